/* Control plane, run-forming policy: the roster of the run's seats (one per server rank and worker rank)
 * and the decisions the rendezvous (ctl_rendezvous.c) takes over it: which join may take a seat, when the
 * run is complete, what a member's departure means (its rank free again, or a lost member to report),
 * which checkpoint step the run resumes from and why, and which members never joined. Pure functions over
 * the roster: no sockets, no threads, no logging, so each rule is testable on its own
 * (tests/common/test_ctl_forming.c). Private to the control plane's files.
 *
 * Seats are numbered servers first: server rank r is seat r, worker rank r is seat num_servers + r. */
#ifndef PFCPS_COMMON_CTL_FORMING_H
#define PFCPS_COMMON_CTL_FORMING_H

#include "common/ctl_book.h"

#include <stddef.h>
#include <stdint.h>

/* One rank of the run and the member that holds it now. The pointers belong to the holder (the service's
 * connection) and stay valid while it holds the seat. */
typedef struct ctl_seat {
    void *holder;     /* the holder (opaque here: the service's connection); NULL while the rank is free */
    const char *peer; /* the holder's host:port, for messages */
    const int64_t *steps;  /* the checkpoint steps the holder listed at join (Join.resume_steps), all > 0 */
    const ckpt_ident *ids; /* ids[i]: the run identity of its files of steps[i] (NULL: all zero) */
    size_t nsteps;
    int ever_joined; /* some member held this rank at some point (the "never joined" report) */
} ctl_seat;

/* The run being formed (or formed): its size, its seats and its state. */
typedef struct ctl_roster {
    int num_servers, num_workers;
    int resume;        /* resume from the newest checkpoint every member holds (ctl_roster_resume_step) */
    int has_expect;    /* expect is set: a step's identity must carry its seed and config digest */
    ckpt_ident expect; /* the run config's seed and config digest (run_id unused) */
    int has_run;       /* run is set (resume_run): only that run's checkpoints count */
    uint8_t run[CKPT_RUN_ID_BYTES];
    int held;          /* seats held now */
    int formed;        /* the run formed: the address book went out */
    int reforming;     /* a member of the formed run joined again (it restarted): the run must re-form */
    ctl_seat *seats;   /* [num_servers + num_workers], servers first */
} ctl_roster;

/* A join's outcome (ctl_roster_admit). */
typedef struct ctl_admission {
    int code;         /* 0: the join takes seat `seat`; else the positive errno of the refusal: ERANGE (rank
                       * outside the run) or EAGAIN (retry: the run is re-forming, or the rank is still held) */
    int seat;         /* the seat taken (code 0) */
    int restarted;    /* 1 on the first join of a member of the formed run: every member must be told that it
                       * was lost (the run re-forms from the newest complete checkpoint); 0 on later ones */
    char reason[512]; /* the refusal's text, sent to the joining member; "" when admitted */
} ctl_admission;

/* What a member's departure means (ctl_roster_release). */
typedef enum {
    CTL_GONE_NOTHING = 0, /* it held no seat (never joined, or already released) */
    CTL_GONE_FREED,       /* before the run formed: its rank is free again for another process */
    CTL_GONE_QUIET,       /* after the run formed, in order (it said it leaves, or the shutdown went out) */
    CTL_GONE_LOST,        /* after the run formed, without saying so (crash, kill -9): tell every member */
} ctl_gone;

/* An empty roster for num_servers + num_workers seats (each >= 1). Returns 0 or -ENOMEM (pf_errmsg()). */
int ctl_roster_init(ctl_roster *r, int num_servers, int num_workers, int resume);

/* Frees the seats and zeroes the roster. */
void ctl_roster_free(ctl_roster *r);

/* Seats in the run (num_servers + num_workers). */
int ctl_roster_size(const ctl_roster *r);

/* The seat of (role, rank): rank for a server, num_servers + rank for a worker; -1 when rank is outside
 * [0, num_servers) or [0, num_workers). */
int ctl_roster_seat(const ctl_roster *r, ctl_role role, int rank);

/* The role and rank of seat i (0 <= i < ctl_roster_size). */
ctl_role ctl_roster_role(const ctl_roster *r, int i);
int ctl_roster_rank(const ctl_roster *r, int i);

/* Decides an authenticated join as (role, rank), in this order: a rank outside the run is refused (ERANGE);
 * once the run formed, a join for a seat whose member is still connected is refused with EAGAIN and changes
 * nothing (another process with the run's secret: a second run on the same rendezvous; a restarted member's
 * old connection is gone, or is dropped at its read deadline, before its seat frees); any other join after
 * the run formed is a restarted member and is refused with EAGAIN (the first one sets r->reforming and
 * out->restarted, so the caller tells every member once); before the run formed, a rank held by another
 * connection is refused with EAGAIN (its previous process may not be gone yet); otherwise the join takes
 * the seat (out->code 0: the caller then calls ctl_roster_take). Fills *out; returns out->code. */
int ctl_roster_admit(ctl_roster *r, ctl_role role, int rank, ctl_admission *out);

/* Gives seat `seat` (admitted, free) to `holder` from `peer` with its listed checkpoint steps and their
 * identities (borrowed; ids may be NULL: all zero). Returns the number of seats held now. */
int ctl_roster_take(ctl_roster *r, int seat, void *holder, const char *peer, const int64_t *steps,
                    const ckpt_ident *ids, size_t nsteps);

/* `holder` leaves seat `seat`; said_leave: it said it leaves the run (ctl_session_leave); shutdown_sent: the
 * rendezvous already broadcast the shutdown. Frees the seat when `holder` holds it and says what the
 * departure means (ctl_gone); a seat held by someone else is left alone (CTL_GONE_NOTHING). */
ctl_gone ctl_roster_release(ctl_roster *r, int seat, const void *holder, int said_leave, int shutdown_sent);

/* 1 when the run can form now: not formed yet and every seat held. */
int ctl_roster_complete(const ctl_roster *r);

/* The step the run resumes from: 0 (from scratch) without r->resume; else the newest checkpoint step that
 * every seat's holder listed (a free seat lists none) with the same identity on every seat, and (has_expect)
 * the seed and config digest of r->expect; 0 when there is none. *run_id gets the chosen step's run id
 * (untouched when 0). With has_run, a step of another run than r->run does not count. The reason goes into
 * reason[cap] (truncated to fit): one "step T skipped: ...; " per newer step: "not complete on ROLE[RANK]"
 * (the first seat lacking it), "ROLE[RANK]'s files are of another run than ROLE[RANK]'s: <fields>"
 * (ckpt_ident_diff), "of run <id>, not resume_run <id>", or "written by a run with another config: <fields>
 * (the files vs this run's config)"; then "step T is the newest checkpoint complete on all N members", or "no
 * checkpoint is complete on all N members: starting from scratch", or without resume "resume = false:
 * starting from scratch". Returns -1 when a step complete on every seat, of one run, was skipped only for
 * another config's seed or digest and is newer than the step taken (or none is): training on would write over
 * that run's checkpoints (same step names, then pruned), so the run must not form; the reason then ends with
 * what to do ("...: move them away, set resume = false to start over there, or give the run the config that
 * wrote them"). */
int64_t ctl_roster_resume_step(const ctl_roster *r, char *reason, size_t cap,
                               uint8_t run_id[CKPT_RUN_ID_BYTES]);

/* Lists the seats no member ever held as "server[1], worker[0]" in out[cap] (truncated to fit; "" when
 * none). Returns how many. */
int ctl_roster_never_joined(const ctl_roster *r, char *out, size_t cap);

/* Lists the seats nobody holds now as "server[1], worker[0]" in out[cap] (truncated to fit; "" when none).
 * Returns how many. */
int ctl_roster_missing(const ctl_roster *r, char *out, size_t cap);

/* 1 when a server's orderly leave still ends the run for the others: the run formed, the shutdown was not
 * broadcast, and not every worker has left yet (workers_left of num_workers): the workers still need its
 * shard. */
int ctl_roster_server_leave_is_loss(const ctl_roster *r, int workers_left, int shutdown_sent);

/* Hot-standby shards (replicas = 1; docs/architecture.md, "Hot-standby shards"): shard s lives on server s
 * (primary) and on server (s + 1) mod S (its backup). Whether the run can go on without server `rank` when
 * the servers marked in lost[0 .. num_servers) are gone already: 1 when every shard keeps a live copy and
 * `rank` is not 0 (server 0 holds the rendezvous), with the shards that now have a single copy listed in
 * why[cap] ("shards 2, 3"); 0 with the reason in why[cap] ("both copies of shard 1 are lost (servers 1 and
 * 2)" or "server 0 holds the rendezvous"). lost[rank] is not read. */
int ctl_failover_possible(const uint8_t *lost, int num_servers, int rank, char *why, size_t cap);

/* ctl_failover_possible without its rule for server 0: 1 when every shard keeps a live copy once server `rank`
 * (0 included) is gone besides those marked in lost[0 .. num_servers), with the shards left with a single
 * copy in why[cap]; 0 with the reason in why[cap]. A member decides with it, from its own view of the lost
 * set, whether the loss of server 0 (and of the rendezvous with it) is a failover (ctl_session.c). */
int ctl_shards_survive(const uint8_t *lost, int num_servers, int rank, char *why, size_t cap);

#endif
