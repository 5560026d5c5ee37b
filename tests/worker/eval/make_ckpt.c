/* make_ckpt OUT NETWORK D SEED: a backbone checkpoint for the embedding tests: model_init(SEED), then
 * the batch-norm biases and running statistics drawn at random too (so that eval-mode batch norm is not
 * the identity), saved with model_save. */
#include "tests/check.h"
#include "worker/model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: make_ckpt OUT NETWORK D SEED\n");
        return 2;
    }
    model *m;
    int rc = model_create(&m, argv[2], atoi(argv[3]), 1);
    if (rc)
        DIE("model_create: %s", pf_errmsg());
    model_init(m, strtoull(argv[4], NULL, 10));
    rng_state = strtoull(argv[4], NULL, 10) * 2654435761u + 1;
    float *p = malloc(model_num_params(m) * sizeof(float));
    float *b = malloc(model_num_buffer_floats(m) * sizeof(float) + 4);
    if (!p || !b || model_get_params(m, p) || model_get_buffers(m, b))
        DIE("host copies: %s", pf_errmsg());
    for (int i = 0; i < model_num_tensors(m); i++) {
        const model_tensor *t = model_tensor_at(m, i);
        if (t->flags & MODEL_TENSOR_FIXED)
            continue;
        int bn = strstr(t->name, "bn") != NULL || strncmp(t->name, "features.", 9) == 0;
        if (bn && strstr(t->name, ".bias"))
            for (size_t k = 0; k < t->count; k++)
                p[t->offset + k] = frand(-0.2f, 0.2f);
        if (bn && strstr(t->name, ".weight"))
            for (size_t k = 0; k < t->count; k++)
                p[t->offset + k] = frand(0.7f, 1.3f);
    }
    for (int i = 0; i < model_num_buffer_tensors(m); i++) {
        const model_tensor *t = model_buffer_tensor_at(m, i);
        int var = strstr(t->name, "running_var") != NULL;
        for (size_t k = 0; k < t->count; k++)
            b[t->offset + k] = var ? frand(0.5f, 2.0f) : frand(-0.3f, 0.3f);
    }
    if (model_set_params(m, p) || model_set_buffers(m, b) || model_save(m, argv[1]))
        DIE("%s", pf_errmsg());
    free(p);
    free(b);
    model_free(m);
    return 0;
}
