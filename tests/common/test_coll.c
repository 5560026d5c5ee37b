/* Thread collectives: allreduce (sum/max, f32/f64), allgather (also in place), reduce-scatter,
 * broadcast, barrier, against values computed by hand; mismatched counts give -EINVAL on every rank. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/coll.h"
#include "common/err.h"

#define W 3

static coll_thread_group *group;
static int fails[W];

#define CHECK(cond, ...)                                                                                     \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            printf("FAIL rank %d line %d: ", rank, __LINE__);                                                \
            printf(__VA_ARGS__);                                                                             \
            printf("\n");                                                                                    \
            fails[rank]++;                                                                                   \
        }                                                                                                    \
    } while (0)

static void *worker(void *vp)
{
    int rank = (int)(long)vp;
    pf_coll c;
    coll_thread_get(group, rank, &c);

    /* allreduce sum f32: rank r holds r + 1 + i; sum over ranks 0..2 = 6 + 3i. */
    float f[5];
    for (int i = 0; i < 5; i++)
        f[i] = (float)(rank + 1 + i);
    CHECK(coll_allreduce(&c, f, 5, COLL_F32, COLL_SUM) == 0, "allreduce f32");
    for (int i = 0; i < 5; i++)
        CHECK(f[i] == 6.0f + 3 * i, "sum[%d] = %g, expected %d", i, f[i], 6 + 3 * i);

    /* allreduce max f64: rank r holds (r == i % 3) ? 100 + i : -i; max = 100 + i. */
    double d[6];
    for (int i = 0; i < 6; i++)
        d[i] = (rank == i % W) ? 100.0 + i : -(double)i;
    CHECK(coll_allreduce(&c, d, 6, COLL_F64, COLL_MAX) == 0, "allreduce max");
    for (int i = 0; i < 6; i++)
        CHECK(d[i] == 100.0 + i, "max[%d] = %g", i, d[i]);

    /* allgather: rank r sends {r, 10 r}. */
    int send[2] = {rank, 10 * rank}, recv[2 * W];
    CHECK(coll_allgather(&c, send, recv, sizeof send) == 0, "allgather");
    for (int r = 0; r < W; r++)
        CHECK(recv[2 * r] == r && recv[2 * r + 1] == 10 * r, "allgather block %d", r);
    /* in place: send points into recv at this rank's block. */
    int inpl[W];
    inpl[rank] = 7 + rank;
    CHECK(coll_allgather(&c, &inpl[rank], inpl, sizeof(int)) == 0, "allgather in place");
    for (int r = 0; r < W; r++)
        CHECK(inpl[r] == 7 + r, "in-place allgather [%d] = %d", r, inpl[r]);

    /* reduce_scatter: block b element q of rank r = 10 r + b + 0.5 q; rank r receives
     * sum over ranks = 30 + 3 r + 1.5 q. */
    double rs[2 * W], out[2];
    for (int b = 0; b < W; b++)
        for (int q = 0; q < 2; q++)
            rs[b * 2 + q] = 10.0 * rank + b + 0.5 * q;
    CHECK(coll_reduce_scatter(&c, rs, out, 2, COLL_F64) == 0, "reduce_scatter");
    for (int q = 0; q < 2; q++)
        CHECK(out[q] == 30.0 + 3 * rank + 1.5 * q, "reduce_scatter[%d] = %g", q, out[q]);

    /* broadcast from rank 1. */
    char msg[16];
    snprintf(msg, sizeof msg, "rank%d", rank);
    CHECK(coll_broadcast(&c, msg, sizeof msg, 1) == 0, "broadcast");
    CHECK(strcmp(msg, "rank1") == 0, "broadcast got '%s'", msg);
    CHECK(coll_broadcast(&c, msg, sizeof msg, W) == -EINVAL, "broadcast root %d accepted", W);

    CHECK(coll_barrier(&c) == 0, "barrier");

    /* Mismatched counts: rank 0 reduces 3 elements, the others 4: every rank gets -EINVAL. */
    float m[4] = {1, 2, 3, 4};
    int rc = coll_allreduce(&c, m, rank == 0 ? 3 : 4, COLL_F32, COLL_SUM);
    CHECK(rc == -EINVAL && strstr(pf_errmsg(), "count"), "mismatch rc %d '%s'", rc, pf_errmsg());
    CHECK(m[0] == 1 && m[3] == 4, "mismatched allreduce changed the buffer");
    /* The group still works afterwards. */
    float one = 1;
    CHECK(coll_allreduce(&c, &one, 1, COLL_F32, COLL_SUM) == 0 && one == W, "after mismatch: %g", one);
    return NULL;
}

int main(void)
{
    int rank = 0;
    coll_thread_group *bad;
    CHECK(coll_thread_group_create(0, &bad) == -EINVAL, "world_size 0 accepted");
    if (coll_thread_group_create(W, &group) != 0) {
        printf("FAIL: group: %s\n", pf_errmsg());
        return 1;
    }
    pf_coll c;
    CHECK(coll_thread_get(group, W, &c) == -EINVAL, "rank %d of %d accepted", W, W);
    pthread_t th[W];
    for (long r = 0; r < W; r++)
        pthread_create(&th[r], NULL, worker, (void *)r);
    for (int r = 0; r < W; r++)
        pthread_join(th[r], NULL);
    coll_thread_group_destroy(group);
    int total = 0;
    for (int r = 0; r < W; r++)
        total += fails[r];
    printf("%s: thread collectives over %d ranks (allreduce sum/max, allgather, reduce_scatter, broadcast, "
           "barrier, count mismatch) — %d failures\n",
           total ? "FAIL" : "PASS", W, total);
    return total ? 1 : 0;
}
