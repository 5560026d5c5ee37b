/* A failed-over server rejoining, in one process (replicas = 1; docs/architecture.md, "Hot-standby shards",
 * Rejoin): 3 servers, each a primary ps_server of shard s and a backup ps_server of shard (s - 1) mod 3, and
 * 2 clients with replicas = 1, in head_mode = global with dense updates; beside them an unreplicated
 * reference system (3 servers, 2 clients) fed the same requests. Steps 0..T-1, each client pushing step t - 1
 * and then pulling step t. At step F "server 1" (shard 1's primary, shard 0's backup) is destroyed and both
 * clients are told (epoch 1; shard 1's backup on server 2 is promoted). Steps F + 1 .. R - 1 run on single
 * copies; the push of step R - 1 asks for checkpoint R, which the serving copies write (shard 1 by its
 * promoted backup, shard 0 by its primary). A new "server 1" then loads both shards from checkpoint R (its
 * step clock at R, its copies refusing epochs before 2), and both clients put its copies back
 * (ps_client_server_back, epoch 3). At step K "server 2" is destroyed (epoch 4): shard 1 is then on the
 * rejoined copy alone. Right after the rejoin a push of step R for shard 1 carrying epoch 1 (older than the
 * rejoined copies' 2: a message meant for the copy they replace) goes to the rejoined primary: it must get no
 * answer, count as a bad request and change nothing (the real push of step R is accepted after it).
 * Checked against the reference: every pulled row of every step bit for bit and every
 * copy's table at the end (shard_checksum_at). The same run with the rejoined copies left as generated (the
 * copy skipped) must differ from the reference: the check above cannot pass without the copy. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/ckpt.h"
#include "common/err.h"
#include "common/fabric.h"
#include "server/ps_server.h"
#include "server/shard.h"
#include "worker/ps_client.h"
#include "worker/ps_client_hooks.h"

#include "tests/check.h"

#define S    3
#define W    2
#define C    3000
#define D    16
#define N    200 /* rows each client pulls and pushes per step */
#define T    12  /* steps */
#define F    3   /* server 1 is lost before step F */
#define R    6   /* the checkpoint step the rejoined server copies from */
#define K    9   /* server 2 is lost before step K */
#define SEED 37

typedef struct sys {
    ps_server *prim[S], *back[S]; /* back: NULL in the reference system */
    ps_client *cli[W];
} sys;

static char g_root[256];

static ps_server *server(int shard, int backup, const char *root, int64_t start)
{
    ps_server_opts o = {.provider = "tcp",
                        .rank = shard,
                        .servers = S,
                        .workers = W,
                        .dim = D,
                        .num_classes = C,
                        .seed = SEED,
                        .momentum = 0.9,
                        .weight_decay = 5e-4,
                        .dense = 1,
                        .global_mode = 1,
                        .apply_threads = 1,
                        .recv_bufs = 8,
                        .snapshot_root = root,
                        .snapshot_keep = 4,
                        .start_step = start,
                        .backup = backup};
    ps_server *p = NULL;
    if (ps_server_create(&o, &p) < 0)
        DIE("server %d (backup %d): %s", shard, backup, pf_errmsg());
    return p;
}

/* Gives srv every client's address. */
static void add_workers(sys *y, ps_server *srv)
{
    uint8_t b[FAB_MAX_ADDR];
    for (int w = 0; w < W; w++) {
        size_t lb = sizeof b;
        if (ps_client_getname(y->cli[w], b, &lb) < 0 || ps_server_add_worker(srv, w, b, lb) < 0)
            DIE("client %d's address: %s", w, pf_errmsg());
    }
}

/* Connects srv (copy `copy` of shard s) with every client, both ways. */
static void connect(sys *y, ps_server *srv, int s, int copy)
{
    uint8_t a[FAB_MAX_ADDR];
    size_t la = sizeof a;
    add_workers(y, srv);
    if (ps_server_getname(srv, a, &la) < 0)
        DIE("%s", pf_errmsg());
    for (int w = 0; w < W; w++)
        if (ps_client_add_copy(y->cli[w], s, copy, a, la) < 0)
            DIE("connecting shard %d copy %d and client %d: %s", s, copy, w, pf_errmsg());
}

static void make(sys *y, int replicas)
{
    memset(y, 0, sizeof *y);
    for (int w = 0; w < W; w++) {
        ps_client_opts o = {
            .provider = "tcp", .rank = w, .servers = S, .num_classes = C, .dim = D, .replicas = replicas};
        if (ps_client_create(&o, &y->cli[w]) < 0)
            DIE("client %d: %s", w, pf_errmsg());
    }
    for (int s = 0; s < S; s++) {
        y->prim[s] = server(s, 0, replicas ? g_root : NULL, 0);
        connect(y, y->prim[s], s, 0);
        if (replicas) {
            y->back[s] = server(s, 1, g_root, 0);
            connect(y, y->back[s], s, 1);
        }
    }
    for (int s = 0; s < S; s++)
        if (ps_server_start(y->prim[s]) < 0 || (y->back[s] && ps_server_start(y->back[s]) < 0))
            DIE("starting shard %d: %s", s, pf_errmsg());
    for (int w = 0; w < W; w++)
        if (ps_client_warmup(y->cli[w], 10) < 0)
            DIE("warm-up of client %d: %s", w, pf_errmsg());
}

static void destroy(sys *y)
{
    for (int w = 0; w < W; w++)
        ps_client_destroy(y->cli[w]);
    for (int s = 0; s < S; s++) {
        ps_server_destroy(y->prim[s]);
        ps_server_destroy(y->back[s]);
    }
}

/* Client w's ids of step t (distinct, in its partition c mod W == w as head_mode = global has it, spread over
 * the shards) and their gradients. */
static void step_data(int w, int t, int64_t *ids, float *g)
{
    for (int i = 0; i < N; i++)
        ids[i] = (((int64_t)i * 13 + (int64_t)t * 101) % (C / W)) * W + w;
    for (int i = 0; i < N * D; i++)
        g[i] = 0.01f * (float)(((i + 3 * w + 5 * t) % 17) - 8);
}

static int push(sys *y, int w, int t, uint32_t flags)
{
    int64_t ids[N];
    static float g[N * D];
    step_data(w, t, ids, g);
    ps_req *r;
    int rc = ps_push_ex(y->cli[w], ids, N, g, 0.1f, t, flags, &r);
    return rc < 0 ? rc : ps_wait(y->cli[w], r, 30);
}

static int pull(sys *y, int w, int t, float *out)
{
    int64_t ids[N];
    static float g[N * D];
    step_data(w, t, ids, g);
    ps_req *r;
    int rc = ps_pull(y->cli[w], ids, N, out, t, &r);
    return rc < 0 ? rc : ps_wait(y->cli[w], r, 30);
}

/* Server `host` is lost: its two copies destroyed, the clients told at `epoch`, shard host's backup promoted.
 */
static void lose(sys *y, int host, uint32_t epoch)
{
    const int b = (host + S - 1) % S;
    ps_server_destroy(y->prim[host]);
    ps_server_destroy(y->back[b]);
    y->prim[host] = y->back[b] = NULL;
    ps_server_promote(y->back[host]);
    for (int w = 0; w < W; w++)
        CHECK(ps_client_server_lost(y->cli[w], host, epoch) == 0, "%s", pf_errmsg());
}

/* Waits up to 10 s for shard s's file of checkpoint `step`. */
static int wait_file(int s, int64_t step)
{
    char p[4300];
    ckpt_member_path(g_root, step, "shard", s, S, ".snap", p, sizeof p);
    struct stat st;
    for (int i = 0; i < 5000 && stat(p, &st) != 0; i++) {
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    return stat(p, &st) == 0;
}

/* Server 1 starts again and rejoins from checkpoint R (copy = 0: its copies left as generated). */
static void rejoin(sys *y, int copy)
{
    CHECK(wait_file(1, R) && wait_file(0, R), "checkpoint %d's files of shards 0 and 1 were not written", R);
    ps_server *p = server(1, 0, g_root, R), *b = server(0, 1, g_root, R);
    ps_server_set_quiet(p);
    ps_server_set_min_epoch(p, 2);
    ps_server_set_min_epoch(b, 2);
    if (copy) {
        CHECK(ps_server_load(p, g_root, R) == 0, "copying shard 1: %s", pf_errmsg());
        CHECK(ps_server_load(b, g_root, R) == 0, "copying shard 0: %s", pf_errmsg());
    }
    add_workers(y, p);
    add_workers(y, b);
    if (ps_server_start(p) < 0 || ps_server_start(b) < 0)
        DIE("starting the rejoined copies: %s", pf_errmsg());
    y->prim[1] = p;
    y->back[0] = b;
    uint8_t a0[FAB_MAX_ADDR], a1[FAB_MAX_ADDR];
    size_t l[2] = {sizeof a0, sizeof a1};
    if (ps_server_getname(p, a0, &l[0]) < 0 || ps_server_getname(b, a1, &l[1]) < 0)
        DIE("%s", pf_errmsg());
    const void *a[2] = {a0, a1};
    for (int w = 0; w < W; w++)
        CHECK(ps_client_server_back(y->cli[w], 1, a, l, 3) == 0, "client %d: %s", w, pf_errmsg());
}

/* A push of step R for class 4 (shard 1, worker 0's partition) carrying membership epoch 1, sent raw to shard
 * 1's serving copy (the rejoined primary): dropped unanswered (-ETIMEDOUT) and counted. */
static void stale_push(sys *y)
{
    static uint8_t msg[sizeof(ps_hdr) + sizeof(int64_t) + D * sizeof(float)];
    ps_hdr h = {.magic = PS_MAGIC,
                .version = PS_VERSION,
                .op = PS_OP_PUSH,
                .client = 0,
                .step = R,
                .n = 1,
                .dim = D,
                .dtype = PS_DT_FP32,
                .nchunks = 1,
                .lr = 0.1f,
                .epoch = 1};
    const int64_t id = 4;
    memcpy(msg, &h, sizeof h);
    memcpy(msg + sizeof h, &id, sizeof id);
    for (int i = 0; i < D; i++) {
        const float g = 1.0f;
        memcpy(msg + sizeof h + sizeof id + sizeof(float) * (size_t)i, &g, sizeof g);
    }
    ps_stat before, after;
    ps_server_stat(y->prim[1], &before);
    int rc = ps_raw(y->cli[0], 1, msg, sizeof msg, 1.0);
    CHECK(rc == -ETIMEDOUT, "a push of epoch 1 to the rejoined copy was answered (%d: %s)", rc, pf_errmsg());
    ps_server_stat(y->prim[1], &after);
    CHECK(after.bad_requests == before.bad_requests + 1, "the stale push was not counted: %lld bad requests",
          (long long)after.bad_requests);
}

/* One run; returns the number of mismatches against the reference (rows of a step or a table). */
static int run(int copy)
{
    snprintf(g_root, sizeof g_root, "/tmp/pfcps_ps_rejoin.%d.%d", (int)getpid(), copy);
    sys rep, ref;
    make(&rep, 1);
    make(&ref, 0);
    int bad = 0;
    static float got[N * D], want[N * D];
    for (int t = 0; t <= T; t++) {
        if (t == F)
            lose(&rep, 1, 1);
        if (t == K)
            lose(&rep, 2, 4);
        for (int w = 0; w < W && t > 0; w++) {
            CHECK(push(&ref, w, t - 1, 0) == 0, "reference push %d of step %d: %s", w, t - 1, pf_errmsg());
            CHECK(push(&rep, w, t - 1, t == R ? PS_PUSH_SNAPSHOT : 0) == 0, "push %d of step %d: %s", w,
                  t - 1, pf_errmsg());
        }
        if (t == R) {
            rejoin(&rep, copy); /* the clients hold their pushes of step R until it is done */
            if (copy)
                stale_push(&rep);
        }
        for (int w = 0; w < W && t < T; w++) {
            CHECK(pull(&ref, w, t, want) == 0, "reference pull %d of step %d: %s", w, t, pf_errmsg());
            CHECK(pull(&rep, w, t, got) == 0, "pull %d of step %d: %s", w, t, pf_errmsg());
            if (memcmp(got, want, sizeof got) != 0) {
                bad++;
                if (copy)
                    CHECK(0, "step %d: client %d's pulled rows differ from the unreplicated run's", t, w);
            }
        }
    }
    if (copy)
        CHECK(ps_client_epoch(rep.cli[0]) == 4, "client epoch %u, want 4", ps_client_epoch(rep.cli[0]));
    /* Every live copy: shard 0 on server 0 and its rejoined backup, shard 1 on the rejoined primary alone,
     * shard 2 on its backup on server 0. */
    ps_server *copies[4] = {rep.prim[0], rep.back[0], rep.prim[1], rep.back[2]};
    const int shard_of[4] = {0, 0, 1, 2};
    for (int i = 0; i < 4; i++) {
        ps_server_stop(copies[i]);
        ps_server_stop(ref.prim[shard_of[i]]);
        uint64_t x = shard_checksum_at((shard *)ps_server_shard(copies[i]), T);
        uint64_t z = shard_checksum_at((shard *)ps_server_shard(ref.prim[shard_of[i]]), T);
        if (x != z) {
            bad++;
            if (copy)
                CHECK(0, "copy %d of shard %d: table %016llx, the unreplicated run's %016llx", i, shard_of[i],
                      (unsigned long long)x, (unsigned long long)z);
        }
    }
    destroy(&rep);
    destroy(&ref);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_root);
    return bad;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int bad = run(1);
    CHECK(bad == 0, "with the copy: %d mismatches against the unreplicated run", bad);
    bad = run(0);
    CHECK(bad > 0, "with the copy skipped: no mismatch against the unreplicated run (the check cannot fail)");
    return check_summary();
}
