/* Control plane, service side: the rendezvous that server rank 0 runs. One poll() loop on its own thread
 * accepts TCP connections, sends each its hello (the join nonce), checks the join's HMAC, reads and writes
 * length-prefixed frames through per-connection buffers, echoes heartbeats, enforces read deadlines and
 * broadcasts the address book, lost members and the shutdown; one slow or hostile peer never holds up the
 * others. What the joins mean for the run (who takes a rank, when the run forms, the resume step, what a
 * departure means) is decided by the forming policy, common/ctl_forming.c. Wire format and message checks:
 * common/ctl_frame.c. */
#include "common/ctl.h"

#include "common/ckpt.h"
#include "common/clock.h"
#include "common/ctl_forming.h"
#include "common/ctl_frame.h"
#include "common/ctl_internal.h"
#include "common/err.h"
#include "common/hostport.h"
#include "common/log.h"
#include "common/metrics.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define CTL_SPARE_CONNS 256 /* connections beyond one per member (joins in progress, strays) */
#define CTL_JOIN_DEADLINE_S                                                                                  \
    5.0 /* a new connection must have joined by then (or the read timeout, if shorter) */
#define CTL_STRAY_LOG_S   5.0 /* at most one summary line about unauthenticated connections this often */
#define CTL_FORMING_LOG_S 10.0 /* while the run forms: a line naming the members it waits for this often */
#define CTL_CLOSE_GRACE_S 1.0 /* time to flush an error reply before the socket is closed */
#define CTL_PEER_LEN      64  /* bytes of a peer's "host:port" (INET6_ADDRSTRLEN + ':' + port fit) */
/* A rejoining server must be ready within this many ctl_timeouts of its book (its own wait for the files is
 * one; the workers hold their pushes for at most 4 from about the same moment, worker/rejoin.h). */
#define CTL_LEARNER_READY_TIMEOUTS 3

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL, 0);
    return fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ? -errno : 0;
}

typedef struct conn {
    int fd;
    char peer[CTL_PEER_LEN];
    uint8_t *rbuf;
    size_t rlen, rcap;
    uint8_t *wbuf;
    size_t wlen, wcap;
    int joined;
    int left; /* the member said it leaves (ctl_session_leave): its disconnect is orderly */
    int hb_seen; /* it sent a heartbeat since it joined: with replicas, its silence is timed from then on */
    int learning; /* a failed-over server rejoining (replicas = 1): joined, holds no seat nor copy yet */
    int replacing; /* a restarted worker replacing a lost one: joined, holds no seat until the redo is set up */
    ctl_role role;
    int rank;
    int seat;        /* its seat in the roster (ctl_forming.h) while joined */
    int closing;     /* no more reads; close once wbuf is flushed or close_at passes */
    int dead;        /* close at the end of this loop iteration */
    double deadline; /* read deadline (0 = none): join not finished, or a partial frame pending */
    double close_at;
    uint8_t nonce[CTL_NONCE_LEN];
    size_t addr_len;
    uint8_t addr[CTL_MAX_ADDR]; /* fabric address given at join */
    int64_t *steps;             /* checkpoint steps the member holds (join's resume_steps) */
    ckpt_ident *ids;            /* ids[i]: the run identity of its files of steps[i] (join's resume_idents) */
    uint64_t rx; /* bytes received: a member sends its join at once, an idle stranger nothing */
    size_t nsteps;
    char maddr[CTL_MAX_METRICS_ADDR]; /* its metrics endpoint "host:port" as listed in /targets ("": none) */
    pf_metric *info;                  /* its pfcps_rendezvous_member_info series while joined (metrics on) */
    char failed[512]; /* the member's own failure (ctl_session_fail), told with its loss ("": none) */
} conn;

struct ctl_rendezvous {
    char *bind_host, *secret, *config_text;
    int num_servers, num_workers;
    int64_t num_classes;
    uint8_t run_nonce[16]; /* random, per run: the data-plane token's input (ctl_data_token) */
    uint8_t new_run_id[CKPT_RUN_ID_BYTES]; /* random: the run id when the run starts afresh */
    /* Unauthenticated connections (never joined): counted, summarised at most every CTL_STRAY_LOG_S. */
    long stray_evicted, stray_dropped, stray_logged;
    long resumes_refused; /* Resumes refused (resume_acceptable): the never-formed report names the last */
    char resume_refused[PF_ERRMSG_MAX]; /* its reason */
    long joins_refused; /* joins refused for their config (a server's replicas, a worker's endpoint keys) */
    char join_refused[PF_ERRMSG_MAX];   /* the last one's reason: the never-formed report names it */
    double join_refused_t, resume_refused_t; /* when the last join / resume was refused (log_forming) */
    double stray_log_t, accept_pause_until;
    double t_start, next_forming_log; /* the service's start; the next log_forming (CTL_FORMING_LOG_S) */
    size_t max_frame;
    double timeout_s;
    double bind_timeout_s; /* ctl_rendezvous_opts.bind_timeout_s */
    int lfd, port;
    int wake[2];
    pthread_t thread;
    atomic_int stop, shutdown_req;
    atomic_int
        fenced; /* ctl_rendezvous_fenced: it stopped past the silence limit and closed every connection */
    atomic_int fail_req; /* ctl_rendezvous_member_failed: fail_text is to be told to every member */
    int fail_sent;
    ctl_role fail_role;
    int fail_rank;
    char fail_text[512];
    atomic_int joined;       /* ctl_rendezvous_joined: the seats held until the run formed, then S + W */
    atomic_int workers_left; /* workers that left in order (ctl_session_leave) or lost after the end vote */
    int shutdown_sent;
    int reform_sent; /* every member was told the run re-forms (queue_member_lost): later losses are its
                      * members stopping for it, not failures to act on */
    conn **conns;
    int nconns, max_conns;
    ctl_roster roster; /* the run's seats and forming state; the service thread's alone */
    int replicas;      /* ctl_rendezvous_opts.replicas */
    uint32_t epoch;    /* membership epoch: failovers and rejoin steps announced so far */
    uint8_t *srv_lost; /* [num_servers]: failed over (its shards go on on their other copies) */
    int rejoin;        /* ctl_rendezvous_opts.rejoin */
    conn *learner;     /* the server rejoining now (at most one at a time), or NULL */
    int64_t learner_step; /* the checkpoint step its copy is taken at (0: the workers have not said yet) */
    double learner_t0;    /* when it joined (pf_now_s), for the log */
    double learner_book;  /* when it was sent its book (pf_now_s; 0: not yet): it must be ready within
                             CTL_LEARNER_READY_TIMEOUTS x ctl_timeout of it */
    uint8_t run_id[CKPT_RUN_ID_BYTES]; /* the run id the book carried when the run formed */
    /* worker replacement in place (ctl_rendezvous_opts.replace_workers; docs/architecture.md, "Worker
     * replacement in place") */
    int replace;      /* opts.replace_workers */
    int acc_k;        /* opts.gradient_acc (>= 1) */
    int wr_rank;      /* the lost worker being replaced, or -1 */
    int wr_phase;     /* WR_REPORTS, WR_ROLLBACK, WR_STATE */
    uint32_t wr_epoch; /* the epoch of the notice the phase's reports answer (a failover meanwhile raises
                          the run's epoch, not this) */
    double wr_t0;     /* when it was lost (pf_now_s) */
    int64_t wr_umin, wr_umax, wr_pmin; /* reports: the survivors' first unfinished steps, the servers' push counts */
    int64_t wr_step;  /* the redo step, once decided */
    uint8_t *wr_in;   /* [S + W]: reports (WR_REPORTS) or roll-backs (WR_ROLLBACK) received, servers first */
    conn *wr_repl;    /* the replacement (joined, no seat yet), or NULL */
    int wr_donor;     /* the survivor whose state the replacement loads */
    char wr_peer[sizeof ((conn *)0)->peer]; /* the lost worker's address, for the logs */
    int lost_after_end; /* workers counted as gone after the end vote (worker_gone_after_end) */
    int64_t end_step; /* > 0: a worker passed the end vote after this step, the last (CTL_FO_END_VOTED): every
                         worker's final outputs are written, and a worker lost from then on is not replaced */
    double last_pass;  /* pf_now_s() of the previous service pass (a long gap: the process was stopped) */
    int adopting;      /* 1: a member resumed a running run here (handle_resume) and the others are coming;
                          2: every member but server 0 resumed: the run is adopted (formed) */
    double adopt_last; /* pf_now_s() of the newest Resume while adopting */
    double adopt_t0;   /* pf_now_s() of the first Resume */
    conn *adopt_cand;  /* while adopting: a worker's join held as the replacement of a rank not resumed, or
                          NULL */
    int metrics;       /* ctl_rendezvous_opts.metrics: the series below are registered, /targets served */
    pf_metric *m_members, *m_expected, *m_joins, *m_lost, *m_reforms, *m_epoch, *m_single;
};

/* ---------- /targets: Prometheus HTTP service discovery of the joined members ---------- */

/* The joined members' metrics endpoints, one per seat (servers first), for the /targets page. Static, not in
 * the service: the endpoint's thread may render the page while the service stops or after it is freed. */
typedef struct rv_target {
    int used;
    ctl_role role;
    int rank;
    char addr[CTL_MAX_METRICS_ADDR];
} rv_target;

static struct {
    pthread_mutex_t mu;
    rv_target *t; /* [n]: index = seat */
    int n;
} g_targets = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Makes the table n empty seats (the service starting). Returns 0 or -ENOMEM. */
static int targets_reset(int n)
{
    rv_target *t = calloc((size_t)(n > 0 ? n : 1), sizeof *t);
    if (!t)
        return pf_err(-ENOMEM, "rendezvous: out of memory for the /targets table");
    pthread_mutex_lock(&g_targets.mu);
    free(g_targets.t);
    g_targets.t = t;
    g_targets.n = n;
    pthread_mutex_unlock(&g_targets.mu);
    return 0;
}

/* Seat `seat` is held by (role, rank) with metrics endpoint addr ("" : none), or (addr NULL) is free. */
static void targets_set(int seat, ctl_role role, int rank, const char *addr)
{
    pthread_mutex_lock(&g_targets.mu);
    if (seat >= 0 && seat < g_targets.n) {
        rv_target *e = &g_targets.t[seat];
        e->used = addr && *addr;
        e->role = role;
        e->rank = rank;
        snprintf(e->addr, sizeof e->addr, "%s", addr ? addr : "");
    }
    pthread_mutex_unlock(&g_targets.mu);
}

/* The /targets page (metrics_add_page's render, on the endpoint's thread): a JSON array with one
 * {"targets": ["host:port"], "labels": {"role": ROLE, "rank": "R"}} per joined member with a metrics
 * endpoint, seat order. Returns the malloc'd text, or NULL (out of memory: the endpoint answers 500). */
static char *targets_render(void *arg)
{
    (void)arg;
    json_t *arr = json_array();
    int ok = arr != NULL;
    pthread_mutex_lock(&g_targets.mu);
    for (int i = 0; ok && i < g_targets.n; i++) {
        const rv_target *e = &g_targets.t[i];
        if (!e->used)
            continue;
        char rank[16];
        snprintf(rank, sizeof rank, "%d", e->rank);
        json_t *o = json_pack("{s:[s], s:{s:s, s:s}}", "targets", e->addr, "labels", "role",
                              ctl_role_name(e->role), "rank", rank);
        ok = o && json_array_append_new(arr, o) == 0;
    }
    pthread_mutex_unlock(&g_targets.mu);
    char *text = ok ? json_dumps(arr, JSON_COMPACT) : NULL;
    json_decref(arr);
    return text;
}

/* The address to list for a member that reported metrics endpoint `reported`: "host:port" as parsed by
 * metrics_parse_address (IPv6 hosts in brackets), with an unspecified host (0.0.0.0, ::, or none) replaced by
 * the host of its control connection `peer` ("host:port"). Returns 0 with out[cap], or -EINVAL naming the
 * problem (not an address, port 0). */
static int target_address(const char *reported, const char *peer, char *out, size_t cap)
{
    char host[CTL_MAX_METRICS_ADDR];
    int port = 0;
    if (metrics_parse_address(reported, host, sizeof host, &port) < 0)
        return -EINVAL;
    if (port == 0)
        return pf_err(-EINVAL, "metrics address '%s' has port 0 (a member reports the port it bound)",
                      reported);
    int unspecified =
        !strcmp(host, "0.0.0.0") || !strcmp(host, "::") || reported[0] == ':' || !strchr(reported, ':');
    if (unspecified) {
        /* peer is "host:port" with the port after the last ':' (an IPv6 host keeps its colons). */
        const char *colon = strrchr(peer, ':');
        size_t hl = colon ? (size_t)(colon - peer) : strlen(peer);
        if (hl >= sizeof host)
            hl = sizeof host - 1;
        memcpy(host, peer, hl);
        host[hl] = 0;
    }
    int n = strchr(host, ':') ? snprintf(out, cap, "[%s]:%d", host, port)
                              : snprintf(out, cap, "%s:%d", host, port);
    if (n < 0 || (size_t)n >= cap)
        return pf_err(-EINVAL, "metrics address '%s' is too long", reported);
    return 0;
}

/* Grows *buf (capacity *cap bytes, doubling from 4096) to hold at least `need` bytes.
 * Returns 0 or -ENOMEM. */
static int buf_reserve(uint8_t **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 4096;
    while (c < need)
        c *= 2;
    uint8_t *nb = realloc(*buf, c);
    if (!nb)
        return -ENOMEM;
    *buf = nb;
    *cap = c;
    return 0;
}

/* Appends `n` bytes to the connection's output; a peer that lets more than two frames pile up unread
 * is dropped. */
static void conn_queue(ctl_rendezvous *rv, conn *c, const uint8_t *p, size_t n)
{
    if (c->dead)
        return;
    if (c->wlen + n > 2 * rv->max_frame + 65536) {
        log_warn("control plane: dropping %s: it does not read its replies (%zu bytes pending)", c->peer,
                 c->wlen);
        c->dead = 1;
        return;
    }
    if (buf_reserve(&c->wbuf, &c->wcap, c->wlen + n) < 0) {
        log_error("control plane: out of memory queueing %zu bytes for %s; dropping it", n, c->peer);
        c->dead = 1;
        return;
    }
    memcpy(c->wbuf + c->wlen, p, n);
    c->wlen += n;
}

/* Encodes m and queues it for c; a message that cannot be encoded drops c. */
static void conn_send_msg(ctl_rendezvous *rv, conn *c, const Pfcps__CtlMessage *m)
{
    uint8_t *frame;
    size_t len;
    if (ctl_frame_encode(m, rv->max_frame, &frame, &len) < 0) {
        log_error("control plane: cannot encode %s for %s: %s", ctl_msg_name(m->body_case), c->peer,
                  pf_errmsg());
        c->dead = 1;
        return;
    }
    conn_queue(rv, c, frame, len);
    free(frame);
}

static void release_seat(ctl_rendezvous *rv, conn *c);

/* A line about a connection that never joined: the first few are logged, then one summary every
 * CTL_STRAY_LOG_S (a flood of idle or hostile connections costs counters, not log lines). */
static void stray_log(ctl_rendezvous *rv, const char *peer, const char *what)
{
    rv->stray_dropped++;
    double now = pf_now_s();
    if (rv->stray_logged < 5) {
        rv->stray_logged++;
        log_warn("control plane: %s: %s", peer, what);
        rv->stray_log_t = now;
    } else if (now - rv->stray_log_t >= CTL_STRAY_LOG_S) {
        log_warn(
            "control plane: %ld connections without a join closed so far (%ld evicted to make room for new "
            "ones); latest: %s: %s",
            rv->stray_dropped, rv->stray_evicted, peer, what);
        rv->stray_log_t = now;
    }
}

/* Error reply (code: a positive errno value) and drop: the connection reads nothing more and is closed
 * once the reply is flushed (or after a short grace period). */
static void conn_refuse(ctl_rendezvous *rv, conn *c, int code, const char *msg)
{
    if (c->joined)
        log_warn("control plane: refusing %s: %s", c->peer, msg);
    else
        stray_log(rv, c->peer, msg);
    Pfcps__Error e;
    Pfcps__CtlMessage m;
    ctl_msg_set_error(&m, &e, code, msg);
    conn_send_msg(rv, c, &m);
    c->closing = 1;
    c->close_at = pf_now_s() + CTL_CLOSE_GRACE_S;
    /* A dropped member stops counting now, not when its socket is finally closed: the run must not
     * form with it. */
    release_seat(rv, c);
}

static void queue_member_lost(ctl_rendezvous *rv, const conn *except, ctl_role role, int rank,
                              const char *peer, const char *what);
static void queue_reform(ctl_rendezvous *rv, const conn *except, const char *text);

/* replicas = 1: a lost server whose shards all keep a live copy (ctl_failover_possible) is failed over: the
 * membership epoch goes up and every other member gets a Failover notice (workers switch to the copies,
 * servers promote theirs), and the run goes on. Returns 1 when it was, 0 when the loss must re-form the run
 * (logged with the reason). */
static int try_failover(ctl_rendezvous *rv, const conn *c)
{
    if (!rv->replicas || c->role != CTL_ROLE_SERVER || c->rank < 0 || c->rank >= rv->num_servers)
        return 0;
    char why[256], text[640];
    if (!ctl_failover_possible(rv->srv_lost, rv->num_servers, c->rank, why, sizeof why)) {
        log_error("control plane: server[%d] (%s) lost and %s: falling back to the checkpoint re-form (every "
                  "member restarts from the newest complete checkpoint)",
                  c->rank, c->peer, why);
        return 0;
    }
    rv->srv_lost[c->rank] = 1;
    rv->epoch++;
    metrics_add(rv->m_lost, 1);
    metrics_set(rv->m_epoch, rv->epoch);
    int single = 0;
    for (int s = 0; s < rv->num_servers; s++)
        single += rv->srv_lost[s] || rv->srv_lost[(s + 1) % rv->num_servers];
    metrics_set(rv->m_single, single);
    snprintf(
        text, sizeof text,
        "server[%d] (%s) lost: shard %d goes on on its backup on server %d, epoch %u; %s now %s a single "
        "copy: the run is one server failure away from the checkpoint re-form",
        c->rank, c->peer, c->rank, (c->rank + 1) % rv->num_servers, rv->epoch, why,
        strchr(why, ',') ? "have" : "has");
    log_warn("control plane: failover: %s", text);
    Pfcps__Failover f;
    Pfcps__CtlMessage m;
    ctl_msg_set_failover(&m, &f, rv->epoch, c->rank, text);
    for (int i = 0; i < rv->nconns; i++) {
        conn *o = rv->conns[i];
        /* A worker's replacement waiting for its seat is told in its join reply (lost_servers) instead. */
        if (o != c && o->joined && !o->replacing && !o->closing && !o->dead)
            conn_send_msg(rv, o, &m);
    }
    return 1;
}

static void rejoin_aborted(ctl_rendezvous *rv, conn *c);
static void replace_fallback(ctl_rendezvous *rv, const char *why);
static int try_replace(ctl_rendezvous *rv, const conn *c);
static int start_replace(ctl_rendezvous *rv, int rank, const char *peer, const conn *except);
static void replace_progress(ctl_rendezvous *rv);
static void worker_gone_after_end(ctl_rendezvous *rv, int rank, const char *peer);

/* A member leaving (dropped or disconnected): before the run formed its rank is free again; after, a
 * member that goes without saying so (crash, kill -9, network) is reported to every other member
 * (ctl_roster_release decides which); a rejoining server gone before it holds a copy aborts its rejoin. */
static void release_seat(ctl_rendezvous *rv, conn *c)
{
    if (!c->joined)
        return;
    if (c->learning) {
        rejoin_aborted(rv, c);
        return;
    }
    if (c->replacing) {
        c->joined = 0;
        c->replacing = 0;
        if (rv->adopt_cand == c)
            rv->adopt_cand = NULL;
        if (rv->wr_repl == c) {
            rv->wr_repl = NULL;
            replace_fallback(rv, "its replacement was lost too");
        }
        return;
    }
    if (rv->metrics) {
        metrics_remove(c->info);
        c->info = NULL;
        targets_set(c->seat, c->role, c->rank, NULL);
    }
    ctl_gone gone = ctl_roster_release(&rv->roster, c->seat, c, c->left, rv->shutdown_sent);
    metrics_set(rv->m_members, rv->roster.held);
    if (gone == CTL_GONE_LOST && rv->reform_sent) {
        log_info("control plane: %s[%d] (%s) stopped for the checkpoint re-form", ctl_role_name(c->role), c->rank,
                 c->peer);
    } else if (gone == CTL_GONE_FREED) {
        atomic_fetch_sub(&rv->joined, 1);
        log_warn("control plane: %s[%d] (%s) left before the run formed; its rank is free again",
                 ctl_role_name(c->role), c->rank, c->peer);
    } else if (gone == CTL_GONE_LOST && c->role == CTL_ROLE_WORKER && rv->end_step > 0) {
        worker_gone_after_end(rv, c->rank, c->peer);
    } else if (gone == CTL_GONE_LOST && rv->wr_rank >= 0) {
        /* A server lost while a worker is replaced (both on one machine that died, say) is failed over like
         * any other, and the replacement goes on without it; anything else re-forms the run. */
        if (c->role == CTL_ROLE_SERVER && try_failover(rv, c)) {
            log_warn("control plane: worker[%d]'s replacement goes on without server[%d]", rv->wr_rank,
                     c->rank);
            replace_progress(rv);
        } else {
            char why[300];
            snprintf(why, sizeof why, "%s[%d] (%s) was lost too", ctl_role_name(c->role), c->rank, c->peer);
            replace_fallback(rv, why);
        }
    } else if (gone == CTL_GONE_LOST && !try_failover(rv, c) && !try_replace(rv, c)) {
        char what[sizeof c->failed + 48];
        snprintf(what, sizeof what, "%s%s", c->failed[0] ? "failed: " : "disconnected without leaving the run",
                 c->failed);
        log_warn("control plane: %s[%d] (%s) %s: telling the other members", ctl_role_name(c->role), c->rank,
                 c->peer, what);
        queue_member_lost(rv, c, c->role, c->rank, c->peer, what);
    }
    c->joined = 0;
}

/* Frees the connection's seat (release_seat), closes its socket and frees it. */
static void conn_close(ctl_rendezvous *rv, conn *c)
{
    release_seat(rv, c);
    close(c->fd);
    free(c->rbuf);
    free(c->wbuf);
    free(c->steps);
    free(c->ids);
    free(c);
}

/* The join's checks before the forming policy sees it: the protocol version, then the HMAC over this
 * connection's nonce (first, so that an unauthenticated peer learns nothing about the run), then a
 * connection that already joined. Returns 1 when the join may go on, 0 when c was refused. */
static int join_authentic(ctl_rendezvous *rv, conn *c, const Pfcps__Join *j)
{
    char msg[PF_ERRMSG_MAX];
    const char *who = ctl_role_name((int)j->role);
    if (j->protocol_version != CTL_PROTOCOL_VERSION) {
        snprintf(msg, sizeof msg, "protocol version %u, this service speaks %d", j->protocol_version,
                 CTL_PROTOCOL_VERSION);
        conn_refuse(rv, c, EPROTO, msg);
        return 0;
    }
    uint8_t mac[CTL_MAC_LEN];
    if (ctl_member_mac(rv->secret, c->nonce, sizeof c->nonce, (int)j->role, j->rank, j->fabric_addr.data,
                       j->fabric_addr.len, j->metrics_address, j->replicas, j->endpoint_keys, mac) < 0 ||
        CRYPTO_memcmp(mac, j->mac.data, CTL_MAC_LEN) != 0) {
        snprintf(msg, sizeof msg, "join as %s rank %d refused: bad secret (HMAC does not match)", who,
                 j->rank);
        conn_refuse(rv, c, EACCES, msg);
        return 0;
    }
    if (c->joined) {
        snprintf(msg, sizeof msg, "join as %s rank %d refused: this connection already joined as %s rank %d",
                 who, j->rank, ctl_role_name(c->role), c->rank);
        conn_refuse(rv, c, EEXIST, msg);
        return 0;
    }
    return 1;
}

/* The metrics address of an authenticated join (Join.metrics_address, "" for none): checked and resolved to
 * the address /targets lists (target_address) into c->maddr. Returns 1 when the join may go on, 0 when c was
 * refused (EPROTO: too long, not a host:port, port 0). */
static int join_metrics_address(ctl_rendezvous *rv, conn *c, const Pfcps__Join *j)
{
    const char *ma = j->metrics_address ? j->metrics_address : "";
    c->maddr[0] = 0;
    if (!*ma)
        return 1;
    char msg[PF_ERRMSG_MAX];
    size_t n = strnlen(ma, CTL_MAX_METRICS_ADDR);
    if (n >= CTL_MAX_METRICS_ADDR || target_address(ma, c->peer, c->maddr, sizeof c->maddr) < 0) {
        if (n >= CTL_MAX_METRICS_ADDR)
            snprintf(msg, sizeof msg, "join as %s rank %d refused: metrics address longer than %d bytes",
                     ctl_role_name((int)j->role), j->rank, CTL_MAX_METRICS_ADDR - 1);
        else
            snprintf(msg, sizeof msg, "join as %s rank %d refused: %s", ctl_role_name((int)j->role), j->rank,
                     pf_errmsg());
        c->maddr[0] = 0;
        conn_refuse(rv, c, EPROTO, msg);
        return 0;
    }
    return 1;
}

/* A member took its seat: counted, listed in /targets and given its member_info series (metrics on). */
static void join_metrics(ctl_rendezvous *rv, conn *c)
{
    if (!rv->metrics)
        return;
    metrics_add(rv->m_joins, 1);
    metrics_set(rv->m_members, rv->roster.held);
    char rank[16];
    snprintf(rank, sizeof rank, "%d", c->rank);
    const char *labels[] = {"member_role", ctl_role_name(c->role), "member_rank",
                            rank,          "metrics_address",      c->maddr};
    c->info = metrics_gauge("pfcps_rendezvous_member_info",
                            "1 per joined member; its metrics endpoint (\"\" when off).", labels, 3);
    metrics_set(c->info, 1);
    targets_set(c->seat, c->role, c->rank, c->maddr);
}

/* Sends m to every joined member but `except` (a learner hears nothing before its book). */
static void send_members(ctl_rendezvous *rv, const conn *except, const Pfcps__CtlMessage *m)
{
    for (int i = 0; i < rv->nconns; i++) {
        conn *o = rv->conns[i];
        if (o != except && o->joined && !o->learning && !o->replacing && !o->closing && !o->dead)
            conn_send_msg(rv, o, m);
    }
}

/* A Failover message of kind `kind` about server `server` at the current epoch to every member but except;
 * addr: the rejoined server's book entry (kind CTL_FO_REJOINED), else NULL. */
static void send_rejoin_notice(ctl_rendezvous *rv, const conn *except, int kind, int server, const char *text,
                               const uint8_t *addr, size_t alen)
{
    Pfcps__Failover f;
    Pfcps__CtlMessage m;
    ctl_msg_set_failover(&m, &f, rv->epoch ? rv->epoch : 1, server, text);
    f.kind = (uint32_t)kind;
    if (addr) {
        f.fabric_addr.data = (uint8_t *)addr;
        f.fabric_addr.len = alen;
    }
    send_members(rv, except, &m);
}

/* The shards that have a single copy now (a server lost, or its neighbour), for the metrics. */
static void count_single(ctl_rendezvous *rv)
{
    int single = 0;
    for (int s = 0; s < rv->num_servers; s++)
        single += rv->srv_lost[s] || rv->srv_lost[(s + 1) % rv->num_servers];
    metrics_set(rv->m_single, single);
}

/* c joins the formed run without a seat yet (a rejoining server, a worker's replacement): role, rank, its
 * book entry from the join. */
static void join_unseated(conn *c, ctl_role role, const Pfcps__Join *j)
{
    c->joined = 1;
    c->role = role;
    c->rank = j->rank;
    c->seat = -1;
    c->addr_len = j->fabric_addr.len;
    if (c->addr_len)
        memcpy(c->addr, j->fabric_addr.data, c->addr_len);
    c->deadline = 0;
}

/* replicas = 1: a join for a failed-over server rank is that server restarted. In head_mode = global it joins
 * as the learner of its two shards (docs/architecture.md, "Hot-standby shards", Rejoin): the epoch goes up,
 * every member is told (the workers then agree on a checkpoint step, CTL_FO_REJOIN_STEP), and the learner
 * gets its book once that step is known. Refused (EEXIST) in head_mode = local or after the shutdown; asked
 * to retry (EAGAIN) while another server rejoins. */
static void rejoin_begin(ctl_rendezvous *rv, conn *c, const Pfcps__Join *j)
{
    char msg[320];
    if (!rv->rejoin || rv->shutdown_sent) {
        snprintf(
            msg, sizeof msg,
            "server[%d] was failed over to its shards' other copies (epoch %u); it cannot rejoin %s: the "
            "run goes on without it",
            j->rank, rv->epoch,
            rv->shutdown_sent ? "a run that is shutting down"
                              : "under head_mode = local (rows shared by workers need one copy step for "
                                "all workers, which is not built; head_mode = global rejoins)");
        log_warn("control plane: refused %s: %s", c->peer, msg);
        /* A run that ended needs nothing more of it: ECANCELED is its join's normal stop (exit 0). */
        conn_refuse(rv, c, rv->shutdown_sent ? ECANCELED : EEXIST, msg);
        return;
    }
    if (rv->learner) {
        snprintf(msg, sizeof msg, "server[%d] is rejoining now; server[%d] rejoins after it",
                 rv->learner->rank, j->rank);
        conn_refuse(rv, c, EAGAIN, msg);
        return;
    }
    if (rv->wr_rank >= 0) {
        snprintf(msg, sizeof msg, "worker[%d] is being replaced now; server[%d] rejoins after it", rv->wr_rank,
                 j->rank);
        conn_refuse(rv, c, EAGAIN, msg);
        return;
    }
    join_unseated(c, CTL_ROLE_SERVER, j);
    c->learning = 1;
    rv->learner = c;
    rv->learner_step = 0;
    rv->learner_t0 = pf_now_s();
    rv->learner_book = 0;
    rv->epoch++;
    metrics_set(rv->m_epoch, rv->epoch);
    const int S = rv->num_servers, r = j->rank;
    char text[400];
    snprintf(
        text, sizeof text,
        "server[%d] (%s) restarted and rejoins as a learner at epoch %u: it copies shard %d (served by "
        "server %d) and shard %d's backup (from server %d) at a checkpoint step the workers agree on; until "
        "it holds them the run is one server failure away from the checkpoint re-form",
        r, c->peer, rv->epoch, r, (r + 1) % S, (r + S - 1) % S, (r + S - 1) % S);
    log_warn("control plane: rejoin: %s", text);
    send_rejoin_notice(rv, c, CTL_FO_REJOIN_BEGIN, r, text, NULL, 0);
}

/* The member list of a join reply: every seat's holder, and the learner `extra` in its rank's seat (the
 * seats of other lost servers list no address). mem[n], ptr[n] with n = the roster's size. */
static void reply_members(ctl_rendezvous *rv, const conn *extra, Pfcps__Member *mem, Pfcps__Member **ptr)
{
    int n = ctl_roster_size(&rv->roster);
    for (int i = 0; i < n; i++) {
        const conn *c = rv->roster.seats[i].holder;
        pfcps__member__init(&mem[i]);
        mem[i].role =
            ctl_roster_role(&rv->roster, i) == CTL_ROLE_SERVER ? PFCPS__ROLE__SERVER : PFCPS__ROLE__WORKER;
        mem[i].rank = ctl_roster_rank(&rv->roster, i);
        if (!c && extra && mem[i].role == PFCPS__ROLE__SERVER && mem[i].rank == extra->rank)
            c = extra;
        if (c) {
            mem[i].fabric_addr.data = (uint8_t *)c->addr;
            mem[i].fabric_addr.len = c->addr_len;
        }
        ptr[i] = &mem[i];
    }
}

/* The fields every join reply carries: the member list ptr[n], the run's config and sizes, its token nonce. */
static void reply_base(const ctl_rendezvous *rv, Pfcps__JoinReply *r, Pfcps__Member **ptr, int n)
{
    r->n_members = (size_t)n;
    r->members = ptr;
    r->config_text = rv->config_text;
    r->num_servers = rv->num_servers;
    r->num_workers = rv->num_workers;
    r->num_classes = rv->num_classes;
    r->run_nonce.data = (uint8_t *)rv->run_nonce;
    r->run_nonce.len = sizeof rv->run_nonce;
}

/* Sends c, which joined the formed run without a seat, its join reply: the book (extra listed in its server
 * seat when it holds none: a learner), the run's config and token nonce, its run id, resume step `step` (why:
 * `reason`), the current epoch as rejoin_epoch, `donor` (a worker's replacement) and the servers failed over
 * and not rejoined, c's own rank excepted (lost_servers: it was told of no failover before). Returns 0, or -1
 * after refusing c (out of memory). */
static int send_late_reply(ctl_rendezvous *rv, conn *c, const conn *extra, int64_t step, const char *reason,
                           int donor)
{
    int n = ctl_roster_size(&rv->roster);
    Pfcps__Member *mem = calloc((size_t)n, sizeof *mem);
    Pfcps__Member **ptr = calloc((size_t)n, sizeof *ptr);
    if (!mem || !ptr) {
        free(mem);
        free(ptr);
        conn_refuse(rv, c, EIO, "out of memory building the join reply");
        return -1;
    }
    reply_members(rv, extra, mem, ptr);
    Pfcps__JoinReply r = PFCPS__JOIN_REPLY__INIT;
    reply_base(rv, &r, ptr, n);
    r.resume_step = step;
    r.resume_reason = (char *)reason;
    r.run_id.data = rv->run_id;
    r.run_id.len = sizeof rv->run_id;
    r.rejoin_epoch = rv->epoch;
    r.donor = donor;
    /* The servers failed over and not rejoined (a learner: but itself), of which c was told nothing. */
    int32_t *lost = calloc((size_t)rv->num_servers, sizeof *lost);
    if (!lost) {
        free(mem);
        free(ptr);
        conn_refuse(rv, c, EIO, "out of memory building the join reply");
        return -1;
    }
    for (int s = 0; s < rv->num_servers; s++)
        if (rv->srv_lost[s] && !(c->role == CTL_ROLE_SERVER && s == c->rank))
            lost[r.n_lost_servers++] = s;
    r.lost_servers = lost;
    Pfcps__CtlMessage m = PFCPS__CTL_MESSAGE__INIT;
    m.body_case = PFCPS__CTL_MESSAGE__BODY_JOIN_REPLY;
    m.join_reply = &r;
    conn_send_msg(rv, c, &m);
    free(lost);
    free(mem);
    free(ptr);
    return 0;
}

/* A worker said which checkpoint step the learner copies from: the learner gets its book (the run's config,
 * token nonce and run id, resume_step = that step, rejoin_epoch). Later reports of the same rejoin are
 * ignored. */
static void rejoin_step(ctl_rendezvous *rv, const conn *from, int64_t step)
{
    conn *l = rv->learner;
    if (!l || rv->learner_step > 0 || step <= 0)
        return;
    rv->learner_step = step;
    char reason[200];
    snprintf(reason, sizeof reason,
             "rejoin: copying shards %d and %d from checkpoint step %lld, which the workers took for it",
             l->rank, (l->rank + rv->num_servers - 1) % rv->num_servers, (long long)step);
    if (send_late_reply(rv, l, l, step, reason, 0) < 0)
        return;
    rv->learner_book = pf_now_s();
    log_info(
        "control plane: rejoin: %s[%d] says the workers took checkpoint step %lld for server[%d]'s copy; "
        "its book sent",
        ctl_role_name(from->role), from->rank, (long long)step, l->rank);
}

/* The learner loaded both copies and serves them: it takes its seat again, the epoch goes up and every member
 * is told (workers send its shards' pushes to it from their next step, which they held until now). */
static void rejoin_done(ctl_rendezvous *rv, conn *c)
{
    const int r = c->rank, S = rv->num_servers;
    int seat = ctl_roster_seat(&rv->roster, CTL_ROLE_SERVER, r);
    if (seat < 0 || rv->roster.seats[seat].holder) {
        conn_refuse(rv, c, EEXIST, "rejoin: the rank's seat is held");
        return;
    }
    ctl_roster_take(&rv->roster, seat, c, c->peer, NULL, NULL, 0);
    c->seat = seat;
    c->learning = 0;
    /* Its silence is timed from now on, as a member's after its first heartbeat: it serves (its heartbeats
     * begin right after its ready), so one that hangs from here is lost like any other, not only once it
     * heartbeated. */
    c->hb_seen = 1;
    c->deadline = pf_now_s() + ctl_member_silence_s(rv->timeout_s);
    join_metrics(rv, c); /* counted, and listed in /targets with its metrics endpoint */
    rv->learner = NULL;
    rv->srv_lost[r] = 0;
    rv->epoch++;
    metrics_set(rv->m_epoch, rv->epoch);
    metrics_set(rv->m_members, rv->roster.held);
    count_single(rv);
    int lost = 0;
    for (int s = 0; s < S; s++)
        lost += rv->srv_lost[s];
    char text[400];
    snprintf(
        text, sizeof text,
        "server[%d] (%s) rejoined at epoch %u, %.2f s after its join: it holds shard %d and the backup of "
        "shard %d again; %s",
        r, c->peer, rv->epoch, pf_now_s() - rv->learner_t0, r, (r + S - 1) % S,
        lost ? "other servers are still lost: the run is one server failure away from the checkpoint re-form"
             : "every shard has two copies again");
    log_warn("control plane: rejoin: %s", text);
    send_rejoin_notice(rv, c, CTL_FO_REJOINED, r, text, c->addr, c->addr_len);
}

/* The learner was lost (or left) before it held a copy: nothing changed, the shards go on as they were. */
static void rejoin_aborted(ctl_rendezvous *rv, conn *c)
{
    c->joined = 0;
    c->learning = 0;
    if (rv->learner != c)
        return;
    rv->learner = NULL;
    if (rv->reform_sent || rv->fail_sent || rv->shutdown_sent) {
        /* The run re-forms (or failed, or ended) already: the learner stops with the others; nothing goes on.
         */
        log_info("control plane: rejoin: server[%d] (%s), rejoining, stopped %s", c->rank, c->peer,
                 rv->shutdown_sent ? "with the run's end" : "for the checkpoint re-form");
        return;
    }
    char text[300];
    snprintf(
        text, sizeof text,
        "server[%d] (%s) was lost while rejoining, before it held a copy: the run goes on as before, one "
        "server failure away from the checkpoint re-form",
        c->rank, c->peer);
    log_warn("control plane: rejoin: %s", text);
    send_rejoin_notice(rv, c, CTL_FO_REJOIN_ABORTED, c->rank, text, NULL, 0);
}

/* ---------- worker replacement in place (docs/architecture.md, "Worker replacement in place") ---------- */

enum { WR_REPORTS = 1, WR_ROLLBACK = 2, WR_STATE = 3 };

/* The connection holding worker w's seat, or NULL. */
static conn *worker_conn(ctl_rendezvous *rv, int w)
{
    int seat = ctl_roster_seat(&rv->roster, CTL_ROLE_WORKER, w);
    return seat < 0 ? NULL : (conn *)rv->roster.seats[seat].holder;
}

/* A Failover notice of kind `kind` (worker replacement) to one connection. */
static void send_wr_notice(ctl_rendezvous *rv, conn *to, int kind, int rank, int64_t step, const char *text,
                           const uint8_t *addr, size_t alen, ProtobufCBinaryData *waddrs, size_t nw)
{
    Pfcps__Failover f;
    Pfcps__CtlMessage m;
    ctl_msg_set_failover(&m, &f, rv->epoch ? rv->epoch : 1, rank, text);
    f.kind = (uint32_t)kind;
    f.step = step;
    if (addr) {
        f.fabric_addr.data = (uint8_t *)addr;
        f.fabric_addr.len = alen;
    }
    f.worker_addrs = waddrs;
    f.n_worker_addrs = nw;
    conn_send_msg(rv, to, &m);
}

/* The replacement cannot go on (another member lost meanwhile, a report that does not fit, the timeout):
 * today's re-form, told to every member with `why`; the replacement, if any, is refused. */
static void replace_fallback(ctl_rendezvous *rv, const char *why)
{
    const int d = rv->wr_rank;
    char what[600];
    snprintf(what, sizeof what, "was lost and its replacement failed: %s; falling back to the checkpoint re-form",
             why);
    log_error("control plane: worker[%d] %s", d, what);
    rv->wr_rank = -1;
    rv->wr_phase = 0;
    conn *r = rv->wr_repl;
    rv->wr_repl = NULL;
    metrics_add(rv->m_reforms, 1);
    queue_member_lost(rv, r, CTL_ROLE_WORKER, d, rv->wr_peer, what);
    if (r) {
        char msg[640];
        snprintf(msg, sizeof msg, "worker[%d] %s", d, what);
        r->replacing = 0;
        r->joined = 0;
        conn_refuse(rv, r, ENOLINK, msg);
    }
}

/* A worker lost after the end vote (rv->end_step > 0): it is counted as gone in order (its final outputs are
 * written), and every worker that has not left is told the run ended (CTL_FO_RUN_ENDED): one whose own vote
 * failed with this loss, waiting for a replacement, finishes instead. */
static void worker_gone_after_end(ctl_rendezvous *rv, int rank, const char *peer)
{
    log_warn(
        "control plane: worker[%d] (%s) was lost after the end of training (every worker passed the end vote "
        "at step %lld: the final checkpoint, model.ckpt and class centers are written): nothing to redo, the "
        "run ends without it",
        rank, peer, (long long)rv->end_step);
    rv->lost_after_end++;
    if (atomic_fetch_add(&rv->workers_left, 1) + 1 == rv->num_workers)
        log_info("control plane: every worker left the run or was lost after the end vote: training is over");
    char text[200];
    snprintf(
        text, sizeof text,
        "worker[%d] was lost after every worker passed the end vote at step %lld: no replacement; the run "
        "ends",
        rank, (long long)rv->end_step);
    for (int i = 0; i < rv->nconns; i++) {
        conn *o = rv->conns[i];
        if (o->joined && o->role == CTL_ROLE_WORKER && !o->left && !o->replacing && !o->closing && !o->dead)
            send_wr_notice(rv, o, CTL_FO_RUN_ENDED, rank, rv->end_step, text, NULL, 0, NULL, 0);
    }
}

/* A worker passed the end vote after `step` (CTL_FO_END_VOTED): every worker's final outputs are written. A
 * replacement under way (a worker lost in the vote or after it) is called off: the lost worker is gone after
 * the end (worker_gone_after_end), and its replacement, if it joined, is told the training is over
 * (ESHUTDOWN: it exits 0). */
static void end_voted(ctl_rendezvous *rv, const conn *c, int64_t step)
{
    if (rv->end_step == 0) {
        rv->end_step = step > 0 ? step : 1;
        log_info(
            "control plane: worker[%d] passed the end vote at step %lld: every worker's final outputs are "
            "written",
            c->rank, (long long)step);
    }
    if (rv->wr_rank < 0)
        return;
    const int d = rv->wr_rank;
    conn *r = rv->wr_repl;
    rv->wr_rank = -1;
    rv->wr_phase = 0;
    rv->wr_repl = NULL;
    log_warn("control plane: worker[%d]'s replacement is called off: the others passed the end vote", d);
    worker_gone_after_end(rv, d, rv->wr_peer);
    if (r) {
        char msg[200];
        snprintf(
            msg, sizeof msg,
            "training is over: every worker passed the end vote at step %lld before worker[%d] was lost; "
            "nothing left to replace",
            (long long)rv->end_step, d);
        r->replacing = 0;
        r->joined = 0;
        conn_refuse(rv, r, ESHUTDOWN, msg);
    }
}

/* replace_workers: a lost worker (kill -9, a crash, silence) is replaced in place instead of re-forming the run:
 * the epoch goes up and every member is told; the survivors stop where they stand and report, the servers
 * report their push counts, and a restarted worker of that rank joins as its replacement. Returns 1 when the
 * replacement began, 0 when the loss must re-form the run. */
static int try_replace(ctl_rendezvous *rv, const conn *c)
{
    if (c->role != CTL_ROLE_WORKER)
        return 0;
    return start_replace(rv, c->rank, c->peer, c);
}

/* The replacement of worker[rank] (last seen at `peer`) begins: try_replace's work for a worker that may hold
 * no connection here (lost while no rendezvous ran, adopt_missing_worker); every joined member but `except`
 * and a learner is told. Returns 1 when it began, 0 when the loss must re-form the run. */
static int start_replace(ctl_rendezvous *rv, int rank, const char *peer, const conn *except)
{
    if (!rv->replace || rv->shutdown_sent || atomic_load(&rv->workers_left) > 0)
        return 0;
    if (rv->learner) {
        log_error("control plane: worker[%d] lost while server[%d] rejoins: falling back to the checkpoint "
                  "re-form",
                  rank, rv->learner->rank);
        return 0;
    }
    const int S = rv->num_servers, W = rv->num_workers;
    /* Servers failed over and not rejoined take no part: the survivors retired their copies at each
     * failover, and the replacement's join reply lists them (lost_servers) so that it retires them too. */
    rv->wr_rank = rank;
    snprintf(rv->wr_peer, sizeof rv->wr_peer, "%s", peer);
    rv->wr_phase = WR_REPORTS;
    rv->wr_t0 = pf_now_s();
    rv->wr_umin = rv->wr_pmin = INT64_MAX;
    rv->wr_umax = -1;
    rv->wr_repl = NULL;
    memset(rv->wr_in, 0, (size_t)(S + W));
    rv->epoch++;
    rv->wr_epoch = rv->epoch;
    metrics_add(rv->m_lost, 1);
    metrics_set(rv->m_epoch, rv->epoch);
    char text[400];
    snprintf(
        text, sizeof text,
        "worker[%d] (%s) lost: the other workers stop where they stand and wait up to %.0f s for its "
        "replacement (its supervisor restarts it), then redo the step it was lost in; membership epoch %u",
        rank, peer, rv->timeout_s, rv->epoch);
    log_warn("control plane: %s", text);
    for (int i = 0; i < rv->nconns; i++) {
        conn *o = rv->conns[i];
        if (o != except && o->joined && !o->learning && !o->closing && !o->dead)
            send_wr_notice(rv, o, CTL_FO_WORKER_LOST, rank, 0, text, NULL, 0, NULL, 0);
    }
    return 1;
}

/* Every report and the replacement are in: the redo step R is the smallest of the survivors' first
 * unfinished steps and the servers' counts of the lost worker's whole pushes, taken back to the start of its
 * gradient_acc window (the lost worker's class-center sums of the window are lost with it; a survivor keeps
 * its state at its current and its previous window's start); every server rolls back the pushes of steps
 * >= R (both its copies) and takes the replacement's address. */
static void replace_decide(ctl_rendezvous *rv)
{
    const int S = rv->num_servers, W = rv->num_workers;
    if (rv->wr_phase != WR_REPORTS || !rv->wr_repl)
        return;
    for (int s = 0; s < S; s++)
        if (!rv->srv_lost[s] && !rv->wr_in[s])
            return;
    for (int w = 0; w < W; w++)
        if (w != rv->wr_rank && !rv->wr_in[S + w])
            return;
    const int64_t k = rv->acc_k, R0 = rv->wr_umin < rv->wr_pmin ? rv->wr_umin : rv->wr_pmin;
    const int64_t R = R0 - R0 % k, umax_start = rv->wr_umax - rv->wr_umax % k;
    if (umax_start - R > k) {
        char why[240];
        snprintf(why, sizeof why,
                 "a worker stands at step %lld, more than one %s past the redo step %lld (each keeps two)",
                 (long long)rv->wr_umax, k > 1 ? "gradient_acc window" : "step", (long long)R);
        replace_fallback(rv, why);
        return;
    }
    rv->wr_step = R;
    rv->wr_phase = WR_ROLLBACK;
    memset(rv->wr_in, 0, (size_t)(S + W));
    rv->epoch++;
    rv->wr_epoch = rv->epoch;
    metrics_set(rv->m_epoch, rv->epoch);
    char text[500];
    snprintf(text, sizeof text,
             "worker[%d]'s replacement joined from %s: every worker redoes step %lld (workers stood at steps "
             "%lld..%lld, the servers held %lld of its pushes); the servers undo the pushes of steps >= %lld "
             "(steps counted from 0: step %lld is logged as Global Step: %lld); membership epoch %u",
             rv->wr_rank, rv->wr_repl->peer, (long long)R, (long long)rv->wr_umin, (long long)rv->wr_umax,
             (long long)rv->wr_pmin, (long long)R, (long long)R, (long long)R + 1, rv->epoch);
    log_warn("control plane: %s", text);
    for (int s = 0; s < S; s++) {
        int seat = ctl_roster_seat(&rv->roster, CTL_ROLE_SERVER, s);
        conn *o = seat < 0 || rv->srv_lost[s] ? NULL : (conn *)rv->roster.seats[seat].holder;
        if (o)
            send_wr_notice(rv, o, CTL_FO_ROLLBACK, rv->wr_rank, R, text, rv->wr_repl->addr,
                           rv->wr_repl->addr_len, NULL, 0);
    }
}

/* Every server rolled back: the survivors get the redo (step, donor, every worker's book entry). */
static void replace_redo(ctl_rendezvous *rv)
{
    const int S = rv->num_servers, W = rv->num_workers;
    for (int s = 0; s < S; s++)
        if (!rv->srv_lost[s] && !rv->wr_in[s])
            return;
    ProtobufCBinaryData *wa = calloc((size_t)W, sizeof *wa);
    if (!wa) {
        replace_fallback(rv, "out of memory");
        return;
    }
    rv->wr_donor = -1;
    for (int w = 0; w < W; w++) {
        conn *o = w == rv->wr_rank ? rv->wr_repl : worker_conn(rv, w);
        if (o) {
            wa[w].data = o->addr;
            wa[w].len = o->addr_len;
        }
        if (w != rv->wr_rank && rv->wr_donor < 0)
            rv->wr_donor = w;
    }
    rv->wr_phase = WR_STATE;
    rv->wr_epoch = rv->epoch; /* the donor's "state ready" answers the redo notice, sent at this epoch */
    char text[200];
    snprintf(text, sizeof text, "redo from step %lld; worker[%d] hands its state to worker[%d]'s replacement",
             (long long)rv->wr_step, rv->wr_donor, rv->wr_rank);
    log_info("control plane: every server rolled back: %s", text);
    for (int w = 0; w < W; w++) {
        conn *o = w == rv->wr_rank ? NULL : worker_conn(rv, w);
        if (o)
            send_wr_notice(rv, o, CTL_FO_REDO, rv->wr_donor, rv->wr_step, text, NULL, 0, wa, (size_t)W);
    }
    free(wa);
}

/* After a failover during the replacement: the phase may now have every report it waits for (the lost
 * server's is no longer needed). */
static void replace_progress(ctl_rendezvous *rv)
{
    if (rv->wr_phase == WR_REPORTS)
        replace_decide(rv);
    else if (rv->wr_phase == WR_ROLLBACK)
        replace_redo(rv);
}

/* The donor's state is written: the replacement takes the lost worker's seat and gets its book. */
static void replace_done(ctl_rendezvous *rv)
{
    conn *c = rv->wr_repl;
    int seat = ctl_roster_seat(&rv->roster, CTL_ROLE_WORKER, rv->wr_rank);
    if (seat < 0 || rv->roster.seats[seat].holder) {
        replace_fallback(rv, "the lost worker's seat is held");
        return;
    }
    ctl_roster_take(&rv->roster, seat, c, c->peer, NULL, NULL, 0);
    c->seat = seat;
    c->replacing = 0;
    join_metrics(rv, c);
    metrics_set(rv->m_members, rv->roster.held);
    char reason[200];
    snprintf(reason, sizeof reason, "replacing worker[%d]: loading worker[%d]'s state of step %lld",
             rv->wr_rank, rv->wr_donor, (long long)rv->wr_step);
    if (send_late_reply(rv, c, NULL, rv->wr_step, reason, rv->wr_donor) < 0) {
        replace_fallback(rv, "out of memory building the join reply");
        return;
    }
    log_warn(
        "control plane: worker[%d] replaced in place from %s, %.2f s after its loss: the run redoes step "
        "%lld (counted from 0: the workers log it as Global Step: %lld; membership epoch %u)",
        rv->wr_rank, c->peer, pf_now_s() - rv->wr_t0, (long long)rv->wr_step, (long long)rv->wr_step + 1,
        rv->epoch);
    rv->wr_rank = -1;
    rv->wr_phase = 0;
    rv->wr_repl = NULL;
}

/* A member's report for the replacement under way (CTL_FO_WORKER_REPORT, CTL_FO_ROLLED_BACK,
 * CTL_FO_STATE_READY, CTL_FO_NO_REDO); reports of another phase or epoch are ignored. */
static void replace_report(ctl_rendezvous *rv, conn *c, const Pfcps__Failover *f)
{
    const int S = rv->num_servers;
    if (rv->wr_rank < 0 || c->replacing || f->epoch != rv->wr_epoch)
        return;
    const int idx = c->role == CTL_ROLE_SERVER ? c->rank : S + c->rank;
    if (f->kind == CTL_FO_NO_REDO && rv->wr_phase == WR_REPORTS && c->role == CTL_ROLE_WORKER) {
        /* A survivor still in its set-up (the initial parameters' broadcast, the data set): it has no step
         * start to go back to, and would only end its set-up when the run breaks. */
        char why[160];
        snprintf(why, sizeof why,
                 "worker[%d] was still in its set-up (no step begun): it has no step to redo", c->rank);
        replace_fallback(rv, why);
        return;
    }
    if (f->kind == CTL_FO_WORKER_REPORT && rv->wr_phase == WR_REPORTS && !rv->wr_in[idx]) {
        rv->wr_in[idx] = 1;
        if (c->role == CTL_ROLE_SERVER) {
            if (f->step < rv->wr_pmin)
                rv->wr_pmin = f->step;
        } else {
            if (f->step < rv->wr_umin)
                rv->wr_umin = f->step;
            if (f->step > rv->wr_umax)
                rv->wr_umax = f->step;
            if (f->fabric_addr.len) { /* its new collectives endpoint */
                memcpy(c->addr, f->fabric_addr.data, f->fabric_addr.len);
                c->addr_len = f->fabric_addr.len;
            }
        }
        replace_decide(rv);
    } else if (f->kind == CTL_FO_ROLLED_BACK && rv->wr_phase == WR_ROLLBACK && c->role == CTL_ROLE_SERVER) {
        rv->wr_in[idx] = 1;
        replace_redo(rv);
    } else if (f->kind == CTL_FO_STATE_READY && rv->wr_phase == WR_STATE && c->role == CTL_ROLE_WORKER &&
               c->rank == rv->wr_donor) {
        replace_done(rv);
    }
}

/* c (joined, no seat) is the replacement of the worker being replaced: it takes part in the decision. */
static void take_replacement(ctl_rendezvous *rv, conn *c)
{
    c->replacing = 1;
    rv->wr_repl = c;
    log_warn("control plane: worker[%d]'s replacement joined from %s, %.2f s after its loss", rv->wr_rank,
             c->peer, pf_now_s() - rv->wr_t0);
    replace_decide(rv);
}

/* A worker joining for the rank being replaced is its replacement: it waits (no seat) until the redo is set
 * up. Returns 1 when c was taken (or refused) here. */
static int replace_join(ctl_rendezvous *rv, conn *c, const Pfcps__Join *j)
{
    if (j->role != PFCPS__ROLE__WORKER || !rv->replace || !rv->roster.formed || j->rank < 0 ||
        j->rank >= rv->num_workers)
        return 0;
    if (rv->wr_rank < 0 && worker_conn(rv, j->rank)) {
        /* Its previous process' loss is not seen yet (a close on its way, or silence not yet past the limit):
         * the join is retried, and is then this worker's replacement. */
        conn_refuse(rv, c, EAGAIN, "this worker rank is still a member of the run (its loss is not seen yet)");
        return 1;
    }
    if (rv->end_step > 0) {
        /* Its previous process was lost after the end vote (restarted by a supervisor): nothing to do. */
        char msg[160];
        snprintf(msg, sizeof msg,
                 "training is over: every worker passed the end vote at step %lld; nothing left to replace",
                 (long long)rv->end_step);
        conn_refuse(rv, c, ESHUTDOWN, msg);
        return 1;
    }
    if (rv->wr_rank < 0 || j->rank != rv->wr_rank)
        return 0;
    if (rv->wr_repl) {
        conn_refuse(rv, c, EEXIST, "a replacement for this worker rank joined already");
        return 1;
    }
    join_unseated(c, CTL_ROLE_WORKER, j);
    take_replacement(rv, c);
    return 1;
}

/* The keys the rendezvous runs a run with (its roster, its failure detection, its failover and replacement
 * rules): a running run whose config differs from this rendezvous' own in one of them cannot be adopted. */
static const char *const rv_run_keys[] = {"servers",     "workers",       "replicas",
                                          "head_mode",   "device",        "gradient_acc",
                                          "ctl_timeout", "ctl_max_frame", NULL};

/* The first Resume of a running run: its run config (the members' book's, config_text) is the run's, whatever
 * this rendezvous' own config (server 0's, restarted perhaps with an edited file) says, so that a restart
 * never changes what the run trains with (the members already run with theirs, and a replacement or server
 * 0 itself later joins with the text kept here). Keys the rendezvous itself runs with (rv_run_keys) must
 * agree: else the refusal's reason, naming them, in why[cap]. Other differences are logged, once, and the
 * run's values kept. Returns NULL (text kept as the run's) or why. */
static const char *adopt_run_config(ctl_rendezvous *rv, const char *text, char *why, size_t cap)
{
    if (!text)
        text = "";
    if (!strcmp(text, rv->config_text))
        return NULL;
    pf_config run, own;
    if (cfg_load_text(&run, text) < 0) {
        snprintf(why, cap, "its run config does not parse: %s", pf_errmsg());
        return why;
    }
    if (cfg_load_text(&own, rv->config_text) < 0) {
        snprintf(why, cap, "this rendezvous' own config does not parse: %s", pf_errmsg());
        return why;
    }
    size_t o = 0;
    int n = 0;
    for (int i = 0; rv_run_keys[i]; i++) {
        char a[CFG_STR + 8], b[CFG_STR + 8];
        if (cfg_format_key(&run, rv_run_keys[i], a, sizeof a) < 0 ||
            cfg_format_key(&own, rv_run_keys[i], b, sizeof b) < 0 || !strcmp(a, b))
            continue;
        if (n++ == 0)
            o = (size_t)snprintf(
                why, cap,
                "the running run's config differs from this rendezvous' own (server 0's) in keys "
                "it runs the run with (start server 0 with the run's config): ");
        if (o < cap)
            o += (size_t)snprintf(why + o, cap - o, "%s%s = %s (%s here)", n > 1 ? ", " : "", rv_run_keys[i],
                                  a, b);
    }
    if (n)
        return why;
    char diff[1024];
    int nd = cfg_diff(&run, &own, NULL, cfg_member_local_keys, diff, sizeof diff);
    char *keep = strdup(text);
    if (!keep) {
        snprintf(why, cap, "out of memory keeping the run's config");
        return why;
    }
    if (nd)
        log_warn(
            "control plane: this server 0's config differs from the running run's in %d key%s: the run keeps "
            "its own (the run's value first, this server 0's in parentheses): %s",
            nd, nd > 1 ? "s" : "", diff);
    free(rv->config_text);
    rv->config_text = keep;
    return NULL;
}

/* A Resume's checks (protocol, MAC, replicas, run config, rank) and, once adopting, its run. Returns 1 when
 * it may take its seat, 0 when c was refused. */
static int resume_acceptable(ctl_rendezvous *rv, conn *c, const Pfcps__Resume *r, ctl_role role, int seat)
{
    char msg[PF_ERRMSG_MAX];
    const char *who = ctl_role_name((int)role);
    uint8_t mac[CTL_MAC_LEN];
    if (c->joined) {
        conn_refuse(rv, c, EPROTO, "resume from a connection that already joined");
        return 0;
    }
    if (r->protocol_version != CTL_PROTOCOL_VERSION) {
        snprintf(msg, sizeof msg, "protocol version %u, this service speaks %d", r->protocol_version,
                 CTL_PROTOCOL_VERSION);
        conn_refuse(rv, c, EPROTO, msg);
        return 0;
    }
    if (r->mac.len != CTL_MAC_LEN ||
        ctl_resume_mac(rv->secret, c->nonce, sizeof c->nonce, (int)r->role, r->rank, r->fabric_addr.data,
                       r->fabric_addr.len, r->run_id.data, r->run_nonce.data, r->config_digest.data, r->epoch,
                       r->lost_servers, r->n_lost_servers, r->config_text, mac) < 0 ||
        CRYPTO_memcmp(mac, r->mac.data, CTL_MAC_LEN) != 0) {
        snprintf(msg, sizeof msg, "resume as %s rank %d refused: bad secret (HMAC does not match)", who, r->rank);
        conn_refuse(rv, c, EACCES, msg);
        return 0;
    }
    const char *bad = NULL;
    char why[PF_ERRMSG_MAX / 2];
    int code = seat < 0 ? ERANGE : EEXIST;
    if (!rv->replicas)
        bad = "this rendezvous runs with replicas = 0: it adopts no running run";
    else if (rv->adopting && strcmp(r->config_text ? r->config_text : "", rv->config_text) != 0)
        bad = "a member with another run config than the run adopted here";
    else if (seat < 0 || (role == CTL_ROLE_SERVER && r->rank == 0))
        bad = "a rank outside the run (or server 0, which rejoins by a join)";
    else if (rv->adopting == 0 && rv->roster.formed)
        bad = "this rendezvous formed a run of its own";
    else if (rv->adopting && (memcmp(r->run_id.data, rv->run_id, CKPT_RUN_ID_BYTES) != 0 ||
                              memcmp(r->run_nonce.data, rv->run_nonce, sizeof rv->run_nonce) != 0))
        bad = "a member of another run (its run id or nonce is not the run's being adopted here)";
    else if (role == CTL_ROLE_WORKER && r->rank == rv->wr_rank) {
        /* ETIMEDOUT: removed as a silent member is; the worker exits for its supervisor to start it again,
         * and that process joins as its own replacement. */
        bad = "its rank was taken for lost (no resume within the silence limit) and is being replaced";
        code = ETIMEDOUT;
    } else if (rv->roster.seats[seat].holder)
        bad = "its rank resumed already";
    else if (!rv->adopting && (bad = adopt_run_config(rv, r->config_text, why, sizeof why)) != NULL) {
        /* The running run cannot be adopted here, ever: the members that joined this rendezvous for a new run
         * (server 0's own join, a restarted member's) are refused with the reason now, so that server 0 exits
         * at once, naming it, rather than hosting a run that cannot form while the running one stalls. */
        for (int i = 0; i < rv->nconns; i++) {
            conn *o = rv->conns[i];
            if (o != c && o->joined && !o->closing && !o->dead)
                conn_refuse(rv, o, EINVAL, bad);
        }
    }
    if (bad) {
        /* Logged by conn_refuse as a connection without a join (the first few, then a summary now and then):
         * a refused member tries again every 0.25 s. */
        snprintf(msg, sizeof msg, "resume as %s rank %d refused: %s", who, r->rank, bad);
        rv->resumes_refused++;
        rv->resume_refused_t = pf_now_s();
        snprintf(rv->resume_refused, sizeof rv->resume_refused, "%s", msg);
        conn_refuse(rv, c, code, msg);
        return 0;
    }
    return 1;
}

/* The adoption is complete: every member but server 0 resumed (missing < 0), or every member but server 0 and
 * worker[missing], whose replacement begins at once (adopt_missing_worker). The run counts as formed at a
 * new epoch; server 0's join is then a failed-over server's rejoin (rejoin_begin), after the replacement. */
static void adopt_complete(ctl_rendezvous *rv, int missing)
{
    conn *cand = rv->adopt_cand;
    rv->adopt_cand = NULL;
    if (cand && cand->rank != missing) {
        /* its rank resumed: the old process lives on */
        cand->replacing = 0;
        cand->joined = 0;
        conn_refuse(rv, cand, EEXIST,
                    "this worker rank resumed the running run: a second process is not needed");
        cand = NULL;
    }
    char hex[2 * CKPT_RUN_ID_BYTES + 1];
    ckpt_run_id_hex(rv->run_id, hex);
    __atomic_store_n(&rv->adopting, 2, __ATOMIC_RELEASE);
    rv->roster.formed = 1;
    rv->epoch++;
    metrics_set(rv->m_epoch, rv->epoch);
    metrics_set(rv->m_members, rv->roster.held);
    count_single(rv);
    const char *s0 = rv->rejoin
                         ? "server 0 rejoins as a learner (it copies its shards at a checkpoint the workers "
                           "take)"
                         : "server 0 hosts the rendezvous without shards (no rejoin under head_mode = local)";
    if (missing < 0) {
        log_warn("control plane: adopted the running run %s: every member but server 0 resumed; epoch %u; %s",
                 hex, rv->epoch, s0);
        return;
    }
    log_warn(
        "control plane: adopted the running run %s: every member but server 0 and worker[%d] resumed; "
        "epoch %u; worker[%d] was lost while no rendezvous ran (with server 0, or since): it is replaced "
        "in place, then %s",
        hex, missing, rv->epoch, missing, s0);
    if (!start_replace(rv, missing, "lost while no rendezvous ran", cand)) {
        metrics_add(rv->m_reforms, 1);
        queue_member_lost(rv, NULL, CTL_ROLE_WORKER, missing, "lost while no rendezvous ran",
                          "did not resume and cannot be replaced in place: the run re-forms from the newest "
                          "complete checkpoint");
        return;
    }
    if (cand)
        take_replacement(rv, cand); /* held while the run was adopted */
}

/* replace_workers, while adopting: the worker rank whose seat alone is empty besides server 0's (a worker
 * lost together with server 0, one machine holding both, or while no rendezvous ran), or -1 (another seat is
 * empty too, or worker replacement is off). */
static int adopt_missing_worker(const ctl_rendezvous *rv)
{
    if (!rv->replace || rv->adopting != 1 || rv->roster.seats[0].holder ||
        rv->roster.held != rv->num_servers + rv->num_workers - 2)
        return -1;
    for (int w = 0; w < rv->num_workers; w++) {
        int seat = ctl_roster_seat(&rv->roster, CTL_ROLE_WORKER, w);
        if (seat >= 0 && !rv->roster.seats[seat].holder)
            return w;
    }
    return -1;
}

/* While adopting: a join of worker rank d whose seat is empty (a member of the run resumes, so this is the
 * process its supervisor started again) is held, without a seat, as d's replacement: once every member but
 * server 0 and d resumed (adopt_progress) the adoption completes without d and d's replacement begins with
 * it; should d resume instead, it is refused (EEXIST). Returns 1 when c was held, 0 when it is to retry. */
static int adopt_hold_join(ctl_rendezvous *rv, conn *c, ctl_role role, const Pfcps__Join *j)
{
    int seat = role == CTL_ROLE_WORKER ? ctl_roster_seat(&rv->roster, role, j->rank) : -1;
    if (!rv->replace || seat < 0 || rv->roster.seats[seat].holder || rv->adopt_cand)
        return 0;
    join_unseated(c, CTL_ROLE_WORKER, j);
    c->replacing = 1; /* told nothing until it is seated: its join reply carries what it needs */
    rv->adopt_cand = c;
    log_warn(
        "control plane: worker[%d] joined from %s while the running run is adopted here and has not resumed "
        "it: held as its replacement (unless it resumes)",
        j->rank, c->peer);
    return 1;
}

/* The first Resume: worker c joined here for a new run before it (a restarted worker whose join came before
 * the members' Resumes) gives its seat back and is held as its rank's replacement, as adopt_hold_join holds a
 * later join. Returns 1 when held, 0 when c is to be asked to join again. */
static int adopt_hold_joined(ctl_rendezvous *rv, conn *c)
{
    if (!rv->replace || c->role != CTL_ROLE_WORKER || c->seat < 0 || c->learning || c->replacing ||
        rv->adopt_cand)
        return 0;
    if (rv->metrics) {
        metrics_remove(c->info);
        c->info = NULL;
        targets_set(c->seat, c->role, c->rank, NULL);
    }
    ctl_roster_release(&rv->roster, c->seat, c, 0, 0);
    atomic_fetch_sub(&rv->joined, 1);
    c->seat = -1;
    c->replacing = 1;
    rv->adopt_cand = c;
    log_warn("control plane: worker[%d] (%s) joined before the running run was resumed here: held as its "
             "replacement (unless it resumes)",
             c->rank, c->peer);
    return 1;
}

/* While adopting, after a Resume or a held join: every member but server 0 and worker d resumed and d's
 * replacement is held: the adoption completes without d and d is replaced now (no wait for the silence
 * limit). */
static void adopt_progress(ctl_rendezvous *rv)
{
    int d = adopt_missing_worker(rv);
    if (d >= 0 && rv->adopt_cand && rv->adopt_cand->rank == d)
        adopt_complete(rv, d);
}

/* While adopting, once a pass: a worker whose seat alone is empty besides server 0's and which did not resume
 * within the silence limit of the newest Resume (an orphaned member tries every 0.25 s) was lost: the adoption
 * completes without it and its replacement begins, waiting up to ctl_timeout for the restarted process. */
static void adopt_expire(ctl_rendezvous *rv, double now)
{
    if (rv->adopting != 1 || now - rv->adopt_last <= ctl_member_silence_s(rv->timeout_s))
        return;
    int d = adopt_missing_worker(rv);
    if (d >= 0) {
        adopt_complete(rv, d);
        return;
    }
    if (now - rv->adopt_t0 <= rv->timeout_s + ctl_member_silence_s(rv->timeout_s))
        return;
    /* Members still missing ctl_timeout past the silence limit, and not one worker alone: the run cannot be
     * adopted (a server lost while no rendezvous ran, two workers, ...): the re-form, told to every member.
     */
    char missing[400] = "";
    size_t len = 0;
    for (int i = 0; i < ctl_roster_size(&rv->roster) && len + 32 < sizeof missing; i++)
        if (i != 0 && !rv->roster.seats[i].holder) /* seat 0: server 0's */
            len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%s[%d]", len ? ", " : "",
                                    ctl_role_name(ctl_roster_role(&rv->roster, i)),
                                    ctl_roster_rank(&rv->roster, i));
    char text[600];
    snprintf(
        text, sizeof text,
        "the running run could not be adopted here: %s did not resume within ctl_timeout (%.0f s) past the "
        "silence limit; falling back to the checkpoint re-form",
        missing[0] ? missing : "a member", rv->timeout_s);
    log_error("control plane: %s", text);
    metrics_add(rv->m_reforms, 1);
    queue_reform(rv, NULL, text);
    __atomic_store_n(&rv->adopting, 2, __ATOMIC_RELEASE); /* given up: no further adoption */
}

/* replicas = 1: a member of a running run whose rendezvous was lost with server 0 reconnects to this one, a
 * restarted server 0's (docs/architecture.md, "Server 0 and the rendezvous"). The first Resume makes this
 * rendezvous adopt that run (its run id, nonce; connections that joined for a new run, server 0's own, are
 * asked to join again); each member takes its seat with its book entry, the epoch rises past every reported
 * one and the lost set takes every reported server. Once every member but server 0 resumed, the run counts as
 * formed at a new epoch, and server 0's join is a failed-over server's rejoin (rejoin_begin). Each Resume is
 * acknowledged with the service's epoch. */
static void handle_resume(ctl_rendezvous *rv, conn *c, const Pfcps__Resume *r)
{
    ctl_role role = r->role == PFCPS__ROLE__SERVER ? CTL_ROLE_SERVER : CTL_ROLE_WORKER;
    int seat = ctl_roster_seat(&rv->roster, role, r->rank);
    if (!resume_acceptable(rv, c, r, role, seat))
        return;
    char hex[2 * CKPT_RUN_ID_BYTES + 1];
    ckpt_run_id_hex(r->run_id.data, hex);
    if (!rv->adopting) {
        __atomic_store_n(&rv->adopting, 1, __ATOMIC_RELEASE);
        rv->adopt_t0 = pf_now_s();
        memcpy(rv->run_id, r->run_id.data, CKPT_RUN_ID_BYTES);
        memcpy(rv->run_nonce, r->run_nonce.data, sizeof rv->run_nonce);
        log_warn("control plane: %s[%d] (%s) resumes the running run %s here (its rendezvous was lost with "
                 "server 0): adopting it; waiting for its other members",
                 ctl_role_name((int)role), r->rank, c->peer, hex);
        for (int i = 0; i < rv->nconns; i++) {
            conn *o = rv->conns[i];
            if (o != c && o->joined && !o->closing && !o->dead && !adopt_hold_joined(rv, o))
                conn_refuse(rv, o, EAGAIN,
                            "this rendezvous adopts a running run (a member resumed it): join again once it has");
        }
    }
    c->joined = 1;
    c->hb_seen = 1;
    c->role = role;
    c->rank = r->rank;
    c->seat = seat;
    c->addr_len = r->fabric_addr.len;
    if (c->addr_len)
        memcpy(c->addr, r->fabric_addr.data, c->addr_len);
    c->deadline = pf_now_s() + ctl_member_silence_s(rv->timeout_s);
    int held = ctl_roster_take(&rv->roster, seat, c, c->peer, NULL, NULL, 0);
    join_metrics(rv, c);
    atomic_fetch_add(&rv->joined, 1);
    if (r->epoch > rv->epoch)
        rv->epoch = r->epoch;
    for (size_t i = 0; i < r->n_lost_servers; i++)
        if (r->lost_servers[i] < rv->num_servers)
            rv->srv_lost[r->lost_servers[i]] = 1;
    rv->srv_lost[0] = 1;
    Pfcps__Resume ack = *r;
    ack.mac.data = NULL;
    ack.mac.len = 0;
    ack.epoch = rv->epoch;
    Pfcps__CtlMessage m = PFCPS__CTL_MESSAGE__INIT;
    m.body_case = PFCPS__CTL_MESSAGE__BODY_RESUME;
    m.resume = &ack;
    conn_send_msg(rv, c, &m);
    const int all = rv->num_servers + rv->num_workers;
    log_info("control plane: %s[%d] resumed from %s at epoch %u (%d/%d; server 0 rejoins)", ctl_role_name((int)role),
             r->rank, c->peer, r->epoch, held, all - 1);
    rv->adopt_last = pf_now_s();
    if (held == all - 1 && !rv->roster.seats[0].holder)
        adopt_complete(rv, -1);
    else
        adopt_progress(rv);
}

/* A join message: authenticated (join_authentic), then admitted or refused by the forming policy
 * (ctl_roster_admit). An admitted member takes its seat with its fabric address and checkpoint steps; the
 * first rejoin of a member of the formed run tells every member that the run must re-form. */
static void handle_join(ctl_rendezvous *rv, conn *c, const Pfcps__Join *j)
{
    if (!join_authentic(rv, c, j) || !join_metrics_address(rv, c, j))
        return;
    ctl_role role = j->role == PFCPS__ROLE__SERVER ? CTL_ROLE_SERVER : CTL_ROLE_WORKER;
    if (role == CTL_ROLE_SERVER && j->replicas != (uint32_t)rv->replicas) {
        /* Refused before it takes a seat, at the run's forming as at a rejoin: a server opens its copies'
         * endpoints from its own config before it joins, so it could not serve the run's copies. (Workers
         * take the run's value from the join reply.) */
        char msg[PF_ERRMSG_MAX];
        snprintf(msg, sizeof msg,
                 "server[%d] was started with replicas = %u, the run has replicas = %d (server 0's config): a "
                 "server's endpoints (one per copy it holds) follow it; start it with the run's config",
                 j->rank, j->replicas, rv->replicas);
        rv->joins_refused++;
        rv->join_refused_t = pf_now_s();
        snprintf(rv->join_refused, sizeof rv->join_refused, "%s", msg);
        conn_refuse(rv, c, EINVAL, msg);
        return;
    }
    if (role == CTL_ROLE_WORKER && j->endpoint_keys && j->endpoint_keys[0]) {
        /* Refused before it takes a seat, at the forming as for a replacement: a worker opens its endpoints
         * and sizes its buffers from its own config before it joins (train_net_check_run would stop it after
         * the join, and its loss would stop the others). A run config that does not parse (never the case
         * for server 0's own) leaves the check to the worker. */
        pf_config run;
        char diff[300], msg[PF_ERRMSG_MAX];
        int nd = cfg_load_text(&run, rv->config_text) < 0
                     ? 0
                     : cfg_keys_text_diff(j->endpoint_keys, &run, diff, sizeof diff);
        if (nd > 0) {
            snprintf(
                msg, sizeof msg,
                "worker[%d] was started with a config that differs from the run's in %d key%s "
                "its endpoints are opened with (the worker's value first, the run's in parentheses): %s; "
                "start it with the run's config",
                j->rank, nd, nd > 1 ? "s" : "", diff);
            rv->joins_refused++;
            rv->join_refused_t = pf_now_s();
            snprintf(rv->join_refused, sizeof rv->join_refused, "%s", msg);
            conn_refuse(rv, c, EINVAL, msg);
            return;
        }
    }
    if (rv->adopting && rv->reform_sent) {
        conn_refuse(rv, c, ENOLINK,
                    "the running run adopted here re-forms from its newest complete checkpoint");
        return;
    }
    if (rv->adopting == 1) {
        if (adopt_hold_join(rv, c, role, j))
            adopt_progress(rv);
        else
            conn_refuse(rv, c, EAGAIN,
                        "this rendezvous is adopting a running run: waiting for its members to resume it");
        return;
    }
    if (role == CTL_ROLE_SERVER && j->rank >= 0 && j->rank < rv->num_servers && rv->srv_lost[j->rank]) {
        rejoin_begin(rv, c, j);
        return;
    }
    if (replace_join(rv, c, j))
        return;
    ctl_admission adm;
    if (ctl_roster_admit(&rv->roster, role, j->rank, &adm) != 0) {
        if (adm.restarted) {
            metrics_add(rv->m_reforms, 1);
            log_warn(
                "control plane: %s[%d] joined again from %s after the run formed (a restarted member): "
                "the run must re-form and resume from its newest complete checkpoint; telling every member",
                ctl_role_name(role), j->rank, c->peer);
            queue_member_lost(rv, c, role, j->rank, c->peer,
                              "restarted and joined again: the run re-forms from the newest complete "
                              "checkpoint");
        }
        conn_refuse(rv, c, adm.code, adm.reason);
        return;
    }
    if (j->n_resume_steps) {
        /* ctl_msg_check: one identity per step, each of the right lengths. */
        c->steps = malloc(sizeof(int64_t) * j->n_resume_steps);
        c->ids = calloc(j->n_resume_steps, sizeof *c->ids);
        if (!c->steps || !c->ids) {
            conn_refuse(rv, c, EIO, "out of memory");
            return;
        }
        memcpy(c->steps, j->resume_steps, sizeof(int64_t) * j->n_resume_steps);
        for (size_t i = 0; i < j->n_resume_steps; i++) {
            memcpy(c->ids[i].run_id, j->resume_idents[i]->run_id.data, CKPT_RUN_ID_BYTES);
            c->ids[i].seed = j->resume_idents[i]->seed;
            memcpy(c->ids[i].config_digest, j->resume_idents[i]->config_digest.data, CKPT_DIGEST_BYTES);
        }
        c->nsteps = j->n_resume_steps;
    }
    c->joined = 1;
    c->role = role;
    c->rank = j->rank;
    c->seat = adm.seat;
    c->addr_len = j->fabric_addr.len;
    if (c->addr_len)
        memcpy(c->addr, j->fabric_addr.data, c->addr_len);
    c->deadline = 0;
    ctl_roster_take(&rv->roster, adm.seat, c, c->peer, c->steps, c->ids, c->nsteps);
    join_metrics(rv, c);
    int n = atomic_fetch_add(&rv->joined, 1) + 1;
    log_info("control plane: %s[%d] joined from %s (%d/%d)", ctl_role_name(role), j->rank, c->peer, n,
             rv->num_servers + rv->num_workers);
}

/* One decoded message from c: a join, a joined member's leave (a Shutdown message) or heartbeat (echoed);
 * anything else is refused. */
static void handle_msg(ctl_rendezvous *rv, conn *c, const Pfcps__CtlMessage *m)
{
    char msg[PF_ERRMSG_MAX];
    if (m->body_case == PFCPS__CTL_MESSAGE__BODY_JOIN) {
        handle_join(rv, c, m->join);
        return;
    }
    if (m->body_case == PFCPS__CTL_MESSAGE__BODY_RESUME) {
        handle_resume(rv, c, m->resume);
        return;
    }
    if (c->joined && m->body_case == PFCPS__CTL_MESSAGE__BODY_SHUTDOWN) {
        /* A member's orderly leave (ctl_session_leave): its coming disconnect is not a loss. */
        c->left = 1;
        log_info("control plane: %s[%d] left the run", ctl_role_name(c->role), c->rank);
        /* A server that stops (SIGTERM) while workers still need it: the run cannot go on without its shard.
         */
        if (c->role == CTL_ROLE_SERVER && !rv->reform_sent &&
            ctl_roster_server_leave_is_loss(&rv->roster, atomic_load(&rv->workers_left), rv->shutdown_sent))
            queue_member_lost(rv, c, c->role, c->rank, c->peer,
                              "stopped while the workers still need its shard");
        if (c->role == CTL_ROLE_WORKER && atomic_fetch_add(&rv->workers_left, 1) + 1 == rv->num_workers)
            log_info("control plane: every worker %s: training is over",
                     rv->lost_after_end ? "left the run or was lost after the end vote"
                                        : "left the run in order");
        /* A survivor that finished training (the lost worker was in the last step or the final save) cannot
         * redo a step with a replacement: fall back now rather than after ctl_timeout. */
        if (c->role == CTL_ROLE_WORKER && rv->wr_rank >= 0 && c->rank != rv->wr_rank) {
            char why[160];
            snprintf(why, sizeof why, "worker[%d] left the run (its training is done) and cannot redo a step",
                     c->rank);
            replace_fallback(rv, why);
        }
        return;
    }
    if (c->joined && m->body_case == PFCPS__CTL_MESSAGE__BODY_ERROR && m->error) {
        /* A member about to exit on a failure of its own (ctl_session_fail): its disconnect is told with it. */
        snprintf(c->failed, sizeof c->failed, "%s", m->error->message ? m->error->message : "");
        return;
    }
    if (c->joined && m->body_case == PFCPS__CTL_MESSAGE__BODY_FAILOVER) {
        /* A rejoin's reports: a worker's copy step, the learner's ready. Others are ignored. */
        const Pfcps__Failover *f = m->failover;
        if (f->kind == CTL_FO_WORKER_REPORT || f->kind == CTL_FO_ROLLED_BACK ||
            f->kind == CTL_FO_STATE_READY || f->kind == CTL_FO_NO_REDO)
            replace_report(rv, c, f);
        else if (f->kind == CTL_FO_END_VOTED && c->role == CTL_ROLE_WORKER && !c->replacing && !c->learning)
            end_voted(rv, c, f->step);
        else if (f->kind == CTL_FO_REJOIN_STEP && c->role == CTL_ROLE_WORKER && !c->learning)
            rejoin_step(rv, c, f->step);
        else if (f->kind == CTL_FO_REJOIN_READY && c->learning && c == rv->learner && rv->learner_step > 0)
            rejoin_done(rv, c);
        return;
    }
    if (c->joined && m->body_case == PFCPS__CTL_MESSAGE__BODY_HEARTBEAT) {
        /* Echo, so the member sees the service alive (and, with replicas, renews its lease). */
        c->hb_seen = 1;
        conn_send_msg(rv, c, m);
        return;
    }
    snprintf(msg, sizeof msg, "unexpected %s message %s", ctl_msg_name(m->body_case),
             c->joined ? "from a joined member" : "(expected join)");
    conn_refuse(rv, c, EPROTO, msg);
}

/* Reads what is available and handles every complete frame. */
static void conn_read(ctl_rendezvous *rv, conn *c, double now)
{
    uint8_t tmp[65536];
    ssize_t r = recv(c->fd, tmp, sizeof tmp, 0);
    if (r < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            /* A member that said it leaves may exit with unread bytes (the shutdown broadcast): its reset is
             * its orderly exit, not a fault. */
            if (!c->left)
                log_warn("control plane: read from %s failed: %s", c->peer, strerror(errno));
            c->dead = 1;
        }
        return;
    }
    if (r == 0) {
        if (c->rlen > 0)
            log_warn(
                "control plane: %s closed the connection in the middle of a frame (truncated, %zu bytes)",
                c->peer, c->rlen);
        else if (!c->joined)
            stray_log(rv, c->peer, "closed the connection without joining");
        c->dead = 1;
        return;
    }
    if (buf_reserve(&c->rbuf, &c->rcap, c->rlen + (size_t)r) < 0) {
        c->dead = 1;
        return;
    }
    memcpy(c->rbuf + c->rlen, tmp, (size_t)r);
    c->rlen += (size_t)r;
    c->rx += (uint64_t)r;
    size_t off = 0;
    while (!c->closing && !c->dead) {
        size_t flen;
        int rc = ctl_frame_peek(c->rbuf + off, c->rlen - off, rv->max_frame, &flen);
        if (rc < 0) {
            conn_refuse(rv, c, EMSGSIZE, pf_errmsg());
            break;
        }
        if (rc == 0)
            break;
        Pfcps__CtlMessage *m;
        if (ctl_msg_decode(c->rbuf + off + 4, flen - 4, &m) < 0) {
            conn_refuse(rv, c, EPROTO, pf_errmsg());
            break;
        }
        handle_msg(rv, c, m);
        pfcps__ctl_message__free_unpacked(m, NULL);
        off += flen;
    }
    if (off > 0) {
        memmove(c->rbuf, c->rbuf + off, c->rlen - off);
        c->rlen -= off;
    }
    /* Joined members have no deadline while idle, only while a frame is half received; with replicas, one
     * that heartbeats must go on doing so (a stopped or hung member is lost as a killed one is) until it left
     * the run (a server then writes its last shard without heartbeats). */
    if (c->joined && !c->closing) {
        if (c->rlen == 0)
            c->deadline = rv->replicas && c->hb_seen && !c->left ? now + ctl_member_silence_s(rv->timeout_s) : 0;
        else if (c->deadline == 0)
            c->deadline = now + rv->timeout_s;
    }
}

/* Sends what c has queued, as far as the socket takes it; a send error marks c dead. */
static void conn_write(conn *c)
{
    while (c->wlen > 0) {
        ssize_t w = send(c->fd, c->wbuf, c->wlen, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                c->dead = 1;
            return;
        }
        memmove(c->wbuf, c->wbuf + w, c->wlen - (size_t)w);
        c->wlen -= (size_t)w;
    }
}

/* Closes a connection that has not joined (not a member: an idle or slow stranger), to make room: the oldest
 * one that never sent a byte, else the oldest one. Returns 1 when one was closed. */
static int evict_stray(ctl_rendezvous *rv)
{
    int oldest = -1;
    for (int pass = 0; pass < 2 && oldest < 0; pass++)
        for (int i = 0; i < rv->nconns; i++) {
            conn *c = rv->conns[i];
            if (!c->joined && !c->dead && (pass == 1 || c->rx == 0) &&
                (oldest < 0 || c->deadline < rv->conns[oldest]->deadline))
                oldest = i;
        }
    if (oldest < 0)
        return 0;
    conn *c = rv->conns[oldest];
    rv->conns[oldest] = rv->conns[--rv->nconns];
    rv->stray_evicted++;
    stray_log(rv, c->peer, "evicted before joining (the rendezvous is full)");
    conn_close(rv, c);
    return 1;
}

/* Refuses a connection accepted while the rendezvous is full: a best-effort error reply (a fresh socket's
 * buffer takes it without blocking), then close. */
static void accept_refuse_full(ctl_rendezvous *rv, int fd, const char *who)
{
    stray_log(rv, who, "refused: too many connections to the rendezvous");
    Pfcps__Error e;
    Pfcps__CtlMessage m;
    ctl_msg_set_error(&m, &e, EBUSY, "too many connections to the rendezvous");
    uint8_t *frame;
    size_t len;
    if (ctl_frame_encode(&m, rv->max_frame, &frame, &len) == 0) {
        ssize_t w = send(fd, frame, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)w;
        free(frame);
    }
    close(fd);
}

/* Takes an accepted, non-blocking socket from `peer` into rv->conns and queues its hello (a fresh random
 * nonce and the protocol version); the join must come by the join deadline. */
static void conn_add(ctl_rendezvous *rv, int fd, const char *peer, double now)
{
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    conn *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        return;
    }
    c->fd = fd;
    snprintf(c->peer, sizeof c->peer, "%s", peer);
    /* The join must come soon: it is sent right after the hello by every member. */
    c->deadline = now + (rv->timeout_s < CTL_JOIN_DEADLINE_S ? rv->timeout_s : CTL_JOIN_DEADLINE_S);
    rv->conns[rv->nconns++] = c;
    if (RAND_bytes(c->nonce, sizeof c->nonce) != 1) {
        conn_refuse(rv, c, EIO, "no random nonce available (RAND_bytes failed)");
        return;
    }
    Pfcps__Hello h = PFCPS__HELLO__INIT;
    h.nonce.data = c->nonce;
    h.nonce.len = sizeof c->nonce;
    h.protocol_version = CTL_PROTOCOL_VERSION;
    Pfcps__CtlMessage m = PFCPS__CTL_MESSAGE__INIT;
    m.body_case = PFCPS__CTL_MESSAGE__BODY_HELLO;
    m.hello = &h;
    conn_send_msg(rv, c, &m);
}

/* Accepts every pending connection. Out of descriptors, it closes a stranger to make room, or pauses
 * accepting for 100 ms; when the connection table is full, a stranger is evicted or the newcomer refused. */
static void accept_new(ctl_rendezvous *rv, double now)
{
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept(rv->lfd, (struct sockaddr *)&ss, &sl);
        if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
            /* Out of descriptors: make room by closing a stranger, or stop accepting for 100 ms (never spin).
             */
            if (!evict_stray(rv)) {
                rv->accept_pause_until = now + 0.1;
                stray_log(rv, "accept", "out of file descriptors; new connections wait");
                return;
            }
            continue;
        }
        if (fd < 0)
            return;
        char host[INET6_ADDRSTRLEN] = "?", serv[16] = "?", peer[CTL_PEER_LEN];
        getnameinfo((struct sockaddr *)&ss, sl, host, sizeof host, serv, sizeof serv,
                    NI_NUMERICHOST | NI_NUMERICSERV);
        snprintf(peer, sizeof peer, "%s:%s", host, serv);
        if (rv->nconns >= rv->max_conns)
            evict_stray(rv);
        if (rv->nconns >= rv->max_conns || set_nonblock(fd) < 0)
            accept_refuse_full(rv, fd, peer);
        else
            conn_add(rv, fd, peer, now);
    }
}

/* All expected members are in (ctl_roster_complete): the same reply (book, config, shard map, resume step
 * chosen by ctl_roster_resume_step) goes to each, and the roster counts the run as formed. */
static void form_run(ctl_rendezvous *rv)
{
    int n = ctl_roster_size(&rv->roster);
    Pfcps__Member *mem = calloc((size_t)n, sizeof *mem);
    Pfcps__Member **ptr = calloc((size_t)n, sizeof *ptr);
    if (!mem || !ptr) {
        free(mem);
        free(ptr);
        log_error("control plane: out of memory building the join reply");
        return;
    }
    reply_members(rv, NULL, mem, ptr); /* every seat is held: the run is complete */
    Pfcps__JoinReply r = PFCPS__JOIN_REPLY__INIT;
    reply_base(rv, &r, ptr, n);
    char reason[1024];
    uint8_t run_id[CKPT_RUN_ID_BYTES];
    /* A pinned run (resume_run) that resumes from none of its checkpoints starts over as itself. */
    memcpy(run_id, rv->roster.has_run ? rv->roster.run : rv->new_run_id, sizeof run_id);
    r.resume_step = ctl_roster_resume_step(&rv->roster, reason, sizeof reason, run_id);
    if (r.resume_step < 0) {
        /* Another config's checkpoints only: forming would start a new run over them. Every member is refused
         * (exit 1), naming them; nothing is written. */
        log_error("control plane: the run does not form: %s", reason);
        for (int i = 0; i < n; i++)
            conn_refuse(rv, rv->roster.seats[i].holder, EINVAL, reason);
        free(mem);
        free(ptr);
        return;
    }
    r.resume_reason = reason;
    r.run_id.data = run_id;
    r.run_id.len = sizeof run_id;
    memcpy(rv->run_id, run_id, sizeof rv->run_id);
    char hexid[2 * CKPT_RUN_ID_BYTES + 1];
    ckpt_run_id_hex(run_id, hexid);
    log_info("control plane: %s; run id %s (%s)", reason, hexid,
             r.resume_step > 0 ? "the resumed checkpoint's"
             : rv->roster.has_run
                 ? "resume_run's: none of its checkpoints is usable, the run starts over as it"
                 : "new: the run starts afresh");
    Pfcps__CtlMessage m = PFCPS__CTL_MESSAGE__INIT;
    m.body_case = PFCPS__CTL_MESSAGE__BODY_JOIN_REPLY;
    m.join_reply = &r;
    uint8_t *frame;
    size_t len;
    int rc = ctl_frame_encode(&m, rv->max_frame, &frame, &len);
    rv->roster.formed = 1;
    for (int i = 0; i < n; i++) {
        conn *c = rv->roster.seats[i].holder;
        if (rc < 0)
            conn_refuse(rv, c, EMSGSIZE, pf_errmsg());
        else
            conn_queue(rv, c, frame, len);
    }
    if (rc == 0) {
        free(frame);
        log_info("control plane: run formed: %d servers + %d workers; address book sent (%zu bytes)",
                 rv->num_servers, rv->num_workers, len);
    }
    free(mem);
    free(ptr);
}

/* Queues the shutdown broadcast for every joined member (ctl_session_wait_shutdown returns 1). */
static void queue_shutdown(ctl_rendezvous *rv)
{
    Pfcps__Shutdown sd;
    Pfcps__CtlMessage m;
    ctl_msg_set_shutdown(&m, &sd, "shutdown broadcast by the rendezvous");
    int n = 0;
    for (int i = 0; i < rv->nconns; i++) {
        conn *c = rv->conns[i];
        if (c->joined && !c->closing && !c->dead) {
            conn_send_msg(rv, c, &m);
            n++;
        }
    }
    __atomic_store_n(&rv->shutdown_sent, 1, __ATOMIC_RELEASE);
    log_info("control plane: shutdown sent to %d members", n);
}

/* Tells every joined member but `except` that member role[rank] from `peer` was lost, `what` saying how
 * (Error, code ENOLINK: "worker[1] (host:port) disconnected without leaving the run");
 * ctl_session_wait_shutdown returns -ENOLINK with the text. Workers stop (the run cannot go on);
 * servers log it and keep serving. */
static void queue_member_lost(ctl_rendezvous *rv, const conn *except, ctl_role role, int rank,
                              const char *peer, const char *what)
{
    char text[800];
    metrics_add(rv->m_lost, 1);
    snprintf(text, sizeof text, "%s[%d] (%s) %s", ctl_role_name(role), rank, peer, what);
    queue_reform(rv, except, text);
}

/* Tells every joined member but `except` that the run re-forms, with `text` (Error, code ENOLINK;
 * ctl_session_wait_shutdown returns -ENOLINK with it), and marks it told (reform_sent). */
static void queue_reform(ctl_rendezvous *rv, const conn *except, const char *text)
{
    __atomic_store_n(&rv->reform_sent, 1, __ATOMIC_RELEASE);
    Pfcps__Error e;
    Pfcps__CtlMessage m;
    ctl_msg_set_error(&m, &e, ENOLINK, text);
    for (int i = 0; i < rv->nconns; i++) {
        conn *c = rv->conns[i];
        if (c != except && c->joined && !c->closing && !c->dead)
            conn_send_msg(rv, c, &m);
    }
}

/* Removes dead connections and those whose error reply is flushed (or whose grace period ran out). */
static void sweep(ctl_rendezvous *rv, double now)
{
    /* Take the dead ones out of rv->conns first, then close them: closing one may tell the others that a
     * member was lost (queue_member_lost walks rv->conns), which must not meet a connection already freed. */
    int k = 0, nd = 0;
    conn **dead = rv->nconns > 0 ? calloc((size_t)rv->nconns, sizeof(conn *)) : NULL;
    for (int i = 0; i < rv->nconns; i++) {
        conn *c = rv->conns[i];
        if (c->closing && (c->wlen == 0 || now >= c->close_at))
            c->dead = 1;
        if (c->dead && dead)
            dead[nd++] = c;
        else
            rv->conns[k++] = c; /* out of memory: closed at a later sweep */
    }
    rv->nconns = k;
    for (int i = 0; i < nd; i++)
        conn_close(rv, dead[i]);
    free(dead);
}

/* Fills pfd: the listening socket, the wake pipe, then one entry per connection (rv->conns order).
 * Returns the number of connections listed. */
static int fill_pollfds(ctl_rendezvous *rv, struct pollfd *pfd)
{
    pfd[0] = (struct pollfd){.fd = rv->lfd, .events = pf_now_s() < rv->accept_pause_until ? 0 : POLLIN};
    pfd[1] = (struct pollfd){.fd = rv->wake[0], .events = POLLIN};
    int nc = rv->nconns;
    for (int i = 0; i < nc; i++) {
        conn *c = rv->conns[i];
        pfd[2 + i] = (struct pollfd){.fd = c->fd,
                                     .events = (short)((c->closing ? 0 : POLLIN) | (c->wlen ? POLLOUT : 0))};
    }
    return nc;
}

/* Reads from and writes to the first nc connections as poll() reported them ready. */
static void serve_ready(ctl_rendezvous *rv, const struct pollfd *pfd, int nc, double now)
{
    for (int i = 0; i < nc; i++) {
        conn *c = rv->conns[i];
        short re = pfd[2 + i].revents;
        if (re & (POLLIN | POLLHUP | POLLERR)) {
            if (!c->closing)
                conn_read(rv, c, now);
            else if (re & (POLLHUP | POLLERR))
                c->dead = 1;
        }
        if ((re & POLLOUT) && !c->dead)
            conn_write(c);
    }
}

/* A learner that got its book and is not ready within CTL_LEARNER_READY_TIMEOUTS x ctl_timeout (stopped or
 * hung while copying: it sends no heartbeat before it serves, so its silence is not timed) is dropped, which
 * aborts its rejoin (release_seat): the workers, holding their pushes since the copy step, go on with single
 * copies before their own bound (4 x ctl_timeout, worker/rejoin.h) ends the run. A late ready of it finds its
 * connection refused and changes nothing. */
static void expire_learner(ctl_rendezvous *rv, double now)
{
    conn *l = rv->learner;
    const double limit = CTL_LEARNER_READY_TIMEOUTS * rv->timeout_s;
    if (!l || rv->learner_book <= 0 || now - rv->learner_book <= limit || l->closing || l->dead)
        return;
    char msg[200];
    snprintf(
        msg, sizeof msg,
        "rejoin: not ready within %.0f s of its book (%d x ctl_timeout): its rejoin is aborted and the run "
        "goes on without it",
        limit, CTL_LEARNER_READY_TIMEOUTS);
    conn_refuse(rv, l, ETIMEDOUT, msg);
}

/* Refuses the connections whose read deadline passed, and sends what this pass queued. */
static void expire_and_flush(ctl_rendezvous *rv, double now)
{
    adopt_expire(rv, now);
    expire_learner(rv, now);
    if (rv->wr_rank >= 0 && now - rv->wr_t0 > rv->timeout_s) {
        char why[160];
        snprintf(why, sizeof why, "%s within ctl_timeout (%.0f s)",
                 rv->wr_repl ? "the workers and servers did not all do their part" : "no replacement joined",
                 rv->timeout_s);
        replace_fallback(rv, why);
    }
    for (int i = 0; i < rv->nconns; i++) {
        conn *c = rv->conns[i];
        if (!c->closing && !c->dead && c->deadline > 0 && now > c->deadline) {
            char msg[160];
            snprintf(msg, sizeof msg, "read timed out after %.3g s (%s)",
                     c->joined && c->rlen == 0 ? ctl_member_silence_s(rv->timeout_s) : rv->timeout_s,
                     c->joined && c->rlen == 0 ? "silent member: no heartbeat"
                     : c->joined               ? "incomplete frame"
                     : c->rlen                 ? "incomplete frame before join"
                                               : "no join");
            conn_refuse(rv, c, ETIMEDOUT, msg);
        }
        if (c->wlen && !c->dead)
            conn_write(c); /* replies queued in this pass go out now rather than next tick */
    }
}

/* The failure ctl_rendezvous_member_failed asked to tell, to every member (once). */
static void queue_failure(ctl_rendezvous *rv)
{
    if (!atomic_load(&rv->fail_req) || rv->fail_sent)
        return;
    rv->fail_sent = 1;
    char what[sizeof rv->fail_text + 48];
    snprintf(what, sizeof what, "failed: %s", rv->fail_text);
    log_warn("control plane: %s[%d] (this rendezvous' host) %s: telling the other members",
             ctl_role_name(rv->fail_role), rv->fail_rank, what);
    queue_member_lost(rv, NULL, rv->fail_role, rv->fail_rank, "the rendezvous' host", what);
}

/* replicas = 1: the service did not run for `gap` seconds, longer than a quarter of the silence limit (this
 * process was stopped: SIGSTOP, a VM pause, a swap storm). Its members kept heartbeating into their sockets
 * and its own host's session could not: every joined member's silence counts from now, so that a short pause
 * of the rendezvous is a pause of the run and never removes the members it could not hear. A pause longer
 * than the silence limit, in a formed run (its own, or one it adopted), is server 0's loss: the members take
 * a rendezvous that echoes nothing for twice that limit as lost (ctl_session_set_rendezvous_silence) and go
 * on with shard 0's backup, so this rendezvous fences itself before it serves anything: it closes every
 * connection without a message (a close is server 0's loss to the members that did not give up yet) and
 * stops; its host's own session sees the close and server 0 exits (DAEMON_EXIT_REPLACED), so that a restart's
 * rendezvous adopts the run and server 0 rejoins. */
static void resumed_after_gap(ctl_rendezvous *rv, double now, double gap)
{
    const double silence = ctl_member_silence_s(rv->timeout_s);
    if (gap > silence && rv->roster.formed && rv->adopting != 1 && !rv->shutdown_sent) {
        log_error(
            "control plane: the rendezvous did not run for %.2f s, longer than the silence limit (%.1f s): "
            "the members take server 0 for lost and train on with its shards' backups; this rendezvous "
            "closes every connection and stops (fenced), and server 0 exits for a restart to rejoin",
            gap, silence);
        atomic_store(&rv->fenced,
                     1); /* before the closes: its host sees the flag when its own session closes */
        __atomic_store_n(&rv->shutdown_sent, 1, __ATOMIC_RELEASE); /* nothing more is told to anyone */
        for (int i = 0; i < rv->nconns; i++)
            conn_close(rv, rv->conns[i]);
        rv->nconns = 0;
        atomic_store(&rv->stop, 1);
        return;
    }
    int n = 0;
    for (int i = 0; i < rv->nconns; i++) {
        conn *c = rv->conns[i];
        if (c->joined && !c->closing && !c->dead && c->rlen == 0 && c->deadline > 0 &&
            c->deadline < now + silence) {
            c->deadline = now + silence;
            n++;
        }
    }
    log_warn("control plane: the rendezvous did not run for %.2f s (this process was stopped?): the silence of "
             "%d members counts from now",
             gap, n);
}

/* While the run forms (every CTL_FORMING_LOG_S): which seats nobody holds, and the joins refused for their
 * config or their resume, the last with its age (a member refused waits for nothing: its own log says why and
 * it exits; the others wait for its seat up to their join_timeout, and this line says what they wait for; a
 * refused member started again with the right config takes its seat, and its old refusal then ages here). */
static void log_forming(const ctl_rendezvous *rv, double now)
{
    char miss[512], refused[2 * PF_ERRMSG_MAX + 160] = "";
    const int total = rv->num_servers + rv->num_workers,
              n = ctl_roster_missing(&rv->roster, miss, sizeof miss);
    if (n == 0)
        return;
    size_t o = 0;
    if (rv->joins_refused)
        o += (size_t)snprintf(refused, sizeof refused,
                              "; joins refused for their config: %ld (the last, %.0f s ago: %s)",
                              rv->joins_refused, now - rv->join_refused_t, rv->join_refused);
    if (rv->resumes_refused && o < sizeof refused)
        snprintf(refused + o, sizeof refused - o, "; resumes refused: %ld (the last, %.0f s ago: %s)",
                 rv->resumes_refused, now - rv->resume_refused_t, rv->resume_refused);
    log_write(
        refused[0] ? LOG_WARN : LOG_INFO,
        "control plane: waiting for the run to form: %d of %d members joined, %s missing (%.0f s since the "
        "rendezvous started)%s",
        total - n, total, miss, now - rv->t_start, refused);
}

/* One pass of the service loop: wait up to CTL_TICK_MS for activity, serve it, form the run once every
 * member is in. Returns 0, or -1 when poll() failed (the service stops). */
static int service_pass(ctl_rendezvous *rv, struct pollfd *pfd)
{
    int nc = fill_pollfds(rv, pfd);
    int pr = poll(pfd, (nfds_t)(2 + nc), CTL_TICK_MS);
    double now = pf_now_s();
    if (pr < 0 && errno != EINTR) {
        log_error("control plane: poll failed: %s", strerror(errno));
        return -1;
    }
    if (rv->replicas && rv->last_pass > 0 && now - rv->last_pass > ctl_member_silence_s(rv->timeout_s) / 4) {
        resumed_after_gap(rv, now, now - rv->last_pass);
        if (atomic_load(&rv->fenced))
            return -1;
    }
    rv->last_pass = now;
    if (pr > 0 && (pfd[1].revents & POLLIN)) {
        char b[64];
        while (read(rv->wake[0], b, sizeof b) > 0) {
        }
    }
    queue_failure(rv);
    /* An adopted run ends here when every worker left in order, also before server 0 rejoined (its daemon,
     * still joining, cannot ask for the shutdown yet). */
    if (rv->adopting == 2 && atomic_load(&rv->workers_left) == rv->num_workers)
        atomic_store(&rv->shutdown_req, 1);
    if (atomic_load(&rv->shutdown_req) && !rv->shutdown_sent)
        queue_shutdown(rv);
    if (pr > 0)
        serve_ready(rv, pfd, nc, now);
    /* New connections after the loop over pfd, whose indices they would shift. */
    if (pr > 0 && (pfd[0].revents & POLLIN))
        accept_new(rv, now);
    expire_and_flush(rv, now);
    sweep(rv, now);
    if (!rv->roster.formed && !rv->adopting && now >= rv->next_forming_log) {
        rv->next_forming_log = now + CTL_FORMING_LOG_S;
        log_forming(rv, now);
    }
    if (ctl_roster_complete(&rv->roster)) {
        form_run(rv);
        for (int i = 0; i < rv->nconns; i++)
            if (rv->conns[i]->wlen)
                conn_write(rv->conns[i]);
    }
    return 0;
}

/* The run never formed: name the members that never joined (the usual cause: not started, wrong rendezvous
 * address or port, or refused). Under replicas = 1 a server 0 started again after its loss waits here for the
 * running run's members to resume; when none ever did, its run may have ended (or re-formed) without it,
 * which the line says too. */
static void log_never_joined(const ctl_rendezvous *rv)
{
    char miss[512];
    const int total = rv->num_servers + rv->num_workers;
    int n = ctl_roster_never_joined(&rv->roster, miss, sizeof miss);
    if (!n)
        return;
    if (rv->resumes_refused)
        log_warn(
            "control plane: the run did not form here: the running run's members tried to resume here and "
            "were refused (%ld times; the last: %s)",
            rv->resumes_refused, rv->resume_refused);
    else if (rv->replicas && !rv->adopting && n == total - 1 && rv->roster.seats[0].ever_joined)
        log_warn("control plane: the run did not form here: no other member joined or resumed (%s); with "
                 "replicas = 1 that is also how a server 0 started again after its loss stops when its run "
                 "ended, or re-formed, without it",
                 miss);
    else if (rv->joins_refused)
        log_warn("control plane: the run did not form: %d of %d members never joined: %s; joins refused for "
                 "their config: %ld (the last: %s)",
                 n, total, miss, rv->joins_refused, rv->join_refused);
    else
        log_warn("control plane: the run did not form: %d of %d members never joined: %s", n, total, miss);
}

/* Stopping: a shutdown requested just before the stop still goes out; pending replies get a moment (0.5 s)
 * to leave, then every connection is closed. */
static void service_drain(ctl_rendezvous *rv)
{
    queue_failure(rv);
    if (atomic_load(&rv->shutdown_req) && !rv->shutdown_sent)
        queue_shutdown(rv);
    /* A close without a message means, to a member, that this process is gone (under replicas = 1 it then
     * goes on without server 0: ctl_session_survive_rendezvous_loss). Stopping without a shutdown or a failure
     * told (server 0 exits for the re-form), the members are told so first. */
    if (rv->roster.formed && !rv->shutdown_sent && !rv->fail_sent)
        queue_member_lost(rv, NULL, CTL_ROLE_SERVER, 0, "the rendezvous' host",
                          "stopped its rendezvous without a shutdown: the run re-forms from its newest complete "
                          "checkpoint");
    double until = pf_now_s() + 0.5;
    for (;;) {
        int pending = 0;
        for (int i = 0; i < rv->nconns; i++) {
            conn *c = rv->conns[i];
            if (c->wlen && !c->dead) {
                conn_write(c);
                pending += c->wlen > 0 && !c->dead;
            }
        }
        if (!pending || pf_now_s() > until)
            break;
        poll(NULL, 0, 10);
    }
    rv->roster.formed = 1; /* closing members below is not "left before the run formed" */
    __atomic_store_n(&rv->shutdown_sent, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < rv->nconns; i++)
        conn_close(rv, rv->conns[i]);
    rv->nconns = 0;
}

/* The service thread: passes until ctl_rendezvous_stop, then the drain. */
static void *service_main(void *arg)
{
    ctl_rendezvous *rv = arg;
    struct pollfd *pfd = calloc((size_t)rv->max_conns + 2, sizeof *pfd);
    if (!pfd) {
        log_error("control plane: out of memory; service thread stops");
        return NULL;
    }
    while (!atomic_load(&rv->stop))
        if (service_pass(rv, pfd) < 0)
            break;
    if (!rv->roster.formed)
        log_never_joined(rv);
    service_drain(rv);
    free(pfd);
    return NULL;
}

static void rv_free(ctl_rendezvous *rv)
{
    if (rv->lfd >= 0)
        close(rv->lfd);
    if (rv->wake[0] >= 0)
        close(rv->wake[0]);
    if (rv->wake[1] >= 0)
        close(rv->wake[1]);
    free(rv->bind_host);
    free(rv->secret);
    free(rv->config_text);
    free(rv->conns);
    free(rv->srv_lost);
    free(rv->wr_in);
    ctl_roster_free(&rv->roster);
    free(rv);
}

/* The options ctl_rendezvous_start accepts. Returns 0 or -EINVAL naming the bad one. */
static int check_opts(const ctl_rendezvous_opts *o)
{
    if (!o->secret || !*o->secret)
        return pf_err(-EINVAL, "rendezvous: empty secret (set 'secret' in the config or PFCPS_SECRET)");
    if (o->num_servers < 1 || o->num_servers > CTL_MAX_MEMBERS || o->num_workers < 1 ||
        o->num_workers > CTL_MAX_MEMBERS)
        return pf_err(-EINVAL, "rendezvous: %d servers / %d workers outside [1, %d]", o->num_servers,
                      o->num_workers, CTL_MAX_MEMBERS);
    if (o->max_frame < 64 || o->max_frame > UINT32_MAX)
        return pf_err(-EINVAL, "rendezvous: max_frame %zu outside [64, 2^32)", o->max_frame);
    if (!(o->timeout_s > 0))
        return pf_err(-EINVAL, "rendezvous: timeout %g s is not positive", o->timeout_s);
    if (o->port < 0 || o->port > 65535)
        return pf_err(-EINVAL, "rendezvous: port %d outside 0-65535", o->port);
    return 0;
}

/* One descriptor per member: raises the soft open-file limit to `need` when a large run needs it (a
 * warning when the hard limit does not allow it). */
static void raise_fd_limit(rlim_t need)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < need) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need ? need : rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur < need)
            log_warn("control plane: open-file limit %llu is below the %llu this run needs (raise ulimit -n)",
                     (unsigned long long)rl.rlim_cur, (unsigned long long)need);
    }
}

/* A service for checked options, without its socket and thread. Returns 0 with *out (free with rv_free) or
 * -ENOMEM. */
static int rv_new(const ctl_rendezvous_opts *o, ctl_rendezvous **out)
{
    ctl_rendezvous *rv = calloc(1, sizeof *rv);
    if (!rv)
        return pf_err(-ENOMEM, "rendezvous: out of memory");
    rv->lfd = rv->wake[0] = rv->wake[1] = -1;
    rv->t_start = pf_now_s();
    rv->next_forming_log = rv->t_start + CTL_FORMING_LOG_S;
    rv->bind_host = strdup(o->bind_host ? o->bind_host : "127.0.0.1");
    rv->secret = strdup(o->secret);
    rv->config_text = strdup(o->config_text ? o->config_text : "");
    rv->max_conns = o->num_servers + o->num_workers + CTL_SPARE_CONNS;
    raise_fd_limit((rlim_t)rv->max_conns + 64);
    rv->conns = calloc((size_t)rv->max_conns, sizeof *rv->conns);
    if (!rv->bind_host || !rv->secret || !rv->config_text || !rv->conns ||
        ctl_roster_init(&rv->roster, o->num_servers, o->num_workers, o->resume) < 0) {
        rv_free(rv);
        return pf_err(-ENOMEM, "rendezvous: out of memory");
    }
    rv->num_servers = o->num_servers;
    rv->num_workers = o->num_workers;
    rv->num_classes = o->num_classes;
    if (o->expect) {
        rv->roster.has_expect = 1;
        rv->roster.expect = *o->expect;
    }
    if (o->resume_run) {
        rv->roster.has_run = 1;
        memcpy(rv->roster.run, o->resume_run, CKPT_RUN_ID_BYTES);
    }
    if (RAND_bytes(rv->run_nonce, sizeof rv->run_nonce) != 1 ||
        RAND_bytes(rv->new_run_id, sizeof rv->new_run_id) != 1) {
        rv_free(rv);
        return pf_err(-EIO, "rendezvous: no random run nonce (RAND_bytes failed)");
    }
    rv->max_frame = o->max_frame;
    rv->timeout_s = o->timeout_s;
    rv->bind_timeout_s = o->bind_timeout_s;
    rv->replicas = o->replicas;
    rv->rejoin = o->replicas && o->rejoin;
    rv->replace = o->replicas && o->replace_workers;
    rv->acc_k = o->gradient_acc > 1 ? o->gradient_acc : 1;
    rv->wr_rank = -1;
    if (!(rv->srv_lost = calloc((size_t)o->num_servers, 1)) ||
        !(rv->wr_in = calloc((size_t)o->num_servers + (size_t)o->num_workers, 1))) {
        rv_free(rv);
        return pf_err(-ENOMEM, "rendezvous: out of memory");
    }
    *out = rv;
    return 0;
}

/* Binds and listens on rv->bind_host:port (0: any free port), learns the port bound (rv->port), and makes
 * the wake pipe. Returns 0 or a negative code naming host:port. */
static int rv_listen(ctl_rendezvous *rv, int port)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    int gr = pf_resolve("the rendezvous bind host", rv->bind_host, portstr, &hints,
                        pf_now_s() + (rv->bind_timeout_s > 0 ? rv->bind_timeout_s : rv->timeout_s), &ai);
    if (gr < 0)
        return gr;
    int err = 0;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0) {
            rv->lfd = fd;
            break;
        }
        err = errno;
        close(fd);
    }
    freeaddrinfo(ai);
    if (rv->lfd < 0)
        return pf_err(-err, "rendezvous: cannot bind %s:%d: %s", rv->bind_host, port, strerror(err));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(rv->lfd, (struct sockaddr *)&ss, &sl);
    rv->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                              : ((struct sockaddr_in *)&ss)->sin_port);
    if (set_nonblock(rv->lfd) < 0 || pipe2(rv->wake, O_NONBLOCK | O_CLOEXEC) < 0)
        return pf_err(-errno, "rendezvous: socket setup failed: %s", strerror(errno));
    return 0;
}

/* Metrics on: registers the service's series, empties the /targets table and serves it. Returns 0 or a
 * negative code (out of memory, the page refused). */
static int rv_metrics(ctl_rendezvous *rv)
{
    int rc = targets_reset(rv->num_servers + rv->num_workers);
    if (rc == 0 && (rc = metrics_add_page("/targets", "application/json", targets_render, NULL)) < 0)
        rc = pf_err_wrap(rc, "rendezvous: serving /targets");
    if (rc < 0)
        return rc;
    rv->metrics = 1;
    rv->m_members = metrics_gauge("pfcps_rendezvous_members", "Members joined now.", NULL, 0);
    rv->m_expected =
        metrics_gauge("pfcps_rendezvous_members_expected", "Servers + workers of the run.", NULL, 0);
    rv->m_joins = metrics_counter("pfcps_rendezvous_joins_total", "Joins accepted.", NULL, 0);
    rv->m_lost = metrics_counter("pfcps_rendezvous_members_lost_total",
                                 "Members lost (heartbeat or connection).", NULL, 0);
    rv->m_reforms =
        metrics_counter("pfcps_rendezvous_reforms_total", "Times the run had to re-form.", NULL, 0);
    rv->m_epoch =
        metrics_gauge("pfcps_rendezvous_epoch",
                      "Membership epoch: failovers and rejoin steps announced (replicas = 1).", NULL, 0);
    rv->m_single =
        metrics_gauge("pfcps_rendezvous_single_copy_shards",
                      "Shards left with one live copy after failovers (replicas = 1): a further loss "
                      "of one of their servers re-forms the run.",
                      NULL, 0);
    metrics_set(rv->m_members, 0);
    metrics_set(rv->m_expected, rv->num_servers + rv->num_workers);
    return 0;
}

int ctl_rendezvous_start(const ctl_rendezvous_opts *o, ctl_rendezvous **out)
{
    *out = NULL;
    ctl_rendezvous *rv = NULL;
    int rc = check_opts(o);
    if (rc == 0)
        rc = rv_new(o, &rv);
    if (rc < 0)
        return rc;
    rc = rv_listen(rv, o->port);
    if (rc < 0) {
        rv_free(rv);
        return rc;
    }
    if (o->metrics && (rc = rv_metrics(rv)) < 0) {
        rv_free(rv);
        return rc;
    }
    int pr = pthread_create(&rv->thread, NULL, service_main, rv);
    if (pr != 0) {
        rv_free(rv);
        return pf_err(-pr, "rendezvous: cannot start the service thread: %s", strerror(pr));
    }
    log_info("control plane: rendezvous listening on %s:%d for %d servers + %d workers (max frame %zu bytes, "
             "read timeout %g s)",
             rv->bind_host, rv->port, rv->num_servers, rv->num_workers, rv->max_frame, rv->timeout_s);
    *out = rv;
    return 0;
}

int ctl_rendezvous_port(const ctl_rendezvous *rv)
{
    return rv->port;
}

int ctl_rendezvous_adopting(const ctl_rendezvous *rv)
{
    if (!__atomic_load_n(&rv->adopting, __ATOMIC_ACQUIRE))
        return 0;
    if (__atomic_load_n(&rv->reform_sent, __ATOMIC_ACQUIRE))
        return 2;
    return __atomic_load_n(&rv->shutdown_sent, __ATOMIC_ACQUIRE) ? 0 : 1;
}

int ctl_rendezvous_fenced(const ctl_rendezvous *rv)
{
    return atomic_load(&((ctl_rendezvous *)rv)->fenced);
}

int ctl_rendezvous_workers_done(const ctl_rendezvous *rv)
{
    return atomic_load(&((ctl_rendezvous *)rv)->workers_left) >= rv->num_workers;
}

int ctl_rendezvous_joined(const ctl_rendezvous *rv)
{
    return atomic_load(&((ctl_rendezvous *)rv)->joined);
}

static void rv_wake(ctl_rendezvous *rv)
{
    ssize_t w = write(rv->wake[1], "x", 1);
    (void)w; /* a full pipe already wakes the thread */
}

void ctl_rendezvous_member_failed(ctl_rendezvous *rv, int role, int rank, const char *why)
{
    if (!rv || atomic_load(&rv->fail_req))
        return;
    rv->fail_role = (ctl_role)role;
    rv->fail_rank = rank;
    snprintf(rv->fail_text, sizeof rv->fail_text, "%s", why ? why : "");
    atomic_store(&rv->fail_req, 1); /* publishes the fields above to the service thread */
    rv_wake(rv);
}

void ctl_rendezvous_broadcast_shutdown(ctl_rendezvous *rv)
{
    atomic_store(&rv->shutdown_req, 1);
    rv_wake(rv);
}

void ctl_rendezvous_stop(ctl_rendezvous *rv)
{
    if (!rv)
        return;
    atomic_store(&rv->stop, 1);
    rv_wake(rv);
    pthread_join(rv->thread, NULL);
    log_info("control plane: rendezvous on port %d stopped", rv->port);
    rv_free(rv);
}
