/* Margin-softmax head against ../shared/reference/head/head_* (float64 PyTorch): loss (rel <= 1e-5),
 * logits and gradients (rel <= 1e-4), every case, single process; then the same head split over 2
 * and 3 workers (thread collectives, global mode, columns j mod W == w as the sampler assigns them)
 * must give the single-process loss and gradients (summed over workers for the embeddings). */
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/coll.h"
#include "common/err.h"
#include "tests/npy.h"
#include "tests/reference/ref.h"
#include "worker/head/head.h"

typedef struct ref_case {
    char name[300];
    int64_t n, k, d;
    float *emb, *cen;
    int64_t *labels;
    double *loss, *logits, *gemb, *gcen;
    head_params p;
} ref_case;

static int load_case(const char *dir, const char *name, ref_case *c)
{
    char path[1600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    char *meta = npy_read_text(path, "meta.json");
    if (!meta) {
        fprintf(stderr, "%s: cannot read meta.json\n", path);
        return -1;
    }
    c->p.s = npy_json_number(meta, "s", NAN);
    c->p.m1 = npy_json_number(meta, "m1", NAN);
    c->p.m2 = npy_json_number(meta, "m2", NAN);
    c->p.m3 = npy_json_number(meta, "m3", NAN);
    c->p.margin_grad =
        strstr(meta, "straight_through") ? HEAD_MARGIN_GRAD_STRAIGHT_THROUGH : HEAD_MARGIN_GRAD_EXACT;
    c->p.mode = HEAD_MODE_GLOBAL;
    free(meta);
    npy_array e, w, l, lo, lg, ge, gc;
    if (npy_load2(path, "embeddings.npy", &e) || npy_load2(path, "centers.npy", &w) ||
        npy_load2(path, "labels.npy", &l) || npy_load2(path, "loss.npy", &lo) ||
        npy_load2(path, "logits.npy", &lg) || npy_load2(path, "grad_embeddings.npy", &ge) ||
        npy_load2(path, "grad_centers.npy", &gc)) {
        fprintf(stderr, "%s: %s\n", path, pf_errmsg());
        return -1;
    }
    c->n = e.shape[0];
    c->d = e.shape[1];
    c->k = w.shape[0];
    c->emb = npy_to_f32(&e);
    c->cen = npy_to_f32(&w);
    c->labels = npy_to_i64(&l);
    c->loss = npy_to_f64(&lo);
    c->logits = npy_to_f64(&lg);
    c->gemb = npy_to_f64(&ge);
    c->gcen = npy_to_f64(&gc);
    npy_free(&e);
    npy_free(&w);
    npy_free(&l);
    npy_free(&lo);
    npy_free(&lg);
    npy_free(&ge);
    npy_free(&gc);
    return 0;
}

static void free_case(ref_case *c)
{
    free(c->emb);
    free(c->cen);
    free(c->labels);
    free(c->loss);
    free(c->logits);
    free(c->gemb);
    free(c->gcen);
}

/* One worker of a split run. */
typedef struct split_arg {
    const ref_case *c;
    coll_thread_group *group;
    int rank, world;
    double loss;
    float *gemb;      /* (n,d) this worker's part */
    float *gcen_full; /* (K,d) shared: this worker writes its columns' rows */
    int rc;
} split_arg;

static void *split_worker(void *vp)
{
    split_arg *a = vp;
    const ref_case *c = a->c;
    pf_coll coll;
    coll_thread_get(a->group, a->rank, &coll);
    int64_t kw = 0;
    for (int64_t j = a->rank; j < c->k; j += a->world)
        kw++;
    float *cen = malloc((size_t)((kw ? kw : 1) * c->d) * sizeof(float));
    float *gc = malloc((size_t)((kw ? kw : 1) * c->d) * sizeof(float));
    int64_t *lab = malloc((size_t)c->n * sizeof(int64_t));
    for (int64_t q = 0; q < kw; q++)
        memcpy(cen + q * c->d, c->cen + (a->rank + q * a->world) * c->d, (size_t)c->d * sizeof(float));
    for (int64_t i = 0; i < c->n; i++)
        lab[i] = (c->labels[i] % a->world == a->rank) ? c->labels[i] / a->world : -1;
    head_ws ws;
    a->rc = head_ws_init(&ws, c->n, kw, c->d);
    if (a->rc == 0)
        a->rc = head_forward(&c->p, &ws, &coll, &a->loss, NULL, c->emb, cen, lab, c->n, kw, c->d);
    if (a->rc == 0)
        a->rc = head_backward(&c->p, &ws, a->gemb, gc, c->emb, cen, lab, c->n, kw, c->d);
    if (a->rc == 0)
        for (int64_t q = 0; q < kw; q++)
            memcpy(a->gcen_full + (a->rank + q * a->world) * c->d, gc + q * c->d,
                   (size_t)c->d * sizeof(float));
    if (a->rc)
        fprintf(stderr, "rank %d: %s\n", a->rank, pf_errmsg());
    head_ws_free(&ws);
    free(cen);
    free(gc);
    free(lab);
    return NULL;
}

static double rel_f32(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(void)
{
    char dir[1024];
    int missing = ref_dir(dir, sizeof dir, "head");
    if (missing)
        return missing;
    DIR *dp = opendir(dir);
    if (!dp) {
        printf("FAIL: cannot open %s\n", dir);
        return 1;
    }
    char *names[256];
    int nn = 0;
    struct dirent *de;
    while ((de = readdir(dp)) && nn < 256)
        if (strncmp(de->d_name, "head_", 5) == 0)
            names[nn++] = strdup(de->d_name);
    closedir(dp);
    qsort(names, (size_t)nn, sizeof(char *), cmp_name);
    if (nn == 0) {
        return ref_missing("no head_* cases in %s", dir);
    }

    int fails = 0;
    double worst[4] = {0};
    for (int ci = 0; ci < nn; ci++) {
        ref_case c;
        if (load_case(dir, names[ci], &c)) {
            fails++;
            continue;
        }
        size_t nk = (size_t)(c.n * c.k), nd = (size_t)(c.n * c.d), kd = (size_t)(c.k * c.d);
        float *logits = malloc(nk * sizeof(float)), *gemb = malloc(nd * sizeof(float)),
              *gcen = malloc(kd * sizeof(float));
        head_ws ws;
        double loss = NAN;
        int rc = head_ws_init(&ws, c.n, c.k, c.d);
        if (rc == 0)
            rc = head_forward(&c.p, &ws, NULL, &loss, logits, c.emb, c.cen, c.labels, c.n, c.k, c.d);
        if (rc == 0)
            rc = head_backward(&c.p, &ws, gemb, gcen, c.emb, c.cen, c.labels, c.n, c.k, c.d);
        if (rc) {
            printf("FAIL %s: head returned %d: %s\n", c.name, rc, pf_errmsg());
            fails++;
        } else {
            double el = fabs(loss - c.loss[0]) / fabs(c.loss[0]);
            double ez = rel_err_f32_f64(logits, c.logits, nk);
            double ee = rel_err_f32_f64(gemb, c.gemb, nd);
            double ec = rel_err_f32_f64(gcen, c.gcen, kd);
            int ok = el <= 1e-5 && ez <= 1e-4 && ee <= 1e-4 && ec <= 1e-4;
            printf("%s %-46s loss %.8f (ref %.8f) rel %.2e | logits rel %.2e | grad_emb rel %.2e (max abs "
                   "%.2e) | grad_cen rel %.2e (max abs %.2e)\n",
                   ok ? "ok  " : "FAIL", c.name, loss, c.loss[0], el, ez, ee,
                   max_abs_err_f32_f64(gemb, c.gemb, nd), ec, max_abs_err_f32_f64(gcen, c.gcen, kd));
            fails += !ok;
            double e4[4] = {el, ez, ee, ec};
            for (int q = 0; q < 4; q++)
                if (e4[q] > worst[q])
                    worst[q] = e4[q];

            /* Split over W workers: same loss and gradients as the single process. */
            for (int W = 2; W <= 3; W++) {
                coll_thread_group *g;
                coll_thread_group_create(W, &g);
                split_arg args[3];
                pthread_t th[3];
                float *gcen_w = calloc(kd, sizeof(float));
                for (int r = 0; r < W; r++) {
                    args[r] = (split_arg){.c = &c,
                                          .group = g,
                                          .rank = r,
                                          .world = W,
                                          .gemb = malloc(nd * sizeof(float)),
                                          .gcen_full = gcen_w};
                    pthread_create(&th[r], NULL, split_worker, &args[r]);
                }
                for (int r = 0; r < W; r++)
                    pthread_join(th[r], NULL);
                coll_thread_group_destroy(g);
                float *gsum = calloc(nd, sizeof(float));
                double lmax = 0;
                int rcs = 0;
                for (int r = 0; r < W; r++) {
                    rcs |= args[r].rc;
                    double dl = fabs(args[r].loss - loss) / fabs(loss);
                    if (dl > lmax)
                        lmax = dl;
                    for (size_t q = 0; q < nd; q++)
                        gsum[q] += args[r].gemb[q];
                    free(args[r].gemb);
                }
                double se = rel_f32(gsum, gemb, nd), sc = rel_f32(gcen_w, gcen, kd);
                double re = rel_err_f32_f64(gsum, c.gemb, nd), rcn = rel_err_f32_f64(gcen_w, c.gcen, kd);
                int sok = rcs == 0 && lmax <= 1e-6 && se <= 1e-5 && sc <= 1e-5 && re <= 1e-4 && rcn <= 1e-4;
                printf("%s   split W=%d: loss rel vs single %.2e | grad_emb rel vs single %.2e (vs ref %.2e) "
                       "| grad_cen rel vs single %.2e (vs ref %.2e)\n",
                       sok ? "ok  " : "FAIL", W, lmax, se, re, sc, rcn);
                fails += !sok;
                free(gsum);
                free(gcen_w);
            }
        }
        head_ws_free(&ws);
        free(logits);
        free(gemb);
        free(gcen);
        free_case(&c);
        free(names[ci]);
    }
    printf("%d cases; worst rel: loss %.2e logits %.2e grad_emb %.2e grad_cen %.2e; %d failures\n", nn,
           worst[0], worst[1], worst[2], worst[3], fails);
    return fails ? 1 : 0;
}
