/* Backbone network: creation from a description (the layer list itself is built by zoo.c), the
 * planning and allocation of its device memory, initialization, forward and backward, accessors.
 * See model.h for the networks and the memory layout. */
#include "worker/model/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/splitmix64.h"
#include "worker/model/model_internal.h"

#define BN_EPS      1e-5f
#define BN_MOMENTUM 0.1f

typedef struct pool_plan {
    size_t *cap;
    int *is_free;
    int n, capn;
} pool_plan;

/* Best fit: the smallest free buffer that is large enough, else the largest free one (grown),
 * else a new one. Returns its index or -ENOMEM. */
static int pool_get(pool_plan *p, size_t need)
{
    int best = -1;
    for (int k = 0; k < p->n; k++)
        if (p->is_free[k] && p->cap[k] >= need && (best < 0 || p->cap[k] < p->cap[best]))
            best = k;
    if (best < 0)
        for (int k = 0; k < p->n; k++)
            if (p->is_free[k] && (best < 0 || p->cap[k] > p->cap[best]))
                best = k;
    if (best < 0) {
        if (p->n == p->capn) {
            int nc = p->capn ? 2 * p->capn : 16;
            size_t *c = realloc(p->cap, (size_t)nc * sizeof *c);
            if (!c)
                return pf_err(-ENOMEM, "model: out of memory");
            p->cap = c;
            int *f = realloc(p->is_free, (size_t)nc * sizeof *f);
            if (!f)
                return pf_err(-ENOMEM, "model: out of memory");
            p->is_free = f;
            p->capn = nc;
        }
        best = p->n++;
        p->cap[best] = 0;
    }
    if (p->cap[best] < need)
        p->cap[best] = need;
    p->is_free[best] = 0;
    return best;
}

/* Assigns activation-gradient buffers by liveness over the backward order: the gradient of a
 * tensor lives from its first write (by its last consumer) to its read (by its producer). Also
 * decides per layer input whether the backward overwrites (first writer) or accumulates. */
static int plan_grads(model *m)
{
    pool_plan p = {0};
    int rc = 0;
    int *written = calloc((size_t)m->n_acts, sizeof *written);
    if (!written)
        return pf_err(-ENOMEM, "model: out of memory");
    int outt = m->out_act;
    if ((rc = pool_get(&p, m->acts[outt].per_sample * m->acts[outt].elem)) < 0)
        goto out;
    m->acts[outt].grad_buf = rc;
    written[outt] = 1;
    for (int i = m->n_layers - 1; i >= 0; i--) {
        mlayer *l = &m->layers[i];
        int ins[2] = {l->in, l->in2};
        int *accs[2] = {&l->acc_in, &l->acc_in2};
        for (int j = 0; j < 2; j++) {
            int t = ins[j];
            if (t < 0)
                continue;
            *accs[j] = written[t];
            if (!written[t] && t != 0) { /* t == 0: the caller's grad_input buffer */
                if ((rc = pool_get(&p, m->acts[t].per_sample * m->acts[t].elem)) < 0)
                    goto out;
                m->acts[t].grad_buf = rc;
            }
            written[t] = 1;
        }
        if (m->acts[l->out].grad_buf >= 0)
            p.is_free[m->acts[l->out].grad_buf] = 1;
    }
    rc = 0;
    m->n_pool = p.n;
    m->pool_cap = p.cap;
    p.cap = NULL;
out:
    free(p.cap);
    free(p.is_free);
    free(written);
    return rc;
}

/* n bytes of zeroed device memory (dev->mem_alloc). */
static int dalloc(model *m, void *p, size_t bytes)
{
    return m->dev->mem_alloc(m->ctx, (void **)p, bytes);
}

/* Activation and gradient-pool buffers (B_cap samples), allocated at the first forward so that
 * a model used only for its layout (parameter counts, checkpoints) costs no activation memory. */
static int alloc_acts(model *m)
{
    if (m->acts_ready)
        return 0;
    int rc = 0;
    m->pool = calloc((size_t)(m->n_pool ? m->n_pool : 1), sizeof *m->pool);
    if (!m->pool)
        return pf_err(-ENOMEM, "model %s: out of memory", m->desc.name);
    for (int k = 0; k < m->n_pool && !rc; k++)
        rc = dalloc(m, &m->pool[k], m->pool_cap[k] * (size_t)m->B_cap);
    for (int t = 0; t < m->n_acts && !rc; t++)
        rc = dalloc(m, &m->acts[t].data, m->acts[t].per_sample * m->acts[t].elem * (size_t)m->B_cap);
    if (!rc && !m->input_direct)
        rc = dalloc(m, &m->in_stage, m->acts[0].per_sample * sizeof(float) * (size_t)m->B_cap);
    if (rc) { /* release what was allocated: a later forward starts over */
        for (int k = 0; k < m->n_pool; k++)
            m->dev->mem_free(m->ctx, m->pool[k]);
        for (int t = 0; t < m->n_acts; t++) {
            m->dev->mem_free(m->ctx, m->acts[t].data);
            m->acts[t].data = NULL;
        }
        m->dev->mem_free(m->ctx, m->in_stage);
        m->in_stage = NULL;
        free(m->pool);
        m->pool = NULL;
        return pf_err_wrap(rc, "model %s: activations (batch %d) on device %s", m->desc.name, m->B_cap,
                           m->dev->name);
    }
    m->acts_ready = 1;
    return 0;
}

/* Fills the running statistics (mean 0, var 1) through a host staging array. */
static int fill_buffers(model *m)
{
    float *h = malloc((m->n_buffer_floats ? m->n_buffer_floats : 1) * sizeof(float));
    if (!h)
        return pf_err(-ENOMEM, "model: out of memory");
    for (int i = 0; i < m->n_buffers; i++)
        for (size_t j = 0; j < m->buffers_t[i].count; j++)
            h[m->buffers_t[i].offset + j] = m->buffer_fill[i];
    int rc = model_set_buffers(m, h);
    free(h);
    return rc;
}

/* The entries worker/model uses; a device table under construction may lack some. */
static int check_device(const ops_device *d)
{
    if (!d->ctx_create || !d->ctx_destroy || !d->conv_forward || !d->conv_backward || !d->bn_forward ||
        !d->bn_backward || !d->prelu_forward || !d->prelu_backward || !d->linear_forward ||
        !d->linear_backward || !d->add_forward || !d->acc || !d->act_block || !d->to_plain ||
        !d->from_plain || !d->dropout_forward || !d->dropout_backward || !d->mem_alloc || !d->mem_free ||
        !d->mem_h2d || !d->mem_d2h || !d->mem_d2d || !d->mem_zero || !d->sync)
        return pf_err(-EINVAL, "model: device '%s' lacks entries of kernels/ops.h", d->name);
    if (d->act_bytes != 2 && d->act_bytes != 4)
        return pf_err(-EINVAL, "model: device '%s' has act_bytes %d (2 or 4)", d->name, d->act_bytes);
    if (d->plain && d->plain->act_bytes != 4)
        return pf_err(-EINVAL, "model: device '%s': its plain device '%s' is not fp32", d->name,
                      d->plain->name);
    return 0;
}

int model_create_desc(model **out, const model_desc *d, int batch_capacity, const ops_device *dev)
{
    if (!d || d->embedding_size <= 0)
        return pf_err(-EINVAL, "model: embedding_size must be positive");
    if (batch_capacity <= 0)
        return pf_err(-EINVAL, "model: batch capacity %d is not positive", batch_capacity);
    if (d->kind == MODEL_IRESNET) {
        for (int s = 0; s < 4; s++)
            if (d->layers[s] <= 0 || d->widths[s] <= 0)
                return pf_err(-EINVAL, "iresnet: stage %d has %d blocks of width %d", s, d->layers[s],
                              d->widths[s]);
    } else if (d->kind == MODEL_MBF) {
        if (d->mbf_scale <= 0 || d->layers[0] <= 0 || d->layers[1] <= 0 || d->layers[2] <= 0 ||
            d->layers[3] <= 0)
            return pf_err(-EINVAL, "mbf: blocks and scale must be positive");
    } else {
        return pf_err(-EINVAL, "model: unknown network kind %d", (int)d->kind);
    }
    if (!dev)
        dev = &ops_cpu;
    int rc = check_device(dev);
    if (rc || (dev->plain && (rc = check_device(dev->plain))))
        return rc;
    model *m = calloc(1, sizeof *m);
    if (!m)
        return pf_err(-ENOMEM, "model: out of memory");
    m->desc = *d;
    m->B_cap = batch_capacity;
    m->dev = dev;
    m->pdev = dev->plain ? dev->plain : dev;
    m->flat_layer = -1;
    m->input_direct = dev->act_bytes == 4 && dev->act_block(3) == 1;
    rc = model_build_layers(m);
    if (rc < 0)
        goto fail;
    m->out_act = rc;
    if ((rc = plan_grads(m)) < 0)
        goto fail;

    if (m->flat_layer < 0) {
        rc = pf_err(-EINVAL, "model %s: no flatten layer", d->name);
        goto fail;
    }
    if ((rc = m->dev->ctx_create(&m->ctx)) < 0)
        goto fail;
    if (dev->plain) {
        if ((rc = dev->plain->ctx_create(&m->ctx_plain)) < 0)
            goto fail;
    } else {
        m->ctx_plain = m->ctx;
    }
    if ((rc = dalloc(m, &m->params, m->n_params * sizeof(float))) ||
        (rc = dalloc(m, &m->grads, m->n_params * sizeof(float))) ||
        (rc = dalloc(m, &m->bufs, m->n_buffer_floats * sizeof(float))) ||
        (rc = dalloc(m, &m->stats, m->n_stats * sizeof(double))) ||
        (rc = dalloc(m, &m->masks, m->n_masks * (size_t)m->B_cap * sizeof(float))) ||
        (rc = fill_buffers(m))) {
        rc = pf_err_wrap(rc, "model %s (batch %d) on device %s", d->name, batch_capacity, dev->name);
        goto fail;
    }
    *out = m;
    return 0;
fail:
    model_free(m);
    return rc;
}

int model_create(model **out, const char *network, int embedding_size, int batch_capacity)
{
    model_desc d;
    int rc = model_desc_from_name(&d, network, embedding_size);
    if (rc)
        return rc;
    return model_create_desc(out, &d, batch_capacity, NULL);
}

void model_free(model *m)
{
    if (!m)
        return;
    if (m->ctx) {
        const ops_device *d = m->dev;
        for (int t = 0; t < m->n_acts; t++)
            d->mem_free(m->ctx, m->acts[t].data);
        for (int k = 0; m->pool && k < m->n_pool; k++)
            d->mem_free(m->ctx, m->pool[k]);
        d->mem_free(m->ctx, m->params);
        d->mem_free(m->ctx, m->grads);
        d->mem_free(m->ctx, m->bufs);
        d->mem_free(m->ctx, m->stats);
        d->mem_free(m->ctx, m->masks);
        d->mem_free(m->ctx, m->in_stage);
        d->mem_free(m->ctx, m->gin_body);
        if (m->ctx_plain && m->ctx_plain != m->ctx)
            m->dev->plain->ctx_destroy(m->ctx_plain);
        d->ctx_destroy(m->ctx);
    }
    free(m->pool);
    free(m->pool_cap);
    free(m->acts);
    free(m->layers);
    free(m->tensors);
    free(m->inits);
    free(m->buffers_t);
    free(m->buffer_fill);
    free(m);
}

/* ---- init ---- */

/* SplitMix64's step: the output for state *s, then the state advanced by the golden gamma
 * (splitmix64 adds the same gamma before its finaliser). */
static uint64_t sm64(uint64_t *s)
{
    uint64_t x = splitmix64(*s);
    *s += 0x9E3779B97F4A7C15ull;
    return x;
}

static double unif01(uint64_t *s) /* (0, 1) */
{
    return ((double)(sm64(s) >> 11) + 0.5) * 0x1.0p-53;
}

void model_init(model *m, uint64_t seed)
{
    /* The values are drawn on the host (one staging array) and uploaded. */
    float *host = malloc((m->n_params ? m->n_params : 1) * sizeof(float));
    if (!host) {
        m->pending_rc = pf_err(-ENOMEM, "model_init: out of memory for %zu parameters", m->n_params);
        return;
    }
    uint64_t s = seed ^ 0x5043465053ull;
    for (int i = 0; i < m->n_tensors; i++) {
        const model_tensor *t = &m->tensors[i];
        mtinit in = m->inits[i];
        float *p = host + t->offset;
        for (size_t j = 0; j < t->count; j++) {
            switch (in.kind) {
            case INIT_CONST: p[j] = in.v; break;
            case INIT_UNIFORM: p[j] = (float)((2.0 * unif01(&s) - 1.0) * in.v); break;
            case INIT_NORMAL:
            case INIT_KAIMING_FAN_OUT: {
                double u1 = unif01(&s), u2 = unif01(&s);
                p[j] = (float)(in.v * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
                break;
            }
            }
        }
    }
    int rc = model_set_params(m, host);
    free(host);
    if (!rc)
        rc = fill_buffers(m);
    if (rc && !m->pending_rc)
        m->pending_rc = pf_err_wrap(rc, "model_init");
    model_zero_grad(m);
}

/* ---- forward / backward ---- */

/* The device and context that run layer i: the plain device after the flatten. */
static const ops_device *layer_dev(model *m, int i, ops_ctx **ctx)
{
    if (i > m->flat_layer) {
        *ctx = m->ctx_plain;
        return m->pdev;
    }
    *ctx = m->ctx;
    return m->dev;
}

/* A device error of an earlier void call (model_init, model_zero_grad), reported once. */
static int take_pending(model *m)
{
    int rc = m->pending_rc;
    m->pending_rc = 0;
    return rc;
}

int model_forward(model *m, const float *input, int B, int train, const float **embeddings)
{
    if (B <= 0 || B > m->B_cap)
        return pf_err(-EINVAL, "model_forward: batch %d outside [1, %d]", B, m->B_cap);
    int rc = take_pending(m);
    if (rc || (rc = alloc_acts(m)))
        return rc;
    mact *a0 = &m->acts[0];
    size_t in_bytes = (size_t)B * a0->per_sample * sizeof(float);
    if (m->input_direct) {
        rc = m->dev->mem_h2d(m->ctx, a0->data, input, in_bytes);
    } else {
        rc = m->dev->mem_h2d(m->ctx, m->in_stage, input, in_bytes);
        if (!rc)
            rc = m->dev->from_plain(m->ctx, a0->data, 0, m->in_stage, B, a0->C, a0->H * a0->W);
    }
    if (rc)
        return pf_err_wrap(rc, "model_forward: input upload");
    m->last_B = 0;
    for (int i = 0; i < m->n_layers && !rc; i++) {
        mlayer *l = &m->layers[i];
        mact *a = &m->acts[l->in], *o = &m->acts[l->out];
        float *W = l->w >= 0 ? m->params + m->tensors[l->w].offset : NULL;
        float *Bi = l->b >= 0 ? m->params + m->tensors[l->b].offset : NULL;
        ops_ctx *cx;
        const ops_device *dv = layer_dev(m, i, &cx);
        switch (l->kind) {
        case LK_CONV: {
            ops_conv_shape s;
            rc = ops_conv_shape_init(&s, B, a->C, a->H, a->W, l->OC, l->K, l->stride, l->pad, l->groups);
            if (!rc)
                rc = dv->conv_forward(cx, o->data, a->data, W, &s);
            break;
        }
        case LK_BN: {
            double *st = m->stats + l->stat_off;
            rc = dv->bn_forward(cx, o->data, st, st + a->C, a->data, W, Bi,
                                m->bufs + m->buffers_t[l->rm].offset, m->bufs + m->buffers_t[l->rv].offset, B,
                                a->C, a->H * a->W, BN_EPS, BN_MOMENTUM, train);
            break;
        }
        case LK_PRELU: rc = dv->prelu_forward(cx, o->data, a->data, W, B, a->C, a->H * a->W); break;
        case LK_ADD:
            rc = dv->add_forward(cx, o->data, a->data, m->acts[l->in2].data, (size_t)B * a->per_sample);
            break;
        case LK_LINEAR:
            rc = dv->linear_forward(cx, o->data, a->data, W, Bi, B, (int)a->per_sample, l->OC);
            break;
        case LK_FLATTEN: /* the body device converts its layout and precision to fp32 NCHW */
            rc = dv->to_plain(cx, o->data, a->data, B, a->C, a->H * a->W);
            break;
        case LK_DROPOUT:
            rc = dv->dropout_forward(cx, o->data, m->masks + l->stat_off * (size_t)m->B_cap, a->data,
                                     (size_t)B * a->per_sample, train ? l->p : 0.0f, m->dropout_seed++);
            break;
        }
        if (rc)
            rc = pf_err_wrap(rc, "forward layer %d", i);
    }
    if (rc)
        return rc;
    m->last_B = B;
    m->last_train = train;
    *embeddings = m->acts[m->out_act].data;
    return 0;
}

int model_backward(model *m, const float *grad_embeddings, float *grad_input)
{
    int B = m->last_B;
    if (!B || !m->last_train)
        return pf_err(-EINVAL, "model_backward: no training-mode forward before it");
    int rc = take_pending(m);
    if (rc)
        return rc;
    mact *a0 = &m->acts[0];
    if (grad_input && !m->input_direct && !m->gin_body &&
        (rc = dalloc(m, &m->gin_body, a0->per_sample * a0->elem * (size_t)m->B_cap)))
        return pf_err_wrap(rc, "model_backward: input gradient buffer");
    for (int t = 1; t < m->n_acts; t++)
        m->acts[t].grad = m->acts[t].grad_buf >= 0 ? m->pool[m->acts[t].grad_buf] : NULL;
    a0->grad = !grad_input ? NULL : m->input_direct ? grad_input : m->gin_body;
    mact *o = &m->acts[m->out_act];
    if ((rc = m->pdev->mem_d2d(m->ctx_plain, o->grad, grad_embeddings,
                               (size_t)B * o->per_sample * sizeof(float))))
        return pf_err_wrap(rc, "model_backward: embedding gradient copy");
    for (int i = m->n_layers - 1; i >= 0 && !rc; i--) {
        mlayer *l = &m->layers[i];
        mact *a = &m->acts[l->in];
        o = &m->acts[l->out];
        size_t wo = l->w >= 0 ? m->tensors[l->w].offset : 0;
        float *W = l->w >= 0 ? m->params + wo : NULL;
        float *dW = l->w >= 0 ? m->grads + wo : NULL;
        float *dB = l->b >= 0 ? m->grads + m->tensors[l->b].offset : NULL;
        ops_ctx *cx;
        const ops_device *dv = layer_dev(m, i, &cx);
        switch (l->kind) {
        case LK_CONV: {
            ops_conv_shape s;
            rc = ops_conv_shape_init(&s, B, a->C, a->H, a->W, l->OC, l->K, l->stride, l->pad, l->groups);
            if (!rc)
                rc = dv->conv_backward(cx, a->grad, l->acc_in, dW, o->grad, a->data, W, &s);
            break;
        }
        case LK_BN: {
            double *st = m->stats + l->stat_off;
            rc = dv->bn_backward(cx, a->grad, l->acc_in, l->fixed_weight ? NULL : dW, dB, o->grad, a->data, W,
                                 st, st + a->C, B, a->C, a->H * a->W, BN_EPS);
            break;
        }
        case LK_PRELU:
            rc = dv->prelu_backward(cx, a->grad, l->acc_in, dW, o->grad, a->data, W, B, a->C, a->H * a->W);
            break;
        case LK_ADD: {
            size_t n = (size_t)B * a->per_sample;
            if (a->grad)
                rc = dv->acc(cx, a->grad, l->acc_in, o->grad, n);
            mact *a2 = &m->acts[l->in2];
            if (!rc && a2->grad)
                rc = dv->acc(cx, a2->grad, l->acc_in2, o->grad, n);
            break;
        }
        case LK_LINEAR:
            rc = dv->linear_backward(cx, a->grad, l->acc_in, dW, dB, o->grad, a->data, W, B,
                                     (int)a->per_sample, l->OC);
            break;
        case LK_FLATTEN:
            if (a->grad)
                rc = dv->from_plain(cx, a->grad, l->acc_in, o->grad, B, a->C, a->H * a->W);
            break;
        case LK_DROPOUT:
            if (a->grad)
                rc = dv->dropout_backward(cx, a->grad, l->acc_in, o->grad,
                                          m->masks + l->stat_off * (size_t)m->B_cap,
                                          (size_t)B * a->per_sample);
            break;
        }
        if (rc)
            rc = pf_err_wrap(rc, "backward layer %d", i);
    }
    if (!rc && grad_input && !m->input_direct &&
        (rc = m->dev->to_plain(m->ctx, grad_input, m->gin_body, B, a0->C, a0->H * a0->W)))
        rc = pf_err_wrap(rc, "model_backward: input gradient");
    return rc;
}

void model_zero_grad(model *m)
{
    int rc = m->dev->mem_zero(m->ctx, m->grads, m->n_params * sizeof(float));
    if (rc && !m->pending_rc)
        m->pending_rc = pf_err_wrap(rc, "model_zero_grad");
}

/* ---- accessors ---- */

const ops_device *model_device(const model *m)
{
    return m->dev;
}
ops_ctx *model_ctx(model *m)
{
    return m->ctx;
}
const model_desc *model_get_desc(const model *m)
{
    return &m->desc;
}
size_t model_num_params(const model *m)
{
    return m->n_params;
}
float *model_params(model *m)
{
    return m->params;
}
float *model_grads(model *m)
{
    return m->grads;
}
int model_num_tensors(const model *m)
{
    return m->n_tensors;
}
size_t model_num_buffer_floats(const model *m)
{
    return m->n_buffer_floats;
}
float *model_buffers(model *m)
{
    return m->bufs;
}
int model_num_buffer_tensors(const model *m)
{
    return m->n_buffers;
}

int model_get_params(const model *m, float *host)
{
    return m->dev->mem_d2h(m->ctx, host, m->params, m->n_params * sizeof(float));
}

int model_set_params(model *m, const float *host)
{
    return m->dev->mem_h2d(m->ctx, m->params, host, m->n_params * sizeof(float));
}

int model_get_grads(const model *m, float *host)
{
    return m->dev->mem_d2h(m->ctx, host, m->grads, m->n_params * sizeof(float));
}

int model_get_buffers(const model *m, float *host)
{
    return m->dev->mem_d2h(m->ctx, host, m->bufs, m->n_buffer_floats * sizeof(float));
}

int model_set_buffers(model *m, const float *host)
{
    return m->dev->mem_h2d(m->ctx, m->bufs, host, m->n_buffer_floats * sizeof(float));
}

const model_tensor *model_tensor_at(const model *m, int i)
{
    return i >= 0 && i < m->n_tensors ? &m->tensors[i] : NULL;
}

const model_tensor *model_buffer_tensor_at(const model *m, int i)
{
    return i >= 0 && i < m->n_buffers ? &m->buffers_t[i] : NULL;
}

static const model_tensor *find(const model_tensor *tab, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(tab[i].name, name))
            return &tab[i];
    return NULL;
}

float *model_param(model *m, const char *name, size_t *count)
{
    const model_tensor *t = find(m->tensors, m->n_tensors, name);
    if (t && count)
        *count = t->count;
    return t ? m->params + t->offset : NULL;
}

float *model_grad(model *m, const char *name, size_t *count)
{
    const model_tensor *t = find(m->tensors, m->n_tensors, name);
    if (t && count)
        *count = t->count;
    return t ? m->grads + t->offset : NULL;
}

float *model_buffer(model *m, const char *name, size_t *count)
{
    const model_tensor *t = find(m->buffers_t, m->n_buffers, name);
    if (t && count)
        *count = t->count;
    return t ? m->bufs + t->offset : NULL;
}

uint64_t model_rng_state(const model *m)
{
    return m->dropout_seed;
}

void model_set_rng_state(model *m, uint64_t state)
{
    m->dropout_seed = state;
}
