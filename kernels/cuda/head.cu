// CUDA margin-softmax head, row gather/scatter, SGD/AdamW, fp16/bf16 conversion (see cuda_ops.h).
// The math mirrors worker/head/head.c and worker/head/optim.c line by line; the sources of the
// formulas are cited there (ArcFace eq. 3/4, arcface_torch, torch.optim).
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_check.h"

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

/* Non-target cosine: clamp to [-1, 1]; filtered (tau > 0, c > tau) -> 0 with no gradient. */
static __device__ float other_value(float c, float tau, float *dv)
{
    float cc = c < -1.0f ? -1.0f : (c > 1.0f ? 1.0f : c);
    if (tau > 0.0f && cc > tau) {
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
    const float s = (float)p.s, tau = (float)p.tau;
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
    if (ws->cublas)
        cublasDestroy((cublasHandle_t)ws->cublas);
    memset(ws, 0, sizeof *ws);
}

extern "C" int cuda_head_ws_init(cuda_head_ws *ws, int n_max, int k_max, int d)
{
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
    ws->host_row_loss = (double *)malloc(n * sizeof(double));
    if (!ws->host_row_loss) {
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
    const int d = ws->d;
    cublasHandle_t h = (cublasHandle_t)ws->cublas;
    const float one = 1.0f, zero = 0.0f;
    double g = grad_scale != 0.0 ? grad_scale : 1.0 / n;
    int want_grad = grad_embeddings || grad_centers;

    normalize_inv_k<<<n, HEAD_THREADS>>>(ws->en, ws->inv_e, embeddings, d);
    LAUNCH_CHECK("normalize_rows (embeddings)");
    if (k > 0) {
        normalize_inv_k<<<k, HEAD_THREADS>>>(ws->wn, ws->inv_w, centers, d);
        LAUNCH_CHECK("normalize_rows (centers)");
        /* cos (n,k) = en (n,d) wn (k,d)^T, row-major; column-major cos^T = wn en^T */
        CUBLAS_TRY(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, k, n, d, &one, ws->wn, d, ws->en, d, &zero,
                               ws->cos, k));
    }
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
