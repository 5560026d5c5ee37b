/* Undo logs and rollback on the parameter server (opts.undo, head_mode = global, then local;
 * server/ps_server.h: ps_server_rollback), in process: pushes go through the test hook ps_server_inject (a
 * server never started, applies on this thread), and one case rolls back through a started server's progress
 * thread. W = 3 workers,
 * C = 24 classes (class c owned by worker c mod 3, 8 rows each, about 6 pushed per step in 2 chunks), D = 7,
 * steps 0 .. N - 1 with step 2 skipped by the loss scaler (empty pushes flagged PS_PUSH_SKIPPED), for four
 * optimizers: SGD with momentum and weight decay (sparse), SGD with pfc_update = dense, AdamW (sparse), AdamW
 * dense. The abandoned attempt of step K carries other gradients and another lr than the redo, so a rollback
 * that left anything of it behind (a row, a moment, a dense row step, the lr table) shows. Checks, per optimizer:
 * (a) a reference server runs steps 0 .. N - 1; a second one runs 0 .. K - 1, then step K's pushes of workers 0
 *     and 1 (applied) and chunk 0 of worker 2's (partial), is rolled back to K at epoch 1, is given step K again
 *     at epoch 1 and runs on to N - 1: every stored bit (weights, momentum or both AdamW moments, dense row
 *     steps, the lr table) and the checksum equal the reference's; ps_server_worker_pushed follows;
 * (b) after that rollback, worker 2's chunk 1 of step K at the old epoch 0 is dropped (counted as a bad request)
 *     and changes nothing;
 * (c) a server that applied steps 0 .. K - 1 and worker 0's push of K refuses a rollback to K - 1 (worker 0's
 *     pushes of K - 1 and K are both applied) with -ERANGE, changing nothing (table, counts, epoch); it then
 *     runs on to N - 1 and equals the reference;
 * (e) the same rollback as (a), performed by a started server's progress thread (ps_server_rollback from this
 *     thread), then the redo: equal to the reference.
 * (g) (a) and (b) on a started server (progress thread, 2 apply threads) fed over the fabric by one client per
 *     worker (ps_raw), the rollback asked from this thread while it serves;
 * (h) (a) with checkpoint K asked by step K - 1's pushes (written on its own thread while step K's pushes
 *     apply): the rollback waits for it, the redo equals the reference, and the checkpoint loads into a
 *     server whose checksum equals that of one that ran steps 0 .. K - 1;
 * (i) a rollback to step SKIP after its empty pushes and step SKIP + 1's (another attempt's) pushes: the empty
 *     ones need nothing undone, so it is done, and the redo equals the reference;
 * (f) (a) and (b) again with 3 apply threads (ps_server_inject_pool: the rows of one push, and so the slots of
 *     its log, split among them), against a reference server without undo logs.
 * And once: (d) SGD, one row of worker 0 pushed at step K: after the rollback it holds the bits it had before
 * step K, and after the redo it equals a float64 step computed here from those values (torch.optim.SGD,
 * dampening 0: v = mu v + (g + wd w); w = w - lr v) within float32 rounding; a rollback on a server without
 * undo logs is refused with -EINVAL. Then (j), head_mode = local, for the four optimizers (case_local). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/fabric.h"
#include "common/log.h"
#include "proto/ps_wire.h"
#include "server/ps_server.h"
#include "server/shard.h"
#include "tests/check.h"
#include "tests/server/ps_server_inject.h"
#include "tests/server/pst_inproc.h"
#include "worker/ps_client.h"
#include "worker/ps_client_hooks.h"

enum { C = 24, D = 7, W = 3, N = 9, K = 5, SKIP = 2, ROW_D = 3 /* class 3: worker 0, pushed at step K */ };
static const double MU = 0.9, WD = 0.05;

typedef struct cfg {
    const char *name;
    int dense, adamw;
} cfg;

static float lr_of(int64_t t, int attempt)
{
    return attempt ? 0.37f : (float)(0.1 - 0.005 * (double)t);
}

static int g_local; /* 1: head_mode = local: the servers made in local mode, the workers' rows shared */

/* Whether worker w pushes class c at step t. Global mode: its own classes only (c mod W == w). Local mode:
 * workers 0 and 1 push overlapping sets of any class and worker 2 a subset of worker 0's, so every row of
 * worker 2's push (and some of worker 1's) is logged in another worker's undo log. */
static int pushes(int w, int64_t t, int64_t c)
{
    if (t == SKIP)
        return 0;
    if (g_local)
        return w == 1 ? (c * 5 + t) % 3 != 0 : (c * 7 + t * 3) % 4 != 0 && (w == 0 || c % 2 == 0);
    if (c % W != w)
        return 0;
    return c == ROW_D || (c * 7 + t * 3) % 4 != 0;
}

static float grad_of(int w, int64_t t, int64_t c, int j, int attempt)
{
    return (float)((int)((c * 31 + j * 17 + t * 13 + w * 7 + attempt * 29) % 61) - 30) * 1e-2f;
}

static const char *g_snap_root; /* set: the servers' snapshot root, and step SNAP_AT's pushes ask for checkpoint K */
enum { SNAP_AT = K - 1 };
static int apply_threads = 1; /* the servers' opts.apply_threads */
static int inject_pool;       /* 1: the apply threads run the injected pushes' applies (ps_server_inject_pool) */

static ps_server *make_at(const cfg *k, int global, int undo, int64_t start_step)
{
    ps_server_opts o = {.provider = "tcp",
                        .dense = k->dense,
                        .adamw = k->adamw,
                        .global_mode = global,
                        .undo = undo,
                        .rank = 0,
                        .servers = 1,
                        .workers = W,
                        .dim = D,
                        .num_classes = C,
                        .seed = 11,
                        .momentum = MU,
                        .weight_decay = WD,
                        .apply_threads = apply_threads,
                        .recv_bufs = 2,
                        .snapshot_root = g_snap_root,
                        .start_step = start_step};
    ps_server *s = NULL;
    int rc = ps_server_create(&o, &s);
    if (rc < 0)
        return NULL;
    uint8_t a[FAB_MAX_ADDR];
    size_t la = sizeof a;
    if (ps_server_getname(s, a, &la) < 0)
        DIE("getname: %s", pf_errmsg());
    for (int w = 0; w < W; w++)
        if (ps_server_add_worker(s, w, a, la) < 0)
            DIE("add_worker: %s", pf_errmsg());
    if (inject_pool && ps_server_inject_pool(s) < 0)
        DIE("apply threads: %s", pf_errmsg());
    return s;
}

static ps_server *make(const cfg *k, int global, int undo)
{
    return make_at(k, global, undo, 0);
}

/* Chunk ci (of 2) of worker w's push of step t at membership epoch `epoch`; attempt 1: the abandoned attempt's
 * gradients and lr. */
static ps_client *g_cli[W]; /* set: pushes go to a started server over the fabric (ps_raw), else injected */
static int g_raw_rc;          /* the last ps_raw's status */

static void push_chunk(ps_server *s, int w, int64_t t, int ci, uint32_t epoch, int attempt)
{
    static uint64_t buf[(sizeof(ps_hdr) + (size_t)C * (8 + 4 * D)) / 8 + 1];
    uint8_t *msg = (uint8_t *)buf;
    int64_t *ids = (int64_t *)(void *)(msg + sizeof(ps_hdr));
    int64_t all[C];
    uint32_t na = 0, n = 0;
    for (int64_t c = 0; c < C; c++)
        if (pushes(w, t, c))
            all[na++] = c;
    for (uint32_t i = ci ? na / 2 : 0; i < (ci ? na : na / 2); i++)
        ids[n++] = all[i];
    float *g = (float *)(ids + n);
    for (uint32_t i = 0; i < n; i++)
        for (int j = 0; j < D; j++)
            g[(size_t)i * D + j] = grad_of(w, t, ids[i], j, attempt);
    ps_hdr h = {.magic = PS_MAGIC,
                .version = PS_VERSION,
                .op = PS_OP_PUSH,
                .client = w,
                .step = t,
                .n = n,
                .dim = D,
                .dtype = PS_DT_FP32,
                .chunk = (uint16_t)ci,
                .nchunks = 2,
                .lr = lr_of(t, attempt),
                .flags = (uint16_t)((t == SKIP ? PS_PUSH_SKIPPED : 0) |
                                    (g_snap_root && t == SNAP_AT ? PS_PUSH_SNAPSHOT : 0)),
                .epoch = epoch};
    memcpy(msg, &h, sizeof h);
    const size_t len = sizeof h + (size_t)n * (8 + 4 * D);
    if (g_cli[w]) /* a message of an older epoch gets no reply: a short wait */
        g_raw_rc = ps_raw(g_cli[w], 0, msg, len, epoch < ps_server_epoch(s) ? 0.2 : 10);
    else
        ps_server_inject(s, msg, len);
}

static void push_full(ps_server *s, int w, int64_t t, uint32_t epoch, int attempt)
{
    push_chunk(s, w, t, 0, epoch, attempt);
    push_chunk(s, w, t, 1, epoch, attempt);
}

static void run_steps(ps_server *s, int64_t from, int64_t to, uint32_t epoch)
{
    for (int64_t t = from; t < to; t++)
        for (int w = 0; w < W; w++)
            push_full(s, w, t, epoch, 0);
}

/* Every stored bit of the shard: weights, momentum / first moment, second moment, dense row steps, lr table
 * (every row generated first in both: a row first touched by an undone push is generated, and restored to its
 * initial value, while the other server may not have generated it yet). */
static int same_table(ps_server *a, ps_server *b)
{
    shard_checksum((shard *)ps_server_shard(a));
    shard_checksum((shard *)ps_server_shard(b));
    const shard *x = ps_server_shard(a), *y = ps_server_shard(b);
    const size_t n = (size_t)x->rows * D * sizeof(float);
    if (memcmp(x->weight, y->weight, n) || memcmp(x->momentum, y->momentum, n))
        return 0;
    if (x->adam && memcmp(x->sq, y->sq, n))
        return 0;
    if (x->dense && memcmp(x->rstep, y->rstep, sizeof(int64_t) * (size_t)x->rows))
        return 0;
    if ((x->dense || x->adam) &&
        (x->lr_hi != y->lr_hi || memcmp(x->step_lr, y->step_lr, sizeof(double) * (size_t)x->lr_hi)))
        return 0;
    return 1;
}

/* Both servers' checksums of the table as after `steps` steps (generates every row of both). */
static int same_checksum(ps_server *a, ps_server *b, int64_t steps)
{
    return shard_checksum_at((shard *)ps_server_shard(a), steps) ==
           shard_checksum_at((shard *)ps_server_shard(b), steps);
}

/* Steps 0 .. K - 1, then step K of the abandoned attempt: workers 0 and 1 complete, worker 2 chunk 0 only. */
static void run_to_abandoned_k(ps_server *s)
{
    run_steps(s, 0, K, 0);
    push_full(s, 0, K, 0, 1);
    push_full(s, 1, K, 0, 1);
    push_chunk(s, 2, K, 0, 0, 1);
}

/* (a), (b): rollback on a never-started server; (e) on a started one. */
static void case_rollback(const cfg *k, ps_server *ref, int started)
{
    const char *how = started ? "progress thread" : "caller's thread";
    ps_server *s = make(k, 1, 1);
    run_to_abandoned_k(s);
    CHECK(ps_server_worker_pushed(s, 0) == K + 1 && ps_server_worker_pushed(s, 2) == K, "%s: pushed counts",
          k->name);
    if (started && ps_server_start(s) < 0)
        DIE("start: %s", pf_errmsg());
    int rc = ps_server_rollback(s, K, 1, 10.0);
    if (started)
        ps_server_stop(s);
    check(rc == 0, "%s (%s): rollback to step %d after 2 applied and 1 partial push: %d %s", k->name, how, K, rc,
          rc ? pf_errmsg() : "");
    ps_stat st;
    ps_server_stat(s, &st);
    check(ps_server_worker_pushed(s, 0) == K && ps_server_worker_pushed(s, 1) == K &&
              ps_server_worker_pushed(s, 2) == K && st.steps_done == K && st.partial_chunks == 0 &&
              ps_server_epoch(s) == 1,
          "%s (%s): after the rollback every worker has pushed %d steps, %lld done, no partial push, epoch 1",
          k->name, how, K, (long long)st.steps_done);
    if (!started) { /* (b) a late chunk of the abandoned attempt (epoch 0) */
        ps_server *chk = make(k, 1, 1);
        run_steps(chk, 0, K, 0);
        push_chunk(s, 2, K, 1, 0, 1);
        ps_stat st2;
        ps_server_stat(s, &st2);
        check(st2.bad_requests == st.bad_requests + 1 && st2.partial_chunks == 0 &&
                  ps_server_worker_pushed(s, 2) == K && same_table(s, chk),
              "%s: a late chunk of epoch 0 after the rollback is dropped and changes nothing", k->name);
        ps_server_destroy(chk);
    }
    run_steps(s, K, N, 1);
    check(same_table(s, ref) && same_checksum(s, ref, N),
          "%s (%s): rolled back at step %d and redone: every bit equals the uninterrupted run's", k->name, how, K);
    ps_server_destroy(s);
}

/* (c): a rollback over two applied steps of one worker is refused and changes nothing. */
static void case_refused(const cfg *k, ps_server *ref)
{
    ps_server *s = make(k, 1, 1), *same = make(k, 1, 1);
    run_steps(s, 0, K, 0);
    push_full(s, 0, K, 0, 0);
    run_steps(same, 0, K, 0);
    push_full(same, 0, K, 0, 0);
    ps_stat a, b;
    ps_server_stat(s, &a);
    int rc = ps_server_rollback(s, K - 1, 1, 10.0);
    const char *why = rc ? pf_errmsg() : "";
    ps_server_stat(s, &b);
    check(rc == -ERANGE && strstr(why, "worker 0") && same_table(s, same) && b.steps_done == a.steps_done &&
              ps_server_worker_pushed(s, 0) == K + 1 && ps_server_epoch(s) == 0,
          "%s: rollback to %d over worker 0's applied steps %d and %d refused, nothing changed: %d (%s)", k->name,
          K - 1, K - 1, K, rc, why);
    for (int w = 1; w < W; w++)
        push_full(s, w, K, 0, 0);
    run_steps(s, K + 1, N, 0);
    check(same_table(s, ref) && same_checksum(s, ref, N), "%s: after the refused rollback the run equals the "
          "uninterrupted one", k->name);
    ps_server_destroy(s);
    ps_server_destroy(same);
}

/* (i): pushes that move no row leave the logs as they are (a gradient_acc window's steps before its last push
 * none). After step SKIP (every push empty) and step SKIP + 1's abandoned attempt, every worker has two applied
 * steps >= SKIP, only the second of them moving rows: a rollback to SKIP undoes it, and the redo from SKIP
 * equals the uninterrupted run. */
static void case_over_empty(const cfg *k, ps_server *ref)
{
    ps_server *s = make(k, 1, 1);
    run_steps(s, 0, SKIP + 1, 0);
    for (int w = 0; w < W; w++)
        push_full(s, w, SKIP + 1, 0, 1);
    int rc = ps_server_rollback(s, SKIP, 1, 10.0);
    check(rc == 0 && ps_server_worker_pushed(s, 0) == SKIP,
          "%s: rollback to step %d over an applied step without rows (%d) and one with rows (%d): %d %s", k->name,
          SKIP, SKIP, SKIP + 1, rc, rc ? pf_errmsg() : "");
    run_steps(s, SKIP, N, 1);
    check(same_table(s, ref) && same_checksum(s, ref, N),
          "%s: rolled back over the empty step and redone: every bit equals the uninterrupted run's", k->name);
    ps_server_destroy(s);
}

/* (g): a started server (progress thread, 2 apply threads) fed over the fabric by W clients: the abandoned
 * attempt of step K, a rollback from this thread while it serves, a late chunk of the old epoch, the redo. */
static void case_fabric(const cfg *k, ps_server *ref)
{
    apply_threads = 2;
    ps_server *s = make(k, 1, 1);
    apply_threads = 1;
    for (int w = 0; w < W; w++) {
        ps_client_opts o = {.provider = "tcp", .rank = w, .servers = 1, .num_classes = C, .dim = D};
        if (ps_client_create(&o, &g_cli[w]) < 0)
            DIE("client %d: %s", w, pf_errmsg());
    }
    if (pst_connect_inproc(&s, 1, g_cli, W, 5.0) < 0)
        DIE("connect: %s", pf_errmsg());
    run_to_abandoned_k(s);
    int rc = ps_server_rollback(s, K, 1, 10.0);
    check(rc == 0 && ps_server_worker_pushed(s, 0) == K && ps_server_worker_pushed(s, 2) == K,
          "%s (fabric): rollback to %d while serving: %d %s", k->name, K, rc, rc ? pf_errmsg() : "");
    push_chunk(s, 2, K, 1, 0, 1);
    check(g_raw_rc == -ETIMEDOUT && ps_server_worker_pushed(s, 2) == K,
          "%s (fabric): a late chunk of epoch 0 gets no answer and completes no push (%d)", k->name, g_raw_rc);
    run_steps(s, K, N, 1);
    ps_server_stop(s);
    check(same_table(s, ref) && same_checksum(s, ref, N),
          "%s (fabric): rolled back while serving and redone: every bit equals the uninterrupted run's", k->name);
    for (int w = 0; w < W; w++) {
        ps_client_destroy(g_cli[w]);
        g_cli[w] = NULL;
    }
    ps_server_destroy(s);
}

/* (h): step SNAP_AT's pushes ask for checkpoint K, written on its own thread while step K's pushes apply (copy
 * on update); the rollback to K waits for it; the redo equals the reference and the checkpoint holds the table
 * after K steps. */
static void case_snapshot(const cfg *k, ps_server *ref)
{
    char root[] = "/tmp/pfcps_test_undo_XXXXXX", cmd[64];
    if (!mkdtemp(root))
        DIE("mkdtemp");
    g_snap_root = root;
    ps_server *s = make(k, 1, 1), *at_k = make(k, 1, 1);
    run_to_abandoned_k(s);
    int rc = ps_server_rollback(s, K, 1, 10.0);
    check(rc == 0, "%s (snapshot): rollback to %d with checkpoint %d asked at step %d: %d %s", k->name, K, K,
          SNAP_AT, rc, rc ? pf_errmsg() : "");
    run_steps(s, K, N, 1);
    check(same_table(s, ref) && same_checksum(s, ref, N),
          "%s (snapshot): rolled back and redone: every bit equals the uninterrupted run's", k->name);
    run_steps(at_k, 0, K, 0);
    g_snap_root = NULL;
    ps_server *loaded = make_at(k, 1, 1, K);
    rc = ps_server_load(loaded, root, K);
    check(rc == 0 && same_checksum(loaded, at_k, K), "%s (snapshot): checkpoint %d holds the table after %d steps",
          k->name, K, K);
    ps_server_destroy(s);
    ps_server_destroy(at_k);
    ps_server_destroy(loaded);
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0)
        printf("warning: %s failed\n", cmd);
}

/* (j) head_mode = local: the W pushes of a step are summed per row and applied together once all are in, and
 * a row several workers pushed is logged once, in the first one's log (worker 2's pushes log nothing). The
 * abandoned attempt: steps 0 .. K - 1, step K from every worker (applied), then step K + 1 from worker 0
 * (chunk 0 only) and worker 1 (whole; waits for worker 2's). A rollback to K (on this thread, or on a started
 * server's progress thread) restores step K's rows and drops the rest; a late chunk of the old epoch is
 * dropped; the redo equals the uninterrupted local run. A rollback to K - 1 after step K was applied is
 * refused (two of worker 0's applied steps moved rows), changing nothing. */
static void case_local(const cfg *k, ps_server *ref, int started)
{
    const char *how = started ? "progress thread" : inject_pool ? "3 apply threads" : "caller's thread";
    ps_server *s = make(k, 0, 1);
    if (!s)
        DIE("%s (local): %s", k->name, pf_errmsg());
    run_steps(s, 0, K, 0);
    for (int w = 0; w < W; w++)
        push_full(s, w, K, 0, 1);
    push_chunk(s, 0, K + 1, 0, 0, 1);
    push_full(s, 1, K + 1, 0, 1);
    ps_stat st;
    ps_server_stat(s, &st);
    CHECK(st.steps_done == K + 1, "%s (local): step %d applied before the rollback (%lld done)", k->name, K,
          (long long)st.steps_done);
    if (!started) {
        ps_server *same = make(k, 0, 1);
        run_steps(same, 0, K, 0);
        for (int w = 0; w < W; w++)
            push_full(same, w, K, 0, 1);
        int rc = ps_server_rollback(s, K - 1, 1, 10.0);
        const char *why = rc ? pf_errmsg() : "";
        check(rc == -ERANGE && strstr(why, "worker 0") && same_table(s, same) && ps_server_epoch(s) == 0,
              "%s (local): rollback to %d over applied steps %d and %d refused, nothing changed: %d (%s)",
              k->name, K - 1, K - 1, K, rc, why);
        ps_server_destroy(same);
    }
    if (started && ps_server_start(s) < 0)
        DIE("start: %s", pf_errmsg());
    int rc = ps_server_rollback(s, K, 1, 10.0);
    if (started)
        ps_server_stop(s);
    ps_server_stat(s, &st);
    check(rc == 0 && st.steps_done == K && st.partial_chunks == 0 && ps_server_worker_pushed(s, 1) == K,
          "%s (local, %s): rollback to step %d after step %d applied and step %d in part: %d %s", k->name,
          how, K, K, K + 1, rc, rc ? pf_errmsg() : "");
    if (!started) {
        push_chunk(s, 0, K + 1, 1, 0, 1);
        ps_stat st2;
        ps_server_stat(s, &st2);
        check(st2.bad_requests == st.bad_requests + 1 && st2.partial_chunks == 0,
              "%s (local): a late chunk of epoch 0 after the rollback is dropped", k->name);
    }
    run_steps(s, K, N, 1);
    check(same_table(s, ref) && same_checksum(s, ref, N),
          "%s (local, %s): rolled back at step %d and redone: every bit equals the uninterrupted run's",
          k->name, how, K);
    ps_server_destroy(s);
}

/* (d): one row, SGD, by hand in float64. */
static void case_by_hand(void)
{
    const cfg k = {"sgd", 0, 0};
    ps_server *s = make(&k, 1, 1);
    const shard *sh = ps_server_shard(s);
    const int64_t r = ROW_D; /* one server: local row = class */
    run_steps(s, 0, K, 0);
    float w0[D], v0[D];
    memcpy(w0, sh->weight + r * D, sizeof w0);
    memcpy(v0, sh->momentum + r * D, sizeof v0);
    push_full(s, 0, K, 0, 1);
    int moved = memcmp(w0, sh->weight + r * D, sizeof w0) != 0;
    int rc = ps_server_rollback(s, K, 1, 10.0);
    check(moved && rc == 0 && !memcmp(w0, sh->weight + r * D, sizeof w0) &&
              !memcmp(v0, sh->momentum + r * D, sizeof v0),
          "by hand: class %d moved at step %d and the rollback restored its bits", ROW_D, K);
    push_full(s, 0, K, 1, 0);
    /* The float32 step rounds each of its 6 operations: its error is within a few float epsilons of the sizes
     * of the terms (ratio below: error / (4 eps x the terms' magnitude), 1 at the bound). */
    double worst = 0;
    const double lr = lr_of(K, 0), eps = 1.1920929e-7;
    for (int j = 0; j < D; j++) {
        double g = grad_of(0, K, ROW_D, j, 0), v = MU * v0[j] + (g + WD * w0[j]), w = w0[j] - lr * v;
        double mv = MU * fabs(v0[j]) + fabs(g) + WD * fabs(w0[j]), mw = fabs(w0[j]) + lr * mv;
        worst = fmax(worst, fabs(sh->momentum[r * D + j] - v) / (4 * eps * mv));
        worst = fmax(worst, fabs(sh->weight[r * D + j] - w) / (4 * eps * mw));
    }
    check(worst <= 1.0, "by hand: class %d after the redo of step %d = the float64 SGD step (v = mu v + g + wd w; "
          "w -= lr v) from its restored values (error %.3g of 4 float32 epsilons of the terms)", ROW_D, K, worst);
    ps_server_destroy(s);
}

int main(void)
{
    log_set_level(LOG_ERROR);
    ps_server *plain = make(&(cfg){"sgd", 0, 0}, 1, 0);
    check(ps_server_rollback(plain, 0, 1, 1.0) == -EINVAL, "rollback without undo logs refused: %s", pf_errmsg());
    ps_server_destroy(plain);
    const cfg cfgs[] = {{"sgd", 0, 0}, {"dense", 1, 0}, {"adamw", 0, 1}, {"adamw dense", 1, 1}};
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        ps_server *ref = make(&cfgs[i], 1, 1);
        run_steps(ref, 0, N, 0);
        case_rollback(&cfgs[i], ref, 0);
        case_rollback(&cfgs[i], ref, 1);
        case_refused(&cfgs[i], ref);
        case_over_empty(&cfgs[i], ref);
        case_fabric(&cfgs[i], ref);
        case_snapshot(&cfgs[i], ref);
        ps_server_destroy(ref);
    }
    /* (f) the same rollback with 3 apply threads saving the rows of one push's log in parallel */
    apply_threads = 3;
    inject_pool = 1;
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        ps_server *ref = make(&cfgs[i], 1, 0); /* and the reference without undo logs */
        run_steps(ref, 0, N, 0);
        case_rollback(&cfgs[i], ref, 0);
        ps_server_destroy(ref);
    }
    apply_threads = 1;
    inject_pool = 0;
    /* (j) head_mode = local, against a local reference without undo logs */
    g_local = 1;
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        ps_server *ref = make(&cfgs[i], 0, 0);
        run_steps(ref, 0, N, 0);
        case_local(&cfgs[i], ref, 0);
        case_local(&cfgs[i], ref, 1);
        apply_threads = 3;
        inject_pool = 1;
        case_local(&cfgs[i], ref, 0);
        apply_threads = 1;
        inject_pool = 0;
        ps_server_destroy(ref);
    }
    g_local = 0;
    case_by_hand();
    return check_summary();
}
