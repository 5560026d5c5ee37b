/* Unit tests of the shard table: counter-based init (vs an independent float64 re-implementation),
 * independence from S, SGD row update vs $PFCPS_REFERENCE/head/sgd_rows_*, fp16/bf16 conversion
 * against hand-computed bit patterns, id checks, fit refusal, checksum vs an independent hash. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "proto/ps_wire.h"
#include "server/shard.h"
#include "tests/npy.h"
#include "tests/reference/ref.h"
#include "tests/server/pst.h"

#include "tests/check.h"

static void test_init(void)
{
    const int64_t C = 53;
    const int D = 7; /* odd D: the last Box-Muller pair is half used */
    shard a, b, one;
    CHECK(shard_create(&a, C, 2, 1, D, 42, 2, 0) == 0, "create S=2: %s", pf_errmsg());
    CHECK(shard_create(&b, C, 3, 2, D, 42, 1, 1) == 0, "create S=3: %s", pf_errmsg());
    CHECK(shard_create(&one, C, 1, 0, D, 42, 1, 0) == 0, "create S=1: %s", pf_errmsg());
    CHECK(a.rows == 26 && b.rows == 17 && one.rows == 53, "local rows %lld %lld %lld (want 26 17 53)",
          (long long)a.rows, (long long)b.rows, (long long)one.rows);
    double maxrel = 0;
    int same = 1;
    for (int64_t c = 0; c < C; c++) {
        double ref[7];
        pst_init_row(42, c, D, ref);
        const float *r1 = shard_row(&one, c);
        for (int j = 0; j < D; j++)
            maxrel = fmax(maxrel, fabs(r1[j] - ref[j]) / fabs(ref[j]));
        if (c % 2 == 1 && memcmp(shard_row(&a, c / 2), r1, sizeof(float) * D))
            same = 0;
        if (c % 3 == 2 && memcmp(shard_row(&b, c / 3), r1, sizeof(float) * D))
            same = 0;
    }
    printf("init: max rel err vs float64 generator %.3g; S=1/2/3 rows bit-identical: %s\n", maxrel,
           same ? "yes" : "NO");
    CHECK(maxrel < 6e-8 && same, "init");
    CHECK(one.momentum[0] == 0 && one.momentum[C * D - 1] == 0, "momentum starts at 0");
    /* Statistics over a larger table: N(0, 0.01^2). */
    shard big;
    CHECK(shard_create(&big, 20000, 1, 0, 64, 2048, 2, 0) == 0, "create big");
    double s = 0, sq = 0;
    for (int64_t r = 0; r < big.rows; r++) {
        const float *w = shard_row(&big, r);
        for (int j = 0; j < 64; j++)
            s += w[j], sq += (double)w[j] * w[j];
    }
    double n = 20000.0 * 64, mean = s / n, sd = sqrt(sq / n - mean * mean);
    printf("init statistics over %.0f values: mean %.2e (want 0 +- 4e-5), std %.6f (want 0.01 +- 5e-5)\n", n,
           mean, sd);
    CHECK(fabs(mean) < 4e-5 && fabs(sd - 0.01) < 5e-5, "init statistics");
    shard_destroy(&a), shard_destroy(&b), shard_destroy(&one), shard_destroy(&big);
}

static void test_sgd_ref(const char *name)
{
    char head[1024], dir[1100], why[2048];
    if (ref_locate(head, sizeof head, "head", why, sizeof why)) {
        fails += ref_part_missing(why);
        return;
    }
    snprintf(dir, sizeof(dir), "%s/%s", head, name);
    npy_array aw, av, ag, awo, avo;
    if (npy_load2(dir, "weight.npy", &aw) || npy_load2(dir, "momentum.npy", &av) ||
        npy_load2(dir, "grad.npy", &ag) || npy_load2(dir, "weight_out.npy", &awo) ||
        npy_load2(dir, "momentum_out.npy", &avo)) {
        printf("FAIL: reference %s: %s\n", dir, pf_errmsg());
        fails++;
        return;
    }
    char *meta = npy_read_text(dir, "meta.json");
    double lr = npy_json_number(meta, "lr", NAN), mu = npy_json_number(meta, "momentum", NAN),
           wd = npy_json_number(meta, "weight_decay", NAN);
    free(meta);
    int R = (int)aw.shape[0], D = (int)aw.shape[1];
    float *w = npy_to_f32(&aw), *v = npy_to_f32(&av), *g = npy_to_f32(&ag);
    double *wo = npy_to_f64(&awo), *vo = npy_to_f64(&avo), *gd = malloc(sizeof(double) * D);
    for (int r = 0; r < R; r++) {
        for (int j = 0; j < D; j++)
            gd[j] = g[(size_t)r * D + j];
        shard_sgd_row(w + (size_t)r * D, v + (size_t)r * D, gd, D, lr, mu, wd);
    }
    double ew = rel_err_f32_f64(w, wo, (size_t)R * D), ev = rel_err_f32_f64(v, vo, (size_t)R * D);
    printf("%s: shard_sgd_row weight_out rel err %.3g, momentum_out rel err %.3g (tolerance 1e-6)\n", name,
           ew, ev);
    CHECK(ew <= 1e-6 && ev <= 1e-6, "%s sgd", name);
    free(w), free(v), free(g), free(wo), free(vo), free(gd);
    npy_free(&aw), npy_free(&av), npy_free(&ag), npy_free(&awo), npy_free(&avo);
}

static void test_convert(void)
{
    struct {
        float f;
        uint16_t h, b;
    } cases[] = {
        {1.0f, 0x3c00, 0x3f80},     {-2.5f, 0xc100, 0xc020},    {0.1f, 0x2e66, 0x3dcd},
        {65504.0f, 0x7bff, 0x4780}, {65520.0f, 0x7c00, 0x4780}, {5.9604645e-8f, 0x0001, 0x3380},
        {0.0f, 0x0000, 0x0000},     {-0.0f, 0x8000, 0x8000},    {INFINITY, 0x7c00, 0x7f80},
        {1e-9f, 0x0000, 0x3089},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint16_t h = f16_from_f32(cases[i].f), b = bf16_from_f32(cases[i].f);
        if (h != cases[i].h || b != cases[i].b) {
            printf("FAIL convert %g: fp16 0x%04x (want 0x%04x), bf16 0x%04x (want 0x%04x)\n",
                   (double)cases[i].f, h, cases[i].h, b, cases[i].b);
            bad++;
        }
    }
    /* Every finite fp16 value survives fp16 -> fp32 -> fp16 exactly, and fp16 -> fp32 is exact: check value.
     */
    for (uint32_t x = 0; x < 0x10000; x++) {
        uint16_t h = (uint16_t)x;
        if ((h & 0x7c00) == 0x7c00)
            continue;
        float f = f16_to_f32(h);
        int e = (h >> 10) & 0x1f, m = h & 0x3ff;
        double want =
            (e ? ldexp(1.0 + m / 1024.0, e - 15) : ldexp(m / 1024.0, -14)) * ((h & 0x8000) ? -1 : 1);
        if ((double)f != want || f16_from_f32(f) != h) {
            if (bad++ < 5)
                printf("FAIL fp16 0x%04x -> %g (want %g)\n", h, (double)f, want);
        }
    }
    printf("fp16/bf16 conversions: %d mismatches (10 hand-computed cases + 63488 fp16 round trips)\n", bad);
    fails += bad != 0;
}

static void test_checks(void)
{
    shard sh;
    CHECK(shard_create(&sh, 10, 2, 0, 4, 1, 1, 0) == 0, "create");
    int64_t good[3] = {0, 2, 8}, big[2] = {0, 10}, neg[1] = {-2}, other[2] = {4, 5};
    CHECK(shard_check_ids(&sh, good, 3) == 0, "good ids refused");
    int rc = shard_check_ids(&sh, big, 2);
    printf("id 10 of C=10 -> %d: %s\n", rc, pf_errmsg());
    CHECK(rc == -ERANGE && strstr(pf_errmsg(), "id 10 at index 1"), "id >= C");
    rc = shard_check_ids(&sh, neg, 1);
    CHECK(rc == -ERANGE && strstr(pf_errmsg(), "negative"), "negative id");
    rc = shard_check_ids(&sh, other, 2);
    printf("id 5 on shard 0 of 2 -> %d: %s\n", rc, pf_errmsg());
    CHECK(rc == -ERANGE && strstr(pf_errmsg(), "belongs to server 1"), "other shard");
    /* Checksum: FNV-1a over 8-byte words of weights then momentum, computed here independently. */
    uint64_t h = 0xcbf29ce484222325ull;
    for (int64_t r = 0; r < sh.rows; r++)
        shard_row(&sh, r);
    const uint8_t *parts[2] = {(const uint8_t *)sh.weight, (const uint8_t *)sh.momentum};
    for (int p = 0; p < 2; p++)
        for (size_t i = 0; i < (size_t)sh.rows * 4 * 4; i += 8) {
            uint64_t word;
            memcpy(&word, parts[p] + i, 8);
            h = (h ^ word) * 0x100000001b3ull;
        }
    uint64_t c1 = shard_checksum(&sh);
    CHECK(c1 == h, "checksum %016llx vs independent %016llx", (unsigned long long)c1, (unsigned long long)h);
    sh.momentum[7] = 1e-30f;
    CHECK(shard_checksum(&sh) != c1, "checksum ignores the momentum");
    /* fp16 gather equals the conversion of the stored rows. */
    uint16_t out[3 * 4];
    shard_gather(&sh, good, 3, PS_DT_FP16, out);
    CHECK(out[5] == f16_from_f32(shard_row(&sh, 1)[1]), "fp16 gather");
    shard_destroy(&sh);
    rc = shard_check_fit(1000000000000LL, 1, 0, 512);
    printf("C=1e12 D=512 -> %d: %s\n", rc, pf_errmsg());
    CHECK(rc == -ENOMEM && strstr(pf_errmsg(), "MemAvailable"), "fit refusal");
    shard s2;
    rc = shard_create(&s2, 10, 2, 2, 4, 1, 1, 0);
    CHECK(rc == -EINVAL, "rank 2 of 2 accepted");
    rc = shard_create(&s2, 10, 1, 0, 0, 1, 1, 0);
    CHECK(rc == -EINVAL, "D=0 accepted");
}

/* The background fill (center_init = eager) racing rows generated and updated on demand: every row ends with
 * its generator value (vs the float64 reference) except the rows updated meanwhile, which keep their update
 * (the fill never regenerates a row), and every momentum is zero. Also: the f32 SGD path equals the double
 * one bit for bit. */
static void test_fill(void)
{
    const int64_t C = 200003;
    const int D = 33;
    shard sh;
    CHECK(shard_create(&sh, C, 1, 0, D, 99, 1, 0) == 0, "create: %s", pf_errmsg());
    CHECK(shard_fill_start(&sh, 3) == 0, "fill start: %s", pf_errmsg());
    /* Meanwhile: rows touched from this thread, from the end of each fill thread's range backwards (the fill
     * reaches them last), and marked: weight[0] = 7 (an "update"). */
    uint8_t *marked = calloc((size_t)C, 1);
    CHECK(marked != NULL, "out of memory");
    for (int t = 0; marked && t < 3; t++)
        for (int i = 1; i <= 100; i++) {
            int64_t r = C * (t + 1) / 3 - i * 7;
            float *w = shard_row(&sh, r);
            w[0] = 7.0f;
            marked[r] = 1;
        }
    CHECK(shard_fill_wait(&sh, 120) == 1, "fill did not finish within 120 s");
    int bad = 0, badm = 0, nready = 0;
    double maxrel = 0;
    for (int64_t r = 0; r < C; r++) {
        nready += shard_row_ready(&sh, r);
        int is_marked = marked && marked[r];
        double ref[33];
        pst_init_row(99, r, D, ref);
        const float *w = sh.weight + (size_t)r * D;
        for (int j = 0; j < D; j++) {
            if (is_marked && j == 0) {
                bad += w[0] != 7.0f;
                continue;
            }
            maxrel = fmax(maxrel, fabs(w[j] - ref[j]) / fabs(ref[j]));
            badm += sh.momentum[(size_t)r * D + j] != 0.0f;
        }
    }
    printf("fill: %d of %lld rows ready; %d updated rows overwritten (want 0); max rel err vs float64 %.3g; "
           "nonzero momenta %d\n",
           nready, (long long)C, bad, maxrel, badm);
    CHECK(nready == C && bad == 0 && maxrel < 6e-8 && badm == 0, "fill");
    free(marked);
    shard_destroy(&sh);

    /* shard_sgd_row_f32 == shard_sgd_row on the widened gradient, bit for bit, and both == torch's float32
     * order computed here (d = g + wd w; v = v mu + d; w = w - lr v, each rounded to float). */
    float w1[37], v1[37], w2[37], v2[37], g[37];
    double gd[37];
    for (int j = 0; j < 37; j++) {
        w1[j] = w2[j] = (float)sin(j + 1.0);
        v1[j] = v2[j] = (float)cos(3.0 * j);
        g[j] = (float)(0.37 * sin(7.0 * j) + 1e-3 * j);
        gd[j] = g[j];
    }
    float w3[37], v3[37];
    for (int j = 0; j < 37; j++) {
        volatile float d = g[j] + 5e-4f * w1[j], vv = v1[j] * 0.9f + d; /* volatile: rounded, never fused */
        v3[j] = vv;
        w3[j] = w1[j] - 0.1f * vv;
    }
    shard_sgd_row_f32(w1, v1, g, 37, 0.1, 0.9, 5e-4);
    shard_sgd_row(w2, v2, gd, 37, 0.1, 0.9, 5e-4);
    CHECK(!memcmp(w1, w2, sizeof w1) && !memcmp(v1, v2, sizeof v1), "sgd f32 path differs from the double path");
    CHECK(!memcmp(w1, w3, sizeof w1) && !memcmp(v1, v3, sizeof v1), "sgd differs from torch's float32 order");
}

/* Every message a worker or server builds fits the receive buffers (ps_wire_msg_bytes), for every D up to
 * 8192 and every wire dtype: the largest is a push chunk, header + rows x (8-byte id + D elements); a pull
 * request (ids) and its reply (rows) are smaller. Sizes written out here from the wire layout. */
static void test_wire_sizes(void)
{
    const uint32_t dts[3] = {PS_DT_FP32, PS_DT_FP16, PS_DT_BF16};
    const size_t esz[3] = {4, 2, 2};
    int bad = 0;
    for (uint32_t d = 1; d <= 8192; d++) {
        size_t have = ps_wire_msg_bytes(d);
        for (int i = 0; i < 3; i++) {
            size_t rows = ps_wire_rows_per_msg(d, dts[i]);
            size_t push = 64 + rows * (8 + (size_t)d * esz[i]);
            if (push > have && bad++ < 5)
                printf("D = %u dtype %u: a push chunk of %zu rows is %zu bytes, receive buffers %zu\n", d, dts[i],
                       rows, push, have);
        }
    }
    CHECK(sizeof(ps_hdr) == 64, "ps_hdr is %zu bytes (the sizes above assume 64)", sizeof(ps_hdr));
    CHECK(bad == 0, "%d (D, dtype) pairs whose largest message exceeds the receive buffers", bad);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    test_wire_sizes();
    test_init();
    test_sgd_ref("sgd_rows_R10_D16");
    test_sgd_ref("sgd_rows_R300_D512");
    test_convert();
    test_checks();
    test_fill();
    printf(fails ? "FAILED (%d)\n" : "PASS\n", fails);
    return fails ? 1 : 0;
}
