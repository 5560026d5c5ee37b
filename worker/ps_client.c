/* Parameter-server client library: a worker's endpoint towards the S servers (see ps_client.h). Requests are
 * split by shard into messages (send_one), sent while the window allows (pump), and completed by the replies
 * progress() receives; liveness probes find dead servers. Built a second time with -DPFCPS_TEST_HOOKS into
 * ps_client_hooks_lib, which adds ps_raw (ps_client_hooks.h) for the tests; the workers' library has no
 * test code. */
#include "worker/ps_client.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <rdma/fi_errno.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/fabric.h"
#include "common/metrics.h"

enum { MB_SEND = 1, MB_RECV = 2 };
enum { RQ_PULL = 1, RQ_PUSH = 2, RQ_STAT = 3, RQ_CHECKSUM = 4, RQ_RAW = 5 /* test hook: ps_raw */ };

#define SLAB          16
#define PROBE_AFTER_S 1.0  /* a server silent this long while messages wait for it gets a liveness probe */
#define CHECK_EVERY_S 0.01 /* how often progress() looks at the servers' silence */

/* A registered message buffer; its address is the completion context. A send buffer remembers the message
 * (slot index and generation) it carries, so an error completion of the send fails that message. */
typedef struct mbuf {
    int kind;
    uint8_t *data;
    fab_mr *mr;
    struct mbuf *next_free;
    uint32_t slot, gen;
} mbuf;

typedef struct slab {
    struct slab *next;
    fab_mr mr;
    uint8_t *mem;
    mbuf bufs[SLAB];
} slab;

/* An outstanding message: which request it belongs to and where its rows go. */
typedef struct slot {
    ps_req *req;
    uint32_t gen;
    int in_use;
    int server; /* the target the message went to: copy 0 of shard t (t < S) or copy 1 of shard t - S */
    size_t off; /* pull: index into req->order of the message's first row */
    uint32_t n;
} slot;

struct ps_req {
    struct ps_req *next; /* in the client's list of requests with messages still to send */
    double t_start;      /* when it was made (pf_now_s) */
    double wait_t0;      /* when the first ps_wait on it began (0: none yet): a wait in several calls (a
                            caller's slices) is said and bounded in its messages from there */
    double next_log;     /* when ps_wait says next that it still waits */
    int op;
    int status;
    char err[PF_ERRMSG_MAX];
    int64_t step;
    float lr;
    uint32_t flags; /* push: PS_PUSH_* */
    size_t n;
    int64_t *sorted_ids; /* ids sorted by (server, id) */
    size_t *order;       /* order[k] = original index of sorted_ids[k] */
    float *grads;        /* push: the gradients, original order: a copy, or the caller's (borrowed) */
    int grads_owned;     /* grads is a copy, freed with the request */
    float *out;          /* pull destination */
    void *result;        /* stat / checksum destination */
    size_t *srv_off;     /* [S + 1] start of each shard's ids in sorted_ids */
    int *next_chunk;     /* [T] next message to send per target (ntgt: a shard's copy, see ps_client) */
    int *nchunks;        /* [T] messages per target */
    int to_send;         /* messages not yet sent */
    int remaining;       /* messages not yet answered */
    int queued;
    int fatal;     /* failed on this side (transport, resources): ps_wait returns at once */
    int probe;     /* an internal liveness probe (stat) of server probe_server */
    int abandoned; /* given up by its caller (timeout, early failure): freed when its replies are in */
    struct ps_req *next_ab;
    int probe_server;
#ifdef PFCPS_TEST_HOOKS
    uint8_t *raw; /* ps_raw: the message's bytes */
    size_t raw_len;
#endif
};

struct ps_client {
    ps_client_opts o;
    uint64_t token;   /* the run's data-plane token (0: none) */
    int borrow_grads; /* ps_client_set_borrow_grads */
    fab_ctx *fab;
    /* Targets: the endpoints the client talks to. Target t < S is shard t's primary (server t); with
     * replicas = 1, target S + s is shard s's backup copy (on server (s + 1) mod S). ntgt = S (1 + replicas).
     * The per-server arrays below are per target. */
    int ntgt;
    int *route;          /* [S]: the target pulls, stats and checksums of shard s go to (its primary until a
                            failover) */
    uint8_t *tgt_gone;   /* [T]: removed by a failover: its messages were retired, none goes there again */
    double *tgt_suspect; /* [T]: when a transport error first hit it while its shard had another copy (0:
                            none): its messages wait for the control plane's failover, up to the timeout */
    _Atomic uint32_t epoch; /* membership epoch (ps_client_server_lost) */
    atomic_int lost_any;    /* a server was posted lost and progress() has not taken it yet */
    atomic_int no_rendezvous; /* ps_client_set_rendezvous(c, 0): no rendezvous decides failovers now */
    atomic_int *lost_post;  /* [S]: posted lost by ps_client_server_lost */
    long fenced_replies;    /* replies of an older epoch that named no live message (dropped) */
    double fenced_log_t;
    fi_addr_t *srv_addr;
    uint8_t *srv_known;
    size_t msg_bytes;
    uint32_t rpm; /* rows per message */
    slab *slabs;
    mbuf *free_bufs;
    slot *slots;
    size_t nslots;
    uint32_t *free_slots;
    size_t nfree_slots;
    int inflight;
    ps_req *sendq_head, *sendq_tail;
    ps_req *abandoned; /* requests given up by their caller with messages still in flight; probes */
    int posted_recvs;  /* receives posted and not completed: kept >= inflight (any-source, shared) */
    double timeout;    /* post retry bound and liveness-probe deadline (ps_client_set_timeout) */
    double last_check;
    int new_deaths; /* a server was marked dead since the send queue was last swept */
    /* Per server: */
    uint8_t *srv_dead;  /* unreachable: every later request touching it fails at once */
    char **srv_why;     /* what failed, for those later errors */
    int *srv_out;       /* request messages in flight to it (probes not counted) */
    double *srv_heard;  /* last reply from it (or when messages started waiting for it) */
    ps_req **srv_probe; /* its probe in flight, or NULL */
    double *srv_probe_t;
    /* Metrics (ps_client_metrics_on; NULL: off): */
    pf_metric *m_pulled_rows, *m_pulled_bytes, *m_pushed_rows, *m_pushed_bytes, *m_fenced;
    pf_metric **m_wait;    /* [S]: pfcps_worker_server_wait_seconds_total{server} */
    const ps_req *waiting; /* the request ps_wait is waiting for */
    double *wait_last;     /* [S]: its last reply from each server during that wait (0: none yet) */
};

/* The server rank hosting target t (ps_client, Targets). */
static int tgt_host(const ps_client *c, int t)
{
    const int S = c->o.servers;
    return t < S ? t : (t - S + 1) % S;
}

/* The shard target t holds. */
static int tgt_shard(const ps_client *c, int t)
{
    return t % c->o.servers;
}

/* "server 1", or "server 2 (backup copy of shard 1)", into buf[n]; returns buf. */
static const char *tgt_name(const ps_client *c, int t, char *buf, size_t n)
{
    if (t < c->o.servers)
        snprintf(buf, n, "server %d", t);
    else
        snprintf(buf, n, "server %d (backup copy of shard %d)", tgt_host(c, t), tgt_shard(c, t));
    return buf;
}

static const char *op_name(const ps_req *r)
{
    if (r->probe)
        return "liveness probe (stat)";
    switch (r->op) {
    case RQ_PULL: return "pull";
    case RQ_PUSH: return "push";
    case RQ_STAT: return "stat";
    case RQ_CHECKSUM: return "checksum";
    default: return "raw";
    }
}

static mbuf *get_buf(ps_client *c)
{
    if (!c->free_bufs) {
        slab *s = calloc(1, sizeof(*s));
        if (!s)
            return NULL;
        s->mem = fab_buf_alloc(c->msg_bytes * SLAB);
        if (!s->mem || fab_mr_reg(c->fab, s->mem, c->msg_bytes * SLAB, FI_SEND | FI_RECV, &s->mr) < 0) {
            free(s->mem);
            free(s);
            return NULL;
        }
        for (int i = 0; i < SLAB; i++) {
            s->bufs[i] = (mbuf){0, s->mem + (size_t)i * c->msg_bytes, &s->mr, c->free_bufs, 0, 0};
            c->free_bufs = &s->bufs[i];
        }
        s->next = c->slabs;
        c->slabs = s;
    }
    mbuf *b = c->free_bufs;
    c->free_bufs = b->next_free;
    return b;
}

static void put_buf(ps_client *c, mbuf *b)
{
    b->next_free = c->free_bufs;
    c->free_bufs = b;
}

static int get_slot(ps_client *c, uint32_t *idx)
{
    if (c->nfree_slots == 0) {
        size_t old = c->nslots, nn = old ? old * 2 : 64;
        slot *ns = realloc(c->slots, nn * sizeof(slot));
        if (!ns)
            return -ENOMEM;
        c->slots = ns;
        uint32_t *nf = realloc(c->free_slots, nn * sizeof(uint32_t));
        if (!nf)
            return -ENOMEM;
        c->free_slots = nf;
        for (size_t i = old; i < nn; i++) {
            memset(&c->slots[i], 0, sizeof(slot));
            c->free_slots[c->nfree_slots++] = (uint32_t)(nn - 1 - (i - old));
        }
        c->nslots = nn;
    }
    *idx = c->free_slots[--c->nfree_slots];
    return 0;
}

int ps_client_create(const ps_client_opts *opts, ps_client **out)
{
    *out = NULL;
    if (opts->servers <= 0)
        return pf_err(-EINVAL, "servers %d must be positive", opts->servers);
    if (opts->dim <= 0 || opts->dim > 65536)
        return pf_err(-EINVAL, "embedding_size %d out of range", opts->dim);
    if (opts->num_classes <= 0)
        return pf_err(-EINVAL, "num_classes must be positive");
    if (!ps_dtype_valid(opts->dtype))
        return pf_err(-EINVAL, "wire dtype %d invalid", (int)opts->dtype);
    ps_client *c = calloc(1, sizeof(*c));
    if (!c)
        return pf_err(-ENOMEM, "out of memory");
    c->o = *opts;
    const int ntgt = opts->servers * (1 + (opts->replicas > 0)); /* every copy gets its messages */
    if (c->o.window <= 0)
        c->o.window = 8 * ntgt < 64 ? 8 * ntgt : 64;
    c->msg_bytes = ps_wire_msg_bytes((uint32_t)opts->dim);
    c->rpm = ps_wire_rows_per_msg((uint32_t)opts->dim, opts->dtype);
    c->timeout = FAB_DEFAULT_TIMEOUT_S;
    c->o.replicas = opts->replicas > 0;
    c->ntgt = opts->servers * (1 + c->o.replicas);
    const size_t S = (size_t)c->ntgt;
    c->srv_addr = calloc(S, sizeof(fi_addr_t));
    c->srv_known = calloc(S, 1);
    c->srv_dead = calloc(S, 1);
    c->srv_why = calloc(S, sizeof(char *));
    c->srv_out = calloc(S, sizeof(int));
    c->srv_heard = calloc(S, sizeof(double));
    c->srv_probe = calloc(S, sizeof(ps_req *));
    c->srv_probe_t = calloc(S, sizeof(double));
    c->route = calloc((size_t)opts->servers, sizeof(int));
    c->tgt_gone = calloc(S, 1);
    c->tgt_suspect = calloc(S, sizeof(double));
    c->lost_post = calloc((size_t)opts->servers, sizeof(atomic_int));
    for (int s = 0; c->route && s < opts->servers; s++)
        c->route[s] = s;
    int rc =
        (!c->srv_addr || !c->srv_known || !c->srv_dead || !c->srv_why || !c->srv_out || !c->srv_heard ||
         !c->srv_probe || !c->srv_probe_t || !c->route || !c->tgt_gone || !c->tgt_suspect || !c->lost_post)
            ? pf_err(-ENOMEM, "out of memory")
            : fab_open(opts->provider, &c->fab);
    if (rc < 0) {
        ps_client_destroy(c);
        return rc;
    }
    fab_set_timeout(c->fab, c->timeout);
    *out = c;
    return 0;
}

void ps_client_set_timeout(ps_client *c, double seconds)
{
    c->timeout = seconds > 0 ? seconds : FAB_DEFAULT_TIMEOUT_S;
    fab_set_timeout(c->fab, c->timeout);
}

int ps_client_getname(ps_client *c, void *addr, size_t *len)
{
    return fab_getname(c->fab, addr, len);
}

int ps_client_add_server(ps_client *c, int s, const void *addr, size_t len)
{
    return ps_client_add_copy(c, s, 0, addr, len);
}

int ps_client_add_copy(ps_client *c, int s, int copy, const void *addr, size_t len)
{
    if (s < 0 || s >= c->o.servers)
        return pf_err(-ERANGE, "server rank %d out of range (%d servers)", s, c->o.servers);
    if (copy < 0 || copy > c->o.replicas)
        return pf_err(-ERANGE, "copy %d of shard %d out of range (replicas = %d)", copy, s, c->o.replicas);
    const int t = s + copy * c->o.servers;
    int rc = fab_av_insert(c->fab, addr, len, &c->srv_addr[t]);
    if (rc < 0)
        return pf_err_wrap(rc, "server %d", tgt_host(c, t));
    c->srv_known[t] = 1;
    return 0;
}

static void req_free(ps_req *r)
{
    if (!r)
        return;
    free(r->sorted_ids);
    free(r->order);
    if (r->grads_owned)
        free(r->grads);
    free(r->srv_off);
    free(r->next_chunk);
    free(r->nchunks);
#ifdef PFCPS_TEST_HOOKS
    free(r->raw);
#endif
    free(r);
}

static void req_fail(ps_req *r, int code, const char *msg)
{
    if (r->status == 0) {
        r->status = code;
        snprintf(r->err, sizeof(r->err), "%s", msg);
    }
}

/* A failure found on this side (the message could not go out, or its server is gone): the request cannot
 * complete, so ps_wait returns the error without waiting for the other servers' replies. */
static void req_fail_fatal(ps_req *r, int code, const char *msg)
{
    req_fail(r, code, msg);
    r->fatal = 1;
}

/* Takes r out of the send queue, dropping its messages not yet sent. */
static void unqueue(ps_client *c, ps_req *r)
{
    if (!r->queued)
        return;
    ps_req *prev = NULL;
    for (ps_req *q = c->sendq_head; q; prev = q, q = q->next)
        if (q == r) {
            if (prev)
                prev->next = r->next;
            else
                c->sendq_head = r->next;
            if (c->sendq_tail == r)
                c->sendq_tail = prev;
            break;
        }
    r->queued = 0;
    for (int s = 0; s < c->ntgt; s++) {
        int left = r->nchunks[s] - r->next_chunk[s];
        r->next_chunk[s] = r->nchunks[s];
        r->to_send -= left;
        r->remaining -= left;
    }
}

/* The caller gives r up (timeout, early failure): nothing is written to its buffers any more; r is freed now
 * when no message is in flight, else when the last one is answered or failed (or at ps_client_destroy). */
static void abandon(ps_client *c, ps_req *r)
{
    unqueue(c, r);
    r->out = NULL;
    r->result = NULL;
    if (r->remaining <= 0) {
        req_free(r);
        return;
    }
    r->abandoned = 1;
    r->next_ab = c->abandoned;
    c->abandoned = r;
}

/* Message in slot si is finished (answered, or failed for good): releases the slot and accounts it. */
static void slot_done(ps_client *c, uint32_t si)
{
    slot *sl = &c->slots[si];
    ps_req *r = sl->req;
    int s = sl->server;
    sl->in_use = 0;
    sl->req = NULL;
    c->free_slots[c->nfree_slots++] = si;
    c->inflight--;
    if (r->probe) {
        if (c->srv_probe[s] == r)
            c->srv_probe[s] = NULL;
    } else {
        c->srv_out[s]--;
    }
    r->remaining--;
    if (r->abandoned && r->remaining <= 0) {
        for (ps_req **pp = &c->abandoned; *pp; pp = &(*pp)->next_ab)
            if (*pp == r) {
                *pp = r->next_ab;
                break;
            }
        req_free(r);
    }
}

/* How long a target may stay suspect or leave a liveness probe unanswered before it is dead: the client's
 * timeout, or, while no rendezvous is left to fail a server over (ps_client_set_rendezvous), an eighth of it
 * (twice the rendezvous' silence limit, ctl_member_silence_s, for a worker's 4 x ctl_timeout): a lost server
 * is then found only here. */
static double loss_timeout(const ps_client *c)
{
    return atomic_load(&c->no_rendezvous) ? c->timeout / 8 : c->timeout;
}

/* The target holding the other copy of target t's shard (replicas = 1). */
static int other_copy(const ps_client *c, int t)
{
    return t < c->o.servers ? t + c->o.servers : t - c->o.servers;
}

/* replicas = 1: the target on the same server as target t (its other endpoint: server/main.c serves a primary
 * and a backup copy in one process). */
static int sibling_target(const ps_client *c, int t)
{
    const int S = c->o.servers, h = tgt_host(c, t);
    return t < S ? S + (h + S - 1) % S : h;
}

/* Target s is unreachable (a send to it failed, or it stopped answering probes): every message in flight to
 * it fails its request with -ECOMM "server s: <why>", and every later request touching it fails at once.
 * With replicas, while its shard has another copy that is neither gone nor suspect, it is only suspect: its
 * messages wait for the rendezvous' failover (ps_client_server_lost), which decides for every member alike
 * which copy serves; it is dead only if none comes within the client's timeout (check_liveness), as without
 * replicas. While no rendezvous is left to say a server's process is gone, the other endpoint of a dead
 * target's server is then taken as unreachable too (as a suspect while its shard has another copy), not after
 * its own posts' retries or probe, another loss bound later. */
static void server_dead(ps_client *c, int s, const char *why)
{
    if (c->srv_dead[s] || c->tgt_gone[s])
        return;
    const int other = other_copy(c, s);
    char name[96];
    if (c->o.replicas && !c->tgt_gone[other] && !c->srv_dead[other] && c->tgt_suspect[other] == 0 &&
        c->tgt_suspect[s] == 0) {
        c->tgt_suspect[s] = pf_now_s();
        if (atomic_load(&c->no_rendezvous))
            log_warn("%s: %s; no rendezvous is left to fail it over to shard %d's other copy: taken as lost "
                     "after %.0f s",
                     tgt_name(c, s, name, sizeof name), why, tgt_shard(c, s), loss_timeout(c));
        else
            log_warn(
                "%s: %s; waiting up to %.0f s for the rendezvous to fail it over to shard %d's other copy",
                tgt_name(c, s, name, sizeof name), why, loss_timeout(c), tgt_shard(c, s));
        return;
    }
    if (c->tgt_suspect[s] > 0 && pf_now_s() - c->tgt_suspect[s] <= loss_timeout(c))
        return; /* still waiting for the failover */
    c->srv_dead[s] = 1;
    c->srv_why[s] = strdup(why);
    c->new_deaths = 1;
    char msg[PF_ERRMSG_MAX];
    snprintf(msg, sizeof(msg), "%s: %s", tgt_name(c, s, name, sizeof name), why);
    for (uint32_t si = 0; si < c->nslots; si++) {
        slot *sl = &c->slots[si];
        if (!sl->in_use || sl->server != s)
            continue;
        req_fail_fatal(sl->req, -ECOMM, msg);
        slot_done(c, si);
    }
    const int sib = c->o.replicas ? sibling_target(c, s) : -1;
    if (sib >= 0 && atomic_load(&c->no_rendezvous) && c->srv_known[sib] && !c->srv_dead[sib] &&
        !c->tgt_gone[sib]) {
        char sw[PF_ERRMSG_MAX];
        snprintf(sw, sizeof sw, "its server's other endpoint (%s) is unreachable: %.300s", name, why);
        server_dead(c, sib, sw);
    }
}

/* The error of a request that needs server s after it was found unreachable. */
static int dead_err(ps_client *c, int s, const char *what)
{
    char name[96];
    return pf_err(-ECOMM, "%s: unreachable since an earlier failure (%s): %s not sent",
                  tgt_name(c, s, name, sizeof name), c->srv_why[s] ? c->srv_why[s] : "out of memory", what);
}

/* Keeps at least `need` receives posted: replies are any-source, so one posted buffer per message in flight
 * is what guarantees every reply a place to land (a receive that completes with an error is replaced). */
static int ensure_recvs(ps_client *c, int need)
{
    while (c->posted_recvs < need) {
        mbuf *b = get_buf(c);
        if (!b)
            return pf_err(-ENOMEM, "out of memory for receive buffers");
        b->kind = MB_RECV;
        int rc = fab_recv(c->fab, b->data, c->msg_bytes, b->mr, b);
        if (rc < 0) {
            put_buf(c, b);
            return rc;
        }
        c->posted_recvs++;
    }
    return 0;
}

#ifdef PFCPS_TEST_HOOKS
static size_t raw_msg(const ps_client *c, const ps_req *r, uint8_t *buf, uint64_t req_id);
#endif

/* Writes message k of request r for target t (shard s = t mod S) into buf (c->msg_bytes), with req_id, and
 * records in sl which rows it carries. Returns the message's length in bytes. Pulls and pushes carry the
 * shard's ids of the message's rows (and, for a push, their gradients in the wire dtype). */
static size_t build_msg(ps_client *c, const ps_req *r, int t, int k, slot *sl, uint8_t *buf, uint64_t req_id)
{
    const int s = tgt_shard(c, t);
#ifdef PFCPS_TEST_HOOKS
    if (r->op == RQ_RAW)
        return raw_msg(c, r, buf, req_id);
#endif
    ps_hdr h = {.magic = PS_MAGIC,
                .version = PS_VERSION,
                .client = c->o.rank,
                .req_id = req_id,
                .step = r->step,
                .dim = (uint32_t)c->o.dim,
                .dtype = (uint16_t)c->o.dtype,
                .lr = r->lr,
                .token = c->token,
                .epoch = atomic_load(&c->epoch),
                .flags = r->op == RQ_PUSH || r->op == RQ_STAT ? r->flags : 0};
    size_t len = sizeof(ps_hdr);
    if (r->op == RQ_STAT || r->op == RQ_CHECKSUM) {
        h.op = r->op == RQ_STAT ? PS_OP_STAT : PS_OP_CHECKSUM;
        memcpy(buf, &h, sizeof(h));
        return len;
    }
    const size_t D = (size_t)c->o.dim, rowb = D * ps_dtype_size(c->o.dtype);
    size_t lo = r->srv_off[s] + (size_t)k * c->rpm, hi = lo + c->rpm;
    if (hi > r->srv_off[s + 1])
        hi = r->srv_off[s + 1];
    h.op = r->op == RQ_PULL ? PS_OP_PULL : PS_OP_PUSH;
    h.n = (uint32_t)(hi - lo);
    h.chunk = (uint16_t)k;
    h.nchunks = (uint16_t)r->nchunks[t];
    sl->off = lo;
    sl->n = h.n;
    memcpy(buf + len, r->sorted_ids + lo, (size_t)h.n * sizeof(int64_t));
    len += (size_t)h.n * sizeof(int64_t);
    if (r->op == RQ_PUSH)
        for (size_t i = lo; i < hi; i++, len += rowb)
            ps_rows_encode(buf + len, r->grads + r->order[i] * D, D, c->o.dtype);
    memcpy(buf, &h, sizeof(h));
    return len;
}

/* Builds and sends message k of request r for target s (a receive for its reply is posted first).
 * Returns 0 or a negative code with pf_errmsg naming the server. A post that fails with -ECOMM (the fabric's
 * retry bound ran out, see fab_send) marks the server dead. */
static int send_chunk(ps_client *c, ps_req *r, int s, int k)
{
    if (c->srv_dead[s])
        return dead_err(c, s, op_name(r));
    mbuf *sb = get_buf(c);
    uint32_t si;
    if (!sb || get_slot(c, &si) < 0) {
        if (sb)
            put_buf(c, sb);
        return pf_err(-ENOMEM, "server %d: out of memory for message buffers", s);
    }
    int rc = ensure_recvs(c, c->inflight + 1);
    if (rc < 0) {
        put_buf(c, sb);
        c->free_slots[c->nfree_slots++] = si;
        return pf_err_wrap(rc, "server %d: posting a receive for the %s reply", s, op_name(r));
    }
    slot *sl = &c->slots[si];
    sl->gen++;
    size_t len = build_msg(c, r, s, k, sl, sb->data, ((uint64_t)sl->gen << 32) | si);
    sb->kind = MB_SEND;
    sb->slot = si;
    sb->gen = sl->gen;
    rc = fab_send(c->fab, c->srv_addr[s], sb->data, len, sb->mr, sb);
    if (rc < 0) {
        c->free_slots[c->nfree_slots++] = si;
        put_buf(c, sb);
        char why[PF_ERRMSG_MAX];
        if (r->probe && c->srv_out[s] > 0)
            snprintf(why, sizeof(why),
                     "no reply for %.1f s while %d request messages waited, and a liveness probe "
                     "(stat) could not be sent: %s",
                     pf_now_s() - c->srv_heard[s], c->srv_out[s], pf_errmsg());
        else if (r->probe) /* ps_client_check_copies' probe: nothing else waits for this server */
            snprintf(why, sizeof(why), "a liveness probe (stat) could not be sent: %s", pf_errmsg());
        else
            snprintf(why, sizeof(why), "%s request send failed: %s", op_name(r), pf_errmsg());
        if (rc == -ECOMM)
            server_dead(c, s, why);
        char name[96];
        return pf_err(rc, "%s: %s", tgt_name(c, s, name, sizeof name), why);
    }
    sl->in_use = 1;
    sl->req = r;
    sl->server = s;
    if (r->op == RQ_PUSH) {
        metrics_add(c->m_pushed_rows, sl->n);
        metrics_add(c->m_pushed_bytes, (double)len);
    }
    c->inflight++;
    r->to_send--;
    if (!r->probe && c->srv_out[s]++ == 0)
        c->srv_heard[s] = pf_now_s(); /* its silence counts from now */
    return 0;
}

/* Sends the next message of request r for target s (send_chunk). */
static int send_one(ps_client *c, ps_req *r, int s)
{
    int rc = send_chunk(c, r, s, r->next_chunk[s]);
    if (rc == 0)
        r->next_chunk[s]++;
    return rc;
}

/* Fails the messages of request r for server s that were not sent yet (they never will be). */
static void fail_unsent(ps_req *r, int s, int code, const char *msg)
{
    int left = r->nchunks[s] - r->next_chunk[s];
    if (left <= 0)
        return;
    req_fail_fatal(r, code, msg);
    r->next_chunk[s] = r->nchunks[s];
    r->to_send -= left;
    r->remaining -= left;
}

/* Sends queued messages while the window allows. */
static void pump(ps_client *c)
{
    while (c->sendq_head && c->inflight < c->o.window) {
        ps_req *r = c->sendq_head;
        int sent = 0;
        for (int s = 0; s < c->ntgt && c->inflight < c->o.window; s++) {
            if (r->next_chunk[s] >= r->nchunks[s])
                continue;
            int rc = send_one(c, r, s);
            if (rc < 0 && c->tgt_suspect[s] > 0 && !c->srv_dead[s])
                continue; /* held for the failover, which moves or drops its messages */
            if (rc < 0)
                fail_unsent(r, s, rc, pf_errmsg()); /* the request completes with the error */
            sent = 1;
        }
        if (r->to_send <= 0) {
            c->sendq_head = r->next;
            if (!c->sendq_head)
                c->sendq_tail = NULL;
            r->queued = 0;
        } else if (!sent) {
            break;
        }
    }
}

/* After a server was marked dead: queued requests fail their unsent messages for it now, not when the window
 * lets them reach it. */
static void sweep_queue(ps_client *c)
{
    if (!c->new_deaths)
        return;
    c->new_deaths = 0;
    for (ps_req *r = c->sendq_head; r; r = r->next)
        for (int s = 0; s < c->ntgt; s++)
            if (c->srv_dead[s] && r->next_chunk[s] < r->nchunks[s]) {
                dead_err(c, s, op_name(r));
                fail_unsent(r, s, -ECOMM, pf_errmsg());
            }
    /* Requests with nothing left to send leave the queue (pump only looks at its head). */
    ps_req *prev = NULL;
    for (ps_req *r = c->sendq_head; r;) {
        ps_req *nx = r->next;
        if (r->to_send <= 0) {
            if (prev)
                prev->next = nx;
            else
                c->sendq_head = nx;
            if (c->sendq_tail == r)
                c->sendq_tail = prev;
            r->queued = 0;
        } else {
            prev = r;
        }
        r = nx;
    }
}

/* The slot a reply (or a truncated one) names, or NULL when stale or foreign. */
static slot *reply_slot(ps_client *c, const uint8_t *buf, size_t len, ps_hdr *h, uint32_t *si)
{
    if (len < sizeof(*h))
        return NULL;
    memcpy(h, buf, sizeof(*h));
    *si = (uint32_t)(h->req_id & 0xffffffffu);
    uint32_t gen = (uint32_t)(h->req_id >> 32);
    if (h->magic != PS_MAGIC || h->op != PS_OP_REPLY || (c->token && h->token != c->token))
        return NULL;
    if (*si >= c->nslots || !c->slots[*si].in_use || c->slots[*si].gen != gen) {
        uint32_t now_epoch = atomic_load(&c->epoch);
        if (h->epoch < now_epoch) {
            /* A copy removed by a failover answering late (its messages were retired): refused. */
            c->fenced_replies++;
            metrics_add(c->m_fenced, 1);
            double t = pf_now_s();
            if (t - c->fenced_log_t >= 1.0) {
                log_warn("dropped a reply of membership epoch %u (now %u): its sender was removed from the "
                         "run and its message retired (%ld such replies so far)",
                         h->epoch, now_epoch, c->fenced_replies);
                c->fenced_log_t = t;
            }
        }
        return NULL;
    }
    return &c->slots[*si];
}

static void handle_reply(ps_client *c, const uint8_t *buf, size_t len)
{
    ps_hdr h;
    uint32_t si;
    slot *sl = reply_slot(c, buf, len, &h, &si);
    if (!sl)
        return; /* stale or foreign: ignore */
    ps_req *r = sl->req;
    const double now = pf_now_s();
    c->srv_heard[sl->server] = now;
    if (r == c->waiting)
        c->wait_last[tgt_shard(c, sl->server)] = now;
    const uint8_t *p = buf + sizeof(h);
    size_t plen = len - sizeof(h);
    if (h.status != 0) {
        char msg[PF_ERRMSG_MAX];
        size_t ml = plen < sizeof(msg) - 1 ? plen : sizeof(msg) - 1;
        memcpy(msg, p, ml);
        msg[ml] = 0;
        req_fail(r, h.status < 0 ? h.status : -EPROTO, msg);
    } else if (r->op == RQ_PULL) {
        const size_t D = (size_t)c->o.dim, dts = ps_dtype_size(c->o.dtype);
        if (h.n != sl->n || plen != (size_t)h.n * D * dts) {
            char msg[128];
            snprintf(msg, sizeof(msg), "server %d: pull reply has the wrong size", tgt_host(c, sl->server));
            req_fail(r, -EPROTO, msg);
        } else {
            metrics_add(c->m_pulled_rows, h.n);
            metrics_add(c->m_pulled_bytes, (double)len);
            for (uint32_t i = 0; r->out && i < h.n; i++) /* r->out is NULL once the caller gave r up */
                ps_rows_decode(r->out + r->order[sl->off + i] * D, p + (size_t)i * D * dts, D, c->o.dtype);
        }
    } else if (r->op == RQ_STAT && r->result) {
        if (plen >= sizeof(ps_stat))
            memcpy(r->result, p, sizeof(ps_stat));
        else
            req_fail(r, -EPROTO, "short stat reply");
    } else if (r->op == RQ_CHECKSUM && r->result) {
        if (plen >= sizeof(uint64_t))
            memcpy(r->result, p, sizeof(uint64_t));
        else
            req_fail(r, -EPROTO, "short checksum reply");
    }
    slot_done(c, si);
}

/* A receive completed with an error (e.g. -ETRUNC). Receives are any-source, so it names a request only when
 * enough of a reply header landed; that request fails. The receive itself is replaced by ensure_recvs. */
static void handle_recv_error(ps_client *c, const uint8_t *buf, size_t len, int err)
{
    ps_hdr h;
    uint32_t si;
    slot *sl = reply_slot(c, buf, len, &h, &si);
    if (!sl)
        return;
    char msg[PF_ERRMSG_MAX];
    char name[96];
    snprintf(msg, sizeof(msg), "%s: receiving the %s reply failed: %s",
             tgt_name(c, sl->server, name, sizeof name), op_name(sl->req), fi_strerror(-err));
    if (c->o.replicas && err != -FI_ETRUNC) {
        /* With another live copy the target is only suspect and the failover retires the slot; otherwise
         * server_dead failed it with every other message to that target. */
        server_dead(c, sl->server, msg);
        return;
    }
    req_fail_fatal(sl->req, err == -FI_ETRUNC ? -EPROTO : -ECOMM, msg);
    slot_done(c, si);
}

/* A send completed with an error: its server's endpoint is closed or unreachable. */
static void handle_send_error(ps_client *c, const mbuf *b, int err)
{
    if (b->slot >= c->nslots)
        return;
    slot *sl = &c->slots[b->slot];
    if (!sl->in_use || sl->gen != b->gen)
        return; /* its message was already failed */
    char why[PF_ERRMSG_MAX];
    snprintf(why, sizeof(why), "%s request send failed: %s", op_name(sl->req), fi_strerror(-err));
    server_dead(c, sl->server, why);
}

/* Sends a liveness probe (a stat request, outside the window) to server s. */
static void send_probe(ps_client *c, int s, double now);

/* Servers with messages waiting and no reply for PROBE_AFTER_S (capped at a quarter of the timeout) get a
 * probe; a probe unanswered for the client's timeout marks its server dead. This bounds every wait on a
 * reply: a server killed after it received a request produces no completion on this side at all. */
static void check_liveness(ps_client *c)
{
    double now = pf_now_s();
    if (now - c->last_check < CHECK_EVERY_S)
        return;
    c->last_check = now;
    const double tmo = loss_timeout(c);
    double after = tmo / 4 < PROBE_AFTER_S ? tmo / 4 : PROBE_AFTER_S;
    for (int s = 0; s < c->ntgt; s++) {
        if (c->srv_dead[s] || !c->srv_known[s] || c->tgt_gone[s])
            continue;
        if (c->tgt_suspect[s] > 0) {
            const int o = other_copy(c, s);
            if (atomic_load(&c->no_rendezvous) && (c->tgt_gone[o] || c->srv_dead[o])) {
                c->tgt_suspect[s] = 0;
                server_dead(
                    c, s,
                    "unreachable, its shard's other copy is lost too, and no rendezvous is left to fail it "
                    "over (server 0 is lost)");
                continue;
            }
            if (now - c->tgt_suspect[s] > tmo)
                server_dead(c, s, "no failover came from the rendezvous after a transport error");
            continue;
        }
        if (c->srv_probe[s]) {
            if (now - c->srv_probe_t[s] > tmo) {
                char why[PF_ERRMSG_MAX];
                if (c->srv_out[s] > 0)
                    snprintf(why, sizeof(why),
                             "no reply to a liveness probe (stat) within %.1f s while %d request "
                             "messages waited for it",
                             tmo, c->srv_out[s]);
                else
                    snprintf(why, sizeof(why), "no reply to a liveness probe (stat) within %.1f s", tmo);
                server_dead(c, s, why);
            }
        } else if (c->srv_out[s] > 0 && now - c->srv_heard[s] > after) {
            send_probe(c, s, now);
        }
    }
}

/* Moves what request r had for gone target t to the shard's other copy `to` (pulls, stats, checksums: their
 * answer must come from a serving copy) or drops it (pushes: the other copy has, or will get, its own). Its
 * in-flight messages to t are retired first by the caller (retire_target). */
static void move_unsent(ps_req *r, int t, int to)
{
    int left = r->nchunks[t] - r->next_chunk[t];
    if (left <= 0)
        return;
    if (r->op == RQ_PUSH || to < 0) {
        r->to_send -= left;
        r->remaining -= left;
    } else {
        r->nchunks[to] = r->nchunks[t];
        r->next_chunk[to] = r->next_chunk[t];
    }
    r->next_chunk[t] = r->nchunks[t];
}

/* Retires every message in flight to gone target t: a push's is dropped (the request completes on its other
 * copies' acknowledgements), a probe's forgotten, a pull's, stat's or checksum's sent again to `to`, the
 * shard's serving copy now (its rows are the same: both copies applied the same pushes). */
static void retire_target(ps_client *c, int t, int to)
{
    for (uint32_t si = 0; si < c->nslots; si++) {
        slot *sl = &c->slots[si];
        if (!sl->in_use || sl->server != t)
            continue;
        ps_req *r = sl->req;
        const int resend = !r->probe && !r->abandoned && r->op != RQ_PUSH && r->op != RQ_RAW && to >= 0;
        const int k = r->op == RQ_PULL ? (int)((sl->off - r->srv_off[tgt_shard(c, t)]) / c->rpm) : 0;
        slot_done(c, si); /* may free an abandoned request: r is not used below then */
        if (!resend)
            continue;
        r->remaining++;
        r->to_send++;
        if (send_chunk(c, r, to, k) < 0) {
            r->remaining--;
            r->to_send--;
            req_fail_fatal(r, -ECOMM, pf_errmsg());
        }
    }
}

/* The rendezvous removed server `host` from the run: its two copies (the primary of shard host, the backup of
 * shard host - 1) are gone. Every shard they held goes on on its other copy; a shard without one fails its
 * requests as a dead server does. */
static void failover_server(ps_client *c, int host)
{
    const int S = c->o.servers;
    const int held[2] = {host, c->o.replicas ? sibling_target(c, host) : -1};
    for (int i = 0; i < 2; i++) {
        const int t = held[i];
        if (t < 0 || c->tgt_gone[t])
            continue;
        const int s = tgt_shard(c, t), other = other_copy(c, t);
        /* A suspect other copy is no copy to go on on when no rendezvous is left to fail it over either. */
        const int to = c->o.replicas && !c->tgt_gone[other] && !c->srv_dead[other] &&
                               !(c->tgt_suspect[other] > 0 && atomic_load(&c->no_rendezvous))
                           ? other
                           : -1;
        char name[96];
        if (to < 0) {
            c->tgt_suspect[t] = 0; /* the rendezvous decided: no wait for a failover */
            server_dead(c, t, "removed from the run and its shard has no other live copy");
            continue;
        }
        c->tgt_gone[t] = 1;
        if (c->route[s] == t)
            c->route[s] = to;
        retire_target(c, t, to);
        for (ps_req *r = c->sendq_head; r; r = r->next)
            move_unsent(r, t, to);
        c->new_deaths = 1; /* sweep_queue takes requests left with nothing to send off the queue */
        log_info("%s removed from the run: shard %d is now served by its %s copy",
                 tgt_name(c, t, name, sizeof name), s, to < S ? "primary" : "backup");
    }
}

/* Takes the servers ps_client_server_lost posted (training thread). */
static void take_lost(ps_client *c)
{
    if (!atomic_exchange(&c->lost_any, 0))
        return;
    for (int h = 0; h < c->o.servers; h++)
        if (atomic_exchange(&c->lost_post[h], 0))
            failover_server(c, h);
}

/* Drives the fabric and handles what completed; with wait_ms >= 0 sleeps up to that long for the first
 * completion when none is ready (fab_wait). Returns the completions handled, or negative when the CQ
 * failed. */
static int progress(ps_client *c, int wait_ms)
{
    take_lost(c);
    fab_comp comps[32];
    int n = wait_ms >= 0 ? fab_wait(c->fab, comps, 32, wait_ms) : fab_poll(c->fab, comps, 32);
    if (n < 0)
        return n;
    for (int i = 0; i < n; i++) {
        mbuf *b = comps[i].context;
        if (!b)
            continue;
        if (b->kind == MB_RECV) {
            c->posted_recvs--;
            if (comps[i].err == 0)
                handle_reply(c, b->data, comps[i].len);
            else
                handle_recv_error(c, b->data, comps[i].len, comps[i].err);
        } else if (comps[i].err != 0) {
            handle_send_error(c, b, comps[i].err);
        }
        put_buf(c, b); /* the provider is done with it */
    }
    check_liveness(c);
    sweep_queue(c);
    ensure_recvs(c, c->inflight); /* on failure the next call tries again */
    pump(c);
    return n;
}

static void enqueue_req(ps_client *c, ps_req *r)
{
    r->queued = 1;
    r->next = NULL;
    if (c->sendq_tail)
        c->sendq_tail->next = r;
    else
        c->sendq_head = r;
    c->sendq_tail = r;
    pump(c);
}

static ps_req *req_alloc(ps_client *c, int op, int64_t step)
{
    ps_req *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->op = op;
    r->step = step;
    r->t_start = pf_now_s();
    r->srv_off = calloc((size_t)c->o.servers + 1, sizeof(size_t));
    r->next_chunk = calloc((size_t)c->ntgt, sizeof(int));
    r->nchunks = calloc((size_t)c->ntgt, sizeof(int));
    if (!r->srv_off || !r->next_chunk || !r->nchunks) {
        req_free(r);
        return NULL;
    }
    return r;
}

static void send_probe(ps_client *c, int s, double now)
{
    ps_req *r = req_alloc(c, RQ_STAT, 0);
    if (!r)
        return; /* out of memory: the next check tries again */
    r->probe = 1;
    r->probe_server = s;
    r->nchunks[s] = 1;
    r->to_send = r->remaining = 1;
    if (send_one(c, r, s) < 0) { /* -ECOMM marked the server dead; anything else: tried again later */
        req_free(r);
        return;
    }
    r->abandoned = 1; /* nobody waits for it: freed when answered or failed */
    r->next_ab = c->abandoned;
    c->abandoned = r;
    c->srv_probe[s] = r;
    c->srv_probe_t[s] = now;
}

/* Groups ids by server (id mod S), keeping the caller's order within a server (a stable counting sort: pfc's
 * ascending ids stay ascending), and fills the request's shard split. */
static int split_ids(ps_client *c, ps_req *r, const int64_t *ids, size_t n)
{
    const int S = c->o.servers;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->o.num_classes)
            return pf_err(-ERANGE, "id %lld at index %zu is outside [0, %lld)", (long long)ids[i], i,
                          (long long)c->o.num_classes);
    r->sorted_ids = malloc(sizeof(int64_t) * (n ? n : 1));
    r->order = malloc(sizeof(size_t) * (n ? n : 1));
    if (!r->sorted_ids || !r->order)
        return pf_err(-ENOMEM, "out of memory splitting %zu ids", n);
    for (size_t i = 0; i < n; i++)
        r->srv_off[ids[i] % S + 1]++;
    for (int s = 0; s < S; s++)
        r->srv_off[s + 1] += r->srv_off[s];
    /* srv_off[s] is where server s's ids start; fill with a running cursor per server. */
    size_t stackpos[64], *pos = S <= 64 ? stackpos : malloc(sizeof(size_t) * (size_t)S);
    if (!pos)
        return pf_err(-ENOMEM, "out of memory splitting %zu ids", n);
    for (int s = 0; s < S; s++)
        pos[s] = r->srv_off[s];
    for (size_t i = 0; i < n; i++) {
        size_t o = pos[ids[i] % S]++;
        r->sorted_ids[o] = ids[i];
        r->order[o] = i;
    }
    if (pos != stackpos)
        free(pos);
    r->n = n;
    return 0;
}

static int check_servers(ps_client *c)
{
    char name[96];
    for (int s = 0; s < c->ntgt; s++)
        if (!c->srv_known[s] && !c->tgt_gone[s]) /* gone: removed from the run before it was ever added */
            return pf_err(-ENOTCONN, "%s's address was never added", tgt_name(c, s, name, sizeof name));
    return 0;
}

int ps_pull(ps_client *c, const int64_t *ids, size_t n, float *out, int64_t step, ps_req **req)
{
    *req = NULL;
    take_lost(c); /* a failover announced since the last progress routes this request already */
    int rc = check_servers(c);
    if (rc < 0)
        return rc;
    if (step < 0)
        return pf_err(-EINVAL, "step %lld is negative", (long long)step);
    ps_req *r = req_alloc(c, RQ_PULL, step);
    if (!r)
        return pf_err(-ENOMEM, "out of memory");
    if ((rc = split_ids(c, r, ids, n)) < 0) {
        req_free(r);
        return rc;
    }
    r->out = out;
    for (int s = 0; s < c->o.servers; s++) {
        size_t cnt = r->srv_off[s + 1] - r->srv_off[s];
        const int t = c->route[s]; /* the shard's serving copy */
        r->nchunks[t] = (int)((cnt + c->rpm - 1) / c->rpm);
        r->to_send += r->nchunks[t];
        if (r->nchunks[t] && c->srv_dead[t]) {
            rc = dead_err(c, t, "pull");
            req_free(r);
            return rc;
        }
    }
    r->remaining = r->to_send;
    *req = r;
    if (r->to_send)
        enqueue_req(c, r);
    return 0;
}

int ps_push(ps_client *c, const int64_t *ids, size_t n, const float *grads, float lr, int64_t step,
            ps_req **req)
{
    return ps_push_ex(c, ids, n, grads, lr, step, 0, req);
}

int ps_push_ex(ps_client *c, const int64_t *ids, size_t n, const float *grads, float lr, int64_t step,
               uint32_t flags, ps_req **req)
{
    *req = NULL;
    take_lost(c); /* a failover announced since the last progress routes this request already */
    int rc = check_servers(c);
    if (rc < 0)
        return rc;
    if (step < 0)
        return pf_err(-EINVAL, "step %lld is negative", (long long)step);
    if (!isfinite(lr) || lr < 0)
        return pf_err(-EINVAL, "learning rate %g is invalid", (double)lr);
    ps_req *r = req_alloc(c, RQ_PUSH, step);
    if (!r)
        return pf_err(-ENOMEM, "out of memory");
    if ((rc = split_ids(c, r, ids, n)) < 0) {
        req_free(r);
        return rc;
    }
    size_t bytes = n * (size_t)c->o.dim * sizeof(float);
    if (c->borrow_grads) {
        /* The caller keeps them unchanged until ps_wait returns: after that nothing reads them (a request
         * given up is taken off the send queue first). Saves copying (and, above glibc's mmap threshold,
         * faulting in) K x D floats every step. */
        r->grads = (float *)grads;
    } else {
        r->grads = malloc(bytes ? bytes : 1);
        r->grads_owned = 1;
    }
    if (!r->grads) {
        req_free(r);
        return pf_err(-ENOMEM, "out of memory copying %zu gradient bytes", bytes);
    }
    if (bytes && r->grads_owned)
        memcpy(r->grads, grads, bytes);
    r->lr = lr;
    r->flags = flags;
    for (int s = 0; s < c->o.servers; s++) {
        size_t cnt = r->srv_off[s + 1] - r->srv_off[s];
        size_t k = (cnt + c->rpm - 1) / c->rpm;
        if (k == 0)
            k = 1; /* every server gets one push per step, possibly empty */
        if (k > 65535) {
            req_free(r);
            return pf_err(-E2BIG, "push of %zu rows to server %d needs %zu messages (max 65535)", cnt, s, k);
        }
        /* Every live copy of the shard gets the push; it is complete when each has acknowledged it. */
        int live = 0;
        for (int t = s; t < c->ntgt; t += c->o.servers) {
            if (c->tgt_gone[t])
                continue;
            if (c->srv_dead[t]) {
                rc = dead_err(c, t, "push");
                req_free(r);
                return rc;
            }
            r->nchunks[t] = (int)k;
            r->to_send += (int)k;
            live++;
        }
        if (!live) {
            req_free(r);
            return pf_err(-ECOMM, "shard %d: every copy was removed from the run: push not sent", s);
        }
    }
    r->remaining = r->to_send;
    *req = r;
    enqueue_req(c, r);
    return 0;
}

int ps_test(ps_client *c, ps_req *r)
{
    progress(c, -1);
    return r->remaining <= 0 || r->fatal;
}

/* Shard s (either of its copies) still owes request r a reply (a message unanswered or not yet sent). */
static int owes(const ps_client *c, const ps_req *r, int s)
{
    for (int t = s; t < c->ntgt; t += c->o.servers)
        if (r->next_chunk && r->nchunks && r->next_chunk[t] < r->nchunks[t])
            return 1;
    for (uint32_t si = 0; si < c->nslots; si++)
        if (c->slots[si].in_use && c->slots[si].req == r && tgt_shard(c, c->slots[si].server) == s)
            return 1;
    return 0;
}

/* The servers request r still waits for (a message unanswered or not yet sent), as "server 1" or
 * "servers 0, 2", with how long since each was last heard from, into buf[n]. */
static void waiting_for(const ps_client *c, const ps_req *r, char *buf, size_t n)
{
    int cnt = 0;
    size_t o = 0;
    double now = pf_now_s();
    buf[0] = 0;
    for (int s = 0; s < c->o.servers && o < n; s++) {
        if (!owes(c, r, s))
            continue;
        o += (size_t)snprintf(buf + o, n - o, "%s%d (last heard %.1f s ago)", cnt ? ", " : "", s,
                              c->srv_heard[s] > 0 ? now - c->srv_heard[s] : now - r->t_start);
        cnt++;
    }
    if (cnt) {
        char tmp[512];
        snprintf(tmp, sizeof tmp, "%s %s", cnt > 1 ? "servers" : "server", buf);
        snprintf(buf, n, "%s", tmp);
    } else {
        snprintf(buf, n, "the servers");
    }
}

/* Metrics on: adds each server's share of the wait for r that began at t0 and ends now (`done`: every reply
 * is in) to pfcps_worker_server_wait_seconds_total{server} (ps_client_metrics_on says how). */
static void wait_account(ps_client *c, const ps_req *r, double t0, int done)
{
    c->waiting = NULL;
    if (!c->m_wait)
        return;
    const double now = pf_now_s();
    for (int s = 0; s < c->o.servers; s++) {
        int any = 0;
        for (int t = s; r->nchunks && t < c->ntgt; t += c->o.servers)
            any |= r->nchunks[t] != 0;
        if (!any)
            continue;
        double end = !done && owes(c, r, s) ? now : c->wait_last[s];
        if (end > t0)
            metrics_add(c->m_wait[s], end - t0);
    }
}

int ps_wait(ps_client *c, ps_req *r, double timeout_s)
{
    const double t0 = pf_now_s(), log_every = c->timeout > 0 ? c->timeout / 16 : 30;
    if (r->wait_t0 == 0) {
        r->wait_t0 = t0;
        r->next_log = t0 + log_every;
    }
    int idle = 0;
    if (c->m_wait) {
        c->waiting = r;
        for (int s = 0; s < c->o.servers; s++)
            c->wait_last[s] = 0;
    }
    while (r->remaining > 0 && !r->fatal) {
        /* After a hundred empty polls: sleep in the completion queue (1 ms at most, so the checks below
         * still run that often) where the provider can, else nap below. */
        int n = progress(c, idle > 100 && fab_can_wait(c->fab) ? 1 : -1);
        if (n < 0) {
            /* CQ failure: the request cannot complete. Its messages in flight still reference it. */
            wait_account(c, r, t0, 0);
            abandon(c, r);
            return n;
        }
        if (n == 0 && ++idle > 100) {
            double now = pf_now_s();
            if (fab_interrupted()) { /* the process' control watcher saw the run break (fab_set_interrupt) */
                char who[600];
                waiting_for(c, r, who, sizeof who);
                int rc = pf_err(-ECANCELED, "waiting for %s: given up: the run broke (%s of step %lld)", who,
                                op_name(r), (long long)r->step);
                wait_account(c, r, t0, 0);
                abandon(c, r);
                return rc;
            }
            if ((timeout_s >= 0 && now - t0 > timeout_s) || now >= r->next_log) {
                char who[600];
                waiting_for(c, r, who, sizeof who);
                if (timeout_s >= 0 && now - t0 > timeout_s) {
                    wait_account(c, r, t0, 0);
                    return pf_err(-ETIMEDOUT,
                                  "no reply from %s within %.1f s (%s of step %lld, %d messages outstanding)",
                                  who, now - r->wait_t0, op_name(r), (long long)r->step, r->remaining);
                }
                /* A stall is said while it lasts (every client timeout / 16: ctl_timeout / 4 for the
                 * workers), counted from the request's first wait. */
                log_warn("still waiting for %s: %s of step %lld, %.1f s so far, %d messages outstanding", who,
                         op_name(r), (long long)r->step, now - r->wait_t0, r->remaining);
                r->next_log = now + log_every;
            }
            /* Without a wait object: give the core away briefly (servers may share it), longer after a
             * thousand empty polls (a server busy applying or gathering needs the core more than this wait
             * needs its latency). */
            if (!fab_can_wait(c->fab)) {
                struct timespec ts = {0, idle > 1000 ? 50000 : 5000};
                nanosleep(&ts, NULL);
            }
        } else if (n > 0) {
            idle = 0;
        }
    }
    /* Done, or failed on this side: the error is returned now, replies still due from live servers are
     * dropped when they come (abandon). */
    wait_account(c, r, t0, r->remaining <= 0);
    int rc = r->status;
    if (rc < 0)
        pf_err(rc, "%s", r->err);
    abandon(c, r);
    return rc;
}

/* A request of one message to server s (stat, checksum; ps_raw) into *out, not yet queued. Returns 0, -ERANGE
 * (s unknown), -ECOMM (s found unreachable before) or -ENOMEM. */
static int simple_req(ps_client *c, int s, int op, void *result, ps_req **out)
{
    *out = NULL;
    if (s < 0 || s >= c->o.servers)
        return pf_err(-ERANGE, "server %d unknown", s);
    if (op != RQ_RAW)
        s = c->route[s]; /* shard s's serving copy (ps_raw talks to server s itself) */
    if (!c->srv_known[s])
        return pf_err(-ERANGE, "server %d unknown", tgt_host(c, s));
    ps_req *r = req_alloc(c, op, 0);
    if (!r)
        return pf_err(-ENOMEM, "out of memory");
    r->result = result;
    if (c->srv_dead[s]) {
        int rc = dead_err(c, s, op_name(r));
        req_free(r);
        return rc;
    }
    r->nchunks[s] = 1;
    r->to_send = r->remaining = 1;
    *out = r;
    return 0;
}

/* Sends a simple_req request and waits up to timeout_s for its reply (ps_wait's returns). */
static int simple_run(ps_client *c, ps_req *r, double timeout_s)
{
    enqueue_req(c, r);
    int rc = ps_wait(c, r, timeout_s);
    /* The reply may still come: never write to the caller's result then; free it when it does (or at
     * ps_client_destroy). */
    if (rc == -ETIMEDOUT)
        abandon(c, r);
    return rc;
}

int ps_stat_get(ps_client *c, int s, ps_stat *out, double timeout_s)
{
    ps_req *r;
    int rc = simple_req(c, s, RQ_STAT, out, &r);
    return rc < 0 ? rc : simple_run(c, r, timeout_s);
}

int ps_client_done(ps_client *c, double timeout_s)
{
    /* One bound for the whole exchange, the posts' retrying included (a copy whose process is gone refuses
     * every post until the fabric's timeout, set here to the time left): each shard is still tried, with at
     * least PS_DONE_MIN_S. */
    const double saved = c->timeout, end = pf_now_s() + timeout_s;
    int first = 0;
    char first_msg[PF_ERRMSG_MAX] = "";
    for (int s = 0; s < c->o.servers; s++) {
        double left = end - pf_now_s();
        if (left < PS_DONE_MIN_S)
            left = PS_DONE_MIN_S;
        ps_client_set_timeout(c, left);
        ps_stat st;
        ps_req *r;
        int rc = simple_req(c, s, RQ_STAT, &st, &r);
        if (rc == 0) {
            r->flags = PS_STAT_DONE;
            rc = simple_run(c, r, left);
        }
        if (rc < 0 && first == 0) {
            first = pf_err_wrap(rc, "telling shard %d's serving copy this worker is done (within %g s)", s,
                                timeout_s);
            snprintf(first_msg, sizeof first_msg, "%s", pf_errmsg());
        }
    }
    ps_client_set_timeout(c, saved);
    if (first < 0)
        pf_err(first, "%s", first_msg); /* the first failure's message, not a later shard's */
    return first;
}

int ps_checksum(ps_client *c, int s, uint64_t *out, double timeout_s)
{
    ps_req *r;
    int rc = simple_req(c, s, RQ_CHECKSUM, out, &r);
    return rc < 0 ? rc : simple_run(c, r, timeout_s);
}

int ps_client_warmup(ps_client *c, double timeout_s)
{
    take_lost(c); /* copies of servers posted lost before (a replacement's lost_servers) are not warmed up */
    for (int s = 0; s < c->ntgt; s++) {
        if (c->tgt_gone[s])
            continue;
        ps_stat st;
        ps_req *r;
        int rc = simple_req(c, tgt_shard(c, s), RQ_STAT, &st, &r);
        if (rc == 0) {
            r->nchunks[c->route[tgt_shard(c, s)]] = 0;
            r->nchunks[s] = 1; /* every copy, backups included */
            rc = simple_run(c, r, timeout_s);
        }
        char name[96];
        if (rc < 0)
            return pf_err_wrap(rc, "warming up %s", tgt_name(c, s, name, sizeof name));
        if (st.dim != c->o.dim || st.num_classes != c->o.num_classes || st.servers != c->o.servers)
            return pf_err(-EINVAL, "server %d has C=%lld D=%d S=%d, client expects C=%lld D=%d S=%d", s,
                          (long long)st.num_classes, st.dim, st.servers, (long long)c->o.num_classes,
                          c->o.dim, c->o.servers);
    }
    return 0;
}

void ps_client_destroy(ps_client *c)
{
    if (!c)
        return;
    for (ps_req *r = c->abandoned; r;) {
        ps_req *nx = r->next_ab;
        if (!r->queued)
            req_free(r); /* queued ones are freed with the send queue below */
        r = nx;
    }
    for (ps_req *r = c->sendq_head; r;) {
        ps_req *nx = r->next;
        req_free(r);
        r = nx;
    }
    /* Close the endpoint (cancelling posted receives) before deregistering and freeing their buffers. */
    fab_shutdown(c->fab);
    for (slab *s = c->slabs; s; s = s->next)
        fab_mr_close(&s->mr);
    fab_close(c->fab);
    for (slab *s = c->slabs; s;) {
        slab *nx = s->next;
        free(s->mem);
        free(s);
        s = nx;
    }
    free(c->slots);
    free(c->free_slots);
    free(c->srv_addr);
    free(c->srv_known);
    free(c->route);
    free(c->tgt_gone);
    free(c->tgt_suspect);
    free(c->lost_post);
    for (int s = 0; c->srv_why && s < c->ntgt; s++)
        free(c->srv_why[s]);
    free(c->srv_why);
    free(c->srv_dead);
    free(c->srv_out);
    free(c->srv_heard);
    free(c->srv_probe);
    free(c->srv_probe_t);
    free(c->m_wait);
    free(c->wait_last);
    free(c);
}

int ps_client_metrics_on(ps_client *c)
{
    const int S = c->o.servers;
    if (!c->m_wait) {
        c->m_wait = calloc((size_t)S, sizeof *c->m_wait);
        c->wait_last = calloc((size_t)S, sizeof *c->wait_last);
        if (!c->m_wait || !c->wait_last) {
            free(c->m_wait);
            free(c->wait_last);
            c->m_wait = NULL;
            c->wait_last = NULL;
            return pf_err(-ENOMEM, "out of memory for %d servers' wait series", S);
        }
    }
    c->m_pulled_rows =
        metrics_counter("pfcps_worker_pulled_rows_total", "Class-center rows pulled.", NULL, 0);
    c->m_pushed_rows =
        metrics_counter("pfcps_worker_pushed_rows_total", "Class-center gradient rows pushed.", NULL, 0);
    c->m_pulled_bytes =
        metrics_counter("pfcps_worker_pulled_bytes_total", "Data-plane bytes received for pulls.", NULL, 0);
    c->m_pushed_bytes =
        metrics_counter("pfcps_worker_pushed_bytes_total", "Data-plane bytes sent for pushes.", NULL, 0);
    c->m_fenced =
        metrics_counter("pfcps_worker_fenced_replies_total",
                        "Replies of an older membership epoch dropped (a removed server's).", NULL, 0);
    for (int s = 0; s < S; s++) {
        char rank[16];
        snprintf(rank, sizeof rank, "%d", s);
        const char *labels[] = {"server", rank};
        c->m_wait[s] = metrics_counter("pfcps_worker_server_wait_seconds_total",
                                       "Time spent waiting for that server's replies.", labels, 1);
    }
    return 0;
}

int ps_client_server_lost(ps_client *c, int server, uint32_t epoch)
{
    if (server < 0 || server >= c->o.servers)
        return pf_err(-ERANGE, "server rank %d out of range (%d servers)", server, c->o.servers);
    uint32_t cur = atomic_load(&c->epoch);
    while (epoch > cur && !atomic_compare_exchange_weak(&c->epoch, &cur, epoch))
        ;
    /* Posts towards its endpoints give up now, so the training thread is not held in one until the timeout.
     */
    if (c->srv_known[server])
        fab_mark_peer_dead(c->fab, c->srv_addr[server]);
    const int b = sibling_target(c, server);
    if (c->o.replicas && c->srv_known[b])
        fab_mark_peer_dead(c->fab, c->srv_addr[b]);
    atomic_store(&c->lost_post[server], 1);
    atomic_store(&c->lost_any, 1);
    return 0;
}

void ps_client_set_rendezvous(ps_client *c, int present)
{
    if (atomic_exchange(&c->no_rendezvous, !present) == !present)
        return;
    /* Posts that cannot go out, probes unanswered and suspect copies are given up after an eighth of the
     * timeout while no rendezvous is left (see ps_client.h). */
    fab_set_timeout(c->fab, loss_timeout(c));
    if (!present)
        log_info("no rendezvous decides failovers now: a server unreachable or silent for %.1f s is taken as "
                 "lost (the run then re-forms from its checkpoint), not after %.1f s",
                 loss_timeout(c), c->timeout);
}

int ps_client_shard_without_copy(const ps_client *c)
{
    for (int s = 0; s < c->o.servers; s++) {
        int live = 0;
        for (int t = s; t < c->ntgt; t += c->o.servers)
            live |= !c->tgt_gone[t] && !c->srv_dead[t];
        if (!live)
            return s;
    }
    return -1;
}

int ps_client_check_copies(ps_client *c)
{
    if (!atomic_load(&c->no_rendezvous))
        return -1;
    take_lost(c); /* a server the control watcher found lost is retired first, not probed */
    const double now = pf_now_s();
    for (int t = 0; t < c->ntgt; t++)
        if (c->srv_known[t] && !c->srv_dead[t] && !c->tgt_gone[t] && !c->srv_probe[t])
            send_probe(c, t, now);
    c->last_check = 0; /* the probes' deadlines are checked now, not after CHECK_EVERY_S */
    if (progress(c, -1) < 0)
        return -1; /* a failed completion queue: the next request says so */
    return ps_client_shard_without_copy(c);
}

void ps_client_set_epoch(ps_client *c, uint32_t epoch)
{
    uint32_t cur = atomic_load(&c->epoch);
    while (epoch > cur && !atomic_compare_exchange_weak(&c->epoch, &cur, epoch))
        ;
}

int ps_client_server_back(ps_client *c, int server, const void *const addr[2], const size_t len[2],
                          uint32_t epoch)
{
    const int S = c->o.servers;
    if (server < 0 || server >= S || !c->o.replicas)
        return pf_err(-ERANGE, "server rank %d out of range (%d servers) or replicas off", server, S);
    /* Failovers posted meanwhile are taken at the next progress, after this: a server lost after this one
     * rejoined may leave a shard on this server's copies alone. */
    const int held[2] = {server, sibling_target(c, server)};
    for (int i = 0; i < 2; i++)
        if (!c->tgt_gone[held[i]] && !c->srv_dead[held[i]])
            return pf_err(-EEXIST, "server %d: copy %d was never removed from the run", server, i);
    for (int i = 0; i < 2; i++)
        for (uint32_t si = 0; si < c->nslots; si++)
            if (c->slots[si].in_use && c->slots[si].server == held[i])
                return pf_err(-EBUSY, "server %d: a message to its removed copy is still in flight", server);
    for (int i = 0; i < 2; i++) {
        const int t = held[i];
        fi_addr_t a;
        int rc = fab_av_insert(c->fab, addr[i], len[i], &a);
        if (rc < 0)
            return pf_err_wrap(rc, "server %d (rejoined, part %d)", server, i);
        fab_mark_peer_alive(c->fab, a);
        c->srv_addr[t] = a;
        c->srv_known[t] = 1;
        c->tgt_gone[t] = 0;
        c->tgt_suspect[t] = 0;
        c->srv_dead[t] = 0;
        free(c->srv_why[t]);
        c->srv_why[t] = NULL;
        c->srv_out[t] = 0;
        c->srv_heard[t] = pf_now_s();
    }
    c->route[server] = server; /* its primary serves shard `server` again: the same rows as the backup */
    ps_client_set_epoch(c, epoch);
    log_info(
        "server %d rejoined (epoch %u): shard %d is served by its primary again, and every push of shards "
        "%d and %d goes to both copies",
        server, epoch, server, server, (server + S - 1) % S);
    return 0;
}

uint32_t ps_client_epoch(const ps_client *c)
{
    return atomic_load(&((ps_client *)c)->epoch);
}

void ps_client_set_token(ps_client *c, uint64_t token)
{
    c->token = token;
}

void ps_client_set_borrow_grads(ps_client *c, int on)
{
    c->borrow_grads = on;
}

/* ---------- test hooks: built only into ps_client_hooks_lib (-DPFCPS_TEST_HOOKS) ---------- */
#ifdef PFCPS_TEST_HOOKS
#include "worker/ps_client_hooks.h"

/* A ps_raw message: the caller's bytes (cut to a receive buffer), with this request's req_id and, when the
 * header is whole and a token is set, the run's token written over theirs (a member's malformed message
 * carries the token; a stranger's would be dropped unanswered). */
static size_t raw_msg(const ps_client *c, const ps_req *r, uint8_t *buf, uint64_t req_id)
{
    size_t len = r->raw_len < c->msg_bytes ? r->raw_len : c->msg_bytes;
    memcpy(buf, r->raw, len);
    if (len >= offsetof(ps_hdr, req_id) + sizeof(req_id))
        memcpy(buf + offsetof(ps_hdr, req_id), &req_id, sizeof(req_id));
    if (len >= sizeof(ps_hdr) && c->token)
        memcpy(buf + offsetof(ps_hdr, token), &c->token, sizeof(c->token));
    return len;
}

int ps_raw(ps_client *c, int s, const void *msg, size_t len, double timeout_s)
{
    ps_req *r;
    int rc = simple_req(c, s, RQ_RAW, NULL, &r);
    if (rc < 0)
        return rc;
    if (!(r->raw = malloc(len ? len : 1))) {
        req_free(r);
        return pf_err(-ENOMEM, "out of memory");
    }
    memcpy(r->raw, msg, len);
    r->raw_len = len;
    return simple_run(c, r, timeout_s);
}
#endif
