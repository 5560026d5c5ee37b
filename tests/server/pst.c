/* Multi-process test harness: see pst.h. */
#include "tests/server/pst.h"

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/member_addr.h"
#include "common/ctl.h"
#include "common/err.h"

#define SECRET "pst-secret"

static pid_t g_children[64];
static int g_nchildren;
static pid_t g_owner;
static ctl_session *g_sessions[PST_MAX];
static int g_nsessions;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

void pst_track_child(pid_t pid)
{
    if (g_nchildren < 64)
        g_children[g_nchildren++] = pid;
}

void pst_untrack_child(pid_t pid)
{
    for (int i = 0; i < g_nchildren; i++)
        if (g_children[i] == pid)
            g_children[i] = 0;
}

static void kill_all(void)
{
    if (getpid() != g_owner)
        return; /* a forked client must not kill the servers */
    for (int i = 0; i < g_nchildren; i++)
        if (g_children[i] > 0)
            kill(g_children[i], SIGKILL);
    for (int i = 0; i < g_nchildren; i++)
        if (g_children[i] > 0)
            waitpid(g_children[i], NULL, 0);
    g_nchildren = 0;
}

static void on_fatal(int sig)
{
    const char msg[] = "pst: test killed by signal/alarm; killing the servers\n";
    ssize_t r = write(2, msg, sizeof(msg) - 1);
    (void)r;
    kill_all();
    _exit(sig == SIGALRM ? 1 : 128 + sig);
}

double pst_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A TCP port of 127.0.0.1 nothing is bound to, drawn at random from below the kernel's ephemeral range (the
 * policy and its reason: tests/free_port.py; a port from bind(0) can be taken by a connection's source port
 * before the rendezvous binds it). Returns the port or -1. */
static int free_port(void)
{
    int lo = 32768, hi = 60999;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d %d", &lo, &hi) != 2)
            lo = 32768, hi = 60999;
        fclose(f);
    }
    const int first = lo > 11000 ? 10000 : hi + 1, last = lo > 11000 ? lo - 1 : 65535;
    if (first > last)
        return -1;
    unsigned seed = (unsigned)getpid() ^ (unsigned)(pst_now() * 1e6);
    for (int i = 0; i < 500; i++) {
        int port = first + (int)(rand_r(&seed) % (unsigned)(last - first + 1));
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0)
            return -1;
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                                .sin_port = htons((uint16_t)port)};
        int rc = bind(fd, (struct sockaddr *)&a, sizeof(a));
        close(fd);
        if (rc == 0)
            return port;
    }
    return -1;
}

int pst_start(pst_cluster *cl, int S, int W, int64_t C, int D, const char *extra, int seconds)
{
    memset(cl, 0, sizeof(*cl));
    cl->S = S;
    cl->W = W;
    cl->C = C;
    cl->D = D;
    g_owner = getpid();
    static int armed;
    if (!armed) {
        atexit(kill_all);
        signal(SIGTERM, on_fatal);
        signal(SIGINT, on_fatal);
        signal(SIGALRM, on_fatal);
        signal(SIGPIPE, SIG_IGN);
        armed = 1;
    }
    alarm((unsigned)seconds);
    const char *build = getenv("PFCPS_BUILD");
    char bin[512];
    snprintf(bin, sizeof(bin), "%s/server/pfcps-server", build ? build : ".");
    if (access(bin, X_OK) != 0) {
        printf("SKIP: %s not found (set PFCPS_BUILD)\n", bin);
        return 77;
    }
    cl->port = free_port();
    if (cl->port < 0) {
        printf("FAIL: no free port\n");
        return -1;
    }
    snprintf(cl->cfg_path, sizeof(cl->cfg_path), "/tmp/pst-%d-%d.ini", (int)getpid(), cl->port);
    FILE *f = fopen(cl->cfg_path, "w");
    if (!f)
        return -1;
    fprintf(f,
            "[train]\nnum_classes = %lld\nembedding_size = %d\nrec = synthetic\nsynthetic = varied\nseed = 2048\n"
            "momentum = 0.9\nweight_decay = 0.0005\n[cluster]\nservers = %d\nworkers = %d\nprovider = tcp\n"
            "rendezvous = 127.0.0.1:%d\nsecret = %s\nctl_timeout = 20\nhead_mode = "
            "local\n[server]\napply_threads = 2\non_member_loss = serve\n%s",
            (long long)C, D, S, W, cl->port, SECRET, extra ? extra : "");
    fclose(f);
    for (int s = 0; s < S; s++) {
        snprintf(cl->log_path[s], sizeof(cl->log_path[s]), "/tmp/pst-%d-%d-s%d.log", (int)getpid(), cl->port,
                 s);
        pid_t pid = fork();
        if (pid < 0)
            return -1;
        if (pid == 0) {
            FILE *lf = freopen(cl->log_path[s], "w", stderr);
            (void)lf;
            char rank[16];
            snprintf(rank, sizeof(rank), "%d", s);
            execl(bin, bin, "--config", cl->cfg_path, "--rank", rank, (char *)NULL);
            _exit(127);
        }
        cl->pids[s] = pid;
        pst_track_child(pid);
    }
    return 0;
}

void pst_dump_logs(pst_cluster *cl)
{
    for (int s = 0; s < cl->S; s++) {
        FILE *f = fopen(cl->log_path[s], "r");
        if (!f)
            continue;
        printf("--- server %d log ---\n", s);
        char line[1024];
        int n = 0;
        while (fgets(line, sizeof(line), f) && n++ < 60)
            fputs(line, stdout);
        fclose(f);
    }
}

ps_client *pst_join(pst_cluster *cl, int rank, ps_dtype dt)
{
    ps_client_opts o = {
        .provider = "tcp", .rank = rank, .servers = cl->S, .num_classes = cl->C, .dim = cl->D, .dtype = dt};
    ps_client *c = NULL;
    if (ps_client_create(&o, &c) < 0) {
        printf("FAIL: client %d: %s\n", rank, pf_errmsg());
        return NULL;
    }
    uint8_t raw[CTL_MAX_ADDR], addr[CTL_MAX_ADDR];
    size_t rlen = sizeof(raw);
    int alen = -1;
    ctl_session *sess = NULL;
    /* A worker's book entry packs its endpoint names (common/member_addr.h); part 0 is the PS one. */
    if (ps_client_getname(c, raw, &rlen) == 0) {
        const void *parts[1] = {raw};
        alen = member_addr_pack(addr, sizeof(addr), 1, parts, &rlen);
    }
    if (alen < 0 || ctl_join("127.0.0.1", cl->port, CTL_ROLE_WORKER, rank, addr, (size_t)alen, SECRET,
                             1 << 20, 20.0, &sess) < 0) {
        printf("FAIL: worker %d join: %s\n", rank, pf_errmsg());
        ps_client_destroy(c);
        return NULL;
    }
    const ctl_book *b = ctl_session_book(sess);
    uint64_t token = 0;
    if (ctl_data_token(SECRET, b->run_nonce, &token) < 0)
        return NULL;
    ps_client_set_token(c, token);
    for (int s = 0; s < cl->S && s < PST_MAX; s++) {
        cl->srv_alen[s] = b->servers[s].addr_len <= sizeof cl->srv_addr[s] ? b->servers[s].addr_len : 0;
        memcpy(cl->srv_addr[s], b->servers[s].addr, cl->srv_alen[s]);
    }
    for (int s = 0; s < cl->S; s++) {
        if (ps_client_add_server(c, s, b->servers[s].addr, b->servers[s].addr_len) < 0) {
            printf("FAIL: worker %d: %s\n", rank, pf_errmsg());
            ps_client_destroy(c);
            ctl_session_close(sess);
            return NULL;
        }
    }
    if (ps_client_warmup(c, 20.0) < 0) {
        printf("FAIL: worker %d warmup: %s\n", rank, pf_errmsg());
        ps_client_destroy(c);
        ctl_session_close(sess);
        return NULL;
    }
    pthread_mutex_lock(&g_lock);
    if (g_nsessions < PST_MAX)
        g_sessions[g_nsessions++] = sess;
    else
        ctl_session_close(sess);
    pthread_mutex_unlock(&g_lock);
    return c;
}

typedef struct join_arg {
    pst_cluster *cl;
    int rank;
    ps_dtype dt;
    ps_client *out;
} join_arg;

static void *join_thread(void *p)
{
    join_arg *a = p;
    a->out = pst_join(a->cl, a->rank, a->dt);
    return NULL;
}

int pst_join_many(pst_cluster *cl, int n, const int *ranks, ps_dtype dt, ps_client **out)
{
    pthread_t t[PST_MAX];
    join_arg a[PST_MAX];
    for (int i = 0; i < n; i++) {
        a[i] = (join_arg){cl, ranks[i], dt, NULL};
        pthread_create(&t[i], NULL, join_thread, &a[i]);
    }
    int ok = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(t[i], NULL);
        out[i] = a[i].out;
        if (!out[i])
            ok = -1;
    }
    return ok;
}

int pst_stop(pst_cluster *cl)
{
    int rc = 0;
    for (int s = 0; s < cl->S; s++)
        if (cl->pids[s] > 0)
            kill(cl->pids[s], SIGTERM);
    for (int s = 0; s < cl->S; s++) {
        if (cl->pids[s] <= 0)
            continue;
        int status = 0;
        double t0 = pst_now();
        pid_t r = 0;
        while ((r = waitpid(cl->pids[s], &status, WNOHANG)) == 0 && pst_now() - t0 < 10)
            usleep(10000);
        if (r == 0) {
            printf("FAIL: server %d did not exit within 10 s of SIGTERM\n", s);
            kill(cl->pids[s], SIGKILL);
            waitpid(cl->pids[s], NULL, 0);
            rc = -1;
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            printf("FAIL: server %d exit status %d (signal %d) after SIGTERM\n", s,
                   WIFEXITED(status) ? WEXITSTATUS(status) : -1, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
            rc = -1;
        }
        for (int i = 0; i < g_nchildren; i++)
            if (g_children[i] == cl->pids[s])
                g_children[i] = 0;
        cl->pids[s] = 0;
    }
    if (rc)
        pst_dump_logs(cl);
    for (int i = 0; i < g_nsessions; i++)
        ctl_session_close(g_sessions[i]);
    g_nsessions = 0;
    unlink(cl->cfg_path);
    for (int s = 0; s < cl->S; s++)
        unlink(cl->log_path[s]);
    return rc;
}

static inline uint64_t splitmix(uint64_t x)
{
    uint64_t z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void pst_init_row(uint64_t seed, int64_t c, int dim, double *row)
{
    uint64_t k = splitmix(splitmix(seed) ^ (uint64_t)c);
    for (int p = 0; 2 * p < dim; p++) {
        uint64_t a = splitmix(k + 2 * (uint64_t)p), b = splitmix(k + 2 * (uint64_t)p + 1);
        double u1 = ldexp((double)((a >> 11) + 1), -53), u2 = ldexp((double)(b >> 11), -53);
        double r = sqrt(-2.0 * log(u1)), th = 2.0 * M_PI * u2;
        row[2 * p] = 0.01 * r * cos(th);
        if (2 * p + 1 < dim)
            row[2 * p + 1] = 0.01 * r * sin(th);
    }
}
