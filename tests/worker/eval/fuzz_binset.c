/* libFuzzer target for the .bin verification-set reader (worker/eval/binset.c): the input is the
 * pickle. A parse either fails with a message or yields N >= 1 pairs whose 2N images lie inside the
 * input and whose issame values are 0 or 1; any crash, sanitizer report or leak is a bug. */
#include "common/err.h"
#include "worker/eval/binset.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    eval_binset s;
    int rc = eval_binset_parse(&s, data, size);
    if (rc == 0) {
        if (s.n_pairs < 1)
            abort();
        for (int64_t i = 0; i < 2 * s.n_pairs; i++)
            if (s.img[i] < data || s.img_len[i] > size || s.img[i] + s.img_len[i] > data + size)
                abort();
        for (int64_t i = 0; i < s.n_pairs; i++)
            if (s.issame[i] > 1)
                abort();
    } else if (pf_errmsg()[0] == 0) {
        abort(); /* every refusal says why */
    }
    eval_binset_free(&s);
    return 0;
}
