/* Distributed == single process for the backbone: the gradient after the allreduce equals the mean of the
 * per-worker gradients.
 *
 * W = 2 and 3 forked ranks (tests/common/mp_ring.h: one libfabric tcp endpoint each on 127.0.0.1) build
 * the ring collectives the training loop uses (coll_fabric_create) and a tiny backbone, r18_w8 with
 * embedding 16 and batch 2, initialised from the same seed. Each rank feeds its own input and its own
 * grad_embeddings (seeded by rank), runs forward + backward, copies its gradient (before any collective)
 * into a shared mapping, then does exactly what worker/train.c does after model_backward:
 *     coll_allreduce(grads, nparams, F32, SUM);  g[i] *= 1.f / W
 * Each rank then compares its result with the float64 mean of all ranks' captured gradients, computed
 * here:
 *   - norm-relative error ||g - mean|| / ||mean|| <= 1e-6 (the allreduce adds W float32 terms in its order);
 *   - elementwise |g_i - mean_i| <= 1e-6 * (1/W) sum_r |g_r,i| (float32 summation of W terms is
 *     accurate relative to the sum of magnitudes, not to a cancelling mean);
 *   - every rank ends with bitwise the same gradient (coll.h promises it; DDP's replicas must agree);
 *   - the ranks' gradients really differ (otherwise returning one's own gradient would pass).
 * Also W = 3 with 12 KiB ring messages (segments cut into many chunks, as for a real backbone).
 * Prints the max errors per case. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/coll.h"
#include "common/err.h"
#include "tests/common/mp_ring.h"
#include "worker/model/model.h"

#define NETWORK "r18_w8"
enum { EMB = 16, BATCH = 2, IMG = 3 * 112 * 112 };
#define TOL 1e-6
#define CAP ((size_t)4 << 20) /* floats per rank slot in the shared mapping (r18_w8 needs far fewer) */

typedef struct shared {
    size_t nparams[MP_MAXW];
    double norm_rel[MP_MAXW], elem_rel[MP_MAXW], spread;
    int mismatch;
    size_t chunk_bytes; /* ring message size, 0 = the default (what training uses) */
    float *pre;         /* [W][CAP]: each rank's gradient before the allreduce */
    float *post;        /* [W][CAP]: after allreduce + divide */
} shared;

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float urand(uint64_t *s)
{
    return (float)(ldexp((double)(splitmix(s) >> 11), -53) * 2.0 - 1.0);
}

static int body(mp_rank *mr, void *arg)
{
    shared *sh = arg;
    const int rank = mr->rank, W = mr->world;
    int fails = 0, have_coll = 0;
    model *m = NULL;
    pf_coll coll;
    float *in = malloc(sizeof(float) * (size_t)BATCH * IMG), ge[BATCH * EMB];
    coll_fabric_opts co = {.chunk_bytes = sh->chunk_bytes, .timeout_s = 60};
    int rc = in ? coll_fabric_create(mr->f, rank, W, mr->addrs, mr->lens, &co, &coll) : -ENOMEM;
    have_coll = rc == 0;
    if (rc == 0)
        rc = model_create(&m, NETWORK, EMB, BATCH);
    size_t n = 0;
    if (rc == 0) {
        model_init(m, 2048);
        n = model_num_params(m);
        sh->nparams[rank] = n;
        if (n > CAP)
            rc = pf_err(-ENOSPC, "%zu parameters do not fit the test's %zu-float slot", n, CAP);
    }
    if (rc == 0) {
        uint64_t s = 1000 + (uint64_t)rank;
        for (size_t i = 0; i < (size_t)BATCH * IMG; i++)
            in[i] = urand(&s);
        for (int i = 0; i < BATCH * EMB; i++)
            ge[i] = urand(&s);
        const float *emb;
        model_zero_grad(m);
        rc = model_forward(m, in, BATCH, 1, &emb);
        if (rc == 0)
            rc = model_backward(m, ge, NULL);
    }
    float *g = rc == 0 ? model_grads(m) : NULL;
    if (rc == 0) {
        memcpy(sh->pre + (size_t)rank * CAP, g, n * sizeof(float));
        /* What worker/train.c does after model_backward. */
        rc = coll_allreduce(&coll, g, n, COLL_F32, COLL_SUM);
    }
    if (rc == 0) {
        float inv = 1.f / (float)W;
        for (size_t i = 0; i < n; i++)
            g[i] *= inv;
        memcpy(sh->post + (size_t)rank * CAP, g, n * sizeof(float));
        rc = coll_barrier(&coll); /* every rank's captures are in place */
    }
    if (rc == 0) {
        for (int r = 0; r < W; r++)
            if (sh->nparams[r] != n) {
                printf("FAIL W=%d rank %d: rank %d has %zu parameters, I have %zu\n", W, rank, r,
                       sh->nparams[r], n);
                fails++;
            }
        double num = 0, den = 0, elem = 0;
        for (size_t i = 0; i < n && !fails; i++) {
            double mean = 0, mag = 0;
            for (int r = 0; r < W; r++) {
                double v = sh->pre[(size_t)r * CAP + i];
                mean += v;
                mag += fabs(v);
            }
            mean /= W;
            mag /= W;
            double e = fabs((double)g[i] - mean);
            num += e * e;
            den += mean * mean;
            if (mag > 0)
                elem = fmax(elem, e / mag);
            else if (e > 0)
                elem = INFINITY;
        }
        sh->norm_rel[rank] = sqrt(num) / fmax(sqrt(den), 1e-300);
        sh->elem_rel[rank] = elem;
        if (!(den > 0)) {
            printf("FAIL W=%d rank %d: the mean gradient is zero: nothing was compared\n", W, rank);
            fails++;
        }
        if (!(sh->norm_rel[rank] <= TOL) || !(elem <= TOL)) {
            printf("FAIL W=%d rank %d: allreduced gradient vs float64 mean: norm rel %.3g, elementwise %.3g "
                   "(tol %.0e)\n",
                   W, rank, sh->norm_rel[rank], elem, TOL);
            fails++;
        }
        if (rank == 0) {
            for (int r = 1; r < W; r++)
                if (memcmp(sh->post, sh->post + (size_t)r * CAP, n * sizeof(float))) {
                    printf("FAIL W=%d: rank %d's allreduced gradient is not bitwise rank 0's\n", W, r);
                    sh->mismatch = 1;
                    fails++;
                }
            /* The ranks' own gradients must differ for the check to mean anything. */
            double spread = INFINITY;
            for (int r = 1; r < W; r++) {
                double a = 0, b = 0;
                for (size_t i = 0; i < n; i++) {
                    double d = (double)sh->pre[(size_t)r * CAP + i] - sh->pre[i];
                    a += d * d;
                    b += (double)sh->pre[i] * sh->pre[i];
                }
                spread = fmin(spread, sqrt(a) / fmax(sqrt(b), 1e-300));
            }
            sh->spread = spread;
            if (!(spread > 1e-2)) {
                printf("FAIL W=%d: per-rank gradients differ by only %.3g: the test cannot tell a mean from "
                       "a copy\n",
                       W, spread);
                fails++;
            }
        }
        rc = coll_barrier(&coll); /* nobody closes while a peer may still send */
    }
    if (rc < 0) {
        printf("FAIL W=%d rank %d: %s\n", W, rank, pf_errmsg());
        fails++;
    }
    model_free(m);
    if (have_coll)
        coll_destroy(&coll);
    free(in);
    return fails ? 1 : 0;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    size_t bytes = sizeof(float) * CAP * MP_MAXW;
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    float *pre = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    float *post =
        mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (sh == MAP_FAILED || pre == MAP_FAILED || post == MAP_FAILED) {
        printf("FAIL: mmap\n");
        return 1;
    }
    int fails = 0;
    double worst_norm = 0, worst_elem = 0;
    /* W = 2, 3 with the default 1 MiB messages (one per ring segment here, as training sends them), and
     * W = 3 with 12 KiB messages: every segment cut into many chunks, as for a real backbone. */
    const int cases_w[3] = {2, 3, 3};
    const size_t cases_chunk[3] = {0, 0, 12288};
    for (int ci = 0; ci < 3; ci++) {
        const int W = cases_w[ci];
        memset(sh, 0, sizeof *sh);
        sh->pre = pre;
        sh->post = post;
        sh->chunk_bytes = cases_chunk[ci];
        int rc = mp_ring_run(W, body, sh, 90);
        if (rc == 77)
            return 77;
        double nr = 0, er = 0;
        for (int r = 0; r < W; r++)
            nr = fmax(nr, sh->norm_rel[r]), er = fmax(er, sh->elem_rel[r]);
        printf("%s W=%d chunk %-7s %s emb %d batch %d, %zu parameters: allreduce(sum)/W vs float64 mean of "
               "the per-rank "
               "gradients: norm rel %.2e, elementwise (vs mean |g|) %.2e (tol %.0e); ranks' own gradients "
               "differ by "
               "%.2e\n",
               rc ? "FAIL" : "ok  ", W, cases_chunk[ci] ? "12 KiB" : "default", NETWORK, EMB, BATCH,
               sh->nparams[0], nr, er, TOL, sh->spread);
        worst_norm = fmax(worst_norm, nr);
        worst_elem = fmax(worst_elem, er);
        fails += rc != 0;
    }
    printf("%s: backbone gradient after the ring allreduce == mean of per-worker gradients, W = 2, 3: max "
           "norm rel "
           "%.2e, elementwise %.2e (tol %.0e)\n",
           fails ? "FAIL" : "PASS", worst_norm, worst_elem, TOL);
    return fails ? 1 : 0;
}
