/* Multi-process scaffolding for ring-collective tests: forks W ranks on 127.0.0.1, each opens a
 * libfabric endpoint ("tcp"), the parent passes the endpoint names around through pipes, each rank
 * runs `body`, then all ranks meet at the parent before closing their endpoints (a send to a closed
 * peer would spin inside fi_send). The parent kills every child that is not done within timeout_s.
 * Returns 0 (all ranks exited 0), 77 (the provider is missing: SKIP) or 1. Header-only, for tests. */
#ifndef PFCPS_TESTS_COMMON_MP_RING_H
#define PFCPS_TESTS_COMMON_MP_RING_H

#include <signal.h>
#include <sys/prctl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/coll.h"
#include "common/err.h"
#include "common/fabric.h"

#define MP_MAXW 8

typedef struct mp_rank {
    int rank, world;
    fab_ctx *f;
    const void *addrs[MP_MAXW];
    size_t lens[MP_MAXW];
    uint8_t book[MP_MAXW][FAB_MAX_ADDR];
} mp_rank;

static int mp_read(int fd, void *buf, size_t n)
{
    for (size_t got = 0; got < n;) {
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

static int mp_write(int fd, const void *buf, size_t n)
{
    for (size_t put = 0; put < n;) {
        ssize_t r = write(fd, (const char *)buf + put, n - put);
        if (r <= 0)
            return -1;
        put += (size_t)r;
    }
    return 0;
}

static int mp_child(int rank, int W, int up, int down, int (*body)(mp_rank *, void *), void *arg)
{
    mp_rank m;
    memset(&m, 0, sizeof m);
    m.rank = rank;
    m.world = W;
    int rc = fab_open("tcp", &m.f);
    if (rc == -ENODATA) {
        printf("SKIP rank %d: %s\n", rank, pf_errmsg());
        return 77;
    }
    if (rc) {
        printf("FAIL rank %d: fab_open: %s\n", rank, pf_errmsg());
        return 1;
    }
    uint8_t name[FAB_MAX_ADDR];
    size_t nl = sizeof name;
    if (fab_getname(m.f, name, &nl) || mp_write(up, &nl, sizeof nl) || mp_write(up, name, nl)) {
        printf("FAIL rank %d: publishing the address: %s\n", rank, pf_errmsg());
        return 1;
    }
    for (int r = 0; r < W; r++) {
        if (mp_read(down, &m.lens[r], sizeof m.lens[r]) || m.lens[r] > FAB_MAX_ADDR ||
            mp_read(down, m.book[r], m.lens[r])) {
            printf("FAIL rank %d: reading the address book\n", rank);
            return 1;
        }
        m.addrs[r] = m.book[r];
    }
    int result = body(&m, arg);
    char tok = 'd';
    if (mp_write(up, &tok, 1) || mp_read(down, &tok, 1)) {
        printf("FAIL rank %d: close barrier with the parent\n", rank);
        result = result ? result : 1;
    }
    fab_close(m.f);
    fflush(stdout);
    return result;
}

static int mp_ring_run(int W, int (*body)(mp_rank *, void *), void *arg, double timeout_s)
{
    if (W < 1 || W > MP_MAXW)
        return 1;
    signal(SIGPIPE, SIG_IGN); /* a child that died early must not kill the parent through its pipe */
    fflush(stdout);
    pid_t pids[MP_MAXW] = {0};
    int up[MP_MAXW][2], down[MP_MAXW][2];
    for (int r = 0; r < W; r++) {
        if (pipe(up[r]) || pipe(down[r]))
            return 1;
        pid_t p = fork();
        if (p == 0) {
            alarm((unsigned)timeout_s + 5);   /* a stuck child dies even if the parent is gone */
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* and at once when the parent dies */
            close(up[r][0]);
            close(down[r][1]);
            int rc = mp_child(r, W, up[r][1], down[r][0], body, arg);
            fflush(stdout);
            _exit(rc);
        }
        pids[r] = p;
        close(up[r][1]);
        close(down[r][0]);
    }
    int ok = 1;
    uint8_t names[MP_MAXW][FAB_MAX_ADDR];
    size_t lens[MP_MAXW];
    for (int r = 0; r < W && ok; r++)
        ok = !mp_read(up[r][0], &lens[r], sizeof lens[r]) && lens[r] <= FAB_MAX_ADDR &&
             !mp_read(up[r][0], names[r], lens[r]);
    for (int r = 0; r < W && ok; r++)
        for (int q = 0; q < W && ok; q++)
            ok = !mp_write(down[r][1], &lens[q], sizeof lens[q]) && !mp_write(down[r][1], names[q], lens[q]);
    /* Close barrier: every rank reports it is done with its endpoint, then all may close. */
    char tok;
    for (int r = 0; r < W && ok; r++)
        ok = !mp_read(up[r][0], &tok, 1);
    for (int r = 0; r < W && ok; r++)
        ok = !mp_write(down[r][1], "g", 1);
    for (int r = 0; r < W; r++) {
        close(up[r][0]);
        close(down[r][1]);
    }
    int status[MP_MAXW] = {0}, done[MP_MAXW] = {0}, ndone = 0;
    for (long it = 0; it < (long)(timeout_s * 100) && ndone < W; it++) {
        for (int r = 0; r < W; r++)
            if (!done[r] && waitpid(pids[r], &status[r], WNOHANG) == pids[r])
                done[r] = 1, ndone++;
        if (ndone < W)
            usleep(10000);
    }
    int fail = 0, skip = 0;
    for (int r = 0; r < W; r++) {
        if (!done[r]) {
            kill(pids[r], SIGKILL);
            waitpid(pids[r], &status[r], 0);
            printf("FAIL W=%d rank %d did not finish in %.0f s (killed)\n", W, r, timeout_s);
            fail = 1;
            continue;
        }
        int code = WIFEXITED(status[r]) ? WEXITSTATUS(status[r]) : 128 + WTERMSIG(status[r]);
        if (code == 77)
            skip = 1;
        else if (code != 0) {
            printf("FAIL W=%d rank %d exited %d\n", W, r, code);
            fail = 1;
        }
    }
    return fail ? 1 : (skip ? 77 : 0);
}

#endif
