/* Optimizer and gradient-utility loops on host memory (see optim_cpu.h): the CPU device's entries,
 * and the reference of the CUDA kernels. */
#include "kernels/cpu/optim_cpu.h"

#include <math.h>

void optim_cpu_sgd(float *w, const float *grad, float *mom, size_t n, float lr, float momentum,
                   float weight_decay)
{
    if (momentum != 0.0f && mom) {
        for (size_t i = 0; i < n; i++) {
            float d = grad[i] + weight_decay * w[i];
            mom[i] = momentum * mom[i] + d;
            w[i] -= lr * mom[i];
        }
    } else {
        for (size_t i = 0; i < n; i++)
            w[i] -= lr * (grad[i] + weight_decay * w[i]);
    }
}

void optim_cpu_adamw(float *w, const float *grad, float *m, float *v, size_t n, double lr, double beta1,
                     double beta2, double eps_d, double weight_decay, int64_t step)
{
    /* PyTorch's single-tensor path: bias corrections and step size in double (Python floats). */
    double bc1 = 1.0 - pow(beta1, (double)step);
    double bc2 = 1.0 - pow(beta2, (double)step);
    float step_size = (float)(lr / bc1);
    float bc2_sqrt = (float)sqrt(bc2);
    float decay = (float)(1.0 - lr * weight_decay);
    /* 1 - beta in double then rounded, as PyTorch passes Python floats (1 - 0.999f in float is off by 1e-5).
     */
    float omb1 = (float)(1.0 - beta1), b2 = (float)beta2, omb2 = (float)(1.0 - beta2), eps = (float)eps_d;
    for (size_t i = 0; i < n; i++) {
        float g = grad[i];
        w[i] *= decay;
        m[i] = m[i] + (g - m[i]) * omb1; /* torch: exp_avg.lerp_(grad, 1 - beta1) */
        v[i] = v[i] * b2 + omb2 * g * g; /* exp_avg_sq.mul_(b2).addcmul_(g, g, 1 - b2) */
        float denom = sqrtf(v[i]) / bc2_sqrt + eps;
        w[i] -= step_size * (m[i] / denom);
    }
}

void optim_cpu_scale(float *x, size_t n, float a)
{
    for (size_t i = 0; i < n; i++)
        x[i] *= a;
}

double optim_cpu_sumsq(double acc, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        acc += (double)x[i] * x[i];
    return acc;
}
