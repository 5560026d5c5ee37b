/* Optimizers on flat float arrays (llm.c style: all parameters in one allocation) and gradient-norm
 * clipping, on host memory: the host API of the loops the devices run, for the tests and references (the
 * training loop calls the device table's entries).
 *
 * SGD and AdamW match PyTorch's torch.optim.SGD (dampening 0, no Nesterov) and torch.optim.AdamW
 * (amsgrad off) update rules exactly, in float32 with the same operation order. The loops (and the
 * clip's sum of squares and scaling) are kernels/cpu/optim_cpu.c, shared with the CPU device's
 * sgd_step / adamw_step / sumsq / scale entries (kernels/ops.h); these functions work on host memory. */
#ifndef PFCPS_WORKER_HEAD_OPTIM_H
#define PFCPS_WORKER_HEAD_OPTIM_H

#include <stddef.h>
#include <stdint.h>

/* torch.optim.SGD step on n parameters (weight decay applies to every parameter, momentum honoured):
 *   d = grad + weight_decay * w;  mom = momentum * mom + d  (momentum > 0);  w -= lr * mom
 * With momentum == 0, w -= lr * d and `mom` is not touched (may be NULL). Start with mom zeroed
 * (PyTorch's first step buf = d is the same as 0 * momentum + d). */
void optim_sgd_step(float *w, const float *grad, float *mom, size_t n, float lr, float momentum,
                    float weight_decay);

typedef struct adamw_params {
    double lr;           /* PyTorch default 1e-3 */
    double beta1, beta2; /* 0.9, 0.999 */
    double eps;          /* 1e-8 */
    double weight_decay; /* 1e-2 */
} adamw_params;

/* Fills PyTorch's AdamW defaults (lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2). */
void optim_adamw_defaults(adamw_params *p);

/* torch.optim.AdamW step number `step` (1-based, counted per parameter set) on n parameters:
 *   w *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *   w -= (lr / (1 - b1^step)) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)
 * (Loshchilov & Hutter, "Decoupled Weight Decay Regularization", Algorithm 2, as PyTorch implements it.)
 * m and v start zeroed. Returns 0 or -EINVAL for step < 1. */
int optim_adamw_step(float *w, const float *grad, float *m, float *v, size_t n, const adamw_params *p,
                     int64_t step);

/* torch.nn.utils.clip_grad_norm_(params, max_norm) with norm_type 2 over one flat array: computes
 * total = ||grad||_2 (double accumulation) and, when max_norm / (total + 1e-6) < 1, scales grad by that
 * factor. Returns total (the norm before clipping). Non-finite totals leave grad untouched and are
 * returned as is (the caller decides; torch's error_if_nonfinite defaults to false). */
double optim_clip_grad_norm(float *grad, size_t n, double max_norm);

/* Same over several arrays (grads[i] has counts[i] elements), as one global norm. */
double optim_clip_grad_norm_multi(float *const *grads, const size_t *counts, int narrays, double max_norm);

#endif
