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
