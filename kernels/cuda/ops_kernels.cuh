// Device code the CUDA devices share: the fp32 device (kernels/cuda/ops_cuda.cu, T = float) and the
// mixed-precision ones (kernels/cuda/ops_cuda_half.cu through ops_cuda_half_kernels.cuh, T = __half /
// __nv_bfloat16; tests/kernels/cuda/test_cuda_half_emu.cpp runs them on the CPU with a software bf16): add /
// acc, the float64 batch norm (statistics, normalization, backward sums), PReLU and the batch-norm
// statistics conversions, templated on the element type T through elt<T> (f: T -> float, r: float -> T,
// rd: double -> T, round to nearest even), which the includer specializes. Kernels loop grid-stride
// over n elements, or take the grid (C, S) / one thread per channel their comment states; block sums
// assume blockDim.x = 256.
#ifndef PFCPS_KERNELS_CUDA_OPS_KERNELS_CUH
#define PFCPS_KERNELS_CUDA_OPS_KERNELS_CUH

#include "kernels/cuda/block_sum.cuh"

template <typename T> struct elt;

template <typename T> static __global__ void add_k(T *out, const T *a, const T *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = elt<T>::r(elt<T>::f(a[i]) + elt<T>::f(b[i]));
}

template <typename T> static __global__ void acc_k(T *dst, const T *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = elt<T>::r(elt<T>::f(dst[i]) + elt<T>::f(src[i]));
}

static __global__ void bn_save_to_f64(double *mean, double *var, const float *fm, const float *finv, int C,
                                      double eps)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < C) {
        double inv = finv[i];
        mean[i] = fm[i];
        var[i] = 1.0 / (inv * inv) - eps;
    }
}

static __global__ void bn_save_from_f64(float *fm, float *finv, const double *mean, const double *var, int C,
                                        double eps)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < C) {
        fm[i] = (float)mean[i];
        finv[i] = (float)(1.0 / sqrt(var[i] + eps));
    }
}

#define BN_SPLIT 32

/* Grid (C, S), 256 threads. part[c*S + s] = this block's share of channel c of: x (mean NULL), or
 * (x - mean[c])^2; with dy: part = sum dy, part2 = sum dy (x - mean[c]). */
template <typename T>
static __global__ void bn_partial_k(double *part, double *part2, const T *x, const T *dy, const double *mean,
                                    int B, int C, int HW)
{
    int ch = blockIdx.x, s = blockIdx.y, S = gridDim.y;
    double m = mean ? mean[ch] : 0.0, a1 = 0.0, a2 = 0.0;
    for (int b = s; b < B; b += S) {
        size_t base = ((size_t)b * C + ch) * HW;
        for (int hw = threadIdx.x; hw < HW; hw += blockDim.x) {
            double v = elt<T>::f(x[base + hw]);
            if (dy) {
                double g = elt<T>::f(dy[base + hw]);
                a1 += g;
                a2 += g * (v - m);
            } else if (mean) {
                a1 += (v - m) * (v - m);
            } else {
                a1 += v;
            }
        }
    }
    a1 = block_sum_d<8>(a1);
    if (dy)
        a2 = block_sum_d<8>(a2);
    if (threadIdx.x == 0) {
        part[ch * S + s] = a1;
        if (dy)
            part2[ch * S + s] = a2;
    }
}

/* One thread per channel. stage 0: mean = sum / n; stage 1: var = sum / n and the running
 * statistics (unbiased variance), as the CPU device. */
static __global__ void bn_finish_k(double *mean, double *var, const double *part, int C, int S, double n,
                                   int stage, float *running_mean, float *running_var, double momentum)
{
    int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= C)
        return;
    double t = 0.0;
    for (int s = 0; s < S; s++)
        t += part[ch * S + s];
    if (stage == 0) {
        mean[ch] = t / n;
        return;
    }
    var[ch] = t / n;
    if (running_mean && running_var) {
        double unbias = n > 1 ? n / (n - 1) : 1.0;
        running_mean[ch] = (float)((1.0 - momentum) * running_mean[ch] + momentum * mean[ch]);
        running_var[ch] = (float)((1.0 - momentum) * running_var[ch] + momentum * var[ch] * unbias);
    }
}

/* out = (x - mean) weight / sqrt(var + eps) + bias in float64, rounded once to T. */
template <typename T>
static __global__ void bn_apply_k(T *out, const T *x, const double *mean_d, const double *var_d,
                                  const float *mean_f, const float *var_f, const float *weight,
                                  const float *bias, int C, int HW, size_t n, double eps)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int ch = (int)((i / (size_t)HW) % (size_t)C);
        double m = mean_d ? mean_d[ch] : (double)mean_f[ch];
        double v = var_d ? var_d[ch] : (double)var_f[ch];
        double k = (double)weight[ch] / sqrt(v + eps);
        out[i] = elt<T>::rd(((double)elt<T>::f(x[i]) - m) * k + (double)bias[ch]);
    }
}

/* One thread per channel: dbias += sum dy, dweight += sum dy xhat (fp32 parameters), and
 * coef[3c..3c+2] = (weight rstd, mean dy, rstd mean(dy xhat)) for the element pass. */
static __global__ void bn_bwd_finish_k(double *coef, float *dweight, float *dbias, const double *part,
                                       const double *part2, const float *weight, const double *save_var,
                                       int C, int S, double n, double eps)
{
    int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= C)
        return;
    double sdy = 0.0, sdyx = 0.0;
    for (int s = 0; s < S; s++) {
        sdy += part[ch * S + s];
        sdyx += part2[ch * S + s];
    }
    double rstd = 1.0 / sqrt(save_var[ch] + eps);
    sdyx *= rstd;
    if (dbias)
        dbias[ch] += (float)sdy;
    if (dweight)
        dweight[ch] += (float)sdyx;
    coef[3 * ch] = (double)weight[ch] * rstd;
    coef[3 * ch + 1] = sdy / n;
    coef[3 * ch + 2] = rstd * (sdyx / n);
}

template <typename T>
static __global__ void prelu_fwd_k(T *out, const T *inp, const float *alpha, int C, int HW, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = elt<T>::f(inp[i]);
        int ch = (int)((i / (size_t)HW) % (size_t)C);
        out[i] = elt<T>::r(v > 0.0f ? v : alpha[ch] * v);
    }
}

template <typename T>
static __global__ void prelu_bwd_dinp_k(T *dinp, int acc, const T *dout, const T *inp, const float *alpha,
                                        int C, int HW, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int ch = (int)((i / (size_t)HW) % (size_t)C);
        float g = elt<T>::f(dout[i]);
        float d = elt<T>::f(inp[i]) > 0.0f ? g : alpha[ch] * g;
        dinp[i] = elt<T>::r(acc ? elt<T>::f(dinp[i]) + d : d);
    }
}

/* Sum of v over the block (blockDim.x a multiple of 32, at most 1024); valid in thread 0. */
static __device__ float block_sum_f(float v)
{
    __shared__ float part[32];
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, off);
    __syncthreads(); /* part[] may still be read by a previous call */
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = v;
    __syncthreads();
    v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0f;
    /* every warp runs the second pass (full warps, full mask; only warp 0's sum is used): the
     * tests' CPU emulator (tests/kernels/cuda/cuda_emu.h) needs every thread at each shuffle */
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, off);
    return v;
}

/* dalpha[c] += sum over (b, hw) with inp <= 0 of dout * inp, in fp32. Grid (C, batch splits). */
template <typename T>
static __global__ void prelu_bwd_dalpha_k(float *dalpha, const T *dout, const T *inp, int B, int C, int HW)
{
    int ch = blockIdx.x;
    float s = 0.0f;
    for (int b = blockIdx.y; b < B; b += gridDim.y) {
        size_t base = ((size_t)b * C + ch) * HW;
        for (int hw = threadIdx.x; hw < HW; hw += blockDim.x) {
            float x = elt<T>::f(inp[base + hw]);
            s += x > 0.0f ? 0.0f : elt<T>::f(dout[base + hw]) * x;
        }
    }
    s = block_sum_f(s);
    if (threadIdx.x == 0)
        atomicAdd(dalpha + ch, s);
}

#endif
