/* NCCL backend of common/coll.h (coll_nccl_create): W = min(CUDA devices, 4) threads, one rank per
 * GPU, shared unique id; allreduce sum (f32, f64: vs a float64 host sum, rel <= 1e-6) and max
 * (exact), allgather (bytes exact), reduce_scatter (rel <= 1e-6), broadcast from the last rank
 * (exact), barrier. Device buffers poisoned with NaN before each collective.
 * Without a GPU: "SKIP: no CUDA device", exit 77. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/coll.h"
#include "common/err.h"
#include "kernels/cuda/cuda_ops.h"
#include "tests/check.h"

enum { N = 1000 };
static int W;
static uint8_t id[CUDA_NCCL_ID_BYTES];
static double input(int rank, int i)
{
    return sin(0.37 * i + 1.3 * rank) * (1 + rank);
}

typedef struct rank_arg {
    int rank, failed;
    char msg[512];
} rank_arg;

/* Ends a rank's thread at its first failure, keeping the message; main reports every rank with check()
 * (the counts of tests/check.h are not shared between threads). */
#define RANK_FAIL(...)                                                                                       \
    do {                                                                                                     \
        snprintf(a->msg, sizeof a->msg, __VA_ARGS__);                                                        \
        a->failed = 1;                                                                                       \
        goto out;                                                                                            \
    } while (0)

static void *rank_main(void *p)
{
    rank_arg *a = p;
    int r = a->rank;
    pf_coll c = {0};
    float *d = NULL, *g = NULL;
    float h[N], hg[N * 4];
    if (cuda_set_device(r) || coll_nccl_create(id, r, W, &c))
        RANK_FAIL("rank %d: init: %s", r, pf_errmsg());
    if (cuda_malloc((void **)&d, N * sizeof(double)) || cuda_malloc((void **)&g, (size_t)W * N * 4))
        RANK_FAIL("rank %d: alloc: %s", r, pf_errmsg());
    /* allreduce sum f32 */
    for (int i = 0; i < N; i++)
        h[i] = (float)input(r, i);
    if (cuda_h2d(d, h, sizeof h) || coll_allreduce(&c, d, N, COLL_F32, COLL_SUM) || cuda_d2h(h, d, sizeof h))
        RANK_FAIL("rank %d: allreduce: %s", r, pf_errmsg());
    double num = 0, den = 0;
    for (int i = 0; i < N; i++) {
        double s = 0;
        for (int q = 0; q < W; q++)
            s += (float)input(q, i);
        num += (h[i] - s) * (h[i] - s);
        den += s * s;
    }
    if (!(sqrt(num / den) <= 1e-6))
        RANK_FAIL("rank %d: allreduce sum f32 rel %.3e", r, sqrt(num / den));
    /* allreduce max f64 */
    double hd[N];
    for (int i = 0; i < N; i++)
        hd[i] = input(r, i);
    if (cuda_h2d(d, hd, sizeof hd) || coll_allreduce(&c, d, N, COLL_F64, COLL_MAX) ||
        cuda_d2h(hd, d, sizeof hd))
        RANK_FAIL("rank %d: allreduce max: %s", r, pf_errmsg());
    for (int i = 0; i < N; i++) {
        double m = -INFINITY;
        for (int q = 0; q < W; q++)
            m = fmax(m, input(q, i));
        if (hd[i] != m)
            RANK_FAIL("rank %d: allreduce max f64 element %d: %g, expected %g", r, i, hd[i], m);
    }
    /* allgather */
    for (int i = 0; i < N; i++)
        h[i] = (float)input(r, i);
    if (cuda_h2d(d, h, sizeof h) || cuda_fill_f32(g, NAN, (size_t)W * N) ||
        coll_allgather(&c, d, g, sizeof h) || cuda_d2h(hg, g, (size_t)W * N * 4))
        RANK_FAIL("rank %d: allgather: %s", r, pf_errmsg());
    for (int q = 0; q < W; q++)
        for (int i = 0; i < N; i++)
            if (hg[q * N + i] != (float)input(q, i))
                RANK_FAIL("rank %d: allgather block %d element %d wrong", r, q, i);
    /* reduce_scatter: every rank sends W blocks of N/W... use blocks of N/4 floats */
    int cnt = N / 4;
    for (int q = 0; q < W; q++)
        for (int i = 0; i < cnt; i++)
            hg[q * cnt + i] = (float)input(r, q * cnt + i);
    if (cuda_h2d(g, hg, (size_t)W * cnt * 4) || cuda_fill_f32(d, NAN, cnt) ||
        coll_reduce_scatter(&c, g, d, cnt, COLL_F32) || cuda_d2h(h, d, (size_t)cnt * 4))
        RANK_FAIL("rank %d: reduce_scatter: %s", r, pf_errmsg());
    num = den = 0;
    for (int i = 0; i < cnt; i++) {
        double s = 0;
        for (int q = 0; q < W; q++)
            s += (float)input(q, r * cnt + i);
        num += (h[i] - s) * (h[i] - s);
        den += s * s;
    }
    if (!(sqrt(num / den) <= 1e-6))
        RANK_FAIL("rank %d: reduce_scatter rel %.3e", r, sqrt(num / den));
    /* broadcast from the last rank */
    for (int i = 0; i < N; i++)
        h[i] = (float)input(r, i);
    if (cuda_h2d(d, h, sizeof h) || coll_broadcast(&c, d, sizeof h, W - 1) || cuda_d2h(h, d, sizeof h))
        RANK_FAIL("rank %d: broadcast: %s", r, pf_errmsg());
    for (int i = 0; i < N; i++)
        if (h[i] != (float)input(W - 1, i))
            RANK_FAIL("rank %d: broadcast element %d wrong", r, i);
    if (coll_barrier(&c))
        RANK_FAIL("rank %d: barrier: %s", r, pf_errmsg());
    snprintf(a->msg, sizeof a->msg,
             "rank %d of %d: allreduce sum/max, allgather, reduce_scatter, broadcast, barrier ok", r, W);
out:
    cuda_free(d);
    cuda_free(g);
    coll_destroy(&c);
    return NULL;
}

int main(void)
{
    int n = cuda_device_count();
    if (n == 0) {
        printf("SKIP: no CUDA device (NCCL backend compiled and linked; not run)\n");
        return 77;
    }
    W = n < 4 ? n : 4;
    if (coll_nccl_unique_id(id))
        DIE("coll_nccl_unique_id");
    pthread_t t[4];
    rank_arg args[4];
    memset(args, 0, sizeof args);
    for (int r = 0; r < W; r++) {
        args[r].rank = r;
        pthread_create(&t[r], NULL, rank_main, &args[r]);
    }
    for (int r = 0; r < W; r++) {
        pthread_join(t[r], NULL);
        check(!args[r].failed, "%s", args[r].msg);
    }
    return check_summary();
}
