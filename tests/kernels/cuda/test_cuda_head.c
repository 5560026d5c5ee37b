/* CUDA head kernels against $PFCPS_REFERENCE/head (float64 PyTorch) and the CPU optimizers:
 *  - margin-softmax head, every head_* case: loss, logits, grad_embeddings, grad_centers with
 *    relative error <= 1e-5 (outputs poisoned with NaN first, every element checked);
 *  - a label out of range -> -ERANGE naming the row;
 *  - SGD vs sgd_rows_* (rel <= 1e-6), AdamW vs the CPU device's loop (optim_cpu_adamw) on random
 *    data (rel <= 1e-6, three steps), gather / scatter / scatter-add of rows vs a host loop (exact),
 *    out-of-range index -> -ERANGE;
 *  - fp16 / bf16: known bit patterns and the round trip of random values within half an ulp;
 *  - loss-scaling unscale + non-finite check (exact scaling by 1/4, inf and NaN found);
 *  - pinned rows copied on a side stream, read by a default-stream kernel after the wait (exact).
 * Without a GPU: "SKIP: no CUDA device" and exit 77. */
#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "kernels/cuda/cuda_ops.h"
#include "tests/kernels/cuda/cuda_testutil.h"
#include "tests/kernels/cuda/head_refcase.h"
#include "tests/npy.h"
#include "tests/reference/ref.h"
#include "kernels/cpu/optim_cpu.h"

static void head_case(const char *dir, const char *name)
{
    head_refcase c;
    if (head_refcase_load(dir, name, &c))
        DIE("reference case %s", name);
    cuda_head_params p = c.p;
    int n = c.n, d = c.d, k = c.k;
    float *emb = c.emb, *cen = c.cen;
    int64_t *lab = c.lab;
    double *rlog = c.rlog, *rge = c.rge, *rgc = c.rgc;
    cuda_head_ws ws;
    if (cuda_head_ws_init(&ws, n, k, d))
        DIE("head workspace");
    float *gemb = dev_up(emb, (size_t)n * d * 4), *gcen = dev_up(cen, (size_t)k * d * 4);
    int64_t *glab = dev_up(lab, (size_t)n * 8);
    float *glog = nan_dev((size_t)n * k), *gge = nan_dev((size_t)n * d), *ggc = nan_dev((size_t)k * d);
    double loss = NAN;
    if (cuda_head_forward_backward(&p, &ws, gemb, n, gcen, k, glab, 0, &loss, glog, gge, ggc))
        DIE("%s: cuda head", name);
    float *hl = dl(glog, (size_t)n * k), *hge = dl(gge, (size_t)n * d), *hgc = dl(ggc, (size_t)k * d);
    double el = fabs(loss - c.rloss) / fabs(c.rloss);
    double elog = rel_l2_f64(hl, rlog, (size_t)n * k), ege = rel_l2_f64(hge, rge, (size_t)n * d),
           egc = rel_l2_f64(hgc, rgc, (size_t)k * d);
    check(el <= 1e-5 && elog <= 1e-5 && ege <= 1e-5 && egc <= 1e-5,
          "%-46s loss %.6f rel %.2e | logits %.2e | grad_emb %.2e | grad_cen %.2e", name, loss, el, elog, ege,
          egc);
    /* forward only, then a bad label */
    double loss2 = NAN;
    if (cuda_head_forward_backward(&p, &ws, gemb, n, gcen, k, glab, 0, &loss2, NULL, NULL, NULL))
        DIE("%s: forward only", name);
    check(loss2 == loss, "%s forward only: loss %.9f (same as with backward)", name, loss2);
    int64_t *bad = malloc((size_t)n * 8);
    memcpy(bad, lab, (size_t)n * 8);
    bad[n - 1] = k;
    if (cuda_h2d(glab, bad, (size_t)n * 8))
        DIE("upload");
    int rc = cuda_head_forward_backward(&p, &ws, gemb, n, gcen, k, glab, 0, &loss2, NULL, gge, NULL);
    check(rc == -ERANGE && strstr(pf_errmsg(), "row") != NULL, "%s label %d on row %d: rc %d (%s)", name, k,
          n - 1, rc, pf_errmsg());
    free(bad);
    cuda_head_ws_free(&ws);
    cuda_free(gemb);
    cuda_free(gcen);
    cuda_free(glab);
    cuda_free(glog);
    cuda_free(gge);
    cuda_free(ggc);
    head_refcase_free(&c);
    free(hl);
    free(hge);
    free(hgc);
}

static void sgd_case(const char *dir, const char *name)
{
    char path[1600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *meta = npy_read_text(path, "meta.json");
    if (!meta)
        DIE("%s: meta.json", path);
    float lr = (float)npy_json_number(meta, "lr", NAN), mom = (float)npy_json_number(meta, "momentum", NAN);
    float wd = (float)npy_json_number(meta, "weight_decay", NAN);
    free(meta);
    npy_array w, g, m, mo, wo;
    if (npy_load2(path, "weight.npy", &w) || npy_load2(path, "grad.npy", &g) ||
        npy_load2(path, "momentum.npy", &m) || npy_load2(path, "momentum_out.npy", &mo) ||
        npy_load2(path, "weight_out.npy", &wo))
        DIE("%s", path);
    size_t n = w.count;
    float *hw = npy_to_f32(&w), *hg = npy_to_f32(&g), *hm = npy_to_f32(&m);
    double *rmo = npy_to_f64(&mo), *rwo = npy_to_f64(&wo);
    float *dw = dev_up(hw, n * 4), *dg = dev_up(hg, n * 4), *dm = dev_up(hm, n * 4);
    if (cuda_sgd_step(dw, dg, dm, n, lr, mom, wd))
        DIE("cuda sgd");
    float *ow = dl(dw, n), *om = dl(dm, n);
    double ew = rel_l2_f64(ow, rwo, n), em = rel_l2_f64(om, rmo, n);
    check(ew <= 1e-6 && em <= 1e-6, "sgd %-20s weight rel %.2e momentum rel %.2e", name, ew, em);
    cuda_free(dw);
    cuda_free(dg);
    cuda_free(dm);
    free(hw);
    free(hg);
    free(hm);
    free(rmo);
    free(rwo);
    free(ow);
    free(om);
    npy_free(&w);
    npy_free(&g);
    npy_free(&m);
    npy_free(&mo);
    npy_free(&wo);
}

static void adamw_case(void)
{
    size_t n = 1000 + rnd() % 5000;
    float *w = malloc(n * 4), *m = calloc(n, 4), *v = calloc(n, 4), *g = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        w[i] = frand(-1, 1);
    const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.05; /* PyTorch's betas and eps */
    float *dw = dev_up(w, n * 4), *dm = dev_up(m, n * 4), *dv = dev_up(v, n * 4), *dg = nan_dev(n);
    for (int step = 1; step <= 3; step++) {
        for (size_t i = 0; i < n; i++)
            g[i] = frand(-1, 1);
        if (cuda_h2d(dg, g, n * 4))
            DIE("upload");
        optim_cpu_adamw(w, g, m, v, n, lr, b1, b2, eps, wd, step);
        if (cuda_adamw_step(dw, dg, dm, dv, n, lr, b1, b2, eps, wd, step))
            DIE("cuda adamw");
    }
    float *ow = dl(dw, n), *om = dl(dm, n), *ov = dl(dv, n);
    double ew = rel_l2(ow, w, n), em = rel_l2(om, m, n), ev = rel_l2(ov, v, n);
    check(ew <= 1e-6 && em <= 1e-6 && ev <= 1e-6,
          "adamw n %zu, 3 steps vs optim_cpu_adamw: w %.2e m %.2e v %.2e", n, ew, em, ev);
    check(cuda_adamw_step(dw, dg, dm, dv, n, 0.1, 0.9, 0.999, 1e-8, 0, 0) == -EINVAL,
          "adamw step 0 refused: %s", pf_errmsg());
    cuda_free(dw);
    cuda_free(dm);
    cuda_free(dv);
    cuda_free(dg);
    free(w);
    free(m);
    free(v);
    free(g);
    free(ow);
    free(om);
    free(ov);
}

static void rows_case(void)
{
    int R = 50 + (int)(rnd() % 200), d = 1 + (int)(rnd() % 130), k = 1 + (int)(rnd() % 40);
    float *table = malloc((size_t)R * d * 4), *rows = malloc((size_t)k * d * 4);
    int64_t *idx = malloc((size_t)k * 8);
    for (size_t i = 0; i < (size_t)R * d; i++)
        table[i] = frand(-1, 1);
    for (size_t i = 0; i < (size_t)k * d; i++)
        rows[i] = frand(-1, 1);
    for (int i = 0; i < k; i++)
        idx[i] = (int64_t)(rnd() % (uint64_t)R);
    float *dt = dev_up(table, (size_t)R * d * 4), *dr = dev_up(rows, (size_t)k * d * 4);
    int64_t *di = dev_up(idx, (size_t)k * 8);
    float *dout = nan_dev((size_t)k * d);
    if (cuda_gather_rows(dout, dt, R, di, k, d))
        DIE("gather");
    float *o = dl(dout, (size_t)k * d);
    int same = 1;
    for (int i = 0; i < k; i++)
        for (int j = 0; j < d; j++)
            same &= o[(size_t)i * d + j] == table[(size_t)idx[i] * d + j];
    check(same, "gather %d rows of %d from a %d-row table: exact", k, d, R);
    /* scatter-add (duplicates summed: order of the float adds may differ -> 1e-6) */
    double *ref = malloc((size_t)R * d * sizeof(double));
    for (size_t i = 0; i < (size_t)R * d; i++)
        ref[i] = table[i];
    for (int i = 0; i < k; i++)
        for (int j = 0; j < d; j++)
            ref[(size_t)idx[i] * d + j] += rows[(size_t)i * d + j];
    if (cuda_scatter_rows(dt, R, dr, di, k, d, 1))
        DIE("scatter add");
    float *ot = dl(dt, (size_t)R * d);
    double e = rel_l2_f64(ot, ref, (size_t)R * d);
    check(e <= 1e-6, "scatter-add %d rows: rel %.2e vs float64 host sum", k, e);
    /* scatter (assignment) of distinct indices */
    for (int i = 0; i < k; i++)
        idx[i] = (int64_t)((i * 7919) % R);
    int distinct = k <= R;
    if (cuda_h2d(di, idx, (size_t)k * 8) || cuda_h2d(dt, table, (size_t)R * d * 4))
        DIE("upload");
    if (distinct && cuda_scatter_rows(dt, R, dr, di, k, d, 0))
        DIE("scatter");
    free(ot);
    ot = dl(dt, (size_t)R * d);
    same = 1;
    for (int i = 0; i < k; i++)
        for (int j = 0; j < d; j++)
            same &= ot[(size_t)idx[i] * d + j] == rows[(size_t)i * d + j];
    check(same, "scatter %d rows into a %d-row table: exact", k, R);
    idx[k - 1] = R;
    if (cuda_h2d(di, idx, (size_t)k * 8))
        DIE("upload");
    int rc = cuda_gather_rows(dout, dt, R, di, k, d);
    check(rc == -ERANGE, "gather with index %d >= %d rows: rc %d (%s)", R, R, rc, pf_errmsg());
    rc = cuda_scatter_rows(dt, R, dr, di, k, d, 1);
    check(rc == -ERANGE, "scatter with index %d >= %d rows: rc %d (%s)", R, R, rc, pf_errmsg());
    cuda_free(dt);
    cuda_free(dr);
    cuda_free(di);
    cuda_free(dout);
    free(table);
    free(rows);
    free(idx);
    free(o);
    free(ref);
    free(ot);
}

static void convert_case(void)
{
    /* known encodings (IEEE binary16 / bfloat16, round to nearest even) */
    const float in[] = {1.0f, -2.0f, 65504.0f, 65520.0f, 1.0f / 3.0f, 1e-8f, 0.0f, 5.9604645e-8f};
    const uint16_t f16[] = {0x3C00, 0xC000, 0x7BFF, 0x7C00, 0x3555, 0x0000, 0x0000, 0x0001};
    const uint16_t bf16[] = {0x3F80, 0xC000, 0x4780, 0x4780, 0x3EAB, 0x322C, 0x0000, 0x3380};
    size_t n = sizeof in / sizeof *in;
    float *din = dev_up(in, sizeof in);
    uint16_t *dh, hh[8], hb[8];
    if (cuda_malloc((void **)&dh, n * 2))
        DIE("alloc");
    if (cuda_f32_to_f16(dh, din, n) || cuda_sync() || cuda_d2h(hh, dh, n * 2) ||
        cuda_f32_to_bf16(dh, din, n) || cuda_sync() || cuda_d2h(hb, dh, n * 2))
        DIE("convert");
    int ok16 = 1, okb = 1;
    for (size_t i = 0; i < n; i++) {
        if (hh[i] != f16[i]) {
            ok16 = 0;
            printf("     f16(%g) = 0x%04x, expected 0x%04x\n", (double)in[i], hh[i], f16[i]);
        }
        if (hb[i] != bf16[i]) {
            okb = 0;
            printf("     bf16(%g) = 0x%04x, expected 0x%04x\n", (double)in[i], hb[i], bf16[i]);
        }
    }
    check(ok16, "fp32 -> fp16 of %zu known values", n);
    check(okb, "fp32 -> bf16 of %zu known values", n);
    /* round trip of random normal-range values: |x - rt(x)| <= half an ulp (2^-11 / 2^-8 relative) */
    size_t m = 4096;
    float *x = malloc(m * 4);
    for (size_t i = 0; i < m; i++)
        x[i] = frand(-1000, 1000);
    float *dx = dev_up(x, m * 4), *dy = nan_dev(m);
    uint16_t *dm;
    if (cuda_malloc((void **)&dm, m * 2))
        DIE("alloc");
    for (int b = 0; b < 2; b++) {
        int rc = b ? (cuda_f32_to_bf16(dm, dx, m) || cuda_bf16_to_f32(dy, dm, m))
                   : (cuda_f32_to_f16(dm, dx, m) || cuda_f16_to_f32(dy, dm, m));
        if (rc)
            DIE("round trip");
        float *y = dl(dy, m);
        double worst = 0, half_ulp = b ? 0x1p-8 : 0x1p-11;
        for (size_t i = 0; i < m; i++) {
            double r = fabs((double)y[i] - x[i]) / fmax(fabs(x[i]), 6.2e-5);
            if (isnan(y[i]) || r > worst)
                worst = isnan(y[i]) ? INFINITY : r;
        }
        check(worst <= half_ulp, "%s round trip of %zu values in [-1000, 1000]: worst rel %.3e <= %.3e",
              b ? "bf16" : "fp16", m, worst, half_ulp);
        free(y);
    }
    cuda_free(din);
    cuda_free(dh);
    cuda_free(dx);
    cuda_free(dy);
    cuda_free(dm);
    free(x);
}

/* cuda_unscale_check: grads times 1/scale (powers of two: exact), found_inf iff a non-finite value. */
static void unscale_case(void)
{
    size_t n = 10000 + rnd() % 1000;
    float *g = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        g[i] = frand(-1000, 1000);
    float *dg = dev_up(g, n * 4);
    int found = -1;
    if (cuda_unscale_check(dg, n, 0.25f, &found))
        DIE("unscale");
    float *o = dl(dg, n);
    int exact = 1;
    for (size_t i = 0; i < n; i++)
        exact &= o[i] == g[i] * 0.25f;
    check(found == 0 && exact, "unscale_check of %zu finite grads by 1/4: found_inf %d, all exact %d", n,
          found, exact);
    size_t bad = rnd() % n;
    g[bad] = INFINITY;
    if (cuda_h2d(dg, g, n * 4) || cuda_unscale_check(dg, n, 0.25f, &found))
        DIE("unscale");
    check(found == 1, "unscale_check with inf at %zu: found_inf %d", bad, found);
    g[bad] = NAN;
    if (cuda_h2d(dg, g, n * 4) || cuda_unscale_check(dg, n, 0.25f, &found))
        DIE("unscale");
    check(found == 1, "unscale_check with NaN at %zu: found_inf %d", bad, found);
    cuda_free(dg);
    free(g);
    free(o);
}

/* Pinned rows copied on a side stream; a default-stream kernel ordered after them reads them. */
static void side_stream_case(void)
{
    size_t n = 1 << 20;
    float *pin, *d, *d2;
    void *side;
    if (cuda_host_pinned_alloc((void **)&pin, n * 4) || cuda_side_stream_create(&side) ||
        cuda_malloc((void **)&d, n * 4) || cuda_malloc((void **)&d2, n * 4))
        DIE("pinned / side stream setup");
    for (size_t i = 0; i < n; i++)
        pin[i] = frand(-1, 1);
    if (cuda_fill_f32(d, NAN, n) || cuda_fill_f32(d2, NAN, n) || cuda_sync() ||
        cuda_h2d_async(d, pin, n * 4, side) || cuda_default_stream_wait(side))
        DIE("side stream copy");
    float *o = NULL;
    int64_t *idx = malloc(sizeof *idx);
    idx[0] = 0;
    int64_t *didx = dev_up(idx, sizeof *idx);
    /* gather row 0 of a 1-row table of n floats: runs on the default stream after the wait */
    if (cuda_gather_rows(d2, d, 1, didx, 1, (int)n))
        DIE("gather after side stream");
    o = dl(d2, n);
    int same = 1;
    for (size_t i = 0; i < n; i++)
        same &= o[i] == pin[i];
    check(same,
          "pinned rows via side stream, read on the default stream after cuda_default_stream_wait: exact");
    free(o);
    free(idx);
    cuda_free(didx);
    cuda_free(d);
    cuda_free(d2);
    cuda_side_stream_destroy(side);
    cuda_host_pinned_free(pin);
}

int main(void)
{
    if (cuda_device_count() == 0) {
        printf("SKIP: no CUDA device (the CUDA head kernels compiled and linked; not run)\n");
        return 77;
    }
    char dir[1200];
    int missing = ref_dir(dir, sizeof dir, "head");
    if (missing)
        return missing;
    uint64_t seed = test_seed();
    printf("seed %llu\n", (unsigned long long)seed);
    DIR *dp = opendir(dir);
    if (!dp) {
        printf("FAIL: cannot open %s\n", dir);
        return 1;
    }
    struct dirent *de;
    int nhead = 0, nsgd = 0;
    while ((de = readdir(dp))) {
        if (!strncmp(de->d_name, "head_", 5)) {
            head_case(dir, de->d_name);
            nhead++;
        } else if (!strncmp(de->d_name, "sgd_rows_", 9)) {
            sgd_case(dir, de->d_name);
            nsgd++;
        }
    }
    closedir(dp);
    check(nhead >= 24 && nsgd >= 2, "reference cases found: %d head, %d sgd", nhead, nsgd);
    adamw_case();
    rows_case();
    convert_case();
    unscale_case();
    side_stream_case();
    printf("%d of %d checks failed\n", failures, checks);
    return failures ? 1 : 0;
}
