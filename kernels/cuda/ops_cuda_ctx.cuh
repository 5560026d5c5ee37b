// The CUDA devices' context (struct ops_ctx), private to kernels/cuda: the fp32 device (ops_cuda.cu) owns
// one; each mixed-precision device (ops_cuda_half.cu) starts its own context with one, created by the same
// cuda_ctx_init, and runs on its cuDNN handle, batch-norm descriptors, plan cache, workspace and scratch,
// adding only its half copies of the convolution weights and weight gradients.
#ifndef PFCPS_KERNELS_CUDA_OPS_CUDA_CTX_CUH
#define PFCPS_KERNELS_CUDA_OPS_CUDA_CTX_CUH

#include <cublas_v2.h>
#include <cudnn.h>
#include <stddef.h>

#include "kernels/conv_cache.h"
#include "kernels/cuda/cuda_ops.h"

struct ops_ctx {
    cudnnDataType_t
        act_type; /* the body activations: FLOAT (ops_cuda), HALF / BFLOAT16 (cuda-fp16 / -bf16) */
    cudnnHandle_t dnn;
    cublasHandle_t blas;
    cudnnTensorDescriptor_t bn_x, bn_p; /* reset per batch-norm call */
    conv_cache conv;                    /* the convolution plans, in act_type */
    void *ws;                           /* convolution workspace, grown when a new shape needs more */
    size_t ws_size;
    void *scr; /* scratch for outputs a caller does not want (dinp NULL in cuDNN's BN backward) */
    size_t scr_bytes;
    float *cscr; /* per-channel scratch: 4*C floats (cuDNN BN mean, inverse std, discarded dw, db) */
    size_t cscr_bytes;
    int tf32;     /* PFCPS_CUDA_TF32=1: allow tensor-op (TF32) fp32 convolution algorithms and GEMMs */
    int bn_exact; /* own float64-sum BatchNorm2d kernels: PFCPS_CUDA_BN=exact, and always for bf16 */
    double *dscr; /* per-channel float64 scratch of the exact batch norm */
    size_t dscr_bytes;
    double *sumsq_part; /* CUDA_SUMSQ_PARTIALS doubles for sumsq */
};

/* Fills c (zeroed by the caller) for body activations of act_type: reads PFCPS_CUDA_TF32 and PFCPS_CUDA_BN,
 * creates the cuDNN and cuBLAS handles (plain fp32 GEMMs unless TF32) and the batch-norm descriptors,
 * allocates sumsq's partials. Returns 0, -EIO (a library call failed, named) or -ENOMEM; after a failure
 * the caller calls cuda_ctx_release. */
int cuda_ctx_init(ops_ctx *c, cudnnDataType_t act_type);

/* Frees everything cuda_ctx_init and the layers allocated in c (not c itself); safe on a partial init. */
void cuda_ctx_release(ops_ctx *c);

/* *buf (device memory, *cap bytes) grown to at least `bytes`, contents not kept. Returns 0 or -ENOMEM
 * naming `what`. */
int cuda_grow(void **buf, size_t *cap, size_t bytes, const char *what);

/* c->dscr grown to n doubles (the exact batch norm's per-channel scratch). Returns 0 or -ENOMEM. */
int cuda_bn_scratch(ops_ctx *c, size_t n);

/* -EINVAL naming the shape unless B, C and HW are positive. */
int cuda_bn_check_shape(int B, int C, int HW);

/* The arguments of kernels/ops.h bn_forward: the shape, save_mean and save_var when training, the running
 * statistics otherwise, eps > 0. Returns 0 or -EINVAL naming the fault. */
int cuda_bn_check_forward(int B, int C, int HW, const double *save_mean, const double *save_var,
                          const float *running_mean, const float *running_var, float eps, int train);

/* The arguments of kernels/ops.h bn_backward: the shape, then (when one of dinp, dweight, dbias is wanted)
 * eps > 0. Returns 1 when none is wanted (nothing to compute), 0 to go on, or -EINVAL naming the fault. */
int cuda_bn_check_backward(int B, int C, int HW, float eps, const void *dinp, const float *dweight,
                           const float *dbias);

/* BatchNorm2d through cuDNN's spatial batch norm (kernels/cuda/cudnn_bn.cuh) on c's handle, descriptors
 * (set here for activations of c->act_type; fp32 parameters and statistics: cuDNN's mixed-precision mode for
 * half activations) and scratch; arguments checked by the caller, otherwise those of kernels/ops.h
 * bn_forward / bn_backward. Return 0, -EIO (cuDNN, named) or -ENOMEM. */
int cuda_cudnn_bn_forward(ops_ctx *c, void *out, const void *inp, const float *weight, const float *bias,
                          float *running_mean, float *running_var, double *save_mean, double *save_var, int B,
                          int C, int HW, float eps, float momentum, int train);
int cuda_cudnn_bn_backward(ops_ctx *c, void *dinp, int acc, float *dweight, float *dbias, const void *dout,
                           const void *inp, const float *weight, const double *save_mean,
                           const double *save_var, int B, int C, int HW, float eps);

/* kernels/ops.h sumsq on c's partials (cuda_sumsq_f32), for every CUDA device's table. */
int cuda_ctx_sumsq(ops_ctx *c, const float *x, size_t n, double *host_out);

#endif
