/* pfcps training step on the CUDA device, timed, as worker/train.c runs it for one worker (W = 1) with
 * device = cuda: class-center sampling on the host (pfc_sample, sample_rate 1: all K classes), worker/model
 * forward (training mode), the K pulled rows copied from pinned host memory to the GPU on a side stream
 * (cuda_h2d_async + cuda_default_stream_wait), the GPU head the loop runs (pfc_cuda_step: cuda_head_dist,
 * forward + backward), the row gradients copied back into pinned host memory (what ps_push sends), then the
 * loop's backbone step: embedding gradient times the loss scale (cuda-fp16: dynamic loss scaling, init
 * 65536, as the loop), backward, unscale, sum of squares (found-inf check and clip_grad_norm_(5)), SGD
 * (momentum 0.9, weight decay 5e-4) on every trainable tensor through the device's sgd_step entry. The
 * class centers' SGD is the parameter servers' work (host memory, other processes): not timed here (the
 * rows keep their values). fp32 everywhere on `cuda` (no TF32 unless PFCPS_CUDA_TF32=1).
 * Parameters from model_init (arcface_torch's initialization); the input batch uploaded from pinned host
 * memory each step (PyTorch's side keeps its batch on the GPU). The same step in PyTorch is
 * bench/gpu/iresnet_torch_gpu.py; bench/gpu_check.sh prints the ratio.
 *
 * Usage: bench_gpu NETWORK BATCH ITERS K [DEVICE]   (NETWORK as model_desc_from_name: r18 r34 r50 r100
 *        r200, r18_w16, mbf; e.g. r50 128 20 100000; DEVICE default cuda, e.g. cuda-fp16)
 * Prints: "pfcps cuda r50 batch 128 K 100000: ... ITERS steps in T s, samples/s X, peak GPU memory M GiB".
 * Exits 77 (SKIP) with a message when there is no GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "kernels/cuda/cuda_ops.h"
#include "worker/head/pfc.h"
#include "worker/head/pfc_cuda.h"
#include "worker/loss_scale.h"
#include "worker/model/model.h"

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

#define TRY(x)                                                                                               \
    do {                                                                                                     \
        if ((x) != 0) {                                                                                      \
            fprintf(stderr, "bench_gpu: %s failed: %s\n", #x, pf_errmsg());                                  \
            return 1;                                                                                        \
        }                                                                                                    \
    } while (0)

/* worker/train.c's optimizer_step: SGD on every trainable tensor (the fixed features-BN weight skipped). */
static int sgd_all(const ops_device *dev, ops_ctx *c, model *m, float *mom, float lr)
{
    float *w = model_params(m), *g = model_grads(m);
    for (int i = 0; i < model_num_tensors(m); i++) {
        const model_tensor *T = model_tensor_at(m, i);
        if (T->flags & MODEL_TENSOR_FIXED)
            continue;
        int rc = dev->sgd_step(c, w + T->offset, g + T->offset, mom + T->offset, T->count, lr, 0.9f, 5e-4f);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: %s NETWORK BATCH ITERS K [DEVICE]   (e.g. r50 128 20 100000)\n", argv[0]);
        return 2;
    }
    const int D = 512;
    model_desc desc;
    int B = atoi(argv[2]), iters = atoi(argv[3]), K = atoi(argv[4]);
    if (model_desc_from_name(&desc, argv[1], D) || B < 1 || iters < 1 || K < 1) {
        fprintf(stderr, "bench_gpu: network '%s' (%s) or non-positive BATCH/ITERS/K\n", argv[1], pf_errmsg());
        return 2;
    }
    const ops_device *dev = ops_device_by_name(argc == 6 ? argv[5] : "cuda");
    if (!dev) {
        fprintf(stderr, "bench_gpu: %s\n", pf_errmsg());
        return 2;
    }
    if (cuda_device_count() == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    TRY(cuda_set_device(0)); /* as the loop: the GPU is chosen before any allocation or handle */
    const int loss_scaling = !strcmp(dev->name, "cuda-fp16"); /* the loop's rule: fp16 = true on cuda */
    model *m;
    TRY(model_create_desc(&m, &desc, B, dev));
    model_init(m, 1);
    ops_ctx *c = model_ctx(m);
    size_t np = model_num_params(m);
    size_t nin = (size_t)B * 3 * 112 * 112, nc = (size_t)K * D, bd = (size_t)B * D;
    /* the host pfc (sampling state) and the GPU head of worker/train.c, one worker */
    head_params hp = {.s = 64,
                      .m1 = 1,
                      .m2 = 0.5,
                      .m3 = 0,
                      .interclass_filtering_threshold = 0,
                      .margin_grad = HEAD_MARGIN_GRAD_STRAIGHT_THROUGH,
                      .mode = HEAD_MODE_GLOBAL,
                      .clamp_loss = 1};
    pfc host;
    TRY(pfc_init(&host, &hp, NULL, K, 1.0, 1, B, D));
    pfc_cuda gh;
    TRY(pfc_cuda_create(&gh, &host, NULL, 0));
    /* the input batch and the pulled rows in pinned host memory, as the loader and the loop hand them over */
    float *hin, *hc, *hgc;
    void *side;
    TRY(cuda_host_pinned_alloc((void **)&hin, nin * sizeof *hin));
    TRY(cuda_host_pinned_alloc((void **)&hc, nc * sizeof *hc));
    TRY(cuda_host_pinned_alloc((void **)&hgc, nc * sizeof *hgc));
    TRY(cuda_side_stream_create(&side));
    int64_t *hl = malloc((size_t)B * sizeof *hl);
    if (!hl) {
        fprintf(stderr, "bench_gpu: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < nin; i++)
        hin[i] = frand(-1, 1);
    for (size_t i = 0; i < nc; i++)
        hc[i] = frand(-0.01f, 0.01f);
    for (int i = 0; i < B; i++)
        hl[i] = (int64_t)(frand(0, 1) * (float)(K - 1));
    float *dc, *dgc, *dge, *pmom;
    TRY(dev->mem_alloc(c, (void **)&dc, nc * 4));
    TRY(dev->mem_alloc(c, (void **)&dgc, nc * 4));
    TRY(dev->mem_alloc(c, (void **)&dge, bd * 4));
    TRY(dev->mem_alloc(c, (void **)&pmom, np * 4)); /* zero-filled */
    loss_scaler scaler;
    TRY(loss_scaler_init(&scaler, 65536.0f, 100));
    double loss = 0, t0 = 0, first = 0;
    int skipped = 0;
    const float lr = 0.1f;
    for (int it = -2; it < iters; it++) { /* two warm-up steps: cuDNN algorithm search */
        if (it == 0) {
            TRY(dev->sync(c));
            t0 = now();
            skipped = 0;
        }
        const int64_t *ids;
        int64_t k;
        TRY(pfc_sample(&host, it + 2, hl, &ids, &k));
        const float *emb;
        model_zero_grad(m);
        TRY(model_forward(m, hin, B, 1, &emb));
        sample_mem();
        size_t kd = (size_t)k * D;
        TRY(cuda_h2d_async(dc, hc, kd * sizeof(float), side));
        TRY(cuda_default_stream_wait(side));
        TRY(pfc_cuda_step(&gh, &host, emb, dc, &loss, dge, dgc));
        TRY(dev->mem_d2h(c, hgc, dgc, kd * sizeof(float))); /* what ps_push sends */
        float scale = loss_scaling ? scaler.scale : 1.0f;
        if (scale != 1.0f)
            TRY(dev->scale(c, dge, bd, scale));
        TRY(model_backward(m, dge, NULL));
        if (scale != 1.0f)
            TRY(dev->scale(c, model_grads(m), np, (float)(1.0 / (double)scale)));
        double ss = 0;
        TRY(dev->sumsq(c, model_grads(m), np, &ss));
        if (loss_scaling && !loss_scaler_update(&scaler, !isfinite(ss))) {
            skipped++;
        } else {
            double coef = 5.0 / (sqrt(ss) + 1e-6);
            if (isfinite(coef) && coef < 1.0)
                TRY(dev->scale(c, model_grads(m), np, (float)coef));
            TRY(sgd_all(dev, c, m, pmom, lr));
        }
        if (it == -2)
            first = loss;
    }
    TRY(dev->sync(c));
    double dt = now() - t0;
    sample_mem();
    printf("pfcps %s %s batch %d K %d (pfc_cuda_step, W=1): loss %.4f -> %.4f, %d steps in %.3f s, samples/s "
           "%.2f, "
           "peak GPU memory %.2f GiB of %.1f",
           dev->name, argv[1], B, K, first, loss, iters, dt, iters * B / dt, (double)peak_used / (1 << 30),
           (double)mem_total / (1 << 30));
    if (loss_scaling)
        printf(", loss scale %g, %d of %d timed steps skipped on overflow", (double)scaler.scale, skipped,
               iters);
    printf("\n");
    if (!isfinite(loss)) {
        fprintf(stderr, "bench_gpu: loss is not finite\n");
        return 1;
    }
    pfc_cuda_free(&gh);
    pfc_free(&host);
    dev->mem_free(c, dc);
    dev->mem_free(c, dgc);
    dev->mem_free(c, dge);
    dev->mem_free(c, pmom);
    cuda_side_stream_destroy(side);
    cuda_host_pinned_free(hin);
    cuda_host_pinned_free(hc);
    cuda_host_pinned_free(hgc);
    free(hl);
    model_free(m);
    return 0;
}
