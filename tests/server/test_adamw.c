/* optimizer = adamw on the parameter server (server/adamw.h), in process (pushes through the test hook
 * ps_server_inject), against an independent float64 reference written here: torch.optim.AdamW's update
 * (torch 1.13 _single_tensor_adamw: w *= 1 - lr wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
 * w -= lr / (1 - b1^t) m / (sqrt(v) / sqrt(1 - b2^t) + eps), t counting the steps that ran) over
 *  - the whole table every step (pfc_update = dense: an unsampled row has g = 0 and still moves), and
 *  - the pushed rows only (pfc_update = sparse: lazy AdamW with the global t),
 * with 2 workers whose pushes overlap on some rows (gradients summed), two steps the loss scaler skipped (empty
 * pushes flagged PS_PUSH_SKIPPED: no update, t does not count them), a class never pushed, a warmup lr, and
 * D = 19 (no vector width divides it). Checks:
 * 1. dense: the pulled rows (shard_gather_at, the skipped steps replayed on a copy) after 14 steps equal the
 *    reference's weights within the tolerance below;
 * 2. a checkpoint of that table (snapshot) loaded into a sparse AdamW server (rows brought up to date at the
 *    load) holds, bit for bit, the weights the pull computed ("replay at pull" = "replay at snapshot"), and
 *    the reference's two moments;
 * 3. resume: the same checkpoint loaded into a dense AdamW server and both servers given 6 more steps: their
 *    checksums (weights and both moments of every row as after step 20) are equal;
 * 4. dense: one more step pushing every class (every row brought up to date by the apply): every stored
 *    weight and moment vs the reference after 21 steps;
 * 5. sparse: a sparse AdamW server given the same 21 steps vs the lazy reference (a row never pushed keeps its
 *    initial value exactly, m = v = 0);
 * 6. an AdamW checkpoint loaded by an SGD server, and an SGD one by an AdamW server: refused naming the
 *    optimizer;
 * 7. pretrained_centers under AdamW: a safetensors file (written here byte by byte) of `weight` alone loads
 *    (the rows equal the file's, both moments 0); one with a `momentum` tensor, and an arcface_torch
 *    checkpoint_gpu file (a zip), are refused naming the file;
 * 8. adamw_replay (4 lanes at a time, every step in registers) gives the bits of adamw_row_f32 with a zero
 *    gradient run step after step (D = 19: the lanes and the scalar tail), and the step counts skip a NaN lr.
 * Tolerance per value x with float64 reference r: |x - r| <= 1e-5 |r| + 1e-5 sum(lr) for weights (a few
 * float32 roundings of w and of each step's update, whose size is at most about lr), 1e-5 |r| + 1e-9 for the
 * moments (gradients are ~1e-2). A wrong bias correction moves a weight by ~0.1 lr = 5e-3, a missing decay
 * (wd = 0.5) by 2.5% of it, a replay that forgets v's decay moves v by 0.1% per step: all far outside. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/fabric.h"
#include "common/log.h"
#include "proto/ps_wire.h"
#include "server/adamw.h"
#include "server/dense.h"
#include "server/ps_server.h"
#include "server/shard.h"
#include "server/snapshot.h"
#include "tests/server/ps_server_inject.h"
#include "tests/check.h"

enum { C = 40, D = 19, W = 2, T1 = 14, T2 = 20, NEVER = 39 };
static const double WD = 0.5, B1 = 0.9, B2 = 0.999, EPS = 1e-8;
static const uint64_t SEED = 5;


static float lr_of(int64_t t)
{
    return (float)(t < 4 ? 0.05 * (double)(t + 1) / 4.0 : 0.05 * (1.0 - (double)(t - 4) / 60.0));
}

static int skipped(int64_t t)
{
    return t == 3 || t == 9;
}

/* Whether worker w pushes class c at step t (the last step: every class but NEVER, by worker 0). */
static int pushes(int w, int64_t t, int64_t c)
{
    if (c == NEVER || skipped(t))
        return 0;
    if (t == T2)
        return w == 0;
    if (c == 0 && t % 4 == 0)
        return 1; /* both workers: summed */
    return (c * 7 + t * 3 + w * 5) % 5 == 0;
}

static float grad_of(int w, int64_t t, int64_t c, int j)
{
    return (float)((int)((c * 31 + j * 17 + t * 13 + w * 7) % 61) - 30) * 1e-3f;
}

static ps_server *make(int dense, int adamw, int64_t start_step)
{
    ps_server_opts o = {.provider = "tcp",
                        .dense = dense,
                        .adamw = adamw,
                        .rank = 0,
                        .servers = 1,
                        .workers = W,
                        .dim = D,
                        .num_classes = C,
                        .seed = SEED,
                        .momentum = 0.9,
                        .weight_decay = WD,
                        .apply_threads = 1,
                        .recv_bufs = 2,
                        .start_step = start_step};
    ps_server *s = NULL;
    if (ps_server_create(&o, &s) < 0) {
        printf("FAIL: ps_server_create: %s\n", pf_errmsg());
        exit(1);
    }
    uint8_t a[FAB_MAX_ADDR];
    size_t la = sizeof a;
    if (ps_server_getname(s, a, &la) < 0 || ps_server_add_worker(s, 0, a, la) < 0 ||
        ps_server_add_worker(s, 1, a, la) < 0)
        exit(1);
    return s;
}

/* Both workers' pushes of step t (one message each: at most C rows of D = 19 floats). */
static void step(ps_server *s, int64_t t)
{
    for (int w = 0; w < W; w++) {
        static uint64_t buf[(sizeof(ps_hdr) + (size_t)C * (8 + 4 * D)) / 8 + 1]; /* 8-byte aligned */
        uint8_t *msg = (uint8_t *)buf;
        int64_t *ids = (int64_t *)(void *)(msg + sizeof(ps_hdr));
        uint32_t n = 0;
        for (int64_t c = 0; c < C; c++)
            if (pushes(w, t, c))
                ids[n++] = c;
        float *g = (float *)(ids + n);
        for (uint32_t i = 0; i < n; i++)
            for (int j = 0; j < D; j++)
                g[(size_t)i * D + j] = grad_of(w, t, ids[i], j);
        ps_hdr h = {.magic = PS_MAGIC,
                    .version = PS_VERSION,
                    .op = PS_OP_PUSH,
                    .client = w,
                    .step = t,
                    .n = n,
                    .dim = D,
                    .dtype = PS_DT_FP32,
                    .chunk = 0,
                    .nchunks = 1,
                    .lr = lr_of(t),
                    .flags = skipped(t) ? PS_PUSH_SKIPPED : 0};
        memcpy(msg, &h, sizeof h);
        ps_server_inject(s, msg, sizeof h + (size_t)n * (8 + 4 * D));
    }
}

/* The float64 reference: the table after steps 0 .. last (dense: every row every step; else the pushed rows). */
typedef struct ref {
    double w[C][D], m[C][D], v[C][D];
} ref;

static void ref_run(ref *R, int dense, int64_t last)
{
    memset(R, 0, sizeof *R);
    for (int64_t c = 0; c < C; c++) {
        float row[D];
        shard_init_row(SEED, c, D, row);
        for (int j = 0; j < D; j++)
            R->w[c][j] = row[j];
    }
    int64_t n = 0;
    for (int64_t t = 0; t <= last; t++) {
        if (skipped(t))
            continue;
        n++;
        const double lr = lr_of(t), bc1 = 1.0 - pow(B1, (double)n), bc2 = 1.0 - pow(B2, (double)n);
        for (int64_t c = 0; c < C; c++) {
            const int any = pushes(0, t, c) || pushes(1, t, c);
            if (!dense && !any)
                continue;
            for (int j = 0; j < D; j++) {
                double g = 0;
                for (int w = 0; w < W; w++)
                    if (pushes(w, t, c))
                        g += grad_of(w, t, c, j);
                R->w[c][j] *= 1.0 - lr * WD;
                R->m[c][j] = B1 * R->m[c][j] + (1.0 - B1) * g;
                R->v[c][j] = B2 * R->v[c][j] + (1.0 - B2) * g * g;
                R->w[c][j] -= lr / bc1 * R->m[c][j] / (sqrt(R->v[c][j]) / sqrt(bc2) + EPS);
            }
        }
    }
}

static double lr_sum(int64_t last)
{
    double s = 0;
    for (int64_t t = 0; t <= last; t++)
        s += skipped(t) ? 0 : lr_of(t);
    return s;
}

/* Compares n values x[c][j] (row stride D) against r; returns the count outside tolerance, printing the
 * first. */
static int compare(const char *what, const float *x, const double (*r)[D], double abs_tol)
{
    int bad = 0;
    double worst = 0;
    for (int64_t c = 0; c < C; c++)
        for (int j = 0; j < D; j++) {
            const double e = fabs((double)x[c * D + j] - r[c][j]), tol = 1e-5 * fabs(r[c][j]) + abs_tol;
            if (e / tol > worst)
                worst = e / tol;
            if (!(e <= tol) && bad++ == 0)
                printf("FAIL %s: class %lld element %d: %.9g, reference %.9g (error %.3g > %.3g)\n", what,
                       (long long)c, j, (double)x[c * D + j], r[c][j], e, tol);
        }
    printf("%s: %s (worst error %.3g of the tolerance)\n", what, bad ? "FAIL" : "ok", worst);
    return bad;
}

/* The pulled weights of every class as after `target` steps (shard_gather_at: the table is not changed). */
static void pull_all(ps_server *s, int64_t target, float *out)
{
    int64_t ids[C];
    for (int64_t c = 0; c < C; c++)
        ids[c] = c;
    dense_cache dc;
    if (dense_cache_init(&dc, D) < 0)
        exit(1);
    shard_gather_at((shard *)ps_server_shard(s), ids, C, PS_DT_FP32, out, target, &dc);
    dense_cache_free(&dc);
}

/* A safetensors file (8-byte little-endian header length, the JSON header, the data) of a C x D F32 tensor
 * `weight`, and with `mom` a second one `momentum` (the same values). */
static void write_safetensors(const char *path, const float *x, int mom)
{
    const size_t n = sizeof(float) * C * D;
    char hdr[512];
    int len = mom ? snprintf(hdr, sizeof hdr,
                             "{\"weight\":{\"dtype\":\"F32\",\"shape\":[%d,%d],\"data_offsets\":[0,%zu]},"
                             "\"momentum\":{\"dtype\":\"F32\",\"shape\":[%d,%d],\"data_offsets\":[%zu,%zu]}}",
                             C, D, n, C, D, n, 2 * n)
                  : snprintf(hdr, sizeof hdr,
                             "{\"weight\":{\"dtype\":\"F32\",\"shape\":[%d,%d],\"data_offsets\":[0,%zu]}}", C,
                             D, n);
    while (len % 8) /* the data 8-byte aligned, as safetensors writers pad with spaces */
        hdr[len++] = ' ';
    const uint64_t hl = (uint64_t)len;
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(&hl, 8, 1, f) != 1 || fwrite(hdr, 1, (size_t)len, f) != (size_t)len ||
        fwrite(x, 1, n, f) != n || (mom && fwrite(x, 1, n, f) != n) || fclose(f) != 0) {
        printf("FAIL: cannot write %s\n", path);
        exit(1);
    }
}

static void checkpoint(ps_server *s, const char *dir, int64_t at)
{
    snap_job *j = NULL;
    ckpt_ident id;
    memset(&id, 0, sizeof id);
    if (snap_start((shard *)ps_server_shard(s), dir, at, &id, NULL, &j) < 0 || snap_finish(j) < 0) {
        printf("FAIL: checkpoint %lld under %s: %s\n", (long long)at, dir, pf_errmsg());
        exit(1);
    }
}

int main(void)
{
    log_set_level(LOG_WARN);
    char dir[] = "/tmp/pfcps_test_adamw_XXXXXX", sgd_dir[256];
    if (!mkdtemp(dir))
        return 1;
    snprintf(sgd_dir, sizeof sgd_dir, "%s/sgd", dir);
    static ref R;
    static float x[C * D];

    /* 1. dense: pulled rows after T1 steps */
    ps_server *a = make(1, 1, 0);
    for (int64_t t = 0; t < T1; t++)
        step(a, t);
    ref_run(&R, 1, T1 - 1);
    static float pulled[C * D];
    pull_all(a, T1, pulled);
    fails += compare("dense: pulled weights after 14 steps", pulled, (const double(*)[D])R.w,
                     1e-5 * lr_sum(T1 - 1));

    /* 2. checkpoint T1 into a sparse AdamW server: rows replayed at the load */
    checkpoint(a, dir, T1);
    ps_server *b = make(0, 1, T1);
    CHECK(ps_server_load(b, dir, T1) == 0, "load into a sparse AdamW server: %s", pf_errmsg());
    const shard *sb = ps_server_shard(b);
    CHECK(memcmp(sb->weight, pulled, sizeof pulled) == 0,
          "the weights replayed at the checkpoint's load differ from those replayed at the pull");
    fails += compare("checkpoint 14 loaded: first moments", sb->momentum, (const double(*)[D])R.m, 1e-9);
    fails += compare("checkpoint 14 loaded: second moments", sb->sq, (const double(*)[D])R.v, 1e-9);

    /* 3. resume: a dense server from checkpoint T1, both given steps T1 .. T2-1 */
    ps_server *c = make(1, 1, T1);
    CHECK(ps_server_load(c, dir, T1) == 0, "load into a dense AdamW server: %s", pf_errmsg());
    for (int64_t t = T1; t < T2; t++) {
        step(a, t);
        step(c, t);
    }
    const uint64_t ha = shard_checksum_at((shard *)ps_server_shard(a), T2),
                   hc = shard_checksum_at((shard *)ps_server_shard(c), T2);
    CHECK(ha == hc, "resumed from checkpoint 14: checksum after step 20 %016llx, uninterrupted %016llx",
          (unsigned long long)hc, (unsigned long long)ha);
    printf("resume from checkpoint 14: checksums after 20 steps %s (%016llx)\n", ha == hc ? "equal" : "DIFFER",
           (unsigned long long)ha);

    /* 4. dense: every class pushed at step T2, stored rows vs the reference */
    step(a, T2);
    ref_run(&R, 1, T2);
    const shard *sa = ps_server_shard(a);
    pull_all(a, T2 + 1, x); /* NEVER is not pushed: its stored row owes steps, the pull replays them */
    fails += compare("dense: weights after 21 steps", x, (const double(*)[D])R.w, 1e-5 * lr_sum(T2));
    /* every row but NEVER was just applied, so its stored moments are up to date; NEVER's stay 0 (g = 0) */
    fails += compare("dense: first moments after 21 steps", sa->momentum, (const double(*)[D])R.m, 1e-9);
    fails += compare("dense: second moments after 21 steps", sa->sq, (const double(*)[D])R.v, 1e-9);
    CHECK(sa->momentum[NEVER * D] == 0.0f && sa->sq[NEVER * D] == 0.0f, "class %d was never pushed: m %g v %g",
          NEVER, (double)sa->momentum[NEVER * D], (double)sa->sq[NEVER * D]);

    /* 5. sparse (lazy) AdamW */
    ps_server *d = make(0, 1, 0);
    for (int64_t t = 0; t <= T2; t++)
        step(d, t);
    ref_run(&R, 0, T2);
    const shard *sd = ps_server_shard(d);
    pull_all(d, T2 + 1, x); /* a sparse pull: the rows as stored (NEVER generated on this first touch) */
    fails += compare("sparse: weights after 21 steps", x, (const double(*)[D])R.w, 1e-5 * lr_sum(T2));
    fails += compare("sparse: first moments", sd->momentum, (const double(*)[D])R.m, 1e-9);
    fails += compare("sparse: second moments", sd->sq, (const double(*)[D])R.v, 1e-9);
    float init[D];
    shard_init_row(SEED, NEVER, D, init);
    CHECK(memcmp(x + NEVER * D, init, sizeof init) == 0 && sd->momentum[NEVER * D] == 0.0f &&
              sd->sq[NEVER * D] == 0.0f,
          "sparse: class %d, never pushed, moved", NEVER);

    /* 6. the optimizer state does not cross optimizers */
    ps_server *e = make(1, 0, T1);
    CHECK(ps_server_load(e, dir, T1) < 0 && strstr(pf_errmsg(), "optimizer = adamw") &&
              strstr(pf_errmsg(), "this run has optimizer = sgd"),
          "an AdamW checkpoint loaded by an SGD server: %s", pf_errmsg());
    printf("AdamW checkpoint into an SGD server: %s\n", pf_errmsg());
    ps_server *f = make(1, 0, 0);
    for (int64_t t = 0; t < 2; t++)
        step(f, t);
    checkpoint(f, sgd_dir, 2);
    ps_server *g = make(1, 1, 2);
    CHECK(ps_server_load(g, sgd_dir, 2) < 0 && strstr(pf_errmsg(), "optimizer = sgd") &&
              strstr(pf_errmsg(), "this run has optimizer = adamw"),
          "an SGD checkpoint loaded by an AdamW server: %s", pf_errmsg());
    printf("SGD checkpoint into an AdamW server: %s\n", pf_errmsg());

    /* 7. pretrained_centers */
    char st1[300], st2[300], pt[300];
    snprintf(st1, sizeof st1, "%s/weight.safetensors", dir);
    snprintf(st2, sizeof st2, "%s/momentum.safetensors", dir);
    snprintf(pt, sizeof pt, "%s/checkpoint_gpu_0.pt", dir);
    static float tab[C * D];
    for (int i = 0; i < C * D; i++)
        tab[i] = (float)((i % 23) - 11) * 1e-3f;
    write_safetensors(st1, tab, 0);
    write_safetensors(st2, tab, 1);
    static const char not_zip[] = "PK\3\4 not really a zip";
    FILE *zf = fopen(pt, "wb");
    if (!zf || fwrite(not_zip, 1, sizeof not_zip - 1, zf) != sizeof not_zip - 1 || fclose(zf) != 0)
        return 1;
    ps_server *h = make(1, 1, 0);
    CHECK(ps_server_load_centers(h, st1) == 0, "weights only under adamw: %s", pf_errmsg());
    const shard *sh7 = ps_server_shard(h);
    CHECK(memcmp(sh7->weight, tab, sizeof tab) == 0, "pretrained_centers: the rows differ from the file's");
    int nz = 0;
    for (int i = 0; i < C * D; i++)
        nz += sh7->momentum[i] != 0.0f || sh7->sq[i] != 0.0f;
    CHECK(nz == 0, "pretrained_centers: %d moments are not 0", nz);
    ps_server *i2 = make(1, 1, 0);
    CHECK(ps_server_load_centers(i2, st2) < 0 && strstr(pf_errmsg(), "momentum.safetensors") &&
              strstr(pf_errmsg(), "optimizer = adamw"),
          "a momentum tensor under adamw: %s", pf_errmsg());
    printf("momentum under adamw: %s\n", pf_errmsg());
    ps_server *i3 = make(1, 1, 0);
    CHECK(ps_server_load_centers(i3, pt) < 0 && strstr(pf_errmsg(), "checkpoint_gpu_0.pt") &&
              strstr(pf_errmsg(), "optimizer = adamw"),
          "a checkpoint_gpu file under adamw: %s", pf_errmsg());
    printf("checkpoint_gpu under adamw: %s\n", pf_errmsg());

    /* 8. the replay's vector path against the step-by-step update */
    {
        double lrs[12];
        for (int t = 0; t < 12; t++)
            lrs[t] = t == 5 ? NAN : 0.01 * (t + 1);
        const adamw_hp hp = adamw_defaults(WD);
        adamw_coef co[12];
        adamw_coefs(&hp, lrs, 0, 11, 0, co);
        float w1[D], m1[D], v1[D], w2[D], m2[D], v2[D];
        for (int j = 0; j < D; j++) {
            w1[j] = w2[j] = grad_of(0, 1, 3, j) * 7.0f;
            m1[j] = m2[j] = grad_of(1, 2, 5, j) * 0.1f;
            v1[j] = v2[j] = grad_of(0, 3, 7, j) * grad_of(0, 3, 7, j) * 1e-3f;
        }
        adamw_replay(w1, m1, v1, D, &hp, co, 2, 11);
        for (int t = 2; t <= 11; t++)
            if (!co[t].skip)
                adamw_row_f32(w2, m2, v2, NULL, D, &hp, &co[t]);
        CHECK(!memcmp(w1, w2, sizeof w1) && !memcmp(m1, m2, sizeof m1) && !memcmp(v1, v2, sizeof v1),
              "adamw_replay differs from adamw_row_f32 step by step");
        CHECK(co[11].n == 11 && co[4].n == 5 && co[5].skip && co[5].n == 5, "step counts %lld %lld %lld",
              (long long)co[11].n, (long long)co[4].n, (long long)co[5].n);
    }

    ps_server *all[] = {a, b, c, d, e, f, g, h, i2, i3};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        ps_server_destroy(all[i]);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        printf("could not remove %s\n", dir);
    printf("%s\n", fails ? "FAILED" : "all ok");
    return fails ? 1 : 0;
}
