/* Partial FC step over the ring collectives of 2 and 3 processes (libfabric tcp on 127.0.0.1):
 * allgather of labels and embeddings, sampling at rate 0.5 and 1, distributed head, reduce-scatter of
 * the embedding gradients, for 3 steps. Each process checks its loss and gradients against one
 * process running the head over the whole global batch and the union of every rank's sample (the
 * other ranks' samples recomputed locally: sampling is deterministic in (seed, step, rank)). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/coll.h"
#include "common/err.h"
#include "tests/common/mp_ring.h"
#include "worker/head/pfc.h"

enum { B = 6, D = 32, C = 97 };

static float table[C * D];

static float urand(unsigned *st)
{
    *st = *st * 1664525u + 1013904223u;
    return (float)(*st >> 8) / 16777216.0f - 0.5f;
}

static double rel(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++)
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), den += (double)b[i] * b[i];
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int body(mp_rank *m, void *arg)
{
    (void)arg;
    int rank = m->rank, W = m->world, fails = 0;
    pf_coll coll;
    coll_fabric_opts o = {.chunk_bytes = 4096, .timeout_s = 20};
    if (coll_fabric_create(m->f, rank, W, m->addrs, m->lens, &o, &coll) < 0) {
        printf("FAIL rank %d: %s\n", rank, pf_errmsg());
        return 1;
    }
    head_params p = {.s = 64,
                     .m1 = 1,
                     .m2 = 0.5,
                     .m3 = 0,
                     .margin_grad = HEAD_MARGIN_GRAD_EXACT,
                     .mode = HEAD_MODE_GLOBAL};
    const double rates[3] = {0.5, 0.5, 1.0};
    for (int step = 0; step < 3; step++) {
        /* The global batch of this step, the same in every process. */
        float emb[3 * B * D];
        int64_t lab[3 * B];
        unsigned st = 1000u + (unsigned)step;
        for (int i = 0; i < W * B * D; i++)
            emb[i] = urand(&st);
        for (int i = 0; i < W * B; i++)
            lab[i] = (int64_t)((i * 31 + step * 7) % C);
        pfc x;
        int rc = pfc_init(&x, &p, &coll, C, rates[step], 77, B, D);
        const int64_t *ids;
        int64_t k;
        if (rc == 0)
            rc = pfc_sample(&x, step, lab + rank * B, &ids, &k);
        float *cen = NULL, *gc = NULL, ge[B * D];
        double loss = NAN;
        if (rc == 0) {
            cen = malloc((size_t)(k * D) * sizeof(float));
            gc = malloc((size_t)(k * D) * sizeof(float));
            for (int64_t j = 0; j < k; j++)
                memcpy(cen + j * D, table + ids[j] * D, D * sizeof(float));
            rc = pfc_step(&x, emb + rank * B * D, cen, &loss, ge, gc);
        }
        if (rc) {
            printf("FAIL rank %d step %d: %s\n", rank, step, pf_errmsg());
            pfc_free(&x);
            free(cen);
            free(gc);
            coll_destroy(&coll);
            return 1;
        }
        /* Single process over the union of all ranks' samples. */
        int64_t uni[C], ku = 0;
        for (int r = 0; r < W; r++) {
            sample_args a = {.num_classes = C,
                             .world_size = W,
                             .rank = r,
                             .sample_rate = rates[step],
                             .seed = 77,
                             .step = step,
                             .mode = SAMPLE_GLOBAL};
            int64_t *ri, rk;
            sample_classes(&a, lab, W * B, &ri, &rk, NULL);
            memcpy(uni + ku, ri, (size_t)rk * sizeof(int64_t));
            ku += rk;
            free(ri);
        }
        qsort(uni, (size_t)ku, sizeof(int64_t), cmp64);
        float *ucen = malloc((size_t)(ku * D) * sizeof(float)),
              *ugc = malloc((size_t)(ku * D) * sizeof(float));
        float uge[3 * B * D];
        int64_t uloc[3 * B];
        for (int64_t j = 0; j < ku; j++)
            memcpy(ucen + j * D, table + uni[j] * D, D * sizeof(float));
        for (int i = 0; i < W * B; i++) {
            uloc[i] = -1;
            for (int64_t j = 0; j < ku; j++)
                if (uni[j] == lab[i])
                    uloc[i] = j;
        }
        head_ws ws;
        double uloss;
        rc = head_ws_init(&ws, W * B, ku, D);
        if (rc == 0)
            rc = head_forward(&p, &ws, NULL, &uloss, NULL, emb, ucen, uloc, W * B, ku, D);
        if (rc == 0)
            rc = head_backward(&p, &ws, uge, ugc, emb, ucen, uloc, W * B, ku, D);
        head_ws_free(&ws);
        float *ref = malloc((size_t)(k * D) * sizeof(float));
        for (int64_t j = 0; j < k; j++) {
            int64_t u = 0;
            while (uni[u] != ids[j])
                u++;
            memcpy(ref + j * D, ugc + u * D, D * sizeof(float));
        }
        double el = fabs(loss - uloss) / uloss, ee = rel(ge, uge + rank * B * D, B * D),
               ec = rel(gc, ref, (size_t)(k * D));
        int ok = rc == 0 && el <= 1e-6 && ee <= 1e-5 && ec <= 1e-5;
        printf("%s W=%d rank %d step %d rate %.1f: %lld of %lld sampled centers here; loss %.6f vs single "
               "%.6f rel %.1e; "
               "grad_emb rel %.1e; grad_cen rel %.1e\n",
               ok ? "ok  " : "FAIL", W, rank, step, rates[step], (long long)k, (long long)ku, loss, uloss, el,
               ee, ec);
        fails += !ok;
        free(ref);
        free(ucen);
        free(ugc);
        free(cen);
        free(gc);
        pfc_free(&x);
    }
    coll_destroy(&coll);
    return fails ? 1 : 0;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    unsigned st = 5;
    for (int i = 0; i < C * D; i++)
        table[i] = urand(&st);
    int r2 = mp_ring_run(2, body, NULL, 60);
    if (r2 == 77) {
        printf("SKIP: libfabric tcp provider not available\n");
        return 77;
    }
    int r3 = mp_ring_run(3, body, NULL, 60);
    printf("%s: Partial FC over ring collectives, W=2 %s, W=3 %s\n", (r2 || r3) ? "FAIL" : "PASS",
           r2 ? "FAIL" : "ok", r3 ? "FAIL" : "ok");
    return (r2 || r3) ? 1 : 0;
}
