/* ps_bench: parameter-server pull and push throughput against a memcpy-gather ceiling measured in the
 * same run.
 *
 *   ps_bench [--provider tcp|shm] [--servers S] [--clients W] [--rows R] [--dim D] [--dtype fp32|fp16|bf16]
 *            [--classes C] [--iters N] [--rounds K] [--head-mode local|global]
 *
 * Servers (ps_server, each with its progress + apply threads) and clients (one thread each) run in this
 * process over the chosen libfabric provider. Each client does N pulls of R random rows (step 0), then N
 * pushes of R random rows (steps 0..N-1; max_staleness is set high so clients do not wait for each other;
 * local head mode sums each step's W pushes before applying, global mode applies each push on arrival).
 * Ceiling: one core gathering the same number of random fp32 rows from a C x D host table with memcpy.
 * K rounds of (ceiling, pull, push) are interleaved; the best and median of each are printed with
 * rows/s, GB/s (wire bytes) and ratio = achieved rows/s / ceiling rows/s. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "common/fabric.h"
#include "worker/ps_client.h"
#include "server/ps_server.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

typedef struct bench_arg {
    ps_client *c;
    int rank, rows, dim, iters, push, step0;
    int64_t classes;
    int rc;
} bench_arg;

static void *client_main(void *p)
{
    bench_arg *a = p;
    int64_t *ids = malloc(sizeof(int64_t) * a->rows);
    float *buf = malloc(sizeof(float) * (size_t)a->rows * a->dim);
    for (size_t i = 0; i < (size_t)a->rows * a->dim; i++)
        buf[i] = 1e-6f;
    for (int it = 0; it < a->iters && !a->rc; it++) {
        for (int i = 0; i < a->rows; i++)
            ids[i] = (int64_t)(mix(((uint64_t)a->rank << 48) ^ ((uint64_t)it << 24) ^ (uint64_t)i ^
                                   (a->push ? 1ull << 62 : 0)) %
                               (uint64_t)a->classes);
        ps_req *r;
        a->rc = a->push ? ps_push(a->c, ids, a->rows, buf, 0.01f, a->step0 + it, &r)
                        : ps_pull(a->c, ids, a->rows, buf, 0, &r);
        if (!a->rc)
            a->rc = ps_wait(a->c, r, 60);
        if (a->rc)
            fprintf(stderr, "client %d: %s\n", a->rank, pf_errmsg());
    }
    free(ids);
    free(buf);
    return NULL;
}

static double run_phase(ps_client **cl, int W, int rows, int dim, int iters, int64_t C, int push, int step0)
{
    pthread_t th[64];
    bench_arg a[64];
    double t0 = now();
    for (int w = 0; w < W; w++) {
        a[w] = (bench_arg){cl[w], w, rows, dim, iters, push, step0, C, 0};
        pthread_create(&th[w], NULL, client_main, &a[w]);
    }
    int bad = 0;
    for (int w = 0; w < W; w++) {
        pthread_join(th[w], NULL);
        bad |= a[w].rc;
    }
    double dt = now() - t0;
    return bad ? -1 : dt;
}

int main(int argc, char **argv)
{
    const char *prov = "tcp", *dts = "fp32";
    int S = 2, W = 2, R = 4096, D = 128, N = 10, rounds = 5, global = 0;
    int64_t C = 262144;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--provider"))
            prov = argv[i + 1];
        else if (!strcmp(argv[i], "--servers"))
            S = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--clients"))
            W = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rows"))
            R = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dim"))
            D = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dtype"))
            dts = argv[i + 1];
        else if (!strcmp(argv[i], "--classes"))
            C = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--iters"))
            N = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--head-mode"))
            global = !strcmp(argv[i + 1], "global");
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    ps_dtype dt = !strcmp(dts, "fp16") ? PS_DT_FP16 : !strcmp(dts, "bf16") ? PS_DT_BF16 : PS_DT_FP32;
    if (S < 1 || S > 64 || W < 1 || W > 64 || R < 1 || D < 1 || C < S || N < 1) {
        fprintf(stderr, "bad sizes\n");
        return 2;
    }
    ps_server *srv[64];
    ps_client *cl[64];
    for (int s = 0; s < S; s++) {
        ps_server_opts o = {.provider = prov,
                            .rank = s,
                            .servers = S,
                            .workers = W,
                            .dim = D,
                            .num_classes = C,
                            .seed = 1,
                            .momentum = 0.9,
                            .weight_decay = 5e-4,
                            .max_staleness = 1 << 30,
                            .apply_threads = 1,
                            .prefault = 1,
                            .global_mode = global};
        if (ps_server_create(&o, &srv[s]) < 0) {
            fprintf(stderr, "server %d: %s\n", s, pf_errmsg());
            return 1;
        }
    }
    for (int w = 0; w < W; w++) {
        ps_client_opts o = {
            .provider = prov, .rank = w, .servers = S, .num_classes = C, .dim = D, .dtype = dt};
        if (ps_client_create(&o, &cl[w]) < 0) {
            fprintf(stderr, "client %d: %s\n", w, pf_errmsg());
            return 1;
        }
    }
    for (int s = 0; s < S; s++)
        for (int w = 0; w < W; w++) {
            uint8_t a[FAB_MAX_ADDR], b[FAB_MAX_ADDR];
            size_t la = sizeof(a), lb = sizeof(b);
            if (ps_server_getname(srv[s], a, &la) || ps_client_getname(cl[w], b, &lb) ||
                ps_server_add_worker(srv[s], w, b, lb) || ps_client_add_server(cl[w], s, a, la)) {
                fprintf(stderr, "address exchange: %s\n", pf_errmsg());
                return 1;
            }
        }
    for (int s = 0; s < S; s++)
        if (ps_server_start(srv[s]) < 0)
            return 1;
    for (int w = 0; w < W; w++)
        if (ps_client_warmup(cl[w], 30) < 0) {
            fprintf(stderr, "warmup: %s\n", pf_errmsg());
            return 1;
        }
    /* Generate every row once (rows are generated on first access) so the timed pulls only gather. */
    {
        int64_t chunk = 65536;
        int64_t *ids = malloc(sizeof(int64_t) * chunk);
        float *out = malloc(sizeof(float) * chunk * D);
        for (int64_t lo = 0; lo < C; lo += chunk) {
            int64_t n = C - lo < chunk ? C - lo : chunk;
            for (int64_t i = 0; i < n; i++)
                ids[i] = lo + i;
            ps_req *r;
            if (ps_pull(cl[0], ids, (size_t)n, out, 0, &r) || ps_wait(cl[0], r, 120)) {
                fprintf(stderr, "warm pull: %s\n", pf_errmsg());
                return 1;
            }
        }
        free(ids);
        free(out);
    }
    char modes[256];
    fab_ctx *probe;
    if (fab_open(prov, &probe) == 0) {
        fab_mr_mode_str(fab_mr_mode(probe), modes, sizeof(modes));
        printf("provider %s, mr_mode %s\n", fab_provider(probe), modes);
        fab_close(probe);
    }
    /* The box may be shared: interleave `rounds` rounds of (ceiling, pull, push) and report the best rate
     * of each (and the median), so a burst of foreign load hits all three alike. */
    double total_rows = (double)W * N * R, wire = (double)D * ps_dtype_size(dt);
    float *table = malloc(sizeof(float) * (size_t)C * D), *dst = malloc(sizeof(float) * (size_t)R * D);
    for (size_t i = 0; i < (size_t)C * D; i++)
        table[i] = (float)i;
    int64_t *idx = malloc(sizeof(int64_t) * R);
    double rc_[3][64];
    if (rounds < 1)
        rounds = 1;
    if (rounds > 64)
        rounds = 64;
    for (int k = 0; k < rounds; k++) {
        /* Ceiling: one core, memcpy-gather of the same number of random fp32 rows from a C x D table. */
        double t0 = now();
        long reps = (long)W * N;
        for (long it = 0; it < reps; it++) {
            for (int i = 0; i < R; i++)
                idx[i] = (int64_t)(mix(((uint64_t)(it + k * reps) << 24) ^ (uint64_t)i ^ 0x77) % (uint64_t)C);
            for (int i = 0; i < R; i++)
                memcpy(dst + (size_t)i * D, table + (size_t)idx[i] * D, sizeof(float) * D);
            __asm__ volatile("" : : "r"(dst) : "memory");
        }
        rc_[0][k] = total_rows / (now() - t0);
        double t_pull = run_phase(cl, W, R, D, N, C, 0, 0);
        double t_push = run_phase(cl, W, R, D, N, C, 1, k * N);
        if (t_pull < 0 || t_push < 0)
            return 1;
        rc_[1][k] = total_rows / t_pull;
        rc_[2][k] = total_rows / t_push;
    }
    double best[3], med[3];
    for (int m = 0; m < 3; m++) {
        double v[64];
        memcpy(v, rc_[m], sizeof(double) * rounds);
        for (int i = 0; i < rounds; i++) /* insertion sort, tiny */
            for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
                double t = v[j];
                v[j] = v[j - 1];
                v[j - 1] = t;
            }
        best[m] = v[rounds - 1];
        med[m] = v[rounds / 2];
    }
    printf("config: provider=%s servers=%d clients=%d rows/request=%d D=%d dtype=%s classes=%lld iters=%d "
           "rounds=%d "
           "head_mode=%s\n",
           prov, S, W, R, D, dts, (long long)C, N, rounds, global ? "global" : "local");
    printf("ceiling (memcpy gather, 1 core): best %.3g rows/s (%.2f GB/s fp32), median %.3g\n", best[0],
           best[0] * D * 4 / 1e9, med[0]);
    printf("pull: best %.3g rows/s, %.2f GB/s on the wire, median %.3g; ratio = %.3f (median %.3f)\n",
           best[1], best[1] * wire / 1e9, med[1], best[1] / best[0], med[1] / med[0]);
    printf("push: best %.3g rows/s, %.2f GB/s on the wire, median %.3g; ratio = %.3f (median %.3f)\n",
           best[2], best[2] * wire / 1e9, med[2], best[2] / best[0], med[2] / med[0]);
    for (int w = 0; w < W; w++)
        ps_client_destroy(cl[w]);
    for (int s = 0; s < S; s++)
        ps_server_destroy(srv[s]);
    free(table), free(dst), free(idx);
    return 0;
}
