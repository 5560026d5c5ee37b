/* A checkpoint the lost copy did not write, in one process (replicas = 1; docs/architecture.md, "Hot-standby
 * shards", Fencing and snapshots): 2 servers, each a primary ps_server of shard s and a backup ps_server of
 * shard (s - 1) mod 2, 1 client with replicas = 1, head_mode = global, dense updates; beside them an
 * unreplicated reference system fed the same pushes. The client pushes steps 0 .. T - 1, the last asking for
 * checkpoint T (as a run's last push asks for its final checkpoint). Shard 0's backup leaves that checkpoint
 * to its primary (it does not write snapshots until promoted); the primary is "lost" before it writes its
 * file (here: it has no snapshot folder), and the backup is promoted. Cases:
 *  - end: nothing is pushed after checkpoint T's push: the promoted backup writes shard 0's file of
 * checkpoint T, and the file holds the reference's shard 0 after step T - 1 (loaded into a new server: the
 * same table checksum);
 *  - moved: step T is pushed and applied by the backup before the promotion: the backup's table is no longer
 *    checkpoint T's, and no file of shard 0 is written for T (a checkpoint holding a later step's rows would
 *    be wrong);
 *  - written: the primary does write its file before it is lost: the promoted backup leaves it as it is (same
 *    inode and modification time). */
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

#include "tests/check.h"

#define S    2
#define C    2000
#define D    16
#define N    150 /* rows the client pushes per step */
#define T    4   /* the checkpoint step asked for */
#define SEED 53

typedef struct sys {
    ps_server *prim[S], *back[S]; /* back: NULL in the reference system */
    ps_client *cli;
} sys;

static char g_root[256];

static ps_server *server(int shard, int backup, const char *root, int64_t start)
{
    ps_server_opts o = {.provider = "tcp",
                        .rank = shard,
                        .servers = S,
                        .workers = 1,
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

/* Connects srv (copy `copy` of shard s) with the client, both ways. */
static void connect(sys *y, ps_server *srv, int s, int copy)
{
    uint8_t a[FAB_MAX_ADDR], b[FAB_MAX_ADDR];
    size_t la = sizeof a, lb = sizeof b;
    if (ps_client_getname(y->cli, b, &lb) < 0 || ps_server_add_worker(srv, 0, b, lb) < 0 ||
        ps_server_getname(srv, a, &la) < 0 || ps_client_add_copy(y->cli, s, copy, a, la) < 0)
        DIE("connecting shard %d copy %d: %s", s, copy, pf_errmsg());
}

/* replicas = 1: shard 0's primary writes snapshots only when primary_writes (else it has no snapshot folder).
 */
static void make(sys *y, int replicas, int primary_writes)
{
    memset(y, 0, sizeof *y);
    ps_client_opts o = {
        .provider = "tcp", .rank = 0, .servers = S, .num_classes = C, .dim = D, .replicas = replicas};
    if (ps_client_create(&o, &y->cli) < 0)
        DIE("client: %s", pf_errmsg());
    for (int s = 0; s < S; s++) {
        y->prim[s] = server(s, 0, replicas && (s > 0 || primary_writes) ? g_root : NULL, 0);
        connect(y, y->prim[s], s, 0);
        if (replicas) {
            y->back[s] = server(s, 1, g_root, 0);
            connect(y, y->back[s], s, 1);
        }
    }
    for (int s = 0; s < S; s++)
        if (ps_server_start(y->prim[s]) < 0 || (y->back[s] && ps_server_start(y->back[s]) < 0))
            DIE("starting shard %d: %s", s, pf_errmsg());
    if (ps_client_warmup(y->cli, 10) < 0)
        DIE("warm-up: %s", pf_errmsg());
}

static void destroy(sys *y)
{
    ps_client_destroy(y->cli);
    for (int s = 0; s < S; s++) {
        ps_server_destroy(y->prim[s]);
        ps_server_destroy(y->back[s]);
    }
}

/* Pushes step t: N distinct ids spread over both shards, with gradients depending on t. */
static void push(sys *y, int t, uint32_t flags)
{
    int64_t ids[N];
    static float g[N * D];
    for (int i = 0; i < N; i++)
        ids[i] = ((int64_t)i * 11 + (int64_t)t * 37) % C;
    for (int i = 0; i < N * D; i++)
        g[i] = 0.01f * (float)(((i + 5 * t) % 13) - 6);
    ps_req *r;
    int rc = ps_push_ex(y->cli, ids, N, g, 0.1f, t, flags, &r);
    if (rc == 0)
        rc = ps_wait(y->cli, r, 30);
    CHECK(rc == 0, "push of step %d: %s", t, pf_errmsg());
}

static void nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Waits up to 10 s until srv has applied `steps` steps, then 200 ms more (its progress thread then has
 * handled the checkpoint asked for at that step). */
static void wait_applied(ps_server *srv, int64_t steps)
{
    ps_stat st = {0};
    for (int i = 0; i < 1000; i++) {
        ps_server_stat(srv, &st);
        if (st.steps_done >= steps)
            break;
        nap_ms(10);
    }
    CHECK(st.steps_done >= steps, "the copy applied %lld steps, want %lld", (long long)st.steps_done,
          (long long)steps);
    nap_ms(200);
}

static void shard_path(int s, int64_t step, char *p, size_t n)
{
    ckpt_member_path(g_root, step, "shard", s, S, ".snap", p, n);
}

/* Waits up to ms milliseconds for shard s's file of checkpoint `step`; 1 if it is there. */
static int wait_file(int s, int64_t step, int ms)
{
    char p[4300];
    struct stat st;
    shard_path(s, step, p, sizeof p);
    for (int i = 0; i < ms / 5 && stat(p, &st) != 0; i++)
        nap_ms(5);
    return stat(p, &st) == 0;
}

/* Server 0 is lost (shard 0's primary, shard 1's backup) and shard 0's backup on server 1 is promoted. */
static void lose_server0(sys *y)
{
    ps_server_destroy(y->prim[0]);
    ps_server_destroy(y->back[1]);
    y->prim[0] = y->back[1] = NULL;
    ps_server_promote(y->back[0]);
}

static void run(const char *name)
{
    snprintf(g_root, sizeof g_root, "/tmp/pfcps_ps_snap_left.%d.%s", (int)getpid(), name);
    const int written = !strcmp(name, "written"), moved = !strcmp(name, "moved");
    sys rep, ref;
    make(&rep, 1, written);
    make(&ref, 0, 0);
    for (int t = 0; t < T; t++) {
        push(&rep, t, t == T - 1 ? PS_PUSH_SNAPSHOT : 0);
        push(&ref, t, 0);
    }
    CHECK(wait_file(1, T, 10000), "%s: shard 1's primary did not write checkpoint %d", name, T);
    wait_applied(rep.back[0], T);
    char p[4300];
    struct stat before = {0}, after = {0};
    shard_path(0, T, p, sizeof p);
    if (written) {
        CHECK(wait_file(0, T, 10000) && stat(p, &before) == 0, "written: shard 0's primary did not write it");
    } else {
        CHECK(stat(p, &before) != 0, "%s: shard 0's backup wrote checkpoint %d before it was promoted", name,
              T);
    }
    if (moved) {
        push(&rep, T, 0);
        wait_applied(rep.back[0], T + 1);
    }
    lose_server0(&rep);
    if (written) {
        nap_ms(1000);
        CHECK(stat(p, &after) == 0 && after.st_ino == before.st_ino &&
                  after.st_mtim.tv_sec == before.st_mtim.tv_sec &&
                  after.st_mtim.tv_nsec == before.st_mtim.tv_nsec,
              "written: the promoted backup rewrote the primary's file of checkpoint %d", T);
    } else if (moved) {
        CHECK(!wait_file(0, T, 1000),
              "moved: the promoted backup wrote checkpoint %d from a later step's table", T);
    } else {
        CHECK(wait_file(0, T, 10000),
              "end: the promoted backup did not write shard 0's file of checkpoint %d", T);
        ps_server_stop(rep.back[0]); /* waits for the write */
        ps_server_stop(ref.prim[0]);
        ps_server *fresh = server(0, 0, g_root, T);
        CHECK(ps_server_load(fresh, g_root, T) == 0, "end: loading checkpoint %d's shard 0: %s", T,
              pf_errmsg());
        uint64_t got = shard_checksum_at((shard *)ps_server_shard(fresh), T);
        uint64_t want = shard_checksum_at((shard *)ps_server_shard(ref.prim[0]), T);
        CHECK(got == want, "end: the file's shard 0 %016llx, the unreplicated run's after step %d %016llx",
              (unsigned long long)got, T - 1, (unsigned long long)want);
        ps_server_destroy(fresh);
    }
    destroy(&rep);
    destroy(&ref);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_root);
    printf("case %s done\n", name);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    run("end");
    run("moved");
    run("written");
    return check_summary();
}
