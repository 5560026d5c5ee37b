/* Parameter-server service: progress thread, request validation, step clock, multi-threaded apply.
 * See ps_server.h for the semantics and ps_wire.h for the messages. */
#include "server/ps_server.h"

#include <math.h>
#include <stdarg.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/fabric.h"
#include "common/log.h"
#include "server/snapshot.h"

enum { CTX_RECV = 1, CTX_SEND = 2 };

typedef struct buf_ctx {
    int kind;
    int idx;
} buf_ctx;

/* One received push message, copied out of the receive buffer (ids then fp32 grads) into a buffer of the
 * server's chunk pool (room for the most rows a message may carry, chunk_cap). */
typedef struct chunk {
    struct chunk *next;
    uint32_t n;
    int64_t *ids;
    float *grads;
} chunk;

/* One worker's push for one step, possibly still missing chunks. */
typedef struct push {
    struct push *next;
    int client;
    int64_t step;
    float lr;
    int snap; /* PS_PUSH_SNAPSHOT was set */
    uint16_t nchunks, got;
    chunk **slot; /* [nchunks]: chunk i, or NULL until it came */
} push;

/* One pull reply of a batch being gathered (serve_pending): its rows are gathered in pieces of
 * gpiece_rows rows by the progress thread and the apply threads together. */
typedef struct gjob {
    const int64_t *ids;
    uint8_t *dst; /* the reply's rows in the send buffer */
    uint32_t n, dtype;
    uint32_t first, pieces; /* its pieces are first .. first + pieces - 1 of the batch */
    atomic_uint done;       /* pieces gathered */
} gjob;

/* One reply of the batch serve_pending sends. */
typedef struct sitem {
    struct pending *p;
    int buf;
    size_t len;
    int job; /* index in S->gj, or -1 (nothing to gather) */
} sitem;

enum { AK_APPLY = 0, AK_GATHER = 1 };

/* A reply waiting to be sent: pulls wait for their step; everything waits for a free send buffer. */
typedef struct pending {
    struct pending *next;
    ps_hdr req;
    int32_t status;
    char msg[256];
    int64_t *ids;         /* pull: req.n ids (room for chunk_cap, owned by the pending) */
    uint8_t payload[128]; /* stat / checksum */
    size_t payload_len;
} pending;

/* One row's gradient in a step's apply. Entries of one row are chained (next, in worker order, then chunk and
 * row order within a worker's push); the first entry of each row is listed in the apply's segment array. */
typedef struct entry {
    int64_t lrow;
    const float *g;
    float lr;
    uint32_t next; /* next entry of the same row, or ENTRY_END */
} entry;
#define ENTRY_END UINT32_MAX

struct ps_server {
    ps_server_opts o;
    shard sh;
    fab_ctx *fab;
    fab_mr mr_table, mr_recv, mr_send;
    size_t msg_bytes;
    int nrecv, nsend;
    uint8_t *recv_mem, *send_mem;
    buf_ctx *recv_ctx, *send_ctx;
    int *send_free, nsend_free;
    fi_addr_t *worker_addr;
    uint8_t *worker_known;
    int64_t *next_push;    /* per worker: steps pushed completely */
    int64_t steps_in;      /* min over workers of next_push: steps whose W pushes are all received */
    int64_t *applied_push; /* per worker: steps whose push was applied */
    snap_job *snap;        /* the snapshot being written, or NULL */
    int64_t snap_at;       /* global mode: checkpoint step asked for and not yet started, or -1 */
    push **partial;        /* per worker: push being received */
    push *complete;        /* complete pushes waiting for their step */
    int64_t steps_done;
    pending *pq_head, *pq_tail;
    atomic_llong st_pushes, st_rows, st_bad, st_pulled;
    double drop_log_t; /* rate limit of the "dropped" warnings: last one logged */
    long drop_quiet;   /* drops not logged since */
    pthread_t progress;
    int started;
    atomic_int stop;
    /* apply pool */
    pthread_mutex_t am;
    pthread_cond_t a_go, a_done;
    pthread_t *athreads;
    int nathreads;
    uint64_t agen;
    int aremaining, aquit;
    entry *ae;        /* [acap]: the step's entries */
    uint32_t *aseg;   /* [acap]: first entry of each row to update */
    size_t anseg, acap;
    uint32_t *amark;  /* [local rows]: apply generation that last saw the row */
    uint32_t *ahead;  /* [local rows]: first entry of the row in that apply */
    uint32_t agen_rows;
    /* pools: nothing is allocated per message once a step's worth of buffers exists */
    size_t chunk_cap; /* rows a pooled chunk (and a pending's ids) holds: the most any message carries */
    chunk *chunk_free;
    pending *pend_free;
    push **aps; /* [workers]: the pushes of the step being applied */
    int aps_n;  /* how many */
    /* the pool's current generation: AK_APPLY (apply_start) or AK_GATHER (a batch of pull replies) */
    int akind;
    /* gathers: the batch's pull replies and the claim word, (batch & 0xffff) << 48 | pieces << 24 | next
     * piece; a thread claims a piece by incrementing it while the batch and the count still match */
    gjob *gj;
    sitem *sb;
    int ngj;
    uint32_t gpiece_rows, gbatch; /* gbatch: the progress thread's own count */
    uint32_t gbatch_wake;         /* the batch the apply threads were last woken for (under am) */
    _Atomic uint64_t gclaim;
    atomic_llong st_par_rows; /* rows gathered by the apply threads (the rest by the progress thread) */
    int applying;       /* an apply's threads are running (apply_start .. apply_finish) */
    int64_t apply_t;    /* the step being applied */
    int apply_snap;     /* local mode: a push of it asked for a snapshot */
};

/* ---------- apply pool ---------- */

typedef struct apply_arg {
    ps_server *srv;
    int idx;
} apply_arg;

/* Sums g (D doubles) += the D floats at x. */
static void add_grad(double *restrict g, const float *restrict x, int D)
{
    for (int j = 0; j < D; j++)
        g[j] += (double)x[j];
}

/* Updates the rows of segments [s_lo, s_hi): one gradient is applied as it is, several are summed in double
 * in chain order (worker, then chunk, then row order) first, so the result never depends on the threads. */
static void apply_segments(ps_server *S, size_t s_lo, size_t s_hi, double *g)
{
    const int D = S->sh.dim;
    const size_t ahead = (size_t)shard_prefetch_rows(D);
    for (size_t s = s_lo; s < s_hi; s++) {
        const entry *e0 = &S->ae[S->aseg[s]];
        if (s + ahead < s_hi) {
            /* A later row's weight and momentum are at random places in the table: start loading them
             * (address arithmetic only; shard_row below still does the on-demand generation). */
            const int64_t r = S->ae[S->aseg[s + ahead]].lrow;
            const size_t off = (size_t)r * (size_t)D;
            shard_prefetch_row(S->sh.weight + off, D, 1);
            shard_prefetch_row(S->sh.momentum + off, D, 1);
            __builtin_prefetch(&S->sh.ready[r], 0, 0);
        }
        if (S->snap)
            snap_before_update(S->snap, e0->lrow);
        float *w = shard_row(&S->sh, e0->lrow);
        float *v = S->sh.momentum + (w - S->sh.weight);
        if (e0->next == ENTRY_END) {
            shard_sgd_row_f32(w, v, e0->g, D, e0->lr, S->o.momentum, S->o.weight_decay);
            continue;
        }
        memset(g, 0, sizeof(double) * (size_t)D);
        for (uint32_t e = S->aseg[s]; e != ENTRY_END; e = S->ae[e].next)
            add_grad(g, S->ae[e].g, D);
        shard_sgd_row(w, v, g, D, e0->lr, S->o.momentum, S->o.weight_decay);
    }
}

/* Claims pieces of gather batch `batch` one at a time (lowest first) and gathers their rows, until none is left
 * or job `until`'s pieces are all claimed (UINT32_MAX: until none is left). A claim is a compare-and-swap on
 * S->gclaim that also checks the batch, so a thread that woke for an earlier batch claims nothing of a later
 * one it did not read. The batch's jobs stay put until every piece is gathered (serve_pending waits for
 * that). Returns the rows this call gathered. */
static long long gather_pieces(ps_server *S, uint32_t batch, uint32_t until)
{
    long long rows = 0;
    for (;;) {
        uint64_t v = atomic_load_explicit(&S->gclaim, memory_order_acquire), nv;
        uint32_t piece;
        do {
            uint32_t total = (uint32_t)(v >> 24) & 0xffffffu;
            piece = (uint32_t)v & 0xffffffu;
            if ((uint32_t)(v >> 48) != (batch & 0xffffu) || piece >= total)
                return rows;
            nv = v + 1;
        } while (!atomic_compare_exchange_weak_explicit(&S->gclaim, &v, nv, memory_order_acq_rel,
                                                        memory_order_acquire));
        /* The job holding the piece: jobs are in piece order. */
        int lo = 0, hi = S->ngj - 1;
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (S->gj[mid].first <= piece)
                lo = mid;
            else
                hi = mid - 1;
        }
        gjob *j = &S->gj[lo];
        const uint32_t r0 = (piece - j->first) * S->gpiece_rows;
        const uint32_t n = j->n - r0 < S->gpiece_rows ? j->n - r0 : S->gpiece_rows;
        const size_t rb = (size_t)S->sh.dim * ps_dtype_size(j->dtype);
        shard_gather(&S->sh, j->ids + r0, n, j->dtype, j->dst + (size_t)r0 * rb);
        atomic_fetch_add_explicit(&j->done, 1, memory_order_release);
        rows += n;
        if (until != UINT32_MAX && piece + 1 >= S->gj[until].first + S->gj[until].pieces)
            return rows;
    }
}

static void *apply_main(void *arg)
{
    apply_arg *a = arg;
    ps_server *S = a->srv;
    double *g = malloc(sizeof(double) * (size_t)S->sh.dim);
    uint64_t seen = 0;
    pthread_mutex_lock(&S->am);
    for (;;) {
        while (!S->aquit && S->agen == seen)
            pthread_cond_wait(&S->a_go, &S->am);
        if (S->aquit)
            break;
        seen = S->agen;
        if (S->akind == AK_GATHER) {
            uint32_t batch = S->gbatch_wake;
            pthread_mutex_unlock(&S->am);
            long long rows = gather_pieces(S, batch, UINT32_MAX);
            atomic_fetch_add_explicit(&S->st_par_rows, rows, memory_order_relaxed);
            pthread_mutex_lock(&S->am);
            continue; /* no count-down: the progress thread waits for the pieces, not the threads */
        }
        size_t n = S->anseg, T = (size_t)S->nathreads;
        pthread_mutex_unlock(&S->am);
        if (g)
            apply_segments(S, n * (size_t)a->idx / T, n * ((size_t)a->idx + 1) / T, g);
        pthread_mutex_lock(&S->am);
        if (--S->aremaining == 0)
            pthread_cond_signal(&S->a_done);
    }
    pthread_mutex_unlock(&S->am);
    free(g);
    free(a);
    return NULL;
}

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

static void pend_put(ps_server *S, pending *p)
{
    p->next = S->pend_free;
    S->pend_free = p;
}

/* Returns a push's chunks to the pool and frees it. NULL is a no-op. */
static void free_push(ps_server *S, push *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->nchunks; i++)
        if (p->slot[i])
            chunk_put(S, p->slot[i]);
    free(p->slot);
    free(p);
}

/* Grows the apply's entry and segment arrays to hold n rows. Returns 0 or -ENOMEM. */
static int apply_reserve(ps_server *S, size_t n)
{
    if (n <= S->acap)
        return 0;
    if (n >= ENTRY_END)
        return -ENOMEM;
    size_t cap = n + n / 4;
    if (cap >= ENTRY_END)
        cap = ENTRY_END - 1;
    entry *e = realloc(S->ae, sizeof(entry) * cap);
    if (e)
        S->ae = e;
    uint32_t *seg = e ? realloc(S->aseg, sizeof(uint32_t) * cap) : NULL;
    if (seg)
        S->aseg = seg;
    if (!e || !seg)
        return -ENOMEM;
    S->acap = cap;
    return 0;
}

static void snap_begin(ps_server *S, int64_t step);
static int64_t min_applied(const ps_server *S);

/* Starts applying every push of step t held in S->complete (summing gradients per row, in worker order).
 * Rows are grouped without sorting: entries are visited last to first and each is put at the front of its
 * row's chain (amark/ahead, one stamp per local row), so a chain lists the row's gradients in worker order,
 * then chunk and row order within a push. The apply threads update the rows while the progress thread goes
 * on receiving (no gather runs meanwhile: serve_pending holds pulls while S->applying); apply_finish, once
 * they are done, frees the pushes. Without apply threads (ps_server_inject) the rows are updated here.
 * Returns the number of rows being updated, or -ENOMEM (nothing started, pushes kept). */
static long apply_start(ps_server *S, int64_t t)
{
    push **ps = S->aps; /* at most one push per worker and step */
    int np = 0;
    size_t nrows = 0;
    for (push *p = S->complete; p; p = p->next)
        if (p->step == t && np < S->o.workers) {
            ps[np++] = p;
            for (int i = 0; i < p->nchunks; i++)
                nrows += p->slot[i]->n; /* complete: every slot is filled */
        }
    if (apply_reserve(S, nrows) < 0) {
        log_error("apply of step %lld: out of memory for %zu rows", (long long)t, nrows);
        return -ENOMEM;
    }
    /* Worker order (insertion sort: W pushes). */
    for (int i = 1; i < np; i++)
        for (int j = i; j > 0 && ps[j - 1]->client > ps[j]->client; j--) {
            push *x = ps[j];
            ps[j] = ps[j - 1];
            ps[j - 1] = x;
        }
    /* Entries in worker, chunk, row order. */
    size_t k = 0;
    for (int i = 0; i < np; i++)
        for (int ci = 0; ci < ps[i]->nchunks; ci++) {
            const chunk *c = ps[i]->slot[ci];
            for (uint32_t r = 0; r < c->n; r++)
                S->ae[k++] = (entry){c->ids[r] / S->sh.servers, c->grads + (size_t)r * S->sh.dim, ps[i]->lr,
                                     ENTRY_END};
        }
    if (++S->agen_rows == 0) { /* the stamps wrapped: start them again */
        memset(S->amark, 0, sizeof(uint32_t) * (size_t)(S->sh.rows ? S->sh.rows : 1));
        S->agen_rows = 1;
    }
    const uint32_t gen = S->agen_rows;
    for (size_t i = k; i-- > 0;) {
        int64_t r = S->ae[i].lrow;
        if (S->amark[r] != gen) {
            S->amark[r] = gen;
            S->ae[i].next = ENTRY_END;
        } else {
            S->ae[i].next = S->ahead[r];
        }
        S->ahead[r] = (uint32_t)i;
    }
    /* Segments: each row's first entry, found where the stamp pass left the chain heads. */
    size_t nseg = 0;
    for (size_t i = 0; i < k; i++)
        if (S->ahead[S->ae[i].lrow] == (uint32_t)i)
            S->aseg[nseg++] = (uint32_t)i;
    S->anseg = nseg;
    S->aps_n = np;
    S->apply_t = t;
    S->applying = 1;
    if (S->nathreads == 0) {
        /* Not started (ps_server_inject): apply on this thread. */
        double *g = malloc(sizeof(double) * (size_t)S->sh.dim);
        if (g)
            apply_segments(S, 0, nseg, g);
        free(g);
    } else {
        pthread_mutex_lock(&S->am);
        S->akind = AK_APPLY;
        S->aremaining = S->nathreads;
        S->agen++;
        pthread_cond_broadcast(&S->a_go);
        pthread_mutex_unlock(&S->am);
    }
    return (long)nseg;
}

/* The running apply's threads are done (or none runs). Taking the mutex the threads count down under also
 * makes their row writes visible to this thread. */
static int apply_idle(ps_server *S)
{
    if (!S->applying)
        return 1;
    pthread_mutex_lock(&S->am);
    int done = S->aremaining == 0;
    pthread_mutex_unlock(&S->am);
    return done;
}

/* Waits up to ns nanoseconds for the running apply's threads to finish (returns at once when they have). */
static void apply_wait_for(ps_server *S, long ns)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl); /* the condition variable's clock */
    dl.tv_nsec += ns;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&S->am);
    if (S->aremaining > 0)
        pthread_cond_timedwait(&S->a_done, &S->am, &dl);
    pthread_mutex_unlock(&S->am);
}

/* Once apply_idle said the apply threads are done: frees the applied pushes and counts them; advances the
 * step clock and (local mode) starts a snapshot the step asked for. */
static void apply_finish(ps_server *S)
{
    for (int i = 0; i < S->aps_n; i++) {
        push **pp = &S->complete;
        while (*pp && *pp != S->aps[i])
            pp = &(*pp)->next;
        if (*pp)
            *pp = S->aps[i]->next;
        if (S->applied_push[S->aps[i]->client] < S->apply_t + 1)
            S->applied_push[S->aps[i]->client] = S->apply_t + 1;
        free_push(S, S->aps[i]);
        S->st_pushes++;
    }
    S->st_rows += (long long)S->anseg;
    S->applying = 0;
    if (S->o.global_mode) {
        S->steps_done = min_applied(S);
    } else {
        S->steps_done = S->apply_t + 1;
        log_debug("step %lld applied: %zu rows from %d pushes", (long long)S->apply_t, S->anseg, S->aps_n);
        if (S->apply_snap)
            snap_begin(S, S->apply_t + 1);
    }
    S->aps_n = 0;
}

/* Waits for the snapshot in progress (if any), logs its outcome and prunes older ones. */
static void snap_wait(ps_server *S)
{
    if (!S->snap)
        return;
    int64_t step = snap_step(S->snap);
    int rc = snap_finish(S->snap);
    S->snap = NULL;
    if (rc == 0)
        snap_prune(S->o.snapshot_root, S->o.rank, S->o.snapshot_keep > 0 ? S->o.snapshot_keep : 2, step);
}

/* Starts checkpoint `step` of the shard (after waiting for the previous one). Nothing changes the table while
 * this runs: it is called between applies, on the thread that applies. */
static void snap_begin(ps_server *S, int64_t step)
{
    if (!S->o.snapshot_root) {
        log_warn("step %lld: a worker asked for a snapshot but this server has no snapshot folder",
                 (long long)step);
        return;
    }
    if (S->snap) {
        log_warn("snapshot step %lld is still being written: step %lld's waits for it",
                 (long long)snap_step(S->snap), (long long)step);
        snap_wait(S);
    }
    if (snap_start(&S->sh, S->o.snapshot_root, step, &S->snap) < 0)
        log_error("snapshot step %lld not started: %s (earlier snapshots are untouched; serving on)",
                  (long long)step, pf_errmsg());
}

/* Global mode: the slowest worker's count of applied steps. */
static int64_t min_applied(const ps_server *S)
{
    int64_t m = S->applied_push[0];
    for (int w = 1; w < S->o.workers; w++)
        if (S->applied_push[w] < m)
            m = S->applied_push[w];
    return m;
}

/* Runs on the progress thread after every batch of messages (and from apply_drain). Finishes the running
 * apply once its threads are done and returns 1, so the caller serves the pulls that waited for it before
 * the next apply starts; otherwise starts the next apply that is ready and returns 0. Local mode (BSP/SSP):
 * the oldest step whose W pushes are all in, and a snapshot after a step flagged PS_PUSH_SNAPSHOT (started
 * by apply_finish). Global mode: every complete push of the oldest step that has one (so each worker's
 * pushes apply in step order), except that while a snapshot of step T is asked for and not begun, pushes of
 * steps >= T wait until every worker's steps < T are applied; steps_done is the slowest worker's count of
 * applied steps. */
static int try_apply(ps_server *S)
{
    if (S->applying) {
        if (!apply_idle(S))
            return 0;
        apply_finish(S);
        return 1;
    }
    if (S->o.global_mode) {
        S->steps_done = min_applied(S);
        if (S->snap_at >= 0 && S->steps_done >= S->snap_at) {
            int64_t at = S->snap_at;
            S->snap_at = -1;
            snap_begin(S, at);
        }
        push *p = NULL;
        for (push *q = S->complete; q; q = q->next)
            if (!(S->snap_at >= 0 && q->step >= S->snap_at) && (!p || q->step < p->step))
                p = q;
        if (!p)
            return 0;
        if (p->snap && S->snap_at < p->step + 1)
            S->snap_at = p->step + 1;
        apply_start(S, p->step); /* out of memory: the pushes stay; the next call retries */
        return 0;
    }
    int64_t t = S->steps_done;
    int count = 0, snap = 0;
    for (push *p = S->complete; p; p = p->next)
        if (p->step == t) {
            count++;
            snap |= p->snap;
        }
    if (count < S->o.workers)
        return 0;
    S->apply_snap = snap;
    apply_start(S, t); /* out of memory: the step stays pending; the next call retries */
    return 0;
}

/* Applies every step that is ready, waiting for each (a stat or checksum then sees a quiet table; a stopping
 * server loses no acknowledged push). */
static void apply_drain(ps_server *S)
{
    for (;;) {
        if (S->applying) {
            while (!apply_idle(S))
                apply_wait_for(S, 200000);
            try_apply(S); /* finishes it */
            continue;
        }
        try_apply(S); /* starts the next one, if any */
        if (!S->applying)
            return;
    }
}

/* A reply may be sent. A pull: not while an apply runs; then, local mode, once its step is within
 * max_staleness of the step clock; global mode, once its worker's own earlier pushes are applied
 * (read-your-writes). A push acknowledgement: see below. Errors, stat and checksum: at once. */
static int reply_ready(const ps_server *S, const pending *p)
{
    if (p->status == 0 && p->req.op == PS_OP_PUSH) {
        /* A push is acknowledged on receipt, but not while earlier steps lag behind: a push of step t once
         * steps_done >= t - 1 - max_staleness (local mode; with max_staleness 0, step t - 2 is applied) or
         * the worker's own applied steps >= t - 1 (global mode). So at most about two steps of pushes wait
         * for the apply threads, even from a worker that only pushes. */
        int64_t applied = S->o.global_mode ? S->applied_push[p->req.client] : S->steps_done + S->o.max_staleness;
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

/* Gathers the rows of the batch's S->ngj pull replies (S->gj) and sends the batch's nb replies (S->sb) in
 * order. The rows are cut into pieces of about 64 KiB; the apply threads (idle: pulls are not served while an
 * apply runs) are woken to claim pieces alongside this thread, which sends each reply as soon as its pieces
 * are gathered and claims more pieces meanwhile (it waits only for a piece another thread already claimed).
 * A server's gathers thus use all its apply threads, as its applies do; for one piece, or before the threads
 * are started, this thread gathers alone. */
static void send_batch(ps_server *S, int nb)
{
    uint32_t pieces = 0;
    for (int j = 0; j < S->ngj; j++) {
        gjob *g = &S->gj[j];
        g->first = pieces;
        g->pieces = (g->n + S->gpiece_rows - 1) / S->gpiece_rows;
        S->st_pulled += g->n;
        atomic_store_explicit(&g->done, 0, memory_order_relaxed);
        pieces += g->pieces;
    }
    const uint32_t batch = ++S->gbatch;
    atomic_store_explicit(&S->gclaim, (uint64_t)(batch & 0xffffu) << 48 | (uint64_t)pieces << 24,
                          memory_order_release);
    if (pieces > 1 && S->nathreads > 0) {
        pthread_mutex_lock(&S->am);
        S->akind = AK_GATHER;
        S->gbatch_wake = batch;
        S->agen++;
        pthread_cond_broadcast(&S->a_go);
        pthread_mutex_unlock(&S->am);
    }
    for (int i = 0; i < nb; i++) {
        sitem *it = &S->sb[i];
        if (it->job >= 0) {
            gjob *g = &S->gj[it->job];
            gather_pieces(S, batch, (uint32_t)it->job); /* claims up to its last piece */
            while (atomic_load_explicit(&g->done, memory_order_acquire) < g->pieces)
                sched_yield(); /* a piece an apply thread claimed is being gathered */
        }
        pending *p = it->p;
        uint8_t *buf = S->send_mem + (size_t)it->buf * S->msg_bytes;
        int rc = fab_send(S->fab, S->worker_addr[p->req.client], buf, it->len, &S->mr_send, &S->send_ctx[it->buf]);
        if (rc < 0) {
            log_error("reply to worker %d: %s", p->req.client, pf_errmsg());
            S->send_free[S->nsend_free++] = it->buf;
        }
        pend_put(S, p);
    }
}

/* Sends every ready reply while send buffers are free (a batch at a time: send_batch). */
static void serve_pending(ps_server *S)
{
    pending **pp = &S->pq_head, *prev = NULL;
    int nb = 0;
    S->ngj = 0;
    while (*pp && S->nsend_free > 0) {
        pending *p = *pp;
        if (!reply_ready(S, p)) {
            prev = p;
            pp = &p->next;
            continue; /* waits for its step */
        }
        int b = S->send_free[--S->nsend_free];
        uint8_t *buf = S->send_mem + (size_t)b * S->msg_bytes;
        ps_hdr h = p->req;
        h.op = PS_OP_REPLY;
        h.status = p->status;
        size_t len = sizeof(ps_hdr);
        int job = -1;
        if (p->status != 0) {
            size_t ml = strlen(p->msg) + 1;
            memcpy(buf + len, p->msg, ml);
            len += ml;
            h.n = 0;
        } else if (p->req.op == PS_OP_PULL) {
            job = S->ngj++;
            S->gj[job].ids = p->ids;
            S->gj[job].dst = buf + len;
            S->gj[job].n = p->req.n;
            S->gj[job].dtype = p->req.dtype;
            len += (size_t)p->req.n * S->sh.dim * ps_dtype_size(p->req.dtype);
        } else {
            memcpy(buf + len, p->payload, p->payload_len);
            len += p->payload_len;
        }
        memcpy(buf, &h, sizeof(h));
        S->sb[nb++] = (sitem){p, b, len, job};
        *pp = p->next;
        if (S->pq_tail == p)
            S->pq_tail = prev;
    }
    if (nb > 0)
        send_batch(S, nb);
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
    memcpy(p->ids, payload, plen); /* h->n <= rows per message <= chunk_cap: checked by handle_msg */
    if (shard_check_ids(&S->sh, p->ids, h->n) < 0) {
        snprintf(msg, sizeof(msg), "%s", pf_errmsg());
        pend_put(S, p);
        return reply_error(S, h, -ERANGE, msg);
    }
    p->req = *h;
    enqueue(S, p);
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
    if (h->flags & ~PS_PUSH_SNAPSHOT) {
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
    memcpy(c->ids, payload, (size_t)h->n * sizeof(int64_t)); /* h->n <= chunk_cap: checked by handle_msg */
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
    const uint8_t *gsrc = payload + (size_t)h->n * sizeof(int64_t);
    size_t ne = (size_t)h->n * (size_t)S->sh.dim;
    if (h->dtype == PS_DT_FP32)
        memcpy(c->grads, gsrc, ne * sizeof(float));
    else {
        for (size_t i = 0; i < ne; i++) {
            uint16_t x;
            memcpy(&x, gsrc + 2 * i, 2);
            c->grads[i] = h->dtype == PS_DT_FP16 ? ps_f16_to_f32(x) : ps_bf16_to_f32(x);
        }
    }
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
    cur->nchunks = h->nchunks;
    cur->slot = slot;
    S->partial[h->client] = cur;
    return cur;
}

/* Adds chunk c to the push in progress and acknowledges it (on receipt: a later pull of this worker waits at
 * the step clock for the apply, so read-your-writes holds); when it was the last chunk moves the push to
 * S->complete, where try_apply finds it. */
static void push_add_chunk(ps_server *S, const ps_hdr *h, push *cur, chunk *c)
{
    const int w = h->client;
    cur->slot[h->chunk] = c;
    cur->got++;
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
        if (S->next_push[w]++ == S->steps_in) { /* applied by try_apply after this batch's acks go out */
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
            free_push(S, cur);
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

/* Counts a message dropped without an answer and logs why, at most once a second (a flood of foreign
 * messages costs a counter, not a log line each). */
static void drop(ps_server *S, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void drop(ps_server *S, const char *fmt, ...)
{
    S->st_bad++;
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

static void handle_msg(ps_server *S, const uint8_t *buf, size_t len)
{
    ps_hdr h;
    if (len < sizeof(ps_hdr))
        return drop(S, "%zu bytes, shorter than the %zu-byte header", len, sizeof(ps_hdr));
    memcpy(&h, buf, sizeof(h));
    if (S->o.token && h.token != S->o.token)
        return drop(S,
                    "wrong data-plane token (a peer outside this run, or a member of another run); "
                    "claimed worker rank %d",
                    h.client);
    if (h.client < 0 || h.client >= S->o.workers || !S->worker_known[h.client])
        return drop(S, "unknown worker rank %d (%d workers)", h.client, S->o.workers);
    char msg[256];
    const uint8_t *payload = buf + sizeof(ps_hdr);
    size_t plen = len - sizeof(ps_hdr);
    if (h.magic != PS_MAGIC || h.version != PS_VERSION) {
        snprintf(msg, sizeof(msg), "bad magic 0x%08x / version %u (want 0x%08x / %u)", h.magic, h.version,
                 PS_MAGIC, PS_VERSION);
        return reply_error(S, &h, -EPROTO, msg);
    }
    if (h.op == PS_OP_STAT || h.op == PS_OP_CHECKSUM) {
        apply_drain(S); /* counters and table as of every push received before this request */
        pending *p = pend_get(S);
        if (!p)
            return;
        p->req = h;
        if (h.op == PS_OP_STAT) {
            ps_stat st;
            ps_server_stat(S, &st);
            memcpy(p->payload, &st, sizeof(st));
            p->payload_len = sizeof(st);
        } else {
            uint64_t sum = shard_checksum(&S->sh);
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

static void *progress_main(void *arg)
{
    ps_server *S = arg;
    fab_comp comps[32];
    int idle = 0;
    while (!atomic_load(&S->stop)) {
        int n = fab_poll(S->fab, comps, 32);
        if (n < 0) {
            log_error("progress: %s", pf_errmsg());
            n = 0;
        }
        for (int i = 0; i < n; i++) {
            buf_ctx *bc = comps[i].context;
            if (!bc)
                continue;
            if (bc->kind == CTX_SEND) {
                if (comps[i].err)
                    log_warn("reply send failed: %s", fi_strerror(-comps[i].err));
                S->send_free[S->nsend_free++] = bc->idx;
                continue;
            }
            uint8_t *buf = S->recv_mem + (size_t)bc->idx * S->msg_bytes;
            if (comps[i].err) {
                S->st_bad++;
                log_warn("receive failed (%s): message dropped", fi_strerror(-comps[i].err));
            } else {
                handle_msg(S, buf, comps[i].len);
            }
            if (fab_recv(S->fab, buf, S->msg_bytes, &S->mr_recv, bc) < 0)
                log_error("reposting a receive: %s", pf_errmsg());
        }
        serve_pending(S); /* acknowledgements first: the apply below overlaps the workers' next work */
        if (S->complete || S->applying) {
            try_apply(S);
            serve_pending(S); /* pulls that waited for an apply */
        }
        if (S->snap && !S->applying && snap_done(S->snap))
            snap_wait(S); /* the apply threads read S->snap (snap_before_update): only between applies */
        if (n == 0) {
            /* Keep polling (manual progress) but give the core away when idle: spin briefly, then sleep
             * 10 us between polls, 100 us after a thousand empty polls (the worker is computing: the wakeups
             * would take its cores), and 500 us after a few thousand (an idle server
             * costs ~0 CPU; the first request after a long pause waits at most ~0.5 ms more). */
            if (++idle > 200 && S->applying) {
                /* The apply threads have the cores: wait for their end (woken at once by it), polling the
                 * endpoint every 20 us for the first few waits and every 200 us after. */
                apply_wait_for(S, idle <= 250 ? 20000 : 200000);
            } else if (idle > 200) {
                struct timespec ts = {0, idle <= 1000 ? 10000 : idle > 3000 ? 500000 : 100000};
                nanosleep(&ts, NULL);
            }
        } else {
            idle = 0;
        }
    }
    /* Stopping: every step whose pushes are all in is applied (they were acknowledged), a snapshot asked for
     * is started (ps_server_stop waits for it). */
    apply_drain(S);
    return NULL;
}

/* ---------- lifecycle ---------- */

int ps_server_create(const ps_server_opts *opts, ps_server **out)
{
    *out = NULL;
    if (opts->workers <= 0)
        return pf_err(-EINVAL, "workers %d must be positive", opts->workers);
    if (opts->max_staleness < 0)
        return pf_err(-EINVAL, "max_staleness %d must be >= 0", opts->max_staleness);
    ps_server *S = calloc(1, sizeof(*S));
    if (!S)
        return pf_err(-ENOMEM, "out of memory");
    S->o = *opts;
    if (S->o.apply_threads < 1)
        S->o.apply_threads = 1;
    if (S->o.recv_bufs <= 0)
        S->o.recv_bufs = 64;
    pthread_mutex_init(&S->am, NULL);
    pthread_cond_init(&S->a_go, NULL);
    pthread_cond_init(&S->a_done, NULL);
    S->fab = opts->fab;
    S->o.fab = NULL;
    int rc = shard_create(&S->sh, opts->num_classes, opts->servers, opts->rank, opts->dim, opts->seed,
                          S->o.apply_threads, opts->prefault);
    if (rc < 0) {
        fab_close(S->fab);
        free(S);
        return rc;
    }
    log_info(
        "shard %d/%d: %lld of %lld classes, D=%d, %d bytes per identity (fp32 weight + momentum, 1-byte "
        "row state, 8 bytes of apply bookkeeping), %.3f GiB total (page-aligned)",
        opts->rank, opts->servers, (long long)S->sh.rows, (long long)opts->num_classes, opts->dim,
        8 * opts->dim + 9, (double)(S->sh.bytes + 9 * (size_t)S->sh.rows) / (1 << 30));
    size_t cg_limit = SIZE_MAX, cg_room = shard_cgroup_room(&cg_limit);
    if (cg_room == SIZE_MAX)
        log_info("memory: no cgroup memory limit applies; the shard was checked against MemAvailable");
    else
        log_info("memory: cgroup limit %.2f GiB, %.2f GiB free in it after the shard's reservation check",
                 (double)cg_limit / (1 << 30), (double)cg_room / (1 << 30));
    if (!S->fab && (rc = fab_open(opts->provider, &S->fab)) < 0)
        goto fail;
    char modes[256];
    fab_mr_mode_str(fab_mr_mode(S->fab), modes, sizeof(modes));
    log_info("fabric provider %s, mr_mode %s", fab_provider(S->fab), modes);
    /* The table is registered for local access only: no peer can write (or read) it remotely; rows
     * change only through the push path. */
    if ((rc = fab_mr_reg(S->fab, S->sh.base, S->sh.bytes, FI_SEND | FI_RECV, &S->mr_table)) < 0)
        goto fail;
    S->msg_bytes = ps_wire_msg_bytes((uint32_t)opts->dim);
    S->nrecv = S->o.recv_bufs;
    S->nsend = S->o.recv_bufs;
    S->recv_mem = fab_buf_alloc(S->msg_bytes * S->nrecv);
    S->send_mem = fab_buf_alloc(S->msg_bytes * S->nsend);
    S->recv_ctx = calloc(S->nrecv, sizeof(buf_ctx));
    S->send_ctx = calloc(S->nsend, sizeof(buf_ctx));
    S->send_free = calloc(S->nsend, sizeof(int));
    S->gj = calloc(S->nsend, sizeof(gjob));
    S->sb = calloc(S->nsend, sizeof(sitem));
    S->worker_addr = calloc(opts->workers, sizeof(fi_addr_t));
    S->worker_known = calloc(opts->workers, 1);
    S->next_push = calloc(opts->workers, sizeof(int64_t));
    S->applied_push = calloc(opts->workers, sizeof(int64_t));
    S->partial = calloc(opts->workers, sizeof(push *));
    S->aps = calloc(opts->workers, sizeof(push *));
    S->amark = calloc((size_t)(S->sh.rows ? S->sh.rows : 1), sizeof(uint32_t));
    S->ahead = malloc(sizeof(uint32_t) * (size_t)(S->sh.rows ? S->sh.rows : 1));
    /* The most rows one message can carry (2-byte wire elements pack the most). */
    S->chunk_cap = ps_wire_rows_per_msg((uint32_t)opts->dim, PS_DT_FP16);
    if (ps_wire_rows_per_msg((uint32_t)opts->dim, PS_DT_FP32) > S->chunk_cap)
        S->chunk_cap = ps_wire_rows_per_msg((uint32_t)opts->dim, PS_DT_FP32);
    /* Pieces of a parallel gather: about 64 KiB of fp32 rows (at least 16 rows). */
    S->gpiece_rows = 65536u / (4u * (uint32_t)opts->dim);
    if (S->gpiece_rows < 16)
        S->gpiece_rows = 16;
    if (!S->gj || !S->sb || !S->aps || !S->amark || !S->ahead || !S->recv_mem || !S->send_mem || !S->recv_ctx || !S->send_ctx || !S->send_free || !S->worker_addr ||
        !S->worker_known || !S->next_push || !S->applied_push || !S->partial) {
        rc = pf_err(-ENOMEM, "out of memory for message buffers");
        goto fail;
    }
    if ((rc = fab_mr_reg(S->fab, S->recv_mem, S->msg_bytes * S->nrecv, FI_RECV, &S->mr_recv)) < 0)
        goto fail;
    if ((rc = fab_mr_reg(S->fab, S->send_mem, S->msg_bytes * S->nsend, FI_SEND, &S->mr_send)) < 0)
        goto fail;
    S->snap_at = -1;
    S->steps_done = opts->start_step;
    for (int w = 0; w < opts->workers; w++)
        S->next_push[w] = S->applied_push[w] = opts->start_step;
    S->steps_in = opts->start_step;
    for (int i = 0; i < S->nsend; i++) {
        S->send_ctx[i] = (buf_ctx){CTX_SEND, i};
        S->send_free[S->nsend_free++] = i;
    }
    for (int i = 0; i < S->nrecv; i++) {
        S->recv_ctx[i] = (buf_ctx){CTX_RECV, i};
        if ((rc = fab_recv(S->fab, S->recv_mem + (size_t)i * S->msg_bytes, S->msg_bytes, &S->mr_recv,
                           &S->recv_ctx[i])) < 0)
            goto fail;
    }
    *out = S;
    return 0;
fail:
    ps_server_destroy(S);
    return rc;
}

int ps_server_getname(ps_server *srv, void *addr, size_t *len)
{
    return fab_getname(srv->fab, addr, len);
}

int ps_server_add_worker(ps_server *srv, int rank, const void *addr, size_t len)
{
    if (rank < 0 || rank >= srv->o.workers)
        return pf_err(-ERANGE, "worker rank %d out of range (%d workers)", rank, srv->o.workers);
    int rc = fab_av_insert(srv->fab, addr, len, &srv->worker_addr[rank]);
    if (rc < 0)
        return pf_err_wrap(rc, "worker %d", rank);
    srv->worker_known[rank] = 1;
    return 0;
}

int ps_server_start(ps_server *srv)
{
    srv->athreads = calloc(srv->o.apply_threads, sizeof(pthread_t));
    if (!srv->athreads)
        return pf_err(-ENOMEM, "out of memory");
    for (int i = 0; i < srv->o.apply_threads; i++) {
        apply_arg *a = malloc(sizeof(*a));
        if (!a)
            break;
        *a = (apply_arg){srv, i};
        if (pthread_create(&srv->athreads[i], NULL, apply_main, a) != 0) {
            free(a);
            break;
        }
        srv->nathreads++;
    }
    if (srv->nathreads == 0)
        return pf_err(-EAGAIN, "could not start any apply thread");
    if (srv->o.fill && shard_fill_start(&srv->sh, srv->o.apply_threads) < 0)
        log_warn("%s", pf_errmsg());
    if (pthread_create(&srv->progress, NULL, progress_main, srv) != 0)
        return pf_err(-EAGAIN, "could not start the progress thread");
    srv->started = 1;
    return 0;
}

void ps_server_stop(ps_server *srv)
{
    if (!srv)
        return;
    atomic_store(&srv->stop, 1);
    if (srv->started) {
        pthread_join(srv->progress, NULL);
        srv->started = 0;
    }
    pthread_mutex_lock(&srv->am);
    srv->aquit = 1;
    pthread_cond_broadcast(&srv->a_go);
    pthread_mutex_unlock(&srv->am);
    for (int i = 0; i < srv->nathreads; i++)
        pthread_join(srv->athreads[i], NULL);
    srv->nathreads = 0;
    if (srv->snap) {
        log_info("waiting for snapshot step %lld to be written", (long long)snap_step(srv->snap));
        snap_wait(srv);
    }
}

void ps_server_destroy(ps_server *S)
{
    if (!S)
        return;
    ps_server_stop(S);
    fab_shutdown(S->fab); /* cancel the posted receives before their buffers are deregistered */
    fab_mr_close(&S->mr_recv);
    fab_mr_close(&S->mr_send);
    fab_mr_close(&S->mr_table);
    fab_close(S->fab);
    for (push *p = S->complete; p;) {
        push *nx = p->next;
        free_push(S, p);
        p = nx;
    }
    if (S->partial)
        for (int w = 0; w < S->o.workers; w++)
            free_push(S, S->partial[w]);
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
    free(S->ae);
    free(S->aseg);
    free(S->amark);
    free(S->ahead);
    free(S->aps);
    free(S->recv_mem);
    free(S->send_mem);
    free(S->recv_ctx);
    free(S->send_ctx);
    free(S->send_free);
    free(S->gj);
    free(S->sb);
    free(S->worker_addr);
    free(S->worker_known);
    free(S->next_push);
    free(S->applied_push);
    free(S->partial);
    free(S->athreads);
    shard_destroy(&S->sh);
    pthread_mutex_destroy(&S->am);
    pthread_cond_destroy(&S->a_go);
    pthread_cond_destroy(&S->a_done);
    free(S);
}

const shard *ps_server_shard(const ps_server *srv)
{
    return &srv->sh;
}

int ps_server_load(ps_server *srv, const char *root, int64_t step)
{
    if (srv->started)
        return pf_err(-EBUSY, "ps_server_load on a started server");
    return snap_load(&srv->sh, root, step);
}

int ps_server_inject(ps_server *S, const void *msg, size_t len)
{
    if (S->started)
        return pf_err(-EBUSY, "ps_server_inject on a started server");
    handle_msg(S, msg, len);
    apply_drain(S); /* no apply threads: every ready step is applied here */
    int replies = 0;
    pending **pp = &S->pq_head, *prev = NULL;
    while (*pp) {
        pending *p = *pp;
        if (!reply_ready(S, p)) {
            prev = p;
            pp = &p->next;
            continue;
        }
        if (p->status == 0 && p->req.op == PS_OP_PULL) {
            void *out = malloc((size_t)p->req.n * S->sh.dim * ps_dtype_size(p->req.dtype) + 1);
            if (out)
                shard_gather(&S->sh, p->ids, p->req.n, p->req.dtype, out);
            free(out);
        }
        *pp = p->next;
        if (S->pq_tail == p)
            S->pq_tail = prev;
        pend_put(S, p);
        replies++;
    }
    return replies;
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
