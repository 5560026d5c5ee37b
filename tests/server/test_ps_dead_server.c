/* A parameter server killed with SIGKILL must fail the requests that need it promptly, with an error naming
 * it, while requests to the live server keep working (real pfcps-server processes on 127.0.0.1, tcp).
 *
 * Smallest failing input of the defect: before the fix, ps_client ignored error completions of its sends and
 * had no bound on a reply that never comes, so a pull touching a killed server ended only when ps_wait's
 * timeout ran out (60 s here; 4 x ctl_timeout in training) and never with ps_wait(-1).
 *
 *   after:    S = 2, W = 1. Pull rows of both servers (held to the documented initializer, pst_init_row),
 *             push known gradients, kill -9 server 1. Then a pull and a push touching server 1 must fail
 *             within 10 s (ps_wait is given 60 s) naming server 1, and the next request at once (< 1 s); a
 *             pull of server 0's rows returns w0 - lr (g + wd w0) computed here in float64; stat/checksum
 *             of server 1 fail at once, of server 0 work.
 *   inflight: S = 2, W = 2 (local mode, BSP). Worker 0 pushes step 0 and pulls step 1: both servers hold the
 *             pull until worker 1 pushes step 0. Server 1 is killed while it holds the pull (the request was
 *             sent fine; no completion will ever come for it): ps_wait(-1) (forever) must still fail within
 *             10 s naming server 1. The pull's destination is freed at once (a late reply from server 0
 *             must not write into it: ASan in the sanitize build). Worker 1's push of step 0 then fails
 * naming server 1 (its part for server 0 arrives), server 0 applies step 0 and answers the abandoned pull,
 * and worker 0's pull of server 0's rows at step 1 equals the float64 update. midpush:  S = 2, W = 1, client
 * timeout 30 s. A push of 100000 rows x 64 (25.6 MB, 25 messages) to server 1; server 1 is killed as soon as
 * ps_push returned (messages posted, in flight). Their sends complete with errors: the push must fail within
 * 10 s (far below the 30 s a probe would need) with "push request send failed", and server 0 still serves its
 * initial rows.
 *
 * The clients' bound (ps_client_set_timeout) is 3 s in after/inflight, so nothing here can hang on the
 * fabric's 120 s default (the first failure there takes ~3.5 s: a probe after 0.75 s of silence whose post
 * stays -FI_EAGAIN for 3 s, which is what libfabric 1.17's tcp;ofi_rxm answers towards a killed peer); an
 * alarm (pst_start) kills and reaps every server on any hang. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/err.h"
#include "worker/ps_client.h"
#include "tests/server/pst.h"

#include "tests/check.h"

#define SEED    2048 /* pst_start's config */
#define WD      0.0005
#define C       1000
#define D       16
#define N       24 /* ids 3, 4, ..., 26: 12 on each server */
#define LR      0.5f
#define BOUND_S 3.0 /* client timeout: post retry bound and liveness-probe deadline */

static float grad(int64_t id, int j)
{
    return 0.001f * (float)(1 + (id * 3 + j) % 11);
}

/* Worker 0's gradient for rows ids[0..n) at step 0, once. */
static void fill_grads(const int64_t *ids, int n, float *g)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < D; j++)
            g[i * D + j] = grad(ids[i], j);
}

/* Largest relative difference between pulled rows and the initializer (pushed = 0) or the first SGD step from
 * it with this test's gradient (pushed = 1): v = g + wd w0 (momentum buffer starts at 0), w1 = w0 - lr v. */
static double row_err(const int64_t *ids, int n, const float *rows, int pushed)
{
    double maxerr = 0, w0[D];
    for (int i = 0; i < n; i++) {
        pst_init_row(SEED, ids[i], D, w0);
        for (int j = 0; j < D; j++) {
            double w = (float)w0[j];
            double want = pushed ? w - (double)LR * ((double)grad(ids[i], j) + WD * w) : w;
            double e = fabs((double)rows[i * D + j] - want) / (fabs(want) + 1e-30);
            if (e > maxerr)
                maxerr = e;
        }
    }
    return maxerr;
}

/* Kills server s with SIGKILL and reaps it. */
static void kill_server(pst_cluster *cl, int s)
{
    pid_t p = cl->pids[s];
    kill(p, SIGKILL);
    waitpid(p, NULL, 0);
    pst_untrack_child(p);
    cl->pids[s] = 0;
}

/* Starts a pull (or push) and waits up to wait_s; returns its code, the seconds the whole call took in *dt
 * and the message in msg. */
static int timed(ps_client *c, int push, const int64_t *ids, int n, float *buf, int64_t step, double wait_s,
                 double *dt, char *msg)
{
    double t0 = pst_now();
    ps_req *r = NULL;
    int rc = push ? ps_push(c, ids, (size_t)n, buf, LR, step, &r) : ps_pull(c, ids, (size_t)n, buf, step, &r);
    if (rc == 0)
        rc = ps_wait(c, r, wait_s);
    *dt = pst_now() - t0;
    snprintf(msg, PF_ERRMSG_MAX, "%s", rc ? pf_errmsg() : "");
    return rc;
}

/* The error a request touching the dead server 1 must end with: -ECOMM, prompt, naming server 1. */
static void check_dead_error(const char *what, int rc, double dt, const char *msg, double within)
{
    printf("%s: rc %d after %.3f s: %s\n", what, rc, dt, msg);
    CHECK(rc == -ECOMM, "%s: expected -ECOMM (%d), got %d", what, -ECOMM, rc);
    CHECK(dt < within, "%s took %.2f s (bound %.1f s; the wait allowed 60 s)", what, dt, within);
    CHECK(strstr(msg, "server 1") != NULL, "%s: message does not name server 1: %s", what, msg);
}

static int finish(pst_cluster *cl, int rc)
{
    if (pst_stop(cl) != 0)
        fails++;
    return rc || fails;
}

static int t_after(void)
{
    pst_cluster cl;
    int rc = pst_start(&cl, 2, 1, C, D, NULL, 90);
    if (rc)
        return rc == 77 ? 77 : 1;
    ps_client *c = pst_join(&cl, 0, PS_DT_FP32);
    if (!c)
        return finish(&cl, 1);
    ps_client_set_timeout(c, BOUND_S);
    int64_t ids[N], ids0[N / 2];
    for (int i = 0; i < N; i++)
        ids[i] = 3 + (i * 7) % N; /* a permutation of 3..26, both servers */
    int n0 = 0;
    for (int i = 0; i < N; i++) /* server 0's ids in the reverse of the mixed order */
        if (ids[N - 1 - i] % 2 == 0)
            ids0[n0++] = ids[N - 1 - i];
    float rows[N * D], g[N * D];
    double dt;
    char msg[PF_ERRMSG_MAX];

    rc = timed(c, 0, ids, N, rows, 0, 20, &dt, msg);
    CHECK(rc == 0, "pull from both live servers: %s", msg);
    double e = rc ? 1 : row_err(ids, N, rows, 0);
    printf("live: pull of %d rows from both servers in %.3f s, max rel err vs initializer %.3g\n", N, dt, e);
    CHECK(e < 1e-7, "initial rows differ from the generator by %g", e);
    fill_grads(ids, N, g);
    rc = timed(c, 1, ids, N, g, 0, 20, &dt, msg);
    CHECK(rc == 0, "push to both live servers: %s", msg);
    if (fails)
        return finish(&cl, 1);

    kill_server(&cl, 1);
    printf("server 1 killed (SIGKILL, reaped)\n");
    rc = timed(c, 0, ids, N, rows, 1, 60, &dt, msg);
    check_dead_error("pull touching server 1 (first request after the kill)", rc, dt, msg, 10);
    rc = timed(c, 0, ids, N, rows, 1, 60, &dt, msg);
    check_dead_error("pull touching server 1 (again)", rc, dt, msg, 1);
    rc = timed(c, 1, ids, N, g, 1, 60, &dt, msg);
    check_dead_error("push touching server 1", rc, dt, msg, 1);
    ps_stat st;
    uint64_t sum;
    double t0 = pst_now();
    rc = ps_stat_get(c, 1, &st, 60);
    check_dead_error("stat of server 1", rc, pst_now() - t0, pf_errmsg(), 1);
    t0 = pst_now();
    rc = ps_checksum(c, 1, &sum, 60);
    check_dead_error("checksum of server 1", rc, pst_now() - t0, pf_errmsg(), 1);

    /* Server 0 still serves: its rows after step 0's push, read back at step 1. */
    memset(rows, 0, sizeof rows);
    rc = timed(c, 0, ids0, n0, rows, 1, 20, &dt, msg);
    CHECK(rc == 0, "pull of server 0's rows after server 1 died: %s", msg);
    e = rc ? 1 : row_err(ids0, n0, rows, 1);
    printf("server 0 only: pull of %d rows in %.3f s, max rel err vs float64 update %.3g\n", n0, dt, e);
    CHECK(e < 1e-6, "server 0's rows differ from w0 - lr (g + wd w0) by %g", e);
    rc = ps_stat_get(c, 0, &st, 20);
    CHECK(rc == 0 && st.rank == 0 && st.steps_done >= 1,
          "stat of server 0: rc %d rank %d steps_done %lld: %s", rc, st.rank, (long long)st.steps_done,
          pf_errmsg());
    ps_client_destroy(c);
    return finish(&cl, 0);
}

static int t_inflight(void)
{
    pst_cluster cl;
    int rc = pst_start(&cl, 2, 2, C, D, NULL, 90);
    if (rc)
        return rc == 77 ? 77 : 1;
    ps_client *c[2];
    int ranks[2] = {0, 1};
    if (pst_join_many(&cl, 2, ranks, PS_DT_FP32, c) < 0)
        return finish(&cl, 1);
    for (int k = 0; k < 2; k++)
        ps_client_set_timeout(c[k], BOUND_S);
    int64_t ids[N], ids0[N / 2];
    int n0 = 0;
    for (int i = 0; i < N; i++)
        ids[i] = 3 + i;
    for (int i = 0; i < N; i++)
        if (ids[i] % 2 == 0)
            ids0[n0++] = ids[i];
    float g[N * D], rows[N * D];
    double dt;
    char msg[PF_ERRMSG_MAX];
    fill_grads(ids, N, g);
    rc = timed(c[0], 1, ids, N, g, 0, 20, &dt, msg);
    CHECK(rc == 0, "worker 0's push of step 0: %s", msg);
    float *held = malloc(sizeof(float) * N * D);
    ps_req *pr = NULL;
    rc = ps_pull(c[0], ids, N, held, 1, &pr);
    CHECK(rc == 0, "pull of step 1: %s", pf_errmsg());
    if (fails)
        return finish(&cl, 1);
    int early = 0;
    for (double t0 = pst_now(); pst_now() - t0 < 0.3;)
        early |= ps_test(c[0], pr);
    CHECK(!early, "the pull of step 1 completed before worker 1 pushed step 0 (BSP)");

    kill_server(&cl, 1);
    printf("server 1 killed (SIGKILL, reaped) while it holds worker 0's pull of step 1\n");
    double t0 = pst_now();
    rc = ps_wait(c[0], pr, -1);
    dt = pst_now() - t0;
    check_dead_error("held pull, ps_wait(-1)", rc, dt, pf_errmsg(), 10);
    free(held); /* a late reply of server 0 to this pull must go nowhere */

    int64_t none = 0;
    rc = timed(c[1], 1, &none, 0, NULL, 0, 60, &dt, msg);
    check_dead_error("worker 1's push of step 0", rc, dt, msg, 10);
    /* Worker 1's part for server 0 went out first: server 0 applies step 0, answers the abandoned pull and
     * serves step 1. */
    memset(rows, 0, sizeof rows);
    rc = timed(c[0], 0, ids0, n0, rows, 1, 20, &dt, msg);
    CHECK(rc == 0, "pull of server 0's rows at step 1: %s", msg);
    double e = rc ? 1 : row_err(ids0, n0, rows, 1);
    printf("server 0 only: pull of %d rows at step 1 in %.3f s, max rel err vs float64 update %.3g\n", n0, dt,
           e);
    CHECK(e < 1e-6, "server 0's rows differ from w0 - lr (g + wd w0) by %g", e);
    for (int k = 0; k < 2; k++)
        ps_client_destroy(c[k]);
    return finish(&cl, 0);
}

static int t_midpush(void)
{
    pst_cluster cl;
    const int n = 100000, d = 64;
    /* pfc_update = sparse: server 0's rows then stay the initial ones whether or not its (empty) part of the
     * failed step was applied before the pull below; under dense they would move by the step's weight decay
     * only once it was, a race this test is not about. */
    int rc = pst_start(&cl, 2, 1, 2 * n + 2, d, "[train]\npfc_update = sparse\n", 90);
    if (rc)
        return rc == 77 ? 77 : 1;
    ps_client *c = pst_join(&cl, 0, PS_DT_FP32);
    if (!c)
        return finish(&cl, 1);
    ps_client_set_timeout(c, 30);
    int64_t *ids = malloc(sizeof(int64_t) * n);
    float *g = calloc((size_t)n * d, sizeof(float));
    for (int i = 0; i < n; i++)
        ids[i] = 2 * i + 1; /* all on server 1 */
    ps_req *r;
    double t0 = pst_now();
    rc = ps_push(c, ids, n, g, LR, 0, &r);
    kill_server(&cl, 1);
    printf("push of %d rows (%.1f MB) started in %.3f s; server 1 killed\n", n, (double)n * d * 4 / 1e6,
           pst_now() - t0);
    CHECK(rc == 0, "push: %s", pf_errmsg());
    if (rc)
        return finish(&cl, 1);
    t0 = pst_now();
    rc = ps_wait(c, r, 60);
    /* The client's timeout is 30 s: only the sends' error completions can end the push within 10 s. */
    check_dead_error("push in flight (send error completions)", rc, pst_now() - t0, pf_errmsg(), 10);
    CHECK(strstr(pf_errmsg(), "push request send failed") != NULL,
          "the message does not say the push send failed");
    /* Server 0 still serves its initial rows. */
    int64_t ids0[N];
    for (int i = 0; i < N; i++)
        ids0[i] = 2 * (N - i);
    float *rows0 = malloc(sizeof(float) * N * d);
    double dt;
    char msg[PF_ERRMSG_MAX];
    rc = timed(c, 0, ids0, N, rows0, 0, 20, &dt, msg);
    CHECK(rc == 0, "pull from server 0 after server 1 died: %s", msg);
    double e = rc ? 1 : 0, w0[64];
    for (int i = 0; rc == 0 && i < N; i++) {
        pst_init_row(SEED, ids0[i], d, w0);
        for (int j = 0; j < d; j++)
            e = fmax(e, fabs(rows0[i * d + j] - w0[j]) / (fabs(w0[j]) + 1e-30));
    }
    printf("server 0 only: pull of %d rows in %.3f s, max rel err vs initializer %.3g\n", N, dt, e);
    CHECK(rc == 0 && e < 1e-7, "server 0's initial rows differ from the generator by %g", e);
    free(rows0), free(ids), free(g);
    ps_client_destroy(c);
    return finish(&cl, 0);
}

/* done: S = 2, W = 1, client timeout 30 s (a worker's 4 x ctl_timeout). After a pull from both, both
 * servers are killed (a run whose servers stopped first); ps_client_done(c, 3) must fail within its 3 s plus
 * PS_DONE_MIN_S for the second shard (bound 6 s), naming shard 0. A post to a killed server is retried until
 * the fabric's timeout: were that the client's 30 s per shard, the call would take over 60 s. */
static int t_done(void)
{
    pst_cluster cl;
    int rc = pst_start(&cl, 2, 1, 2 * N, 16, NULL, 90);
    if (rc)
        return rc == 77 ? 77 : 1;
    ps_client *c = pst_join(&cl, 0, PS_DT_FP32);
    if (!c)
        return finish(&cl, 1);
    ps_client_set_timeout(c, 30);
    int64_t ids[N];
    for (int i = 0; i < N; i++)
        ids[i] = i; /* both servers' rows */
    float *rows = malloc(sizeof(float) * N * 16);
    double dt;
    char msg[PF_ERRMSG_MAX];
    rc = timed(c, 0, ids, N, rows, 0, 20, &dt, msg);
    CHECK(rc == 0, "pull from both servers: %s", msg);
    kill_server(&cl, 0);
    kill_server(&cl, 1);
    double t0 = pst_now();
    rc = ps_client_done(c, 3);
    dt = pst_now() - t0;
    printf("done with both servers killed: rc %d after %.3f s: %s\n", rc, dt, rc ? pf_errmsg() : "");
    CHECK(rc < 0, "ps_client_done succeeded with both servers killed");
    CHECK(dt < 6, "ps_client_done took %.2f s (bound 3 s + %.1f s for the second shard)", dt, PS_DONE_MIN_S);
    CHECK(rc == 0 || strstr(pf_errmsg(), "shard 0") != NULL, "the message does not name shard 0: %s",
          pf_errmsg());
    free(rows);
    ps_client_destroy(c);
    return finish(&cl, 0);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *t = argc > 1 ? argv[1] : "";
    int rc;
    if (!strcmp(t, "after"))
        rc = t_after();
    else if (!strcmp(t, "inflight"))
        rc = t_inflight();
    else if (!strcmp(t, "midpush"))
        rc = t_midpush();
    else if (!strcmp(t, "done"))
        rc = t_done();
    else {
        printf("usage: test_ps_dead_server after|inflight|midpush|done\n");
        return 2;
    }
    if (rc == 77)
        return 77;
    printf(rc || fails ? "FAILED (%d checks)\n" : "PASS\n", fails);
    return rc || fails ? 1 : 0;
}
