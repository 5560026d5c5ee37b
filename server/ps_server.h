/* Parameter-server service: one shard of the class-center table served over the fabric (ps_wire.h).
 *
 * Threads: one progress thread owns the endpoint; it polls the CQ continuously (manual progress, even
 * when idle, with a short sleep after a run of empty polls), validates every message, answers pulls,
 * collects pushes (each message is acknowledged on receipt) and, when all W pushes of the oldest open step
 * are in, has `apply_threads` apply threads update the rows while it goes on receiving; pulls are held while
 * an apply runs (a step's apply is never torn by a concurrent gather), and a stat or checksum request first
 * finishes every apply that is due. The same threads gather pull replies with the progress thread (pieces of
 * ~64 KiB claimed from a shared counter; the progress thread sends each reply once its rows are in), so a
 * server's gathers, like its applies, use `apply_threads` + 1 cores.
 *
 * Step clock (docs/architecture.md, One training step, item 8): steps_done = number of steps whose W pushes
 * have all been applied.
 *   pull tagged t: answered once steps_done >= t - max_staleness (BSP when max_staleness = 0: a pull for
 *                  step t+1 waits for every push of step t); error if the worker has not yet pushed
 *                  steps 0..t-1 (a step from the future).
 *   push tagged t: must be the worker's next step (one push per worker and step, in order) and
 *                  t <= steps_in + max_staleness + 1, steps_in = the steps whose W pushes this server has
 *                  all received (a worker that synchronised on another server's pull may run one step
 *                  ahead of this server); otherwise error. Pushes of future steps
 *                  are held until their step's turn. Gradients that several pushes of one
 *                  step send for the same row are summed (in worker-rank order, in double) and the row gets
 *                  one SGD update: v = mu*v + (g + wd*w); w -= lr*v (torch.optim.SGD, dampening 0).
 * Global head mode (opts.global_mode; docs/architecture.md, One training step, item 8): every class has one
 * owning worker, so a push is applied as soon as it is complete (the oldest step first: each worker's pushes
 * apply in step order) and a pull of step t is answered once that worker's own pushes of steps < t are
 * applied; steps_done is then the slowest worker's applied steps.
 * Push acknowledgements: sent on receipt, unless earlier steps lag behind (a push of step t is answered once
 * steps_done >= t - 1 - max_staleness in local mode, once the worker's own applied steps >= t - 1 in global
 * mode), so at most about two steps of pushes wait for the apply threads.
 * Snapshots: a push flagged PS_PUSH_SNAPSHOT for step t makes the server write checkpoint t+1, the shard as it
 * stands once every push of steps 0..t is applied and none of a later step (snapshot.h; in global mode pushes
 * of later steps wait until the slowest worker's step t is in, and a pull waits for its own worker's earlier
 * pushes to be applied). The write runs on its own thread while serving goes on; one at a time (a new one
 * waits for the previous); ps_server_stop waits for the one in progress.
 * A push is applied only after all its chunks arrived; a bad chunk discards the whole push. A bad request
 * gets an error reply naming the problem and changes nothing. */
#ifndef PFCPS_SERVER_PS_SERVER_H
#define PFCPS_SERVER_PS_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "common/ckpt_ident.h"
#include "common/snapfile.h"
#include "proto/ps_wire.h"
#include "server/shard.h"

typedef struct ps_server ps_server;

typedef struct ps_server_opts {
    const char *provider; /* "tcp", "shm", "verbs" (fabric.h) */
    int rank, servers;    /* s, S */
    int workers;          /* W: pushes per step */
    int dim;              /* D */
    int64_t num_classes;  /* C */
    uint64_t seed;        /* init generator key */
    double momentum;      /* mu */
    double weight_decay;  /* wd */
    int adamw;            /* optimizer = adamw: the rows train with AdamW (server/adamw.h; momentum unused), else
                             SGD with momentum mu */
    int max_staleness;    /* k >= 0 */
    int apply_threads;    /* >= 1: apply pushes, and gather pulls with the progress thread */
    int recv_bufs;        /* receive buffers posted; 0 = 64 */
    int prefault;         /* back every page of the table at start (shard_create) */
    int fill;             /* center_init = eager: ps_server_start generates every class center in a background
                             thread (shard_fill_start); 0: each on its first pull or push */
    int dense;            /* pfc_update = dense: every row moves every step (server/dense.h), rows a step did not
                             touch brought up to date when next read or written; 0: sparse */
    int global_mode;      /* head_mode = global: each row has one owner, pushes apply on arrival and a
                             pull waits only for the same worker's earlier pushes (read-your-writes) */
    const char *snapshot_root; /* checkpoint root (common/ckpt.h) for PS_PUSH_SNAPSHOT; NULL: snapshots off */
    int snapshot_keep;         /* newest checkpoints of this shard kept on disk (>= 1; 0 = 2) */
    int64_t start_step;        /* the step clock starts here (a resumed run: its checkpoint step), else 0 */
    uint64_t token;            /* the run's data-plane token (ps_wire.h); 0: not checked (tests) */
    ckpt_ident ckpt_id;        /* the run identity every shard file carries, and a load must find */
    int ckpt_keyed;            /* 1: shard files carry an HMAC under ckpt_key and a load verifies it */
    snapfile_key ckpt_key;     /* the checkpoint key (snapfile_key_derive of the join secret) */
    struct fab_ctx *fab;       /* an endpoint opened already (its address went into the address book), or
                                  NULL to open one for `provider`; the server owns it either way */
    int backup;                /* replicas = 1: this is the hot-standby copy of shard `rank`, held by server
                                  rank + 1 (docs/architecture.md, "Hot-standby shards"): it applies the same
                                  pushes as the primary, exports no metrics of its own and writes snapshots only
                                  once promoted (ps_server_promote) */
    int undo;                  /* keep, per worker, the rows its newest applied push changed as they were
                                  before (weights, optimizer state, dense row step; local mode: a row several
                                  pushes of the step changed, in the first one's log), so that
                                  ps_server_rollback can undo the newest applied step (docs/architecture.md,
                                  "Worker replacement in place"); costs (2 D floats, AdamW 3 D, + 16 bytes)
                                  per row of each worker's newest push, and a copy of those rows at every
                                  apply */
} ps_server_opts;

/* Allocates and initialises the shard (logs bytes per identity and total; -ENOMEM when it would not fit),
 * opens the fabric endpoint and registers the table and message buffers. Returns 0 or a negative code
 * with pf_errmsg(). */
int ps_server_create(const ps_server_opts *opts, ps_server **out);

/* The server's fabric address for the address book. *len: capacity in, bytes out. */
int ps_server_getname(ps_server *srv, void *addr, size_t *len);

/* Inserts worker `rank`'s fabric address; requests carrying that rank are answered there.
 * Call for every worker before ps_server_start. Returns 0, -ERANGE (rank), -EINVAL (address). */
int ps_server_add_worker(ps_server *srv, int rank, const void *addr, size_t len);

/* Worker `rank` is replaced in place (docs/architecture.md, "Worker replacement in place"): its requests are
 * answered at `addr` from now on. Safe while the server runs; call after ps_server_rollback and before the
 * replacement sends anything (nothing is then due to the lost worker's address). Returns 0, -ERANGE (rank),
 * or the fabric's error. */
int ps_server_replace_worker(ps_server *srv, int rank, const void *addr, size_t len);

/* Starts the progress thread and the apply threads. Returns 0 or -errno. */
int ps_server_start(ps_server *srv);

/* Stops accepting requests: the progress thread finishes the message it is handling, applies every step
 * whose pushes are all in (they were acknowledged; a snapshot one of them asks for is started) and exits;
 * apply threads are joined and the snapshot in progress is waited for. Idempotent; safe before start. */
void ps_server_stop(ps_server *srv);

/* Stops if needed and frees everything. NULL is a no-op. */
void ps_server_destroy(ps_server *srv);

/* The shard (read it only while the server is stopped, or for sizes). */
const shard *ps_server_shard(const ps_server *srv);

/* Loads checkpoint `step` from the snapshot root into the shard (snapshot.h: snap_load). Call before
 * ps_server_start, with opts.start_step == step. Returns 0 or the load's error (the server must not serve). */
int ps_server_load(ps_server *srv, const char *root, int64_t step);

/* Before ps_server_start, for a run that does not resume: the shard's rows from pretrained_centers' file
 * (server/centers_load.h). Returns 0, -EBUSY on a started server, or centers_load's errors. */
int ps_server_load_centers(ps_server *srv, const char *path);

/* Counters (approximate while running). */
void ps_server_stat(ps_server *srv, ps_stat *out);

/* ---------- hot-standby shards (replicas = 1; docs/architecture.md, "Hot-standby shards") ----------
 * These are safe from any thread (atomics): the daemon's control-plane loop calls them while the progress
 * thread serves. */

/* Raises the server's membership epoch to `epoch` (never lowers it); replies carry it (ps_wire.h). */
void ps_server_set_epoch(ps_server *srv, uint32_t epoch);

/* The server's membership epoch. */
uint32_t ps_server_epoch(const ps_server *srv);

/* A backup copy becomes the shard's serving copy because its primary was lost: from now on it writes the
 * shard's snapshots too. On a quiet primary (ps_server_set_quiet) whose backup was lost: it writes them
 * again. Idempotent. */
void ps_server_promote(ps_server *srv);

/* A copy that rejoined the run at membership epoch `epoch` (docs/architecture.md, "Hot-standby shards",
 * Rejoin): from now on it drops (and counts, as bad requests) every message of an older epoch, which could
 * only be meant for the copy it replaces, and its own epoch is at least `epoch`. */
void ps_server_set_min_epoch(ps_server *srv, uint32_t epoch);

/* A primary that rejoined the run (docs/architecture.md, "Hot-standby shards", Rejoin) writes no snapshot of
 * its shard while its promoted backup does (one writer per shard file), until ps_server_promote. A no-op on a
 * backup copy. */
void ps_server_set_quiet(ps_server *srv);

/* The server may act (answer, apply, start a snapshot) until `until` (pf_now_s() seconds), its lease on the
 * control plane (ctl_session_lease_base + lease); past it the progress thread takes no message until the lease
 * is renewed, so a process that was stopped past the time the rendezvous removes silent members starts
 * nothing when it runs again (an apply or snapshot write already running finishes). Starts unlimited. */
void ps_server_set_lease(ps_server *srv, double until);

/* Removes the server from the run for good (the rendezvous removed it, or its control connection broke): it
 * takes no more messages, and ps_server_stop applies nothing more. Idempotent. */
void ps_server_fence(ps_server *srv);

/* 1 when worker `rank` (0 <= rank < workers) said it finished training (a stat request with PS_STAT_DONE,
 * proto/ps_wire.h), else 0 (also for a rank out of range). Safe from any thread. */
int ps_server_worker_done(const ps_server *srv, int rank);

/* When this copy last took a message from a worker of the run (pf_now_s() seconds; 0 when none yet, or srv is
 * NULL). Safe from any thread. */
double ps_server_last_request(const ps_server *srv);

/* ---------- in-place worker replacement (opts.undo; docs/architecture.md, "Worker replacement in place")
 * ---------- */

/* Takes back every push of steps >= `step` so that the workers can redo from `step` and end bit-identical to
 * an uninterrupted run. For every worker w:
 *   - a push of w of step >= step that was applied is restored from w's undo log: it must be w's newest applied
 *     push, of step `step` exactly (applied steps of w = step + 1), and the log must hold that step (local
 *     mode: or hold an older step, when every row of w's push was logged in another worker's log); otherwise
 *     -ERANGE names the worker and the steps, and NOTHING is changed (every worker is checked first);
 *   - pushes of steps >= step received completely but not applied, or in part, are discarded;
 *   - w's pushed and applied step counts become min(their value, step); the step clock follows;
 * a snapshot asked for at a step >= step and not begun is forgotten; replies queued for pulls and pushes of
 * steps >= step are dropped (they answer the abandoned attempt); the lr table (pfc_update = dense, AdamW's
 * step counts) forgets steps >= step, so the redo records them again; the membership epoch and the oldest
 * epoch accepted become at least `epoch`, so a late chunk of the abandoned attempt's epoch is dropped.
 * On a started server the progress thread does it between messages, after the running apply is finished and
 * the snapshot being written is complete; the caller (any thread: the daemon's control thread) blocks until
 * then. On a server never started (or stopped) it runs on the calling thread. timeout_s: how long to wait for
 * the progress thread to take the request (< 0: forever); once taken, the call waits for its end, so -ETIMEDOUT
 * always means nothing changed. Returns 0, -EINVAL (opts.undo off, step < 0), -ERANGE (above), -EBUSY (another
 * rollback is in progress), -ETIMEDOUT, -ECANCELED (the server stopped before taking it: nothing changed); the
 * reason in pf_errmsg() on the caller's thread. */
int ps_server_rollback(ps_server *srv, int64_t step, uint32_t epoch, double timeout_s);

/* The number of steps whose push from worker `worker` this server has received completely (pushes of steps
 * 0 .. n - 1, or start_step .. n - 1 on a resumed run), whether applied or not. Safe from any thread (an
 * atomic copy the progress thread updates). Returns n, or -ERANGE for a worker out of range. */
int64_t ps_server_worker_pushed(const ps_server *srv, int worker);

#endif
