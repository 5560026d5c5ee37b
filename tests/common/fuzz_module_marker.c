/* libFuzzer target for the pfcps.torch ranks' checkpoint marker parser (common/ckpt_marker.c): the input is a
 * marker file's bytes, read as the marker of step 5, rank 1 of 2. A refusal must name the file; a text that
 * parses must be the canonical text of what it parsed to (ckpt_module_marker_format gives the same bytes
 * back), so no two texts mean the same marker. Any crash, sanitizer report or leak is a bug. Built only with
 * -Dfuzz=true (clang). */
#include "common/ckpt_marker.h"
#include "common/err.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ckpt_ident id;
    int rc = ckpt_module_marker_parse((const char *)data, size, "fuzz.module", 5, 1, 2, &id);
    if (rc < 0) {
        if (rc != -EINVAL || strncmp(pf_errmsg(), "fuzz.module: ", 13) != 0)
            abort();
        return 0;
    }
    char back[CKPT_MODULE_MARKER_MAX];
    int n = ckpt_module_marker_format(back, sizeof back, 5, 1, 2, &id);
    if (n < 0 || (size_t)n != size || memcmp(back, data, size) != 0)
        abort();
    return 0;
}
