/* Ring collectives over the libfabric transport (see coll.h for the algorithms and the contract).
 *
 * Every rank sends only to its right neighbour (rank + 1) and receives only from its left one, one
 * message at a time: post the receive, post the send, wait for both. A message is a 20-byte header
 * (magic, collective number, step, payload length, the collective's kind) and at most chunk_bytes of payload,
 * staged in two buffers registered once at creation, so the data calls work under FI_MR_LOCAL. Large buffers
 * are processed in rounds of W chunks. Progress is manual: the waits poll the CQ. */
#include "common/coll.h"

#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/fabric.h"

#define RING_MAGIC      0x52434650u /* "PFCR" */
#define HDR             20
#define DEFAULT_CHUNK   (1024u * 1024u)
#define DEFAULT_TIMEOUT 60.0

typedef struct ring {
    fab_ctx *f;
    fi_addr_t right;
    int left;
    size_t chunk;
    double timeout_s;
    uint8_t *sbuf, *rbuf;
    fab_mr smr, rmr;
    uint32_t seq;           /* collective number, same on every rank */
    uint32_t step;          /* message number within the collective */
    uint32_t kind;          /* the collective's kind (coll_kind) */
    int sctx, rctx;         /* their addresses tell send and receive completions apart */
    int send_out, recv_out; /* a send / receive posted and not completed (after an error) */
    size_t recv_len;        /* bytes of the last completed receive */
    int (*idle_check)(void *arg); /* coll_fabric_set_idle_check */
    void *idle_arg;
} ring;

/* What a message belongs to: every rank calls the same collectives in the same order, so a message of
 * another kind means a rank left the sequence (pfcps.torch's close() barrier while the others train on). */
enum coll_kind { K_ALLREDUCE = 1, K_ALLGATHER, K_REDUCE_SCATTER, K_BROADCAST, K_BARRIER };

static const char *kind_name(uint32_t k)
{
    switch (k) {
    case K_ALLREDUCE: return "allreduce";
    case K_ALLGATHER: return "allgather";
    case K_REDUCE_SCATTER: return "reduce-scatter";
    case K_BROADCAST: return "broadcast";
    case K_BARRIER: return "barrier";
    default: return "unknown collective";
    }
}

static ring *ring_of(pf_coll *c)
{
    return (ring *)c->impl;
}

static void put32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, 4);
}
static uint32_t get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Waits until the posted send (need_send) and receive (need_recv) completed. */
static int ring_wait(pf_coll *c, int need_send, int need_recv)
{
    ring *r = ring_of(c);
    const double t0 = pf_now_s(), deadline = t0 + r->timeout_s;
    double next_check = t0 + 1.0; /* coll_fabric_set_idle_check: after a second without a completion */
    unsigned idle = 0;
    while (need_send || need_recv) {
        fab_comp comp[4];
        /* After a couple of hundred empty polls: sleep in the completion queue (up to 1 ms, so the checks
         * below run that often) where the provider can, else nap below. */
        int n = idle > 200 && fab_can_wait(r->f) ? fab_wait(r->f, comp, 4, 1) : fab_poll(r->f, comp, 4);
        if (n < 0)
            return pf_err_wrap(n, "ring rank %d: polling the completion queue", c->rank);
        for (int i = 0; i < n; i++) {
            int is_send = comp[i].context == &r->sctx, is_recv = comp[i].context == &r->rctx;
            if (!is_send && !is_recv)
                return pf_err(-EPROTO,
                              "ring rank %d: completion with a foreign context (is the endpoint shared?)",
                              c->rank);
            if (comp[i].err)
                return pf_err(-EIO, "ring rank %d: %s %s rank %d failed: %s", c->rank,
                              is_send ? "send to" : "receive from", is_send ? "right" : "left",
                              is_send ? (c->rank + 1) % c->world_size : r->left, strerror(-comp[i].err));
            if (is_send)
                need_send = 0, r->send_out = 0;
            else
                need_recv = 0, r->recv_out = 0, r->recv_len = comp[i].len;
        }
        if (n == 0) {
            if (fab_interrupted())
                return pf_err(-ECANCELED,
                              "ring rank %d: collective %u step %u: stopped waiting for worker %d: the run broke "
                              "(the control plane reported a lost member)",
                              c->rank, r->seq, r->step, need_recv ? r->left : (c->rank + 1) % c->world_size);
            const double now = pf_now_s();
            if (r->idle_check && now >= next_check) {
                int rc = r->idle_check(r->idle_arg);
                if (rc < 0)
                    return pf_err_wrap(
                        rc, "ring rank %d: collective %u step %u: stopped waiting for worker %d", c->rank,
                        r->seq, r->step, need_recv ? r->left : (c->rank + 1) % c->world_size);
                next_check = pf_now_s() + 1.0;
            }
            if (now > deadline)
                return pf_err(-ETIMEDOUT,
                              "ring rank %d: collective %u step %u: no %s within %.0f s: worker %d died, "
                              "hung, left the run, or is itself stuck waiting for a server (its log names "
                              "which)",
                              c->rank, r->seq, r->step,
                              need_recv ? "message from the left" : "send completion", r->timeout_s,
                              need_recv ? r->left : (c->rank + 1) % c->world_size);
            /* A peer may still be computing (backward pass) for a long time: spin briefly, then sleep
             * between polls so this rank does not take the core from the computing processes that share
             * the machine (sched_yield alone keeps it busy under CFS). */
            if (++idle > 200 && fab_can_wait(r->f)) {
                /* slept in fab_wait above */
            } else if (idle > 200) {
                struct timespec ts = {0, idle > 2000 ? 200000 : 10000};
                nanosleep(&ts, NULL);
            } else {
                sched_yield();
            }
        } else {
            idle = 0;
            next_check = pf_now_s() + 1.0;
        }
    }
    return 0;
}

static int post_recv(pf_coll *c)
{
    ring *r = ring_of(c);
    int rc = fab_recv(r->f, r->rbuf, HDR + r->chunk, &r->rmr, &r->rctx);
    if (rc == 0)
        r->recv_out = 1;
    return rc;
}

static int post_send(pf_coll *c, const void *data, size_t len)
{
    ring *r = ring_of(c);
    put32(r->sbuf, RING_MAGIC);
    put32(r->sbuf + 4, r->seq);
    put32(r->sbuf + 8, r->step);
    put32(r->sbuf + 12, (uint32_t)len);
    put32(r->sbuf + 16, r->kind);
    if (len)
        memcpy(r->sbuf + HDR, data, len);
    int rc = fab_send(r->f, r->right, r->sbuf, HDR + len, &r->smr, &r->sctx);
    if (rc == 0)
        r->send_out = 1;
    return rc;
}

/* Checks the received header against (seq, step, len); returns the payload. */
static int check_recv(pf_coll *c, size_t len, const uint8_t **payload)
{
    ring *r = ring_of(c);
    if (r->recv_len >= HDR && get32(r->rbuf) == RING_MAGIC && get32(r->rbuf + 16) != r->kind)
        return pf_err(
            -EPROTO,
            "ring rank %d: collective %u: rank %d called %s (its collective %u) while this rank called %s: "
            "the ranks' sequences of collectives diverged (a rank that ended its training early and "
            "met the others in its closing barrier, as a PyTorch script's exit does)",
            c->rank, r->seq, r->left, kind_name(get32(r->rbuf + 16)), get32(r->rbuf + 4), kind_name(r->kind));
    if (r->recv_len != HDR + len)
        return pf_err(-EPROTO,
                      "ring rank %d: collective %u step %u: a %zu-byte message from rank %d, expected %zu "
                      "(%d-byte header + %zu)",
                      c->rank, r->seq, r->step, r->recv_len, r->left, HDR + len, HDR, len);
    uint32_t magic = get32(r->rbuf), seq = get32(r->rbuf + 4), step = get32(r->rbuf + 8),
             n = get32(r->rbuf + 12);
    if (magic != RING_MAGIC || seq != r->seq || step != r->step || n != len)
        return pf_err(-EPROTO,
                      "ring rank %d: expected collective %u step %u (%zu bytes) from rank %d, got magic %08x "
                      "collective %u step %u (%u bytes): ranks called different collectives or counts",
                      c->rank, r->seq, r->step, len, r->left, magic, seq, step, n);
    *payload = r->rbuf + HDR;
    return 0;
}

/* One ring step: send `slen` bytes to the right, receive `rlen` from the left. */
static int exchange(pf_coll *c, const void *send, size_t slen, size_t rlen, const uint8_t **payload)
{
    int rc;
    if ((rc = post_recv(c)) < 0 || (rc = post_send(c, send, slen)) < 0 || (rc = ring_wait(c, 1, 1)) < 0 ||
        (rc = check_recv(c, rlen, payload)) < 0)
        return rc;
    ring_of(c)->step++;
    return 0;
}

static inline int mod(int a, int w)
{
    return ((a % w) + w) % w;
}

/* Segment b of a round: elements [start[b] + o, + n) with n = min(len[b] - o, ce) (0 when past the end). */
static size_t sub_len(const size_t *len, int b, size_t o, size_t ce)
{
    if (len[b] <= o)
        return 0;
    size_t n = len[b] - o;
    return n < ce ? n : ce;
}

/* Ring reduce-scatter phase on base (elements of esz bytes): afterwards rank r holds segment r reduced. */
static int phase_reduce_scatter(pf_coll *c, uint8_t *base, const size_t *start, const size_t *len, size_t o,
                                size_t ce, size_t esz, coll_dtype dt, coll_op op)
{
    int W = c->world_size, r = c->rank, rc;
    for (int s = 0; s < W - 1; s++) {
        int sb = mod(r - s - 1, W), rb = mod(r - s - 2, W);
        size_t sn = sub_len(len, sb, o, ce), rn = sub_len(len, rb, o, ce);
        const uint8_t *pl;
        if ((rc = exchange(c, base + (start[sb] + o) * esz, sn * esz, rn * esz, &pl)) < 0)
            return rc;
        if (rn)
            coll_reduce(base + (start[rb] + o) * esz, pl, rn, dt, op);
    }
    return 0;
}

/* Ring allgather phase: rank r starts holding segment r, ends holding all. */
static int phase_allgather(pf_coll *c, uint8_t *base, const size_t *start, const size_t *len, size_t o,
                           size_t ce, size_t esz)
{
    int W = c->world_size, r = c->rank, rc;
    for (int s = 0; s < W - 1; s++) {
        int sb = mod(r - s, W), rb = mod(r - s - 1, W);
        size_t sn = sub_len(len, sb, o, ce), rn = sub_len(len, rb, o, ce);
        const uint8_t *pl;
        if ((rc = exchange(c, base + (start[sb] + o) * esz, sn * esz, rn * esz, &pl)) < 0)
            return rc;
        if (rn)
            memcpy(base + (start[rb] + o) * esz, pl, rn * esz);
    }
    return 0;
}

static void begin(pf_coll *c, enum coll_kind kind)
{
    ring *r = ring_of(c);
    r->seq++;
    r->step = 0;
    r->kind = kind;
}

/* An allreduce under the kind `kind` (K_ALLREDUCE, or K_BARRIER for f_barrier). */
static int allreduce_as(pf_coll *c, void *buf, size_t count, coll_dtype dt, coll_op op, enum coll_kind kind)
{
    if (!coll_valid(dt, COLL_SUM))
        return pf_err(-EINVAL, "ring allreduce: bad dtype %d", (int)dt);
    if (op != COLL_SUM && op != COLL_MAX)
        return pf_err(-EINVAL, "ring allreduce: bad op %d", (int)op);
    int W = c->world_size;
    begin(c, kind);
    if (W == 1 || count == 0)
        return 0;
    size_t esz = coll_dtype_size(dt), ce = ring_of(c)->chunk / esz;
    size_t start[W], len[W], base = count / (size_t)W, rem = count % (size_t)W, maxlen = 0;
    for (int b = 0; b < W; b++) {
        start[b] = (size_t)b * base + ((size_t)b < rem ? (size_t)b : rem);
        len[b] = base + ((size_t)b < rem);
        if (len[b] > maxlen)
            maxlen = len[b];
    }
    int rc;
    for (size_t o = 0; o < maxlen; o += ce) {
        if ((rc = phase_reduce_scatter(c, buf, start, len, o, ce, esz, dt, op)) < 0)
            return rc;
        if ((rc = phase_allgather(c, buf, start, len, o, ce, esz)) < 0)
            return rc;
    }
    return 0;
}

static int f_allreduce(pf_coll *c, void *buf, size_t count, coll_dtype dt, coll_op op)
{
    return allreduce_as(c, buf, count, dt, op, K_ALLREDUCE);
}

static int f_reduce_scatter(pf_coll *c, const void *send, void *recv, size_t count, coll_dtype dt)
{
    if (!coll_valid(dt, COLL_SUM))
        return pf_err(-EINVAL, "ring reduce_scatter: bad dtype %d", (int)dt);
    int W = c->world_size;
    size_t esz = coll_dtype_size(dt);
    begin(c, K_REDUCE_SCATTER);
    if (W == 1 || count == 0) {
        if (count)
            memmove(recv, send, count * esz);
        return 0;
    }
    uint8_t *tmp = malloc((size_t)W * count * esz);
    if (!tmp)
        return pf_err(-ENOMEM, "ring reduce_scatter: out of memory for %zu bytes", (size_t)W * count * esz);
    memcpy(tmp, send, (size_t)W * count * esz);
    size_t start[W], len[W], ce = ring_of(c)->chunk / esz;
    for (int b = 0; b < W; b++)
        start[b] = (size_t)b * count, len[b] = count;
    int rc = 0;
    for (size_t o = 0; o < count && rc == 0; o += ce)
        rc = phase_reduce_scatter(c, tmp, start, len, o, ce, esz, dt, COLL_SUM);
    if (rc == 0)
        memcpy(recv, tmp + (size_t)c->rank * count * esz, count * esz);
    free(tmp);
    return rc;
}

static int f_allgather(pf_coll *c, const void *send, void *recv, size_t bytes)
{
    int W = c->world_size;
    begin(c, K_ALLGATHER);
    uint8_t *own = (uint8_t *)recv + (size_t)c->rank * bytes;
    if (bytes && own != send)
        memmove(own, send, bytes);
    if (W == 1 || bytes == 0)
        return 0;
    size_t start[W], len[W], ce = ring_of(c)->chunk;
    for (int b = 0; b < W; b++)
        start[b] = (size_t)b * bytes, len[b] = bytes;
    int rc;
    for (size_t o = 0; o < bytes; o += ce)
        if ((rc = phase_allgather(c, recv, start, len, o, ce, 1)) < 0)
            return rc;
    return 0;
}

static int f_broadcast(pf_coll *c, void *buf, size_t bytes, int root)
{
    int W = c->world_size;
    if (root < 0 || root >= W)
        return pf_err(-EINVAL, "ring broadcast: root %d outside [0, %d)", root, W);
    begin(c, K_BROADCAST);
    if (W == 1 || bytes == 0)
        return 0;
    ring *r = ring_of(c);
    int pos = mod(c->rank - root, W), rc;
    for (size_t o = 0; o < bytes; o += r->chunk) {
        size_t n = bytes - o < r->chunk ? bytes - o : r->chunk;
        if (pos > 0) {
            const uint8_t *pl;
            if ((rc = post_recv(c)) < 0 || (rc = ring_wait(c, 0, 1)) < 0 || (rc = check_recv(c, n, &pl)) < 0)
                return rc;
            memcpy((uint8_t *)buf + o, pl, n);
        }
        if (pos < W - 1)
            if ((rc = post_send(c, (uint8_t *)buf + o, n)) < 0 || (rc = ring_wait(c, 1, 0)) < 0)
                return rc;
        r->step++;
    }
    return 0;
}

static int f_barrier(pf_coll *c)
{
    float one = 1.0f;
    return allreduce_as(c, &one, 1, COLL_F32, COLL_SUM, K_BARRIER);
}

static void f_destroy(pf_coll *c)
{
    ring *r = ring_of(c);
    if (!r)
        return;
    fab_mr_close(&r->smr);
    fab_mr_close(&r->rmr);
    /* After an error a posted operation may still reference a staging buffer until the endpoint closes:
     * leave that buffer allocated (once, in a run that is ending) rather than risk a write into freed memory.
     */
    if (!r->send_out)
        free(r->sbuf);
    if (!r->recv_out)
        free(r->rbuf);
    free(r);
    c->impl = NULL;
}

static const pf_coll_ops fabric_ops = {
    .allreduce = f_allreduce,
    .allgather = f_allgather,
    .reduce_scatter = f_reduce_scatter,
    .broadcast = f_broadcast,
    .barrier = f_barrier,
    .destroy = f_destroy,
};

int coll_fabric_create(fab_ctx *f, int rank, int world_size, const void *const *addrs,
                       const size_t *addr_lens, const coll_fabric_opts *opts, pf_coll *out)
{
    memset(out, 0, sizeof *out);
    if (!f || world_size < 1 || world_size > 1024 || rank < 0 || rank >= world_size)
        return pf_err(-EINVAL, "ring: rank %d / world_size %d invalid (or no endpoint)", rank, world_size);
    if (world_size > 1 && (!addrs || !addr_lens))
        return pf_err(-EINVAL, "ring: no address book");
    ring *r = calloc(1, sizeof *r);
    if (!r)
        return pf_err(-ENOMEM, "ring: out of memory");
    r->f = f;
    r->chunk = opts && opts->chunk_bytes ? opts->chunk_bytes : DEFAULT_CHUNK;
    r->timeout_s = opts && opts->timeout_s > 0 ? opts->timeout_s : DEFAULT_TIMEOUT;
    /* A send that cannot go out (the right neighbour's endpoint closed: its process died) gives up after the
     * same bound as a receive, not the endpoint's default post bound. */
    fab_set_timeout(f, r->timeout_s);
    r->left = mod(rank - 1, world_size);
    out->ops = &fabric_ops;
    out->rank = rank;
    out->world_size = world_size;
    out->impl = r;
    if (r->chunk > UINT32_MAX || r->chunk < 16) {
        f_destroy(out);
        return pf_err(-EINVAL, "ring: chunk_bytes %zu outside [16, 4 GiB)", opts->chunk_bytes);
    }
    if (world_size == 1)
        return 0;
    int right = (rank + 1) % world_size, rc;
    r->sbuf = malloc(HDR + r->chunk);
    r->rbuf = malloc(HDR + r->chunk);
    if (!r->sbuf || !r->rbuf) {
        f_destroy(out);
        return pf_err(-ENOMEM, "ring: out of memory for 2 x %zu bytes of staging", HDR + r->chunk);
    }
    if ((rc = fab_mr_reg(f, r->sbuf, HDR + r->chunk, FI_SEND, &r->smr)) < 0 ||
        (rc = fab_mr_reg(f, r->rbuf, HDR + r->chunk, FI_RECV, &r->rmr)) < 0 ||
        (rc = fab_av_insert(f, addrs[right], addr_lens[right], &r->right)) < 0) {
        f_destroy(out);
        return pf_err_wrap(rc, "ring rank %d: setting up the link to rank %d", rank, right);
    }
    return 0;
}

void coll_fabric_set_idle_check(pf_coll *c, int (*check)(void *arg), void *arg)
{
    if (!c || c->ops != &fabric_ops)
        return;
    ring *r = ring_of(c);
    r->idle_check = check;
    r->idle_arg = arg;
}
