/* Partial FC step on the CUDA device: the device twin of pfc_step (worker/head/pfc.h) for a worker whose
 * backbone runs on the GPU (docs/architecture.md, One training step, item 5, and Devices).
 *
 *   host:   pfc_init(&p, ...)                        sampling state (host memory), host pf_coll
 *           pfc_cuda_create(&g, &p, dev_coll, 0)     device workspace, sized once from p
 *   step:   pfc_sample(&p, step, labels, &ids, &k)   on the HOST: ids drive the parameter-server pull
 *           ... pull rows `ids` into pinned memory, copy to dev_centers (k, D) ...
 *           pfc_cuda_step(&g, &p, dev_emb, dev_centers, &loss, dev_grad_emb, dev_grad_centers)
 *           ... push dev_grad_centers for `ids`, backbone backward with dev_grad_emb ...
 *
 * Sampling stays on the host, with no GPU kernel, because pfc_sample's ids are needed on the host anyway
 * (they name the rows to pull from the servers, before the backbone forward so that the pull overlaps it),
 * it costs O(W*B + k) host work per step, and one sampler keeps the CPU and CUDA workers' samples
 * identical. pfc_cuda_step uploads the host's labels_local (the columns of the targets, W*B int64) each
 * step.
 *
 * Math: exactly head_forward's and head_backward's (worker/head/head.h) through cuda_head_dist
 * (kernels/cuda/cuda_ops.h): global mode allgathers the embeddings (W*B rows, rank-major), allreduces
 * the row max then (sum of exp, target logit, has-target, bad-label) per row, and reduce-scatters
 * (sum) the embedding gradients back to this worker's B rows; local mode runs the head on its own B
 * rows with gradient scale 1/(B W) and allreduces the mean loss. grad_embeddings is dL/d(my
 * embeddings) of the global mean loss, as pfc_step's (a loop that averages backbone gradients over
 * workers multiplies it by W, as arcface_torch).
 *
 * Collectives: `dev_coll` is a pf_coll whose buffers are device memory (NCCL: coll_nccl_create), or
 * with coll_host_memory = 1 a host-memory backend (coll_thread, coll_fabric): the buffers it sees are
 * then allocated with cudaMallocManaged and the device is synchronized before each collective (for
 * tests and CPU-ring debugging; ranks sharing one GPU as threads need concurrent managed access,
 * cuda_managed_concurrent()). NULL when the host pfc has world_size 1. The host pfc keeps its own
 * (host) pf_coll for pfc_sample's label allgather.
 *
 * Verdicts (same as pfc_step, agreed by all ranks): -ERANGE when the loss is NaN or infinite, -EPROTO
 * when rows of the batch found their target on no worker (outputs still written); a label outside
 * [-1, k) in labels_local gives -ERANGE on every rank with no output written. Two departures from
 * pfc_step, both making verdicts agree where pfc_step's could differ between ranks: in local mode the
 * no-target count is summed over the ranks (pfc_step counts each rank's own rows), and the NaN check
 * runs even when the caller passes loss = NULL. */
#ifndef PFCPS_WORKER_HEAD_PFC_CUDA_H
#define PFCPS_WORKER_HEAD_PFC_CUDA_H

#ifdef PFCPS_HAVE_CUDA_OPS

#include <stdint.h>

#include "common/coll.h"
#include "kernels/cuda/cuda_ops.h"
#include "worker/head/pfc.h"

typedef struct pfc_cuda {
    cuda_head_params params;
    int local; /* head_mode local (own softmax per worker) */
    int world_size, rank;
    pf_coll *coll;              /* device collectives; NULL for one process */
    int coll_host;              /* the coll reads host memory: its buffers are managed, synchronized */
    int64_t batch, d, n, k_max; /* B, D, rows the head sees (W*B global, B local), largest sample */
    cuda_head_ws ws;            /* head workspace (n, k_max, d) */
    int64_t *dev_labels;        /* (n) labels_local uploaded each step */
    float *emb_all, *grad_all;  /* (n, d) global mode with W > 1: allgathered rows, their gradient */
    float *emb_send;            /* (B, d) coll_host: staging copy of the caller's embeddings */
    float *grad_recv;           /* (B, d) reduce-scatter target when the caller's buffer cannot be used */
    int created;
} pfc_cuda;

/* Creates the device state for the initialized host pfc `host` (pfc_init): its params, mode, world
 * size, rank, B, D, n and k_max. dev_coll must have host's world size and rank (NULL allowed only
 * for world_size 1). Allocates everything the steps need (the head workspace of n x k_max cosines,
 * n x D rows twice in global mode): nothing is allocated per step.
 * Returns 0, -EINVAL (NULL or uninitialized host pfc, coll missing or not matching, sizes above
 * INT_MAX, scale <= 0 or margins not finite) checked before touching the GPU, -ENODEV (no CUDA
 * device), -ENOMEM (device memory), -EIO (CUDA / cuBLAS). On error *x is left freed (zeroed). */
int pfc_cuda_create(pfc_cuda *x, const pfc *host, pf_coll *dev_coll, int coll_host_memory);

/* One step for the sample `host_state` holds (pfc_sample of this step: ids, k, labels_local).
 *   dev_embeddings     (B, D) this worker's embeddings, device memory
 *   dev_centers        (k, D) the pulled rows of host_state->ids, same order (NULL allowed when k = 0)
 * Outputs (each may be NULL): loss (host; global mean, same on every rank), dev_grad_embeddings (B, D),
 * dev_grad_centers (k, D), overwritten. With both gradients NULL only the forward runs.
 * Returns 0; -EINVAL (not created, NULL inputs, host_state not sampled or not the pfc this state was
 * created from, k > k_max) before any collective; a collective's or CUDA's error; or the verdicts
 * above (-ERANGE, -EPROTO), the same on every rank. host_state is not modified (pfc_step clears its
 * `sampled` flag, pfc_cuda_step does not). Synchronizes (the row sums come to the host). */
int pfc_cuda_step(pfc_cuda *x, const pfc *host_state, const float *dev_embeddings, const float *dev_centers,
                  double *loss, float *dev_grad_embeddings, float *dev_grad_centers);

/* Frees the device state (zeroed or NULL allowed). */
void pfc_cuda_free(pfc_cuda *x);

#endif /* PFCPS_HAVE_CUDA_OPS */
#endif
