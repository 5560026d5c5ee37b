/* Bad peers against a live rendezvous (1 server + 2 workers, read timeout 1 s, frame limit 4 KiB):
 * a silent connection, a truncated frame, a length over the maximum, random bytes, a valid frame
 * with garbage protobuf, a non-join message first, a wrong protocol version, a metrics address or replicas altered on
 * the way or malformed (no port, port 0, 256 bytes), a wrong secret, a rank
 * out of range, a taken rank, and a connection that joins twice. Each must get its error reply (code
 * and message checked) and be dropped, while the three honest members, joined as threads around the
 * attacks, must all receive the expected address book and then the shutdown broadcast. */
#include "common/ctl.h"
#include "common/ctl_frame.h"
#include "common/ctl_internal.h"
#include "common/err.h"
#include "common/log.h"
#include "ctl_book_dump.h"
#include "tests/check.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define SECRET "bad-peer-test-secret"
#define MAXF   4096
#define CONFIG "[train]\nnum_classes = 30\n[data]\nrec = synthetic\n"

static int port;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- honest members (threads) ---- */

typedef struct honest {
    ctl_role role;
    int rank;
    char addr[32];
    pthread_t th;
    int join_rc, idle_rc, shutdown_rc;
    volatile int idle_done;
    char *dump;
    char err[PF_ERRMSG_MAX];
} honest;

static void *honest_main(void *arg)
{
    honest *h = arg;
    ctl_session *s;
    h->join_rc =
        ctl_join("127.0.0.1", port, h->role, h->rank, h->addr, strlen(h->addr), SECRET, MAXF, 20.0, &s);
    if (h->join_rc < 0) {
        snprintf(h->err, sizeof h->err, "%s", pf_errmsg());
        return NULL;
    }
    h->dump = book_dump(ctl_session_book(s));
    /* 1.5 s with no shutdown: returns 0, and one heartbeat went out and was echoed meanwhile. */
    h->idle_rc = ctl_session_wait_shutdown(s, 1.5);
    __atomic_store_n(&h->idle_done, 1, __ATOMIC_SEQ_CST);
    h->shutdown_rc = ctl_session_wait_shutdown(s, 20.0);
    ctl_session_close(s);
    return NULL;
}

static void honest_start(honest *h, ctl_role role, int rank)
{
    h->role = role;
    h->rank = rank;
    snprintf(h->addr, sizeof h->addr, "honest-%s-%d", role == CTL_ROLE_SERVER ? "server" : "worker", rank);
    pthread_create(&h->th, NULL, honest_main, h);
}

/* ---- raw peers ---- */

static int raw_connect(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        perror("connect");
        exit(1);
    }
    return fd;
}

static void raw_send(int fd, const void *p, size_t n)
{
    if (send(fd, p, n, MSG_NOSIGNAL) != (ssize_t)n)
        fprintf(stderr, "raw send of %zu bytes failed\n", n);
}

/* Reads one frame (bounded by timeout_s). Returns the message, or NULL on EOF/timeout (*eof says which). */
static Pfcps__CtlMessage *raw_recv(int fd, double timeout_s, int *eof)
{
    static uint8_t buf[MAXF + 4];
    size_t len = 0, flen = 0;
    double end = now_s() + timeout_s;
    *eof = 0;
    for (;;) {
        int pk = ctl_frame_peek(buf, len, MAXF, &flen);
        if (pk == 1)
            break;
        if (pk < 0)
            return NULL;
        double left = end - now_s();
        if (left <= 0)
            return NULL;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, (int)(left * 1000) + 1) <= 0)
            continue;
        /* One byte at a time past the header, so nothing of the next frame is consumed. */
        size_t want = len < 4 ? 4 - len : (size_t)(buf[0] | buf[1] << 8 | buf[2] << 16) + 4 - len;
        ssize_t r = recv(fd, buf + len, want, 0);
        if (r <= 0) {
            *eof = 1;
            return NULL;
        }
        len += (size_t)r;
    }
    Pfcps__CtlMessage *m = NULL;
    if (ctl_msg_decode(buf + 4, flen - 4, &m) < 0)
        return NULL;
    return m;
}

/* Connects and reads the hello; returns the fd and the nonce. */
static int raw_hello(uint8_t nonce[CTL_NONCE_LEN])
{
    int fd = raw_connect(), eof;
    Pfcps__CtlMessage *m = raw_recv(fd, 5.0, &eof);
    CHECK(m && m->body_case == PFCPS__CTL_MESSAGE__BODY_HELLO, "no hello from the service");
    if (m && m->body_case == PFCPS__CTL_MESSAGE__BODY_HELLO)
        memcpy(nonce, m->hello->nonce.data, CTL_NONCE_LEN);
    if (m)
        pfcps__ctl_message__free_unpacked(m, NULL);
    return fd;
}

/* Expects an Error with `code` whose text contains `want` (NULL: any), then the connection closed. */
static void expect_error_and_drop(const char *what, int fd, const int *codes, int ncodes, const char *want)
{
    int eof;
    Pfcps__CtlMessage *m = raw_recv(fd, 5.0, &eof);
    int ok = m && m->body_case == PFCPS__CTL_MESSAGE__BODY_ERROR;
    int code_ok = 0;
    for (int i = 0; ok && i < ncodes; i++)
        code_ok |= m->error->code == codes[i];
    printf("%-28s -> %s %d: %s\n", what, ok ? "error" : "no error reply", ok ? m->error->code : 0,
           ok ? m->error->message : "");
    CHECK(ok, "%s: no error reply", what);
    CHECK(!ok || code_ok, "%s: error code %d not the expected one (%d)", what, m->error->code, codes[0]);
    CHECK(!ok || !want || strstr(m->error->message, want), "%s: message lacks '%s'", what, want);
    if (m)
        pfcps__ctl_message__free_unpacked(m, NULL);
    m = raw_recv(fd, 5.0, &eof);
    CHECK(!m && eof, "%s: connection not closed after the error", what);
    if (m)
        pfcps__ctl_message__free_unpacked(m, NULL);
    close(fd);
}

/* A join carrying metrics address maddr ("" for none), replicas and endpoint keys whose MAC covers mac_maddr,
 * mac_replicas and mac_keys: equal to them for an honest member, other values for a join altered on the way.
 */
static void send_join_fields(int fd, const uint8_t *nonce, const char *secret, int role, int rank,
                             const char *addr, uint32_t version, const char *maddr, const char *mac_maddr,
                             uint32_t replicas, uint32_t mac_replicas, const char *keys, const char *mac_keys)
{
    uint8_t mac[CTL_MAC_LEN];
    ctl_member_mac(secret, nonce, CTL_NONCE_LEN, role, rank, (const uint8_t *)addr, strlen(addr), mac_maddr,
                   mac_replicas, mac_keys, mac);
    Pfcps__Join j = PFCPS__JOIN__INIT;
    j.metrics_address = (char *)maddr;
    j.replicas = replicas;
    j.endpoint_keys = (char *)keys;
    j.role = (Pfcps__Role)role;
    j.rank = rank;
    j.fabric_addr.data = (uint8_t *)addr;
    j.fabric_addr.len = strlen(addr);
    j.mac.data = mac;
    j.mac.len = sizeof mac;
    j.protocol_version = version;
    Pfcps__CtlMessage m = PFCPS__CTL_MESSAGE__INIT;
    m.body_case = PFCPS__CTL_MESSAGE__BODY_JOIN;
    m.join = &j;
    uint8_t *frame;
    size_t len;
    if (ctl_frame_encode(&m, MAXF, &frame, &len) == 0) {
        raw_send(fd, frame, len);
        free(frame);
    }
}

static void send_join_metrics(int fd, const uint8_t *nonce, const char *secret, int role, int rank,
                              const char *addr, uint32_t version, const char *maddr, const char *mac_maddr)
{
    send_join_fields(fd, nonce, secret, role, rank, addr, version, maddr, mac_maddr, 0, 0, "", "");
}

static void send_join(int fd, const uint8_t *nonce, const char *secret, int role, int rank, const char *addr,
                      uint32_t version)
{
    send_join_metrics(fd, nonce, secret, role, rank, addr, version, "", "");
}

static void watchdog(int sig)
{
    (void)sig;
    static const char m[] = "test_ctl_badpeer: watchdog expired\n";
    ssize_t w = write(2, m, sizeof m - 1);
    (void)w;
    _exit(1);
}

/* Many slow clients at once (deadline 10 s, so they stay connected): 40 silent connections and one
 * sending its join a byte every 20 ms. Two honest members joining meanwhile must get their book
 * within 3 s: the service never waits on one client. */
static void slow_clients_phase(void)
{
    ctl_rendezvous_opts o = {.bind_host = "127.0.0.1",
                             .port = 0,
                             .num_servers = 1,
                             .num_workers = 1,
                             .secret = SECRET,
                             .max_frame = MAXF,
                             .timeout_s = 10.0,
                             .config_text = CONFIG,
                             .num_classes = 30};
    ctl_rendezvous *rv;
    if (ctl_rendezvous_start(&o, &rv) < 0) {
        CHECK(0, "second rendezvous: %s", pf_errmsg());
        return;
    }
    int saved_port = port;
    port = ctl_rendezvous_port(rv);
    enum { NSILENT = 40 };
    int silent[NSILENT];
    for (int i = 0; i < NSILENT; i++)
        silent[i] = raw_connect();
    uint8_t nonce[CTL_NONCE_LEN];
    int slow = raw_hello(nonce);
    /* The slow joiner's frame: a join as worker 0 that would be valid, trickled out. */
    uint8_t mac[CTL_MAC_LEN];
    ctl_join_mac(SECRET, nonce, CTL_NONCE_LEN, 1, 0, (const uint8_t *)"slow", 4, mac);
    Pfcps__Join j = PFCPS__JOIN__INIT;
    j.role = PFCPS__ROLE__WORKER;
    j.fabric_addr.data = (uint8_t *)"slow";
    j.fabric_addr.len = 4;
    j.mac.data = mac;
    j.mac.len = sizeof mac;
    j.protocol_version = CTL_PROTOCOL_VERSION;
    Pfcps__CtlMessage m = PFCPS__CTL_MESSAGE__INIT;
    m.body_case = PFCPS__CTL_MESSAGE__BODY_JOIN;
    m.join = &j;
    uint8_t *frame;
    size_t flen;
    ctl_frame_encode(&m, MAXF, &frame, &flen);

    size_t sent = 0;
    for (; sent < 10; sent++) { /* the first 10 bytes, 20 ms apart, before the honest members come */
        raw_send(slow, frame + sent, 1);
        usleep(20000);
    }
    double t0 = now_s();
    honest hs[2] = {0};
    honest_start(&hs[0], CTL_ROLE_SERVER, 0);
    /* Worker 0 is what the slow joiner is asking for; the honest one takes it first. */
    honest_start(&hs[1], CTL_ROLE_WORKER, 0);
    while ((!hs[0].dump || !hs[1].dump) && hs[0].join_rc == 0 && hs[1].join_rc == 0 && now_s() < t0 + 3.0) {
        if (sent < flen / 2) /* half the frame: it is still in progress when the run forms */
            raw_send(slow, frame + sent++, 1);
        usleep(20000);
    }
    double took = now_s() - t0;
    free(frame);
    printf("with %d silent clients and a slow joiner (%zu of %zu bytes sent), 2 honest members got the book "
           "in %.3f s\n",
           NSILENT, sent, flen, took);
    CHECK(hs[0].dump && hs[1].dump && took < 3.0, "honest members held up by slow clients (%.3f s)", took);
    CHECK(ctl_rendezvous_joined(rv) == 2, "joined %d, want 2", ctl_rendezvous_joined(rv));

    /* The service holds S + W + 256 = 258 connections; 43 are open. Of 220 more, the ones past the cap make
     * room by evicting the oldest connections that never joined (strangers crowding the rendezvous must not
     * keep members out): every newcomer gets its hello, and the joined members stay. */
    enum { NEXTRA = 220 };
    int extra[NEXTRA], busy = 0, hellos = 0;
    for (int i = 0; i < NEXTRA; i++) {
        extra[i] = raw_connect();
        usleep(1000); /* in order, so the refused ones are the last */
    }
    for (int i = 0; i < NEXTRA; i++) {
        int eof;
        Pfcps__CtlMessage *r = raw_recv(extra[i], 3.0, &eof);
        if (r && r->body_case == PFCPS__CTL_MESSAGE__BODY_ERROR && r->error->code == EBUSY)
            busy++;
        else if (r && r->body_case == PFCPS__CTL_MESSAGE__BODY_HELLO)
            hellos++;
        if (r)
            pfcps__ctl_message__free_unpacked(r, NULL);
        close(extra[i]);
    }
    printf("connection cap: %d of %d extra connections got a hello, %d an EBUSY error\n", hellos, NEXTRA,
           busy);
    CHECK(hellos == NEXTRA && busy == 0, "cap: %d hellos (want %d), %d busy (want 0)", hellos, NEXTRA, busy);
    CHECK(ctl_rendezvous_joined(rv) == 2, "evictions removed a joined member (%d joined)",
          ctl_rendezvous_joined(rv));
    double end = now_s() + 10;
    for (int i = 0; i < 2; i++)
        while (hs[i].join_rc == 0 && !__atomic_load_n(&hs[i].idle_done, __ATOMIC_SEQ_CST) && now_s() < end)
            usleep(5000);
    ctl_rendezvous_broadcast_shutdown(rv);
    for (int i = 0; i < 2; i++) {
        pthread_join(hs[i].th, NULL);
        free(hs[i].dump);
    }
    ctl_rendezvous_stop(rv);
    for (int i = 0; i < NSILENT; i++)
        close(silent[i]);
    close(slow);
    port = saved_port;
}

int main(void)
{
    log_init("test", -1);
    signal(SIGALRM, watchdog);
    alarm(60);
    ctl_rendezvous_opts o = {.bind_host = "127.0.0.1",
                             .port = 0,
                             .num_servers = 1,
                             .num_workers = 2,
                             .secret = SECRET,
                             .max_frame = MAXF,
                             .timeout_s = 1.0,
                             .config_text = CONFIG,
                             .num_classes = 30};
    ctl_rendezvous *rv;
    if (ctl_rendezvous_start(&o, &rv) < 0) {
        fprintf(stderr, "rendezvous: %s\n", pf_errmsg());
        return 1;
    }
    port = ctl_rendezvous_port(rv);
    uint8_t nonce[CTL_NONCE_LEN];
    const int e_proto[] = {EPROTO}, e_size[] = {EMSGSIZE}, e_time[] = {ETIMEDOUT}, e_exist[] = {EEXIST},
              e_any[] = {EPROTO, EMSGSIZE, EACCES};

    /* A connection that says nothing, open through most of the test. */
    int silent = raw_hello(nonce);
    double silent_since = now_s();

    honest hs[3] = {0};
    honest_start(&hs[0], CTL_ROLE_SERVER, 0);

    /* Truncated frame: the header announces 100 bytes, 10 arrive; dropped at the read deadline. */
    int fd = raw_hello(nonce);
    uint8_t trunc[14] = {100, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    raw_send(fd, trunc, sizeof trunc);
    expect_error_and_drop("truncated frame", fd, e_time, 1, "timed out");

    /* Truncated frame, then the peer hangs up: nothing to answer, the service goes on. */
    fd = raw_hello(nonce);
    raw_send(fd, trunc, 8);
    close(fd);

    /* Announced length over the maximum. */
    fd = raw_hello(nonce);
    uint8_t over[8] = {(MAXF + 1) & 0xff, (MAXF + 1) >> 8, 0, 0, 0, 0, 0, 0};
    raw_send(fd, over, sizeof over);
    expect_error_and_drop("length over the maximum", fd, e_size, 1, "exceeds the maximum");

    /* Random bytes (fixed seed): unframed, then framed with a valid length. */
    srand(12345);
    uint8_t rnd[260];
    for (size_t i = 0; i < sizeof rnd; i++)
        rnd[i] = (uint8_t)(rand() >> 7);
    fd = raw_hello(nonce);
    raw_send(fd, rnd, sizeof rnd);
    expect_error_and_drop("random bytes", fd, e_any, 3, NULL);
    rnd[0] = 200, rnd[1] = 0, rnd[2] = 0, rnd[3] = 0;
    fd = raw_hello(nonce);
    raw_send(fd, rnd, 204);
    expect_error_and_drop("framed random payload", fd, e_any, 3, NULL);

    /* A valid frame carrying garbage protobuf. */
    fd = raw_hello(nonce);
    uint8_t garbage[12] = {8, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x12};
    raw_send(fd, garbage, sizeof garbage);
    expect_error_and_drop("garbage protobuf", fd, e_proto, 1, "undecodable");

    /* A well-formed message, but not a join. */
    fd = raw_hello(nonce);
    Pfcps__Heartbeat hb = PFCPS__HEARTBEAT__INIT;
    Pfcps__CtlMessage hm = PFCPS__CTL_MESSAGE__INIT;
    hm.body_case = PFCPS__CTL_MESSAGE__BODY_HEARTBEAT;
    hm.heartbeat = &hb;
    uint8_t *frame;
    size_t flen;
    ctl_frame_encode(&hm, MAXF, &frame, &flen);
    raw_send(fd, frame, flen);
    free(frame);
    expect_error_and_drop("heartbeat before join", fd, e_proto, 1, "expected join");

    /* A member of another build (older or newer protocol version). */
    for (int d = -1; d <= 1; d += 2) {
        char want[96];
        snprintf(want, sizeof want, "protocol version %d, this service speaks %d", CTL_PROTOCOL_VERSION + d,
                 CTL_PROTOCOL_VERSION);
        fd = raw_hello(nonce);
        send_join(fd, nonce, SECRET, 1, 0, "other-build", (uint32_t)(CTL_PROTOCOL_VERSION + d));
        expect_error_and_drop(d < 0 ? "older protocol version" : "newer protocol version", fd, e_proto, 1, want);
    }

    /* Metrics addresses: one changed on the way (the MAC covers another) is a bad secret; with a valid MAC,
     * one that is not host:port, has port 0 or is 256 bytes long is refused as malformed. */
    const int e_acces[] = {EACCES}, seated = ctl_rendezvous_joined(rv);
    fd = raw_hello(nonce);
    send_join_metrics(fd, nonce, SECRET, 1, 1, "w1", CTL_PROTOCOL_VERSION, "10.0.0.66:9400", "127.0.0.1:9400");
    expect_error_and_drop("metrics address altered", fd, e_acces, 1, "bad secret");
    fd = raw_hello(nonce);
    send_join_metrics(fd, nonce, SECRET, 1, 1, "w1", CTL_PROTOCOL_VERSION, "no-port", "no-port");
    expect_error_and_drop("metrics address no port", fd, e_proto, 1, "refused");
    fd = raw_hello(nonce);
    send_join_metrics(fd, nonce, SECRET, 1, 1, "w1", CTL_PROTOCOL_VERSION, "127.0.0.1:0", "127.0.0.1:0");
    expect_error_and_drop("metrics address port 0", fd, e_proto, 1, "refused");
    char longaddr[CTL_MAX_METRICS_ADDR + 8];
    memset(longaddr, 'a', sizeof longaddr);
    snprintf(longaddr + CTL_MAX_METRICS_ADDR - 5, 6, ":9400"); /* 256 bytes */
    fd = raw_hello(nonce);
    send_join_metrics(fd, nonce, SECRET, 1, 1, "w1", CTL_PROTOCOL_VERSION, longaddr, longaddr);
    expect_error_and_drop("metrics address 256 bytes", fd, e_proto, 1, "longer than 255 bytes");
    CHECK(ctl_rendezvous_joined(rv) == seated, "a refused metrics address took a seat (%d joined, %d before)",
          ctl_rendezvous_joined(rv), seated);
    /* The replicas a member sends are authenticated too: changed on the way either way, a bad secret. */
    for (uint32_t r = 0; r <= 1; r++) {
        fd = raw_hello(nonce);
        send_join_fields(fd, nonce, SECRET, 1, 1, "w1", CTL_PROTOCOL_VERSION, "", "", r, 1 - r, "", "");
        expect_error_and_drop(r ? "replicas altered 0 -> 1" : "replicas altered 1 -> 0", fd, e_acces, 1,
                              "bad secret");
    }
    CHECK(ctl_rendezvous_joined(rv) == seated, "a join with altered replicas took a seat (%d joined, %d before)",
          ctl_rendezvous_joined(rv), seated);
    /* So are a worker's endpoint keys: altered, added or removed on the way, a bad secret. */
    const char *sent[] = {"embedding_size = 32\n", "embedding_size = 32\n", ""},
               *maced[] = {"embedding_size = 512\n", "", "embedding_size = 512\n"};
    for (int k = 0; k < 3; k++) {
        fd = raw_hello(nonce);
        send_join_fields(fd, nonce, SECRET, 1, 1, "w1", CTL_PROTOCOL_VERSION, "", "", 0, 0, sent[k],
                         maced[k]);
        expect_error_and_drop(k == 0   ? "endpoint keys altered"
                              : k == 1 ? "endpoint keys added"
                                       : "endpoint keys removed",
                              fd, e_acces, 1, "bad secret");
    }
    CHECK(ctl_rendezvous_joined(rv) == seated,
          "a join with altered endpoint keys took a seat (%d joined, %d before)", ctl_rendezvous_joined(rv),
          seated);

    /* Wrong secret, rank out of range, taken rank: through the client API. */
    ctl_session *s = NULL;
    int rc = ctl_join("127.0.0.1", port, CTL_ROLE_WORKER, 0, "x", 1, "wrong-secret", MAXF, 5.0, &s);
    printf("%-28s -> rc %d: %s\n", "wrong secret (ctl_join)", rc, pf_errmsg());
    CHECK(rc == -EACCES && strstr(pf_errmsg(), "bad secret"), "wrong secret: rc %d", rc);
    rc = ctl_join("127.0.0.1", port, CTL_ROLE_WORKER, 2, "x", 1, SECRET, MAXF, 5.0, &s);
    printf("%-28s -> rc %d: %s\n", "rank out of range", rc, pf_errmsg());
    CHECK(rc == -ERANGE && strstr(pf_errmsg(), "outside [0, 2)"), "rank out of range: rc %d", rc);
    double end = now_s() + 5;
    while (ctl_rendezvous_joined(rv) < 1 && now_s() < end)
        usleep(5000);
    /* A rank still held (a restarted process whose old connection is not gone yet): retried until the
     * timeout. */
    rc = ctl_join("127.0.0.1", port, CTL_ROLE_SERVER, 0, "x", 1, SECRET, MAXF, 1.5, &s);
    printf("%-28s -> rc %d: %s\n", "taken rank", rc, pf_errmsg());
    CHECK(rc == -ETIMEDOUT && strstr(pf_errmsg(), "still held by"), "taken rank: rc %d", rc);

    /* Joins twice on one connection: refused and dropped; its rank is free again. */
    fd = raw_hello(nonce);
    send_join(fd, nonce, SECRET, 1, 1, "double-joiner", CTL_PROTOCOL_VERSION);
    end = now_s() + 5;
    while (ctl_rendezvous_joined(rv) < 2 && now_s() < end)
        usleep(5000);
    CHECK(ctl_rendezvous_joined(rv) == 2, "first join of the double joiner not counted");
    send_join(fd, nonce, SECRET, 1, 1, "double-joiner", CTL_PROTOCOL_VERSION);
    expect_error_and_drop("joins twice", fd, e_exist, 1, "already joined");
    end = now_s() + 5;
    while (ctl_rendezvous_joined(rv) != 1 && now_s() < end)
        usleep(5000);
    CHECK(ctl_rendezvous_joined(rv) == 1, "double joiner's rank not freed (%d joined)",
          ctl_rendezvous_joined(rv));

    /* A joined member that stalls in the middle of a frame: dropped at the read deadline, rank freed. */
    fd = raw_hello(nonce);
    send_join(fd, nonce, SECRET, 1, 1, "stalling-member", CTL_PROTOCOL_VERSION);
    end = now_s() + 5;
    while (ctl_rendezvous_joined(rv) < 2 && now_s() < end)
        usleep(5000);
    CHECK(ctl_rendezvous_joined(rv) == 2, "stalling member's join not counted");
    raw_send(fd, trunc, sizeof trunc);
    expect_error_and_drop("joined member, half frame", fd, e_time, 1, "incomplete frame");
    end = now_s() + 5;
    while (ctl_rendezvous_joined(rv) != 1 && now_s() < end)
        usleep(5000);
    CHECK(ctl_rendezvous_joined(rv) == 1, "stalling member's rank not freed (%d joined)",
          ctl_rendezvous_joined(rv));

    /* The silent connection was dropped at its deadline with an error reply. */
    expect_error_and_drop("silent connection", silent, e_time, 1, "no join");
    printf("silent connection: its error reply was read %.2f s after it connected (deadline 1 s)\n",
           now_s() - silent_since);

    /* The honest workers join; all three members must get the expected book. */
    honest_start(&hs[1], CTL_ROLE_WORKER, 0);
    honest_start(&hs[2], CTL_ROLE_WORKER, 1);
    end = now_s() + 10;
    for (int i = 0; i < 3; i++)
        while (!hs[i].dump && hs[i].join_rc == 0 && now_s() < end)
            usleep(5000);
    const char *want = "servers 1 workers 2 classes 30\n"
                       "server 0 686f6e6573742d7365727665722d30\n" /* "honest-server-0" */
                       "worker 0 686f6e6573742d776f726b65722d30\n" /* "honest-worker-0" */
                       "worker 1 686f6e6573742d776f726b65722d31\n" /* "honest-worker-1" */
                       "config:\n" CONFIG;
    for (int i = 0; i < 3; i++) {
        CHECK(hs[i].join_rc == 0, "honest member %d: join rc %d: %s", i, hs[i].join_rc, hs[i].err);
        CHECK(hs[i].dump && strcmp(hs[i].dump, want) == 0, "honest member %d book:\n%s", i,
              hs[i].dump ? hs[i].dump : "(none)");
    }
    printf("3 honest members received the expected book\n");

    /* After the run formed, a join without the secret is refused and disturbs nobody (only an authenticated
     * join, a restarted member, makes the run re-form: test_ctl_rendezvous). */
    rc = ctl_join("127.0.0.1", port, CTL_ROLE_WORKER, 1, "late", 4, "wrong-secret", MAXF, 5.0, &s);
    printf("%-28s -> rc %d: %s\n", "join after formation", rc, pf_errmsg());
    CHECK(rc == -EACCES, "unauthenticated join after formation: rc %d", rc);

    end = now_s() + 10;
    for (int i = 0; i < 3; i++)
        while (hs[i].join_rc == 0 && !__atomic_load_n(&hs[i].idle_done, __ATOMIC_SEQ_CST) && now_s() < end)
            usleep(5000);
    /* Shutdown immediately followed by stop: the broadcast must still reach everyone. */
    ctl_rendezvous_broadcast_shutdown(rv);
    ctl_rendezvous_stop(rv);
    for (int i = 0; i < 3; i++) {
        pthread_join(hs[i].th, NULL);
        CHECK(hs[i].idle_rc == 0, "honest member %d: idle wait returned %d (want 0: timeout)", i,
              hs[i].idle_rc);
        CHECK(hs[i].shutdown_rc == 1, "honest member %d: wait_shutdown returned %d", i, hs[i].shutdown_rc);
        free(hs[i].dump);
    }
    printf("idle wait timed out cleanly and the shutdown broadcast reached all 3 members\n");
    slow_clients_phase();
    printf("test_ctl_badpeer: %d failures\n", fails);
    return fails ? 1 : 0;
}
