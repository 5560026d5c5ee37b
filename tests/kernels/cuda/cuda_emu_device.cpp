// An emulated CUDA device for the head (tests only, no GPU): the memory helpers of
// kernels/cuda/cuda_ops.h on host memory, and the margin-softmax head's exact host code
// (kernels/cuda/head_impl.cuh: workspace, cuda_head_forward_backward, cuda_head_dist) with its
// kernels (kernels/cuda/head_kernels.cuh) run by tests/kernels/cuda/cuda_emu.h (blocks of HEAD_THREADS = 64
// fibers) and cblas for cuBLAS. Linked with worker/head/pfc_cuda.c and tests/kernels/cuda/test_cuda_pfc.c,
// the GPU test runs on the CPU (test cuda_pfc_emu). Launches from several threads (ranks) are
// serialized by one lock. "Device" memory is host malloc filled with 0xff bytes (NaN as float and
// double), so a value read before it was written shows up as NaN.
#include "tests/kernels/cuda/cuda_emu.h"

#define HEAD_THREADS 64

extern "C" {
#include <cblas.h>

#include "common/coll.h"
#include "common/err.h"
}

#include <errno.h>
#include <string.h>

#include <mutex>

#include "kernels/cuda/head_kernels.cuh"

static std::mutex emu_lock;

#define HEAD_LAUNCH(what, grid, kernel, ...)                                                                 \
    do {                                                                                                     \
        (void)(what);                                                                                        \
        std::lock_guard<std::mutex> held_(emu_lock);                                                         \
        emu_launch((unsigned)(grid), HEAD_THREADS, [&] { kernel(__VA_ARGS__); });                            \
    } while (0)

static int head_sgemm(void *, int ta, int tb, int m, int n, int k, const float *A, int lda, const float *B,
                      int ldb, float *C, int ldc)
{
    cblas_sgemm(CblasColMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f,
                A, lda, B, ldb, 0.0f, C, ldc);
    return 0;
}
static int head_d2h(void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
    return 0;
}
static int head_h2d(void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
    return 0;
}
static int head_memset0(void *p, size_t bytes)
{
    memset(p, 0, bytes);
    return 0;
}
static int head_device_sync(void)
{
    return 0;
}
static int head_blas_create(void **blas)
{
    *blas = (void *)&emu_lock; // any non-NULL handle
    return 0;
}
static void head_blas_destroy(void *)
{
}
static void head_dfree(void *p)
{
    free(p);
}

extern "C" {
int cuda_device_count(void)
{
    return 1;
}
int cuda_malloc(void **p, size_t bytes)
{
    *p = malloc(bytes ? bytes : 1);
    if (!*p)
        return pf_err(-ENOMEM, "emulated device: out of memory for %zu bytes", bytes);
    memset(*p, 0xff, bytes ? bytes : 1);
    return 0;
}
int cuda_malloc_managed(void **p, size_t bytes)
{
    return cuda_malloc(p, bytes);
}
int cuda_managed_concurrent(void)
{
    return 1;
}
void cuda_free(void *p)
{
    free(p);
}
int cuda_h2d(void *dst, const void *host_src, size_t bytes)
{
    memcpy(dst, host_src, bytes);
    return 0;
}
int cuda_d2h(void *host_dst, const void *src, size_t bytes)
{
    memcpy(host_dst, src, bytes);
    return 0;
}
int cuda_d2d(void *dst, const void *src, size_t bytes)
{
    if (bytes && dst != src)
        memcpy(dst, src, bytes);
    return 0;
}
int cuda_fill_f32(float *p, float v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = v;
    return 0;
}
int cuda_sync(void)
{
    return 0;
}
}

#include "kernels/cuda/head_impl.cuh"
