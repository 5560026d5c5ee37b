/* Margin-softmax head: see head.h for the math and its sources.
 *
 * Layout of one step (N rows, K columns, D features; the three SGEMMs are the floor of its cost).
 * head_forward runs the items up to the allreduce of the row sums and the loss; head_backward the rest, from
 * the workspace the forward left:
 *   - inv_e, inv_w = 1 / max(|row|, eps) (float64 sums of squares); en = e * inv_e is materialized (N x D,
 *     small), the normalized centers are not: cos_ij = (en_i . w_j) * inv_w_j, the column scale applied
 *     on the fly to the SGEMM of en with the raw centers (no K x D write);
 *   - pass 1 over the cosine matrix: row max of the logits (and the logits when asked); the target's
 *     cosine moves to tcos[i]; allreduce of the row max;
 *   - pass 2: e_ij = exp(z_ij - max_i) (vectorized float exp), row sums in float64 lanes; the matrix
 *     keeps a_ij = e_ij * inv_w_j (0 where torch.clamp's or the filter's gradient mask is 0), which is
 *     dL/dcos_ij * inv_w_j up to the row factor f_i = s g / sum_i; allreduce of the row sums;
 *   - the target element becomes (e_t - sum_i) dv inv_w_t, so that f_i a_ij is the whole dL/dcos_ij inv_w_j;
 *   - dL/d en = f_i (a . W), f_i applied in the normalization backward; dL/d wn_j * inv_w_j =
 *     a^T . (f en) (en rows pre-scaled by f_i, N x D); the centers' normalization backward then reads
 *     the raw centers: dL/d w_j = h_j - w_j inv_w_j^2 (w_j . h_j) with h_j = inv_w_j dL/d wn_j.
 * The passes over N x K and K x D are written with GCC vector extensions (8 floats / 4 doubles) and
 * compiled twice where the compiler can (AVX2 clone and a baseline one, chosen at load time). The
 * arithmetic is the same IEEE operations in a fixed order in both (no FMA contraction: ISO C mode),
 * and each row's result depends only on that row: the same bits for any thread count or clone.
 */
#include "worker/head/head.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/err.h"

/* Rows are independent in every elementwise pass: split them over OpenMP threads where available. */
#ifdef _OPENMP
#define PARALLEL_ROWS _Pragma("omp parallel for schedule(static)")
#else
#define PARALLEL_ROWS
#endif

/* The K x D passes (centers' norms + cosine SGEMM; dL/dW SGEMM + centers' normalization backward) run per
 * block of head_center_block(d) centers, each block on one thread with a one-thread SGEMM, so that a block's
 * rows are read from memory once and its gradient is written to memory once (a whole-K SGEMM streams the
 * K x D matrices through memory two to three times: BLAS's beta pass, the update, the backward's pass). The
 * blocks are the same for any thread count, and so are the bits. */
#ifdef _OPENMP
#include <omp.h>
#define BLOCKS_PARALLEL _Pragma("omp parallel for schedule(dynamic, 1)")
#else
#define BLOCKS_PARALLEL
#endif

static int64_t center_block_override; /* head_set_center_block */

int64_t head_center_block(int64_t d)
{
    if (center_block_override > 0)
        return center_block_override;
    int64_t kb = ((int64_t)1 << 18) / (d > 0 ? d : 1); /* 1 MiB of fp32 rows: a core's L2 */
    return kb < 16 ? 16 : kb;
}

void head_set_center_block(int64_t rows)
{
    center_block_override = rows > 0 ? rows : 0;
}

int head_ge_lanes(int64_t n, int64_t d)
{
    int64_t bytes = n * d * (int64_t)sizeof(float);
    int64_t lanes = bytes > 0 ? HEAD_GE_PART_BYTES / bytes : 0;
    return lanes > HEAD_GE_LANES_MAX ? HEAD_GE_LANES_MAX : (int)lanes;
}

/* OpenBLAS's thread count is process-wide: concurrent head calls (ranks run as threads) share one setting.
 * The first caller into a block loop saves it and sets 1, the last one out restores it. Only the pthreads
 * build of OpenBLAS is changed: its OpenMP build runs one thread inside a parallel region by itself (and its
 * openblas_set_num_threads sets OpenMP's count, which the block loops need). */
static pthread_mutex_t blocks_mu = PTHREAD_MUTEX_INITIALIZER;
static int blocks_users, blocks_saved;

/* Before a BLOCKS_PARALLEL loop that calls cblas_sgemm: in an OpenMP build, OpenBLAS (pthreads) goes to one
 * thread (each block's SGEMM runs on the thread that owns the block, and OpenBLAS's bits for a shape depend
 * on its own thread count), whatever the OpenMP thread count. */
static void blocks_begin(void)
{
#ifdef _OPENMP
    if (openblas_get_parallel() != 1)
        return;
    pthread_mutex_lock(&blocks_mu);
    if (blocks_users++ == 0) {
        blocks_saved = openblas_get_num_threads();
        if (blocks_saved > 1)
            openblas_set_num_threads(1);
    }
    pthread_mutex_unlock(&blocks_mu);
#endif
}

static void blocks_end(void)
{
#ifdef _OPENMP
    if (openblas_get_parallel() != 1)
        return;
    pthread_mutex_lock(&blocks_mu);
    if (--blocks_users == 0 && blocks_saved > 1)
        openblas_set_num_threads(blocks_saved);
    pthread_mutex_unlock(&blocks_mu);
#endif
}

#define NORM_EPS     1e-12
#define TARGET_CLAMP 1e-7
/* -log(1e-30): the loss of a row whose target probability is floored (arcface_torch clamp_min). */
#define LOSS_CAP 69.07755278982137

int head_parse_margin_grad(const char *name, head_margin_grad *out)
{
    if (name && strcmp(name, "exact") == 0) {
        *out = HEAD_MARGIN_GRAD_EXACT;
        return 0;
    }
    if (name && strcmp(name, "straight_through") == 0) {
        *out = HEAD_MARGIN_GRAD_STRAIGHT_THROUGH;
        return 0;
    }
    return pf_err(-EINVAL, "margin_grad '%s' is neither 'exact' nor 'straight_through'",
                  name ? name : "(null)");
}

int head_parse_mode(const char *name, head_mode *out)
{
    if (name && strcmp(name, "global") == 0) {
        *out = HEAD_MODE_GLOBAL;
        return 0;
    }
    if (name && strcmp(name, "local") == 0) {
        *out = HEAD_MODE_LOCAL;
        return 0;
    }
    return pf_err(-EINVAL, "head_mode '%s' is neither 'global' nor 'local'", name ? name : "(null)");
}

int head_params_from_config(const pf_config *cfg, head_params *out)
{
    head_params p = {.s = cfg->scale,
                     .m1 = cfg->margin_list[0],
                     .m2 = cfg->margin_list[1],
                     .m3 = cfg->margin_list[2],
                     .interclass_filtering_threshold = cfg->interclass_filtering_threshold};
    int rc;
    if ((rc = head_parse_margin_grad(cfg->margin_grad, &p.margin_grad)) < 0)
        return rc;
    if ((rc = head_parse_mode(cfg->head_mode, &p.mode)) < 0)
        return rc;
    p.sample_ceil = strcmp(cfg->sample_rounding, "ceil") == 0;
    if (!(p.s > 0) || !isfinite(p.m1) || !isfinite(p.m2) || !isfinite(p.m3))
        return pf_err(-EINVAL, "head: scale %g must be > 0 and margin_list (%g, %g, %g) finite", p.s, p.m1,
                      p.m2, p.m3);
    if (strcmp(cfg->margin_combine, "full") != 0) {
        /* arcface_torch's CombinedMarginLoss.forward: m1 == 1 and m3 == 0 is ArcFace (m2); else m3 > 0 is
         * CosFace alone (m1 and m2 unused); anything else raises. */
        if (p.m3 > 0) {
            p.m1 = 1.0;
            p.m2 = 0.0;
        } else if (p.m1 != 1.0) {
            return pf_err(-EINVAL,
                          "margin_list (%g, %g, %g): arcface_torch's CombinedMarginLoss has no such margin (m1 "
                          "must be 1 unless m3 > 0); margin_combine = full computes cos(m1 theta + m2) - m3",
                          p.m1, p.m2, p.m3);
        }
    }
    *out = p;
    return 0;
}

void head_ws_free(head_ws *ws)
{
    if (!ws)
        return;
    free(ws->cos);
    free(ws->en);
    free(ws->en_g);
    free(ws->inv_e);
    free(ws->inv_w);
    free(ws->inv_wf);
    free(ws->row_max);
    free(ws->row_red);
    free(ws->tcos);
    free(ws->ge_part);
    memset(ws, 0, sizeof *ws);
}

int head_ws_init(head_ws *ws, int64_t n_max, int64_t k_max, int64_t d)
{
    memset(ws, 0, sizeof *ws);
    if (n_max <= 0 || k_max < 0 || d <= 0)
        return pf_err(-EINVAL,
                      "head workspace: n_max %lld, k_max %lld, d %lld (need n_max > 0, k_max >= 0, d > 0)",
                      (long long)n_max, (long long)k_max, (long long)d);
    size_t n = (size_t)n_max, k = (size_t)k_max, dd = (size_t)d;
    size_t k1 = k ? k : 1;
    ws->cos = malloc(n * k1 * sizeof(float));
    ws->en = malloc(n * dd * sizeof(float));
    ws->en_g = malloc(n * dd * sizeof(float));
    ws->inv_e = malloc(n * sizeof(double));
    ws->inv_w = malloc(k1 * sizeof(double));
    ws->inv_wf = malloc(k1 * sizeof(float));
    ws->row_max = malloc(n * sizeof(float));
    ws->row_red = malloc(3 * n * sizeof(double));
    ws->tcos = malloc(n * sizeof(float));
    /* lanes(n) * n * d * 4 <= min(HEAD_GE_LANES_MAX * n_max * d * 4, HEAD_GE_PART_BYTES) for every n <= n_max */
    size_t part = (size_t)HEAD_GE_LANES_MAX * n * dd * sizeof(float);
    if (part > (size_t)HEAD_GE_PART_BYTES)
        part = (size_t)HEAD_GE_PART_BYTES;
    if (!(ws->ge_part = malloc(part))) {
        head_ws_free(ws);
        return pf_err(-ENOMEM, "head workspace: out of memory for %zu bytes of partial sums", part);
    }
    if (!ws->cos || !ws->en || !ws->en_g || !ws->inv_e || !ws->inv_w || !ws->inv_wf || !ws->row_max ||
        !ws->row_red || !ws->tcos) {
        head_ws_free(ws);
        return pf_err(-ENOMEM, "head workspace: out of memory for n %lld x k %lld x d %lld", (long long)n_max,
                      (long long)k_max, (long long)d);
    }
    ws->n_max = n_max;
    ws->k_max = k_max;
    ws->d = d;
    return 0;
}

/* ---- Vector kernels -------------------------------------------------------------------------------
 * GCC vector extensions: a v8f is 8 floats, a v4d 4 doubles; the compiler maps them onto AVX2 registers
 * in the AVX2 clone and onto pairs of SSE2 registers in the baseline one. Loads and stores go through
 * memcpy (unaligned). */
typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));
typedef double v4d __attribute__((vector_size(32)));
typedef double v8d __attribute__((vector_size(64)));

/* HEAD_SIMD: an AVX2 clone and a baseline clone, picked once by the loader (ifunc) on x86-64 ELF with
 * GCC; elsewhere (or with PFCPS_HEAD_NO_CLONES, which tests/worker/head/test_head_simd.c uses to build
 * the baseline alone) the one baseline build. The clones compute the same bits (see the file comment). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__ELF__) &&                   \
    !defined(PFCPS_HEAD_NO_CLONES) && !defined(__SANITIZE_THREAD__)
#define HEAD_SIMD __attribute__((target_clones("avx2", "default"), noinline))
#else
#define HEAD_SIMD __attribute__((noinline))
#endif
#define VINLINE static inline __attribute__((always_inline))

/* 32-byte vectors in the signatures of the always-inlined helpers below change no ABI (they never are
 * real calls); GCC (at the end of the translation unit) and Clang warn anyway in the baseline build. */
#pragma GCC diagnostic ignored "-Wpsabi"

VINLINE v8f ld8(const float *p)
{
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}
VINLINE void st8(float *p, v8f v)
{
    memcpy(p, &v, sizeof v);
}
VINLINE v4d ld4d(const float *p) /* 4 floats widened to double (exact) */
{
    v4f v;
    memcpy(&v, p, sizeof v);
    return __builtin_convertvector(v, v4d);
}
VINLINE void st4d(float *p, v4d v) /* 4 doubles rounded to float */
{
    v4f f = __builtin_convertvector(v, v4f);
    memcpy(p, &f, sizeof f);
}
VINLINE v8f sel8(v8i m, v8f a, v8f b) /* m ? a : b lane by lane (m lanes all ones or zero) */
{
    return (v8f)((m & (v8i)a) | (~m & (v8i)b));
}
VINLINE v8f and8(v8i m, v8f a) /* m ? a : +0 lane by lane */
{
    return (v8f)(m & (v8i)a);
}
VINLINE v8f bcast8(float x)
{
    return (v8f){x, x, x, x, x, x, x, x};
}

/* exp(x) for x <= 0 (valid up to x = 88), 8 lanes: Cephes expf (S. L. Moshier): n = round(x / ln 2),
 * r = x - n ln 2 in two parts (Cody-Waite), degree-6 polynomial on |r| <= ln2/2, times 2^n applied as
 * two exact powers of two so that the gradual underflow below x = -87.3 rounds once like expf; x <= -104
 * gives 0 (exp(-104) is below half the least subnormal). At most 1 ulp from the correctly rounded
 * result for every float in [-104, 0] (exhaustive check; tests/worker/head/test_head_simd.c samples
 * it); NaN in, NaN out. */
VINLINE v8f vexp8(v8f x)
{
    x = sel8(x < -104.0f, bcast8(-104.0f), x);
    v8f fn = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest (|x/ln2| < 2^22) */
    v8f r = (x - fn * 0.693359375f) - fn * -2.12194440e-4f;
    v8f y = 1.9875691500e-4f * r + 1.3981999507e-3f; /* Horner, Cephes' coefficients */
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = (y * (r * r) + r) + 1.0f;
    v8i n = __builtin_convertvector(fn, v8i);
    v8i n1 = n >> 1, n2 = n - n1; /* each in [-76, 44] where it matters: 2^n1, 2^n2 normal */
    v8f p1 = (v8f)((v8u)(n1 + 127) << 23), p2 = (v8f)((v8u)(n2 + 127) << 23);
    return (y * p1) * p2;
}

/* The value v of non-target cosines c, 8 lanes: c clamped to [-1, 1], then v = 0 where the clamped c
 * > tau (interclass filtering; tau = +inf when off). *keep: the lanes whose dv/dc is 1 (c inside
 * [-1, 1] and not filtered; torch.clamp's gradient mask). A NaN cosine stays NaN with keep 0. */
VINLINE v8f other8(v8f c, float tau, v8i *keep)
{
    v8i lo = c<-1.0f, hi = c> 1.0f;
    v8f cc = sel8(lo, bcast8(-1.0f), sel8(hi, bcast8(1.0f), c));
    v8i f = cc > tau;
    *keep = (c >= -1.0f) & (c <= 1.0f) & ~f;
    return sel8(f, bcast8(0.0f), cc);
}

/* Sum of squares of x (d floats) in float64: 16 lanes, each product exact (float x float fits a
 * double), lanes combined in a fixed order, then the tail. */
VINLINE double sumsq(const float *x, int64_t d)
{
    v4d a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    int64_t c = 0;
    for (; c + 16 <= d; c += 16) {
        v4d x0 = ld4d(x + c), x1 = ld4d(x + c + 4), x2 = ld4d(x + c + 8), x3 = ld4d(x + c + 12);
        a0 += x0 * x0;
        a1 += x1 * x1;
        a2 += x2 * x2;
        a3 += x3 * x3;
    }
    v4d a = (a0 + a1) + (a2 + a3);
    double s = (a[0] + a[1]) + (a[2] + a[3]);
    for (; c < d; c++)
        s += (double)x[c] * x[c];
    return s;
}

/* Dot product of x and y (d floats) in float64, same lane layout as sumsq. */
VINLINE double dot64(const float *x, const float *y, int64_t d)
{
    v4d a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    int64_t c = 0;
    for (; c + 16 <= d; c += 16) {
        a0 += ld4d(x + c) * ld4d(y + c);
        a1 += ld4d(x + c + 4) * ld4d(y + c + 4);
        a2 += ld4d(x + c + 8) * ld4d(y + c + 8);
        a3 += ld4d(x + c + 12) * ld4d(y + c + 12);
    }
    v4d a = (a0 + a1) + (a2 + a3);
    double s = (a[0] + a[1]) + (a[2] + a[3]);
    for (; c < d; c++)
        s += (double)x[c] * y[c];
    return s;
}

/* 1 / max(|x|, eps) of one row. */
HEAD_SIMD static double row_inv_norm(const float *x, int64_t d)
{
    double nrm = sqrt(sumsq(x, d));
    return 1.0 / (nrm > NORM_EPS ? nrm : NORM_EPS);
}

/* y = (float)(x * a) over d elements (a in float64). */
HEAD_SIMD static void row_scale(float *y, const float *x, double a, int64_t d)
{
    int64_t c = 0;
    for (; c + 4 <= d; c += 4)
        st4d(y + c, ld4d(x + c) * a);
    for (; c < d; c++)
        y[c] = (float)(x[c] * a);
}

/* Backward of y = x * inv for one row, in place on g (float64 arithmetic, one rounding at the end):
 *   g <- (f g - y (y . f g)) * inv, the projection dropped when |x| <= eps (inv = 1/eps: the norm is
 *   the constant eps there). f scales the incoming gradient (the row factor of dL/dcos). */
HEAD_SIMD static void row_normalize_backward(float *g, const float *y, double inv, double f, int64_t d)
{
    double dot = inv < 1.0 / NORM_EPS ? dot64(y, g, d) * f : 0.0;
    int64_t c = 0;
    for (; c + 4 <= d; c += 4)
        st4d(g + c, (ld4d(g + c) * f - ld4d(y + c) * dot) * inv);
    for (; c < d; c++)
        g[c] = (float)(((double)g[c] * f - (double)y[c] * dot) * inv);
}

/* The centers' normalization backward from the raw row w and h = inv * dL/d wn (what the SGEMM on the
 * column-scaled matrix gives), in place on h: dL/dw = h - wn (wn . h) = h - w inv^2 (w . h); h alone when
 * |w| <= eps. The dot in float64; the update h - w coef in float (coef rounded to float): the radial
 * term is at most |h|, so its two extra roundings add ~1e-7 |h|, the size of h's own rounding. */
HEAD_SIMD static void center_row_backward(float *h, const float *w, double inv, int64_t d)
{
    float coef = (float)(inv < 1.0 / NORM_EPS ? inv * inv * dot64(w, h, d) : 0.0);
    int64_t c = 0;
    for (; c + 8 <= d; c += 8)
        st8(h + c, ld8(h + c) - ld8(w + c) * coef);
    for (; c < d; c++)
        h[c] = h[c] - w[c] * coef;
}

VINLINE v8i iota8(int32_t c) /* the column indices c .. c+7 */
{
    return (v8i){c, c + 1, c + 2, c + 3, c + 4, c + 5, c + 6, c + 7};
}

/* Pass 1 on 8 columns: logits z = s v(c), c = raw * inv_wf; max into *vm over the lanes in `use`. */
VINLINE v8f max_chunk(const float *raw, const float *inv_wf, float s, float tau, v8i use, v8f *vm)
{
    v8i keep;
    v8f z = s * other8(ld8(raw) * ld8(inv_wf), tau, &keep);
    v8f zu = sel8(use, z, bcast8(-INFINITY));
    *vm = sel8(zu > *vm, zu, *vm);
    return z;
}

/* Pass 1 on one row: cosines c_j = raw_j * inv_wf_j, max over the non-target columns of the
 * logit s v(c_j) (-INFINITY when there is none; NaN logits are skipped, as `z > mx` skips them); writes
 * the logits of the non-target columns when z_out is not NULL. li: the target column or -1 (k < 2^31,
 * as the SGEMMs' int sizes require). The last k mod 8 columns run through the same vector code on a
 * padded copy. */
HEAD_SIMD static float row_pass_max(const float *raw, const float *inv_wf, int64_t k, int64_t li, float s,
                                    float tau, float *z_out)
{
    v8f vm = bcast8(-INFINITY);
    const int32_t l32 = li < 0 ? -1 : (int32_t)li;
    int64_t c = 0;
    v8i idx = iota8(0);
    for (; c + 8 <= k; c += 8, idx += 8) {
        v8f z = max_chunk(raw + c, inv_wf + c, s, tau, idx != l32, &vm);
        if (z_out)
            st8(z_out + c, z);
    }
    if (c < k) {
        size_t m = (size_t)(k - c);
        float rb[8] = {0}, ib[8] = {0}, zb[8];
        memcpy(rb, raw + c, m * sizeof(float));
        memcpy(ib, inv_wf + c, m * sizeof(float));
        v8f z = max_chunk(rb, ib, s, tau, (idx != l32) & (idx < (int32_t)k), &vm);
        if (z_out) {
            st8(zb, z);
            memcpy(z_out + c, zb, m * sizeof(float));
        }
    }
    float mx = -INFINITY;
    for (int l = 0; l < 8; l++)
        if (vm[l] > mx)
            mx = vm[l];
    return mx;
}

/* Pass 2 on 8 columns, in place: a = e * inv_wf where dv/dc is 1, else 0, e = exp(s v(c) - mx);
 * the e of the lanes in `use` are added, widened to double, to the 8 lanes of *acc. */
VINLINE void exp_chunk(float *ci, const float *inv_wf, float s, float tau, float mx, v8i use, v8d *acc)
{
    v8i keep;
    v8f iv = ld8(inv_wf);
    v8f e = vexp8(s * other8(ld8(ci) * iv, tau, &keep) - mx);
    st8(ci, and8(keep, e * iv));
    *acc += __builtin_convertvector(and8(use, e), v8d);
}

/* Pass 2 on one row, in place (exp_chunk over the row; the last k mod 8 columns on a padded copy);
 * returns the sum of e_j over the non-target columns in float64 (8 lanes, combined in a fixed order).
 * The target column's a is left for the caller to overwrite. */
HEAD_SIMD static double row_pass_exp(float *ci, const float *inv_wf, int64_t k, int64_t li, float s,
                                     float tau, float mx)
{
    v8d acc = {0};
    const int32_t l32 = li < 0 ? -1 : (int32_t)li;
    int64_t c = 0;
    v8i idx = iota8(0);
    /* two chunks per iteration: two independent polynomial chains in flight */
    for (; c + 16 <= k; c += 16, idx += 16) {
        exp_chunk(ci + c, inv_wf + c, s, tau, mx, idx != l32, &acc);
        exp_chunk(ci + c + 8, inv_wf + c + 8, s, tau, mx, (idx + 8) != l32, &acc);
    }
    for (; c + 8 <= k; c += 8, idx += 8)
        exp_chunk(ci + c, inv_wf + c, s, tau, mx, idx != l32, &acc);
    if (c < k) {
        size_t m = (size_t)(k - c);
        float rb[8] = {0}, ib[8] = {0};
        memcpy(rb, ci + c, m * sizeof(float));
        memcpy(ib, inv_wf + c, m * sizeof(float));
        exp_chunk(rb, ib, s, tau, mx, (idx != l32) & (idx < (int32_t)k), &acc);
        memcpy(ci + c, rb, m * sizeof(float));
    }
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

static inline double clampd(double x, double lo, double hi)
{
    return x < lo ? lo : (x > hi ? hi : x);
}

/* Margin value v for a target cosine c (raw, before the [-1,1] clamp), and dv/dc in *dv. */
static double target_value(const head_params *p, double c, double *dv)
{
    double cc = clampd(c, -1.0, 1.0);
    double t = clampd(cc, -1.0 + TARGET_CLAMP, 1.0 - TARGET_CLAMP);
    double theta = acos(t);
    double v = cos(p->m1 * theta + p->m2) - p->m3;
    if (dv) {
        int outer = (c >= -1.0 && c <= 1.0);
        if (p->margin_grad == HEAD_MARGIN_GRAD_STRAIGHT_THROUGH) {
            *dv = outer ? 1.0 : 0.0;
        } else {
            int inner = (cc >= -1.0 + TARGET_CLAMP && cc <= 1.0 - TARGET_CLAMP);
            *dv = (outer && inner) ? p->m1 * sin(p->m1 * theta + p->m2) / sqrt(1.0 - t * t) : 0.0;
        }
    }
    return v;
}

/* Pass 1 on row i of the cosine matrix (raw en . w^T): row max of the logits into row_max[i] (the
 * target's logit (float)(s v_t) included), logits written when asked, the target's cosine
 * c = raw * inv_wf moved to tcos[i]. */
static void forward_pass1(const head_params *p, head_ws *ws, int64_t i, int64_t k, int64_t li, float s,
                          float tau, float *logits)
{
    const float *ci = ws->cos + i * k;
    float mx = row_pass_max(ci, ws->inv_wf, k, li, s, tau, logits ? logits + i * k : NULL);
    if (li >= 0) {
        float c = ci[li] * ws->inv_wf[li];
        float z = (float)(p->s * target_value(p, c, NULL));
        ws->tcos[i] = c;
        if (logits)
            logits[i * k + li] = z;
        if (z > mx)
            mx = z;
    }
    ws->row_max[i] = mx;
}

/* Pass 2 on row i: row_red[3i..3i+2] = (sum of exp(z - max) over the row, z_target - max, has-target),
 * the target's exp in float64 as its z; the row keeps a = exp(z - max) * inv_wf (0 where the gradient
 * is masked) for the backward. */
static void forward_pass2(const head_params *p, head_ws *ws, int64_t i, int64_t k, int64_t li, float s,
                          float tau)
{
    double mx = ws->row_max[i], zt = 0.0, has = 0.0;
    double sum = row_pass_exp(ws->cos + i * k, ws->inv_wf, k, li, s, tau, ws->row_max[i]);
    if (li >= 0) {
        double z = p->s * target_value(p, ws->tcos[i], NULL);
        sum += exp(z - mx);
        zt = z - mx;
        has = 1.0;
    }
    ws->row_red[3 * i] = sum;
    ws->row_red[3 * i + 1] = zt;
    ws->row_red[3 * i + 2] = has;
}

/* Backward preparation of row i, once its sum of exp is final (row_red[3i]): the target element becomes
 * (e_t - sum_i) dv_t inv_w_t (so that f_i times the row is dL/dcos_ij inv_w_j, f_i = s g / sum_i), and,
 * when `embeddings` is not NULL (the centers' SGEMM runs), en_g_i = e_i inv_e_i f_i (float64 product, one
 * rounding). */
static void backward_prep(const head_params *p, head_ws *ws, int64_t i, int64_t k, int64_t li, double g,
                          const float *embeddings, int64_t d)
{
    double sum = ws->row_red[3 * i];
    if (li >= 0) {
        double dv;
        double z = p->s * target_value(p, ws->tcos[i], &dv);
        double e = exp(z - (double)ws->row_max[i]);
        ws->cos[i * k + li] = (float)((e - sum) * dv * ws->inv_w[li]);
    }
    if (embeddings)
        row_scale(ws->en_g + i * d, embeddings + i * d, ws->inv_e[i] * (p->s * g / sum), d);
}

/* The argument checks of head_forward: NULL pointers, shapes against the workspace, params, labels. */
static int check_forward_args(const head_params *p, const head_ws *ws, const float *embeddings,
                              const float *centers, const int64_t *labels, int64_t n, int64_t k, int64_t d)
{
    if (!p || !ws || !embeddings || (!centers && k > 0) || !labels)
        return pf_err(-EINVAL, "head: NULL argument");
    if (n <= 0 || n > ws->n_max || k < 0 || k > ws->k_max || d != ws->d)
        return pf_err(
            -EINVAL, "head: n %lld, k %lld, d %lld do not fit the workspace (n_max %lld, k_max %lld, d %lld)",
            (long long)n, (long long)k, (long long)d, (long long)ws->n_max, (long long)ws->k_max,
            (long long)ws->d);
    if (!(p->s > 0) || !isfinite(p->m1) || !isfinite(p->m2) || !isfinite(p->m3))
        return pf_err(-EINVAL, "head: scale %g must be > 0 and margins (%g, %g, %g) finite", p->s, p->m1,
                      p->m2, p->m3);
    for (int64_t i = 0; i < n; i++)
        if (labels[i] < -1 || labels[i] >= k)
            return pf_err(-ERANGE, "head: label %lld of row %lld outside [-1, %lld)", (long long)labels[i],
                          (long long)i, (long long)k);
    return 0;
}

/* Interclass filtering compares a float cosine with the double threshold: cc > tau exactly when cc > tau_f,
 * tau_f the largest float <= tau. tau_f = +inf when filtering is off (tau <= 0). */
static float filter_threshold(const head_params *p)
{
    float tau = INFINITY;
    if (p->interclass_filtering_threshold > 0) {
        tau = (float)p->interclass_filtering_threshold;
        if ((double)tau > p->interclass_filtering_threshold)
            tau = nextafterf(tau, -INFINITY);
    }
    return tau;
}

/* en = e * inv_e row by row; then per block of centers, while the block is in cache: its inverse norms, then
 * its raw cosines (n, kb) = en (n,d) . w_block (kb,d)^T into columns [j0, j0 + kb) of ws->cos (n,k);
 * cos_ij = raw_ij * inv_wf_j in the passes. */
static void forward_cosines(head_ws *ws, const float *embeddings, const float *centers, int64_t n, int64_t k,
                            int64_t d)
{
    PARALLEL_ROWS
    for (int64_t i = 0; i < n; i++) {
        double iv = row_inv_norm(embeddings + i * d, d);
        ws->inv_e[i] = iv;
        row_scale(ws->en + i * d, embeddings + i * d, iv, d);
    }
    const int64_t kb = head_center_block(d), nblk = (k + kb - 1) / kb;
    blocks_begin();
    BLOCKS_PARALLEL
    for (int64_t b = 0; b < nblk; b++) {
        const int64_t j0 = b * kb, m = k - j0 < kb ? k - j0 : kb;
        for (int64_t j = j0; j < j0 + m; j++) {
            ws->inv_w[j] = row_inv_norm(centers + j * d, d);
            ws->inv_wf[j] = (float)ws->inv_w[j];
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)m, (int)d, 1.0f, ws->en, (int)d,
                    centers + j0 * d, (int)d, 0.0f, ws->cos + j0, (int)k);
    }
    blocks_end();
}

/* Pass 1 (logits, row max, target cosine to tcos), allreduce of the row max (global), pass 2 (exp, row
 * sums), allreduce of the row sums (global). Without the allreduces both passes run on a row in one go,
 * while it is in cache. Returns 0 or the collective's error. */
static int forward_softmax(const head_params *p, head_ws *ws, pf_coll *coll, int global, float *logits,
                           const int64_t *labels, int64_t n, int64_t k)
{
    const float s = (float)p->s, tau = filter_threshold(p);
    int rc;
    if (!global) {
        PARALLEL_ROWS
        for (int64_t i = 0; i < n; i++) {
            forward_pass1(p, ws, i, k, labels[i], s, tau, logits);
            forward_pass2(p, ws, i, k, labels[i], s, tau);
        }
        return 0;
    }
    PARALLEL_ROWS
    for (int64_t i = 0; i < n; i++)
        forward_pass1(p, ws, i, k, labels[i], s, tau, logits);
    if ((rc = coll_allreduce(coll, ws->row_max, (size_t)n, COLL_F32, COLL_MAX)) < 0)
        return pf_err_wrap(rc, "head: allreduce of row max");
    PARALLEL_ROWS
    for (int64_t i = 0; i < n; i++)
        forward_pass2(p, ws, i, k, labels[i], s, tau);
    if ((rc = coll_allreduce(coll, ws->row_red, (size_t)(3 * n), COLL_F64, COLL_SUM)) < 0)
        return pf_err_wrap(rc, "head: allreduce of row sums");
    return 0;
}

/* The mean loss over the n rows from row_red (log-softmax of the target; LOSS_CAP for a row without
 * target, counted in ws->no_target), averaged over the ranks in local mode. Returns 0 or the collective's
 * error. */
static int forward_loss(const head_params *p, head_ws *ws, pf_coll *coll, int64_t n, double *loss)
{
    double total = 0.0;
    ws->no_target = 0;
    for (int64_t i = 0; i < n; i++) {
        double li = LOSS_CAP;
        ws->no_target += !(ws->row_red[3 * i + 2] > 0);
        if (ws->row_red[3 * i + 2] > 0) {
            li = -(ws->row_red[3 * i + 1] - log(ws->row_red[3 * i]));
            if (p->clamp_loss && li > LOSS_CAP)
                li = LOSS_CAP;
        }
        total += li;
    }
    double mean = total / (double)n;
    int world = coll ? coll->world_size : 1, rc;
    if (p->mode == HEAD_MODE_LOCAL && coll && world > 1) {
        if ((rc = coll_allreduce(coll, &mean, 1, COLL_F64, COLL_SUM)) < 0)
            return pf_err_wrap(rc, "head: allreduce of the local losses");
        mean /= world;
    }
    if (loss)
        *loss = mean;
    return 0;
}

int head_forward(const head_params *p, head_ws *ws, pf_coll *coll, double *loss, float *logits,
                 const float *embeddings, const float *centers, const int64_t *labels, int64_t n, int64_t k,
                 int64_t d)
{
    if (ws)
        ws->fwd_n = 0; /* a failed forward leaves nothing for a backward */
    int rc = check_forward_args(p, ws, embeddings, centers, labels, n, k, d);
    if (rc < 0)
        return rc;
    int world = coll ? coll->world_size : 1;
    int global = (p->mode == HEAD_MODE_GLOBAL) && coll && world > 1;
    forward_cosines(ws, embeddings, centers, n, k, d);
    if ((rc = forward_softmax(p, ws, coll, global, logits, labels, n, k)) < 0)
        return rc;
    if ((rc = forward_loss(p, ws, coll, n, loss)) < 0)
        return rc;
    ws->fwd_n = n;
    ws->fwd_k = k;
    ws->fwd_world = world;
    return 0;
}

/* The dL/d embeddings SGEMM over all K in one call (n x d too large for lane partials), or zeros at k = 0. */
static void backward_ge_whole(head_ws *ws, float *grad_embeddings, const float *centers, int64_t n, int64_t k,
                              int64_t d)
{
    if (k == 0)
        memset(grad_embeddings, 0, (size_t)(n * d) * sizeof(float));
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)d, (int)k, 1.0f, ws->cos, (int)k,
                    centers, (int)d, 0.0f, grad_embeddings, (int)d);
}

/* The K x D passes of the backward, per block of centers while the block is in cache:
 *   dL/d en_i / f_i += a (n,kb) . w_block (kb,d)  (dL/dcos_ij inv_w_j w_j = dL/dcos_ij wn_j), summed into
 *     the block's lane's partial (lanes > 0: contiguous runs of blocks, each summed in block order);
 *   h (kb,d) = a^T (kb,n) . (f en) (n,d) = inv_w_j dL/d wn_j, then the normalization backward of its rows
 *     (it reads the raw block just used), when grad_centers is not NULL.
 * nl: the loop's tasks (lanes, or one per block). */
static void backward_blocks(head_ws *ws, float *grad_centers, const float *centers, int64_t n, int64_t k,
                            int64_t d, int lanes, int64_t nl)
{
    const int64_t kb = head_center_block(d), nblk = (k + kb - 1) / kb;
    blocks_begin();
    BLOCKS_PARALLEL
    for (int64_t l = 0; l < nl; l++) {
        const int64_t b0 = lanes ? nblk * l / nl : l, b1 = lanes ? nblk * (l + 1) / nl : l + 1;
        for (int64_t b = b0; b < b1; b++) {
            const int64_t j0 = b * kb, m = k - j0 < kb ? k - j0 : kb;
            if (lanes)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)d, (int)m, 1.0f,
                            ws->cos + j0, (int)k, centers + j0 * d, (int)d, b == b0 ? 0.0f : 1.0f,
                            ws->ge_part + l * n * d, (int)d);
            if (grad_centers) {
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)m, (int)d, (int)n, 1.0f,
                            ws->cos + j0, (int)k, ws->en_g, (int)d, 0.0f, grad_centers + j0 * d, (int)d);
                for (int64_t j = j0; j < j0 + m; j++)
                    center_row_backward(grad_centers + j * d, centers + j * d, ws->inv_w[j], d);
            }
        }
    }
    blocks_end();
}

int head_backward(const head_params *p, head_ws *ws, float *grad_embeddings, float *grad_centers,
                  const float *embeddings, const float *centers, const int64_t *labels, int64_t n, int64_t k,
                  int64_t d)
{
    if (!p || !ws || !embeddings || (!centers && k > 0) || !labels)
        return pf_err(-EINVAL, "head: NULL argument");
    if (ws->fwd_n == 0 || n != ws->fwd_n || k != ws->fwd_k || d != ws->d)
        return pf_err(-EINVAL,
                      "head: backward of n %lld, k %lld, d %lld without its forward (last: n %lld, k %lld)",
                      (long long)n, (long long)k, (long long)d, (long long)ws->fwd_n, (long long)ws->fwd_k);
    const double g = 1.0 / ((double)n * (p->mode == HEAD_MODE_LOCAL ? ws->fwd_world : 1));
    const float *emb_g = grad_centers && k > 0 ? embeddings : NULL;
    if (grad_embeddings || grad_centers) {
        PARALLEL_ROWS
        for (int64_t i = 0; i < n; i++)
            backward_prep(p, ws, i, k, labels[i], g, emb_g, d);
    }
    const int want_ge = grad_embeddings && k > 0, want_gc = grad_centers && k > 0;
    const int lanes_nd = head_ge_lanes(n, d), lanes = want_ge && lanes_nd >= 2 ? lanes_nd : 0;
    if (grad_embeddings && !lanes)
        backward_ge_whole(ws, grad_embeddings, centers, n, k, d);
    const int64_t kb = head_center_block(d), nblk = (k + kb - 1) / kb;
    const int64_t nl = lanes ? (lanes < nblk ? lanes : nblk) : nblk;
    if (lanes || want_gc)
        backward_blocks(ws, want_gc ? grad_centers : NULL, centers, n, k, d, lanes, nl);
    /* The lanes' partials added in lane order, then the embeddings' normalization backward. */
    const int64_t ng = want_ge ? n : 0;
    PARALLEL_ROWS
    for (int64_t i = 0; i < ng; i++) {
        float *dst = grad_embeddings + i * d;
        if (lanes) {
            memcpy(dst, ws->ge_part + i * d, (size_t)d * sizeof(float));
            for (int64_t l = 1; l < nl; l++) {
                const float *src = ws->ge_part + (l * n + i) * d;
                for (int64_t c = 0; c < d; c++)
                    dst[c] += src[c];
            }
        }
        row_normalize_backward(dst, ws->en + i * d, ws->inv_e[i], p->s * g / ws->row_red[3 * i], d);
    }
    return 0;
}
