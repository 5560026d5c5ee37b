/* Parameter server: the transport and the server's life cycle. The progress thread owns the libfabric
 * endpoint: it polls the completion queue (manual progress), hands each received message to the request
 * handling (request.c) and reposts its receive buffer, sends the replies that are ready from the send buffers
 * (gathering pulled rows with the apply threads, apply.c), and runs the applies between batches. See
 * ps_server.h for the semantics and proto/ps_wire.h for the messages. */
#include "server/ps_server.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/fabric.h"
#include "common/log.h"
#include "server/centers_load.h"
#include "server/ps_server_internal.h"
#include "server/snapshot.h"

/* ---------- replies out ---------- */

/* Sends the batch's nb replies (S->sb) in order, each as soon as the rows of its pull (S->gj) are gathered
 * (pss_gather_begin / pss_gather_job: the apply threads gather with this thread). */
static void send_batch(ps_server *S, int nb)
{
    const double t0 = S->ngj > 0 ? pf_now_s() : 0;
    const uint32_t batch = pss_gather_begin(S);
    for (int i = 0; i < nb; i++) {
        sitem *it = &S->sb[i];
        if (it->job >= 0) {
            pss_gather_job(S, batch, it->job);
            metrics_observe(S->m.gather_seconds, pf_now_s() - t0);
        }
        pending *p = it->p;
        uint8_t *buf = S->send_mem + (size_t)it->buf * S->msg_bytes;
        int rc =
            fab_send(S->fab, S->worker_addr[p->req.client], buf, it->len, &S->mr_send, &S->send_ctx[it->buf]);
        if (rc < 0) {
            log_error("reply to worker %d: %s", p->req.client, pf_errmsg());
            S->send_free[S->nsend_free++] = it->buf;
        }
        pss_pend_put(S, p);
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
        /* The last free send buffer is kept for the small replies (push acknowledgements, stats, errors): a
         * worker that does not progress for a while (a long forward) holds the buffers of its pull replies in
         * flight, and a liveness probe (a stat) must still be answered at once. */
        const int reserved = S->nsend > 1 && S->nsend_free == 1 && p->status == 0 && p->req.op == PS_OP_PULL;
        if (reserved || !pss_reply_ready(S, p)) {
            prev = p;
            pp = &p->next;
            continue; /* waits for its step, or for a buffer */
        }
        int b = S->send_free[--S->nsend_free];
        uint8_t *rows = NULL;
        size_t len = pss_reply_build(S, p, S->send_mem + (size_t)b * S->msg_bytes, &rows);
        int job = -1;
        if (rows) {
            job = S->ngj++;
            S->gj[job].ids = p->ids;
            S->gj[job].dst = rows;
            S->gj[job].n = p->req.n;
            S->gj[job].dtype = p->req.dtype;
            /* local mode: the table's step; global mode: the pulling worker's own applied steps (its rows) */
            S->gj[job].target = S->o.global_mode ? S->applied_push[p->req.client] : S->steps_done;
        }
        S->sb[nb++] = (sitem){p, b, len, job};
        S->queued--;
        *pp = p->next;
        if (S->pq_tail == p)
            S->pq_tail = prev;
    }
    if (nb > 0)
        send_batch(S, nb);
}

/* ---------- progress thread ---------- */

/* Hot-standby shards: whether the progress thread must hold every message now (removed from the run, or its
 * control-plane lease ran out); logs when that starts and ends. */
static int hold_messages(ps_server *S)
{
    if (atomic_load(&S->fenced))
        return 1;
    double until = atomic_load(&S->lease_until), now = pf_now_s();
    if (now <= until) {
        if (S->lease_held)
            log_info("shard %d: lease renewed: serving again", S->o.rank);
        S->lease_held = 0;
        return 0;
    }
    if (!S->lease_held)
        log_warn("shard %d: no word from the rendezvous for %.1f s past this server's lease: taking no "
                 "message until it answers (the rendezvous may be handing the shard to its other copy)",
                 S->o.rank, now - until);
    S->lease_held = 1;
    return 1;
}

/* The progress loop's pause after `idle` (> 200) empty polls of an endpoint without a wait object: it keeps
 * polling (manual progress) but gives the core away: 10 us between polls, 100 us after a thousand empty polls
 * (the worker is computing: the wakeups would take its cores) and 500 us after a few thousand (an idle server
 * costs ~0 CPU; the first request after a long pause waits at most ~0.5 ms more). While an apply runs its
 * threads have the cores: the loop waits for its end (woken at once by it), polling the endpoint every 20 us
 * for the first few waits and every 200 us after. */
static void idle_nap(ps_server *S, int idle)
{
    if (S->applying) {
        pss_apply_wait_for(S, idle <= 250 ? 20000 : 200000);
        return;
    }
    struct timespec ts = {0, idle <= 1000 ? 10000 : idle > 3000 ? 500000 : 100000};
    nanosleep(&ts, NULL);
}

static void *progress_main(void *arg)
{
    ps_server *S = arg;
    fab_comp comps[32];
    int idle = 0;
    while (!atomic_load(&S->stop)) {
        if (atomic_load_explicit(&S->rb_flag, memory_order_relaxed))
            pss_rollback_serve(S); /* ps_server_rollback: between messages, also while messages are held */
        if (hold_messages(S)) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
            continue;
        }
        /* Idle (a few hundred empty polls): sleep in the completion queue until a message comes, woken at
         * once by the end of an apply, a rollback asked for or the stop (fab_wake); at most 1 ms while an
         * apply or a snapshot runs (its end is also seen by the loop below), 10 ms otherwise (the lease
         * and the fence are checked that often when nothing comes). */
        int n = idle > 200 && fab_can_wait(S->fab)
                    ? fab_wait(S->fab, comps, 32, S->applying || S->snap || S->snap_at >= 0 ? 1 : 10)
                    : fab_poll(S->fab, comps, 32);
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
                metrics_add(S->m.dropped_malformed, 1);
                log_warn("receive failed (%s): message dropped", fi_strerror(-comps[i].err));
            } else {
                pss_handle_msg(S, buf, comps[i].len);
            }
            if (fab_recv(S->fab, buf, S->msg_bytes, &S->mr_recv, bc) < 0)
                log_error("reposting a receive: %s", pf_errmsg());
        }
        serve_pending(S); /* acknowledgements first: the apply below overlaps the workers' next work */
        /* A snapshot asked for (global mode) begins once its step is applied, also when no push follows: the
         * workers may hold their next pushes for it (a rejoin's copy step). */
        if (S->complete || S->applying || S->snap_at >= 0) {
            pss_try_apply(S);
            serve_pending(S); /* pulls that waited for an apply */
        }
        pss_snap_left(S); /* after a promotion: a checkpoint the lost copy did not write */
        if (S->snap) {
            metrics_set(S->m.snap_progress, snap_progress(S->snap));
            /* The apply threads read S->snap (snap_before_update): finished only between applies. */
            if (!S->applying && snap_done(S->snap))
                pss_snap_wait(S);
        }
        metrics_set(S->m.queue_depth, (double)(S->queued + S->ncomplete));
        if (n > 0)
            idle = 0;
        else if (++idle > 200 && !fab_can_wait(S->fab))
            idle_nap(S, idle); /* with a wait object the next loop sleeps in fab_wait instead */
    }
    /* Stopping: every step whose pushes are all in is applied (they were acknowledged), a snapshot asked for
     * is started (ps_server_stop waits for it); a server removed from the run changes nothing more. */
    if (!atomic_load(&S->fenced)) {
        pss_snap_left(S);
        pss_apply_drain(S);
    }
    return NULL;
}

/* ---------- lifecycle ---------- */

void pss_metrics_register(ps_server *S)
{
    pss_metrics *m = &S->m;
    m->pulled_rows =
        metrics_counter("pfcps_server_pulled_rows_total", "Rows sent to workers' pulls.", NULL, 0);
    m->pushed_rows =
        metrics_counter("pfcps_server_pushed_rows_total", "Gradient rows received in pushes.", NULL, 0);
    m->pull_requests = metrics_counter("pfcps_server_pull_requests_total", "Pull requests served.", NULL, 0);
    m->push_requests = metrics_counter("pfcps_server_push_requests_total", "Push requests applied.", NULL, 0);
    m->apply_seconds = metrics_histogram(
        "pfcps_server_apply_seconds",
        "Time of one apply: the complete pushes of one step that had arrived when it started.", NULL, 0,
        metrics_latency_bounds, metrics_latency_nbounds);
    m->gather_seconds = metrics_histogram(
        "pfcps_server_gather_seconds",
        "Time from the start of a batch of pull replies until this pull's rows are gathered.", NULL, 0,
        metrics_latency_bounds, metrics_latency_nbounds);
    m->queue_depth = metrics_gauge("pfcps_server_queue_depth",
                                   "Replies waiting for their step or a send buffer, plus complete pushes "
                                   "waiting for an apply.",
                                   NULL, 0);
    m->step =
        metrics_gauge("pfcps_server_step", "Steps whose pushes from every worker are applied.", NULL, 0);
    m->staleness = metrics_gauge("pfcps_server_staleness_steps",
                                 "Steps the newest pull ran ahead of the applied step.", NULL, 0);
    m->shard_rows = metrics_gauge("pfcps_server_shard_rows", "Class centers this server owns.", NULL, 0);
    m->shard_bytes =
        metrics_gauge("pfcps_server_shard_bytes", "Bytes of its table (rows and optimizer state).", NULL, 0);
    m->snap_in_progress =
        metrics_gauge("pfcps_server_snapshot_in_progress", "1 while a snapshot is being written.", NULL, 0);
    m->snap_progress = metrics_gauge("pfcps_server_snapshot_progress_ratio",
                                     "Fraction of the shard written by the snapshot in progress.", NULL, 0);
    m->snap_duration = metrics_gauge("pfcps_server_snapshot_duration_seconds",
                                     "How long the last completed snapshot took.", NULL, 0);
    m->snap_last_ts = metrics_gauge("pfcps_server_snapshot_last_timestamp_seconds",
                                    "Unix time the last snapshot completed (0: none).", NULL, 0);
    m->snap_last_step =
        metrics_gauge("pfcps_server_snapshot_last_step", "Step of the last completed snapshot.", NULL, 0);
    m->snap_bytes =
        metrics_gauge("pfcps_server_snapshot_bytes", "Size of the last completed snapshot file.", NULL, 0);
    m->snapshots = metrics_counter("pfcps_server_snapshots_total", "Snapshots completed.", NULL, 0);
    m->snap_failures =
        metrics_counter("pfcps_server_snapshot_failures_total", "Snapshots that failed.", NULL, 0);
    static const char *const unauth[] = {"reason", "unauthenticated"}, *const malformed[] = {"reason",
                                                                                             "malformed"};
    const char *help = "Data-plane messages dropped (strangers, bad frames).";
    m->dropped_unauth = metrics_counter("pfcps_server_dropped_messages_total", help, unauth, 1);
    m->dropped_malformed = metrics_counter("pfcps_server_dropped_messages_total", help, malformed, 1);
    m->connected = metrics_gauge("pfcps_server_connected_members",
                                 "Workers connected to this server's data plane.", NULL, 0);
    m->epoch =
        metrics_gauge("pfcps_server_epoch", "Membership epoch this server is at (replicas = 1).", NULL, 0);
    metrics_set(m->shard_rows, (double)S->sh.rows);
    metrics_set(m->shard_bytes, (double)S->sh.bytes + (double)S->sh.sq_bytes + 9.0 * (double)S->sh.rows);
}

/* Logs the shard's size and the memory room the cgroup leaves. */
static void log_shard(const ps_server *S)
{
    const ps_server_opts *o = &S->o;
    log_info("shard %d/%d: %lld of %lld classes, D=%d, %d bytes per identity (fp32 weight + %s, 1-byte "
             "row state, 8 bytes of apply bookkeeping), %.3f GiB total (page-aligned)",
             o->rank, o->servers, (long long)S->sh.rows, (long long)o->num_classes, o->dim,
             (o->adamw ? 12 : 8) * o->dim + 9, o->adamw ? "AdamW's two moments" : "momentum",
             (double)(S->sh.bytes + S->sh.sq_bytes + 9 * (size_t)S->sh.rows) / (1 << 30));
    size_t cg_limit = SIZE_MAX, cg_room = shard_cgroup_room(&cg_limit);
    if (cg_room == SIZE_MAX)
        log_info("memory: no cgroup memory limit applies; the shard was checked against MemAvailable");
    else
        log_info("memory: cgroup limit %.2f GiB, %.2f GiB free in it after the shard's reservation check",
                 (double)cg_limit / (1 << 30), (double)cg_room / (1 << 30));
}

/* Allocates the message buffers (recv_bufs receive and as many send buffers of ps_wire_msg_bytes). Returns 0
 * or -ENOMEM. */
static int transport_alloc(ps_server *S)
{
    S->msg_bytes = ps_wire_msg_bytes((uint32_t)S->o.dim);
    S->nrecv = S->o.recv_bufs;
    S->nsend = S->o.recv_bufs;
    S->recv_mem = fab_buf_alloc(S->msg_bytes * S->nrecv);
    S->send_mem = fab_buf_alloc(S->msg_bytes * S->nsend);
    S->recv_ctx = calloc(S->nrecv, sizeof(buf_ctx));
    S->send_ctx = calloc(S->nsend, sizeof(buf_ctx));
    S->send_free = calloc(S->nsend, sizeof(int));
    if (!S->recv_mem || !S->send_mem || !S->recv_ctx || !S->send_ctx || !S->send_free)
        return pf_err(-ENOMEM, "out of memory for message buffers");
    return 0;
}

/* Opens the endpoint (unless the caller gave one), registers the table and the message buffers and posts
 * every receive. Returns 0 or a negative code (the fabric call named). */
static int transport_open(ps_server *S)
{
    int rc;
    if (!S->fab && (rc = fab_open(S->o.provider, &S->fab)) < 0)
        return rc;
    char modes[256];
    fab_mr_mode_str(fab_mr_mode(S->fab), modes, sizeof(modes));
    log_info("shard %d%s: fabric provider %s, mr_mode %s, %s", S->o.rank,
             S->o.backup ? " (hot-standby copy)" : "", fab_provider(S->fab), modes,
             fab_can_wait(S->fab) ? "idle progress sleeps on the completion queue's wait object"
                                  : "idle progress polls (no wait object)");
    /* The table is registered for local access only: no peer can write (or read) it remotely; rows
     * change only through the push path. */
    if ((rc = fab_mr_reg(S->fab, S->sh.base, S->sh.bytes, FI_SEND | FI_RECV, &S->mr_table)) < 0)
        return rc;
    if ((rc = fab_mr_reg(S->fab, S->recv_mem, S->msg_bytes * S->nrecv, FI_RECV, &S->mr_recv)) < 0)
        return rc;
    if ((rc = fab_mr_reg(S->fab, S->send_mem, S->msg_bytes * S->nsend, FI_SEND, &S->mr_send)) < 0)
        return rc;
    for (int i = 0; i < S->nsend; i++) {
        S->send_ctx[i] = (buf_ctx){CTX_SEND, i};
        S->send_free[S->nsend_free++] = i;
    }
    for (int i = 0; i < S->nrecv; i++) {
        S->recv_ctx[i] = (buf_ctx){CTX_RECV, i};
        if ((rc = fab_recv(S->fab, S->recv_mem + (size_t)i * S->msg_bytes, S->msg_bytes, &S->mr_recv,
                           &S->recv_ctx[i])) < 0)
            return rc;
    }
    return 0;
}

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
    S->fab = opts->fab;
    S->o.fab = NULL;
    int rc = shard_create(&S->sh, opts->num_classes, opts->servers, opts->rank, opts->dim, opts->seed,
                          S->o.apply_threads, opts->prefault);
    if (rc < 0) {
        fab_close(S->fab);
        free(S);
        return rc;
    }
    if (S->o.adamw && (rc = shard_adamw_enable(&S->sh, S->o.weight_decay)) < 0) {
        shard_destroy(&S->sh);
        fab_close(S->fab);
        free(S);
        return rc;
    }
    if (S->o.dense && (rc = shard_dense_enable(&S->sh, S->o.momentum, S->o.weight_decay, S->o.start_step)) < 0) {
        shard_destroy(&S->sh);
        fab_close(S->fab);
        free(S);
        return rc;
    }
    S->nsend = S->o.recv_bufs; /* pss_apply_init sizes the gather batches by the send buffers */
    atomic_store(&S->lease_until, 1e300);
    if (!S->o.backup)
        pss_metrics_register(S); /* a backup copy's series stay NULL: the process' series are its primary's */
    /* pss_apply_init first: it sets up the pool's mutex, which ps_server_destroy uses on a failure below. */
    if ((rc = pss_apply_init(S)) < 0 || (rc = pss_request_init(S)) < 0 || (rc = pss_undo_init(S)) < 0 ||
        (rc = transport_alloc(S)) < 0)
        goto fail;
    log_shard(S);
    if ((rc = transport_open(S)) < 0)
        goto fail;
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
    if (!srv->worker_known[rank])
        metrics_add(srv->m.connected, 1);
    srv->worker_known[rank] = 1;
    return 0;
}

int ps_server_replace_worker(ps_server *srv, int rank, const void *addr, size_t len)
{
    if (rank < 0 || rank >= srv->o.workers)
        return pf_err(-ERANGE, "worker rank %d out of range (%d workers)", rank, srv->o.workers);
    fi_addr_t a;
    int rc = fab_av_insert(srv->fab, addr, len, &a);
    if (rc < 0)
        return pf_err_wrap(rc, "worker %d's replacement", rank);
    /* The domain is FI_THREAD_SAFE (common/fabric.c), so the insert may run beside the progress thread; the
     * slot itself is one aligned 64-bit store, which that thread reads whole. */
    __atomic_store_n(&srv->worker_addr[rank], a, __ATOMIC_RELEASE);
    return 0;
}

int ps_server_start(ps_server *srv)
{
    int rc = pss_apply_pool_start(srv);
    if (rc < 0)
        return rc;
    if (srv->o.fill && shard_fill_start(&srv->sh, srv->o.apply_threads) < 0)
        log_warn("%s", pf_errmsg());
    pss_rollback_live(srv, 1);
    if (pthread_create(&srv->progress, NULL, progress_main, srv) != 0) {
        pss_rollback_live(srv, 0);
        return pf_err(-EAGAIN, "could not start the progress thread");
    }
    srv->started = 1;
    return 0;
}

void ps_server_stop(ps_server *srv)
{
    if (!srv)
        return;
    atomic_store(&srv->stop, 1);
    fab_wake(srv->fab);
    if (srv->started) {
        pthread_join(srv->progress, NULL);
        srv->started = 0;
        pss_rollback_live(srv, 0);
    }
    pss_apply_pool_stop(srv);
    if (srv->snap) {
        log_info("waiting for snapshot step %lld to be written", (long long)snap_step(srv->snap));
        pss_snap_wait(srv);
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
    pss_request_free(S);
    pss_undo_free(S);
    pss_apply_free(S);
    free(S->recv_mem);
    free(S->send_mem);
    free(S->recv_ctx);
    free(S->send_ctx);
    free(S->send_free);
    shard_destroy(&S->sh);
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
    /* snap_load sets each dense row's step (the file's, or `step`) and the lr table the rows still need. */
    return snap_load(&srv->sh, root, step, srv->o.ckpt_keyed ? &srv->o.ckpt_key : NULL, &srv->o.ckpt_id);
}

int ps_server_load_centers(ps_server *srv, const char *path)
{
    if (srv->started)
        return pf_err(-EBUSY, "ps_server_load_centers on a started server");
    return centers_load(&srv->sh, path);
}

void ps_server_set_epoch(ps_server *srv, uint32_t epoch)
{
    uint32_t cur = atomic_load(&srv->epoch);
    while (epoch > cur && !atomic_compare_exchange_weak(&srv->epoch, &cur, epoch))
        ;
    if (epoch > cur)
        metrics_set(srv->m.epoch, epoch);
}

uint32_t ps_server_epoch(const ps_server *srv)
{
    return atomic_load(&((ps_server *)srv)->epoch);
}

void ps_server_promote(ps_server *srv)
{
    if (srv->o.backup && !atomic_exchange(&srv->promoted, 1))
        log_warn("shard %d: its primary is lost: this copy now serves it and writes its snapshots",
                 srv->o.rank);
    if (!srv->o.backup && atomic_exchange(&srv->quiet, 0))
        log_warn("shard %d: its backup copy is lost: this rejoined primary writes its snapshots again",
                 srv->o.rank);
}

void ps_server_set_min_epoch(ps_server *srv, uint32_t epoch)
{
    atomic_store(&srv->min_epoch, epoch);
    ps_server_set_epoch(srv, epoch);
}

void ps_server_set_quiet(ps_server *srv)
{
    if (!srv->o.backup)
        atomic_store(&srv->quiet, 1);
}

void ps_server_set_lease(ps_server *srv, double until)
{
    atomic_store(&srv->lease_until, until);
}

void ps_server_fence(ps_server *srv)
{
    if (srv && !atomic_exchange(&srv->fenced, 1))
        log_warn("shard %d%s: removed from the run: this server answers and applies nothing more",
                 srv->o.rank, srv->o.backup ? " (backup copy)" : "");
}

int ps_server_worker_done(const ps_server *srv, int rank)
{
    if (!srv || rank < 0 || rank >= srv->o.workers || !srv->worker_done)
        return 0;
    return atomic_load(&srv->worker_done[rank]);
}

double ps_server_last_request(const ps_server *srv)
{
    return srv ? atomic_load(&((ps_server *)srv)->last_rx) : 0;
}
