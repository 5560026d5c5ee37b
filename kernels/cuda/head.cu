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

#define NORM_EPS 1e-12
#define TARGET_CLAMP 1e-7
#define LOSS_CAP 69.07755278982137 /* -log(1e-30) */
#define HEAD_THREADS 256

/* Block-wide double sum (blockDim.x == HEAD_THREADS); every thread gets the result. */
static __device__ double block_sum_d(double v)
{
    __shared__ double part[HEAD_THREADS / 32];
    __shared__ double total;
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, off);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int w = 0; w < HEAD_THREADS / 32; w++)
            s += part[w];
        total = s;
    }
    __syncthreads();
    double r = total;
    __syncthreads(); /* total / part reusable by the next call */
    return r;
}

/* One block per row: out = x / max(|x|, eps), inv[row] = 1 / max(|x|, eps) (double sums). */
static __global__ void normalize_inv_k(float *out, double *inv, const float *x, int d)
{
    const float *r = x + (size_t)blockIdx.x * d;
    float *o = out + (size_t)blockIdx.x * d;
    double ss = 0.0;
    for (int j = threadIdx.x; j < d; j += blockDim.x)
        ss += (double)r[j] * r[j];
    ss = block_sum_d(ss);
    double nrm = sqrt(ss);
    double iv = 1.0 / (nrm > NORM_EPS ? nrm : NORM_EPS);
    if (threadIdx.x == 0)
        inv[blockIdx.x] = iv;
    for (int j = threadIdx.x; j < d; j += blockDim.x)
        o[j] = (float)(r[j] * iv);
}

/* Backward of normalize_inv_k, in place on g: g <- (g - y (y.g)) * inv (projection dropped when
 * |x| <= eps: the norm is then the constant eps). */
static __global__ void normalize_bwd_k(float *g, const float *y, const double *inv, const float *x, int d)
{
    size_t base = (size_t)blockIdx.x * d;
    double ss = 0.0, dot = 0.0;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        ss += (double)x[base + j] * x[base + j];
        dot += (double)y[base + j] * g[base + j];
    }
    ss = block_sum_d(ss);
    dot = block_sum_d(dot);
    if (sqrt(ss) <= NORM_EPS)
        dot = 0.0;
    double iv = inv[blockIdx.x];
    for (int j = threadIdx.x; j < d; j += blockDim.x)
        g[base + j] = (float)((g[base + j] - y[base + j] * dot) * iv);
}

static __device__ double clampd(double x, double lo, double hi)
{
    return x < lo ? lo : (x > hi ? hi : x);
}

/* Margin value of a target cosine c (raw) and dv/dc (head.c target_value). */
static __device__ double target_value(const cuda_head_params &p, double c, double *dv)
{
    double cc = clampd(c, -1.0, 1.0);
    double t = clampd(cc, -1.0 + TARGET_CLAMP, 1.0 - TARGET_CLAMP);
    double theta = acos(t);
    double v = cos(p.m1 * theta + p.m2) - p.m3;
    int outer = (c >= -1.0 && c <= 1.0);
    if (p.straight_through) {
        *dv = outer ? 1.0 : 0.0;
    } else {
        int inner = (cc >= -1.0 + TARGET_CLAMP && cc <= 1.0 - TARGET_CLAMP);
        *dv = (outer && inner) ? p.m1 * sin(p.m1 * theta + p.m2) / sqrt(1.0 - t * t) : 0.0;
    }
    return v;
}

/* Non-target cosine: clamp to [-1, 1]; filtered (tau > 0, c > tau) -> 0 with no gradient. The
 * comparison with tau is in double, as head.c's (float cc against the double threshold). */
static __device__ float other_value(float c, double tau, float *dv)
{
    float cc = c < -1.0f ? -1.0f : (c > 1.0f ? 1.0f : c);
    if (tau > 0.0 && (double)cc > tau) {
        *dv = 0.0f;
        return 0.0f;
    }
    *dv = (c >= -1.0f && c <= 1.0f) ? 1.0f : 0.0f;
    return cc;
}

/* Online softmax state (max m, sum of exp(z - m)) merge; m = -inf means empty. */
static __device__ void merge(float &m, float &s, float m2, float s2)
{
    if (m2 == -INFINITY)
        return;
    if (m == -INFINITY) {
        m = m2;
        s = s2;
        return;
    }
    float mm = fmaxf(m, m2);
    s = s * expf(m - mm) + s2 * expf(m2 - mm);
    m = mm;
}

/* One block per row i of cos (n,k): one pass computing the row's max and sum of exp(z - max) online
 * (z the margin logits), the row loss (row_loss[i] = -1 marks a label outside [-1, k)); then, when
 * asked, a second sweep writing logits and/or dL/dcos in place of the cosines. */
static __global__ void head_row_k(float *cosm, float *logits, const int64_t *labels, int k,
                                  cuda_head_params p, double g, double *row_loss, int want_grad)
{
    __shared__ float sm[HEAD_THREADS / 32], ss[HEAD_THREADS / 32];
    __shared__ double zt_sh;
    __shared__ float m_sh, s_sh;
    const int i = blockIdx.x;
    const int64_t li = labels[i];
    const int bad = li < -1 || li >= k;
    float *ci = cosm + (size_t)i * k;
    const float s = (float)p.s;
    const double tau = p.tau;
    if (threadIdx.x == 0)
        zt_sh = 0.0;
    __syncthreads();

    float m = -INFINITY, sum = 0.0f;
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        float z;
        if (j == li) {
            double dv;
            double zd = p.s * target_value(p, ci[j], &dv);
            zt_sh = zd;
            z = (float)zd;
        } else {
            float dv;
            z = s * other_value(ci[j], tau, &dv);
        }
        if (z > m) {
            sum = (m == -INFINITY ? 0.0f : sum * expf(m - z)) + 1.0f;
            m = z;
        } else {
            sum += expf(z - m);
        }
    }
    for (int off = 16; off > 0; off >>= 1) {
        float m2 = __shfl_down_sync(0xffffffffu, m, off);
        float s2 = __shfl_down_sync(0xffffffffu, sum, off);
        merge(m, sum, m2, s2);
    }
    if ((threadIdx.x & 31) == 0) {
        sm[threadIdx.x >> 5] = m;
        ss[threadIdx.x >> 5] = sum;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float mt = -INFINITY, st = 0.0f;
        for (int w = 0; w < HEAD_THREADS / 32; w++)
            merge(mt, st, sm[w], ss[w]);
        m_sh = mt;
        s_sh = st;
        double loss;
        if (bad)
            loss = -1.0;
        else if (li < 0)
            loss = LOSS_CAP;
        else {
            loss = -((zt_sh - (double)mt) - log((double)st));
            if (p.clamp_loss && loss > LOSS_CAP)
                loss = LOSS_CAP;
        }
        row_loss[i] = loss;
    }
    __syncthreads();
    if (!logits && !want_grad)
        return;
    const float mx = m_sh;
    const double inv_sum = 1.0 / (double)s_sh;
    const float scale = (float)(p.s * g * inv_sum);
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        float c = ci[j];
        if (j == li) {
            double dv;
            double z = p.s * target_value(p, c, &dv);
            if (logits)
                logits[(size_t)i * k + j] = (float)z;
            if (want_grad) {
                double pr = exp(z - (double)mx) * inv_sum;
                ci[j] = (float)(p.s * (pr - 1.0) * g * dv);
            }
        } else {
            float dv;
            float z = s * other_value(c, tau, &dv);
            if (logits)
                logits[(size_t)i * k + j] = z;
            if (want_grad)
                ci[j] = dv != 0.0f ? expf(z - mx) * scale : 0.0f;
        }
    }
}

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

/* ---- the head of a worker in a group (cuda_head_dist): head.c's passes, one block per row ---- */

/* Block-wide float max (blockDim.x == HEAD_THREADS); NaN ignored as head.c's `if (z > mx)` does
 * (fmaxf returns the other operand). Every thread gets the result. */
static __device__ float block_max_f(float v)
{
    __shared__ float part[HEAD_THREADS / 32];
    __shared__ float total;
    for (int off = 16; off > 0; off >>= 1)
        v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, off));
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = -INFINITY;
        for (int w = 0; w < HEAD_THREADS / 32; w++)
            m = fmaxf(m, part[w]);
        total = m;
    }
    __syncthreads();
    float r = total;
    __syncthreads();
    return r;
}

/* Pass 1 (head.c "logits and row max"): z of every column of row i (target: s * margin value,
 * computed in double then rounded; others s * clamp/filter in float), logits[i,:] = z when asked,
 * row_max[i] = max_j z (-inf for k == 0). */
static __global__ void dist_max_k(const float *cosm, float *logits, const int64_t *labels, int k,
                                  cuda_head_params p, float *row_max)
{
    const int i = blockIdx.x;
    const int64_t li = labels[i];
    const float *ci = cosm + (size_t)i * k;
    const float s = (float)p.s;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        float z;
        if (j == li) {
            double dv;
            z = (float)(p.s * target_value(p, ci[j], &dv));
        } else {
            float dv;
            z = s * other_value(ci[j], p.tau, &dv);
        }
        if (logits)
            logits[(size_t)i * k + j] = z;
        m = fmaxf(m, z);
    }
    m = block_max_f(m);
    if (threadIdx.x == 0)
        row_max[i] = m;
}

/* Pass 2 (head.c "row sums"): with mx = row_max[i] (global after the allreduce),
 * row_red[4i..4i+3] = {sum_j exp(z_j - mx) over this worker's columns (non-target terms expf in
 * float as head.c, summed in double; the target's exp in double), z_target - mx (0 without a
 * target here), 1 if the target is here else 0, 1 if the label is outside [-1, k) else 0}. */
static __global__ void dist_sum_k(const float *cosm, const int64_t *labels, int k, cuda_head_params p,
                                  const float *row_max, double *row_red)
{
    const int i = blockIdx.x;
    const int64_t li = labels[i];
    const float *ci = cosm + (size_t)i * k;
    const float s = (float)p.s, mx = row_max[i];
    double sum = 0.0;
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        if (j == li)
            continue;
        float dv;
        float e = expf(s * other_value(ci[j], p.tau, &dv) - mx);
        sum += e;
    }
    sum = block_sum_d(sum);
    if (threadIdx.x == 0) {
        double zt = 0.0, has = 0.0;
        if (li >= 0 && li < k) {
            double dv;
            double z = p.s * target_value(p, ci[li], &dv);
            sum += exp(z - (double)mx);
            zt = z - (double)mx;
            has = 1.0;
        }
        double *r = row_red + 4 * (size_t)i;
        r[0] = sum;
        r[1] = zt;
        r[2] = has;
        r[3] = (li < -1 || li >= k) ? 1.0 : 0.0;
    }
}

/* Pass 3 (head.c backward): cos[i,:] <- dL/dcos = s * (p - onehot) * g * dv/dc with the global
 * max and sum: non-target e * (float)(s g / sum) where dv/dc != 0, else 0; target
 * s (exp(z_t - mx) / sum - 1) g dv/dc in double. Labels are in [-1, k) here (checked on the host). */
static __global__ void dist_grad_k(float *cosm, const int64_t *labels, int k, cuda_head_params p, double g,
                                   const float *row_max, const double *row_red)
{
    const int i = blockIdx.x;
    const int64_t li = labels[i];
    float *ci = cosm + (size_t)i * k;
    const float s = (float)p.s, mx = row_max[i];
    const double inv_sum = 1.0 / row_red[4 * (size_t)i];
    const float scale = (float)(p.s * g * inv_sum);
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        float c = ci[j];
        if (j == li) {
            double dv;
            double z = p.s * target_value(p, c, &dv);
            double pr = exp(z - (double)mx) * inv_sum;
            ci[j] = (float)(p.s * (pr - 1.0) * g * dv);
        } else {
            float dv;
            float e = expf(s * other_value(c, p.tau, &dv) - mx);
            ci[j] = dv != 0.0f ? e * scale : 0.0f;
        }
    }
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
    const double *r = ws->host_row_red;
    double total = 0.0, bad = 0.0, no_target = 0.0;
    int bad_row = -1;
    for (int i = 0; i < n; i++) {
        double li = LOSS_CAP;
        if (r[4 * i + 3] > 0) {
            bad += r[4 * i + 3];
            if (bad_row < 0)
                bad_row = i;
        }
        no_target += !(r[4 * i + 2] > 0);
        if (r[4 * i + 2] > 0) {
            li = -(r[4 * i + 1] - log(r[4 * i]));
            if (p->clamp_loss && li > LOSS_CAP)
                li = LOSS_CAP;
        }
        total += li;
    }
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
