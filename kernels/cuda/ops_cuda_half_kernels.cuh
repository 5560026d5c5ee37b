// Device code of the mixed-precision CUDA devices (kernels/cuda/ops_cuda_half.cu): weight and layout
// conversions and the batch-norm input gradient (float64, one rounding), templated on the 2-byte
// element type T through elt<T> (f: T -> float, r: float -> T and rd: double -> T, round to nearest
// even), which the includer specializes (__half and __nv_bfloat16 in ops_cuda_half.cu; a software bf16
// in tests/kernels/cuda/test_cuda_half_emu.cpp, which runs these kernels on the CPU through
// tests/kernels/cuda/cuda_emu.h); with what they share with the fp32 device (add / acc, batch norm, PReLU:
// kernels/cuda/ops_kernels.cuh). Kernels loop grid-stride over n elements.
#ifndef PFCPS_KERNELS_CUDA_OPS_CUDA_HALF_KERNELS_CUH
#define PFCPS_KERNELS_CUDA_OPS_CUDA_HALF_KERNELS_CUH

#include "kernels/cuda/ops_kernels.cuh"

/* ---- conversion kernels (math in fp32, one rounding per output) ---- */

template <typename T> static __global__ void f32_to_h_k(T *out, const float *in, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = elt<T>::r(in[i]);
}

/* dweight (fp32) += the half weight gradient. */
template <typename T> static __global__ void acc_h_into_f32_k(float *dst, const T *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] += elt<T>::f(src[i]);
}

template <typename T> static __global__ void to_plain_k(float *dst, const T *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = elt<T>::f(src[i]);
}

template <typename T> static __global__ void from_plain_k(T *dst, int acc, const float *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = elt<T>::r(acc ? elt<T>::f(dst[i]) + src[i] : src[i]);
}

/* dx = k (dy - mean dy - (x - mean) kx) in float64; += in float64 too; one rounding. */
template <typename T>
static __global__ void hbn_dx_k(T *dinp, int acc, const T *dy, const T *x, const double *coef,
                                const double *save_mean, int C, int HW, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int ch = (int)((i / (size_t)HW) % (size_t)C);
        double k = coef[3 * ch], mdy = coef[3 * ch + 1], kx = coef[3 * ch + 2];
        double v = k * ((double)elt<T>::f(dy[i]) - mdy - ((double)elt<T>::f(x[i]) - save_mean[ch]) * kx);
        if (acc)
            v += (double)elt<T>::f(dinp[i]);
        dinp[i] = elt<T>::rd(v);
    }
}

#endif
