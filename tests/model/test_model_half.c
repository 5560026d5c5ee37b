/* The debugging device cpu-bf16 (kernels/cpu/ops_cpu_bf16.c) against the fp32 CPU device, layer by
 * layer, on fresh random shapes and inputs each run (seed printed; PFCPS_TEST_SEED replays one).
 *
 * bf16 keeps 8 significant bits: round to nearest even has unit roundoff u = 2^-8 (|rd(x) - x| <=
 * u |x| for normal x). The test rounds with its own function (frexp / nearbyint, not bit tricks),
 * checked on hand-computed bit patterns, and holds each layer to two bounds:
 *  (a) pipeline: ops_cpu run on the test-rounded inputs (and bf16-rounded convolution weights, as
 *      autocast does) gives the same result as the device up to the final rounding of each output:
 *      |dev - ref| <= u |ref| per element; fp32 side outputs (BN statistics, running stats,
 *      BN/PReLU parameter gradients) must be bit-identical.
 *  (b) against fp32 on the unrounded inputs, a bound derived per element from u and the reduction:
 *      convolution y = sum of R products w x: each rounded input contributes a relative error <= u,
 *      so |y(rounded) - y| <= (2u + u^2) S with S = sum |w||x| (computed by running the conv on
 *      |w|, |x|); both fp32 sums differ from exact by <= R 2^-24 S each; the output rounding adds
 *      u |y|: bound u |y| + (1 + u)(2u + u^2 + 2 R 2^-24) S, with R = C/groups K K (forward),
 *      OC/groups K K (data gradient), B OH OW (weight gradient). Batch norm forward: input errors
 *      e_i = u (|x_i| + mean|x|) on x - mean, a variance error V <= mean(2 |x - mean| e + e^2), so
 *      sigma lies in [sqrt(var + eps - V), sqrt(var + eps + V)]; bound |w| (e_i / sigma_lo +
 *      |x_i - mean| |1/sigma' - 1/sigma|max) + u |y| (+1% for fp32 evaluation). PReLU: the rounding
 *      never flips a sign, bound (2u + u^2)|y|. Backward batch norm and PReLU against unrounded fp32
 *      are printed for information only (their (a) checks are strict).
 * Every bf16 output is poisoned with NaN before the call and every element checked written.
 * Bad input: linear and dropout (run after the flatten, on the plain device), bad shapes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "kernels/ops.h"
#include "tests/check.h"

#define U 0x1.0p-8 /* bf16 unit roundoff */
#define U32 0x1.0p-24

static uint64_t rng_state;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static int irand(int lo, int hi) { return lo + (int)(rnd() % (uint64_t)(hi - lo + 1)); }
static float frand(float lo, float hi) { return lo + (hi - lo) * (float)((rnd() >> 11) * 0x1.0p-53); }

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        printf("FAIL: out of memory\n");
        exit(1);
    }
    return p;
}

static float *frnd(size_t n, float lo, float hi)
{
    float *p = xmalloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = frand(lo, hi);
    return p;
}

static float *fcopy(const float *s, size_t n)
{
    float *p = xmalloc(n * sizeof *p);
    memcpy(p, s, n * sizeof *p);
    return p;
}

static float *fabs_of(const float *s, size_t n)
{
    float *p = xmalloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = fabsf(s[i]);
    return p;
}

/* The test's own bf16 rounding (nearest, ties to even: nearbyint in the default rounding mode)
 * of a normal float: x = m 2^e with m in [0.5, 1); keep 8 significant bits of m. */
static float rbf(float x)
{
    if (x == 0.0f || !isfinite(x))
        return x;
    int e;
    double m = frexp((double)x, &e);
    return (float)ldexp(nearbyint(ldexp(m, 8)), e - 8);
}

static float *rbf_of(const float *x, size_t n)
{
    float *p = xmalloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = rbf(x[i]);
    return p;
}

/* bf16 storage of already-rounded floats (upper 16 bits; the lower ones are 0 after rbf). */
static uint16_t *bits_of(const float *r, size_t n)
{
    uint16_t *h = xmalloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &r[i], sizeof u);
        if (u & 0xffffu) {
            printf("FAIL: bits_of: %a is not a bf16 value\n", (double)r[i]);
            exit(1);
        }
        h[i] = (uint16_t)(u >> 16);
    }
    return h;
}

static float *floats_of(const uint16_t *h, size_t n)
{
    float *p = xmalloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)h[i] << 16;
        memcpy(&p[i], &u, sizeof u);
    }
    return p;
}

static uint16_t *bf_nan(size_t n)
{
    uint16_t *h = xmalloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++)
        h[i] = 0x7fc0u;
    return h;
}

#define F(p) ((float *)(void *)(p))
#define CF(p) ((const float *)(const void *)(p))

static ops_ctx *cpu, *bf;

#define RUN(call)                                                                                  \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_) {                                                                                 \
            printf("FAIL: %s returned %d (%s)\n", #call, rc_, pf_errmsg());                        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* Per-element check |got - ref| <= bound[i] (bound NULL: coef |ref| + floor), no NaN. Prints the
 * relative L2 error and the worst |got - ref| / bound. */
static void check_bound(const char *what, const float *got, const float *ref, const double *bound,
                        double coef, size_t n)
{
    double num = 0, den = 0, worst = 0;
    size_t nan = 0, bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i])) {
            nan++;
            continue;
        }
        double d = fabs((double)got[i] - ref[i]);
        double b = bound ? bound[i] : coef * fabs((double)ref[i]) + 1e-37;
        num += d * d;
        den += (double)ref[i] * ref[i];
        if (d / b > worst)
            worst = d / b;
        if (!(d <= b) && bad++ == 0)
            first = i;
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    int ok = nan == 0 && bad == 0;
    printf("%-4s %-44s n %-6zu rel %.3e  worst err/bound %.3f%s\n", ok ? "ok" : "FAIL", what, n, rel,
           worst, nan ? "  (NaN left: element not written)" : "");
    if (bad)
        printf("     first violation at %zu: got %.9g ref %.9g\n", first, (double)got[first],
               (double)ref[first]);
    CHECK(ok, "%s", what);
}

static void check_same(const char *what, const void *got, const void *ref, size_t bytes)
{
    int ok = memcmp(got, ref, bytes) == 0;
    printf("%-4s %-44s bit-identical\n", ok ? "ok" : "FAIL", what);
    CHECK(ok, "%s not bit-identical", what);
}

static void info(const char *what, const float *got, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    printf("info %-44s rel %.3e (vs fp32 on unrounded inputs)\n", what, den > 0 ? sqrt(num / den) : sqrt(num));
}

/* Conversion against hand-computed bit patterns (through from_plain with HW = 1: plain layout). */
static void test_rounding(void)
{
    const float in[] = {1.0f, 1.0f + 0x1.0p-8f, 1.0f + 3 * 0x1.0p-8f, 1.0f + 0x1.0p-7f + 0x1.0p-9f,
                        -2.0f, 0x1.fffffep127f, -0.0f, 0x1.0p-126f, 65504.0f, NAN};
    const uint16_t want[] = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0xc000, 0x7f80, 0x8000, 0x0080, 0x4780, 0x7fc0};
    const int n = (int)(sizeof in / sizeof in[0]);
    uint16_t *out = bf_nan((size_t)n);
    RUN(ops_cpu_bf16.from_plain(bf, F(out), 0, in, 1, n, 1));
    int ok = 1;
    for (int i = 0; i < n; i++) {
        int same = isnan(in[i]) ? ((out[i] & 0x7f80) == 0x7f80 && (out[i] & 0x7f)) : out[i] == want[i];
        if (!same) {
            printf("     from_plain(%a) = 0x%04x, want 0x%04x\n", (double)in[i], out[i], want[i]);
            ok = 0;
        }
        float r = rbf(in[i]);
        uint32_t rb;
        memcpy(&rb, &r, sizeof rb);
        if (!isnan(in[i]) && i != 5 && rb != (uint32_t)want[i] << 16) {
            printf("     test rounding rbf(%a) disagrees with 0x%04x\n", (double)in[i], want[i]);
            ok = 0;
        }
    }
    printf("%-4s %-44s (ties to even, overflow to inf, NaN kept)\n", ok ? "ok" : "FAIL",
           "bf16 rounding: hand-computed bit patterns");
    CHECK(ok, "bf16 rounding");
    free(out);
}

static double conv_bound(double y, double S, double R)
{
    return U * fabs(y) + (1 + U) * (2 * U + U * U + 2 * R * U32) * S + 1e-37;
}

static void test_conv(int round)
{
    ops_conv_shape s;
    int g = irand(0, 1), B = irand(1, 3), C = 8 * irand(1, 2), H = irand(5, 11), W = irand(5, 11);
    int K = irand(0, 1) ? 3 : 1, stride = irand(1, 2), pad = K == 3 ? irand(0, 1) : 0, OC = 8 * irand(1, 3);
    int groups = 1;
    if (g == 1) {
        OC = C;
        groups = C;
    }
    if (round == 0) {
        C = 3; /* the stem: input channels not a multiple of 8 (plain layout) */
        groups = 1;
    }
    RUN(ops_conv_shape_init(&s, B, C, H, W, OC, K, stride, pad, groups));
    size_t nin = (size_t)B * C * H * W, nout = (size_t)B * OC * s.OH * s.OW;
    size_t nw = (size_t)OC * (C / groups) * K * K;
    char lab[128];
    printf("conv B=%d C=%d %dx%d OC=%d K=%d stride %d pad %d groups %d\n", B, C, H, W, OC, K, stride,
           pad, groups);
    float *x = frnd(nin, -1, 1), *w = frnd(nw, -0.5f, 0.5f), *dy = frnd(nout, -1, 1);
    float *d0 = frnd(nin, -1, 1), *dw0 = frnd(nw, -1, 1);
    float *xr = rbf_of(x, nin), *wr = rbf_of(w, nw), *dyr = rbf_of(dy, nout), *d0r = rbf_of(d0, nin);
    uint16_t *xh = bits_of(xr, nin), *dyh = bits_of(dyr, nout), *dinh = bits_of(d0r, nin);
    uint16_t *outh = bf_nan(nout);
    /* forward */
    RUN(ops_cpu_bf16.conv_forward(bf, F(outh), CF(xh), w, &s));
    float *got = floats_of(outh, nout), *ya = xmalloc(nout * 4), *yb = xmalloc(nout * 4), *S = xmalloc(nout * 4);
    RUN(ops_cpu.conv_forward(cpu, ya, xr, wr, &s));
    RUN(ops_cpu.conv_forward(cpu, yb, x, w, &s));
    float *ax = fabs_of(x, nin), *aw = fabs_of(w, nw), *ady = fabs_of(dy, nout);
    RUN(ops_cpu.conv_forward(cpu, S, ax, aw, &s));
    double *bd = xmalloc(nout * sizeof *bd);
    double R = (double)(C / groups) * K * K;
    for (size_t i = 0; i < nout; i++)
        bd[i] = conv_bound(yb[i], S[i], R);
    check_bound("conv fwd (a) vs ops_cpu on rounded inputs", got, ya, NULL, U, nout);
    snprintf(lab, sizeof lab, "conv fwd (b) vs fp32, R=%.0f", R);
    check_bound(lab, got, yb, bd, 0, nout);
    /* backward: dinp accumulated into d0, dweight into dw0 */
    float *dwdev = fcopy(dw0, nw);
    RUN(ops_cpu_bf16.conv_backward(bf, F(dinh), 1, dwdev, CF(dyh), CF(xh), w, &s));
    float *gdx = floats_of(dinh, nin);
    float *dxa = fcopy(d0r, nin), *dwa = calloc(nw, 4);
    RUN(ops_cpu.conv_backward(cpu, dxa, 1, dwa, dyr, xr, wr, &s));
    check_bound("conv bwd dinp (+=) (a)", gdx, dxa, NULL, U, nin);
    double *bw = xmalloc(nw * sizeof *bw);
    float *dwref = xmalloc(nw * 4);
    for (size_t i = 0; i < nw; i++) {
        dwref[i] = dw0[i] + dwa[i];
        bw[i] = U * fabs((double)dwa[i]) + 2 * U32 * (fabs((double)dw0[i]) + fabs((double)dwa[i])) + 1e-37;
    }
    check_bound("conv bwd dweight (+=) (a)", dwdev, dwref, bw, 0, nw);
    /* (b): fp32 on unrounded inputs, and the absolute-value runs for S */
    float *dxb = fcopy(d0r, nin), *dwb = calloc(nw, 4), *Sx = xmalloc(nin * 4), *Sw = calloc(nw, 4);
    RUN(ops_cpu.conv_backward(cpu, dxb, 1, dwb, dy, x, w, &s));
    RUN(ops_cpu.conv_backward(cpu, Sx, 0, Sw, ady, ax, aw, &s));
    double *bx = xmalloc(nin * sizeof *bx);
    double Rd = (double)(OC / groups) * K * K, Rw = (double)B * s.OH * s.OW;
    for (size_t i = 0; i < nin; i++)
        bx[i] = conv_bound(dxb[i], Sx[i], Rd) + 2 * U32 * fabs((double)d0r[i]);
    snprintf(lab, sizeof lab, "conv bwd dinp (b) vs fp32, R=%.0f", Rd);
    check_bound(lab, gdx, dxb, bx, 0, nin);
    for (size_t i = 0; i < nw; i++) {
        bw[i] = conv_bound(dwb[i], Sw[i], Rw) + 2 * U32 * (fabs((double)dw0[i]) + fabs((double)dwb[i]));
        dwb[i] += dw0[i];
    }
    snprintf(lab, sizeof lab, "conv bwd dweight (b) vs fp32, R=%.0f", Rw);
    check_bound(lab, dwdev, dwb, bw, 0, nw);
    free(x); free(w); free(dy); free(d0); free(dw0); free(xr); free(wr); free(dyr); free(d0r);
    free(xh); free(dyh); free(dinh); free(outh); free(got); free(ya); free(yb); free(S); free(ax);
    free(aw); free(ady); free(bd); free(dwdev); free(gdx); free(dxa); free(dwa); free(bw); free(dwref);
    free(dxb); free(dwb); free(Sx); free(Sw); free(bx);
}

/* Index of channel c of element i in the CPU device's layout (act_block bs). */
static int chan_of(size_t i, int C, int HW, int bs)
{
    size_t blk = i / ((size_t)HW * bs); /* b * (C/bs) + c/bs */
    return (int)(blk % (size_t)(C / bs)) * bs + (int)(i % (size_t)bs);
}

static void test_bn(void)
{
    int B = irand(1, 3), C = 8 * irand(1, 3), H = irand(3, 9), HW = H * H, bs = ops_cpu.act_block(C);
    size_t n = (size_t)B * C * HW;
    float eps = 1e-5f, mom = 0.1f;
    printf("batchnorm B=%d C=%d HW=%d (layout block %d)\n", B, C, HW, bs);
    float *x = frnd(n, -1, 2), *w = frnd((size_t)C, 0.5f, 1.5f), *b = frnd((size_t)C, -0.5f, 0.5f);
    float *rm0 = frnd((size_t)C, -0.1f, 0.1f), *rv0 = frnd((size_t)C, 0.9f, 1.1f);
    float *xr = rbf_of(x, n);
    uint16_t *xh = bits_of(xr, n), *outh = bf_nan(n);
    double *sm = xmalloc(C * 8), *sv = xmalloc(C * 8), *sma = xmalloc(C * 8), *sva = xmalloc(C * 8);
    double *smb = xmalloc(C * 8), *svb = xmalloc(C * 8);
    float *rm = fcopy(rm0, C), *rv = fcopy(rv0, C), *rma = fcopy(rm0, C), *rva = fcopy(rv0, C);
    float *rmb = fcopy(rm0, C), *rvb = fcopy(rv0, C);
    RUN(ops_cpu_bf16.bn_forward(bf, F(outh), sm, sv, CF(xh), w, b, rm, rv, B, C, HW, eps, mom, 1));
    float *got = floats_of(outh, n), *ya = xmalloc(n * 4), *yb = xmalloc(n * 4);
    RUN(ops_cpu.bn_forward(cpu, ya, sma, sva, xr, w, b, rma, rva, B, C, HW, eps, mom, 1));
    RUN(ops_cpu.bn_forward(cpu, yb, smb, svb, x, w, b, rmb, rvb, B, C, HW, eps, mom, 1));
    check_bound("bn fwd train (a)", got, ya, NULL, U, n);
    check_same("bn save_mean (a)", sm, sma, C * 8);
    check_same("bn save_var (a)", sv, sva, C * 8);
    check_same("bn running_mean (a)", rm, rma, C * 4);
    check_same("bn running_var (a)", rv, rva, C * 4);
    /* (b): the derived bound, per channel statistics in double */
    double *m1 = calloc(C, 8), *mu = calloc(C, 8), *var = calloc(C, 8), *V = calloc(C, 8);
    double cnt = (double)B * HW;
    for (size_t i = 0; i < n; i++) {
        int c = chan_of(i, C, HW, bs);
        m1[c] += fabs((double)x[i]) / cnt;
        mu[c] += (double)x[i] / cnt;
    }
    for (size_t i = 0; i < n; i++) {
        int c = chan_of(i, C, HW, bs);
        double d = x[i] - mu[c], e = U * (fabs((double)x[i]) + m1[c]);
        var[c] += d * d / cnt;
        V[c] += (2 * fabs(d) * e + e * e) / cnt;
    }
    double *bd = xmalloc(n * 8);
    for (size_t i = 0; i < n; i++) {
        int c = chan_of(i, C, HW, bs);
        double sig = sqrt(var[c] + eps), lo = sqrt(fmax(var[c] + eps - V[c], (double)eps));
        double hi = sqrt(var[c] + eps + V[c]);
        double dinv = fmax(1 / lo - 1 / sig, 1 / sig - 1 / hi);
        double d = fabs((double)x[i] - mu[c]), e = U * (fabs((double)x[i]) + m1[c]);
        double t = fabs((double)w[c]) * (e / lo + d * dinv);
        bd[i] = 1.01 * (t + U * (fabs((double)yb[i]) + t)) + 1e-30;
    }
    check_bound("bn fwd train (b) vs fp32, derived bound", got, yb, bd, 0, n);
    /* eval */
    uint16_t *evh = bf_nan(n);
    RUN(ops_cpu_bf16.bn_forward(bf, F(evh), NULL, NULL, CF(xh), w, b, rm0, rv0, B, C, HW, eps, mom, 0));
    float *gev = floats_of(evh, n), *eva = xmalloc(n * 4);
    RUN(ops_cpu.bn_forward(cpu, eva, NULL, NULL, xr, w, b, rm0, rv0, B, C, HW, eps, mom, 0));
    check_bound("bn fwd eval (a)", gev, eva, NULL, U, n);
    /* backward, dinp accumulated */
    float *dy = frnd(n, -1, 1), *d0 = frnd(n, -1, 1), *dyr = rbf_of(dy, n), *d0r = rbf_of(d0, n);
    uint16_t *dyh = bits_of(dyr, n), *dinh = bits_of(d0r, n);
    float *dw0 = frnd(C, -1, 1), *db0 = frnd(C, -1, 1);
    float *dw = fcopy(dw0, C), *db = fcopy(db0, C), *dwa = fcopy(dw0, C), *dba = fcopy(db0, C);
    RUN(ops_cpu_bf16.bn_backward(bf, F(dinh), 1, dw, db, CF(dyh), CF(xh), w, sm, sv, B, C, HW, eps));
    float *gdx = floats_of(dinh, n), *dxa = fcopy(d0r, n);
    RUN(ops_cpu.bn_backward(cpu, dxa, 1, dwa, dba, dyr, xr, w, sma, sva, B, C, HW, eps));
    check_bound("bn bwd dinp (+=) (a)", gdx, dxa, NULL, U, n);
    check_same("bn bwd dweight (+=) (a)", dw, dwa, C * 4);
    check_same("bn bwd dbias (+=) (a)", db, dba, C * 4);
    float *dxb = fcopy(d0r, n);
    RUN(ops_cpu.bn_backward(cpu, dxb, 1, NULL, NULL, dy, x, w, smb, svb, B, C, HW, eps));
    info("bn bwd dinp (b)", gdx, dxb, n);
    /* dinp NULL (first layer) with only the parameter gradients */
    float *dw2 = fcopy(dw0, C);
    RUN(ops_cpu_bf16.bn_backward(bf, NULL, 0, dw2, NULL, CF(dyh), CF(xh), w, sm, sv, B, C, HW, eps));
    float *dwa2 = fcopy(dw0, C);
    RUN(ops_cpu.bn_backward(cpu, NULL, 0, dwa2, NULL, dyr, xr, w, sma, sva, B, C, HW, eps));
    check_same("bn bwd dinp NULL: dweight (a)", dw2, dwa2, C * 4);
    free(x); free(w); free(b); free(rm0); free(rv0); free(xr); free(xh); free(outh); free(sm);
    free(sv); free(sma); free(sva); free(smb); free(svb); free(rm); free(rv); free(rma); free(rva);
    free(rmb); free(rvb); free(got); free(ya); free(yb); free(m1); free(mu); free(var); free(V);
    free(bd); free(evh); free(gev); free(eva); free(dy); free(d0); free(dyr); free(d0r); free(dyh);
    free(dinh); free(dw0); free(db0); free(dw); free(db); free(dwa); free(dba); free(gdx); free(dxa);
    free(dxb); free(dw2); free(dwa2);
}

static void test_prelu(void)
{
    int B = irand(1, 3), C = 8 * irand(1, 3), HW = irand(2, 40);
    size_t n = (size_t)B * C * HW;
    printf("prelu B=%d C=%d HW=%d\n", B, C, HW);
    float *x = frnd(n, -1, 1), *a = frnd(C, 0.1f, 0.4f), *xr = rbf_of(x, n);
    uint16_t *xh = bits_of(xr, n), *outh = bf_nan(n);
    RUN(ops_cpu_bf16.prelu_forward(bf, F(outh), CF(xh), a, B, C, HW));
    float *got = floats_of(outh, n), *ya = xmalloc(n * 4), *yb = xmalloc(n * 4);
    RUN(ops_cpu.prelu_forward(cpu, ya, xr, a, B, C, HW));
    RUN(ops_cpu.prelu_forward(cpu, yb, x, a, B, C, HW));
    check_bound("prelu fwd (a)", got, ya, NULL, U, n);
    check_bound("prelu fwd (b) vs fp32, (2u+u^2)|y|", got, yb, NULL, 2 * U + U * U + 2 * U32, n);
    float *dy = frnd(n, -1, 1), *d0 = frnd(n, -1, 1), *dyr = rbf_of(dy, n), *d0r = rbf_of(d0, n);
    uint16_t *dyh = bits_of(dyr, n), *dinh = bits_of(d0r, n);
    float *da0 = frnd(C, -1, 1), *da = fcopy(da0, C), *daa = fcopy(da0, C);
    RUN(ops_cpu_bf16.prelu_backward(bf, F(dinh), 1, da, CF(dyh), CF(xh), a, B, C, HW));
    float *gdx = floats_of(dinh, n), *dxa = fcopy(d0r, n);
    RUN(ops_cpu.prelu_backward(cpu, dxa, 1, daa, dyr, xr, a, B, C, HW));
    check_bound("prelu bwd dinp (+=) (a)", gdx, dxa, NULL, U, n);
    check_same("prelu bwd dalpha (+=) (a)", da, daa, C * 4);
    float *dxb = fcopy(d0r, n);
    RUN(ops_cpu.prelu_backward(cpu, dxb, 1, NULL, dy, x, a, B, C, HW));
    info("prelu bwd dinp (b)", gdx, dxb, n);
    free(x); free(a); free(xr); free(xh); free(outh); free(got); free(ya); free(yb); free(dy);
    free(d0); free(dyr); free(d0r); free(dyh); free(dinh); free(da0); free(da); free(daa); free(gdx);
    free(dxa); free(dxb);
}

/* add, acc, to_plain, from_plain: each output must equal the test's own rounding exactly. */
static void test_elementwise(void)
{
    int B = irand(1, 3), C = 8 * irand(1, 3), HW = irand(2, 30);
    size_t n = (size_t)B * C * HW;
    printf("elementwise n=%zu (B=%d C=%d HW=%d)\n", n, B, C, HW);
    float *a0 = frnd(n, -2, 2), *b0 = frnd(n, -2, 2);
    float *a = rbf_of(a0, n), *b = rbf_of(b0, n), *want = xmalloc(n * 4);
    free(a0);
    free(b0);
    uint16_t *ah = bits_of(a, n), *bh = bits_of(b, n), *outh = bf_nan(n);
    for (size_t i = 0; i < n; i++)
        want[i] = rbf(a[i] + b[i]);
    uint16_t *wh = bits_of(want, n);
    RUN(ops_cpu_bf16.add_forward(bf, F(outh), CF(ah), CF(bh), n));
    check_same("add: rd(a + b)", outh, wh, n * 2);
    uint16_t *ip = bits_of(a, n);
    RUN(ops_cpu_bf16.add_forward(bf, F(ip), CF(ip), CF(bh), n));
    check_same("add in place on a", ip, wh, n * 2);
    uint16_t *acc = bits_of(a, n);
    RUN(ops_cpu_bf16.acc(bf, F(acc), 1, CF(bh), n));
    check_same("acc +=: rd(dst + src)", acc, wh, n * 2);
    uint16_t *cp = bf_nan(n);
    RUN(ops_cpu_bf16.acc(bf, F(cp), 0, CF(bh), n));
    check_same("acc =: copy", cp, bh, n * 2);
    /* to_plain: bf16 device layout -> fp32 NCHW equals ops_cpu's to_plain of the same values */
    float *tp = xmalloc(n * 4), *tpa = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++)
        tp[i] = NAN;
    RUN(ops_cpu_bf16.to_plain(bf, tp, CF(ah), B, C, HW));
    RUN(ops_cpu.to_plain(cpu, tpa, a, B, C, HW));
    check_same("to_plain (exact)", tp, tpa, n * 4);
    /* from_plain = and += */
    float *src = frnd(n, -2, 2), *lay = xmalloc(n * 4);
    RUN(ops_cpu.from_plain(cpu, lay, 0, src, B, C, HW));
    for (size_t i = 0; i < n; i++)
        lay[i] = rbf(lay[i]);
    uint16_t *fph = bf_nan(n), *fpw = bits_of(lay, n);
    RUN(ops_cpu_bf16.from_plain(bf, F(fph), 0, src, B, C, HW));
    check_same("from_plain =: rd(src) in layout", fph, fpw, n * 2);
    float *acl = fcopy(b, n);
    RUN(ops_cpu.from_plain(cpu, acl, 1, src, B, C, HW));
    for (size_t i = 0; i < n; i++)
        acl[i] = rbf(acl[i]);
    uint16_t *fpa = bits_of(b, n), *fpaw = bits_of(acl, n);
    RUN(ops_cpu_bf16.from_plain(bf, F(fpa), 1, src, B, C, HW));
    check_same("from_plain +=: rd(dst + src)", fpa, fpaw, n * 2);
    free(a); free(b); free(want); free(ah); free(bh); free(outh); free(wh); free(ip); free(acc);
    free(cp); free(tp); free(tpa); free(src); free(lay); free(fph); free(fpw); free(acl); free(fpa);
    free(fpaw);
}

static void test_refusals(void)
{
    float buf[64] = {0}, mask[64];
    ops_conv_shape s;
    RUN(ops_conv_shape_init(&s, 1, 8, 4, 4, 8, 3, 1, 1, 1));
    s.OH = 7; /* not derived */
    int rc = ops_cpu_bf16.conv_forward(bf, buf, buf, buf, &s);
    printf("     conv with underived OH: %d (%s)\n", rc, pf_errmsg());
    CHECK(rc == -EINVAL, "conv bad shape: %d", rc);
    rc = ops_cpu_bf16.bn_forward(bf, buf, NULL, NULL, buf, buf, buf, buf, buf, 0, 8, 4, 1e-5f, 0.1f, 0);
    printf("     batchnorm B=0: %d (%s)\n", rc, pf_errmsg());
    CHECK(rc == -EINVAL, "bn B=0: %d", rc);
    rc = ops_cpu_bf16.prelu_forward(bf, buf, buf, buf, 1, -1, 4);
    printf("     prelu C=-1: %d (%s)\n", rc, pf_errmsg());
    CHECK(rc == -EINVAL, "prelu C=-1: %d", rc);
    rc = ops_cpu_bf16.linear_forward(bf, buf, buf, buf, NULL, 1, 4, 4);
    printf("     linear on the half device: %d (%s)\n", rc, pf_errmsg());
    CHECK(rc == -EINVAL && strstr(pf_errmsg(), "plain"), "linear: %d", rc);
    rc = ops_cpu_bf16.linear_backward(bf, buf, 0, buf, NULL, buf, buf, buf, 1, 4, 4);
    CHECK(rc == -EINVAL, "linear backward: %d", rc);
    rc = ops_cpu_bf16.dropout_forward(bf, buf, mask, buf, 8, 0.1f, 1);
    printf("     dropout on the half device: %d (%s)\n", rc, pf_errmsg());
    CHECK(rc == -EINVAL && strstr(pf_errmsg(), "plain"), "dropout: %d", rc);
    rc = ops_cpu_bf16.dropout_backward(bf, buf, 0, buf, mask, 8);
    CHECK(rc == -EINVAL, "dropout backward: %d", rc);
    int ok = ops_cpu_bf16.act_bytes == 2 && ops_cpu_bf16.plain == &ops_cpu &&
             ops_cpu_bf16.act_block(16) == ops_cpu.act_block(16) &&
             ops_cpu_bf16.act_block(3) == ops_cpu.act_block(3);
    printf("%-4s %-44s\n", ok ? "ok" : "FAIL", "act_bytes 2, plain = ops_cpu, ops_cpu's layout");
    CHECK(ok, "table fields");
}

int main(void)
{
    const char *e = getenv("PFCPS_TEST_SEED");
    uint64_t seed = e ? strtoull(e, NULL, 10) : (uint64_t)time(NULL);
    printf("seed %llu (PFCPS_TEST_SEED replays)\n", (unsigned long long)seed);
    rng_state = seed * 0x9E3779B97F4A7C15ull | 1;
    RUN(ops_cpu.ctx_create(&cpu));
    RUN(ops_cpu_bf16.ctx_create(&bf));
    test_rounding();
    for (int r = 0; r < 3; r++)
        test_conv(r);
    for (int r = 0; r < 2; r++) {
        test_bn();
        test_prelu();
        test_elementwise();
    }
    test_refusals();
    ops_cpu_bf16.ctx_destroy(bf);
    ops_cpu.ctx_destroy(cpu);
    printf("%s: %d failure(s)\n", fails ? "FAIL" : "PASS", fails);
    return fails != 0;
}
