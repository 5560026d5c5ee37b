/* CUDA device (ops_cuda) vs the CPU device (ops_cpu, the reference) for every layer of
 * kernels/ops.h: convolution fwd/bwd (groups, strides, 1x1 and 3x3), batch norm train/eval fwd and
 * bwd (2d and HW = 1; cuDNN and PFCPS_CUDA_BN=exact), PReLU, Linear (with and without bias), add, acc, layout
 * conversions, dropout. Random shapes and inputs drawn from a fresh seed each run (printed; PFCPS_TEST_SEED
 * replays one). Every CUDA output is poisoned with NaN before the call and every element is
 * checked (a NaN left anywhere fails). fp32: relative error ||cuda - cpu|| / ||cpu|| <= 1e-4 per
 * output; the dropout mask must be bit-identical. Also: bad shapes / arguments are refused.
 * Without a GPU: "SKIP: no CUDA device" and exit 77. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"
#include "tests/kernels/cuda/cuda_testutil.h"

#define TOL 1e-4

/* Compares a CUDA result (host copy) with the CPU device's: every element finite where the
 * CPU's is, relative L2 error <= tol. */
static void cmp(const char *what, const float *cu, const float *cpu, size_t n, double tol)
{
    double num = 0, den = 0, maxabs = 0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(cu[i]) != isnan(cpu[i])) {
            bad++;
            continue;
        }
        double e = (double)cu[i] - cpu[i];
        num += e * e;
        den += (double)cpu[i] * cpu[i];
        if (fabs(e) > maxabs)
            maxabs = fabs(e);
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    int ok = bad == 0 && rel <= tol;
    checks++;
    if (!ok)
        failures++;
    printf("%-4s %-48s n %-8zu rel %.3e max abs %.3e%s\n", ok ? "ok" : "FAIL", what, n, rel, maxabs,
           bad ? " (NaN left: element not written)" : "");
}

static void cmp_d(const char *what, const double *cu, const double *cpu, size_t n, double tol)
{
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    for (size_t i = 0; i < n; i++) {
        a[i] = (float)cu[i];
        b[i] = (float)cpu[i];
    }
    cmp(what, a, b, n, tol);
    free(a);
    free(b);
}

static ops_ctx *cpu, *gpu;

/* CPU layout helpers: plain NCHW host <-> the CPU device's activation layout. */
static float *cpu_in(const float *plain, int B, int C, int HW)
{
    size_t n = (size_t)B * C * HW;
    float *p = malloc(n * sizeof *p);
    if (ops_cpu.from_plain(cpu, p, 0, plain, B, C, HW))
        DIE("cpu from_plain");
    return p;
}

static float *cpu_out(float *dev_layout, int B, int C, int HW)
{
    size_t n = (size_t)B * C * HW;
    float *p = malloc(n * sizeof *p);
    if (ops_cpu.to_plain(cpu, p, dev_layout, B, C, HW))
        DIE("cpu to_plain");
    free(dev_layout);
    return p;
}

static void test_conv(void)
{
    ops_conv_shape s;
    int groups_opt = irand(0, 2);
    int B = irand(1, 4), C = 8 * irand(1, 3), H = irand(5, 17), W = irand(5, 17);
    int K = irand(0, 1) ? 3 : 1, stride = irand(1, 2), pad = K == 3 ? irand(0, 1) : 0;
    int OC = 8 * irand(1, 3), groups = 1;
    if (groups_opt == 1) { /* depthwise (mobilefacenet) */
        OC = C;
        groups = C;
    } else if (groups_opt == 2 && irand(0, 1)) { /* stem: 3 input channels */
        C = 3;
    }
    if (ops_conv_shape_init(&s, B, C, H, W, OC, K, stride, pad, groups))
        DIE("conv shape");
    char tag[128];
    snprintf(tag, sizeof tag, "B%d C%d %dx%d OC%d K%d s%d p%d g%d", B, C, H, W, OC, K, stride, pad, groups);
    size_t ni = (size_t)B * C * H * W, no = (size_t)B * OC * s.OH * s.OW;
    size_t nw = (size_t)OC * (C / groups) * K * K;
    float *x = frnd(ni, -1, 1), *w = frnd(nw, -0.5f, 0.5f), *dy = frnd(no, -1, 1);
    float *dx0 = frnd(ni, -1, 1), *dw0 = frnd(nw, -1, 1);
    /* CPU */
    float *cx = cpu_in(x, B, C, H * W), *cy = malloc(no * sizeof(float));
    float *cdy = cpu_in(dy, B, OC, s.OH * s.OW), *cdx = cpu_in(dx0, B, C, H * W), *cdw = fcopy(dw0, nw);
    if (ops_cpu.conv_forward(cpu, cy, cx, w, &s) || ops_cpu.conv_backward(cpu, cdx, 1, cdw, cdy, cx, w, &s))
        DIE("cpu conv %s", tag);
    cy = cpu_out(cy, B, OC, s.OH * s.OW);
    cdx = cpu_out(cdx, B, C, H * W);
    float *cdx2 = malloc(ni * sizeof(float));
    if (ops_cpu.conv_backward(cpu, cdx2, 0, NULL, cdy, cx, w, &s))
        DIE("cpu conv bwd %s", tag);
    cdx2 = cpu_out(cdx2, B, C, H * W);
    /* CUDA */
    float *gx = dup_dev(x, ni), *gw = dup_dev(w, nw), *gdy = dup_dev(dy, no), *gy = nan_dev(no);
    float *gdx = dup_dev(dx0, ni), *gdw = dup_dev(dw0, nw), *gdx2 = nan_dev(ni);
    if (ops_cuda.conv_forward(gpu, gy, gx, gw, &s) ||
        ops_cuda.conv_backward(gpu, gdx, 1, gdw, gdy, gx, gw, &s) ||
        ops_cuda.conv_backward(gpu, gdx2, 0, NULL, gdy, gx, gw, &s))
        DIE("cuda conv %s", tag);
    char what[200];
    float *h;
    snprintf(what, sizeof what, "conv fwd %s", tag);
    cmp(what, h = dl(gy, no), cy, no, TOL);
    free(h);
    snprintf(what, sizeof what, "conv dinp += %s", tag);
    cmp(what, h = dl(gdx, ni), cdx, ni, TOL);
    free(h);
    snprintf(what, sizeof what, "conv dinp = %s", tag);
    cmp(what, h = dl(gdx2, ni), cdx2, ni, TOL);
    free(h);
    snprintf(what, sizeof what, "conv dweight += %s", tag);
    cmp(what, h = dl(gdw, nw), cdw, nw, TOL);
    free(h);
    free(x);
    free(w);
    free(dy);
    free(dx0);
    free(dw0);
    free(cx);
    free(cy);
    free(cdy);
    free(cdx);
    free(cdw);
    free(cdx2);
    cuda_free(gx);
    cuda_free(gw);
    cuda_free(gdy);
    cuda_free(gy);
    cuda_free(gdx);
    cuda_free(gdw);
    cuda_free(gdx2);
}

static void test_bn(int HW)
{
    int B = irand(2, 6), C = 8 * irand(1, 4);
    if (HW == 0)
        HW = irand(3, 12) * irand(3, 12);
    size_t n = (size_t)B * C * HW;
    float eps = 1e-5f, mom = 0.1f;
    char tag[96], what[200];
    snprintf(tag, sizeof tag, "B%d C%d HW%d", B, C, HW);
    float *x = frnd(n, -2, 3), *wt = frnd(C, 0.5f, 1.5f), *bi = frnd(C, -0.5f, 0.5f);
    float *rm = frnd(C, -0.1f, 0.1f), *rv = frnd(C, 0.5f, 1.5f), *dy = frnd(n, -1, 1), *dx0 = frnd(n, -1, 1);
    float *dw0 = frnd(C, -1, 1), *db0 = frnd(C, -1, 1);
    /* CPU */
    float *cx = cpu_in(x, B, C, HW), *cy = malloc(n * sizeof(float)), *cye = malloc(n * sizeof(float));
    float *crm = fcopy(rm, C), *crv = fcopy(rv, C), *cdy = cpu_in(dy, B, C, HW), *cdx = cpu_in(dx0, B, C, HW);
    float *cdw = fcopy(dw0, C), *cdb = fcopy(db0, C);
    double *smean = malloc(C * sizeof(double)), *svar = malloc(C * sizeof(double));
    if (ops_cpu.bn_forward(cpu, cy, smean, svar, cx, wt, bi, crm, crv, B, C, HW, eps, mom, 1) ||
        ops_cpu.bn_backward(cpu, cdx, 1, cdw, cdb, cdy, cx, wt, smean, svar, B, C, HW, eps) ||
        ops_cpu.bn_forward(cpu, cye, NULL, NULL, cx, wt, bi, crm, crv, B, C, HW, eps, mom, 0))
        DIE("cpu bn %s", tag);
    cy = cpu_out(cy, B, C, HW);
    cye = cpu_out(cye, B, C, HW);
    cdx = cpu_out(cdx, B, C, HW);
    /* CUDA */
    float *gx = dup_dev(x, n), *gw = dup_dev(wt, C), *gb = dup_dev(bi, C), *grm = dup_dev(rm, C);
    float *grv = dup_dev(rv, C), *gdy = dup_dev(dy, n), *gdx = dup_dev(dx0, n), *gdw = dup_dev(dw0, C);
    float *gdb = dup_dev(db0, C), *gy = nan_dev(n), *gye = nan_dev(n);
    double *gsm, *gsv;
    if (cuda_malloc((void **)&gsm, C * sizeof(double)) || cuda_malloc((void **)&gsv, C * sizeof(double)))
        DIE("alloc");
    if (ops_cuda.bn_forward(gpu, gy, gsm, gsv, gx, gw, gb, grm, grv, B, C, HW, eps, mom, 1) ||
        ops_cuda.bn_backward(gpu, gdx, 1, gdw, gdb, gdy, gx, gw, gsm, gsv, B, C, HW, eps) ||
        ops_cuda.bn_forward(gpu, gye, NULL, NULL, gx, gw, gb, grm, grv, B, C, HW, eps, mom, 0))
        DIE("cuda bn %s", tag);
    float *h;
    double *hm = malloc(C * sizeof(double)), *hv = malloc(C * sizeof(double));
    if (cuda_sync() || cuda_d2h(hm, gsm, C * sizeof(double)) || cuda_d2h(hv, gsv, C * sizeof(double)))
        DIE("download");
    snprintf(what, sizeof what, "bn train fwd %s", tag);
    cmp(what, h = dl(gy, n), cy, n, TOL);
    free(h);
    snprintf(what, sizeof what, "bn save_mean %s", tag);
    cmp_d(what, hm, smean, C, TOL);
    snprintf(what, sizeof what, "bn save_var %s", tag);
    cmp_d(what, hv, svar, C, TOL);
    snprintf(what, sizeof what, "bn running_mean %s", tag);
    cmp(what, h = dl(grm, C), crm, C, TOL);
    free(h);
    snprintf(what, sizeof what, "bn running_var %s", tag);
    cmp(what, h = dl(grv, C), crv, C, TOL);
    free(h);
    snprintf(what, sizeof what, "bn dinp += %s", tag);
    cmp(what, h = dl(gdx, n), cdx, n, TOL);
    free(h);
    snprintf(what, sizeof what, "bn dweight += %s", tag);
    cmp(what, h = dl(gdw, C), cdw, C, TOL);
    free(h);
    snprintf(what, sizeof what, "bn dbias += %s", tag);
    cmp(what, h = dl(gdb, C), cdb, C, TOL);
    free(h);
    snprintf(what, sizeof what, "bn eval fwd %s", tag);
    cmp(what, h = dl(gye, n), cye, n, TOL);
    free(h);
    /* Backward with dinp overwritten and the weight gradient skipped (features BN: fixed weight). */
    float *cdx2 = malloc(n * sizeof(float)), *cdb2 = fcopy(db0, C);
    if (ops_cpu.bn_backward(cpu, cdx2, 0, NULL, cdb2, cdy, cx, wt, smean, svar, B, C, HW, eps))
        DIE("cpu bn bwd");
    cdx2 = cpu_out(cdx2, B, C, HW);
    float *gdx2 = nan_dev(n), *gdb2 = dup_dev(db0, C);
    if (ops_cuda.bn_backward(gpu, gdx2, 0, NULL, gdb2, gdy, gx, gw, gsm, gsv, B, C, HW, eps))
        DIE("cuda bn bwd %s", tag);
    snprintf(what, sizeof what, "bn dinp = (dweight NULL) %s", tag);
    cmp(what, h = dl(gdx2, n), cdx2, n, TOL);
    free(h);
    snprintf(what, sizeof what, "bn dbias += (dweight NULL) %s", tag);
    cmp(what, h = dl(gdb2, C), cdb2, C, TOL);
    free(h);
    free(x);
    free(wt);
    free(bi);
    free(rm);
    free(rv);
    free(dy);
    free(dx0);
    free(dw0);
    free(db0);
    free(cx);
    free(cy);
    free(cye);
    free(crm);
    free(crv);
    free(cdy);
    free(cdx);
    free(cdw);
    free(cdb);
    free(smean);
    free(svar);
    free(hm);
    free(hv);
    free(cdx2);
    free(cdb2);
    cuda_free(gx);
    cuda_free(gw);
    cuda_free(gb);
    cuda_free(grm);
    cuda_free(grv);
    cuda_free(gdy);
    cuda_free(gdx);
    cuda_free(gdw);
    cuda_free(gdb);
    cuda_free(gy);
    cuda_free(gye);
    cuda_free(gsm);
    cuda_free(gsv);
    cuda_free(gdx2);
    cuda_free(gdb2);
}

static void test_prelu(void)
{
    int B = irand(1, 5), C = 8 * irand(1, 4), HW = irand(1, 20) * irand(1, 20);
    size_t n = (size_t)B * C * HW;
    char tag[96], what[200];
    snprintf(tag, sizeof tag, "B%d C%d HW%d", B, C, HW);
    float *x = frnd(n, -1, 1), *a = frnd(C, 0, 0.5f), *dy = frnd(n, -1, 1), *dx0 = frnd(n, -1, 1);
    float *da0 = frnd(C, -1, 1);
    float *cx = cpu_in(x, B, C, HW), *cy = malloc(n * sizeof(float)), *cdy = cpu_in(dy, B, C, HW);
    float *cdx = cpu_in(dx0, B, C, HW), *cda = fcopy(da0, C);
    if (ops_cpu.prelu_forward(cpu, cy, cx, a, B, C, HW) ||
        ops_cpu.prelu_backward(cpu, cdx, 1, cda, cdy, cx, a, B, C, HW))
        DIE("cpu prelu");
    cy = cpu_out(cy, B, C, HW);
    cdx = cpu_out(cdx, B, C, HW);
    float *gx = dup_dev(x, n), *ga = dup_dev(a, C), *gdy = dup_dev(dy, n), *gdx = dup_dev(dx0, n);
    float *gda = dup_dev(da0, C), *gy = nan_dev(n), *h;
    if (ops_cuda.prelu_forward(gpu, gy, gx, ga, B, C, HW) ||
        ops_cuda.prelu_backward(gpu, gdx, 1, gda, gdy, gx, ga, B, C, HW))
        DIE("cuda prelu %s", tag);
    snprintf(what, sizeof what, "prelu fwd %s", tag);
    cmp(what, h = dl(gy, n), cy, n, TOL);
    free(h);
    snprintf(what, sizeof what, "prelu dinp += %s", tag);
    cmp(what, h = dl(gdx, n), cdx, n, TOL);
    free(h);
    snprintf(what, sizeof what, "prelu dalpha += %s", tag);
    cmp(what, h = dl(gda, C), cda, C, TOL);
    free(h);
    free(x);
    free(a);
    free(dy);
    free(dx0);
    free(da0);
    free(cx);
    free(cy);
    free(cdy);
    free(cdx);
    free(cda);
    cuda_free(gx);
    cuda_free(ga);
    cuda_free(gdy);
    cuda_free(gdx);
    cuda_free(gda);
    cuda_free(gy);
}

static void test_linear(int with_bias)
{
    int B = irand(1, 9), IN = irand(1, 300), OUT = irand(1, 130);
    char tag[96], what[200];
    snprintf(tag, sizeof tag, "B%d IN%d OUT%d%s", B, IN, OUT, with_bias ? " bias" : "");
    size_t ni = (size_t)B * IN, no = (size_t)B * OUT, nw = (size_t)OUT * IN;
    float *x = frnd(ni, -1, 1), *w = frnd(nw, -1, 1), *b = with_bias ? frnd(OUT, -1, 1) : NULL;
    float *dy = frnd(no, -1, 1), *dx0 = frnd(ni, -1, 1), *dw0 = frnd(nw, -1, 1), *db0 = frnd(OUT, -1, 1);
    float *cy = malloc(no * sizeof(float)), *cdx = fcopy(dx0, ni), *cdw = fcopy(dw0, nw),
          *cdb = fcopy(db0, OUT);
    float *cdx2 = malloc(ni * sizeof(float));
    if (ops_cpu.linear_forward(cpu, cy, x, w, b, B, IN, OUT) ||
        ops_cpu.linear_backward(cpu, cdx, 1, cdw, with_bias ? cdb : NULL, dy, x, w, B, IN, OUT) ||
        ops_cpu.linear_backward(cpu, cdx2, 0, NULL, NULL, dy, x, w, B, IN, OUT))
        DIE("cpu linear");
    float *gx = dup_dev(x, ni), *gw = dup_dev(w, nw), *gb = b ? dup_dev(b, OUT) : NULL,
          *gdy = dup_dev(dy, no);
    float *gdx = dup_dev(dx0, ni), *gdw = dup_dev(dw0, nw), *gdb = dup_dev(db0, OUT), *gy = nan_dev(no);
    float *gdx2 = nan_dev(ni), *h;
    if (ops_cuda.linear_forward(gpu, gy, gx, gw, gb, B, IN, OUT) ||
        ops_cuda.linear_backward(gpu, gdx, 1, gdw, with_bias ? gdb : NULL, gdy, gx, gw, B, IN, OUT) ||
        ops_cuda.linear_backward(gpu, gdx2, 0, NULL, NULL, gdy, gx, gw, B, IN, OUT))
        DIE("cuda linear %s", tag);
    snprintf(what, sizeof what, "linear fwd %s", tag);
    cmp(what, h = dl(gy, no), cy, no, TOL);
    free(h);
    snprintf(what, sizeof what, "linear dinp += %s", tag);
    cmp(what, h = dl(gdx, ni), cdx, ni, TOL);
    free(h);
    snprintf(what, sizeof what, "linear dinp = %s", tag);
    cmp(what, h = dl(gdx2, ni), cdx2, ni, TOL);
    free(h);
    snprintf(what, sizeof what, "linear dweight += %s", tag);
    cmp(what, h = dl(gdw, nw), cdw, nw, TOL);
    free(h);
    snprintf(what, sizeof what, "linear dbias += %s", tag);
    cmp(what, h = dl(gdb, OUT), cdb, OUT, TOL);
    free(h);
    free(x);
    free(w);
    free(b);
    free(dy);
    free(dx0);
    free(dw0);
    free(db0);
    free(cy);
    free(cdx);
    free(cdw);
    free(cdb);
    free(cdx2);
    cuda_free(gx);
    cuda_free(gw);
    cuda_free(gb);
    cuda_free(gdy);
    cuda_free(gdx);
    cuda_free(gdw);
    cuda_free(gdb);
    cuda_free(gy);
    cuda_free(gdx2);
}

static void test_elementwise(void)
{
    size_t n = (size_t)irand(1, 100000);
    char what[200];
    float *a = frnd(n, -1, 1), *b = frnd(n, -1, 1), *h;
    float *ref = malloc(n * sizeof(float)), *ref2 = malloc(n * sizeof(float));
    if (ops_cpu.add_forward(cpu, ref, a, b, n))
        DIE("cpu add");
    float *ga = dup_dev(a, n), *gb = dup_dev(b, n), *go = nan_dev(n);
    if (ops_cuda.add_forward(gpu, go, ga, gb, n))
        DIE("cuda add");
    snprintf(what, sizeof what, "add n%zu", n);
    cmp(what, h = dl(go, n), ref, n, 0);
    free(h);
    /* acc: dst = src, then dst += src */
    memcpy(ref2, a, n * sizeof(float));
    if (ops_cpu.acc(cpu, ref2, 1, b, n))
        DIE("cpu acc");
    float *gd = nan_dev(n);
    if (ops_cuda.acc(gpu, gd, 0, ga, n) || ops_cuda.acc(gpu, gd, 1, gb, n))
        DIE("cuda acc");
    snprintf(what, sizeof what, "acc = then += n%zu", n);
    cmp(what, h = dl(gd, n), ref2, n, 0);
    free(h);
    /* dropout: p = 0 (identity) and p in (0, 1): same mask bits as the CPU */
    for (int t = 0; t < 2; t++) {
        float p = t ? frand(0.05f, 0.9f) : 0.0f;
        uint64_t seed = rnd();
        float *cm = malloc(n * sizeof(float)), *co = malloc(n * sizeof(float));
        float *dy = frnd(n, -1, 1), *cdx = malloc(n * sizeof(float));
        if (ops_cpu.dropout_forward(cpu, co, cm, a, n, p, seed) ||
            ops_cpu.dropout_backward(cpu, cdx, 0, dy, cm, n))
            DIE("cpu dropout");
        float *gm = nan_dev(n), *gout = nan_dev(n), *gdy = dup_dev(dy, n), *gdx = nan_dev(n);
        if (ops_cuda.dropout_forward(gpu, gout, gm, ga, n, p, seed) ||
            ops_cuda.dropout_backward(gpu, gdx, 0, gdy, gm, n))
            DIE("cuda dropout");
        snprintf(what, sizeof what, "dropout mask p=%.3f n%zu (bitwise)", p, n);
        cmp(what, h = dl(gm, n), cm, n, 0);
        free(h);
        snprintf(what, sizeof what, "dropout fwd p=%.3f", p);
        cmp(what, h = dl(gout, n), co, n, 0);
        free(h);
        snprintf(what, sizeof what, "dropout bwd p=%.3f", p);
        cmp(what, h = dl(gdx, n), cdx, n, 0);
        free(h);
        free(cm);
        free(co);
        free(dy);
        free(cdx);
        cuda_free(gm);
        cuda_free(gout);
        cuda_free(gdy);
        cuda_free(gdx);
    }
    /* layout: CUDA activations are plain NCHW; to_plain / from_plain copy or add */
    if (ops_cuda.act_block(64) != 1) {
        failures++;
        printf("FAIL act_block(64) = %d, expected 1 (plain NCHW)\n", ops_cuda.act_block(64));
    }
    int B = 2, C = 8, HW = (int)(n / 16 ? n / 16 : 1);
    size_t m = (size_t)B * C * HW;
    float *gp = nan_dev(m);
    if (ops_cuda.to_plain(gpu, gp, ga, B, C, HW) || ops_cuda.from_plain(gpu, gp, 1, gb, B, C, HW))
        DIE("cuda to_plain/from_plain");
    for (size_t i = 0; i < m; i++)
        ref2[i] = a[i] + b[i];
    snprintf(what, sizeof what, "to_plain then from_plain += n%zu", m);
    cmp(what, h = dl(gp, m), ref2, m, 0);
    free(h);
    free(a);
    free(b);
    free(ref);
    free(ref2);
    cuda_free(ga);
    cuda_free(gb);
    cuda_free(go);
    cuda_free(gd);
    cuda_free(gp);
}

static void test_errors(void)
{
    ops_conv_shape s;
    memset(&s, 0, sizeof s);
    s.B = 1;
    s.C = 6;
    s.H = 8;
    s.W = 8;
    s.OC = 4;
    s.K = 3;
    s.stride = 1;
    s.pad = 1;
    s.groups = 4;
    s.OH = 8;
    s.OW = 8;
    int rc = ops_cuda.conv_forward(gpu, NULL, NULL, NULL, &s);
    checks++;
    if (rc != -EINVAL) {
        failures++;
        printf("FAIL conv with groups 4 not dividing C 6: rc %d, expected -EINVAL\n", rc);
    } else {
        printf("ok   conv groups 4 / C 6 refused: %s\n", pf_errmsg());
    }
    rc = ops_cuda.dropout_forward(gpu, NULL, NULL, NULL, 4, 1.0f, 1);
    checks++;
    if (rc != -EINVAL) {
        failures++;
        printf("FAIL dropout p = 1: rc %d, expected -EINVAL\n", rc);
    } else {
        printf("ok   dropout p = 1 refused: %s\n", pf_errmsg());
    }
    rc = ops_cuda.bn_forward(gpu, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 8, 1, 1e-5f, 0.1f, 1);
    checks++;
    if (rc != -EINVAL) {
        failures++;
        printf("FAIL bn B = 0: rc %d, expected -EINVAL\n", rc);
    } else {
        printf("ok   bn B = 0 refused: %s\n", pf_errmsg());
    }
}

int main(void)
{
    if (cuda_device_count() == 0) {
        printf("SKIP: no CUDA device (the CUDA device library compiled and linked; CUDA vs CPU not run)\n");
        return 77;
    }
    uint64_t seed = test_seed();
    printf("seed %llu (PFCPS_TEST_SEED=%llu replays)\n", (unsigned long long)seed, (unsigned long long)seed);
    if (ops_cpu.ctx_create(&cpu) || ops_cuda.ctx_create(&gpu))
        DIE("context creation");
    for (int r = 0; r < 4; r++)
        test_conv();
    test_bn(0);
    test_bn(0);
    test_bn(1);
    /* the same with the exact (float64-sum) batch norm */
    ops_ctx *cudnn_ctx = gpu;
    setenv("PFCPS_CUDA_BN", "exact", 1);
    if (ops_cuda.ctx_create(&gpu))
        DIE("exact-BN context creation");
    unsetenv("PFCPS_CUDA_BN");
    printf("-- PFCPS_CUDA_BN=exact --\n");
    test_bn(0);
    test_bn(0);
    ops_cuda.ctx_destroy(gpu);
    gpu = cudnn_ctx;
    test_prelu();
    test_prelu();
    test_linear(1);
    test_linear(0);
    test_elementwise();
    test_errors();
    ops_cuda.ctx_destroy(gpu);
    ops_cpu.ctx_destroy(cpu);
    printf("%d of %d checks failed\n", failures, checks);
    return failures ? 1 : 0;
}
