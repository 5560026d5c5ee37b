/* pfcps training step on the CUDA device, timed: worker/model forward (training mode) + margin-softmax
 * head over K class centers (forward + backward) + backbone backward + SGD on backbone parameters
 * and class centers (momentum 0.9, weight decay 5e-4), all fp32 (no TF32 unless PFCPS_CUDA_TF32=1).
 * The backbone is worker/model on ops_device_by_name("cuda"): parameters from model_init (arcface_torch's
 * initialization), the input batch uploaded from pinned host memory each step (as the training loop
 * does; PyTorch's side keeps its batch on the GPU),
 * the backbone SGD through the device's sgd_step entry. The same step in PyTorch is
 * bench/gpu/iresnet_torch_gpu.py; bench/gpu_check.sh prints the ratio.
 *
 * Usage: bench_gpu NETWORK BATCH ITERS K [DEVICE]   (NETWORK as model_desc_from_name: r18 r34 r50 r100
 *        r200, r18_w16, mbf; e.g. r50 128 20 100000; DEVICE default cuda, e.g. cuda-fp16)
 * Prints: "pfcps cuda r50 batch 128 K 100000: ITERS steps in T s, samples/s X, peak GPU memory M GiB".
 * Exits 77 (SKIP) with a message when there is no GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "kernels/cuda/cuda_ops.h"
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

#define TRY(x)                                                                                   \
    do {                                                                                         \
        if ((x) != 0) {                                                                          \
            fprintf(stderr, "bench_gpu: %s failed: %s\n", #x, pf_errmsg());                     \
            return 1;                                                                            \
        }                                                                                        \
    } while (0)

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
    model *m;
    TRY(model_create_desc(&m, &desc, B, dev));
    model_init(m, 1);
    ops_ctx *c = model_ctx(m);
    size_t np = model_num_params(m);
    size_t nin = (size_t)B * 3 * 112 * 112, nc = (size_t)K * D;
    /* the input batch in pinned host memory, as a loader would hand it over (fast upload) */
    float *hin, *hc = malloc(nc * sizeof *hc);
    TRY(cuda_host_pinned_alloc((void **)&hin, nin * sizeof *hin));
    int64_t *hl = malloc((size_t)B * sizeof *hl);
    for (size_t i = 0; i < nin; i++)
        hin[i] = frand(-1, 1);
    for (size_t i = 0; i < nc; i++)
        hc[i] = frand(-0.01f, 0.01f);
    for (int i = 0; i < B; i++)
        hl[i] = (int64_t)(frand(0, 1) * (float)(K - 1));
    float *dc, *dgc, *dge, *pmom, *cmom;
    int64_t *dl;
    TRY(cuda_malloc((void **)&dc, nc * 4));
    TRY(cuda_malloc((void **)&dgc, nc * 4));
    TRY(cuda_malloc((void **)&dge, (size_t)B * D * 4));
    TRY(dev->mem_alloc(c, (void **)&pmom, np * 4)); /* zero-filled */
    TRY(cuda_malloc((void **)&cmom, nc * 4));
    TRY(cuda_malloc((void **)&dl, (size_t)B * 8));
    TRY(cuda_h2d(dc, hc, nc * 4));
    TRY(cuda_h2d(dl, hl, (size_t)B * 8));
    TRY(cuda_fill_f32(cmom, 0, nc));
    free(hc);
    free(hl);
    cuda_head_ws ws;
    TRY(cuda_head_ws_init(&ws, B, K, D));
    cuda_head_params hp_ = {.s = 64, .m1 = 1, .m2 = 0.5, .m3 = 0, .tau = 0, .straight_through = 1, .clamp_loss = 0};
    double loss = 0, t0 = 0, first = 0;
    const float lr = 0.1f;
    for (int it = -2; it < iters; it++) { /* two warm-up steps: cuDNN algorithm search */
        if (it == 0) {
            TRY(dev->sync(c));
            t0 = now();
        }
        const float *emb;
        model_zero_grad(m);
        TRY(model_forward(m, hin, B, 1, &emb));
        sample_mem();
        TRY(cuda_head_forward_backward(&hp_, &ws, emb, B, dc, K, dl, 0, &loss, NULL, dge, dgc));
        TRY(model_backward(m, dge, NULL));
        TRY(dev->sgd_step(c, model_params(m), model_grads(m), pmom, np, lr, 0.9f, 5e-4f));
        TRY(cuda_sgd_step(dc, dgc, cmom, nc, lr, 0.9f, 5e-4f));
        if (it == -2)
            first = loss;
    }
    TRY(dev->sync(c));
    double dt = now() - t0;
    sample_mem();
    printf("pfcps %s %s batch %d K %d: loss %.4f -> %.4f, %d steps in %.3f s, samples/s %.2f, "
           "peak GPU memory %.2f GiB of %.1f\n", dev->name, argv[1], B, K, first, loss, iters, dt, iters * B / dt,
           (double)peak_used / (1 << 30), (double)mem_total / (1 << 30));
    if (!isfinite(loss)) {
        fprintf(stderr, "bench_gpu: loss is not finite\n");
        return 1;
    }
    cuda_head_ws_free(&ws);
    cuda_free(dc); cuda_free(dgc); cuda_free(dge); cuda_free(cmom); cuda_free(dl);
    dev->mem_free(c, pmom);
    cuda_host_pinned_free(hin);
    model_free(m);
    return 0;
}
