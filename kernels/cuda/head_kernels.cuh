// The margin-softmax head's device code (kernels/cuda/head.cu): normalization, margin, the fused
// single-process row kernel and the three row kernels of cuda_head_dist, plus the host-side loss of
// cuda_head_dist. Private to head.cu; also compiled as host C++ by tests/kernels/cuda/test_cuda_head_emu.cpp
// under PFCPS_CUDA_EMU (tests/kernels/cuda/cuda_emu.h: blocks run as fibers on the CPU) so that the kernels'
// index math and reductions are checked without a GPU. Kernels assume blockDim.x == HEAD_THREADS,
// one block per row; the emulator may define HEAD_THREADS smaller (a multiple of 32).
#ifndef PFCPS_KERNELS_CUDA_HEAD_KERNELS_CUH
#define PFCPS_KERNELS_CUDA_HEAD_KERNELS_CUH

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda/block_sum.cuh"
#include "kernels/cuda/cuda_ops.h"

#define NORM_EPS     1e-12
#define TARGET_CLAMP 1e-7
#define LOSS_CAP     69.07755278982137 /* -log(1e-30) */
#ifndef HEAD_THREADS
#define HEAD_THREADS 256
#endif

/* One block per row: out = x / max(|x|, eps), inv[row] = 1 / max(|x|, eps) (double sums). */
static __global__ void normalize_inv_k(float *out, double *inv, const float *x, int d)
{
    const float *r = x + (size_t)blockIdx.x * d;
    float *o = out + (size_t)blockIdx.x * d;
    double ss = 0.0;
    for (int j = threadIdx.x; j < d; j += blockDim.x)
        ss += (double)r[j] * r[j];
    ss = block_sum_d<HEAD_THREADS / 32>(ss);
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
    ss = block_sum_d<HEAD_THREADS / 32>(ss);
    dot = block_sum_d<HEAD_THREADS / 32>(dot);
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
 * (z the margin logits), the row loss (row_loss[i] = -inf marks a label outside [-1, k): a real row loss
 * is never -inf, while a row whose target takes all the probability may round a hair below 0); then, when
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
            loss = -INFINITY;
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
    sum = block_sum_d<HEAD_THREADS / 32>(sum);
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

/* cuda_head_dist's loss from the row records r (4n doubles, after the allreduce): head.c's loop, rows
 * in order: total of the row losses -(z_t - max - log sum) (LOSS_CAP without a target; floored at
 * LOSS_CAP with clamp_loss), rows without a target, bad labels and the first row with one (-1: none). */
static inline void head_dist_loss(const double *r, int n, int clamp_loss, double *total, double *no_target,
                                  double *bad, int *bad_row)
{
    double t = 0.0, nt = 0.0, b = 0.0;
    int br = -1;
    for (int i = 0; i < n; i++) {
        double li = LOSS_CAP;
        if (r[4 * i + 3] > 0) {
            b += r[4 * i + 3];
            if (br < 0)
                br = i;
        }
        nt += !(r[4 * i + 2] > 0);
        if (r[4 * i + 2] > 0) {
            li = -(r[4 * i + 1] - log(r[4 * i]));
            if (clamp_loss && li > LOSS_CAP)
                li = LOSS_CAP;
        }
        t += li;
    }
    *total = t;
    *no_target = nt;
    *bad = b;
    *bad_row = br;
}

#endif
