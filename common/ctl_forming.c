/* Control plane, run-forming policy: who may take a rank, when the run forms, what a departure means, the
 * resume step and the never-joined report, as pure functions over the roster of seats (ctl_forming.h).
 * The rendezvous's connection loop (ctl_rendezvous.c) calls them and does the talking and the logging. */
#include "common/ctl_forming.h"

#include "common/ckpt.h"
#include "common/ctl_internal.h"
#include "common/err.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ctl_roster_init(ctl_roster *r, int num_servers, int num_workers, int resume)
{
    memset(r, 0, sizeof *r);
    r->seats = calloc((size_t)num_servers + (size_t)num_workers, sizeof *r->seats);
    if (!r->seats)
        return pf_err(-ENOMEM, "rendezvous: out of memory");
    r->num_servers = num_servers;
    r->num_workers = num_workers;
    r->resume = resume;
    return 0;
}

void ctl_roster_free(ctl_roster *r)
{
    free(r->seats);
    memset(r, 0, sizeof *r);
}

int ctl_roster_size(const ctl_roster *r)
{
    return r->num_servers + r->num_workers;
}

int ctl_roster_seat(const ctl_roster *r, ctl_role role, int rank)
{
    int limit = role == CTL_ROLE_SERVER ? r->num_servers : r->num_workers;
    if (rank < 0 || rank >= limit)
        return -1;
    return role == CTL_ROLE_SERVER ? rank : r->num_servers + rank;
}

ctl_role ctl_roster_role(const ctl_roster *r, int i)
{
    return i < r->num_servers ? CTL_ROLE_SERVER : CTL_ROLE_WORKER;
}

int ctl_roster_rank(const ctl_roster *r, int i)
{
    return i < r->num_servers ? i : i - r->num_servers;
}

int ctl_roster_admit(ctl_roster *r, ctl_role role, int rank, ctl_admission *out)
{
    const char *who = ctl_role_name((int)role);
    memset(out, 0, sizeof *out);
    out->seat = ctl_roster_seat(r, role, rank);
    if (out->seat < 0) {
        int limit = role == CTL_ROLE_SERVER ? r->num_servers : r->num_workers;
        out->code = ERANGE;
        snprintf(out->reason, sizeof out->reason, "join refused: %s rank %d is outside [0, %d)", who, rank,
                 limit);
        return out->code;
    }
    const ctl_seat *s = &r->seats[out->seat];
    if (r->formed && s->holder && !r->reforming) {
        /* The seat's member is still connected: this is not its restart (a restarted process's old
         * connection is gone, or goes at its read deadline) but another process with the run's secret, such
         * as a second run started on the same rendezvous. Refused; the run goes on. */
        out->code = EAGAIN;
        snprintf(
            out->reason, sizeof out->reason,
            "%s rank %d is held by a live member of the formed run (%s): is a second process of this rank "
            "running (started twice, or by two supervisors), or another run using this rendezvous and "
            "secret? retry",
            who, rank, s->peer ? s->peer : "?");
        return out->code;
    }
    if (r->formed) {
        /* An authenticated member of the run joins again and its seat is free: it restarted. The run cannot
         * go on; the members are told once (they exit, to be restarted with resume) and this one retries
         * meanwhile. */
        out->restarted = !r->reforming;
        r->reforming = 1;
        out->code = EAGAIN;
        snprintf(out->reason, sizeof out->reason,
                 "%s rank %d: the run is re-forming after a member restarted; retry", who, rank);
        return out->code;
    }
    if (s->holder) {
        out->code = EAGAIN;
        snprintf(out->reason, sizeof out->reason,
                 "%s rank %d is still held by %s (a previous process not yet gone?); retry", who, rank,
                 s->peer ? s->peer : "?");
        return out->code;
    }
    return 0;
}

int ctl_roster_take(ctl_roster *r, int seat, void *holder, const char *peer, const int64_t *steps,
                    const ckpt_ident *ids, size_t nsteps)
{
    ctl_seat *s = &r->seats[seat];
    s->holder = holder;
    s->peer = peer;
    s->steps = steps;
    s->ids = ids;
    s->nsteps = nsteps;
    s->ever_joined = 1;
    return ++r->held;
}

ctl_gone ctl_roster_release(ctl_roster *r, int seat, const void *holder, int said_leave, int shutdown_sent)
{
    ctl_seat *s = &r->seats[seat];
    if (!holder || s->holder != holder)
        return CTL_GONE_NOTHING;
    s->holder = NULL;
    s->peer = NULL;
    s->steps = NULL;
    s->ids = NULL;
    s->nsteps = 0;
    r->held--;
    if (!r->formed)
        return CTL_GONE_FREED;
    return shutdown_sent || said_leave ? CTL_GONE_QUIET : CTL_GONE_LOST;
}

int ctl_roster_complete(const ctl_roster *r)
{
    return !r->formed && r->held == ctl_roster_size(r);
}

int ctl_roster_server_leave_is_loss(const ctl_roster *r, int workers_left, int shutdown_sent)
{
    return r->formed && !shutdown_sent && workers_left < r->num_workers;
}

/* Does seat s's holder list checkpoint step t? *id (when not NULL) gets its files' identity. */
static int seat_has_step(const ctl_seat *s, int64_t t, ckpt_ident *id)
{
    for (size_t i = 0; i < s->nsteps; i++)
        if (s->steps[i] == t) {
            if (id && s->ids)
                *id = s->ids[i];
            else if (id)
                memset(id, 0, sizeof *id);
            return 1;
        }
    return 0;
}

/* The newest step any seat lists below `below` (0: none). */
static int64_t newest_step_below(const ctl_roster *r, int64_t below)
{
    int64_t cand = 0;
    for (int i = 0; i < ctl_roster_size(r); i++) {
        const ctl_seat *s = &r->seats[i];
        for (size_t k = 0; k < s->nsteps; k++)
            if (s->steps[k] < below && s->steps[k] > cand)
                cand = s->steps[k];
    }
    return cand;
}

/* The first seat whose holder does not list step t, or -1 when every one does. */
static int seat_missing_step(const ctl_roster *r, int64_t t)
{
    for (int i = 0; i < ctl_roster_size(r); i++)
        if (!seat_has_step(&r->seats[i], t, NULL))
            return i;
    return -1;
}

enum { STEP_OK = 0, STEP_RUNS_DIFFER = 1, STEP_OTHER_CONFIG = 2, STEP_OTHER_RUN = 3 };

/* Why step t (listed by every seat) cannot be resumed: its seats' identities differ (STEP_RUNS_DIFFER:
 * "ROLE[RANK]'s files are of another run than ROLE[RANK]'s: <fields>"), are of another run than the pinned
 * one (STEP_OTHER_RUN, resume_run: "of run <id>..., not resume_run <id>..."), or all agree on another config
 * than the run's (STEP_OTHER_CONFIG: "written by a run with another config: <fields> (the files vs this run's
 * config)"), the reason into why[cap]; STEP_OK when the step is fine (*id: its identity). */
static int step_mismatch(const ctl_roster *r, int64_t t, ckpt_ident *id, char *why, size_t cap)
{
    char diff[300];
    seat_has_step(&r->seats[0], t, id);
    for (int i = 1; i < ctl_roster_size(r); i++) {
        ckpt_ident other;
        seat_has_step(&r->seats[i], t, &other);
        if (ckpt_ident_diff(&other, id, diff, sizeof diff) != 0) {
            snprintf(why, cap, "%s[%d]'s files are of another run than %s[0]'s: %s",
                     ctl_role_name((int)ctl_roster_role(r, i)), ctl_roster_rank(r, i),
                     ctl_role_name((int)ctl_roster_role(r, 0)), diff);
            return STEP_RUNS_DIFFER;
        }
    }
    if (r->has_run && memcmp(id->run_id, r->run, CKPT_RUN_ID_BYTES) != 0) {
        char got[2 * CKPT_RUN_ID_BYTES + 1], want[2 * CKPT_RUN_ID_BYTES + 1];
        ckpt_run_id_hex(id->run_id, got);
        ckpt_run_id_hex(r->run, want);
        snprintf(why, cap, "of run %.8s..., not resume_run %.8s...", got, want);
        return STEP_OTHER_RUN;
    }
    if (r->has_expect) {
        ckpt_ident want = r->expect;
        memcpy(want.run_id, id->run_id, CKPT_RUN_ID_BYTES);
        if (ckpt_ident_diff(id, &want, diff, sizeof diff) != 0) {
            snprintf(why, cap, "written by a run with another config: %s (the files vs this run's config)",
                     diff);
            return STEP_OTHER_CONFIG;
        }
    }
    return STEP_OK;
}

int64_t ctl_roster_resume_step(const ctl_roster *r, char *reason, size_t cap,
                               uint8_t run_id[CKPT_RUN_ID_BYTES])
{
    int n = ctl_roster_size(r);
    if (!r->resume) {
        snprintf(reason, cap, "resume = false: starting from scratch");
        return 0;
    }
    int64_t best = 0, foreign = 0;
    size_t len = 0;
    if (cap)
        reason[0] = '\0';
    /* Candidates: every step any member listed, newest first; the first one all members hold, from one run
     * with this run's config, wins. */
    for (int64_t cand = newest_step_below(r, INT64_MAX); cand > 0; cand = newest_step_below(r, cand)) {
        int missing = seat_missing_step(r, cand);
        char why[400];
        ckpt_ident id;
        int mismatch = missing < 0 ? step_mismatch(r, cand, &id, why, sizeof why) : STEP_OK;
        if (missing < 0 && mismatch == STEP_OK) {
            best = cand;
            memcpy(run_id, id.run_id, CKPT_RUN_ID_BYTES);
            break;
        }
        if (mismatch == STEP_OTHER_CONFIG && !foreign)
            foreign = cand;
        if (missing >= 0)
            snprintf(why, sizeof why, "not complete on %s[%d]",
                     ctl_role_name((int)ctl_roster_role(r, missing)), ctl_roster_rank(r, missing));
        if (len < cap)
            len += (size_t)snprintf(reason + len, cap - len, "step %lld skipped: %s; ", (long long)cand, why);
    }
    if (len < cap) {
        if (foreign > best)
            snprintf(
                reason + len, cap - len,
                "resume = true, but step %lld, complete on all %d members, is of a run with another config, "
                "newer than any step this run can resume (%s%lld): training from there would overwrite its "
                "checkpoints: move them away, set resume = false to start over there, or give the run the "
                "config that wrote them",
                (long long)foreign, n, best ? "step " : "none: ", (long long)best);
        else if (best)
            snprintf(reason + len, cap - len, "step %lld is the newest checkpoint complete on all %d members",
                     (long long)best, n);
        else
            snprintf(reason + len, cap - len,
                     "no checkpoint is complete on all %d members: starting from scratch", n);
    }
    return foreign > best ? -1 : best;
}

/* Lists the seats for which skip(seat) is 0 (ctl_roster_never_joined, ctl_roster_missing). */
static int list_seats(const ctl_roster *r, int (*skip)(const ctl_seat *), char *out, size_t cap)
{
    size_t o = 0;
    int n = 0;
    if (cap)
        out[0] = '\0';
    for (int i = 0; i < ctl_roster_size(r); i++) {
        if (skip(&r->seats[i]))
            continue;
        if (o < cap)
            o += (size_t)snprintf(out + o, cap - o, "%s%s[%d]", n ? ", " : "",
                                  ctl_role_name((int)ctl_roster_role(r, i)), ctl_roster_rank(r, i));
        n++;
    }
    return n;
}

static int seat_ever_joined(const ctl_seat *s)
{
    return s->ever_joined;
}

static int seat_held(const ctl_seat *s)
{
    return s->holder != NULL;
}

int ctl_roster_never_joined(const ctl_roster *r, char *out, size_t cap)
{
    return list_seats(r, seat_ever_joined, out, cap);
}

int ctl_roster_missing(const ctl_roster *r, char *out, size_t cap)
{
    return list_seats(r, seat_held, out, cap);
}

int ctl_failover_possible(const uint8_t *lost, int num_servers, int rank, char *why, size_t cap)
{
    if (rank == 0) {
        snprintf(why, cap, "server 0 holds the rendezvous");
        return 0;
    }
    return ctl_shards_survive(lost, num_servers, rank, why, cap);
}

int ctl_shards_survive(const uint8_t *lost, int num_servers, int rank, char *why, size_t cap)
{
    const int S = num_servers;
    if (S < 2 || rank < 0 || rank >= S) {
        snprintf(why, cap, "server %d is not one of %d servers with hot-standby copies", rank, S);
        return 0;
    }
    size_t o = 0;
    int single = 0;
    why[0] = 0;
    for (int s = 0; s < S; s++) {
        int b = (s + 1) % S;
        int p_up = s != rank && !lost[s], b_up = b != rank && !lost[b];
        if (!p_up && !b_up) {
            snprintf(why, cap, "both copies of shard %d are lost (servers %d and %d)", s, s, b);
            return 0;
        }
        if ((!p_up || !b_up) && o < cap)
            o += (size_t)snprintf(why + o, cap - o, "%s%d", single++ ? ", " : "shards ", s);
    }
    return 1;
}
