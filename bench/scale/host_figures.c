/* host_figures: the per-host figures `pfcps plan` takes, measured on this machine (bench/scale/run.sh
 * --plan).
 *
 *   host_figures N K D [rounds]
 *
 * Prints one line `FIGURES gemm_gflops=G mem_gbs=M`:
 *   gemm_gflops: the head's three SGEMMs on its shapes (cosines N x K = E (N x D) . W^T, dL/dE = G (N x K) .
 * W, dL/dW = G^T . E), 6 N K D FLOP over the wall time of the three, best of `rounds` (default 3), with the
 * BLAS threads the environment gives (OPENBLAS_NUM_THREADS); mem_gbs:     one thread's memcpy of a 512 MiB
 * buffer, bytes read + bytes written per second, best of `rounds`: the unit of tools/plan.h's server memory
 * passes (each pass reads or writes 4 D bytes per row). The link on loopback is not measured here: run.sh
 * takes ps_bench's pull rate for it. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/head/head_gemms.h"
#include "common/clock.h"

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: host_figures N K D [rounds]\n");
        return 2;
    }
    const long n = atol(argv[1]), k = atol(argv[2]), d = atol(argv[3]);
    const int rounds = argc > 4 ? atoi(argv[4]) : 3;
    if (n < 1 || k < 1 || d < 1 || rounds < 1) {
        fprintf(stderr, "host_figures: N, K, D and rounds must be positive\n");
        return 2;
    }
    float *e = malloc(sizeof(float) * n * d), *w = malloc(sizeof(float) * k * d);
    float *c = malloc(sizeof(float) * n * k), *ge = malloc(sizeof(float) * n * d);
    float *gw = malloc(sizeof(float) * k * d);
    const size_t mem = 512u << 20;
    char *src = malloc(mem), *dst = malloc(mem);
    if (!e || !w || !c || !ge || !gw || !src || !dst) {
        fprintf(stderr, "host_figures: out of memory\n");
        return 1;
    }
    for (long i = 0; i < n * d; i++)
        e[i] = (float)((i % 97) - 48) / 97.0f;
    for (long i = 0; i < k * d; i++)
        w[i] = (float)((i % 89) - 44) / 89.0f;
    memset(c, 0, sizeof(float) * n * k);
    memset(src, 1, mem);
    memset(dst, 2, mem);
    double best_gemm = 1e30, best_copy = 1e30;
    for (int r = 0; r < rounds; r++) {
        double t0 = pf_now_s();
        head_three_sgemms(n, k, d, e, w, c, ge, gw);
        double t1 = pf_now_s();
        memcpy(dst, src, mem);
        double t2 = pf_now_s();
        best_gemm = t1 - t0 < best_gemm ? t1 - t0 : best_gemm;
        best_copy = t2 - t1 < best_copy ? t2 - t1 : best_copy;
        src[r] = dst[mem - 1 - r]; /* keep the copy observable */
    }
    printf("FIGURES gemm_gflops=%.1f mem_gbs=%.2f\n", 6.0 * n * k * d / best_gemm / 1e9,
           2.0 * mem / best_copy / 1e9);
    free(e);
    free(w);
    free(c);
    free(ge);
    free(gw);
    free(src);
    free(dst);
    return 0;
}
