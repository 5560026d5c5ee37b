// Device memory helpers for tests and drivers (see cuda_ops.h).
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_check.h"

extern "C" int cuda_malloc(void **p, size_t bytes)
{
    *p = NULL;
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *p = NULL;
        return pf_err(-ENOMEM, "cudaMalloc(%zu bytes) failed: %s", bytes, cudaGetErrorString(e));
    }
    return 0;
}

extern "C" void cuda_free(void *p)
{
    if (p)
        cudaFree(p);
}

extern "C" int cuda_h2d(void *dst, const void *host_src, size_t bytes)
{
    CUDA_TRY(cudaMemcpy(dst, host_src, bytes, cudaMemcpyHostToDevice));
    return 0;
}

extern "C" int cuda_d2h(void *host_dst, const void *src, size_t bytes)
{
    CUDA_TRY(cudaMemcpy(host_dst, src, bytes, cudaMemcpyDeviceToHost));
    return 0;
}

static __global__ void fill_k(float *p, float v, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = v;
}

extern "C" int cuda_fill_f32(float *p, float v, size_t n)
{
    if (!n)
        return 0;
    fill_k<<<grid_for(n), 256>>>(p, v, n);
    LAUNCH_CHECK("fill_f32");
    return 0;
}

extern "C" int cuda_sync(void)
{
    CUDA_TRY(cudaDeviceSynchronize());
    return 0;
}

extern "C" int cuda_mem_info(size_t *free_bytes, size_t *total_bytes)
{
    CUDA_TRY(cudaMemGetInfo(free_bytes, total_bytes));
    return 0;
}

extern "C" int cuda_set_device(int device)
{
    CUDA_TRY(cudaSetDevice(device));
    return 0;
}

/* ---- pinned host buffers and a side stream for class-center rows ---- */

extern "C" int cuda_host_pinned_alloc(void **p, size_t bytes)
{
    *p = NULL;
    cudaError_t e = cudaHostAlloc(p, bytes ? bytes : 1, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        *p = NULL;
        return pf_err(-ENOMEM, "cudaHostAlloc(%zu bytes) failed: %s", bytes, cudaGetErrorString(e));
    }
    return 0;
}

extern "C" void cuda_host_pinned_free(void *p)
{
    if (p)
        cudaFreeHost(p);
}

extern "C" int cuda_side_stream_create(void **stream)
{
    cudaStream_t s;
    *stream = NULL;
    CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *stream = s;
    return 0;
}

extern "C" void cuda_side_stream_destroy(void *stream)
{
    if (stream)
        cudaStreamDestroy((cudaStream_t)stream);
}

extern "C" int cuda_h2d_async(void *dst, const void *host_src, size_t bytes, void *stream)
{
    CUDA_TRY(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream));
    return 0;
}

extern "C" int cuda_default_stream_wait(void *stream)
{
    cudaEvent_t ev;
    CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    cudaError_t e = cudaEventRecord(ev, (cudaStream_t)stream);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(0, ev, 0);
    cudaEventDestroy(ev); /* released once the recorded work completes */
    if (e != cudaSuccess)
        return pf_err(-EIO, "side stream -> default stream dependency failed: %s", cudaGetErrorString(e));
    return 0;
}
