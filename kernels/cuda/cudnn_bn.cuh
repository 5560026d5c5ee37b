// cuDNN's spatial batch normalization (legacy API) as the CUDA devices call it (kernels/cuda/ops_cuda.cu
// in fp32, ops_cuda_half.cu in fp16 / bf16; cudnnTensorDescriptor x describes the activation, p the
// parameters derived from it), with the interface's float64 saved statistics (kernels/ops.h) converted
// from and to cuDNN's fp32 mean / inverse std by ops_kernels.cuh's kernels.
#ifndef PFCPS_KERNELS_CUDA_CUDNN_BN_CUH
#define PFCPS_KERNELS_CUDA_CUDNN_BN_CUH

#include <cudnn.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops_kernels.cuh"

/* out = BN(inp) over C channels. train: batch statistics, running_mean / running_var updated in
 * place, save_mean / save_var = the float64 batch mean and biased variance (cs: 2 C floats of device
 * scratch for cuDNN's fp32 ones); else with the running statistics (cs unused). */
static int cudnn_bn_forward(cudnnHandle_t dnn, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t p,
                            void *out, const void *inp, const float *weight, const float *bias,
                            float *running_mean, float *running_var, double *save_mean, double *save_var,
                            int C, float eps, float momentum, int train, float *cs)
{
    const float one = 1.0f, zero = 0.0f;
    if (!train) {
        CUDNN_TRY(cudnnBatchNormalizationForwardInference(dnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, x, inp,
                                                          x, out, p, weight, bias, running_mean, running_var,
                                                          (double)eps));
        return 0;
    }
    float *fm = cs, *finv = cs + C;
    CUDNN_TRY(cudnnBatchNormalizationForwardTraining(dnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, x, inp, x,
                                                     out, p, weight, bias, (double)momentum, running_mean,
                                                     running_var, (double)eps, fm, finv));
    bn_save_to_f64<<<(C + 255) / 256, 256>>>(save_mean, save_var, fm, finv, C, (double)eps);
    LAUNCH_CHECK("bn_save_to_f64");
    return 0;
}

/* dx = (or, with accumulate, +=) the input gradient, dweight / dbias += the parameter gradients (a
 * NULL one goes to scratch: cuDNN writes both). cs: 4 C floats of device scratch. */
static int cudnn_bn_backward(cudnnHandle_t dnn, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t p,
                             void *dx, int accumulate, float *dweight, float *dbias, const void *dout,
                             const void *inp, const float *weight, const double *save_mean,
                             const double *save_var, int C, float eps, float *cs)
{
    float *fm = cs, *finv = cs + C, *dw = dweight ? dweight : cs + 2 * C, *db = dbias ? dbias : cs + 3 * C;
    bn_save_from_f64<<<(C + 255) / 256, 256>>>(fm, finv, save_mean, save_var, C, (double)eps);
    LAUNCH_CHECK("bn_save_from_f64");
    const float one = 1.0f, zero = 0.0f;
    CUDNN_TRY(cudnnBatchNormalizationBackward(dnn, CUDNN_BATCHNORM_SPATIAL, &one, accumulate ? &one : &zero,
                                              &one, &one, x, inp, x, dout, x, dx, p, weight, dw, db,
                                              (double)eps, fm, finv));
    return 0;
}

#endif
