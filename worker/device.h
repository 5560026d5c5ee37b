/* The worker's device: everything the training loop needs from the device beyond the kernels/ops.h table.
 *
 *   train_device_resolve   config keys device, fp16, bf16 -> an ops.h device name and its precision
 *   wdev_make_id           worker 0's NCCL unique id (cuda), carried in its address-book entry
 *   wdev_open              GPU choice (worker w uses GPU w mod visible GPUs)
 *   wdev_backbone          the backbone's collective (NCCL over device buffers on cuda, else the fabric ring:
 *                          in place on the plain CPU device, through a host staging buffer otherwise)
 *   wdev_head_create       host buffers for the pulled class-center rows (pinned on cuda) and the margin-
 *                          softmax head on the device: the GPU head (worker/head/pfc_cuda.h) on cuda, the CPU
 *                          head (pfc_step) on host copies of the embeddings elsewhere
 *   wdev_head_step         one head step, the same call for both heads
 *   wdev_bcast / wdev_allreduce   the backbone's parameter broadcast and gradient allreduce
 *   wdev_bcast_floats      a broadcast from worker 0 of fewer floats (worker 0's BN statistics)
 *
 * This file pair is the only place in the worker's loop that knows whether the device is a GPU: train.c
 * has no #ifdef. Without the CUDA device (no PFCPS_HAVE_CUDA_OPS) the CUDA paths refuse with -ENODEV. */
#ifndef PFCPS_WORKER_DEVICE_H
#define PFCPS_WORKER_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "common/coll.h"
#include "common/config.h"
#include "common/ctl.h"
#include "kernels/ops.h"
#include "worker/head/pfc.h"

/* The device a run config asks for (keys device, fp16, bf16), resolved to a kernels/ops.h device. */
typedef struct train_device_info {
    char name[32];       /* ops_device_by_name name: cpu cpu-fenced cpu-bf16 cuda cuda-fp16 cuda-bf16 */
    char precision[160]; /* for the start-up log: "fp32", "fp16 body, fp32 master weights, ..." */
    int cuda;            /* a CUDA device: NCCL collectives (when built), pinned class-center rows */
    int loss_scaling;    /* fp16 = true on a half device (cuda-fp16, cpu-bf16): dynamic loss scaling */
    char warning[256];   /* non-empty: fp16 / bf16 asked for on a device without a half path (log it) */
} train_device_info;

/* Resolves cfg's device, fp16 and bf16 keys:
 *   cuda + fp16 -> cuda-fp16 with loss scaling; cuda + bf16 -> cuda-bf16; cuda -> cuda;
 *   cpu-bf16 (+ fp16: loss scaling, as on cuda-fp16); cpu / cpu-fenced + fp16 or bf16 -> fp32 with a warning.
 * Checks that the device can run here: -ENODEV naming key 'device' and the cause when this binary was
 * built without the CUDA device (no PFCPS_HAVE_CUDA_OPS) or no GPU is visible (cuda_device_count() == 0),
 * or when ops_device_by_name does not know the resolved name; -EINVAL when fp16 and bf16 are both true or
 * the device is not one of cpu, cuda, cpu-fenced, cpu-bf16 (message lists them). Returns 0 otherwise. */
int train_device_resolve(const pf_config *cfg, train_device_info *out);

/* Bytes of the NCCL unique id that worker 0 of a cuda run publishes as the third part of its address. */
#define WDEV_ID_BYTES 128

/* Worker `rank` about to join with config key device = `device`: for worker 0 of a cuda run in a binary
 * with NCCL, makes the NCCL unique id into id (WDEV_ID_BYTES bytes) and returns 1 (the id travels in the
 * address book); returns 0 when there is nothing to publish; a negative code when making the id fails. */
int wdev_make_id(const char *device, int rank, uint8_t id[WDEV_ID_BYTES]);

struct wdev_gpu; /* CUDA-only state (device.c): GPU head, device rows, side stream */

typedef struct wdev {
    train_device_info di;
    const ops_device *dev; /* the model's device table */
    ops_ctx *ctx;          /* the model's device context */
    int rank, W;
    int direct;    /* device memory is plain host memory host code may touch (device "cpu") */
    pf_coll *ring; /* the fabric ring among the workers (host memory) */
    pf_coll nccl;  /* NCCL over device buffers (cuda, NCCL built) */
    int have_nccl;
    const char *backend; /* the backbone collective, for the start-up log */
    float *h_stage;      /* (nparams) host staging for the backbone collectives through the ring */
    uint16_t *h_grad16;  /* (nparams) host fp16 gradients of wdev_allreduce_grads over the ring */
    void *d_grad16;      /* (nparams) device fp16 gradients of wdev_allreduce_grads over NCCL */
    size_t nparams;
    /* Head buffers (wdev_head_create). */
    float *centers, *grad_centers; /* host (k_max, D), pinned on cuda: pulled rows, their gradients (push) */
    float *h_emb, *grad_emb;       /* host (B, D): embeddings for the CPU head, its embedding gradient */
    float *d_grad_emb;             /* device (B, D): the embedding gradient model_backward reads */
    size_t bd;                     /* B x D */
    int gpu_head;                  /* the head runs on the GPU */
    struct wdev_gpu *gpu;          /* CUDA state; NULL elsewhere */
} wdev;

/* Opens the device part of worker `rank` of W for the resolved device `di`, before the model is created:
 * selects the GPU on cuda (GPU rank mod visible GPUs, logged). Returns 0, or -ENODEV / a CUDA error.
 * Call wdev_close on failure too. */
int wdev_open(wdev *d, const train_device_info *di, int rank, int W);

/* The backbone's collective, once the model exists on table `dev` with context `ctx` (nparams parameters):
 * NCCL from worker 0's id in `book` on cuda where NCCL is built, else the ring `ring`, with the host staging
 * buffer the ring needs when device memory is not host memory (d->backend says which, for the log).
 * Returns 0, -EPROTO (worker 0's entry carries no NCCL id), -ENOMEM, or an NCCL error. */
int wdev_backbone(wdev *d, const ops_device *dev, ops_ctx *ctx, size_t nparams, pf_coll *ring,
                  const ctl_book *book);

/* The backbone's collectives over the nparams floats at buf (device memory): broadcast from worker 0, or
 * allreduce (sum). NCCL on device buffers, the ring in place on the CPU device, else the ring on a host copy.
 * Returns 0 or the collective's / device's negative code. */
int wdev_bcast(wdev *d, float *buf);
int wdev_allreduce(wdev *d, float *buf);

/* Broadcast from worker 0 of n floats at buf (device memory, n <= nparams), over the backbone's collective
 * (wdev_bcast's paths). Returns 0, -EINVAL when n exceeds the host staging buffer, or the collective's /
 * device's negative code. */
int wdev_bcast_floats(wdev *d, float *buf, size_t n);

/* The backbone gradients' collective (nparams floats at buf, device memory), the result the mean over the W
 * workers. fp16 = 0: wdev_allreduce's float32 sum, then the caller multiplies by 1/W. fp16 = 1: torch DDP's
 * fp16_compress_hook (common/coll.h coll_allreduce_fp16_mean: fp16(fp16(g) / W) summed in fp16, read back
 * as float32; the mean already). Scratch of nparams fp16 values allocated at the first call (host, or
 * device under NCCL). Returns 0, -ENOMEM, or the collective's / device's negative code. */
int wdev_allreduce_grads(wdev *d, float *buf, int fp16);

/* Head buffers for head->k_max sampled rows of D floats and a batch of B embeddings (B, D: the sampler's),
 * and the head itself: on cuda the GPU head (pfc_cuda, its collectives on NCCL or, without NCCL, on the ring
 * through managed buffers) over the sampler `head` (pfc_init'ed with PFC_NO_HOST_HEAD), pinned host rows,
 * device rows and a side stream for their upload; elsewhere plain host buffers for the CPU head (pfc_step).
 * Logs where the head runs and, on cuda, which path the class-center rows take. Returns 0, -ENOMEM, or a CUDA
 * error. */
int wdev_head_create(wdev *d, pfc *head, const char *provider);

/* One head step for the sample in `head` (pfc_sample of this step, k rows pulled into d->centers):
 *   emb (B, D) device memory: this worker's embeddings
 * -> *loss (global mean), d->d_grad_emb (B, D, device): d(global mean loss)/d(my embeddings), and
 *    d->grad_centers (k, D, host): the rows' gradients for the push.
 * GPU head: the rows go up on the side stream (the forward is still queued on the default stream, which then
 * waits for the copy); CPU head: emb copied to the host, pfc_step, the gradient uploaded.
 * Returns 0 or pfc_step's / pfc_cuda_step's negative code (-ERANGE non-finite loss, -EPROTO no target). */
int wdev_head_step(wdev *d, pfc *head, const float *emb, int64_t k, double *loss);

/* Logs the GPU memory in use (cuda; nothing elsewhere). */
void wdev_log_memory(const wdev *d);

/* Frees everything wdev_open / wdev_head_create made (before the model's device context goes). */
void wdev_close(wdev *d);

#endif
