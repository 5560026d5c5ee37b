/* Closed form of skipped dense SGD steps: see dense.h. */
#include "server/dense.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
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

/* M := M * A_t (A_t applied first); *ident: M is still the identity (no step folded in yet). */
static void extend(dense_map *M, int *ident, double lr, double mu, double wd)
{
    if (isnan(lr))
        return; /* a skipped step: the identity */
    dense_map A = dense_step_map(lr, mu, wd);
    *M = *ident ? A : dense_mul(*M, A);
    *ident = 0;
}

int dense_compose(const double *lr, int64_t first, int64_t last, double mu, double wd, dense_map *M)
{
    int ident = 1;
    *M = dense_identity();
    for (int64_t t = last; t >= first; t--)
        extend(M, &ident, lr[t], mu, wd);
    return ident;
}

int dense_cache_init(dense_cache *c, int dim)
{
    memset(c, 0, sizeof *c);
    c->last = -1;
    c->tmp = malloc(sizeof(float) * 3 * (size_t)(dim > 0 ? dim : 1));
    return c->tmp ? 0 : -ENOMEM;
}

void dense_cache_free(dense_cache *c)
{
    free(c->tab);
    free(c->ident);
    free(c->tmp);
    memset(c, 0, sizeof *c);
}

enum { CACHE_MAX = 1 << 16 }; /* 2 MiB of maps: gaps longer than 65536 steps are composed directly */

int dense_cache_get(dense_cache *c, const double *lr, int64_t first, int64_t last, double mu, double wd,
                    dense_map *M)
{
    if (last < first) {
        *M = dense_identity();
        return 1;
    }
    const int64_t i = last - first;
    if (i >= CACHE_MAX)
        return dense_compose(lr, first, last, mu, wd, M);
    if (c->last != last) {
        c->last = last;
        c->n = 0;
    }
    if (i >= c->cap) {
        int64_t cap = c->cap ? c->cap : 64;
        while (cap <= i)
            cap *= 2;
        dense_map *t = realloc(c->tab, sizeof(dense_map) * (size_t)cap);
        if (t)
            c->tab = t;
        uint8_t *id = t ? realloc(c->ident, (size_t)cap) : NULL;
        if (id)
            c->ident = id;
        if (!t || !id)
            return dense_compose(lr, first, last, mu, wd, M); /* same bits, no table */
        c->cap = cap;
    }
    while (c->n <= i) {
        dense_map m = c->n ? c->tab[c->n - 1] : dense_identity();
        int ident = c->n ? c->ident[c->n - 1] : 1;
        extend(&m, &ident, lr[last - c->n], mu, wd);
        c->tab[c->n] = m;
        c->ident[c->n] = (uint8_t)ident;
        c->n++;
    }
    *M = c->tab[i];
    return c->ident[i];
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

PF_DENSE_CLONES
void dense_apply_w(const float *restrict w, const float *restrict v, float *restrict out, int dim,
                   const dense_map *M)
{
    const double c = M->m[2], d = M->m[3];
    int j = 0;
#if defined(__GNUC__)
    typedef double v4d __attribute__((vector_size(32)));
    for (; j + 4 <= dim; j += 4) {
        v4d vv = {v[j], v[j + 1], v[j + 2], v[j + 3]};
        v4d wv = {w[j], w[j + 1], w[j + 2], w[j + 3]};
        v4d wn = c * vv + d * wv;
        for (int k = 0; k < 4; k++)
            out[j + k] = (float)wn[k];
    }
#endif
    for (; j < dim; j++)
        out[j] = (float)(c * (double)v[j] + d * (double)w[j]);
}

void dense_steps_f32(float *w, float *v, int dim, const double *lr, int64_t first, int64_t last, double mu,
                     double wd)
{
    const float muf = (float)mu, wdf = (float)wd;
    for (int64_t t = first; t <= last; t++) {
        if (isnan(lr[t]))
            continue;
        const float lrf = (float)lr[t];
        for (int j = 0; j < dim; j++) {
            float dj = 0.0f + wdf * w[j];
            float vj = v[j] * muf + dj;
            v[j] = vj;
            w[j] = w[j] + -lrf * vj;
        }
    }
}
