// CUDA margin-softmax head, row gather/scatter, SGD/AdamW, fp16/bf16 conversion (see cuda_ops.h).
// The math mirrors worker/head/head.c and kernels/cpu/optim_cpu.c line by line; the sources of the
// formulas are cited there (ArcFace eq. 3/4, arcface_torch, torch.optim).
// Layout: the head's kernels are in head_kernels.cuh and its host code in head_impl.cuh, the row /
// optimizer / unscale kernels in head_util_kernels.cuh; this file binds them to CUDA and cuBLAS. The
// headers are also compiled for the CPU by the tests (tests/kernels/cuda/cuda_emu.h, cuda_emu_device.cpp), so
// what runs on the GPU is what CI runs without one.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_check.h"

extern "C" {
#include "common/coll.h"
}

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/head_kernels.cuh"
#include "kernels/cuda/head_util_kernels.cuh"

extern "C" int cuda_malloc_managed(void **p, size_t bytes)
{
    *p = NULL;
    cudaError_t e = cudaMallocManaged(p, bytes ? bytes : 1, cudaMemAttachGlobal);
    if (e != cudaSuccess) {
        *p = NULL;
        return pf_err(-ENOMEM, "cudaMallocManaged of %zu bytes failed: %s", bytes, cudaGetErrorString(e));
    }
    return 0;
}

extern "C" int cuda_managed_concurrent(void)
{
    if (cuda_device_count() == 0)
        return 0;
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrConcurrentManagedAccess, dev) != cudaSuccess) {
        cudaGetLastError(); /* clear: this is a query, not a failure of later calls */
        return 0;
    }
    return v != 0;
}

/* ---- the primitives kernels/cuda/head_impl.cuh is written against ---- */

#define HEAD_LAUNCH(what, grid, kernel, ...)                                                                 \
    do {                                                                                                     \
        kernel<<<(grid), HEAD_THREADS>>>(__VA_ARGS__);                                                       \
        LAUNCH_CHECK(what);                                                                                  \
    } while (0)

/* C (m,n) = op(A) op(B), column-major, fp32 (default math: no TF32). */
static int head_sgemm(void *blas, int ta, int tb, int m, int n, int k, const float *A, int lda,
                      const float *B, int ldb, float *C, int ldc)
{
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_TRY(cublasSgemm((cublasHandle_t)blas, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                           tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &one, A, lda, B, ldb, &zero, C, ldc));
    return 0;
}
static int head_d2h(void *dst, const void *src, size_t bytes)
{
    CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    return 0;
}
static int head_h2d(void *dst, const void *src, size_t bytes)
{
    CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    return 0;
}
static int head_memset0(void *p, size_t bytes)
{
    CUDA_TRY(cudaMemsetAsync(p, 0, bytes, 0));
    return 0;
}
static int head_device_sync(void)
{
    CUDA_TRY(cudaDeviceSynchronize());
    return 0;
}
static int head_blas_create(void **blas)
{
    cublasHandle_t h;
    cublasStatus_t st = cublasCreate(&h);
    if (st != CUBLAS_STATUS_SUCCESS)
        return pf_err(-EIO, "cublasCreate failed: %s", cublasGetStatusString(st));
    *blas = h;
    return 0;
}
static void head_blas_destroy(void *blas)
{
    cublasDestroy((cublasHandle_t)blas);
}
static void head_dfree(void *p)
{
    cudaFree(p);
}

#include "kernels/cuda/head_impl.cuh"

/* ---- gather / scatter of class-center rows ---- */

static int bad_reset(void)
{
    unsigned long long none = ~0ull;
    CUDA_TRY(cudaMemcpyToSymbol(g_bad_row, &none, sizeof none));
    return 0;
}

static int bad_check(const char *what, int64_t rows)
{
    unsigned long long bad = 0;
    CUDA_TRY(cudaMemcpyFromSymbol(&bad, g_bad_row, sizeof bad));
    if (bad != ~0ull)
        return pf_err(-ERANGE, "%s: index of row %llu outside [0, %lld)", what, bad, (long long)rows);
    return 0;
}

/* Before a gather / scatter of k rows of d in a table of `rows`: -EINVAL naming `what` on a bad shape, 1 when
 * k is 0 (nothing to move), else bad_reset's 0 or error. */
static int rows_begin(const char *what, int64_t k, int d, int64_t rows)
{
    if (k < 0 || d <= 0 || rows < 0)
        return pf_err(-EINVAL, "%s: bad shape k %lld, d %d, rows %lld", what, (long long)k, d,
                      (long long)rows);
    return k == 0 ? 1 : bad_reset();
}

extern "C" int cuda_gather_rows(float *out, const float *table, int64_t rows, const int64_t *idx, int64_t k,
                                int d)
{
    int rc = rows_begin("cuda_gather_rows", k, d, rows);
    if (rc)
        return rc > 0 ? 0 : rc;
    gather_k<<<grid_for((size_t)k * d), 256>>>(out, table, rows, idx, k, d);
    LAUNCH_CHECK("gather_rows");
    return bad_check("cuda_gather_rows", rows);
}

extern "C" int cuda_scatter_rows(float *table, int64_t rows, const float *src, const int64_t *idx, int64_t k,
                                 int d, int add)
{
    int rc = rows_begin("cuda_scatter_rows", k, d, rows);
    if (rc)
        return rc > 0 ? 0 : rc;
    scatter_k<<<grid_for((size_t)k * d), 256>>>(table, rows, src, idx, k, d, add);
    LAUNCH_CHECK("scatter_rows");
    return bad_check("cuda_scatter_rows", rows);
}

/* ---- optimizers (no FMA contraction: each operation rounded as on the CPU) ---- */

extern "C" int cuda_sgd_step(float *w, const float *grad, float *mom, size_t n, float lr, float momentum,
                             float weight_decay)
{
    if (!n)
        return 0;
    sgd_k<<<grid_for(n), 256>>>(w, grad, mom, n, lr, momentum, weight_decay, momentum != 0.0f && mom != NULL);
    LAUNCH_CHECK("sgd_step");
    return 0;
}

extern "C" int cuda_adamw_step(float *w, const float *grad, float *m, float *v, size_t n, double lr,
                               double beta1, double beta2, double eps, double weight_decay, int64_t step)
{
    if (step < 1)
        return pf_err(-EINVAL, "cuda adamw: step %lld must be >= 1", (long long)step);
    if (!n)
        return 0;
    adamw_consts c = adamw_consts_of(lr, beta1, beta2, eps, weight_decay, step);
    adamw_k<<<grid_for(n), 256>>>(w, grad, m, v, n, c.step_size, c.bc2_sqrt, c.decay, c.omb1, c.b2, c.omb2,
                                  c.eps);
    LAUNCH_CHECK("adamw_step");
    return 0;
}

/* ---- fp16 / bf16 conversion ----
 * One grid-stride kernel and one launch for the four directions, each direction's element conversion a
 * template argument (round to nearest even towards the 16-bit types, exact towards fp32). */

static __device__ uint16_t to_f16(float x)
{
    return __half_as_ushort(__float2half_rn(x));
}
static __device__ float from_f16(uint16_t x)
{
    return __half2float(__ushort_as_half(x));
}
static __device__ uint16_t to_bf16(float x)
{
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}
static __device__ float from_bf16(uint16_t x)
{
    return __bfloat162float(__ushort_as_bfloat16(x));
}

template <typename O, typename I, O (*CV)(I)> static __global__ void convert_k(O *out, const I *in, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = CV(in[i]);
}

template <typename O, typename I, O (*CV)(I)>
static int convert(O *out, const I *in, size_t n, const char *what)
{
    if (!n)
        return 0;
    convert_k<O, I, CV><<<grid_for(n), 256>>>(out, in, n);
    LAUNCH_CHECK(what);
    return 0;
}

extern "C" int cuda_f32_to_f16(uint16_t *out, const float *in, size_t n)
{
    return convert<uint16_t, float, to_f16>(out, in, n, "f32_to_f16");
}

extern "C" int cuda_f16_to_f32(float *out, const uint16_t *in, size_t n)
{
    return convert<float, uint16_t, from_f16>(out, in, n, "f16_to_f32");
}

static __global__ void f16_compress_k(uint16_t *out, const float *in, size_t n, float w)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = to_f16(from_f16(to_f16(in[i])) / w);
}

extern "C" int cuda_f16_compress(uint16_t *out, const float *in, size_t n, float w)
{
    if (!n)
        return 0;
    f16_compress_k<<<grid_for(n), 256>>>(out, in, n, w);
    LAUNCH_CHECK("f16_compress");
    return 0;
}

extern "C" int cuda_f32_to_bf16(uint16_t *out, const float *in, size_t n)
{
    return convert<uint16_t, float, to_bf16>(out, in, n, "f32_to_bf16");
}

extern "C" int cuda_bf16_to_f32(float *out, const uint16_t *in, size_t n)
{
    return convert<float, uint16_t, from_bf16>(out, in, n, "bf16_to_f32");
}

/* ---- loss scaling: unscale + non-finite check ---- */

extern "C" int cuda_unscale_check(float *grads, size_t n, float inv_scale, int *host_found_inf)
{
    int zero = 0;
    CUDA_TRY(cudaMemcpyToSymbol(g_found_inf, &zero, sizeof zero));
    if (n) {
        unscale_check_k<<<grid_for(n), 256>>>(grads, n, inv_scale);
        LAUNCH_CHECK("unscale_check");
    }
    CUDA_TRY(cudaMemcpyFromSymbol(host_found_inf, g_found_inf, sizeof *host_found_inf));
    return 0;
}
