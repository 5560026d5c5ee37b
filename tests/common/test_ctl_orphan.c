/* A member's session when the rendezvous' process goes (replicas = 1; docs/architecture.md, "Hot-standby
 * shards", "Server 0 and the rendezvous"). The rendezvous (2 servers + 1 worker, replicas = 1) runs in a
 * forked child, as in server 0's process; the three members join from threads of this process. Cases:
 * - kill: the child is killed (SIGKILL): the worker's and server 1's sessions
 *   (ctl_session_survive_rendezvous_loss) take the close as server 0's failover (wait returns 2: server 0,
 *   epoch 1, the text naming the lost rendezvous), are orphaned, keep a lease (lease base = now), leave
 *   without error, refuse rejoin reports and failure reports (-ENOTCONN) and then only wait out their
 *   timeouts; server 0's session, which does not survive it, gets the close as an error.
 * - both: server 1 goes first (its session closed without leaving: the rendezvous fails it over); then the
 *   child is killed: shard 0 would have no copy left, so the worker's session returns the close as an error
 *   naming the fallback to the checkpoint re-form, not orphaned.
 * - stop: the child stops its rendezvous without a shutdown (ctl_rendezvous_stop, as server 0 exiting for a
 *   re-form): every member is told before its connection closes (-ENOLINK), none is orphaned.
 * - resume: the child is killed, then a new one starts at the same address (server 0 restarted): the members
 *   reconnect and resume the run there, strangers' Resumes are refused naming why (another run config among
 *   them), and server 0's join becomes a rejoin that gets its learner's book once the worker says the copy
 *   step.
 * - keys: the restarted rendezvous' own config differs from the run's in a key it runs the run with
 *   (servers): the run's Resume is refused naming the key with both values, server 0's own join with it
 *   (EINVAL), each member says its refusal once, and the stopped rendezvous names the refusals. */
#include "common/clock.h"
#include "common/ctl.h"
#include "common/ctl_frame.h"
#include "common/ctl_internal.h"
#include "common/err.h"
#include "common/log.h"
#include "tests/check.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define SECRET "orphan-test-secret"
#define MAXF   65536

#include "tests/common/ctl_member.h"

static pid_t child;

static void kill_child(void)
{
    if (child > 0) {
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
        child = 0;
    }
}

/* Forks the rendezvous' process: it starts the service on a free port, writes the port to this process,
 * then stops the service when it reads a byte from *cmd (the write end, for this process). */
static void start_child_at(int *cmd, int at_port);

static void start_child(int *cmd)
{
    start_child_at(cmd, 0);
}

/* The run config text the child's rendezvous starts with (server 0's config). */
#define RUN_DATA "[data]\nrec = synthetic\nnum_classes = 4\n"
static const char *child_config = RUN_DATA "[cluster]\nservers = 2\nreplicas = 1\n";

/* start_child on port at_port (0: a free one). */
static void start_child_at(int *cmd, int at_port)
{
    int up[2], down[2];
    if (pipe(up) < 0 || pipe(down) < 0)
        DIE("pipe");
    child = fork();
    if (child < 0)
        DIE("fork");
    if (child == 0) {
        close(up[0]);
        close(down[1]);
        static const ckpt_ident expect; /* seed 0, a zero config digest: the members' (case_resume) */
        ctl_rendezvous_opts o = {.expect = &expect,
                                 .bind_host = "127.0.0.1",
                                 .port = at_port,
                                 .num_servers = 2,
                                 .num_workers = 1,
                                 .secret = SECRET,
                                 .max_frame = MAXF,
                                 .timeout_s = 8,
                                 .config_text = child_config,
                                 .replicas = 1,
                                 .rejoin = 1};
        ctl_rendezvous *rv;
        if (ctl_rendezvous_start(&o, &rv) < 0)
            _exit(3);
        int p = ctl_rendezvous_port(rv);
        if (write(up[1], &p, sizeof p) != sizeof p)
            _exit(4);
        char b;
        if (read(down[0], &b, 1) == 1)
            ctl_rendezvous_stop(rv);
        _exit(0);
    }
    close(up[1]);
    close(down[0]);
    if (read(up[0], &port, sizeof port) != sizeof port)
        DIE("the rendezvous' process did not start");
    close(up[0]);
    *cmd = down[1];
}

/* Joins server 0, server 1 and worker 0 (threads: the run forms once all three are in) into m[3]. */
static void join_all(member m[3])
{
    m[0] = (member){.role = CTL_ROLE_SERVER, .rank = 0, .addr = "fab-server-0", .timeout = 10};
    m[1] = (member){.role = CTL_ROLE_SERVER, .rank = 1, .addr = "fab-server-1", .timeout = 10};
    m[2] = (member){.role = CTL_ROLE_WORKER, .rank = 0, .addr = "fab-worker-0", .timeout = 10};
    for (int i = 0; i < 3; i++)
        pthread_create(&m[i].th, NULL, join_main, &m[i]);
    for (int i = 0; i < 3; i++) {
        pthread_join(m[i].th, NULL);
        if (m[i].rc < 0)
            DIE("member %d did not join: %s", i, pf_errmsg());
    }
}

static void close_all(member m[3])
{
    for (int i = 0; i < 3; i++)
        ctl_session_close(m[i].s);
}

/* The child exited (killed, or stopped its service); reaps it. */
static void reap(void)
{
    waitpid(child, NULL, 0);
    child = 0;
}

static void case_kill(void)
{
    int cmd;
    start_child(&cmd);
    member m[3];
    join_all(m);
    CHECK(ctl_session_survive_rendezvous_loss(m[1].s, NULL) == 0, "survive");
    CHECK(ctl_session_survive_rendezvous_loss(m[2].s, NULL) == 0, "survive");
    kill(child, SIGKILL);
    reap();
    for (int i = 1; i < 3; i++) {
        int r = ctl_session_wait_shutdown(m[i].s, 5.0);
        check(r == 2, "kill: member %d takes the close as a failover notice (wait returned %d: %s)", i, r,
              r < 0 ? pf_errmsg() : "");
        int server = -1;
        const char *text = "";
        uint32_t epoch = ctl_session_failover(m[i].s, &server, &text);
        check(epoch == 1 && server == 0, "kill: member %d: server 0 lost at epoch 1 (got %d at %u)", i, server,
              epoch);
        check(ctl_session_failover_kind(m[i].s, NULL, NULL, NULL) == CTL_FO_LOST, "kill: member %d: kind lost", i);
        check(strstr(text, "the rendezvous is lost with server 0: training goes on") != NULL &&
                  strstr(text, "shards 0, 1 now have a single copy") != NULL,
              "kill: member %d's notice text: %s", i, text);
        check(ctl_session_orphaned(m[i].s) == 1, "kill: member %d is orphaned", i);
        double lb = ctl_session_lease_base(m[i].s), now = pf_now_s();
        check(lb <= now && lb > now - 0.5, "kill: member %d keeps its lease (base %.3f, now %.3f)", i, lb, now);
        check(ctl_session_leave(m[i].s) == 0, "kill: member %d leaves without a rendezvous", i);
        check(ctl_session_rejoin_report(m[i].s, CTL_FO_REJOIN_READY, 1, 1, 0) == -ENOTCONN,
              "kill: member %d's rejoin report is refused", i);
        check(ctl_session_fail(m[i].s, "x") == -ENOTCONN, "kill: member %d's failure report is refused", i);
        double t0 = pf_now_s();
        r = ctl_session_wait_shutdown(m[i].s, 0.3);
        double dt = pf_now_s() - t0;
        check(r == 0 && dt >= 0.28 && dt < 2, "kill: member %d then waits out its timeout (%d after %.3f s)", i, r,
              dt);
    }
    int r = ctl_session_wait_shutdown(m[0].s, 5.0);
    check(r == -ECONNRESET || r == -EPIPE, "kill: server 0's own session (not surviving) gets the close (%d)", r);
    check(!ctl_session_orphaned(m[0].s), "kill: server 0's session is not orphaned");
    close_all(m);
    close(cmd);
}

static void case_both(void)
{
    int cmd;
    start_child(&cmd);
    member m[3];
    join_all(m);
    CHECK(ctl_session_survive_rendezvous_loss(m[2].s, NULL) == 0, "survive");
    ctl_session_close(m[1].s); /* server 1 lost: failed over by the rendezvous */
    m[1].s = NULL;
    int r = ctl_session_wait_shutdown(m[2].s, 5.0);
    int server = -1;
    uint32_t epoch = ctl_session_failover(m[2].s, &server, NULL);
    check(r == 2 && server == 1 && epoch == 1, "both: the worker is told server 1 failed over (%d, %d, %u)", r,
          server, epoch);
    kill(child, SIGKILL);
    reap();
    r = ctl_session_wait_shutdown(m[2].s, 5.0);
    check(r == -ECONNRESET || r == -EPIPE, "both: the close is an error for the worker (%d)", r);
    check(strstr(pf_errmsg(), "both copies of shard 0 are lost (servers 0 and 1)") &&
              strstr(pf_errmsg(), "falling back to the checkpoint re-form"),
          "both: the reason names the fallback: %s", pf_errmsg());
    check(!ctl_session_orphaned(m[2].s), "both: the worker is not orphaned");
    close_all(m);
    close(cmd);
}

static void case_stop(void)
{
    int cmd;
    start_child(&cmd);
    member m[3];
    join_all(m);
    for (int i = 0; i < 3; i++)
        CHECK(ctl_session_survive_rendezvous_loss(m[i].s, NULL) == 0, "survive");
    if (write(cmd, "s", 1) != 1)
        DIE("write");
    reap();
    for (int i = 0; i < 3; i++) {
        int r = ctl_session_wait_shutdown(m[i].s, 5.0);
        check(r == -ENOLINK && strstr(pf_errmsg(), "stopped its rendezvous without a shutdown"),
              "stop: member %d is told before its connection closes (%d: %s)", i, r, pf_errmsg());
        check(!ctl_session_orphaned(m[i].s), "stop: member %d is not orphaned", i);
    }
    close_all(m);
    close(cmd);
}

/* Reads one frame from the blocking socket fd (up to 5 s). Returns the message or NULL. */
static Pfcps__CtlMessage *raw_recv(int fd)
{
    uint8_t buf[MAXF];
    size_t n = 0, flen = 0;
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    while (ctl_frame_peek(buf, n, MAXF, &flen) == 0) {
        ssize_t r = recv(fd, buf + n, sizeof buf - n, 0);
        if (r <= 0)
            return NULL;
        n += (size_t)r;
    }
    Pfcps__CtlMessage *m = NULL;
    return ctl_msg_decode(buf + 4, flen - 4, &m) == 0 ? m : NULL;
}

/* A hand-made Resume to the rendezvous at `port` as worker `rank` of the run (run_id, nonce: 16 bytes), the
 * config digest `digest` (32 bytes), with the MAC under `secret`. Returns the refusal's code (the Error's), 0
 * when it was taken (the acknowledgement came), or -1 when nothing came; the refusal's text in why[cap]. */
static int raw_resume(int rank, const uint8_t *run_id, const uint8_t *nonce, const uint8_t *digest,
                      const char *text, const char *secret, char *why, size_t cap)
{
    why[0] = 0;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0)
        DIE("connect");
    Pfcps__CtlMessage *h = raw_recv(fd);
    if (!h || h->body_case != PFCPS__CTL_MESSAGE__BODY_HELLO)
        DIE("no hello");
    const char *addr = "fab-stranger";
    int32_t lost[1] = {0};
    uint8_t mac[32];
    if (ctl_resume_mac(secret, h->hello->nonce.data, h->hello->nonce.len, CTL_ROLE_WORKER, rank,
                       (const uint8_t *)addr, strlen(addr), run_id, nonce, digest, 1, lost, 1, text, mac) < 0)
        DIE("mac");
    pfcps__ctl_message__free_unpacked(h, NULL);
    Pfcps__Resume r = PFCPS__RESUME__INIT;
    r.role = PFCPS__ROLE__WORKER;
    r.rank = rank;
    r.fabric_addr.data = (uint8_t *)addr;
    r.fabric_addr.len = strlen(addr);
    r.mac.data = mac;
    r.mac.len = 32;
    r.protocol_version = CTL_PROTOCOL_VERSION;
    r.run_id.data = (uint8_t *)run_id;
    r.run_id.len = 16;
    r.run_nonce.data = (uint8_t *)nonce;
    r.run_nonce.len = 16;
    r.config_digest.data = (uint8_t *)digest;
    r.config_digest.len = 32;
    r.config_text = (char *)text;
    r.epoch = 1;
    r.lost_servers = lost;
    r.n_lost_servers = 1;
    Pfcps__CtlMessage m = PFCPS__CTL_MESSAGE__INIT;
    m.body_case = PFCPS__CTL_MESSAGE__BODY_RESUME;
    m.resume = &r;
    uint8_t *frame;
    size_t len;
    if (ctl_frame_encode(&m, MAXF, &frame, &len) < 0 || send(fd, frame, len, MSG_NOSIGNAL) != (ssize_t)len)
        DIE("send");
    free(frame);
    Pfcps__CtlMessage *a = raw_recv(fd);
    int rc = -1;
    if (a && a->body_case == PFCPS__CTL_MESSAGE__BODY_ERROR) {
        rc = a->error->code;
        snprintf(why, cap, "%s", a->error->message);
    } else if (a && a->body_case == PFCPS__CTL_MESSAGE__BODY_RESUME) {
        rc = 0;
    }
    if (a)
        pfcps__ctl_message__free_unpacked(a, NULL);
    close(fd);
    return rc;
}

typedef struct learner {
    pthread_t th;
    int rc;
    ctl_session *s;
} learner;

static void *learner_main(void *arg)
{
    learner *l = arg;
    const char *addr = "fab-server-0-again";
    l->rc = ctl_join("127.0.0.1", port, CTL_ROLE_SERVER, 0, addr, strlen(addr), SECRET, MAXF, 10.0, &l->s);
    return NULL;
}

/* resume: the child is killed (server 1 and the worker take it as server 0's failover, orphaned), then a new
 * rendezvous starts at the same address (server 0 restarted): both members reconnect and resume the run
 * there (acknowledged; not orphaned any more), the new rendezvous adopts it, and server 0's join is a rejoin:
 * the worker is told "rejoin begins" for server 0, says the copy step, and the learner gets its book (rejoin
 * epoch and that step). A stranger's Resume is refused naming why: a bad secret, another config, another
 * run, a rank that resumed already, a rank outside the run. */
/* Forms the run in a child (m: server 0, server 1, worker 0), lets server 1 and the worker survive the
 * rendezvous' loss (a zero config digest: they resume), kills the child and waits for both to take it as
 * server 0's failover (checked, named by `name`). Returns the child's port, at which a restarted one can
 * start. */
static int orphan_members(member m[3], uint8_t digest[32], const char *name)
{
    int cmd;
    start_child(&cmd);
    const int at = port;
    join_all(m);
    memset(digest, 0, 32);
    CHECK(ctl_session_survive_rendezvous_loss(m[1].s, digest) == 0, "survive");
    CHECK(ctl_session_survive_rendezvous_loss(m[2].s, digest) == 0, "survive");
    kill(child, SIGKILL);
    reap();
    close(cmd);
    for (int i = 1; i < 3; i++)
        check(ctl_session_wait_shutdown(m[i].s, 5.0) == 2 && ctl_session_orphaned(m[i].s),
              "%s: member %d failed server 0 over", name, i);
    return at;
}

static void case_resume(void)
{
    int cmd;
    member m[3];
    uint8_t digest[32];
    const int at = orphan_members(m, digest, "resume");
    start_child_at(&cmd, at);
    double t0 = pf_now_s();
    while (pf_now_s() - t0 < 5 && (ctl_session_orphaned(m[1].s) || ctl_session_orphaned(m[2].s)))
        for (int i = 1; i < 3; i++)
            ctl_session_wait_shutdown(m[i].s, 0.1);
    check(!ctl_session_orphaned(m[1].s) && !ctl_session_orphaned(m[2].s),
          "resume: both members reconnected to the restarted rendezvous within %.2f s", pf_now_s() - t0);
    /* Strangers: a bad secret, another config, another run, a rank that resumed already; each refused with
     * its reason while the run's members stay connected. */
    const ctl_book *book = ctl_session_book(m[2].s);
    uint8_t other[32];
    memset(other, 0x5a, sizeof other);
    char why[600];
    const char *text = book->config_text;
    int rc = raw_resume(0, book->run_id, book->run_nonce, digest, text, "not-the-secret", why, sizeof why);
    check(rc == EACCES && strstr(why, "bad secret"), "resume: a bad secret is refused (%d: %s)", rc, why);
    rc = raw_resume(0, book->run_id, book->run_nonce, other, "[cluster]\nreplicas = 1\n[train]\nlr = 0.3\n",
                    SECRET, why, sizeof why);
    check(rc == EEXIST && strstr(why, "another run config"), "resume: another config is refused (%d: %s)", rc,
          why);
    rc = raw_resume(0, other, book->run_nonce, digest, text, SECRET, why, sizeof why);
    check(rc == EEXIST && strstr(why, "another run"), "resume: another run is refused (%d: %s)", rc, why);
    rc = raw_resume(0, book->run_id, book->run_nonce, digest, text, SECRET, why, sizeof why);
    check(rc == EEXIST && strstr(why, "resumed already"), "resume: a rank that resumed is refused (%d: %s)", rc,
          why);
    rc = raw_resume(7, book->run_id, book->run_nonce, digest, text, SECRET, why, sizeof why);
    check(rc == ERANGE, "resume: a rank outside the run is refused (%d: %s)", rc, why);
    check(!ctl_session_orphaned(m[1].s) && !ctl_session_orphaned(m[2].s), "resume: the members stay connected");
    learner l = {0};
    pthread_create(&l.th, NULL, learner_main, &l);
    int kind = -1, server = -1, r = 0;
    (void)rc;
    t0 = pf_now_s();
    while (pf_now_s() - t0 < 8 && kind != CTL_FO_REJOIN_BEGIN) {
        ctl_session_wait_shutdown(m[1].s, 0.05);
        r = ctl_session_wait_shutdown(m[2].s, 0.2);
        if (r == 2) {
            ctl_session_failover(m[2].s, &server, NULL);
            kind = ctl_session_failover_kind(m[2].s, NULL, NULL, NULL);
        }
    }
    uint32_t epoch = ctl_session_failover(m[2].s, NULL, NULL);
    check(kind == CTL_FO_REJOIN_BEGIN && server == 0 && epoch >= 3,
          "resume: the worker is told server 0 rejoins (kind %d, server %d, epoch %u)", kind, server, epoch);
    CHECK(ctl_session_rejoin_report(m[2].s, CTL_FO_REJOIN_STEP, 0, epoch, 8) == 0, "copy step: %s", pf_errmsg());
    pthread_join(l.th, NULL);
    check(l.rc == 0, "resume: the restarted server 0 got its book (%d: %s)", l.rc, l.rc < 0 ? pf_errmsg() : "");
    if (l.rc == 0) {
        const ctl_book *b = ctl_session_book(l.s);
        check(b->rejoin_epoch == epoch && b->resume_step == 8 && !memcmp(b->run_id, ctl_session_book(m[2].s)->run_id, 16),
              "resume: as a learner at epoch %u from step %lld, of the run", b->rejoin_epoch,
              (long long)b->resume_step);
        ctl_session_close(l.s);
    }
    close_all(m);
    close(cmd);
    kill_child();
}

/* keys: the child is killed, then a new one starts whose own config differs from the run's in `servers`, a
 * key the rendezvous runs the run with: a Resume with the run's config is refused naming it with both values,
 * and the members are not taken (they stay orphaned). */
static void case_keys(void)
{
    int cmd;
    member m[3];
    uint8_t digest[32];
    const int at = orphan_members(m, digest, "keys");
    child_config = RUN_DATA "[cluster]\nreplicas = 1\nservers = 3\n";
    char path[] = "/tmp/pfcps-test-ctl-orphan-XXXXXX";
    int lfd = mkstemp(path);
    CHECK(lfd >= 0 && log_open_file(path) == 0, "keys: log file"); /* the child's lines too */
    close(lfd);
    start_child_at(&cmd, at);
    /* Server 0 restarted joins its own rendezvous for a new run; once a Resume is refused for the keys, that
     * join is refused too (EINVAL), so that server 0 exits naming why instead of waiting join_timeout. */
    member s0 = {.role = CTL_ROLE_SERVER, .rank = 0, .addr = "fab-server-0-again", .timeout = 10};
    pthread_create(&s0.th, NULL, join_main, &s0);
    /* The two members try to resume every second and are refused each time: each says so once, not at
     * every try (CTL_REFUSAL_LOG_S). */
    const double t0 = pf_now_s();
    while (pf_now_s() - t0 < 3.5)
        for (int i = 1; i < 3; i++)
            ctl_session_wait_shutdown(m[i].s, 0.05);
    pthread_join(s0.th, NULL);
    check(s0.rc == -EINVAL, "keys: server 0's own join is refused once the run cannot be adopted (%d)",
          s0.rc);
    if (s0.rc == 0)
        ctl_session_close(s0.s);
    const ctl_book *book = ctl_session_book(m[2].s);
    char why[600];
    int rc = raw_resume(0, book->run_id, book->run_nonce, digest, book->config_text, SECRET, why, sizeof why);
    check(rc == EEXIST && strstr(why, "keys it runs the run with") && strstr(why, "servers = 2 (3 here)"),
          "keys: a run whose servers differ from this rendezvous' is refused naming them (%d: %s)", rc, why);
    child_config = RUN_DATA "[cluster]\nservers = 2\nreplicas = 1\n";
    /* Stopped without a run: its report names the refused resumes, not members that never came. */
    CHECK(write(cmd, "x", 1) == 1, "keys: stop the child");
    reap();
    log_close_file();
    FILE *f = fopen(path, "r");
    char line[2048];
    int named = 0;
    while (f && !named && fgets(line, sizeof line, f))
        named =
            strstr(line, "the run did not form here: the running run's members tried to resume here and were "
                         "refused") &&
            strstr(line, "servers = 2 (3 here)");
    if (f)
        fclose(f);
    int said = 0, reached = 0;
    f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f)) {
        said += strstr(line, "did not take this member's resume") != NULL;
        reached += strstr(line, "again: resuming the run there") != NULL;
    }
    if (f)
        fclose(f);
    unlink(path);
    check(named, "keys: the never-formed report names the refused resumes and why");
    check(said == 2 && reached == 2,
          "keys: each member said its refused resume once in 3.5 s of tries (%d refusal lines, %d resume "
          "lines)",
          said, reached);
    close_all(m);
    close(cmd);
    kill_child();
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    atexit(kill_child);
    log_init("test", 0);
    ctl_set_replicas(1); /* the members' config: replicas = 1, as the run's (a rejoining server sends it) */
    case_kill();
    case_both();
    case_stop();
    case_resume();
    case_keys();
    return check_summary();
}
