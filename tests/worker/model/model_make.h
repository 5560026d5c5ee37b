/* The test backbone the safetensors and torch.save tests load into: model_init(seed) plus random BN affine
 * parameters and running statistics, so that eval-mode batch norm is not the identity and a tensor loaded
 * into the wrong place changes the forward. Uses tests/check.h's rng_state, frand, DIE. */
#ifndef PFCPS_TESTS_WORKER_MODEL_MODEL_MAKE_H
#define PFCPS_TESTS_WORKER_MODEL_MODEL_MAKE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check.h"
#include "worker/model/model.h"

/* A net / D backbone for batch `batch`, initialised from seed and then perturbed as described above. */
static inline model *model_make_perturbed(const char *net, int D, int batch, uint64_t seed)
{
    model *m;
    if (model_create(&m, net, D, batch))
        DIE("model_create %s: %s", net, pf_errmsg());
    model_init(m, seed);
    rng_state = seed * 2654435761u + 1;
    float *p = malloc(model_num_params(m) * sizeof(float));
    float *b = malloc(model_num_buffer_floats(m) * sizeof(float));
    if (!p || !b || model_get_params(m, p) || model_get_buffers(m, b))
        DIE("host copies: %s", pf_errmsg());
    for (int i = 0; i < model_num_tensors(m); i++) {
        const model_tensor *t = model_tensor_at(m, i);
        if (t->ndim == 1 && !(t->flags & MODEL_TENSOR_FIXED))
            for (size_t k = 0; k < t->count; k++)
                p[t->offset + k] += frand(-0.2f, 0.2f);
    }
    for (int i = 0; i < model_num_buffer_tensors(m); i++) {
        const model_tensor *t = model_buffer_tensor_at(m, i);
        int var = strstr(t->name, "running_var") != NULL;
        for (size_t k = 0; k < t->count; k++)
            b[t->offset + k] = var ? frand(0.5f, 2.0f) : frand(-0.3f, 0.3f);
    }
    if (model_set_params(m, p) || model_set_buffers(m, b))
        DIE("%s", pf_errmsg());
    free(p);
    free(b);
    return m;
}

#endif
