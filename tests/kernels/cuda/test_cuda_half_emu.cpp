// The own kernels of the mixed-precision CUDA devices (kernels/cuda/ops_cuda_half_kernels.cuh: PReLU,
// the float64 batch norm that cuda-bf16 always uses, add / acc, layout and weight conversions) run on
// the CPU through tests/kernels/cuda/cuda_emu.h (blocks of 256 fibers, the wrappers' launch shapes) with a
// software bf16 element type, against the CPU device: no GPU needed, so this runs in CI. Not covered
// here: the cuDNN calls (convolutions, fp16 batch norm) and anything about real GPU concurrency.
// Fresh random shapes and inputs each run (seed printed; PFCPS_TEST_SEED replays).
//
// Bounds (u = 2^-8, bf16): elementwise kernels, PReLU outputs and input gradients compute in fp32
// exactly as ops_cpu does and round once: bit-identical to the test's rounding of ops_cpu's result.
// Batch norm computes in float64 and rounds once to bf16; ops_cpu rounds the same float64 value to
// fp32: |got - ref| <= u |ref| + 2^-22 (|ref| + |added|). Batch statistics (float64, another order)
// <= 1e-12 relative, running statistics and BN parameter gradients (fp32 results of float64 sums)
// and dalpha (fp32 sums in another order) <= 1e-5 relative.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/kernels/cuda/cuda_emu.h"

extern "C" {
#include "common/err.h"
#include "kernels/ops.h"
}

/* ---- a software bf16 for the kernels (independent of the device's intrinsics) ---- */
struct ebf {
    uint16_t v;
};

static double rnd_bf(double x) /* nearest even, 8 significant bits (normal range) */
{
    if (x == 0.0 || !isfinite(x))
        return x;
    int e;
    double m = frexp(x, &e);
    return ldexp(nearbyint(ldexp(m, 8)), e - 8);
}

static ebf enc(double x)
{
    float f = (float)rnd_bf(x); /* exactly representable: the conversion is exact */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if (isnan(f))
        return ebf{0x7fc0};
    return ebf{(uint16_t)(u >> 16)};
}

static float dec(ebf h)
{
    uint32_t u = (uint32_t)h.v << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

template <typename T> struct elt;
template <> struct elt<ebf> {
    static float f(ebf h)
    {
        return dec(h);
    }
    static ebf r(float v)
    {
        return enc(v);
    }
    static ebf rd(double v)
    {
        return enc(v);
    }
};

static inline float atomicAdd(float *p, float v) /* blocks run one at a time */
{
    float o = *p;
    *p = o + v;
    return o;
}

#include "kernels/cuda/ops_cuda_half_kernels.cuh"
#include "tests/check.h"

/* 2-D grid launcher (cuda_emu.h's emu_launch is 1-D). */
template <class F> static void launch2(unsigned gx, unsigned gy, unsigned block, F kernel)
{
    emu::body = kernel;
    gridDim = {gx, gy, 1};
    blockDim = {block, 1, 1};
    for (unsigned y = 0; y < gy; y++)
        for (unsigned x = 0; x < gx; x++) {
            blockIdx = {x, y, 0};
            emu::run_block(block);
        }
}

static unsigned grid_for(size_t n) /* the wrappers' (kernels/cuda/cuda_check.h) */
{
    size_t g = (n + 255) / 256;
    if (g > 65535u * 8u)
        g = 65535u * 8u;
    return g ? (unsigned)g : 1u;
}

/* n values drawn in [lo, hi) and rounded to bf16: the float copy and the bf16 array. */
static std::vector<float> vals(size_t n, float lo, float hi, std::vector<ebf> *h = nullptr)
{
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++)
        v[i] = (float)rnd_bf(frand(lo, hi));
    if (h) {
        h->resize(n);
        for (size_t i = 0; i < n; i++)
            (*h)[i] = enc(v[i]);
    }
    return v;
}

static void report(const char *what, size_t n, size_t bad, double worst, const char *how)
{
    checks++;
    if (bad)
        failures++;
    printf("%-4s %-44s n %-7zu %s %.3e%s\n", bad ? "FAIL" : "ok", what, n, how, worst,
           bad ? "  (elements outside the bound)" : "");
}

/* got == round(ref) bit for bit */
static void exact(const char *what, const std::vector<ebf> &got, const std::vector<float> &ref)
{
    size_t bad = 0;
    for (size_t i = 0; i < ref.size(); i++)
        bad += got[i].v != enc(ref[i]).v;
    report(what, ref.size(), bad, (double)bad, "differing elements");
}

/* |got - ref| <= u |ref| + 2^-22 (|ref| + |add|), add may be empty */
static void near_bf(const char *what, const std::vector<ebf> &got, const std::vector<float> &ref,
                    const std::vector<float> &add)
{
    size_t bad = 0;
    double worst = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        double g = dec(got[i]), r = ref[i], a = add.empty() ? 0.0 : fabs((double)add[i]);
        double b = 0x1.0p-8 * fabs(r) + 0x1.0p-22 * (fabs(r) + a) + 1e-37;
        double q = fabs(g - r) / b;
        if (!(q <= 1.0))
            bad++;
        if (q > worst || isnan(q))
            worst = isnan(q) ? INFINITY : q;
    }
    report(what, ref.size(), bad, worst, "worst err/bound");
}

template <typename A, typename B>
static void rel(const char *what, const A *got, const B *ref, size_t n, double tol)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
    }
    double r = den > 0 ? sqrt(num / den) : sqrt(num);
    size_t bad = !(r <= tol);
    report(what, n, bad, r, "relative");
}

static ops_ctx *cpu;

/* ops_cpu on plain NCHW host arrays (its activation layout may be blocked) */
static std::vector<float> to_lay(const std::vector<float> &p, int B, int C, int HW)
{
    std::vector<float> l(p.size());
    if (ops_cpu.from_plain(cpu, l.data(), 0, p.data(), B, C, HW))
        DIE("from_plain");
    return l;
}

static std::vector<float> to_nchw(const std::vector<float> &l, int B, int C, int HW)
{
    std::vector<float> p(l.size());
    if (ops_cpu.to_plain(cpu, p.data(), l.data(), B, C, HW))
        DIE("to_plain");
    return p;
}

static void test_prelu()
{
    int B = irand(1, 4), C = irand(1, 24), HW = irand(1, 150);
    size_t n = (size_t)B * C * HW;
    printf("prelu B=%d C=%d HW=%d\n", B, C, HW);
    std::vector<ebf> xh, dyh, d0h;
    std::vector<float> x = vals(n, -1, 1, &xh), dy = vals(n, -1, 1, &dyh), d0 = vals(n, -1, 1, &d0h);
    std::vector<float> al(C), da0(C);
    for (int c = 0; c < C; c++) {
        al[c] = frand(0.1f, 0.4f);
        da0[c] = frand(-1, 1);
    }
    std::vector<ebf> y(n, ebf{0x7fc0});
    launch2(grid_for(n), 1, 256, [&] { prelu_fwd_k<ebf>(y.data(), xh.data(), al.data(), C, HW, n); });
    std::vector<float> cy(n), cdx = to_lay(d0, B, C, HW), cda = da0, lx = to_lay(x, B, C, HW),
                              ldy = to_lay(dy, B, C, HW);
    if (ops_cpu.prelu_forward(cpu, cy.data(), lx.data(), al.data(), B, C, HW) ||
        ops_cpu.prelu_backward(cpu, cdx.data(), 1, cda.data(), ldy.data(), lx.data(), al.data(), B, C, HW))
        DIE("cpu prelu");
    exact("prelu fwd", y, to_nchw(cy, B, C, HW));
    std::vector<float> da = da0;
    launch2(grid_for(n), 1, 256,
            [&] { prelu_bwd_dinp_k<ebf>(d0h.data(), 1, dyh.data(), xh.data(), al.data(), C, HW, n); });
    launch2((unsigned)C, (unsigned)(B < 32 ? B : 32), 256,
            [&] { prelu_bwd_dalpha_k<ebf>(da.data(), dyh.data(), xh.data(), B, C, HW); });
    exact("prelu dinp += (fp32 sum, one rounding)", d0h, to_nchw(cdx, B, C, HW));
    rel("prelu dalpha +=", da.data(), cda.data(), (size_t)C, 1e-5);
}

static void test_bn()
{
    int B = irand(1, 5), C = irand(1, 20), HW = irand(1, 12) * irand(1, 12);
    size_t n = (size_t)B * C * HW;
    int S = B < BN_SPLIT ? B : BN_SPLIT;
    double eps = (double)1e-5f, mom = (double)0.1f, cnt = (double)B * HW; /* as the wrappers pass them */
    printf("batchnorm B=%d C=%d HW=%d (grid %d x %d)\n", B, C, HW, C, S);
    std::vector<ebf> xh, dyh, d0h;
    std::vector<float> x = vals(n, -1, 2, &xh), dy = vals(n, -1, 1, &dyh), d0 = vals(n, -1, 1, &d0h);
    std::vector<float> w(C), bi(C), rm0(C), rv0(C), dw0(C), db0(C);
    for (int c = 0; c < C; c++) {
        w[c] = frand(0.5f, 1.5f);
        bi[c] = frand(-0.5f, 0.5f);
        rm0[c] = frand(-0.1f, 0.1f);
        rv0[c] = frand(0.5f, 1.5f);
        dw0[c] = frand(-1, 1);
        db0[c] = frand(-1, 1);
    }
    /* kernels, in the order and shapes of hbnx_forward / hbnx_backward */
    std::vector<double> part((size_t)C * (2 * S + 3)), sm(C), sv(C);
    std::vector<float> rm = rm0, rv = rv0, dw = dw0, db = db0;
    std::vector<ebf> y(n, ebf{0x7fc0}), ye(n, ebf{0x7fc0});
    launch2((unsigned)C, (unsigned)S, 256,
            [&] { bn_partial_k<ebf>(part.data(), NULL, xh.data(), NULL, NULL, B, C, HW); });
    launch2((unsigned)(C + 127) / 128, 1, 128,
            [&] { bn_finish_k(sm.data(), sv.data(), part.data(), C, S, cnt, 0, NULL, NULL, 0.0); });
    launch2((unsigned)C, (unsigned)S, 256,
            [&] { bn_partial_k<ebf>(part.data(), NULL, xh.data(), NULL, sm.data(), B, C, HW); });
    launch2((unsigned)(C + 127) / 128, 1, 128,
            [&] { bn_finish_k(sm.data(), sv.data(), part.data(), C, S, cnt, 1, rm.data(), rv.data(), mom); });
    launch2(grid_for(n), 1, 256, [&] {
        bn_apply_k<ebf>(y.data(), xh.data(), sm.data(), sv.data(), NULL, NULL, w.data(), bi.data(), C, HW, n,
                        eps);
    });
    launch2(grid_for(n), 1, 256, [&] {
        bn_apply_k<ebf>(ye.data(), xh.data(), NULL, NULL, rm0.data(), rv0.data(), w.data(), bi.data(), C, HW,
                        n, eps);
    });
    double *p1 = part.data(), *p2 = p1 + (size_t)C * S, *coef = p1 + (size_t)2 * C * S;
    launch2((unsigned)C, (unsigned)S, 256,
            [&] { bn_partial_k<ebf>(p1, p2, xh.data(), dyh.data(), sm.data(), B, C, HW); });
    launch2((unsigned)(C + 127) / 128, 1, 128, [&] {
        bn_bwd_finish_k(coef, dw.data(), db.data(), p1, p2, w.data(), sv.data(), C, S, cnt, eps);
    });
    launch2(grid_for(n), 1, 256,
            [&] { hbn_dx_k<ebf>(d0h.data(), 1, dyh.data(), xh.data(), coef, sm.data(), C, HW, n); });
    /* the CPU device on the same bf16 values */
    std::vector<float> lx = to_lay(x, B, C, HW), ldy = to_lay(dy, B, C, HW), cy(n), cye(n),
                       cdx = to_lay(d0, B, C, HW);
    std::vector<float> crm = rm0, crv = rv0, cdw = dw0, cdb = db0;
    std::vector<double> csm(C), csv(C);
    if (ops_cpu.bn_forward(cpu, cy.data(), csm.data(), csv.data(), lx.data(), w.data(), bi.data(), crm.data(),
                           crv.data(), B, C, HW, (float)eps, (float)mom, 1) ||
        ops_cpu.bn_forward(cpu, cye.data(), NULL, NULL, lx.data(), w.data(), bi.data(), rm0.data(),
                           rv0.data(), B, C, HW, (float)eps, (float)mom, 0) ||
        ops_cpu.bn_backward(cpu, cdx.data(), 1, cdw.data(), cdb.data(), ldy.data(), lx.data(), w.data(),
                            csm.data(), csv.data(), B, C, HW, (float)eps))
        DIE("cpu bn");
    rel("bn save_mean", sm.data(), csm.data(), (size_t)C, 1e-12);
    rel("bn save_var", sv.data(), csv.data(), (size_t)C, 1e-12);
    rel("bn running_mean", rm.data(), crm.data(), (size_t)C, 1e-5);
    rel("bn running_var", rv.data(), crv.data(), (size_t)C, 1e-5);
    near_bf("bn fwd train (float64, one rounding)", y, to_nchw(cy, B, C, HW), {});
    near_bf("bn fwd eval", ye, to_nchw(cye, B, C, HW), {});
    near_bf("bn dinp +=", d0h, to_nchw(cdx, B, C, HW), d0);
    rel("bn dweight +=", dw.data(), cdw.data(), (size_t)C, 1e-5);
    rel("bn dbias +=", db.data(), cdb.data(), (size_t)C, 1e-5);
    /* the cuDNN path's statistics conversion (fp16 device): float64 mean / biased variance -> fp32
     * mean / inverse std -> back; fp32 keeps ~1e-7 relative, the variance loses eps/var more */
    std::vector<float> fm(C), finv(C);
    std::vector<double> bm(C), bv(C);
    launch2((unsigned)(C + 255) / 256, 1, 256,
            [&] { bn_save_from_f64(fm.data(), finv.data(), sm.data(), sv.data(), C, eps); });
    launch2((unsigned)(C + 255) / 256, 1, 256,
            [&] { bn_save_to_f64(bm.data(), bv.data(), fm.data(), finv.data(), C, eps); });
    rel("bn saved statistics fp32 round trip (mean)", bm.data(), sm.data(), (size_t)C, 1e-6);
    rel("bn saved statistics fp32 round trip (var)", bv.data(), sv.data(), (size_t)C, 1e-5);
}

static void test_elementwise()
{
    size_t n = (size_t)irand(1, 5000);
    printf("elementwise n=%zu\n", n);
    std::vector<ebf> ah, bh;
    std::vector<float> a = vals(n, -3, 3, &ah), b = vals(n, -3, 3, &bh), s(n), want(n);
    for (size_t i = 0; i < n; i++)
        s[i] = frand(-3, 3);
    std::vector<ebf> o(n, ebf{0x7fc0});
    launch2(grid_for(n), 1, 256, [&] { add_k<ebf>(o.data(), ah.data(), bh.data(), n); });
    for (size_t i = 0; i < n; i++)
        want[i] = a[i] + b[i];
    exact("add", o, want);
    std::vector<ebf> c = ah;
    launch2(grid_for(n), 1, 256, [&] { acc_k<ebf>(c.data(), bh.data(), n); });
    exact("acc +=", c, want);
    std::vector<float> tp(n, NAN);
    launch2(grid_for(n), 1, 256, [&] { to_plain_k<ebf>(tp.data(), bh.data(), n); });
    rel("to_plain (exact)", tp.data(), b.data(), n, 0.0);
    std::vector<ebf> f(n, ebf{0x7fc0}), g = bh;
    launch2(grid_for(n), 1, 256, [&] { from_plain_k<ebf>(f.data(), 0, s.data(), n); });
    launch2(grid_for(n), 1, 256, [&] { from_plain_k<ebf>(g.data(), 1, s.data(), n); });
    exact("from_plain =", f, s);
    for (size_t i = 0; i < n; i++)
        want[i] = b[i] + s[i];
    exact("from_plain += (fp32 sum, one rounding)", g, want);
    /* the half weight copy and the half weight gradient added into fp32 */
    std::vector<ebf> wh(n, ebf{0x7fc0});
    launch2(grid_for(n), 1, 256, [&] { f32_to_h_k<ebf>(wh.data(), s.data(), n); });
    exact("f32_to_h (weight copy)", wh, s);
    std::vector<float> dw = s;
    launch2(grid_for(n), 1, 256, [&] { acc_h_into_f32_k<ebf>(dw.data(), bh.data(), n); });
    for (size_t i = 0; i < n; i++)
        want[i] = s[i] + b[i];
    rel("half weight gradient += into fp32 (exact)", dw.data(), want.data(), n, 0.0);
}

int main()
{
    test_seed_mixed();
    if (ops_cpu.ctx_create(&cpu))
        DIE("cpu ctx");
    for (int r = 0; r < 3; r++) {
        test_prelu();
        test_bn();
        test_elementwise();
    }
    ops_cpu.ctx_destroy(cpu);
    printf("%d checks, %d failure(s): %s (fiber switches %ld)\n", checks, failures,
           failures ? "FAIL" : "PASS", emu::switches);
    return failures ? 1 : 0;
}
