/* NCCL backend of common/coll.h for workers on the CUDA device (see cuda_ops.h: coll_nccl_create).
 * Every collective is queued on the legacy default stream and the call returns after
 * cudaStreamSynchronize, so the blocking semantics of pf_coll hold; buffers are device memory. */
#include "kernels/cuda/cuda_ops.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "common/coll.h"
#include "common/err.h"

typedef struct nccl_impl {
    ncclComm_t comm;
    float *one; /* device float for the barrier */
} nccl_impl;

#define NCCL_TRY(call, what)                                                                                 \
    do {                                                                                                     \
        ncclResult_t r_ = (call);                                                                            \
        if (r_ != ncclSuccess)                                                                               \
            return pf_err(-EIO, "NCCL %s failed: %s", what, ncclGetErrorString(r_));                         \
    } while (0)

static int wait_stream(const char *what)
{
    cudaError_t e = cudaStreamSynchronize(0);
    if (e != cudaSuccess)
        return pf_err(-EIO, "NCCL %s: stream synchronize failed: %s", what, cudaGetErrorString(e));
    return 0;
}

static ncclDataType_t nccl_type(coll_dtype dt)
{
    return dt == COLL_F64 ? ncclFloat64 : dt == COLL_F16 ? ncclFloat16 : ncclFloat32;
}

static ncclComm_t comm_of(pf_coll *c)
{
    return ((nccl_impl *)c->impl)->comm;
}

static int n_allreduce(pf_coll *c, void *buf, size_t count, coll_dtype dt, coll_op op)
{
    if (!count)
        return 0;
    NCCL_TRY(ncclAllReduce(buf, buf, count, nccl_type(dt),
                           op == COLL_MAX ? ncclMax : ncclSum, comm_of(c), 0),
             "allreduce");
    return wait_stream("allreduce");
}

static int n_allgather(pf_coll *c, const void *send, void *recv, size_t bytes)
{
    if (!bytes)
        return 0;
    NCCL_TRY(ncclAllGather(send, recv, bytes, ncclUint8, comm_of(c), 0), "allgather");
    return wait_stream("allgather");
}

static int n_reduce_scatter(pf_coll *c, const void *send, void *recv, size_t count, coll_dtype dt)
{
    if (!count)
        return 0;
    NCCL_TRY(ncclReduceScatter(send, recv, count, nccl_type(dt), ncclSum,
                               comm_of(c), 0),
             "reduce_scatter");
    return wait_stream("reduce_scatter");
}

static int n_broadcast(pf_coll *c, void *buf, size_t bytes, int root)
{
    if (root < 0 || root >= c->world_size)
        return pf_err(-EINVAL, "NCCL broadcast: root %d outside [0, %d)", root, c->world_size);
    if (!bytes)
        return 0;
    NCCL_TRY(ncclBroadcast(buf, buf, bytes, ncclUint8, root, comm_of(c), 0), "broadcast");
    return wait_stream("broadcast");
}

static int n_barrier(pf_coll *c)
{
    nccl_impl *im = c->impl;
    NCCL_TRY(ncclAllReduce(im->one, im->one, 1, ncclFloat32, ncclSum, im->comm, 0), "barrier");
    return wait_stream("barrier");
}

static void n_destroy(pf_coll *c)
{
    nccl_impl *im = c->impl;
    if (!im)
        return;
    if (im->comm)
        ncclCommDestroy(im->comm);
    cudaFree(im->one);
    free(im);
    c->impl = NULL;
}

static const pf_coll_ops nccl_ops = {n_allreduce, n_allgather, n_reduce_scatter,
                                     n_broadcast, n_barrier,   n_destroy};

int coll_nccl_unique_id(uint8_t id[CUDA_NCCL_ID_BYTES])
{
    ncclUniqueId u;
    NCCL_TRY(ncclGetUniqueId(&u), "get unique id");
    memcpy(id, u.internal, CUDA_NCCL_ID_BYTES);
    return 0;
}

int coll_nccl_create(const uint8_t id[CUDA_NCCL_ID_BYTES], int rank, int world_size, pf_coll *out)
{
    memset(out, 0, sizeof *out);
    if (world_size < 1 || rank < 0 || rank >= world_size)
        return pf_err(-EINVAL, "NCCL: rank %d outside [0, %d)", rank, world_size);
    if (cuda_device_count() == 0)
        return pf_err(-ENODEV, "NCCL: no CUDA device visible");
    nccl_impl *im = calloc(1, sizeof *im);
    if (!im)
        return pf_err(-ENOMEM, "NCCL: out of memory");
    cudaError_t e = cudaMalloc((void **)&im->one, sizeof(float));
    if (e != cudaSuccess) {
        free(im);
        return pf_err(-ENOMEM, "NCCL: cudaMalloc: %s", cudaGetErrorString(e));
    }
    ncclUniqueId u;
    memcpy(u.internal, id, CUDA_NCCL_ID_BYTES);
    ncclResult_t r = ncclCommInitRank(&im->comm, world_size, u, rank);
    if (r != ncclSuccess) {
        im->comm = NULL;
        cudaFree(im->one);
        free(im);
        /* ncclGetLastError: NCCL's own detail (e.g. "Duplicate GPU detected": NCCL refuses two ranks of one
         * communicator on the same GPU, so run one worker per GPU) */
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
        const char *detail = ncclGetLastError(NULL);
#else
        const char *detail = NULL;
#endif
        return pf_err(-EIO, "NCCL comm init (rank %d of %d) failed: %s%s%s%s", rank, world_size,
                      ncclGetErrorString(r), detail && *detail ? " (" : "", detail && *detail ? detail : "",
                      detail && *detail ? ")" : "");
    }
    out->ops = &nccl_ops;
    out->rank = rank;
    out->world_size = world_size;
    out->impl = im;
    return 0;
}
