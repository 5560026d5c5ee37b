/* Partial FC margin-softmax head (ArcFace / CosFace / combined margin), forward and backward, on the
 * CPU with BLAS (docs/architecture.md, One training step, item 5).
 *
 * Math (ArcFace paper, Deng et al. 2019, eq. 3 and the combined margin of eq. 4; arcface_torch
 * CombinedMarginLoss + PartialFC_V2 / DistCrossEntropyFunc):
 *   en_i = e_i / max(|e_i|, 1e-12)        wn_j = w_j / max(|w_j|, 1e-12)      (F.normalize)
 *   c_ij = clamp(en_i . wn_j, -1, 1)
 *   target (j == label_i): t = clamp(c, -1+1e-7, 1-1e-7), theta = acos(t),
 *                          v = cos(m1*theta + m2) - m3
 *   interclass filtering (threshold tau > 0, non-target only): c > tau -> v = 0, no gradient
 *   otherwise v = c;  logits z_ij = s * v_ij
 *   softmax over all columns of all workers (global mode: row max and row sum of exp allreduced),
 *   loss = (1/N) sum_i -log p_i,label_i computed as log-softmax (z_t - max - log sum), the float64
 *   reference's value; a row whose target is on no worker counts -log(1e-30) = 69.0776 (arcface_torch's
 *   floor). With clamp_loss set, every row is floored like arcface_torch's clamp_min(1e-30) (loss of a
 *   row at most 69.0776; the reference cases N8_K50_D16 have rows beyond it, so it is off by default).
 *   dL/dz = (p - onehot) / N; margin derivative `exact` (d v/d c = m1 sin(m1 theta + m2)/sqrt(1-t^2),
 *   zero outside the clamp ranges as torch.clamp's backward) or `straight_through` (d v/d c = 1,
 *   arcface_torch since 2022); then back through both normalizations:
 *   de_i = (g_i - en_i (en_i . g_i)) / max(|e_i|, 1e-12) where g_i = dL/d en_i.
 */
#ifndef PFCPS_WORKER_HEAD_HEAD_H
#define PFCPS_WORKER_HEAD_HEAD_H

#include <stddef.h>
#include <stdint.h>

#include "common/coll.h"

typedef enum { HEAD_MARGIN_GRAD_EXACT = 0, HEAD_MARGIN_GRAD_STRAIGHT_THROUGH = 1 } head_margin_grad;

/* HEAD_MODE_GLOBAL: the N rows are the global batch (allgathered embeddings), every worker holds a
 * slice of the columns, max and sum of exp are allreduced: one softmax over all workers' columns.
 * HEAD_MODE_LOCAL: the N rows are this worker's own batch and its own softmax; the gradients are
 * scaled by 1/(N * world_size) so that the sum of all workers' gradients is the gradient of the
 * global mean loss (mean over workers of the per-worker mean losses, equal batch sizes). */
typedef enum { HEAD_MODE_GLOBAL = 0, HEAD_MODE_LOCAL = 1 } head_mode;

typedef struct head_params {
    double s;                              /* logit scale, 64 */
    double m1, m2, m3;                     /* combined margin: ArcFace (1, 0.5, 0), CosFace (1, 0, 0.4) */
    double interclass_filtering_threshold; /* 0 = off */
    head_margin_grad margin_grad;
    head_mode mode;
    int clamp_loss; /* 1: floor p_target at 1e-30 in the loss value (arcface_torch) */
    int sample_ceil; /* Partial FC's sample count: 0 int(rate * P) (arcface_torch), 1 ceil (sample_rounding) */
} head_params;

/* Parses "exact" / "straight_through" (config key margin_grad) and "global" / "local" (head_mode).
 * Return 0 or -EINVAL naming the value. */
int head_parse_margin_grad(const char *name, head_margin_grad *out);
int head_parse_mode(const char *name, head_mode *out);

struct pf_config;

/* Fills `out` from the run config (common/config.h): scale, margin_list (as margin_combine says),
 * interclass_filtering_threshold, margin_grad, head_mode, sample_rounding; clamp_loss off. Returns 0 or -EINVAL naming the bad value. */
int head_params_from_config(const struct pf_config *cfg, head_params *out);

/* Workspace reused across steps (no allocation on the hot path). Sized for at most n_max rows,
 * k_max columns, d features: n_max*k_max + 2*n_max*d + 2*n_max + k_max floats plus 4*n_max + k_max
 * doubles.
 * The normalized class centers are never stored: cos = (en . w^T) * inv_w column by column (head.c).
 */
typedef struct head_ws {
    int64_t n_max, k_max, d;
    float *cos;           /* (n_max, k_max): en . w^T, then dL/dcos_ij * inv_w_j / f_i in place (head.c) */
    float *en;            /* (n_max, d) normalized embeddings */
    float *en_g;          /* (n_max, d) en_i * f_i, f_i = s g / sum_i the row factor of dL/dcos (backward) */
    double *inv_e;        /* (n_max) 1 / max(|e_i|, 1e-12) */
    double *inv_w;        /* (k_max) */
    float *inv_wf;        /* (k_max) inv_w rounded to float: the column scale of the cosines */
    float *row_max;       /* (n_max) */
    double *row_red;      /* (3 n_max): sum exp(z - max), z_target - max, has-target count */
    float *tcos;          /* (n_max) raw target cosine of each row */
    float *ge_part;       /* min(HEAD_GE_LANES_MAX n_max d, HEAD_GE_PART_BYTES / 4) floats: per-lane partial
                           * dL/d en sums, lane l at l * n * d for a call with n rows (head.c) */
    int64_t no_target;    /* set by each head_forward: rows whose target is on no worker */
    int64_t fwd_n, fwd_k; /* n and k of the last successful head_forward (fwd_n 0: none): head_backward's */
    int fwd_world;        /* world size of that forward's group (local mode's gradient scale) */
} head_ws;

/* Allocates the workspace. Returns 0, -EINVAL (non-positive n_max/d, negative k_max), -ENOMEM. */
int head_ws_init(head_ws *ws, int64_t n_max, int64_t k_max, int64_t d);
void head_ws_free(head_ws *ws);

/* Forward of the head on this worker: embeddings (n,d), centers (k,d), labels (n) -> loss, logits (n,k).
 *   embeddings (n, d): global batch in global mode (rank-major, as allgathered), own batch in local
 *   centers    (k, d): this worker's pulled class centers (k may be 0). They enter the SGEMMs
 *                      unnormalized (the cosines are scaled by 1/max(|w|, 1e-12) afterwards): full float
 *                      precision needs row norms |w| in [1e-30, 1e30] (or 0); elements near float's
 *                      limits (1e38, or subnormal) are out of range
 *   labels     (n):    column of the target in `centers`, or -1 when it lives on another worker
 *   coll:              the workers' collectives; NULL = single process (world_size 1)
 * Outputs (each may be NULL to skip):
 *   loss: global mean loss (same value on every rank; in local mode the mean over ranks)
 *   logits (n, k): z = s * margin-applied cosines (what the softmax sees)
 * The workspace keeps what head_backward needs (the softmax numerators in ws->cos, the row sums, the
 * norms) and ws->no_target counts the rows whose target is on no worker.
 * Errors: -EINVAL (n, k, d outside the workspace, bad params), -ERANGE (a label outside [-1, k),
 * message names the row) — both before any collective, so a caller with a group must abort the group;
 * or the collective's error. */
int head_forward(const head_params *p, head_ws *ws, pf_coll *coll, double *loss, float *logits,
                 const float *embeddings, const float *centers, const int64_t *labels, int64_t n, int64_t k,
                 int64_t d);

/* Backward of the last head_forward on `ws` (same p, embeddings, centers, labels, n, k, d): dL/dloss = 1
 * (the loss is the end of the graph) -> grad_embeddings (n,d), grad_centers (k,d), each OVERWRITTEN (not
 * accumulated as kernels/ops.h's parameter gradients are) and each may be NULL to skip.
 *   grad_embeddings: this worker's part of dL/d embeddings; in global mode the caller sums it over workers
 *     (reduce-scatter) so that each worker gets dL/d its own B rows. This is the gradient of the global
 *     mean loss: a caller that averages backbone gradients over workers afterwards must scale by
 *     world_size (arcface_torch's AllGather backward does `*= W`).
 *   grad_centers: dL/d centers.
 * No collective: the forward allreduced what the backward reads. Running it twice gives the same result.
 * Errors: -EINVAL (NULL argument, no successful forward of this n and k on ws). */
int head_backward(const head_params *p, head_ws *ws, float *grad_embeddings, float *grad_centers,
                  const float *embeddings, const float *centers, const int64_t *labels, int64_t n, int64_t k,
                  int64_t d);

/* Centers per block of head_forward's and head_backward's K x D passes at dimension d: 2^18 / d (1 MiB of
 * fp32 rows), at least 16. Each block's inverse norms + cosine SGEMM, and its dL/dW SGEMM + normalization
 * backward, run on one OpenMP thread with a one-thread OpenBLAS SGEMM (OpenBLAS's thread count is set to 1
 * for the duration and restored), so that a block is read from memory once per pass. The blocks do not depend
 * on the thread count, nor do the results. */
int64_t head_center_block(int64_t d);

/* Tests only: makes head_center_block return `rows` (> 0) for every d, or the default again (rows <= 0). Not
 * thread-safe against a running head_forward or head_backward. */
void head_set_center_block(int64_t rows);

/* Lanes of the fused dL/d embeddings SGEMM for n rows of d: the blocks of centers are split into
 * min(lanes, blocks) contiguous runs, each summed in block order into its own n x d partial, and the partials
 * are added in lane order, so the result depends on n, d and k, never on the thread count.
 * Returns min(HEAD_GE_LANES_MAX, HEAD_GE_PART_BYTES / (n d 4 bytes)); below 2 the SGEMM runs whole (one
 * OpenBLAS call over all K) instead. */
#define HEAD_GE_LANES_MAX  64
#define HEAD_GE_PART_BYTES ((int64_t)16 << 20)
int head_ge_lanes(int64_t n, int64_t d);

#endif
