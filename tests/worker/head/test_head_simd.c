/* The head's vectorized passes (worker/head/head.c) are deterministic and their float exp is accurate:
 *  1. the same inputs give the same output bits with 1, 2 and 3 OpenMP threads (each row's arithmetic
 *     does not depend on the split), for single-process, filtered, logits-only and k = 0 calls, at
 *     sizes that leave vector tails (k mod 8, d mod 16 not 0);
 *  2. the library's build (its AVX2 clone where the CPU has AVX2) gives the same bits as the baseline
 *     build of the same file (head_simd_base.c, no clones): no FMA contraction, same operation order;
 *  3. the vector exp against float64 exp rounded to float over [-104, 0] (every 97th float there, every
 *     float near the ends): at most 1 ulp, normal and subnormal results (an exhaustive run over all
 *     1.12e9 floats in [-104, 0) found 1 ulp at most, 99.2% correctly rounded); 0 at and below -104,
 *     where the correctly rounded result is 0 too; NaN, -inf, +-0.
 * Loss, logits and gradients against float64 references are tests/worker/head/test_head.c's job. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "common/err.h"
#include "worker/head/head.h"

#include "tests/check.h"

int base_head_ws_init(head_ws *ws, int64_t n_max, int64_t k_max, int64_t d);
void base_head_ws_free(head_ws *ws);
int base_head_forward(const head_params *p, head_ws *ws, pf_coll *coll, double *loss, float *logits,
                      const float *embeddings, const float *centers, const int64_t *labels, int64_t n,
                      int64_t k, int64_t d);
int base_head_backward(const head_params *p, head_ws *ws, float *grad_embeddings, float *grad_centers,
                       const float *embeddings, const float *centers, const int64_t *labels, int64_t n,
                       int64_t k, int64_t d);
void base_head_vexp8(const float *x, float *y);

typedef struct outs {
    double loss;
    float *logits, *ge, *gc;
} outs;

/* K: buffers and workspace (k = 40009 at D = 77: 12 blocks of head_center_block(77) = 3404 centers, one lane
 * each); K1: the cases whose k fits one block. */
enum { N = 13, K = 40009, D = 77, K1 = 1001 };

static unsigned rng = 12345u;
static float uni(void)
{
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / 16777216.0f - 0.5f;
}

/* One call; base = 1 runs the baseline copy. logits NULL when want_logits is 0, gradients NULL when
 * want_grad is 0. */
static int run_ws(int base, int64_t n_max, const head_params *p, const float *e, const float *w, int64_t k,
                  const int64_t *lab, int want_logits, int want_grad, outs *o)
{
    head_ws ws;
    int rc = base ? base_head_ws_init(&ws, n_max, K, D) : head_ws_init(&ws, n_max, K, D);
    if (rc)
        return rc;
    o->logits = calloc((size_t)N * K, sizeof(float));
    o->ge = calloc((size_t)N * D, sizeof(float));
    o->gc = calloc((size_t)K * D, sizeof(float));
    float *lg = want_logits ? o->logits : NULL, *ge = want_grad ? o->ge : NULL,
          *gc = want_grad ? o->gc : NULL;
    rc = base ? base_head_forward(p, &ws, NULL, &o->loss, lg, e, w, lab, N, k, D)
              : head_forward(p, &ws, NULL, &o->loss, lg, e, w, lab, N, k, D);
    if (rc == 0 && want_grad)
        rc = base ? base_head_backward(p, &ws, ge, gc, e, w, lab, N, k, D)
                  : head_backward(p, &ws, ge, gc, e, w, lab, N, k, D);
    if (base)
        base_head_ws_free(&ws);
    else
        head_ws_free(&ws);
    return rc;
}

/* One call with a workspace for exactly N rows. */
static int run(int base, const head_params *p, const float *e, const float *w, int64_t k, const int64_t *lab,
               int want_logits, int want_grad, outs *o)
{
    return run_ws(base, N, p, e, w, k, lab, want_logits, want_grad, o);
}

static int same(const outs *a, const outs *b)
{
    return memcmp(&a->loss, &b->loss, sizeof a->loss) == 0 &&
           memcmp(a->logits, b->logits, (size_t)N * K * sizeof(float)) == 0 &&
           memcmp(a->ge, b->ge, (size_t)N * D * sizeof(float)) == 0 &&
           memcmp(a->gc, b->gc, (size_t)K * D * sizeof(float)) == 0;
}

static void free_outs(outs *o)
{
    free(o->logits);
    free(o->ge);
    free(o->gc);
}

static void set_threads(int t)
{
#ifdef _OPENMP
    omp_set_num_threads(t);
#else
    (void)t;
#endif
}

/* Which build of the library's passes runs here (head.c's HEAD_SIMD). */
static const char *library_build(void)
{
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__ELF__)
    return __builtin_cpu_supports("avx2") ? "AVX2 clone" : "baseline clone";
#else
    return "no clones";
#endif
}

/* ulp distance of two non-negative floats. */
static int64_t ulps(float a, float b)
{
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    return ia > ib ? (int64_t)ia - ib : (int64_t)ib - ia;
}

static void check_exp(void)
{
    int64_t worst_normal = 0, worst_sub = 0;
    float worst_x = 0;
    float xs[8], ys[8];
    int q = 0;
    uint32_t lo, hi;
    float fhi = -104.0f, flo = -0.0f;
    memcpy(&lo, &flo, 4); /* -0 */
    memcpy(&hi, &fhi, 4); /* bit patterns of negative floats grow with magnitude */
    for (uint64_t b = lo; b <= hi + 2000u; b += (b < lo + 3000u || b + 3000u > hi) ? 1 : 97) {
        uint32_t b32 = (uint32_t)b;
        memcpy(&xs[q], &b32, 4);
        if (++q < 8)
            continue;
        q = 0;
        base_head_vexp8(xs, ys);
        for (int l = 0; l < 8; l++) {
            double ref = exp((double)xs[l]);
            float rf = (float)ref; /* correctly rounded float exp */
            if (xs[l] <= -104.0f) {
                CHECK(ys[l] == 0.0f && rf == 0.0f, "exp(%.9g) = %g, expected 0", xs[l], ys[l]);
                continue;
            }
            int64_t u = ulps(ys[l], rf);
            if (rf >= 1.17549435e-38f) {
                if (u > worst_normal)
                    worst_normal = u, worst_x = xs[l];
            } else if (u > worst_sub) {
                worst_sub = u;
            }
        }
    }
    float special[8] = {NAN, -INFINITY, 0.0f, -0.0f, -87.0f, -88.0f, -103.9f, -1e30f}, out[8];
    base_head_vexp8(special, out);
    CHECK(isnan(out[0]) && out[1] == 0.0f && out[2] == 1.0f && out[3] == 1.0f && out[7] == 0.0f,
          "exp of NaN %g, -inf %g, 0 %g, -0 %g, -1e30 %g", out[0], out[1], out[2], out[3], out[7]);
    CHECK(worst_normal <= 1 && worst_sub <= 1,
          "vector exp: %lld ulp at x = %.9g (normal results), %lld ulp "
          "below the least normal",
          (long long)worst_normal, worst_x, (long long)worst_sub);
    printf(
        "%s vector exp over [-104, 0]: worst %lld ulp (normal results, at x = %.9g), %lld ulp (subnormal)\n",
        worst_normal <= 1 && worst_sub <= 1 ? "ok  " : "FAIL", (long long)worst_normal, worst_x,
        (long long)worst_sub);
}

/* Max |a - b| / max |b| over len floats. */
static double rel_diff(const float *a, const float *b, size_t len)
{
    double mx = 0, md = 0;
    for (size_t i = 0; i < len; i++) {
        mx = fmax(mx, fabs((double)b[i]));
        md = fmax(md, fabs((double)a[i] - (double)b[i]));
    }
    return md / (mx + 1e-30);
}

/* The blocked passes against one block over all k (the arrangement the float64 PyTorch references of
 * test_head check, where k fits one block): the same loss, logits and gradients up to float rounding (the
 * dL/d embeddings sums are grouped by lane). Blocks of 12 (default) and of 100 centers (401 blocks in 64 lanes,
 * several blocks per lane); the latter also with 1 and 3 threads and with a workspace for 40 rows called with
 * 13 (the lanes' partials are laid out by the call's n), bit for bit. */
static void check_blocks(const head_params *p, const float *e, const float *w, const int64_t *lab)
{
    outs one, blk[2], o;
    set_threads(2);
    head_set_center_block(K);
    int rc = run(0, p, e, w, K, lab, 1, 1, &one);
    const int64_t sizes[2] = {0, 100};
    const char *names[2] = {"12 blocks, 12 lanes", "401 blocks, 64 lanes"};
    for (int v = 0; v < 2; v++) {
        head_set_center_block(sizes[v]);
        rc |= run(0, p, e, w, K, lab, 1, 1, &blk[v]);
        double dl = fabs(blk[v].loss - one.loss) / fabs(one.loss);
        double r0 = rel_diff(blk[v].logits, one.logits, (size_t)N * K);
        double r1 = rel_diff(blk[v].ge, one.ge, (size_t)N * D), r2 = rel_diff(blk[v].gc, one.gc, (size_t)K * D);
        int ok = rc == 0 && dl <= 1e-6 && r0 <= 1e-6 && r1 <= 1e-5 && r2 <= 1e-6;
        CHECK(ok, "k = %d, %s vs one block: loss %.3g, logits %.3g, dL/d emb %.3g, dL/d centers %.3g", K, names[v],
              dl, r0, r1, r2);
        printf("%s k = %d, %s vs one block: relative differences loss %.2g, logits %.2g, dL/d embeddings %.2g, "
               "dL/d centers %.2g\n",
               ok ? "ok  " : "FAIL", K, names[v], dl, r0, r1, r2);
    }
    head_set_center_block(100);
    int bits = 1;
    for (int t = 1; t <= 3; t += 2) {
        set_threads(t);
        bits &= run(0, p, e, w, K, lab, 1, 1, &o) == 0 && same(&blk[1], &o);
        free_outs(&o);
    }
    set_threads(2);
    int bits_nmax = run_ws(0, 40, p, e, w, K, lab, 1, 1, &o) == 0 && same(&blk[1], &o);
    free_outs(&o);
    head_set_center_block(0);
    CHECK(bits && bits_nmax, "401 blocks in 64 lanes: bits differ with 1 / 3 threads (%s) or n_max 40 (%s)",
          bits ? "same" : "differ", bits_nmax ? "same" : "differ");
    printf("%s k = %d, 401 blocks in 64 lanes: same bits with 1, 2, 3 threads %s; workspace n_max 40 for n %d %s\n",
           bits && bits_nmax ? "ok  " : "FAIL", K, bits ? "yes" : "NO", N, bits_nmax ? "same" : "DIFFER");
    free_outs(&one);
    free_outs(&blk[0]);
    free_outs(&blk[1]);
}

int main(void)
{
    float *e = malloc((size_t)N * D * sizeof(float)), *w = malloc((size_t)K * D * sizeof(float));
    int64_t lab[N];
    for (int i = 0; i < N * D; i++)
        e[i] = uni();
    for (int i = 0; i < K * D; i++)
        w[i] = uni();
    /* a few centers close to the embeddings (cosines near 1, clamped or filtered), one zero center */
    for (int c = 0; c < D; c++) {
        w[5 * D + c] = e[0 * D + c] * 3.0f;
        w[17 * D + c] = e[1 * D + c] * 0.5f + 1e-3f * uni();
        w[999 * D + c] = 0.0f;
    }
    for (int i = 0; i < N; i++)
        lab[i] = (i * 389 + 7) % K1;
    lab[0] = 5;
    lab[3] = 1000; /* the last column: inside the padded tail */
    lab[4] = -1;   /* target on another worker */

    head_params arc = {.s = 64, .m1 = 1, .m2 = 0.5, .m3 = 0, .margin_grad = HEAD_MARGIN_GRAD_EXACT};
    head_params filt = arc;
    filt.interclass_filtering_threshold = 0.1; /* not a float: exercises the threshold's rounding */
    filt.margin_grad = HEAD_MARGIN_GRAD_STRAIGHT_THROUGH;
    struct {
        const char *name;
        const head_params *p;
        int64_t k;
        int logits, grad;
    } cases[] = {
        {"arcface exact, logits and gradients", &arc, K1, 1, 1},
        {"filtering 0.1, straight-through", &filt, K1, 1, 1},
        {"forward only (loss, logits)", &arc, K1, 1, 0},
        {"k = 7 (tail only)", &arc, 7, 0, 1},
        {"k = 40009: 12 blocks, 12 lanes", &arc, K, 1, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t labc[N];
        for (int i = 0; i < N; i++)
            labc[i] = lab[i] < cases[c].k ? lab[i] : -1;
        outs ref, o;
        set_threads(1);
        int rc = run(0, cases[c].p, e, w, cases[c].k, labc, cases[c].logits, cases[c].grad, &ref);
        CHECK(rc == 0 && isfinite(ref.loss), "%s: rc %d loss %g (%s)", cases[c].name, rc, ref.loss,
              pf_errmsg());
        int ok_threads = 1;
        for (int t = 2; t <= 3; t++) {
            set_threads(t);
            rc = run(0, cases[c].p, e, w, cases[c].k, labc, cases[c].logits, cases[c].grad, &o);
            ok_threads &= rc == 0 && same(&ref, &o);
            free_outs(&o);
        }
        CHECK(ok_threads, "%s: outputs differ between 1, 2 and 3 threads", cases[c].name);
        set_threads(2);
        rc = run(1, cases[c].p, e, w, cases[c].k, labc, cases[c].logits, cases[c].grad, &o);
        int ok_base = rc == 0 && same(&ref, &o);
        CHECK(ok_base, "%s: the library's build and the baseline build differ", cases[c].name);
        free_outs(&o);
        printf("%s %-38s loss %.9f: same bits with 1, 2, 3 threads %s; library (%s) vs baseline build %s\n",
               ok_threads && ok_base ? "ok  " : "FAIL", cases[c].name, ref.loss, ok_threads ? "yes" : "NO",
               library_build(), ok_base ? "same" : "DIFFER");
        free_outs(&ref);
    }
    check_blocks(&arc, e, w, lab);
    check_exp();
    free(e);
    free(w);
    return fails ? 1 : 0;
}
