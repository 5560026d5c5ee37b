/* Optimizers, clipping and the lr schedule: see optim.h. */
#include "worker/head/optim.h"

#include <math.h>

#include "common/err.h"
#include "kernels/cpu/optim_cpu.h"

void optim_sgd_step(float *w, const float *grad, float *mom, size_t n, float lr, float momentum,
                    float weight_decay)
{
    optim_cpu_sgd(w, grad, mom, n, lr, momentum, weight_decay);
}

void optim_adamw_defaults(adamw_params *p)
{
    p->lr = 1e-3;
    p->beta1 = 0.9;
    p->beta2 = 0.999;
    p->eps = 1e-8;
    p->weight_decay = 1e-2;
}

int optim_adamw_step(float *w, const float *grad, float *m, float *v, size_t n, const adamw_params *p,
                     int64_t step)
{
    if (step < 1)
        return pf_err(-EINVAL, "adamw: step %lld must be >= 1", (long long)step);
    optim_cpu_adamw(w, grad, m, v, n, p->lr, p->beta1, p->beta2, p->eps, p->weight_decay, step);
    return 0;
}

double optim_clip_grad_norm_multi(float *const *grads, const size_t *counts, int narrays, double max_norm)
{
    double ss = 0.0;
    for (int a = 0; a < narrays; a++)
        ss = optim_cpu_sumsq(ss, grads[a], counts[a]);
    double total = sqrt(ss);
    if (!isfinite(total))
        return total;
    double coef = max_norm / (total + 1e-6);
    if (coef < 1.0) {
        float c = (float)coef;
        for (int a = 0; a < narrays; a++)
            optim_cpu_scale(grads[a], counts[a], c);
    }
    return total;
}

double optim_clip_grad_norm(float *grad, size_t n, double max_norm)
{
    return optim_clip_grad_norm_multi(&grad, &n, 1, max_norm);
}
