/* Head benchmark: one margin-softmax forward+backward (global batch N, K sampled centers, D) against
 * its ceiling measured in the same run: the three SGEMMs the head cannot avoid (cos = en wn^T,
 * dEn = dcos wn, dWn = dcos^T en), timed alone on the same shapes with the same BLAS.
 * ratio = gemm-only time / head time (1.0 = the head costs no more than its GEMMs).
 * Times are CPU seconds of the process (CLOCK_PROCESS_CPUTIME_ID), best of reps, with OpenBLAS and the
 * head's OpenMP row passes on `threads` threads (default 1: CPU time is then stable on a loaded machine).
 * Usage: bench_head [N K D reps threads]   (default 256 8192 512 5 1) */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "bench/head/head_gemms.h"
#include "common/err.h"
#include "worker/head/head.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
    int64_t n = argc > 1 ? atoll(argv[1]) : 256, k = argc > 2 ? atoll(argv[2]) : 8192,
            d = argc > 3 ? atoll(argv[3]) : 512;
    int reps = argc > 4 ? atoi(argv[4]) : 5, threads = argc > 5 ? atoi(argv[5]) : 1;
    if (n <= 0 || k <= 0 || d <= 0 || reps <= 0 || threads <= 0) {
        fprintf(stderr, "usage: bench_head [N K D reps threads] (all positive)\n");
        return 2;
    }
    openblas_set_num_threads(threads);
#ifdef _OPENMP
    omp_set_num_threads(threads); /* the head's row passes */
#endif
    float *e = malloc((size_t)(n * d) * sizeof(float)), *w = malloc((size_t)(k * d) * sizeof(float));
    float *ge = malloc((size_t)(n * d) * sizeof(float)), *gw = malloc((size_t)(k * d) * sizeof(float));
    float *c = malloc((size_t)(n * k) * sizeof(float));
    int64_t *lab = malloc((size_t)n * sizeof(int64_t));
    unsigned st = 1;
    for (int64_t i = 0; i < n * d; i++)
        st = st * 1664525u + 1013904223u, e[i] = (float)(st >> 8) / 16777216.0f - 0.5f;
    for (int64_t i = 0; i < k * d; i++)
        st = st * 1664525u + 1013904223u, w[i] = (float)(st >> 8) / 16777216.0f - 0.5f;
    for (int64_t i = 0; i < n; i++)
        lab[i] = (i * 7919) % k;
    head_params p = {.s = 64, .m1 = 1, .m2 = 0.5, .m3 = 0, .margin_grad = HEAD_MARGIN_GRAD_EXACT};
    head_ws ws;
    if (head_ws_init(&ws, n, k, d) < 0) {
        fprintf(stderr, "%s\n", pf_errmsg());
        return 1;
    }
    double loss, best_head = 1e30, best_gemm = 1e30;
    for (int r = 0; r < reps + 1; r++) {
        double t0 = now();
        if (head_forward(&p, &ws, NULL, &loss, NULL, e, w, lab, n, k, d) < 0 ||
            head_backward(&p, &ws, ge, gw, e, w, lab, n, k, d) < 0) {
            fprintf(stderr, "%s\n", pf_errmsg());
            return 1;
        }
        double t1 = now();
        head_three_sgemms(n, k, d, e, w, c, ge, gw);
        double t2 = now();
        if (r == 0)
            continue; /* warm-up */
        if (t1 - t0 < best_head)
            best_head = t1 - t0;
        if (t2 - t1 < best_gemm)
            best_gemm = t2 - t1;
    }
    double flops = 6.0 * (double)n * (double)k * (double)d;
    printf("head N=%lld K=%lld D=%lld, %d BLAS thread(s), CPU time: %.2f ms (%.1f GFLOP/s, loss %.3f); 3 "
           "SGEMMs alone %.2f ms (%.1f GFLOP/s); "
           "ratio gemm/head %.2f\n",
           (long long)n, (long long)k, (long long)d, threads, best_head * 1e3, flops / best_head / 1e9, loss,
           best_gemm * 1e3, flops / best_gemm / 1e9, best_gemm / best_head);
    head_ws_free(&ws);
    free(e);
    free(w);
    free(ge);
    free(gw);
    free(c);
    free(lab);
    return 0;
}
