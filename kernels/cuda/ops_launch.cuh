// Host side of the layers the CUDA devices share: the launch sequences of ops_kernels.cuh's templates
// for PReLU, add / acc and the exact (float64) BatchNorm2d, templated on the element type T as the
// kernels are: the fp32 device (kernels/cuda/ops_cuda.cu, T = float) and the mixed-precision ones
// (kernels/cuda/ops_cuda_half.cu, T = __half / __nv_bfloat16) call the same code, so they launch the
// same kernels with the same grids. The includer specializes elt<T> first. `dev` prefixes the kernel
// names in launch errors ("" for the fp32 device, "half " for the others: "half prelu_fwd"); the exact
// batch norm's `what` prefixes its steps likewise ("bn exact " / "half bn ": "bn exact sum").
// Returns 0, -EINVAL (bad shape) or -EIO (launch failed); the work is queued on the default stream.
// nvcc only (tests/kernels/cuda/test_cuda_half_emu.cpp runs the kernels with its own launches).
#ifndef PFCPS_KERNELS_CUDA_OPS_LAUNCH_CUH
#define PFCPS_KERNELS_CUDA_OPS_LAUNCH_CUH

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops_kernels.cuh"

/* ---- PReLU (kernels/ops.h prelu_forward / prelu_backward on T elements) ---- */

template <typename T>
static int prelu_forward_launch(const char *dev, T *out, const T *inp, const float *alpha, int B, int C,
                                int HW)
{
    if (B <= 0 || C <= 0 || HW <= 0)
        return pf_err(-EINVAL, "prelu shape B=%d C=%d HW=%d: sizes must be positive", B, C, HW);
    size_t n = (size_t)B * C * HW;
    prelu_fwd_k<T><<<grid_for(n), 256>>>(out, inp, alpha, C, HW, n);
    LAUNCH_CHECK_AS(dev, "prelu_fwd");
    return 0;
}

/* dinp (= or += per acc) and dalpha (+=, fp32, grid (C, min(B, 32))), each skipped when NULL. */
template <typename T>
static int prelu_backward_launch(const char *dev, T *dinp, int acc, float *dalpha, const T *dout,
                                 const T *inp, const float *alpha, int B, int C, int HW)
{
    if (B <= 0 || C <= 0 || HW <= 0)
        return pf_err(-EINVAL, "prelu shape B=%d C=%d HW=%d: sizes must be positive", B, C, HW);
    size_t n = (size_t)B * C * HW;
    if (dinp) {
        prelu_bwd_dinp_k<T><<<grid_for(n), 256>>>(dinp, acc, dout, inp, alpha, C, HW, n);
        LAUNCH_CHECK_AS(dev, "prelu_bwd_dinp");
    }
    if (dalpha) {
        dim3 grid((unsigned)C, (unsigned)(B < 32 ? B : 32));
        prelu_bwd_dalpha_k<T><<<grid, 256>>>(dalpha, dout, inp, B, C, HW);
        LAUNCH_CHECK_AS(dev, "prelu_bwd_dalpha");
    }
    return 0;
}

/* ---- add / acc (n elements; n == 0 does nothing) ---- */

template <typename T> static int add_launch(const char *dev, T *out, const T *a, const T *b, size_t n)
{
    if (!n)
        return 0;
    add_k<T><<<grid_for(n), 256>>>(out, a, b, n);
    LAUNCH_CHECK_AS(dev, "add");
    return 0;
}

/* dst += src (acc != 0), or dst = src by an asynchronous device-to-device copy (none when dst == src). */
template <typename T> static int acc_launch(const char *dev, T *dst, int acc, const T *src, size_t n)
{
    if (!n)
        return 0;
    if (acc) {
        acc_k<T><<<grid_for(n), 256>>>(dst, src, n);
        LAUNCH_CHECK_AS(dev, "acc");
    } else if (dst != src) {
        CUDA_TRY(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToDevice, 0));
    }
    return 0;
}

/* ---- exact BatchNorm2d: the CPU device's float64 two-pass math (kernels/cpu/ops_cpu.c) ----
 * Per channel: partial sums over grid (C, S) blocks, S = bn_exact_splits(B), finished by one thread
 * per channel; the output computed in float64 and rounded once to T. The caller provides the float64
 * scratch (bn_exact_fwd_doubles / bn_exact_bwd_doubles) and checks the arguments. */

static inline int bn_exact_splits(int B)
{
    return B < BN_SPLIT ? B : BN_SPLIT;
}

/* Scratch doubles a training forward needs (an eval forward needs none). */
static inline size_t bn_exact_fwd_doubles(int B, int C)
{
    return (size_t)C * bn_exact_splits(B);
}

/* Scratch doubles a backward needs: two sets of partial sums and 3 coefficients per channel. */
static inline size_t bn_exact_bwd_doubles(int B, int C)
{
    return (size_t)C * (2 * bn_exact_splits(B) + 3);
}

/* kernels/ops.h bn_forward on T elements: train != 0 writes save_mean / save_var (float64) and
 * updates the running statistics; train == 0 normalizes with the running statistics (scr unused). */
template <typename T>
static int bn_exact_forward(double *scr, const char *what, T *out, double *save_mean, double *save_var,
                            const T *inp, const float *weight, const float *bias, float *running_mean,
                            float *running_var, int B, int C, int HW, float eps, float momentum, int train)
{
    size_t n = (size_t)B * C * HW;
    if (!train) {
        bn_apply_k<T><<<grid_for(n), 256>>>(out, inp, NULL, NULL, running_mean, running_var, weight, bias, C,
                                            HW, n, (double)eps);
        LAUNCH_CHECK_AS(what, "apply (eval)");
        return 0;
    }
    int S = bn_exact_splits(B);
    dim3 grid((unsigned)C, (unsigned)S);
    double cnt = (double)B * HW;
    bn_partial_k<T><<<grid, 256>>>(scr, NULL, inp, NULL, NULL, B, C, HW);
    LAUNCH_CHECK_AS(what, "sum");
    bn_finish_k<<<(C + 127) / 128, 128>>>(save_mean, save_var, scr, C, S, cnt, 0, NULL, NULL, 0.0);
    LAUNCH_CHECK_AS(what, "mean");
    bn_partial_k<T><<<grid, 256>>>(scr, NULL, inp, NULL, save_mean, B, C, HW);
    LAUNCH_CHECK_AS(what, "sum of squares");
    bn_finish_k<<<(C + 127) / 128, 128>>>(save_mean, save_var, scr, C, S, cnt, 1, running_mean, running_var,
                                          (double)momentum);
    LAUNCH_CHECK_AS(what, "variance");
    bn_apply_k<T><<<grid_for(n), 256>>>(out, inp, save_mean, save_var, NULL, NULL, weight, bias, C, HW, n,
                                        (double)eps);
    LAUNCH_CHECK_AS(what, "apply");
    return 0;
}

/* The backward's channel sums: dweight, dbias += (fp32, each skipped when NULL) and *coef = the
 * 3 C coefficients (inside scr) the input-gradient kernel reads. The caller launches that kernel
 * (the devices round the input gradient differently: ops_cuda.cu's bnx_dx_k, hbn_dx_k). */
template <typename T>
static int bn_exact_backward_sums(double *scr, const char *what, float *dweight, float *dbias, const T *dout,
                                  const T *inp, const float *weight, const double *save_mean,
                                  const double *save_var, int B, int C, int HW, float eps,
                                  const double **coef)
{
    int S = bn_exact_splits(B);
    double *p1 = scr, *p2 = scr + (size_t)C * S, *cf = scr + (size_t)2 * C * S;
    dim3 grid((unsigned)C, (unsigned)S);
    bn_partial_k<T><<<grid, 256>>>(p1, p2, inp, dout, save_mean, B, C, HW);
    LAUNCH_CHECK_AS(what, "backward sums");
    bn_bwd_finish_k<<<(C + 127) / 128, 128>>>(cf, dweight, dbias, p1, p2, weight, save_var, C, S,
                                              (double)B * HW, (double)eps);
    LAUNCH_CHECK_AS(what, "backward finish");
    *coef = cf;
    return 0;
}

#endif
