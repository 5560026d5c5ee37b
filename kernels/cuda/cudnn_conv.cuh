// One convolution shape's cuDNN plan (legacy API), as the CUDA devices build it (kernels/cuda/ops_cuda.cu
// in fp32, kernels/cuda/ops_cuda_half.cu in fp16 / bf16): tensor and filter descriptors of the element
// type, a convolution descriptor per direction (FLOAT compute; each ends up carrying its algorithm's
// math type), the fastest algorithm cudnnFind* reports in the allowed math, the workspace grown to it.
// The plans live in kernels/conv_cache.h's cache: cudnn_conv_build_fwd / _bwd / cudnn_conv_release are
// its callbacks, with a cudnn_conv_cfg as the device context.
#ifndef PFCPS_KERNELS_CUDA_CUDNN_CONV_CUH
#define PFCPS_KERNELS_CUDA_CUDNN_CONV_CUH

#include <cudnn.h>
#include <stddef.h>

#include "kernels/conv_cache.h"
#include "kernels/cuda/cuda_check.h"
extern "C" {
#include "common/log.h"
}

struct cudnn_conv {
    ops_conv_shape s;
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t cf, cbd, cbf; /* per direction: each carries its algorithm's math type */
    cudnnConvolutionFwdAlgo_t fwd;
    cudnnConvolutionBwdDataAlgo_t bwd_data;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter;
};

/* How a device builds its plans (the device context conv_cache_get passes to the callbacks). */
struct cudnn_conv_cfg {
    cudnnHandle_t dnn;
    cudnnDataType_t type; /* of tensors and filters */
    cudnnMathType_t math; /* of the descriptors before the search */
    int any_math;         /* 1: the fastest algorithm in any math; 0: see cudnn_conv_pick */
    const char *which;    /* says which algorithms were looked for: "cuDNN: no forward convolution
                           * algorithm <which>" */
    void **ws;            /* the device's workspace (cudaMalloc'd) and its size, grown as plans need */
    size_t *ws_size;
};

/* Index of the perf result to use: with any_math the fastest that succeeded; otherwise the fastest
 * that succeeded in FMA math (plain fp32), else one reported in default math (cuDNN may label an fp32
 * algorithm so; NVIDIA_TF32_OVERRIDE=0 then rules TF32 out), never tensor-op math. -1 when none. */
template <typename P> static int cudnn_conv_pick(const P *perf, int n, int any_math)
{
    for (int i = 0; i < n; i++)
        if (perf[i].status == CUDNN_STATUS_SUCCESS && (any_math || perf[i].mathType == CUDNN_FMA_MATH))
            return i;
    for (int i = 0; i < n; i++)
        if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].mathType == CUDNN_DEFAULT_MATH)
            return i;
    return -1;
}

static int cudnn_conv_ws(const cudnn_conv_cfg *g, size_t bytes)
{
    if (bytes <= *g->ws_size)
        return 0;
    cudaFree(*g->ws);
    *g->ws = NULL;
    *g->ws_size = 0;
    cudaError_t e = cudaMalloc(g->ws, bytes);
    if (e != cudaSuccess) {
        *g->ws = NULL;
        return pf_err(-ENOMEM, "cuDNN workspace of %zu bytes: %s", bytes, cudaGetErrorString(e));
    }
    *g->ws_size = bytes;
    return 0;
}

static int cudnn_conv_desc(cudnnConvolutionDescriptor_t *d, const ops_conv_shape *s, cudnnMathType_t math)
{
    CUDNN_TRY(cudnnCreateConvolutionDescriptor(d));
    /* compute type FLOAT (with half I/O: cuDNN's PSEUDO_HALF / PSEUDO_BFLOAT16 configuration) */
    CUDNN_TRY(cudnnSetConvolution2dDescriptor(*d, s->pad, s->pad, s->stride, s->stride, 1, 1,
                                              CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    CUDNN_TRY(cudnnSetConvolutionGroupCount(*d, s->groups));
    CUDNN_TRY(cudnnSetConvolutionMathType(*d, math));
    return 0;
}

/* conv_cache_fns.release */
static void cudnn_conv_release(void *entry)
{
    cudnn_conv *e = (cudnn_conv *)entry;
    if (e->x)
        cudnnDestroyTensorDescriptor(e->x);
    if (e->y)
        cudnnDestroyTensorDescriptor(e->y);
    if (e->w)
        cudnnDestroyFilterDescriptor(e->w);
    if (e->cf)
        cudnnDestroyConvolutionDescriptor(e->cf);
    if (e->cbd)
        cudnnDestroyConvolutionDescriptor(e->cbd);
    if (e->cbf)
        cudnnDestroyConvolutionDescriptor(e->cbf);
}

/* conv_cache_fns.build_fwd: descriptors, forward algorithm, workspace. */
static int cudnn_conv_build_fwd(void *cfg, void *entry, const ops_conv_shape *shape)
{
    const cudnn_conv_cfg *g = (const cudnn_conv_cfg *)cfg;
    cudnn_conv *e = (cudnn_conv *)entry;
    e->s = *shape;
    const ops_conv_shape *s = &e->s;
    CUDNN_TRY(cudnnCreateTensorDescriptor(&e->x));
    CUDNN_TRY(cudnnCreateTensorDescriptor(&e->y));
    CUDNN_TRY(cudnnCreateFilterDescriptor(&e->w));
    CUDNN_TRY(cudnnSetTensor4dDescriptor(e->x, CUDNN_TENSOR_NCHW, g->type, s->B, s->C, s->H, s->W));
    CUDNN_TRY(cudnnSetTensor4dDescriptor(e->y, CUDNN_TENSOR_NCHW, g->type, s->B, s->OC, s->OH, s->OW));
    CUDNN_TRY(
        cudnnSetFilter4dDescriptor(e->w, g->type, CUDNN_TENSOR_NCHW, s->OC, s->C / s->groups, s->K, s->K));
    int rc;
    if ((rc = cudnn_conv_desc(&e->cf, s, g->math)) || (rc = cudnn_conv_desc(&e->cbd, s, g->math)) ||
        (rc = cudnn_conv_desc(&e->cbf, s, g->math)))
        return rc;
    int n, oh, ow, oc;
    CUDNN_TRY(cudnnGetConvolution2dForwardOutputDim(e->cf, e->x, e->w, &n, &oc, &oh, &ow));
    if (n != s->B || oc != s->OC || oh != s->OH || ow != s->OW)
        return pf_err(-EINVAL, "cuDNN output %dx%dx%dx%d differs from the shape's %dx%dx%dx%d", n, oc, oh, ow,
                      s->B, s->OC, s->OH, s->OW);
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int got = 0;
    CUDNN_TRY(cudnnFindConvolutionForwardAlgorithm(g->dnn, e->x, e->w, e->cf, e->y,
                                                   CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, perf));
    int i = cudnn_conv_pick(perf, got, g->any_math);
    if (i < 0)
        return pf_err(-EIO, "cuDNN: no forward convolution algorithm %s", g->which);
    e->fwd = perf[i].algo;
    CUDNN_TRY(cudnnSetConvolutionMathType(e->cf, perf[i].mathType));
    log_debug("cuDNN conv %dx%dx%dx%d -> %d k%d s%d g%d (%s): forward algorithm %d, math %d, %.3f ms", s->B,
              s->C, s->H, s->W, s->OC, s->K, s->stride, s->groups, g->which, (int)e->fwd,
              (int)perf[i].mathType, (double)perf[i].time);
    size_t bytes = 0;
    CUDNN_TRY(cudnnGetConvolutionForwardWorkspaceSize(g->dnn, e->x, e->w, e->cf, e->y, e->fwd, &bytes));
    return cudnn_conv_ws(g, bytes);
}

/* conv_cache_fns.build_bwd: backward-data and backward-filter algorithms, workspace. */
static int cudnn_conv_build_bwd(void *cfg, void *entry)
{
    const cudnn_conv_cfg *g = (const cudnn_conv_cfg *)cfg;
    cudnn_conv *e = (cudnn_conv *)entry;
    cudnnConvolutionBwdDataAlgoPerf_t pd[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    cudnnConvolutionBwdFilterAlgoPerf_t pf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int got = 0;
    CUDNN_TRY(cudnnFindConvolutionBackwardDataAlgorithm(g->dnn, e->w, e->y, e->cbd, e->x,
                                                        CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, pd));
    int i = cudnn_conv_pick(pd, got, g->any_math);
    if (i < 0)
        return pf_err(-EIO, "cuDNN: no backward-data convolution algorithm %s", g->which);
    e->bwd_data = pd[i].algo;
    const cudnnMathType_t data_math = pd[i].mathType;
    CUDNN_TRY(cudnnSetConvolutionMathType(e->cbd, data_math));
    got = 0;
    CUDNN_TRY(cudnnFindConvolutionBackwardFilterAlgorithm(g->dnn, e->x, e->y, e->cbf, e->w,
                                                          CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, pf));
    i = cudnn_conv_pick(pf, got, g->any_math);
    if (i < 0)
        return pf_err(-EIO, "cuDNN: no backward-filter convolution algorithm %s", g->which);
    e->bwd_filter = pf[i].algo;
    CUDNN_TRY(cudnnSetConvolutionMathType(e->cbf, pf[i].mathType));
    log_debug("cuDNN conv %dx%dx%dx%d -> %d k%d s%d g%d (%s): backward-data algorithm %d (math %d), "
              "backward-filter algorithm %d (math %d)",
              e->s.B, e->s.C, e->s.H, e->s.W, e->s.OC, e->s.K, e->s.stride, e->s.groups, g->which,
              (int)e->bwd_data, (int)data_math, (int)e->bwd_filter, (int)pf[i].mathType);
    size_t b1 = 0, b2 = 0;
    CUDNN_TRY(
        cudnnGetConvolutionBackwardDataWorkspaceSize(g->dnn, e->w, e->y, e->cbd, e->x, e->bwd_data, &b1));
    CUDNN_TRY(
        cudnnGetConvolutionBackwardFilterWorkspaceSize(g->dnn, e->x, e->y, e->cbf, e->w, e->bwd_filter, &b2));
    return cudnn_conv_ws(g, b1 > b2 ? b1 : b2);
}

/* *out = the plan for shape s from the device's cache (with its backward parts when need_bwd);
 * what: the error context of a failed creation ("cuDNN conv B=.. ..."). */
static int cudnn_conv_get(conv_cache *cache, const cudnn_conv_cfg *g, const char *what,
                          const ops_conv_shape *s, int need_bwd, cudnn_conv **out)
{
    const conv_cache_fns fns = {sizeof(cudnn_conv), cudnn_conv_build_fwd, cudnn_conv_build_bwd,
                                cudnn_conv_release, what};
    void *e = NULL;
    int rc = conv_cache_get(cache, &fns, (void *)g, s, need_bwd, &e);
    *out = (cudnn_conv *)e;
    return rc;
}

/* Frees every plan of the cache. */
static inline void cudnn_conv_clear(conv_cache *cache)
{
    const conv_cache_fns fns = {sizeof(cudnn_conv), cudnn_conv_build_fwd, cudnn_conv_build_bwd,
                                cudnn_conv_release, "cuDNN conv"};
    conv_cache_clear(cache, &fns);
}

#endif
