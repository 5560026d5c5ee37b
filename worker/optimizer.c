/* The backbone's optimizer step (see optimizer.h). */
#include "worker/optimizer.h"

#include <math.h>

#include "common/err.h"

int bopt_zero_fixed_grads(model *m)
{
    const ops_device *dev = model_device(m);
    float *g = model_grads(m);
    for (int i = 0; i < model_num_tensors(m); i++) {
        const model_tensor *T = model_tensor_at(m, i);
        if (T->flags & MODEL_TENSOR_FIXED) {
            int rc = dev->mem_zero(model_ctx(m), g + T->offset, T->count * sizeof(float));
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

int bopt_step(model *m, const bopt *o, float lr, int64_t step1)
{
    const ops_device *dev = model_device(m);
    ops_ctx *ctx = model_ctx(m);
    float *w = model_params(m), *g = model_grads(m);
    for (int i = 0; i < model_num_tensors(m); i++) {
        const model_tensor *T = model_tensor_at(m, i);
        if (T->flags & MODEL_TENSOR_FIXED)
            continue;
        int rc;
        if (o->mom)
            rc = dev->sgd_step(ctx, w + T->offset, g + T->offset, o->mom + T->offset, T->count, lr,
                               (float)o->momentum, (float)o->weight_decay);
        else
            rc = dev->adamw_step(ctx, w + T->offset, g + T->offset, o->adam_m + T->offset,
                                 o->adam_v + T->offset, T->count, lr, 0.9, 0.999, 1e-8, o->weight_decay,
                                 step1);
        if (rc < 0)
            return pf_err_wrap(rc, "optimizer step on %s", T->name);
    }
    return 0;
}

int bopt_clip_apply(model *m, const bopt *o, float lr, double ss, int64_t *opt_steps)
{
    double total = sqrt(ss);
    if (isfinite(total)) {
        double coef = 5.0 / (total + 1e-6);
        int rc;
        if (coef < 1.0 &&
            (rc = model_device(m)->scale(model_ctx(m), model_grads(m), model_num_params(m), (float)coef)) < 0)
            return rc;
    }
    ++*opt_steps;
    return bopt_step(m, o, lr, *opt_steps);
}
