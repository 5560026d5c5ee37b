/* Hot-standby shards in one process (replicas = 1; docs/architecture.md, "Hot-standby shards"): 3 servers,
 * each a primary ps_server of shard s and a backup ps_server of shard (s - 1) mod 3, and 2 clients with
 * replicas = 1; beside them an unreplicated reference system (3 servers, 2 clients) fed the same requests.
 * Local head mode (BSP: a pull of step t waits for every client's push of step t - 1), dense updates.
 * At step F, client 0 has pushed step F - 1 and its pull of step F is held by the servers (client 1 has not
 * pushed yet); then "server 1" (the primary of shard 1 and the backup of shard 0) is destroyed and both
 * clients are told (ps_client_server_lost); the held pull must complete from shard 1's backup, and client
 * 1's push goes to the live copies only. Checked against the reference: every pulled row of every step bit
 * for bit, the serving copies' tables (shard_checksum_at) at the end, and the two copies of shard 2, which
 * lost neither, equal to each other. With the argument `adamw`, the same under optimizer = adamw (both copies
 * apply the same pushes with AdamW, the rows' skipped steps replayed). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/fabric.h"
#include "server/ps_server.h"
#include "server/shard.h"
#include "worker/ps_client.h"

#include "tests/check.h"

#define S    3
#define W    2
#define C    3000
#define D    32
#define N    200 /* rows each client pulls and pushes per step */
#define T    7   /* steps */
#define F    3   /* the step whose pull is in flight when server 1 is lost */
#define SEED 91

typedef struct sys {
    ps_server *prim[S], *back[S]; /* back: NULL in the reference system */
    ps_client *cli[W];
} sys;

static int adamw; /* argv[1] = "adamw": optimizer = adamw */

static ps_server *server(int shard, int backup)
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
                        .adamw = adamw,
                        .apply_threads = 1,
                        .recv_bufs = 8,
                        .backup = backup};
    ps_server *p = NULL;
    if (ps_server_create(&o, &p) < 0)
        DIE("server %d (backup %d): %s", shard, backup, pf_errmsg());
    return p;
}

/* Connects srv (copy `copy` of shard s) with every client, as worker w there and as that copy here. */
static void connect(sys *y, ps_server *srv, int s, int copy)
{
    uint8_t a[FAB_MAX_ADDR], b[FAB_MAX_ADDR];
    for (int w = 0; w < W; w++) {
        size_t la = sizeof a, lb = sizeof b;
        if (ps_server_getname(srv, a, &la) < 0 || ps_client_getname(y->cli[w], b, &lb) < 0 ||
            ps_server_add_worker(srv, w, b, lb) < 0 || ps_client_add_copy(y->cli[w], s, copy, a, la) < 0)
            DIE("connecting shard %d copy %d and client %d: %s", s, copy, w, pf_errmsg());
    }
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
        y->prim[s] = server(s, 0);
        connect(y, y->prim[s], s, 0);
        if (replicas) {
            y->back[s] = server(s, 1);
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

/* Client w's ids of step t (distinct, spread over the shards) and their gradients. */
static void step_data(int w, int t, int64_t *ids, float *g)
{
    for (int i = 0; i < N; i++)
        ids[i] = ((int64_t)i * 13 + (int64_t)w * 7 + (int64_t)t * 101) % C;
    for (int i = 0; i < N * D; i++)
        g[i] = 0.01f * (float)(((i + 3 * w + 5 * t) % 17) - 8);
}

static int push(sys *y, int w, int t)
{
    int64_t ids[N];
    static float g[N * D];
    step_data(w, t, ids, g);
    ps_req *r;
    int rc = ps_push(y->cli[w], ids, N, g, 0.1f, t, &r);
    return rc < 0 ? rc : ps_wait(y->cli[w], r, 30);
}

static int pull_start(sys *y, int w, int t, float *out, ps_req **r)
{
    int64_t ids[N];
    static float g[N * D];
    step_data(w, t, ids, g);
    return ps_pull(y->cli[w], ids, N, out, t, r);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    adamw = argc > 1 && !strcmp(argv[1], "adamw");
    sys rep, ref;
    make(&rep, 1);
    make(&ref, 0);
    static float got[W][N * D], want[W][N * D];
    for (int t = 0; t <= T; t++) {
        ps_req *rr[W] = {NULL}, *fr[W] = {NULL};
        if (t > 0) {
            for (int w = 0; w < W; w++)
                CHECK(push(&ref, w, t - 1) == 0, "reference push %d of step %d: %s", w, t - 1, pf_errmsg());
            CHECK(push(&rep, 0, t - 1) == 0, "push 0 of step %d: %s", t - 1, pf_errmsg());
            if (t == F) {
                /* Client 0's pull of step F waits for client 1's push of F - 1 on every server. */
                CHECK(pull_start(&rep, 0, t, got[0], &rr[0]) == 0, "pull 0 of step %d: %s", t, pf_errmsg());
                CHECK(ps_test(rep.cli[0], rr[0]) == 0, "the pull of step %d completed before client 1 pushed",
                      t);
                ps_server_destroy(rep.prim[1]); /* server 1: shard 1's primary, shard 0's backup */
                ps_server_destroy(rep.back[0]);
                rep.prim[1] = rep.back[0] = NULL;
                for (int w = 0; w < W; w++)
                    CHECK(ps_client_server_lost(rep.cli[w], 1, 1) == 0, "%s", pf_errmsg());
            }
            CHECK(push(&rep, 1, t - 1) == 0, "push 1 of step %d: %s", t - 1, pf_errmsg());
        }
        if (t == T)
            break;
        for (int w = 0; w < W; w++) {
            if (!rr[w])
                CHECK(pull_start(&rep, w, t, got[w], &rr[w]) == 0, "pull %d of step %d: %s", w, t,
                      pf_errmsg());
            CHECK(pull_start(&ref, w, t, want[w], &fr[w]) == 0, "reference pull: %s", pf_errmsg());
        }
        for (int w = 0; w < W; w++) {
            CHECK(ps_wait(rep.cli[w], rr[w], 30) == 0, "pull %d of step %d: %s", w, t, pf_errmsg());
            CHECK(ps_wait(ref.cli[w], fr[w], 30) == 0, "reference pull %d of step %d: %s", w, t, pf_errmsg());
            CHECK(memcmp(got[w], want[w], sizeof got[w]) == 0,
                  "step %d: client %d's pulled rows differ from the unreplicated run's", t, w);
        }
    }
    CHECK(ps_client_epoch(rep.cli[0]) == 1, "client epoch %u, want 1", ps_client_epoch(rep.cli[0]));
    /* Tables at the end: the serving copy of each shard equals the reference's; shard 2's copies equal. */
    ps_server *serving[S] = {rep.prim[0], rep.back[1], rep.prim[2]};
    for (int s = 0; s < S; s++) {
        ps_server_stop(serving[s]);
        ps_server_stop(ref.prim[s]);
        ps_stat a, b;
        ps_server_stat(serving[s], &a);
        ps_server_stat(ref.prim[s], &b);
        CHECK(a.steps_done == T && b.steps_done == T, "shard %d: steps done %lld and %lld, want %d", s,
              (long long)a.steps_done, (long long)b.steps_done, T);
        uint64_t x = shard_checksum_at((shard *)ps_server_shard(serving[s]), T);
        uint64_t y = shard_checksum_at((shard *)ps_server_shard(ref.prim[s]), T);
        CHECK(x == y, "shard %d: table %016llx, the unreplicated run's %016llx", s, (unsigned long long)x,
              (unsigned long long)y);
    }
    ps_server_stop(rep.back[2]);
    uint64_t p2 = shard_checksum_at((shard *)ps_server_shard(rep.prim[2]), T);
    uint64_t b2 = shard_checksum_at((shard *)ps_server_shard(rep.back[2]), T);
    CHECK(p2 == b2, "shard 2: primary %016llx, backup %016llx", (unsigned long long)p2,
          (unsigned long long)b2);
    for (int w = 0; w < W; w++) {
        ps_client_destroy(rep.cli[w]);
        ps_client_destroy(ref.cli[w]);
    }
    for (int s = 0; s < S; s++) {
        ps_server_destroy(rep.prim[s]);
        ps_server_destroy(rep.back[s]);
        ps_server_destroy(ref.prim[s]);
    }
    return check_summary();
}
