/* AdamW for the class centers: see adamw.h. */
#include "server/adamw.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

adamw_hp adamw_defaults(double wd)
{
    return (adamw_hp){ADAMW_BETA1, ADAMW_BETA2, ADAMW_EPS, wd};
}

void adamw_coefs(const adamw_hp *hp, const double *lr, int64_t first, int64_t last, int64_t n0,
                 adamw_coef *out)
{
    int64_t n = n0;
    for (int64_t t = first; t <= last; t++) {
        adamw_coef c = {0};
        if (isnan(lr[t])) {
            c.skip = 1;
        } else {
            n++;
            /* torch: bias_correction1 = 1 - beta1 ** step (Python floats: C's pow), step_size = lr / bc1,
             * bias_correction2_sqrt = math.sqrt(1 - beta2 ** step), param.mul_(1 - lr * weight_decay) */
            const double bc1 = 1.0 - pow(hp->b1, (double)n), bc2 = 1.0 - pow(hp->b2, (double)n);
            c.decay = (float)(1.0 - lr[t] * hp->wd);
            c.nss = (float)(-(lr[t] / bc1));
            c.bc2s = (float)sqrt(bc2);
        }
        c.n = n;
        out[t] = c;
    }
}

/* One element of one step (g: its gradient, 0 for an unsampled row). */
static inline void step1(float *restrict w, float *restrict m, float *restrict v, float g, float b1f,
                         float omb1, float b2f, float omb2, float epsf, const adamw_coef *c)
{
    const float wj = *w * c->decay;              /* param.mul_(1 - lr * weight_decay) */
    const float mj = *m * b1f + omb1 * g;        /* exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1) */
    const float vj = *v * b2f + (omb2 * g) * g;  /* exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2) */
    const float den = sqrtf(vj) / c->bc2s + epsf; /* (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps) */
    *w = wj + (c->nss * mj) / den;               /* param.addcdiv_(exp_avg, denom, value=-step_size) */
    *m = mj;
    *v = vj;
}

void adamw_row_f32(float *restrict w, float *restrict m, float *restrict v, const float *restrict g, int dim,
                   const adamw_hp *hp, const adamw_coef *c)
{
    const float b1f = (float)hp->b1, omb1 = (float)(1.0 - hp->b1), b2f = (float)hp->b2,
                omb2 = (float)(1.0 - hp->b2), epsf = (float)hp->eps;
    if (g)
        for (int j = 0; j < dim; j++)
            step1(w + j, m + j, v + j, g[j], b1f, omb1, b2f, omb2, epsf, c);
    else
        for (int j = 0; j < dim; j++)
            step1(w + j, m + j, v + j, 0.0f, b1f, omb1, b2f, omb2, epsf, c);
}

#if defined(__GNUC__) && defined(__SSE__)
#include <xmmintrin.h>
#define ADAMW_SSE 1
typedef float v4f __attribute__((vector_size(16)));
#endif

void adamw_replay(float *restrict w, float *restrict m, float *restrict v, int dim, const adamw_hp *hp,
                  const adamw_coef *tab, int64_t first, int64_t last)
{
    const float b1f = (float)hp->b1, omb1 = (float)(1.0 - hp->b1), b2f = (float)hp->b2,
                omb2 = (float)(1.0 - hp->b2), epsf = (float)hp->eps;
    int j = 0;
#ifdef ADAMW_SSE
    /* 4 elements at a time through every step, kept in registers: step1's operations in its order on each
     * lane (SSE's sqrtps and divps round as sqrtf and / do), so the bits are the scalar loop's. */
    const float zero = 0.0f;
    for (; j + 4 <= dim; j += 4) {
        v4f W, M, V;
        memcpy(&W, w + j, sizeof W);
        memcpy(&M, m + j, sizeof M);
        memcpy(&V, v + j, sizeof V);
        for (int64_t t = first; t <= last; t++) {
            const adamw_coef *c = &tab[t];
            if (c->skip)
                continue;
            const v4f wj = W * c->decay;
            M = M * b1f + omb1 * zero;
            V = V * b2f + (omb2 * zero) * zero;
            const v4f den = (v4f)_mm_sqrt_ps((__m128)V) / c->bc2s + epsf;
            W = wj + (c->nss * M) / den;
        }
        memcpy(w + j, &W, sizeof W);
        memcpy(m + j, &M, sizeof M);
        memcpy(v + j, &V, sizeof V);
    }
#endif
    for (; j < dim; j++)
        for (int64_t t = first; t <= last; t++)
            if (!tab[t].skip)
                step1(w + j, m + j, v + j, 0.0f, b1f, omb1, b2f, omb2, epsf, &tab[t]);
}
