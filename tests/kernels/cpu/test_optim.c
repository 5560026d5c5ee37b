/* The CPU device's optimizer and gradient entries (kernels/ops.h sgd_step, adamw_step, sumsq, scale; their
 * loops are kernels/cpu/optim_cpu.c, which the CUDA kernels are tested against bit for bit): SGD against
 * $PFCPS_REFERENCE/head/sgd_rows_* (PyTorch float64) and by hand; AdamW against the update written here in
 * float64 from the paper / torch docs, by hand, and step 0 refused; sumsq and scale as the training loop's
 * clip_grad_norm_(5) uses them, against values computed by hand, and a non-finite sum. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "tests/npy.h"
#include "kernels/ops.h"
#include "tests/reference/ref.h"

#include "tests/check.h"

static ops_ctx *ctx; /* the CPU device's context: its optimizer entries run on host memory */

/* One SGD step through the CPU device (torch.optim.SGD: d = g + wd w; mom = mu mom + d; w -= lr mom). */
static void sgd(float *w, const float *g, float *mom, size_t n, float lr, float mu, float wd)
{
    CHECK(ops_cpu.sgd_step(ctx, w, g, mom, n, lr, mu, wd) == 0, "sgd_step: %s", pf_errmsg());
}

/* One AdamW step through the CPU device with PyTorch's betas (0.9, 0.999) and eps 1e-8. */
static int adamw(float *w, const float *g, float *m, float *v, size_t n, double lr, double wd, int64_t t)
{
    return ops_cpu.adamw_step(ctx, w, g, m, v, n, lr, 0.9, 0.999, 1e-8, wd, t);
}

static int test_sgd_reference(void)
{
    char dir[1024], why[2048];
    DIR *dp = ref_locate(dir, sizeof dir, "head", why, sizeof why) ? NULL : opendir(dir);
    if (!dp) {
        fails += ref_part_missing(why);
        return -1;
    }
    struct dirent *de;
    int ncases = 0;
    while ((de = readdir(dp))) {
        if (strncmp(de->d_name, "sgd_rows_", 9) != 0)
            continue;
        char path[1600];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        char *meta = npy_read_text(path, "meta.json");
        npy_array w, g, m, wo, mo;
        if (!meta || npy_load2(path, "weight.npy", &w) || npy_load2(path, "grad.npy", &g) ||
            npy_load2(path, "momentum.npy", &m) || npy_load2(path, "weight_out.npy", &wo) ||
            npy_load2(path, "momentum_out.npy", &mo)) {
            CHECK(0, "%s: cannot load: %s", path, pf_errmsg());
            free(meta);
            continue;
        }
        double lr = npy_json_number(meta, "lr", NAN), mu = npy_json_number(meta, "momentum", NAN),
               wd = npy_json_number(meta, "weight_decay", NAN);
        float *wf = npy_to_f32(&w), *gf = npy_to_f32(&g), *mf = npy_to_f32(&m);
        double *wod = npy_to_f64(&wo), *mod = npy_to_f64(&mo);
        sgd(wf, gf, mf, w.count, (float)lr, (float)mu, (float)wd);
        double ew = rel_err_f32_f64(wf, wod, w.count), em = rel_err_f32_f64(mf, mod, m.count);
        int ok = ew <= 1e-6 && em <= 1e-6;
        printf("%s %s (lr %g, momentum %g, wd %g): weight rel %.2e (max abs %.2e), momentum rel %.2e (max "
               "abs %.2e)\n",
               ok ? "ok  " : "FAIL", de->d_name, lr, mu, wd, ew, max_abs_err_f32_f64(wf, wod, w.count), em,
               max_abs_err_f32_f64(mf, mod, m.count));
        fails += !ok;
        ncases++;
        free(wf);
        free(gf);
        free(mf);
        free(wod);
        free(mod);
        free(meta);
        npy_free(&w);
        npy_free(&g);
        npy_free(&m);
        npy_free(&wo);
        npy_free(&mo);
    }
    closedir(dp);
    return ncases;
}

/* SGD by hand: w = 1, g = 0.5, wd = 0.1, mu = 0.9, lr = 0.1, mom = 0:
 * step 1: d = 0.5 + 0.1 = 0.6, mom = 0.6, w = 1 - 0.06 = 0.94
 * step 2: d = 0.5 + 0.094 = 0.594, mom = 0.54 + 0.594 = 1.134, w = 0.94 - 0.1134 = 0.8266
 * momentum 0: w = 1 - 0.1 * 0.6 = 0.94 and mom untouched. */
static void test_sgd_hand(void)
{
    float w = 1.0f, g = 0.5f, m = 0.0f;
    sgd(&w, &g, &m, 1, 0.1f, 0.9f, 0.1f);
    CHECK(fabs(w - 0.94) < 1e-6 && fabs(m - 0.6) < 1e-6, "sgd step 1: w %.8f m %.8f", w, m);
    sgd(&w, &g, &m, 1, 0.1f, 0.9f, 0.1f);
    CHECK(fabs(w - 0.8266) < 1e-6 && fabs(m - 1.134) < 1e-6, "sgd step 2: w %.8f m %.8f", w, m);
    float w0 = 1.0f, m0 = 7.0f;
    sgd(&w0, &g, &m0, 1, 0.1f, 0.0f, 0.1f);
    CHECK(fabs(w0 - 0.94) < 1e-6 && m0 == 7.0f, "sgd no momentum: w %.8f m %.8f", w0, m0);
    printf("ok   SGD by hand: w after 2 steps %.7f (expected 0.8266), momentum %.7f (expected 1.134)\n", w,
           m);
}

/* AdamW in float64, written from torch.optim.AdamW's documented algorithm. */
static void adamw_f64(double *w, const double *g, double *m, double *v, int n, double lr, double b1,
                      double b2, double eps, double wd, int t)
{
    for (int i = 0; i < n; i++) {
        w[i] = w[i] - lr * wd * w[i];
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
        double mhat = m[i] / (1 - pow(b1, t)), vhat = v[i] / (1 - pow(b2, t));
        w[i] = w[i] - lr * mhat / (sqrt(vhat) + eps);
    }
}

static void test_adamw(void)
{
    enum { N = 6, STEPS = 5 };
    float w[N], m[N] = {0}, v[N] = {0};
    double wd[N], md[N] = {0}, vd[N] = {0};
    for (int i = 0; i < N; i++)
        w[i] = (float)(0.3 * (i - 2.5)), wd[i] = w[i];
    const double lr = 0.01, decay = 0.05;
    double worst = 0;
    for (int t = 1; t <= STEPS; t++) {
        float g[N];
        double gd[N];
        for (int i = 0; i < N; i++)
            g[i] = (float)(sin(1.3 * i + 0.7 * t) * (i + 1) * 0.1), gd[i] = g[i];
        CHECK(adamw(w, g, m, v, N, lr, decay, t) == 0, "adamw step %d", t);
        adamw_f64(wd, gd, md, vd, N, lr, 0.9, 0.999, 1e-8, decay, t);
        double e = rel_err_f32_f64(w, wd, N);
        if (e > worst)
            worst = e;
    }
    CHECK(worst <= 2e-7, "adamw: rel err %.2e vs float64", worst);
    /* Step 1 by hand for one parameter: w=1, g=0.2, lr=0.1, wd=0.01: w = 1 - 0.001 = 0.999; mhat = 0.2,
     * vhat = 0.04, w = 0.999 - 0.1 * 0.2 / (0.2 + 1e-8) = 0.899000005 */
    float w1 = 1.0f, g1 = 0.2f, m1 = 0, v1 = 0;
    CHECK(adamw(&w1, &g1, &m1, &v1, 1, 0.1, 0.01, 1) == 0, "adamw hand step: %s", pf_errmsg());
    CHECK(fabs(w1 - 0.899000005) < 2e-7, "adamw hand step: %.9f", w1);
    CHECK(adamw(&w1, &g1, &m1, &v1, 1, 0.1, 0.01, 0) == -EINVAL, "adamw step 0 accepted");
    printf("%s AdamW: %d steps rel err vs float64 %.2e; hand step w %.7f (expected 0.8990000)\n",
           worst <= 2e-7 ? "ok  " : "FAIL", STEPS, worst, w1);
}

/* clip_grad_norm_(max_norm) as the training loop runs it on a device: the norm is sqrt(sumsq) over the flat
 * gradient array, and scale multiplies by max_norm / (norm + 1e-6) when that is below 1. */
static double clip(float *g, size_t n, double max_norm)
{
    double ss = NAN;
    CHECK(ops_cpu.sumsq(ctx, g, n, &ss) == 0, "sumsq: %s", pf_errmsg());
    double total = sqrt(ss), coef = max_norm / (total + 1e-6);
    if (isfinite(total) && coef < 1.0)
        CHECK(ops_cpu.scale(ctx, g, n, (float)coef) == 0, "scale: %s", pf_errmsg());
    return total;
}

static void test_clip(void)
{
    float g[2] = {30.0f, 40.0f};
    double tn = clip(g, 2, 5.0);
    /* coef = 5 / (50 + 1e-6) */
    double c = 5.0 / (50.0 + 1e-6);
    CHECK(tn == 50.0 && fabs(g[0] - 30 * c) < 1e-6 && fabs(g[1] - 40 * c) < 1e-6,
          "clip: total %g g %.8f %.8f", tn, g[0], g[1]);
    float h[2] = {0.3f, 0.4f};
    tn = clip(h, 2, 5.0);
    CHECK(fabs(tn - 0.5) < 1e-7 && h[0] == 0.3f && h[1] == 0.4f, "no clip below max: %g %g", h[0], h[1]);
    float bad[3] = {1.0f, INFINITY, 2.0f};
    double ss = 0;
    CHECK(ops_cpu.sumsq(ctx, bad, 3, &ss) == 0 && isinf(ss), "sumsq of an inf: %g", ss);
    printf(
        "ok   clip_grad_norm_ through sumsq / scale: |(30,40)| = %g -> (%.6f, %.6f); sumsq with an inf %g\n",
        50.0, g[0], g[1], ss);
}

int main(void)
{
    if (ops_cpu.ctx_create(&ctx) < 0) {
        printf("FAIL: CPU device context: %s\n", pf_errmsg());
        return 1;
    }
    int n = test_sgd_reference();
    if (n == 0)
        fails += ref_part_missing("no sgd_rows_* case in the reference folder (PFCPS_REFERENCE)");
    test_sgd_hand();
    test_adamw();
    test_clip();
    ops_cpu.ctx_destroy(ctx);
    printf("%s (%d failures)\n", fails ? "FAIL" : "PASS", fails);
    return fails ? 1 : 0;
}
