/* CUDA device ops (host-callable wrappers). Built only where nvcc is found (meson option `cuda`).
 * Every wrapper checks the CUDA / cuBLAS / cuDNN return codes and the launch, and returns 0 or a
 * negative code with the library's error string in pf_errmsg() (-EIO library failure, -EINVAL bad
 * shape or argument, -ENOMEM device allocation failed, -ERANGE a label / index out of range).
 * Pointers are device pointers unless named host_. All work is queued on CUDA's legacy default
 * stream, in order; the wrappers do not synchronize unless they say so (a failing kernel then
 * surfaces at the next synchronizing call: cuda_sync()).
 *
 * Pieces:
 *  - memory helpers (tests, drivers): cuda_malloc / cuda_free / cuda_h2d / cuda_d2h / cuda_fill_f32
 *  - ops_cuda: the kernels/ops.h device table (cuDNN convolution and batch norm, cuBLAS Linear,
 *    own kernels for PReLU, add, dropout), activations plain NCHW (act_block = 1)
 *  - the margin-softmax head (mirror of worker/head/head.h, single process), row gather/scatter,
 *    SGD / AdamW (mirror of kernels/cpu/optim_cpu.h), fp16 / bf16 conversion. */
#ifndef PFCPS_KERNELS_CUDA_CUDA_OPS_H
#define PFCPS_KERNELS_CUDA_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/ops.h"

/* Number of CUDA devices visible (0 when there is no GPU or no driver; never an error). */
int cuda_device_count(void);

/* ---- memory helpers ---- */

/* *p = cudaMalloc(bytes) (bytes 0 allocates 1). Returns 0 or -ENOMEM with CUDA's message. */
int cuda_malloc(void **p, size_t bytes);
/* cudaFree (NULL allowed; errors ignored: used on cleanup paths). */
void cuda_free(void *p);
/* Synchronous copies host -> device and device -> host. Return 0 or -EIO. */
int cuda_h2d(void *dst, const void *host_src, size_t bytes);
int cuda_d2h(void *host_dst, const void *src, size_t bytes);
/* p[i] = v for i < n (used to poison outputs with NaN before a test). Returns 0 or -EIO. */
int cuda_fill_f32(float *p, float v, size_t n);
/* cudaDeviceSynchronize; returns 0 or -EIO with the first pending error of a kernel. */
int cuda_sync(void);
/* Free and total memory of the current device in bytes (cudaMemGetInfo). Returns 0 or -EIO. */
int cuda_mem_info(size_t *free_bytes, size_t *total_bytes);

/* ---- device memory and gradient utilities (the kernels/ops.h memory / utility entries of ops_cuda;
 * exported so that other CUDA devices reuse them; kernels/cuda/cuda_util.cu) ---- */

/* *p = cudaMalloc(bytes) then cudaMemset 0 (bytes 0 allocates 1). Returns 0, -ENOMEM, -EIO. */
int cuda_malloc_zero(void **p, size_t bytes);
/* cudaMemcpy device -> device (queued on the default stream). Returns 0 or -EIO. */
int cuda_d2d(void *dst, const void *src, size_t bytes);
/* cudaMemset(p, 0, bytes) (queued on the default stream). Returns 0 or -EIO. */
int cuda_memzero(void *p, size_t bytes);
/* x[i] *= a for i < n (rounded multiply, no contraction: bit-identical to the CPU). 0 or -EIO. */
int cuda_scale_f32(float *x, size_t n, float a);
/* The kernels/ops.h memory / optimizer entries every CUDA device table uses (context-free wrappers of
 * cuda_malloc_zero, cuda_free, cuda_h2d, cuda_d2h, cuda_d2d, cuda_memzero, cuda_sync, cuda_sgd_step,
 * cuda_adamw_step, cuda_scale_f32; kernels/cuda/cuda_util.cu). sumsq stays per device: it needs the
 * context's scratch. Same returns as the functions they wrap. */
int cuda_ops_mem_alloc(ops_ctx *c, void **p, size_t bytes);
void cuda_ops_mem_free(ops_ctx *c, void *p);
int cuda_ops_mem_h2d(ops_ctx *c, void *dst, const void *host_src, size_t bytes);
int cuda_ops_mem_d2h(ops_ctx *c, void *host_dst, const void *src, size_t bytes);
int cuda_ops_mem_d2d(ops_ctx *c, void *dst, const void *src, size_t bytes);
int cuda_ops_mem_zero(ops_ctx *c, void *p, size_t bytes);
int cuda_ops_sync(ops_ctx *c);
int cuda_ops_sgd_step(ops_ctx *c, float *w, const float *grad, float *mom, size_t n, float lr, float momentum,
                      float weight_decay);
int cuda_ops_adamw_step(ops_ctx *c, float *w, const float *grad, float *m, float *v, size_t n, double lr,
                        double beta1, double beta2, double eps, double weight_decay, int64_t step);
int cuda_ops_scale(ops_ctx *c, float *x, size_t n, float a);

/* Doubles of device scratch that cuda_sumsq_f32 needs (one partial sum per block). */
#define CUDA_SUMSQ_PARTIALS 1024
/* *host_out = sum of x[i]^2 accumulated in double (inf / NaN when an element is not finite):
 * per-block tree sums into dev_partials (CUDA_SUMSQ_PARTIALS doubles of device memory the caller
 * owns), added on the host in block order (deterministic; the order differs from the CPU's
 * sequential sum, so the two agree to double rounding, not bit for bit). Synchronizes.
 * Returns 0 or -EIO. */
int cuda_sumsq_f32(const float *x, size_t n, double *dev_partials, double *host_out);

/* ---- pinned host buffers, side stream (class-center rows pulled from the parameter servers) ----
 * Rows are pulled into pinned host memory (register it with the fabric), copied to the GPU on a
 * side stream while the backbone forward runs on the default stream, and the default stream is
 * made to wait for the copy before the head reads the rows:
 *   cuda_h2d_async(dev_rows, pinned, bytes, side); ... forward ...; cuda_default_stream_wait(side);
 * cudaHostAlloc / cudaStreamCreateWithFlags(NonBlocking) / cudaMemcpyAsync / event + StreamWaitEvent.
 * Return 0, -ENOMEM (pinned allocation), or -EIO. A pinned buffer must stay alive until its copy is done. */
int cuda_host_pinned_alloc(void **p, size_t bytes);
void cuda_host_pinned_free(void *p);
int cuda_side_stream_create(void **stream);
void cuda_side_stream_destroy(void *stream);
int cuda_h2d_async(void *dst, const void *host_src, size_t bytes, void *stream);
/* Work queued on the default stream from now on starts after everything queued on `stream` so far. */
int cuda_default_stream_wait(void *stream);

/* ---- the device table ---- */

/* The CUDA device (kernels/cuda/ops_cuda.cu), name "cuda". All tensors in device memory.
 * Convolution: cuDNN legacy API, algorithms found once per shape (cudnnFind*, first result that
 *   succeeded in plain fp32 FMA math, i.e. no TF32, unless the environment sets PFCPS_CUDA_TF32=1),
 *   cached in the context with the descriptors; one workspace grown to the largest need when a
 *   new shape is first seen.
 * Batch norm: BatchNorm2d (HW > 1) through cuDNN spatial mode, statistics summed by cuDNN in fp32
 *   (the CPU device sums in float64), or with PFCPS_CUDA_BN=exact (read at ctx_create) in own
 *   kernels with the CPU device's float64 math (two-pass statistics; slower; for verification and
 *   runs that must follow the CPU device); BatchNorm1d (HW == 1) always in own kernels with float64
 *   sums (with few samples per channel the backward cancels: fp32 loses most digits).
 *   save_mean / save_var are device buffers of C doubles as on the CPU device and hold the same
 *   values (batch mean, biased batch variance), for cuDNN converted from its fp32 mean and inverse
 *   standard deviation; bn_backward converts them back.
 * Linear: cublasSgemm (fp32, default math: no TF32). PReLU, add, acc, dropout: own kernels; the
 *   dropout mask is the CPU device's (same splitmix64 draw of (seed, i)), so both devices agree
 *   bit for bit. act_block is 1 (plain NCHW): to_plain / from_plain are copies (or adds).
 * ctx_create fails with -ENODEV when no CUDA device is present. */
extern const ops_device ops_cuda;

/* The mixed-precision CUDA devices (kernels/cuda/ops_cuda_half.cu), names "cuda-fp16" (__half) and
 * "cuda-bf16" (__nv_bfloat16): torch.autocast's body. act_bytes 2: the body activations (conv,
 * BatchNorm2d, PReLU, add, acc inputs/outputs and their gradients) are 2-byte elements behind the
 * float * pointers, plain NCHW (act_block 1); plain = &ops_cuda runs everything after the flatten
 * (linear and dropout here return -EINVAL). Weights, weight gradients, BN parameters and running
 * statistics are fp32; save_mean / save_var float64 as on every device.
 * Convolution: cuDNN legacy API with half tensors and filters and FLOAT compute type, tensor-op math
 *   allowed (what autocast does), fastest successful algorithm found once per shape; the fp32 weight
 *   is converted to a half scratch copy at each call (simple and correct; one extra pass over the
 *   weights), and the weight gradient is computed by cuDNN into a half scratch and then added into
 *   the fp32 dweight (+=) by a kernel.
 * Batch norm: cuda-fp16 through cuDNN spatial mode (half x/y/dx, fp32 scale, bias, statistics: cuDNN's
 *   mixed-precision mode, fp32 sums), or with PFCPS_CUDA_BN=exact in own kernels; cuda-bf16 always in
 *   own kernels: the CPU device's float64 two-pass math reading and writing half elements.
 * PReLU, add, acc, to_plain / from_plain: own kernels, math in fp32 (BN own kernels in float64), one
 *   rounding to half per output (+= done before the rounding). PReLU's dalpha is summed in fp32.
 * Memory, optimizer and utility entries: the fp32 CUDA device's helpers (cuda_malloc_zero, cuda_d2d,
 *   cuda_sgd_step, cuda_sumsq_f32, ...). ctx_create fails with -ENODEV without a GPU. */
extern const ops_device ops_cuda_fp16;
extern const ops_device ops_cuda_bf16;

/* ---- margin-softmax head (kernels/cuda/head.cu) ----
 * Same math as worker/head/head.h (ArcFace combined margin, arcface_torch), for one process:
 * en = F.normalize(embeddings), wn = F.normalize(centers), cos = en wn^T (cublasSgemm),
 * target z = s (cos(m1 acos(clamp(c, -1+1e-7, 1-1e-7)) + m2) - m3) (computed in double), other
 * columns z = s clamp(c, -1, 1) (0 with no gradient when tau > 0 and c > tau), one block per row
 * computes the row max and sum of exp(z - max) in a single online pass over the cosines, then
 * writes dL/dcos in place; two GEMMs and the normalization backward give the gradients. */
typedef struct cuda_head_params {
    double s;             /* logit scale (64) */
    double m1, m2, m3;    /* combined margin */
    double tau;           /* interclass filtering threshold, 0 = off */
    int straight_through; /* margin derivative: 0 exact, 1 straight_through (dv/dc = 1) */
    int clamp_loss;       /* 1: a row's loss is at most -log(1e-30) = 69.0776 */
} cuda_head_params;

/* Device workspace for at most n_max rows, k_max columns, d features (float cos (n_max,k_max),
 * en (n_max,d), wn (k_max,d), inverse norms, per-row losses) plus a cuBLAS handle. */
typedef struct cuda_head_ws {
    int n_max, k_max, d;
    float *cos, *en, *wn;
    double *inv_e, *inv_w; /* 1 / max(|row|, 1e-12) */
    double *row_loss;      /* (n_max) device */
    double *host_row_loss; /* (n_max) host copy */
    void *cublas;          /* cublasHandle_t */
    /* cuda_head_dist (the buffers its collectives see; managed memory when coll_host): */
    float *row_max;       /* (n_max) */
    double *row_red;      /* (4 n_max): per row sum of exp(z - max), z_target - max, has-target, bad label */
    double *scal;         /* (4) local mode: mean loss, no-target rows, bad labels */
    double *host_row_red; /* (4 n_max) host copy */
    int coll_host;        /* 1: row_max, row_red, scal are cudaMallocManaged (host collectives) */
} cuda_head_ws;

/* Returns 0, -EINVAL (n_max <= 0, k_max < 0, d <= 0), -ENOMEM, -EIO (cuBLAS), -ENODEV (no GPU). */
int cuda_head_ws_init(cuda_head_ws *ws, int n_max, int k_max, int d);
/* The same, with coll_host_memory = 1 allocating the buffers cuda_head_dist hands to its pf_coll
 * (row_max, row_red, scal) with cudaMallocManaged, so that a host-memory backend (coll_thread,
 * coll_fabric) can read them; cuda_head_ws_init is coll_host_memory = 0 (device memory, NCCL). */
int cuda_head_ws_init_coll(cuda_head_ws *ws, int n_max, int k_max, int d, int coll_host_memory);
void cuda_head_ws_free(cuda_head_ws *ws);

/* One head step. embeddings (n,d), centers (k,d) (k may be 0), labels (n) int64 device: column of
 * the target or -1 (no target here: row loss 69.0776 as on the CPU head). grad_scale multiplies
 * dL/dz (0 means 1/n, the mean loss; 1/(n W) gives the CPU head's local mode). Outputs, each may be
 * NULL: host_loss (mean over rows of the row losses, host double), logits (n,k),
 * grad_embeddings (n,d), grad_centers (k,d) (overwritten). Synchronizes once (the row losses are
 * copied back). Errors: -EINVAL (shapes outside the workspace, s <= 0, margins not finite),
 * -ERANGE (a label outside [-1, k); names the row; no gradient written), -EIO. */
int cuda_head_forward_backward(const cuda_head_params *p, cuda_head_ws *ws, const float *embeddings, int n,
                               const float *centers, int k, const int64_t *labels, double grad_scale,
                               double *host_loss, float *logits, float *grad_embeddings, float *grad_centers);

/* The head of a worker in a group (worker/head/head.h head_forward + head_backward, exactly their math and
 * modes), three row kernels instead of one fused pass:
 *   1. z per column (logits written here when asked), row max -> ws->row_max (n floats);
 *      global mode: allreduce MAX over the workers;
 *   2. per row {sum over this worker's columns of exp(z - max) (double), z_target - max, has-target,
 *      label-outside-[-1,k)} -> ws->row_red (4n doubles); global mode: allreduce SUM (one call);
 *   3. the row sums come to the host: loss = mean over rows of -(z_t - max - log sum) (69.0776 for a
 *      row with no target on any worker; clamp_loss floors as head.c); local mode with a group:
 *      allreduce SUM of {mean, no-target rows, bad labels} and mean / W;
 *   4. dL/dcos = s (p - onehot) g dv/dc with the global max and sum (g = 1/n global, 1/(n W) local),
 *      then the GEMMs and normalization backward of cuda_head_forward_backward.
 * local_mode 0: global (rows = the allgathered batch, columns = this worker's sample; collectives
 * only when coll != NULL and coll->world_size > 1); 1: local (own rows, own softmax).
 * coll: NULL = one process; its buffers are device memory (NCCL), or managed when the workspace
 * was made with coll_host_memory (the device is then synchronized before each collective).
 * Collective calls per step: 2 (global, W > 1), 1 (local, W > 1), 0 otherwise.
 * labels (n) int64 device: column of the target or -1. Outputs as cuda_head_forward_backward
 * (host_loss: global mean, same on every rank); host_no_target (may be NULL): rows whose target is
 * on no worker (global: counted over the group; local with a group: summed over the ranks).
 * Errors: -EINVAL (NULL, shapes outside the workspace, s <= 0, margins or tau not finite) before any
 * collective; -ERANGE when a label on ANY rank is outside [-1, k) (every rank returns it after the
 * collectives, no gradient written, the message names a row); a collective's error; -EIO. */
struct pf_coll;
int cuda_head_dist(const cuda_head_params *p, int local_mode, cuda_head_ws *ws, struct pf_coll *coll,
                   const float *embeddings, int n, const float *centers, int k, const int64_t *labels,
                   double *host_loss, int64_t *host_no_target, float *logits, float *grad_embeddings,
                   float *grad_centers);

/* *p = cudaMallocManaged(bytes, global attach) (bytes 0 allocates 1): memory both the host and the
 * device may address (free with cuda_free). Returns 0 or -ENOMEM with CUDA's message. */
int cuda_malloc_managed(void **p, size_t bytes);
/* 1 when the current device lets the host touch managed memory while kernels run (device attribute
 * concurrentManagedAccess: ranks sharing one GPU as threads need it), 0 otherwise or without a GPU. */
int cuda_managed_concurrent(void);

/* out[i,:] = x[i,:] / max(||x[i,:]||_2, eps) for rows i < n, x and out (n, d) fp32 on the device,
 * in place allowed. Matches torch.nn.functional.normalize(x, dim=1, eps=eps).
 * Returns 0, or -EIO with the CUDA error in pf_errmsg(). */
int cuda_l2_normalize_rows(float *out, const float *x, int n, int d, float eps);

/* Host-buffer convenience for tests: copies (n, d) host rows to the device, normalizes, copies back. */
int cuda_l2_normalize_rows_host(float *host_out, const float *host_x, int n, int d, float eps);

/* out[i,:] = table[idx[i],:] for i < k (rows of d floats); idx (k) int64 device, each in
 * [0, rows). Out-of-range indices are not read: the row is filled with NaN and the call returns
 * -ERANGE naming the first one (it synchronizes to check). */
int cuda_gather_rows(float *out, const float *table, int64_t rows, const int64_t *idx, int64_t k, int d);
/* table[idx[i],:] = src[i,:] (add != 0: += with atomicAdd, duplicates summed). Indices must be in
 * [0, rows); out-of-range ones are skipped and reported as -ERANGE (synchronizes to check). */
int cuda_scatter_rows(float *table, int64_t rows, const float *src, const int64_t *idx, int64_t k, int d,
                      int add);

/* torch.optim.SGD step, same float32 operation order as optim_cpu_sgd (kernels/cpu/optim_cpu.h),
 * without FMA contraction (bit-identical to the CPU). mom may be NULL when momentum == 0. */
int cuda_sgd_step(float *w, const float *grad, float *mom, size_t n, float lr, float momentum,
                  float weight_decay);
/* torch.optim.AdamW step `step` (>= 1), the operation order of optim_cpu_adamw (lr, betas, eps,
 * weight_decay as there). Returns 0, -EINVAL (step < 1), -EIO. */
int cuda_adamw_step(float *w, const float *grad, float *m, float *v, size_t n, double lr, double beta1,
                    double beta2, double eps, double weight_decay, int64_t step);

/* fp32 <-> fp16 (IEEE binary16) and bf16, round to nearest even, stored as uint16_t. */
int cuda_f32_to_f16(uint16_t *out, const float *in, size_t n);
int cuda_f16_to_f32(float *out, const uint16_t *in, size_t n);
/* out[i] = fp16(fp16(in[i]) / w) for n elements (device memory): the cast and div_ of torch's
 * fp16_compress_hook (common/coll.h coll_allreduce_fp16_mean), before an fp16 sum over the workers. */
int cuda_f16_compress(uint16_t *out, const float *in, size_t n, float w);
int cuda_f32_to_bf16(uint16_t *out, const float *in, size_t n);
int cuda_bf16_to_f32(float *out, const uint16_t *in, size_t n);

/* ---- mixed precision: the unscale-and-check kernel (the scaler's host rule: worker/loss_scale.h) ---- */
/* Device: grads[i] *= inv_scale for i < n, and *host_found_inf = 1 when any grads[i] was inf or NaN
 * before (else 0) (torch's _amp_foreach_non_finite_check_and_unscale_). Synchronizes. 0 or -EIO. */
int cuda_unscale_check(float *grads, size_t n, float inv_scale, int *host_found_inf);

/* ---- NCCL collectives (kernels/cuda/coll_nccl.c; built when libnccl is found: PFCPS_HAVE_NCCL) ----
 * A common/coll.h backend for workers on the CUDA device: the same pf_coll calls (allreduce sum/max,
 * allgather, reduce_scatter, broadcast, barrier), but every buffer is DEVICE memory; each call returns
 * after the NCCL operation completed (default stream synchronized). The 128-byte unique id is made
 * by rank 0 (coll_nccl_unique_id) and handed to every rank through the rendezvous; each rank then
 * calls coll_nccl_create with its current CUDA device set (cudaSetDevice). coll_destroy releases. */
#define CUDA_NCCL_ID_BYTES 128
struct pf_coll;
/* Returns 0 or -EIO (NCCL's error string). */
int coll_nccl_unique_id(uint8_t id[CUDA_NCCL_ID_BYTES]);
/* Returns 0, -EINVAL (rank/world), -ENODEV (no GPU), -ENOMEM, -EIO (NCCL init failed). Blocks
 * until all world_size ranks joined (ncclCommInitRank). */
int coll_nccl_create(const uint8_t id[CUDA_NCCL_ID_BYTES], int rank, int world_size, struct pf_coll *out);
/* Selects the CUDA device of this thread (cudaSetDevice). Returns 0 or -EIO. */
int cuda_set_device(int device);

#ifdef __cplusplus
}
#endif
#endif
