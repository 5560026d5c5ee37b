// CUDA margin-softmax head, row gather/scatter, SGD/AdamW, fp16/bf16 conversion (see cuda_ops.h).
// The math mirrors worker/head/head.c and worker/head/optim.c line by line; the sources of the
// formulas are cited there (ArcFace eq. 3/4, arcface_torch, torch.optim).
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

extern "C" void cuda_head_ws_free(cuda_head_ws *ws)
{
    if (!ws)
        return;
    cudaFree(ws->cos);
    cudaFree(ws->en);
    cudaFree(ws->wn);
    cudaFree(ws->inv_e);
    cudaFree(ws->inv_w);
    cudaFree(ws->row_loss);
    free(ws->host_row_loss);
    cudaFree(ws->row_max);
    cudaFree(ws->row_red);
    cudaFree(ws->scal);
    free(ws->host_row_red);
    if (ws->cublas)
        cublasDestroy((cublasHandle_t)ws->cublas);
    memset(ws, 0, sizeof *ws);
}

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

extern "C" int cuda_head_ws_init(cuda_head_ws *ws, int n_max, int k_max, int d)
{
    return cuda_head_ws_init_coll(ws, n_max, k_max, d, 0);
}

extern "C" int cuda_head_ws_init_coll(cuda_head_ws *ws, int n_max, int k_max, int d, int coll_host_memory)
{
    if (!ws)
        return pf_err(-EINVAL, "CUDA head workspace: NULL");
    memset(ws, 0, sizeof *ws);
    if (n_max <= 0 || k_max < 0 || d <= 0)
        return pf_err(-EINVAL, "CUDA head workspace: n_max %d, k_max %d, d %d (need n_max > 0, "
                      "k_max >= 0, d > 0)", n_max, k_max, d);
    if (cuda_device_count() == 0)
        return pf_err(-ENODEV, "CUDA head: no GPU visible");
    size_t n = (size_t)n_max, k1 = k_max ? (size_t)k_max : 1, dd = (size_t)d;
    int rc;
    if ((rc = cuda_malloc((void **)&ws->cos, n * k1 * sizeof(float))) ||
        (rc = cuda_malloc((void **)&ws->en, n * dd * sizeof(float))) ||
        (rc = cuda_malloc((void **)&ws->wn, k1 * dd * sizeof(float))) ||
        (rc = cuda_malloc((void **)&ws->inv_e, n * sizeof(double))) ||
        (rc = cuda_malloc((void **)&ws->inv_w, k1 * sizeof(double))) ||
        (rc = cuda_malloc((void **)&ws->row_loss, n * sizeof(double)))) {
        cuda_head_ws_free(ws);
        return pf_err_wrap(rc, "CUDA head workspace n %d x k %d x d %d", n_max, k_max, d);
    }
    /* the buffers cuda_head_dist's collectives see */
    int (*alloc)(void **, size_t) = coll_host_memory ? cuda_malloc_managed : cuda_malloc;
    if ((rc = alloc((void **)&ws->row_max, n * sizeof(float))) ||
        (rc = alloc((void **)&ws->row_red, 4 * n * sizeof(double))) ||
        (rc = alloc((void **)&ws->scal, 4 * sizeof(double)))) {
        cuda_head_ws_free(ws);
        return pf_err_wrap(rc, "CUDA head workspace (row reductions, %s memory) for n %d",
                           coll_host_memory ? "managed" : "device", n_max);
    }
    ws->coll_host = coll_host_memory != 0;
    ws->host_row_loss = (double *)malloc(n * sizeof(double));
    ws->host_row_red = (double *)malloc(4 * n * sizeof(double));
    if (!ws->host_row_loss || !ws->host_row_red) {
        cuda_head_ws_free(ws);
        return pf_err(-ENOMEM, "CUDA head workspace: out of host memory");
    }
    cublasHandle_t h;
    cublasStatus_t st = cublasCreate(&h);
    if (st != CUBLAS_STATUS_SUCCESS) {
        cuda_head_ws_free(ws);
        return pf_err(-EIO, "cublasCreate failed: %s", cublasGetStatusString(st));
    }
    ws->cublas = h;
    ws->n_max = n_max;
    ws->k_max = k_max;
    ws->d = d;
    return 0;
}

/* Normalized rows and cosines: ws->en, ws->inv_e (n rows), ws->wn, ws->inv_w (k rows),
 * ws->cos (n,k) = en wn^T (cuBLAS, fp32). */
static int head_cosines(cuda_head_ws *ws, const float *embeddings, int n, const float *centers, int k)
{
    const int d = ws->d;
    const float one = 1.0f, zero = 0.0f;
    normalize_inv_k<<<n, HEAD_THREADS>>>(ws->en, ws->inv_e, embeddings, d);
    LAUNCH_CHECK("normalize_rows (embeddings)");
    if (k > 0) {
        normalize_inv_k<<<k, HEAD_THREADS>>>(ws->wn, ws->inv_w, centers, d);
        LAUNCH_CHECK("normalize_rows (centers)");
        /* cos (n,k) = en (n,d) wn (k,d)^T, row-major; column-major cos^T = wn en^T */
        CUBLAS_TRY(cublasSgemm((cublasHandle_t)ws->cublas, CUBLAS_OP_T, CUBLAS_OP_N, k, n, d, &one, ws->wn,
                               d, ws->en, d, &zero, ws->cos, k));
    }
    return 0;
}

/* With ws->cos holding dL/dcos (n,k): the two GEMMs and the normalization backward (each output
 * may be NULL; grad_embeddings is zero when k == 0). */
static int head_backward(cuda_head_ws *ws, const float *embeddings, int n, const float *centers, int k,
                         float *grad_embeddings, float *grad_centers)
{
    const int d = ws->d;
    cublasHandle_t h = (cublasHandle_t)ws->cublas;
    const float one = 1.0f, zero = 0.0f;
    if (grad_embeddings) {
        if (k > 0)
            /* dL/d en (n,d) = dcos (n,k) wn (k,d): column-major en^T = wn^T dcos^T */
            CUBLAS_TRY(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, d, n, k, &one, ws->wn, d, ws->cos, k,
                                   &zero, grad_embeddings, d));
        else
            CUDA_TRY(cudaMemsetAsync(grad_embeddings, 0, (size_t)n * d * sizeof(float), 0));
        normalize_bwd_k<<<n, HEAD_THREADS>>>(grad_embeddings, ws->en, ws->inv_e, embeddings, d);
        LAUNCH_CHECK("normalize_rows backward (embeddings)");
    }
    if (grad_centers && k > 0) {
        /* dL/d wn (k,d) = dcos^T (k,n) en (n,d): column-major wn^T (d,k) = en^T (d,n) dcos (n,k) */
        CUBLAS_TRY(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, d, k, n, &one, ws->en, d, ws->cos, k, &zero,
                               grad_centers, d));
        normalize_bwd_k<<<k, HEAD_THREADS>>>(grad_centers, ws->wn, ws->inv_w, centers, d);
        LAUNCH_CHECK("normalize_rows backward (centers)");
    }
    return 0;
}

extern "C" int cuda_head_forward_backward(const cuda_head_params *p, cuda_head_ws *ws,
                                          const float *embeddings, int n, const float *centers, int k,
                                          const int64_t *labels, double grad_scale, double *host_loss,
                                          float *logits, float *grad_embeddings, float *grad_centers)
{
    if (!p || !ws || !ws->cublas || !embeddings || (!centers && k > 0) || !labels)
        return pf_err(-EINVAL, "CUDA head: NULL argument (or workspace not initialized)");
    if (n <= 0 || n > ws->n_max || k < 0 || k > ws->k_max)
        return pf_err(-EINVAL, "CUDA head: n %d, k %d do not fit the workspace (n_max %d, k_max %d)",
                      n, k, ws->n_max, ws->k_max);
    if (!(p->s > 0) || !isfinite(p->m1) || !isfinite(p->m2) || !isfinite(p->m3))
        return pf_err(-EINVAL, "CUDA head: scale %g must be > 0 and margins (%g, %g, %g) finite", p->s,
                      p->m1, p->m2, p->m3);
    double g = grad_scale != 0.0 ? grad_scale : 1.0 / n;
    int want_grad = grad_embeddings || grad_centers;
    int rc;

    if ((rc = head_cosines(ws, embeddings, n, centers, k)) < 0)
        return rc;
    head_row_k<<<n, HEAD_THREADS>>>(ws->cos, logits, labels, k, *p, g, ws->row_loss, want_grad);
    LAUNCH_CHECK("head_row (margin softmax)");
    CUDA_TRY(cudaMemcpy(ws->host_row_loss, ws->row_loss, (size_t)n * sizeof(double),
                        cudaMemcpyDeviceToHost));
    double total = 0.0;
    for (int i = 0; i < n; i++) {
        if (ws->host_row_loss[i] < 0.0)
            return pf_err(-ERANGE, "CUDA head: the label of row %d is outside [-1, %d)", i, k);
        total += ws->host_row_loss[i];
    }
    if (host_loss)
        *host_loss = total / n;
    return head_backward(ws, embeddings, n, centers, k, grad_embeddings, grad_centers);
}

/* Before a collective on workspace buffers: a host backend reads them on the host. */
static int coll_ready(const cuda_head_ws *ws)
{
    if (ws->coll_host)
        CUDA_TRY(cudaDeviceSynchronize());
    return 0;
}

extern "C" int cuda_head_dist(const cuda_head_params *p, int local_mode, cuda_head_ws *ws, pf_coll *coll,
                              const float *embeddings, int n, const float *centers, int k,
                              const int64_t *labels, double *host_loss, int64_t *host_no_target,
                              float *logits, float *grad_embeddings, float *grad_centers)
{
    if (!p || !ws || !ws->cublas || !ws->row_red || !embeddings || (!centers && k > 0) || !labels)
        return pf_err(-EINVAL, "CUDA head: NULL argument (or workspace not initialized)");
    if (n <= 0 || n > ws->n_max || k < 0 || k > ws->k_max)
        return pf_err(-EINVAL, "CUDA head: n %d, k %d do not fit the workspace (n_max %d, k_max %d)",
                      n, k, ws->n_max, ws->k_max);
    if (!(p->s > 0) || !isfinite(p->m1) || !isfinite(p->m2) || !isfinite(p->m3) || !isfinite(p->tau))
        return pf_err(-EINVAL, "CUDA head: scale %g must be > 0 and margins (%g, %g, %g), tau %g finite",
                      p->s, p->m1, p->m2, p->m3, p->tau);
    if (coll && (!coll->ops || coll->world_size < 1))
        return pf_err(-EINVAL, "CUDA head: collectives handle not initialized");
    const int world = coll ? coll->world_size : 1;
    const int global = !local_mode && world > 1;
    const int local_group = local_mode && world > 1;
    const double g = 1.0 / ((double)n * (local_mode ? world : 1));
    const int want_grad = grad_embeddings || grad_centers;
    int rc;

    if ((rc = head_cosines(ws, embeddings, n, centers, k)) < 0)
        return rc;
    dist_max_k<<<n, HEAD_THREADS>>>(ws->cos, logits, labels, k, *p, ws->row_max);
    LAUNCH_CHECK("head row max");
    if (global) {
        if ((rc = coll_ready(ws)) < 0)
            return rc;
        if ((rc = coll_allreduce(coll, ws->row_max, (size_t)n, COLL_F32, COLL_MAX)) < 0)
            return pf_err_wrap(rc, "CUDA head: allreduce of row max");
    }
    dist_sum_k<<<n, HEAD_THREADS>>>(ws->cos, labels, k, *p, ws->row_max, ws->row_red);
    LAUNCH_CHECK("head row sums");
    if (global) {
        if ((rc = coll_ready(ws)) < 0)
            return rc;
        if ((rc = coll_allreduce(coll, ws->row_red, (size_t)4 * n, COLL_F64, COLL_SUM)) < 0)
            return pf_err_wrap(rc, "CUDA head: allreduce of row sums");
    }
    CUDA_TRY(cudaMemcpy(ws->host_row_red, ws->row_red, (size_t)4 * n * sizeof(double),
                        cudaMemcpyDeviceToHost));

    /* head.c's loss: rows in order, log-softmax of the target, 69.0776 without a target anywhere */
    double total, bad, no_target;
    int bad_row;
    head_dist_loss(ws->host_row_red, n, p->clamp_loss, &total, &no_target, &bad, &bad_row);
    double mean = total / (double)n;
    if (local_group) {
        double sc[4] = {mean, no_target, bad, 0.0};
        CUDA_TRY(cudaMemcpy(ws->scal, sc, sizeof sc, cudaMemcpyHostToDevice));
        if ((rc = coll_ready(ws)) < 0)
            return rc;
        if ((rc = coll_allreduce(coll, ws->scal, 4, COLL_F64, COLL_SUM)) < 0)
            return pf_err_wrap(rc, "CUDA head: allreduce of the local losses");
        CUDA_TRY(cudaMemcpy(sc, ws->scal, sizeof sc, cudaMemcpyDeviceToHost));
        mean = sc[0] / world;
        no_target = sc[1];
        bad = sc[2];
    }
    if (bad > 0) {
        if (bad_row >= 0)
            return pf_err(-ERANGE, "CUDA head: the label of row %d is outside [-1, %d) (%.0f bad label(s) in "
                          "the group)", bad_row, k, bad);
        return pf_err(-ERANGE, "CUDA head: %.0f label(s) outside [-1, k) on another worker of the group", bad);
    }
    if (host_loss)
        *host_loss = mean;
    if (host_no_target)
        *host_no_target = (int64_t)no_target;
    if (!want_grad)
        return 0;
    dist_grad_k<<<n, HEAD_THREADS>>>(ws->cos, labels, k, *p, g, ws->row_max, ws->row_red);
    LAUNCH_CHECK("head dL/dcos");
    return head_backward(ws, embeddings, n, centers, k, grad_embeddings, grad_centers);
}

/* ---- gather / scatter of class-center rows ---- */

/* Smallest i with an index out of range (UINT64_MAX: none). One caller at a time. */
static __device__ unsigned long long g_bad_row;

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

static __global__ void gather_k(float *out, const float *table, int64_t rows, const int64_t *idx,
                                int64_t k, int d)
{
    size_t n = (size_t)k * d;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t i = e / d, j = e % d;
        int64_t r = idx[i];
        if (r < 0 || r >= rows) {
            out[e] = NAN;
            atomicMin(&g_bad_row, (unsigned long long)i);
        } else {
            out[e] = table[(size_t)r * d + j];
        }
    }
}

static __global__ void scatter_k(float *table, int64_t rows, const float *src, const int64_t *idx,
                                 int64_t k, int d, int add)
{
    size_t n = (size_t)k * d;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t i = e / d, j = e % d;
        int64_t r = idx[i];
        if (r < 0 || r >= rows) {
            atomicMin(&g_bad_row, (unsigned long long)i);
        } else if (add) {
            atomicAdd(table + (size_t)r * d + j, src[e]);
        } else {
            table[(size_t)r * d + j] = src[e];
        }
    }
}

extern "C" int cuda_gather_rows(float *out, const float *table, int64_t rows, const int64_t *idx,
                                int64_t k, int d)
{
    if (k < 0 || d <= 0 || rows < 0)
        return pf_err(-EINVAL, "cuda_gather_rows: bad shape k %lld, d %d, rows %lld", (long long)k, d,
                      (long long)rows);
    if (k == 0)
        return 0;
    int rc = bad_reset();
    if (rc)
        return rc;
    gather_k<<<grid_for((size_t)k * d), 256>>>(out, table, rows, idx, k, d);
    LAUNCH_CHECK("gather_rows");
    return bad_check("cuda_gather_rows", rows);
}

extern "C" int cuda_scatter_rows(float *table, int64_t rows, const float *src, const int64_t *idx,
                                 int64_t k, int d, int add)
{
    if (k < 0 || d <= 0 || rows < 0)
        return pf_err(-EINVAL, "cuda_scatter_rows: bad shape k %lld, d %d, rows %lld", (long long)k, d,
                      (long long)rows);
    if (k == 0)
        return 0;
    int rc = bad_reset();
    if (rc)
        return rc;
    scatter_k<<<grid_for((size_t)k * d), 256>>>(table, rows, src, idx, k, d, add);
    LAUNCH_CHECK("scatter_rows");
    return bad_check("cuda_scatter_rows", rows);
}

/* ---- optimizers (no FMA contraction: each operation rounded as on the CPU) ---- */

static __global__ void sgd_k(float *w, const float *grad, float *mom, size_t n, float lr,
                             float momentum, float wd, int use_mom)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float d = __fadd_rn(grad[i], __fmul_rn(wd, w[i]));
        if (use_mom) {
            float m = __fadd_rn(__fmul_rn(momentum, mom[i]), d);
            mom[i] = m;
            w[i] = __fsub_rn(w[i], __fmul_rn(lr, m));
        } else {
            w[i] = __fsub_rn(w[i], __fmul_rn(lr, d));
        }
    }
}

extern "C" int cuda_sgd_step(float *w, const float *grad, float *mom, size_t n, float lr,
                             float momentum, float weight_decay)
{
    if (!n)
        return 0;
    sgd_k<<<grid_for(n), 256>>>(w, grad, mom, n, lr, momentum, weight_decay,
                                momentum != 0.0f && mom != NULL);
    LAUNCH_CHECK("sgd_step");
    return 0;
}

static __global__ void adamw_k(float *w, const float *grad, float *m, float *v, size_t n, float step_size,
                               float bc2_sqrt, float decay, float omb1, float b2, float omb2, float eps)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = grad[i];
        float wi = __fmul_rn(w[i], decay);
        float mi = __fadd_rn(m[i], __fmul_rn(__fsub_rn(g, m[i]), omb1));
        float vi = __fadd_rn(__fmul_rn(v[i], b2), __fmul_rn(__fmul_rn(omb2, g), g));
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
        w[i] = __fsub_rn(wi, __fmul_rn(step_size, __fdiv_rn(mi, denom)));
        m[i] = mi;
        v[i] = vi;
    }
}

extern "C" int cuda_adamw_step(float *w, const float *grad, float *m, float *v, size_t n, double lr,
                               double beta1, double beta2, double eps, double weight_decay, int64_t step)
{
    if (step < 1)
        return pf_err(-EINVAL, "cuda adamw: step %lld must be >= 1", (long long)step);
    if (!n)
        return 0;
    double bc1 = 1.0 - pow(beta1, (double)step);
    double bc2 = 1.0 - pow(beta2, (double)step);
    adamw_k<<<grid_for(n), 256>>>(w, grad, m, v, n, (float)(lr / bc1), (float)sqrt(bc2),
                                  (float)(1.0 - lr * weight_decay), (float)(1.0 - beta1), (float)beta2,
                                  (float)(1.0 - beta2), (float)eps);
    LAUNCH_CHECK("adamw_step");
    return 0;
}

/* ---- fp16 / bf16 conversion ---- */

static __global__ void f32_to_f16_k(uint16_t *out, const float *in, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __half_as_ushort(__float2half_rn(in[i]));
}

static __global__ void f16_to_f32_k(float *out, const uint16_t *in, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __half2float(__ushort_as_half(in[i]));
}

static __global__ void f32_to_bf16_k(uint16_t *out, const float *in, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(in[i]));
}

static __global__ void bf16_to_f32_k(float *out, const uint16_t *in, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __bfloat162float(__ushort_as_bfloat16(in[i]));
}

extern "C" int cuda_f32_to_f16(uint16_t *out, const float *in, size_t n)
{
    if (!n) return 0;
    f32_to_f16_k<<<grid_for(n), 256>>>(out, in, n);
    LAUNCH_CHECK("f32_to_f16");
    return 0;
}

extern "C" int cuda_f16_to_f32(float *out, const uint16_t *in, size_t n)
{
    if (!n) return 0;
    f16_to_f32_k<<<grid_for(n), 256>>>(out, in, n);
    LAUNCH_CHECK("f16_to_f32");
    return 0;
}

extern "C" int cuda_f32_to_bf16(uint16_t *out, const float *in, size_t n)
{
    if (!n) return 0;
    f32_to_bf16_k<<<grid_for(n), 256>>>(out, in, n);
    LAUNCH_CHECK("f32_to_bf16");
    return 0;
}

extern "C" int cuda_bf16_to_f32(float *out, const uint16_t *in, size_t n)
{
    if (!n) return 0;
    bf16_to_f32_k<<<grid_for(n), 256>>>(out, in, n);
    LAUNCH_CHECK("bf16_to_f32");
    return 0;
}

/* ---- loss scaling: unscale + non-finite check ---- */

static __device__ int g_found_inf;

static __global__ void unscale_check_k(float *g, size_t n, float inv_scale)
{
    int bad = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = g[i];
        bad |= !isfinite(v);
        g[i] = v * inv_scale;
    }
    if (bad)
        g_found_inf = 1;
}

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
