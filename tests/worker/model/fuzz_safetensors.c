/* libFuzzer target for the safetensors reader (worker/model/safetensors.c st_parse): the input is the whole
 * file. A parse either fails with -EPROTO / -ENOMEM and a message, or yields tensors whose byte ranges lie
 * inside the input's data section, tile it (sorted, no gap, no overlap, ending at the end of the input) and
 * match shape x dtype size; every tensor and metadata lookup then works. Any crash, sanitizer report or leak
 * is a bug. */
#include "common/err.h"
#include "common/safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    st_file *f = NULL;
    int rc = st_parse(&f, data, size, "fuzz");
    if (rc != 0) {
        if (f || (rc != -EPROTO && rc != -ENOMEM) || pf_errmsg()[0] == 0)
            abort(); /* every refusal says why and leaves nothing */
        return 0;
    }
    uint64_t hlen;
    memcpy(&hlen, data, 8);
    const uint8_t *at = data + 8 + hlen;
    volatile unsigned sum = 0;
    for (int i = 0; i < st_count(f); i++) {
        const st_tensor *t = st_at(f, i);
        if (t->data != at || t->data + t->nbytes > data + size || st_find(f, t->name) == NULL)
            abort();
        uint64_t n = st_dtype_size(t->dtype);
        for (int k = 0; k < t->ndim; k++)
            n *= (uint64_t)t->shape[k];
        if (n != t->nbytes)
            abort();
        for (size_t k = 0; k < t->nbytes; k++)
            sum += t->data[k];
        at += t->nbytes;
    }
    if (at != data + size)
        abort();
    (void)sum; /* every byte was read (ASan checks each read) */
    (void)st_metadata(f, "format");
    st_free(f);
    return 0;
}
