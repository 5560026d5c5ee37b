/* Ring allreduce over libfabric (W processes on 127.0.0.1) against a ceiling measured in the same run:
 * twice the time of a ring allgather of the same bytes (the allreduce's data movement without its
 * arithmetic): ratio = 2 t_allgather / t_allreduce (1.0 = the reduction costs nothing).
 * Also printed, for information: the raw shift bandwidth of the same endpoints (every rank streams the same
 * number of bytes to its right neighbour with raw fab_send / fab_recv in messages of chunk_bytes, one in
 * flight each way: the ring's transfers without its headers, copies and sums). A ring allreduce moves 2
 * (W-1)/W of the buffer through each link. Usage: bench_coll [W floats chunk_bytes reps provider]   (default
 * 2 4194304 1048576 3 tcp) */
#include <signal.h>
#include <sys/prctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/coll.h"
#include "common/err.h"
#include "common/fabric.h"

static int rd(int fd, void *b, size_t n)
{
    for (size_t g = 0; g < n;) {
        ssize_t r = read(fd, (char *)b + g, n - g);
        if (r <= 0)
            return -1;
        g += (size_t)r;
    }
    return 0;
}

static int wr(int fd, const void *b, size_t n)
{
    for (size_t g = 0; g < n;) {
        ssize_t r = write(fd, (const char *)b + g, n - g);
        if (r <= 0)
            return -1;
        g += (size_t)r;
    }
    return 0;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Streams `bytes` to the right neighbour while receiving as many from the left, in messages of `msg`
 * bytes, up to `depth` of each in flight. Returns seconds or < 0. */
static double shift(fab_ctx *f, fi_addr_t right, uint8_t *sbuf, uint8_t *rbuf, fab_mr *smr, fab_mr *rmr,
                    size_t bytes, size_t msg, int depth)
{
    size_t nmsg = (bytes + msg - 1) / msg, sent = 0, recvd = 0, sdone = 0, rdone = 0;
    int ctx_s, ctx_r;
    double t0 = now();
    while (sdone < nmsg || rdone < nmsg) {
        while (recvd < nmsg && recvd - rdone < (size_t)depth) {
            size_t o = (recvd * msg) % (size_t)(depth * (int)msg);
            if (fab_recv(f, rbuf + o, msg, rmr, &ctx_r) < 0)
                return -1;
            recvd++;
        }
        while (sent < nmsg && sent - sdone < (size_t)depth) {
            size_t o = (sent * msg) % (size_t)(depth * (int)msg);
            if (fab_send(f, right, sbuf + o, msg, smr, &ctx_s) < 0)
                return -1;
            sent++;
        }
        fab_comp c[16];
        int n = fab_poll(f, c, 16);
        if (n < 0)
            return -1;
        for (int i = 0; i < n; i++) {
            if (c[i].err)
                return -1;
            if (c[i].context == &ctx_s)
                sdone++;
            else
                rdone++;
        }
        if (now() - t0 > 60)
            return -1;
    }
    return now() - t0;
}

static int child(int rank, int W, size_t count, size_t chunk, int reps, const char *prov, int up, int down)
{
    fab_ctx *f;
    if (fab_open(prov, &f) < 0) {
        fprintf(stderr, "rank %d: %s\n", rank, pf_errmsg());
        return 77;
    }
    uint8_t name[FAB_MAX_ADDR], book[8][FAB_MAX_ADDR];
    size_t nl = sizeof name, lens[8];
    const void *addrs[8];
    if (fab_getname(f, name, &nl) || wr(up, &nl, sizeof nl) || wr(up, name, nl))
        return 1;
    for (int r = 0; r < W; r++) {
        if (rd(down, &lens[r], sizeof lens[r]) || lens[r] > FAB_MAX_ADDR || rd(down, book[r], lens[r]))
            return 1;
        addrs[r] = book[r];
    }
    /* Ceiling: raw shift of the same bytes per link as the allreduce moves, in messages of the ring's
     * chunk size, one in flight each way (the ring's own pattern without headers, copies or sums). */
    size_t bytes = count * sizeof(float), msg = chunk, ring_bytes = 2 * (size_t)(W - 1) * bytes / (size_t)W;
    int depth = 1;
    uint8_t *sbuf = calloc(1, msg * depth), *rbuf = calloc(1, msg * depth);
    fab_mr smr, rmr;
    fi_addr_t right;
    if (fab_mr_reg(f, sbuf, msg * depth, FI_SEND, &smr) || fab_mr_reg(f, rbuf, msg * depth, FI_RECV, &rmr) ||
        fab_av_insert(f, addrs[(rank + 1) % W], lens[(rank + 1) % W], &right)) {
        fprintf(stderr, "rank %d: %s\n", rank, pf_errmsg());
        return 1;
    }
    double best_shift = 1e30, best_ar = 1e30;
    for (int r = 0; r < reps; r++) {
        char tok = 's';
        if (wr(up, &tok, 1) || rd(down, &tok, 1))
            return 1; /* start together */
        double t = shift(f, right, sbuf, rbuf, &smr, &rmr, ring_bytes, msg, depth);
        if (t < 0) {
            fprintf(stderr, "rank %d: shift failed: %s\n", rank, pf_errmsg());
            return 1;
        }
        if (t < best_shift)
            best_shift = t;
    }
    fab_mr_close(&smr);
    fab_mr_close(&rmr);
    pf_coll c;
    coll_fabric_opts o = {.chunk_bytes = chunk, .timeout_s = 60};
    if (coll_fabric_create(f, rank, W, addrs, lens, &o, &c) < 0) {
        fprintf(stderr, "rank %d: %s\n", rank, pf_errmsg());
        return 1;
    }
    float *a = malloc(bytes);
    /* Ceiling 2: the ring's own data movement without arithmetic: an allgather of bytes/W per rank moves
     * (W-1)/W of the buffer through each link, half of what the allreduce moves. */
    double best_ag = 1e30;
    size_t per = bytes / (size_t)W;
    uint8_t *agin = malloc(per ? per : 1);
    memset(agin, rank, per);
    for (int r = 0; r < reps; r++) {
        if (coll_barrier(&c) < 0)
            return 1;
        double t0 = now();
        if (coll_allgather(&c, agin, a, per) < 0) {
            fprintf(stderr, "rank %d: %s\n", rank, pf_errmsg());
            return 1;
        }
        double t = now() - t0;
        if (t < best_ag)
            best_ag = t;
    }
    free(agin);
    for (int r = 0; r < reps; r++) {
        for (size_t i = 0; i < count; i++)
            a[i] = (float)(i % 7);
        if (coll_barrier(&c) < 0)
            return 1;
        double t0 = now();
        if (coll_allreduce(&c, a, count, COLL_F32, COLL_SUM) < 0) {
            fprintf(stderr, "rank %d: %s\n", rank, pf_errmsg());
            return 1;
        }
        double t = now() - t0;
        if (t < best_ar)
            best_ar = t;
        if (a[count - 1] != (float)(W * ((count - 1) % 7))) {
            fprintf(stderr, "rank %d: wrong sum\n", rank);
            return 1;
        }
    }
    if (rank == 0) {
        double bw = (double)ring_bytes / best_shift, ideal = 2 * best_ag;
        printf("ring allreduce W=%d, %zu floats (%.1f MB), chunk %zu B, provider %s: %.1f ms (%.0f MB/s per "
               "link); "
               "ceiling: 2 x ring allgather of the same bytes %.1f ms; ratio ceiling/allreduce %.2f "
               "(raw fab_send shift of the same bytes: %.0f MB/s per link, %.1f ms)\n",
               W, count, bytes / 1e6, chunk, fab_provider(f), best_ar * 1e3, ring_bytes / best_ar / 1e6,
               ideal * 1e3, ideal / best_ar, bw / 1e6, best_shift * 1e3);
    }
    char tok = 'd';
    if (wr(up, &tok, 1) || rd(down, &tok, 1))
        return 1; /* close together */
    coll_destroy(&c);
    fab_close(f);
    free(a);
    free(sbuf);
    free(rbuf);
    return 0;
}

int main(int argc, char **argv)
{
    int W = argc > 1 ? atoi(argv[1]) : 2;
    size_t count = argc > 2 ? (size_t)atoll(argv[2]) : 4194304;
    size_t chunk = argc > 3 ? (size_t)atoll(argv[3]) : 1048576;
    int reps = argc > 4 ? atoi(argv[4]) : 3;
    const char *prov = argc > 5 ? argv[5] : "tcp";
    if (W < 2 || W > 8 || count < (size_t)W || reps < 1) {
        fprintf(stderr, "usage: bench_coll [W(2..8) floats chunk_bytes reps provider]\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    pid_t pid[8];
    int up[8][2], down[8][2];
    for (int r = 0; r < W; r++) {
        if (pipe(up[r]) || pipe(down[r]))
            return 1;
        pid[r] = fork();
        if (pid[r] == 0) {
            alarm(300);
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* and at once when the parent dies */
            close(up[r][0]);
            close(down[r][1]);
            int rc = child(r, W, count, chunk, reps, prov, up[r][1], down[r][0]);
            fflush(stdout);
            _exit(rc);
        }
        close(up[r][1]);
        close(down[r][0]);
    }
    int ok = 1;
    uint8_t names[8][FAB_MAX_ADDR];
    size_t lens[8];
    for (int r = 0; r < W && ok; r++)
        ok = !rd(up[r][0], &lens[r], sizeof lens[r]) && lens[r] <= FAB_MAX_ADDR &&
             !rd(up[r][0], names[r], lens[r]);
    for (int r = 0; r < W && ok; r++)
        for (int q = 0; q < W && ok; q++)
            ok = !wr(down[r][1], &lens[q], sizeof lens[q]) && !wr(down[r][1], names[q], lens[q]);
    /* reps start barriers + one close barrier */
    for (int b = 0; b < reps + 1 && ok; b++) {
        char tok;
        for (int r = 0; r < W && ok; r++)
            ok = !rd(up[r][0], &tok, 1);
        for (int r = 0; r < W && ok; r++)
            ok = !wr(down[r][1], "g", 1);
    }
    for (int r = 0; r < W; r++)
        close(up[r][0]), close(down[r][1]);
    int fail = !ok;
    for (int r = 0; r < W; r++) {
        int st;
        if (!ok)
            kill(pid[r], SIGKILL);
        waitpid(pid[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            fail = 1;
    }
    return fail;
}
