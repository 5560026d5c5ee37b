/* CUDA device link check + l2-normalize kernel vs a float64 reference computed here.
 * Without a GPU the binary still links (that is the CI check) and the test is skipped (exit 77). */
#include "common/err.h"
#include "kernels/cuda/cuda_ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int main(void)
{
    if (cuda_device_count() == 0) {
        printf("SKIP: no CUDA device on this machine; the CUDA device library compiled and linked\n");
        return 77;
    }
    enum { N = 37, D = 515 };
    float *x = malloc(sizeof(float) * N * D), *y = malloc(sizeof(float) * N * D);
    unsigned s = 1;
    for (int i = 0; i < N * D; i++) {
        s = s * 1103515245u + 12345u;
        x[i] = (float)((s >> 8) & 0xffff) / 32768.0f - 1.0f;
    }
    for (int i = 0; i < N * D; i++)
        y[i] = NAN; /* poisoned: every element must be written */
    if (cuda_l2_normalize_rows_host(y, x, N, D, 1e-12f) != 0) {
        printf("FAIL: %s\n", pf_errmsg());
        return 1;
    }
    double maxerr = 0;
    for (int i = 0; i < N; i++) {
        double n2 = 0;
        for (int j = 0; j < D; j++)
            n2 += (double)x[i * D + j] * x[i * D + j];
        double inv = 1.0 / sqrt(n2);
        for (int j = 0; j < D; j++) {
            double e = fabs(y[i * D + j] - x[i * D + j] * inv);
            if (!(e <= maxerr))
                maxerr = isnan(e) ? INFINITY : (e > maxerr ? e : maxerr);
        }
    }
    printf("cuda_l2_normalize_rows: max abs err %.3e\n", maxerr);
    free(x);
    free(y);
    return maxerr < 1e-6 ? 0 : 1;
}
