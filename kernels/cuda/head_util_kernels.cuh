// Row gather / scatter, SGD / AdamW and loss-scale unscale kernels of kernels/cuda/head.cu (grid-stride
// loops, 256 threads per block there). Private to head.cu; also compiled as host C++ by
// tests/kernels/cuda/test_cuda_head_util_emu.cpp (tests/kernels/cuda/cuda_emu.h) against the CPU optimizers.
// The optimizers round each operation as the CPU does (__fadd_rn etc.: no FMA contraction), so the two agree
// bit for bit.
#ifndef PFCPS_KERNELS_CUDA_HEAD_UTIL_KERNELS_CUH
#define PFCPS_KERNELS_CUDA_HEAD_UTIL_KERNELS_CUH

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* Smallest i with an index out of range (UINT64_MAX: none). One caller at a time. */
static __device__ unsigned long long g_bad_row;

static __global__ void gather_k(float *out, const float *table, int64_t rows, const int64_t *idx, int64_t k,
                                int d)
{
    size_t n = (size_t)k * d;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        size_t i = e / d, j = e % d;
        int64_t r = idx[i];
        if (r < 0 || r >= rows) {
            out[e] = NAN;
            atomicMin(&g_bad_row, (unsigned long long)i);
        } else {
            out[e] = table[(size_t)r * d + j];
        }
    }
}

static __global__ void scatter_k(float *table, int64_t rows, const float *src, const int64_t *idx, int64_t k,
                                 int d, int add)
{
    size_t n = (size_t)k * d;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        size_t i = e / d, j = e % d;
        int64_t r = idx[i];
        if (r < 0 || r >= rows) {
            atomicMin(&g_bad_row, (unsigned long long)i);
        } else if (add) {
            atomicAdd(table + (size_t)r * d + j, src[e]);
        } else {
            table[(size_t)r * d + j] = src[e];
        }
    }
}

static __global__ void sgd_k(float *w, const float *grad, float *mom, size_t n, float lr, float momentum,
                             float wd, int use_mom)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float d = __fadd_rn(grad[i], __fmul_rn(wd, w[i]));
        if (use_mom) {
            float m = __fadd_rn(__fmul_rn(momentum, mom[i]), d);
            mom[i] = m;
            w[i] = __fsub_rn(w[i], __fmul_rn(lr, m));
        } else {
            w[i] = __fsub_rn(w[i], __fmul_rn(lr, d));
        }
    }
}

/* The float constants of one AdamW step (optim_cpu_adamw's: bias corrections and step size computed
 * in double as PyTorch's Python floats, then rounded). */
typedef struct adamw_consts {
    float step_size, bc2_sqrt, decay, omb1, b2, omb2, eps;
} adamw_consts;

static inline adamw_consts adamw_consts_of(double lr, double beta1, double beta2, double eps,
                                           double weight_decay, int64_t step)
{
    double bc1 = 1.0 - pow(beta1, (double)step);
    double bc2 = 1.0 - pow(beta2, (double)step);
    adamw_consts c = {(float)(lr / bc1),
                      (float)sqrt(bc2),
                      (float)(1.0 - lr * weight_decay),
                      (float)(1.0 - beta1),
                      (float)beta2,
                      (float)(1.0 - beta2),
                      (float)eps};
    return c;
}

static __global__ void adamw_k(float *w, const float *grad, float *m, float *v, size_t n, float step_size,
                               float bc2_sqrt, float decay, float omb1, float b2, float omb2, float eps)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = grad[i];
        float wi = __fmul_rn(w[i], decay);
        float mi = __fadd_rn(m[i], __fmul_rn(__fsub_rn(g, m[i]), omb1));
        float vi = __fadd_rn(__fmul_rn(v[i], b2), __fmul_rn(__fmul_rn(omb2, g), g));
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
        w[i] = __fsub_rn(wi, __fmul_rn(step_size, __fdiv_rn(mi, denom)));
        m[i] = mi;
        v[i] = vi;
    }
}

static __device__ int g_found_inf;

static __global__ void unscale_check_k(float *g, size_t n, float inv_scale)
{
    int bad = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = g[i];
        bad |= !isfinite(v);
        g[i] = v * inv_scale;
    }
    if (bad)
        g_found_inf = 1;
}

#endif
