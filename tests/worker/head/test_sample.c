/* Class-center sampling: every positive is in the sample, the size is int(rate * partition) (arcface_torch;
 * ceil(rate * partition) under ceil_count) (or the
 * positive count when larger), ids sorted, unique, inside the rank's partition, labels remapped to
 * the right positions, same (seed, step, rank) -> same sample, different steps/ranks -> different
 * samples, negatives roughly uniform (chi-square), bad input rejected with a message. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "worker/head/sample.h"

#include "tests/check.h"

/* Checks one sample against its definition; returns 0 when all holds. */
static int check_sample(const sample_args *a, const int64_t *labels, int64_t n, const int64_t *ids, int64_t k,
                        const int64_t *loc)
{
    int f0 = fails;
    int global = a->mode == SAMPLE_GLOBAL;
    int64_t W = global ? a->world_size : 1, r = global ? a->rank : 0;
    /* Partition size counted by hand. */
    int64_t part = 0;
    for (int64_t c = 0; c < a->num_classes; c++)
        part += (c % W == r);
    int64_t want = a->ceil_count ? (int64_t)ceil(a->sample_rate * (double)part - 1e-9)
                                 : (int64_t)(a->sample_rate * (double)part);
    if (a->sample_rate >= 1)
        want = part;
    int64_t npos = 0;
    for (int64_t i = 0; i < n; i++) {
        if (labels[i] % W != r)
            continue;
        int dup = 0;
        for (int64_t j = 0; j < i; j++)
            dup |= labels[j] == labels[i];
        npos += !dup;
    }
    if (npos > want)
        want = npos;
    CHECK(k == want, "size %lld, expected %lld (partition %lld, rate %g, %lld positives)", (long long)k,
          (long long)want, (long long)part, a->sample_rate, (long long)npos);
    for (int64_t j = 0; j < k; j++) {
        CHECK(ids[j] >= 0 && ids[j] < a->num_classes && ids[j] % W == r,
              "id %lld not in rank %lld's partition", (long long)ids[j], (long long)r);
        if (j)
            CHECK(ids[j] > ids[j - 1], "ids not strictly increasing at %lld", (long long)j);
    }
    for (int64_t i = 0; i < n; i++) {
        if (labels[i] % W == r) {
            CHECK(loc[i] >= 0 && loc[i] < k && ids[loc[i]] == labels[i],
                  "positive %lld (row %lld) missing or remapped wrong", (long long)labels[i], (long long)i);
        } else {
            CHECK(loc[i] == -1, "row %lld label %lld of another rank remapped to %lld", (long long)i,
                  (long long)labels[i], (long long)loc[i]);
        }
    }
    return fails != f0;
}

static void test_global_rate_01(void)
{
    const int64_t C = 10007, n = 64;
    int64_t labels[64];
    for (int64_t i = 0; i < n; i++)
        labels[i] = (i * 7919 + 13) % C;
    labels[5] = labels[9]; /* a duplicate positive */
    for (int W = 1; W <= 3; W++) {
        for (int r = 0; r < W; r++) {
            int64_t *prev = NULL, prevk = 0;
            for (int64_t step = 0; step < 4; step++) {
                sample_args a = {.num_classes = C,
                                 .world_size = W,
                                 .rank = r,
                                 .sample_rate = 0.1,
                                 .seed = 2048,
                                 .step = step,
                                 .mode = SAMPLE_GLOBAL};
                int64_t *ids, k, loc[64];
                int rc = sample_classes(&a, labels, n, &ids, &k, loc);
                CHECK(rc == 0, "sample rc %d: %s", rc, pf_errmsg());
                if (rc)
                    return;
                check_sample(&a, labels, n, ids, k, loc);
                /* Deterministic: the same call again gives the same ids. */
                int64_t *ids2, k2, loc2[64];
                sample_classes(&a, labels, n, &ids2, &k2, loc2);
                CHECK(k2 == k && memcmp(ids, ids2, (size_t)k * sizeof(int64_t)) == 0,
                      "same (seed, step, rank) differs");
                free(ids2);
                if (prev) {
                    CHECK(prevk == k && memcmp(prev, ids, (size_t)k * sizeof(int64_t)) != 0,
                          "W=%d rank %d: step %lld gives the same sample as step %lld", W, r, (long long)step,
                          (long long)step - 1);
                }
                if (step == 0)
                    printf("ok   W=%d rank %d rate 0.1: %lld ids, first %lld %lld %lld\n", W, r, (long long)k,
                           (long long)ids[0], (long long)ids[1], (long long)ids[2]);
                free(prev);
                prev = ids;
                prevk = k;
            }
            free(prev);
        }
    }
}

static void test_rate_1_and_local(void)
{
    const int64_t C = 1000, n = 16;
    int64_t labels[16];
    for (int64_t i = 0; i < n; i++)
        labels[i] = (i * 37 + 5) % C;
    sample_args a = {.num_classes = C,
                     .world_size = 3,
                     .rank = 2,
                     .sample_rate = 1.0,
                     .seed = 1,
                     .step = 3,
                     .mode = SAMPLE_GLOBAL};
    int64_t *ids, k, loc[16];
    CHECK(sample_classes(&a, labels, n, &ids, &k, loc) == 0, "rate 1");
    check_sample(&a, labels, n, ids, k, loc);
    for (int64_t j = 0; j < k; j++)
        CHECK(ids[j] == 2 + 3 * j, "rate 1: id %lld is %lld", (long long)j, (long long)ids[j]);
    free(ids);

    /* Local mode: partition = all classes, different ranks differ. */
    sample_args b = {.num_classes = C,
                     .world_size = 2,
                     .rank = 0,
                     .sample_rate = 0.05,
                     .seed = 1,
                     .step = 3,
                     .mode = SAMPLE_LOCAL};
    int64_t *i0, *i1, k0, k1;
    CHECK(sample_classes(&b, labels, n, &i0, &k0, loc) == 0, "local rank 0");
    check_sample(&b, labels, n, i0, k0, loc);
    b.rank = 1;
    CHECK(sample_classes(&b, labels, n, &i1, &k1, loc) == 0, "local rank 1");
    check_sample(&b, labels, n, i1, k1, loc);
    CHECK(k0 == 50 && k1 == 50, "local sizes %lld %lld, expected 50", (long long)k0, (long long)k1);
    CHECK(memcmp(i0, i1, 50 * sizeof(int64_t)) != 0, "local ranks 0 and 1 drew the same sample");
    free(i0);
    free(i1);
    printf("ok   rate 1 takes the whole partition; local mode rate 0.05: 50 ids per rank\n");

    /* More positives than the sample size: the sample is exactly the positives. */
    sample_args c = {.num_classes = C,
                     .world_size = 1,
                     .rank = 0,
                     .sample_rate = 0.001,
                     .seed = 9,
                     .step = 0,
                     .mode = SAMPLE_GLOBAL};
    CHECK(sample_classes(&c, labels, n, &ids, &k, loc) == 0, "tiny rate");
    CHECK(k == 16, "tiny rate: %lld ids, expected the 16 positives", (long long)k);
    check_sample(&c, labels, n, ids, k, loc);
    free(ids);
}

/* sample_rate 0 (arcface_torch's num_sample = 0, wf42m_pfc0008_32gpu_r100.py): the sample is exactly the
 * distinct positives of the partition, sorted, written down by hand here. C = 20 over W = 3 (rank r owns
 * c = r mod 3); global batch labels {7, 3, 7, 19, 10, 3, 0, 13}: rank 0 owns 3, 0 -> {0, 3}; rank 1 owns 7,
 * 19, 10, 13 -> {7, 10, 13, 19}; rank 2 owns none -> empty. Local mode (one worker's batch {5, 2, 5}, all 20
 * classes its own): {2, 5}. */
static void test_rate_0(void)
{
    const int64_t labels[8] = {7, 3, 7, 19, 10, 3, 0, 13};
    const int64_t want0[2] = {0, 3}, want1[4] = {7, 10, 13, 19};
    const int64_t *want[3] = {want0, want1, NULL};
    const int64_t nwant[3] = {2, 4, 0};
    for (int r = 0; r < 3; r++) {
        for (int64_t step = 0; step < 3; step++) {
            sample_args a = {.num_classes = 20,
                             .world_size = 3,
                             .rank = r,
                             .sample_rate = 0,
                             .seed = 2048,
                             .step = step,
                             .mode = SAMPLE_GLOBAL};
            int64_t *ids = NULL, k = -1, loc[8];
            int rc = sample_classes(&a, labels, 8, &ids, &k, loc);
            CHECK(rc == 0 && k == nwant[r], "rate 0 rank %d step %lld: rc %d, %lld ids (want %lld): %s", r,
                  (long long)step, rc, (long long)k, (long long)nwant[r], rc ? pf_errmsg() : "");
            for (int64_t j = 0; rc == 0 && j < k && j < nwant[r]; j++)
                CHECK(ids[j] == want[r][j], "rate 0 rank %d: id %lld is %lld, want %lld", r, (long long)j,
                      (long long)ids[j], (long long)want[r][j]);
            for (int i = 0; rc == 0 && i < 8; i++) {
                int mine = labels[i] % 3 == r;
                CHECK(mine ? (loc[i] >= 0 && loc[i] < k && ids[loc[i]] == labels[i]) : loc[i] == -1,
                      "rate 0 rank %d: row %d (label %lld) remapped to %lld", r, i, (long long)labels[i],
                      (long long)loc[i]);
            }
            free(ids);
        }
    }
    const int64_t mine[3] = {5, 2, 5};
    sample_args l = {.num_classes = 20, .world_size = 2, .rank = 1, .sample_rate = 0, .seed = 1,
                     .step = 4, .mode = SAMPLE_LOCAL};
    int64_t *ids = NULL, k = -1, loc[3];
    CHECK(sample_classes(&l, mine, 3, &ids, &k, loc) == 0 && k == 2 && ids[0] == 2 && ids[1] == 5 &&
              loc[0] == 1 && loc[1] == 0 && loc[2] == 1,
          "rate 0 local: %lld ids", (long long)k);
    free(ids);
    CHECK(sample_count(0, 1000, 0) == 0 && sample_count(0, 1000, 1) == 0, "sample_count(0, 1000) = %lld",
          (long long)sample_count(0, 1000, 0));
    printf("ok   rate 0: exactly the positives ({0, 3}, {7, 10, 13, 19}, {} over 3 ranks; {2, 5} local)\n");
}

/* Negatives are uniform: draw many samples of 10 out of 100 (no positives), chi-square over ids. */
static void test_uniform(void)
{
    const int64_t C = 100;
    double cnt[100] = {0};
    const int trials = 4000;
    int64_t lab = 0;
    for (int t = 0; t < trials; t++) {
        sample_args a = {.num_classes = C,
                         .world_size = 1,
                         .rank = 0,
                         .sample_rate = 0.1,
                         .seed = 77,
                         .step = t,
                         .mode = SAMPLE_GLOBAL};
        int64_t *ids, k;
        if (sample_classes(&a, &lab, 0, &ids, &k, NULL) != 0 || k != 10) {
            CHECK(0, "uniform draw %d failed (k %lld)", t, (long long)k);
            return;
        }
        for (int64_t j = 0; j < k; j++)
            cnt[ids[j]] += 1;
        free(ids);
    }
    double expect = trials * 10.0 / C, chi2 = 0;
    for (int c = 0; c < C; c++)
        chi2 += (cnt[c] - expect) * (cnt[c] - expect) / expect;
    /* 99 degrees of freedom: mean 99, sd ~14; 99.9th percentile ~148. */
    CHECK(chi2 < 148.0, "chi-square %.1f over 100 ids: negatives not uniform", chi2);
    printf("%s uniformity: chi-square %.1f (99 dof, bound 148)\n", chi2 < 148.0 ? "ok  " : "FAIL", chi2);
}

/* Huge partition: 1e9 classes over 4 workers at rate 1e-5 samples 2500 ids without O(partition) memory. */
static void test_huge(void)
{
    int64_t labels[4] = {4, 999999996, 123456788, 7};
    sample_args a = {.num_classes = 1000000000LL,
                     .world_size = 4,
                     .rank = 0,
                     .sample_rate = 1e-5,
                     .seed = 5,
                     .step = 11,
                     .mode = SAMPLE_GLOBAL};
    int64_t *ids, k, loc[4];
    CHECK(sample_classes(&a, labels, 4, &ids, &k, loc) == 0, "huge: %s", pf_errmsg());
    CHECK(k == 2500, "huge: %lld ids, expected 2500", (long long)k);
    CHECK(loc[0] >= 0 && ids[loc[0]] == 4 && loc[1] >= 0 && ids[loc[1]] == 999999996 && loc[2] >= 0 &&
              ids[loc[2]] == 123456788 && loc[3] == -1,
          "huge: positives remapped wrong");
    for (int64_t j = 1; j < k; j++)
        CHECK(ids[j] > ids[j - 1] && ids[j] % 4 == 0, "huge: id %lld", (long long)ids[j]);
    printf("ok   1e9 classes / 4 workers at rate 1e-5: %lld ids, last %lld\n", (long long)k,
           (long long)ids[k - 1]);
    free(ids);
}

static void test_bad_input(void)
{
    int64_t labels[3] = {1, 50, 2};
    int64_t *ids, k;
    sample_args a = {.num_classes = 50,
                     .world_size = 2,
                     .rank = 0,
                     .sample_rate = 0.5,
                     .seed = 1,
                     .step = 0,
                     .mode = SAMPLE_GLOBAL};
    int rc = sample_classes(&a, labels, 3, &ids, &k, NULL);
    CHECK(rc == -ERANGE && strstr(pf_errmsg(), "label 50") && strstr(pf_errmsg(), "row 1"),
          "label out of range: rc %d msg '%s'", rc, pf_errmsg());
    printf("ok   bad label: %s\n", pf_errmsg());
    labels[1] = 3;
    a.sample_rate = -0.1;
    rc = sample_classes(&a, labels, 3, &ids, &k, NULL);
    CHECK(rc == -EINVAL && strstr(pf_errmsg(), "sample_rate") && strstr(pf_errmsg(), "[0, 1]"),
          "rate -0.1: rc %d msg '%s'", rc, pf_errmsg());
    a.sample_rate = NAN;
    CHECK(sample_classes(&a, labels, 3, &ids, &k, NULL) == -EINVAL, "rate NaN accepted");
    a.sample_rate = 1.5;
    CHECK(sample_classes(&a, labels, 3, &ids, &k, NULL) == -EINVAL, "rate 1.5 accepted");
    a.sample_rate = 0.5;
    a.rank = 2;
    rc = sample_classes(&a, labels, 3, &ids, &k, NULL);
    CHECK(rc == -EINVAL && strstr(pf_errmsg(), "rank 2"), "rank 2 of 2: rc %d msg '%s'", rc, pf_errmsg());
    a.rank = 0;
    a.num_classes = 0;
    CHECK(sample_classes(&a, labels, 3, &ids, &k, NULL) == -EINVAL, "num_classes 0 accepted");
    printf("ok   bad rate / rank / num_classes rejected: %s\n", pf_errmsg());
    /* By hand: ceil(r P) with float noise ignored; and arcface_torch's int(r * P), Python's truncation of the
     * double product (int(0.1 * 25) = 2, int(0.29 * 100) = int(28.999999999999996) = 28, int(0.1 * 30) =
     * int(3.0000000000000004) = 3). */
    CHECK(sample_count(0.1, 30, 1) == 3 && sample_count(0.1, 31, 1) == 4 && sample_count(1.0, 7, 1) == 7 &&
              sample_count(0.3, 10, 1) == 3 && sample_count(0.1, 25, 1) == 3,
          "sample_count ceil: %lld %lld %lld %lld", (long long)sample_count(0.1, 30, 1),
          (long long)sample_count(0.1, 31, 1), (long long)sample_count(1.0, 7, 1),
          (long long)sample_count(0.3, 10, 1));
    CHECK(sample_count(0.1, 30, 0) == 3 && sample_count(0.1, 31, 0) == 3 && sample_count(1.0, 7, 0) == 7 &&
              sample_count(0.3, 10, 0) == 3 && sample_count(0.1, 25, 0) == 2 &&
              sample_count(0.29, 100, 0) == 28 && sample_count(0.05, 10, 0) == 0,
          "sample_count floor (arcface_torch): %lld %lld %lld %lld", (long long)sample_count(0.1, 31, 0),
          (long long)sample_count(0.1, 25, 0), (long long)sample_count(0.29, 100, 0),
          (long long)sample_count(0.05, 10, 0));
    /* More workers than classes: rank 2 of 3 over 2 classes owns nothing and samples nothing. */
    int64_t two[2] = {0, 1}, loc2[2];
    sample_args e = {.num_classes = 2,
                     .world_size = 3,
                     .rank = 2,
                     .sample_rate = 1.0,
                     .seed = 1,
                     .step = 0,
                     .mode = SAMPLE_GLOBAL};
    rc = sample_classes(&e, two, 2, &ids, &k, loc2);
    CHECK(rc == 0 && k == 0 && loc2[0] == -1 && loc2[1] == -1, "empty partition: rc %d k %lld", rc,
          (long long)k);
    free(ids);
    CHECK(sample_partition_size(10, 3, 0) == 4 && sample_partition_size(10, 3, 1) == 3 &&
              sample_partition_size(10, 3, 2) == 3 && sample_partition_size(2, 3, 2) == 0,
          "partition sizes");
}

/* The sample's definition, written out here with plain arrays: the positives of the rank's partition, then
 * m = k - positives negatives by Floyd's algorithm over the pool of non-positive local ids (draw j of
 * [pool - m, pool): t = uniform in [0, j] from sample_bits(sample_key(seed, step, rank), counter) by
 * Lemire's multiply-shift with rejection; keep t, or j when t is already in), mapped to local ids by skipping
 * the positives. sample_classes keeps the set as a bitmap for dense rates and as a hash set for sparse ones:
 * both must give exactly this subset. Returns 0 when equal. */
static int check_floyd_reference(const sample_args *a, const int64_t *labels, int64_t n)
{
    int global = a->mode == SAMPLE_GLOBAL;
    int64_t W = global ? a->world_size : 1, r = global ? a->rank : 0;
    int64_t part = global ? sample_partition_size(a->num_classes, a->world_size, a->rank) : a->num_classes;
    char *is_pos = calloc((size_t)part, 1), *taken = calloc((size_t)part, 1);
    int64_t np = 0;
    for (int64_t i = 0; i < n; i++)
        if (labels[i] % W == r && !is_pos[labels[i] / W]) {
            is_pos[labels[i] / W] = 1;
            np++;
        }
    int64_t k = sample_count(a->sample_rate, part, a->ceil_count);
    if (k < np)
        k = np;
    int64_t m = k - np, pool = part - np;
    uint64_t key = sample_key(a->seed, a->step, a->rank), ctr = 0;
    for (int64_t j = pool - m; j < pool; j++) {
        uint64_t bound = (uint64_t)j + 1, lo, t;
        do {
            unsigned __int128 x = (unsigned __int128)sample_bits(key, ctr++) * bound;
            lo = (uint64_t)x;
            t = (uint64_t)(x >> 64);
        } while (lo < (0 - bound) % bound);
        taken[taken[t] ? j : (int64_t)t] = 1;
    }
    /* the pool index p of the non-positives, in order, is local id c with p non-positives before it */
    int64_t *want = malloc(sizeof(int64_t) * (size_t)(k > 0 ? k : 1)), nw = 0, p = 0;
    for (int64_t c = 0; c < part; c++) {
        if (is_pos[c])
            want[nw++] = c * W + r;
        else if (taken[p++])
            want[nw++] = c * W + r;
    }
    int64_t *ids = NULL, got_k = 0;
    int rc = sample_classes(a, labels, n, &ids, &got_k, NULL);
    int ok = rc == 0 && nw == k && got_k == k && !memcmp(ids, want, sizeof(int64_t) * (size_t)k);
    CHECK(ok, "rate %g, %lld classes, world %d rank %d, %s mode: the sample is not Floyd's subset", a->sample_rate,
          (long long)a->num_classes, a->world_size, a->rank, global ? "global" : "local");
    printf("%s rate %-6g C %lld W %d rank %d %s: %lld ids equal to Floyd's subset written out\n", ok ? "ok  " : "FAIL",
           a->sample_rate, (long long)a->num_classes, a->world_size, a->rank, global ? "global" : "local ",
           (long long)k);
    free(ids), free(want), free(is_pos), free(taken);
    return !ok;
}

static void test_floyd_reference(void)
{
    int64_t labels[40];
    for (int i = 0; i < 40; i++)
        labels[i] = (int64_t)((i * 7919 + 13) % 100003);
    labels[5] = labels[6]; /* a repeated positive */
    /* bitmap path (pool / 64 <= 4 m: 0.1, 0.5, 0.02), hash-set path (0.001); 0.0001: positives only (m = 0) */
    const double rates[] = {0.1, 0.5, 0.02, 0.001, 0.0001};
    for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++)
        for (int mode = 0; mode < 2; mode++) {
            sample_args a = {.num_classes = 100003,
                             .world_size = 3,
                             .rank = mode ? 1 : 0,
                             .sample_rate = rates[i],
                             .seed = 42,
                             .step = (int64_t)i + 5,
                             .mode = mode ? SAMPLE_GLOBAL : SAMPLE_LOCAL};
            check_floyd_reference(&a, labels, 40);
        }
}

int main(void)
{
    test_floyd_reference();
    test_global_rate_01();
    test_rate_1_and_local();
    test_rate_0();
    test_uniform();
    test_huge();
    test_bad_input();
    printf("%s (%d failures)\n", fails ? "FAIL" : "PASS", fails);
    return fails ? 1 : 0;
}
