/* Parameter-server wire protocol: fixed 64-byte little-endian binary header + raw payload, carried in
 * libfabric messages (fab_send / fab_recv). Never protobuf on this path.
 *
 * Requests (worker -> server s). Ids are global class ids c with c mod S == s.
 *   PS_OP_PULL      payload: n x int64 ids                         -> reply payload: n x D rows in `dtype`
 *   PS_OP_PUSH      payload: n x int64 ids, then n x D grads in `dtype`  -> reply payload: empty
 *                   one push per (worker, step) may span `nchunks` messages (chunk = 0..nchunks-1); it is
 *                   applied only once every chunk has arrived, so a worker that dies mid-push changes
 *                   nothing. Each worker sends exactly one push per step to every server (n may be 0).
 *   PS_OP_STAT      payload: empty -> reply payload: ps_stat (flags PS_STAT_DONE: the worker is done)
 *   PS_OP_CHECKSUM  payload: empty -> reply payload: uint64 FNV-1a over the shard's weights then momentum
 * A push carrying PS_PUSH_SNAPSHOT asks for a snapshot of the shard as it stands after that step.
 * Authentication: every message carries the run's data-plane token, derived from the join secret and the
 * run's nonce (ctl_data_token): a server drops (and counts) any request whose token is not its run's without
 * answering, and a client ignores replies without it, so a peer that cannot join the run cannot pull, push
 * or answer. The token travels in the clear: the data plane must be a network the operator trusts against
 * eavesdroppers (RDMA fabrics are).
 * Replies: op = PS_OP_REPLY, same req_id and chunk as the request, status 0 or a negative errno; on error
 * the payload is a NUL-terminated message naming the problem.
 * Membership epoch (fencing; docs/architecture.md, "Hot-standby shards"): every message carries its sender's
 * epoch, the number of failovers and rejoin steps the rendezvous had announced to it (0 until the first). A
 * request carries the worker's, a reply the server's. A server adopts a newer epoch from a request (only
 * members of the run hold the token, and they learn epochs from the rendezvous), a copy that rejoined the run
 * drops every request of an epoch older than the one it joined at, and a server answers nothing while it is
 * fenced (its control-plane lease ran out, or the rendezvous removed it); a client drops every reply of a
 * copy it was told is gone and counts those of an older epoch, so a stale copy's answers change nothing.
 *
 * Large requests are split by the client into messages of at most ps_wire_rows_per_msg(D, dtype) rows,
 * so every message fits the receive buffers both sides post (ps_wire_msg_bytes).
 *
 * Why pulled rows travel in reply messages rather than an explicit RMA write into the worker
 * (docs/architecture.md, the departure "Pull replies are messages, not RMA writes"): the rows
 * must be scattered back to the caller's order anyway (ids are split by shard), a message cannot land
 * half-written, and the table needs no remote key at all (nothing remote can read or write it). Above
 * ofi_rxm's eager limit (16 KiB) the provider moves a message with its rendezvous protocol, i.e. an RDMA
 * read by the receiver from the server's registered reply buffer, so on verbs the bulk bytes still go
 * one-sided. */
#ifndef PFCPS_PROTO_PS_WIRE_H
#define PFCPS_PROTO_PS_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/err.h"
#include "common/half.h"

#define PS_MAGIC           0x53504650u /* "PFPS" */
#define PS_VERSION         3
#define PS_MSG_PAYLOAD_MAX (1u << 20) /* bytes of rows (or grads) per message */

enum { PS_OP_PULL = 1, PS_OP_PUSH = 2, PS_OP_STAT = 3, PS_OP_CHECKSUM = 4, PS_OP_REPLY = 16 };

/* Element types of rows and gradients on the wire. */
typedef enum { PS_DT_FP32 = 0, PS_DT_FP16 = 1, PS_DT_BF16 = 2 } ps_dtype;

typedef struct ps_hdr {
    uint32_t magic;   /* PS_MAGIC */
    uint16_t version; /* PS_VERSION */
    uint16_t op;      /* PS_OP_* */
    int32_t client;   /* worker rank of the requester */
    int32_t status;   /* replies: 0 or -errno */
    uint64_t req_id;  /* chosen by the client, echoed */
    int64_t step;     /* step clock tag */
    uint32_t n;       /* rows in this message */
    uint32_t dim;     /* D */
    uint16_t dtype;   /* ps_dtype of rows / grads */
    uint16_t flags;   /* push: PS_PUSH_* (0 on other ops); unknown bits are refused */
    uint16_t chunk;   /* push: index of this message within the push */
    uint16_t nchunks; /* push: messages in the push */
    float lr;         /* push: learning rate */
    uint32_t epoch;   /* the sender's membership epoch (see above) */
    uint64_t token;   /* the run's data-plane token (ctl_data_token), echoed in replies */
} ps_hdr;

/* Push flag: once this step's pushes are applied, the server snapshots its shard as checkpoint step + 1
 * (server/snapshot.h). Every worker sets it on the same steps. */
#define PS_PUSH_SNAPSHOT 1u
/* Push flag: the loss scaler skipped this optimizer step (the push carries no rows). Under pfc_update = dense
 * the step then moves no row (torch's GradScaler skips the whole step: no decay, no momentum). Every worker
 * sets it on the same steps. */
#define PS_PUSH_SKIPPED 2u
/* Stat flag: the requesting worker has finished training (its last request is complete) and sends nothing
 * more. A server that lost the rendezvous with server 0 stops once every worker said so (server/main.c; docs/
 * architecture.md, "Server 0 and the rendezvous"). Other stat requests carry flags 0. */
#define PS_STAT_DONE 1u

_Static_assert(sizeof(ps_hdr) == 64, "ps_hdr must stay 64 bytes");

/* Reply payload of PS_OP_STAT (at most 128 bytes). */
typedef struct ps_stat {
    int64_t steps_done;     /* steps fully applied (all W pushes of steps 0..steps_done-1) */
    int64_t num_classes;    /* C */
    int32_t rank, servers;  /* s, S */
    int32_t dim, workers;   /* D, W */
    int64_t local_rows;     /* rows of this shard */
    int64_t pushes_applied; /* pushes applied since start */
    int64_t rows_applied;   /* distinct row updates since start */
    int64_t bad_requests;   /* requests answered with an error */
    int64_t table_bytes;    /* bytes of weights + momentum (page-rounded) + the 1-byte-per-row init map */
    int64_t partial_chunks; /* chunks held for pushes not yet complete (not applied, not counted) */
    int64_t rows_pulled;    /* rows gathered into pull replies since start */
    int64_t rows_pulled_par; /* of those, rows the apply threads gathered (the rest: the progress thread) */
} ps_stat;

_Static_assert(sizeof(ps_stat) <= 128, "ps_stat must fit the 128-byte stat payload");

static inline size_t ps_dtype_size(uint32_t dt)
{
    return dt == PS_DT_FP32 ? 4 : 2;
}

static inline int ps_dtype_valid(uint32_t dt)
{
    return dt <= PS_DT_BF16;
}

/* The wire dtype named by config key `wire_dtype`: "fp32", "fp16" or "bf16" into *out. Returns 0, or -EINVAL
 * naming the key and the value when it is none of them. The one parser for the server and the worker. */
static inline int ps_dtype_parse(const char *s, ps_dtype *out)
{
    if (!strcmp(s, "fp32"))
        *out = PS_DT_FP32;
    else if (!strcmp(s, "fp16"))
        *out = PS_DT_FP16;
    else if (!strcmp(s, "bf16"))
        *out = PS_DT_BF16;
    else
        return pf_err(-EINVAL, "wire_dtype '%s' is not fp32, fp16 or bf16", s);
    return 0;
}

/* Rows per message for D and dtype: as many as fit PS_MSG_PAYLOAD_MAX, at least 1. */
static inline uint32_t ps_wire_rows_per_msg(uint32_t dim, uint32_t dtype)
{
    size_t row = (size_t)dim * ps_dtype_size(dtype) + sizeof(int64_t);
    size_t r = PS_MSG_PAYLOAD_MAX / (row ? row : 1);
    if (r > 65535u * 16u)
        r = 65535u * 16u;
    return r ? (uint32_t)r : 1;
}

/* Bytes of the largest message (request or reply) for D in any wire dtype: header + rows-per-message x
 * (id + row) for fp32, fp16 and bf16 (a 2-byte dtype packs more rows per message, and its message can be the
 * longer one: at D = 1024, 510 fp16 rows take 1048624 bytes, 255 fp32 rows 1046584), and at least 4 KiB for
 * stat and error replies. Both sides post receive buffers of this size. */
static inline size_t ps_wire_msg_bytes(uint32_t dim)
{
    const uint32_t dts[3] = {PS_DT_FP32, PS_DT_FP16, PS_DT_BF16};
    size_t b = 4096;
    for (int i = 0; i < 3; i++) {
        size_t m = sizeof(ps_hdr) +
                   ps_wire_rows_per_msg(dim, dts[i]) * ((size_t)dim * ps_dtype_size(dts[i]) + sizeof(int64_t));
        if (m > b)
            b = m;
    }
    return b;
}

/* Row codec (ps_wire.c), the one conversion both sides use. ps_rows_encode writes n fp32 values of src into
 * dst in wire dtype `dtype` (n x ps_dtype_size(dtype) bytes, any alignment; fp16 and bf16 round to nearest
 * even as f16_from_f32 / bf16_from_f32 do); ps_rows_decode reads n values of `dtype` at src into dst (fp32,
 * exact). dtype must be valid (ps_dtype_valid); src and dst must not overlap. */
void ps_rows_encode(void *dst, const float *src, size_t n, uint32_t dtype);
void ps_rows_decode(float *dst, const void *src, size_t n, uint32_t dtype);

#endif
