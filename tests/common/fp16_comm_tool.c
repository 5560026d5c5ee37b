/* Runs coll_allreduce_fp16_mean (common/coll.h: torch DDP's fp16_compress_hook) over the fabric ring among W
 * forked ranks (tcp on 127.0.0.1), for tests/common/test_fp16_hook.py, which compares the result with torch's
 * own hook over gloo.
 *   fp16_comm_tool W N IN_PREFIX OUT
 * rank r reads N float32 (native byte order) from IN_PREFIX.<r>; every rank's result (N float32) is written to
 * OUT.<r>. Exit 0, 77 when the tcp provider is missing, 1 on an error (named). */
#include <stdio.h>
#include <stdlib.h>

#include "common/coll.h"
#include "common/err.h"
#include "tests/common/mp_ring.h"

typedef struct job {
    size_t n;
    const char *in, *out;
} job;

static int io(const char *prefix, int rank, float *buf, size_t n, int write)
{
    char path[4096];
    snprintf(path, sizeof path, "%s.%d", prefix, rank);
    FILE *f = fopen(path, write ? "wb" : "rb");
    size_t done = f ? (write ? fwrite(buf, 4, n, f) : fread(buf, 4, n, f)) : 0;
    if (!f || done != n || fclose(f) != 0) {
        printf("FAIL rank %d: %s %s\n", rank, write ? "writing" : "reading", path);
        return 1;
    }
    return 0;
}

static int body(mp_rank *mr, void *arg)
{
    const job *j = arg;
    float *g = malloc(j->n * sizeof *g);
    uint16_t *h = malloc(j->n * sizeof *h);
    pf_coll c;
    coll_fabric_opts o = {.chunk_bytes = 4096, .timeout_s = 20}; /* several chunks per segment */
    int rc = !g || !h || io(j->in, mr->rank, g, j->n, 0);
    if (rc == 0 && coll_fabric_create(mr->f, mr->rank, mr->world, mr->addrs, mr->lens, &o, &c) < 0) {
        printf("FAIL rank %d: coll_fabric_create: %s\n", mr->rank, pf_errmsg());
        rc = 1;
    } else if (rc == 0) {
        if (coll_allreduce_fp16_mean(&c, g, h, j->n) < 0) {
            printf("FAIL rank %d: coll_allreduce_fp16_mean: %s\n", mr->rank, pf_errmsg());
            rc = 1;
        }
        if (coll_barrier(&c) < 0)
            rc = 1;
        coll_destroy(&c);
        if (rc == 0)
            rc = io(j->out, mr->rank, g, j->n, 1);
    }
    free(g);
    free(h);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: fp16_comm_tool W N IN_PREFIX OUT\n");
        return 2;
    }
    int W = atoi(argv[1]);
    job j = {.n = (size_t)strtoull(argv[2], NULL, 10), .in = argv[3], .out = argv[4]};
    return mp_ring_run(W, body, &j, 60);
}
