/* Control plane: the TCP rendezvous that server rank 0 runs (common/ctl_rendezvous.c), and the session a
 * member holds with it (common/ctl_session.c). The address book types are in common/ctl_book.h, the frame
 * and message coding in common/ctl_frame.h.
 *
 * Wire: length-prefixed frames, `u32 little-endian length` then a protobuf-c message (proto/ctl.proto),
 * lengths above the configured maximum are refused. Every read has a timeout.
 * Join: the service sends a random nonce; the member answers with role, rank, its fabric address and
 * HMAC-SHA256(secret, nonce || role || rank || addr) (OpenSSL libcrypto); the secret never travels.
 * When all expected members (num_servers servers + num_workers workers) have joined, every member gets
 * the same join reply: the address book (every member's role, rank and fabric address), the effective
 * run config text and the shard map (S; class c lives on server c mod S at local row c div S).
 * A peer that sends garbage, a truncated or oversized frame, a bad secret, a taken rank, or joins
 * twice gets an error reply where possible and is dropped; the others keep being served.
 * After the reply the connection stays open for heartbeats and the shutdown broadcast.
 * A member that leaves before the run formed frees its rank (a restarted process can take it).
 * Once the run formed, an authenticated join for a rank of the run is a member that restarted: the run
 * cannot go on without re-forming, so every member is told that member was lost (their sessions return
 * -ENOLINK; the daemons exit so that they can be restarted and resume from the newest complete checkpoint)
 * and the joining member is asked to retry (EAGAIN), which ctl_join does until its timeout. A join for a
 * rank whose previous connection is still open before the run formed is retried the same way. */
#ifndef PFCPS_COMMON_CTL_H
#define PFCPS_COMMON_CTL_H

#include "common/ctl_book.h"

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ctl_rendezvous ctl_rendezvous;
typedef struct ctl_session ctl_session;

typedef struct ctl_rendezvous_opts {
    const char *bind_host; /* e.g. "127.0.0.1" or "0.0.0.0" */
    int port;              /* 0 = pick a free port (ctl_rendezvous_port tells which) */
    int num_servers, num_workers;
    const char *secret;       /* shared secret, non-empty */
    size_t max_frame;         /* bytes; frames longer than this are refused */
    double timeout_s;         /* per-read timeout */
    double bind_timeout_s;    /* how long bind_host may take to resolve (published late); 0: timeout_s */
    const char *config_text;  /* sent to every member */
    int64_t num_classes;      /* shard map's C, sent in the join reply (0 = unknown) */
    int resume;               /* pick the newest checkpoint step every member holds (book.resume_step) */
    const uint8_t *resume_run; /* NULL, or the run id (CKPT_RUN_ID_BYTES) whose checkpoints alone count when
                                * resuming (config resume_run); a run formed from none of them keeps it */
    const ckpt_ident *expect; /* the run config's seed and config digest (run_id unused): a step whose files
                                 carry others is not resumed (NULL: not compared) */
    int replicas; /* 1: a lost server whose shards keep a copy is failed over (Failover notice, new
                     epoch) instead of re-forming the run, and a joined member silent for
                     ctl_member_silence_s is removed (docs/architecture.md, "Hot-standby shards") */
    int rejoin;   /* with replicas: 1 (head_mode = global) lets a failed-over server that restarts rejoin the
                     run as a learner of its two shards (docs/architecture.md, "Hot-standby shards", Rejoin);
                     0 refuses it (EEXIST) naming why */
    int replace_workers; /* with replicas: 1 replaces a lost worker in place (docs/architecture.md,
                            "Worker replacement in place": the survivors and servers report, a restarted worker
                            of its rank joins, the servers undo the pushes of the redo step and after, every
                            worker redoes it); 0: a lost worker re-forms the run */
    int gradient_acc;    /* the run's gradient_acc (0 is taken as 1): the redo step is a window start, the
                            lost worker's class-center sums of the window being lost with it */
    int metrics;              /* 1: export the rendezvous series (docs/metrics.md, "Rendezvous") and serve
                                 /targets on the process' metrics endpoint (ctl_rendezvous_start); 0: neither
                                 (tests running several services in one process) */
} ctl_rendezvous_opts;

/* Starts the rendezvous service on its own thread. Returns 0 or -errno (bind failure names host:port).
 * With opts.metrics it registers the rendezvous series (common/metrics.h): members joined now, members
 * expected, joins accepted, members lost, re-forms, and pfcps_rendezvous_member_info{member_role,
 * member_rank, metrics_address} = 1 per joined member (removed when it leaves); and the page /targets
 * (metrics_add_page, "application/json"): Prometheus HTTP service discovery
 * (https://prometheus.io/docs/prometheus/latest/http_sd/), one entry {"targets": ["host:port"], "labels":
 * {"role": "worker", "rank": "1"}} per joined member that reported a metrics address, servers first, by
 * rank. A member that bound an unspecified host (0.0.0.0, ::) is listed at the host its control connection
 * came from. At most one service per process should set it: the page shows the latest one's members. */
int ctl_rendezvous_start(const ctl_rendezvous_opts *opts, ctl_rendezvous **out);

/* The TCP port actually bound. */
int ctl_rendezvous_port(const ctl_rendezvous *rv);

/* Members currently joined (0 .. num_servers + num_workers); for progress logs and tests. */
int ctl_rendezvous_joined(const ctl_rendezvous *rv);

/* 1 once every worker of the formed run has left it in order (ctl_session_leave: done, or stopped on
 * request): the run is over and server 0 can shut it down. */
int ctl_rendezvous_workers_done(const ctl_rendezvous *rv);

/* replicas = 1: 1 once this rendezvous fenced itself: its service did not run for longer than the silence
 * limit in a formed run (its process was stopped), so the members took server 0 for lost; it closed every
 * connection and stopped. Its host must stop serving and exit (server/main.c: DAEMON_EXIT_REPLACED). Safe
 * from any thread. */
int ctl_rendezvous_fenced(const ctl_rendezvous *rv);

/* replicas = 1: 0 while this rendezvous runs no adopted run (a run of its own, or none yet); 1 while it
 * adopts or adopted a running run (its members resumed it here: docs/architecture.md, "Server 0 and the
 * rendezvous") that neither re-forms nor shuts down, so that its host's own join, refused (EAGAIN) while the
 * members are busy (a worker's replacement) or waiting for its copy step, is worth trying again; 2 once such
 * a run was told to re-form (its host then exits for the re-form too). Safe from any thread. */
int ctl_rendezvous_adopting(const ctl_rendezvous *rv);

/* Tells every joined member that the member (role, rank) living in this process (server 0, which runs the
 * rendezvous) failed, with `why` (its error message, truncated to 511 bytes): their ctl_session_wait_shutdown
 * returns -ENOLINK with "server[0] (the rendezvous' host) failed: <why>". Sent by the service thread, before
 * ctl_rendezvous_stop closes the connections. Once per service; later calls do nothing. */
void ctl_rendezvous_member_failed(ctl_rendezvous *rv, int role, int rank, const char *why);

/* Sends the shutdown message to every joined member (they see it in ctl_session_wait_shutdown). */
void ctl_rendezvous_broadcast_shutdown(ctl_rendezvous *rv);

/* Stops the service thread, closes every connection, frees. */
void ctl_rendezvous_stop(ctl_rendezvous *rv);

/* Joins the run at host:port as (role, rank) with fabric address `addr` and waits (up to timeout_s in
 * total) for the address book; a refused connection, and a rendezvous that says to retry (the run is
 * re-forming after a member restarted, or the rank's previous connection is still open), are retried until then. Returns 0 and
 * a session (whose book stays valid until close), or -ECONNREFUSED / -ETIMEDOUT / -EACCES (bad secret)
 * / -EEXIST (rank taken or joined twice) / -ERANGE (rank outside the run) / -EPROTO / -EMSGSIZE,
 * with the service's error text in pf_errmsg(); -ECANCELED when the rendezvous shut the run down before it
 * formed; -EINTR within ~0.1 s of the ctl_set_interrupt flag being raised (the connection is closed:
 * before the run formed the rendezvous frees the rank and logs that the member left). */
int ctl_join(const char *host, int port, ctl_role role, int rank, const void *addr, size_t addr_len,
             const char *secret, size_t max_frame, double timeout_s, ctl_session **out);

/* The metrics address ("host:port" the process' metrics endpoint bound; NULL or "" for none) sent with every
 * later ctl_join (copied; the rendezvous lists it in its /targets page). Returns 0, or -EINVAL when it is
 * CTL_MAX_METRICS_ADDR (256) bytes or longer. */
int ctl_set_metrics_address(const char *address);

/* The member's replicas (its config's, 0 or 1) sent with every later ctl_join. A server whose value differs
 * from the run's is refused (-EINVAL, with the reason) at its join: its endpoints (one, or two with the
 * backup copy's) could not serve the run's copies. */
void ctl_set_replicas(int replicas);

/* A worker's values of the keys its endpoints were opened with (cfg_keys_text of cfg_worker_endpoint_keys),
 * sent with every later ctl_join (copied; NULL or "" sends none). The rendezvous refuses a worker whose
 * values differ from the run's (-EINVAL, naming each key) before it takes a seat. Returns 0, or -EINVAL when
 * it is CTL_MAX_ENDPOINT_KEYS (2048) bytes or longer. */
#define CTL_MAX_ENDPOINT_KEYS 2048
int ctl_set_endpoint_keys(const char *text);

/* Makes every later ctl_join in this process give up with -EINTR once *flag is non-zero (a daemon passes
 * the flag its SIGTERM/SIGINT handler sets, so a stop request is honoured while the run is still forming
 * instead of after the whole join timeout). NULL turns it off. Set it once, before joining. */
void ctl_set_interrupt(const volatile sig_atomic_t *flag);

/* As ctl_set_interrupt, with a function the join calls at each of its ticks (about every 0.1 s) from the
 * joining thread: non-zero makes the join give up with -EINTR (pfcps.torch runs Python's signal handlers
 * there, so that Ctrl-C ends a join as it ends any Python call). NULL turns it off. */
void ctl_set_interrupt_check(int (*check)(void));

/* The checkpoint steps (common/ckpt.h) this process holds complete and valid, with the run identity their
 * files carry (ids[i] of steps[i]), sent with every later ctl_join (copied; n <= CTL_MAX_RESUME_STEPS, steps
 * > 0). When the rendezvous resumes (ctl_rendezvous_opts.resume) it picks the newest step every member listed
 * with one identity, matching the run config's seed and config digest, and says it in the book (resume_step,
 * resume_reason, run_id). */
void ctl_set_resume_steps(const int64_t *steps, const ckpt_ident *ids, size_t n);

/* The run's data-plane token (proto/ps_wire.h): the first 8 bytes (little-endian) of
 * HMAC-SHA256(secret, "pfcps data plane v1\0" || nonce), nonce = the book's run_nonce; never 0. Every member
 * computes it from the secret it joined with, so nobody without the secret can produce it. Returns 0 or -EIO. */
int ctl_data_token(const char *secret, const uint8_t nonce[16], uint64_t *token);

/* The address book received at join. */
const ctl_book *ctl_session_book(const ctl_session *s);

/* Waits up to timeout_s (< 0: forever) for the shutdown broadcast; sends heartbeats meanwhile.
 * Returns 1 on shutdown, 2 when a failover notice came (replicas = 1: a server was lost and the run goes on
 * with its shards' other copies; ctl_session_failover says which; the session stays usable), 0 on timeout,
 * -ENOLINK when another member was lost and the run must re-form (ctl_session_leave; the session stays
 * usable), other -errno when the connection broke. */
int ctl_session_wait_shutdown(ctl_session *s, double timeout_s);

/* The newest failover notice ctl_session_wait_shutdown returned 2 for: its membership epoch (>= 1; 0: none
 * came yet), the lost server's rank in *server and the rendezvous' text in *text (valid until the next wait
 * call; either may be NULL). Design: docs/architecture.md, "Hot-standby shards". */
uint32_t ctl_session_failover(const ctl_session *s, int *server, const char **text);

/* The newest failover notice's kind (CTL_FO_* of common/ctl_book.h: a lost server, or one of a rejoin's
 * notices), with its step in *step and its fabric address (a rejoined server's book entry) in
 * *addr[*addr_len] (valid until the next wait call; each may be NULL). */
int ctl_session_failover_kind(const ctl_session *s, int64_t *step, const uint8_t **addr, size_t *addr_len);

/* Tells the rendezvous, for the rejoin of server `server` (docs/architecture.md, "Hot-standby shards"):
 * kind CTL_FO_REJOIN_STEP, from a worker: the workers took checkpoint `step` for the learner to copy from;
 * CTL_FO_REJOIN_READY, from the learner: both its copies are loaded and serving. `epoch`: the sender's
 * membership epoch. Safe beside a thread waiting in ctl_session_wait_shutdown (frames are sent whole, one at
 * a time). Returns 0, -EINVAL (another kind) or the send's -errno. */
int ctl_session_rejoin_report(ctl_session *s, int kind, int server, uint32_t epoch, int64_t step);

/* Sends the rendezvous a member's report (a Failover message; proto/ctl.proto lists what each kind carries):
 * CTL_FO_REJOIN_STEP, CTL_FO_REJOIN_READY (as ctl_session_rejoin_report), CTL_FO_WORKER_REPORT (a worker: its
 * first unfinished step and, in addr[addr_len], its book entry with its new collectives endpoint, which is
 * this session's entry from then on; a server: how many steps' pushes of the lost worker `rank` it holds
 * whole), CTL_FO_ROLLED_BACK (a server undid the pushes of steps >= step), CTL_FO_STATE_READY (the donor
 * wrote its state of `step` for the replacement), CTL_FO_NO_REDO (a worker told of a lost worker before its
 * first step began: it cannot redo a step, and the replacement falls back to the re-form), CTL_FO_END_VOTED
 * (a worker passed the end vote at step `step`, the last: every worker's final outputs are written, so a
 * worker lost from then on needs no replacement). `epoch`: the sender's membership epoch. Safe beside a
 * thread waiting in ctl_session_wait_shutdown. Returns 0, -EINVAL (another kind, an address over
 * CTL_MAX_ADDR), -ENOTCONN (the rendezvous is lost with server 0) or the send's -errno. Design:
 * docs/architecture.md, "Worker replacement in place". */
int ctl_session_report(ctl_session *s, int kind, int rank, uint32_t epoch, int64_t step, const void *addr,
                       size_t addr_len);

/* Sets the interval between heartbeats (seconds > 0; 1 s by default). A member that holds a lease on its role
 * (ctl_session_lease_base) sends them often enough to renew it well before it runs out. */
void ctl_session_set_heartbeat(ctl_session *s, double seconds);

/* The lease base, pf_now_s() seconds: the send time of the newest heartbeat the rendezvous echoed (0 when
 * none was echoed yet). The rendezvous heard from this member no earlier than that, so with replicas = 1,
 * where it removes a member silent for ctl_member_silence_s, a member that holds its role only until base + a
 * lease shorter than that silence stops acting before the rendezvous can hand its role to another (a lease in
 * the sense of Gray and Cheriton, SOSP 1989). Safe to call from any thread. */
double ctl_session_lease_base(const ctl_session *s);

/* With replicas = 1: how long the rendezvous lets a joined member that has sent a heartbeat stay silent
 * before it removes it (a stopped or hung process is lost like a killed one): ctl_timeout / 4, at least 2 s.
 */
static inline double ctl_member_silence_s(double ctl_timeout)
{
    double d = ctl_timeout / 4;
    return d < 2 ? 2 : d;
}

/* replicas = 1 (docs/architecture.md, "Hot-standby shards", "Server 0 and the rendezvous"): from now on a
 * close of the control connection (EOF or RST: the rendezvous never closes a member's connection without an
 * explicit message first, so a close means server 0's process is gone) is taken, when every shard keeps a live
 * copy without server 0 in this member's view of the lost set (the failover notices it got) and no rejoin is
 * under way, as server 0's failover: ctl_session_wait_shutdown returns 2 with a notice of kind CTL_FO_LOST
 * for server 0 at the session's epoch + 1, exactly as if the rendezvous had sent it, and the session is
 * orphaned (ctl_session_orphaned). Otherwise the close is returned as an error (-ECONNRESET / -EPIPE) with
 * "... falling back to the checkpoint re-form" and the reason in pf_errmsg(). With config_digest (the run
 * config's digest, CKPT_DIGEST_BYTES bytes: common/ckpt.h ckpt_ident_of) the orphaned session tries the
 * rendezvous' address every 0.25 s and resumes the run with a restarted rendezvous there (a Resume message:
 * its role, rank, book entry, run id and nonce, the digest, its epoch and lost servers, authenticated with
 * the secret it joined with); the session is then connected again (not orphaned), server 0 rejoins through
 * that rendezvous, and a refusal (another run, another config) is logged and tried again. NULL: it never
 * reconnects. Call once, after ctl_join. Returns 0 or -ENOMEM. */
int ctl_session_survive_rendezvous_loss(ctl_session *s, const uint8_t *config_digest);

/* With ctl_session_survive_rendezvous_loss: a rendezvous that echoes none of this member's heartbeats for
 * `seconds` (the lease base, ctl_session_lease_base, that old) is taken as lost exactly as a closed
 * connection is (server 0 stopped, hung or cut off). The daemons pass twice ctl_member_silence_s: a
 * rendezvous that did not run for longer than that limit fences itself when it runs again
 * (ctl_rendezvous_fenced). 0 (the default): only a close counts. */
void ctl_session_set_rendezvous_silence(ctl_session *s, double seconds);

/* 1 once the session took the close of its connection as server 0's failover
 * (ctl_session_survive_rendezvous_loss) and no rendezvous took it back yet. ctl_session_wait_shutdown then
 * waits out its timeout (returns 0) or reconnects, ctl_session_leave does nothing (returns 0), ctl_session_fail and
 * ctl_session_rejoin_report return -ENOTCONN, and ctl_session_lease_base is the current time (no rendezvous
 * is left that could hand this member's role to another, so a server's lease holds). Safe from any thread. */
int ctl_session_orphaned(const ctl_session *s);

/* 1 while this member counts server `r` as failed over and not rejoined (the Failover notices it got, its
 * join reply's lost servers, and server 0 from the close of its control connection on: then until server 0
 * rejoins, a restarted rendezvous decides what the run's lost one did). 0 otherwise, also for a session that
 * does not survive the rendezvous' loss (ctl_session_survive_rendezvous_loss not called) or r out of range.
 * Safe from any thread (a notice being taken may be seen a moment late). */
int ctl_session_server_lost(const ctl_session *s, int r);

/* Says this member leaves the run in order (its work is done, or it stops on request), so that its
 * disconnect is not reported as a loss. A member that disconnects without it after the run formed (a
 * crash, kill -9) is reported to every other member: their ctl_session_wait_shutdown returns -ENOLINK
 * with "worker[1] (...) disconnected without leaving the run" in pf_errmsg(). Returns 0 or -errno. */
int ctl_session_leave(ctl_session *s);

/* Says this member is about to exit on a failure of its own, with `why` (its error message, truncated to 511
 * bytes), then the caller closes the session: the rendezvous tells every other member "<role>[<rank>] (host:port)
 * failed: <why>" (their ctl_session_wait_shutdown returns -ENOLINK with it) instead of "disconnected without
 * leaving the run". Returns 0 or -errno. */
int ctl_session_fail(ctl_session *s, const char *why);

/* Closes the connection and frees the session and its book. */
void ctl_session_close(ctl_session *s);

#endif
