/* The three SGEMMs a margin-softmax head over N rows, K sampled centers and dimension D cannot avoid, in one
 * place for the benchmarks that measure them as a ceiling (bench/head/bench_head, bench/scale/host_figures):
 *   cos (N,K) = e (N,D) . w (K,D)^T;  ge (N,D) = cos (N,K) . w (K,D);  gw (K,D) = cos (N,K)^T . e (N,D).
 * 6 N K D floating-point operations in all. Row-major float arrays; c is overwritten by the first. */
#ifndef PFCPS_BENCH_HEAD_HEAD_GEMMS_H
#define PFCPS_BENCH_HEAD_HEAD_GEMMS_H

#include <cblas.h>
#include <stdint.h>

static inline void head_three_sgemms(int64_t n, int64_t k, int64_t d, const float *e, const float *w, float *c,
                                     float *ge, float *gw)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)k, (int)d, 1.0f, e, (int)d, w, (int)d, 0.0f,
                c, (int)k);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)d, (int)k, 1.0f, c, (int)k, w, (int)d,
                0.0f, ge, (int)d);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)k, (int)d, (int)n, 1.0f, c, (int)k, e, (int)d, 0.0f,
                gw, (int)d);
}

#endif
