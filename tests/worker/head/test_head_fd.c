/* Head cases the references do not cover, checked against a float64 head written here and its
 * central finite differences: interclass filtering (exact and straight-through margin grads),
 * local head mode over 2 workers (gradients sum to the gradient of the global mean loss), a row whose
 * target lives on no worker (loss 69.0776, arcface_torch's floor), and bad input. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/coll.h"
#include "common/config.h"
#include "common/err.h"
#include "worker/head/head.h"

#include "tests/check.h"

/* Float64 margin-softmax loss (mean over n rows), the definition in the reference README plus
 * arcface_torch's interclass filtering. Labels in [0, k). */
static double loss64(const head_params *p, const double *e, int n, const double *w, int k, int d,
                     const int64_t *lab, int *nfiltered)
{
    double total = 0;
    if (nfiltered)
        *nfiltered = 0;
    for (int i = 0; i < n; i++) {
        double ne = 0;
        for (int c = 0; c < d; c++)
            ne += e[i * d + c] * e[i * d + c];
        ne = fmax(sqrt(ne), 1e-12);
        double z[64], mx = -INFINITY;
        for (int j = 0; j < k; j++) {
            double nw = 0, dot = 0;
            for (int c = 0; c < d; c++) {
                nw += w[j * d + c] * w[j * d + c];
                dot += e[i * d + c] * w[j * d + c];
            }
            double cs = dot / ne / fmax(sqrt(nw), 1e-12);
            cs = fmin(1.0, fmax(-1.0, cs));
            double v = cs;
            if (j == lab[i]) {
                double t = fmin(1 - 1e-7, fmax(-1 + 1e-7, cs));
                v = cos(p->m1 * acos(t) + p->m2) - p->m3;
            } else if (p->interclass_filtering_threshold > 0 && cs > p->interclass_filtering_threshold) {
                v = 0;
                if (nfiltered)
                    (*nfiltered)++;
            }
            z[j] = p->s * v;
            mx = fmax(mx, z[j]);
        }
        double se = 0;
        for (int j = 0; j < k; j++)
            se += exp(z[j] - mx);
        total += -(z[lab[i]] - mx - log(se));
    }
    return total / n;
}

/* Central differences of loss64 w.r.t. x (the array e or w, n elements) with step h. */
static void fd_grad(const head_params *p, double *e, int n, double *w, int k, int d, const int64_t *lab,
                    double *x, int count, double *g, double scale)
{
    const double h = 1e-6;
    for (int q = 0; q < count; q++) {
        double x0 = x[q];
        x[q] = x0 + h;
        double lp = loss64(p, e, n, w, k, d, lab, NULL);
        x[q] = x0 - h;
        double lm = loss64(p, e, n, w, k, d, lab, NULL);
        x[q] = x0;
        g[q] = scale * (lp - lm) / (2 * h);
    }
}

static double rel(const float *a, const double *b, int n)
{
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return sqrt(num / den);
}

/* Deterministic pseudo-random values in [-1, 1). */
static double prand(unsigned *state)
{
    *state = *state * 1664525u + 1013904223u;
    return (double)(*state >> 8) / (double)(1u << 23) - 1.0;
}

enum { N = 6, K = 9, D = 4 };

static void test_filtering(head_margin_grad mode)
{
    unsigned st = 12345;
    double e[N * D], w[K * D];
    float ef[N * D], wf[K * D];
    for (int i = 0; i < N * D; i++)
        ef[i] = (float)prand(&st), e[i] = ef[i];
    for (int i = 0; i < K * D; i++)
        wf[i] = (float)prand(&st), w[i] = wf[i];
    int64_t lab[N] = {0, 3, 8, 3, 5, 1};
    head_params p = {.s = 16,
                     .m1 = 1,
                     .m2 = 0.3,
                     .m3 = 0.1,
                     .interclass_filtering_threshold = 0.4,
                     .margin_grad = mode,
                     .mode = HEAD_MODE_GLOBAL};
    int nf;
    double l64 = loss64(&p, e, N, w, K, D, lab, &nf);
    head_ws ws;
    float ge[N * D], gw[K * D];
    double loss;
    head_ws_init(&ws, N, K, D);
    int rc = head_forward(&p, &ws, NULL, &loss, NULL, ef, wf, lab, N, K, D);
    if (rc == 0)
        rc = head_backward(&p, &ws, ge, gw, ef, wf, lab, N, K, D);
    head_ws_free(&ws);
    CHECK(rc == 0, "head rc %d: %s", rc, pf_errmsg());
    double fe[N * D], fw[K * D];
    fd_grad(&p, e, N, w, K, D, lab, e, N * D, fe, 1.0);
    fd_grad(&p, e, N, w, K, D, lab, w, K * D, fw, 1.0);
    double el = fabs(loss - l64) / l64, ee = rel(ge, fe, N * D), ew = rel(gw, fw, K * D);
    if (mode == HEAD_MARGIN_GRAD_EXACT) {
        int ok = nf > 0 && el < 1e-6 && ee < 1e-4 && ew < 1e-4;
        printf("%s filtering tau 0.4 (%d of %d non-target cosines filtered), exact: loss %.8f vs f64 %.8f "
               "rel %.1e, "
               "grad_emb rel vs finite diff %.1e, grad_cen %.1e\n",
               ok ? "ok  " : "FAIL", nf, N * (K - 1), loss, l64, el, ee, ew);
        fails += !ok;
    } else {
        /* Straight-through is not the derivative of the loss: compare the loss, and check that the
         * gradient does differ from the exact derivative (the margin's factor is dropped). */
        int ok = el < 1e-6 && ee > 1e-3;
        printf("%s filtering tau 0.4, straight_through: loss rel %.1e; grad differs from finite diff by %.1e "
               "(expected)\n",
               ok ? "ok  " : "FAIL", el, ee);
        fails += !ok;
    }
}

typedef struct local_arg {
    coll_thread_group *g;
    int rank;
    const float *e, *w;
    const int64_t *lab;
    double loss;
    float ge[N * D], gw[K * D];
    int rc;
} local_arg;

static void *local_worker(void *vp)
{
    local_arg *a = vp;
    pf_coll c;
    coll_thread_get(a->g, a->rank, &c);
    head_params p = {
        .s = 8, .m1 = 1, .m2 = 0.5, .m3 = 0, .margin_grad = HEAD_MARGIN_GRAD_EXACT, .mode = HEAD_MODE_LOCAL};
    head_ws ws;
    head_ws_init(&ws, N, K, D);
    const float *e = a->e + a->rank * N * D;
    const int64_t *lab = a->lab + a->rank * N;
    a->rc = head_forward(&p, &ws, &c, &a->loss, NULL, e, a->w, lab, N, K, D);
    if (a->rc == 0)
        a->rc = head_backward(&p, &ws, a->ge, a->gw, e, a->w, lab, N, K, D);
    head_ws_free(&ws);
    return NULL;
}

/* Local mode, 2 workers with their own batches and the same K centers: global mean loss =
 * (L0 + L1) / 2; worker r's grad_embeddings = dL/de_r; the sum of the workers' grad_centers = dL/dw. */
static void test_local_mode(void)
{
    unsigned st = 777;
    double e[2 * N * D], w[K * D];
    float ef[2 * N * D], wf[K * D];
    for (int i = 0; i < 2 * N * D; i++)
        ef[i] = (float)prand(&st), e[i] = ef[i];
    for (int i = 0; i < K * D; i++)
        wf[i] = (float)prand(&st), w[i] = wf[i];
    int64_t lab[2 * N] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 2, 4};
    head_params p = {.s = 8, .m1 = 1, .m2 = 0.5, .m3 = 0, .margin_grad = HEAD_MARGIN_GRAD_EXACT};
    double l0 = loss64(&p, e, N, w, K, D, lab, NULL), l1 = loss64(&p, e + N * D, N, w, K, D, lab + N, NULL);
    double lg = 0.5 * (l0 + l1);
    coll_thread_group *g;
    coll_thread_group_create(2, &g);
    local_arg a[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        a[r] = (local_arg){.g = g, .rank = r, .e = ef, .w = wf, .lab = lab};
        pthread_create(&th[r], NULL, local_worker, &a[r]);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    coll_thread_group_destroy(g);
    CHECK(a[0].rc == 0 && a[1].rc == 0, "local mode rc %d %d", a[0].rc, a[1].rc);
    /* Finite differences of the global mean loss: e_r only enters L_r (factor 1/2); w enters both. */
    double fe[2][N * D], fw0[K * D], fw1[K * D], fw[K * D];
    fd_grad(&p, e, N, w, K, D, lab, e, N * D, fe[0], 0.5);
    fd_grad(&p, e + N * D, N, w, K, D, lab + N, e + N * D, N * D, fe[1], 0.5);
    fd_grad(&p, e, N, w, K, D, lab, w, K * D, fw0, 0.5);
    fd_grad(&p, e + N * D, N, w, K, D, lab + N, w, K * D, fw1, 0.5);
    float gws[K * D];
    for (int q = 0; q < K * D; q++)
        fw[q] = fw0[q] + fw1[q], gws[q] = a[0].gw[q] + a[1].gw[q];
    double el = fmax(fabs(a[0].loss - lg), fabs(a[1].loss - lg)) / lg;
    double ee0 = rel(a[0].ge, fe[0], N * D), ee1 = rel(a[1].ge, fe[1], N * D), ew = rel(gws, fw, K * D);
    int ok = el < 1e-6 && ee0 < 1e-4 && ee1 < 1e-4 && ew < 1e-4;
    printf("%s local mode W=2: loss %.8f (f64 mean of worker losses %.8f) rel %.1e; grad_emb rel vs finite "
           "diff %.1e / %.1e; "
           "summed grad_cen %.1e\n",
           ok ? "ok  " : "FAIL", a[0].loss, lg, el, ee0, ee1, ew);
    fails += !ok;
}

/* A row whose label is -1 everywhere (single process): its loss is -log(1e-30). */
static void test_missing_target_and_bad_input(void)
{
    float e[2 * 3] = {1, 0, 0, 0, 1, 0}, w[2 * 3] = {1, 0, 0, 0, 0, 1};
    int64_t lab[2] = {0, -1};
    head_params p = {.s = 1, .m1 = 1, .m2 = 0, .m3 = 0};
    head_ws ws;
    head_ws_init(&ws, 2, 2, 3);
    double loss;
    float ge[6], gw[6];
    CHECK(head_forward(&p, &ws, NULL, &loss, NULL, e, w, lab, 2, 2, 3) == 0 &&
              head_backward(&p, &ws, ge, gw, e, w, lab, 2, 2, 3) == 0,
          "missing target");
    /* Row 0: target cos 1 is clamped to t = 1 - 1e-7 (m = 0: v = t), z = (t, 0): loss log(1 + exp(-t));
     * row 1: 69.07755278982137. */
    double expect = 0.5 * (log(1 + exp(-(1 - 1e-7))) + 69.07755278982137);
    CHECK(fabs(loss - expect) < 1e-7, "missing-target loss %.10f, expected %.10f", loss, expect);
    printf("ok   row with no target anywhere counts -log(1e-30): loss %.8f (expected %.8f)\n", loss, expect);

    /* No columns at all (a worker whose partition is empty, alone): every row counts 69.0776, and the
     * embedding gradient is zero. */
    int64_t none[2] = {-1, -1};
    CHECK(head_forward(&p, &ws, NULL, &loss, NULL, e, NULL, none, 2, 0, 3) == 0 &&
              head_backward(&p, &ws, ge, NULL, e, NULL, none, 2, 0, 3) == 0 &&
              fabs(loss - 69.07755278982137) < 1e-12 && ge[0] == 0 && ge[5] == 0,
          "k = 0: loss %.8f", loss);
    lab[1] = 2;
    int rc = head_forward(&p, &ws, NULL, &loss, NULL, e, w, lab, 2, 2, 3);
    CHECK(rc == -ERANGE && strstr(pf_errmsg(), "label 2 of row 1"), "label 2 of k=2: rc %d '%s'", rc,
          pf_errmsg());
    printf("ok   bad label: %s\n", pf_errmsg());
    lab[1] = 1;
    rc = head_forward(&p, &ws, NULL, &loss, NULL, e, w, lab, 3, 2, 3);
    CHECK(rc == -EINVAL, "n 3 > n_max 2 accepted");
    rc = head_forward(&p, &ws, NULL, &loss, NULL, e, w, lab, 2, 2, 4);
    CHECK(rc == -EINVAL && strstr(pf_errmsg(), "workspace"), "d mismatch: rc %d '%s'", rc, pf_errmsg());
    head_params q = p;
    q.s = 0;
    CHECK(head_forward(&q, &ws, NULL, &loss, NULL, e, w, lab, 2, 2, 3) == -EINVAL, "scale 0 accepted");
    /* The backward needs a successful forward of the same n and k on the workspace. */
    CHECK(head_backward(&p, &ws, ge, gw, e, w, lab, 2, 2, 3) == -EINVAL, "backward after a failed forward");
    CHECK(head_forward(&p, &ws, NULL, &loss, NULL, e, w, lab, 2, 2, 3) == 0 &&
              head_backward(&p, &ws, ge, gw, e, w, lab, 1, 2, 3) == -EINVAL,
          "backward of another n accepted");
    head_ws_free(&ws);
    CHECK(head_ws_init(&ws, 0, 2, 3) == -EINVAL, "n_max 0 accepted");
    head_margin_grad mg;
    head_mode hm;
    CHECK(head_parse_margin_grad("straight_through", &mg) == 0 && mg == HEAD_MARGIN_GRAD_STRAIGHT_THROUGH,
          "parse st");
    CHECK(head_parse_margin_grad("exakt", &mg) == -EINVAL && strstr(pf_errmsg(), "exakt"), "parse exakt");
    CHECK(head_parse_mode("local", &hm) == 0 && hm == HEAD_MODE_LOCAL && head_parse_mode("x", &hm) == -EINVAL,
          "parse mode");
    printf("ok   bad sizes / scale / names rejected: %s\n", pf_errmsg());

    /* From the config: the defaults (ArcFace, arcface_torch's straight-through margin gradient: its
     * CombinedMarginLoss applies the margin under torch.no_grad()); CosFace margins, exact, local mode. */
    pf_config cfg;
    cfg_defaults(&cfg);
    head_params hp;
    CHECK(head_params_from_config(&cfg, &hp) == 0 && hp.s == 64 && hp.m1 == 1.0 && hp.m2 == 0.5 &&
              hp.m3 == 0.0 && hp.margin_grad == HEAD_MARGIN_GRAD_STRAIGHT_THROUGH && hp.mode == HEAD_MODE_GLOBAL,
          "defaults: s %g m (%g %g %g) grad %d mode %d", hp.s, hp.m1, hp.m2, hp.m3, hp.margin_grad, hp.mode);
    cfg.margin_list[1] = 0;
    cfg.margin_list[2] = 0.35;
    cfg.interclass_filtering_threshold = 0.2;
    snprintf(cfg.margin_grad, sizeof cfg.margin_grad, "exact");
    snprintf(cfg.head_mode, sizeof cfg.head_mode, "local");
    CHECK(head_params_from_config(&cfg, &hp) == 0 && hp.m2 == 0 && hp.m3 == 0.35 &&
              hp.interclass_filtering_threshold == 0.2 && hp.margin_grad == HEAD_MARGIN_GRAD_EXACT &&
              hp.mode == HEAD_MODE_LOCAL,
          "cosface config");
    /* margin_combine = arcface_torch (default): CombinedMarginLoss.forward's branches. (1, 0.3, 0.2) is CosFace
     * 0.2 alone; (1.35, 0, 0) raises there, is refused here; margin_combine = full keeps any triple. */
    snprintf(cfg.head_mode, sizeof cfg.head_mode, "global");
    cfg.margin_list[0] = 1.0;
    cfg.margin_list[1] = 0.3;
    cfg.margin_list[2] = 0.2;
    CHECK(head_params_from_config(&cfg, &hp) == 0 && hp.m1 == 1.0 && hp.m2 == 0.0 && hp.m3 == 0.2,
          "(1, 0.3, 0.2) as arcface_torch: (%g, %g, %g)", hp.m1, hp.m2, hp.m3);
    cfg.margin_list[0] = 1.35;
    cfg.margin_list[1] = 0.0;
    cfg.margin_list[2] = 0.0;
    CHECK(head_params_from_config(&cfg, &hp) == -EINVAL && strstr(pf_errmsg(), "margin_combine = full"),
          "(1.35, 0, 0) refused naming margin_combine (%s)", pf_errmsg());
    snprintf(cfg.margin_combine, sizeof cfg.margin_combine, "full");
    CHECK(head_params_from_config(&cfg, &hp) == 0 && hp.m1 == 1.35, "(1.35, 0, 0) under margin_combine = full");
    cfg.margin_list[1] = 0.3;
    cfg.margin_list[2] = 0.2;
    CHECK(head_params_from_config(&cfg, &hp) == 0 && hp.m1 == 1.35 && hp.m2 == 0.3 && hp.m3 == 0.2,
          "(1.35, 0.3, 0.2) kept under margin_combine = full");
    snprintf(cfg.head_mode, sizeof cfg.head_mode, "both");
    CHECK(head_params_from_config(&cfg, &hp) == -EINVAL && strstr(pf_errmsg(), "both"),
          "head_mode both accepted");
    printf(
        "ok   head params from the config (defaults = ArcFace s 64 straight_through, CosFace + exact + local, "
        "margin_combine)\n");
}

int main(void)
{
    test_filtering(HEAD_MARGIN_GRAD_EXACT);
    test_filtering(HEAD_MARGIN_GRAD_STRAIGHT_THROUGH);
    test_local_mode();
    test_missing_target_and_bad_input();
    printf("%s (%d failures)\n", fails ? "FAIL" : "PASS", fails);
    return fails ? 1 : 0;
}
