/* A server acknowledges a push on receipt and applies it after, on its apply threads, while its progress
 * thread goes on receiving. In-process (1 server, 1 worker, tcp;ofi_rxm), with pushes large enough that
 * an apply takes longer than the next push's transfer. Checks, against float64 momentum SGD written out
 * here:
 *   - pushes of steps 0..5 sent back to back (each waited for, no pull between) are all accepted: the
 *     step-ahead bound counts pushes received, not applied (max_staleness 0);
 *   - a pull sent right after a push's acknowledgement sees that push applied (read-your-writes), and no
 *     row is torn by an apply running while it is gathered;
 *   - a pull tagged with the step just pushed (answerable at once by the step clock) is held while that
 *     step's apply runs, and sees it whole;
 *   - a stat right after an acknowledgement counts the step as done;
 *   - the rows after 6 steps;
 *   - two more pushes back to back and an immediate stop: both applied (they were acknowledged).
 * Both head modes: local (BSP step clock) and global (each worker's pushes applied in step order). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/fabric.h"
#include "server/ps_server.h"
#include "tests/server/pst.h"
#include "worker/ps_client.h"

#include "tests/server/pst_inproc.h"

#include "tests/check.h"

#define C     120000
#define D     64
#define N     100000 /* rows pushed per step: ids 0, 1, ..., N-1 shuffled */
#define STEPS 6
#define SEED  5
#define MU    0.9
#define WD    5e-4
#define LR    0.1f

static float grad(int t, int64_t id, int j)
{
    return (float)(1e-3 * sin(0.37 * (double)(t + 1) + 0.011 * (double)id + 0.7 * (double)j));
}

/* Compares rows ids[0..n) of `out` with the float64 reference after `steps` steps (step t's gradient is
 * grad(t, ...)); returns the max error relative to the row's largest magnitude. */
static double compare_n(const int64_t *ids, const float *out, int n, int steps)
{
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double w[D], v[D] = {0}, scale = 0;
        pst_init_row(SEED, ids[i], D, w);
        for (int j = 0; j < D; j++)
            w[j] = (float)w[j];
        for (int t = 0; t < steps; t++)
            for (int j = 0; j < D; j++) {
                double d = (double)grad(t, ids[i], j) + WD * w[j];
                v[j] = MU * v[j] + d;
                w[j] -= (double)LR * v[j];
            }
        double err = 0;
        for (int j = 0; j < D; j++) {
            scale = fmax(scale, fabs(w[j]));
            err = fmax(err, fabs((double)out[(size_t)i * D + j] - w[j]));
        }
        worst = fmax(worst, err / scale);
    }
    return worst;
}

static double compare(const int64_t *ids, const float *out, int steps)
{
    return compare_n(ids, out, N, steps);
}

/* Compares rows ids[0..n) of the server's own table (stopped server) with the float64 reference after
 * `steps` steps. */
static double compare_shard(const shard *sh, const int64_t *ids, int n, int steps)
{
    float *rows = malloc(sizeof(float) * (size_t)n * D);
    for (int i = 0; i < n; i++)
        memcpy(rows + (size_t)i * D, sh->weight + (size_t)ids[i] * D, sizeof(float) * D); /* S = 1: row = id */
    double e = compare_n(ids, rows, n, steps);
    free(rows);
    return e;
}

static void run(int global)
{
    printf("--- head_mode %s ---\n", global ? "global" : "local");
    ps_server_opts so = {.provider = "tcp",
                         .rank = 0,
                         .servers = 1,
                         .workers = 1,
                         .dim = D,
                         .num_classes = C,
                         .seed = SEED,
                         .momentum = MU,
                         .weight_decay = WD,
                         .max_staleness = 0,
                         .apply_threads = 1,
                         .global_mode = global};
    ps_server *srv;
    ps_client *cli;
    ps_client_opts co = {.provider = "tcp", .rank = 0, .servers = 1, .num_classes = C, .dim = D};
    if (ps_server_create(&so, &srv) < 0 || ps_client_create(&co, &cli) < 0) {
        CHECK(0, "setup: %s", pf_errmsg());
        return;
    }
    if (pst_connect_inproc(&srv, 1, &cli, 1, 10) < 0) {
        CHECK(0, "%s", pf_errmsg());
        return;
    }
    int64_t *ids = malloc(sizeof(int64_t) * N);
    float *g = malloc(sizeof(float) * (size_t)N * D), *out = malloc(sizeof(float) * (size_t)N * D);
    for (int i = 0; i < N; i++)
        ids[i] = i;
    uint64_t x = 88172645463325252ull;
    for (int i = N - 1; i > 0; i--) { /* Fisher-Yates with xorshift64: rows at random places */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int k = (int)(x % (uint64_t)(i + 1));
        int64_t tmp = ids[i];
        ids[i] = ids[k];
        ids[k] = tmp;
    }
    for (int t = 0; t < STEPS; t++) {
        for (int i = 0; i < N; i++)
            for (int j = 0; j < D; j++)
                g[(size_t)i * D + j] = grad(t, ids[i], j);
        ps_req *r;
        double t0 = pst_now();
        int rc = ps_push(cli, ids, N, g, LR, t, &r);
        if (rc == 0)
            rc = ps_wait(cli, r, 30);
        CHECK(rc == 0, "push of step %d: %s", t, pf_errmsg());
        printf("push of step %d (%d rows): acknowledged after %.1f ms\n", t, N, 1e3 * (pst_now() - t0));
        if (t == 2) {
            /* Pull of step 3 right after the acknowledgement: must see step 2 applied, whole rows. */
            memset(out, 0, sizeof(float) * (size_t)N * D);
            rc = ps_pull(cli, ids, N, out, t + 1, &r);
            if (rc == 0)
                rc = ps_wait(cli, r, 30);
            CHECK(rc == 0, "pull of step %d: %s", t + 1, pf_errmsg());
            double e = compare(ids, out, t + 1);
            printf("pull of step %d right after the push: max relative error vs float64 %.3g (tolerance 1e-5)\n",
                   t + 1, e);
            CHECK(e < 1e-5, "pull after push sees step %d unapplied or torn rows", t);
        }
        if (t == 3) {
            /* Pull tagged with the step just pushed: answerable at once by the step clock, but the apply
             * of that step is running: it is held until the apply is done, so whole rows, step 3 applied. */
            memset(out, 0, sizeof(float) * (size_t)N * D);
            rc = ps_pull(cli, ids, N, out, t, &r);
            if (rc == 0)
                rc = ps_wait(cli, r, 30);
            CHECK(rc == 0, "pull of step %d: %s", t, pf_errmsg());
            double e = compare(ids, out, t + 1);
            printf("pull tagged %d during its apply: max relative error vs float64 after %d steps %.3g "
                   "(tolerance 1e-5)\n",
                   t, t + 1, e);
            CHECK(e < 1e-5, "pull during the apply of step %d saw it unapplied or torn rows", t);
        }
        if (t == 4) {
            ps_stat st;
            CHECK(ps_stat_get(cli, 0, &st, 10) == 0 && st.steps_done == t + 1,
                  "stat right after the push of step %d: steps_done %lld (want %d)", t, (long long)st.steps_done,
                  t + 1);
        }
    }
    ps_req *r;
    int rc = ps_pull(cli, ids, N, out, STEPS, &r);
    if (rc == 0)
        rc = ps_wait(cli, r, 30);
    CHECK(rc == 0, "final pull: %s", pf_errmsg());
    double e = compare(ids, out, STEPS);
    printf("after %d steps: max relative error vs float64 %.3g (tolerance 1e-5)\n", STEPS, e);
    CHECK(e < 1e-5, "rows after %d steps", STEPS);
    ps_stat st;
    CHECK(ps_stat_get(cli, 0, &st, 10) == 0 && st.bad_requests == 0 && st.steps_done == STEPS &&
              st.rows_applied == (long long)STEPS * N,
          "stat: bad %lld, steps %lld, rows applied %lld", (long long)st.bad_requests, (long long)st.steps_done,
          (long long)st.rows_applied);
    /* Step STEPS pushes every row, step STEPS + 1 one row (it arrives while the big apply still runs), then
     * the server stops at once: both were acknowledged, so both are applied before it stops. */
    for (int t = STEPS; t < STEPS + 2; t++) {
        const int n = t == STEPS ? N : 1;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < D; j++)
                g[(size_t)i * D + j] = grad(t, ids[i], j);
        rc = ps_push(cli, ids, (size_t)n, g, LR, t, &r);
        if (rc == 0)
            rc = ps_wait(cli, r, 30);
        CHECK(rc == 0, "push of step %d: %s", t, pf_errmsg());
    }
    ps_server_stop(srv);
    const shard *sh = ps_server_shard(srv);
    double e1 = compare_shard(sh, ids, 1, STEPS + 2), e2 = compare_shard(sh, ids + 1, N - 1, STEPS + 1);
    printf("stopped right after the acknowledgement of step %d: max relative error vs float64 %.3g (the row "
           "of %d steps), %.3g (the rows of %d) (tolerance 1e-5)\n",
           STEPS + 1, e1, STEPS + 2, e2, STEPS + 1);
    CHECK(e1 < 1e-5 && e2 < 1e-5, "acknowledged pushes applied before the stop");
    ps_client_destroy(cli);
    ps_server_destroy(srv);
    free(ids), free(g), free(out);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    run(0);
    run(1);
    printf(fails ? "FAILED (%d)\n" : "PASS\n", fails);
    return fails ? 1 : 0;
}
