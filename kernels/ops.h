/* Device layer interface: the backbone's layers as forward/backward pairs (llm.c style).
 *
 * A device (CPU: oneDNN + OpenBLAS + plain C; CUDA: cuDNN + cuBLAS + own kernels) fills one
 * `ops_device` table; worker/model calls layers only through it, so the same network description
 * runs on any device. All tensors are fp32 (but the body activations of a mixed-precision device:
 * act_bytes below), contiguous, in the device's memory (host memory for the CPU device); weights
 * OIHW, activations (B,C,H,W) in the device's activation layout
 * (act_block below; shapes are always written as logical NCHW).
 *
 * Conventions (all functions):
 * - Parameter gradients (dweight, dbias, dalpha) are ACCUMULATED (+=) into buffers the caller
 *   zeroes once per step.
 * - Input gradients (dinp) are overwritten, or accumulated (+=) when `acc` is non-zero (a tensor
 *   read by two layers, e.g. a residual block input, gets the second gradient added).
 * - dinp may be NULL when the input gradient is not needed (first layer): it is then skipped.
 * - Return 0, or a negative errno code with the reason in pf_errmsg() (-EINVAL bad shape,
 *   -ENOMEM, -EIO when the device library fails).
 * Math: PyTorch's torch.nn.Conv2d, BatchNorm2d/1d, PReLU, Linear, Dropout (same definitions,
 * eps inside the square root, running variance unbiased, momentum as PyTorch's).
 */
#ifndef PFCPS_KERNELS_OPS_H
#define PFCPS_KERNELS_OPS_H

#include <stddef.h>
#include <stdint.h>

/* Per-device state: library handles, primitive caches (created once per shape), scratch. */
typedef struct ops_ctx ops_ctx;

/* Convolution shape. Input (B,C,H,W), weight (OC, C/groups, K, K), output (B,OC,OH,OW) with
 * OH = (H + 2*pad - K)/stride + 1 (same for OW). No bias, no dilation. */
typedef struct ops_conv_shape {
    int B, C, H, W;
    int OC, K, stride, pad, groups;
    int OH, OW; /* derived: set by ops_conv_shape_init */
} ops_conv_shape;

/* Fills s (OH, OW included; kernels/conv_shape.c, shared by every device). Returns 0, or -EINVAL
 * when a size is not positive, groups does not divide C and OC, or the kernel does not fit the
 * padded input. */
int ops_conv_shape_init(ops_conv_shape *s, int B, int C, int H, int W, int OC, int K, int stride, int pad,
                        int groups);

typedef struct ops_device {
    const char *name;

    /* Creates / frees the device context. */
    int (*ctx_create)(ops_ctx **out);
    void (*ctx_destroy)(ops_ctx *ctx);

    /* inp (B,C,H,W), weight (OC,C/groups,K,K) -> out (B,OC,OH,OW). torch.nn.functional.conv2d. */
    int (*conv_forward)(ops_ctx *ctx, float *out, const float *inp, const float *weight,
                        const ops_conv_shape *s);
    /* dout (B,OC,OH,OW) -> dinp (B,C,H,W) (= or += per acc; skipped when NULL),
     * dweight (OC,C/groups,K,K) += (skipped when NULL). */
    int (*conv_backward)(ops_ctx *ctx, float *dinp, int acc, float *dweight, const float *dout,
                         const float *inp, const float *weight, const ops_conv_shape *s);

    /* Batch normalization over (B,C,HW) (BatchNorm2d with HW = H*W; BatchNorm1d with HW = 1).
     * train != 0: normalize with the batch mean and biased variance, write them to save_mean and
     * save_var (C each, float64: the backward needs them exact; it reads them), and update
     * running_mean/running_var in place: r = (1-momentum)*r + momentum*batch_stat, the variance unbiased
     * (times n/(n-1), n = B*HW). train == 0: normalize with running_mean/running_var (save_* unused, may be
     * NULL). out = (inp - mean) / sqrt(var + eps) * weight + bias. inp, out (B,C,HW); weight, bias (C). */
    int (*bn_forward)(ops_ctx *ctx, float *out, double *save_mean, double *save_var, const float *inp,
                      const float *weight, const float *bias, float *running_mean, float *running_var, int B,
                      int C, int HW, float eps, float momentum, int train);
    /* Training-mode backward: dout (B,C,HW) -> dinp (B,C,HW) (= or +=), dweight, dbias (C) +=
     * (each skipped when NULL: a fixed weight passes dweight NULL). */
    int (*bn_backward)(ops_ctx *ctx, float *dinp, int acc, float *dweight, float *dbias, const float *dout,
                       const float *inp, const float *weight, const double *save_mean, const double *save_var,
                       int B, int C, int HW, float eps);

    /* PReLU with one slope per channel: out = inp > 0 ? inp : alpha[c]*inp. inp, out (B,C,HW),
     * alpha (C). Backward: dinp (= or +=), dalpha (C) += sum over inp <= 0 of dout*inp. */
    int (*prelu_forward)(ops_ctx *ctx, float *out, const float *inp, const float *alpha, int B, int C,
                         int HW);
    int (*prelu_backward)(ops_ctx *ctx, float *dinp, int acc, float *dalpha, const float *dout,
                          const float *inp, const float *alpha, int B, int C, int HW);

    /* Linear: inp (B,IN), weight (OUT,IN), bias (OUT) or NULL -> out (B,OUT) = inp W^T + b.
     * Backward: dinp (B,IN) (= or +=), dweight (OUT,IN) +=, dbias (OUT) += (NULL skips). */
    int (*linear_forward)(ops_ctx *ctx, float *out, const float *inp, const float *weight, const float *bias,
                          int B, int IN, int OUT);
    int (*linear_backward)(ops_ctx *ctx, float *dinp, int acc, float *dweight, float *dbias,
                           const float *dout, const float *inp, const float *weight, int B, int IN, int OUT);

    /* out (n) = a + b (residual add; in place on a or b allowed). Backward is dinp = dout for
     * both inputs: ops_acc does it. */
    int (*add_forward)(ops_ctx *ctx, float *out, const float *a, const float *b, size_t n);
    /* dst (n) = src (acc == 0) or dst += src (acc != 0). */
    int (*acc)(ops_ctx *ctx, float *dst, int acc, const float *src, size_t n);

    /* Activation layout. Activations (B,C,H,W) live in the device's layout: channel blocks of
     * act_block(C) channels innermost, element (b,c,hw) at
     * ((b*(C/bs) + c/bs)*HW + hw)*bs + c%bs with bs = act_block(C) (bs = 1: plain NCHW; the
     * CPU device uses bs = 8, oneDNN's nChw8c, when 8 divides C). Conv, BN and PReLU take and
     * return activations in this layout; weights are always PyTorch's OIHW. With HW = 1 every
     * layout equals NCHW. to_plain: device layout -> NCHW; from_plain: NCHW -> device layout
     * (= or += per acc). Not in place. */
    int (*act_block)(int C);
    int (*to_plain)(ops_ctx *ctx, float *dst, const float *src, int B, int C, int HW);
    int (*from_plain)(ops_ctx *ctx, float *dst, int acc, const float *src, int B, int C, int HW);

    /* Inverted dropout (torch.nn.Dropout, training): mask[i] = keep ? 1/(1-p) : 0 drawn from
     * (seed, i); out = inp * mask. p == 0 is the identity (mask all 1). 0 <= p < 1.
     * Backward: dinp = dout * mask (= or +=). */
    int (*dropout_forward)(ops_ctx *ctx, float *out, float *mask, const float *inp, size_t n, float p,
                           uint64_t seed);
    int (*dropout_backward)(ops_ctx *ctx, float *dinp, int acc, const float *dout, const float *mask,
                            size_t n);

    /* ---- precision of the body ----
     * act_bytes: bytes per element of the activations before the flatten (the "body": conv, BN2d,
     * PReLU, add, and their gradients): 4 = fp32; 2 = fp16 / bf16 (mixed-precision devices). For
     * such a device the float * activation pointers of the body calls point at 2-byte elements;
     * to_plain converts body activations to plain fp32 NCHW and from_plain converts back.
     * Weights, weight gradients, BN parameters and running statistics are always fp32 (master
     * weights); a half device converts them itself.
     * plain: the fp32 device that runs every layer after the flatten (dropout, Linear,
     * BatchNorm1d: arcface_torch keeps fc and features in fp32), or NULL when this device does it
     * itself. The model creates a separate context for it with plain->ctx_create. The plain device
     * must share this device's memory space: the model allocates everything with this device's
     * mem_alloc and hands those buffers to the plain device's layers. */
    int act_bytes;
    const struct ops_device *plain;

    /* ---- device memory (worker/model and the training loop allocate through these) ----
     * Host devices use malloc/memcpy; CUDA uses cudaMalloc / cudaMemcpy. Sizes in bytes.
     * mem_alloc: *p = zero-filled allocation (bytes 0 allocates 1). Returns 0 or -ENOMEM.
     * mem_free: NULL allowed, never fails.
     * mem_h2d / mem_d2h: copies, complete when they return (the host buffer may be reused).
     * mem_d2d / mem_zero: ordered with the device's other work (on CUDA queued on the stream, not
     * blocking the host). mem_zero: p[0..bytes) = 0. Return 0 or -EIO.
     * sync: waits for all queued work; returns the first pending device error (-EIO). */
    int (*mem_alloc)(ops_ctx *ctx, void **p, size_t bytes);
    void (*mem_free)(ops_ctx *ctx, void *p);
    int (*mem_h2d)(ops_ctx *ctx, void *dst, const void *host_src, size_t bytes);
    int (*mem_d2h)(ops_ctx *ctx, void *host_dst, const void *src, size_t bytes);
    int (*mem_d2d)(ops_ctx *ctx, void *dst, const void *src, size_t bytes);
    int (*mem_zero)(ops_ctx *ctx, void *p, size_t bytes);
    int (*sync)(ops_ctx *ctx);

    /* ---- optimizer and gradient utilities on device memory (fp32 arrays of n elements) ----
     * sgd_step: torch.optim.SGD (kernels/cpu/optim_cpu.h optim_cpu_sgd, same float32 operation
     *   order); mom may be NULL when momentum == 0.
     * adamw_step: torch.optim.AdamW step number `step` >= 1 (optim_cpu_adamw); -EINVAL for
     *   step < 1.
     * scale: x[i] *= a.
     * sumsq: *host_out = sum of x[i]^2 accumulated in double (inf or NaN when any x[i] is not
     *   finite: the caller uses it both for clip_grad_norm and as the loss scaler's found-inf
     *   check). Synchronizes.
     * Return 0 or -EIO (device failure). */
    int (*sgd_step)(ops_ctx *ctx, float *w, const float *grad, float *mom, size_t n, float lr, float momentum,
                    float weight_decay);
    int (*adamw_step)(ops_ctx *ctx, float *w, const float *grad, float *m, float *v, size_t n, double lr,
                      double beta1, double beta2, double eps, double weight_decay, int64_t step);
    int (*scale)(ops_ctx *ctx, float *x, size_t n, float a);
    int (*sumsq)(ops_ctx *ctx, const float *x, size_t n, double *host_out);
} ops_device;

/* The device table called `name` among those built into this binary: "cpu", "cpu-fenced"
 * (debugging device, kernels/cpu/ops_fenced.c), "cpu-bf16" (debugging device: body activations
 * stored as bf16), "cuda", "cuda-fp16", "cuda-bf16" (when built with CUDA). Returns NULL and sets
 * pf_errmsg() naming the devices that exist when there is no such device. */
const ops_device *ops_device_by_name(const char *name);

/* The CPU device (kernels/cpu/ops_cpu.c): oneDNN 2.x for convolution (primitives created once per
 * shape and cached in the context), OpenBLAS sgemm for Linear, plain C for the rest (batch
 * normalization with float64 statistics and sums, PReLU, add, dropout). Threads: oneDNN's OpenMP
 * runtime (OMP_NUM_THREADS) and OpenBLAS's. */
extern const ops_device ops_cpu;

/* Debugging device "cpu-bf16" (kernels/cpu/ops_cpu_bf16.c): ops_cpu with the body activations stored
 * as bf16 (act_bytes 2, same layout as ops_cpu), each body op computed by ops_cpu in fp32 on
 * converted inputs and its outputs rounded once to bf16; plain = &ops_cpu. */
extern const ops_device ops_cpu_bf16;

#endif
