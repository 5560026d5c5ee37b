/* undo_cost: what opts.undo (server/undo.c: each worker's newest applied push kept undoable) costs an apply.
 *
 *   undo_cost [--rows R] [--dim D] [--workers W] [--threads T] [--steps N] [--adamw] [--dense]
 *
 * One parameter server in this process (head_mode = global, C = 2 R classes, every row generated before the
 * clock starts), its progress thread not started: the pushes of a step (W workers, R / W rows each, each worker
 * its own classes, a different random subset every step, fp32, in messages of the wire's size) are handed to
 * the request handling on this thread (server/ps_server_internal.h, as the test hook ps_server_inject does),
 * then the clock times pss_apply_drain alone: the W pushes applied by the T apply threads. Undo off and undo on
 * alternate step by step (two servers, the same pushes), after 2 warm-up steps each; the median and best apply
 * times of N steps are printed with rows/s and the ratio on / off. Afterwards the undo server is rolled back
 * over its newest step (timed: the restore runs on this thread) and its checksum compared with the one taken
 * before that step (the undo restored it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/fabric.h"
#include "common/log.h"
#include "common/splitmix64.h"
#include "proto/ps_wire.h"
#include "server/ps_server.h"
#include "server/ps_server_internal.h"
#include "server/shard.h"


static int64_t gcd(int64_t a, int64_t b)
{
    while (b) {
        int64_t r = a % b;
        a = b;
        b = r;
    }
    return a;
}

typedef struct params {
    int64_t rows;
    int dim, workers, threads, steps, adamw, dense;
} params;

static ps_server *make(const params *p, int undo)
{
    ps_server_opts o = {.provider = "tcp",
                        .rank = 0,
                        .servers = 1,
                        .workers = p->workers,
                        .dim = p->dim,
                        .num_classes = 2 * p->rows,
                        .seed = 1,
                        .momentum = 0.9,
                        .weight_decay = 5e-4,
                        .adamw = p->adamw,
                        .dense = p->dense,
                        .global_mode = 1,
                        .undo = undo,
                        .apply_threads = p->threads,
                        .recv_bufs = 2,
                        .prefault = 1};
    ps_server *S = NULL;
    if (ps_server_create(&o, &S) < 0) {
        fprintf(stderr, "ps_server_create: %s\n", pf_errmsg());
        exit(1);
    }
    uint8_t a[FAB_MAX_ADDR];
    size_t la = sizeof a;
    if (ps_server_getname(S, a, &la) < 0)
        exit(1);
    for (int w = 0; w < p->workers; w++)
        if (ps_server_add_worker(S, w, a, la) < 0)
            exit(1);
    if (shard_fill_start(&S->sh, p->threads) < 0 || !shard_fill_wait(&S->sh, -1) || pss_apply_pool_start(S) < 0) {
        fprintf(stderr, "fill / apply threads: %s\n", pf_errmsg());
        exit(1);
    }
    return S;
}

/* Hands worker w's push of step t to S's request handling: R / W of its own classes (class c is worker
 * c mod W's), a random subset (an affine walk over its 2 R / W classes), in messages of the wire's size. */
static void push_step(ps_server *S, const params *p, int w, int64_t t, uint8_t *msg, const float *grads)
{
    const int64_t own = 2 * p->rows / p->workers, n = p->rows / p->workers;
    const uint32_t per = ps_wire_rows_per_msg((uint32_t)p->dim, PS_DT_FP32);
    const uint16_t nchunks = (uint16_t)((n + per - 1) / per);
    int64_t stride = 1 + (int64_t)(splitmix64((uint64_t)t * 31 + (uint64_t)w) % (uint64_t)own), off = (int64_t)t * 7919;
    while (gcd(stride, own) != 1)
        stride++;
    for (uint16_t ci = 0; ci < nchunks; ci++) {
        const int64_t i0 = (int64_t)ci * per;
        const uint32_t m = (uint32_t)(n - i0 < per ? n - i0 : per);
        int64_t *ids = (int64_t *)(void *)(msg + sizeof(ps_hdr));
        for (uint32_t i = 0; i < m; i++) /* stride coprime to own: distinct */
            ids[i] = w + (int64_t)p->workers * (((i0 + i) * stride + off) % own);
        memcpy(ids + m, grads, sizeof(float) * (size_t)m * (size_t)p->dim);
        ps_hdr h = {.magic = PS_MAGIC, .version = PS_VERSION, .op = PS_OP_PUSH, .client = w, .step = t,
                    .n = m, .dim = (uint32_t)p->dim, .dtype = PS_DT_FP32, .chunk = ci, .nchunks = nchunks,
                    .lr = 0.1f};
        memcpy(msg, &h, sizeof h);
        pss_handle_msg(S, msg, sizeof h + (size_t)m * (8 + 4 * (size_t)p->dim));
    }
}

/* Step t on S: every worker's push handed over, then the applies timed. Returns the seconds. */
static double step(ps_server *S, const params *p, int64_t t, uint8_t *msg, const float *grads)
{
    for (int w = 0; w < p->workers; w++)
        push_step(S, p, w, t, msg, grads);
    double t0 = pf_now_s();
    pss_apply_drain(S);
    double dt = pf_now_s() - t0;
    for (pending *q = S->pq_head; q;) { /* the acknowledgements: nobody to send them to */
        pending *nx = q->next;
        pss_pend_put(S, q);
        q = nx;
    }
    S->pq_head = S->pq_tail = NULL;
    S->queued = 0;
    return dt;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void args(int argc, char **argv, params *p)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "0";
        if (!strcmp(a, "--rows"))
            p->rows = atoll(v), i++;
        else if (!strcmp(a, "--dim"))
            p->dim = atoi(v), i++;
        else if (!strcmp(a, "--workers"))
            p->workers = atoi(v), i++;
        else if (!strcmp(a, "--threads"))
            p->threads = atoi(v), i++;
        else if (!strcmp(a, "--steps"))
            p->steps = atoi(v), i++;
        else if (!strcmp(a, "--adamw"))
            p->adamw = 1;
        else if (!strcmp(a, "--dense"))
            p->dense = 1;
        else {
            fprintf(stderr, "usage: undo_cost [--rows R] [--dim D] [--workers W] [--threads T] [--steps N] "
                            "[--adamw] [--dense]\n");
            exit(2);
        }
    }
}

int main(int argc, char **argv)
{
    params p = {.rows = 200000, .dim = 512, .workers = 2, .threads = 1, .steps = 8};
    args(argc, argv, &p);
    log_set_level(LOG_WARN);
    ps_server *off = make(&p, 0), *on = make(&p, 1);
    uint8_t *msg = malloc(ps_wire_msg_bytes((uint32_t)p.dim));
    const uint32_t per = ps_wire_rows_per_msg((uint32_t)p.dim, PS_DT_FP32);
    float *grads = malloc(sizeof(float) * per * (size_t)p.dim);
    double *toff = malloc(sizeof(double) * (size_t)p.steps), *ton = malloc(sizeof(double) * (size_t)p.steps);
    if (!msg || !grads || !toff || !ton)
        return 1;
    for (size_t i = 0; i < (size_t)per * (size_t)p.dim; i++)
        grads[i] = (float)((int)(splitmix64(i) % 2001) - 1000) * 1e-5f;
    int64_t t = 0;
    for (; t < 2; t++) /* warm-up */
        step(off, &p, t, msg, grads), step(on, &p, t, msg, grads);
    uint64_t before = 0;
    for (int i = 0; i < p.steps; i++, t++) {
        toff[i] = step(off, &p, t, msg, grads);
        if (i == p.steps - 1)
            before = shard_checksum(&on->sh);
        ton[i] = step(on, &p, t, msg, grads);
    }
    double r0 = pf_now_s();
    int rc = ps_server_rollback(on, t - 1, 1, -1);
    const double trb = pf_now_s() - r0;
    const int restored = rc == 0 && shard_checksum(&on->sh) == before;
    qsort(toff, (size_t)p.steps, sizeof(double), cmp);
    qsort(ton, (size_t)p.steps, sizeof(double), cmp);
    const double moff = toff[p.steps / 2], mon = ton[p.steps / 2];
    printf("undo_cost: %lld rows of D=%d per step (%d workers), %s%s, %d apply thread(s), %d steps\n",
           (long long)p.rows, p.dim, p.workers, p.adamw ? "AdamW" : "SGD", p.dense ? " dense" : "", p.threads,
           p.steps);
    printf("  undo off: median %.1f ms (best %.1f), %.2f M rows/s\n", 1e3 * moff, 1e3 * toff[0],
           1e-6 * (double)p.rows / moff);
    printf("  undo on:  median %.1f ms (best %.1f), %.2f M rows/s\n", 1e3 * mon, 1e3 * ton[0],
           1e-6 * (double)p.rows / mon);
    printf("  ratio on / off: %.3f (median), %.3f (best)\n", mon / moff, ton[0] / toff[0]);
    printf("  rollback over the last step: %.1f ms (%lld rows restored), the table's checksum restored: %s\n",
           1e3 * trb, (long long)p.rows, restored ? "yes" : "NO");
    ps_server_destroy(off);
    ps_server_destroy(on);
    free(msg), free(grads), free(toff), free(ton);
    return restored ? 0 : 1;
}
