/* Private to the kernels/cuda .cu files: return-code checks that turn a CUDA / cuBLAS / cuDNN failure into
 * pf_err(-EIO, "<call> failed: <library's error string>"). */
#ifndef PFCPS_KERNELS_CUDA_CUDA_CHECK_H
#define PFCPS_KERNELS_CUDA_CUDA_CHECK_H

#include <cuda_runtime.h>
#include <errno.h>

extern "C" {
#include "common/err.h"
}

#define CUDA_TRY(call)                                                                                       \
    do {                                                                                                     \
        cudaError_t e_ = (call);                                                                             \
        if (e_ != cudaSuccess)                                                                               \
            return pf_err(-EIO, "%s failed: %s", #call, cudaGetErrorString(e_));                             \
    } while (0)

/* After a kernel launch: launch-configuration errors (and earlier asynchronous ones). */
#define LAUNCH_CHECK(what)                                                                                   \
    do {                                                                                                     \
        cudaError_t e_ = cudaGetLastError();                                                                 \
        if (e_ != cudaSuccess)                                                                               \
            return pf_err(-EIO, "kernel %s launch failed: %s", what, cudaGetErrorString(e_));                \
    } while (0)

/* LAUNCH_CHECK for a kernel named by two strings, prefix then what ("half " "prelu_fwd"): the device
 * templates of ops_launch.cuh name their kernels after the device that launches them. */
#define LAUNCH_CHECK_AS(prefix, what)                                                                        \
    do {                                                                                                     \
        cudaError_t e_ = cudaGetLastError();                                                                 \
        if (e_ != cudaSuccess)                                                                               \
            return pf_err(-EIO, "kernel %s%s launch failed: %s", prefix, what, cudaGetErrorString(e_));      \
    } while (0)

#define CUBLAS_TRY(call)                                                                                     \
    do {                                                                                                     \
        cublasStatus_t s_ = (call);                                                                          \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                                     \
            return pf_err(-EIO, "%s failed: %s (%s)", #call, cublasGetStatusName(s_),                        \
                          cublasGetStatusString(s_));                                                        \
    } while (0)

#define CUDNN_TRY(call)                                                                                      \
    do {                                                                                                     \
        cudnnStatus_t s_ = (call);                                                                           \
        if (s_ != CUDNN_STATUS_SUCCESS)                                                                      \
            return pf_err(-EIO, "%s failed: %s", #call, cudnnGetErrorString(s_));                            \
    } while (0)

/* Grid size for n elements, 256 threads per block, capped (kernels loop grid-stride). */
static inline unsigned grid_for(size_t n)
{
    size_t g = (n + 255) / 256;
    if (g > 65535u * 8u)
        g = 65535u * 8u;
    return g ? (unsigned)g : 1u;
}

#endif
