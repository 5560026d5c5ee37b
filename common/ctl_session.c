/* Control plane, member side: the session a daemon holds with the rendezvous. ctl_join connects (retrying
 * while the rendezvous is not up yet), answers the hello's nonce with the join MAC and waits for the address
 * book; afterwards the connection carries heartbeats, the shutdown broadcast and lost-member reports.
 * Wire format and message checks: common/ctl_frame.c. */
#include "common/ctl.h"

#include "common/clock.h"
#include "common/config.h"
#include "common/ctl_forming.h"
#include "common/ctl_frame.h"
#include "common/ctl_internal.h"
#include "common/err.h"
#include "common/hostport.h"
#include "common/log.h"

#include <netdb.h>
#include <stdatomic.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CTL_HB_RING 16 /* send times of the newest heartbeats, by sequence number */

struct ctl_session {
    int fd;
    size_t max_frame;
    uint8_t *rbuf;
    size_t rlen, rcap;
    uint64_t hb_seq;
    double next_hb; /* when the next heartbeat is due (kept across short wait calls) */
    double hb_every;             /* seconds between heartbeats (ctl_session_set_heartbeat; 1 by default) */
    double rv_silence;           /* > 0: a rendezvous that echoes nothing this long is lost (survive only) */
    double last_pass, own_gap;   /* the wait loop's last pass; when it last ran after a gap of its own */
    double hb_sent[CTL_HB_RING]; /* hb_sent[seq % CTL_HB_RING]: when heartbeat seq went out */
    _Atomic double lease_base;   /* when the newest heartbeat the rendezvous echoed went out (0: none) */
    uint32_t fo_epoch;           /* the last failover notice: its epoch and lost server */
    int fo_server;
    char fo_text[1024];
    int fo_kind; /* its kind (CTL_FO_*), step and fabric address (rejoin notices) */
    int64_t fo_step;
    size_t fo_addr_len;
    uint8_t fo_addr[CTL_MAX_ADDR];
    pthread_mutex_t send_mu; /* one frame at a time: the watcher's heartbeats and the trainer's reports */
    int survive;         /* ctl_session_survive_rendezvous_loss: a close of the connection may be server 0's
                            failover */
    uint8_t *srv_lost;   /* [book.num_servers] (survive only): servers failed over, as this member was told */
    int rejoin_pending;  /* a rejoin began (CTL_FO_REJOIN_BEGIN) and did not end yet */
    _Atomic int orphan;  /* the rendezvous is lost with server 0 and the run went on (ctl_session_orphaned) */
    /* What a Resume to a restarted rendezvous needs (ctl_join's arguments, the run config's digest). */
    char host[256];
    int port;
    ctl_role role;
    int rank;
    uint8_t addr[CTL_MAX_ADDR];
    size_t addr_len;
    char secret[CFG_STR];
    uint8_t digest[CKPT_DIGEST_BYTES];
    int can_resume;   /* the digest is set: an orphaned session reconnects to resume */
    int resuming;     /* a Resume went out on this connection and was not acknowledged yet */
    double next_try;  /* orphaned: when to try the rendezvous' address again */
    long refusals; /* Resumes refused in a row (resume_refused; the log says the first and then a summary) */
    double refusal_log_t; /* pf_now_s() of the last refusal line */
    ctl_book book;
};

/* Sends n bytes on the blocking-or-not socket fd by `deadline` (pf_now_s seconds). Returns 0, -ETIMEDOUT,
 * or -errno of the failed send. */
static int send_all(int fd, const uint8_t *p, size_t n, double deadline)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            double left = deadline - pf_now_s();
            if (left <= 0)
                return pf_err(-ETIMEDOUT, "send to the rendezvous timed out");
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            poll(&pfd, 1, (int)(left * 1000) + 1);
            continue;
        }
        return pf_err(-errno, "send to the rendezvous failed: %s", strerror(errno));
    }
    return 0;
}

/* Encodes m and sends it by `deadline`. Returns 0 or a negative code (pf_errmsg()). */
static int send_msg(ctl_session *s, const Pfcps__CtlMessage *m, double deadline)
{
    uint8_t *frame;
    size_t len;
    int rc = ctl_frame_encode(m, s->max_frame, &frame, &len);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&s->send_mu);
    rc = s->fd >= 0 ? send_all(s->fd, frame, len, deadline)
                    : pf_err(-ENOTCONN, "the rendezvous is lost with server 0");
    pthread_mutex_unlock(&s->send_mu);
    free(frame);
    return rc;
}

/* Reads one frame by `deadline`. Returns 0 with *out, -ETIMEDOUT (bytes so far are kept), -ECONNRESET
 * when the service closed, -EMSGSIZE / -EPROTO for a bad frame. */
static int recv_msg(ctl_session *s, double deadline, Pfcps__CtlMessage **out)
{
    for (;;) {
        size_t flen;
        int rc = ctl_frame_peek(s->rbuf, s->rlen, s->max_frame, &flen);
        if (rc < 0)
            return rc;
        if (rc == 1) {
            rc = ctl_msg_decode(s->rbuf + 4, flen - 4, out);
            memmove(s->rbuf, s->rbuf + flen, s->rlen - flen);
            s->rlen -= flen;
            return rc;
        }
        double left = deadline - pf_now_s();
        if (left <= 0)
            return pf_err(-ETIMEDOUT, "no message from the rendezvous in time");
        struct pollfd pfd = {.fd = s->fd, .events = POLLIN};
        int pr = poll(&pfd, 1, (int)(left * 1000) + 1);
        if (pr < 0 && errno != EINTR)
            return pf_err(-errno, "poll: %s", strerror(errno));
        if (pr <= 0)
            continue;
        if (s->rcap - s->rlen < 65536) {
            size_t cap = s->rcap ? s->rcap * 2 : 65536;
            if (cap > s->max_frame + 4 + 65536)
                cap = s->max_frame + 4 + 65536;
            if (cap <= s->rlen)
                return pf_err(-EMSGSIZE, "receive buffer full");
            uint8_t *nb = realloc(s->rbuf, cap);
            if (!nb)
                return pf_err(-ENOMEM, "out of memory");
            s->rbuf = nb;
            s->rcap = cap;
        }
        ssize_t r = recv(s->fd, s->rbuf + s->rlen, s->rcap - s->rlen, 0);
        if (r == 0)
            return pf_err(-ECONNRESET, "the rendezvous closed the connection");
        if (r < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                continue;
            return pf_err(-errno, "read from the rendezvous failed: %s", strerror(errno));
        }
        s->rlen += (size_t)r;
    }
}

/* Maps the service's Error reply to the negative code callers see. */
static int error_reply(const Pfcps__Error *e)
{
    int code = e->code;
    switch (code) {
    case ENOLINK: return pf_err(-ENOLINK, "%s", e->message); /* a member lost, not a refusal */
    case EACCES:
    case EEXIST:
    case ERANGE:
    case EPROTO:
    case EINVAL:
    case EMSGSIZE:
    case ETIMEDOUT:
    case EIO:
    case EAGAIN:
    case EBUSY:
    case ESHUTDOWN: break; /* a worker's restart after the end of training: nothing to join */
    default: code = EPROTO;
    }
    return pf_err(-code, "rendezvous refused: %s", e->message);
}

/* ctl_set_resume_steps' list, sent at join: the steps, their identities as sent (messages pointing into
 * g_resume_ids) and the pointers the Join message takes. */
static int64_t g_resume_steps[CTL_MAX_RESUME_STEPS];
static ckpt_ident g_resume_ids[CTL_MAX_RESUME_STEPS];
static Pfcps__CheckpointIdent g_resume_msgs[CTL_MAX_RESUME_STEPS];
static Pfcps__CheckpointIdent *g_resume_ptrs[CTL_MAX_RESUME_STEPS];
static size_t g_n_resume_steps;

void ctl_set_resume_steps(const int64_t *steps, const ckpt_ident *ids, size_t n)
{
    g_n_resume_steps = 0;
    for (size_t i = 0; i < n && g_n_resume_steps < CTL_MAX_RESUME_STEPS; i++) {
        if (steps[i] <= 0)
            continue;
        size_t k = g_n_resume_steps++;
        g_resume_steps[k] = steps[i];
        g_resume_ids[k] = ids[i];
        Pfcps__CheckpointIdent *m = &g_resume_msgs[k];
        pfcps__checkpoint_ident__init(m);
        m->run_id.data = g_resume_ids[k].run_id;
        m->run_id.len = CKPT_RUN_ID_BYTES;
        m->seed = g_resume_ids[k].seed;
        m->config_digest.data = g_resume_ids[k].config_digest;
        m->config_digest.len = CKPT_DIGEST_BYTES;
        g_resume_ptrs[k] = m;
    }
}

/* ctl_set_metrics_address's address, sent at join ("" when none). */
static char g_metrics_address[CTL_MAX_METRICS_ADDR];

int ctl_set_metrics_address(const char *address)
{
    if (!address)
        address = "";
    size_t n = strlen(address);
    if (n >= sizeof g_metrics_address)
        return pf_err(-EINVAL, "metrics address '%.40s...' is %zu bytes long, over the %d the join carries",
                      address, n, CTL_MAX_METRICS_ADDR - 1);
    memcpy(g_metrics_address, address, n + 1);
    return 0;
}

/* ctl_set_replicas's value, sent at join. */
static uint32_t g_replicas;

void ctl_set_replicas(int replicas)
{
    g_replicas = replicas > 0 ? (uint32_t)replicas : 0;
}

/* ctl_set_endpoint_keys's text, sent at join ("" when none). */
static char g_endpoint_keys[CTL_MAX_ENDPOINT_KEYS];

int ctl_set_endpoint_keys(const char *text)
{
    if (!text)
        text = "";
    if (strlen(text) >= sizeof g_endpoint_keys)
        return pf_err(-EINVAL, "endpoint keys' text of %zu bytes: at most %zu", strlen(text),
                      sizeof g_endpoint_keys - 1);
    snprintf(g_endpoint_keys, sizeof g_endpoint_keys, "%s", text);
    return 0;
}

/* The separators before the metrics address, the replicas and the endpoint keys in the MAC's input
 * (ctl_member_mac), each with its terminating NUL: "\0pfcps metrics\0", "\0pfcps replicas\0",
 * "\0pfcps endpoint keys\0". */
static const char mac_sep[] = "\0pfcps metrics", rep_sep[] = "\0pfcps replicas",
                  keys_sep[] = "\0pfcps endpoint keys";

int ctl_member_mac(const char *secret, const uint8_t *nonce, size_t nonce_len, int role, int rank,
                   const uint8_t *addr, size_t addr_len, const char *maddr, uint32_t replicas,
                   const char *keys, uint8_t mac[32])
{
    size_t ml = maddr ? strlen(maddr) : 0, kl = keys ? strlen(keys) : 0;
    if (ml == 0 && replicas == 0 && kl == 0)
        return ctl_join_mac(secret, nonce, nonce_len, role, rank, addr, addr_len, mac);
    uint8_t *buf = malloc(addr_len + sizeof mac_sep + ml + sizeof rep_sep + 4 + sizeof keys_sep + kl),
            *p = buf;
    if (!buf)
        return pf_err(-ENOMEM, "out of memory computing the join mac");
    if (addr_len)
        memcpy(p, addr, addr_len);
    p += addr_len;
    if (ml) {
        memcpy(p, mac_sep, sizeof mac_sep);
        memcpy(p + sizeof mac_sep, maddr, ml);
        p += sizeof mac_sep + ml;
    }
    if (replicas) {
        memcpy(p, rep_sep, sizeof rep_sep);
        p += sizeof rep_sep;
        for (int b = 0; b < 4; b++)
            *p++ = (uint8_t)(replicas >> (8 * b));
    }
    if (kl) {
        memcpy(p, keys_sep, sizeof keys_sep);
        memcpy(p + sizeof keys_sep, keys, kl);
        p += sizeof keys_sep + kl;
    }
    int rc = ctl_join_mac(secret, nonce, nonce_len, role, rank, buf, (size_t)(p - buf), mac);
    free(buf);
    return rc;
}

/* The separator before the run's fields in a Resume's MAC input (ctl_resume_mac), NUL included. */
static const char resume_sep[] = "\0pfcps resume";

int ctl_resume_mac(const char *secret, const uint8_t *nonce, size_t nonce_len, int role, int rank,
                   const uint8_t *addr, size_t addr_len, const uint8_t *run_id, const uint8_t *run_nonce,
                   const uint8_t *config_digest, uint32_t epoch, const int32_t *lost, size_t nlost,
                   const char *config_text, uint8_t mac[32])
{
    const size_t tlen = config_text ? strlen(config_text) : 0;
    size_t n = addr_len + sizeof resume_sep + 16 + 16 + CKPT_DIGEST_BYTES + 4 + 4 * nlost + tlen;
    uint8_t *buf = malloc(n), *p = buf;
    if (!buf)
        return pf_err(-ENOMEM, "out of memory computing the resume mac");
    if (addr_len)
        memcpy(p, addr, addr_len);
    p += addr_len;
    memcpy(p, resume_sep, sizeof resume_sep);
    p += sizeof resume_sep;
    memcpy(p, run_id, 16);
    memcpy(p + 16, run_nonce, 16);
    memcpy(p + 32, config_digest, CKPT_DIGEST_BYTES);
    p += 32 + CKPT_DIGEST_BYTES;
    for (size_t i = 0; i <= nlost; i++, p += 4) {
        uint32_t v = i == 0 ? epoch : (uint32_t)lost[i - 1];
        p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
    }
    if (tlen)
        memcpy(p, config_text, tlen);
    int rc = ctl_join_mac(secret, nonce, nonce_len, role, rank, buf, n, mac);
    free(buf);
    return rc;
}

/* ctl_set_interrupt's flag: a joining member stops waiting when it is raised. */
static const volatile sig_atomic_t *g_join_interrupt;

void ctl_set_interrupt(const volatile sig_atomic_t *flag)
{
    g_join_interrupt = flag;
}

/* ctl_set_interrupt_check's function. */
static int (*g_join_check)(void);

void ctl_set_interrupt_check(int (*check)(void))
{
    g_join_check = check;
}

/* -EINTR (named) once ctl_set_interrupt's flag is raised or ctl_set_interrupt_check's function says so, else
 * 0. */
static int join_interrupted(void)
{
    if (g_join_interrupt && *g_join_interrupt)
        return pf_err(-EINTR, "interrupted (SIGTERM/SIGINT) while waiting for the run to form");
    if (g_join_check && g_join_check())
        return pf_err(-EINTR, "interrupted (a signal) while waiting for the run to form");
    return 0;
}

/* recv_msg for ctl_join: wakes at least every CTL_TICK_MS to see whether the interrupt flag was raised
 * (a signal landing just before poll() would otherwise wait out the whole join timeout). */
static int join_recv(ctl_session *s, double deadline, Pfcps__CtlMessage **out)
{
    for (;;) {
        int rc = join_interrupted();
        if (rc < 0)
            return rc;
        double tick = pf_now_s() + CTL_TICK_MS / 1000.0;
        rc = recv_msg(s, tick < deadline ? tick : deadline, out);
        if (rc != -ETIMEDOUT || pf_now_s() >= deadline)
            return rc;
    }
}

/* Seconds between the "still waiting" lines of a join (connecting, or joined and waiting for the run). */
#define CTL_JOIN_PROGRESS_S 10.0

/* Connects to the rendezvous at host:port by `deadline`, resolving the name (pf_resolve) and retrying a
 * refused connection every 0.1 s (the rendezvous may not be up yet), saying so every CTL_JOIN_PROGRESS_S.
 * Returns 0 with *out_fd (non-blocking, TCP_NODELAY), -EINTR when interrupted, or the last connect error
 * named with host:port and `limit` (what bounded the tries, e.g. "join_timeout (30 s)"). */
static int connect_by(const char *host, int port, double deadline, const char *limit, int *out_fd)
{
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    int last = ECONNREFUSED;
    const double t0 = pf_now_s();
    double t_log = t0;
    for (;;) {
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
        struct addrinfo *ai = NULL;
        int gr = pf_resolve("rendezvous host", host, portstr, &hints, deadline, &ai); /* waits for the name */
        if (gr < 0)
            return gr;
        for (struct addrinfo *a = ai; a; a = a->ai_next) {
            int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
            if (fd < 0) {
                last = errno;
                continue;
            }
            int rc = connect(fd, a->ai_addr, a->ai_addrlen);
            if (rc < 0 && errno == EINPROGRESS) {
                double left = deadline - pf_now_s();
                struct pollfd pfd = {.fd = fd, .events = POLLOUT};
                if (left > 0 && poll(&pfd, 1, (int)(left * 1000) + 1) == 1) {
                    int e = 0;
                    socklen_t el = sizeof e;
                    getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el);
                    rc = e ? -1 : 0;
                    errno = e;
                } else {
                    errno = ETIMEDOUT;
                }
            }
            if (rc == 0) {
                freeaddrinfo(ai);
                int one = 1;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                *out_fd = fd;
                return 0;
            }
            last = errno;
            close(fd);
        }
        freeaddrinfo(ai);
        int irc = join_interrupted();
        if (irc < 0)
            return irc;
        const double now = pf_now_s();
        if (now + 0.1 > deadline)
            break;
        if (now - t_log >= CTL_JOIN_PROGRESS_S) {
            log_info("join: waiting for the rendezvous at %s:%d (%s) for %.0f s; giving up in %.0f s", host,
                     port, strerror(last), now - t0, deadline - now);
            t_log = now;
        }
        poll(NULL, 0, 100); /* the rendezvous may not be up yet */
    }
    return pf_err(-last, "cannot connect to the rendezvous at %s:%d within %s: %s", host, port, limit,
                  strerror(last));
}

/* The first exchange: the service's hello (its nonce and protocol version), answered with this member's
 * join (role, rank, address and the MAC over the nonce). Returns 0 or a negative code (pf_errmsg()). */
static int join_handshake(ctl_session *s, ctl_role role, int rank, const void *addr, size_t addr_len,
                          const char *secret, double deadline)
{
    Pfcps__CtlMessage *m = NULL;
    int rc = join_recv(s, deadline, &m);
    if (rc == 0 && m->body_case == PFCPS__CTL_MESSAGE__BODY_ERROR)
        rc = error_reply(m->error);
    else if (rc == 0 && m->body_case != PFCPS__CTL_MESSAGE__BODY_HELLO)
        rc = pf_err(-EPROTO, "expected hello from the rendezvous, got %s", ctl_msg_name(m->body_case));
    else if (rc == 0 && m->hello->protocol_version != CTL_PROTOCOL_VERSION)
        rc = pf_err(-EPROTO, "rendezvous speaks protocol %u, this member %d", m->hello->protocol_version,
                    CTL_PROTOCOL_VERSION);
    if (rc == 0) {
        uint8_t mac[CTL_MAC_LEN];
        rc = ctl_member_mac(secret, m->hello->nonce.data, m->hello->nonce.len, (int)role, rank, addr,
                            addr_len, g_metrics_address, g_replicas, g_endpoint_keys, mac);
        if (rc == 0) {
            Pfcps__Join j = PFCPS__JOIN__INIT;
            j.role = role == CTL_ROLE_SERVER ? PFCPS__ROLE__SERVER : PFCPS__ROLE__WORKER;
            j.rank = rank;
            j.fabric_addr.data = (uint8_t *)addr;
            j.fabric_addr.len = addr_len;
            j.mac.data = mac;
            j.mac.len = sizeof mac;
            j.protocol_version = CTL_PROTOCOL_VERSION;
            j.resume_steps = g_resume_steps;
            j.n_resume_steps = g_n_resume_steps;
            j.resume_idents = g_resume_ptrs;
            j.n_resume_idents = g_n_resume_steps;
            j.metrics_address = g_metrics_address;
            j.replicas = g_replicas;
            j.endpoint_keys = g_endpoint_keys;
            Pfcps__CtlMessage jm = PFCPS__CTL_MESSAGE__INIT;
            jm.body_case = PFCPS__CTL_MESSAGE__BODY_JOIN;
            jm.join = &j;
            rc = send_msg(s, &jm, deadline);
        }
    }
    if (m)
        pfcps__ctl_message__free_unpacked(m, NULL);
    return rc;
}

/* Takes the join reply's book into s->book and checks that it lists this member with its address.
 * Returns 0 or -EPROTO / -ENOMEM. */
static int take_book(ctl_session *s, const Pfcps__JoinReply *reply, ctl_role role, int rank, const void *addr,
                     size_t addr_len)
{
    int rc = ctl_book_from_reply(reply, &s->book);
    if (rc < 0)
        return rc;
    const ctl_member *me = role == CTL_ROLE_SERVER
                               ? (rank < s->book.num_servers ? &s->book.servers[rank] : NULL)
                               : (rank < s->book.num_workers ? &s->book.workers[rank] : NULL);
    if (!me || me->addr_len != addr_len || (addr_len && memcmp(me->addr, addr, addr_len) != 0))
        return pf_err(-EPROTO, "the address book does not list this member (%s rank %d) as joined",
                      ctl_role_name(role), rank);
    return 0;
}

/* Waits for the join reply (heartbeats may come first) and takes its book, saying every CTL_JOIN_PROGRESS_S
 * that it still waits. Returns 0, -ETIMEDOUT when the run did not form within timeout_s (join_timeout),
 * -ECANCELED when it was shut down first, or another negative code. */
static int join_wait_book(ctl_session *s, ctl_role role, int rank, const void *addr, size_t addr_len,
                          double deadline, double timeout_s)
{
    const double t0 = pf_now_s();
    for (;;) {
        const double now = pf_now_s();
        const double until = now + CTL_JOIN_PROGRESS_S < deadline ? now + CTL_JOIN_PROGRESS_S : deadline;
        Pfcps__CtlMessage *m = NULL;
        int rc = join_recv(s, until, &m);
        if (rc == -ETIMEDOUT && until < deadline) {
            log_info(
                "join: in at the rendezvous, waiting for the other members for %.0f s; giving up in %.0f s",
                pf_now_s() - t0, deadline - pf_now_s());
            continue;
        }
        if (rc == -ETIMEDOUT)
            return pf_err(-ETIMEDOUT,
                          "no address book from the rendezvous within join_timeout (%g s): not every member "
                          "joined",
                          timeout_s);
        if (rc < 0)
            return rc;
        int done = 1;
        if (m->body_case == PFCPS__CTL_MESSAGE__BODY_ERROR)
            rc = error_reply(m->error);
        else if (m->body_case == PFCPS__CTL_MESSAGE__BODY_JOIN_REPLY)
            rc = take_book(s, m->join_reply, role, rank, addr, addr_len);
        else if (m->body_case == PFCPS__CTL_MESSAGE__BODY_SHUTDOWN)
            rc = pf_err(-ECANCELED, "the run was shut down before it formed: %s", m->shutdown->reason);
        else if (m->body_case != PFCPS__CTL_MESSAGE__BODY_HEARTBEAT)
            rc = pf_err(-EPROTO, "unexpected %s while waiting for the address book",
                        ctl_msg_name(m->body_case));
        else
            done = 0;
        pfcps__ctl_message__free_unpacked(m, NULL);
        if (done)
            return rc;
    }
}

int ctl_join(const char *host, int port, ctl_role role, int rank, const void *addr, size_t addr_len,
             const char *secret, size_t max_frame, double timeout_s, ctl_session **out)
{
    *out = NULL;
    if (!secret || !*secret)
        return pf_err(-EINVAL, "join: empty secret (set 'secret' in the config or PFCPS_SECRET)");
    if (addr_len > CTL_MAX_ADDR)
        return pf_err(-EINVAL, "join: fabric address of %zu bytes is longer than %d", addr_len, CTL_MAX_ADDR);
    if ((role != CTL_ROLE_SERVER && role != CTL_ROLE_WORKER) || rank < 0 || rank >= CTL_MAX_MEMBERS)
        return pf_err(-EINVAL, "join: bad role %d or rank %d", (int)role, rank);
    if (max_frame < 64 || max_frame > UINT32_MAX)
        return pf_err(-EINVAL, "join: max_frame %zu outside [64, 2^32)", max_frame);
    double deadline = pf_now_s() + timeout_s, t_log = 0;
    for (;;) {
        ctl_session *s = calloc(1, sizeof *s);
        if (!s)
            return pf_err(-ENOMEM, "join: out of memory");
        s->max_frame = max_frame;
        pthread_mutex_init(&s->send_mu, NULL);
        char limit[64];
        snprintf(limit, sizeof limit, "join_timeout (%.0f s)", timeout_s);
        int rc = connect_by(host, port, deadline, limit, &s->fd);
        if (rc < 0) {
            pthread_mutex_destroy(&s->send_mu);
            free(s);
            return rc;
        }
        rc = join_handshake(s, role, rank, addr, addr_len, secret, deadline);
        if (rc == 0)
            rc = join_wait_book(s, role, rank, addr, addr_len, deadline, timeout_s);
        if (rc == 0) {
            snprintf(s->host, sizeof s->host, "%s", host);
            s->port = port;
            s->role = role;
            s->rank = rank;
            s->addr_len = addr_len;
            if (addr_len)
                memcpy(s->addr, addr, addr_len);
            snprintf(s->secret, sizeof s->secret, "%s", secret);
            *out = s;
            return 0;
        }
        ctl_session_close(s);
        /* Retried until the deadline: a rendezvous that asks to (re-forming, rank still held, full) or that
         * closed the connection before the run formed (it evicted us among strangers, or restarted). */
        if (rc != -EAGAIN && rc != -EBUSY && rc != -ECONNRESET && rc != -EPIPE)
            return rc;
        /* The rendezvous asked to retry (the run is re-forming, or this rank's previous connection is still
         * open): again every 0.5 s until the deadline, saying so every 5 s. */
        double now = pf_now_s();
        char why[PF_ERRMSG_MAX];
        snprintf(why, sizeof why, "%s", pf_errmsg());
        if (now + 0.5 >= deadline)
            return pf_err(-ETIMEDOUT, "join: %s (gave up after join_timeout, %g s)", why, timeout_s);
        if (now - t_log >= 5.0) {
            log_info("join: %s; retrying", why);
            t_log = now;
        }
        for (int i = 0; i < 5; i++) {
            int irc = join_interrupted();
            if (irc < 0)
                return irc;
            struct timespec ts = {0, 100000000};
            nanosleep(&ts, NULL);
        }
    }
}

const ctl_book *ctl_session_book(const ctl_session *s)
{
    return &s->book;
}

/* A heartbeat came back: the rendezvous had heard from this member no earlier than that heartbeat's send
 * time, which becomes the lease base (ctl_session_lease_base). */
static void heartbeat_echoed(ctl_session *s, const Pfcps__Heartbeat *hb)
{
    if (!hb || hb->seq == 0 || hb->seq > s->hb_seq || s->hb_seq - hb->seq >= CTL_HB_RING)
        return; /* not one of the last heartbeats this session sent */
    double t = s->hb_sent[hb->seq % CTL_HB_RING];
    if (t > atomic_load(&s->lease_base))
        atomic_store(&s->lease_base, t);
}

/* Keeps a failover notice for ctl_session_failover. */
static void take_failover(ctl_session *s, const Pfcps__Failover *f)
{
    s->fo_epoch = f->epoch;
    s->fo_server = f->server;
    snprintf(s->fo_text, sizeof s->fo_text, "%s", f->text);
    s->fo_kind = (int)f->kind;
    s->fo_step = f->step;
    s->fo_addr_len = f->fabric_addr.len; /* <= CTL_MAX_ADDR: ctl_msg_check */
    if (s->fo_addr_len)
        memcpy(s->fo_addr, f->fabric_addr.data, s->fo_addr_len);
    const int S = s->book.num_servers;
    if (s->srv_lost && f->server >= 0 && f->server < S) {
        if (f->kind == CTL_FO_LOST)
            __atomic_store_n(&s->srv_lost[f->server], 1, __ATOMIC_RELAXED);
        else if (f->kind == CTL_FO_REJOINED)
            __atomic_store_n(&s->srv_lost[f->server], 0, __ATOMIC_RELAXED);
    }
    /* A server's rejoin under way: server 0's loss meanwhile re-forms the run (the learner's copy needs the
     * rendezvous). A worker's replacement under way does not count: server 0's loss then is its failover as
     * at any other time, and the restarted rendezvous, finding the worker missing, begins its replacement
     * again (docs/architecture.md, "A worker lost with server 0"). */
    if (f->kind == CTL_FO_REJOIN_BEGIN)
        s->rejoin_pending = 1;
    else if (f->kind == CTL_FO_REJOINED || f->kind == CTL_FO_REJOIN_ABORTED)
        s->rejoin_pending = 0;
    /* The book follows the replacement: a redo lists every worker's entry (new collectives endpoints), a
     * rollback the replacement's. */
    const int W = s->book.num_workers;
    if (f->kind == CTL_FO_REDO && f->n_worker_addrs == (size_t)W)
        for (int w = 0; w < W; w++) {
            s->book.workers[w].addr_len = f->worker_addrs[w].len; /* <= CTL_MAX_ADDR: ctl_msg_check */
            memcpy(s->book.workers[w].addr, f->worker_addrs[w].data, f->worker_addrs[w].len);
        }
    if (f->kind == CTL_FO_ROLLBACK && f->server >= 0 && f->server < W && f->fabric_addr.len) {
        s->book.workers[f->server].addr_len = f->fabric_addr.len;
        memcpy(s->book.workers[f->server].addr, f->fabric_addr.data, f->fabric_addr.len);
    }
}

/* 1 when rc (a send or read of the session) says the rendezvous closed the connection (EOF or RST) rather
 * than sent anything: the process holding it is gone (the rendezvous never closes a member's connection
 * without an explicit message first). */
static int closed_rc(int rc)
{
    return rc == -ECONNRESET || rc == -EPIPE || rc == -ECONNABORTED;
}

/* Closes the control connection (under the send lock) and leaves the session orphaned: no rendezvous, no
 * Resume in flight. */
static void become_orphan(ctl_session *s)
{
    pthread_mutex_lock(&s->send_mu);
    close(s->fd);
    s->fd = -1;
    pthread_mutex_unlock(&s->send_mu);
    s->resuming = 0;
    atomic_store(&s->orphan, 1);
}

/* The control connection closed (rc, closed_rc) on a session that may survive it: when every shard keeps a
 * live copy without server 0 (this member's view of the lost set) and no rejoin is under way, the close is
 * taken as server 0's failover at the next epoch (a notice as the rendezvous would send, kept for
 * ctl_session_failover) and the session goes on without a connection (orphan): returns 2. A restarted
 * rendezvous lost before server 0 rejoined: the session waits for the next one, returns 3. Otherwise returns
 * rc with the reason the run must re-form in pf_errmsg(). */
static int rendezvous_lost(ctl_session *s, int rc)
{
    char why[256], cause[PF_ERRMSG_MAX];
    snprintf(cause, sizeof cause, "%s", pf_errmsg());
    const int S = s->book.num_servers;
    if (s->srv_lost[0]) {
        /* A restarted rendezvous that this member resumed with is gone before server 0 rejoined: nothing
         * changes for the copies (server 0 holds none); the session waits for the next one. */
        become_orphan(s);
        log_warn("%s: the restarted rendezvous is lost again before server 0 rejoined: training goes on; "
                 "waiting for the next one",
                 cause);
        return 3;
    }
    if (s->rejoin_pending)
        return pf_err(rc,
                      "%s: the rendezvous is lost with server 0 while a server rejoins (a rejoin needs the "
                      "rendezvous): falling back to the checkpoint re-form",
                      cause);
    if (!ctl_shards_survive(s->srv_lost, S, 0, why, sizeof why))
        return pf_err(rc, "%s: the rendezvous is lost with server 0 and %s: falling back to the checkpoint re-form",
                      cause, why);
    pthread_mutex_lock(&s->send_mu);
    close(s->fd);
    s->fd = -1;
    pthread_mutex_unlock(&s->send_mu);
    __atomic_store_n(&s->srv_lost[0], 1, __ATOMIC_RELAXED);
    s->fo_epoch++;
    s->fo_server = 0;
    s->fo_kind = CTL_FO_LOST;
    s->fo_step = 0;
    s->fo_addr_len = 0;
    snprintf(s->fo_text, sizeof s->fo_text,
             "server[0] lost (%s): shard 0 goes on on its backup on server 1, epoch %u; %s now %s a single copy; "
             "the rendezvous is lost with server 0: training goes on; another failure now re-forms the run from "
             "its checkpoint",
             cause, s->fo_epoch, why, strchr(why, ',') ? "have" : "has");
    atomic_store(&s->orphan, 1);
    s->next_try = pf_now_s() + 0.25;
    return 2;
}

/* An orphaned session (can_resume) tries once to reach a restarted rendezvous at the address it joined: it
 * answers the hello with a Resume (this member's part of the run: role, rank, book entry, run id and nonce,
 * config digest, epoch, lost servers; authenticated as a join). Returns 0 when the Resume went out (the
 * session is connected again, waiting for its acknowledgement), or -1 (nobody there yet, or no hello). */
static int try_resume(ctl_session *s)
{
    int fd = -1;
    double now = pf_now_s();
    if (connect_by(s->host, s->port, now + 0.2, "0.2 s", &fd) < 0)
        return -1;
    pthread_mutex_lock(&s->send_mu);
    s->fd = fd;
    s->rlen = 0;
    pthread_mutex_unlock(&s->send_mu);
    Pfcps__CtlMessage *m = NULL;
    int rc = recv_msg(s, pf_now_s() + 1.0, &m);
    if (rc == 0 && (m->body_case != PFCPS__CTL_MESSAGE__BODY_HELLO ||
                    m->hello->protocol_version != CTL_PROTOCOL_VERSION))
        rc = -EPROTO;
    int32_t lost[CTL_MAX_MEMBERS];
    size_t nlost = 0;
    for (int i = 0; i < s->book.num_servers && i < CTL_MAX_MEMBERS; i++)
        if (s->srv_lost[i])
            lost[nlost++] = i;
    uint8_t mac[CTL_MAC_LEN];
    if (rc == 0)
        rc = ctl_resume_mac(s->secret, m->hello->nonce.data, m->hello->nonce.len, (int)s->role, s->rank,
                            s->addr, s->addr_len, s->book.run_id, s->book.run_nonce, s->digest, s->fo_epoch,
                            lost, nlost, s->book.config_text, mac);
    if (m)
        pfcps__ctl_message__free_unpacked(m, NULL);
    if (rc == 0) {
        Pfcps__Resume r = PFCPS__RESUME__INIT;
        r.role = s->role == CTL_ROLE_SERVER ? PFCPS__ROLE__SERVER : PFCPS__ROLE__WORKER;
        r.rank = s->rank;
        r.fabric_addr.data = s->addr;
        r.fabric_addr.len = s->addr_len;
        r.mac.data = mac;
        r.mac.len = sizeof mac;
        r.protocol_version = CTL_PROTOCOL_VERSION;
        r.run_id.data = s->book.run_id;
        r.run_id.len = CKPT_RUN_ID_BYTES;
        r.run_nonce.data = s->book.run_nonce;
        r.run_nonce.len = 16;
        r.config_digest.data = s->digest;
        r.config_digest.len = CKPT_DIGEST_BYTES;
        r.epoch = s->fo_epoch;
        r.lost_servers = lost;
        r.n_lost_servers = nlost;
        r.config_text = s->book.config_text ? s->book.config_text : (char *)"";
        Pfcps__CtlMessage rm = PFCPS__CTL_MESSAGE__INIT;
        rm.body_case = PFCPS__CTL_MESSAGE__BODY_RESUME;
        rm.resume = &r;
        rc = send_msg(s, &rm, pf_now_s() + 1.0);
    }
    if (rc < 0) {
        pthread_mutex_lock(&s->send_mu);
        close(s->fd);
        s->fd = -1;
        pthread_mutex_unlock(&s->send_mu);
        return -1;
    }
    s->resuming = 1;
    now = pf_now_s();
    atomic_store(&s->lease_base, now); /* a new rendezvous removes nobody before a whole silence limit */
    s->next_hb = now + (s->hb_every > 0 ? s->hb_every : 1.0);
    atomic_store(&s->orphan, 0);
    if (s->refusals == 0)
        log_info("reached a rendezvous at %s:%d again: resuming the run there (epoch %u, %zu lost servers)",
                 s->host, s->port, s->fo_epoch, nlost);
    return 0;
}

/* Seconds between two lines about a member's resume refused again and again. */
#define CTL_REFUSAL_LOG_S 30.0

/* The connection on which a Resume went out was refused (an Error) or closed before its acknowledgement:
 * back to waiting, the next try in a second. */
static void resume_refused(ctl_session *s, const char *why)
{
    become_orphan(s);
    const double now = pf_now_s();
    s->next_try = now + 1.0;
    /* Tried every second: the first refusal is said, then one line every CTL_REFUSAL_LOG_S. */
    if (++s->refusals == 1 || now - s->refusal_log_t >= CTL_REFUSAL_LOG_S) {
        log_warn(
            "the rendezvous at %s:%d did not take this member's resume (%ld time%s): %s; trying again every "
            "second",
            s->host, s->port, s->refusals, s->refusals > 1 ? "s" : "", why);
        s->refusal_log_t = now;
    }
}

/* A send or receive on the control connection failed with rc < 0. A session that may survive the close
 * (ctl_session_survive_rendezvous_loss) takes a closed connection as a refused Resume while resuming (returns
 * 3: go on waiting) or as the rendezvous' loss (rendezvous_lost's 2, 3 or rc); any other failure is rc. */
static int connection_failed(ctl_session *s, int rc)
{
    if (!s->survive || !closed_rc(rc))
        return rc;
    if (s->resuming) {
        resume_refused(s, pf_errmsg());
        return 3;
    }
    return rendezvous_lost(s, rc);
}

int ctl_session_wait_shutdown(ctl_session *s, double timeout_s)
{
    double end = timeout_s < 0 ? 1e300 : pf_now_s() + timeout_s;
    const double hb_every = s->hb_every > 0 ? s->hb_every : 1.0;
    if (s->next_hb == 0)
        s->next_hb = pf_now_s() + hb_every;
    for (;;) {
        double t = pf_now_s();
        if (t >= end)
            return 0;
        if (atomic_load(&s->orphan)) {
            /* No rendezvous: nothing comes and nothing is sent; every 0.25 s the address is tried again
             * (ctl_session_survive_rendezvous_loss with a digest). */
            if (s->can_resume && t >= s->next_try) {
                s->next_try = t + 0.25;
                if (try_resume(s) == 0)
                    continue;
            }
            double until = s->can_resume && s->next_try < end ? s->next_try : end;
            double left = until - pf_now_s();
            if (left > 0)
                poll(NULL, 0, left > 1.0 ? 1000 : (int)(left * 1000) + 1);
            continue;
        }
        if (t >= s->next_hb) {
            Pfcps__Heartbeat hb = PFCPS__HEARTBEAT__INIT;
            hb.seq = ++s->hb_seq;
            Pfcps__CtlMessage m = PFCPS__CTL_MESSAGE__INIT;
            m.body_case = PFCPS__CTL_MESSAGE__BODY_HEARTBEAT;
            m.heartbeat = &hb;
            s->hb_sent[hb.seq % CTL_HB_RING] = t;
            int rc = send_msg(s, &m, t + 5.0);
            if (rc < 0) {
                if ((rc = connection_failed(s, rc)) == 3)
                    continue;
                return rc;
            }
            s->next_hb = t + hb_every;
        }
        /* A rendezvous that echoed no heartbeat for rv_silence (its process stopped or hung, its host cut
         * off) is lost as if its connection closed; a rendezvous stopped that long fences itself when it runs
         * again (ctl_rendezvous.c resumed_after_gap), so it never serves on behind the members' backs. */
        /* Silence is counted from the newest echo, or from this loop's own last gap (this process stopped, or
         * not waiting here for a while: no heartbeat went out meanwhile, so none could be echoed). */
        if (s->last_pass > 0 && t - s->last_pass > 2 * hb_every + 0.5)
            s->own_gap = t;
        s->last_pass = t;
        double base = atomic_load(&s->lease_base);
        if (s->own_gap > base)
            base = s->own_gap;
        if (s->survive && s->rv_silence > 0 && !s->resuming && base > 0 && t - base > s->rv_silence) {
            int lost = pf_err(-ECONNABORTED,
                              "the rendezvous at %s:%d echoed no heartbeat for %.1f s (server 0 "
                              "stopped, hung or cut off)",
                              s->host, s->port, t - base);
            if ((lost = connection_failed(s, lost)) == 3)
                continue;
            return lost;
        }
        Pfcps__CtlMessage *m = NULL;
        int rc = recv_msg(s, s->next_hb < end ? s->next_hb : end, &m);
        if (rc == -ETIMEDOUT)
            continue;
        if (rc < 0) {
            if ((rc = connection_failed(s, rc)) == 3)
                continue;
            return rc;
        }
        int kind = m->body_case;
        if (s->resuming && (kind == PFCPS__CTL_MESSAGE__BODY_ERROR || kind == PFCPS__CTL_MESSAGE__BODY_RESUME)) {
            if (kind == PFCPS__CTL_MESSAGE__BODY_ERROR) {
                char why[600];
                snprintf(why, sizeof why, "%s", m->error->message);
                const int code = (int)m->error->code;
                pfcps__ctl_message__free_unpacked(m, NULL);
                if (code == ETIMEDOUT) {
                    /* This member was taken for lost while no rendezvous ran (a worker whose replacement the
                     * restarted rendezvous began): it is out of the run, as a silent member removed. */
                    become_orphan(s);
                    s->can_resume = 0;
                    return pf_err(-ETIMEDOUT,
                                  "the restarted rendezvous at %s:%d refused this member's resume: %s",
                                  s->host, s->port, why);
                }
                resume_refused(s, why);
                continue;
            }
            s->resuming = 0;
            log_info("the rendezvous at %s:%d took this member's resume (its epoch %u%s)", s->host, s->port,
                     m->resume->epoch, s->refusals ? ", after refusals" : "");
            s->refusals = 0;
            pfcps__ctl_message__free_unpacked(m, NULL);
            continue;
        }
        if (kind == PFCPS__CTL_MESSAGE__BODY_ERROR)
            rc = error_reply(m->error);
        else if (kind == PFCPS__CTL_MESSAGE__BODY_HEARTBEAT)
            heartbeat_echoed(s, m->heartbeat);
        else if (kind == PFCPS__CTL_MESSAGE__BODY_FAILOVER)
            take_failover(s, m->failover);
        pfcps__ctl_message__free_unpacked(m, NULL);
        if (kind == PFCPS__CTL_MESSAGE__BODY_SHUTDOWN)
            return 1;
        if (kind == PFCPS__CTL_MESSAGE__BODY_FAILOVER)
            return 2;
        if (rc < 0)
            return rc;
    }
}

uint32_t ctl_session_failover(const ctl_session *s, int *server, const char **text)
{
    if (server)
        *server = s->fo_server;
    if (text)
        *text = s->fo_text;
    return s->fo_epoch;
}

int ctl_session_failover_kind(const ctl_session *s, int64_t *step, const uint8_t **addr, size_t *addr_len)
{
    if (step)
        *step = s->fo_step;
    if (addr)
        *addr = s->fo_addr;
    if (addr_len)
        *addr_len = s->fo_addr_len;
    return s->fo_kind;
}

int ctl_session_rejoin_report(ctl_session *s, int kind, int server, uint32_t epoch, int64_t step)
{
    if (kind != CTL_FO_REJOIN_STEP && kind != CTL_FO_REJOIN_READY)
        return pf_err(-EINVAL, "rejoin report: kind %d is neither the copy step nor ready", kind);
    return ctl_session_report(s, kind, server, epoch, step, NULL, 0);
}

int ctl_session_report(ctl_session *s, int kind, int rank, uint32_t epoch, int64_t step, const void *addr,
                       size_t addr_len)
{
    static const char *const what[CTL_FO_KIND_MAX + 1] = {
        [CTL_FO_REJOIN_STEP] = "copy step",   [CTL_FO_REJOIN_READY] = "learner ready",
        [CTL_FO_WORKER_REPORT] = "report",    [CTL_FO_ROLLED_BACK] = "rolled back",
        [CTL_FO_STATE_READY] = "state ready", [CTL_FO_NO_REDO] = "no step to redo",
        [CTL_FO_END_VOTED] = "end voted"};
    if (kind < 0 || kind > CTL_FO_KIND_MAX || !what[kind])
        return pf_err(-EINVAL, "control report: kind %d is not a member's report", kind);
    if (addr_len > CTL_MAX_ADDR)
        return pf_err(-EINVAL, "control report: an address of %zu bytes (at most %d)", addr_len, CTL_MAX_ADDR);
    if (atomic_load(&s->orphan))
        return pf_err(-ENOTCONN, "control report (%s): the rendezvous is lost with server 0", what[kind]);
    Pfcps__Failover f;
    Pfcps__CtlMessage m;
    ctl_msg_set_failover(&m, &f, epoch ? epoch : 1, rank, what[kind]);
    f.kind = (uint32_t)kind;
    f.step = step;
    if (addr_len) {
        f.fabric_addr.data = (uint8_t *)addr;
        f.fabric_addr.len = addr_len;
        if (kind == CTL_FO_WORKER_REPORT) { /* this member's book entry from now on (a Resume carries it) */
            memcpy(s->addr, addr, addr_len);
            s->addr_len = addr_len;
        }
    }
    return send_msg(s, &m, pf_now_s() + 5.0);
}

void ctl_session_set_heartbeat(ctl_session *s, double seconds)
{
    s->hb_every = seconds > 0 ? seconds : 1.0;
    double t = pf_now_s() + s->hb_every;
    if (s->next_hb == 0 || s->next_hb > t)
        s->next_hb = t;
}

double ctl_session_lease_base(const ctl_session *s)
{
    if (atomic_load(&((ctl_session *)s)->orphan))
        return pf_now_s(); /* no rendezvous is left that could hand this member's role to another */
    return atomic_load(&((ctl_session *)s)->lease_base);
}

void ctl_session_set_rendezvous_silence(ctl_session *s, double seconds)
{
    s->rv_silence = seconds > 0 ? seconds : 0;
}

int ctl_session_survive_rendezvous_loss(ctl_session *s, const uint8_t *config_digest)
{
    if (config_digest) {
        memcpy(s->digest, config_digest, CKPT_DIGEST_BYTES);
        s->can_resume = 1;
    }
    if (!s->srv_lost) {
        int S = s->book.num_servers > 0 ? s->book.num_servers : 1;
        s->srv_lost = calloc((size_t)S, 1);
        if (!s->srv_lost)
            return pf_err(-ENOMEM, "out of memory");
        /* A member that joined the running run late (a worker's replacement, a rejoining server) was not told
         * of the failovers before it: its join reply lists the servers failed over and not rejoined. */
        for (int i = 0; i < s->book.nlost; i++)
            if (s->book.lost[i] >= 0 && s->book.lost[i] < S)
                s->srv_lost[s->book.lost[i]] = 1;
    }
    /* A server that rejoined holds the rejoin's epoch until the next notice. */
    if (s->fo_epoch == 0 && s->book.rejoin_epoch > 0)
        s->fo_epoch = s->book.rejoin_epoch;
    s->survive = 1;
    return 0;
}

int ctl_session_orphaned(const ctl_session *s)
{
    return atomic_load(&((ctl_session *)s)->orphan);
}

int ctl_session_server_lost(const ctl_session *s, int r)
{
    if (!s || !s->srv_lost || r < 0 || r >= s->book.num_servers)
        return 0;
    return __atomic_load_n(&s->srv_lost[r], __ATOMIC_RELAXED) != 0;
}

int ctl_session_leave(ctl_session *s)
{
    if (atomic_load(&s->orphan))
        return 0; /* no rendezvous to tell */
    Pfcps__Shutdown sd;
    Pfcps__CtlMessage m;
    ctl_msg_set_shutdown(&m, &sd, "leaving");
    return send_msg(s, &m, pf_now_s() + 5.0);
}

int ctl_session_fail(ctl_session *s, const char *why)
{
    if (atomic_load(&s->orphan))
        return pf_err(-ENOTCONN, "the rendezvous is lost with server 0");
    char text[512];
    snprintf(text, sizeof text, "%s", why ? why : "");
    Pfcps__Error e;
    Pfcps__CtlMessage m;
    ctl_msg_set_error(&m, &e, EIO, text);
    return send_msg(s, &m, pf_now_s() + 5.0);
}

void ctl_session_close(ctl_session *s)
{
    if (!s)
        return;
    if (s->fd >= 0)
        close(s->fd);
    pthread_mutex_destroy(&s->send_mu);
    ctl_book_free(&s->book);
    free(s->srv_lost);
    free(s->rbuf);
    free(s);
}
