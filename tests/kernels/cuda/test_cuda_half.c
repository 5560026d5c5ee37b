/* The mixed-precision CUDA devices cuda-fp16 and cuda-bf16 (kernels/cuda/ops_cuda_half.cu) against
 * the fp32 CPU device, every body layer: convolution forward / backward (dinp +=, dweight +=;
 * stem, depthwise, strided), batch norm train / eval forward and backward (cuDNN and own kernels
 * for fp16, own kernels for bf16), PReLU, add, acc, to_plain, from_plain; linear and dropout refused.
 * Fresh random shapes and inputs each run (seed printed; PFCPS_TEST_SEED replays). Every output is
 * poisoned with NaN before the call and every element checked written.
 *
 * The test encodes and decodes fp16 / bf16 on the host itself (frexp / nearbyint rounding, not the
 * device's conversions). Two comparisons per output, relative L2 error:
 *  (a) against ops_cpu run on the same half-rounded inputs (and half-rounded conv weights): the
 *      device may differ by its one output rounding (u) plus accumulation order and the extra
 *      half-precision roundings some cuDNN algorithms make inside (Winograd / FFT tiles): <= 4u
 *      (u = 2^-11 fp16, 2^-8 bf16); fp32 side outputs (BN statistics, parameter gradients) <= 1e-4;
 *  (b) against ops_cpu in fp32 on the unrounded inputs: fp16 <= 1e-2; bf16, with 3 fewer mantissa bits
 *      (u 8x larger), <= 8e-2.
 * Without a GPU: prints why and exits 77 (SKIP). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"
#include "tests/kernels/cuda/cuda_testutil.h"

/* ---- the half format under test (host side, the test's own code) ---- */

static int is_bf16;  /* 0: IEEE binary16, 1: bfloat16 */
static double U;     /* unit roundoff: 2^-11 / 2^-8 */
static double TOL_B; /* bound (b) */

/* Round to the half format, nearest even (nearbyint in the default mode). fp16: 11 significant
 * bits, subnormal below 2^-14 (quantum 2^-24), overflow to inf above 65504 + half a quantum;
 * bf16: 8 significant bits, float32's exponent range (test values stay normal). */
static float hround(float x)
{
    if (x == 0.0f || !isfinite(x))
        return x;
    int e;
    frexp((double)x, &e); /* |x| = m 2^e, m in [0.5, 1) */
    double q = is_bf16 ? ldexp(1.0, (e < -125 ? -125 : e) - 8) : ldexp(1.0, (e < -13 ? -13 : e) - 11);
    double r = nearbyint((double)x / q) * q;
    if (!is_bf16 && fabs(r) > 65504.0)
        return x > 0 ? INFINITY : -INFINITY;
    return (float)r;
}

/* Bits of a value already in the format. */
static uint16_t henc(float r)
{
    uint32_t u;
    memcpy(&u, &r, sizeof u);
    if (is_bf16)
        return (uint16_t)(u >> 16);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    double a = fabs((double)r);
    if (a == 0.0)
        return sign;
    if (isinf(r))
        return (uint16_t)(sign | 0x7c00u);
    if (isnan(r))
        return 0x7e00u;
    int e;
    double m = frexp(a, &e); /* a = (2m) 2^(e-1), 2m in [1, 2) */
    int E = e - 1 + 15;
    if (E >= 1)
        return (uint16_t)(sign | (E << 10) | (int)((2 * m - 1) * 1024));
    return (uint16_t)(sign | (int)(a * 16777216.0)); /* subnormal: a / 2^-24 */
}

static float hdec(uint16_t h)
{
    if (is_bf16) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    int E = (h >> 10) & 31, mant = h & 1023;
    double v = E == 0    ? mant * 0x1.0p-24
               : E == 31 ? (mant ? NAN : INFINITY)
                         : ldexp(1.0 + mant / 1024.0, E - 15);
    return (float)((h & 0x8000u) ? -v : v);
}

static float *hround_of(const float *x, size_t n)
{
    float *p = xmalloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = hround(x[i]);
    return p;
}

/* Device half buffer holding the rounded values r (n). */
static float *hup(const float *r, size_t n)
{
    uint16_t *h = xmalloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++)
        h[i] = henc(r[i]);
    void *d;
    if (cuda_malloc(&d, n * 2) || cuda_h2d(d, h, n * 2))
        DIE("device upload of %zu halves", n);
    free(h);
    return d;
}

/* Device half buffer of NaNs. */
static float *hnan(size_t n)
{
    uint16_t *h = xmalloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++)
        h[i] = is_bf16 ? 0x7fc0u : 0x7e00u;
    void *d;
    if (cuda_malloc(&d, n * 2) || cuda_h2d(d, h, n * 2))
        DIE("device alloc of %zu halves", n);
    free(h);
    return d;
}

static float *hdl(const float *d, size_t n)
{
    uint16_t *h = xmalloc(n * sizeof *h);
    if (cuda_sync() || cuda_d2h(h, d, n * 2))
        DIE("device download of %zu halves", n);
    float *f = xmalloc(n * sizeof *f);
    for (size_t i = 0; i < n; i++)
        f[i] = hdec(h[i]);
    free(h);
    return f;
}

static void cmp(const char *what, const float *got, const float *ref, size_t n, double tol)
{
    double num = 0, den = 0, maxabs = 0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) {
            bad++;
            continue;
        }
        double e = (double)got[i] - ref[i];
        num += e * e;
        den += (double)ref[i] * ref[i];
        if (fabs(e) > maxabs)
            maxabs = fabs(e);
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    int ok = bad == 0 && rel <= tol;
    checks++;
    if (!ok)
        failures++;
    printf("%-4s %-52s n %-7zu rel %.3e (bound %.1e) max abs %.3e%s\n", ok ? "ok" : "FAIL", what, n, rel, tol,
           maxabs, bad ? " (NaN/inf left: element not written)" : "");
}

static void cmp_d(const char *what, const double *got, const double *ref, size_t n, double tol)
{
    float *a = xmalloc(n * 4), *b = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        a[i] = (float)got[i];
        b[i] = (float)ref[i];
    }
    cmp(what, a, b, n, tol);
    free(a);
    free(b);
}

static void exact(const char *what, const float *got, const float *want, size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += memcmp(&got[i], &want[i], sizeof(float)) != 0;
    checks++;
    if (bad)
        failures++;
    printf("%-4s %-52s n %-7zu %zu element(s) differ from the test's own rounding\n", bad ? "FAIL" : "ok",
           what, n, bad);
}

static ops_ctx *cpu, *gpu;
static const ops_device *dev;

static float *cpu_in(const float *plain, int B, int C, int HW)
{
    float *p = xmalloc((size_t)B * C * HW * sizeof *p);
    if (ops_cpu.from_plain(cpu, p, 0, plain, B, C, HW))
        DIE("cpu from_plain");
    return p;
}

static float *cpu_out(float *lay, int B, int C, int HW)
{
    float *p = xmalloc((size_t)B * C * HW * sizeof *p);
    if (ops_cpu.to_plain(cpu, p, lay, B, C, HW))
        DIE("cpu to_plain");
    free(lay);
    return p;
}

/* CPU conv forward + backward (dinp += d0, dweight += dw0) on plain host arrays. */
static void cpu_conv(const ops_conv_shape *s, const float *x, const float *w, const float *dy,
                     const float *d0, const float *dw0, float **y, float **dx, float **dw)
{
    int HWi = s->H * s->W, HWo = s->OH * s->OW;
    size_t nw = (size_t)s->OC * (s->C / s->groups) * s->K * s->K;
    float *cx = cpu_in(x, s->B, s->C, HWi), *cy = xmalloc((size_t)s->B * s->OC * HWo * 4);
    float *cdy = cpu_in(dy, s->B, s->OC, HWo), *cdx = cpu_in(d0, s->B, s->C, HWi);
    *dw = fcopy(dw0, nw);
    if (ops_cpu.conv_forward(cpu, cy, cx, w, s) || ops_cpu.conv_backward(cpu, cdx, 1, *dw, cdy, cx, w, s))
        DIE("cpu conv");
    *y = cpu_out(cy, s->B, s->OC, HWo);
    *dx = cpu_out(cdx, s->B, s->C, HWi);
    free(cx);
    free(cdy);
}

static void test_conv(int round)
{
    ops_conv_shape s;
    int B = irand(1, 4), C = 8 * irand(1, 3), H = irand(5, 17), W = irand(5, 17);
    int K = irand(0, 1) ? 3 : 1, stride = irand(1, 2), pad = K == 3 ? irand(0, 1) : 0;
    int OC = 8 * irand(1, 3), groups = 1;
    if (round == 1) { /* depthwise (mobilefacenet) */
        OC = C;
        groups = C;
    } else if (round == 0) { /* stem: 3 input channels */
        C = 3;
    }
    if (ops_conv_shape_init(&s, B, C, H, W, OC, K, stride, pad, groups))
        DIE("conv shape");
    char tag[96], what[200];
    snprintf(tag, sizeof tag, "B%d C%d %dx%d OC%d K%d s%d p%d g%d", B, C, H, W, OC, K, stride, pad, groups);
    size_t ni = (size_t)B * C * H * W, no = (size_t)B * OC * s.OH * s.OW,
           nw = (size_t)OC * (C / groups) * K * K;
    float *x = frnd(ni, -1, 1), *w = frnd(nw, -0.5f, 0.5f), *dy = frnd(no, -1, 1);
    float *d0 = frnd(ni, -1, 1), *dw0 = frnd(nw, -1, 1);
    float *xr = hround_of(x, ni), *wr = hround_of(w, nw), *dyr = hround_of(dy, no), *d0r = hround_of(d0, ni);
    float *ya, *dxa, *dwa, *yb, *dxb, *dwb;
    cpu_conv(&s, xr, wr, dyr, d0r, dw0, &ya, &dxa, &dwa);
    cpu_conv(&s, x, w, dy, d0r, dw0, &yb, &dxb, &dwb);
    float *gx = hup(xr, ni), *gdy = hup(dyr, no), *gdx = hup(d0r, ni), *gy = hnan(no);
    float *gw = dup_dev(w, nw), *gdw = dup_dev(dw0, nw), *gdx2 = hnan(ni);
    if (dev->conv_forward(gpu, gy, gx, gw, &s) || dev->conv_backward(gpu, gdx, 1, gdw, gdy, gx, gw, &s))
        DIE("%s conv %s", dev->name, tag);
    float *h;
    snprintf(what, sizeof what, "conv fwd (a) %s", tag);
    cmp(what, h = hdl(gy, no), ya, no, 4 * U);
    snprintf(what, sizeof what, "conv fwd (b) %s", tag);
    cmp(what, h, yb, no, TOL_B);
    free(h);
    snprintf(what, sizeof what, "conv dinp += (a) %s", tag);
    cmp(what, h = hdl(gdx, ni), dxa, ni, 4 * U);
    snprintf(what, sizeof what, "conv dinp += (b) %s", tag);
    cmp(what, h, dxb, ni, TOL_B);
    free(h);
    /* dweight: the device's half weight gradient added into dw0 */
    float *gotw = dl(gdw, nw);
    for (size_t i = 0; i < nw; i++) {
        gotw[i] -= dw0[i];
        dwa[i] -= dw0[i];
        dwb[i] -= dw0[i];
    }
    snprintf(what, sizeof what, "conv dweight += (a) %s", tag);
    cmp(what, gotw, dwa, nw, 4 * U);
    snprintf(what, sizeof what, "conv dweight += (b) %s", tag);
    cmp(what, gotw, dwb, nw, TOL_B);
    /* dinp overwritten, no weight gradient */
    if (dev->conv_backward(gpu, gdx2, 0, NULL, gdy, gx, gw, &s))
        DIE("%s conv bwd %s", dev->name, tag);
    for (size_t i = 0; i < ni; i++)
        dxa[i] -= d0r[i];
    snprintf(what, sizeof what, "conv dinp = (a) %s", tag);
    cmp(what, h = hdl(gdx2, ni), dxa, ni, 4 * U);
    free(h);
    free(x);
    free(w);
    free(dy);
    free(d0);
    free(dw0);
    free(xr);
    free(wr);
    free(dyr);
    free(d0r);
    free(ya);
    free(dxa);
    free(dwa);
    free(yb);
    free(dxb);
    free(dwb);
    free(gotw);
    cuda_free(gx);
    cuda_free(gdy);
    cuda_free(gdx);
    cuda_free(gy);
    cuda_free(gw);
    cuda_free(gdw);
    cuda_free(gdx2);
}

/* CPU batch norm train fwd, bwd (dinp += d0, dweight += , dbias +=), eval fwd, on plain arrays. */
typedef struct bn_out {
    float *y, *ye, *dx, *dw, *db, *rm, *rv;
    double *sm, *sv;
} bn_out;

static void cpu_bn(int B, int C, int HW, const float *x, const float *wt, const float *bi, float *rm,
                   float *rv, const float *dy, const float *d0, const float *dw0, const float *db0, bn_out *o)
{
    size_t n = (size_t)B * C * HW;
    float *cx = cpu_in(x, B, C, HW), *cy = xmalloc(n * 4), *cye = xmalloc(n * 4);
    float *cdy = cpu_in(dy, B, C, HW), *cdx = cpu_in(d0, B, C, HW);
    o->rm = fcopy(rm, C);
    o->rv = fcopy(rv, C);
    o->dw = fcopy(dw0, C);
    o->db = fcopy(db0, C);
    o->sm = xmalloc(C * sizeof(double));
    o->sv = xmalloc(C * sizeof(double));
    if (ops_cpu.bn_forward(cpu, cy, o->sm, o->sv, cx, wt, bi, o->rm, o->rv, B, C, HW, 1e-5f, 0.1f, 1) ||
        ops_cpu.bn_backward(cpu, cdx, 1, o->dw, o->db, cdy, cx, wt, o->sm, o->sv, B, C, HW, 1e-5f) ||
        ops_cpu.bn_forward(cpu, cye, NULL, NULL, cx, wt, bi, rm, rv, B, C, HW, 1e-5f, 0.1f, 0))
        DIE("cpu bn");
    o->y = cpu_out(cy, B, C, HW);
    o->ye = cpu_out(cye, B, C, HW);
    o->dx = cpu_out(cdx, B, C, HW);
    free(cx);
    free(cdy);
}

static void bn_free(bn_out *o)
{
    free(o->y);
    free(o->ye);
    free(o->dx);
    free(o->dw);
    free(o->db);
    free(o->rm);
    free(o->rv);
    free(o->sm);
    free(o->sv);
}

static void test_bn(const char *mode)
{
    int B = irand(2, 6), C = 8 * irand(1, 4), HW = irand(3, 12) * irand(3, 12);
    size_t n = (size_t)B * C * HW;
    char tag[96], what[200];
    snprintf(tag, sizeof tag, "%s B%d C%d HW%d", mode, B, C, HW);
    float *x = frnd(n, -2, 3), *wt = frnd(C, 0.5f, 1.5f), *bi = frnd(C, -0.5f, 0.5f);
    float *rm = frnd(C, -0.1f, 0.1f), *rv = frnd(C, 0.5f, 1.5f), *dy = frnd(n, -1, 1), *d0 = frnd(n, -1, 1);
    float *dw0 = frnd(C, -1, 1), *db0 = frnd(C, -1, 1);
    float *xr = hround_of(x, n), *dyr = hround_of(dy, n), *d0r = hround_of(d0, n);
    bn_out a, b;
    cpu_bn(B, C, HW, xr, wt, bi, rm, rv, dyr, d0r, dw0, db0, &a);
    cpu_bn(B, C, HW, x, wt, bi, rm, rv, dy, d0r, dw0, db0, &b);
    float *gx = hup(xr, n), *gdy = hup(dyr, n), *gdx = hup(d0r, n), *gy = hnan(n), *gye = hnan(n);
    float *gw = dup_dev(wt, C), *gb = dup_dev(bi, C), *grm = dup_dev(rm, C), *grv = dup_dev(rv, C);
    float *grm0 = dup_dev(rm, C), *grv0 = dup_dev(rv, C), *gdw = dup_dev(dw0, C), *gdb = dup_dev(db0, C);
    double *gsm, *gsv;
    if (cuda_malloc((void **)&gsm, C * sizeof(double)) || cuda_malloc((void **)&gsv, C * sizeof(double)))
        DIE("alloc");
    if (dev->bn_forward(gpu, gy, gsm, gsv, gx, gw, gb, grm, grv, B, C, HW, 1e-5f, 0.1f, 1) ||
        dev->bn_backward(gpu, gdx, 1, gdw, gdb, gdy, gx, gw, gsm, gsv, B, C, HW, 1e-5f) ||
        dev->bn_forward(gpu, gye, NULL, NULL, gx, gw, gb, grm0, grv0, B, C, HW, 1e-5f, 0.1f, 0))
        DIE("%s bn %s", dev->name, tag);
    double *hm = xmalloc(C * 8), *hv = xmalloc(C * 8);
    if (cuda_sync() || cuda_d2h(hm, gsm, C * 8) || cuda_d2h(hv, gsv, C * 8))
        DIE("download");
    float *h;
    snprintf(what, sizeof what, "bn train fwd (a) %s", tag);
    cmp(what, h = hdl(gy, n), a.y, n, 4 * U);
    snprintf(what, sizeof what, "bn train fwd (b) %s", tag);
    cmp(what, h, b.y, n, TOL_B);
    free(h);
    snprintf(what, sizeof what, "bn save_mean (a) %s", tag);
    cmp_d(what, hm, a.sm, C, 1e-4);
    snprintf(what, sizeof what, "bn save_var (a) %s", tag);
    cmp_d(what, hv, a.sv, C, 1e-4);
    snprintf(what, sizeof what, "bn running_mean (a) %s", tag);
    cmp(what, h = dl(grm, C), a.rm, C, 1e-4);
    free(h);
    snprintf(what, sizeof what, "bn running_var (a) %s", tag);
    cmp(what, h = dl(grv, C), a.rv, C, 1e-4);
    free(h);
    snprintf(what, sizeof what, "bn dinp += (a) %s", tag);
    cmp(what, h = hdl(gdx, n), a.dx, n, 4 * U);
    snprintf(what, sizeof what, "bn dinp += (b) %s", tag);
    cmp(what, h, b.dx, n, TOL_B);
    free(h);
    snprintf(what, sizeof what, "bn dweight += (a) %s", tag);
    cmp(what, h = dl(gdw, C), a.dw, C, 1e-4);
    snprintf(what, sizeof what, "bn dweight += (b) %s", tag);
    cmp(what, h, b.dw, C, TOL_B);
    free(h);
    snprintf(what, sizeof what, "bn dbias += (a) %s", tag);
    cmp(what, h = dl(gdb, C), a.db, C, 1e-4);
    free(h);
    snprintf(what, sizeof what, "bn eval fwd (a) %s", tag);
    cmp(what, h = hdl(gye, n), a.ye, n, 4 * U);
    snprintf(what, sizeof what, "bn eval fwd (b) %s", tag);
    cmp(what, h, b.ye, n, TOL_B);
    free(h);
    /* dinp NULL with the parameter gradients only, and dweight NULL with dinp overwritten */
    float *gdw2 = dup_dev(dw0, C), *gdx3 = hnan(n), *gdb3 = dup_dev(db0, C);
    if (dev->bn_backward(gpu, NULL, 0, gdw2, NULL, gdy, gx, gw, gsm, gsv, B, C, HW, 1e-5f) ||
        dev->bn_backward(gpu, gdx3, 0, NULL, gdb3, gdy, gx, gw, gsm, gsv, B, C, HW, 1e-5f))
        DIE("%s bn bwd %s", dev->name, tag);
    snprintf(what, sizeof what, "bn dweight += (dinp NULL) (a) %s", tag);
    cmp(what, h = dl(gdw2, C), a.dw, C, 1e-4);
    free(h);
    snprintf(what, sizeof what, "bn dbias += (dweight NULL) (a) %s", tag);
    cmp(what, h = dl(gdb3, C), a.db, C, 1e-4);
    free(h);
    for (size_t i = 0; i < n; i++)
        a.dx[i] -= d0r[i];
    snprintf(what, sizeof what, "bn dinp = (a) %s", tag);
    cmp(what, h = hdl(gdx3, n), a.dx, n, 4 * U);
    free(h);
    bn_free(&a);
    bn_free(&b);
    free(x);
    free(wt);
    free(bi);
    free(rm);
    free(rv);
    free(dy);
    free(d0);
    free(dw0);
    free(db0);
    free(xr);
    free(dyr);
    free(d0r);
    free(hm);
    free(hv);
    cuda_free(gx);
    cuda_free(gdy);
    cuda_free(gdx);
    cuda_free(gy);
    cuda_free(gye);
    cuda_free(gw);
    cuda_free(gb);
    cuda_free(grm);
    cuda_free(grv);
    cuda_free(grm0);
    cuda_free(grv0);
    cuda_free(gdw);
    cuda_free(gdb);
    cuda_free(gsm);
    cuda_free(gsv);
    cuda_free(gdw2);
    cuda_free(gdx3);
    cuda_free(gdb3);
}

static void test_prelu(void)
{
    int B = irand(1, 5), C = 8 * irand(1, 4), HW = irand(1, 200);
    size_t n = (size_t)B * C * HW;
    char tag[64], what[160];
    snprintf(tag, sizeof tag, "B%d C%d HW%d", B, C, HW);
    float *x = frnd(n, -1, 1), *al = frnd(C, 0.1f, 0.4f), *dy = frnd(n, -1, 1), *d0 = frnd(n, -1, 1);
    float *da0 = frnd(C, -1, 1), *xr = hround_of(x, n), *dyr = hround_of(dy, n), *d0r = hround_of(d0, n);
    float *res[2][3]; /* (a), (b): y, dx, dalpha */
    for (int k = 0; k < 2; k++) {
        float *cx = cpu_in(k ? x : xr, B, C, HW), *cy = xmalloc(n * 4), *cdy = cpu_in(k ? dy : dyr, B, C, HW);
        float *cdx = cpu_in(d0r, B, C, HW);
        res[k][2] = fcopy(da0, C);
        if (ops_cpu.prelu_forward(cpu, cy, cx, al, B, C, HW) ||
            ops_cpu.prelu_backward(cpu, cdx, 1, res[k][2], cdy, cx, al, B, C, HW))
            DIE("cpu prelu");
        res[k][0] = cpu_out(cy, B, C, HW);
        res[k][1] = cpu_out(cdx, B, C, HW);
        free(cx);
        free(cdy);
    }
    float *gx = hup(xr, n), *gdy = hup(dyr, n), *gdx = hup(d0r, n), *gy = hnan(n), *ga = dup_dev(al, C);
    float *gda = dup_dev(da0, C);
    if (dev->prelu_forward(gpu, gy, gx, ga, B, C, HW) ||
        dev->prelu_backward(gpu, gdx, 1, gda, gdy, gx, ga, B, C, HW))
        DIE("%s prelu %s", dev->name, tag);
    float *h;
    snprintf(what, sizeof what, "prelu fwd (a) %s", tag);
    cmp(what, h = hdl(gy, n), res[0][0], n, 4 * U);
    snprintf(what, sizeof what, "prelu fwd (b) %s", tag);
    cmp(what, h, res[1][0], n, TOL_B);
    free(h);
    snprintf(what, sizeof what, "prelu dinp += (a) %s", tag);
    cmp(what, h = hdl(gdx, n), res[0][1], n, 4 * U);
    snprintf(what, sizeof what, "prelu dinp += (b) %s", tag);
    cmp(what, h, res[1][1], n, TOL_B);
    free(h);
    snprintf(what, sizeof what, "prelu dalpha += (a) %s", tag);
    cmp(what, h = dl(gda, C), res[0][2], C, 1e-4);
    free(h);
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 3; j++)
            free(res[k][j]);
    free(x);
    free(al);
    free(dy);
    free(d0);
    free(da0);
    free(xr);
    free(dyr);
    free(d0r);
    cuda_free(gx);
    cuda_free(gdy);
    cuda_free(gdx);
    cuda_free(gy);
    cuda_free(ga);
    cuda_free(gda);
}

/* add, acc, to_plain, from_plain: exactly the test's own rounding of the fp32 result. */
static void test_elementwise(void)
{
    int B = irand(1, 4), C = irand(1, 40), HW = irand(1, 300);
    size_t n = (size_t)B * C * HW;
    char tag[64], what[160];
    snprintf(tag, sizeof tag, "B%d C%d HW%d", B, C, HW);
    float *a0 = frnd(n, -3, 3), *b0 = frnd(n, -3, 3), *s = frnd(n, -3, 3);
    float *a = hround_of(a0, n), *b = hround_of(b0, n), *want = xmalloc(n * 4);
    float *ga = hup(a, n), *gb = hup(b, n), *go = hnan(n), *h;
    for (size_t i = 0; i < n; i++)
        want[i] = hround(a[i] + b[i]);
    if (dev->add_forward(gpu, go, ga, gb, n))
        DIE("%s add", dev->name);
    snprintf(what, sizeof what, "add %s", tag);
    exact(what, h = hdl(go, n), want, n);
    free(h);
    if (dev->add_forward(gpu, ga, ga, gb, n)) /* in place on a */
        DIE("%s add in place", dev->name);
    snprintf(what, sizeof what, "add in place %s", tag);
    exact(what, h = hdl(ga, n), want, n);
    free(h);
    float *gc = hup(a, n), *gd = hnan(n);
    if (dev->acc(gpu, gc, 1, gb, n) || dev->acc(gpu, gd, 0, gb, n))
        DIE("%s acc", dev->name);
    snprintf(what, sizeof what, "acc += %s", tag);
    exact(what, h = hdl(gc, n), want, n);
    free(h);
    snprintf(what, sizeof what, "acc = %s", tag);
    exact(what, h = hdl(gd, n), b, n);
    free(h);
    float *gp = nan_dev(n), *gs = dup_dev(s, n), *gf = hnan(n), *gg = hup(b, n);
    if (dev->to_plain(gpu, gp, gb, B, C, HW) || dev->from_plain(gpu, gf, 0, gs, B, C, HW) ||
        dev->from_plain(gpu, gg, 1, gs, B, C, HW))
        DIE("%s to_plain / from_plain", dev->name);
    snprintf(what, sizeof what, "to_plain (exact) %s", tag);
    exact(what, h = dl(gp, n), b, n);
    free(h);
    for (size_t i = 0; i < n; i++)
        want[i] = hround(s[i]);
    snprintf(what, sizeof what, "from_plain = %s", tag);
    exact(what, h = hdl(gf, n), want, n);
    free(h);
    for (size_t i = 0; i < n; i++)
        want[i] = hround(b[i] + s[i]);
    snprintf(what, sizeof what, "from_plain += %s", tag);
    exact(what, h = hdl(gg, n), want, n);
    free(h);
    free(a0);
    free(b0);
    free(s);
    free(a);
    free(b);
    free(want);
    cuda_free(ga);
    cuda_free(gb);
    cuda_free(go);
    cuda_free(gc);
    cuda_free(gd);
    cuda_free(gp);
    cuda_free(gs);
    cuda_free(gf);
    cuda_free(gg);
}

/* The host encoder / rounding on hand-computed patterns, so that the comparisons above rest on it. */
static void test_host_format(void)
{
    /* ties to even at 1 (spacing 2^-10), the largest finite, the first overflow (a tie), the
     * smallest subnormal */
    const float in[] = {1.0f, 1.0f + 0x1.0p-11f, 1.0f + 3 * 0x1.0p-11f, 65504.0f, 65520.0f, 0x1.0p-24f,
                        -2.0f};
    const uint16_t f16[] = {0x3c00, 0x3c00, 0x3c02, 0x7bff, 0x7c00, 0x0001, 0xc000};
    const float inb[] = {1.0f, 1.0f + 0x1.0p-8f, 1.0f + 3 * 0x1.0p-8f, 65504.0f, -2.0f};
    const uint16_t bf[] = {0x3f80, 0x3f80, 0x3f82, 0x4780, 0xc000};
    int save = is_bf16, bad = 0;
    is_bf16 = 0;
    for (int i = 0; i < 7; i++) {
        uint16_t h = henc(hround(in[i]));
        bad += h != f16[i] || hdec(h) != hround(in[i]);
    }
    is_bf16 = 1;
    for (int i = 0; i < 5; i++) {
        uint16_t h = henc(hround(inb[i]));
        bad += h != bf[i] || hdec(h) != hround(inb[i]);
    }
    is_bf16 = save;
    checks++;
    if (bad)
        failures++;
    printf("%-4s host fp16 / bf16 rounding and encoding on hand-computed bit patterns\n",
           bad ? "FAIL" : "ok");
}

static void test_refusals(void)
{
    float *buf = nan_dev(64), *mask = nan_dev(64);
    int rc = dev->linear_forward(gpu, buf, buf, buf, NULL, 1, 4, 4);
    printf("     linear on %s: %d (%s)\n", dev->name, rc, pf_errmsg());
    int ok = rc == -EINVAL;
    rc = dev->dropout_forward(gpu, buf, mask, buf, 8, 0.1f, 1);
    printf("     dropout on %s: %d (%s)\n", dev->name, rc, pf_errmsg());
    ok &= rc == -EINVAL;
    ok &= dev->linear_backward(gpu, buf, 0, buf, NULL, buf, buf, buf, 1, 4, 4) == -EINVAL;
    ok &= dev->dropout_backward(gpu, buf, 0, buf, mask, 8) == -EINVAL;
    rc = dev->prelu_forward(gpu, buf, buf, buf, 0, 8, 4);
    printf("     prelu B=0: %d (%s)\n", rc, pf_errmsg());
    ok &= rc == -EINVAL;
    ops_conv_shape s;
    if (ops_conv_shape_init(&s, 1, 8, 4, 4, 8, 3, 1, 1, 1))
        DIE("shape");
    s.OH = 9;
    rc = dev->conv_forward(gpu, buf, buf, buf, &s);
    printf("     conv with underived OH: %d (%s)\n", rc, pf_errmsg());
    ok &= rc == -EINVAL;
    /* a context of the other half device */
    const ops_device *other = dev == &ops_cuda_fp16 ? &ops_cuda_bf16 : &ops_cuda_fp16;
    rc = other->prelu_forward(gpu, buf, buf, buf, 1, 8, 4);
    printf("     %s call with a %s context: %d (%s)\n", other->name, dev->name, rc, pf_errmsg());
    ok &= rc == -EINVAL;
    ok &= dev->act_bytes == 2 && dev->plain == &ops_cuda && dev->act_block(64) == 1;
    checks++;
    if (!ok)
        failures++;
    printf("%-4s refusals (linear, dropout, bad shapes, foreign context); act_bytes 2, plain = ops_cuda\n",
           ok ? "ok" : "FAIL");
    cuda_free(buf);
    cuda_free(mask);
}

static void run_device(const ops_device *d, int bn_exact)
{
    dev = d;
    is_bf16 = d == &ops_cuda_bf16;
    U = is_bf16 ? 0x1.0p-8 : 0x1.0p-11;
    TOL_B = is_bf16 ? 8e-2 : 1e-2;
    if (bn_exact)
        setenv("PFCPS_CUDA_BN", "exact", 1);
    else
        unsetenv("PFCPS_CUDA_BN");
    if (d->ctx_create(&gpu))
        DIE("%s ctx_create", d->name);
    printf("== %s (u = %.3g, bound (a) %.2g, (b) %.0e)%s\n", d->name, U, 4 * U, TOL_B,
           bn_exact ? ", PFCPS_CUDA_BN=exact" : "");
    if (!bn_exact) {
        for (int r = 0; r < 4; r++)
            test_conv(r);
        for (int r = 0; r < 2; r++) {
            test_prelu();
            test_elementwise();
        }
        test_refusals();
    }
    for (int r = 0; r < 2; r++)
        test_bn(is_bf16 || bn_exact ? "own kernels" : "cuDNN");
    if (cuda_sync())
        DIE("%s: pending device error", d->name);
    d->ctx_destroy(gpu);
    gpu = NULL;
}

/* Runs without a GPU: both tables complete (every entry set), act_bytes 2, plain = ops_cuda, names,
 * and without a GPU a clean -ENODEV from ctx_create. */
static void test_tables(void)
{
    const ops_device *ds[2] = {&ops_cuda_fp16, &ops_cuda_bf16};
    const char *names[2] = {"cuda-fp16", "cuda-bf16"};
    for (int k = 0; k < 2; k++) {
        const ops_device *d = ds[k];
        int missing = !d->ctx_create + !d->ctx_destroy + !d->conv_forward + !d->conv_backward +
                      !d->bn_forward + !d->bn_backward + !d->prelu_forward + !d->prelu_backward +
                      !d->linear_forward + !d->linear_backward + !d->add_forward + !d->acc + !d->act_block +
                      !d->to_plain + !d->from_plain + !d->dropout_forward + !d->dropout_backward +
                      !d->mem_alloc + !d->mem_free + !d->mem_h2d + !d->mem_d2h + !d->mem_d2d + !d->mem_zero +
                      !d->sync + !d->sgd_step + !d->adamw_step + !d->scale + !d->sumsq;
        int ok = missing == 0 && d->name && !strcmp(d->name, names[k]) && d->act_bytes == 2 &&
                 d->plain == &ops_cuda && d->act_block(64) == 1 && ops_device_by_name(names[k]) == d;
        if (cuda_device_count() == 0) {
            ops_ctx *c = NULL;
            int rc = d->ctx_create(&c);
            printf("     %s ctx_create without a GPU: %d (%s)\n", names[k], rc, pf_errmsg());
            ok &= rc == -ENODEV && c == NULL;
        }
        checks++;
        if (!ok)
            failures++;
        printf("%-4s %s table: %d entries missing, act_bytes %d, plain %s, by name %s\n", ok ? "ok" : "FAIL",
               names[k], missing, d->act_bytes, d->plain ? d->plain->name : "NULL",
               ops_device_by_name(names[k]) == d ? "yes" : "no");
    }
}

int main(void)
{
    test_host_format();
    test_tables();
    if (failures) {
        printf("FAIL: %d of %d checks that need no GPU\n", failures, checks);
        return 1;
    }
    if (cuda_device_count() == 0) {
        printf("SKIP: no CUDA device (cudaGetDeviceCount is 0): cuda-fp16 / cuda-bf16 compiled and linked, "
               "not run against the CPU device\n");
        return 77;
    }
    test_seed_mixed();
    if (ops_cpu.ctx_create(&cpu))
        DIE("cpu ctx");
    run_device(&ops_cuda_fp16, 0);
    run_device(&ops_cuda_fp16, 1);
    run_device(&ops_cuda_bf16, 0);
    ops_cpu.ctx_destroy(cpu);
    printf("%d checks, %d failure(s): %s\n", checks, failures, failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}
