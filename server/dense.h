/* Dense updates at sparse cost (docs/arcface_parity.md, "Dense update at sparse cost: the closed form"):
 * arcface_torch's PartialFC_V2 runs torch.optim.SGD (momentum mu, weight decay wd, dampening 0, no Nesterov)
 * over the whole class-center table, so a row a step did not sample still moves: its gradient is 0 and
 *   v <- mu*v + wd*w;  w <- w - lr_t*v
 * per element, the linear map A_t = [[mu, wd], [-lr_t*mu, 1 - lr_t*wd]] on [v; w] (det A_t = mu).
 * A row whose stored state is as after step s and that is next touched at step e skipped the steps s+1 ..
 * e-1; it is brought up to date with M(s, e) = A_{e-1} * ... * A_{s+1} (A_{s+1} applied first).
 *
 * Bit-reproducibility: M depends only on (s, e, the lr of each skipped step, mu, wd). It is computed in double
 * with one fixed association, a left fold from the latest step down,
 *   M = ((A_{e-1} * A_{e-2}) * A_{e-3}) * ... * A_{s+1},
 * never from prefix products and their inverses (det = mu^k underflows). Each element is then updated as
 *   v' = (float)(M00*v + M01*w),  w' = (float)(M10*v + M11*w)     (double products, one rounding each)
 * with the inputs' old values (v and w are read before either is written). Built without contraction
 * (-ffp-contract=off), so every build gives the same bits. Against a float64 step-by-step run the result
 * differs by the final rounding plus k double roundings: far below torch's own float32 steps. */
#ifndef PFCPS_SERVER_DENSE_H
#define PFCPS_SERVER_DENSE_H

#include <stdint.h>

/* A 2x2 map on [v; w]: v' = m[0]*v + m[1]*w, w' = m[2]*v + m[3]*w. */
typedef struct dense_map {
    double m[4];
} dense_map;

/* The identity. */
dense_map dense_identity(void);

/* A_t for one zero-gradient SGD step at learning rate lr (mu, wd: the optimizer's momentum and weight decay,
 * as doubles; the map is in double). */
dense_map dense_step_map(double lr, double mu, double wd);

/* a * b (b applied first). */
dense_map dense_mul(dense_map a, dense_map b);

/* M = A_{last} * ... * A_{first} over the steps first .. last (first applied first), lr[t] the lr of step t,
 * folded as the header says. A step whose lr is NaN is one the loss scaler skipped (torch's GradScaler skips
 * the whole optimizer step): its map is the identity and is left out of the product. Returns 1 (and M = the
 * identity) when no step is left (last < first, or every one skipped): the row must then be left as it is. */
int dense_compose(const double *lr, int64_t first, int64_t last, double mu, double wd, dense_map *M);

/* The maps M(first, last) for one `last` and many `first`s (the rows of one apply or gather all end at the
 * same step): tab[i] = dense_compose over last - i .. last, built incrementally in the same association, so
 * every entry has exactly dense_compose's bits. At most `cap` entries; an older `first` is composed
 * directly. tmp: room for 3 rows of D floats (a gather's caught-up copy: weights and SGD momentum, or weights
 * and AdamW's two moments). Owned by one thread. */
typedef struct dense_cache {
    int64_t last;  /* the `last` the table is for (-1: none) */
    int64_t n;     /* entries built */
    int64_t cap;   /* entries allocated */
    uint64_t gen;  /* the shard's lr_gen the table was built under (server/shard.c resets a stale one) */
    dense_map *tab;
    uint8_t *ident;
    float *tmp;
} dense_cache;

/* Sets up an empty cache with room for `dim`-float rows. Returns 0 or -ENOMEM. */
int dense_cache_init(dense_cache *c, int dim);
void dense_cache_free(dense_cache *c);

/* dense_compose(lr, first, last, mu, wd, M) through the cache (mu, wd must be the same for every call). */
int dense_cache_get(dense_cache *c, const double *lr, int64_t first, int64_t last, double mu, double wd,
                    dense_map *M);

/* Applies M to the D elements of a row: each (v[j], w[j]) <- M (v[j], w[j]) as the header says. */
void dense_apply_row(float *w, float *v, int dim, const dense_map *M);

/* The weights only of dense_apply_row, into out (the same bits as dense_apply_row's w; the row is not
 * changed): what a pull needs. */
void dense_apply_w(const float *w, const float *v, float *out, int dim, const dense_map *M);

/* Reference for tests and measurements: the k steps one at a time in float32, torch's order for a zero
 * gradient (d = 0 + wd*w; v = v*mu + d; w = w + (-lr)*v, lr/mu/wd as float, each operation rounded). */
void dense_steps_f32(float *w, float *v, int dim, const double *lr, int64_t first, int64_t last, double mu,
                     double wd);

#endif
