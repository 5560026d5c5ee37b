// Row-wise L2 normalization of embeddings / class centers, (n, d) fp32, one block per row.
#include "kernels/cuda/cuda_ops.h"

#include "kernels/cuda/cuda_check.h"

static __global__ void l2_normalize_rows_kernel(float *out, const float *x, int d, float eps)
{
    const float *row = x + (size_t)blockIdx.x * d;
    float *orow = out + (size_t)blockIdx.x * d;
    __shared__ float partial[32];
    float s = 0.f;
    for (int j = threadIdx.x; j < d; j += blockDim.x)
        s += row[j] * row[j];
    for (int off = 16; off > 0; off >>= 1)
        s += __shfl_down_sync(0xffffffffu, s, off);
    if ((threadIdx.x & 31) == 0)
        partial[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        s = threadIdx.x < (blockDim.x >> 5) ? partial[threadIdx.x] : 0.f;
        for (int off = 16; off > 0; off >>= 1)
            s += __shfl_down_sync(0xffffffffu, s, off);
        if (threadIdx.x == 0)
            partial[0] = s;
    }
    __syncthreads();
    float inv = 1.f / fmaxf(sqrtf(partial[0]), eps);
    for (int j = threadIdx.x; j < d; j += blockDim.x)
        orow[j] = row[j] * inv;
}

extern "C" int cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess)
        return 0;
    return n;
}

extern "C" int cuda_l2_normalize_rows(float *out, const float *x, int n, int d, float eps)
{
    if (n <= 0 || d <= 0)
        return pf_err(-EINVAL, "cuda_l2_normalize_rows: bad shape (%d, %d)", n, d);
    l2_normalize_rows_kernel<<<n, 256>>>(out, x, d, eps);
    CUDA_TRY(cudaGetLastError());
    return 0;
}

extern "C" int cuda_l2_normalize_rows_host(float *host_out, const float *host_x, int n, int d, float eps)
{
    size_t bytes = (size_t)n * d * sizeof(float);
    float *dev = NULL;
    CUDA_TRY(cudaMalloc(&dev, bytes));
    int rc = 0;
    if (cudaMemcpy(dev, host_x, bytes, cudaMemcpyHostToDevice) != cudaSuccess)
        rc = pf_err(-EIO, "cudaMemcpy to device failed");
    if (rc == 0)
        rc = cuda_l2_normalize_rows(dev, dev, n, d, eps);
    if (rc == 0 && cudaDeviceSynchronize() != cudaSuccess)
        rc = pf_err(-EIO, "l2_normalize_rows kernel failed: %s", cudaGetErrorString(cudaGetLastError()));
    if (rc == 0 && cudaMemcpy(host_out, dev, bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
        rc = pf_err(-EIO, "cudaMemcpy to host failed");
    cudaFree(dev);
    return rc;
}
