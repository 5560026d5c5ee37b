/* Parameter server: the apply / gather thread pool and the applies the step clock schedules.
 *
 * `apply_threads` threads wait on one condition variable for a new generation of work: an apply (apply_start:
 * every push of a step, grouped by row, rows split evenly among the threads; the progress thread goes on
 * receiving meanwhile) or a gather (pss_gather_begin: a batch of pull replies cut into ~64 KiB pieces that
 * the threads and the progress thread claim from one atomic counter). pss_try_apply, on the progress thread,
 * decides which step to apply next (local mode: the oldest step whose W pushes are all in; global mode: the
 * oldest complete push), finishes an apply once its threads are done, advances the step clock and starts the
 * snapshots the workers asked for. See ps_server.h for the semantics. */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/ckpt.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "server/ps_server_internal.h"
#include "server/snapshot.h"

/* Unix time in seconds (CLOCK_REALTIME), for the snapshot series' timestamps. */
static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

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
static void apply_segments(ps_server *S, size_t s_lo, size_t s_hi, double *g, dense_cache *dc)
{
    const int64_t t = S->apply_t;
    const int D = S->sh.dim;
    const size_t ahead = (size_t)shard_prefetch_rows(D);
    int ui = 0; /* opts.undo: the push of the apply segment s belongs to (pss_undo_save) */
    for (size_t s = s_lo; s < s_hi; s++) {
        const entry *e0 = &S->ae[S->aseg[s]];
        if (s + ahead < s_hi) {
            /* A later row's weight and momentum are at random places in the table: start loading them
             * (address arithmetic only; shard_row below still does the on-demand generation). */
            const int64_t r = S->ae[S->aseg[s + ahead]].lrow;
            const size_t off = (size_t)r * (size_t)D;
            shard_prefetch_row(S->sh.weight + off, D, 1);
            shard_prefetch_row(S->sh.momentum + off, D, 1);
            if (S->sh.adam)
                shard_prefetch_row(S->sh.sq + off, D, 1);
            __builtin_prefetch(&S->sh.ready[r], 0, 0);
            if (S->sh.dense)
                __builtin_prefetch(&S->sh.rstep[r], 1, 0);
        }
        if (S->o.undo)
            pss_undo_save(S, &ui, s, e0->lrow); /* the row as it is, into its slot of the push's undo log */
        if (S->snap)
            snap_before_update(S->snap, e0->lrow);
        if (S->sh.adam) { /* optimizer = adamw: the steps the row owes (dense), then step t (shard.h) */
            if (e0->next == ENTRY_END) {
                shard_adamw_row_f32(&S->sh, e0->lrow, e0->g, t);
                continue;
            }
            memset(g, 0, sizeof(double) * (size_t)D);
            for (uint32_t e = S->aseg[s]; e != ENTRY_END; e = S->ae[e].next)
                add_grad(g, S->ae[e].g, D);
            shard_adamw_row(&S->sh, e0->lrow, g, t);
            continue;
        }
        /* pfc_update = dense: the closed form of the steps the row skipped (server/dense.h), then this step's
         * update, in one pass over the row (shard_dense_sgd_row_f32) */
        float *w = shard_row(&S->sh, e0->lrow);
        dense_map M;
        const dense_map *owed = shard_dense_owed(&S->sh, e0->lrow, t, dc, &M) ? &M : NULL;
        if (S->sh.dense)
            S->sh.rstep[e0->lrow] = t + 1;
        float *v = S->sh.momentum + (w - S->sh.weight);
        if (e0->next == ENTRY_END) {
            shard_dense_sgd_row_f32(w, v, e0->g, D, owed, e0->lr, S->o.momentum, S->o.weight_decay);
            continue;
        }
        memset(g, 0, sizeof(double) * (size_t)D);
        for (uint32_t e = S->aseg[s]; e != ENTRY_END; e = S->ae[e].next)
            add_grad(g, S->ae[e].g, D);
        shard_dense_sgd_row(w, v, g, D, owed, e0->lr, S->o.momentum, S->o.weight_decay);
    }
    if (S->o.undo)
        pss_undo_fence();
}

/* Claims pieces of gather batch `batch` one at a time (lowest first) and gathers their rows, until none is
 * left or job `until`'s pieces are all claimed (UINT32_MAX: until none is left). A claim is a
 * compare-and-swap on S->gclaim that also checks the batch, so a thread that woke for an earlier batch claims
 * nothing of a later one it did not read. The batch's jobs stay put until every piece is gathered
 * (pss_gather_job waits for that). Returns the rows this call gathered. */
static long long gather_pieces(ps_server *S, uint32_t batch, uint32_t until, dense_cache *dc)
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
        shard_gather_at(&S->sh, j->ids + r0, n, j->dtype, j->dst + (size_t)r0 * rb, j->target, dc);
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
    dense_cache dc;
    if (dense_cache_init(&dc, S->sh.dim) < 0) {
        free(g);
        g = NULL; /* counted down without work: the apply below reports nothing; cannot happen in practice */
    }
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
            long long rows = g ? gather_pieces(S, batch, UINT32_MAX, &dc) : 0;
            atomic_fetch_add_explicit(&S->st_par_rows, rows, memory_order_relaxed);
            pthread_mutex_lock(&S->am);
            continue; /* no count-down: the progress thread waits for the pieces, not the threads */
        }
        size_t n = S->anseg, T = (size_t)S->nathreads;
        pthread_mutex_unlock(&S->am);
        if (g)
            apply_segments(S, n * (size_t)a->idx / T, n * ((size_t)a->idx + 1) / T, g, &dc);
        pthread_mutex_lock(&S->am);
        if (--S->aremaining == 0) {
            pthread_cond_signal(&S->a_done);
            fab_wake(S->fab); /* the progress thread may sleep in fab_wait */
        }
    }
    pthread_mutex_unlock(&S->am);
    free(g);
    dense_cache_free(&dc);
    free(a);
    return NULL;
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
 * on receiving (no gather runs meanwhile: pss_reply_ready holds pulls while S->applying); apply_finish, once
 * they are done, frees the pushes. Without apply threads (a server driven by the test hook ps_server_inject,
 * never started) the rows are updated here.
 * Returns the number of rows being updated, or -ENOMEM (nothing started, pushes kept). */
static long apply_start(ps_server *S, int64_t t)
{
    push **ps = S->aps; /* at most one push per worker and step */
    int np = 0;
    size_t nrows = 0;
    S->snap_left_moved = 1;
    for (push *p = S->complete; p; p = p->next)
        if (p->step == t && np < S->o.workers) {
            ps[np++] = p;
            for (int i = 0; i < p->nchunks; i++)
                nrows += p->slot[i]->n; /* complete: every slot is filled */
        }
    /* pfc_update = dense: the lr of step t, which the rows that skip it will need (NaN: the loss scaler
     * skipped it, and it moves no row); optimizer = adamw: also the step count of its bias corrections */
    if (S->sh.dense || S->sh.adam)
        for (int i = 0; i < np; i++)
            if (shard_dense_set_lr(&S->sh, t, ps[i]->skipped ? NAN : (double)ps[i]->lr) < 0) {
                log_error("apply of step %lld: %s", (long long)t, pf_errmsg());
                return -ENOMEM;
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
    if (S->o.undo)
        pss_undo_begin(S, t, ps, np); /* each push's log: its segments' slots */
    S->aps_n = np;
    S->apply_t = t;
    S->applying = 1;
    S->apply_t0 = pf_now_s();
    if (S->nathreads == 0) {
        /* Not started: apply on this thread. */
        double *g = malloc(sizeof(double) * (size_t)S->sh.dim);
        if (g)
            apply_segments(S, 0, nseg, g, &S->pcache);
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
void pss_apply_wait_for(ps_server *S, long ns)
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
        pss_free_push(S, S->aps[i]);
        S->st_pushes++;
    }
    S->ncomplete -= S->aps_n;
    metrics_add(S->m.push_requests, S->aps_n);
    metrics_observe(S->m.apply_seconds, pf_now_s() - S->apply_t0);
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
    metrics_set(S->m.step, (double)S->steps_done);
    S->aps_n = 0;
}

/* Waits for the snapshot in progress (if any), logs its outcome and prunes older ones. */
void pss_snap_wait(ps_server *S)
{
    if (!S->snap)
        return;
    snap_outcome out;
    int rc = snap_finish_ex(S->snap, &out);
    S->snap = NULL;
    metrics_set(S->m.snap_in_progress, 0);
    if (rc < 0) {
        metrics_add(S->m.snap_failures, 1);
        return;
    }
    metrics_set(S->m.snap_progress, 1);
    metrics_set(S->m.snap_duration, out.seconds);
    metrics_set(S->m.snap_last_ts, wall_s());
    metrics_set(S->m.snap_last_step, (double)out.step);
    metrics_set(S->m.snap_bytes, (double)out.bytes);
    metrics_add(S->m.snapshots, 1);
    snap_prune(S->o.snapshot_root, S->o.rank, S->o.snapshot_keep > 0 ? S->o.snapshot_keep : 2, &S->o.ckpt_id);
}

/* Whether this copy writes its shard's snapshots now: a primary unless quiet (a rejoined primary whose
 * promoted backup writes them), a backup once promoted. */
static int writes_snapshots(ps_server *S)
{
    return S->o.backup ? atomic_load(&S->promoted) : !atomic_load(&S->quiet);
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
    if (!writes_snapshots(S)) {
        log_debug("step %lld: snapshot of shard %d left to its other copy (this one does not write it now)",
                  (long long)step, S->o.rank);
        S->snap_left = step;
        S->snap_left_moved = 0;
        return;
    }
    if (S->snap) {
        log_warn("snapshot step %lld is still being written: step %lld's waits for it",
                 (long long)snap_step(S->snap), (long long)step);
        pss_snap_wait(S);
    }
    /* pfc_update = dense: the rows go into the file as they are stored, each with its step, and the file
     * carries the lr of every step (server/snapshot.h); nothing is brought up to date here, so the table
     * evolves the same whatever steps are checkpointed, and a run resumed from any checkpoint continues from
     * the same bits as the uninterrupted one. */
    if (snap_start(&S->sh, S->o.snapshot_root, step, &S->o.ckpt_id, S->o.ckpt_keyed ? &S->o.ckpt_key : NULL,
                   &S->snap) < 0) {
        log_error("snapshot step %lld not started: %s (earlier snapshots are untouched; serving on)",
                  (long long)step, pf_errmsg());
        metrics_add(S->m.snap_failures, 1);
        return;
    }
    metrics_set(S->m.snap_progress, 0);
    metrics_set(S->m.snap_in_progress, 1);
}

void pss_snap_left(ps_server *S)
{
    if (S->snap_left < 0 || S->applying || !writes_snapshots(S))
        return;
    const int64_t step = S->snap_left;
    S->snap_left = -1;
    char path[4200];
    struct stat st;
    ckpt_member_path(S->o.snapshot_root, step, "shard", S->sh.rank, S->sh.servers, ".snap", path,
                     sizeof path);
    if (stat(path, &st) == 0)
        return; /* the other copy wrote it */
    if (S->snap_left_moved) {
        log_warn(
            "checkpoint %lld has no file of shard %d: its other copy was lost before it wrote it, and this "
            "copy has applied later steps since; that checkpoint stays incomplete (never loaded) and the "
            "next one has the shard",
            (long long)step, S->o.rank);
        return;
    }
    log_warn(
        "checkpoint %lld has no file of shard %d: its other copy was lost before it wrote it; this copy, "
        "still at that step, writes it",
        (long long)step, S->o.rank);
    snap_begin(S, step);
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

/* Runs on the progress thread after every batch of messages (and from pss_apply_drain). Finishes the running
 * apply once its threads are done and returns 1, so the caller serves the pulls that waited for it before
 * the next apply starts; otherwise starts the next apply that is ready and returns 0. Local mode (BSP/SSP):
 * the oldest step whose W pushes are all in, and a snapshot after a step flagged PS_PUSH_SNAPSHOT (started
 * by apply_finish). Global mode: every complete push of the oldest step that has one (so each worker's
 * pushes apply in step order), except that while a snapshot of step T is asked for and not begun, pushes of
 * steps >= T wait until every worker's steps < T are applied; steps_done is the slowest worker's count of
 * applied steps. */
int pss_try_apply(ps_server *S)
{
    if (S->applying) {
        if (!apply_idle(S))
            return 0;
        apply_finish(S);
        return 1;
    }
    if (S->o.global_mode) {
        S->steps_done = min_applied(S);
        metrics_set(S->m.step, (double)S->steps_done);
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

void pss_apply_settle(ps_server *S)
{
    while (S->applying) {
        while (!apply_idle(S))
            pss_apply_wait_for(S, 200000);
        pss_try_apply(S); /* finishes it (returns before starting another) */
    }
}

/* Applies every step that is ready, waiting for each (a stat or checksum then sees a quiet table; a stopping
 * server loses no acknowledged push). */
void pss_apply_drain(ps_server *S)
{
    for (;;) {
        if (S->applying) {
            while (!apply_idle(S))
                pss_apply_wait_for(S, 200000);
            pss_try_apply(S); /* finishes it */
            continue;
        }
        pss_try_apply(S); /* starts the next one, if any */
        if (!S->applying)
            return;
    }
}

int pss_apply_init(ps_server *S)
{
    const size_t rows = (size_t)(S->sh.rows ? S->sh.rows : 1);
    pthread_mutex_init(&S->am, NULL);
    pthread_cond_init(&S->a_go, NULL);
    pthread_cond_init(&S->a_done, NULL);
    S->gj = calloc(S->nsend, sizeof(gjob));
    S->sb = calloc(S->nsend, sizeof(sitem));
    S->aps = calloc(S->o.workers, sizeof(push *));
    S->amark = calloc(rows, sizeof(uint32_t));
    S->ahead = malloc(sizeof(uint32_t) * rows);
    /* Pieces of a parallel gather: about 64 KiB of fp32 rows (at least 16 rows). */
    S->gpiece_rows = 65536u / (4u * (uint32_t)S->o.dim);
    if (S->gpiece_rows < 16)
        S->gpiece_rows = 16;
    if (!S->gj || !S->sb || !S->aps || !S->amark || !S->ahead || dense_cache_init(&S->pcache, S->o.dim) < 0)
        return pf_err(-ENOMEM, "out of memory for the apply bookkeeping");
    return 0;
}

void pss_apply_free(ps_server *S)
{
    free(S->ae);
    free(S->aseg);
    free(S->amark);
    free(S->ahead);
    free(S->aps);
    free(S->gj);
    free(S->sb);
    dense_cache_free(&S->pcache);
    free(S->athreads);
    pthread_mutex_destroy(&S->am);
    pthread_cond_destroy(&S->a_go);
    pthread_cond_destroy(&S->a_done);
}

int pss_apply_pool_start(ps_server *S)
{
    if (S->nathreads > 0)
        return 0; /* running already (the test hook ps_server_inject_pool started them) */
    S->athreads = calloc(S->o.apply_threads, sizeof(pthread_t));
    if (!S->athreads)
        return pf_err(-ENOMEM, "out of memory");
    for (int i = 0; i < S->o.apply_threads; i++) {
        apply_arg *a = malloc(sizeof(*a));
        if (!a)
            break;
        *a = (apply_arg){S, i};
        if (pthread_create(&S->athreads[i], NULL, apply_main, a) != 0) {
            free(a);
            break;
        }
        S->nathreads++;
    }
    if (S->nathreads == 0)
        return pf_err(-EAGAIN, "could not start any apply thread");
    return 0;
}

void pss_apply_pool_stop(ps_server *S)
{
    pthread_mutex_lock(&S->am);
    S->aquit = 1;
    pthread_cond_broadcast(&S->a_go);
    pthread_mutex_unlock(&S->am);
    for (int i = 0; i < S->nathreads; i++)
        pthread_join(S->athreads[i], NULL);
    S->nathreads = 0;
}

/* The rows are cut into pieces of about 64 KiB; the apply threads (idle: pulls are not served while an apply
 * runs) are woken to claim pieces alongside the progress thread, so a server's gathers use all its apply
 * threads, as its applies do; for one piece, or before the threads are started, the progress thread gathers
 * alone. */
uint32_t pss_gather_begin(ps_server *S)
{
    uint32_t pieces = 0;
    long long rows = 0;
    for (int j = 0; j < S->ngj; j++) {
        gjob *g = &S->gj[j];
        g->first = pieces;
        g->pieces = (g->n + S->gpiece_rows - 1) / S->gpiece_rows;
        rows += g->n;
        atomic_store_explicit(&g->done, 0, memory_order_relaxed);
        pieces += g->pieces;
    }
    S->st_pulled += rows;
    if (S->ngj > 0) {
        metrics_add(S->m.pulled_rows, (double)rows);
        metrics_add(S->m.pull_requests, S->ngj);
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
    return batch;
}

/* The progress thread claims pieces up to the job's last one and waits only for a piece another thread
 * already claimed. */
void pss_gather_job(ps_server *S, uint32_t batch, int job)
{
    gjob *g = &S->gj[job];
    gather_pieces(S, batch, (uint32_t)job, &S->pcache); /* claims up to its last piece */
    while (atomic_load_explicit(&g->done, memory_order_acquire) < g->pieces)
        sched_yield(); /* a piece an apply thread claimed is being gathered */
}
