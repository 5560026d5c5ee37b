/* Parameter server: undo logs and rollback (opts.undo, either head mode; docs/architecture.md, "Worker
 * replacement in place"; ps_server.h: ps_server_rollback).
 *
 * Each worker has one undo log, the rows its newest applied push changed as they were before that apply: the
 * weights, the optimizer state (SGD momentum, or AdamW's two moments) and, under pfc_update = dense, the row's
 * step. apply_start (apply.c) points each push of an apply at its worker's log (pss_undo_begin), which from
 * then on holds that push's rows instead of the worker's previous push's; the apply threads copy each row into
 * its own slot before they update it (pss_undo_save), so restoring the slots puts back exactly the bits the
 * apply found. A row several pushes of one apply update (local mode; never in global mode, where each row has
 * one owner) is logged once, in the log of the first of them (a push all of whose rows are logged so keeps
 * its worker's log as it was); a rollback restores every log of its step, newest apply first, so the rows
 * come back as they were before the oldest of them either way.
 *
 * A push that moves no row (a gradient_acc window's steps before its last, a step the loss scaler skipped)
 * leaves its worker's log as it is. A rollback to step R (pss_rollback) restores the logs of the applied pushes
 * of steps >= R, discards every other push of a step >= R and sets the step clock back to R. It is refused,
 * with nothing changed, when a worker has applied pushes of steps >= R that its log cannot undo (two of them
 * that moved rows, or a log lost to a failed allocation). Under gradient_acc = k a worker pushes rows once per
 * window, so a rollback to a window start undoes at most its window-end push. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "server/ps_server_internal.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

int pss_undo_init(ps_server *S)
{
    const int W = S->o.workers;
    S->pushed_pub = calloc((size_t)W, sizeof(*S->pushed_pub));
    if (!S->pushed_pub)
        return pf_err(-ENOMEM, "out of memory for %d workers' step counts", W);
    for (int w = 0; w < W; w++)
        atomic_store(&S->pushed_pub[w], S->o.start_step);
    pthread_mutex_init(&S->rbm, NULL);
    pthread_cond_init(&S->rbc, NULL);
    if (!S->o.undo)
        return 0;
    S->ulog = calloc((size_t)W, sizeof(undo_log));
    S->uapply = calloc((size_t)W, sizeof(undo_log *));
    S->useg0 = calloc((size_t)W + 1, sizeof(size_t));
    if (!S->ulog || !S->uapply || !S->useg0)
        return pf_err(-ENOMEM, "out of memory for %d workers' undo logs", W);
    for (int w = 0; w < W; w++)
        S->ulog[w].step = S->ulog[w].newest = S->ulog[w].prev = -1;
    S->urow_floats = (size_t)(S->o.adamw ? 3 : 2) * (size_t)S->o.dim;
    log_info("shard %d: undo logs on: %zu bytes per row of each worker's newest applied push (allocated as pushes "
             "arrive), one copy of each updated row per apply",
             S->o.rank, sizeof(float) * S->urow_floats + 2 * sizeof(int64_t));
    return 0;
}

void pss_undo_free(ps_server *S)
{
    if (S->pushed_pub) {
        pthread_mutex_destroy(&S->rbm);
        pthread_cond_destroy(&S->rbc);
    }
    for (int w = 0; S->ulog && w < S->o.workers; w++) {
        free(S->ulog[w].lrow);
        free(S->ulog[w].rstep);
        free(S->ulog[w].val);
    }
    free(S->ulog);
    free(S->uapply);
    free(S->useg0);
    free((void *)S->pushed_pub);
}

void pss_pushed_publish(ps_server *S, int w)
{
    atomic_store_explicit(&S->pushed_pub[w], S->next_push[w], memory_order_release);
}

/* Grows log L to hold n rows (with a quarter to spare). Returns 0 or -ENOMEM (L unchanged). */
static int undo_reserve(ps_server *S, undo_log *L, size_t n)
{
    if (n <= L->cap)
        return 0;
    size_t cap = n + n / 4;
    int64_t *lrow = realloc(L->lrow, sizeof(int64_t) * cap);
    if (lrow)
        L->lrow = lrow;
    int64_t *rstep = lrow && S->sh.dense ? realloc(L->rstep, sizeof(int64_t) * cap) : L->rstep;
    if (rstep)
        L->rstep = rstep;
    float *val = lrow && (rstep || !S->sh.dense) ? realloc(L->val, sizeof(float) * S->urow_floats * cap) : NULL;
    if (val)
        L->val = val;
    if (!val)
        return -ENOMEM;
    L->cap = cap;
    return 0;
}

void pss_undo_begin(ps_server *S, int64_t t, push *const *ps, int np)
{
    S->useq++;
    size_t k = 0, s = 0;
    for (int i = 0; i < np; i++) {
        /* Entries of push i are k .. k + rows - 1 (apply_start lists them push after push); its segments are
         * the ones whose first entry lies there (ascending, like the entries). */
        for (int ci = 0; ci < ps[i]->nchunks; ci++)
            k += ps[i]->slot[ci]->n;
        S->useg0[i] = s;
        while (s < S->anseg && S->aseg[s] < k)
            s++;
        undo_log *L = &S->ulog[ps[i]->client];
        const size_t n = s - S->useg0[i];
        if (n == 0) { /* moves no row (global mode: every row of a push is its own segment): the log keeps
                       * the worker's newest push that did */
            S->uapply[i] = NULL;
            continue;
        }
        L->prev = L->newest;
        L->newest = t;
        if (undo_reserve(S, L, n) < 0) {
            log_error("step %lld: out of memory for worker %d's undo log of %zu rows: a rollback to this step "
                      "will be refused",
                      (long long)t, ps[i]->client, n);
            L->step = -1;
            L->n = 0;
            S->uapply[i] = NULL;
            continue;
        }
        L->step = t;
        L->seq = S->useq;
        L->n = n;
        S->uapply[i] = L;
    }
    S->useg0[np] = S->anseg;
    S->un = np;
}

/* Copies n floats from src to dst, which the apply will not read again: with streaming stores where dst is
 * 16-byte aligned (x86-64: no read of the log's lines before they are written, none of them kept in the
 * caches), else memcpy. pss_undo_fence orders the streaming stores before the apply is reported done. */
static void log_copy(float *restrict dst, const float *restrict src, size_t n)
{
#if defined(__SSE2__)
    if (((uintptr_t)dst & 15) == 0) {
        size_t j = 0;
        for (; j + 4 <= n; j += 4)
            _mm_stream_ps(dst + j, _mm_loadu_ps(src + j));
        for (; j < n; j++)
            dst[j] = src[j];
        return;
    }
#endif
    memcpy(dst, src, sizeof(float) * n);
}

void pss_undo_fence(void)
{
#if defined(__SSE2__)
    _mm_sfence();
#endif
}

void pss_undo_save(ps_server *S, int *ui, size_t s, int64_t lrow)
{
    while (*ui + 1 < S->un && s >= S->useg0[*ui + 1])
        (*ui)++;
    undo_log *L = S->uapply[*ui];
    if (!L)
        return;
    const size_t i = s - S->useg0[*ui], D = (size_t)S->sh.dim;
    const float *w = shard_row(&S->sh, lrow); /* generated first if never touched: its value is then saved */
    const size_t off = (size_t)(w - S->sh.weight);
    float *dst = L->val + i * S->urow_floats;
    L->lrow[i] = lrow;
    log_copy(dst, w, D);
    log_copy(dst + D, S->sh.momentum + off, D);
    if (S->sh.adam)
        log_copy(dst + 2 * D, S->sh.sq + off, D);
    if (S->sh.dense)
        L->rstep[i] = S->sh.rstep[lrow];
}

/* Writes log L's rows back into the table. */
static void undo_restore(ps_server *S, const undo_log *L)
{
    const size_t D = (size_t)S->sh.dim;
    for (size_t i = 0; i < L->n; i++) {
        const size_t off = (size_t)L->lrow[i] * D;
        const float *src = L->val + i * S->urow_floats;
        memcpy(S->sh.weight + off, src, sizeof(float) * D);
        memcpy(S->sh.momentum + off, src + D, sizeof(float) * D);
        if (S->sh.adam)
            memcpy(S->sh.sq + off, src + 2 * D, sizeof(float) * D);
        if (S->sh.dense)
            S->sh.rstep[L->lrow[i]] = L->rstep[i];
    }
}

/* Whether every worker's applied pushes of steps >= step can be undone (see the file's header): each worker's
 * pushes that moved rows among them are at most one, its newest, and its log holds that one. Pushes without
 * rows need nothing undone. Returns 0, or -ERANGE naming the first worker that cannot. */
static int rollback_check(const ps_server *S, int64_t step)
{
    for (int w = 0; w < S->o.workers; w++) {
        const int64_t a = S->applied_push[w];
        const undo_log *L = &S->ulog[w];
        if (a <= step || L->newest < step)
            continue;
        if (L->prev >= step)
            return pf_err(-ERANGE,
                          "rollback to step %lld: worker %d's pushes of steps %lld..%lld are applied and more than "
                          "one of them moved rows; only its newest (step %lld) can be undone",
                          (long long)step, w, (long long)step, (long long)a - 1, (long long)L->newest);
        if (L->step != L->newest)
            return pf_err(-ERANGE,
                          "rollback to step %lld: worker %d's push of step %lld is applied but its undo log "
                          "holds %s%lld",
                          (long long)step, w, (long long)L->newest, L->step < 0 ? "no step: " : "step ",
                          (long long)L->step);
    }
    return 0;
}

/* Restores every worker's applied push of a step >= `step` that moved rows (newest apply first) and marks its
 * log used up (rollback_do then sets every worker's applied count back to `step`). */
static long rollback_restore(ps_server *S, int64_t step)
{
    long rows = 0;
    for (;;) {
        int best = -1;
        for (int w = 0; w < S->o.workers; w++)
            if (S->applied_push[w] > step && S->ulog[w].step >= step && S->ulog[w].step == S->ulog[w].newest &&
                (best < 0 || S->ulog[w].seq > S->ulog[best].seq))
                best = w;
        if (best < 0)
            break;
        undo_log *L = &S->ulog[best];
        undo_restore(S, L);
        rows += (long)L->n;
        L->step = -1;
        L->n = 0;
        L->newest = L->prev;
        L->prev = L->newest < 0 ? -1 : INT64_MAX; /* the one before it is no longer known */
        S->applied_push[best] = step;
    }
    return rows;
}

/* Discards the received pushes of steps >= step (complete and partial) and the queued replies of pulls and
 * pushes of those steps. Returns the pushes discarded. */
static int rollback_discard(ps_server *S, int64_t step)
{
    int n = 0;
    for (push **pp = &S->complete; *pp;) {
        push *p = *pp;
        if (p->step < step) {
            pp = &p->next;
            continue;
        }
        *pp = p->next;
        pss_free_push(S, p);
        S->ncomplete--;
        n++;
    }
    for (int w = 0; w < S->o.workers; w++)
        if (S->partial[w] && S->partial[w]->step >= step) {
            pss_free_push(S, S->partial[w]);
            S->partial[w] = NULL;
            n++;
        }
    pending **pp = &S->pq_head, *prev = NULL;
    while (*pp) {
        pending *p = *pp;
        if ((p->req.op != PS_OP_PULL && p->req.op != PS_OP_PUSH) || p->req.step < step) {
            prev = p;
            pp = &p->next;
            continue;
        }
        *pp = p->next;
        if (S->pq_tail == p)
            S->pq_tail = prev;
        S->queued--;
        pss_pend_put(S, p);
    }
    return n;
}

/* The rollback itself, on the thread that applies (no apply running, no snapshot being written). Returns 0 or
 * -ERANGE (nothing changed). */
static int rollback_do(ps_server *S, int64_t step, uint32_t epoch)
{
    int rc = rollback_check(S, step);
    if (rc < 0)
        return rc;
    /* The epoch first: from here on a late message of the abandoned attempt is dropped. */
    if (epoch > atomic_load(&S->min_epoch))
        atomic_store(&S->min_epoch, epoch);
    ps_server_set_epoch(S, epoch);
    const long rows = rollback_restore(S, step);
    const int dropped = rollback_discard(S, step);
    int64_t in = INT64_MAX;
    for (int w = 0; w < S->o.workers; w++) {
        if (S->next_push[w] > step)
            S->next_push[w] = step;
        if (S->applied_push[w] > step)
            S->applied_push[w] = step;
        pss_pushed_publish(S, w);
        in = S->next_push[w] < in ? S->next_push[w] : in;
    }
    S->steps_in = in;
    int64_t done = S->applied_push[0];
    for (int w = 1; w < S->o.workers; w++)
        done = S->applied_push[w] < done ? S->applied_push[w] : done;
    S->steps_done = done;
    metrics_set(S->m.step, (double)done);
    if (S->snap_at >= step)
        S->snap_at = -1;
    S->snap_left_moved = 1;
    if (S->sh.dense || S->sh.adam)
        shard_dense_truncate_lr(&S->sh, step);
    log_info("shard %d: rolled back to step %lld at epoch %u: %ld rows restored, %d received pushes discarded",
             S->o.rank, (long long)step, epoch, rows, dropped);
    return 0;
}

void pss_rollback_serve(ps_server *S)
{
    pthread_mutex_lock(&S->rbm);
    if (S->rb_state != RB_POSTED) {
        pthread_mutex_unlock(&S->rbm);
        return;
    }
    S->rb_state = RB_TAKEN;
    const int64_t step = S->rb_step;
    const uint32_t epoch = S->rb_epoch;
    pthread_mutex_unlock(&S->rbm);
    pss_apply_settle(S);
    pss_snap_wait(S);
    int rc = rollback_do(S, step, epoch);
    pthread_mutex_lock(&S->rbm);
    S->rb_rc = rc;
    snprintf(S->rb_msg, sizeof S->rb_msg, "%s", rc < 0 ? pf_errmsg() : "");
    S->rb_state = RB_DONE;
    atomic_store(&S->rb_flag, 0);
    pthread_cond_broadcast(&S->rbc);
    pthread_mutex_unlock(&S->rbm);
}

/* Waits on S->rbc until the posted rollback is done or `deadline` (CLOCK_REALTIME; NULL: forever) passes while
 * it is still untaken (then withdrawn). Called with S->rbm held. Returns the rollback's code or -ETIMEDOUT. */
static int rollback_wait(ps_server *S, const struct timespec *deadline)
{
    while (S->rb_state != RB_DONE) {
        int e = deadline && S->rb_state == RB_POSTED ? pthread_cond_timedwait(&S->rbc, &S->rbm, deadline)
                                                     : pthread_cond_wait(&S->rbc, &S->rbm);
        if (e == ETIMEDOUT && S->rb_state == RB_POSTED) {
            S->rb_state = RB_NONE;
            atomic_store(&S->rb_flag, 0);
            return -ETIMEDOUT;
        }
        if (e == ETIMEDOUT) /* taken meanwhile: it runs to its end */
            deadline = NULL;
    }
    S->rb_state = RB_NONE;
    return S->rb_rc;
}

int ps_server_rollback(ps_server *S, int64_t step, uint32_t epoch, double timeout_s)
{
    if (!S->o.undo)
        return pf_err(-EINVAL, "rollback to step %lld: the server keeps no undo logs (opts.undo is off)",
                      (long long)step);
    if (step < 0)
        return pf_err(-EINVAL, "rollback to step %lld: negative step", (long long)step);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl); /* the condition variable's clock */
    if (timeout_s >= 0) {
        double s = (double)dl.tv_sec + 1e-9 * (double)dl.tv_nsec + timeout_s;
        dl.tv_sec = (time_t)s;
        dl.tv_nsec = (long)((s - (double)dl.tv_sec) * 1e9);
    }
    pthread_mutex_lock(&S->rbm);
    if (!S->rb_live) { /* never started, or stopped: nothing else touches the state */
        pthread_mutex_unlock(&S->rbm);
        pss_apply_settle(S);
        pss_snap_wait(S);
        return rollback_do(S, step, epoch);
    }
    if (S->rb_state != RB_NONE) {
        pthread_mutex_unlock(&S->rbm);
        return pf_err(-EBUSY, "rollback to step %lld: another rollback is in progress", (long long)step);
    }
    S->rb_state = RB_POSTED;
    S->rb_step = step;
    S->rb_epoch = epoch;
    atomic_store(&S->rb_flag, 1);
    fab_wake(S->fab);
    int rc = rollback_wait(S, timeout_s >= 0 ? &dl : NULL);
    char msg[sizeof S->rb_msg];
    snprintf(msg, sizeof msg, "%s", S->rb_msg);
    pthread_mutex_unlock(&S->rbm);
    if (rc == -ETIMEDOUT)
        return pf_err(rc, "rollback to step %lld: the progress thread did not take it within %.3g s (nothing "
                          "changed)",
                      (long long)step, timeout_s);
    if (rc < 0)
        return pf_err(rc, "%s", msg);
    return 0;
}

void pss_rollback_live(ps_server *S, int live)
{
    pthread_mutex_lock(&S->rbm);
    S->rb_live = live;
    if (!live && S->rb_state == RB_POSTED) { /* the progress thread ended without taking it */
        S->rb_rc = -ECANCELED;
        snprintf(S->rb_msg, sizeof S->rb_msg, "the server stopped before the rollback was taken (nothing changed)");
        S->rb_state = RB_DONE;
        atomic_store(&S->rb_flag, 0);
        pthread_cond_broadcast(&S->rbc);
    }
    pthread_mutex_unlock(&S->rbm);
}

int64_t ps_server_worker_pushed(const ps_server *S, int worker)
{
    if (!S || worker < 0 || worker >= S->o.workers)
        return -ERANGE;
    return atomic_load_explicit(&((ps_server *)S)->pushed_pub[worker], memory_order_acquire);
}
