/* The worker's backbone: one network description (iresnet 18/34/50/100/200, mobilefacenet, or
 * custom widths) from which the layer list, the flat parameter/gradient layout (PyTorch names, in
 * PyTorch's module order) and the checkpoint layout are derived. Layers run through a device table
 * (kernels/ops.h); model_create uses the CPU device.
 *
 * Networks follow insightface's arcface_torch (backbones/iresnet.py, mobilefacenet.py):
 * - iresnet: conv3x3(3->w0) BN PReLU; 4 stages of IBasicBlock (BN, conv3x3, BN, PReLU, conv3x3
 *   stride s, BN; shortcut conv1x1 stride s + BN where stride or width changes, identity
 *   otherwise; no activation after the add), first block of each stage stride 2; head BN2d,
 *   flatten (w3*7*7), dropout (p=0 default), Linear(w3*49 -> D, bias), BatchNorm1d(D) with weight
 *   fixed at 1 ("features.weight", flagged MODEL_TENSOR_FIXED).
 * - mbf: MobileFaceNet(blocks=(1,4,6,2), scale=2): ConvBlock / DepthWise / Residual, conv_sep,
 *   GDC head (7x7 depthwise LinearBlock, Linear(512 -> D, no bias), BatchNorm1d(D)).
 *
 * Memory: everything lives in the DEVICE's memory (dev->mem_alloc; host memory for "cpu", GPU
 * memory for "cuda", fenced pages for "cpu-fenced"): params and grads are one allocation each
 * (model_params / model_grads, num_params fp32, tensors at model_tensor.offset, PyTorch layouts:
 * conv OIHW, linear (out,in)); BN running statistics are a third flat array (model_buffers); BN
 * batch statistics (float64), dropout masks, every activation of the forward (kept for the
 * backward, B_cap samples, allocated at the first forward) and a small pool of activation
 * gradients reused by liveness. Host code reads and writes them only through the device
 * (model_get_params / model_set_params ..., or dev->mem_* on model_ctx).
 * Precision: activations before the flatten (the "body") are dev->act_bytes per element in the
 * device's layout (fp16/bf16 on mixed-precision devices); the flatten converts to fp32 plain NCHW
 * and the layers after it (dropout, Linear, BatchNorm1d) run on dev->plain when the device has one
 * (with its own context), else on dev. Weights, gradients and running statistics are fp32.
 *
 * Numerics: float32 throughout; batch-norm statistics and sums in float64 (see
 * kernels/cpu/ops_cpu.c). Tested against PyTorch float64 (tests/worker/model/test_model_reference.c). */
#ifndef PFCPS_WORKER_MODEL_MODEL_H
#define PFCPS_WORKER_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/ckpt_ident.h"
#include "kernels/ops.h"

typedef enum model_kind { MODEL_IRESNET = 1, MODEL_MBF = 2 } model_kind;

/* The network description. */
typedef struct model_desc {
    model_kind kind;
    char name[32];      /* "r50", "mbf", or a custom name (written into checkpoints) */
    int layers[4];      /* blocks per stage (mbf: the blocks tuple) */
    int widths[4];      /* iresnet stage widths (stem width = widths[0]); unused for mbf */
    int mbf_scale;      /* mbf width multiplier (arcface_torch: 2) */
    int embedding_size; /* D */
    float dropout;      /* iresnet head dropout p, 0 <= p < 1 (arcface_torch default 0) */
} model_desc;

/* (zoo.c) Fills d for a network name as arcface_torch's config spells it: r18 r34 r50 r100 r200 (also
 * iresnet18 ...) and mbf; an iresnet name may carry a width suffix "_wN" (r18_w16: stage widths
 * N, 2N, 4N, 8N; N even, 2..512) for narrow CPU runs. Returns 0, or -EINVAL for an unknown name,
 * a bad suffix or embedding_size <= 0. */
int model_desc_from_name(model_desc *d, const char *network, int embedding_size);

#define MODEL_TENSOR_FIXED 1u /* not trained: the optimizer and weight decay must skip it */

/* One named tensor of the flat parameter (or buffer) array. */
typedef struct model_tensor {
    char name[96]; /* PyTorch state_dict name, e.g. "layer1.0.conv1.weight" */
    int ndim;
    int shape[5];
    size_t offset;  /* in floats, into model_params/model_grads (or model_buffers) */
    size_t count;   /* floats */
    unsigned flags; /* MODEL_TENSOR_FIXED */
} model_tensor;

typedef struct model model;

/* Creates the network `network` (model_desc_from_name) with embedding size D on the CPU device,
 * able to run batches of up to batch_capacity samples of (3,112,112). Parameters are zero until
 * model_init or model_load. Returns 0, -EINVAL (bad name/size), -ENOMEM, -EIO (oneDNN). */
int model_create(model **out, const char *network, int embedding_size, int batch_capacity);

/* Same from a description, on a given device (NULL: CPU; see ops_device_by_name). Running
 * statistics are set to mean 0 / var 1. Returns 0, -EINVAL (bad description, or a device table
 * lacking entries worker/model needs), -ENOMEM, or the device's error (-ENODEV: no GPU). */
int model_create_desc(model **out, const model_desc *d, int batch_capacity, const ops_device *dev);

void model_free(model *m);

/* arcface_torch's initialization from a seed (deterministic). iresnet: conv ~ N(0, 0.1), BN
 * weight 1 bias 0, PReLU 0.25, fc as torch.nn.Linear's default (U(+-1/sqrt(fan_in)) for weight
 * and bias), features weight 1 bias 0. mbf: conv and Linear kaiming_normal(fan_out, relu), BN 1/0,
 * PReLU 0.25. Running mean 0, running var 1. Grads zeroed. Values are drawn on the host and
 * uploaded (identical on every device). A device failure is reported by the next model_forward
 * or model_backward. */
void model_init(model *m, uint64_t seed);

/* input: HOST memory, (B,3,112,112) NCHW fp32, 1 <= B <= batch_capacity (uploaded with mem_h2d,
 * converted to the body's layout and precision with from_plain). train != 0: BN uses batch
 * statistics and updates running statistics (momentum 0.1), dropout active; train == 0: eval.
 * On success *embeddings is a DEVICE pointer to the model's (B,D) fp32 output (valid until the
 * next forward; read it with dev->mem_d2h). Work may still be queued on the device when this
 * returns (dev->sync waits). Returns 0, -EINVAL (bad B), or a device error. */
int model_forward(model *m, const float *input, int B, int train, const float **embeddings);

/* Backward of the last training-mode forward: grad_embeddings, a DEVICE (B,D) fp32 array, =
 * dLoss/dembeddings. Parameter gradients are accumulated (+=) into model_grads; grad_input, when
 * not NULL, is a DEVICE fp32 plain NCHW (B,3,112,112) buffer that receives dLoss/dinput.
 * Returns 0, -EINVAL (no training forward before), device errors. */
int model_backward(model *m, const float *grad_embeddings, float *grad_input);

/* Zeroes all parameter gradients (once per step; dev->mem_zero). A device failure is reported
 * by the next model_forward or model_backward. */
void model_zero_grad(model *m);

/* The device the model was created on (the body device) and its context (for dev->mem_*,
 * dev->sgd_step ... on the model's arrays). */
const ops_device *model_device(const model *m);
ops_ctx *model_ctx(model *m);

const model_desc *model_get_desc(const model *m);
size_t model_num_params(const model *m); /* floats in model_params (fixed tensors included) */
/* DEVICE pointers (host pointers on the CPU device) to the flat fp32 parameter and gradient
 * arrays (num_params each). */
float *model_params(model *m);
float *model_grads(model *m);
/* Host copies of the whole flat arrays: host holds num_params (buffers: num_buffer_floats) floats.
 * Synchronous. Return 0 or the device's error. */
int model_get_params(const model *m, float *host);
int model_set_params(model *m, const float *host);
int model_get_grads(const model *m, float *host);
int model_get_buffers(const model *m, float *host);
int model_set_buffers(model *m, const float *host);
int model_num_tensors(const model *m);
const model_tensor *model_tensor_at(const model *m, int i);
/* DEVICE pointer to the parameter / gradient of a named tensor (NULL when absent); *count gets
 * its size if count. */
float *model_param(model *m, const char *name, size_t *count);
float *model_grad(model *m, const char *name, size_t *count);

/* BN running statistics: "<bn>.running_mean" / "<bn>.running_var" (DEVICE pointers). */
size_t model_num_buffer_floats(const model *m);
float *model_buffers(model *m);
int model_num_buffer_tensors(const model *m);
const model_tensor *model_buffer_tensor_at(const model *m, int i);
float *model_buffer(model *m, const char *name, size_t *count);

/* The backbone file (a backbone checkpoint: model.ckpt, a worker's .model member file; names: common/ckpt.h):
 * parameters + running statistics, written to path.tmp, fsync'd, renamed. The
 * arrays are read from the device through a host copy.
 * Layout (little-endian):
 *   magic "PFCPSBB1" (8) | u32 version=2 | u32 embedding_size | u32 n_tensors | u32 n_extras
 *   | char network[32] (NUL-padded) | u64 payload_bytes | u64 checksum
 *   | n_tensors x { u16 name_len, name, u8 dtype (0 = f32), u8 ndim, u32 shape[ndim],
 *                   u64 payload_offset (bytes) }
 *   | n_extras x { char name[32] (NUL-padded), f64 value }
 *   | payload (parameters in model order, then running statistics).
 * Version 1 (still loaded) is the same without the extras table (n_extras field reserved, 0).
 * checksum = FNV-1a 64 over everything after the checksum field (tensor table, extras, payload).
 * Returns 0, -EIO (write failed, errno text in pf_errmsg), or the device's error. */
int model_save(const model *m, const char *path);

/* Loads a backbone file written by model_save / model_save_ex (version 1 or 2) into m; extras in the
 * file are verified and ignored. The whole file is read and verified (magic, version, network
 * name, D, every tensor name/shape/dtype against m's layout, sizes, checksum, extras table) before
 * anything in m changes: a corrupt or mismatched file is refused with -EINVAL (layout mismatch),
 * -EPROTO (bad magic, truncated, checksum, corrupt extras) or -EIO/-ENOENT, m untouched. */
int model_load(model *m, const char *path);

/* The dropout mask generator's counter (advanced by every forward through a dropout layer), for checkpoints:
 * a model given back the counter draws the same masks as the one it was read from. */
uint64_t model_rng_state(const model *m);
void model_set_rng_state(model *m, uint64_t state);

/* A named float64 scalar saved with the backbone (e.g. the mixed-precision loss scaler's "scale" and
 * "growth_tracker"). name: 1..31 characters, NUL-terminated. */
#define MODEL_EXTRAS_MAX 64
typedef struct model_extra {
    char name[32];
    double value;
} model_extra;

/* model_save with n extras x[0..n) (n = 0: none; x may then be NULL). -EINVAL when n is outside
 * [0, MODEL_EXTRAS_MAX] or a name is empty, unterminated or repeated (nothing written). */
int model_save_ex(const model *m, const char *path, const model_extra *x, int n);

/* model_load that also returns the extras: x (room for cap entries, may be NULL with cap 0:
 * extras verified and dropped) receives them in file order and *n (when n is not NULL) their
 * number (0 for a version 1 file). -EINVAL (m untouched) when the file has more than cap extras
 * and x is given; other errors as model_load. */
int model_load_ex(model *m, const char *path, model_extra *x, int cap, int *n);

/* model_load_ex of the bytes whose SHA-256 is want_sha256 (32 bytes; NULL: no check): the file is read once,
 * its digest computed over those bytes, and only bytes that match are loaded, so a file replaced between a
 * caller's check and the load cannot be loaded. -EINVAL naming the file when the digest differs (m untouched);
 * other errors as model_load_ex. */
int model_load_digest(model *m, const char *path, const uint8_t want_sha256[32], model_extra *x, int cap,
                      int *n);

/* The extras of the backbone file at path, read without a model (e.g. the run identity a checkpoint's
 * .model carries, common/ckpt.h): the fixed header (magic, version 1 or 2, counts), the tensor table walked
 * as written (each name length, dtype 0, ndim 1..5, offset equal to the sum of the sizes before it, every
 * product and sum overflow-checked), the file size and the checksum are verified, then the extras go to x
 * (room for cap entries) and their number to *n; file_sha256 (may be NULL) gets the SHA-256 of the whole
 * file, tensors_sha256 (may be NULL) that of its tensors (the payload: parameters, then running statistics,
 * without the header, table and extras). Returns 0, or with "checkpoint <path>: <problem>" naming
 * the field: -EPROTO (bad magic, version, truncated, a table entry or size out of bounds, checksum, corrupt
 * extras), -EINVAL (more than cap extras), or pf_read_file's errors (-ENOENT, -EACCES, -EIO "a FIFO, not a
 * regular file", ...). */
int model_file_extras(const char *path, model_extra *x, int cap, int *n, uint8_t file_sha256[32],
                      uint8_t tensors_sha256[32]);

/* The run identity a checkpoint's backbone file carries as extras (common/ckpt.h ckpt_ident_extras), read
 * with model_file_extras (the digests as there). Returns 0, model_file_extras' errors, or -ENOENT
 * "checkpoint <path>: no run identity (extra '<name>' missing)". */
int model_file_ident(const char *path, ckpt_ident *id, uint8_t file_sha256[32], uint8_t tensors_sha256[32]);

#endif
