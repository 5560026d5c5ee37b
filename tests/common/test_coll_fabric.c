/* Ring collectives over libfabric (tcp;ofi_rxm on 127.0.0.1), W = 2 and 3 processes: allreduce sum
 * and max (several chunks), reduce_scatter, allgather, broadcast, barrier, against values computed by
 * formula in each process; a count mismatch (W=3) and a hostile 7-byte message (W=2) give -EPROTO
 * naming the sender on the rank that receives them; the ring's timeout is also its endpoint's post bound; a
 * barrier against an allreduce of one float gives -EPROTO naming both kinds on both ranks; a
 * wait for a rank that never sends calls the idle check after 1 s, then once a second, and ends with its
 * error (coll_fabric_set_idle_check), well before the ring's timeout. The parent forks the ranks, passes the
 * endpoint names through pipes, and kills every child on every exit path (timeout 60 s). Exits 77 when the
 * tcp provider is not available. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/coll.h"
#include "common/err.h"
#include "common/fabric.h"
#include "tests/common/mp_ring.h"

static int fails;

#define CHECK(cond, ...)                                                                                     \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            printf("FAIL rank %d line %d: ", rank, __LINE__);                                                \
            printf(__VA_ARGS__);                                                                             \
            printf("\n");                                                                                    \
            fflush(stdout);                                                                                  \
            fails++;                                                                                         \
        }                                                                                                    \
    } while (0)

static double elapsed(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + 1e-9 * (double)(t.tv_nsec - t0->tv_nsec);
}

/* Value of element i on rank r: small integers, so float sums are exact. */
static float val(int r, size_t i)
{
    return (float)((i * 7 + (size_t)r * 13) % 101);
}

static int child(mp_rank *mr, void *arg)
{
    (void)arg;
    int rank = mr->rank, W = mr->world, rc;
    fab_ctx *f = mr->f;
    const void *const *addrs = mr->addrs;
    const size_t *lens = mr->lens;
    pf_coll c;
    coll_fabric_opts o = {.chunk_bytes = 64 * 1024, .timeout_s = 20};
    if ((rc = coll_fabric_create(f, rank, W, addrs, lens, &o, &c)) < 0) {
        printf("FAIL rank %d: coll_fabric_create: %s\n", rank, pf_errmsg());
        return 1;
    }

    /* allreduce sum, 1M + 3 floats (segments of uneven length, 16+ rounds of 64 KiB chunks). */
    size_t n = (1u << 20) + 3;
    float *a = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        a[i] = val(rank, i);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    rc = coll_allreduce(&c, a, n, COLL_F32, COLL_SUM);
    double dt = elapsed(&t0);
    CHECK(rc == 0, "allreduce: %s", pf_errmsg());
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        for (int r = 0; r < W; r++)
            want += val(r, i);
        bad += a[i] != want;
    }
    CHECK(bad == 0, "allreduce sum: %zu of %zu elements wrong", bad, n);
    if (rank == 0)
        printf("ok   W=%d allreduce sum of %zu floats: exact, %.1f ms (%.0f MB/s algorithm bandwidth)\n", W,
               n, dt * 1e3, n * 4.0 / dt / 1e6);

    /* allreduce max, doubles: rank r holds i on element i where i % W == r, else -1. */
    double d[1001];
    for (int i = 0; i < 1001; i++)
        d[i] = (i % W == rank) ? (double)i : -1.0;
    CHECK(coll_allreduce(&c, d, 1001, COLL_F64, COLL_MAX) == 0, "allreduce max: %s", pf_errmsg());
    int badm = 0;
    for (int i = 0; i < 1001; i++)
        badm += d[i] != (double)i;
    CHECK(badm == 0, "allreduce max: %d wrong", badm);

    /* reduce_scatter: block b element q of rank r = 10 r + b + 0.5 q (count 100003, several chunks). */
    size_t cnt = 100003;
    double *rs = malloc((size_t)W * cnt * sizeof(double)), *out = malloc(cnt * sizeof(double));
    for (int b = 0; b < W; b++)
        for (size_t q = 0; q < cnt; q++)
            rs[(size_t)b * cnt + q] = 10.0 * rank + b + 0.5 * (double)q;
    CHECK(coll_reduce_scatter(&c, rs, out, cnt, COLL_F64) == 0, "reduce_scatter: %s", pf_errmsg());
    double sr = 0;
    for (int r = 0; r < W; r++)
        sr += 10.0 * r;
    size_t badr = 0;
    for (size_t q = 0; q < cnt; q++)
        badr += out[q] != sr + W * (rank + 0.5 * (double)q);
    CHECK(badr == 0, "reduce_scatter: %zu wrong", badr);

    /* allgather: 70001 bytes per rank, byte j of rank r = (r * 31 + j) & 255. */
    size_t gb = 70001;
    uint8_t *gs = malloc(gb), *gr = malloc(gb * (size_t)W);
    for (size_t j = 0; j < gb; j++)
        gs[j] = (uint8_t)((rank * 31 + j) & 255);
    CHECK(coll_allgather(&c, gs, gr, gb) == 0, "allgather: %s", pf_errmsg());
    size_t badg = 0;
    for (int r = 0; r < W; r++)
        for (size_t j = 0; j < gb; j++)
            badg += gr[(size_t)r * gb + j] != (uint8_t)((r * 31 + j) & 255);
    CHECK(badg == 0, "allgather: %zu wrong", badg);

    /* broadcast 200000 bytes from the last rank. */
    size_t bb = 200000;
    uint8_t *bc = malloc(bb);
    for (size_t j = 0; j < bb; j++)
        bc[j] = rank == W - 1 ? (uint8_t)(j * 13 + 5) : 0;
    CHECK(coll_broadcast(&c, bc, bb, W - 1) == 0, "broadcast: %s", pf_errmsg());
    size_t badb = 0;
    for (size_t j = 0; j < bb; j++)
        badb += bc[j] != (uint8_t)(j * 13 + 5);
    CHECK(badb == 0, "broadcast: %zu wrong", badb);

    CHECK(coll_barrier(&c) == 0, "barrier: %s", pf_errmsg());

    /* Count mismatch: rank 0 sends 5 floats, the others 6: rank 1 (right of 0) sees a bad length. */
    /* A second ring on the same (now idle) endpoint with a 2 s timeout, so the ranks left waiting
     * for the failed rank give up quickly. */
    coll_destroy(&c);
    coll_fabric_opts o2 = {.chunk_bytes = 4096, .timeout_s = 2};
    CHECK(coll_fabric_create(f, rank, W, addrs, lens, &o2, &c) == 0, "second ring: %s", pf_errmsg());
    /* A send to a right neighbour whose endpoint is gone gives up after the ring's bound too, not after the
     * endpoint's default post bound (FAB_DEFAULT_TIMEOUT_S, 120 s). */
    CHECK(fab_timeout(f) == 2.0, "the endpoint's post bound is %.1f s, not the ring's 2 s", fab_timeout(f));
    float m[6] = {1, 1, 1, 1, 1, 1};
    if (W == 3) {
        rc = coll_allreduce(&c, m, rank == 0 ? 5 : 6, COLL_F32, COLL_SUM);
        if (rank == 1) {
            CHECK(rc == -EPROTO && strstr(pf_errmsg(), "from rank 0"), "mismatch: rc %d '%s'", rc,
                  pf_errmsg());
            if (rc == -EPROTO)
                printf("ok   W=%d count mismatch seen by rank 1: %s\n", W, pf_errmsg());
        }
    } else {
        /* A hostile message: rank 1 sends 7 bytes of garbage straight to rank 0's endpoint before the
         * allreduce; rank 0 must reject it by its length, not read stale header bytes. */
        if (rank == 1) {
            static uint8_t junk[7] = {'P', 'F', 'C', 'R', 0, 0, 0};
            fab_mr jmr;
            fi_addr_t to;
            int jc = 0;
            CHECK(fab_mr_reg(f, junk, sizeof junk, FI_SEND, &jmr) == 0 &&
                      fab_av_insert(f, addrs[0], lens[0], &to) == 0 &&
                      fab_send(f, to, junk, sizeof junk, &jmr, &jc) == 0,
                  "sending junk: %s", pf_errmsg());
            fab_comp comp;
            for (int it = 0; it < 200000 && fab_poll(f, &comp, 1) == 0; it++)
                usleep(10);
            fab_mr_close(&jmr);
        }
        rc = coll_allreduce(&c, m, 6, COLL_F32, COLL_SUM);
        if (rank == 0) {
            CHECK(rc == -EPROTO && strstr(pf_errmsg(), "7-byte message"), "junk: rc %d '%s'", rc,
                  pf_errmsg());
            if (rc == -EPROTO)
                printf("ok   W=%d hostile 7-byte message rejected by rank 0: %s\n", W, pf_errmsg());
        }
    }
    /* After an error the group is unusable: stop here (the other ranks time out after 2 s; mp_ring_run
     * keeps every endpoint open until all ranks are done). */

    free(a);
    free(rs);
    free(out);
    free(gs);
    free(gr);
    free(bc);
    coll_destroy(&c);
    if (rank == 0 && fails == 0)
        printf("ok   W=%d allreduce max, reduce_scatter, allgather, broadcast, barrier exact\n", W);
    fflush(stdout);
    return fails ? 1 : 0;
}

/* W = 2: rank 0 calls a barrier, rank 1 an allreduce of one float (the same bytes on the wire): each receives
 * the other's message and must refuse it naming both kinds, not take the barrier's 1 as the allreduce's. */
static int kind_child(mp_rank *mr, void *arg)
{
    (void)arg;
    const int rank = mr->rank;
    pf_coll c;
    coll_fabric_opts o = {.chunk_bytes = 4096, .timeout_s = 20};
    if (coll_fabric_create(mr->f, rank, mr->world, mr->addrs, mr->lens, &o, &c) < 0) {
        printf("FAIL rank %d: coll_fabric_create: %s\n", rank, pf_errmsg());
        return 1;
    }
    float v = 5.0f;
    int rc = rank == 0 ? coll_barrier(&c) : coll_allreduce(&c, &v, 1, COLL_F32, COLL_SUM);
    const char *want = rank == 0
                           ? "rank 1 called allreduce (its collective 1) while this rank called barrier"
                           : "rank 0 called barrier (its collective 1) while this rank called allreduce";
    CHECK(rc == -EPROTO && strstr(pf_errmsg(), want), "kind mismatch: rc %d '%s'", rc, pf_errmsg());
    CHECK(v == 5.0f, "rank 1's allreduce changed its buffer to %g", v);
    if (rc == -EPROTO && rank == 1)
        printf("ok   W=2 barrier against allreduce refused: %s\n", pf_errmsg());
    fflush(stdout);
    coll_destroy(&c);
    return fails ? 1 : 0;
}

/* coll_fabric_set_idle_check: rank 0's check is called with its argument, says nothing the first time and
 * fails the second. */
static int idle_calls;
static int idle_check(void *arg)
{
    if (arg != &idle_calls)
        return pf_err(-EINVAL, "the idle check got the wrong argument");
    if (++idle_calls < 2)
        return 0;
    return pf_err(-ECOMM, "shard 3 has no live copy left");
}

/* W = 2: rank 1 never enters a collective (it drives its endpoint for 8 s, so rank 0's send goes out, and
 * returns), rank 0 waits in a barrier for its message with a 20 s ring timeout and the idle check above. */
static int idle_child(mp_rank *mr, void *arg)
{
    (void)arg;
    const int rank = mr->rank;
    if (rank != 0) {
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        fab_comp comp;
        while (elapsed(&t0) < 8 && fab_poll(mr->f, &comp, 1) >= 0)
            usleep(1000);
        return 0;
    }
    pf_coll c;
    coll_fabric_opts o = {.chunk_bytes = 4096, .timeout_s = 20};
    if (coll_fabric_create(mr->f, rank, mr->world, mr->addrs, mr->lens, &o, &c) < 0) {
        printf("FAIL rank 0: coll_fabric_create: %s\n", pf_errmsg());
        return 1;
    }
    coll_fabric_set_idle_check(&c, idle_check, &idle_calls);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = coll_barrier(&c);
    const double dt = elapsed(&t0);
    CHECK(rc == -ECOMM, "barrier with a failing idle check returned %d (%s), not -ECOMM", rc, pf_errmsg());
    CHECK(idle_calls == 2, "the idle check was called %d times, not 2", idle_calls);
    /* first call after 1 s without a completion, the second a second later */
    CHECK(dt >= 1.9 && dt < 6, "the barrier ended after %.2f s, not about 2 s", dt);
    CHECK(strstr(pf_errmsg(), "stopped waiting for worker 1: shard 3 has no live copy left") != NULL,
          "message '%s' does not name the rank waited for and the check's text", pf_errmsg());
    if (fails == 0)
        printf("ok   W=2 idle check ended the wait for a silent rank after %.2f s: %s\n", dt, pf_errmsg());
    fflush(stdout);
    coll_destroy(&c);
    return fails ? 1 : 0;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int r2 = mp_ring_run(2, child, NULL, 60);
    if (r2 == 77) {
        printf("SKIP: libfabric tcp provider not available\n");
        return 77;
    }
    int r3 = mp_ring_run(3, child, NULL, 60);
    int rk = mp_ring_run(2, kind_child, NULL, 60);
    int ri = mp_ring_run(2, idle_child, NULL, 60);
    printf("%s: ring collectives over tcp;ofi_rxm, W=2 %s, W=3 %s, kinds %s, idle check %s\n",
           (r2 || r3 || rk || ri) ? "FAIL" : "PASS", r2 ? "FAIL" : "ok", r3 ? "FAIL" : "ok",
           rk ? "FAIL" : "ok", ri ? "FAIL" : "ok");
    return (r2 || r3 || rk || ri) ? 1 : 0;
}
