/* Backbone throughput on the CPU device: forward (training mode) + backward, samples/s.
 * Usage: bench_backbone NETWORK BATCH [ITERS [WARMUP]] (defaults 3 timed steps after 1 warm-up
 * step; threads from OMP_NUM_THREADS / OPENBLAS_NUM_THREADS). Prints one line: the warm-up steps'
 * time (first step apart), then the steady state: timed steps, their total and median, and
 * samples/s = ITERS * BATCH / total. bench/backbone/run.sh runs the PyTorch peers beside it
 * (iresnet_torch.py prints the same line). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "common/err.h"
#include "worker/model/model.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of n step times in seconds (sorts t in place). */
static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s NETWORK BATCH [ITERS [WARMUP]]\n", argv[0]);
        return 2;
    }
    const char *net = argv[1];
    int B = atoi(argv[2]), iters = argc > 3 ? atoi(argv[3]) : 3, warmup = argc > 4 ? atoi(argv[4]) : 1;
    int D = 512;
    model *m;
    if (B <= 0 || iters <= 0 || warmup < 0) {
        fprintf(stderr, "bench_backbone: bad batch/iters/warm-up\n");
        return 1;
    }
    if (model_create(&m, net, D, B)) {
        fprintf(stderr, "bench_backbone: %s\n", pf_errmsg());
        return 1;
    }
    model_init(m, 1);
    size_t nin = (size_t)B * 3 * 112 * 112;
    float *x = malloc(nin * sizeof *x), *g = malloc((size_t)B * D * sizeof *g);
    double *t = malloc((size_t)(warmup + iters) * sizeof *t);
    if (!x || !g || !t) {
        fprintf(stderr, "bench_backbone: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < nin; i++)
        x[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    for (int i = 0; i < B * D; i++)
        g[i] = 1e-3f * (float)((i % 7) - 3);
    const float *e;
    for (int it = 0; it < warmup + iters; it++) {
        double t0 = now();
        model_zero_grad(m);
        if (model_forward(m, x, B, 1, &e) || model_backward(m, g, NULL)) {
            fprintf(stderr, "bench_backbone: %s\n", pf_errmsg());
            return 1;
        }
        t[it] = now() - t0;
    }
    double warm = 0, steady = 0;
    for (int it = 0; it < warmup; it++)
        warm += t[it];
    for (int it = warmup; it < warmup + iters; it++)
        steady += t[it];
    const char *threads = getenv("OMP_NUM_THREADS");
    printf("pfcps %s batch %d threads %s params %zu: warm-up %d steps %.3f s first %.3f s, "
           "steady %d steps %.3f s median %.3f s, samples/s %.2f\n",
           net, B, threads ? threads : "default", model_num_params(m), warmup, warm,
           warmup ? t[0] : 0.0, iters, steady, median(t + warmup, iters), iters * B / steady);
    free(x);
    free(g);
    free(t);
    model_free(m);
    return 0;
}
