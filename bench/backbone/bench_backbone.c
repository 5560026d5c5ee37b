/* Backbone throughput on the CPU device: forward (training mode) + backward, samples/s.
 * Usage: bench_backbone NETWORK BATCH [ITERS] (one warm-up step first; threads from
 * OMP_NUM_THREADS / OPENBLAS_NUM_THREADS). bench/backbone/run.sh runs PyTorch beside it. */
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

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s NETWORK BATCH [ITERS]\n", argv[0]);
        return 2;
    }
    const char *net = argv[1];
    int B = atoi(argv[2]), iters = argc > 3 ? atoi(argv[3]) : 3, D = 512;
    model *m;
    if (B <= 0 || iters <= 0 || model_create(&m, net, D, B)) {
        fprintf(stderr, "bench_backbone: %s\n", B > 0 && iters > 0 ? pf_errmsg() : "bad batch/iters");
        return 1;
    }
    model_init(m, 1);
    size_t nin = (size_t)B * 3 * 112 * 112;
    float *x = malloc(nin * sizeof *x), *g = malloc((size_t)B * D * sizeof *g);
    for (size_t i = 0; i < nin; i++)
        x[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    for (int i = 0; i < B * D; i++)
        g[i] = 1e-3f * (float)((i % 7) - 3);
    const float *e;
    double t0 = 0;
    for (int it = -1; it < iters; it++) {
        if (it == 0)
            t0 = now();
        model_zero_grad(m);
        if (model_forward(m, x, B, 1, &e) || model_backward(m, g, NULL)) {
            fprintf(stderr, "bench_backbone: %s\n", pf_errmsg());
            return 1;
        }
    }
    double dt = now() - t0;
    printf("pfcps %s batch %d: %d steps in %.3f s, samples/s %.2f\n", net, B, iters, dt, iters * B / dt);
    free(x);
    free(g);
    model_free(m);
    return 0;
}
