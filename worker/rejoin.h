/* A worker's part in a failed-over server's rejoin (replicas = 1; docs/architecture.md, "Hot-standby shards",
 * Rejoin), shared by pfcps-worker (worker/train.c) and the Python module (python/src/_C.c):
 *
 *   1. the control watcher stores the rendezvous' notices (rejoin_notice): "rejoin begins" (kind
 *      CTL_FO_REJOIN_BEGIN), then "rejoined" or "rejoin aborted";
 *   2. at a step boundary every worker contributes rejoin_vote() to an allreduce (max), so that all agree on
 *      the same begins epoch at the same step, and rejoin_agree() fixes the copy's checkpoint step T;
 *   3. the push of step T - 1 asks the servers for checkpoint T (PS_PUSH_SNAPSHOT); once it is acknowledged,
 *      rejoin_hold() (worker 0) tells the rendezvous T and (every worker) holds its next pull and push until
 *      the learner holds its copies (the client sends to both copies again) or the rejoin was aborted.
 *
 * Threads: rejoin_notice runs on the control watcher, everything else on the training thread. */
#ifndef PFCPS_WORKER_REJOIN_H
#define PFCPS_WORKER_REJOIN_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/ctl.h"
#include "worker/ps_client.h"

typedef struct rejoin_state {
    _Atomic uint32_t begin_epoch; /* epoch of the newest rejoin-begins notice (0: none) */
    _Atomic uint32_t end_epoch;   /* epoch of the newest rejoined / aborted notice, stored after `end` */
    atomic_int taken;             /* the training thread took the newest rejoined notice */
    struct {
        int kind; /* CTL_FO_REJOINED or CTL_FO_REJOIN_ABORTED */
        int server;
        size_t len;
        uint8_t addr[CTL_MAX_ADDR]; /* the rejoined server's book entry */
    } end;
    int server;          /* the rejoining server (from the begins notice) */
    uint32_t wait_epoch; /* the begins epoch the workers agreed to copy for (0: none) */
    int64_t ckpt;        /* the checkpoint step of that copy (-1: none) */
} rejoin_state;

/* Nothing begun, nothing agreed. */
void rejoin_init(rejoin_state *r);

/* The control watcher's notice of kind CTL_FO_REJOIN_BEGIN, CTL_FO_REJOINED or CTL_FO_REJOIN_ABORTED about
 * `server` at `epoch`; addr (len bytes, common/member_addr.h) is a rejoined server's book entry. A rejoined
 * notice the training thread has not taken yet is kept until it has (up to 10 s, polling every ms). */
void rejoin_notice(rejoin_state *r, int kind, int server, uint32_t epoch, const void *addr, size_t len);

/* This worker's part of the step boundary's allreduce (max): the epoch of a rejoin it was told began and not
 * yet ended, 0 when none (epochs are small integers, exact in float). */
float rejoin_vote(const rejoin_state *r);

/* The allreduced vote `agreed` at a step boundary whose push of step ckpt - 1 is yet to go: when it names a
 * rejoin newer than the last agreed and none is pending, the copy's checkpoint step becomes `ckpt`, logged.
 * Returns 1 then, else 0. */
int rejoin_agree(rejoin_state *r, uint32_t agreed, int64_t ckpt);

/* Whether the push of step `step` (0-based) must ask for the copy's checkpoint (PS_PUSH_SNAPSHOT). */
static inline int rejoin_snapshot_push(const rejoin_state *r, int64_t step)
{
    return r->ckpt >= 0 && step + 1 == r->ckpt;
}

/* After the acknowledged push of checkpoint step `step`, the one agreed: worker 0 (rank 0, sess not NULL)
 * tells the rendezvous the step (the learner copies its shards from that checkpoint's files), and every
 * worker holds until the rendezvous says the learner holds its copies (ps_client_server_back with its
 * address: both copies get every push from step on) or was lost (the run goes on as it was). `stop(arg)` (may
 * be NULL), polled every ms, ends the hold early with its return value when non-zero (a stop asked for, a
 * broken run). Returns 0, a stop's value, -ETIMEDOUT after 4 x ctl_timeout (30 s when ctl_timeout is 0)
 * without an end, or the client's error; all with pf_errmsg. */
int rejoin_hold(rejoin_state *r, ctl_session *sess, ps_client *ps, int rank, int64_t step, double ctl_timeout,
                int (*stop)(void *), void *arg);

#endif
