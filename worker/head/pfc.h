/* Partial FC step glue for one worker (docs/architecture.md, One training step, items 2 and 5; the
 * parameter-server pull and push, items 3 and 6, are the training loop's, between pfc_sample and pfc_step):
 *
 *   pfc_sample(step, labels of my batch)        global mode: allgather labels (W*B), sample my
 *                                               partition; local mode: sample from my own labels
 *   ... training loop pulls rows `ids` from the servers ...
 *   pfc_step(my embeddings, pulled centers)     global: allgather embeddings (W*B x D), head with
 *                                               allreduced softmax, reduce-scatter the embedding
 *                                               gradients back (sum); local: head on my batch
 *   ... push grad_centers (k x D) for `ids`, backbone backward with grad_embeddings (B x D) ...
 *
 * grad_embeddings is dL/d(my embeddings) of the global mean loss over all W*B rows. arcface_torch
 * multiplies it by W because DDP then averages the backbone gradients over workers; pfcps's training
 * loop must do the same if it averages (or sum the backbone gradients instead). */
#ifndef PFCPS_WORKER_HEAD_PFC_H
#define PFCPS_WORKER_HEAD_PFC_H

#include <stdint.h>

#include "common/coll.h"
#include "worker/head/head.h"
#include "worker/head/sample.h"

typedef struct pfc {
    head_params params;
    pf_coll *coll; /* NULL = single process */
    int world_size, rank;
    int64_t num_classes;
    double sample_rate;
    uint64_t seed;
    int64_t batch; /* B, rows per worker */
    int64_t d;
    int64_t n; /* rows the head sees: W*B (global) or B (local) */
    int64_t k_max;
    int64_t *labels_all;   /* (n) labels of the rows the head sees */
    int64_t *labels_local; /* (n) remapped to columns of ids, -1 elsewhere */
    int64_t *ids;          /* (k) sorted sampled class ids (owned; valid until the next pfc_sample) */
    int64_t k;
    float *emb_all;  /* (n, d) global mode: allgathered embeddings */
    float *grad_all; /* (n, d) global mode: this worker's part of the gradient before reduce-scatter */
    head_ws ws;
    int sampled;
    int64_t step;  /* of the last pfc_sample */
    int host_head; /* 0: created with PFC_NO_HOST_HEAD (no emb_all, grad_all, ws) */
} pfc;

/* Sets up a worker's Partial FC state: params (head_params.mode chooses global/local), the group
 * (coll may be NULL for one process), C classes, sample_rate in [0, 1] (0: the positives only), seed, per-worker batch B and D.
 * Allocates the head workspace for the largest possible sample (k_max = max(ceil(r * P), min(n, P)),
 * P the partition size), so nothing is allocated per step except the sampled id list.
 * Returns 0, -EINVAL naming the bad argument, -ENOMEM. */
int pfc_init(pfc *x, const head_params *params, pf_coll *coll, int64_t num_classes, double sample_rate,
             uint64_t seed, int64_t batch, int64_t d);

/* pfc_init with flags. PFC_NO_HOST_HEAD: sampling only (pfc_sample, labels_local, k_max), for a worker whose
 * head runs on the GPU (worker/head/pfc_cuda.h): the host head's workspace (n x k_max floats of cosines,
 * ~5 GB per worker at 100M classes) and the global-mode embedding buffers are not allocated, and pfc_step
 * returns -EINVAL. */
#define PFC_NO_HOST_HEAD 1u
int pfc_init_flags(pfc *x, const head_params *params, pf_coll *coll, int64_t num_classes, double sample_rate,
                   uint64_t seed, int64_t batch, int64_t d, unsigned flags);

/* Step 1-2: labels (B) of this worker's batch for global step `step`. Sets *ids (sorted global class ids
 * to pull, owned by x) and *k. Errors: -ERANGE for a label outside [0, C) (message names the row; in
 * global mode the row of the global batch), a collective's error. */
int pfc_sample(pfc *x, int64_t step, const int64_t *labels, const int64_t **ids, int64_t *k);

/* Steps 4-5-7: embeddings (B, D) of this worker, centers (k, D) pulled for the ids of pfc_sample, in the
 * same order. Outputs (may be NULL): loss (global mean, same on all ranks), grad_embeddings (B, D) and
 * grad_centers (k, D), overwritten. Returns 0, -EINVAL (no pfc_sample before), the head's / a
 * collective's error, or (same verdict on every rank, after all collectives of the step) -ERANGE when
 * the loss is NaN or infinite ("loss is nan at step 12") and -EPROTO when a row of the global batch
 * found its target class on no worker (a label or sampling fault: such a row would count 69.0776, the
 * value of a loss stuck at -log(1e-30)); the outputs are still written. */
int pfc_step(pfc *x, const float *embeddings, const float *centers, double *loss, float *grad_embeddings,
             float *grad_centers);

void pfc_free(pfc *x);

#endif
