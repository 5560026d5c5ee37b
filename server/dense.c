/* Closed form of skipped dense SGD steps: see dense.h. */
#include "server/dense.h"

#include <string.h>

dense_map dense_identity(void)
{
    return (dense_map){{1.0, 0.0, 0.0, 1.0}};
}

dense_map dense_step_map(double lr, double mu, double wd)
{
    /* v' = mu*v + wd*w;  w' = w - lr*v' = -lr*mu*v + (1 - lr*wd)*w */
    return (dense_map){{mu, wd, -lr * mu, 1.0 - lr * wd}};
}

dense_map dense_mul(dense_map a, dense_map b)
{
    return (dense_map){{a.m[0] * b.m[0] + a.m[1] * b.m[2], a.m[0] * b.m[1] + a.m[1] * b.m[3],
                        a.m[2] * b.m[0] + a.m[3] * b.m[2], a.m[2] * b.m[1] + a.m[3] * b.m[3]}};
}

dense_map dense_compose(const double *lr, int64_t first, int64_t last, double mu, double wd)
{
    if (last < first)
        return dense_identity();
    dense_map M = dense_step_map(lr[last], mu, wd);
    for (int64_t t = last - 1; t >= first; t--)
        M = dense_mul(M, dense_step_map(lr[t], mu, wd));
    return M;
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define PF_DENSE_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define PF_DENSE_CLONES
#endif

PF_DENSE_CLONES
void dense_apply_row(float *restrict w, float *restrict v, int dim, const dense_map *M)
{
    const double a = M->m[0], b = M->m[1], c = M->m[2], d = M->m[3];
    int j = 0;
#if defined(__GNUC__)
    /* 4 lanes of doubles with GCC vector extensions: the same IEEE operations per element as the loop below. */
    typedef double v4d __attribute__((vector_size(32)));
    for (; j + 4 <= dim; j += 4) {
        v4d vv = {v[j], v[j + 1], v[j + 2], v[j + 3]};
        v4d wv = {w[j], w[j + 1], w[j + 2], w[j + 3]};
        v4d vn = a * vv + b * wv;
        v4d wn = c * vv + d * wv;
        for (int k = 0; k < 4; k++) {
            v[j + k] = (float)vn[k];
            w[j + k] = (float)wn[k];
        }
    }
#endif
    for (; j < dim; j++) {
        const double vj = v[j], wj = w[j];
        v[j] = (float)(a * vj + b * wj);
        w[j] = (float)(c * vj + d * wj);
    }
}

void dense_steps_f32(float *w, float *v, int dim, const double *lr, int64_t first, int64_t last, double mu,
                     double wd)
{
    const float muf = (float)mu, wdf = (float)wd;
    for (int64_t t = first; t <= last; t++) {
        const float lrf = (float)lr[t];
        for (int j = 0; j < dim; j++) {
            float dj = 0.0f + wdf * w[j];
            float vj = v[j] * muf + dj;
            v[j] = vj;
            w[j] = w[j] + -lrf * vj;
        }
    }
}
