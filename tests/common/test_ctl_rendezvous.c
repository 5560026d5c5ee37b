/* Rendezvous on loopback with separate member processes: 4 servers + 4 workers (the ctl_member
 * helper, forked and exec'd) join a rendezvous running in this process; every member must receive the
 * same address book, equal to the one this test writes down from the addresses it handed out. A
 * member asking for a taken rank (before and after the run formed), a rank outside the run, or with a
 * wrong secret is refused with the right code while the others complete. Then the shutdown broadcast
 * must reach every member (each exits 0).
 *
 * usage: test_ctl_rendezvous PATH/TO/ctl_member
 * Children are killed on every exit path (atexit, and a SIGALRM watchdog). */
#include "common/config.h"
#include "common/ctl.h"
#include "common/err.h"
#include "common/log.h"
#include "ctl_book_dump.h"
#include "tests/check.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define S       4
#define W       4
#define MAXKIDS 32
#define SECRET  "rendezvous-test-secret"

static pid_t kids[MAXKIDS];
static int nkids;
static char dir[256];
static const char *member_exe;
static int port;

static void kill_kids(void)
{
    for (int i = 0; i < nkids; i++)
        if (kids[i] > 0) {
            kill(kids[i], SIGKILL);
            waitpid(kids[i], NULL, 0);
            kids[i] = 0;
        }
}

static void watchdog(int sig)
{
    (void)sig;
    static const char m[] = "test_ctl_rendezvous: watchdog expired, killing members\n";
    ssize_t w = write(2, m, sizeof m - 1);
    (void)w;
    for (int i = 0; i < nkids; i++)
        if (kids[i] > 0)
            kill(kids[i], SIGKILL);
    _exit(1);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void addr_of(const char *role, int rank, char *out, size_t cap)
{
    snprintf(out, cap, "fab-%s-%d-addr", role, rank);
}

static void out_path(const char *name, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s.out", dir, name);
}

/* Starts one member; returns its index in kids[]. */
static const char *spawn_timeout = "15"; /* the members' join and shutdown-wait timeout, seconds */

static int spawn(const char *name, const char *role, int rank, const char *addr, const char *secret)
{
    char portstr[16], rankstr[16], out[512];
    snprintf(portstr, sizeof portstr, "%d", port);
    snprintf(rankstr, sizeof rankstr, "%d", rank);
    out_path(name, out, sizeof out);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        exit(1);
    }
    if (pid == 0) {
        execl(member_exe, member_exe, "127.0.0.1", portstr, role, rankstr, addr, secret, out, spawn_timeout,
              (char *)NULL);
        perror("execl");
        _exit(127);
    }
    kids[nkids] = pid;
    return nkids++;
}

/* Waits (bounded) for kid i to exit; returns its exit status, or -1 on timeout/signal. */
static int wait_kid(int i, double timeout_s)
{
    double end = now_s() + timeout_s;
    while (now_s() < end) {
        int st;
        pid_t r = waitpid(kids[i], &st, WNOHANG);
        if (r == kids[i]) {
            kids[i] = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        }
        usleep(10000);
    }
    return -1;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t cap = 0;
    ssize_t n = getdelim(&buf, &cap, '\0', f);
    fclose(f);
    if (n < 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* Runs a member that must be refused: checks its exit code and that its message mentions `want`. */
static void expect_refused(const char *name, const char *role, int rank, const char *secret, int code,
                           const char *want)
{
    char addr[64], out[512];
    addr_of(role, rank, addr, sizeof addr);
    strcat(addr, "-intruder");
    int k = spawn(name, role, rank, addr, secret);
    int st = wait_kid(k, 10.0);
    out_path(name, out, sizeof out);
    char *text = read_file(out);
    printf("%-22s exit %d (want %d): %s", name, st, code, text ? text : "(no output)\n");
    CHECK(st == code, "%s: exit %d, want %d", name, st, code);
    CHECK(text && strstr(text, want), "%s: message lacks '%s'", name, want);
    free(text);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s PATH/TO/ctl_member\n", argv[0]);
        return 2;
    }
    member_exe = argv[1];
    log_init("test", -1);
    atexit(kill_kids);
    signal(SIGALRM, watchdog);
    alarm(60);
    snprintf(dir, sizeof dir, "/tmp/pfcps-test-rv-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char log_path[300];
    snprintf(log_path, sizeof log_path, "%s/rendezvous.log", dir);
    log_open_file(log_path);

    pf_config cfg;
    const char *sets[] = {"num_classes=1000", "rec=synthetic", "servers=4", "workers=4"};
    if (cfg_load(&cfg, NULL, sets, 4) < 0) {
        fprintf(stderr, "config: %s\n", pf_errmsg());
        return 1;
    }
    char *config_text = cfg_to_ini(&cfg);
    ctl_rendezvous_opts o = {.bind_host = "127.0.0.1",
                             .port = 0,
                             .num_servers = S,
                             .num_workers = W,
                             .secret = SECRET,
                             .max_frame = 1 << 16,
                             .timeout_s = 5.0,
                             .config_text = config_text,
                             .num_classes = cfg.num_classes};
    ctl_rendezvous *rv;
    if (ctl_rendezvous_start(&o, &rv) < 0) {
        fprintf(stderr, "rendezvous: %s\n", pf_errmsg());
        return 1;
    }
    port = ctl_rendezvous_port(rv);
    printf("rendezvous on 127.0.0.1:%d\n", port);

    /* Every member but worker 3. */
    int member[S + W];
    char name[64], addr[64];
    for (int i = 0; i < S + W - 1; i++) {
        const char *role = i < S ? "server" : "worker";
        int rank = i < S ? i : i - S;
        snprintf(name, sizeof name, "%s%d", role, rank);
        addr_of(role, rank, addr, sizeof addr);
        member[i] = spawn(name, role, rank, addr, SECRET);
    }
    double end = now_s() + 15;
    while (ctl_rendezvous_joined(rv) < S + W - 1 && now_s() < end)
        usleep(10000);
    CHECK(ctl_rendezvous_joined(rv) == S + W - 1, "only %d of %d joined", ctl_rendezvous_joined(rv),
          S + W - 1);

    /* Refusals while the run is forming. */
    /* A rank whose holder is still connected: the newcomer (a restarted process whose old connection is not
     * gone yet) is asked to retry, and gives up at its timeout naming the holder. */
    spawn_timeout = "2";
    expect_refused("dup-server2", "server", 2, SECRET, ETIMEDOUT, "is still held by");
    spawn_timeout = "15";
    expect_refused("worker-out-of-range", "worker", 4, SECRET, ERANGE, "outside [0, 4)");
    expect_refused("wrong-secret", "worker", 3, "not-the-secret", EACCES, "bad secret");
    CHECK(ctl_rendezvous_joined(rv) == S + W - 1, "refused members changed the count to %d",
          ctl_rendezvous_joined(rv));

    snprintf(name, sizeof name, "worker3");
    addr_of("worker", 3, addr, sizeof addr);
    member[S + W - 1] = spawn(name, "worker", 3, addr, SECRET);

    /* The book this test expects, written from what it handed out. */
    char *want = NULL;
    size_t wlen = 0;
    FILE *wf = open_memstream(&want, &wlen);
    fprintf(wf, "servers %d workers %d classes %d\n", S, W, 1000);
    for (int i = 0; i < S + W; i++) {
        const char *role = i < S ? "server" : "worker";
        int rank = i < S ? i : i - S;
        addr_of(role, rank, addr, sizeof addr);
        book_dump_member(wf, role, rank, (const uint8_t *)addr, strlen(addr));
    }
    fprintf(wf, "config:\n%s", config_text);
    fclose(wf);

    /* Each member writes its book once it has it. */
    char *books[S + W] = {0};
    end = now_s() + 15;
    for (int i = 0; i < S + W; i++) {
        const char *role = i < S ? "server" : "worker";
        int rank = i < S ? i : i - S;
        char out[512];
        snprintf(name, sizeof name, "%s%d", role, rank);
        out_path(name, out, sizeof out);
        struct stat sb;
        while (stat(out, &sb) != 0 && now_s() < end)
            usleep(10000);
        books[i] = read_file(out);
        CHECK(books[i] != NULL, "%s wrote no book", name);
        if (books[i]) {
            CHECK(strcmp(books[i], want) == 0,
                  "%s's book differs from the expected one:\n%s\n--- want ---\n%s", name, books[i], want);
            CHECK(i == 0 || !books[0] || strcmp(books[i], books[0]) == 0, "%s's book differs from server0's",
                  name);
        }
    }
    printf("%d members received identical books (%zu bytes each, %d entries)\n", S + W, wlen, S + W);

    /* After the run formed, a join for a seat whose member is still connected changes nothing: the newcomer
     * (another process with the run's secret) is refused until its timeout and every member runs on. */
    spawn_timeout = "2";
    expect_refused("late-dup-server1", "server", 1, SECRET, ETIMEDOUT,
                   "is held by a live member of the formed run");
    for (int i = 0; i < S + W; i++) {
        int st = wait_kid(member[i], 0.2);
        CHECK(st == -1, "member %d exited %d after a join for a live member's seat (want: still running)", i,
              st);
    }
    /* Server 1 dies (kill -9): every other member is told it was lost; its restarted process's join is a
     * restarted member: asked to retry until the run re-forms (here: never), and logged. */
    kill(kids[member[1]], SIGKILL);
    wait_kid(member[1], 10.0);
    expect_refused("restarted-server1", "server", 1, SECRET, ETIMEDOUT, "the run is re-forming");
    for (int i = 0; i < S + W; i++) {
        if (i == 1)
            continue;
        int st = wait_kid(member[i], 10.0);
        CHECK(st == 3, "member %d exited %d after server 1 was lost (want 3: lost member)", i, st);
    }
    char *lg = read_file(log_path);
    CHECK(lg && strstr(lg, "joined again"), "the rendezvous did not log the restarted member");
    free(lg);
    printf("a second server[1] while server[1] lives: refused, nobody told; after server[1] died, its restarted "
           "process: every member told, the newcomer retried\n");
    ctl_rendezvous_stop(rv);

    for (int i = 0; i < S + W; i++)
        free(books[i]);
    free(want);
    free(config_text);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    printf("%s: %d failures\n", argv[0], fails);
    return fails ? 1 : 0;
}
