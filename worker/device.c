/* The worker's device beyond the kernels/ops.h table: see device.h. The CUDA specifics of the worker live
 * here and only here. */
#include "worker/device.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/fabric.h"
#include "common/log.h"
#include "common/member_addr.h"
#include "kernels/cuda/cuda_ops.h"
#include "worker/head/pfc_cuda.h"

_Static_assert(WDEV_ID_BYTES == CUDA_NCCL_ID_BYTES, "the address part is the NCCL unique id");

#ifdef PFCPS_HAVE_CUDA_OPS
struct wdev_gpu {
    pfc_cuda gh; /* the GPU head: pfc_step's twin on device buffers */
    int have_gh;
    float *d_centers,
        *d_grad_centers; /* device (k_max, D): rows uploaded for the GPU head, their gradients */
    void *side;          /* side stream for the row upload */
};
#endif

int train_device_resolve(const pf_config *cfg, train_device_info *out)
{
    memset(out, 0, sizeof *out);
    if (cfg->fp16 && cfg->bf16)
        return pf_err(-EINVAL, "keys 'fp16' and 'bf16' are both true: set one of them");
    const char *d = cfg->device;
    const char *name = NULL;
    if (!strcmp(d, "cuda")) {
        name = cfg->fp16 ? "cuda-fp16" : cfg->bf16 ? "cuda-bf16" : "cuda";
        out->cuda = 1;
        out->loss_scaling = cfg->fp16;
        snprintf(out->precision, sizeof out->precision, "%s",
                 cfg->fp16
                     ? "fp16 body (dynamic loss scaling), fp32 master weights, fc and features BN in fp32"
                 : cfg->bf16 ? "bf16 body, fp32 master weights, fc and features BN in fp32"
                             : "fp32");
    } else if (!strcmp(d, "cpu-bf16")) {
        name = "cpu-bf16";
        out->loss_scaling = cfg->fp16;
        snprintf(out->precision, sizeof out->precision,
                 "bf16 body (CPU stand-in of a half device)%s, fp32 master "
                 "weights, fc and features BN in fp32",
                 cfg->fp16 ? " with fp16's dynamic loss scaling" : "");
    } else if (!strcmp(d, "cpu") || !strcmp(d, "cpu-fenced")) {
        name = !strcmp(d, "cpu") ? "cpu" : "cpu-fenced";
        snprintf(out->precision, sizeof out->precision, "fp32");
        if (cfg->fp16 || cfg->bf16)
            snprintf(
                out->warning, sizeof out->warning,
                "%s = true: the CPU device has no half-precision path; training in fp32 (device = cuda for "
                "mixed precision; device = cpu-bf16 is the CPU stand-in of a half device, for tests)",
                cfg->fp16 ? "fp16" : "bf16");
    } else {
        return pf_err(-EINVAL, "config key 'device': '%s' is not one of: cpu cuda cpu-fenced cpu-bf16", d);
    }
    size_t nl = strlen(name) < sizeof out->name ? strlen(name) : sizeof out->name - 1;
    memcpy(out->name, name, nl);
    out->name[nl] = '\0';
    if (out->cuda) {
#ifndef PFCPS_HAVE_CUDA_OPS
        return pf_err(
            -ENODEV,
            "config key 'device' = cuda: this pfcps-worker was built without the CUDA device "
            "(nvcc, cuDNN or cuBLAS were not found at build time: rebuild with -Dcuda=enabled where the "
            "CUDA toolkit is installed), or use device = cpu");
#else
        int n = cuda_device_count();
        if (n <= 0)
            return pf_err(
                -ENODEV,
                "config key 'device' = cuda: no CUDA GPU is visible on this machine "
                "(cuda_device_count() = 0: no GPU, no NVIDIA driver, or CUDA_VISIBLE_DEVICES hides them); "
                "use device = cpu");
#endif
    }
    if (!ops_device_by_name(out->name))
        return pf_err_wrap(-ENODEV, "config key 'device' = %s: device '%s' is not in this binary", d,
                           out->name);
    return 0;
}

int wdev_make_id(const char *device, int rank, uint8_t id[WDEV_ID_BYTES])
{
#ifdef PFCPS_HAVE_NCCL
    if (rank == 0 && !strcmp(device, "cuda")) {
        int rc = coll_nccl_unique_id(id);
        return rc < 0 ? pf_err_wrap(rc, "making the NCCL unique id") : 1;
    }
#endif
    (void)device;
    (void)rank;
    (void)id;
    return 0;
}

/* cuda: worker `rank` uses GPU rank mod (visible GPUs). */
static int select_gpu(const wdev *d)
{
    if (!d->di.cuda)
        return 0;
#ifdef PFCPS_HAVE_CUDA_OPS
    int ngpu = cuda_device_count(), gpu = ngpu > 0 ? d->rank % ngpu : 0;
    int rc = cuda_set_device(gpu);
    if (rc < 0)
        return pf_err_wrap(rc, "selecting GPU %d of %d for worker %d", gpu, ngpu, d->rank);
    log_info("GPU %d of %d visible (worker %d)", gpu, ngpu, d->rank);
    return 0;
#else
    return pf_err(-ENODEV, "device %s: this pfcps-worker was built without the CUDA device", d->di.name);
#endif
}

/* cuda with NCCL: the communicator of the W workers from worker 0's unique id (third part of its entry). */
static int open_nccl(wdev *d, const ctl_book *book)
{
#ifdef PFCPS_HAVE_NCCL
    const void *id = NULL;
    size_t idlen = 0;
    if (member_addr_part(book->workers[0].addr, book->workers[0].addr_len, 2, &id, &idlen) < 0 ||
        idlen != CUDA_NCCL_ID_BYTES)
        return pf_err(-EPROTO,
                      "worker 0's address-book entry carries no NCCL unique id (was worker 0 started "
                      "with device = cuda? give every process the same config)");
    int rc = coll_nccl_create((const uint8_t *)id, d->rank, d->W, &d->nccl);
    if (rc < 0)
        return pf_err_wrap(rc, "NCCL communicator of %d workers", d->W);
    d->have_nccl = 1;
    d->backend = "NCCL on device buffers";
#else
    (void)book;
    d->backend = "fabric ring through host staging (this build has no NCCL)";
#endif
    return 0;
}

int wdev_open(wdev *d, const train_device_info *di, int rank, int W)
{
    memset(d, 0, sizeof *d);
    d->di = *di;
    d->rank = rank;
    d->W = W;
    return select_gpu(d);
}

int wdev_backbone(wdev *d, const ops_device *dev, ops_ctx *ctx, size_t nparams, pf_coll *ring,
                  const ctl_book *book)
{
    d->dev = dev;
    d->ctx = ctx;
    d->nparams = nparams;
    d->ring = ring;
    d->direct = dev == &ops_cpu;
    d->backend = d->direct ? "fabric ring on the parameters in place" : "fabric ring through host staging";
    int rc = d->di.cuda ? open_nccl(d, book) : 0;
    if (rc < 0)
        return rc;
    if (!d->direct && !d->have_nccl && !(d->h_stage = malloc(nparams * sizeof(float))))
        return pf_err(-ENOMEM, "out of memory for the %zu-float gradient staging buffer", nparams);
    return 0;
}

/* The backbone's collective over n floats at buf (n <= nparams: the staging buffer's size): broadcast from
 * rank 0 (bcast != 0) or allreduce (sum). */
static int bb_collective(wdev *d, float *buf, size_t n, int bcast)
{
    size_t bytes = n * sizeof(float);
    pf_coll *c = d->have_nccl ? &d->nccl : d->ring;
    if (d->have_nccl || d->direct)
        return bcast ? coll_broadcast(c, buf, bytes, 0) : coll_allreduce(c, buf, n, COLL_F32, COLL_SUM);
    if (n > d->nparams)
        return pf_err(-EINVAL, "backbone collective of %zu floats: the staging buffer holds %zu", n, d->nparams);
    int rc = d->dev->mem_d2h(d->ctx, d->h_stage, buf, bytes);
    if (rc == 0)
        rc = bcast ? coll_broadcast(c, d->h_stage, bytes, 0)
                   : coll_allreduce(c, d->h_stage, n, COLL_F32, COLL_SUM);
    if (rc == 0)
        rc = d->dev->mem_h2d(d->ctx, buf, d->h_stage, bytes);
    return rc;
}

int wdev_bcast(wdev *d, float *buf)
{
    return bb_collective(d, buf, d->nparams, 1);
}

int wdev_bcast_floats(wdev *d, float *buf, size_t n)
{
    return bb_collective(d, buf, n, 1);
}

int wdev_allreduce(wdev *d, float *buf)
{
    return bb_collective(d, buf, d->nparams, 0);
}

/* fp16 gradient mean (coll_allreduce_fp16_mean's arithmetic) over NCCL on device buffers: the cast and div_ by
 * a kernel into device scratch, NCCL's fp16 sum, the copy back to float32. */
static int grads_fp16_nccl(wdev *d, float *buf)
{
#ifdef PFCPS_HAVE_CUDA_OPS
    size_t n = d->nparams;
    if (!d->d_grad16) {
        int rc = cuda_malloc(&d->d_grad16, n * sizeof(uint16_t));
        if (rc < 0)
            return pf_err_wrap(rc, "device %s: %zu bytes of fp16 gradient scratch", d->di.name, n * 2);
    }
    int rc = cuda_f16_compress(d->d_grad16, buf, n, (float)d->W);
    if (rc == 0)
        rc = coll_allreduce(&d->nccl, d->d_grad16, n, COLL_F16, COLL_SUM);
    if (rc == 0)
        rc = cuda_f16_to_f32(buf, d->d_grad16, n);
    return rc;
#else
    (void)d;
    (void)buf;
    return pf_err(-ENODEV, "NCCL without the CUDA device");
#endif
}

int wdev_allreduce_grads(wdev *d, float *buf, int fp16)
{
    if (!fp16)
        return wdev_allreduce(d, buf);
    if (d->have_nccl)
        return grads_fp16_nccl(d, buf);
    size_t n = d->nparams, bytes = n * sizeof(float);
    if (!d->h_grad16 && !(d->h_grad16 = malloc(n * sizeof(uint16_t))))
        return pf_err(-ENOMEM, "out of memory for the %zu-value fp16 gradient buffer", n);
    if (d->direct)
        return coll_allreduce_fp16_mean(d->ring, buf, d->h_grad16, n);
    int rc = d->dev->mem_d2h(d->ctx, d->h_stage, buf, bytes);
    if (rc == 0)
        rc = coll_allreduce_fp16_mean(d->ring, d->h_stage, d->h_grad16, n);
    if (rc == 0)
        rc = d->dev->mem_h2d(d->ctx, buf, d->h_stage, bytes);
    return rc;
}

/* *p = zero-filled device memory of the model's device. */
static int dev_alloc(wdev *d, void **p, size_t bytes, const char *what)
{
    int rc = d->dev->mem_alloc(d->ctx, p, bytes);
    return rc < 0 ? pf_err_wrap(rc, "device %s: %zu bytes for %s", d->di.name, bytes, what) : 0;
}

static void dev_free(wdev *d, void *p)
{
    if (p && d->dev && d->ctx)
        d->dev->mem_free(d->ctx, p);
}

#ifdef PFCPS_HAVE_CUDA_OPS
/* cuda: pinned host rows (full-speed asynchronous copies), device rows, the side stream and the GPU head (its
 * collectives on NCCL, or without NCCL on the ring over managed staging buffers). Says which path
 * class-center rows take (FI_HMEM straight to GPU memory is detected, not used: docs/architecture.md). */
static int gpu_head_create(wdev *d, pfc *head, size_t kd, const char *provider)
{
    size_t bytes = (kd ? kd : 1) * sizeof(float);
    struct wdev_gpu *g = calloc(1, sizeof *g);
    if (!g)
        return pf_err(-ENOMEM, "out of memory");
    d->gpu = g;
    int rc = cuda_host_pinned_alloc((void **)&d->centers, bytes);
    if (rc == 0 && (rc = cuda_host_pinned_alloc((void **)&d->grad_centers, bytes)) < 0) {
        cuda_host_pinned_free(d->centers);
        d->centers = NULL;
    }
    if (rc < 0)
        return pf_err_wrap(rc, "pinned host buffers for %zu class-center floats", kd);
    int h = fab_hmem_cuda_supported(provider);
    const char *staging = "class-center rows: pinned host staging (pulled into pinned host memory, copied to "
                          "the GPU on a side stream during the backbone forward)";
    if (h < 0)
        log_warn("%s; FI_HMEM detection failed: %s", staging, pf_errmsg());
    else if (h == 1)
        log_info("%s; provider %s offers FI_HMEM for CUDA (%s), but pfcps does not register GPU buffers with "
                 "the fabric",
                 staging, provider, pf_errmsg());
    else
        log_info("%s; no FI_HMEM for CUDA on provider %s (%s)", staging, provider, pf_errmsg());
    pf_coll *hc = d->W == 1 ? NULL : d->have_nccl ? &d->nccl : d->ring;
    if ((rc = pfc_cuda_create(&g->gh, head, hc, hc && !d->have_nccl)) < 0)
        return pf_err_wrap(rc, "the GPU head");
    g->have_gh = 1;
    d->gpu_head = 1;
    if ((rc = dev_alloc(d, (void **)&g->d_centers, bytes, "class-center rows")) < 0 ||
        (rc = dev_alloc(d, (void **)&g->d_grad_centers, bytes, "class-center gradients")) < 0)
        return rc;
    if ((rc = cuda_side_stream_create(&g->side)) < 0)
        return pf_err_wrap(rc, "the side stream for class-center rows");
    return 0;
}
#endif

int wdev_head_create(wdev *d, pfc *head, const char *provider)
{
    const int B = (int)head->batch, D = (int)head->d;
    size_t kd = (size_t)head->k_max * (size_t)D;
    d->bd = (size_t)B * (size_t)D;
    int rc = 0;
    if (d->di.cuda) {
#ifdef PFCPS_HAVE_CUDA_OPS
        rc = gpu_head_create(d, head, kd, provider);
#else
        rc = pf_err(-ENODEV, "device %s: this pfcps-worker was built without the CUDA device", d->di.name);
#endif
    } else {
        (void)head;
        (void)provider;
        size_t bytes = (kd ? kd : 1) * sizeof(float);
        d->centers = malloc(bytes);
        d->grad_centers = malloc(bytes);
        if (!d->centers || !d->grad_centers)
            rc = pf_err(-ENOMEM, "out of memory for %zu class-center floats", kd);
    }
    if (rc < 0)
        return rc;
    d->h_emb = malloc(d->bd * sizeof(float));
    d->grad_emb = malloc(d->bd * sizeof(float));
    if (!d->h_emb || !d->grad_emb)
        return pf_err(-ENOMEM, "out of memory for head buffers (batch %d x %d)", B, D);
    if ((rc = dev_alloc(d, (void **)&d->d_grad_emb, d->bd * sizeof(float), "the embedding gradient")) < 0)
        return rc;
    log_info("head on the %s, its collectives on %s; label allgather and sampling on the host (fabric ring)",
             d->gpu_head ? "GPU (pfc_cuda)" : "CPU (pfc_step, host copies of the embeddings)",
             d->gpu_head && d->have_nccl ? "NCCL"
             : d->W == 1                 ? "nothing (one worker)"
                                         : "the fabric ring");
    return 0;
}

int wdev_head_step(wdev *d, pfc *head, const float *emb, int64_t k, double *loss)
{
#ifdef PFCPS_HAVE_CUDA_OPS
    if (d->gpu_head) {
        struct wdev_gpu *g = d->gpu;
        size_t kd = (size_t)k * (size_t)head->d;
        int rc = kd ? cuda_h2d_async(g->d_centers, d->centers, kd * sizeof(float), g->side) : 0;
        if (rc == 0)
            rc = cuda_default_stream_wait(g->side);
        if (rc == 0)
            rc = pfc_cuda_step(&g->gh, head, emb, g->d_centers, loss, d->d_grad_emb, g->d_grad_centers);
        if (rc == 0 && kd)
            rc = d->dev->mem_d2h(d->ctx, d->grad_centers, g->d_grad_centers, kd * sizeof(float));
        return rc;
    }
#endif
    (void)k;
    int rc = d->dev->mem_d2h(d->ctx, d->h_emb, emb, d->bd * sizeof(float));
    if (rc == 0)
        rc = pfc_step(head, d->h_emb, d->centers, loss, d->grad_emb, d->grad_centers);
    if (rc == 0)
        rc = d->dev->mem_h2d(d->ctx, d->d_grad_emb, d->grad_emb, d->bd * sizeof(float));
    return rc;
}

void wdev_log_memory(const wdev *d)
{
#ifdef PFCPS_HAVE_CUDA_OPS
    size_t gfree = 0, gtotal = 0;
    if (d->di.cuda && cuda_mem_info(&gfree, &gtotal) == 0)
        log_info("GPU memory in use at the end (whole device, cudaMemGetInfo): %.0f MiB of %.0f MiB",
                 (double)(gtotal - gfree) / 1048576.0, (double)gtotal / 1048576.0);
#else
    (void)d;
#endif
}

void wdev_close(wdev *d)
{
    if (!d)
        return;
    dev_free(d, d->d_grad_emb);
#ifdef PFCPS_HAVE_CUDA_OPS
    struct wdev_gpu *g = d->gpu;
    if (g) {
        if (g->have_gh)
            pfc_cuda_free(&g->gh);
        if (g->side)
            cuda_side_stream_destroy(g->side);
        dev_free(d, g->d_centers);
        dev_free(d, g->d_grad_centers);
        cuda_host_pinned_free(d->centers);
        cuda_host_pinned_free(d->grad_centers);
        d->centers = d->grad_centers = NULL;
        free(g);
    }
#endif
    if (d->have_nccl)
        coll_destroy(&d->nccl);
    free(d->centers);
    free(d->grad_centers);
    free(d->h_emb);
    free(d->grad_emb);
    free(d->h_stage);
    free(d->h_grad16);
#ifdef PFCPS_HAVE_CUDA_OPS
    if (d->d_grad16)
        cuda_free(d->d_grad16);
#endif
    memset(d, 0, sizeof *d);
}
