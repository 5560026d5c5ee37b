/* Private to the parameter server (server/ps_server.c, request.c, apply.c, undo.c) and its test hooks: the server's
 * state and the functions its files call across. Not for the daemon's main or anyone else: they use
 * ps_server.h.
 *
 * Who touches what: the progress thread (ps_server.c) owns the endpoint, the buffers and everything below
 * except the fields marked "apply pool"; the apply threads (apply.c) read the shard and the apply's entries
 * and write rows (and, with opts.undo, each its own slots of the undo logs) while S->applying, and claim gather
 * pieces; `am` guards the pool's generation and counts; `rbm` guards a rollback handed to the progress thread. */
#ifndef PFCPS_SERVER_PS_SERVER_INTERNAL_H
#define PFCPS_SERVER_PS_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/fabric.h"
#include "common/metrics.h"
#include "server/ps_server.h"
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
    int skipped; /* PS_PUSH_SKIPPED was set */
    uint16_t nchunks, got;
    chunk **slot; /* [nchunks]: chunk i, or NULL until it came */
} push;

/* One pull reply of a batch being gathered (serve_pending, ps_server.c): its rows are gathered in pieces of
 * gpiece_rows rows by the progress thread and the apply threads together. */
typedef struct gjob {
    const int64_t *ids;
    uint8_t *dst; /* the reply's rows in the send buffer */
    uint32_t n, dtype;
    int64_t target; /* dense shards: the rows as they stand after this many steps */
    uint32_t first, pieces; /* its pieces are first .. first + pieces - 1 of the batch */
    atomic_uint done;       /* pieces gathered */
} gjob;

/* One reply of the batch serve_pending (ps_server.c) sends. */
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

/* opts.undo: one worker's undo log, the rows its newest applied push changed as they were before that apply.
 * Row i of the log: local row lrow[i], its weights, then momentum (AdamW: first moment, then second moment) at
 * val + i * nf * D, and (pfc_update = dense) its step rstep[i]. Sized by the progress thread before an apply's
 * threads start (grown, never shrunk: no allocation once a step's worth of rows fits); each segment of the
 * apply writes its own slot, so the apply threads share no lock. */
typedef struct undo_log {
    int64_t step;   /* the step of the push the log undoes, or -1: none (nothing applied, undone, or no memory) */
    int64_t newest; /* the step of the worker's newest applied push that moved rows, or -1: none. Pushes
                     * without rows (a gradient_acc window's steps before its last, a step the loss scaler
                     * skipped) leave the log as it is: they change nothing to undo */
    int64_t prev;   /* the step of its row-moving push before `newest`, -1: none, or INT64_MAX: unknown (after a
                     * restore) */
    uint64_t seq; /* the apply that wrote it (S->useq): logs are restored newest apply first */
    size_t n;     /* rows in the log */
    size_t cap;   /* rows allocated */
    int64_t *lrow;
    int64_t *rstep; /* dense shards only */
    float *val;
} undo_log;

/* A rollback asked for by ps_server_rollback, for the progress thread (fields under S->rbm). */
enum { RB_NONE = 0, RB_POSTED = 1, RB_TAKEN = 2, RB_DONE = 3 };

/* The server's Prometheus series (docs/metrics.md, "Server"; common/metrics.h), registered once by
 * ps_server_create and updated lock-free: the progress thread updates every one of them except where noted.
 */
typedef struct pss_metrics {
    pf_metric *pulled_rows, *pushed_rows; /* rows gathered for pull replies; rows of accepted push chunks */
    pf_metric *pull_requests, *push_requests; /* pull replies gathered; pushes applied */
    pf_metric *apply_seconds;                 /* apply_start to apply_finish, once per apply */
    pf_metric *gather_seconds;                /* a batch's gather start to one pull reply's rows all in */
    pf_metric *queue_depth; /* replies queued (waiting for their step or a send buffer) + complete pushes
                               waiting for their apply */
    pf_metric *step, *staleness;
    pf_metric *shard_rows, *shard_bytes;
    pf_metric *snap_in_progress, *snap_progress, *snap_duration, *snap_last_ts, *snap_last_step, *snap_bytes;
    pf_metric *snapshots, *snap_failures;
    pf_metric *dropped_unauth, *dropped_malformed;
    pf_metric *connected; /* set by ps_server_add_worker */
    pf_metric *epoch;     /* set by ps_server_set_epoch, from any thread */
} pss_metrics;

struct ps_server {
    ps_server_opts o;
    pss_metrics m;
    long queued;     /* replies in the pending queue (pq_head .. pq_tail) */
    int ncomplete;   /* pushes in S->complete */
    double apply_t0; /* pf_now_s() at the running apply's start */
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
    _Atomic uint8_t *worker_done; /* [W]: the worker said it finished training (PS_STAT_DONE) */
    _Atomic double last_rx;       /* pf_now_s() of the last message taken from a worker of the run (0: none) */
    int64_t *next_push;    /* per worker: steps pushed completely */
    int64_t steps_in;      /* min over workers of next_push: steps whose W pushes are all received */
    int64_t *applied_push; /* per worker: steps whose push was applied */
    snap_job *snap;        /* the snapshot being written, or NULL */
    int64_t snap_at;       /* global mode: checkpoint step asked for and not yet started, or -1 */
    int64_t snap_left;     /* checkpoint step this copy left to its other copy (it did not write snapshots
                            * then), or -1; pss_snap_left writes it once this copy does, if the other left no
                            * file of it */
    int snap_left_moved;   /* the table changed since snap_left's step (an apply or a rollback) */
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
    entry *ae;      /* [acap]: the step's entries */
    uint32_t *aseg; /* [acap]: first entry of each row to update */
    size_t anseg, acap;
    uint32_t *amark; /* [local rows]: apply generation that last saw the row */
    uint32_t *ahead; /* [local rows]: first entry of the row in that apply */
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
    int applying;             /* an apply's threads are running (apply_start .. apply_finish) */
    int64_t apply_t;          /* the step being applied */
    int apply_snap;           /* local mode: a push of it asked for a snapshot */
    dense_cache pcache;       /* the progress thread's maps of skipped dense steps (gathers, snapshots) */
    /* hot-standby shards (ps_server.h): set from any thread */
    _Atomic uint32_t epoch;     /* membership epoch */
    atomic_int promoted;        /* a backup copy that now serves its shard (writes its snapshots) */
    atomic_int quiet;           /* a rejoined primary whose shard's snapshots its promoted backup writes */
    _Atomic uint32_t min_epoch; /* messages of an older epoch are dropped (ps_server_set_min_epoch) */
    atomic_int fenced;          /* removed from the run: takes nothing more */
    _Atomic double lease_until; /* takes no message past this time (pf_now_s) */
    int lease_held;             /* progress thread: 1 while it holds messages because the lease ran out */
    /* opts.undo (undo.c) */
    _Atomic int64_t *pushed_pub; /* [W]: a copy of next_push for other threads (ps_server_worker_pushed) */
    undo_log *ulog;              /* [W]: each worker's undo log */
    undo_log **uapply;           /* [W]: the log of each push of the running apply (its order), or NULL */
    size_t *useg0;               /* [W + 1]: the apply's first segment of each of its pushes, then anseg */
    int un;                      /* pushes in the running apply */
    uint64_t useq;               /* applies started */
    size_t urow_floats;          /* floats per row in a log: 2 D (SGD) or 3 D (AdamW) */
    pthread_mutex_t rbm;         /* guards the rb_ fields */
    pthread_cond_t rbc;          /* signalled when a rollback is done */
    atomic_int rb_flag;          /* a rollback is posted (read by the progress thread without the lock) */
    int rb_live;                 /* the progress thread runs and takes rollbacks (else the caller does them) */
    int rb_state;                /* RB_* */
    int64_t rb_step;
    uint32_t rb_epoch;
    int rb_rc;
    char rb_msg[512];            /* the progress thread's error message for the caller */
};

/* ---------- request.c: requests, replies, the step clock ---------- */

/* Allocates the per-worker step clock and push state (S->o.workers entries) and sets the chunk size. Returns
 * 0 or -ENOMEM. */
int pss_request_init(ps_server *S);

/* Frees every push, pending reply and pooled buffer (at destroy). */
void pss_request_free(ps_server *S);

/* Handles one received message buf[0..len): validates it and queues its reply (or drops it, counted, when it
 * is not from a member of this run). Progress thread only. */
void pss_handle_msg(ps_server *S, const uint8_t *buf, size_t len);

/* A queued reply may be sent now (the step clock: see ps_server.h). */
int pss_reply_ready(const ps_server *S, const pending *p);

/* Writes reply p (header, then error text, stat / checksum payload, or room for the pulled rows) into buf.
 * Returns its length in bytes; a pull's rows are gathered later at buf + sizeof(ps_hdr), *rows_at says so
 * (else NULL). */
size_t pss_reply_build(const ps_server *S, const pending *p, uint8_t *buf, uint8_t **rows_at);

/* Returns a pending reply to its pool. */
void pss_pend_put(ps_server *S, pending *p);

/* Returns a push's chunks to the pool and frees it. NULL is a no-op. */
void pss_free_push(ps_server *S, push *p);

/* ---------- apply.c: the apply / gather thread pool, and the applies the step clock schedules ---------- */

/* Allocates the apply and gather bookkeeping (per local row, per worker, per send buffer). Returns 0 or
 * -ENOMEM. */
int pss_apply_init(ps_server *S);

/* Frees what pss_apply_init and the applies allocated. */
void pss_apply_free(ps_server *S);

/* Starts S->o.apply_threads apply threads. Returns 0, or -EAGAIN when none could start. */
int pss_apply_pool_start(ps_server *S);

/* Asks the apply threads to quit and joins them. */
void pss_apply_pool_stop(ps_server *S);

/* Finishes the running apply when its threads are done (returns 1), else starts the next apply that is ready
 * (returns 0). Progress thread only. */
int pss_try_apply(ps_server *S);

/* Applies every step that is ready, waiting for each. */
void pss_apply_drain(ps_server *S);

/* Waits up to ns nanoseconds for the running apply's threads to finish. */
void pss_apply_wait_for(ps_server *S, long ns);

/* Starts gathering the rows of the batch's S->ngj pull replies (S->gj): cuts them into pieces, wakes the
 * apply threads for more than one piece. Returns the batch number for pss_gather_job. */
uint32_t pss_gather_begin(ps_server *S);

/* Gathers, with the apply threads, until every piece of job `job` of batch `batch` is in. */
void pss_gather_job(ps_server *S, uint32_t batch, int job);

/* Waits for the snapshot in progress (if any), logs its outcome, updates the snapshot series and prunes
 * older ones. */
void pss_snap_wait(ps_server *S);

/* Finishes the running apply, if any, waiting for its threads; starts no other. */
void pss_apply_settle(ps_server *S);

/* A checkpoint this copy left to its other copy while it did not write snapshots (S->snap_left), once this
 * copy writes them (a promoted backup, or a rejoined primary whose backup was lost): when that checkpoint has
 * no file of this shard (the other copy was lost before or while it wrote it), starts it from this copy if
 * the table is still that step's (nothing applied or rolled back since: the last checkpoint of a run, asked
 * for with its last push), else logs that the checkpoint stays without this shard (an incomplete checkpoint,
 * never loaded; the next one has the shard). Progress thread, between applies; a no-op otherwise. */
void pss_snap_left(ps_server *S);

/* ---------- undo.c: undo logs and rollback (opts.undo) ---------- */

/* Allocates the per-worker undo state (also without opts.undo: the pushed-step copies). Returns 0 or
 * -ENOMEM. */
int pss_undo_init(ps_server *S);

/* Frees it. */
void pss_undo_free(ps_server *S);

/* Publishes next_push[w] for ps_server_worker_pushed. */
void pss_pushed_publish(ps_server *S, int w);

/* apply_start, once the apply's segments are set (S->aseg, S->anseg) and before its threads start: points
 * every push ps[0 .. np) (in entry order) at its worker's log, sized for the push's segments and marked as
 * step t's. A log that cannot grow is marked empty (step -1: a rollback over it is refused). */
void pss_undo_begin(ps_server *S, int64_t t, push *const *ps, int np);

/* apply_segments, before segment s (local row lrow) changes: saves the row into its slot of the log of the push
 * that segment belongs to (*ui: the push index, advanced along the thread's ascending segments). */
void pss_undo_save(ps_server *S, int *ui, size_t s, int64_t lrow);

/* ps_server_start (live = 1, before the progress thread starts) and ps_server_stop (live = 0, once it has
 * ended: a rollback posted and not taken fails with -ECANCELED): whether ps_server_rollback hands its work to
 * the progress thread or does it on the caller's thread. */
void pss_rollback_live(ps_server *S, int live);

/* apply_segments, after its last pss_undo_save: orders the log's streaming stores before the apply is reported
 * done (a store fence; nothing on targets without them). */
void pss_undo_fence(void);

/* The progress thread's part of ps_server_rollback: performs a posted rollback and signals the caller. */
void pss_rollback_serve(ps_server *S);

/* ---------- ps_server.c ---------- */

/* Registers the server's series (S->m; docs/metrics.md, "Server") and sets the shard's sizes. Series that
 * cannot be registered stay NULL (their updates cost nothing). */
void pss_metrics_register(ps_server *S);

#endif
