/* AdamW for the class centers (optimizer = adamw): torch.optim.AdamW as arcface_torch's train_v2.py builds it
 * (betas (0.9, 0.999), eps 1e-8, weight_decay and lr from the config), torch 1.13's _single_tensor_adamw per
 * element (torch/optim/adamw.py), with t the optimizer's step count (steps the loss scaler skipped excluded):
 *   w = w * (1 - lr*wd);  m = m*b1 + (1-b1)*g;  v = v*b2 + ((1-b2)*g)*g;
 *   bc1 = 1 - b1^t;  bc2 = 1 - b2^t;  denom = sqrt(v) / sqrt(bc2) + eps;  w = w + ((-lr/bc1) * m) / denom
 * Scalars (1 - lr*wd, lr/bc1, sqrt(bc2), 1-b1, 1-b2) are computed in double as Python does and rounded to
 * float, as torch passes Python floats to float32 tensors; every tensor operation is one float32 rounding, in
 * the order above, no fused multiply-add (the project builds with -ffp-contract=off), so every build gives the
 * same bits. (torch's own CPU kernels fuse the multiply-add of add_(alpha) on AVX2: its results differ from
 * these by float32 roundings, well inside the parity test's tolerance.)
 *
 * Dense update (pfc_update = dense): arcface_torch's AdamW moves every row of the table at every step, an
 * unsampled row with g = 0. There is no closed form (eps sits outside the square root), so a row skipped for k
 * steps is brought up to date by running those k zero-gradient steps one by one (adamw_replay), with each
 * step's own lr and t: O(k D) per row, what torch pays over the whole table. */
#ifndef PFCPS_SERVER_ADAMW_H
#define PFCPS_SERVER_ADAMW_H

#include <stdint.h>

/* torch.optim.AdamW's defaults, which arcface_torch's configs cannot change (train_v2.py passes lr and
 * weight_decay only). */
#define ADAMW_BETA1 0.9
#define ADAMW_BETA2 0.999
#define ADAMW_EPS   1e-8

/* The optimizer's constants. */
typedef struct adamw_hp {
    double b1, b2, eps, wd;
} adamw_hp;

/* The per-step scalars of one step, as float (what torch's tensor operations see). skip: the loss scaler
 * skipped this step (its lr is NaN): it changes nothing and does not count. n: the optimizer's step count
 * after this step (torch's state "step": 1 for the first step that ran). */
typedef struct adamw_coef {
    float decay; /* (float)(1 - lr*wd) */
    float nss;   /* (float)(-(lr / (1 - b1^n))) */
    float bc2s;  /* (float)sqrt(1 - b2^n) */
    int32_t skip;
    int64_t n;
} adamw_coef;

/* The default constants with weight decay wd. */
adamw_hp adamw_defaults(double wd);

/* The coefficients of steps first .. last (into out[first .. last]) from their lr (lr[t], NaN: skipped) and
 * the step count before `first` (n0 = the count after step first - 1, 0 at the start). */
void adamw_coefs(const adamw_hp *hp, const double *lr, int64_t first, int64_t last, int64_t n0,
                 adamw_coef *out);

/* One AdamW step on one row of D elements with gradient g (D floats; NULL: a zero gradient, the update of a
 * row a step did not sample), per the header's formula. c must not be a skipped step. */
void adamw_row_f32(float *w, float *m, float *v, const float *g, int dim, const adamw_hp *hp,
                   const adamw_coef *c);

/* The zero-gradient steps first .. last of a row (tab[t]: step t's coefficients; skipped steps left out). */
void adamw_replay(float *w, float *m, float *v, int dim, const adamw_hp *hp, const adamw_coef *tab,
                  int64_t first, int64_t last);

#endif
