/* A self-contained iresnet (arcface_torch's structure, as worker/model/model.h describes it) that
 * runs on any ops_device with every tensor in that device's memory: what the CUDA timing driver
 * (bench/gpu/bench_gpu.c) and the CUDA reference-network test (tests/cuda/test_cuda_backbone.c)
 * use until worker/model allocates through the device. Parameters in PyTorch's module order and
 * names (meta.json param_order of ../shared/reference/backbone), running statistics alongside.
 *
 * Layers: conv3x3(3->w0) BN PReLU; stages of IBasicBlock (BN, conv3x3, BN, PReLU, conv3x3 stride
 * s, BN, + conv1x1 stride s + BN shortcut on the first block of a stage (stride 2)); BN2d,
 * flatten, Linear(w3*49 -> D, bias), BatchNorm1d(D) with weight fixed (no gradient). No dropout
 * (p = 0 in arcface_torch). Input (B,3,112,112) plain NCHW. */
#ifndef PFCPS_BENCH_GPU_IRESNET_DEV_H
#define PFCPS_BENCH_GPU_IRESNET_DEV_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"

/* Memory of the device the layers run on (host malloc for the CPU device, cudaMalloc for CUDA). */
typedef struct devmem {
    int (*alloc)(void **p, size_t bytes);          /* 0 or -ENOMEM */
    void (*release)(void *p);
    int (*h2d)(void *dst, const void *src, size_t bytes);
    int (*d2h)(void *dst, const void *src, size_t bytes);
    int (*fill)(float *p, float v, size_t n);      /* p[i] = v */
    int (*sync)(void);                             /* wait for queued work (may be NULL) */
} devmem;

extern const devmem devmem_host; /* malloc/memcpy: for ops_cpu */

typedef struct inet_tensor {
    char name[64];
    size_t offset, count; /* floats into params/grads (or running) */
} inet_tensor;

typedef struct inet inet;

/* Builds iresnet with `layers` blocks per stage and stage widths `widths`, embedding size D, batch B.
 * All parameters, activations and gradients are allocated on the device up front.
 * Returns 0, -EINVAL (bad sizes), -ENOMEM, or a device error. */
int inet_create(inet **out, const ops_device *dev, const devmem *mem, const int layers[4],
                const int widths[4], int D, int B);
void inet_free(inet *n);

/* Parameter / running-statistics tables (PyTorch names: "layer1.0.conv1.weight",
 * "bn1.running_mean", ...). */
int inet_num_params(const inet *n);
const inet_tensor *inet_param(const inet *n, int i);
int inet_num_running(const inet *n);
const inet_tensor *inet_running(const inet *n, int i);
size_t inet_param_floats(const inet *n);
size_t inet_running_floats(const inet *n);
/* Device arrays (flat). */
float *inet_params(inet *n);
float *inet_grads(inet *n);
float *inet_running_buf(inet *n);

/* Training forward (batch statistics, running statistics updated) or eval forward of the device
 * input (B,3,112,112); *emb = device (B,D). Returns 0 or the device's error. */
int inet_forward(inet *n, const float *input, int train, const float **emb);
/* Backward of the last training forward: grad_emb (B,D) device; parameter gradients are
 * accumulated into inet_grads (zero them first: inet_zero_grad); grad_input (B,3,112,112) device
 * or NULL. */
int inet_backward(inet *n, const float *grad_emb, float *grad_input);
int inet_zero_grad(inet *n);

/* After a forward: number of PReLU inputs x with |x| <= rel * rms(that PReLU's input) (downloads
 * them). An fp32 activation that close to PReLU's kink may take the other branch than in float64
 * and move every upstream gradient by ~1e-3 (tests/model/test_model_reference.c); tests use this
 * to tell such cases apart. (size_t)-1 on a device error. */
size_t inet_near_kink(inet *n, double rel);

#endif
