/* libFuzzer target: arbitrary bytes as a backbone checkpoint file (model_load_ex, extras table of
 * room 4). Every input must be either loaded (a valid file for the model: r18_w2, D = 8) or refused
 * with a negative code and a message, with the model's parameters untouched on refusal; loaded
 * extras have NUL-terminated names; no crash, no sanitizer report.
 * Seeds: tests/worker/model/fuzz_checkpoint_corpus (valid version 1 and version 2 (two extras) checkpoints and a few
 * cut/altered ones). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "worker/model/model.h"

static model *m;
static char path[64];
static float *saved;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!m) {
        if (model_create(&m, "r18_w2", 8, 1))
            abort();
        model_init(m, 1);
        snprintf(path, sizeof path, "/tmp/pfcps_fuzz_ckpt_%d", (int)getpid());
        saved = malloc(model_num_params(m) * sizeof(float));
    }
    FILE *f = fopen(path, "wb");
    if (!f)
        abort();
    if (size && fwrite(data, 1, size, f) != size)
        abort();
    fclose(f);
    memcpy(saved, model_params(m), model_num_params(m) * sizeof(float));
    model_extra x[4];
    int n = -1;
    int rc = model_load_ex(m, path, x, 4, &n);
    if (rc > 0 || (rc < 0 && pf_errmsg()[0] == '\0'))
        abort(); /* errors must carry a message */
    if (rc == 0 && (n < 0 || n > 4))
        abort();
    for (int i = 0; rc == 0 && i < n; i++)
        if (!memchr(x[i].name, 0, sizeof x[i].name) || !x[i].name[0])
            abort(); /* names are checked before they are handed out */
    if (rc < 0 && memcmp(saved, model_params(m), model_num_params(m) * sizeof(float)))
        abort(); /* a refused file must not change the model */
    unlink(path);
    return 0;
}
