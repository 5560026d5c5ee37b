// CUDA device: the backbone layers of kernels/ops.h on cuDNN 9 (convolution, batch norm; legacy
// API), cuBLAS (Linear) and own kernels (PReLU, add, dropout). See cuda_ops.h for the contract and
// the differences from the CPU device (fp32 batch-norm sums; algorithms without TF32).
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cudnn_conv.cuh"
#include "kernels/cuda/ops_cuda_ctx.cuh"

#include <cublas_v2.h>
#include <cudnn.h>
#include <stdlib.h>
#include <string.h>

#include "common/splitmix64.h"
#include "kernels/cuda/cudnn_bn.cuh"
#include "kernels/cuda/ops_kernels.cuh"

/* The shared kernels (ops_kernels.cuh) on fp32 elements: conversions are the identity. */
template <> struct elt<float> {
    static __device__ __forceinline__ float f(float v)
    {
        return v;
    }
    static __device__ __forceinline__ float r(float v)
    {
        return v;
    }
    static __device__ __forceinline__ float rd(double v)
    {
        return (float)v;
    }
};

#include "kernels/cuda/ops_launch.cuh"

int cuda_grow(void **buf, size_t *cap, size_t bytes, const char *what)
{
    if (bytes <= *cap)
        return 0;
    cudaFree(*buf);
    *buf = NULL;
    *cap = 0;
    cudaError_t e = cudaMalloc(buf, bytes);
    if (e != cudaSuccess) {
        *buf = NULL;
        return pf_err(-ENOMEM, "%s of %zu bytes: %s", what, bytes, cudaGetErrorString(e));
    }
    *cap = bytes;
    return 0;
}

/* ---- convolution ---- */

/* The plans (kernels/cuda/cudnn_conv.cuh) are fp32, in FMA math unless PFCPS_CUDA_TF32=1. */
static int conv_get(ops_ctx *c, const ops_conv_shape *s, int need_bwd, cudnn_conv **out)
{
    const cudnn_conv_cfg g = {c->dnn,
                              CUDNN_DATA_FLOAT,
                              c->tf32 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH,
                              c->tf32,
                              c->tf32 ? "in any math" : "in FMA (fp32) math",
                              &c->ws,
                              &c->ws_size};
    return cudnn_conv_get(&c->conv, &g, "cuDNN conv", s, need_bwd, out);
}

static int cuda_conv_forward(ops_ctx *c, float *out, const float *inp, const float *weight,
                             const ops_conv_shape *s)
{
    cudnn_conv *e = NULL;
    int rc = conv_get(c, s, 0, &e);
    if (rc)
        return rc;
    const float one = 1.0f, zero = 0.0f;
    CUDNN_TRY(cudnnConvolutionForward(c->dnn, &one, e->x, inp, e->w, weight, e->cf, e->fwd, c->ws, c->ws_size,
                                      &zero, e->y, out));
    return 0;
}

static int cuda_conv_backward(ops_ctx *c, float *dinp, int acc, float *dweight, const float *dout,
                              const float *inp, const float *weight, const ops_conv_shape *s)
{
    cudnn_conv *e = NULL;
    int rc = conv_get(c, s, 1, &e);
    if (rc)
        return rc;
    const float one = 1.0f, zero = 0.0f;
    if (dinp)
        CUDNN_TRY(cudnnConvolutionBackwardData(c->dnn, &one, e->w, weight, e->y, dout, e->cbd, e->bwd_data,
                                               c->ws, c->ws_size, acc ? &one : &zero, e->x, dinp));
    if (dweight)
        CUDNN_TRY(cudnnConvolutionBackwardFilter(c->dnn, &one, e->x, inp, e->y, dout, e->cbf, e->bwd_filter,
                                                 c->ws, c->ws_size, &one, e->w, dweight));
    return 0;
}

/* ---- batch normalization ---- */

int cuda_bn_check_shape(int B, int C, int HW)
{
    if (B <= 0 || C <= 0 || HW <= 0)
        return pf_err(-EINVAL, "batchnorm shape B=%d C=%d HW=%d: sizes must be positive", B, C, HW);
    return 0;
}

int cuda_bn_check_forward(int B, int C, int HW, const double *save_mean, const double *save_var,
                          const float *running_mean, const float *running_var, float eps, int train)
{
    int rc = cuda_bn_check_shape(B, C, HW);
    if (rc)
        return rc;
    if (train && (!save_mean || !save_var))
        return pf_err(-EINVAL, "batchnorm training forward needs save_mean and save_var");
    if (!train && (!running_mean || !running_var))
        return pf_err(-EINVAL, "batchnorm eval forward needs running statistics");
    if (!(eps > 0.0f))
        return pf_err(-EINVAL, "batchnorm eps %g must be positive", (double)eps);
    return 0;
}

int cuda_bn_check_backward(int B, int C, int HW, float eps, const void *dinp, const float *dweight,
                           const float *dbias)
{
    int rc = cuda_bn_check_shape(B, C, HW);
    if (rc)
        return rc;
    if (!dinp && !dweight && !dbias)
        return 1;
    if (!(eps > 0.0f))
        return pf_err(-EINVAL, "batchnorm eps %g must be positive", (double)eps);
    return 0;
}

/* The batch-norm descriptors for (B, C, HW) activations of c->act_type. */
static int bn_descs(ops_ctx *c, int B, int C, int HW)
{
    CUDNN_TRY(cudnnSetTensor4dDescriptor(c->bn_x, CUDNN_TENSOR_NCHW, c->act_type, B, C, HW, 1));
    CUDNN_TRY(cudnnDeriveBNTensorDescriptor(c->bn_p, c->bn_x, CUDNN_BATCHNORM_SPATIAL));
    return 0;
}

int cuda_cudnn_bn_forward(ops_ctx *c, void *out, const void *inp, const float *weight, const float *bias,
                          float *running_mean, float *running_var, double *save_mean, double *save_var, int B,
                          int C, int HW, float eps, float momentum, int train)
{
    int rc = bn_descs(c, B, C, HW);
    if (rc)
        return rc;
    if (train && (rc = cuda_grow((void **)&c->cscr, &c->cscr_bytes, 4 * (size_t)C * sizeof(float),
                                 "CUDA batch-norm channel scratch")))
        return rc;
    return cudnn_bn_forward(c->dnn, c->bn_x, c->bn_p, out, inp, weight, bias, running_mean, running_var,
                            save_mean, save_var, C, eps, momentum, train, c->cscr);
}

int cuda_cudnn_bn_backward(ops_ctx *c, void *dinp, int acc, float *dweight, float *dbias, const void *dout,
                           const void *inp, const float *weight, const double *save_mean,
                           const double *save_var, int B, int C, int HW, float eps)
{
    int rc = bn_descs(c, B, C, HW);
    if (rc)
        return rc;
    if ((rc = cuda_grow((void **)&c->cscr, &c->cscr_bytes, 4 * (size_t)C * sizeof(float),
                        "CUDA batch-norm channel scratch")))
        return rc;
    void *dx = dinp;
    if (!dx) {
        size_t elt_bytes = c->act_type == CUDNN_DATA_FLOAT ? sizeof(float) : 2;
        if ((rc = cuda_grow(&c->scr, &c->scr_bytes, (size_t)B * C * HW * elt_bytes,
                            "CUDA batch-norm input-gradient scratch")))
            return rc;
        dx = c->scr;
    }
    return cudnn_bn_backward(c->dnn, c->bn_x, c->bn_p, dx, dinp && acc, dweight, dbias, dout, inp, weight,
                             save_mean, save_var, C, eps, c->cscr);
}

/* BatchNorm1d (HW == 1): own kernels, one thread per channel, float64 sums as the CPU device
 * (kernels/cpu/ops_cpu.c). With few samples per channel the backward's three terms nearly cancel
 * (for B = 2 the result scales with eps/(var+eps)): cuDNN's fp32 sums would lose most digits there. */
static __global__ void bn1d_fwd_k(float *out, double *save_mean, double *save_var, const float *inp,
                                  const float *weight, const float *bias, float *running_mean,
                                  float *running_var, int B, int C, double eps, double momentum, int train)
{
    int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= C)
        return;
    double mean, var;
    if (train) {
        double s = 0.0, s2 = 0.0;
        for (int b = 0; b < B; b++)
            s += inp[(size_t)b * C + ch];
        mean = s / B;
        for (int b = 0; b < B; b++) {
            double d = (double)inp[(size_t)b * C + ch] - mean;
            s2 += d * d;
        }
        var = s2 / B;
        save_mean[ch] = mean;
        save_var[ch] = var;
        if (running_mean && running_var) {
            double unbias = B > 1 ? (double)B / (B - 1) : 1.0;
            running_mean[ch] = (float)((1.0 - momentum) * running_mean[ch] + momentum * mean);
            running_var[ch] = (float)((1.0 - momentum) * running_var[ch] + momentum * var * unbias);
        }
    } else {
        mean = running_mean[ch];
        var = running_var[ch];
    }
    double k = (double)weight[ch] / sqrt(var + eps), q = bias[ch];
    for (int b = 0; b < B; b++)
        out[(size_t)b * C + ch] = (float)(((double)inp[(size_t)b * C + ch] - mean) * k + q);
}

static __global__ void bn1d_bwd_k(float *dinp, int acc, float *dweight, float *dbias, const float *dout,
                                  const float *inp, const float *weight, const double *save_mean,
                                  const double *save_var, int B, int C, double eps)
{
    int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= C)
        return;
    double mean = save_mean[ch], rstd = 1.0 / sqrt(save_var[ch] + eps), sdy = 0.0, sdyx = 0.0;
    for (int b = 0; b < B; b++) {
        size_t o = (size_t)b * C + ch;
        sdy += dout[o];
        sdyx += (double)dout[o] * ((double)inp[o] - mean);
    }
    sdyx *= rstd;
    if (dbias)
        dbias[ch] += (float)sdy;
    if (dweight)
        dweight[ch] += (float)sdyx;
    if (!dinp)
        return;
    double k = (double)weight[ch] * rstd, mdy = sdy / B, kx = rstd * (sdyx / B);
    for (int b = 0; b < B; b++) {
        size_t o = (size_t)b * C + ch;
        float v = (float)(k * ((double)dout[o] - mdy - ((double)inp[o] - mean) * kx));
        dinp[o] = acc ? dinp[o] + v : v;
    }
}

/* ---- exact BatchNorm2d (PFCPS_CUDA_BN=exact): the CPU device's float64 math on the GPU ----
 * Per channel: two-pass float64 statistics (partial sums over grid (C, S) blocks, then one thread
 * per channel finishes them), per-element output in float64 then rounded; backward likewise. The
 * kernels are ops_kernels.cuh's (T = float) but for the input gradient: rounded to fp32, then added. */
static __global__ void bnx_dx_k(float *dinp, int acc, const float *dy, const float *x, const double *coef,
                                const double *save_mean, int C, int HW, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int ch = (int)((i / (size_t)HW) % (size_t)C);
        double k = coef[3 * ch], mdy = coef[3 * ch + 1], kx = coef[3 * ch + 2];
        float v = (float)(k * ((double)dy[i] - mdy - ((double)x[i] - save_mean[ch]) * kx));
        dinp[i] = acc ? dinp[i] + v : v;
    }
}

int cuda_bn_scratch(ops_ctx *c, size_t n)
{
    return cuda_grow((void **)&c->dscr, &c->dscr_bytes, n * sizeof(double), "CUDA batch-norm scratch");
}

/* The launches are ops_launch.cuh's (T = float), shared with the half devices. */
static int bnx_forward(ops_ctx *c, float *out, double *save_mean, double *save_var, const float *inp,
                       const float *weight, const float *bias, float *running_mean, float *running_var, int B,
                       int C, int HW, float eps, float momentum, int train)
{
    int rc;
    if (train && (rc = cuda_bn_scratch(c, bn_exact_fwd_doubles(B, C))))
        return rc;
    return bn_exact_forward<float>(c->dscr, "bn exact ", out, save_mean, save_var, inp, weight, bias,
                                   running_mean, running_var, B, C, HW, eps, momentum, train);
}

static int bnx_backward(ops_ctx *c, float *dinp, int acc, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, const double *save_mean,
                        const double *save_var, int B, int C, int HW, float eps)
{
    int rc;
    if ((rc = cuda_bn_scratch(c, bn_exact_bwd_doubles(B, C))))
        return rc;
    const double *coef = NULL;
    if ((rc = bn_exact_backward_sums<float>(c->dscr, "bn exact ", dweight, dbias, dout, inp, weight,
                                            save_mean, save_var, B, C, HW, eps, &coef)))
        return rc;
    if (dinp) {
        size_t n = (size_t)B * C * HW;
        bnx_dx_k<<<grid_for(n), 256>>>(dinp, acc, dout, inp, coef, save_mean, C, HW, n);
        LAUNCH_CHECK("bn exact dx");
    }
    return 0;
}

static int cuda_bn_forward(ops_ctx *c, float *out, double *save_mean, double *save_var, const float *inp,
                           const float *weight, const float *bias, float *running_mean, float *running_var,
                           int B, int C, int HW, float eps, float momentum, int train)
{
    int rc = cuda_bn_check_forward(B, C, HW, save_mean, save_var, running_mean, running_var, eps, train);
    if (rc)
        return rc;
    if (c->bn_exact && HW > 1)
        return bnx_forward(c, out, save_mean, save_var, inp, weight, bias, running_mean, running_var, B, C,
                           HW, eps, momentum, train);
    if (HW == 1) {
        bn1d_fwd_k<<<(C + 127) / 128, 128>>>(out, save_mean, save_var, inp, weight, bias, running_mean,
                                             running_var, B, C, (double)eps, (double)momentum, train);
        LAUNCH_CHECK("bn1d_fwd");
        return 0;
    }
    return cuda_cudnn_bn_forward(c, out, inp, weight, bias, running_mean, running_var, save_mean, save_var, B,
                                 C, HW, eps, momentum, train);
}

static int cuda_bn_backward(ops_ctx *c, float *dinp, int acc, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, const double *save_mean,
                            const double *save_var, int B, int C, int HW, float eps)
{
    int rc = cuda_bn_check_backward(B, C, HW, eps, dinp, dweight, dbias);
    if (rc)
        return rc > 0 ? 0 : rc;
    if (c->bn_exact && HW > 1)
        return bnx_backward(c, dinp, acc, dweight, dbias, dout, inp, weight, save_mean, save_var, B, C, HW,
                            eps);
    if (HW == 1) {
        bn1d_bwd_k<<<(C + 127) / 128, 128>>>(dinp, acc, dweight, dbias, dout, inp, weight, save_mean,
                                             save_var, B, C, (double)eps);
        LAUNCH_CHECK("bn1d_bwd");
        return 0;
    }
    return cuda_cudnn_bn_backward(c, dinp, acc, dweight, dbias, dout, inp, weight, save_mean, save_var, B, C,
                                  HW, eps);
}

/* ---- own kernels: PReLU, add, acc, dropout, bias ---- */

/* Dropout mask i is drawn by splitmix64 (common/splitmix64.h) from (seed, i) only, as on the CPU
 * device (kernels/cpu/ops_cpu.c). */
static __global__ void dropout_fwd_k(float *out, float *mask, const float *inp, size_t n, float p, float keep,
                                     uint64_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        double u = (double)(splitmix64(seed * 0x100000001B3ull + i) >> 11) * 0x1.0p-53;
        float m = u < (double)p ? 0.0f : keep;
        mask[i] = m;
        out[i] = __fmul_rn(inp[i], m);
    }
}

static __global__ void dropout_bwd_k(float *dinp, int acc, const float *dout, const float *mask, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float d = __fmul_rn(dout[i], mask[i]);
        dinp[i] = acc ? dinp[i] + d : d;
    }
}

static __global__ void bias_fill_k(float *out, const float *bias, int B, int OUT)
{
    size_t n = (size_t)B * OUT;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = bias[i % (size_t)OUT];
}

/* dbias[o] += sum_b dout[b, o]: one thread per column (coalesced across o). */
static __global__ void bias_grad_k(float *dbias, const float *dout, int B, int OUT)
{
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= OUT)
        return;
    float s = 0.0f;
    for (int b = 0; b < B; b++)
        s += dout[(size_t)b * OUT + o];
    dbias[o] += s;
}

static int cuda_prelu_forward(ops_ctx *c, float *out, const float *inp, const float *alpha, int B, int C,
                              int HW)
{
    (void)c;
    return prelu_forward_launch<float>("", out, inp, alpha, B, C, HW);
}

static int cuda_prelu_backward(ops_ctx *c, float *dinp, int acc, float *dalpha, const float *dout,
                               const float *inp, const float *alpha, int B, int C, int HW)
{
    (void)c;
    return prelu_backward_launch<float>("", dinp, acc, dalpha, dout, inp, alpha, B, C, HW);
}

/* Row-major out (B,OUT) = inp (B,IN) W^T: column-major out^T (OUT,B) = W^T' inp^T where W (OUT,IN)
 * row-major is the column-major (IN,OUT) matrix Wc: out^T = Wc^T inp^T -> gemm(T, N). */
static int cuda_linear_forward(ops_ctx *c, float *out, const float *inp, const float *weight,
                               const float *bias, int B, int IN, int OUT)
{
    if (B <= 0 || IN <= 0 || OUT <= 0)
        return pf_err(-EINVAL, "linear shape B=%d IN=%d OUT=%d: sizes must be positive", B, IN, OUT);
    if (bias) {
        bias_fill_k<<<grid_for((size_t)B * OUT), 256>>>(out, bias, B, OUT);
        LAUNCH_CHECK("bias_fill");
    }
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_TRY(cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, OUT, B, IN, &one, weight, IN, inp, IN,
                           bias ? &one : &zero, out, OUT));
    return 0;
}

static int cuda_linear_backward(ops_ctx *c, float *dinp, int acc, float *dweight, float *dbias,
                                const float *dout, const float *inp, const float *weight, int B, int IN,
                                int OUT)
{
    if (B <= 0 || IN <= 0 || OUT <= 0)
        return pf_err(-EINVAL, "linear shape B=%d IN=%d OUT=%d: sizes must be positive", B, IN, OUT);
    const float one = 1.0f, zero = 0.0f;
    if (dinp) /* dinp^T (IN,B) = Wc (IN,OUT) dout^T (OUT,B) */
        CUBLAS_TRY(cublasSgemm(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, IN, B, OUT, &one, weight, IN, dout, OUT,
                               acc ? &one : &zero, dinp, IN));
    if (dweight) /* dweight^T (IN,OUT) += inp^T (IN,B) dout (B,OUT) */
        CUBLAS_TRY(cublasSgemm(c->blas, CUBLAS_OP_N, CUBLAS_OP_T, IN, OUT, B, &one, inp, IN, dout, OUT, &one,
                               dweight, IN));
    if (dbias) {
        bias_grad_k<<<(OUT + 255) / 256, 256>>>(dbias, dout, B, OUT);
        LAUNCH_CHECK("bias_grad");
    }
    return 0;
}

static int cuda_add_forward(ops_ctx *c, float *out, const float *a, const float *b, size_t n)
{
    (void)c;
    return add_launch<float>("", out, a, b, n);
}

static int cuda_acc(ops_ctx *c, float *dst, int acc, const float *src, size_t n)
{
    (void)c;
    return acc_launch<float>("", dst, acc, src, n);
}

static int cuda_act_block(int C)
{
    (void)C;
    return 1;
}

static int cuda_to_plain(ops_ctx *c, float *dst, const float *src, int B, int C, int HW)
{
    return cuda_acc(c, dst, 0, src, (size_t)B * C * HW);
}

static int cuda_from_plain(ops_ctx *c, float *dst, int acc, const float *src, int B, int C, int HW)
{
    return cuda_acc(c, dst, acc, src, (size_t)B * C * HW);
}

static int cuda_dropout_forward(ops_ctx *c, float *out, float *mask, const float *inp, size_t n, float p,
                                uint64_t seed)
{
    (void)c;
    if (!(p >= 0.0f && p < 1.0f))
        return pf_err(-EINVAL, "dropout p=%g outside [0, 1)", (double)p);
    if (!n)
        return 0;
    dropout_fwd_k<<<grid_for(n), 256>>>(out, mask, inp, n, p, 1.0f / (1.0f - p), seed);
    LAUNCH_CHECK("dropout_fwd");
    return 0;
}

static int cuda_dropout_backward(ops_ctx *c, float *dinp, int acc, const float *dout, const float *mask,
                                 size_t n)
{
    (void)c;
    if (!n)
        return 0;
    dropout_bwd_k<<<grid_for(n), 256>>>(dinp, acc, dout, mask, n);
    LAUNCH_CHECK("dropout_bwd");
    return 0;
}

/* ---- context (ops_cuda_ctx.cuh: the half devices' contexts start with one) ---- */

void cuda_ctx_release(ops_ctx *c)
{
    cudnn_conv_clear(&c->conv);
    cudaFree(c->ws);
    cudaFree(c->scr);
    cudaFree(c->cscr);
    cudaFree(c->dscr);
    cudaFree(c->sumsq_part);
    if (c->bn_x)
        cudnnDestroyTensorDescriptor(c->bn_x);
    if (c->bn_p)
        cudnnDestroyTensorDescriptor(c->bn_p);
    if (c->blas)
        cublasDestroy(c->blas);
    if (c->dnn)
        cudnnDestroy(c->dnn);
}

int cuda_ctx_init(ops_ctx *c, cudnnDataType_t act_type)
{
    c->act_type = act_type;
    const char *t = getenv("PFCPS_CUDA_TF32");
    c->tf32 = t && strcmp(t, "1") == 0;
    const char *bm = getenv("PFCPS_CUDA_BN");
    c->bn_exact = act_type == CUDNN_DATA_BFLOAT16 || (bm && strcmp(bm, "exact") == 0);
    CUDNN_TRY(cudnnCreate(&c->dnn));
    CUBLAS_TRY(cublasCreate(&c->blas));
    /* Plain fp32 GEMMs (no TF32) unless asked: the CPU device is the reference. */
    CUBLAS_TRY(cublasSetMathMode(c->blas, c->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    CUDNN_TRY(cudnnCreateTensorDescriptor(&c->bn_x));
    CUDNN_TRY(cudnnCreateTensorDescriptor(&c->bn_p));
    return cuda_malloc((void **)&c->sumsq_part, CUDA_SUMSQ_PARTIALS * sizeof(double));
}

int cuda_ctx_sumsq(ops_ctx *c, const float *x, size_t n, double *host_out)
{
    return cuda_sumsq_f32(x, n, c->sumsq_part, host_out);
}

static void cuda_ctx_destroy(ops_ctx *c)
{
    if (!c)
        return;
    cuda_ctx_release(c);
    free(c);
}

static int cuda_ctx_create(ops_ctx **out)
{
    if (cuda_device_count() == 0)
        return pf_err(-ENODEV, "CUDA device: no GPU visible (cudaGetDeviceCount is 0)");
    ops_ctx *c = (ops_ctx *)calloc(1, sizeof *c);
    if (!c)
        return pf_err(-ENOMEM, "CUDA ops context: out of memory");
    int rc = cuda_ctx_init(c, CUDNN_DATA_FLOAT);
    if (rc) {
        cuda_ctx_destroy(c);
        return rc;
    }
    *out = c;
    return 0;
}

/* Memory, optimizer and gradient utilities (kernels/ops.h): cuda_util.cu and head.cu, shared with the
 * other CUDA devices. */
extern "C" const ops_device ops_cuda = {
    .name = "cuda",
    .ctx_create = cuda_ctx_create,
    .ctx_destroy = cuda_ctx_destroy,
    .conv_forward = cuda_conv_forward,
    .conv_backward = cuda_conv_backward,
    .bn_forward = cuda_bn_forward,
    .bn_backward = cuda_bn_backward,
    .prelu_forward = cuda_prelu_forward,
    .prelu_backward = cuda_prelu_backward,
    .linear_forward = cuda_linear_forward,
    .linear_backward = cuda_linear_backward,
    .add_forward = cuda_add_forward,
    .acc = cuda_acc,
    .act_block = cuda_act_block,
    .to_plain = cuda_to_plain,
    .from_plain = cuda_from_plain,
    .dropout_forward = cuda_dropout_forward,
    .dropout_backward = cuda_dropout_backward,
    .act_bytes = 4,
    .plain = NULL,
    .mem_alloc = cuda_ops_mem_alloc,
    .mem_free = cuda_ops_mem_free,
    .mem_h2d = cuda_ops_mem_h2d,
    .mem_d2h = cuda_ops_mem_d2h,
    .mem_d2d = cuda_ops_mem_d2d,
    .mem_zero = cuda_ops_mem_zero,
    .sync = cuda_ops_sync,
    .sgd_step = cuda_ops_sgd_step,
    .adamw_step = cuda_ops_adamw_step,
    .scale = cuda_ops_scale,
    .sumsq = cuda_ctx_sumsq,
};
