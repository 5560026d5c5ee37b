/* libFuzzer target for the checkpoint file reader (common/snapfile.c): the input is a whole checkpoint file,
 * read through snapfile_open_stream and snapfile_finish. A read either fails with a message or accepts a file
 * whose size is exactly 4096 + the payload length its header states; any crash, sanitizer report, leak or
 * silent refusal is a bug. */
#include "common/err.h"
#include "common/snapfile.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    FILE *f = fmemopen((void *)data, size, "rb");
    if (!f)
        return 0;
    snapfile_reader r;
    int rc = snapfile_open_stream(&r, f, (int64_t)size, "fuzz.snap", NULL);
    if (rc == 0) {
        rc = snapfile_finish(&r);
        if (rc == 0 && (uint64_t)size != SNAPFILE_HDR_AREA + r.m.payload_bytes)
            abort();
    }
    if (rc < 0 && pf_errmsg()[0] == 0)
        abort(); /* every refusal says why */
    snapfile_close(&r);
    fclose(f);
    return 0;
}
