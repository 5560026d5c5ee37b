/* Collectives among the workers of a run: allreduce (sum, max), allgather, reduce-scatter (sum),
 * broadcast, barrier. One interface, several backends:
 *   - coll_thread.c: W threads of one process share a group (tests, single-host debugging);
 *   - coll_fabric.c: ring algorithms over the libfabric transport (CPU workers, one dedicated endpoint);
 *   - NCCL (CUDA device) plugs in by filling a pf_coll_ops table.
 *
 * Semantics follow MPI / NCCL / torch.distributed: every rank of the group calls the same
 * collective in the same order with the same counts; buffers are host memory. Results are
 * identical on every rank (the thread backend reduces in rank order 0..W-1, so bitwise identical).
 * A call whose counts disagree across ranks returns -EINVAL on every rank (thread backend).
 * Errors: negative errno code with pf_errmsg() (common/err.h). */
#ifndef PFCPS_COMMON_COLL_H
#define PFCPS_COMMON_COLL_H

#include <stddef.h>
#include <stdint.h>

/* Element types. COLL_F16 is IEEE binary16 (uint16_t storage); its sum rounds each addition to fp16 (the
 * float32 sum of two fp16 values, rounded to nearest even: what NCCL's and gloo's half sums compute). */
typedef enum { COLL_F32 = 0, COLL_F64 = 1, COLL_F16 = 2 } coll_dtype;
typedef enum { COLL_SUM = 0, COLL_MAX = 1 } coll_op;

typedef struct pf_coll pf_coll;

typedef struct pf_coll_ops {
    /* In place: buf (count elements of dt) becomes the elementwise op over all ranks. */
    int (*allreduce)(pf_coll *c, void *buf, size_t count, coll_dtype dt, coll_op op);
    /* recv (world_size * bytes) receives rank r's `bytes` of send at offset r * bytes. */
    int (*allgather)(pf_coll *c, const void *send, void *recv, size_t bytes);
    /* send holds world_size blocks of count elements; rank r receives in recv (count elements)
     * the sum over all ranks of their block r (torch.distributed.reduce_scatter, op SUM). */
    int (*reduce_scatter)(pf_coll *c, const void *send, void *recv, size_t count, coll_dtype dt);
    /* buf (bytes) of rank `root` is copied to every rank's buf. */
    int (*broadcast)(pf_coll *c, void *buf, size_t bytes, int root);
    /* Returns when every rank has entered. */
    int (*barrier)(pf_coll *c);
    /* Releases this rank's handle (not the group). */
    void (*destroy)(pf_coll *c);
} pf_coll_ops;

/* One rank's handle. `impl` is the backend's state. */
struct pf_coll {
    const pf_coll_ops *ops;
    int rank;
    int world_size;
    void *impl;
};

/* Size in bytes of one element of dt. */
static inline size_t coll_dtype_size(coll_dtype dt)
{
    return dt == COLL_F64 ? 8 : dt == COLL_F16 ? 2 : 4;
}

/* 1 when dt is one of coll_dtype's values and op one of coll_op's; backends refuse anything else (-EINVAL). */
static inline int coll_valid(coll_dtype dt, coll_op op)
{
    return (dt == COLL_F32 || dt == COLL_F64 || dt == COLL_F16) && (op == COLL_SUM || op == COLL_MAX);
}

/* dst[i] = dst[i] op src[i] for count elements of dt (common/coll.c), the reduction of every backend. src may
 * be unaligned (a received message); dst is aligned for dt. fp16: computed in float32, rounded to fp16. */
void coll_reduce(void *dst, const void *src, size_t count, coll_dtype dt, coll_op op);

/* torch's DistributedDataParallel gradient communication under fp16_compress_hook
 * (torch.distributed.algorithms.ddp_comm_hooks.default_hooks: the bucket cast to float16, div_(world_size)
 * in float16, all_reduce (sum) in float16, copied back): h[i] = fp16(fp16(g[i]) / W) on every rank, the
 * COLL_F16 allreduce sum of h, then g[i] = float(h[i]), the mean gradient. g (n floats, host) is rewritten in
 * place; h is scratch of n uint16_t. An fp16 overflow gives inf (the loss scaler's found-inf); values below
 * 2^-25 become 0. Returns 0 or the backend's negative code. */
int coll_allreduce_fp16_mean(pf_coll *c, float *g, uint16_t *h, size_t n);

static inline int coll_allreduce(pf_coll *c, void *buf, size_t count, coll_dtype dt, coll_op op)
{
    return c->ops->allreduce(c, buf, count, dt, op);
}
static inline int coll_allgather(pf_coll *c, const void *send, void *recv, size_t bytes)
{
    return c->ops->allgather(c, send, recv, bytes);
}
static inline int coll_reduce_scatter(pf_coll *c, const void *send, void *recv, size_t count, coll_dtype dt)
{
    return c->ops->reduce_scatter(c, send, recv, count, dt);
}
static inline int coll_broadcast(pf_coll *c, void *buf, size_t bytes, int root)
{
    return c->ops->broadcast(c, buf, bytes, root);
}
static inline int coll_barrier(pf_coll *c)
{
    return c->ops->barrier(c);
}
static inline void coll_destroy(pf_coll *c)
{
    if (c && c->ops)
        c->ops->destroy(c);
}

/* ---- thread backend (coll_thread.c) ---- */

typedef struct coll_thread_group coll_thread_group;

/* Creates a group for `world_size` threads (1..1024). Returns 0 or -EINVAL / -ENOMEM. */
int coll_thread_group_create(int world_size, coll_thread_group **out);

/* Fills `out` with the handle of `rank` in the group (each of the world_size threads takes its own
 * rank and calls the collectives with it). Returns 0 or -EINVAL for a rank outside [0, world_size). */
int coll_thread_get(coll_thread_group *g, int rank, pf_coll *out);

/* Frees the group after every thread has stopped using it. */
void coll_thread_group_destroy(coll_thread_group *g);

/* ---- ring backend over the libfabric transport (coll_fabric.c) ---- */

typedef struct fab_ctx fab_ctx;

typedef struct coll_fabric_opts {
    size_t chunk_bytes; /* payload bytes per message, default 1 MiB (0 = default) */
    double timeout_s;   /* wait for one message at most this long, default 60 s (0 = default); also the
                           endpoint's post bound (fab_set_timeout): a send that cannot go out for this long
                           fails with -ECOMM */
} coll_fabric_opts;

/* Creates this rank's handle of a ring over `f`, an endpoint opened with fab_open and dedicated to the
 * collectives (no other receives may be posted on it: ring messages are matched in arrival order).
 * addrs[i] / addr_lens[i] are the endpoint names (fab_getname) of ranks 0..world_size-1; only the right
 * neighbour's is inserted. Two registered staging buffers of chunk_bytes + 16 are allocated.
 * Algorithms (Patarasuk & Yuan 2009, as NCCL/Gloo/Horovod): allreduce = ring reduce-scatter + ring
 * allgather (2 (W-1)/W of the data sent per rank), reduce_scatter and allgather = one ring phase,
 * broadcast = chain from the root, barrier = allreduce of one float. Results are bitwise identical on
 * all ranks (each segment is reduced once, then copied). Every message carries (collective number, step,
 * length, kind): a peer out of step, or in another kind of collective (its barrier against this rank's
 * allreduce of one float), gives -EPROTO naming both; no message within timeout_s gives -ETIMEDOUT;
 * a failed completion -EIO. After an error the group is unusable: coll_destroy, fab_close, end the run
 * (a staging buffer with an operation still posted is then left allocated, not freed). A rank must not
 * close its endpoint while a peer may still send to it (libfabric's tcp provider then retries the
 * connection inside fi_send): end a run with a barrier.
 * Returns 0 or -EINVAL (rank/world/addresses), -ENOMEM, or the fabric error. coll_destroy(out) releases
 * the buffers (not `f`). */
int coll_fabric_create(fab_ctx *f, int rank, int world_size, const void *const *addrs,
                       const size_t *addr_lens, const coll_fabric_opts *opts, pf_coll *out);

/* Has every wait of the ring handle c (made by coll_fabric_create) that has gone a second without a
 * completion call check(arg) on the waiting thread, then once a second while the wait lasts: a negative
 * return ends the collective with that code, the text check set (pf_errmsg) prefixed with what the ring was
 * waiting for (the group is then unusable, as after a timeout). For what the waiting process can find out on
 * its own that its ring peers cannot tell it (pfcps-worker: that no server is left to hold a shard, while no
 * rendezvous is left to say so; worker/train_net.c). It runs between polls of the completion queue, not while
 * a send waits for the provider to take it (fab_send's retry, bounded by the ring's timeout). check = NULL
 * removes it. */
void coll_fabric_set_idle_check(pf_coll *c, int (*check)(void *arg), void *arg);

#endif
