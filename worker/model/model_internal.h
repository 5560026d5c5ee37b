/* Private layout of struct model, shared by model.c and checkpoint.c only. */
#ifndef PFCPS_WORKER_MODEL_INTERNAL_H
#define PFCPS_WORKER_MODEL_INTERNAL_H

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
    float *data;
    int grad_buf;  /* index into the gradient pool, -1 none */
    float *grad;   /* resolved at backward */
} mact;

typedef struct mlayer {
    int kind;
    int in, in2, out;       /* activation ids (in2: second add input) */
    int acc_in, acc_in2;    /* backward accumulates into the input gradient */
    int w, b;               /* parameter tensor ids, -1 none */
    int rm, rv;             /* running stats buffer tensor ids */
    int fixed_weight;
    int OC, K, stride, pad, groups; /* conv; OC = OUT for linear */
    float p;                /* dropout */
    size_t stat_off;        /* BN: offset of (mean, var) in stats; dropout: mask offset/B_cap */
} mlayer;

struct model {
    model_desc desc;
    const ops_device *dev;
    ops_ctx *ctx;
    int B_cap;

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
    float *params, *grads, *bufs, *masks;
    double *stats; /* BN batch mean/var saved for the backward */
    float **pool;
    size_t *pool_cap;
    int n_pool;
    int acts_ready;

    int last_B, last_train;
    uint64_t dropout_seed;
};

#endif
