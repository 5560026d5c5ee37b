// Mixed-precision CUDA devices "cuda-fp16" (__half) and "cuda-bf16" (__nv_bfloat16): the body of
// the backbone (conv, BatchNorm2d, PReLU, add and their gradients) with 2-byte activations, fp32
// master weights, as torch.autocast runs arcface_torch's iresnet. One templated implementation;
// see cuda_ops.h for the contract. Everything after the flatten runs on the plain fp32 device
// (plain = &ops_cuda, its own context). The context is the fp32 device's (ops_cuda_ctx.cuh: cuDNN and
// cuBLAS handles, descriptors, plan cache, workspace, scratch), created by the same cuda_ctx_init for the
// half element type, plus the half copies of a convolution's weights and weight gradient.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cudnn_conv.cuh"
#include "kernels/cuda/ops_cuda_ctx.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudnn.h>
#include <stdlib.h>
#include <string.h>

/* ---- element type ---- */

/* elt<T> for a 2-byte type: f (T -> float), r (float -> T) and rd (double -> T), round to nearest even,
 * plus the cuDNN data type and the device's name. */
template <typename T> struct elt;
#define HALF_ELT(T, DNN, NAME, TO_F, FROM_F, FROM_D)                                                         \
    template <> struct elt<T> {                                                                              \
        static constexpr cudnnDataType_t dnn = DNN;                                                          \
        static constexpr const char *name = NAME;                                                            \
        static __device__ __forceinline__ float f(T h)                                                       \
        {                                                                                                    \
            return TO_F(h);                                                                                  \
        }                                                                                                    \
        static __device__ __forceinline__ T r(float v)                                                       \
        {                                                                                                    \
            return FROM_F(v);                                                                                \
        }                                                                                                    \
        static __device__ __forceinline__ T rd(double v)                                                     \
        {                                                                                                    \
            return FROM_D(v);                                                                                \
        }                                                                                                    \
    }
HALF_ELT(__half, CUDNN_DATA_HALF, "cuda-fp16", __half2float, __float2half_rn, __double2half);
HALF_ELT(__nv_bfloat16, CUDNN_DATA_BFLOAT16, "cuda-bf16", __bfloat162float, __float2bfloat16_rn,
         __double2bfloat16);

#include "kernels/cuda/ops_cuda_half_kernels.cuh"
#include "kernels/cuda/ops_launch.cuh"

/* ---- context: the fp32 device's (base, first: an hctx * is an ops_ctx *) and the half weight copies ---- */

struct hctx {
    ops_ctx base; /* act_type HALF or BFLOAT16: which table created it */
    void *wh;     /* half copy of a convolution's fp32 weight (converted at each call) */
    size_t wh_bytes;
    void *dwh; /* the convolution's half weight gradient, then added into the fp32 dweight */
    size_t dwh_bytes;
};

static inline hctx *H(ops_ctx *c)
{
    return reinterpret_cast<hctx *>(c);
}

template <typename T> static int ctx_ok(ops_ctx *c)
{
    if (!c || c->act_type != elt<T>::dnn)
        return pf_err(-EINVAL, "%s: context not created by this device's ctx_create", elt<T>::name);
    return 0;
}

/* In a layer of device T: return -EINVAL when another device created the context c_. */
#define CTX_CHECK(T, c_)                                                                                     \
    do {                                                                                                     \
        int rc_ = ctx_ok<T>(c_);                                                                             \
        if (rc_)                                                                                             \
            return rc_;                                                                                      \
    } while (0)

/* CTX_CHECK, then hctx *c = the context c_. */
#define CTX(T, c_, c)                                                                                        \
    CTX_CHECK(T, c_);                                                                                        \
    hctx *c = H(c_)

/* ---- convolution (cuDNN legacy API: half tensors and filters, FLOAT compute, tensor ops allowed) ---- */

/* The plans (kernels/cuda/cudnn_conv.cuh): half tensors and filters, FLOAT compute, the fastest
 * algorithm in any math (tensor ops allowed). */
static int hconv_get(hctx *h, const ops_conv_shape *s, int need_bwd, cudnn_conv **out)
{
    ops_ctx *c = &h->base;
    const cudnn_conv_cfg g = {c->dnn, c->act_type, CUDNN_TENSOR_OP_MATH, 1, "for this half-precision shape",
                              &c->ws, &c->ws_size};
    return cudnn_conv_get(&c->conv, &g, "cuDNN half conv", s, need_bwd, out);
}

/* c->wh = the half copy of weight (n elements). */
template <typename T> static int half_weights(hctx *c, const float *weight, size_t n)
{
    int rc = cuda_grow(&c->wh, &c->wh_bytes, n * sizeof(T), "half weight copy");
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
    ops_ctx *b = &c->base;
    CUDNN_TRY(cudnnConvolutionForward(b->dnn, &one, e->x, inp, e->w, c->wh, e->cf, e->fwd, b->ws, b->ws_size,
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
    ops_ctx *b = &c->base;
    if (dinp) {
        if ((rc = half_weights<T>(c, weight, nw)))
            return rc;
        CUDNN_TRY(cudnnConvolutionBackwardData(b->dnn, &one, e->w, c->wh, e->y, dout, e->cbd, e->bwd_data,
                                               b->ws, b->ws_size, acc ? &one : &zero, e->x, dinp));
    }
    if (dweight) {
        if ((rc = cuda_grow(&c->dwh, &c->dwh_bytes, nw * sizeof(T), "half weight gradient")))
            return rc;
        CUDNN_TRY(cudnnConvolutionBackwardFilter(b->dnn, &one, e->x, inp, e->y, dout, e->cbf, e->bwd_filter,
                                                 b->ws, b->ws_size, &zero, e->w, c->dwh));
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

/* The launches are ops_launch.cuh's, shared with the fp32 device; the input gradient is hbn_dx_k's
 * (float64 sum, one rounding to T). */
template <typename T>
static int hbnx_forward(ops_ctx *c, T *out, double *save_mean, double *save_var, const T *inp,
                        const float *weight, const float *bias, float *running_mean, float *running_var,
                        int B, int C, int HW, float eps, float momentum, int train)
{
    int rc;
    if (train && (rc = cuda_bn_scratch(c, bn_exact_fwd_doubles(B, C))))
        return rc;
    return bn_exact_forward<T>(c->dscr, "half bn ", out, save_mean, save_var, inp, weight, bias, running_mean,
                               running_var, B, C, HW, eps, momentum, train);
}

template <typename T>
static int hbnx_backward(ops_ctx *c, T *dinp, int acc, float *dweight, float *dbias, const T *dout,
                         const T *inp, const float *weight, const double *save_mean, const double *save_var,
                         int B, int C, int HW, float eps)
{
    int rc;
    if ((rc = cuda_bn_scratch(c, bn_exact_bwd_doubles(B, C))))
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

template <typename T>
static int h_bn_forward(ops_ctx *c, float *out, double *save_mean, double *save_var, const float *inp,
                        const float *weight, const float *bias, float *running_mean, float *running_var,
                        int B, int C, int HW, float eps, float momentum, int train)
{
    int rc = ctx_ok<T>(c);
    if (rc == 0)
        rc = cuda_bn_check_forward(B, C, HW, save_mean, save_var, running_mean, running_var, eps, train);
    if (rc)
        return rc;
    if (c->bn_exact)
        return hbnx_forward<T>(c, (T *)out, save_mean, save_var, (const T *)inp, weight, bias, running_mean,
                               running_var, B, C, HW, eps, momentum, train);
    return cuda_cudnn_bn_forward(c, out, inp, weight, bias, running_mean, running_var, save_mean, save_var, B,
                                 C, HW, eps, momentum, train);
}

template <typename T>
static int h_bn_backward(ops_ctx *c, float *dinp, int acc, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, const double *save_mean,
                         const double *save_var, int B, int C, int HW, float eps)
{
    int rc = ctx_ok<T>(c);
    if (rc == 0)
        rc = cuda_bn_check_backward(B, C, HW, eps, dinp, dweight, dbias);
    if (rc)
        return rc > 0 ? 0 : rc;
    if (c->bn_exact)
        return hbnx_backward<T>(c, (T *)dinp, acc, dweight, dbias, (const T *)dout, (const T *)inp, weight,
                                save_mean, save_var, B, C, HW, eps);
    return cuda_cudnn_bn_backward(c, dinp, acc, dweight, dbias, dout, inp, weight, save_mean, save_var, B, C,
                                  HW, eps);
}

/* ---- PReLU ---- */

template <typename T>
static int h_prelu_forward(ops_ctx *c_, float *out, const float *inp, const float *alpha, int B, int C,
                           int HW)
{
    CTX_CHECK(T, c_);
    return prelu_forward_launch<T>("half ", (T *)out, (const T *)inp, alpha, B, C, HW);
}

template <typename T>
static int h_prelu_backward(ops_ctx *c_, float *dinp, int acc, float *dalpha, const float *dout,
                            const float *inp, const float *alpha, int B, int C, int HW)
{
    CTX_CHECK(T, c_);
    return prelu_backward_launch<T>("half ", (T *)dinp, acc, dalpha, (const T *)dout, (const T *)inp, alpha,
                                    B, C, HW);
}

/* ---- add, acc, layout conversions ---- */

template <typename T>
static int h_add_forward(ops_ctx *c_, float *out, const float *a, const float *b, size_t n)
{
    CTX_CHECK(T, c_);
    return add_launch<T>("half ", (T *)out, (const T *)a, (const T *)b, n);
}

template <typename T> static int h_acc(ops_ctx *c_, float *dst, int acc, const float *src, size_t n)
{
    CTX_CHECK(T, c_);
    return acc_launch<T>("half ", (T *)dst, acc, (const T *)src, n);
}

static int h_act_block(int C)
{
    (void)C;
    return 1;
}

template <typename T> static int h_to_plain(ops_ctx *c_, float *dst, const float *src, int B, int C, int HW)
{
    CTX_CHECK(T, c_);
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
    CTX_CHECK(T, c_);
    if (B <= 0 || C <= 0 || HW <= 0)
        return pf_err(-EINVAL, "from_plain shape B=%d C=%d HW=%d: sizes must be positive", B, C, HW);
    size_t n = (size_t)B * C * HW;
    from_plain_k<T><<<grid_for(n), 256>>>((T *)dst, acc, src, n);
    LAUNCH_CHECK("half from_plain");
    return 0;
}

/* ---- after the flatten: the plain fp32 device's (these entries refuse) ---- */

template <typename T> static int after_flatten(const char *layer)
{
    return pf_err(-EINVAL, "%s: %s runs after the flatten, on the plain fp32 device (ops_cuda)", elt<T>::name,
                  layer);
}

template <typename T>
static int h_linear_forward(ops_ctx *, float *, const float *, const float *, const float *, int, int, int)
{
    return after_flatten<T>("linear");
}

template <typename T>
static int h_linear_backward(ops_ctx *, float *, int, float *, float *, const float *, const float *,
                             const float *, int, int, int)
{
    return after_flatten<T>("linear");
}

template <typename T>
static int h_dropout_forward(ops_ctx *, float *, float *, const float *, size_t, float, uint64_t)
{
    return after_flatten<T>("dropout");
}

template <typename T>
static int h_dropout_backward(ops_ctx *, float *, int, const float *, const float *, size_t)
{
    return after_flatten<T>("dropout");
}

/* ---- context ---- */

static void h_ctx_destroy(ops_ctx *c_)
{
    hctx *c = H(c_);
    if (!c)
        return;
    cudaFree(c->wh);
    cudaFree(c->dwh);
    cuda_ctx_release(&c->base);
    free(c);
}

template <typename T> static int h_ctx_create(ops_ctx **out)
{
    *out = NULL;
    if (cuda_device_count() == 0)
        return pf_err(-ENODEV, "%s device: no GPU visible (cudaGetDeviceCount is 0)", elt<T>::name);
    hctx *c = (hctx *)calloc(1, sizeof *c);
    if (!c)
        return pf_err(-ENOMEM, "%s context: out of memory", elt<T>::name);
    int rc = cuda_ctx_init(&c->base, elt<T>::dnn);
    if (rc) {
        h_ctx_destroy(&c->base);
        return pf_err_wrap(rc, "%s context", elt<T>::name);
    }
    *out = &c->base;
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
        .adamw_step = cuda_ops_adamw_step, .scale = cuda_ops_scale, .sumsq = cuda_ctx_sumsq,                 \
    }

extern "C" const ops_device ops_cuda_fp16 = HALF_TABLE(__half, "cuda-fp16");
extern "C" const ops_device ops_cuda_bf16 = HALF_TABLE(__nv_bfloat16, "cuda-bf16");
