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

/* ---- device memory, scale and sum of squares (the ops.h memory / utility entries) ---- */

extern "C" int cuda_malloc_zero(void **p, size_t bytes)
{
    int rc = cuda_malloc(p, bytes);
    if (rc)
        return rc;
    cudaError_t e = cudaMemset(*p, 0, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cudaFree(*p);
        *p = NULL;
        return pf_err(-EIO, "cudaMemset(%zu bytes) failed: %s", bytes, cudaGetErrorString(e));
    }
    return 0;
}

extern "C" int cuda_d2d(void *dst, const void *src, size_t bytes)
{
    if (!bytes || dst == src)
        return 0;
    CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
    return 0;
}

extern "C" int cuda_memzero(void *p, size_t bytes)
{
    if (!bytes)
        return 0;
    CUDA_TRY(cudaMemset(p, 0, bytes));
    return 0;
}

static __global__ void scale_k(float *x, size_t n, float a)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = __fmul_rn(x[i], a);
}

extern "C" int cuda_scale_f32(float *x, size_t n, float a)
{
    if (!n)
        return 0;
    scale_k<<<grid_for(n), 256>>>(x, n, a);
    LAUNCH_CHECK("scale_f32");
    return 0;
}

/* One partial sum per block: each thread sums x[i]^2 (double) over a grid-stride loop, then a
 * shared-memory tree reduction (blockDim.x = 256, a power of two) leaves the block's sum in
 * partials[blockIdx.x]. Inf / NaN propagate through the double additions. */
static __global__ void sumsq_k(const float *x, size_t n, double *partials)
{
    __shared__ double sh[256];
    double s = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        double v = (double)x[i];
        s = __dadd_rn(s, __dmul_rn(v, v));
    }
    sh[threadIdx.x] = s;
    __syncthreads();
    for (unsigned h = blockDim.x / 2; h > 0; h >>= 1) {
        if (threadIdx.x < h)
            sh[threadIdx.x] = __dadd_rn(sh[threadIdx.x], sh[threadIdx.x + h]);
        __syncthreads();
    }
    if (threadIdx.x == 0)
        partials[blockIdx.x] = sh[0];
}

extern "C" int cuda_sumsq_f32(const float *x, size_t n, double *dev_partials, double *host_out)
{
    *host_out = 0.0;
    if (!n)
        return 0;
    size_t blocks = (n + 255) / 256;
    if (blocks > CUDA_SUMSQ_PARTIALS)
        blocks = CUDA_SUMSQ_PARTIALS;
    sumsq_k<<<(unsigned)blocks, 256>>>(x, n, dev_partials);
    LAUNCH_CHECK("sumsq_f32");
    double host[CUDA_SUMSQ_PARTIALS];
    /* cudaMemcpy to pageable host memory waits for the kernel (legacy default stream). */
    CUDA_TRY(cudaMemcpy(host, dev_partials, blocks * sizeof(double), cudaMemcpyDeviceToHost));
    double s = 0.0;
    for (size_t b = 0; b < blocks; b++)
        s += host[b];
    *host_out = s;
    return 0;
}

/* ---- kernels/ops.h memory / optimizer entries shared by every CUDA device table (they need no context:
 * the work is on the legacy default stream of the current device) ---- */

extern "C" int cuda_ops_mem_alloc(ops_ctx *c, void **p, size_t bytes)
{
    (void)c;
    return cuda_malloc_zero(p, bytes);
}

extern "C" void cuda_ops_mem_free(ops_ctx *c, void *p)
{
    (void)c;
    cuda_free(p);
}

extern "C" int cuda_ops_mem_h2d(ops_ctx *c, void *dst, const void *host_src, size_t bytes)
{
    (void)c;
    return bytes ? cuda_h2d(dst, host_src, bytes) : 0;
}

extern "C" int cuda_ops_mem_d2h(ops_ctx *c, void *host_dst, const void *src, size_t bytes)
{
    (void)c;
    return bytes ? cuda_d2h(host_dst, src, bytes) : 0;
}

extern "C" int cuda_ops_mem_d2d(ops_ctx *c, void *dst, const void *src, size_t bytes)
{
    (void)c;
    return cuda_d2d(dst, src, bytes);
}

extern "C" int cuda_ops_mem_zero(ops_ctx *c, void *p, size_t bytes)
{
    (void)c;
    return cuda_memzero(p, bytes);
}

extern "C" int cuda_ops_sync(ops_ctx *c)
{
    (void)c;
    return cuda_sync();
}

extern "C" int cuda_ops_sgd_step(ops_ctx *c, float *w, const float *grad, float *mom, size_t n, float lr,
                                 float momentum, float weight_decay)
{
    (void)c;
    return cuda_sgd_step(w, grad, mom, n, lr, momentum, weight_decay);
}

extern "C" int cuda_ops_adamw_step(ops_ctx *c, float *w, const float *grad, float *m, float *v, size_t n,
                                   double lr, double beta1, double beta2, double eps, double weight_decay,
                                   int64_t step)
{
    (void)c;
    return cuda_adamw_step(w, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, step);
}

extern "C" int cuda_ops_scale(ops_ctx *c, float *x, size_t n, float a)
{
    (void)c;
    return cuda_scale_f32(x, n, a);
}
