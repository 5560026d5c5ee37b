/* The backbone's optimizer step as the training loop runs it (worker/train.c, after the gradient collective):
 * fixed tensors' gradients zeroed, their sum of squares (clip_grad_norm_'s norm and the loss scaler's
 * found-inf check), clip at 5, then torch.optim.SGD (momentum) or torch.optim.AdamW on every trainable
 * tensor, on the model's device (kernels/ops.h sgd_step / adamw_step). Shared by the trainer and the tests
 * that replay its steps in-process. */
#ifndef PFCPS_WORKER_OPTIMIZER_H
#define PFCPS_WORKER_OPTIMIZER_H

#include <stdint.h>

#include "worker/model/model.h"

/* The backbone optimizer's state and hyper-parameters. Exactly one of mom (SGD) and adam_m / adam_v (AdamW)
 * is set: device arrays of model_num_params floats each, laid out as model_params. */
typedef struct bopt {
    float *mom;             /* device: SGD momentum (nparams), or NULL */
    float *adam_m, *adam_v; /* device: AdamW first and second moments (nparams each), or NULL */
    double momentum;        /* SGD momentum (config momentum) */
    double weight_decay;    /* config weight_decay (SGD: L2 added to the gradient; AdamW: decoupled) */
} bopt;

/* Zeroes the gradients of the model's fixed tensors (MODEL_TENSOR_FIXED) so that they take no part in
 * clipping. Returns 0 or the device's negative code. */
int bopt_zero_fixed_grads(model *m);

/* One optimizer step at learning rate lr on every trainable tensor (fixed ones are skipped, as arcface_torch
 * leaves them out: requires_grad = False) from the gradients in model_grads; step1 (>= 1) is AdamW's step
 * count (bias correction), unused by SGD. Returns 0 or the device's negative code naming the tensor. */
int bopt_step(model *m, const bopt *o, float lr, int64_t step1);

/* torch.nn.utils.clip_grad_norm_(params, 5) from the gradients' sum of squares ss (coef = 5 / (sqrt(ss) +
 * 1e-6), applied when below 1; nothing when ss is not finite), then *opt_steps + 1 and bopt_step at lr with
 * that count. Returns 0 or the device's negative code (*opt_steps is incremented before the step). */
int bopt_clip_apply(model *m, const bopt *o, float lr, double ss, int64_t *opt_steps);

#endif
