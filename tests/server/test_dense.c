/* Unit tests of the closed form of skipped dense SGD steps (server/dense.h) against
 *  - an independent float64 step-by-step loop written here (torch's zero-gradient SGD step in double);
 *  - $PFCPS_REFERENCE/head/dense_skip_*: torch.optim.SGD run K steps with zero gradients in float64;
 *  - torch's float32 arithmetic one step at a time (dense_steps_f32), within k float32 roundings;
 * and its reproducibility (the vector path and the scalar tail give the same bits). Also prints the time of
 * the closed form vs the k-step loop per row (D = 512), the measurement behind the choice of the closed form.
 *
 * Tolerance of the closed form vs a float64 reference, per element x with reference r and inputs v0, w0:
 *   |x - r| <= 2^-24 |r|  (the one rounding to float)  +  64 (k + 1) 2^-53 (|v0| + |w0|)
 * (the double roundings of k 2x2 products and the reference's own, each entry of M bounded by a few units:
 * |M| <= 1 + sum lr / (1 - mu) stays < 16 for the schedules here). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "server/dense.h"
#include "server/shard.h"
#include "tests/npy.h"
#include "tests/reference/ref.h"

#include "tests/check.h"

static const double MU = 0.9, WD = 5e-4;

/* Deterministic uniform in [-1, 1). */
static double urand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*s >> 11) * 0x1p-52 - 1.0;
}

/* Float64 step-by-step: v = mu*v + (0 + wd*w); w = w - lr*v, over steps first..last. */
static void steps_f64(double *w, double *v, const double *lr, int64_t first, int64_t last)
{
    for (int64_t t = first; t <= last; t++) {
        double d = 0.0 + WD * *w;
        *v = MU * *v + d;
        *w = *w - lr[t] * *v;
    }
}

static double tol(double r, int64_t k, double v0, double w0)
{
    return 0x1p-24 * fabs(r) + 64.0 * (double)(k + 1) * 0x1p-53 * (fabs(v0) + fabs(w0));
}

static void test_vs_f64_loop(void)
{
    enum { D = 37, T = 3000 };
    double *lr = malloc(sizeof(double) * T);
    for (int t = 0; t < T; t++) /* warmup 100 steps then a linear decay, as PolynomialLRWarmup */
        lr[t] = t < 100 ? 0.1 * (t + 1) / 100.0 : 0.1 * (1.0 - (t - 100) / (double)(T - 100));
    const int64_t firsts[] = {0, 5, 50, 99, 1200};
    const int64_t ks[] = {0, 1, 2, 3, 10, 30, 257, 1000};
    uint64_t seed = 1;
    double worst = 0;
    int bad = 0;
    for (size_t fi = 0; fi < sizeof firsts / sizeof *firsts; fi++)
        for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++) {
            const int64_t first = firsts[fi], k = ks[ki], last = first + k - 1;
            float w[D], v[D];
            double w0[D], v0[D];
            for (int j = 0; j < D; j++) {
                w[j] = (float)(0.03 * urand(&seed));
                v[j] = (float)(0.003 * urand(&seed));
                if (j == 3)
                    v[j] = 0.0f; /* a row never pulled: v = 0 */
                w0[j] = w[j], v0[j] = v[j];
            }
            dense_map M;
            if (!dense_compose(lr, first, last, MU, WD, &M))
                dense_apply_row(w, v, D, &M);
            for (int j = 0; j < D; j++) {
                double rw = w0[j], rv = v0[j];
                steps_f64(&rw, &rv, lr, first, last);
                double ew = fabs(w[j] - rw), ev = fabs(v[j] - rv);
                double tw = tol(rw, k, v0[j], w0[j]), tv = tol(rv, k, v0[j], w0[j]);
                worst = fmax(worst, fmax(ew / tw, ev / tv));
                if (ew > tw || ev > tv) {
                    if (bad++ < 5)
                        printf("  first %lld k %lld j %d: w %.9g vs %.17g, v %.9g vs %.17g\n", (long long)first,
                               (long long)k, j, w[j], rw, v[j], rv);
                }
                if (k == 0 && (w[j] != (float)w0[j] || v[j] != (float)v0[j]))
                    bad++; /* the identity leaves the bits */
            }
        }
    printf("closed form vs float64 loop: worst error / tolerance %.3g\n", worst);
    CHECK(bad == 0, "closed form vs float64 loop: %d elements out of tolerance", bad);
    free(lr);
}

/* The vector lanes and the scalar tail compute the same thing: D = 13 row vs 13 rows of D = 1. */
static void test_lanes(void)
{
    double lr[40];
    for (int t = 0; t < 40; t++)
        lr[t] = 0.05 + 0.001 * t;
    dense_map M, M2;
    dense_compose(lr, 3, 39, MU, WD, &M);
    dense_compose(lr, 3, 39, MU, WD, &M2);
    CHECK(memcmp(&M, &M2, sizeof M) == 0, "compose is a function of its arguments");
    /* The cache gives dense_compose's bits for every first, in any order of requests. */
    dense_cache c;
    CHECK(dense_cache_init(&c, 13) == 0, "cache init");
    const int64_t firsts[] = {30, 3, 39, 0, 17, 40};
    for (size_t i = 0; i < sizeof firsts / sizeof *firsts; i++) {
        dense_map a, b;
        int ia = dense_cache_get(&c, lr, firsts[i], 39, MU, WD, &a), ib = dense_compose(lr, firsts[i], 39, MU, WD, &b);
        CHECK(ia == ib && memcmp(&a, &b, sizeof a) == 0, "cache == compose for first %lld", (long long)firsts[i]);
    }
    dense_cache_free(&c);
    /* A skipped step (NaN lr) is the identity: composing over it equals composing without it. */
    double ls[6] = {0.1, 0.09, NAN, 0.08, NAN, NAN}, lk[3] = {0.1, 0.09, 0.08};
    dense_map sa, sb;
    int ia = dense_compose(ls, 0, 5, MU, WD, &sa), ib = dense_compose(lk, 0, 2, MU, WD, &sb);
    CHECK(!ia && !ib && memcmp(&sa, &sb, sizeof sa) == 0, "skipped steps are the identity");
    CHECK(dense_compose(ls, 4, 5, MU, WD, &sa) == 1, "only skipped steps: identity");
    uint64_t seed = 7;
    float w[13], v[13], w1[13], v1[13];
    for (int j = 0; j < 13; j++) {
        w[j] = w1[j] = (float)(0.1 * urand(&seed));
        v[j] = v1[j] = (float)(0.01 * urand(&seed));
    }
    dense_apply_row(w, v, 13, &M);
    for (int j = 0; j < 13; j++)
        dense_apply_row(w1 + j, v1 + j, 1, &M);
    CHECK(memcmp(w, w1, sizeof w) == 0 && memcmp(v, v1, sizeof v) == 0, "vector lanes == scalar tail");
    /* A pull's weights-only form gives the bits the stored update would. */
    float wo[13];
    memcpy(w1, w, sizeof w), memcpy(v1, v, sizeof v);
    dense_apply_w(w1, v1, wo, 13, &M);
    dense_apply_row(w1, v1, 13, &M);
    CHECK(memcmp(wo, w1, sizeof wo) == 0, "dense_apply_w == dense_apply_row's weights");
    /* One step's map is torch's step in double: A = [[mu, wd], [-lr mu, 1 - lr wd]]. */
    dense_map A = dense_step_map(0.1, MU, WD);
    CHECK(A.m[0] == 0.9 && A.m[1] == 5e-4 && A.m[2] == -0.1 * 0.9 && A.m[3] == 1.0 - 0.1 * 5e-4, "A_t");
}

static void test_torch_ref(const char *name)
{
    char head[1024], dir[1100], why[2048];
    if (ref_locate(head, sizeof head, "head", why, sizeof why)) {
        fails += ref_part_missing(why);
        return;
    }
    snprintf(dir, sizeof dir, "%s/%s", head, name);
    npy_array aw, av, al, awo, avo;
    if (npy_load2(dir, "weight.npy", &aw) || npy_load2(dir, "momentum.npy", &av) ||
        npy_load2(dir, "lrs.npy", &al) || npy_load2(dir, "weight_out.npy", &awo) ||
        npy_load2(dir, "momentum_out.npy", &avo)) {
        printf("FAIL: reference %s: %s\n", dir, pf_errmsg());
        fails++;
        return;
    }
    char *meta = npy_read_text(dir, "meta.json");
    double mu = npy_json_number(meta, "momentum", NAN), wd = npy_json_number(meta, "weight_decay", NAN);
    free(meta);
    CHECK(mu == MU && wd == WD, "%s: meta momentum %g weight_decay %g", name, mu, wd);
    const int R = (int)aw.shape[0], D = (int)aw.shape[1], K = (int)al.shape[0];
    float *w = npy_to_f32(&aw), *v = npy_to_f32(&av);
    float *w32 = malloc(sizeof(float) * (size_t)R * D), *v32 = malloc(sizeof(float) * (size_t)R * D);
    memcpy(w32, w, sizeof(float) * (size_t)R * D);
    memcpy(v32, v, sizeof(float) * (size_t)R * D);
    double *lrs = npy_to_f64(&al), *wo = npy_to_f64(&awo), *vo = npy_to_f64(&avo);
    dense_map M;
    dense_compose(lrs, 0, K - 1, mu, wd, &M);
    int bad = 0;
    double worst = 0, dev32 = 0, maxw = 0;
    for (int r = 0; r < R; r++) {
        float *wr = w + (size_t)r * D, *vr = v + (size_t)r * D;
        float w0[512], v0[512];
        memcpy(w0, wr, sizeof(float) * D), memcpy(v0, vr, sizeof(float) * D);
        dense_apply_row(wr, vr, D, &M);
        dense_steps_f32(w32 + (size_t)r * D, v32 + (size_t)r * D, D, lrs, 0, K - 1, mu, wd);
        for (int j = 0; j < D; j++) {
            size_t i = (size_t)r * D + j;
            double tw = tol(wo[i], K, v0[j], w0[j]), tv = tol(vo[i], K, v0[j], w0[j]);
            worst = fmax(worst, fmax(fabs(wr[j] - wo[i]) / tw, fabs(vr[j] - vo[i]) / tv));
            bad += fabs(wr[j] - wo[i]) > tw || fabs(vr[j] - vo[i]) > tv;
            dev32 = fmax(dev32, fabs(w32[i] - wo[i]));
            maxw = fmax(maxw, fabs(wo[i]));
        }
    }
    /* torch's float32 steps: each step rounds 4 times, errors of |w| size: K * 4 * 2^-24 * max|w| bounds them
     * (the momentum's contribution is smaller by lr). */
    const double tol32 = (double)K * 4.0 * 0x1p-24 * maxw;
    printf("%s: closed form vs torch float64: worst error / tolerance %.3g; float32 steps deviate %.3g of max|w| "
           "(bound %.3g)\n", name, worst, dev32 / maxw, tol32 / maxw);
    CHECK(bad == 0, "%s: %d elements of the closed form out of tolerance", name, bad);
    CHECK(dev32 <= tol32, "%s: float32 steps deviate %.3g > %.3g", name, dev32, tol32);
    free(w), free(v), free(w32), free(v32), free(lrs), free(wo), free(vo);
    npy_free(&aw), npy_free(&av), npy_free(&al), npy_free(&awo), npy_free(&avo);
}

/* A push's fused update (shard_dense_sgd_row_f32 / shard_dense_sgd_row) gives the bits of the two passes it
 * replaces, dense_apply_row then shard_sgd_row_f32 / shard_sgd_row, at row lengths that use the vector lanes,
 * the scalar tail and both; with M NULL it is shard_sgd_row_f32. */
static void test_fused(void)
{
    enum { DMAX = 1030 };
    static float w0[DMAX], v0[DMAX], g[DMAX], wa[DMAX], va[DMAX], wb[DMAX], vb[DMAX];
    static double gd[DMAX];
    double lr[40];
    for (int t = 0; t < 40; t++)
        lr[t] = t == 17 ? NAN : 0.1 - 0.002 * t;
    uint64_t seed = 11;
    for (int j = 0; j < DMAX; j++) {
        w0[j] = (float)(0.05 * urand(&seed));
        v0[j] = (float)(0.02 * urand(&seed));
        g[j] = (float)(0.03 * urand(&seed));
        gd[j] = 0.03 * urand(&seed) + 1e-9 * urand(&seed);
    }
    const int dims[] = {1, 3, 8, 13, 512, 515, 1030};
    const int64_t firsts[] = {39, 30, 5, 0};
    int bad = 0;
    for (size_t di = 0; di < sizeof dims / sizeof *dims; di++)
        for (size_t fi = 0; fi < sizeof firsts / sizeof *firsts; fi++) {
            const int D = dims[di];
            dense_map M;
            dense_compose(lr, firsts[fi], 39, MU, WD, &M);
            for (int multi = 0; multi < 2; multi++) {
                memcpy(wa, w0, sizeof(float) * D), memcpy(va, v0, sizeof(float) * D);
                memcpy(wb, w0, sizeof(float) * D), memcpy(vb, v0, sizeof(float) * D);
                dense_apply_row(wa, va, D, &M);
                if (multi) {
                    shard_sgd_row(wa, va, gd, D, 0.07, MU, WD);
                    shard_dense_sgd_row(wb, vb, gd, D, &M, 0.07, MU, WD);
                } else {
                    shard_sgd_row_f32(wa, va, g, D, 0.07, MU, WD);
                    shard_dense_sgd_row_f32(wb, vb, g, D, &M, 0.07, MU, WD);
                }
                bad += memcmp(wa, wb, sizeof(float) * D) != 0 || memcmp(va, vb, sizeof(float) * D) != 0;
            }
            memcpy(wa, w0, sizeof(float) * D), memcpy(va, v0, sizeof(float) * D);
            memcpy(wb, w0, sizeof(float) * D), memcpy(vb, v0, sizeof(float) * D);
            shard_sgd_row_f32(wa, va, g, D, 0.07, MU, WD);
            shard_dense_sgd_row_f32(wb, vb, g, D, NULL, 0.07, MU, WD);
            bad += memcmp(wa, wb, sizeof(float) * D) != 0 || memcmp(va, vb, sizeof(float) * D) != 0;
        }
    CHECK(bad == 0, "fused closed form + SGD == dense_apply_row then SGD: %d of %zu cases differ", bad,
          sizeof dims / sizeof *dims * (sizeof firsts / sizeof *firsts) * 3);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Time per row at D = 512 of the closed form (compose + apply) vs the k-step float32 loop. */
static void measure(void)
{
    enum { D = 512, ROWS = 2000 };
    static float w[D], v[D];
    double lr[64];
    for (int t = 0; t < 64; t++)
        lr[t] = 0.1 - 0.001 * t;
    for (int j = 0; j < D; j++)
        w[j] = 0.01f * (float)(j % 7), v[j] = 0.001f;
    const int ks[] = {1, 10, 30};
    for (size_t i = 0; i < sizeof ks / sizeof *ks; i++) {
        int k = ks[i];
        double t0 = now_s();
        for (int r = 0; r < ROWS; r++) {
            dense_map M;
            dense_compose(lr, 0, k - 1, MU, WD, &M);
            dense_apply_row(w, v, D, &M);
        }
        double t1 = now_s();
        for (int r = 0; r < ROWS; r++)
            dense_steps_f32(w, v, D, lr, 0, k - 1, MU, WD);
        double t2 = now_s();
        printf("D %d, k %d skipped steps: closed form %.3g us/row, step loop %.3g us/row\n", D, k,
               1e6 * (t1 - t0) / ROWS, 1e6 * (t2 - t1) / ROWS);
    }
    /* A push's update of a row that skipped steps (the row in cache): two passes vs the fused one. */
    static float g[D];
    for (int j = 0; j < D; j++)
        g[j] = 1e-4f * (float)(j % 5);
    dense_map M;
    dense_compose(lr, 0, 9, MU, WD, &M);
    double t0 = now_s();
    for (int r = 0; r < ROWS; r++) {
        dense_apply_row(w, v, D, &M);
        shard_sgd_row_f32(w, v, g, D, 0.05, MU, WD);
    }
    double t1 = now_s();
    for (int r = 0; r < ROWS; r++)
        shard_dense_sgd_row_f32(w, v, g, D, &M, 0.05, MU, WD);
    double t2 = now_s();
    printf("D %d, push of a row that skipped steps: closed form then SGD %.3g us/row, fused %.3g us/row\n", D,
           1e6 * (t1 - t0) / ROWS, 1e6 * (t2 - t1) / ROWS);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    test_vs_f64_loop();
    test_lanes();
    test_fused();
    test_torch_ref("dense_skip_K1_R20_D64");
    test_torch_ref("dense_skip_K7_R20_D64");
    test_torch_ref("dense_skip_K300_R8_D512");
    measure();
    printf(fails ? "FAILED (%d)\n" : "PASS\n", fails);
    return fails ? 1 : 0;
}
