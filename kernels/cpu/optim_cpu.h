/* The one implementation of the optimizer and gradient-utility loops on host memory: the CPU
 * device's sgd_step / adamw_step / scale / sumsq entries (kernels/ops.h; the cpu-fenced and cpu-bf16
 * devices run the same entries), and the reference the CUDA kernels are tested against bit for bit
 * (tests/kernels/cuda). CUDA twins: cuda_sgd_step / cuda_adamw_step
 * (kernels/cuda/head.cu, same float32 operation order, no FMA contraction), cuda_scale_f32 /
 * cuda_sumsq_f32 (kernels/cuda/cuda_util.cu). */
#ifndef PFCPS_KERNELS_CPU_OPTIM_CPU_H
#define PFCPS_KERNELS_CPU_OPTIM_CPU_H

#include <stddef.h>
#include <stdint.h>

/* torch.optim.SGD (dampening 0, no Nesterov) on n floats, float32, PyTorch's operation order:
 *   d = grad + weight_decay * w;  mom = momentum * mom + d (momentum != 0 and mom != NULL);
 *   w -= lr * mom   (else w -= lr * d, mom untouched and may be NULL). */
void optim_cpu_sgd(float *w, const float *grad, float *mom, size_t n, float lr, float momentum,
                   float weight_decay);

/* torch.optim.AdamW (amsgrad off, single-tensor path) step `step` on n floats; bias corrections
 * and step size in double, rounded to float as PyTorch passes Python floats (Loshchilov & Hutter,
 * "Decoupled Weight Decay Regularization", Algorithm 2, as PyTorch implements it):
 *   w *= 1 - lr*wd; m = m + (g - m)(1 - b1); v = v b2 + (1 - b2) g g;
 *   w -= (lr / (1 - b1^step)) * m / (sqrt(v) / sqrt(1 - b2^step) + eps).
 * The caller checks step >= 1 (the device entries return -EINVAL otherwise). */
void optim_cpu_adamw(float *w, const float *grad, float *m, float *v, size_t n, double lr, double beta1,
                     double beta2, double eps, double weight_decay, int64_t step);

/* x[i] *= a for i < n. */
void optim_cpu_scale(float *x, size_t n, float a);

/* acc + sum of x[i]^2 for i < n, accumulated in double in index order (inf / NaN propagate). */
double optim_cpu_sumsq(double acc, const float *x, size_t n);

#endif
