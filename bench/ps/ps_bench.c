/* ps_bench: parameter-server pull and push throughput against a memcpy-gather ceiling measured in the
 * same run.
 *
 *   ps_bench [--provider tcp|shm] [--servers S] [--clients W] [--rows R] [--dim D] [--dtype fp32|fp16|bf16]
 *            [--classes C] [--iters N] [--rounds K] [--head-mode local|global] [--only all|pull|push]
 *
 * Servers (ps_server, each with its progress + apply threads) and clients (one thread each) run in this
 * process over the chosen libfabric provider. Each client does N pulls of R random rows (step 0), then N
 * pushes of R random rows (steps 0..N-1; max_staleness is set high so clients do not wait for each other;
 * local head mode sums each step's W pushes before applying, global mode applies each push on arrival).
 * Ceilings, each measured in the same run:
 *   - memcpy gather: one core gathering the same number of random fp32 rows from a C x D host table;
 *   - transport: the provider alone moving the same payload bytes (fp32 rows, as many per message as a pull
 *     reply carries) over max(S, W) sender -> receiver endpoint pairs in this process at once, 16 messages
 *     in flight each, no gather and no scatter: what pull and push could reach if pfcps's own work cost
 *     nothing;
 *   - SGD apply: one core applying the same number of rows' momentum SGD (shard_sgd_row_f32, the servers'
 *     update) at random rows of a C x D table and its momentum, from a contiguous gradient buffer: a push's
 *     least memory work (read the gradient, read and write the weight and the momentum).
 * K rounds of (ceilings, pull, push) are interleaved; the best and median of each are printed with
 * rows/s, GB/s (wire bytes) and the ratios achieved rows/s / ceiling rows/s. --only pull (push) runs that
 * phase alone, without the ceilings, for profiling. A push is acknowledged when the servers receive it; the
 * push phase's clock stops once every server has applied every push (a stat request waits for that). */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "common/fabric.h"
#include "worker/ps_client.h"
#include "server/ps_server.h"
#include "server/shard.h"
#include "proto/ps_wire.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

typedef struct bench_arg {
    ps_client *c;
    int rank, rows, dim, iters, push, step0;
    int64_t classes;
    int rc;
} bench_arg;

static void *client_main(void *p)
{
    bench_arg *a = p;
    int64_t *ids = malloc(sizeof(int64_t) * a->rows);
    float *buf = malloc(sizeof(float) * (size_t)a->rows * a->dim);
    for (size_t i = 0; i < (size_t)a->rows * a->dim; i++)
        buf[i] = 1e-6f;
    for (int it = 0; it < a->iters && !a->rc; it++) {
        for (int i = 0; i < a->rows; i++)
            ids[i] = (int64_t)(mix(((uint64_t)a->rank << 48) ^ ((uint64_t)it << 24) ^ (uint64_t)i ^
                                   (a->push ? 1ull << 62 : 0)) %
                               (uint64_t)a->classes);
        ps_req *r;
        a->rc = a->push ? ps_push(a->c, ids, a->rows, buf, 0.01f, a->step0 + it, &r)
                        : ps_pull(a->c, ids, a->rows, buf, 0, &r);
        if (!a->rc)
            a->rc = ps_wait(a->c, r, 60);
        if (a->rc)
            fprintf(stderr, "client %d: %s\n", a->rank, pf_errmsg());
    }
    free(ids);
    free(buf);
    return NULL;
}

static double run_phase(ps_client **cl, int S, int W, int rows, int dim, int iters, int64_t C, int push, int step0)
{
    pthread_t th[64];
    bench_arg a[64];
    double t0 = now();
    for (int w = 0; w < W; w++) {
        a[w] = (bench_arg){cl[w], w, rows, dim, iters, push, step0, C, 0};
        pthread_create(&th[w], NULL, client_main, &a[w]);
    }
    int bad = 0;
    for (int w = 0; w < W; w++) {
        pthread_join(th[w], NULL);
        bad |= a[w].rc;
    }
    if (push && !bad) {
        /* A push is acknowledged on receipt and applied after: the clock stops once every server has
         * applied every push (a stat is answered only after the applies of the pushes before it). */
        ps_stat st;
        for (int s = 0; s < S && !bad; s++)
            if (ps_stat_get(cl[0], s, &st, 60) < 0) {
                fprintf(stderr, "stat of server %d: %s\n", s, pf_errmsg());
                bad = 1;
            }
    }
    double dt = now() - t0;
    return bad ? -1 : dt;
}

/* ---------- transport ceiling ---------- */

enum { T_WIN = 16 };

typedef struct trx_arg {
    fab_ctx *f;
    uint8_t *mem; /* T_WIN buffers of msg bytes */
    fab_mr *mr;
    size_t msg, payload;
    long msgs; /* to receive */
    int rc;
} trx_arg;

static void *trx_main(void *p)
{
    trx_arg *a = p;
    for (int i = 0; i < T_WIN && !a->rc; i++)
        a->rc = fab_recv(a->f, a->mem + (size_t)i * a->msg, a->msg, a->mr, (void *)(uintptr_t)i);
    long got = 0;
    fab_comp cq[T_WIN];
    double t0 = now();
    while (!a->rc && got < a->msgs) {
        int n = fab_poll(a->f, cq, T_WIN);
        if (n < 0 || now() - t0 > 120) {
            a->rc = -1;
            break;
        }
        if (n == 0)
            sched_yield(); /* 2 cores, 2 to 4 pollers: let the peer side run */
        for (int i = 0; i < n && !a->rc; i++) {
            if (cq[i].err || cq[i].len != a->payload) {
                a->rc = -1;
                break;
            }
            got++;
            uintptr_t b = (uintptr_t)cq[i].context;
            if (got + T_WIN <= a->msgs)
                a->rc = fab_recv(a->f, a->mem + b * a->msg, a->msg, a->mr, cq[i].context);
        }
    }
    return NULL;
}

/* One sender/receiver pair of the transport ceiling. */
typedef struct tpair {
    const char *prov;
    int D;
    long msgs;
    pthread_barrier_t *ready; /* all pairs set up: the clock starts */
    double t_end;             /* when its last message was received (before teardown) */
    int rc;
} tpair;

static void *tpair_main(void *p)
{
    tpair *t = p;
    fab_ctx *tx = NULL, *rx = NULL;
    const size_t per = ps_wire_rows_per_msg((uint32_t)t->D, PS_DT_FP32);
    const size_t payload = sizeof(ps_hdr) + per * (size_t)t->D * sizeof(float);
    const size_t msg = ps_wire_msg_bytes((uint32_t)t->D);
    uint8_t *smem = fab_buf_alloc(msg * T_WIN);
    uint8_t *rmem = fab_buf_alloc(msg * T_WIN);
    fab_mr smr = {0}, rmr = {0};
    uint8_t addr[FAB_MAX_ADDR];
    size_t alen = sizeof(addr);
    fi_addr_t dst;
    t->rc = -1;
    int setup = smem && rmem && fab_open(t->prov, &tx) == 0 && fab_open(t->prov, &rx) == 0 &&
                fab_mr_reg(tx, smem, msg * T_WIN, FI_SEND, &smr) == 0 &&
                fab_mr_reg(rx, rmem, msg * T_WIN, FI_RECV, &rmr) == 0 && fab_getname(rx, addr, &alen) == 0 &&
                fab_av_insert(tx, addr, alen, &dst) == 0;
    if (setup)
        memset(smem, 1, msg * T_WIN);
    trx_arg ra = {rx, rmem, &rmr, msg, payload, t->msgs + 1, 0};
    pthread_t th;
    int started = setup && pthread_create(&th, NULL, trx_main, &ra) == 0;
    if (started) {
        /* one message before the clock starts: the connection is set up */
        fab_comp c1;
        int n = 0;
        double tw = now();
        if (fab_send(tx, dst, smem, payload, &smr, NULL) == 0)
            while ((n = fab_poll(tx, &c1, 1)) == 0 && now() - tw < 30)
                sched_yield();
        if (n != 1 || c1.err) {
            ra.rc = -1;
            pthread_join(th, NULL);
            started = 0;
        }
    }
    pthread_barrier_wait(t->ready);
    if (started) {
        long sent = 0, done = 0;
        int bad = 0;
        int free_b[T_WIN], nfree = T_WIN;
        for (int i = 0; i < T_WIN; i++)
            free_b[i] = i;
        fab_comp cq[T_WIN];
        double t0 = now();
        while (!bad && done < t->msgs) {
            while (sent < t->msgs && nfree > 0) {
                int b = free_b[--nfree];
                if (fab_send(tx, dst, smem + (size_t)b * msg, payload, &smr, (void *)(uintptr_t)b) < 0) {
                    bad = 1;
                    break;
                }
                sent++;
            }
            int n = fab_poll(tx, cq, T_WIN);
            if (n < 0 || now() - t0 > 120)
                bad = 1;
            if (n == 0)
                sched_yield();
            for (int i = 0; i < n; i++) {
                bad |= cq[i].err != 0;
                free_b[nfree++] = (int)(uintptr_t)cq[i].context;
                done++;
            }
        }
        pthread_join(th, NULL);
        t->t_end = now();
        t->rc = bad || ra.rc ? -1 : 0;
    }
    if (smr.mr)
        fab_mr_close(&smr);
    if (rmr.mr)
        fab_mr_close(&rmr);
    if (tx)
        fab_close(tx);
    if (rx)
        fab_close(rx);
    free(smem);
    free(rmem);
    return NULL;
}

/* Moves `rows` fp32 rows of D elements over `pairs` sender -> receiver endpoint pairs of `prov` at once (as
 * many as the bench has server-client pairs in flight), in messages of as many rows as a pull reply holds
 * (plus the header's bytes), T_WIN in flight per pair. Returns rows/s, or -1 on failure. */
static double transport_rate(const char *prov, int D, double rows, int pairs)
{
    const size_t per = ps_wire_rows_per_msg((uint32_t)D, PS_DT_FP32);
    long msgs = (long)((rows / pairs + (double)per - 1) / (double)per);
    if (msgs < 256)
        msgs = 256; /* enough to be a rate */
    pthread_barrier_t ready;
    pthread_barrier_init(&ready, NULL, (unsigned)pairs + 1);
    tpair t[64];
    pthread_t th[64];
    for (int i = 0; i < pairs; i++) {
        t[i] = (tpair){prov, D, msgs, &ready, 0, -1};
        if (pthread_create(&th[i], NULL, tpair_main, &t[i])) {
            fprintf(stderr, "transport ceiling: cannot start a thread\n");
            exit(1);
        }
    }
    pthread_barrier_wait(&ready);
    double t0 = now(), t1 = t0;
    int bad = 0;
    for (int i = 0; i < pairs; i++) {
        pthread_join(th[i], NULL);
        bad |= t[i].rc;
        t1 = t[i].t_end > t1 ? t[i].t_end : t1;
    }
    double dt = t1 - t0;
    pthread_barrier_destroy(&ready);
    return bad ? -1 : (double)pairs * (double)msgs * (double)per / dt;
}

int main(int argc, char **argv)
{
    const char *prov = "tcp", *dts = "fp32", *only = "all";
    int S = 2, W = 2, R = 4096, D = 128, N = 10, rounds = 5, global = 0;
    int64_t C = 262144;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--provider"))
            prov = argv[i + 1];
        else if (!strcmp(argv[i], "--servers"))
            S = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--clients"))
            W = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rows"))
            R = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dim"))
            D = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dtype"))
            dts = argv[i + 1];
        else if (!strcmp(argv[i], "--classes"))
            C = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--iters"))
            N = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--only"))
            only = argv[i + 1];
        else if (!strcmp(argv[i], "--head-mode"))
            global = !strcmp(argv[i + 1], "global");
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    ps_dtype dt = !strcmp(dts, "fp16") ? PS_DT_FP16 : !strcmp(dts, "bf16") ? PS_DT_BF16 : PS_DT_FP32;
    if (S < 1 || S > 64 || W < 1 || W > 64 || R < 1 || D < 1 || C < S || N < 1) {
        fprintf(stderr, "bad sizes\n");
        return 2;
    }
    ps_server *srv[64];
    ps_client *cl[64];
    /* As the daemons (daemon_bind_data_plane): over tcp, libfabric's universe is the job's processes. */
    if (fab_set_universe(prov, (long)S + W) < 0) {
        fprintf(stderr, "%s\n", pf_errmsg());
        return 2;
    }
    for (int s = 0; s < S; s++) {
        ps_server_opts o = {.provider = prov,
                            .rank = s,
                            .servers = S,
                            .workers = W,
                            .dim = D,
                            .num_classes = C,
                            .seed = 1,
                            .momentum = 0.9,
                            .weight_decay = 5e-4,
                            .max_staleness = 1 << 30,
                            .apply_threads = 1,
                            .prefault = 1,
                            .global_mode = global};
        if (ps_server_create(&o, &srv[s]) < 0) {
            fprintf(stderr, "server %d: %s\n", s, pf_errmsg());
            return 1;
        }
    }
    for (int w = 0; w < W; w++) {
        ps_client_opts o = {
            .provider = prov, .rank = w, .servers = S, .num_classes = C, .dim = D, .dtype = dt};
        if (ps_client_create(&o, &cl[w]) < 0) {
            fprintf(stderr, "client %d: %s\n", w, pf_errmsg());
            return 1;
        }
        ps_client_set_borrow_grads(cl[w], 1); /* as the workers do: each push is waited for before reuse */
    }
    for (int s = 0; s < S; s++)
        for (int w = 0; w < W; w++) {
            uint8_t a[FAB_MAX_ADDR], b[FAB_MAX_ADDR];
            size_t la = sizeof(a), lb = sizeof(b);
            if (ps_server_getname(srv[s], a, &la) || ps_client_getname(cl[w], b, &lb) ||
                ps_server_add_worker(srv[s], w, b, lb) || ps_client_add_server(cl[w], s, a, la)) {
                fprintf(stderr, "address exchange: %s\n", pf_errmsg());
                return 1;
            }
        }
    for (int s = 0; s < S; s++)
        if (ps_server_start(srv[s]) < 0)
            return 1;
    for (int w = 0; w < W; w++)
        if (ps_client_warmup(cl[w], 30) < 0) {
            fprintf(stderr, "warmup: %s\n", pf_errmsg());
            return 1;
        }
    /* Generate every row once (rows are generated on first access) so the timed pulls only gather. */
    {
        int64_t chunk = 65536;
        int64_t *ids = malloc(sizeof(int64_t) * chunk);
        float *out = malloc(sizeof(float) * chunk * D);
        for (int64_t lo = 0; lo < C; lo += chunk) {
            int64_t n = C - lo < chunk ? C - lo : chunk;
            for (int64_t i = 0; i < n; i++)
                ids[i] = lo + i;
            ps_req *r;
            if (ps_pull(cl[0], ids, (size_t)n, out, 0, &r) || ps_wait(cl[0], r, 120)) {
                fprintf(stderr, "warm pull: %s\n", pf_errmsg());
                return 1;
            }
        }
        free(ids);
        free(out);
    }
    char modes[256];
    fab_ctx *probe;
    if (fab_open(prov, &probe) == 0) {
        fab_mr_mode_str(fab_mr_mode(probe), modes, sizeof(modes));
        printf("provider %s, mr_mode %s\n", fab_provider(probe), modes);
        fab_close(probe);
    }
    /* The box may be shared: interleave `rounds` rounds of (ceiling, pull, push) and report the best rate
     * of each (and the median), so a burst of foreign load hits all three alike. */
    double total_rows = (double)W * N * R, wire = (double)D * ps_dtype_size(dt);
    /* The ceilings' table, momentum and destination sit in transparent huge pages, as the servers' shards
     * (shard.c) and message buffers (fab_buf_alloc) do: same TLB reach on both sides of the ratio. */
    float *table = fab_buf_alloc(sizeof(float) * (size_t)C * D), *dst = fab_buf_alloc(sizeof(float) * (size_t)R * D);
    for (size_t i = 0; i < (size_t)C * D; i++)
        table[i] = (float)i;
    float *mom = fab_buf_alloc(sizeof(float) * (size_t)C * D), *grad = fab_buf_alloc(sizeof(float) * (size_t)R * D);
    memset(mom, 0, sizeof(float) * (size_t)C * D); /* touched now: no page faults in the timed loop */
    for (size_t i = 0; i < (size_t)R * D; i++)
        grad[i] = 1e-6f;
    const int ahead = shard_prefetch_rows(D);
    int64_t *idx = malloc(sizeof(int64_t) * R);
    double rc_[5][64];
    if (rounds < 1)
        rounds = 1;
    if (rounds > 64)
        rounds = 64;
    const int do_ceil = !strcmp(only, "all"), do_pull = do_ceil || !strcmp(only, "pull"),
              do_push = do_ceil || !strcmp(only, "push");
    if (!do_pull && !do_push) {
        fprintf(stderr, "--only takes all, pull or push\n");
        return 2;
    }
    for (int k = 0; k < rounds; k++) {
        if (!do_ceil)
            goto phases;
        /* Ceiling: one core, memcpy-gather of the same number of random fp32 rows from a C x D table. */
        double t0 = now();
        long reps = (long)W * N;
        for (long it = 0; it < reps; it++) {
            for (int i = 0; i < R; i++)
                idx[i] = (int64_t)(mix(((uint64_t)(it + k * reps) << 24) ^ (uint64_t)i ^ 0x77) % (uint64_t)C);
            for (int i = 0; i < R; i++)
                memcpy(dst + (size_t)i * D, table + (size_t)idx[i] * D, sizeof(float) * D);
            __asm__ volatile("" : : "r"(dst) : "memory");
        }
        rc_[0][k] = total_rows / (now() - t0);
        /* SGD-apply ceiling: one core, the servers' row update at random rows of the table and momentum. */
        t0 = now();
        for (long it = 0; it < reps; it++) {
            for (int i = 0; i < R; i++)
                idx[i] = (int64_t)(mix(((uint64_t)(it + k * reps) << 24) ^ (uint64_t)i ^ 0x99) % (uint64_t)C);
            for (int i = 0; i < R; i++) {
                if (i + ahead < R) { /* as the servers' apply does: start loading a random row ahead */
                    shard_prefetch_row(table + (size_t)idx[i + ahead] * D, D, 1);
                    shard_prefetch_row(mom + (size_t)idx[i + ahead] * D, D, 1);
                }
                shard_sgd_row_f32(table + (size_t)idx[i] * D, mom + (size_t)idx[i] * D, grad + (size_t)i * D, D,
                                  1e-3, 0.9, 5e-4);
            }
            __asm__ volatile("" : : "r"(table) : "memory");
        }
        rc_[3][k] = total_rows / (now() - t0);
        rc_[4][k] = transport_rate(prov, D, total_rows, S > W ? S : W);
        if (rc_[4][k] < 0) {
            fprintf(stderr, "transport ceiling over %s failed\n", prov);
            return 1;
        }
    phases:;
        double t_pull = do_pull ? run_phase(cl, S, W, R, D, N, C, 0, 0) : 1;
        double t_push = do_push ? run_phase(cl, S, W, R, D, N, C, 1, k * N) : 1;
        if (t_pull < 0 || t_push < 0)
            return 1;
        rc_[1][k] = total_rows / t_pull;
        rc_[2][k] = total_rows / t_push;
    }
    double best[5], med[5];
    for (int m = 0; m < 5; m++) {
        double v[64];
        memcpy(v, rc_[m], sizeof(double) * rounds);
        for (int i = 0; i < rounds; i++) /* insertion sort, tiny */
            for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
                double t = v[j];
                v[j] = v[j - 1];
                v[j - 1] = t;
            }
        best[m] = v[rounds - 1];
        med[m] = v[rounds / 2];
    }
    printf("config: provider=%s servers=%d clients=%d rows/request=%d D=%d dtype=%s classes=%lld iters=%d "
           "rounds=%d "
           "head_mode=%s\n",
           prov, S, W, R, D, dts, (long long)C, N, rounds, global ? "global" : "local");
    if (!do_ceil) { /* --only: rates alone (no ceilings were measured) */
        if (do_pull)
            printf("pull: best %.3g rows/s, median %.3g\n", best[1], med[1]);
        if (do_push)
            printf("push: best %.3g rows/s, median %.3g\n", best[2], med[2]);
        goto out;
    }
    printf("ceiling (memcpy gather, 1 core): best %.3g rows/s (%.2f GB/s fp32), median %.3g\n", best[0],
           best[0] * D * 4 / 1e9, med[0]);
    printf("ceiling (transport: %s alone, %d pairs, contiguous fp32 rows, 16 messages in flight each): best %.3g rows/s "
           "(%.2f GB/s), median %.3g\n",
           prov, S > W ? S : W, best[4], best[4] * D * 4 / 1e9, med[4]);
    printf("ceiling (SGD apply, 1 core, random rows): best %.3g rows/s, median %.3g\n", best[3], med[3]);
    printf("pull: best %.3g rows/s, %.2f GB/s on the wire, median %.3g; ratio = %.3f (median %.3f); "
           "vs transport %.3f (median %.3f)\n",
           best[1], best[1] * wire / 1e9, med[1], best[1] / best[0], med[1] / med[0], best[1] / best[4],
           med[1] / med[4]);
    printf("push: best %.3g rows/s, %.2f GB/s on the wire, median %.3g; ratio = %.3f (median %.3f); "
           "vs transport %.3f (median %.3f); vs SGD apply %.3f (median %.3f)\n",
           best[2], best[2] * wire / 1e9, med[2], best[2] / best[0], med[2] / med[0], best[2] / best[4],
           med[2] / med[4], best[2] / best[3], med[2] / med[3]);
out:;
    long long pulled = 0, par = 0;
    for (int s = 0; s < S; s++) {
        ps_stat st;
        ps_server_stat(srv[s], &st);
        pulled += st.rows_pulled, par += st.rows_pulled_par;
    }
    printf("pull rows gathered by the servers' apply threads (the rest by their progress threads): %.0f%%\n",
           pulled ? 100.0 * (double)par / (double)pulled : 0.0);
    for (int w = 0; w < W; w++)
        ps_client_destroy(cl[w]);
    for (int s = 0; s < S; s++)
        ps_server_destroy(srv[s]);
    free(table), free(dst), free(idx), free(mom), free(grad);
    return 0;
}
