/* In-process collectives: W threads share a group. Each collective publishes the rank's buffer
 * pointer and arguments in its slot, waits at a barrier, then every rank reads the other ranks'
 * buffers directly (reducing in rank order 0..W-1, so every rank gets bitwise the same result),
 * and a second barrier keeps the buffers alive until everyone has read them. */
#include "common/coll.h"
#include "common/err.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct coll_slot {
    const void *ptr;
    size_t count;
    int dt, op, root;
    int kind;
} coll_slot;

struct coll_thread_group {
    int world_size;
    pthread_barrier_t barrier;
    coll_slot *slots;
};

enum { K_ALLREDUCE = 1, K_ALLGATHER, K_REDUCE_SCATTER, K_BROADCAST, K_BARRIER };

static coll_thread_group *group_of(pf_coll *c)
{
    return (coll_thread_group *)c->impl;
}

static void wait_all(coll_thread_group *g)
{
    pthread_barrier_wait(&g->barrier);
}

/* Publishes this rank's arguments and waits for all ranks; returns 0 when every rank called the
 * same collective with the same arguments, else -EINVAL (the same verdict on every rank). */
static int publish(pf_coll *c, int kind, const void *ptr, size_t count, int dt, int op, int root)
{
    coll_thread_group *g = group_of(c);
    coll_slot *s = &g->slots[c->rank];
    s->ptr = ptr;
    s->count = count;
    s->dt = dt;
    s->op = op;
    s->root = root;
    s->kind = kind;
    wait_all(g);
    for (int r = 0; r < g->world_size; r++) {
        const coll_slot *o = &g->slots[r];
        if (o->kind != kind || o->count != count || o->dt != dt || o->op != op || o->root != root)
            return pf_err(-EINVAL,
                          "coll_thread: rank %d called collective %d (count %zu) while rank %d "
                          "called %d (count %zu)",
                          c->rank, kind, count, r, o->kind, o->count);
    }
    return 0;
}

static int t_allreduce(pf_coll *c, void *buf, size_t count, coll_dtype dt, coll_op op)
{
    coll_thread_group *g = group_of(c);
    if (!coll_valid(dt, COLL_SUM))
        return pf_err(-EINVAL, "coll allreduce: bad dtype %d", (int)dt);
    if (op != COLL_SUM && op != COLL_MAX)
        return pf_err(-EINVAL, "coll allreduce: bad op %d", (int)op);
    size_t bytes = count * coll_dtype_size(dt);
    void *tmp = bytes ? malloc(bytes) : NULL;
    /* Every rank must enter the barriers even when its malloc failed; the failure is reported after. */
    int rc = publish(c, K_ALLREDUCE, buf, count, dt, op, 0);
    if (rc == 0 && tmp) {
        memcpy(tmp, g->slots[0].ptr, bytes);
        for (int r = 1; r < g->world_size; r++)
            coll_reduce(tmp, g->slots[r].ptr, count, dt, op);
    }
    wait_all(g);
    if (rc == 0 && bytes && !tmp)
        rc = pf_err(-ENOMEM, "coll allreduce: out of memory (%zu bytes)", bytes);
    if (rc == 0 && tmp)
        memcpy(buf, tmp, bytes);
    free(tmp);
    return rc;
}

static int t_allgather(pf_coll *c, const void *send, void *recv, size_t bytes)
{
    coll_thread_group *g = group_of(c);
    int rc = publish(c, K_ALLGATHER, send, bytes, 0, 0, 0);
    if (rc == 0)
        for (int r = 0; r < g->world_size; r++) {
            char *dst = (char *)recv + (size_t)r * bytes;
            if (dst != g->slots[r].ptr)
                memcpy(dst, g->slots[r].ptr, bytes); /* in-place allgather */
        }
    wait_all(g);
    return rc;
}

static int t_reduce_scatter(pf_coll *c, const void *send, void *recv, size_t count, coll_dtype dt)
{
    coll_thread_group *g = group_of(c);
    if (!coll_valid(dt, COLL_SUM))
        return pf_err(-EINVAL, "coll reduce_scatter: bad dtype %d", (int)dt);
    int rc = publish(c, K_REDUCE_SCATTER, send, count, dt, COLL_SUM, 0);
    if (rc == 0) {
        size_t bytes = count * coll_dtype_size(dt), off = (size_t)c->rank * bytes;
        memcpy(recv, (const char *)g->slots[0].ptr + off, bytes);
        for (int r = 1; r < g->world_size; r++)
            coll_reduce(recv, (const char *)g->slots[r].ptr + off, count, dt, COLL_SUM);
    }
    wait_all(g);
    return rc;
}

static int t_broadcast(pf_coll *c, void *buf, size_t bytes, int root)
{
    coll_thread_group *g = group_of(c);
    if (root < 0 || root >= c->world_size)
        return pf_err(-EINVAL, "coll broadcast: root %d outside [0, %d)", root, c->world_size);
    int rc = publish(c, K_BROADCAST, buf, bytes, 0, 0, root);
    if (rc == 0 && c->rank != root)
        memcpy(buf, g->slots[root].ptr, bytes);
    wait_all(g);
    return rc;
}

static int t_barrier(pf_coll *c)
{
    int rc = publish(c, K_BARRIER, NULL, 0, 0, 0, 0);
    wait_all(group_of(c));
    return rc;
}

static void t_destroy(pf_coll *c)
{
    c->impl = NULL;
}

static const pf_coll_ops thread_ops = {
    .allreduce = t_allreduce,
    .allgather = t_allgather,
    .reduce_scatter = t_reduce_scatter,
    .broadcast = t_broadcast,
    .barrier = t_barrier,
    .destroy = t_destroy,
};

int coll_thread_group_create(int world_size, coll_thread_group **out)
{
    *out = NULL;
    if (world_size < 1 || world_size > 1024)
        return pf_err(-EINVAL, "coll_thread: world_size %d outside [1, 1024]", world_size);
    coll_thread_group *g = calloc(1, sizeof *g);
    if (!g)
        return pf_err(-ENOMEM, "coll_thread: out of memory");
    g->slots = calloc((size_t)world_size, sizeof *g->slots);
    if (!g->slots) {
        free(g);
        return pf_err(-ENOMEM, "coll_thread: out of memory");
    }
    if (pthread_barrier_init(&g->barrier, NULL, (unsigned)world_size) != 0) {
        free(g->slots);
        free(g);
        return pf_err(-ENOMEM, "coll_thread: pthread_barrier_init failed");
    }
    g->world_size = world_size;
    *out = g;
    return 0;
}

int coll_thread_get(coll_thread_group *g, int rank, pf_coll *out)
{
    if (!g || rank < 0 || rank >= g->world_size)
        return pf_err(-EINVAL, "coll_thread: rank %d outside [0, %d)", rank, g ? g->world_size : 0);
    out->ops = &thread_ops;
    out->rank = rank;
    out->world_size = g->world_size;
    out->impl = g;
    return 0;
}

void coll_thread_group_destroy(coll_thread_group *g)
{
    if (!g)
        return;
    pthread_barrier_destroy(&g->barrier);
    free(g->slots);
    free(g);
}
