/* The distributed CUDA head (cuda_head_dist) and the CUDA Partial FC step (pfc_cuda_step) on a GPU.
 * W = 1, 2, 3 ranks run as threads of this process on ONE GPU (NCCL refuses two ranks on one
 * device), their collectives through coll_thread over managed memory (the workspaces are made with
 * coll_host_memory = 1; needs concurrent managed access, else the multi-rank parts SKIP).
 *  1. Every $PFCPS_REFERENCE/head case (float64 PyTorch) through the fused single-process head
 *     (cuda_head_forward_backward) and split over W ranks by columns for cuda_head_dist (column j
 *     on rank j mod W): loss (same bits on every rank), logits and center gradients assembled from the
 *     ranks, embedding gradients summed over the ranks, each relative <= 1e-5 vs the reference.
 *     Outputs NaN-poisoned first, so an element not written fails. A label outside [-1, k) on one
 *     rank -> -ERANGE on every rank.
 *  2. pfc_cuda_step vs the CPU pfc_step over the same coll_thread group, same data (fresh random
 *     embeddings, labels and centers each run; seed printed, PFCPS_TEST_SEED replays), global and
 *     local mode, exact / straight_through margin gradient, interclass filtering, sample rates 0.3
 *     and 1: loss, embedding and center gradients relative <= 1e-5 and the same verdict on every
 *     rank; forward-only and grad_embeddings = NULL calls; faults: a row whose target is on no
 *     worker -> -EPROTO on every rank (outputs still compared), a NaN embedding -> -ERANGE on every
 *     rank (as pfc_step), a corrupted label column on one rank -> -ERANGE on every rank.
 *  3. With 2 or more GPUs and NCCL: the production path, one rank per GPU (up to 3), pfc_cuda over
 *     coll_nccl (device buffers) next to the host pfc over coll_thread, compared with pfc_step as in
 *     part 2 (clean global and local steps, an orphan row, a bad label column). Not run with one GPU.
 * Without a GPU: "SKIP: no CUDA device" and exit 77. Built twice: on the CUDA device (cuda_pfc) and on
 * the emulated device of tests/kernels/cuda/cuda_emu_device.cpp (cuda_pfc_emu: the head's host code and kernels
 * on the CPU, so this whole test also runs in CI; part 3 is not built there). */
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/coll.h"
#include "common/err.h"
#include "kernels/cuda/cuda_ops.h"
#include "tests/check.h"
#include "tests/kernels/cuda/cuda_testutil.h"
#include "tests/kernels/cuda/head_refcase.h"
#include "tests/npy.h"
#include "tests/reference/ref.h"
#include "worker/head/pfc.h"
#include "worker/head/pfc_cuda.h"

enum { MAXW = 3 };
#define TOL 1e-5

static uint64_t g_seed;

static uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
static uint64_t h4(uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
    return mix(mix(mix(mix(g_seed ^ a) ^ b) ^ c) ^ d);
}
/* uniform in [-1, 1) from (a, b, c, d) and the run's seed */
static float sym(uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
    return (float)(2.0 * ((h4(a, b, c, d) >> 11) * 0x1.0p-53) - 1.0);
}

static void down(void *h, const void *d, size_t bytes)
{
    if (cuda_sync() || (bytes && cuda_d2h(h, d, bytes)))
        DIE("device download of %zu bytes", bytes);
}

/* Agreement on a rank-local setup failure before the first collective (so no rank waits forever):
 * returns 1 when every rank is ready. */
static int all_ready(pf_coll *c, int ok)
{
    if (!c)
        return ok;
    float bad = ok ? 0.0f : 1.0f;
    if (coll_allreduce(c, &bad, 1, COLL_F32, COLL_MAX))
        return 0;
    return bad == 0.0f;
}

/* ---------------- part 1: reference cases split over W ranks ---------------- */

typedef struct refrank {
    const head_refcase *c;
    coll_thread_group *grp;
    int rank, W, bad;
    int rc;
    double loss;
    char msg[512];
    float *ge;          /* (n, d) this rank's part of the embedding gradient */
    float *logits_full; /* (n, k) shared: this rank fills its columns */
    float *gc_full;     /* (k, d) shared: this rank fills its rows */
} refrank;

static void *ref_rank_main(void *vp)
{
    refrank *a = vp;
    const head_refcase *c = a->c;
    const int W = a->W, r = a->rank, n = c->n, d = c->d, k = c->k;
    pf_coll coll, *cp = NULL;
    if (W > 1) {
        coll_thread_get(a->grp, r, &coll);
        cp = &coll;
    }
    int kr = 0;
    for (int j = r; j < k; j += W)
        kr++;
    float *cen = malloc((size_t)(kr ? kr : 1) * d * sizeof(float));
    int64_t *lab = malloc((size_t)n * sizeof(int64_t));
    for (int j = r, q = 0; j < k; j += W, q++)
        memcpy(cen + (size_t)q * d, c->cen + (size_t)j * d, (size_t)d * sizeof(float));
    for (int i = 0; i < n; i++)
        lab[i] = (c->lab[i] >= 0 && c->lab[i] % W == r) ? c->lab[i] / W : -1;
    if (a->bad)
        lab[n - 1] = kr; /* one past this rank's columns */
    cuda_head_ws ws;
    int ok = cuda_head_ws_init_coll(&ws, n, kr, d, W > 1) == 0;
    if (!ok)
        snprintf(a->msg, sizeof a->msg, "workspace: %s", pf_errmsg());
    if (!all_ready(cp, ok)) {
        a->rc = -1;
        free(cen);
        free(lab);
        return NULL;
    }
    float *demb = dev_up(c->emb, (size_t)n * d * sizeof(float));
    float *dcen = dev_up(cen, (size_t)kr * d * sizeof(float));
    int64_t *dlab = dev_up(lab, (size_t)n * sizeof(int64_t));
    float *dlog = nan_dev((size_t)n * kr), *dge = nan_dev((size_t)n * d), *dgc = nan_dev((size_t)kr * d);
    int64_t no_target = -1;
    a->rc = cuda_head_dist(&c->p, 0, &ws, cp, demb, n, dcen, kr, dlab, &a->loss, &no_target, dlog, dge, dgc);
    if (a->rc) {
        snprintf(a->msg, sizeof a->msg, "%s", pf_errmsg());
    } else {
        float *hlog = malloc((size_t)(kr ? n * kr : 1) * sizeof(float));
        float *hgc = malloc((size_t)(kr ? kr : 1) * d * sizeof(float));
        a->ge = malloc((size_t)n * d * sizeof(float));
        down(hlog, dlog, (size_t)n * kr * sizeof(float));
        down(hgc, dgc, (size_t)kr * d * sizeof(float));
        down(a->ge, dge, (size_t)n * d * sizeof(float));
        for (int j = r, q = 0; j < k; j += W, q++) {
            for (int i = 0; i < n; i++)
                a->logits_full[(size_t)i * k + j] = hlog[(size_t)i * kr + q];
            memcpy(a->gc_full + (size_t)j * d, hgc + (size_t)q * d, (size_t)d * sizeof(float));
        }
        if (no_target != 0) {
            snprintf(a->msg, sizeof a->msg, "no_target %lld, expected 0", (long long)no_target);
            a->rc = -1;
        }
        free(hlog);
        free(hgc);
    }
    cuda_head_ws_free(&ws);
    cuda_free(demb);
    cuda_free(dcen);
    cuda_free(dlab);
    cuda_free(dlog);
    cuda_free(dge);
    cuda_free(dgc);
    free(cen);
    free(lab);
    return NULL;
}

static void ref_run(const head_refcase *c, int W, int bad_rank)
{
    const int n = c->n, k = c->k, d = c->d;
    coll_thread_group *g = NULL;
    if (W > 1 && coll_thread_group_create(W, &g))
        DIE("thread group");
    float *logits = malloc((size_t)n * k * sizeof(float)), *gc = malloc((size_t)k * d * sizeof(float));
    for (size_t i = 0; i < (size_t)n * k; i++)
        logits[i] = NAN;
    for (size_t i = 0; i < (size_t)k * d; i++)
        gc[i] = NAN;
    refrank a[MAXW];
    pthread_t th[MAXW];
    for (int r = 0; r < W; r++) {
        a[r] = (refrank){
            .c = c, .grp = g, .rank = r, .W = W, .bad = r == bad_rank, .logits_full = logits, .gc_full = gc};
        if (pthread_create(&th[r], NULL, ref_rank_main, &a[r]))
            DIE("pthread_create");
    }
    for (int r = 0; r < W; r++)
        pthread_join(th[r], NULL);
    if (bad_rank >= 0) {
        int all = 1;
        for (int r = 0; r < W; r++)
            all &= a[r].rc == -ERANGE && strstr(a[r].msg, "outside") != NULL;
        printf("%-4s W=%d %s: label out of range on rank %d -> -ERANGE on every rank (rank 0: %s)\n",
               all ? "ok" : "FAIL", W, c->name, bad_rank, a[0].msg);
        for (int r = 0; r < W && !all; r++)
            printf("     rank %d: rc %d %s\n", r, a[r].rc, a[r].msg);
        CHECK(all, "W=%d %s: bad label verdicts", W, c->name);
    } else {
        int ok = 1, same = 1;
        for (int r = 0; r < W; r++) {
            if (a[r].rc) {
                printf("FAIL W=%d %s rank %d: rc %d %s\n", W, c->name, r, a[r].rc, a[r].msg);
                ok = 0;
            }
            same &= memcmp(&a[r].loss, &a[0].loss, sizeof(double)) == 0;
        }
        CHECK(ok, "W=%d %s: every rank ran", W, c->name);
        if (ok) {
            float *ge = malloc((size_t)n * d * sizeof(float));
            for (size_t i = 0; i < (size_t)n * d; i++) {
                double s = 0;
                for (int r = 0; r < W; r++)
                    s += a[r].ge[i];
                ge[i] = (float)s;
            }
            double el = fabs(a[0].loss - c->rloss) / fabs(c->rloss);
            double elog = rel_l2_f64(logits, c->rlog, (size_t)n * k),
                   ege = rel_l2_f64(ge, c->rge, (size_t)n * d), egc = rel_l2_f64(gc, c->rgc, (size_t)k * d);
            int pass = same && el <= TOL && elog <= TOL && ege <= TOL && egc <= TOL;
            printf("%-4s W=%d %-44s loss %.6f rel %.2e%s | logits %.2e | grad_emb %.2e | grad_cen %.2e\n",
                   pass ? "ok" : "FAIL", W, c->name, a[0].loss, el, same ? "" : " (ranks differ)", elog, ege,
                   egc);
            CHECK(pass, "W=%d %s vs reference", W, c->name);
            free(ge);
        }
    }
    for (int r = 0; r < W; r++)
        free(a[r].ge);
    free(logits);
    free(gc);
    if (g)
        coll_thread_group_destroy(g);
}

/* The single-process fused head (cuda_head_forward_backward, grad scale 1/n) on the same case. */
static void fused_run(const head_refcase *c)
{
    const int n = c->n, k = c->k, d = c->d;
    cuda_head_ws ws;
    if (cuda_head_ws_init(&ws, n, k, d))
        DIE("fused head workspace");
    float *demb = dev_up(c->emb, (size_t)n * d * sizeof(float)),
          *dcen = dev_up(c->cen, (size_t)k * d * sizeof(float));
    int64_t *dlab = dev_up(c->lab, (size_t)n * sizeof(int64_t));
    float *dlog = nan_dev((size_t)n * k), *dge = nan_dev((size_t)n * d), *dgc = nan_dev((size_t)k * d);
    double loss = NAN;
    int rc = cuda_head_forward_backward(&c->p, &ws, demb, n, dcen, k, dlab, 0, &loss, dlog, dge, dgc);
    float *hl = malloc((size_t)n * k * sizeof(float)), *hge = malloc((size_t)n * d * sizeof(float)),
          *hgc = malloc((size_t)k * d * sizeof(float));
    down(hl, dlog, (size_t)n * k * sizeof(float));
    down(hge, dge, (size_t)n * d * sizeof(float));
    down(hgc, dgc, (size_t)k * d * sizeof(float));
    double el = fabs(loss - c->rloss) / fabs(c->rloss), elog = rel_l2_f64(hl, c->rlog, (size_t)n * k),
           ege = rel_l2_f64(hge, c->rge, (size_t)n * d), egc = rel_l2_f64(hgc, c->rgc, (size_t)k * d);
    int pass = rc == 0 && el <= TOL && elog <= TOL && ege <= TOL && egc <= TOL;
    printf("%-4s fused %-44s loss %.6f rel %.2e | logits %.2e | grad_emb %.2e | grad_cen %.2e%s%s\n",
           pass ? "ok" : "FAIL", c->name, loss, el, elog, ege, egc, rc ? " " : "", rc ? pf_errmsg() : "");
    CHECK(pass, "fused %s vs reference", c->name);
    cuda_head_ws_free(&ws);
    cuda_free(demb);
    cuda_free(dcen);
    cuda_free(dlab);
    cuda_free(dlog);
    cuda_free(dge);
    cuda_free(dgc);
    free(hl);
    free(hge);
    free(hgc);
}

/* ---------------- part 2: pfc_cuda_step vs pfc_step ---------------- */

enum { PC = 300, PB = 6, PD = 40, MAXSTEPS = 2 };
enum { CORRUPT_NONE, CORRUPT_ORPHAN, CORRUPT_NAN, CORRUPT_BADLABEL };
static const char *corrupt_name[] = {"clean", "orphan row", "NaN embedding", "bad label column"};

typedef struct pcfg {
    int W;
    head_mode mode;
    head_margin_grad mg;
    double m1, m2, m3, tau, rate;
    int corrupt;
    int nccl; /* part 3: rank r on GPU r, pfc_cuda over NCCL */
} pcfg;

#ifdef PFCPS_HAVE_NCCL
static uint8_t nccl_id[CUDA_NCCL_ID_BYTES];
#endif

typedef struct prank {
    const pcfg *cfg;
    coll_thread_group *grp;
    int rank, steps, setup_failed;
    int rcg[MAXSTEPS], rcc[MAXSTEPS];
    double lg[MAXSTEPS], lc[MAXSTEPS], ege[MAXSTEPS], egc[MAXSTEPS];
    int64_t k[MAXSTEPS];
    double l_fwd, egc_noemb; /* forward-only loss, center gradients with grad_embeddings NULL (last step) */
    int rc_fwd, rc_noemb;
    char msg[512];
} prank;

static float center_value(int64_t id, int j)
{
    return sym(1, (uint64_t)id, (uint64_t)j, 0);
}

static void *pfc_rank_main(void *vp)
{
    prank *a = vp;
    const pcfg *c = a->cfg;
    const int W = c->W, r = a->rank;
    pf_coll coll, *cp = NULL;
    if (W > 1) {
        coll_thread_get(a->grp, r, &coll);
        cp = &coll;
    }
    head_params hp = {.s = 64,
                      .m1 = c->m1,
                      .m2 = c->m2,
                      .m3 = c->m3,
                      .interclass_filtering_threshold = c->tau,
                      .margin_grad = c->mg,
                      .mode = c->mode,
                      .clamp_loss = 0};
    pfc cpu;
    pfc_cuda gx;
    memset(&gx, 0, sizeof gx);
    memset(&cpu, 0, sizeof cpu);
    pf_coll ncoll = {0}, *dev_coll = cp;
    int rc = 0;
#ifdef PFCPS_HAVE_NCCL
    if (c->nccl) {
        if ((rc = cuda_set_device(r)) || (rc = coll_nccl_create(nccl_id, r, W, &ncoll)))
            snprintf(a->msg, sizeof a->msg, "NCCL rank %d: %s", r, pf_errmsg());
        dev_coll = &ncoll;
    }
#endif
    if (!rc && (rc = pfc_init(&cpu, &hp, cp, PC, c->rate, 1234 + g_seed % 1000, PB, PD)))
        snprintf(a->msg, sizeof a->msg, "pfc_init: %s", pf_errmsg());
    else if (!rc && (rc = pfc_cuda_create(&gx, &cpu, dev_coll, !c->nccl)))
        snprintf(a->msg, sizeof a->msg, "pfc_cuda_create: %s", pf_errmsg());
    if (!all_ready(cp, rc == 0)) {
        a->setup_failed = 1;
        pfc_free(&cpu);
        pfc_cuda_free(&gx);
        if (ncoll.ops)
            coll_destroy(&ncoll);
        return NULL;
    }
    const size_t bd = (size_t)PB * PD, kd = (size_t)cpu.k_max * PD;
    float *emb = malloc(bd * sizeof(float)), *cen = malloc((kd ? kd : 1) * sizeof(float));
    float *hge = malloc(bd * sizeof(float)), *hgc = malloc((kd ? kd : 1) * sizeof(float));
    float *cge = malloc(bd * sizeof(float)), *cgc = malloc((kd ? kd : 1) * sizeof(float));
    float *demb = nan_dev(bd), *dcen = nan_dev(kd), *dge = nan_dev(bd), *dgc = nan_dev(kd);
    int64_t labels[PB];
    for (int step = 0; step < a->steps; step++) {
        for (int i = 0; i < PB; i++) {
            labels[i] = (int64_t)(h4(2, (uint64_t)step, (uint64_t)r, (uint64_t)i) % PC);
            /* half the rows near their class center (target cosine ~0.9: the margin's working range) */
            int near = i % 2 == 0;
            for (int j = 0; j < PD; j++) {
                float noise = sym(3, (uint64_t)step, (uint64_t)(r * PB + i), (uint64_t)j);
                emb[i * PD + j] = near ? 2.0f * center_value(labels[i], j) + 0.5f * noise : noise;
            }
        }
        const int64_t *ids;
        int64_t k;
        if ((rc = pfc_sample(&cpu, step, labels, &ids, &k))) {
            snprintf(a->msg, sizeof a->msg, "pfc_sample: %s", pf_errmsg());
            a->rcg[step] = a->rcc[step] = rc;
            break;
        }
        a->k[step] = k;
        for (int64_t q = 0; q < k; q++)
            for (int j = 0; j < PD; j++)
                cen[q * PD + j] = center_value(ids[q], j);
        if (c->corrupt == CORRUPT_ORPHAN && (c->mode == HEAD_MODE_GLOBAL || r == 0))
            cpu.labels_local[0] = -1; /* row 0 (global: of rank 0's batch) loses its target everywhere */
        if (c->corrupt == CORRUPT_NAN && r == 0)
            emb[0] = NAN;
        if (c->corrupt == CORRUPT_BADLABEL && r == W - 1)
            cpu.labels_local[0] = k; /* one past the sampled columns, on one rank only */
        if (cuda_h2d(demb, emb, bd * sizeof(float)) ||
            (k && cuda_h2d(dcen, cen, (size_t)k * PD * sizeof(float))) || cuda_fill_f32(dge, NAN, bd) ||
            cuda_fill_f32(dgc, NAN, kd))
            DIE("rank %d: upload", r);
        a->lg[step] = NAN;
        a->rcg[step] = pfc_cuda_step(&gx, &cpu, demb, dcen, &a->lg[step], dge, dgc);
        if (a->rcg[step])
            snprintf(a->msg, sizeof a->msg, "%s", pf_errmsg());
        down(hge, dge, bd * sizeof(float));
        down(hgc, dgc, (size_t)k * PD * sizeof(float));
        if (c->corrupt == CORRUPT_NONE && step == a->steps - 1) {
            /* forward only, then only the center gradients (the reduce-scatter lands in pfc_cuda's buffer) */
            a->l_fwd = NAN;
            a->rc_fwd = pfc_cuda_step(&gx, &cpu, demb, dcen, &a->l_fwd, NULL, NULL);
            if (cuda_fill_f32(dgc, NAN, kd))
                DIE("fill");
            a->rc_noemb = pfc_cuda_step(&gx, &cpu, demb, dcen, NULL, NULL, dgc);
            float *h2 = malloc((kd ? kd : 1) * sizeof(float));
            down(h2, dgc, (size_t)k * PD * sizeof(float));
            a->egc_noemb = rel_l2(h2, hgc, (size_t)k * PD);
            free(h2);
        }
        if (c->corrupt == CORRUPT_BADLABEL) {
            a->rcc[step] =
                -ERANGE; /* pfc_step would stop this rank before the collectives the others are in */
            break;
        }
        a->lc[step] = NAN;
        a->rcc[step] = pfc_step(&cpu, emb, cen, &a->lc[step], cge, cgc);
        a->ege[step] = rel_l2(hge, cge, bd);
        a->egc[step] = rel_l2(hgc, cgc, (size_t)k * PD);
        if (c->corrupt != CORRUPT_NONE)
            break;
    }
    free(emb);
    free(cen);
    free(hge);
    free(hgc);
    free(cge);
    free(cgc);
    cuda_free(demb);
    cuda_free(dcen);
    cuda_free(dge);
    cuda_free(dgc);
    pfc_cuda_free(&gx);
    pfc_free(&cpu);
    if (ncoll.ops)
        coll_destroy(&ncoll);
    return NULL;
}

static void pfc_run(const pcfg *c)
{
    const int W = c->W;
    coll_thread_group *g = NULL;
    if (W > 1 && coll_thread_group_create(W, &g))
        DIE("thread group");
    prank a[MAXW];
    pthread_t th[MAXW];
    int steps = c->corrupt == CORRUPT_NONE ? MAXSTEPS : 1;
    for (int r = 0; r < W; r++) {
        a[r] = (prank){.cfg = c, .grp = g, .rank = r, .steps = steps};
        if (pthread_create(&th[r], NULL, pfc_rank_main, &a[r]))
            DIE("pthread_create");
    }
    for (int r = 0; r < W; r++)
        pthread_join(th[r], NULL);
    if (g)
        coll_thread_group_destroy(g);
    char name[160];
    snprintf(name, sizeof name, "%sW=%d %s %s%s tau %.2f rate %.1f, %s", c->nccl ? "NCCL " : "", W,
             c->mode == HEAD_MODE_GLOBAL ? "global" : "local",
             c->mg == HEAD_MARGIN_GRAD_EXACT ? "exact" : "straight_through",
             c->m3 != 0 ? " cosface-combined" : "", c->tau, c->rate, corrupt_name[c->corrupt]);
    for (int r = 0; r < W; r++)
        if (a[r].setup_failed) {
            printf("FAIL %s: rank %d setup: %s\n", name, r, a[r].msg);
            CHECK(0, "%s: setup", name);
            return;
        }
    int want = c->corrupt == CORRUPT_NONE ? 0 : c->corrupt == CORRUPT_ORPHAN ? -EPROTO : -ERANGE;
    for (int step = 0; step < steps; step++) {
        int verdicts = 1, same_loss = 1, cpu_verdicts = 1;
        double el = 0, ege = 0, egc = 0;
        for (int r = 0; r < W; r++) {
            verdicts &= a[r].rcg[step] == want;
            same_loss &= memcmp(&a[r].lg[step], &a[0].lg[step], sizeof(double)) == 0;
            /* pfc_step counts orphans per rank in local mode: only rank 0 (the corrupted one) says -EPROTO */
            int cwant = (c->corrupt == CORRUPT_ORPHAN && c->mode == HEAD_MODE_LOCAL && r != 0) ? 0 : want;
            cpu_verdicts &= a[r].rcc[step] == cwant;
            if (c->corrupt == CORRUPT_NONE || c->corrupt == CORRUPT_ORPHAN) {
                el = fmax(el, fabs(a[r].lg[step] - a[r].lc[step]) / fabs(a[r].lc[step]));
                ege = fmax(ege, a[r].ege[step]);
                egc = fmax(egc, a[r].egc[step]);
            }
            if (isnan(el))
                el = INFINITY;
        }
        int pass = verdicts && cpu_verdicts;
        if (c->corrupt == CORRUPT_NONE || c->corrupt == CORRUPT_ORPHAN)
            pass &= same_loss && el <= TOL && ege <= TOL && egc <= TOL;
        if (c->corrupt == CORRUPT_NAN)
            pass &= isnan(a[0].lg[step]);
        printf("%-4s %s step %d: k %lld", pass ? "ok" : "FAIL", name, step, (long long)a[0].k[step]);
        for (int r = 1; r < W; r++)
            printf("/%lld", (long long)a[r].k[step]);
        printf(" rc %d (all ranks %s) loss %.6f vs cpu %.6f rel %.2e | grad_emb %.2e | grad_cen %.2e%s\n",
               a[0].rcg[step], verdicts ? "agree" : "DIFFER", a[0].lg[step], a[0].lc[step], el, ege, egc,
               same_loss ? "" : " (losses differ between ranks)");
        if (!pass)
            for (int r = 0; r < W; r++)
                printf("     rank %d: cuda rc %d, cpu rc %d, loss %.9g / %.9g: %s\n", r, a[r].rcg[step],
                       a[r].rcc[step], a[r].lg[step], a[r].lc[step], a[r].msg);
        CHECK(pass, "%s step %d", name, step);
    }
    if (c->corrupt == CORRUPT_NONE) {
        int ok = 1;
        for (int r = 0; r < W; r++)
            ok &= a[r].rc_fwd == 0 && a[r].rc_noemb == 0 &&
                  memcmp(&a[r].l_fwd, &a[r].lg[steps - 1], 8) == 0 && a[r].egc_noemb <= 1e-6;
        printf("%-4s %s: forward-only loss identical %.9f, grad_centers without grad_embeddings rel %.2e\n",
               ok ? "ok" : "FAIL", name, a[0].l_fwd, a[0].egc_noemb);
        CHECK(ok, "%s: forward only / no grad_embeddings", name);
    }
}

int main(void)
{
    if (cuda_device_count() == 0) {
        printf("SKIP: no CUDA device (cuda_head_dist and pfc_cuda compiled and linked; not run)\n");
        return 77;
    }
    g_seed = test_seed();
    printf("seed %llu (PFCPS_TEST_SEED replays)\n", (unsigned long long)g_seed);
#ifdef PFCPS_CUDA_EMU_DEVICE
    printf("EMULATED device (tests/kernels/cuda/cuda_emu_device.cpp): the head's host code and kernels on the CPU\n");
#endif
    int maxw = cuda_managed_concurrent() ? MAXW : 1;
    if (maxw == 1)
        printf("NOTE: this GPU has no concurrent managed access: ranks sharing it as threads cannot use host "
               "collectives; only W = 1 runs and the test reports SKIP\n");

    /* part 1 */
    char dir[1200], why[2048];
    DIR *dp = ref_locate(dir, sizeof dir, "head", why, sizeof why) ? NULL : opendir(dir);
    int ncase = 0, have_ref = dp != NULL;
    if (!dp) {
        printf("NOTE: %s: part 1 not run\n", why);
    } else {
        struct dirent *de;
        while ((de = readdir(dp))) {
            if (strncmp(de->d_name, "head_", 5))
                continue;
            head_refcase c;
            if (head_refcase_load(dir, de->d_name, &c))
                DIE("%s/%s: cannot load", dir, de->d_name);
#ifdef __SANITIZE_ADDRESS__
            if (c.k <= 100)
#endif
                fused_run(&c);
            for (int W = 1; W <= maxw; W++) {
#ifdef PFCPS_CUDA_EMU_DEVICE
                /* emulated: the large N32_K1000 cases (millions of fiber switches each) at W = 3 only, and
                 * not at all in the sanitizer build (ten times slower there) */
#ifdef __SANITIZE_ADDRESS__
                if (c.k > 100)
                    continue;
#endif
                if (c.k > 100 && W != maxw)
                    continue;
#endif
                ref_run(&c, W, -1);
            }
            if (strstr(c.name, "N8_K50"))
                for (int W = 1; W <= maxw; W++)
                    ref_run(&c, W, W - 1);
            head_refcase_free(&c);
            ncase++;
        }
        closedir(dp);
        CHECK(ncase >= 24, "reference head cases found: %d", ncase);
    }

    /* part 2 */
    const pcfg cfgs[] = {
        {1, HEAD_MODE_GLOBAL, HEAD_MARGIN_GRAD_EXACT, 1, 0.5, 0, 0, 0.3, CORRUPT_NONE, 0},
        {2, HEAD_MODE_GLOBAL, HEAD_MARGIN_GRAD_EXACT, 1, 0.5, 0, 0, 0.3, CORRUPT_NONE, 0},
        {3, HEAD_MODE_GLOBAL, HEAD_MARGIN_GRAD_EXACT, 1, 0.5, 0, 0, 0.3, CORRUPT_NONE, 0},
        {1, HEAD_MODE_LOCAL, HEAD_MARGIN_GRAD_EXACT, 1, 0.5, 0, 0, 0.3, CORRUPT_NONE, 0},
        {2, HEAD_MODE_LOCAL, HEAD_MARGIN_GRAD_EXACT, 1, 0.5, 0, 0, 0.3, CORRUPT_NONE, 0},
        {3, HEAD_MODE_LOCAL, HEAD_MARGIN_GRAD_EXACT, 1, 0.5, 0, 0, 0.3, CORRUPT_NONE, 0},
        {1, HEAD_MODE_GLOBAL, HEAD_MARGIN_GRAD_STRAIGHT_THROUGH, 0.9, 0.4, 0.15, 0.05, 1.0, CORRUPT_NONE, 0},
        {3, HEAD_MODE_GLOBAL, HEAD_MARGIN_GRAD_STRAIGHT_THROUGH, 0.9, 0.4, 0.15, 0.05, 1.0, CORRUPT_NONE, 0},
        {2, HEAD_MODE_LOCAL, HEAD_MARGIN_GRAD_STRAIGHT_THROUGH, 0.9, 0.4, 0.15, 0.05, 1.0, CORRUPT_NONE, 0},
        {1, HEAD_MODE_GLOBAL, HEAD_MARGIN_GRAD_EXACT, 1, 0.5, 0, 0, 0.3, CORRUPT_ORPHAN, 0},
        {2, HEAD_MODE_GLOBAL, HEAD_MARGIN_GRAD_EXACT, 1, 0.5, 0, 0, 0.3, CORRUPT_ORPHAN, 0},
        {3, HEAD_MODE_LOCAL, HEAD_MARGIN_GRAD_EXACT, 1, 0.5, 0, 0, 0.3, CORRUPT_ORPHAN, 0},
        {1, HEAD_MODE_GLOBAL, HEAD_MARGIN_GRAD_EXACT, 1, 0.5, 0, 0, 0.3, CORRUPT_NAN, 0},
        {3, HEAD_MODE_GLOBAL, HEAD_MARGIN_GRAD_EXACT, 1, 0.5, 0, 0, 0.3, CORRUPT_NAN, 0},
        {2, HEAD_MODE_LOCAL, HEAD_MARGIN_GRAD_EXACT, 1, 0.5, 0, 0, 0.3, CORRUPT_NAN, 0},
        {1, HEAD_MODE_GLOBAL, HEAD_MARGIN_GRAD_EXACT, 1, 0.5, 0, 0, 0.3, CORRUPT_BADLABEL, 0},
        {3, HEAD_MODE_GLOBAL, HEAD_MARGIN_GRAD_EXACT, 1, 0.5, 0, 0, 0.3, CORRUPT_BADLABEL, 0},
        {2, HEAD_MODE_LOCAL, HEAD_MARGIN_GRAD_EXACT, 1, 0.5, 0, 0, 0.3, CORRUPT_BADLABEL, 0},
    };
    int skipped = 0;
    for (size_t i = 0; i < sizeof cfgs / sizeof *cfgs; i++) {
        if (cfgs[i].W > maxw) {
            skipped++;
            continue;
        }
        pfc_run(&cfgs[i]);
    }
    /* part 3 */
    int gpus = cuda_device_count(), nccl_ran = 0;
#ifdef PFCPS_HAVE_NCCL
    if (gpus >= 2) {
        int W = gpus < MAXW ? gpus : MAXW;
        if (coll_nccl_unique_id(nccl_id))
            DIE("NCCL unique id");
        const pcfg ncfgs[] = {
            {W, HEAD_MODE_GLOBAL, HEAD_MARGIN_GRAD_EXACT, 1, 0.5, 0, 0, 0.3, CORRUPT_NONE, 1},
            {W, HEAD_MODE_LOCAL, HEAD_MARGIN_GRAD_EXACT, 1, 0.5, 0, 0, 0.3, CORRUPT_NONE, 1},
            {W, HEAD_MODE_GLOBAL, HEAD_MARGIN_GRAD_STRAIGHT_THROUGH, 0.9, 0.4, 0.15, 0.05, 1.0,
             CORRUPT_ORPHAN, 1},
            {W, HEAD_MODE_GLOBAL, HEAD_MARGIN_GRAD_EXACT, 1, 0.5, 0, 0, 0.3, CORRUPT_BADLABEL, 1},
            {W, HEAD_MODE_LOCAL, HEAD_MARGIN_GRAD_EXACT, 1, 0.5, 0, 0, 0.3, CORRUPT_BADLABEL, 1},
        };
        for (size_t i = 0; i < sizeof ncfgs / sizeof *ncfgs; i++) {
            /* a fresh NCCL group per configuration: a new unique id each time */
            if (i && coll_nccl_unique_id(nccl_id))
                DIE("NCCL unique id");
            pfc_run(&ncfgs[i]);
        }
        nccl_ran = 1;
        if (cuda_set_device(0))
            DIE("cuda_set_device(0)");
    }
#endif
    if (!nccl_ran)
        printf("NOTE: part 3 (pfc_cuda over NCCL, one rank per GPU) needs NCCL and 2 GPUs (%d visible): not "
               "run\n",
               gpus);
    printf("%d failure(s)\n", fails);
    if (fails)
        return 1;
    if (!have_ref)
        return ref_missing("%s: part 1 not run", why);
    if (maxw == 1) {
        printf("SKIP: %d multi-rank configuration(s) not run, reference part %s\n", skipped,
               have_ref ? "run" : "not run");
        return 77;
    }
    return 0;
}
