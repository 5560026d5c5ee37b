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
    if (step < 1) return pf_err(-EINVAL, "adamw: step %lld must be >= 1", (long long)step);
    optim_cpu_adamw(w, grad, m, v, n, p->lr, p->beta1, p->beta2, p->eps, p->weight_decay, step);
    return 0;
}

double optim_clip_grad_norm_multi(float *const *grads, const size_t *counts, int narrays, double max_norm)
{
    double ss = 0.0;
    for (int a = 0; a < narrays; a++)
        ss = optim_cpu_sumsq(ss, grads[a], counts[a]);
    double total = sqrt(ss);
    if (!isfinite(total)) return total;
    double coef = max_norm / (total + 1e-6);
    if (coef < 1.0) {
        float c = (float)coef;
        for (int a = 0; a < narrays; a++) optim_cpu_scale(grads[a], counts[a], c);
    }
    return total;
}

double optim_clip_grad_norm(float *grad, size_t n, double max_norm)
{
    return optim_clip_grad_norm_multi(&grad, &n, 1, max_norm);
}

int optim_schedule_steps(int64_t num_image, int64_t total_batch, int num_epoch, double warmup_epoch,
                         double *warmup_steps, int64_t *total_steps)
{
    if (num_image <= 0 || total_batch <= 0 || num_epoch <= 0)
        return pf_err(-EINVAL, "lr schedule: num_image %lld, total batch %lld, num_epoch %d must be positive",
                      (long long)num_image, (long long)total_batch, num_epoch);
    if (!(warmup_epoch >= 0))
        return pf_err(-EINVAL, "lr schedule: warmup_epoch %g is negative", warmup_epoch);
    int64_t per_epoch = num_image / total_batch;
    if (per_epoch == 0)
        return pf_err(-EINVAL, "lr schedule: num_image %lld is smaller than the total batch %lld",
                      (long long)num_image, (long long)total_batch);
    double w = (double)per_epoch * warmup_epoch;
    int64_t t = per_epoch * num_epoch;
    if (w > 0 && w >= (double)t)
        return pf_err(-EINVAL, "lr schedule: warmup %g steps is not shorter than the %lld total steps",
                      w, (long long)t);
    *warmup_steps = w;
    *total_steps = t;
    return 0;
}

double optim_poly_lr(double base_lr, int64_t t, double warmup_steps, int64_t total_steps)
{
    if (t < 0) t = 0;
    if ((double)t < warmup_steps) return base_lr * (double)t / warmup_steps;
    if (t >= total_steps) return 0.0;
    double a = 1.0 - ((double)t - warmup_steps) / ((double)total_steps - warmup_steps);
    return base_lr * a * a;
}
