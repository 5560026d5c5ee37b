/* Parameter server: request handling. Validates every pull, push, stat and checksum message (a bad one gets
 * an error reply naming the problem and changes nothing; one from outside the run is dropped and counted),
 * collects push chunks into complete pushes for the applies (apply.c), keeps the step clock that decides when
 * a reply may go (pss_reply_ready), and writes the replies (pss_reply_build) that the transport
 * (ps_server.c) sends. Progress thread only. See ps_server.h for the semantics and proto/ps_wire.h for the
 * messages. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "server/ps_server_internal.h"

/* A chunk buffer from the pool (allocated when the pool is empty), or NULL on out of memory. */
static chunk *chunk_get(ps_server *S)
{
    chunk *c = S->chunk_free;
    if (c) {
        S->chunk_free = c->next;
        return c;
    }
    const size_t D = (size_t)S->sh.dim;
    c = malloc(sizeof(chunk) + S->chunk_cap * (sizeof(int64_t) + D * sizeof(float)));
    if (c) {
        c->ids = (int64_t *)(c + 1);
        c->grads = (float *)(c->ids + S->chunk_cap);
    }
    return c;
}

static void chunk_put(ps_server *S, chunk *c)
{
    c->next = S->chunk_free;
    S->chunk_free = c;
}

/* A zeroed pending reply from the pool with room for chunk_cap ids, or NULL on out of memory. */
static pending *pend_get(ps_server *S)
{
    pending *p = S->pend_free;
    if (p)
        S->pend_free = p->next;
    else if ((p = malloc(sizeof *p)) && !(p->ids = malloc(S->chunk_cap * sizeof(int64_t)))) {
        free(p);
        p = NULL;
    }
    if (p) {
        int64_t *ids = p->ids;
        memset(p, 0, offsetof(pending, payload));
        p->ids = ids;
        p->payload_len = 0;
    }
    return p;
}

void pss_pend_put(ps_server *S, pending *p)
{
    p->next = S->pend_free;
    S->pend_free = p;
}

/* Returns a push's chunks to the pool and frees it. NULL is a no-op. */
void pss_free_push(ps_server *S, push *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->nchunks; i++)
        if (p->slot[i])
            chunk_put(S, p->slot[i]);
    free(p->slot);
    free(p);
}

/* A reply may be sent. A pull: not while an apply runs; then, local mode, once its step is within
 * max_staleness of the step clock; global mode, once its worker's own earlier pushes are applied
 * (read-your-writes). A push acknowledgement: see below. Errors, stat and checksum: at once. */
int pss_reply_ready(const ps_server *S, const pending *p)
{
    if (p->status == 0 && p->req.op == PS_OP_PUSH) {
        /* A push is acknowledged on receipt, but not while earlier steps lag behind: a push of step t once
         * steps_done >= t - 1 - max_staleness (local mode; with max_staleness 0, step t - 2 is applied) or
         * the worker's own applied steps >= t - 1 (global mode). So at most about two steps of pushes wait
         * for the apply threads, even from a worker that only pushes. */
        int64_t applied =
            S->o.global_mode ? S->applied_push[p->req.client] : S->steps_done + S->o.max_staleness;
        return p->req.step <= applied + 1;
    }
    if (p->status != 0 || p->req.op != PS_OP_PULL)
        return 1;
    if (S->applying)
        return 0; /* the apply threads are writing rows: gather after them */
    if (S->o.global_mode)
        return p->req.step <= S->applied_push[p->req.client];
    return p->req.step - S->o.max_staleness <= S->steps_done;
}

/* ---------- replies ---------- */

static void enqueue(ps_server *S, pending *p)
{
    S->queued++;
    p->next = NULL;
    if (S->pq_tail)
        S->pq_tail->next = p;
    else
        S->pq_head = p;
    S->pq_tail = p;
}

static void reply_error(ps_server *S, const ps_hdr *h, int code, const char *msg)
{
    S->st_bad++;
    log_warn("bad request from worker %d (op %u, step %lld): %s", h->client, h->op, (long long)h->step, msg);
    pending *p = pend_get(S);
    if (!p)
        return;
    p->req = *h;
    p->status = code;
    snprintf(p->msg, sizeof(p->msg), "server %d: %s", S->o.rank, msg);
    enqueue(S, p);
}

size_t pss_reply_build(const ps_server *S, const pending *p, uint8_t *buf, uint8_t **rows_at)
{
    ps_hdr h = p->req;
    h.op = PS_OP_REPLY;
    h.status = p->status;
    size_t len = sizeof(ps_hdr);
    *rows_at = NULL;
    if (p->status != 0) {
        size_t ml = strlen(p->msg) + 1;
        memcpy(buf + len, p->msg, ml);
        len += ml;
        h.n = 0;
    } else if (p->req.op == PS_OP_PULL) {
        *rows_at = buf + len;
        len += (size_t)p->req.n * S->sh.dim * ps_dtype_size(p->req.dtype);
    } else {
        memcpy(buf + len, p->payload, p->payload_len);
        len += p->payload_len;
    }
    h.epoch = atomic_load(&((ps_server *)S)->epoch);
    memcpy(buf, &h, sizeof(h));
    return len;
}

/* ---------- request handling ---------- */

static void handle_pull(ps_server *S, const ps_hdr *h, const uint8_t *payload, size_t plen)
{
    char msg[256];
    if (plen != (size_t)h->n * sizeof(int64_t)) {
        snprintf(msg, sizeof(msg), "pull of %u ids needs %zu payload bytes, got %zu (truncated or padded)",
                 h->n, (size_t)h->n * sizeof(int64_t), plen);
        return reply_error(S, h, -EPROTO, msg);
    }
    if (h->step < 0 || h->step > S->next_push[h->client]) {
        snprintf(msg, sizeof(msg),
                 "pull for step %lld is from the future: worker %d has pushed steps 0..%lld",
                 (long long)h->step, h->client, (long long)S->next_push[h->client] - 1);
        return reply_error(S, h, -ERANGE, msg);
    }
    pending *p = pend_get(S);
    if (!p)
        return reply_error(S, h, -ENOMEM, "out of memory queueing a pull");
    memcpy(p->ids, payload, plen); /* h->n <= rows per message <= chunk_cap: checked by pss_handle_msg */
    if (shard_check_ids(&S->sh, p->ids, h->n) < 0) {
        snprintf(msg, sizeof(msg), "%s", pf_errmsg());
        pss_pend_put(S, p);
        return reply_error(S, h, -ERANGE, msg);
    }
    p->req = *h;
    enqueue(S, p);
    metrics_set(S->m.staleness, h->step > S->steps_done ? (double)(h->step - S->steps_done) : 0.0);
}

/* Checks a push chunk's header against the payload size, the worker's step clock and the push in progress
 * (`cur`, may be NULL). Returns 0, or a negative code with the reason in msg[msglen]. */
static int push_check(const ps_server *S, const ps_hdr *h, size_t plen, const push *cur, char *msg,
                      size_t msglen)
{
    const int w = h->client;
    const size_t D = (size_t)S->sh.dim, dts = ps_dtype_size(h->dtype);
    size_t need = (size_t)h->n * (sizeof(int64_t) + D * dts);
    if (plen != need) {
        snprintf(msg, msglen, "push of %u rows (D=%zu, %zu-byte elements) needs %zu payload bytes, got %zu",
                 h->n, D, dts, need, plen);
        return -EPROTO;
    }
    if (h->nchunks == 0 || h->chunk >= h->nchunks) {
        snprintf(msg, msglen, "push chunk %u of %u is invalid", h->chunk, h->nchunks);
        return -EPROTO;
    }
    if (h->flags & ~(PS_PUSH_SNAPSHOT | PS_PUSH_SKIPPED)) {
        snprintf(msg, msglen, "push flags 0x%x has unknown bits", h->flags);
        return -EPROTO;
    }
    if (!isfinite(h->lr) || h->lr < 0) {
        snprintf(msg, msglen, "learning rate %g is not a finite non-negative number", (double)h->lr);
        return -EINVAL;
    }
    if (h->step != S->next_push[w]) {
        snprintf(msg, msglen, "push for step %lld but worker %d's next step is %lld (%s)", (long long)h->step,
                 w, (long long)S->next_push[w],
                 h->step > S->next_push[w] ? "step from the future" : "already pushed");
        return -ERANGE;
    }
    if (!S->o.global_mode && h->step > S->steps_in + S->o.max_staleness + 1) {
        /* A worker may push step t+1 before this server has every push of step t (it synchronised on
         * another server's pull), but never further ahead than that plus max_staleness. Pushes are
         * acknowledged on receipt and applied after, so the bound counts steps received, not applied. */
        snprintf(msg, msglen,
                 "push for step %lld is from the future: every worker's pushes are in for %lld steps "
                 "(%lld applied), max_staleness %d",
                 (long long)h->step, (long long)S->steps_in, (long long)S->steps_done, S->o.max_staleness);
        return -ERANGE;
    }
    if (cur && (cur->step != h->step || cur->nchunks != h->nchunks || cur->slot[h->chunk])) {
        snprintf(msg, msglen, "push chunk %u/%u of step %lld does not match the push in progress", h->chunk,
                 h->nchunks, (long long)h->step);
        return -EPROTO;
    }
    if (cur && cur->lr != h->lr) {
        snprintf(msg, msglen, "push chunks of one step carry different learning rates");
        return -EINVAL;
    }
    return 0;
}

/* Copies a checked chunk's ids out of the payload into a pooled chunk (ids then fp32 grads) and checks them
 * against the shard. Returns 0 with *out, or a negative code with the reason in msg[msglen]. */
static int chunk_new(ps_server *S, const ps_hdr *h, const uint8_t *payload, chunk **out, char *msg,
                     size_t msglen)
{
    chunk *c = chunk_get(S);
    if (!c) {
        snprintf(msg, msglen, "out of memory for a push of %u rows", h->n);
        return -ENOMEM;
    }
    c->n = h->n;
    /* h->n <= chunk_cap: checked by pss_handle_msg */
    memcpy(c->ids, payload, (size_t)h->n * sizeof(int64_t));
    if (shard_check_ids(&S->sh, c->ids, h->n) < 0) {
        snprintf(msg, msglen, "%s", pf_errmsg());
        chunk_put(S, c);
        return -ERANGE;
    }
    *out = c;
    return 0;
}

/* Converts the payload's gradients (after the n ids; fp32, fp16 or bf16 as h->dtype says) into c->grads. */
static void chunk_fill_grads(const ps_server *S, const ps_hdr *h, const uint8_t *payload, chunk *c)
{
    ps_rows_decode(c->grads, payload + (size_t)h->n * sizeof(int64_t), (size_t)h->n * (size_t)S->sh.dim,
                   h->dtype);
}

/* A new push in progress for the header's worker and step, registered in S->partial. Returns NULL on out of
 * memory. */
static push *push_start(ps_server *S, const ps_hdr *h)
{
    push *cur = calloc(1, sizeof(*cur));
    chunk **slot = cur ? calloc(h->nchunks, sizeof(chunk *)) : NULL;
    if (!cur || !slot) {
        free(cur), free(slot);
        return NULL;
    }
    cur->client = h->client;
    cur->step = h->step;
    cur->lr = h->lr;
    cur->snap = (h->flags & PS_PUSH_SNAPSHOT) != 0;
    cur->skipped = (h->flags & PS_PUSH_SKIPPED) != 0;
    cur->nchunks = h->nchunks;
    cur->slot = slot;
    S->partial[h->client] = cur;
    return cur;
}

/* Adds chunk c to the push in progress and acknowledges it (on receipt: a later pull of this worker waits at
 * the step clock for the apply, so read-your-writes holds); when it was the last chunk moves the push to
 * S->complete, where pss_try_apply finds it. */
static void push_add_chunk(ps_server *S, const ps_hdr *h, push *cur, chunk *c)
{
    const int w = h->client;
    cur->slot[h->chunk] = c;
    cur->got++;
    metrics_add(S->m.pushed_rows, h->n);
    cur->snap |= (h->flags & PS_PUSH_SNAPSHOT) != 0;
    pending *ack = pend_get(S);
    if (ack) {
        ack->req = *h;
        enqueue(S, ack);
    }
    if (cur->got == cur->nchunks) {
        S->partial[w] = NULL;
        cur->next = S->complete;
        S->complete = cur;
        S->ncomplete++;
        const int64_t was = S->next_push[w]++;
        pss_pushed_publish(S, w);
        if (was == S->steps_in) { /* applied by pss_try_apply after this batch's acks go out */
            int64_t m = S->next_push[0];
            for (int i = 1; i < S->o.workers; i++)
                m = S->next_push[i] < m ? S->next_push[i] : m;
            S->steps_in = m;
        }
    }
}

/* One push chunk: checked, copied, added to its worker's push in progress. A bad chunk gets an error reply
 * and discards the whole push of that step: nothing of it is ever applied. */
static void handle_push(ps_server *S, const ps_hdr *h, const uint8_t *payload, size_t plen)
{
    char msg[256];
    const int w = h->client;
    push *cur = S->partial[w];
    chunk *c = NULL;
    int code = push_check(S, h, plen, cur, msg, sizeof(msg));
    if (!code)
        code = chunk_new(S, h, payload, &c, msg, sizeof(msg));
    if (code) {
        if (cur && cur->step == h->step) {
            pss_free_push(S, cur);
            S->partial[w] = NULL;
        }
        return reply_error(S, h, code, msg);
    }
    chunk_fill_grads(S, h, payload, c);
    if (!cur && !(cur = push_start(S, h))) {
        chunk_put(S, c);
        return reply_error(S, h, -ENOMEM, "out of memory starting a push");
    }
    push_add_chunk(S, h, cur, c);
}

/* Counts a message dropped without an answer (in st_bad and in `reason`, one of the dropped-messages
 * series) and logs why, at most once a second (a flood of foreign messages costs a counter, not a log line
 * each). */
static void drop(ps_server *S, pf_metric *reason, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void drop(ps_server *S, pf_metric *reason, const char *fmt, ...)
{
    S->st_bad++;
    metrics_add(reason, 1);
    double now = pf_now_s();
    if (now - S->drop_log_t < 1.0) {
        S->drop_quiet++;
        return;
    }
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    log_warn("dropped a message: %s (%ld more dropped since the last such line; %lld bad requests in all)",
             why, S->drop_quiet, (long long)S->st_bad);
    S->drop_log_t = now;
    S->drop_quiet = 0;
}

void pss_handle_msg(ps_server *S, const uint8_t *buf, size_t len)
{
    ps_hdr h;
    if (len < sizeof(ps_hdr))
        return drop(S, S->m.dropped_malformed, "%zu bytes, shorter than the %zu-byte header", len,
                    sizeof(ps_hdr));
    memcpy(&h, buf, sizeof(h));
    if (S->o.token && h.token != S->o.token)
        return drop(S, S->m.dropped_unauth,
                    "wrong data-plane token (a peer outside this run, or a member of another run); "
                    "claimed worker rank %d",
                    h.client);
    if (h.client < 0 || h.client >= S->o.workers || !S->worker_known[h.client])
        return drop(S, S->m.dropped_unauth, "unknown worker rank %d (%d workers)", h.client, S->o.workers);
    if (h.epoch < atomic_load(&S->min_epoch))
        return drop(
            S, S->m.dropped_unauth,
            "worker %d's message of membership epoch %u, older than %u, the epoch this copy joined the run "
            "at (meant for the copy it replaces)",
            h.client, h.epoch, atomic_load(&S->min_epoch));
    /* A member of the run (it holds the token) at a newer membership epoch: a failover was announced that
     * this server's control plane has not told it yet. */
    ps_server_set_epoch(S, h.epoch);
    atomic_store(&S->last_rx, pf_now_s());
    char msg[256];
    const uint8_t *payload = buf + sizeof(ps_hdr);
    size_t plen = len - sizeof(ps_hdr);
    if (h.magic != PS_MAGIC || h.version != PS_VERSION) {
        snprintf(msg, sizeof(msg), "bad magic 0x%08x / version %u (want 0x%08x / %u)", h.magic, h.version,
                 PS_MAGIC, PS_VERSION);
        return reply_error(S, &h, -EPROTO, msg);
    }
    if (h.op == PS_OP_STAT || h.op == PS_OP_CHECKSUM) {
        pss_apply_drain(S); /* counters and table as of every push received before this request */
        pending *p = pend_get(S);
        if (!p)
            return;
        p->req = h;
        if (h.op == PS_OP_STAT) {
            if (h.flags & PS_STAT_DONE)
                atomic_store(&S->worker_done[h.client], 1);
            ps_stat st;
            ps_server_stat(S, &st);
            memcpy(p->payload, &st, sizeof(st));
            p->payload_len = sizeof(st);
        } else {
            uint64_t sum = shard_checksum_at(&S->sh, S->steps_done); /* dense: rows as after steps_done */
            memcpy(p->payload, &sum, sizeof(sum));
            p->payload_len = sizeof(sum);
        }
        p->req.n = 0;
        return enqueue(S, p);
    }
    if (h.op != PS_OP_PULL && h.op != PS_OP_PUSH) {
        snprintf(msg, sizeof(msg), "unknown op %u", h.op);
        return reply_error(S, &h, -EPROTO, msg);
    }
    if (h.dim != (uint32_t)S->sh.dim) {
        snprintf(msg, sizeof(msg), "dimension mismatch: request has D=%u, table has D=%d", h.dim, S->sh.dim);
        return reply_error(S, &h, -EINVAL, msg);
    }
    if (!ps_dtype_valid(h.dtype)) {
        snprintf(msg, sizeof(msg), "wire dtype %u is not fp32 (0), fp16 (1) or bf16 (2)", h.dtype);
        return reply_error(S, &h, -EINVAL, msg);
    }
    if (h.n > ps_wire_rows_per_msg(h.dim, h.dtype)) {
        snprintf(msg, sizeof(msg), "%u rows in one message exceed the limit %u", h.n,
                 ps_wire_rows_per_msg(h.dim, h.dtype));
        return reply_error(S, &h, -EINVAL, msg);
    }
    if (h.op == PS_OP_PULL)
        handle_pull(S, &h, payload, plen);
    else
        handle_push(S, &h, payload, plen);
}

void ps_server_stat(ps_server *S, ps_stat *st)
{
    memset(st, 0, sizeof(*st));
    st->steps_done = S->steps_done;
    st->num_classes = S->sh.num_classes;
    st->rank = S->o.rank;
    st->servers = S->o.servers;
    st->dim = S->sh.dim;
    st->workers = S->o.workers;
    st->local_rows = S->sh.rows;
    st->pushes_applied = S->st_pushes;
    st->rows_applied = S->st_rows;
    st->rows_pulled = S->st_pulled;
    st->rows_pulled_par = S->st_par_rows;
    st->bad_requests = S->st_bad;
    st->table_bytes = (int64_t)S->sh.bytes + 9 * S->sh.rows; /* + the row states and apply bookkeeping */
    for (int w = 0; S->partial && w < S->o.workers; w++)
        if (S->partial[w])
            st->partial_chunks += S->partial[w]->got;
}

int pss_request_init(ps_server *S)
{
    const int W = S->o.workers;
    S->worker_addr = calloc(W, sizeof(fi_addr_t));
    S->worker_known = calloc(W, 1);
    S->worker_done = calloc(W, 1);
    S->next_push = calloc(W, sizeof(int64_t));
    S->applied_push = calloc(W, sizeof(int64_t));
    S->partial = calloc(W, sizeof(push *));
    if (!S->worker_addr || !S->worker_known || !S->worker_done || !S->next_push || !S->applied_push || !S->partial)
        return pf_err(-ENOMEM, "out of memory for %d workers' state", W);
    /* The most rows one message can carry (2-byte wire elements pack the most). */
    S->chunk_cap = ps_wire_rows_per_msg((uint32_t)S->o.dim, PS_DT_FP16);
    if (ps_wire_rows_per_msg((uint32_t)S->o.dim, PS_DT_FP32) > S->chunk_cap)
        S->chunk_cap = ps_wire_rows_per_msg((uint32_t)S->o.dim, PS_DT_FP32);
    S->snap_at = -1;
    S->snap_left = -1;
    S->steps_done = S->o.start_step;
    for (int w = 0; w < W; w++)
        S->next_push[w] = S->applied_push[w] = S->o.start_step;
    S->steps_in = S->o.start_step;
    return 0;
}

void pss_request_free(ps_server *S)
{
    for (push *p = S->complete; p;) {
        push *nx = p->next;
        pss_free_push(S, p);
        p = nx;
    }
    if (S->partial)
        for (int w = 0; w < S->o.workers; w++)
            pss_free_push(S, S->partial[w]);
    pending *lists[2] = {S->pq_head, S->pend_free};
    for (int l = 0; l < 2; l++)
        for (pending *p = lists[l]; p;) {
            pending *nx = p->next;
            free(p->ids);
            free(p);
            p = nx;
        }
    for (chunk *c = S->chunk_free; c;) {
        chunk *nx = c->next;
        free(c);
        c = nx;
    }
    free(S->worker_addr);
    free(S->worker_known);
    free((void *)S->worker_done);
    free(S->next_push);
    free(S->applied_push);
    free(S->partial);
}
