/* Unit tests of common/fabric: two endpoints in one process (tcp;ofi_rxm, and shm when available):
 * send/recv, RMA write and read through fab_mr_remote, truncated receive reported as an error completion,
 * bad provider / bad address errors, fab_wait's sleep and wake-ups. Prints the mr_mode bits each provider
 * asked for. */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/fabric.h"

#include "tests/check.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Endpoint b is progressed by its own thread (as a server's progress thread would), which keeps its
 * completions; endpoint a is polled by the test thread. A single thread posting on a while nobody
 * progresses b would wait forever for the connection. */
static fab_ctx *g_b, *g_a;
static fab_comp g_bc[256];
static int g_nbc;
static volatile int g_quit;
static pthread_mutex_t g_m = PTHREAD_MUTEX_INITIALIZER;

static void *b_progress(void *arg)
{
    (void)arg;
    while (!g_quit) {
        fab_comp c[8];
        int n = fab_poll(g_b, c, 8);
        pthread_mutex_lock(&g_m);
        for (int i = 0; i < n && g_nbc < 256; i++)
            g_bc[g_nbc++] = c[i];
        pthread_mutex_unlock(&g_m);
    }
    return NULL;
}

/* Completions of a seen while waiting for something else. */
static fab_comp g_ac[256];
static int g_nac;

/* Waits (5 s bound) for the completion carrying ctx: on b from its thread's stash, on a by polling; a is
 * polled in both cases (some shm protocols need the sender's progress to complete the receive). */
static int wait_ctx(fab_ctx *who, void *ctx, fab_comp *out)
{
    double t0 = now();
    while (now() - t0 < 5) {
        fab_comp c[8];
        int n = g_nac < 248 ? fab_poll(g_a, c, 8) : 0;
        for (int i = 0; i < n; i++)
            g_ac[g_nac++] = c[i];
        fab_comp *st = who == g_b ? g_bc : g_ac;
        int *nst = who == g_b ? &g_nbc : &g_nac;
        pthread_mutex_lock(&g_m);
        for (int i = 0; i < *nst; i++)
            if (st[i].context == ctx) {
                *out = st[i];
                st[i] = st[--*nst];
                pthread_mutex_unlock(&g_m);
                return 0;
            }
        pthread_mutex_unlock(&g_m);
    }
    return -1;
}

static double thread_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A send b -> a posted from its own thread 50 ms after start: the test thread is then asleep in fab_wait on
 * a, which also progresses a (the connection's handshake needs both ends). */
typedef struct {
    fab_ctx *b;
    fi_addr_t to_a;
    uint8_t *buf;
    fab_mr *mr;
    int ctx, rc;
} send_later_args;

static void *send_later(void *arg)
{
    send_later_args *s = arg;
    usleep(50000);
    s->rc = fab_send(s->b, s->to_a, s->buf, 100, s->mr, &s->ctx);
    return NULL;
}

static void *wake_later(void *arg)
{
    usleep(50000);
    fab_wake(arg);
    return NULL;
}

/* fab_wait on a (b is progressed by its thread): with nothing coming it sleeps the whole timeout without
 * spinning (the thread's CPU time stays a small part of the wall time), fab_wake from another thread ends
 * the sleep early, and a message sent by b ends it with its completion. Providers without a wait object
 * (fab_can_wait false) must return at once instead. */
static void wait_checks(const char *prov, fab_ctx *a, fab_ctx *b, fi_addr_t to_a, uint8_t *sa, fab_mr *ma,
                        uint8_t *rb, fab_mr *mb)
{
    fab_comp c[8];
    int can = fab_can_wait(a);
    printf("%s: completion queue %s\n", prov, can ? "has a wait object (fab_wait sleeps)" : "is polled only");
    if (!strcmp(prov, "tcp")) {
        CHECK(can, "tcp;ofi_rxm of libfabric 1.17 offers a wait object; fab_open did not get one");
        /* PFCPS_FABRIC_WAIT=0 turns it off: that CQ is polled only */
        fab_ctx *off = NULL;
        setenv("PFCPS_FABRIC_WAIT", "0", 1);
        int rc = fab_open(prov, &off);
        unsetenv("PFCPS_FABRIC_WAIT");
        CHECK(rc == 0 && !fab_can_wait(off), "with PFCPS_FABRIC_WAIT=0: open %d, wait object %d", rc,
              off ? fab_can_wait(off) : -1);
        printf("%s: with PFCPS_FABRIC_WAIT=0 the completion queue %s\n", prov,
               off && fab_can_wait(off) ? "has a wait object" : "is polled only");
        if (off)
            fab_close(off);
    }
    double t0 = now(), c0 = thread_cpu();
    int n = fab_wait(a, c, 8, 300);
    double wall = now() - t0, cpu = thread_cpu() - c0;
    printf("%s: fab_wait(300 ms) with nothing coming: %d after %.3f s wall, %.3f s CPU\n", prov, n, wall,
           cpu);
    CHECK(n == 0, "a completion from nowhere (%d)", n);
    if (can)
        CHECK(wall >= 0.25 && wall < 2 && cpu < 0.1 * wall, "did not sleep: %.3f s wall, %.3f s CPU", wall,
              cpu);
    else
        CHECK(wall < 0.1, "no wait object, yet fab_wait took %.3f s", wall);
    if (!can)
        return;
    pthread_t w;
    t0 = now();
    pthread_create(&w, NULL, wake_later, a);
    n = fab_wait(a, c, 8, 5000);
    wall = now() - t0;
    pthread_join(w, NULL);
    printf("%s: fab_wait(5 s) woken by fab_wake 50 ms later: %d after %.3f s\n", prov, n, wall);
    CHECK(n == 0 && wall >= 0.04 && wall < 1, "fab_wake did not end the wait (%d after %.3f s)", n, wall);
    int ctx_r;
    CHECK(fab_recv(a, sa, 4096, ma, &ctx_r) == 0, "recv on a: %s", pf_errmsg());
    memset(rb, 0x77, 100);
    send_later_args sl = {.b = b, .to_a = to_a, .buf = rb, .mr = mb, .rc = 1};
    t0 = now();
    pthread_create(&w, NULL, send_later, &sl);
    int seen = 0;
    while (!seen && now() - t0 < 5) {
        n = fab_wait(a, c, 8, 5000);
        for (int i = 0; i < n; i++)
            if (c[i].context == &ctx_r && c[i].err == 0 && c[i].len == 100 && sa[99] == 0x77)
                seen = 1;
    }
    wall = now() - t0;
    pthread_join(w, NULL);
    printf("%s: fab_wait(5 s) ended by a 100-byte message sent 50 ms in, after %.4f s\n", prov, wall);
    CHECK(sl.rc == 0, "send b -> a: %s", pf_errmsg());
    CHECK(seen && wall >= 0.04 && wall < 1, "the message did not end the wait (%.3f s)", wall);
    fab_comp sc;
    CHECK(wait_ctx(b, &sl.ctx, &sc) == 0 && sc.err == 0, "send completion on b");
}

/* fab_addr_host on the endpoint names na, nb of two endpoints of this process: the same host, an IPv4
 * address for tcp (on loopback: 127.0.0.1), "local" for shm; a hand-made sockaddr_in of 10.1.2.3 gives
 * "10.1.2.3" on tcp, and a name cut short is refused. */
static void host_checks(const char *prov, fab_ctx *a, const uint8_t *na, size_t la, const uint8_t *nb,
                        size_t lb)
{
    char ha[64] = "", hb[64] = "";
    int ra = fab_addr_host(a, na, la, ha, sizeof ha), rb = fab_addr_host(a, nb, lb, hb, sizeof hb);
    printf("%s: endpoint hosts '%s' (%d), '%s' (%d)\n", prov, ha, ra, hb, rb);
    CHECK(ra == 0 && rb == 0 && !strcmp(ha, hb), "two endpoints of one process on different hosts");
    if (!strcmp(prov, "shm")) {
        CHECK(!strcmp(ha, "local"), "shm host '%s', expected 'local'", ha);
        return;
    }
    struct in_addr ip;
    CHECK(inet_pton(AF_INET, ha, &ip) == 1, "tcp host '%s' is not an IPv4 address", ha);
    /* the endpoint's own address: one of this machine's interfaces, not the wildcard */
    struct ifaddrs *ifs = NULL, *i;
    int mine = 0;
    CHECK(getifaddrs(&ifs) == 0, "getifaddrs");
    for (i = ifs; i; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
            ((struct sockaddr_in *)(void *)i->ifa_addr)->sin_addr.s_addr == ip.s_addr)
            mine = 1;
    freeifaddrs(ifs);
    CHECK(mine, "tcp host '%s' is not an address of this machine's interfaces", ha);
    struct sockaddr_in other = {.sin_family = AF_INET, .sin_port = htons(4242)};
    inet_pton(AF_INET, "10.1.2.3", &other.sin_addr);
    char ho[64] = "";
    int ro = fab_addr_host(a, &other, sizeof other, ho, sizeof ho);
    CHECK(ro == 0 && !strcmp(ho, "10.1.2.3"), "sockaddr_in of 10.1.2.3: %d '%s'", ro, ho);
    CHECK(fab_addr_host(a, na, 3, ho, sizeof ho) == -EINVAL, "a 3-byte name accepted");
}

static void run(const char *prov)
{
    fab_ctx *a = NULL, *b = NULL;
    int rc = fab_open(prov, &a);
    if (rc == -ENODATA) {
        printf("%s: not available here (%s), skipped\n", prov, pf_errmsg());
        return;
    }
    CHECK(rc == 0, "%s open a: %s", prov, pf_errmsg());
    CHECK(fab_open(prov, &b) == 0, "%s open b: %s", prov, pf_errmsg());
    if (!a || !b)
        return;
    char modes[256];
    fab_mr_mode_str(fab_mr_mode(a), modes, sizeof(modes));
    printf("%s: provider %s, mr_mode %s\n", prov, fab_provider(a), modes);
    uint8_t na[FAB_MAX_ADDR], nb[FAB_MAX_ADDR];
    size_t la = sizeof(na), lb = sizeof(nb);
    fi_addr_t to_b, to_a;
    CHECK(fab_getname(a, na, &la) == 0 && fab_getname(b, nb, &lb) == 0, "getname");
    CHECK(fab_av_insert(a, nb, lb, &to_b) == 0 && fab_av_insert(b, na, la, &to_a) == 0, "av insert: %s",
          pf_errmsg());
    host_checks(prov, a, na, la, nb, lb);
    g_b = b;
    g_a = a;
    g_nac = 0;
    g_quit = 0;
    g_nbc = 0;
    pthread_t th;
    pthread_create(&th, NULL, b_progress, NULL);

    enum { N = 1 << 16 };
    uint8_t *sa = aligned_alloc(4096, N), *rb = aligned_alloc(4096, N);
    for (int i = 0; i < N; i++)
        sa[i] = (uint8_t)(i * 7 + 3), rb[i] = 0;
    fab_mr ma, mb;
    CHECK(fab_mr_reg(a, sa, N, FI_SEND | FI_RECV | FI_READ | FI_WRITE, &ma) == 0, "reg a: %s", pf_errmsg());
    CHECK(fab_mr_reg(b, rb, N, FI_SEND | FI_RECV | FI_REMOTE_READ | FI_REMOTE_WRITE, &mb) == 0, "reg b: %s",
          pf_errmsg());
    int ctx_s, ctx_r;
    fab_comp c;
    /* Message: 1000 bytes a -> b. */
    CHECK(fab_recv(b, rb, N, &mb, &ctx_r) == 0, "recv: %s", pf_errmsg());
    CHECK(fab_send(a, to_b, sa, 1000, &ma, &ctx_s) == 0, "send: %s", pf_errmsg());
    CHECK(wait_ctx(b, &ctx_r, &c) == 0 && c.err == 0 && c.len == 1000, "recv completion (err %d len %zu)",
          c.err, c.len);
    CHECK(!memcmp(rb, sa, 1000), "message payload differs");
    CHECK(wait_ctx(a, &ctx_s, &c) == 0 && c.err == 0, "send completion");
    /* RMA write of 40000 bytes into b at offset 1024, then read back 40000 bytes into a's buffer at 20000. */
    uint64_t raddr, rkey;
    fab_mr_remote(&mb, 1024, &raddr, &rkey);
    memset(rb, 0, N);
    CHECK(fab_write(a, to_b, sa, 40000, &ma, raddr, rkey, &ctx_s) == 0, "write: %s", pf_errmsg());
    CHECK(wait_ctx(a, &ctx_s, &c) == 0 && c.err == 0, "write completion err %d", c.err);
    CHECK(!memcmp(rb + 1024, sa, 40000) && rb[1023] == 0, "RMA write landed wrong");
    for (int i = 0; i < 40000; i++)
        rb[1024 + i] ^= 0x5a;
    CHECK(fab_read(a, to_b, sa + 20000, 40000, &ma, raddr, rkey, &ctx_s) == 0, "read: %s", pf_errmsg());
    CHECK(wait_ctx(a, &ctx_s, &c) == 0 && c.err == 0, "read completion err %d", c.err);
    CHECK(!memcmp(sa + 20000, rb + 1024, 40000), "RMA read returned wrong bytes");
    /* A message longer than the posted buffer: error completion on the receiver, not a crash. */
    CHECK(fab_recv(b, rb, 16, &mb, &ctx_r) == 0, "recv small");
    CHECK(fab_send(a, to_b, sa, 4000, &ma, &ctx_s) == 0, "send big");
    int got = wait_ctx(b, &ctx_r, &c);
    printf("%s: 4000-byte message into a 16-byte receive -> got %d err %d (%s)\n", prov, got, c.err,
           c.err ? fi_strerror(-c.err) : "none");
    CHECK(got == 0 && c.err != 0, "truncation not reported");
    wait_ctx(a, &ctx_s, &c);
    wait_checks(prov, a, b, to_a, sa, &ma, rb, &mb);
    g_quit = 1;
    pthread_join(th, NULL);
    fab_mr_close(&ma);
    fab_mr_close(&mb);
    fab_close(a);
    fab_close(b);
    free(sa);
    free(rb);
    printf("%s: send/recv, RMA write, RMA read OK\n", prov);
}

/* A stale shm region named after this pid (left by a killed earlier process that had the same pid) before the
 * process's first shm endpoint: fab_open removes it and opens (libfabric alone fails fi_enable with EBUSY). */
static void stale_shm_region(void)
{
    char path[64];
    snprintf(path, sizeof path, "/dev/shm/%ld:0:0", (long)getpid());
    FILE *fp = fopen(path, "w");
    if (!fp) {
        printf("skip stale shm region: cannot create %s\n", path);
        return;
    }
    fputs("stale", fp);
    fclose(fp);
    fab_ctx *f = NULL;
    int rc = fab_open("shm", &f);
    CHECK(rc == 0, "shm endpoint with a stale region of this pid: %s", rc ? pf_errmsg() : "");
    if (rc == 0)
        fab_close(f);
    CHECK(access(path, F_OK) != 0 || rc != 0, "the stale region %s is still there", path);
    printf("%s shm endpoint over a stale region of this pid: %s\n", rc == 0 ? "ok  " : "FAIL",
           rc == 0 ? "opened" : pf_errmsg());
    unlink(path);
}

int main(void)
{
    unsetenv("PFCPS_FABRIC_WAIT"); /* the default: a wait object where the provider has one */
    setvbuf(stdout, NULL, _IOLBF, 0);
    stale_shm_region(); /* before any other shm endpoint of this process */
    run("tcp");
    run("shm");
    fab_ctx *f = NULL;
    int rc = fab_open("nope", &f);
    printf("provider 'nope' -> %d: %s\n", rc, pf_errmsg());
    CHECK(rc == -EINVAL && strstr(pf_errmsg(), "nope"), "unknown provider");
    rc = fab_open("verbs", &f);
    printf("provider 'verbs' -> %d: %s\n", rc, rc ? pf_errmsg() : "opened");
    CHECK(rc == -ENODATA || rc == 0, "verbs should be -ENODATA without InfiniBand");
    if (rc == 0)
        fab_close(f);
    if (fab_open("tcp", &f) == 0) {
        fi_addr_t x;
        uint8_t junk[4] = {1, 2, 3, 4};
        rc = fab_av_insert(f, junk, 0, &x);
        CHECK(rc == -EINVAL, "empty address accepted");
        fab_close(f);
    }
    printf(fails ? "FAILED (%d)\n" : "PASS\n", fails);
    return fails ? 1 : 0;
}
