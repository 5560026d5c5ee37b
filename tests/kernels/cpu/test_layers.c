/* CPU device layers (kernels/ops.h) against float64 plain C (tests/worker/model/ref64.h) and float64
 * central finite differences: conv (3x3 s1/s2, 1x1 s2, grouped, depthwise, 7x7 GDC), batch norm
 * in training mode (2d, 1d, fixed weight), eval mode and the running-statistic update, PReLU,
 * Linear, residual add, dropout. Also the += contract of the backward functions.
 *
 * Each case: random float32 inputs; forward vs the float64 forward (rel <= 1e-5); backward with a
 * random upstream gradient g vs (a) d/dtheta sum(g * f) by central differences of the float64
 * forward (h = 1e-4, on up to 24 sampled elements per tensor, rel <= 1e-4) and (b) the full
 * float64 analytic backward (rel <= 1e-5). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/ops.h"
#include "tests/check.h"
#include "tests/worker/model/ref64.h"

static uint64_t rng = 88172645463325252ull;

static double urand(void) /* [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * 0x1.0p-52 - 1.0;
}

static float *randf(size_t n, double scale)
{
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(urand() * scale);
    return p;
}

static double *to64(const float *f, size_t n)
{
    double *d = malloc(n * sizeof *d);
    for (size_t i = 0; i < n; i++)
        d[i] = f[i];
    return d;
}

static void expect_rel(const char *what, double r, double tol)
{
    check(r <= tol, "%-44s rel %.2e (tol %.0e)", what, r, tol);
}

/* Activations go to the device in its layout (ops.h act_block) and come back as NCHW. */
static ops_ctx *g_ctx;
static float *dev_in(const float *plain, int B, int C, int HW)
{
    size_t n = (size_t)B * C * HW;
    float *d = malloc(n * sizeof *d);
    ops_cpu.from_plain(g_ctx, d, 0, plain, B, C, HW);
    return d;
}
static void dev_out(float *plain, const float *dev, int B, int C, int HW)
{
    ops_cpu.to_plain(g_ctx, plain, dev, B, C, HW);
}

/* ---- finite differences over a float64 forward ---- */

typedef struct fcase {
    int kind; /* 1 conv, 2 bn, 3 prelu, 4 linear */
    int B, C, H, W, OC, K, stride, pad, groups, IN, OUT;
    double *x, *w, *b, *g; /* input, weight, bias, upstream gradient (float64 copies) */
    size_t ny;
} fcase;

static double loss64(const fcase *f)
{
    double *y = malloc(f->ny * sizeof *y), s = 0;
    double *mv = NULL;
    switch (f->kind) {
    case 1:
        conv64_forward(y, f->x, f->w, f->B, f->C, f->H, f->W, f->OC, f->K, f->stride, f->pad, f->groups);
        break;
    case 2:
        mv = malloc(2 * (size_t)f->C * sizeof *mv);
        bn64_forward(y, mv, mv + f->C, f->x, f->w, f->b, f->B, f->C, f->H * f->W, 1e-5);
        break;
    case 3: prelu64_forward(y, f->x, f->w, f->B, f->C, f->H * f->W, NULL); break;
    case 4: linear64_forward(y, f->x, f->w, f->b, f->B, f->IN, f->OUT); break;
    }
    for (size_t i = 0; i < f->ny; i++)
        s += y[i] * f->g[i];
    free(y);
    free(mv);
    return s;
}

/* Central differences of loss64 w.r.t. `theta` (n values) at up to 24 sampled indices, compared
 * with the device gradient `got`. */
static void fd_check(const char *what, fcase *f, double *theta, size_t n, const float *got)
{
    const double h = 1e-4;
    size_t idx[24];
    int m = n < 24 ? (int)n : 24;
    double num = 0, den = 0;
    for (int k = 0; k < m; k++) {
        idx[k] = n <= 24 ? (size_t)k : (size_t)((urand() + 1.0) * 0.5 * (double)n) % n;
        double t0 = theta[idx[k]];
        theta[idx[k]] = t0 + h;
        double lp = loss64(f);
        theta[idx[k]] = t0 - h;
        double lm = loss64(f);
        theta[idx[k]] = t0;
        double fd = (lp - lm) / (2 * h);
        num += (got[idx[k]] - fd) * (got[idx[k]] - fd);
        den += fd * fd;
    }
    char lab[96];
    snprintf(lab, sizeof lab, "%s vs finite differences", what);
    expect_rel(lab, den > 0 ? sqrt(num / den) : sqrt(num), 1e-4);
}

static void test_conv(ops_ctx *ctx, int B, int C, int H, int OC, int K, int stride, int pad, int g)
{
    ops_conv_shape s;
    if (ops_conv_shape_init(&s, B, C, H, H, OC, K, stride, pad, g)) {
        CHECK(0, "shape: %s", pf_errmsg());
        return;
    }
    printf("conv B=%d C=%d %dx%d OC=%d K=%d stride=%d pad=%d groups=%d -> %dx%d\n", B, C, H, H, OC, K, stride,
           pad, g, s.OH, s.OW);
    size_t nx = (size_t)B * C * H * H, nw = (size_t)OC * (C / g) * K * K, ny = (size_t)B * OC * s.OH * s.OW;
    float *x = randf(nx, 1.0), *w = randf(nw, 0.3), *gy = randf(ny, 1.0);
    float *y = malloc(ny * sizeof *y), *dx = calloc(nx, sizeof *dx), *dw = calloc(nw, sizeof *dw);
    fcase f = {.kind = 1,
               .B = B,
               .C = C,
               .H = H,
               .W = H,
               .OC = OC,
               .K = K,
               .stride = stride,
               .pad = pad,
               .groups = g,
               .x = to64(x, nx),
               .w = to64(w, nw),
               .g = to64(gy, ny),
               .ny = ny};
    double *y64 = malloc(ny * sizeof *y64), *dx64 = calloc(nx, sizeof *dx64),
           *dw64 = calloc(nw, sizeof *dw64);
    conv64_forward(y64, f.x, f.w, B, C, H, H, OC, K, stride, pad, g);
    conv64_backward(dx64, dw64, f.g, f.x, f.w, B, C, H, H, OC, K, stride, pad, g);
    int HWi = H * H, HWo = s.OH * s.OW;
    float *xd = dev_in(x, B, C, HWi), *gd = dev_in(gy, B, OC, HWo);
    float *yd = malloc(ny * sizeof *yd), *dxd = calloc(nx, sizeof *dxd);
    int rc = ops_cpu.conv_forward(ctx, yd, xd, w, &s);
    if (!rc)
        rc = ops_cpu.conv_backward(ctx, dxd, 0, dw, gd, xd, w, &s);
    dev_out(y, yd, B, OC, HWo);
    dev_out(dx, dxd, B, C, HWi);
    if (rc) {
        CHECK(0, "conv: %s", pf_errmsg());
    } else {
        expect_rel("forward vs float64", rel_l2_f64(y, y64, ny), 1e-5);
        expect_rel("dinp vs float64 backward", rel_l2_f64(dx, dx64, nx), 1e-5);
        expect_rel("dweight vs float64 backward", rel_l2_f64(dw, dw64, nw), 1e-5);
        fd_check("dinp", &f, f.x, nx, dx);
        fd_check("dweight", &f, f.w, nw, dw);
        /* += contract: a second backward with acc adds the same again */
        rc = ops_cpu.conv_backward(ctx, dxd, 1, dw, gd, xd, w, &s);
        dev_out(dx, dxd, B, C, HWi);
        for (size_t i = 0; i < nx; i++)
            dx64[i] *= 2;
        for (size_t i = 0; i < nw; i++)
            dw64[i] *= 2;
        expect_rel("second backward accumulates (dinp, acc)", rc ? 1 : rel_l2_f64(dx, dx64, nx), 1e-5);
        expect_rel("second backward accumulates (dweight)", rc ? 1 : rel_l2_f64(dw, dw64, nw), 1e-5);
    }
    free(x);
    free(w);
    free(gy);
    free(y);
    free(dx);
    free(dw);
    free(xd);
    free(gd);
    free(yd);
    free(dxd);
    free(f.x);
    free(f.w);
    free(f.g);
    free(y64);
    free(dx64);
    free(dw64);
}

static void test_bn(ops_ctx *ctx, int B, int C, int HW, int fixed)
{
    printf("batchnorm train B=%d C=%d HW=%d%s\n", B, C, HW, fixed ? " (weight fixed)" : "");
    size_t n = (size_t)B * C * HW;
    float *x = randf(n, 2.0), *gy = randf(n, 1.0), *w = randf((size_t)C, 1.0), *b = randf((size_t)C, 1.0);
    for (size_t i = 0; i < n; i++)
        x[i] += 0.7f; /* non-zero mean */
    if (fixed)
        for (int c = 0; c < C; c++)
            w[c] = 1.0f;
    float *y = malloc(n * sizeof *y), *dx = malloc(n * sizeof *dx);
    float *dw = calloc((size_t)C, sizeof *dw), *db = calloc((size_t)C, sizeof *db);
    float *rm = calloc((size_t)C, sizeof *rm), *rv = malloc((size_t)C * sizeof *rv);
    double *sm = malloc((size_t)C * sizeof *sm), *sv = malloc((size_t)C * sizeof *sv);
    for (int c = 0; c < C; c++)
        rv[c] = 1.0f;
    fcase f = {.kind = 2,
               .B = B,
               .C = C,
               .H = HW,
               .W = 1,
               .x = to64(x, n),
               .w = to64(w, C),
               .b = to64(b, C),
               .g = to64(gy, n),
               .ny = n};
    double *y64 = malloc(n * sizeof *y64), *mv = malloc(2 * (size_t)C * sizeof *mv);
    double *dx64 = calloc(n, sizeof *dx64), *dw64 = calloc((size_t)C, sizeof *dw64),
           *db64 = calloc((size_t)C, sizeof *db64);
    bn64_forward(y64, mv, mv + C, f.x, f.w, f.b, B, C, HW, 1e-5);
    bn64_backward(dx64, dw64, db64, f.g, f.x, f.w, mv, mv + C, B, C, HW, 1e-5);
    float *xd = dev_in(x, B, C, HW), *gd = dev_in(gy, B, C, HW), *yd = malloc(n * sizeof *yd),
          *dxd = malloc(n * sizeof *dxd);
    int rc = ops_cpu.bn_forward(ctx, yd, sm, sv, xd, w, b, rm, rv, B, C, HW, 1e-5f, 0.1f, 1);
    if (!rc)
        rc = ops_cpu.bn_backward(ctx, dxd, 0, fixed ? NULL : dw, db, gd, xd, w, sm, sv, B, C, HW, 1e-5f);
    dev_out(y, yd, B, C, HW);
    dev_out(dx, dxd, B, C, HW);
    if (rc) {
        CHECK(0, "batchnorm: %s", pf_errmsg());
    } else {
        expect_rel("forward vs float64", rel_l2_f64(y, y64, n), 1e-5);
        /* running stats: 0.9*0 + 0.1*mean, 0.9*1 + 0.1*var*n/(n-1) */
        double *er = malloc(2 * (size_t)C * sizeof *er);
        double nn = (double)B * HW;
        for (int c = 0; c < C; c++) {
            er[c] = 0.1 * mv[c];
            er[C + c] = 0.9 + 0.1 * mv[C + c] * nn / (nn - 1);
        }
        expect_rel("running_mean (momentum 0.1)", rel_l2_f64(rm, er, (size_t)C), 1e-6);
        expect_rel("running_var (momentum 0.1, unbiased)", rel_l2_f64(rv, er + C, (size_t)C), 1e-6);
        free(er);
        expect_rel("dinp vs float64 backward", rel_l2_f64(dx, dx64, n), 1e-5);
        expect_rel("dbias vs float64 backward", rel_l2_f64(db, db64, (size_t)C), 1e-5);
        fd_check("dinp", &f, f.x, n, dx);
        fd_check("dbias", &f, f.b, (size_t)C, db);
        if (fixed) {
            int nz = 0;
            for (int c = 0; c < C; c++)
                nz |= dw[c] != 0.0f;
            check(!nz, "fixed weight: no weight gradient written");
        } else {
            expect_rel("dweight vs float64 backward", rel_l2_f64(dw, dw64, (size_t)C), 1e-5);
            fd_check("dweight", &f, f.w, (size_t)C, dw);
        }
        /* eval mode: normalize with the running statistics */
        rc = ops_cpu.bn_forward(ctx, yd, NULL, NULL, xd, w, b, rm, rv, B, C, HW, 1e-5f, 0.1f, 0);
        dev_out(y, yd, B, C, HW);
        for (size_t k = 0; k < n; k++) {
            int c = (int)((k / (size_t)HW) % (size_t)C);
            y64[k] = ((double)x[k] - rm[c]) / sqrt((double)rv[c] + 1e-5) * w[c] + b[c];
        }
        expect_rel("eval forward (running statistics)", rc ? 1 : rel_l2_f64(y, y64, n), 1e-6);
    }
    free(x);
    free(gy);
    free(w);
    free(b);
    free(y);
    free(dx);
    free(dw);
    free(db);
    free(rm);
    free(rv);
    free(sm);
    free(sv);
    free(xd);
    free(gd);
    free(yd);
    free(dxd);
    free(f.x);
    free(f.w);
    free(f.b);
    free(f.g);
    free(y64);
    free(mv);
    free(dx64);
    free(dw64);
    free(db64);
}

static void test_prelu(ops_ctx *ctx, int B, int C, int HW)
{
    printf("prelu B=%d C=%d HW=%d\n", B, C, HW);
    size_t n = (size_t)B * C * HW;
    float *x = randf(n, 1.0), *gy = randf(n, 1.0), *a = randf((size_t)C, 0.5);
    for (size_t i = 0; i < n; i++) /* keep away from the kink for finite differences */
        if (fabsf(x[i]) < 1e-2f)
            x[i] = 0.5f;
    float *y = malloc(n * sizeof *y), *dx = malloc(n * sizeof *dx), *da = calloc((size_t)C, 4);
    fcase f = {.kind = 3,
               .B = B,
               .C = C,
               .H = HW,
               .W = 1,
               .x = to64(x, n),
               .w = to64(a, C),
               .g = to64(gy, n),
               .ny = n};
    double *y64 = malloc(n * sizeof *y64), *dx64 = calloc(n, 8), *da64 = calloc((size_t)C, 8);
    prelu64_forward(y64, f.x, f.w, B, C, HW, NULL);
    prelu64_backward(dx64, da64, f.g, f.x, f.w, B, C, HW, NULL);
    float *xd = dev_in(x, B, C, HW), *gd = dev_in(gy, B, C, HW), *yd = malloc(n * sizeof *yd),
          *dxd = malloc(n * sizeof *dxd);
    int rc = ops_cpu.prelu_forward(ctx, yd, xd, a, B, C, HW);
    if (!rc)
        rc = ops_cpu.prelu_backward(ctx, dxd, 0, da, gd, xd, a, B, C, HW);
    dev_out(y, yd, B, C, HW);
    dev_out(dx, dxd, B, C, HW);
    free(xd);
    free(gd);
    free(yd);
    free(dxd);
    expect_rel("forward vs float64", rc ? 1 : rel_l2_f64(y, y64, n), 1e-6);
    expect_rel("dinp vs float64 backward", rc ? 1 : rel_l2_f64(dx, dx64, n), 1e-6);
    expect_rel("dalpha vs float64 backward", rc ? 1 : rel_l2_f64(da, da64, (size_t)C), 1e-5);
    fd_check("dinp", &f, f.x, n, dx);
    fd_check("dalpha", &f, f.w, (size_t)C, da);
    free(x);
    free(gy);
    free(a);
    free(y);
    free(dx);
    free(da);
    free(f.x);
    free(f.w);
    free(f.g);
    free(y64);
    free(dx64);
    free(da64);
}

static void test_linear(ops_ctx *ctx, int B, int IN, int OUT, int bias)
{
    printf("linear B=%d IN=%d OUT=%d%s\n", B, IN, OUT, bias ? " bias" : " no bias");
    size_t nx = (size_t)B * IN, nw = (size_t)OUT * IN, ny = (size_t)B * OUT;
    float *x = randf(nx, 1.0), *w = randf(nw, 0.1), *b = bias ? randf((size_t)OUT, 0.1) : NULL,
          *gy = randf(ny, 1.0);
    float *y = malloc(ny * 4), *dx = malloc(nx * 4), *dw = calloc(nw, 4), *db = calloc((size_t)OUT, 4);
    fcase f = {.kind = 4,
               .B = B,
               .IN = IN,
               .OUT = OUT,
               .x = to64(x, nx),
               .w = to64(w, nw),
               .b = bias ? to64(b, OUT) : NULL,
               .g = to64(gy, ny),
               .ny = ny};
    double *y64 = malloc(ny * 8), *dx64 = calloc(nx, 8), *dw64 = calloc(nw, 8),
           *db64 = calloc((size_t)OUT, 8);
    linear64_forward(y64, f.x, f.w, f.b, B, IN, OUT);
    linear64_backward(dx64, dw64, db64, f.g, f.x, f.w, B, IN, OUT);
    int rc = ops_cpu.linear_forward(ctx, y, x, w, b, B, IN, OUT);
    if (!rc)
        rc = ops_cpu.linear_backward(ctx, dx, 0, dw, bias ? db : NULL, gy, x, w, B, IN, OUT);
    expect_rel("forward vs float64", rc ? 1 : rel_l2_f64(y, y64, ny), 1e-5);
    expect_rel("dinp vs float64 backward", rc ? 1 : rel_l2_f64(dx, dx64, nx), 1e-5);
    expect_rel("dweight vs float64 backward", rc ? 1 : rel_l2_f64(dw, dw64, nw), 1e-5);
    fd_check("dinp", &f, f.x, nx, dx);
    fd_check("dweight", &f, f.w, nw, dw);
    if (bias) {
        expect_rel("dbias vs float64 backward", rc ? 1 : rel_l2_f64(db, db64, (size_t)OUT), 1e-5);
        fd_check("dbias", &f, f.b, (size_t)OUT, db);
    }
    free(x);
    free(w);
    free(b);
    free(gy);
    free(y);
    free(dx);
    free(dw);
    free(db);
    free(f.x);
    free(f.w);
    free(f.b);
    free(f.g);
    free(y64);
    free(dx64);
    free(dw64);
    free(db64);
}

static void test_add_dropout(ops_ctx *ctx)
{
    printf("add, acc, dropout\n");
    size_t n = 10000;
    float *a = randf(n, 1.0), *b = randf(n, 1.0), *o = malloc(n * 4), *mask = malloc(n * 4),
          *d = malloc(n * 4);
    double *e = malloc(n * 8);
    ops_cpu.add_forward(ctx, o, a, b, n);
    for (size_t i = 0; i < n; i++)
        e[i] = (double)a[i] + b[i];
    expect_rel("add forward", rel_l2_f64(o, e, n), 1e-7);
    memcpy(d, a, n * 4);
    ops_cpu.acc(ctx, d, 1, b, n);
    expect_rel("acc (+=)", rel_l2_f64(d, e, n), 1e-7);
    ops_cpu.dropout_forward(ctx, o, mask, a, n, 0.0f, 1);
    for (size_t i = 0; i < n; i++)
        e[i] = a[i];
    expect_rel("dropout p=0 is the identity", rel_l2_f64(o, e, n), 0);
    ops_cpu.dropout_forward(ctx, o, mask, a, n, 0.5f, 1);
    size_t kept = 0, okv = 0;
    for (size_t i = 0; i < n; i++) {
        kept += mask[i] != 0.0f;
        okv += mask[i] == 0.0f ? o[i] == 0.0f : o[i] == a[i] * 2.0f;
    }
    check(kept > 4750 && kept < 5250 && okv == n,
          "dropout p=0.5: kept %zu of %zu (expect ~5000 +- 250), scaled x2: %s", kept, n,
          okv == n ? "yes" : "NO");
    ops_cpu.dropout_backward(ctx, d, 0, b, mask, n);
    for (size_t i = 0; i < n; i++)
        e[i] = (double)b[i] * mask[i];
    expect_rel("dropout backward = dout * mask", rel_l2_f64(d, e, n), 0);
    int rc = ops_cpu.dropout_forward(ctx, o, mask, a, n, 1.0f, 1);
    check(rc == -EINVAL, "dropout p=1 refused: %d '%s'", rc, pf_errmsg());
    free(a);
    free(b);
    free(o);
    free(mask);
    free(d);
    free(e);
}

/* The layout conversion itself, against the index formula written out here. */
static void test_layout(ops_ctx *ctx)
{
    int B = 2, C = 16, HW = 6, bs = ops_cpu.act_block(C);
    size_t n = (size_t)B * C * HW;
    float *p = randf(n, 1.0), *d = malloc(n * 4), *q = malloc(n * 4);
    ops_cpu.from_plain(ctx, d, 0, p, B, C, HW);
    int bad = 0;
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++)
            for (int i = 0; i < HW; i++)
                bad += d[(((size_t)b * (C / bs) + c / bs) * HW + i) * bs + c % bs] !=
                       p[((size_t)b * C + c) * HW + i];
    ops_cpu.to_plain(ctx, q, d, B, C, HW);
    bad += memcmp(p, q, n * 4) != 0;
    ops_cpu.from_plain(ctx, d, 1, p, B, C, HW); /* += : doubles */
    ops_cpu.to_plain(ctx, q, d, B, C, HW);
    for (size_t i = 0; i < n; i++)
        bad += q[i] != 2 * p[i];
    check(!bad && ops_cpu.act_block(3) == 1,
          "layout: act_block(16) = %d, act_block(3) = %d, NCHW <-> device round trip, +=: %d mismatches", bs,
          ops_cpu.act_block(3), bad);
    free(p);
    free(d);
    free(q);
}

int main(void)
{
    ops_ctx *ctx;
    if (ops_cpu.ctx_create(&ctx))
        DIE("ctx_create");
    g_ctx = ctx;
    test_conv(ctx, 2, 3, 12, 8, 3, 1, 1, 1);   /* stem */
    test_conv(ctx, 2, 8, 10, 16, 3, 2, 1, 1);  /* iresnet conv2, stride 2 */
    test_conv(ctx, 2, 8, 10, 16, 1, 2, 0, 1);  /* downsample 1x1 stride 2 */
    test_conv(ctx, 2, 8, 9, 8, 3, 1, 1, 4);    /* grouped (mbf layers.1) */
    test_conv(ctx, 2, 16, 8, 16, 3, 2, 1, 16); /* depthwise stride 2 */
    test_conv(ctx, 3, 16, 7, 16, 7, 1, 0, 16); /* GDC 7x7 depthwise */
    test_bn(ctx, 3, 5, 49, 0);
    test_bn(ctx, 2, 16, 25, 0); /* blocked layout (nChw8c) */
    test_bn(ctx, 2, 6, 1, 0);   /* BatchNorm1d, batch 2 */
    test_bn(ctx, 4, 6, 1, 1);   /* features: BatchNorm1d, weight fixed */
    test_prelu(ctx, 2, 4, 30);
    test_prelu(ctx, 2, 16, 9); /* blocked layout */
    test_layout(ctx);
    test_linear(ctx, 3, 50, 7, 1);
    test_linear(ctx, 2, 40, 6, 0);
    test_add_dropout(ctx);

    /* bad shapes refused with a message */
    ops_conv_shape s;
    int rc = ops_conv_shape_init(&s, 2, 6, 8, 8, 8, 3, 1, 1, 4);
    check(rc == -EINVAL, "conv groups 4 with C=6 refused: %d '%s'", rc, pf_errmsg());
    rc = ops_conv_shape_init(&s, 2, 4, 2, 2, 8, 7, 1, 0, 1);
    check(rc == -EINVAL, "conv kernel 7 on 2x2 refused: %d '%s'", rc, pf_errmsg());
    rc = ops_cpu.bn_forward(ctx, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 4, 4, 1e-5f, 0.1f, 1);
    check(rc == -EINVAL, "batchnorm B=0 refused: %d '%s'", rc, pf_errmsg());
    ops_cpu.ctx_destroy(ctx);
    return check_summary();
}
