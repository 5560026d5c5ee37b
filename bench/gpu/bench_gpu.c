/* pfcps training step on the CUDA device, timed: iresnet forward (training mode) + margin-softmax
 * head over K class centers (forward + backward) + backbone backward + SGD on backbone parameters
 * and class centers (momentum 0.9, weight decay 5e-4), all fp32 (no TF32 unless PFCPS_CUDA_TF32=1).
 * The same step in PyTorch is bench/gpu/iresnet_torch_gpu.py; bench/gpu_check.sh prints the ratio.
 *
 * Usage: bench_gpu NETWORK BATCH ITERS K    (NETWORK r18 r34 r50 r100; e.g. r50 128 20 100000)
 * Prints: "pfcps cuda r50 batch 128 K 100000: ITERS steps in T s, samples/s X, peak GPU memory M GiB". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/gpu/iresnet_dev.h"
#include "common/err.h"
#include "kernels/cuda/cuda_ops.h"

static const devmem devmem_cuda = {cuda_malloc, cuda_free, cuda_h2d, cuda_d2h, cuda_fill_f32, cuda_sync};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rs = 88172645463325252ull;
static float frand(float lo, float hi)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return lo + (hi - lo) * (float)((rs >> 11) * 0x1.0p-53);
}

static size_t peak_used, mem_total;
static void sample_mem(void)
{
    size_t fr = 0, tot = 0;
    if (cuda_mem_info(&fr, &tot) == 0 && tot - fr > peak_used) {
        peak_used = tot - fr;
        mem_total = tot;
    }
}

#define TRY(x)                                                                                   \
    do {                                                                                         \
        if ((x) != 0) {                                                                          \
            fprintf(stderr, "bench_gpu: %s failed: %s\n", #x, pf_errmsg());                     \
            return 1;                                                                            \
        }                                                                                        \
    } while (0)

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: %s NETWORK BATCH ITERS K   (e.g. r50 128 20 100000)\n", argv[0]);
        return 2;
    }
    static const struct { const char *name; int layers[4]; } nets[] = {
        {"r18", {2, 2, 2, 2}}, {"r34", {3, 4, 6, 3}}, {"r50", {3, 4, 14, 3}}, {"r100", {3, 13, 30, 3}}};
    const int *layers = NULL;
    for (size_t i = 0; i < sizeof nets / sizeof *nets; i++)
        if (!strcmp(argv[1], nets[i].name))
            layers = nets[i].layers;
    int B = atoi(argv[2]), iters = atoi(argv[3]), K = atoi(argv[4]);
    if (!layers || B < 1 || iters < 1 || K < 1) {
        fprintf(stderr, "bench_gpu: unknown network '%s' or non-positive BATCH/ITERS/K\n", argv[1]);
        return 2;
    }
    if (cuda_device_count() == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    const int widths[4] = {64, 128, 256, 512}, D = 512;
    inet *n;
    TRY(inet_create(&n, &ops_cuda, &devmem_cuda, layers, widths, D, B));
    /* parameters: conv ~ U(+-0.1), BN weight 1 bias 0, PReLU 0.25, fc U(+-1/sqrt(fan_in)) */
    size_t np = inet_param_floats(n);
    float *hp = malloc(np * sizeof *hp);
    for (int i = 0; i < inet_num_params(n); i++) {
        const inet_tensor *t = inet_param(n, i);
        const char *nm = t->name;
        size_t l = strlen(nm);
        int is_bn = strstr(nm, "bn") || strstr(nm, "downsample.1") || !strncmp(nm, "features", 8);
        for (size_t j = 0; j < t->count; j++) {
            float v;
            if (strstr(nm, "prelu"))
                v = 0.25f;
            else if (is_bn)
                v = !strcmp(nm + l - 6, "weight") ? 1.0f : 0.0f;
            else if (!strncmp(nm, "fc.", 3))
                v = frand(-1, 1) / sqrtf(512.0f * 49.0f);
            else
                v = frand(-0.1f, 0.1f);
            hp[t->offset + j] = v;
        }
    }
    TRY(cuda_h2d(inet_params(n), hp, np * sizeof(float)));
    free(hp);
    size_t nin = (size_t)B * 3 * 112 * 112, nc = (size_t)K * D;
    float *hin = malloc(nin * sizeof *hin), *hc = malloc(nc * sizeof *hc);
    int64_t *hl = malloc((size_t)B * sizeof *hl);
    for (size_t i = 0; i < nin; i++)
        hin[i] = frand(-1, 1);
    for (size_t i = 0; i < nc; i++)
        hc[i] = frand(-0.01f, 0.01f);
    for (int i = 0; i < B; i++)
        hl[i] = (int64_t)(frand(0, 1) * (float)(K - 1));
    float *din, *dc, *dgc, *dge, *pmom, *cmom;
    int64_t *dl;
    TRY(cuda_malloc((void **)&din, nin * 4));
    TRY(cuda_malloc((void **)&dc, nc * 4));
    TRY(cuda_malloc((void **)&dgc, nc * 4));
    TRY(cuda_malloc((void **)&dge, (size_t)B * D * 4));
    TRY(cuda_malloc((void **)&pmom, np * 4));
    TRY(cuda_malloc((void **)&cmom, nc * 4));
    TRY(cuda_malloc((void **)&dl, (size_t)B * 8));
    TRY(cuda_h2d(din, hin, nin * 4));
    TRY(cuda_h2d(dc, hc, nc * 4));
    TRY(cuda_h2d(dl, hl, (size_t)B * 8));
    TRY(cuda_fill_f32(pmom, 0, np));
    TRY(cuda_fill_f32(cmom, 0, nc));
    free(hin);
    free(hc);
    free(hl);
    cuda_head_ws ws;
    TRY(cuda_head_ws_init(&ws, B, K, D));
    cuda_head_params hp_ = {.s = 64, .m1 = 1, .m2 = 0.5, .m3 = 0, .tau = 0, .straight_through = 1, .clamp_loss = 0};
    double loss = 0, t0 = 0, first = 0;
    const float lr = 0.1f;
    for (int it = -2; it < iters; it++) { /* two warm-up steps: cuDNN algorithm search */
        if (it == 0) {
            TRY(cuda_sync());
            t0 = now();
        }
        const float *emb;
        TRY(inet_zero_grad(n));
        TRY(inet_forward(n, din, 1, &emb));
        sample_mem();
        TRY(cuda_head_forward_backward(&hp_, &ws, emb, B, dc, K, dl, 0, &loss, NULL, dge, dgc));
        TRY(inet_backward(n, dge, NULL));
        TRY(cuda_sgd_step(inet_params(n), inet_grads(n), pmom, np, lr, 0.9f, 5e-4f));
        TRY(cuda_sgd_step(dc, dgc, cmom, nc, lr, 0.9f, 5e-4f));
        if (it == -2)
            first = loss;
    }
    TRY(cuda_sync());
    double dt = now() - t0;
    sample_mem();
    printf("pfcps cuda %s batch %d K %d: loss %.4f -> %.4f, %d steps in %.3f s, samples/s %.2f, "
           "peak GPU memory %.2f GiB of %.1f\n", argv[1], B, K, first, loss, iters, dt, iters * B / dt,
           (double)peak_used / (1 << 30), (double)mem_total / (1 << 30));
    if (!isfinite(loss)) {
        fprintf(stderr, "bench_gpu: loss is not finite\n");
        return 1;
    }
    cuda_head_ws_free(&ws);
    cuda_free(din); cuda_free(dc); cuda_free(dgc); cuda_free(dge); cuda_free(pmom); cuda_free(cmom); cuda_free(dl);
    inet_free(n);
    return 0;
}
