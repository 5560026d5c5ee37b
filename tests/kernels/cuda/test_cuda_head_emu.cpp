// The CUDA head kernels (kernels/cuda/head_kernels.cuh) run on the CPU through tests/kernels/cuda/cuda_emu.h
// (each block's threads as fibers; HEAD_THREADS 64 here: two warps, so the cross-warp reductions are
// exercised at a quarter of the cost), with the host sequence of cuda_head_dist restated below (ranks
// in lock step, collectives as coll_thread computes them: max / sum in rank order) and host cblas for
// the GEMMs cuBLAS does on the GPU. No GPU needed: this checks the kernels' index math, reductions and
// formulas; what only a GPU shows (launches, streams, memory kinds) is left to cuda_head / cuda_pfc.
//  1. every $PFCPS_REFERENCE/head case (float64 PyTorch): the fused single-process kernel
//     (head_row_k, cuda_head_forward_backward's) and cuda_head_dist's kernels over W = 1, 2, 3 ranks
//     (column j on rank j mod W; of the large N32_K1000 cases only arcface_exact, at W = 1 fused and
//     W = 3, to keep the test at a few seconds: each costs millions of fiber switches):
//     loss, logits, embedding gradients (summed over ranks), center gradients, relative <= 1e-5, the
//     same loss bits on every rank; outputs NaN-filled first so an element not written fails;
//  2. a label outside [-1, k) on one rank: the kernel's flag, summed, reaches every rank (row named);
//  3. interclass filtering (tau 0.2), clamp_loss, a row whose label is -1 everywhere, exact and
//     straight_through, global (W = 1 also through the fused kernel, W = 3) and local mode (W = 2, 3)
//     vs the CPU head (worker/head/head.c,
//     itself tested against the references) on random data (seed printed; PFCPS_TEST_SEED replays).
#include "tests/kernels/cuda/cuda_emu.h"

#define HEAD_THREADS 64

extern "C" {
#include <cblas.h>

#include "common/err.h"
#include "tests/npy.h"
#include "tests/reference/ref.h"
#include "worker/head/head.h"
}

#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/head_kernels.cuh"
#include "tests/kernels/cuda/head_refcase.h"
#include "tests/check.h"

// One rank's inputs, the "device" buffers and outputs.
struct rank_io {
    int n = 0, k = 0, d = 0;
    std::vector<float> emb, cen;
    std::vector<int64_t> lab;
    std::vector<float> en, wn, cos, row_max, logits, ge, gc;
    std::vector<double> inv_e, inv_w, row_red, row_loss;
    double loss = NAN;
    int64_t no_target = -1;
};

// head_cosines: normalize rows (kernel), cos = en wn^T (cuBLAS on the GPU, cblas here)
static void cosines(rank_io &r)
{
    const int n = r.n, k = r.k, d = r.d;
    r.en.assign((size_t)n * d, NAN);
    r.inv_e.assign(n, NAN);
    r.wn.assign((size_t)(k ? k : 1) * d, NAN);
    r.inv_w.assign(k ? k : 1, NAN);
    r.cos.assign((size_t)(k ? n * k : 1), NAN);
    float *en = r.en.data(), *wn = r.wn.data();
    double *ie = r.inv_e.data(), *iw = r.inv_w.data();
    const float *emb = r.emb.data(), *cen = r.cen.data();
    emu_launch(n, HEAD_THREADS, [&] { normalize_inv_k(en, ie, emb, d); });
    if (k > 0) {
        emu_launch(k, HEAD_THREADS, [&] { normalize_inv_k(wn, iw, cen, d); });
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, k, d, 1.0f, en, d, wn, d, 0.0f, r.cos.data(),
                    k);
    }
}

// head_backward: the GEMMs and the normalization backward (kernel)
static void backward(rank_io &r)
{
    const int n = r.n, k = r.k, d = r.d;
    r.ge.assign((size_t)n * d, NAN);
    r.gc.assign((size_t)(k ? k : 1) * d, NAN);
    float *ge = r.ge.data(), *gc = r.gc.data(), *en = r.en.data(), *wn = r.wn.data();
    const float *emb = r.emb.data(), *cen = r.cen.data();
    double *ie = r.inv_e.data(), *iw = r.inv_w.data();
    if (k > 0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, k, 1.0f, r.cos.data(), k, wn, d, 0.0f,
                    ge, d);
    else
        std::fill(r.ge.begin(), r.ge.end(), 0.0f);
    emu_launch(n, HEAD_THREADS, [&] { normalize_bwd_k(ge, en, ie, emb, d); });
    if (k > 0) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, k, d, n, 1.0f, r.cos.data(), k, en, d, 0.0f, gc,
                    d);
        emu_launch(k, HEAD_THREADS, [&] { normalize_bwd_k(gc, wn, iw, cen, d); });
    }
}

// cuda_head_forward_backward's sequence (fused row kernel), grad scale 1/n. Returns 0 or -ERANGE.
static int emu_fused(const cuda_head_params &p, rank_io &r)
{
    const int n = r.n, k = r.k;
    cosines(r);
    r.logits.assign((size_t)(k ? n * k : 1), NAN);
    r.row_loss.assign(n, NAN);
    float *cosm = r.cos.data(), *lg = r.logits.data();
    const int64_t *lab = r.lab.data();
    double *rl = r.row_loss.data();
    emu_launch(n, HEAD_THREADS, [&] { head_row_k(cosm, lg, lab, k, p, 1.0 / n, rl, 1); });
    double total = 0;
    for (int i = 0; i < n; i++) {
        if (rl[i] == -INFINITY) // head_row_k's mark of a bad label
            return -ERANGE;
        total += rl[i];
    }
    r.loss = total / n;
    backward(r);
    return 0;
}

// cuda_head_dist's sequence for W ranks in lock step; collectives as coll_thread (rank order).
// Returns 0 or -ERANGE (the verdict every rank would return); *bad_row as named by rank 0.
static int emu_dist(const cuda_head_params &p, int local, std::vector<rank_io> &R, int *bad_row)
{
    const int W = (int)R.size(), n = R[0].n;
    const bool global = !local && W > 1;
    for (auto &r : R) {
        cosines(r);
        r.logits.assign((size_t)(r.k ? n * r.k : 1), NAN);
        r.row_max.assign(n, NAN);
        float *cosm = r.cos.data(), *lg = r.logits.data(), *mx = r.row_max.data();
        const int64_t *lab = r.lab.data();
        int k = r.k;
        emu_launch(n, HEAD_THREADS, [&] { dist_max_k(cosm, lg, lab, k, p, mx); });
    }
    if (global)
        for (int i = 0; i < n; i++) {
            float m = R[0].row_max[i];
            for (int q = 1; q < W; q++)
                m = R[q].row_max[i] > m ? R[q].row_max[i] : m;
            for (auto &r : R)
                r.row_max[i] = m;
        }
    for (auto &r : R) {
        r.row_red.assign((size_t)4 * n, NAN);
        const float *cosm = r.cos.data(), *mx = r.row_max.data();
        const int64_t *lab = r.lab.data();
        double *red = r.row_red.data();
        int k = r.k;
        emu_launch(n, HEAD_THREADS, [&] { dist_sum_k(cosm, lab, k, p, mx, red); });
    }
    if (global)
        for (int i = 0; i < 4 * n; i++) {
            double s = R[0].row_red[i];
            for (int q = 1; q < W; q++)
                s += R[q].row_red[i];
            for (auto &r : R)
                r.row_red[i] = s;
        }
    std::vector<double> mean(W), nt(W), bad(W);
    std::vector<int> br(W);
    for (int q = 0; q < W; q++) {
        double total;
        head_dist_loss(R[q].row_red.data(), n, p.clamp_loss, &total, &nt[q], &bad[q], &br[q]);
        mean[q] = total / n;
    }
    if (local && W > 1) {
        double m = 0, t = 0, b = 0;
        for (int q = 0; q < W; q++)
            m += mean[q], t += nt[q], b += bad[q];
        for (int q = 0; q < W; q++)
            mean[q] = m / W, nt[q] = t, bad[q] = b;
    }
    *bad_row = br[0];
    for (int q = 0; q < W; q++)
        if (bad[q] > 0)
            return -ERANGE;
    const double g = 1.0 / ((double)n * (local ? W : 1));
    for (int q = 0; q < W; q++) {
        rank_io &r = R[q];
        r.loss = mean[q];
        r.no_target = (int64_t)nt[q];
        float *cosm = r.cos.data(), *mx = r.row_max.data();
        const double *red = r.row_red.data();
        const int64_t *lab = r.lab.data();
        int k = r.k;
        emu_launch(n, HEAD_THREADS, [&] { dist_grad_k(cosm, lab, k, p, g, mx, red); });
        backward(r);
    }
    return 0;
}

// Splits (emb n x d, centers k x d, labels) over W ranks by columns: column j on rank j mod W.
static std::vector<rank_io> split(const float *emb, const float *cen, const int64_t *lab, int n, int k, int d,
                                  int W)
{
    std::vector<rank_io> R(W);
    for (int q = 0; q < W; q++) {
        rank_io &r = R[q];
        r.n = n;
        r.d = d;
        r.emb.assign(emb, emb + (size_t)n * d);
        for (int j = q; j < k; j += W)
            r.cen.insert(r.cen.end(), cen + (size_t)j * d, cen + (size_t)(j + 1) * d);
        r.k = (int)(r.cen.size() / d);
        if (r.cen.empty())
            r.cen.assign(d, 0.0f);
        r.lab.resize(n);
        for (int i = 0; i < n; i++)
            r.lab[i] = (lab[i] >= 0 && lab[i] % W == q) ? lab[i] / W : -1;
    }
    return R;
}

// Reassembles logits (n,k), center gradients (k,d) and the summed embedding gradients.
static void assemble(const std::vector<rank_io> &R, int k, std::vector<float> &lg, std::vector<float> &ge,
                     std::vector<float> &gc)
{
    const int W = (int)R.size(), n = R[0].n, d = R[0].d;
    lg.assign((size_t)n * k, NAN);
    gc.assign((size_t)k * d, NAN);
    ge.assign((size_t)n * d, 0.0f);
    for (int q = 0; q < W; q++) {
        const rank_io &r = R[q];
        for (int j = q, c = 0; j < k; j += W, c++) {
            for (int i = 0; i < n; i++)
                lg[(size_t)i * k + j] = r.logits[(size_t)i * r.k + c];
            memcpy(&gc[(size_t)j * d], &r.gc[(size_t)c * d], (size_t)d * sizeof(float));
        }
    }
    for (size_t i = 0; i < (size_t)n * d; i++) {
        double s = 0;
        for (int q = 0; q < W; q++)
            s += R[q].ge[i];
        ge[i] = (float)s;
    }
}

static void reference_case(const char *dir, const char *name)
{
    head_refcase c;
    if (head_refcase_load(dir, name, &c)) {
        check(false, "%s: %s", name, pf_errmsg());
        return;
    }
    const cuda_head_params p = c.p;
    const int n = c.n, d = c.d, k = c.k;
    float *emb = c.emb, *cen = c.cen;
    int64_t *lab = c.lab;
    double *rlog = c.rlog, *rge = c.rge, *rgc = c.rgc;
    const bool big = k > 100;
#ifdef __SANITIZE_ADDRESS__
    const bool skip_big = true; // ten times slower under the sanitizers
#else
    const bool skip_big = false;
#endif
    if (big && (skip_big || !strstr(name, "arcface_exact"))) {
        // ~2.5M fiber switches per large case: one (arcface exact) is run, the rest on the GPU only
        printf("--   %s: large case, emulated only for arcface_exact (and not under the sanitizers)\n", name);
        head_refcase_free(&c);
        return;
    }

    // the fused single-process kernel
    std::vector<rank_io> one = split(emb, cen, lab, n, k, d, 1);
    int rc = emu_fused(p, one[0]);
    double el = fabs(one[0].loss - c.rloss) / fabs(c.rloss);
    double elog = rel_l2_f64(one[0].logits.data(), rlog, (size_t)n * k),
           ege = rel_l2_f64(one[0].ge.data(), rge, (size_t)n * d),
           egc = rel_l2_f64(one[0].gc.data(), rgc, (size_t)k * d);
    check(rc == 0 && el <= 1e-5 && elog <= 1e-5 && ege <= 1e-5 && egc <= 1e-5,
          "fused  W=1 %-44s loss %.6f rel %.2e | logits %.2e | grad_emb %.2e | grad_cen %.2e", name,
          one[0].loss, el, elog, ege, egc);

    for (int W = big ? 3 : 1; W <= 3; W++) {
        std::vector<rank_io> R = split(emb, cen, lab, n, k, d, W);
        int bad_row;
        rc = emu_dist(p, 0, R, &bad_row);
        bool same = true, no_orphan = true;
        for (auto &r : R)
            same &= memcmp(&r.loss, &R[0].loss, sizeof(double)) == 0, no_orphan &= r.no_target == 0;
        std::vector<float> alg, age, agc;
        if (rc == 0)
            assemble(R, k, alg, age, agc);
        el = fabs(R[0].loss - c.rloss) / fabs(c.rloss);
        elog = rc ? INFINITY : rel_l2_f64(alg.data(), rlog, (size_t)n * k);
        ege = rc ? INFINITY : rel_l2_f64(age.data(), rge, (size_t)n * d);
        egc = rc ? INFINITY : rel_l2_f64(agc.data(), rgc, (size_t)k * d);
        check(rc == 0 && same && no_orphan && el <= 1e-5 && elog <= 1e-5 && ege <= 1e-5 && egc <= 1e-5,
              "dist   W=%d %-44s loss %.6f rel %.2e%s | logits %.2e | grad_emb %.2e | grad_cen %.2e", W, name,
              R[0].loss, el, same ? "" : " (ranks differ)", elog, ege, egc);
    }
    if (strstr(name, "N8_K50")) {
        // a label one past the last column of rank 1 (of 2): every rank's verdict is -ERANGE, row n-1
        std::vector<rank_io> R = split(emb, cen, lab, n, k, d, 2);
        R[1].lab[n - 1] = R[1].k;
        int bad_row = -2;
        rc = emu_dist(p, 0, R, &bad_row);
        check(rc == -ERANGE && bad_row == n - 1,
              "dist   W=2 %s: label %d on rank 1 row %d -> rc %d, row named %d", name, R[1].k, n - 1, rc,
              bad_row);
        // the fused kernel's flag
        one = split(emb, cen, lab, n, k, d, 1);
        one[0].lab[0] = -2;
        rc = emu_fused(p, one[0]);
        check(rc == -ERANGE, "fused  W=1 %s: label -2 on row 0 -> rc %d", name, rc);
    }
    head_refcase_free(&c);
}

// vs the CPU head (head.c): random data, interclass filtering, clamp_loss, a row without any target.
static void cpu_case(int W, int local, int straight, int clamp)
{
    const int n = 12, d = 48, k = 70;
    std::vector<float> emb((size_t)n * d), cen((size_t)k * d);
    std::vector<int64_t> lab(n);
    for (auto &x : cen)
        x = frand(-1, 1);
    for (int i = 0; i < n; i++) {
        lab[i] = (int64_t)(rnd() % k);
        bool near = i % 3 != 2;
        for (int j = 0; j < d; j++)
            emb[(size_t)i * d + j] = (near ? 2.0f * cen[(size_t)lab[i] * d + j] : 0.0f) + frand(-1, 1);
    }
    lab[n - 1] = -1; // target on no worker
    head_params hp = {64,
                      0.9,
                      0.4,
                      0.15,
                      0.2,
                      straight ? HEAD_MARGIN_GRAD_STRAIGHT_THROUGH : HEAD_MARGIN_GRAD_EXACT,
                      local ? HEAD_MODE_LOCAL : HEAD_MODE_GLOBAL,
                      clamp,
                      0};
    cuda_head_params p = {hp.s, hp.m1, hp.m2, hp.m3, hp.interclass_filtering_threshold, straight, clamp};
    char name[160];
    snprintf(name, sizeof name, "%s W=%d vs head.c: %s, tau 0.2%s, one row without target",
             local ? "local" : "global", W, straight ? "straight_through" : "exact",
             clamp ? ", clamp_loss" : "");
    if (!local) {
        // CPU: one process over all k columns (the distributed head equals it)
        head_ws ws;
        std::vector<float> clg((size_t)n * k), cge((size_t)n * d), cgc((size_t)k * d);
        double closs = NAN;
        int crc = head_ws_init(&ws, n, k, d);
        if (!crc)
            crc =
                head_forward(&hp, &ws, NULL, &closs, clg.data(), emb.data(), cen.data(), lab.data(), n, k, d);
        if (!crc)
            crc =
                head_backward(&hp, &ws, cge.data(), cgc.data(), emb.data(), cen.data(), lab.data(), n, k, d);
        int64_t cnt = ws.no_target;
        head_ws_free(&ws);
        std::vector<rank_io> R = split(emb.data(), cen.data(), lab.data(), n, k, d, W);
        int bad_row;
        int rc = emu_dist(p, 0, R, &bad_row);
        std::vector<float> alg, age, agc;
        if (rc == 0)
            assemble(R, k, alg, age, agc);
        double el = fabs(R[0].loss - closs) / fabs(closs);
        double elog = rc ? INFINITY : rel_l2(alg.data(), clg.data(), clg.size());
        double ege = rc ? INFINITY : rel_l2(age.data(), cge.data(), cge.size());
        double egc = rc ? INFINITY : rel_l2(agc.data(), cgc.data(), cgc.size());
        check(crc == 0 && rc == 0 && R[0].no_target == 1 && cnt == 1 && el <= 1e-5 && elog <= 1e-5 &&
                  ege <= 1e-5 && egc <= 1e-5,
              "%-86s loss %.6f rel %.2e | logits %.2e | grad_emb %.2e | grad_cen %.2e | no-target rows %lld",
              name, R[0].loss, el, elog, ege, egc, (long long)R[0].no_target);
        if (W == 1) {
            // the fused single-process kernel on the same data (grad scale 1/n, as head.c without a group)
            std::vector<rank_io> F = split(emb.data(), cen.data(), lab.data(), n, k, d, 1);
            rc = emu_fused(p, F[0]);
            el = fabs(F[0].loss - closs) / fabs(closs);
            elog = rc ? INFINITY : rel_l2(F[0].logits.data(), clg.data(), clg.size());
            ege = rc ? INFINITY : rel_l2(F[0].ge.data(), cge.data(), cge.size());
            egc = rc ? INFINITY : rel_l2(F[0].gc.data(), cgc.data(), cgc.size());
            check(rc == 0 && el <= 1e-5 && elog <= 1e-5 && ege <= 1e-5 && egc <= 1e-5,
                  "fused %-80s loss %.6f rel %.2e | logits %.2e | grad_emb %.2e | grad_cen %.2e (rc %d)",
                  name, F[0].loss, el, elog, ege, egc, rc);
        }
    } else {
        // local: rank q has its own rows (a shifted copy of the batch) and all columns; CPU head per rank
        // in one process (g = 1/n) -> expected gradients / W, loss = mean over ranks
        std::vector<rank_io> R(W);
        double want_loss = 0;
        std::vector<std::vector<float>> cge(W), cgc(W);
        int crc = 0;
        for (int q = 0; q < W; q++) {
            rank_io &r = R[q];
            r.n = n, r.k = k, r.d = d;
            r.emb.resize((size_t)n * d);
            for (size_t i = 0; i < r.emb.size(); i++)
                r.emb[i] = emb[i] * (1.0f + 0.25f * q) + 0.1f * q;
            r.cen = cen;
            r.lab = lab;
            head_params hl = hp;
            hl.mode = HEAD_MODE_GLOBAL; // single process: identical to local with W = 1
            head_ws ws;
            cge[q].resize((size_t)n * d);
            cgc[q].resize((size_t)k * d);
            double l = NAN;
            crc |= head_ws_init(&ws, n, k, d);
            crc |= head_forward(&hl, &ws, NULL, &l, NULL, r.emb.data(), cen.data(), lab.data(), n, k, d);
            crc |= head_backward(&hl, &ws, cge[q].data(), cgc[q].data(), r.emb.data(), cen.data(), lab.data(),
                                 n, k, d);
            head_ws_free(&ws);
            want_loss += l / W;
            for (auto &x : cge[q])
                x /= (float)W;
            for (auto &x : cgc[q])
                x /= (float)W;
        }
        int bad_row;
        int rc = emu_dist(p, 1, R, &bad_row);
        double el = fabs(R[0].loss - want_loss) / fabs(want_loss), ege = 0, egc = 0;
        bool same = true;
        for (int q = 0; q < W; q++) {
            ege = fmax(ege, rc ? INFINITY : rel_l2(R[q].ge.data(), cge[q].data(), cge[q].size()));
            egc = fmax(egc, rc ? INFINITY : rel_l2(R[q].gc.data(), cgc[q].data(), cgc[q].size()));
            same &= R[q].loss == R[0].loss;
        }
        check(crc == 0 && rc == 0 && same && R[0].no_target == W && el <= 1e-5 && ege <= 1e-5 && egc <= 1e-5,
              "%-86s loss %.6f rel %.2e | grad_emb %.2e | grad_cen %.2e (1/(nW) scale) | no-target rows %lld",
              name, R[0].loss, el, ege, egc, (long long)R[0].no_target);
    }
}

int main()
{
    uint64_t seed = test_seed();
    printf("seed %llu; CUDA head kernels emulated on the CPU, %d threads per block\n",
           (unsigned long long)seed, HEAD_THREADS);
    char dir[1200];
    int missing = ref_dir(dir, sizeof dir, "head");
    if (missing)
        return missing;
    DIR *dp = opendir(dir);
    if (!dp) {
        printf("FAIL: cannot open %s\n", dir);
        return 1;
    }
    int ncase = 0;
    while (struct dirent *de = readdir(dp)) {
        if (strncmp(de->d_name, "head_", 5))
            continue;
        reference_case(dir, de->d_name);
        ncase++;
    }
    closedir(dp);
    check(ncase >= 24, "reference head cases found: %d", ncase);
    cpu_case(1, 0, 0, 0);
    cpu_case(1, 0, 1, 1);
    cpu_case(3, 0, 1, 1);
    cpu_case(3, 0, 0, 0);
    cpu_case(2, 1, 0, 0);
    cpu_case(3, 1, 1, 1);
    printf("%d of %d checks failed (%ld fiber switches)\n", failures, checks, emu::switches);
    return failures ? 1 : 0;
}
