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
#include "tests/npy.h"
#include "tests/worker/model/ref64.h"
#include "tests/worker/model/refcase.h"
#include "worker/model/model_internal.h"

#define U   0x1.0p-8 /* bf16 unit roundoff */
#define U32 0x1.0p-24

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

#define F(p)  ((float *)(void *)(p))
#define CF(p) ((const float *)(const void *)(p))

static ops_ctx *cpu, *bf;

#define RUN(call)                                                                                            \
    do {                                                                                                     \
        int rc_ = (call);                                                                                    \
        if (rc_) {                                                                                           \
            printf("FAIL: %s returned %d (%s)\n", #call, rc_, pf_errmsg());                                  \
            exit(1);                                                                                         \
        }                                                                                                    \
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
    printf("%-4s %-44s n %-6zu rel %.3e  worst err/bound %.3f%s\n", ok ? "ok" : "FAIL", what, n, rel, worst,
           nan ? "  (NaN left: element not written)" : "");
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
    printf("info %-44s rel %.3e (vs fp32 on unrounded inputs)\n", what,
           den > 0 ? sqrt(num / den) : sqrt(num));
}

/* Conversion against hand-computed bit patterns (through from_plain with HW = 1: plain layout). */
static void test_rounding(void)
{
    const float in[] = {1.0f,
                        1.0f + 0x1.0p-8f,
                        1.0f + 3 * 0x1.0p-8f,
                        1.0f + 0x1.0p-7f + 0x1.0p-9f,
                        -2.0f,
                        0x1.fffffep127f,
                        -0.0f,
                        0x1.0p-126f,
                        65504.0f,
                        NAN};
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
    printf("conv B=%d C=%d %dx%d OC=%d K=%d stride %d pad %d groups %d\n", B, C, H, W, OC, K, stride, pad,
           groups);
    float *x = frnd(nin, -1, 1), *w = frnd(nw, -0.5f, 0.5f), *dy = frnd(nout, -1, 1);
    float *d0 = frnd(nin, -1, 1), *dw0 = frnd(nw, -1, 1);
    float *xr = rbf_of(x, nin), *wr = rbf_of(w, nw), *dyr = rbf_of(dy, nout), *d0r = rbf_of(d0, nin);
    uint16_t *xh = bits_of(xr, nin), *dyh = bits_of(dyr, nout), *dinh = bits_of(d0r, nin);
    uint16_t *outh = bf_nan(nout);
    /* forward */
    RUN(ops_cpu_bf16.conv_forward(bf, F(outh), CF(xh), w, &s));
    float *got = floats_of(outh, nout), *ya = xmalloc(nout * 4), *yb = xmalloc(nout * 4),
          *S = xmalloc(nout * 4);
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
    free(x);
    free(w);
    free(dy);
    free(d0);
    free(dw0);
    free(xr);
    free(wr);
    free(dyr);
    free(d0r);
    free(xh);
    free(dyh);
    free(dinh);
    free(outh);
    free(got);
    free(ya);
    free(yb);
    free(S);
    free(ax);
    free(aw);
    free(ady);
    free(bd);
    free(dwdev);
    free(gdx);
    free(dxa);
    free(dwa);
    free(bw);
    free(dwref);
    free(dxb);
    free(dwb);
    free(Sx);
    free(Sw);
    free(bx);
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
    free(x);
    free(w);
    free(b);
    free(rm0);
    free(rv0);
    free(xr);
    free(xh);
    free(outh);
    free(sm);
    free(sv);
    free(sma);
    free(sva);
    free(smb);
    free(svb);
    free(rm);
    free(rv);
    free(rma);
    free(rva);
    free(rmb);
    free(rvb);
    free(got);
    free(ya);
    free(yb);
    free(m1);
    free(mu);
    free(var);
    free(V);
    free(bd);
    free(evh);
    free(gev);
    free(eva);
    free(dy);
    free(d0);
    free(dyr);
    free(d0r);
    free(dyh);
    free(dinh);
    free(dw0);
    free(db0);
    free(dw);
    free(db);
    free(dwa);
    free(dba);
    free(gdx);
    free(dxa);
    free(dxb);
    free(dw2);
    free(dwa2);
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
    free(x);
    free(a);
    free(xr);
    free(xh);
    free(outh);
    free(got);
    free(ya);
    free(yb);
    free(dy);
    free(d0);
    free(dyr);
    free(d0r);
    free(dyh);
    free(dinh);
    free(da0);
    free(da);
    free(daa);
    free(gdx);
    free(dxa);
    free(dxb);
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
    free(a);
    free(b);
    free(want);
    free(ah);
    free(bh);
    free(outh);
    free(wh);
    free(ip);
    free(acc);
    free(cp);
    free(tp);
    free(tpa);
    free(src);
    free(lay);
    free(fph);
    free(fpw);
    free(acl);
    free(fpa);
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

/* ---- the tiny reference networks on a half device (--reference DEVICE [case ...]) ----
 * ../shared/reference/backbone/<case> (PyTorch float64): initial parameters by name, one training
 * forward and backward with grad_output, an eval forward. Each tensor is held to
 * ||x - ref|| / ||ref|| <= tol (tensors that are 0 in exact arithmetic: max |x| <= tol, their
 * float64 reference holds only rounding noise). */

static double net_worst;

/* tol <= 0: printed for information, not judged. */
static int net_check(const char *what, const float *got, const double *ref, size_t n, double tol)
{
    int info_only = tol <= 0;
    double num = 0, den = 0, mx = 0;
    size_t nan = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) {
            nan++;
            continue;
        }
        double d = fabs((double)got[i] - ref[i]);
        num += d * d;
        den += ref[i] * ref[i];
        if (d > mx)
            mx = d;
    }
    int bad;
    if (sqrt(den / (double)n) < 1e-9) {
        bad = !info_only && (nan || !(mx <= tol));
        printf("  %-4s %-36s ref is 0: max_abs %.3e\n", info_only ? "info" : bad ? "FAIL" : "ok", what, mx);
    } else {
        double rel = sqrt(num / den);
        bad = !info_only && (nan || !(rel <= tol));
        printf("  %-4s %-36s rel %.3e  max_abs %.3e%s\n",
               info_only ? "info"
               : bad     ? "FAIL"
                         : "ok",
               what, rel, mx, nan ? "  (non-finite elements)" : "");
        if (!info_only && rel > net_worst)
            net_worst = rel;
    }
    CHECK(!bad, "%s", what);
    return bad;
}

/* Device buffer with the host contents (n floats; host NULL: zeroed). */
static float *dev_buf(const ops_device *dev, ops_ctx *ctx, const float *host, size_t n)
{
    void *p = NULL;
    RUN(dev->mem_alloc(ctx, &p, n * sizeof(float)));
    if (host)
        RUN(dev->mem_h2d(ctx, p, host, n * sizeof(float)));
    return p;
}

/* got (float) against a float64 array: relative L2 (absolute max when the reference is ~0). */
static double rel_f64(const float *got, const double *ref, size_t n)
{
    double num = 0, den = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        num += d * d;
        den += ref[i] * ref[i];
        if (d > mx || isnan(d))
            mx = isnan(d) ? INFINITY : d;
    }
    return sqrt(den / (double)n) < 1e-9 ? mx : sqrt(num / den);
}

/* bf16 rounding of a double (the emulation's rounding points). */
static double rbf_d(double x)
{
    if (x == 0.0 || !isfinite(x))
        return x;
    int e;
    double m = frexp(x, &e);
    return ldexp(nearbyint(ldexp(m, 8)), e - 8);
}

static void round_all(double *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        v[i] = rbf_d(v[i]);
}

/* dst = rd(dst + t) on a body tensor (the device rounds each write of a body gradient once, after
 * the fp32 +=), dst += t on a plain one. */
static void acc_round(double *dst, const double *t, size_t n, int body)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = body ? rbf_d(dst[i] + t[i]) : dst[i] + t[i];
}

/* The bf16 twin of the model: float64 plain C over m's layer list with the cpu-bf16 contract's
 * rounding points (ops_cpu_bf16.c): the input and every body layer output rounded to bf16, conv
 * weights rounded, conv weight-gradient contributions rounded before the fp32 +=, every write of
 * a body gradient rounded once after its +=; statistics, BN/PReLU parameter gradients and the
 * layers after the flatten unrounded. What the device computes in fp32 this computes in float64.
 * Fills emb (B,D), gin (input), grads (n_params), running (buffers, from running0), and
 * *act_worst: the largest relative difference between an activation of the device's last
 * (training) forward and the twin's (*act_at: which; PFCPS_TWIN_DEBUG=1 prints them all). */
static int emu_run(model *m, int B, const float *x, const float *gout, const float *params,
                   const float *running0, double *emb, double *gin, double *grads, double *running,
                   double *act_worst, int *act_at)
{
    double *p = malloc(m->n_params * sizeof *p);
    double **act = calloc((size_t)m->n_acts, sizeof *act), **grd = calloc((size_t)m->n_acts, sizeof *grd);
    double **st = calloc((size_t)m->n_layers, sizeof *st);
    size_t maxn = 0, maxw = 0;
    if (!p || !act || !grd || !st)
        return -1;
    for (size_t i = 0; i < m->n_params; i++)
        p[i] = params[i];
    for (int t = 0; t < m->n_acts; t++) {
        size_t n = (size_t)B * m->acts[t].per_sample;
        act[t] = calloc(n, sizeof(double));
        grd[t] = calloc(n, sizeof(double));
        if (!act[t] || !grd[t])
            return -1;
        if (n > maxn)
            maxn = n;
    }
    for (int i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].count > maxw)
            maxw = m->tensors[i].count;
    double *tmp = malloc(maxn * sizeof *tmp), *wr = malloc(maxw * sizeof *wr),
           *tw = malloc(maxw * sizeof *tw);
    if (!tmp || !wr || !tw)
        return -1;
    for (size_t i = 0; i < (size_t)B * m->acts[0].per_sample; i++)
        act[0][i] = rbf_d(x[i]); /* from_plain into the bf16 body */
    int rc = 0;
    for (int li = 0; li < m->n_layers && !rc; li++) {
        mlayer *l = &m->layers[li];
        mact *a = &m->acts[l->in];
        double *W = l->w >= 0 ? p + m->tensors[l->w].offset : NULL;
        double *Bi = l->b >= 0 ? p + m->tensors[l->b].offset : NULL;
        size_t n = (size_t)B * a->per_sample, no = (size_t)B * m->acts[l->out].per_sample;
        int body = !m->acts[l->out].plain;
        switch (l->kind) {
        case LK_CONV:
            for (size_t k = 0; k < m->tensors[l->w].count; k++)
                wr[k] = rbf_d(W[k]);
            conv64_forward(act[l->out], act[l->in], wr, B, a->C, a->H, a->W, l->OC, l->K, l->stride, l->pad,
                           l->groups);
            break;
        case LK_BN:
            st[li] = malloc(2 * (size_t)a->C * sizeof(double));
            bn64_forward(act[l->out], st[li], st[li] + a->C, act[l->in], W, Bi, B, a->C, a->H * a->W, 1e-5);
            for (int c = 0; c < a->C; c++) {
                size_t om = m->buffers_t[l->rm].offset + c, ov = m->buffers_t[l->rv].offset + c;
                double nn = (double)B * a->H * a->W;
                running[om] = 0.9 * running0[om] + 0.1 * st[li][c];
                running[ov] = 0.9 * running0[ov] + 0.1 * st[li][a->C + c] * nn / (nn - 1.0);
            }
            break;
        case LK_PRELU: prelu64_forward(act[l->out], act[l->in], W, B, a->C, a->H * a->W, NULL); break;
        case LK_ADD:
            for (size_t k = 0; k < n; k++)
                act[l->out][k] = act[l->in][k] + act[l->in2][k];
            break;
        case LK_FLATTEN: /* bf16 -> fp32 NCHW: exact */
            memcpy(act[l->out], act[l->in], n * sizeof(double));
            break;
        case LK_DROPOUT:
            if (l->p != 0.0f) {
                printf("emulation: dropout p=%g not supported\n", (double)l->p);
                rc = -1;
            }
            memcpy(act[l->out], act[l->in], n * sizeof(double));
            break;
        case LK_LINEAR: linear64_forward(act[l->out], act[l->in], W, Bi, B, (int)a->per_sample, l->OC); break;
        default: printf("emulation: layer kind %d not supported\n", l->kind); rc = -1;
        }
        if (body && l->kind != LK_FLATTEN)
            round_all(act[l->out], no);
    }
    /* every activation of the device's forward (still in the model) vs the twin's */
    *act_worst = 0;
    for (int t = 0; t < m->n_acts && !rc; t++) {
        mact *a = &m->acts[t];
        size_t n = (size_t)B * a->per_sample;
        float *h = malloc(n * sizeof *h);
        if (!h)
            return -1;
        if (a->plain)
            rc = m->pdev->mem_d2h(m->ctx_plain, h, a->data, n * sizeof *h);
        else
            rc = m->dev->to_plain(m->ctx, h, a->data, B, a->C, a->H * a->W);
        double r = rel_f64(h, act[t], n);
        if (getenv("PFCPS_TWIN_DEBUG"))
            printf("    act %2d %s C=%d %dx%d: rel %.3e\n", t, a->plain ? "plain" : "body ", a->C, a->H, a->W,
                   r);
        if (t != m->out_act && !(r <= *act_worst)) { /* the output: after BatchNorm1d, see net_case */
            *act_worst = r;
            *act_at = t;
        }
        free(h);
    }
    size_t D = m->acts[m->out_act].per_sample;
    memcpy(emb, act[m->out_act], (size_t)B * D * sizeof(double));
    for (size_t k = 0; k < (size_t)B * D; k++)
        grd[m->out_act][k] = gout[k];
    memset(grads, 0, m->n_params * sizeof(double));
    for (int li = m->n_layers - 1; li >= 0 && !rc; li--) {
        mlayer *l = &m->layers[li];
        mact *a = &m->acts[l->in];
        double *W = l->w >= 0 ? p + m->tensors[l->w].offset : NULL;
        double *dW = l->w >= 0 ? grads + m->tensors[l->w].offset : NULL;
        double *dB = l->b >= 0 ? grads + m->tensors[l->b].offset : NULL;
        size_t n = (size_t)B * a->per_sample;
        int body = !a->plain;
        memset(tmp, 0, n * sizeof *tmp);
        switch (l->kind) {
        case LK_CONV: {
            size_t nw = m->tensors[l->w].count;
            for (size_t k = 0; k < nw; k++)
                wr[k] = rbf_d(W[k]);
            memset(tw, 0, nw * sizeof *tw);
            conv64_backward(tmp, tw, grd[l->out], act[l->in], wr, B, a->C, a->H, a->W, l->OC, l->K, l->stride,
                            l->pad, l->groups);
            for (size_t k = 0; k < nw; k++)
                dW[k] += rbf_d(tw[k]);
            break;
        }
        case LK_BN:
            bn64_backward(tmp, l->fixed_weight ? NULL : dW, dB, grd[l->out], act[l->in], W, st[li],
                          st[li] + a->C, B, a->C, a->H * a->W, 1e-5);
            break;
        case LK_PRELU:
            prelu64_backward(tmp, dW, grd[l->out], act[l->in], W, B, a->C, a->H * a->W, NULL);
            break;
        case LK_ADD:
            acc_round(grd[l->in2], grd[l->out], n, body);
            memcpy(tmp, grd[l->out], n * sizeof *tmp);
            break;
        case LK_FLATTEN:
        case LK_DROPOUT: memcpy(tmp, grd[l->out], n * sizeof *tmp); break;
        case LK_LINEAR:
            linear64_backward(tmp, dW, dB, grd[l->out], act[l->in], W, B, (int)a->per_sample, l->OC);
            break;
        }
        acc_round(grd[l->in], tmp, n, body);
    }
    memcpy(gin, grd[0], (size_t)B * m->acts[0].per_sample * sizeof(double));
    for (int t = 0; t < m->n_acts; t++) {
        free(act[t]);
        free(grd[t]);
    }
    for (int li = 0; li < m->n_layers; li++)
        free(st[li]);
    free(act);
    free(grd);
    free(st);
    free(p);
    free(tmp);
    free(wr);
    free(tw);
    return rc;
}

/* Returns 0 ok, 1 fail, 77 skip. */
static int net_case(const ops_device *dev, const char *root, const char *name, double tol_twin,
                    double tol_ref, double tol_eval)
{
    char dir[1024], sub[1100];
    char *meta;
    model_desc d;
    int B, mrc = refcase_meta(dir, sizeof dir, root, name, &d, &B, &meta);
    if (mrc)
        return mrc;
    free(meta);
    model *m;
    int rc = model_create_desc(&m, &d, B, dev);
    if (rc == -ENODEV) {
        printf("SKIP: %s: %s\n", dev->name, pf_errmsg());
        return 77;
    }
    if (rc) {
        printf("FAIL: model_create_desc on %s: %s\n", dev->name, pf_errmsg());
        return 1;
    }
    printf("case %s on %s: B=%d D=%d\n", name, dev->name, B, d.embedding_size);
    ops_ctx *ctx = model_ctx(m);
    size_t D = (size_t)d.embedding_size, nin = (size_t)B * 3 * 112 * 112, np = model_num_params(m);
    size_t nb = model_num_buffer_floats(m);
    float *params = xmalloc(np * 4), *grads = xmalloc(np * 4), *bufs = xmalloc(nb * 4);
    float *emb = xmalloc(B * D * 4), *gin = xmalloc(nin * 4);
    float *x = NULL, *g = NULL;
    int fail = 0;
    snprintf(sub, sizeof sub, "%s/params", dir);
    for (int i = 0; i < model_num_tensors(m) && !fail; i++) {
        const model_tensor *t = model_tensor_at(m, i);
        char fn[160];
        snprintf(fn, sizeof fn, "%s.npy", t->name);
        double *v = npy_load_f64(sub, fn, t->count);
        if (!v) {
            fail = 1;
            break;
        }
        for (size_t k = 0; k < t->count; k++)
            params[t->offset + k] = (float)v[k];
        free(v);
    }
    if (!fail) {
        x = refcase_f32(dir, "input.npy", nin);
        g = refcase_f32(dir, "grad_output.npy", (size_t)B * D);
    }
    if (fail || !x || !g) {
        printf("FAIL: could not load the reference case %s\n", dir);
        fail = 1;
        goto out;
    }
    RUN(model_set_params(m, params));
    float *running0 = xmalloc(nb * 4);
    RUN(model_get_buffers(m, running0));
    float *gdev = dev_buf(dev, ctx, g, (size_t)B * D), *gindev = dev_buf(dev, ctx, NULL, nin);
    const float *embdev;
    model_zero_grad(m);
    RUN(model_forward(m, x, B, 1, &embdev));
    RUN(dev->mem_d2h(ctx, emb, embdev, (size_t)B * D * 4));
    RUN(model_backward(m, gdev, gindev));
    RUN(dev->mem_d2h(ctx, gin, gindev, nin * 4));
    RUN(model_get_grads(m, grads));
    RUN(model_get_buffers(m, bufs));
    if (tol_twin > 0) {
        /* The twin rounds the same values at the same points; it differs from the device only by
         * float64 vs fp32 arithmetic before each rounding. Where the two land on either side of a
         * rounding boundary an element differs by one ulp (<= 2u relative), and such differences
         * spread through the layers (measured: 1.4u on the tiny case, 3.2u on the small one, both
         * deterministic): the forward is held to 8u, printed per activation with
         * PFCPS_TWIN_DEBUG=1; a layout or plumbing error is O(1). The outputs
         * after the features BatchNorm1d (B = 2, 3: ill-conditioned, see below) and the gradients
         * amplify these one-ulp differences chaotically: printed for information. */
        double *e_emb = xmalloc(B * D * 8), *e_gin = xmalloc(nin * 8), *e_gr = xmalloc(np * 8);
        double *e_run = xmalloc(nb * 8), aw = 0;
        int at = -1;
        printf(" %s vs its float64 twin (same rounding points), forward bound 8u = %.2e:\n", dev->name,
               tol_twin);
        if (emu_run(m, B, x, g, params, running0, e_emb, e_gin, e_gr, e_run, &aw, &at)) {
            printf("FAIL: emulation\n");
            CHECK(0, "emulation");
            fail = 1;
        } else {
            int bad = !(aw <= tol_twin);
            printf("  %-4s %-36s worst rel %.3e (activation %d)\n", bad ? "FAIL" : "ok",
                   "every forward activation but the last", aw, at);
            CHECK(!bad, "forward activations vs twin");
            fail |= bad;
            fail |= net_check("running statistics (all)", bufs, e_run, nb, tol_twin);
            net_check("output (after BatchNorm1d)", emb, e_emb, (size_t)B * D, 0);
            net_check("grad_input", gin, e_gin, nin, 0);
            net_check("all parameter gradients (one vector)", grads, e_gr, np, 0);
        }
        free(e_emb);
        free(e_gin);
        free(e_gr);
        free(e_run);
    }
    printf(" %s vs PyTorch float64 (%s):\n", dev->name,
           tol_ref > 0 ? "bounded" : "information: the half-precision error itself, see net_tol");
    double *r = npy_load_f64(dir, "output.npy", (size_t)B * D);
    if (r)
        fail |= net_check("output", emb, r, (size_t)B * D, tol_ref);
    free(r);
    if ((r = npy_load_f64(dir, "grad_input.npy", nin)))
        fail |= net_check("grad_input", gin, r, nin, tol_ref);
    free(r);
    snprintf(sub, sizeof sub, "%s/grads", dir);
    for (int i = 0; i < model_num_tensors(m); i++) {
        const model_tensor *t = model_tensor_at(m, i);
        char fn[160], lab[128];
        snprintf(lab, sizeof lab, "grad %s", t->name);
        if (t->flags & MODEL_TENSOR_FIXED) {
            int nz = 0;
            for (size_t k = 0; k < t->count; k++)
                nz |= grads[t->offset + k] != 0.0f;
            printf("  %-4s %-36s fixed weight: gradient stays 0\n", nz ? "FAIL" : "ok", lab);
            CHECK(!nz, "%s", lab);
            fail |= nz;
            continue;
        }
        snprintf(fn, sizeof fn, "%s.npy", t->name);
        if ((r = npy_load_f64(sub, fn, t->count)))
            fail |= net_check(lab, grads + t->offset, r, t->count, tol_ref);
        else
            fail = 1;
        free(r);
    }
    snprintf(sub, sizeof sub, "%s/running", dir);
    for (int i = 0; i < model_num_buffer_tensors(m); i++) {
        const model_tensor *t = model_buffer_tensor_at(m, i);
        char fn[160];
        snprintf(fn, sizeof fn, "%s.npy", t->name);
        if ((r = npy_load_f64(sub, fn, t->count)))
            fail |= net_check(t->name, bufs + t->offset, r, t->count, tol_ref);
        else
            fail = 1;
        free(r);
    }
    RUN(model_forward(m, x, B, 0, &embdev));
    RUN(dev->mem_d2h(ctx, emb, embdev, (size_t)B * D * 4));
    if ((r = npy_load_f64(dir, "eval_output.npy", (size_t)B * D)))
        fail |= net_check("eval_output", emb, r, (size_t)B * D, tol_eval);
    else
        fail = 1;
    free(r);
    dev->mem_free(ctx, gdev);
    dev->mem_free(ctx, gindev);
    free(running0);
out:
    free(params);
    free(grads);
    free(bufs);
    free(emb);
    free(gin);
    free(x);
    free(g);
    model_free(m);
    printf("case %s on %s: %s\n", name, dev->name, fail ? "FAIL" : "ok");
    return fail;
}

/* ---- a well-conditioned batch (--batch DEVICE): the model on DEVICE vs the same model on its plain
 * fp32 device, iresnet 1111 w8 at B = 8, parameters model_init(seed), random input and grad_output.
 * With 8 samples the features BatchNorm1d is well conditioned, so the whole network's error is the
 * accumulated rounding of the body: this is where the mixed-precision plumbing of the model (every
 * rounding point, the accumulating backward) is held to a bound. */
static int batch_case(const ops_device *dev, uint64_t seed)
{
    const int B = 8;
    model_desc d;
    memset(&d, 0, sizeof d);
    d.kind = MODEL_IRESNET;
    snprintf(d.name, sizeof d.name, "tiny_1111_w8");
    int L[4] = {1, 1, 1, 1}, W[4] = {8, 16, 32, 64};
    memcpy(d.layers, L, sizeof L);
    memcpy(d.widths, W, sizeof W);
    d.embedding_size = 32;
    model *m[2];
    const ops_device *devs[2] = {dev, dev->plain};
    for (int k = 0; k < 2; k++) {
        int rc = model_create_desc(&m[k], &d, B, devs[k]);
        if (rc == -ENODEV) {
            printf("SKIP: %s: %s\n", devs[k]->name, pf_errmsg());
            return 77;
        }
        if (rc) {
            printf("FAIL: model_create_desc on %s: %s\n", devs[k]->name, pf_errmsg());
            return 1;
        }
        model_init(m[k], seed);
    }
    size_t D = 32, nin = (size_t)B * 3 * 112 * 112, np = model_num_params(m[0]),
           nb = model_num_buffer_floats(m[0]);
    float *x = frnd(nin, -1, 1), *g = frnd(B * D, -1, 1), *gs = xmalloc(B * D * 4);
    float *emb[2], *gin[2], *gr[2], *bufs[2];
    /* fp16 backward as training runs it: the embedding gradient multiplied by the loss scale of
     * torch.amp.GradScaler (worker/loss_scale.h), from its initial 2^16 halved while a gradient overflows
     * (inf / NaN), the gradients divided by it after (powers of two: exact in fp32). bf16 has fp32's range
     * and trains without it (scale 1). */
    float scale = 1;
    int fp16 = strstr(dev->name, "fp16") != NULL;
    for (int k = 0; k < 2; k++) {
        ops_ctx *ctx = model_ctx(m[k]);
        emb[k] = xmalloc(B * D * 4);
        gin[k] = xmalloc(nin * 4);
        gr[k] = xmalloc(np * 4);
        bufs[k] = xmalloc(nb * 4);
        float *run0 = xmalloc(nb * 4);
        RUN(model_get_buffers(m[k], run0));
        for (float s = k == 0 && fp16 ? 0x1.0p16f : 1;; s /= 2) {
            for (size_t i = 0; i < (size_t)B * D; i++)
                gs[i] = g[i] * s;
            float *gdev = dev_buf(devs[k], ctx, gs, B * D), *gindev = dev_buf(devs[k], ctx, NULL, nin);
            const float *e;
            model_zero_grad(m[k]);
            RUN(model_forward(m[k], x, B, 1, &e));
            RUN(devs[k]->mem_d2h(ctx, emb[k], e, B * D * 4));
            RUN(model_backward(m[k], gdev, gindev));
            RUN(devs[k]->mem_d2h(ctx, gin[k], gindev, nin * 4));
            RUN(model_get_grads(m[k], gr[k]));
            RUN(model_get_buffers(m[k], bufs[k]));
            devs[k]->mem_free(ctx, gdev);
            devs[k]->mem_free(ctx, gindev);
            int finite = 1;
            for (size_t i = 0; i < nin && finite; i++)
                finite = isfinite(gin[k][i]);
            for (size_t i = 0; i < np && finite; i++)
                finite = isfinite(gr[k][i]);
            if (finite || s <= 1) {
                for (size_t i = 0; i < nin; i++)
                    gin[k][i] /= s;
                for (size_t i = 0; i < np; i++)
                    gr[k][i] /= s;
                if (k == 0)
                    scale = s;
                break;
            }
            /* the next try's forward starts from the same running statistics */
            RUN(model_set_buffers(m[k], run0));
        }
        free(run0);
    }
    free(gs);
    /* u per rounding point; the forward has ~10 body layers between input and output, the
     * backward ~20 rounding points (and the BN backward's cancellations) between the loss and the
     * first layer: measured on cpu-bf16 ~3u for the output, ~20u for the input gradient and the
     * early layers' parameter gradients. Bounds: 8u forward (output, running statistics), 40u
     * backward (grad_input, all parameter gradients as one vector); per tensor printed. The input
     * gradient in fp16 is held to 100u: PyTorch's autocast fp16 on this network (H200, cuDNN in benchmark
     * mode, loss scaling; bench/gpu/half_error_torch.py, then with fc and the features BatchNorm1d under
     * autocast too, which arcface_torch and pfcps run in fp32) errs by 51-61u there (4 seeds) and cuda-fp16
     * by 53-66u, against ~20u for both in bf16 and on cpu-bf16 (PyTorch's autocast bf16 on the CPU: 20u). */
    double uu = strstr(dev->name, "bf16") ? 0x1.0p-8 : 0x1.0p-11;
    double gin_u = fp16 ? 100 : 40;
    printf(
        "batch B=%d on %s vs %s (fp32); u = %.3g, bounds 8u = %.2e (forward), %gu = %.2e (input gradient), "
        "40u = %.2e (parameter gradients), loss scale %g:\n",
        B, dev->name, dev->plain->name, uu, 8 * uu, gin_u, gin_u * uu, 40 * uu, scale);
    double *ref = xmalloc((nin > np ? nin : np) * 8);
    int fail = 0;
#define VS(what, a, b, n, t)                                                                                 \
    do {                                                                                                     \
        for (size_t i_ = 0; i_ < (n); i_++)                                                                  \
            ref[i_] = (b)[i_];                                                                               \
        fail |= net_check(what, a, ref, n, t);                                                               \
    } while (0)
    VS("output", emb[0], emb[1], B * D, 8 * uu);
    VS("running statistics (all)", bufs[0], bufs[1], nb, 8 * uu);
    VS("grad_input", gin[0], gin[1], nin, gin_u * uu);
    double num = 0, den = 0;
    for (int i = 0; i < model_num_tensors(m[0]); i++) {
        const model_tensor *t = model_tensor_at(m[0], i);
        char lab[128];
        snprintf(lab, sizeof lab, "grad %s", t->name);
        if (t->flags & MODEL_TENSOR_FIXED)
            continue;
        VS(lab, gr[0] + t->offset, gr[1] + t->offset, t->count, 0);
        for (size_t k = t->offset; k < t->offset + t->count; k++) {
            double e = (double)gr[0][k] - gr[1][k];
            num += e * e;
            den += (double)gr[1][k] * gr[1][k];
        }
    }
    double relg = sqrt(num / den);
    int bad = !(relg <= 40 * uu);
    printf("  %-4s %-36s rel %.3e\n", bad ? "FAIL" : "ok", "all parameter gradients (one vector)", relg);
    CHECK(!bad, "all parameter gradients");
    fail |= bad;
    if (relg > net_worst)
        net_worst = relg;
#undef VS
    for (int k = 0; k < 2; k++) {
        free(emb[k]);
        free(gin[k]);
        free(gr[k]);
        free(bufs[k]);
        model_free(m[k]);
    }
    free(x);
    free(g);
    free(ref);
    return fail;
}

/* The bound for the reference networks on a half device is 1e-2 relative (fp16); bf16 has
 * 3 fewer mantissa bits (u = 2^-8 instead of 2^-11), every rounding error is 8x larger: 8e-2.
 * Only the eval-mode output is held to it against PyTorch: in training mode the reference cases
 * (B = 2 and 3) end in a BatchNorm1d over 2-3 samples, whose output and input gradient are
 * ill-conditioned: relative perturbations of size u of the input and weights alone move the fp32
 * network's parameter gradients by 2.6e-2 / 3.3e-2 (tiny / small) at fp16's u and by 0.15 / 0.21
 * at bf16's (measured with the CPU device), so no half-precision run can meet 1e-2 there. Those
 * comparisons are printed; the training-mode plumbing is held to bounds in the --batch check
 * (B = 8, well-conditioned) and, for cpu-bf16, to its float64 twin. */
static double net_tol(const ops_device *dev)
{
    return strstr(dev->name, "bf16") ? 8e-2 : 1e-2;
}

static int reference_main(int argc, char **argv)
{
    const ops_device *dev = ops_device_by_name(argv[2]);
    if (!dev) {
        printf("FAIL: %s\n", pf_errmsg());
        return 1;
    }
    char checked[1024];
    int missing = ref_dir(checked, sizeof checked, "backbone");
    if (missing)
        return missing;
    const char *root = getenv("PFCPS_REFERENCE");
    const char *def[] = {"iresnet_tiny_1111_w8", "iresnet_small_2222_w16"};
    int n = argc > 3 ? argc - 3 : 2, skipped = 0, rc = 0;
    for (int i = 0; i < n; i++) {
        int r = net_case(dev, root, argc > 3 ? argv[3 + i] : def[i], dev == &ops_cpu_bf16 ? 8 * 0x1.0p-8 : 0,
                         0, net_tol(dev));
        if (r == 77)
            skipped++;
        else
            rc |= r;
    }
    if (skipped == n)
        return 77;
    printf("%s: worst bounded relative error %.3e: %s\n", dev->name, net_worst,
           rc || fails ? "FAIL" : "PASS");
    return rc || fails ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc > 2 && !strcmp(argv[1], "--reference"))
        return reference_main(argc, argv);
    if (argc > 2 && !strcmp(argv[1], "--batch")) {
        const ops_device *dev = ops_device_by_name(argv[2]);
        if (!dev || !dev->plain) {
            printf("FAIL: %s\n", dev ? "not a mixed-precision device" : pf_errmsg());
            return 1;
        }
        uint64_t seed = test_seed_mixed();
        int r = batch_case(dev, seed);
        if (r == 77)
            return 77;
        printf("%s: worst bounded relative error %.3e: %s\n", dev->name, net_worst,
               r || fails ? "FAIL" : "PASS");
        return r || fails ? 1 : 0;
    }
    test_seed_mixed();
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
