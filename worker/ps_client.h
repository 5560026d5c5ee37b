/* Parameter-server client library (linked by workers through ps_client_dep).
 *
 * A ps_client is one worker's fabric endpoint towards the S servers. Requests are asynchronous: ps_pull /
 * ps_push split the ids by shard (class c lives on server c mod S), sort each server's ids, cut them into
 * messages of at most ps_wire_rows_per_msg rows and send to all servers concurrently; the returned handle is
 * completed by ps_wait (or polled with ps_test), so a worker overlaps a pull with its backbone forward.
 * Progress is manual: the library only moves data inside ps_wait / ps_test / ps_stat_get / ps_checksum
 * calls. A client is not thread-safe: use it from one thread.
 *
 * Step protocol (ps_server.h): a worker pulls rows tagged with its current step t and pushes exactly one
 * push per step, tagged t, to every server (ps_push does that, sending an empty push to servers without
 * rows). Under BSP the pull of step t+1 completes only after all W workers pushed step t.
 *
 * Errors: negative errno codes; pf_errmsg() has the text (for server-side errors, the server's message:
 * "server 1: id 99 at index 3 is >= num_classes 50").
 *
 * Dead servers: a server whose endpoint is gone (killed, closed) fails the requests that need it with -ECOMM
 * and a message naming it and what failed ("server 1: push request send failed: Transport endpoint is not
 * connected"), promptly, not at the caller's ps_wait timeout. It is found unreachable when a send to it
 * completes with an error, when a post to it cannot go out within the client's timeout (fab_send's bounded
 * retry, ps_client_set_timeout), or when it leaves a liveness probe unanswered for that timeout: a server
 * silent for 1 s (or a quarter of the timeout, if less) while messages wait for it is sent a stat request as
 * a probe, which also catches a server killed after it received a request (no completion ever comes for that
 * on this side). With libfabric 1.17's tcp;ofi_rxm, messages in flight when a server dies complete with
 * errors at once; a request sent just after it died is taken by the dead connection without an error, and
 * later posts to it stay -FI_EAGAIN, so that case ends after the silence plus the timeout. From then on every
 * request touching the server fails at once (ps_pull / ps_push / ps_stat_get / ps_checksum return
 * -ECOMM, nothing sent); requests to the other servers keep working. A client never marks a server alive
 * again.
 *
 * Hot-standby shards (replicas = 1; docs/architecture.md, "Hot-standby shards"): shard s also has a backup
 * copy on server (s + 1) mod S, on that server's second endpoint (ps_client_add_copy). ps_push sends every
 * push to both copies of each shard and completes when both acknowledged it; pulls, stats and checksums go to
 * the shard's serving copy, its primary until the rendezvous announces that server lost
 * (ps_client_server_lost). Then the lost server's copies are retired: pull messages in flight to it are sent
 * again to the shard's other copy, push messages to it are dropped (the other copy acknowledges its own),
 * and every later request goes to the other copies. A transport error towards a copy whose shard has another
 * one does not fail requests at once: the client waits for the rendezvous' decision, which every member gets
 * alike, up to the client's timeout (a worker deciding alone could leave the copies with different pushes).
 * Every message carries the membership epoch (ps_wire.h); late replies of a retired copy are dropped.
 * The Parameter Server (Li et al., OSDI 2014, section 4.3) has the primary forward the aggregated update to its
 * replica instead; in head_mode = global each row has one pushing worker, so the bytes are the same, and the
 * worker-side copy needs one acknowledgement round trip instead of two in series (docs/architecture.md). */
#ifndef PFCPS_WORKER_PS_CLIENT_H
#define PFCPS_WORKER_PS_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "proto/ps_wire.h"

typedef struct ps_client ps_client;
typedef struct ps_req ps_req;

typedef struct ps_client_opts {
    const char *provider; /* "tcp", "shm", "verbs" */
    int rank;             /* this worker's rank (in [0, W)) */
    int servers;          /* S */
    int64_t num_classes;  /* C */
    int dim;              /* D */
    ps_dtype dtype;       /* wire dtype for pulled rows and pushed gradients */
    int window;           /* max messages in flight; 0 = min(64, 8 * S * (1 + replicas)) */
    int replicas;         /* 0, or 1: every shard also has a backup copy (see above) */
} ps_client_opts;

/* Opens the endpoint. Returns 0 or a negative code (fabric errors name the libfabric call). */
int ps_client_create(const ps_client_opts *opts, ps_client **out);

/* Sets the run's data-plane token (ctl_data_token): every request carries it and replies without it are
 * ignored. Call once the address book is known, before the first request (0: none, for tests). */
void ps_client_set_token(ps_client *c, uint64_t token);

/* on != 0: ps_push no longer copies the gradients; the caller promises not to change or free them until ps_wait
 * on that push has returned (the training loop waits for its push before the buffer is reused). */
void ps_client_set_borrow_grads(ps_client *c, int on);

/* Registers this client's Prometheus series (common/metrics.h; docs/metrics.md, "Worker") and counts into
 * them from now on: pfcps_worker_pulled_rows_total and pfcps_worker_pulled_bytes_total (rows and bytes of
 * every pull reply received whole), pfcps_worker_pushed_rows_total and pfcps_worker_pushed_bytes_total (rows
 * and bytes of every push message sent, headers included), and the wait per server,
 * pfcps_worker_server_wait_seconds_total{server}: per ps_wait, for each server the request has messages
 * with, the time from the wait's start to that server's last reply within it (0 when all its replies came
 * before), or to the wait's end when it still owed one; and pfcps_worker_fenced_replies_total (replies of an
 * older membership epoch dropped, see Hot-standby shards). Returns 0 or -ENOMEM. Call once, before the
 * requests to count. */
int ps_client_metrics_on(ps_client *c);

/* This client's fabric address for the address book. *len: capacity in, bytes out. */
int ps_client_getname(ps_client *c, void *addr, size_t *len);

/* Inserts server s's fabric address (shard s's primary copy). Returns 0, -ERANGE (s), -EINVAL (address). */
int ps_client_add_server(ps_client *c, int s, const void *addr, size_t len);

/* Inserts the fabric address of copy `copy` of shard s: 0 its primary (server s, as ps_client_add_server), 1
 * its backup (replicas = 1: server (s + 1) mod S's second endpoint). Returns 0, -ERANGE (s or copy), -EINVAL
 * (address). */
int ps_client_add_copy(ps_client *c, int s, int copy, const void *addr, size_t len);

/* The rendezvous announced server `server` lost at membership epoch `epoch` (ctl_session_failover): posts to
 * its endpoints fail from now on, and the next progress of the client retires its copies (see Hot-standby
 * shards above) and carries the epoch in every message. Safe from any thread (the worker's control watcher
 * calls it while the training thread waits in ps_wait). Returns 0 or -ERANGE. */
int ps_client_server_lost(ps_client *c, int server, uint32_t epoch);

/* Whether a rendezvous decides this member's failovers now (1, the default) or none does (0: the rendezvous
 * was lost with server 0 and the member failed server 0 over itself). Without one, no failover can come for a
 * copy that is only suspect (a transport error: see server_dead in ps_client.c): a shard whose other copy is
 * removed, lost or dead while this copy is suspect has no copy left, and its requests fail at once (-ECOMM)
 * instead of after the client's timeout. Safe from any thread (the control watcher sets it). */
void ps_client_set_rendezvous(ps_client *c, int present);

/* The first shard none of whose copies is live (each removed from the run or found dead), or -1. Call from
 * the thread that makes progress. */
int ps_client_shard_without_copy(const ps_client *c);

/* While no rendezvous is left (ps_client_set_rendezvous(c, 0)): sends a liveness probe (a stat) to every copy
 * not known lost that has none in flight, takes the replies and errors that have arrived without waiting for
 * more, and returns ps_client_shard_without_copy; with a rendezvous it does nothing and returns -1. A probe
 * left unanswered for the client's loss bound (an eighth of its timeout without a rendezvous) marks its copy
 * dead, so calling this about once a second finds a shard whose servers are all gone within about that bound.
 * For a thread that owns the client and waits on something else (the ring, train_net.c); it may block in a
 * post for up to that bound. */
int ps_client_check_copies(ps_client *c);

/* Raises the membership epoch the client's messages carry to `epoch` (never lowers it). Any thread. */
void ps_client_set_epoch(ps_client *c, uint32_t epoch);

/* Server `server`, removed by a failover, rejoined the run (docs/architecture.md, "Hot-standby shards",
 * Rejoin) with new endpoints: addr[0] (its primary copy, of shard `server`) and addr[1] (its backup copy, of
 * shard server - 1), the parts of its book entry. Both copies take every later push again, pulls of shard
 * `server` go to its primary, and the client's epoch rises to `epoch`. Call on the training thread between
 * steps, with nothing in flight to the removed copies. Returns 0, -ERANGE (rank, or replicas off), -EEXIST
 * (its copies were never removed), -EBUSY (a message to them still in flight), or an address error. */
int ps_client_server_back(ps_client *c, int server, const void *const addr[2], const size_t len[2],
                          uint32_t epoch);

/* The membership epoch the client's messages carry (0 until a failover). */
uint32_t ps_client_epoch(const ps_client *c);

/* Opens the connection to every server copy (a stat round trip each) so the first step does not pay for it;
 * the copies of servers posted lost before (ps_client_server_lost) are retired first and skipped. Returns 0
 * or the first error (-ETIMEDOUT after timeout_s seconds). */
int ps_client_warmup(ps_client *c, double timeout_s);

/* Starts pulling rows ids[0..n) into out (n x D floats, row i of out = class ids[i]; converted from the
 * wire dtype). ids may be in any order and may repeat; each must be in [0, C) (else -ERANGE, nothing
 * sent). ids and out must stay valid until ps_wait returns. step: the worker's current step (>= 0).
 * Returns 0 and *req, or a negative code (-ECOMM, nothing sent, when a server holding one of the ids is known
 * to be unreachable). */
int ps_pull(ps_client *c, const int64_t *ids, size_t n, float *out, int64_t step, ps_req **req);

/* Starts pushing row gradients grads (n x D floats, row i for class ids[i]) with learning rate lr for step
 * `step`; sends a (possibly empty) push to every server. The inputs are copied before ps_push returns.
 * Returns 0 and *req, -ERANGE for a bad id, -ECOMM (nothing sent) when any server is known to be unreachable,
 * or another negative code. */
int ps_push(ps_client *c, const int64_t *ids, size_t n, const float *grads, float lr, int64_t step,
            ps_req **req);

/* ps_push with header flags (proto/ps_wire.h PS_PUSH_*: PS_PUSH_SNAPSHOT asks every server to snapshot its
 * shard once this step is applied). */
int ps_push_ex(ps_client *c, const int64_t *ids, size_t n, const float *grads, float lr, int64_t step,
               uint32_t flags, ps_req **req);

/* Waits up to timeout_s seconds (< 0: no limit) for req; while it waits it logs "still waiting" every client
 * timeout / 16 (ps_client_set_timeout), counted from the first ps_wait on req, so that a caller waiting in
 * several calls is told of the whole stall once per period, and a -ETIMEDOUT's message gives the time since
 * that first wait. Returns 0 when every server answered OK, the first
 * server error (pf_errmsg has the server's text), -ECOMM as soon as a server the request needs is found
 * unreachable (see "Dead servers" above; so even with no limit a dead server ends the wait within about the
 * client's timeout, while a live server holding a pull for its step is waited for), -ECANCELED once the
 * process' fab_set_interrupt flag is raised (common/fabric.h: its control watcher saw the run break), another
 * negative code for a failure on this side, or -ETIMEDOUT (req stays valid: wait again). Any return other
 * than -ETIMEDOUT releases req: replies still due from other servers are dropped when they come, never
 * written to the request's buffers, so they may be freed at once. */
int ps_wait(ps_client *c, ps_req *req, double timeout_s);

/* Makes progress; returns 1 when req is complete or has failed (then call ps_wait to collect it), 0 if not
 * yet. */
int ps_test(ps_client *c, ps_req *req);

/* Server s's counters (ps_stat in ps_wire.h). Returns 0 or a negative code. */
int ps_stat_get(ps_client *c, int s, ps_stat *out, double timeout_s);

/* Tells every shard's serving copy that this worker finished training (a stat request with PS_STAT_DONE,
 * proto/ps_wire.h), waiting up to timeout_s for all the replies together (a copy whose process is gone
 * refuses the posts to it: the exchange still ends by then; every shard is tried for at least PS_DONE_MIN_S):
 * servers that lost the rendezvous with server 0 stop once every worker said so. Call after the last request
 * completed. Returns 0, or the first failure's negative code (named in pf_errmsg(); the other shards are
 * still told). */
#define PS_DONE_MIN_S 0.5

int ps_client_done(ps_client *c, double timeout_s);

/* Server s's table checksum (shard_checksum over weights then momentum). */
int ps_checksum(ps_client *c, int s, uint64_t *out, double timeout_s);

/* Sets the client's bound, in seconds, on a post to a server that cannot go out (fab_set_timeout of its
 * endpoint) and on a liveness probe's reply (see "Dead servers" above); seconds <= 0 restores the default,
 * FAB_DEFAULT_TIMEOUT_S (120 s). Must exceed the longest time a live server may take to answer a stat: its
 * progress thread answers at once, but a reply waits for one of the server's send buffers, which another
 * worker that does not progress for a while (a long forward with large pulls outstanding) can hold, and a
 * checksum of a huge shard blocks the progress thread. A post towards an unreachable server holds the calling
 * ps_* function for up to this bound (ps_wait may then return -ECOMM later than its own timeout). */
void ps_client_set_timeout(ps_client *c, double seconds);

/* Closes the endpoint and frees everything (outstanding requests included). NULL is a no-op. */
void ps_client_destroy(ps_client *c);

#endif
