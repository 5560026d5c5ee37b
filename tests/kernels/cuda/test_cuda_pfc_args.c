/* Host-side checks of the CUDA Partial FC step (worker/head/pfc_cuda.h) and the distributed CUDA head
 * (cuda_head_dist, cuda_head_ws_init_coll): runs everywhere the CUDA device builds, GPU or not.
 * Every argument refusal happens before the GPU is touched and names the problem (-EINVAL); a valid
 * request without a GPU is refused with -ENODEV ("no CUDA device"), with a GPU it succeeds and the
 * per-step refusals (no pfc_sample, another pfc, NULL inputs, shapes outside the workspace) follow.
 * A failed create leaves the state zeroed, so pfc_cuda_free and pfc_cuda_step on it are safe. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/coll.h"
#include "common/err.h"
#include "kernels/cuda/cuda_ops.h"
#include "tests/check.h"
#include "worker/head/pfc_cuda.h"

/* rc must be `want` and pf_errmsg() must contain `word`. */
static void refused(int rc, int want, const char *word, const char *what)
{
    int ok = rc == want && strstr(pf_errmsg(), word) != NULL;
    printf("%-4s %-58s rc %d (%s)\n", ok ? "ok" : "FAIL", what, rc, rc ? pf_errmsg() : "");
    CHECK(ok, "%s: rc %d, expected %d with '%s' in the message", what, rc, want, word);
}

static int zeroed(const pfc_cuda *g)
{
    static const pfc_cuda z;
    return memcmp(g, &z, sizeof z) == 0;
}

int main(void)
{
    int gpus = cuda_device_count();
    printf("CUDA devices visible: %d\n", gpus);
    head_params hp = {.s = 64,
                      .m1 = 1,
                      .m2 = 0.5,
                      .m3 = 0,
                      .margin_grad = HEAD_MARGIN_GRAD_EXACT,
                      .mode = HEAD_MODE_GLOBAL};
    enum { C = 100, B = 4, D = 8 };
    pfc host1, host2;
    CHECK(pfc_init(&host1, &hp, NULL, C, 0.5, 7, B, D) == 0, "pfc_init: %s", pf_errmsg());
    coll_thread_group *g2 = NULL, *g3 = NULL;
    pf_coll c0, c1, c3;
    CHECK(coll_thread_group_create(2, &g2) == 0 && coll_thread_group_create(3, &g3) == 0, "groups");
    coll_thread_get(g2, 0, &c0);
    coll_thread_get(g2, 1, &c1);
    coll_thread_get(g3, 0, &c3);
    /* pfc_init does no collective: a rank-0 host state of a 2-worker group can be made alone */
    CHECK(pfc_init(&host2, &hp, &c0, C, 0.5, 7, B, D) == 0, "pfc_init W=2: %s", pf_errmsg());

    pfc_cuda g;
    memset(&g, 0x5a, sizeof g);
    refused(pfc_cuda_create(NULL, &host1, NULL, 0), -EINVAL, "NULL", "create: NULL state");
    refused(pfc_cuda_create(&g, NULL, NULL, 0), -EINVAL, "pfc_init", "create: NULL host pfc");
    CHECK(zeroed(&g), "a refused create leaves the state zeroed");
    pfc zero;
    memset(&zero, 0, sizeof zero);
    refused(pfc_cuda_create(&g, &zero, NULL, 0), -EINVAL, "pfc_init", "create: host pfc not initialized");
    refused(pfc_cuda_create(&g, &host2, NULL, 0), -EINVAL, "needs a device pf_coll",
            "create: world 2 without coll");
    refused(pfc_cuda_create(&g, &host2, &c1, 0), -EINVAL, "not the host pfc's group",
            "create: coll of rank 1 for rank 0");
    refused(pfc_cuda_create(&g, &host2, &c3, 0), -EINVAL, "not the host pfc's group",
            "create: coll of 3 for a group of 2");
    refused(pfc_cuda_create(&g, &host1, &c0, 0), -EINVAL, "not the host pfc's group",
            "create: coll of 2 for one process");
    pfc bad = host1;
    bad.params.s = 0;
    refused(pfc_cuda_create(&g, &bad, NULL, 0), -EINVAL, "scale", "create: scale 0");
    bad = host1;
    bad.params.m2 = NAN;
    refused(pfc_cuda_create(&g, &bad, NULL, 0), -EINVAL, "finite", "create: margin NaN");
    bad = host1;
    bad.params.interclass_filtering_threshold = INFINITY;
    refused(pfc_cuda_create(&g, &bad, NULL, 0), -EINVAL, "threshold", "create: threshold inf");
    bad = host1;
    bad.k_max = (int64_t)INT_MAX + 1;
    refused(pfc_cuda_create(&g, &bad, NULL, 0), -EINVAL, "at most", "create: k_max above INT_MAX");
    bad = host1;
    bad.n = B + 1;
    refused(pfc_cuda_create(&g, &bad, NULL, 0), -EINVAL, "rows for batch", "create: n not W*B");
    CHECK(zeroed(&g), "every refused create leaves the state zeroed");

    /* a valid request: -ENODEV without a GPU (and nothing to free), 0 with one */
    int rc = pfc_cuda_create(&g, &host1, NULL, 0);
    if (!gpus) {
        refused(rc, -ENODEV, "no CUDA device", "create without a GPU");
        CHECK(zeroed(&g), "state zeroed after -ENODEV");
    } else {
        CHECK(rc == 0, "create with a GPU: %s", pf_errmsg());
    }

    float dummy = 0;
    double loss = NAN;
    pfc_cuda none;
    memset(&none, 0, sizeof none);
    refused(pfc_cuda_step(NULL, &host1, &dummy, &dummy, &loss, NULL, NULL), -EINVAL, "not created",
            "step: NULL state");
    refused(pfc_cuda_step(&none, &host1, &dummy, &dummy, &loss, NULL, NULL), -EINVAL, "not created",
            "step: state never created");
    pfc_cuda_free(&none);
    pfc_cuda_free(NULL);

    /* workspace and head refusals before the GPU */
    cuda_head_ws ws;
    refused(cuda_head_ws_init_coll(NULL, 4, 4, 4, 0), -EINVAL, "NULL", "ws: NULL");
    refused(cuda_head_ws_init_coll(&ws, 0, 4, 4, 1), -EINVAL, "n_max 0", "ws: n_max 0");
    refused(cuda_head_ws_init_coll(&ws, 4, -1, 4, 1), -EINVAL, "k_max -1", "ws: k_max -1");
    refused(cuda_head_ws_init_coll(&ws, 4, 4, 0, 0), -EINVAL, "d 0", "ws: d 0");
    cuda_head_params cp = {.s = 64, .m1 = 1, .m2 = 0.5, .m3 = 0};
    int64_t lab = 0;
    memset(&ws, 0, sizeof ws);
    refused(cuda_head_dist(NULL, 0, &ws, NULL, &dummy, 1, &dummy, 1, &lab, &loss, NULL, NULL, NULL, NULL),
            -EINVAL, "NULL", "head: NULL params");
    refused(cuda_head_dist(&cp, 0, &ws, NULL, &dummy, 1, &dummy, 1, &lab, &loss, NULL, NULL, NULL, NULL),
            -EINVAL, "not initialized", "head: workspace not initialized");
    CHECK(gpus || cuda_managed_concurrent() == 0, "cuda_managed_concurrent() is 0 without a GPU");

    if (gpus) {
        /* per-step refusals on a created state */
        refused(pfc_cuda_step(&g, &host1, &dummy, &dummy, &loss, NULL, NULL), -EINVAL, "without pfc_sample",
                "step before pfc_sample");
        int64_t labels[B] = {1, 2, 3, 99};
        const int64_t *ids;
        int64_t k;
        CHECK(pfc_sample(&host1, 0, labels, &ids, &k) == 0 && k > 0, "pfc_sample: %s", pf_errmsg());
        refused(pfc_cuda_step(&g, &host1, NULL, &dummy, &loss, NULL, NULL), -EINVAL, "NULL embeddings",
                "step: NULL embeddings");
        refused(pfc_cuda_step(&g, &host1, &dummy, NULL, &loss, NULL, NULL), -EINVAL, "no centers",
                "step: k > 0 and NULL centers");
        pfc other;
        CHECK(pfc_init(&other, &hp, NULL, C, 0.5, 7, B, D + 1) == 0, "pfc_init other");
        CHECK(pfc_sample(&other, 0, labels, &ids, &k) == 0, "pfc_sample other");
        refused(pfc_cuda_step(&g, &other, &dummy, &dummy, &loss, NULL, NULL), -EINVAL, "not the one",
                "step: a host pfc of another shape");
        pfc_free(&other);
        CHECK(cuda_head_ws_init_coll(&ws, 4, 4, 4, 1) == 0, "managed workspace: %s", pf_errmsg());
        refused(cuda_head_dist(&cp, 0, &ws, NULL, &dummy, 5, &dummy, 1, &lab, &loss, NULL, NULL, NULL, NULL),
                -EINVAL, "do not fit", "head: n above n_max");
        cp.tau = NAN;
        refused(cuda_head_dist(&cp, 0, &ws, NULL, &dummy, 1, &dummy, 1, &lab, &loss, NULL, NULL, NULL, NULL),
                -EINVAL, "tau", "head: tau NaN");
        cuda_head_ws_free(&ws);
        pfc_cuda_free(&g);
        CHECK(zeroed(&g), "pfc_cuda_free zeroes the state");
    } else {
        refused(cuda_head_ws_init_coll(&ws, 4, 4, 4, 1), -ENODEV, "no GPU", "ws without a GPU");
    }

    pfc_free(&host1);
    pfc_free(&host2);
    coll_thread_group_destroy(g2);
    coll_thread_group_destroy(g3);
    printf("%s\n", fails ? "FAILED" : "all passed");
    return fails != 0;
}
