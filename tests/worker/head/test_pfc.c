/* Partial FC step glue over 2 and 3 workers (thread collectives): allgather of labels and embeddings,
 * per-worker sampling (rate 1 and 0.5), the distributed head, reduce-scatter of the embedding
 * gradients. Each worker's loss, embedding gradients (its own rows) and class-center gradients must
 * equal one process running the head (checked against ../shared/reference by test_head) over the
 * whole global batch and the union of the sampled centers. Local mode: the loss is the mean of the
 * per-worker losses and the gradients are the per-worker ones divided by W. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/coll.h"
#include "common/err.h"
#include "tests/check.h"
#include "worker/head/pfc.h"

enum { B = 5, D = 16, C = 41, MAXW = 3 };

static float table[C * D];      /* the class-center table the servers would hold */
static float emb[MAXW * B * D]; /* embeddings of every worker's batch */
static int64_t labels[MAXW * B];

typedef struct warg {
    coll_thread_group *g;
    int rank, W;
    double rate;
    head_mode mode;
    int64_t step;
    double loss;
    int64_t *ids, k;
    float ge[B * D], *gc;
    int rc;
} warg;

static void *worker(void *vp)
{
    warg *a = vp;
    pf_coll coll;
    coll_thread_get(a->g, a->rank, &coll);
    head_params p = {
        .s = 30, .m1 = 1, .m2 = 0.3, .m3 = 0.1, .margin_grad = HEAD_MARGIN_GRAD_EXACT, .mode = a->mode};
    pfc x;
    a->rc = pfc_init(&x, &p, &coll, C, a->rate, 2048, B, D);
    const int64_t *ids;
    if (a->rc == 0)
        a->rc = pfc_sample(&x, a->step, labels + a->rank * B, &ids, &a->k);
    float *cen = NULL;
    if (a->rc == 0) {
        a->ids = malloc((size_t)a->k * sizeof(int64_t));
        memcpy(a->ids, ids, (size_t)a->k * sizeof(int64_t));
        cen = malloc((size_t)(a->k * D) * sizeof(float));
        a->gc = malloc((size_t)(a->k * D) * sizeof(float));
        for (int64_t j = 0; j < a->k; j++)
            memcpy(cen + j * D, table + ids[j] * D, D * sizeof(float));
        a->rc = pfc_step(&x, emb + a->rank * B * D, cen, &a->loss, a->ge, a->gc);
    }
    if (a->rc)
        printf("rank %d: %s\n", a->rank, pf_errmsg());
    free(cen);
    pfc_free(&x);
    return NULL;
}

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Single-process head over rows [0, n) of emb with the given sorted centers ids. */
static int single(int64_t n, const float *e, const int64_t *lab, const int64_t *ids, int64_t k,
                  head_mode mode, double *loss, float *ge, float *gc)
{
    head_params p = {
        .s = 30, .m1 = 1, .m2 = 0.3, .m3 = 0.1, .margin_grad = HEAD_MARGIN_GRAD_EXACT, .mode = mode};
    float *cen = malloc((size_t)(k * D) * sizeof(float));
    int64_t *loc = malloc((size_t)n * sizeof(int64_t));
    for (int64_t j = 0; j < k; j++)
        memcpy(cen + j * D, table + ids[j] * D, D * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        loc[i] = -1;
        for (int64_t j = 0; j < k; j++)
            if (ids[j] == lab[i])
                loc[i] = j;
    }
    head_ws ws;
    int rc = head_ws_init(&ws, n, k, D);
    if (rc == 0)
        rc = head_forward(&p, &ws, NULL, loss, NULL, e, cen, loc, n, k, D);
    if (rc == 0)
        rc = head_backward(&p, &ws, ge, gc, e, cen, loc, n, k, D);
    head_ws_free(&ws);
    free(cen);
    free(loc);
    return rc;
}

static void run(int W, double rate, head_mode mode, int64_t step)
{
    coll_thread_group *g;
    coll_thread_group_create(W, &g);
    warg a[MAXW];
    pthread_t th[MAXW];
    for (int r = 0; r < W; r++) {
        a[r] = (warg){.g = g, .rank = r, .W = W, .rate = rate, .mode = mode, .step = step};
        pthread_create(&th[r], NULL, worker, &a[r]);
    }
    for (int r = 0; r < W; r++)
        pthread_join(th[r], NULL);
    coll_thread_group_destroy(g);
    for (int r = 0; r < W; r++)
        if (a[r].rc) {
            CHECK(0, "W=%d rate %g: rank %d returned %d", W, rate, r, a[r].rc);
            goto out;
        }
    if (mode == HEAD_MODE_GLOBAL) {
        /* Union of the sampled ids (disjoint partitions). */
        int64_t ku = 0, uni[C];
        for (int r = 0; r < W; r++)
            for (int64_t j = 0; j < a[r].k; j++)
                uni[ku++] = a[r].ids[j];
        qsort(uni, (size_t)ku, sizeof(int64_t), cmp64);
        float ge[MAXW * B * D], gc[C * D];
        double loss;
        if (single(W * B, emb, labels, uni, ku, HEAD_MODE_GLOBAL, &loss, ge, gc)) {
            CHECK(0, "single: %s", pf_errmsg());
            goto out;
        }
        double el = 0, ee = 0, ec = 0;
        for (int r = 0; r < W; r++) {
            el = fmax(el, fabs(a[r].loss - loss) / loss);
            ee = fmax(ee, rel_l2(a[r].ge, ge + r * B * D, B * D));
            /* this worker's center gradients vs the union's rows of its ids */
            float *ref = malloc((size_t)(a[r].k * D) * sizeof(float));
            for (int64_t j = 0; j < a[r].k; j++) {
                int64_t u = 0;
                while (uni[u] != a[r].ids[j])
                    u++;
                memcpy(ref + j * D, gc + u * D, D * sizeof(float));
            }
            ec = fmax(ec, rel_l2(a[r].gc, ref, (size_t)(a[r].k * D)));
            free(ref);
        }
        int ok = el <= 1e-6 && ee <= 1e-5 && ec <= 1e-5;
        check(ok,
              "global W=%d rate %.1f step %lld: %lld of %d centers sampled; loss %.6f vs single %.6f rel "
              "%.1e; "
              "grad_emb rel %.1e; grad_cen rel %.1e",
              W, rate, (long long)step, (long long)ku, C, a[0].loss, loss, el, ee, ec);
    } else {
        double lsum = 0, ee = 0, ec = 0;
        for (int r = 0; r < W; r++) {
            float ge[B * D], *gc = malloc((size_t)(a[r].k * D) * sizeof(float));
            double l;
            single(B, emb + r * B * D, labels + r * B, a[r].ids, a[r].k, HEAD_MODE_GLOBAL, &l, ge, gc);
            lsum += l;
            for (int q = 0; q < B * D; q++)
                ge[q] /= W;
            for (int64_t q = 0; q < a[r].k * D; q++)
                gc[q] /= W;
            ee = fmax(ee, rel_l2(a[r].ge, ge, B * D));
            ec = fmax(ec, rel_l2(a[r].gc, gc, (size_t)(a[r].k * D)));
            free(gc);
        }
        double el = fabs(a[0].loss - lsum / W) / (lsum / W);
        int ok = el <= 1e-9 && ee <= 1e-6 && ec <= 1e-6;
        check(ok,
              "local W=%d rate %.1f: loss %.6f = mean of worker losses %.6f (rel %.1e); grads = own / W "
              "(rel %.1e, %.1e)",
              W, rate, a[0].loss, lsum / W, el, ee, ec);
    }
out:
    for (int r = 0; r < W; r++) {
        free(a[r].ids);
        free(a[r].gc);
    }
}

int main(void)
{
    unsigned st = 99;
    for (int i = 0; i < C * D; i++)
        st = st * 1664525u + 1013904223u, table[i] = (float)(st >> 8) / 16777216.0f - 0.5f;
    for (int i = 0; i < MAXW * B * D; i++)
        st = st * 1664525u + 1013904223u, emb[i] = (float)(st >> 8) / 16777216.0f - 0.5f;
    for (int i = 0; i < MAXW * B; i++)
        labels[i] = (i * 17 + 3) % C;
    labels[4] = labels[7]; /* a class twice in the global batch */
    for (int W = 2; W <= 3; W++) {
        run(W, 1.0, HEAD_MODE_GLOBAL, 0);
        run(W, 0.5, HEAD_MODE_GLOBAL, 1);
        run(W, 0.5, HEAD_MODE_GLOBAL, 2);
    }
    run(2, 0.3, HEAD_MODE_LOCAL, 5);

    /* Bad input: a label outside [0, C) in one worker's batch is reported with its global row. */
    pfc x;
    head_params p = {.s = 30, .m1 = 1};
    int64_t bad[B] = {0, 1, C, 2, 3};
    int rc = pfc_init(&x, &p, NULL, C, 1.0, 1, B, D);
    if (rc == 0)
        rc = pfc_sample(&x, 0, bad, NULL, NULL);
    int ok = rc == -ERANGE && strstr(pf_errmsg(), "label 41 of row 2");
    check(ok, "bad label: %s", pf_errmsg());
    rc = pfc_step(&x, emb, table, NULL, NULL, NULL);
    ok = rc == -EINVAL;
    check(ok, "step without a successful sample: %s", pf_errmsg());
    pfc_free(&x);

    /* A NaN embedding: the step reports the loss as nan, naming the step. */
    float e2[B * D], gcen[C * D], gemb[B * D];
    memcpy(e2, emb, sizeof e2);
    e2[3] = NAN;
    int64_t good[B] = {0, 1, 2, 3, 4};
    const int64_t *ids;
    int64_t k;
    rc = pfc_init(&x, &p, NULL, C, 1.0, 1, B, D);
    if (rc == 0)
        rc = pfc_sample(&x, 3, good, &ids, &k);
    double loss;
    if (rc == 0)
        rc = pfc_step(&x, e2, table, &loss, gemb, gcen);
    ok = rc == -ERANGE && strstr(pf_errmsg(), "nan at step 3");
    check(ok, "NaN embedding: %s", pf_errmsg());
    /* A row whose label was not found in the sample (simulated by unmapping it): a sampling fault, and
     * that row's loss is the floor 69.0776. */
    rc = pfc_sample(&x, 4, good, &ids, &k);
    x.labels_local[2] = -1;
    if (rc == 0)
        rc = pfc_step(&x, emb, table, &loss, gemb, gcen);
    ok = rc == -EPROTO && strstr(pf_errmsg(), "step 4: 1 of 5 rows") && loss > 69.0776 / B;
    check(ok, "row without a target: %s (loss %.4f)", pf_errmsg(), loss);
    pfc_free(&x);
    /* sample_rate in [0, 1] (0: positives only, test_sample.c); outside it, refused naming the value. */
    ok = pfc_init(&x, &p, NULL, C, -0.25, 1, B, D) == -EINVAL &&
         strstr(pf_errmsg(), "sample_rate -0.25 outside [0, 1]");
    check(ok, "sample_rate -0.25: %s", pf_errmsg());
    ok = pfc_init(&x, &p, NULL, C, 1.5, 1, B, D) == -EINVAL &&
         strstr(pf_errmsg(), "sample_rate 1.5 outside [0, 1]");
    check(ok, "sample_rate 1.5: %s", pf_errmsg());
    ok = pfc_init(&x, &p, NULL, C, NAN, 1, B, D) == -EINVAL;
    check(ok, "sample_rate nan: %s", pf_errmsg());

    /* PFC_NO_HOST_HEAD (GPU workers): the same sample as a full pfc at a sample rate that leaves
     * negatives to draw, no host head workspace, and pfc_step refused. */
    {
        pfc full, samp;
        const int64_t *ids_f, *ids_s;
        int64_t k_f = -1, k_s = -2;
        int rf = pfc_init(&full, &p, NULL, C, 0.5, 9, B, D);
        int rs = pfc_init_flags(&samp, &p, NULL, C, 0.5, 9, B, D, PFC_NO_HOST_HEAD);
        if (rf == 0)
            rf = pfc_sample(&full, 7, good, &ids_f, &k_f);
        if (rs == 0)
            rs = pfc_sample(&samp, 7, good, &ids_s, &k_s);
        ok = rf == 0 && rs == 0 && k_f == k_s && k_f > B && k_f < C &&
             !memcmp(ids_f, ids_s, (size_t)k_f * sizeof *ids_f) &&
             !memcmp(full.labels_local, samp.labels_local, B * sizeof(int64_t)) && samp.ws.cos == NULL &&
             samp.k_max == full.k_max;
        check(ok, "PFC_NO_HOST_HEAD samples as a full pfc (k %lld of %d, no workspace)", (long long)k_s, C);
        rs = pfc_step(&samp, emb, table, &loss, gemb, gcen);
        ok = rs == -EINVAL && strstr(pf_errmsg(), "PFC_NO_HOST_HEAD");
        check(ok, "PFC_NO_HOST_HEAD refuses pfc_step: %s", pf_errmsg());
        pfc_free(&full);
        pfc_free(&samp);
    }
    return check_summary();
}
