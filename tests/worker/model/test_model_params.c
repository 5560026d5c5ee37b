/* Parameter counts of r18/r34/r50/r100/r200/mbf at D = 512 against numbers computed here by hand
 * from the architecture facts (arcface_torch's iresnet.py and mobilefacenet.py), bad
 * descriptions refused with a message, and the initialization's statistics. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "worker/model/model.h"
#include "tests/check.h"


/* IBasicBlock(in -> out): bn1(in), conv3x3 in->out, bn2, prelu(out), conv3x3 out->out, bn3,
 * downsample conv1x1 in->out + BN when stride 2 (first block of every stage). */
static long long ires_block(long long in, long long out, int ds)
{
    long long n = 2 * in + in * out * 9 + 2 * out + out + out * out * 9 + 2 * out;
    if (ds)
        n += in * out + 2 * out;
    return n;
}

static long long ires_count(const int layers[4], long long D)
{
    const long long w[4] = {64, 128, 256, 512};
    long long n = 3 * 64 * 9 + 2 * 64 + 64; /* conv1, bn1, prelu */
    long long in = 64;
    for (int s = 0; s < 4; s++)
        for (int b = 0; b < layers[s]; b++) {
            n += ires_block(in, w[s], b == 0);
            in = w[s];
        }
    n += 2 * 512 + 512 * 49 * D + D + 2 * D; /* bn2, fc (weight, bias), features (w, b) */
    return n;
}

/* mobilefacenet: ConvBlock = conv + BN + PReLU, LinearBlock = conv + BN. */
static long long cb(long long in, long long out, long long k, long long g)
{
    return out * (in / g) * k * k + 2 * out + out;
}
static long long lb(long long in, long long out, long long k, long long g)
{
    return out * (in / g) * k * k + 2 * out;
}
static long long dw(long long in, long long out, long long g)
{
    return cb(in, g, 1, 1) + cb(g, g, 3, g) + lb(g, out, 1, 1);
}
static long long mbf_count(long long D)
{
    long long n = cb(3, 128, 3, 1) + cb(128, 128, 3, 64);
    n += dw(128, 128, 128) + 4 * dw(128, 128, 128);
    n += dw(128, 256, 256) + 6 * dw(256, 256, 256);
    n += dw(256, 256, 512) + 2 * dw(256, 256, 256);
    n += cb(256, 512, 1, 1);
    n += lb(512, 512, 7, 512) + 512 * D + 2 * D;
    return n;
}

int main(void)
{
    struct {
        const char *name;
        int layers[4];
    } nets[] = {
        {"r18", {2, 2, 2, 2}},    {"r34", {3, 4, 6, 3}},    {"r50", {3, 4, 14, 3}},
        {"r100", {3, 13, 30, 3}}, {"r200", {6, 26, 60, 6}}, {"mbf", {0, 0, 0, 0}},
    };
    for (size_t i = 0; i < sizeof nets / sizeof *nets; i++) {
        model *m;
        int rc = model_create(&m, nets[i].name, 512, 2);
        CHECK(rc == 0, "model_create(%s): %s", nets[i].name, pf_errmsg());
        if (rc)
            continue;
        long long want = strcmp(nets[i].name, "mbf") ? ires_count(nets[i].layers, 512) : mbf_count(512);
        long long got = (long long)model_num_params(m);
        printf("%-5s D=512: %lld parameters (%.2fM), by hand %lld: %s\n", nets[i].name, got, got / 1e6, want,
               got == want ? "ok" : "FAIL");
        CHECK(got == want, "%s parameter count", nets[i].name);
        /* the sum of the table equals the flat array, tensors tile it without gaps */
        size_t off = 0;
        for (int t = 0; t < model_num_tensors(m); t++) {
            CHECK(model_tensor_at(m, t)->offset == off, "%s tensor %d offset", nets[i].name, t);
            off += model_tensor_at(m, t)->count;
        }
        CHECK(off == model_num_params(m), "%s tensors tile the flat array", nets[i].name);
        if (!strcmp(nets[i].name, "r50"))
            CHECK(fabs(got / 1e6 - 43.6) < 0.1, "r50 is not ~43.6M");
        if (!strcmp(nets[i].name, "r100"))
            CHECK(fabs(got / 1e6 - 65.2) < 0.1, "r100 is not ~65.2M");
        if (!strcmp(nets[i].name, "mbf"))
            CHECK(got > 1.9e6 && got < 2.2e6, "mbf is not ~2.1M");
        model_free(m);
    }

    /* Bad descriptions: refused with a message naming the problem. */
    model *m = NULL;
    int rc = model_create(&m, "r51", 512, 2);
    printf("unknown network: %d '%s'\n", rc, pf_errmsg());
    CHECK(rc == -EINVAL && strstr(pf_errmsg(), "r51"), "unknown network accepted");
    /* arcface_torch's ViT networks: refused naming them and what pfcps builds instead. */
    rc = model_create(&m, "vit_b_dp005_mask_005", 512, 2);
    printf("ViT network: %d '%s'\n", rc, pf_errmsg());
    CHECK(rc == -EINVAL && strstr(pf_errmsg(), "vit_b_dp005_mask_005") && strstr(pf_errmsg(), "ViT backbones") &&
              strstr(pf_errmsg(), "r100"),
          "ViT network not refused by name");
    rc = model_create(&m, "r50", 0, 2);
    printf("embedding_size 0: %d '%s'\n", rc, pf_errmsg());
    CHECK(rc == -EINVAL && strstr(pf_errmsg(), "embedding_size"), "D = 0 accepted");
    rc = model_create(&m, "r18", 512, 0);
    printf("batch 0: %d '%s'\n", rc, pf_errmsg());
    CHECK(rc == -EINVAL && strstr(pf_errmsg(), "batch"), "batch 0 accepted");
    model_desc d;
    model_desc_from_name(&d, "r18", 128);
    d.widths[1] = 0;
    rc = model_create_desc(&m, &d, 2, NULL);
    printf("width 0: %d '%s'\n", rc, pf_errmsg());
    CHECK(rc == -EINVAL, "width 0 accepted");
    model_desc_from_name(&d, "r18", 128);
    d.dropout = 1.0f;
    rc = model_create_desc(&m, &d, 2, NULL);
    printf("dropout 1: %d '%s'\n", rc, pf_errmsg());
    CHECK(rc == -EINVAL && strstr(pf_errmsg(), "dropout"), "dropout 1 accepted");
    CHECK(model_desc_from_name(&d, "iresnet50", 512) == 0 && !strcmp(d.name, "r50"), "iresnet50 alias");
    CHECK(model_desc_from_name(&d, "r18_w16", 512) == 0 && d.widths[0] == 16 && d.widths[3] == 128 &&
               !strcmp(d.name, "r18_w16"),
           "r18_w16 narrow iresnet");
    rc = model_desc_from_name(&d, "r18_w3", 512);
    printf("r18_w3: %d '%s'\n", rc, pf_errmsg());
    CHECK(rc == -EINVAL && strstr(pf_errmsg(), "_w3"), "odd width suffix accepted");

    /* Initialization: conv ~ N(0, 0.1), BN 1/0, PReLU 0.25, fc U(+-1/sqrt(25088)), features
     * weight fixed at 1; forward with B beyond capacity refused. */
    if (model_create(&m, "r18", 512, 2) == 0) {
        model_init(m, 7);
        size_t n;
        float *w = model_param(m, "layer3.1.conv1.weight", &n);
        double s = 0, s2 = 0;
        for (size_t i = 0; i < n; i++)
            s += w[i], s2 += (double)w[i] * w[i];
        double mean = s / n, sd = sqrt(s2 / n - mean * mean);
        printf("layer3.1.conv1.weight: %zu values, mean %.4f, std %.4f (want 0, 0.1)\n", n, mean, sd);
        CHECK(fabs(mean) < 0.002 && fabs(sd - 0.1) < 0.002, "conv init");
        float *fc = model_param(m, "fc.weight", &n);
        float mx = 0;
        for (size_t i = 0; i < n; i++)
            mx = fabsf(fc[i]) > mx ? fabsf(fc[i]) : mx;
        printf("fc.weight max |w| %.6f, bound 1/sqrt(25088) = %.6f\n", mx, 1 / sqrt(25088.0));
        CHECK(mx <= 1.000001 / sqrt(25088.0) && mx > 0.99 / sqrt(25088.0), "fc init bound");
        CHECK(model_param(m, "layer2.0.prelu.weight", &n)[3] == 0.25f, "prelu init");
        CHECK(model_param(m, "bn2.weight", &n)[5] == 1.0f && model_param(m, "bn2.bias", &n)[5] == 0.0f,
               "bn init");
        CHECK(model_buffer(m, "bn2.running_var", &n)[0] == 1.0f, "running var init");
        int fixed = 0;
        for (int t = 0; t < model_num_tensors(m); t++)
            if (model_tensor_at(m, t)->flags & MODEL_TENSOR_FIXED) {
                fixed++;
                CHECK(!strcmp(model_tensor_at(m, t)->name, "features.weight"), "fixed tensor");
            }
        CHECK(fixed == 1, "exactly one fixed tensor (features.weight), got %d", fixed);
        const float *e;
        float x[1] = {0};
        rc = model_forward(m, x, 3, 1, &e);
        printf("batch 3 > capacity 2: %d '%s'\n", rc, pf_errmsg());
        CHECK(rc == -EINVAL, "batch above capacity accepted");
        float g[1] = {0};
        rc = model_backward(m, g, NULL);
        printf("backward before forward: %d '%s'\n", rc, pf_errmsg());
        CHECK(rc == -EINVAL, "backward without forward accepted");
        model_free(m);
    }
    printf("%s (%d failures)\n", fails ? "FAIL" : "PASS", fails);
    return fails ? 1 : 0;
}
