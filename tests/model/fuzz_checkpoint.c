/* libFuzzer target: arbitrary bytes as a backbone checkpoint file (model_load). Every input must be
 * either loaded (a valid file for the model: r18_w2, D = 8) or refused with a negative code and a
 * message, with the model's parameters untouched on refusal; no crash, no sanitizer report.
 * Seeds: tests/model/ckpt_corpus (a valid checkpoint and a few cut/altered ones). */
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
    int rc = model_load(m, path);
    if (rc > 0 || (rc < 0 && pf_errmsg()[0] == '\0'))
        abort(); /* errors must carry a message */
    if (rc < 0 && memcmp(saved, model_params(m), model_num_params(m) * sizeof(float)))
        abort(); /* a refused file must not change the model */
    unlink(path);
    return 0;
}
