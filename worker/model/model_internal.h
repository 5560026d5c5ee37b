/* Private layout of struct model, shared by model.c, zoo.c and checkpoint.c only (and read by tests). */
#ifndef PFCPS_WORKER_MODEL_MODEL_INTERNAL_H
#define PFCPS_WORKER_MODEL_MODEL_INTERNAL_H

#include "worker/model/model.h"

enum { INIT_CONST = 1, INIT_NORMAL, INIT_UNIFORM, INIT_KAIMING_FAN_OUT };
typedef struct mtinit {
    int kind;
    float v; /* constant, std, or uniform bound */
} mtinit;

enum { LK_CONV = 1, LK_BN, LK_PRELU, LK_ADD, LK_LINEAR, LK_DROPOUT, LK_FLATTEN };

/* An activation tensor: (C,H,W) per sample, B_cap samples. */
typedef struct mact {
    int C, H, W;
    size_t per_sample;
    int plain;    /* 1: after the flatten (fp32 plain, plain device); 0: body (act_bytes) */
    size_t elem;  /* bytes per element: 4 for plain, dev->act_bytes for the body */
    float *data;  /* device memory */
    int grad_buf; /* index into the gradient pool, -1 none */
    float *grad;  /* resolved at backward */
} mact;

typedef struct mlayer {
    int kind;
    int in, in2, out;    /* activation ids (in2: second add input) */
    int acc_in, acc_in2; /* backward accumulates into the input gradient */
    int w, b;            /* parameter tensor ids, -1 none */
    int rm, rv;          /* running stats buffer tensor ids */
    int fixed_weight;
    int OC, K, stride, pad, groups; /* conv; OC = OUT for linear */
    float p;                        /* dropout */
    size_t stat_off;                /* BN: offset of (mean, var) in stats; dropout: mask offset/B_cap */
} mlayer;

struct model {
    model_desc desc;
    const ops_device *dev; /* body device */
    ops_ctx *ctx;
    const ops_device *pdev; /* layers after the flatten: dev->plain or dev */
    ops_ctx *ctx_plain;     /* pdev's context (== ctx when pdev == dev) */
    int B_cap;
    int flat_layer;   /* index of the flatten layer: later layers run on pdev */
    int input_direct; /* body input is plain fp32: input / grad_input copied straight */
    float *in_stage;  /* (B_cap,3,112,112) fp32 device staging (when !input_direct) */
    float *gin_body;  /* body-layout input gradient (when !input_direct), lazily */
    int pending_rc;   /* device error of a void call (init, zero_grad), reported next */

    model_tensor *tensors;
    mtinit *inits;
    int n_tensors, cap_tensors;
    size_t n_params;

    model_tensor *buffers_t;
    float *buffer_fill;
    int n_buffers, cap_buffers;
    size_t n_buffer_floats;

    mact *acts;
    int n_acts, cap_acts;
    mlayer *layers;
    int n_layers, cap_layers;
    int out_act;

    size_t n_stats, n_masks;
    /* all device memory (dev->mem_alloc) */
    float *params, *grads, *bufs, *masks;
    double *stats; /* BN batch mean/var saved for the backward */
    void **pool;
    size_t *pool_cap; /* bytes per sample */
    int n_pool;
    int acts_ready;

    int last_B, last_train;
    uint64_t dropout_seed;
};

/* Builds m's layer list from m->desc (zoo.c): activation 0 is the input (3,112,112), then the
 * network's layers with their parameter tensors (m->tensors, m->inits, PyTorch module order), BN
 * running-statistics tensors (m->buffers_t, m->buffer_fill), BN statistic and dropout mask offsets,
 * and m->flat_layer. Needs m->desc, m->dev and m->flat_layer = -1 set; allocates no device memory.
 * Returns the output activation's id (>= 0), or -EINVAL (a shape that does not reach 7x7, bad
 * groups or dropout p) / -ENOMEM with pf_err's message. */
int model_build_layers(model *m);

#endif
