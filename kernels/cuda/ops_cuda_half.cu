// Mixed-precision CUDA devices "cuda-fp16" (__half) and "cuda-bf16" (__nv_bfloat16): the body of
// the backbone (conv, BatchNorm2d, PReLU, add and their gradients) with 2-byte activations, fp32
// master weights, as torch.autocast runs arcface_torch's iresnet. One templated implementation;
// see cuda_ops.h for the contract. Everything after the flatten runs on the plain fp32 device
// (plain = &ops_cuda, its own context).
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cudnn_bn.cuh"
#include "kernels/cuda/cudnn_conv.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudnn.h>
#include <stdlib.h>
#include <string.h>

/* ---- element type ---- */

template <typename T> struct elt;
template <> struct elt<__half> {
    static constexpr cudnnDataType_t dnn = CUDNN_DATA_HALF;
    static constexpr const char *name = "cuda-fp16";
    static __device__ __forceinline__ float f(__half h)
    {
        return __half2float(h);
    }
    static __device__ __forceinline__ __half r(float v)
    {
        return __float2half_rn(v);
    }
    static __device__ __forceinline__ __half rd(double v)
    {
        return __double2half(v);
    }
};
template <> struct elt<__nv_bfloat16> {
    static constexpr cudnnDataType_t dnn = CUDNN_DATA_BFLOAT16;
    static constexpr const char *name = "cuda-bf16";
    static __device__ __forceinline__ float f(__nv_bfloat16 h)
    {
        return __bfloat162float(h);
    }
    static __device__ __forceinline__ __nv_bfloat16 r(float v)
    {
        return __float2bfloat16_rn(v);
    }
    static __device__ __forceinline__ __nv_bfloat16 rd(double v)
    {
        return __double2bfloat16(v);
    }
};

#include "kernels/cuda/ops_cuda_half_kernels.cuh"
#include "kernels/cuda/ops_launch.cuh"

/* ---- context (its own type: ops_ctx stays incomplete here, ops_cuda.cu defines that one) ---- */

struct hctx {
    cudnnDataType_t type; /* CUDNN_DATA_HALF or CUDNN_DATA_BFLOAT16: which table created it */
    cudnnHandle_t dnn;
    cudnnTensorDescriptor_t bn_x, bn_p;
    conv_cache conv;
    void *ws; /* cuDNN workspace, grown when a new shape needs more */
    size_t ws_size;
    void *wh; /* half copy of a convolution's fp32 weight (converted at each call) */
    size_t wh_bytes;
    void *dwh; /* the convolution's half weight gradient, then added into the fp32 dweight */
    size_t dwh_bytes;
    void *hscr; /* half scratch: the input gradient cuDNN's BN backward writes when dinp is NULL */
    size_t hscr_bytes;
    float *cscr; /* per-channel fp32 scratch: 4*C (cuDNN BN mean, inverse std, discarded dw, db) */
    size_t cscr_bytes;
    double *dscr; /* per-channel float64 scratch of the own BN kernels */
    size_t dscr_bytes;
    double *sumsq_part; /* CUDA_SUMSQ_PARTIALS doubles for sumsq */
    int bn_exact;       /* own float64 BN kernels (always for bf16; fp16 with PFCPS_CUDA_BN=exact) */
};

static inline hctx *H(ops_ctx *c)
{
    return reinterpret_cast<hctx *>(c);
}

template <typename T> static int ctx_ok(hctx *c)
{
    if (!c || c->type != elt<T>::dnn)
        return pf_err(-EINVAL, "%s: context not created by this device's ctx_create", elt<T>::name);
    return 0;
}

#define CTX(T, c_, c)                                                                                        \
    hctx *c = H(c_);                                                                                         \
    do {                                                                                                     \
        int rc_ = ctx_ok<T>(c);                                                                              \
        if (rc_)                                                                                             \
            return rc_;                                                                                      \
    } while (0)

/* *buf grown to at least bytes (contents not kept). */
static int grow_bytes(void **buf, size_t *cap, size_t bytes, const char *what)
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

/* ---- convolution (cuDNN legacy API: half tensors and filters, FLOAT compute, tensor ops allowed) ---- */

/* The plans (kernels/cuda/cudnn_conv.cuh): half tensors and filters, FLOAT compute, the fastest
 * algorithm in any math (tensor ops allowed). */
static int hconv_get(hctx *c, const ops_conv_shape *s, int need_bwd, cudnn_conv **out)
{
    const cudnn_conv_cfg g = {c->dnn, c->type,    CUDNN_TENSOR_OP_MATH, 1, "for this half-precision shape",
                              &c->ws, &c->ws_size};
    return cudnn_conv_get(&c->conv, &g, "cuDNN half conv", s, need_bwd, out);
}

/* c->wh = the half copy of weight (n elements). */
template <typename T> static int half_weights(hctx *c, const float *weight, size_t n)
{
    int rc = grow_bytes(&c->wh, &c->wh_bytes, n * sizeof(T), "half weight copy");
    if (rc)
        return rc;
    f32_to_h_k<T><<<grid_for(n), 256>>>((T *)c->wh, weight, n);
    LAUNCH_CHECK("half weight copy");
    return 0;
}

template <typename T>
static int h_conv_forward(ops_ctx *c_, float *out, const float *inp, const float *weight,
                          const ops_conv_shape *s)
{
    CTX(T, c_, c);
    cudnn_conv *e = NULL;
    int rc = hconv_get(c, s, 0, &e);
    if (rc)
        return rc;
    size_t nw = (size_t)s->OC * (s->C / s->groups) * s->K * s->K;
    if ((rc = half_weights<T>(c, weight, nw)))
        return rc;
    const float one = 1.0f, zero = 0.0f; /* float scaling factors for half tensors (cuDNN) */
    CUDNN_TRY(cudnnConvolutionForward(c->dnn, &one, e->x, inp, e->w, c->wh, e->cf, e->fwd, c->ws, c->ws_size,
                                      &zero, e->y, out));
    return 0;
}

template <typename T>
static int h_conv_backward(ops_ctx *c_, float *dinp, int acc, float *dweight, const float *dout,
                           const float *inp, const float *weight, const ops_conv_shape *s)
{
    CTX(T, c_, c);
    cudnn_conv *e = NULL;
    int rc = hconv_get(c, s, 1, &e);
    if (rc)
        return rc;
    const float one = 1.0f, zero = 0.0f;
    size_t nw = (size_t)s->OC * (s->C / s->groups) * s->K * s->K;
    if (dinp) {
        if ((rc = half_weights<T>(c, weight, nw)))
            return rc;
        CUDNN_TRY(cudnnConvolutionBackwardData(c->dnn, &one, e->w, c->wh, e->y, dout, e->cbd, e->bwd_data,
                                               c->ws, c->ws_size, acc ? &one : &zero, e->x, dinp));
    }
    if (dweight) {
        if ((rc = grow_bytes(&c->dwh, &c->dwh_bytes, nw * sizeof(T), "half weight gradient")))
            return rc;
        CUDNN_TRY(cudnnConvolutionBackwardFilter(c->dnn, &one, e->x, inp, e->y, dout, e->cbf, e->bwd_filter,
                                                 c->ws, c->ws_size, &zero, e->w, c->dwh));
        acc_h_into_f32_k<T><<<grid_for(nw), 256>>>(dweight, (const T *)c->dwh, nw);
        LAUNCH_CHECK("half weight gradient += into fp32");
    }
    return 0;
}

/* ---- batch normalization ----
 * fp16: cuDNN spatial batch norm, half x/y/dx with fp32 scale, bias, running and saved statistics
 * (cuDNN's documented mixed-precision mode; statistics summed by cuDNN in fp32).
 * bf16 (and fp16 with PFCPS_CUDA_BN=exact): own kernels, the float64 two-pass math of the CPU
 * device (ops_cuda.cu's exact path) reading and writing half elements. */

static int hbn_check(int B, int C, int HW)
{
    if (B <= 0 || C <= 0 || HW <= 0)
        return pf_err(-EINVAL, "batchnorm shape B=%d C=%d HW=%d: sizes must be positive", B, C, HW);
    return 0;
}

/* The launches are ops_launch.cuh's, shared with the fp32 device; the input gradient is hbn_dx_k's
 * (float64 sum, one rounding to T). */
template <typename T>
static int hbnx_forward(hctx *c, T *out, double *save_mean, double *save_var, const T *inp,
                        const float *weight, const float *bias, float *running_mean, float *running_var,
                        int B, int C, int HW, float eps, float momentum, int train)
{
    int rc;
    if (train && (rc = grow_bytes((void **)&c->dscr, &c->dscr_bytes,
                                  bn_exact_fwd_doubles(B, C) * sizeof(double), "batch-norm scratch")))
        return rc;
    return bn_exact_forward<T>(c->dscr, "half bn ", out, save_mean, save_var, inp, weight, bias, running_mean,
                               running_var, B, C, HW, eps, momentum, train);
}

template <typename T>
static int hbnx_backward(hctx *c, T *dinp, int acc, float *dweight, float *dbias, const T *dout, const T *inp,
                         const float *weight, const double *save_mean, const double *save_var, int B, int C,
                         int HW, float eps)
{
    int rc;
    if ((rc = grow_bytes((void **)&c->dscr, &c->dscr_bytes, bn_exact_bwd_doubles(B, C) * sizeof(double),
                         "batch-norm scratch")))
        return rc;
    const double *coef = NULL;
    if ((rc = bn_exact_backward_sums<T>(c->dscr, "half bn ", dweight, dbias, dout, inp, weight, save_mean,
                                        save_var, B, C, HW, eps, &coef)))
        return rc;
    if (dinp) {
        size_t n = (size_t)B * C * HW;
        hbn_dx_k<T><<<grid_for(n), 256>>>(dinp, acc, dout, inp, coef, save_mean, C, HW, n);
        LAUNCH_CHECK("half bn dx");
    }
    return 0;
}

static int hbn_descs(hctx *c, int B, int C, int HW)
{
    CUDNN_TRY(cudnnSetTensor4dDescriptor(c->bn_x, CUDNN_TENSOR_NCHW, c->type, B, C, HW, 1));
    CUDNN_TRY(cudnnDeriveBNTensorDescriptor(c->bn_p, c->bn_x, CUDNN_BATCHNORM_SPATIAL));
    return 0;
}

template <typename T>
static int h_bn_forward(ops_ctx *c_, float *out, double *save_mean, double *save_var, const float *inp,
                        const float *weight, const float *bias, float *running_mean, float *running_var,
                        int B, int C, int HW, float eps, float momentum, int train)
{
    CTX(T, c_, c);
    int rc = hbn_check(B, C, HW);
    if (rc)
        return rc;
    if (train && (!save_mean || !save_var))
        return pf_err(-EINVAL, "batchnorm training forward needs save_mean and save_var");
    if (!train && (!running_mean || !running_var))
        return pf_err(-EINVAL, "batchnorm eval forward needs running statistics");
    if (!(eps > 0.0f))
        return pf_err(-EINVAL, "batchnorm eps %g must be positive", (double)eps);
    if (c->bn_exact)
        return hbnx_forward<T>(c, (T *)out, save_mean, save_var, (const T *)inp, weight, bias, running_mean,
                               running_var, B, C, HW, eps, momentum, train);
    if ((rc = hbn_descs(c, B, C, HW)))
        return rc;
    if (train && (rc = grow_bytes((void **)&c->cscr, &c->cscr_bytes, 4 * (size_t)C * sizeof(float),
                                  "batch-norm channel scratch")))
        return rc;
    return cudnn_bn_forward(c->dnn, c->bn_x, c->bn_p, out, inp, weight, bias, running_mean, running_var,
                            save_mean, save_var, C, eps, momentum, train, c->cscr);
}

template <typename T>
static int h_bn_backward(ops_ctx *c_, float *dinp, int acc, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, const double *save_mean,
                         const double *save_var, int B, int C, int HW, float eps)
{
    CTX(T, c_, c);
    int rc = hbn_check(B, C, HW);
    if (rc)
        return rc;
    if (!dinp && !dweight && !dbias)
        return 0;
    if (!(eps > 0.0f))
        return pf_err(-EINVAL, "batchnorm eps %g must be positive", (double)eps);
    if (c->bn_exact)
        return hbnx_backward<T>(c, (T *)dinp, acc, dweight, dbias, (const T *)dout, (const T *)inp, weight,
                                save_mean, save_var, B, C, HW, eps);
    if ((rc = hbn_descs(c, B, C, HW)))
        return rc;
    if ((rc = grow_bytes((void **)&c->cscr, &c->cscr_bytes, 4 * (size_t)C * sizeof(float),
                         "batch-norm channel scratch")))
        return rc;
    void *dx = dinp;
    if (!dx) {
        if ((rc = grow_bytes(&c->hscr, &c->hscr_bytes, (size_t)B * C * HW * sizeof(T),
                             "batch-norm input-gradient scratch")))
            return rc;
        dx = c->hscr;
    }
    return cudnn_bn_backward(c->dnn, c->bn_x, c->bn_p, dx, dinp && acc, dweight, dbias, dout, inp, weight,
                             save_mean, save_var, C, eps, c->cscr);
}

/* ---- PReLU ---- */

template <typename T>
static int h_prelu_forward(ops_ctx *c_, float *out, const float *inp, const float *alpha, int B, int C,
                           int HW)
{
    CTX(T, c_, c);
    (void)c;
    return prelu_forward_launch<T>("half ", (T *)out, (const T *)inp, alpha, B, C, HW);
}

template <typename T>
static int h_prelu_backward(ops_ctx *c_, float *dinp, int acc, float *dalpha, const float *dout,
                            const float *inp, const float *alpha, int B, int C, int HW)
{
    CTX(T, c_, c);
    (void)c;
    return prelu_backward_launch<T>("half ", (T *)dinp, acc, dalpha, (const T *)dout, (const T *)inp, alpha,
                                    B, C, HW);
}

/* ---- add, acc, layout conversions ---- */

template <typename T>
static int h_add_forward(ops_ctx *c_, float *out, const float *a, const float *b, size_t n)
{
    CTX(T, c_, c);
    (void)c;
    return add_launch<T>("half ", (T *)out, (const T *)a, (const T *)b, n);
}

template <typename T> static int h_acc(ops_ctx *c_, float *dst, int acc, const float *src, size_t n)
{
    CTX(T, c_, c);
    (void)c;
    return acc_launch<T>("half ", (T *)dst, acc, (const T *)src, n);
}

static int h_act_block(int C)
{
    (void)C;
    return 1;
}

template <typename T> static int h_to_plain(ops_ctx *c_, float *dst, const float *src, int B, int C, int HW)
{
    CTX(T, c_, c);
    (void)c;
    if (B <= 0 || C <= 0 || HW <= 0)
        return pf_err(-EINVAL, "to_plain shape B=%d C=%d HW=%d: sizes must be positive", B, C, HW);
    size_t n = (size_t)B * C * HW;
    to_plain_k<T><<<grid_for(n), 256>>>(dst, (const T *)src, n);
    LAUNCH_CHECK("half to_plain");
    return 0;
}

template <typename T>
static int h_from_plain(ops_ctx *c_, float *dst, int acc, const float *src, int B, int C, int HW)
{
    CTX(T, c_, c);
    (void)c;
    if (B <= 0 || C <= 0 || HW <= 0)
        return pf_err(-EINVAL, "from_plain shape B=%d C=%d HW=%d: sizes must be positive", B, C, HW);
    size_t n = (size_t)B * C * HW;
    from_plain_k<T><<<grid_for(n), 256>>>((T *)dst, acc, src, n);
    LAUNCH_CHECK("half from_plain");
    return 0;
}

/* ---- after the flatten: the plain fp32 device's ---- */

template <typename T>
static int h_linear_forward(ops_ctx *c, float *out, const float *inp, const float *weight, const float *bias,
                            int B, int IN, int OUT)
{
    (void)c;
    (void)out;
    (void)inp;
    (void)weight;
    (void)bias;
    (void)B;
    (void)IN;
    (void)OUT;
    return pf_err(-EINVAL, "%s: linear runs after the flatten, on the plain fp32 device (ops_cuda)",
                  elt<T>::name);
}

template <typename T>
static int h_linear_backward(ops_ctx *c, float *dinp, int acc, float *dweight, float *dbias,
                             const float *dout, const float *inp, const float *weight, int B, int IN, int OUT)
{
    (void)c;
    (void)dinp;
    (void)acc;
    (void)dweight;
    (void)dbias;
    (void)dout;
    (void)inp;
    (void)weight;
    (void)B;
    (void)IN;
    (void)OUT;
    return pf_err(-EINVAL, "%s: linear runs after the flatten, on the plain fp32 device (ops_cuda)",
                  elt<T>::name);
}

template <typename T>
static int h_dropout_forward(ops_ctx *c, float *out, float *mask, const float *inp, size_t n, float p,
                             uint64_t seed)
{
    (void)c;
    (void)out;
    (void)mask;
    (void)inp;
    (void)n;
    (void)p;
    (void)seed;
    return pf_err(-EINVAL, "%s: dropout runs after the flatten, on the plain fp32 device (ops_cuda)",
                  elt<T>::name);
}

template <typename T>
static int h_dropout_backward(ops_ctx *c, float *dinp, int acc, const float *dout, const float *mask,
                              size_t n)
{
    (void)c;
    (void)dinp;
    (void)acc;
    (void)dout;
    (void)mask;
    (void)n;
    return pf_err(-EINVAL, "%s: dropout runs after the flatten, on the plain fp32 device (ops_cuda)",
                  elt<T>::name);
}

/* ---- memory, optimizer, utilities: the fp32 CUDA device's helpers (cuda_util.cu, head.cu) ---- */

static int h_sumsq(ops_ctx *c, const float *x, size_t n, double *host_out)
{
    return cuda_sumsq_f32(x, n, H(c)->sumsq_part, host_out);
}

/* ---- context ---- */

static void h_ctx_destroy(ops_ctx *c_)
{
    hctx *c = H(c_);
    if (!c)
        return;
    cudnn_conv_clear(&c->conv);
    cudaFree(c->ws);
    cudaFree(c->wh);
    cudaFree(c->dwh);
    cudaFree(c->hscr);
    cudaFree(c->cscr);
    cudaFree(c->dscr);
    cudaFree(c->sumsq_part);
    if (c->bn_x)
        cudnnDestroyTensorDescriptor(c->bn_x);
    if (c->bn_p)
        cudnnDestroyTensorDescriptor(c->bn_p);
    if (c->dnn)
        cudnnDestroy(c->dnn);
    free(c);
}

static int h_ctx_init(hctx *c)
{
    CUDNN_TRY(cudnnCreate(&c->dnn));
    CUDNN_TRY(cudnnCreateTensorDescriptor(&c->bn_x));
    CUDNN_TRY(cudnnCreateTensorDescriptor(&c->bn_p));
    return cuda_malloc((void **)&c->sumsq_part, CUDA_SUMSQ_PARTIALS * sizeof(double));
}

template <typename T> static int h_ctx_create(ops_ctx **out)
{
    *out = NULL;
    if (cuda_device_count() == 0)
        return pf_err(-ENODEV, "%s device: no GPU visible (cudaGetDeviceCount is 0)", elt<T>::name);
    hctx *c = (hctx *)calloc(1, sizeof *c);
    if (!c)
        return pf_err(-ENOMEM, "%s context: out of memory", elt<T>::name);
    c->type = elt<T>::dnn;
    const char *bm = getenv("PFCPS_CUDA_BN");
    c->bn_exact = c->type == CUDNN_DATA_BFLOAT16 || (bm && strcmp(bm, "exact") == 0);
    int rc = h_ctx_init(c);
    if (rc) {
        h_ctx_destroy(reinterpret_cast<ops_ctx *>(c));
        return pf_err_wrap(rc, "%s context", elt<T>::name);
    }
    *out = reinterpret_cast<ops_ctx *>(c);
    return 0;
}

#define HALF_TABLE(T, NAME)                                                                                  \
    {                                                                                                        \
        .name = NAME, .ctx_create = h_ctx_create<T>, .ctx_destroy = h_ctx_destroy,                           \
        .conv_forward = h_conv_forward<T>, .conv_backward = h_conv_backward<T>,                              \
        .bn_forward = h_bn_forward<T>, .bn_backward = h_bn_backward<T>, .prelu_forward = h_prelu_forward<T>, \
        .prelu_backward = h_prelu_backward<T>, .linear_forward = h_linear_forward<T>,                        \
        .linear_backward = h_linear_backward<T>, .add_forward = h_add_forward<T>, .acc = h_acc<T>,           \
        .act_block = h_act_block, .to_plain = h_to_plain<T>, .from_plain = h_from_plain<T>,                  \
        .dropout_forward = h_dropout_forward<T>, .dropout_backward = h_dropout_backward<T>, .act_bytes = 2,  \
        .plain = &ops_cuda, .mem_alloc = cuda_ops_mem_alloc, .mem_free = cuda_ops_mem_free,                  \
        .mem_h2d = cuda_ops_mem_h2d, .mem_d2h = cuda_ops_mem_d2h, .mem_d2d = cuda_ops_mem_d2d,               \
        .mem_zero = cuda_ops_mem_zero, .sync = cuda_ops_sync, .sgd_step = cuda_ops_sgd_step,                 \
        .adamw_step = cuda_ops_adamw_step, .scale = cuda_ops_scale, .sumsq = h_sumsq,                        \
    }

extern "C" const ops_device ops_cuda_fp16 = HALF_TABLE(__half, "cuda-fp16");
extern "C" const ops_device ops_cuda_bf16 = HALF_TABLE(__nv_bfloat16, "cuda-bf16");
