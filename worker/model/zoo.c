/* The network zoo: the names arcface_torch's configs use (model_desc_from_name) and the builders
 * that turn a description into the model's layer list, flat parameter table and running-statistics
 * table (iresnet, mobilefacenet). See model.h for the networks; model.c plans the memory of the
 * list built here and runs it. */
#include "worker/model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/netname.h"
#include "worker/model/model_internal.h"

#define IMG 112

/* ---- description ---- */

int model_desc_from_name(model_desc *d, const char *network, int embedding_size)
{
    static const struct {
        const char *depth;
        int layers[4];
    } ires[] = {
        {"r18", {2, 2, 2, 2}},    {"r34", {3, 4, 6, 3}},    {"r50", {3, 4, 14, 3}},
        {"r100", {3, 13, 30, 3}}, {"r200", {6, 26, 60, 6}},
    };
    if (!network)
        return pf_err(-EINVAL, "network name missing");
    if (embedding_size <= 0)
        return pf_err(-EINVAL, "embedding_size %d is not positive", embedding_size);
    memset(d, 0, sizeof *d);
    d->embedding_size = embedding_size;
    pf_network_name nn; /* the one name grammar (common/netname.h), which the config checks too */
    int rc = pf_network_parse(network, &nn);
    if (rc < 0)
        return rc;
    snprintf(d->name, sizeof d->name, "%s", nn.name);
    if (nn.kind == PF_NET_MBF) {
        d->kind = MODEL_MBF;
        int l[4] = {1, 4, 6, 2};
        memcpy(d->layers, l, sizeof l);
        d->mbf_scale = 2;
        return 0;
    }
    for (size_t i = 0; i < sizeof ires / sizeof *ires; i++) {
        if (!strcmp(nn.depth, ires[i].depth)) {
            d->kind = MODEL_IRESNET;
            memcpy(d->layers, ires[i].layers, sizeof d->layers);
            int w[4] = {nn.width, 2 * nn.width, 4 * nn.width, 8 * nn.width};
            memcpy(d->widths, w, sizeof w);
            return 0;
        }
    }
    return pf_err(-EINVAL, "network '%s': no layer table for %s", network, nn.depth);
}

/* ---- building ---- */

static int grow(void **arr, int *cap, int n, size_t elem)
{
    if (n < *cap)
        return 0;
    int nc = *cap ? *cap * 2 : 64;
    void *p = realloc(*arr, (size_t)nc * elem);
    if (!p)
        return pf_err(-ENOMEM, "model description: out of memory");
    memset((char *)p + (size_t)*cap * elem, 0, (size_t)(nc - *cap) * elem);
    *arr = p;
    *cap = nc;
    return 0;
}

/* New activation tensor of (C,H,W) per sample; returns its id or a negative error. */
static int new_act(model *m, int C, int H, int W)
{
    int rc = grow((void **)&m->acts, &m->cap_acts, m->n_acts, sizeof *m->acts);
    if (rc)
        return rc;
    mact *a = &m->acts[m->n_acts];
    a->C = C;
    a->H = H;
    a->W = W;
    a->per_sample = (size_t)C * H * W;
    a->plain = m->flat_layer >= 0; /* created after the flatten */
    a->elem = a->plain ? sizeof(float) : (size_t)m->dev->act_bytes;
    a->grad_buf = -1;
    return m->n_acts++;
}

static int new_tensor(model_tensor **tab, mtinit **inits, int *n, int *cap, size_t *total, const char *name,
                      int ndim, const int *shape, unsigned flags, mtinit init)
{
    int cap0 = *cap;
    int rc = grow((void **)tab, cap, *n, sizeof **tab);
    if (rc)
        return rc;
    if (inits) {
        int c2 = cap0;
        if ((rc = grow((void **)inits, &c2, *n, sizeof **inits)))
            return rc;
    }
    model_tensor *t = &(*tab)[*n];
    if (strlen(name) >= sizeof t->name)
        return pf_err(-EINVAL, "tensor name too long: %s", name);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->count = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->count *= (size_t)shape[i];
    }
    t->offset = *total;
    t->flags = flags;
    *total += t->count;
    if (inits)
        (*inits)[*n] = init;
    return (*n)++;
}

static int add_param(model *m, const char *prefix, const char *suffix, int ndim, const int *shape,
                     unsigned flags, mtinit init)
{
    char name[128];
    snprintf(name, sizeof name, "%s%s%s", prefix, *prefix ? "." : "", suffix);
    return new_tensor(&m->tensors, &m->inits, &m->n_tensors, &m->cap_tensors, &m->n_params, name, ndim, shape,
                      flags, init);
}

static int add_buffer(model *m, const char *prefix, const char *suffix, int C, float fill)
{
    char name[128];
    snprintf(name, sizeof name, "%s.%s", prefix, suffix);
    mtinit init = {INIT_CONST, fill};
    int shape[1] = {C};
    int cap = m->cap_buffers;
    int rc = new_tensor(&m->buffers_t, NULL, &m->n_buffers, &m->cap_buffers, &m->n_buffer_floats, name, 1,
                        shape, 0, init);
    if (rc < 0)
        return rc;
    /* buffer inits are constants: keep them in a parallel array */
    int c2 = cap;
    if ((rc = grow((void **)&m->buffer_fill, &c2, m->n_buffers - 1, sizeof *m->buffer_fill)) < 0)
        return rc;
    m->buffer_fill[m->n_buffers - 1] = fill;
    return m->n_buffers - 1;
}

static int add_layer(model *m, mlayer **out)
{
    int rc = grow((void **)&m->layers, &m->cap_layers, m->n_layers, sizeof *m->layers);
    if (rc)
        return rc;
    mlayer *l = &m->layers[m->n_layers++];
    memset(l, 0, sizeof *l);
    l->in2 = -1;
    l->w = -1;
    l->b = -1;
    l->rm = -1;
    l->rv = -1;
    *out = l;
    return 0;
}

#define TRY(x)                                                                                               \
    do {                                                                                                     \
        int rc_ = (x);                                                                                       \
        if (rc_ < 0)                                                                                         \
            return rc_;                                                                                      \
    } while (0)

/* conv (no bias): returns the output activation id */
static int b_conv(model *m, const char *name, int in, int OC, int K, int stride, int pad, int groups,
                  mtinit init)
{
    mact a = m->acts[in];
    if (a.C % groups || OC % groups)
        return pf_err(-EINVAL, "%s: groups %d does not divide %d and %d", name, groups, a.C, OC);
    int OH = (a.H + 2 * pad - K) / stride + 1, OW = (a.W + 2 * pad - K) / stride + 1;
    if (OH <= 0 || OW <= 0)
        return pf_err(-EINVAL, "%s: kernel %d does not fit input %dx%d", name, K, a.H, a.W);
    int shape[4] = {OC, a.C / groups, K, K};
    if (init.kind == INIT_KAIMING_FAN_OUT)
        init.v = sqrtf(2.0f / (float)(OC * K * K));
    int w = add_param(m, name, "weight", 4, shape, 0, init);
    TRY(w);
    int out = new_act(m, OC, OH, OW);
    TRY(out);
    mlayer *l;
    TRY(add_layer(m, &l));
    l->kind = LK_CONV;
    l->in = in;
    l->out = out;
    l->w = w;
    l->OC = OC;
    l->K = K;
    l->stride = stride;
    l->pad = pad;
    l->groups = groups;
    return out;
}

static int b_bn(model *m, const char *name, int in, int fixed_weight)
{
    int C = m->acts[in].C;
    int shape[1] = {C};
    mtinit one = {INIT_CONST, 1.0f}, zero = {INIT_CONST, 0.0f};
    int w = add_param(m, name, "weight", 1, shape, fixed_weight ? MODEL_TENSOR_FIXED : 0, one);
    TRY(w);
    int b = add_param(m, name, "bias", 1, shape, 0, zero);
    TRY(b);
    int rm = add_buffer(m, name, "running_mean", C, 0.0f);
    TRY(rm);
    int rv = add_buffer(m, name, "running_var", C, 1.0f);
    TRY(rv);
    int out = new_act(m, C, m->acts[in].H, m->acts[in].W);
    TRY(out);
    mlayer *l;
    TRY(add_layer(m, &l));
    l->kind = LK_BN;
    l->in = in;
    l->out = out;
    l->w = w;
    l->b = b;
    l->rm = rm;
    l->rv = rv;
    l->fixed_weight = fixed_weight;
    l->stat_off = m->n_stats;
    m->n_stats += 2 * (size_t)C;
    return out;
}

static int b_prelu(model *m, const char *name, int in)
{
    int shape[1] = {m->acts[in].C};
    mtinit q = {INIT_CONST, 0.25f};
    int w = add_param(m, name, "weight", 1, shape, 0, q);
    TRY(w);
    int out = new_act(m, m->acts[in].C, m->acts[in].H, m->acts[in].W);
    TRY(out);
    mlayer *l;
    TRY(add_layer(m, &l));
    l->kind = LK_PRELU;
    l->in = in;
    l->out = out;
    l->w = w;
    return out;
}

static int b_add(model *m, int a, int b)
{
    if (m->acts[a].per_sample != m->acts[b].per_sample)
        return pf_err(-EINVAL, "residual add of tensors with different sizes");
    int out = new_act(m, m->acts[a].C, m->acts[a].H, m->acts[a].W);
    TRY(out);
    mlayer *l;
    TRY(add_layer(m, &l));
    l->kind = LK_ADD;
    l->in = a;
    l->in2 = b;
    l->out = out;
    return out;
}

/* (C,H,W) -> (C*H*W,1,1) in PyTorch's flatten order: the boundary between the body (device
 * layout, dev->act_bytes per element) and the layers after it (fp32 plain NCHW, on dev->plain when
 * the device has one): dev->to_plain forward, dev->from_plain backward. Always a layer (a copy
 * even when H*W == 1, where the layouts agree, since the element type may change). A tensor that
 * is already plain passes through. */
static int b_flatten(model *m, int in)
{
    mact a = m->acts[in];
    if (a.plain)
        return in;
    m->flat_layer = m->n_layers; /* the index add_layer gives it: later acts are plain */
    int out = new_act(m, (int)a.per_sample, 1, 1);
    TRY(out);
    mlayer *l;
    TRY(add_layer(m, &l));
    l->kind = LK_FLATTEN;
    l->in = in;
    l->out = out;
    return out;
}

static int b_linear(model *m, const char *name, int in, int OUT, int bias, mtinit winit)
{
    TRY(in = b_flatten(m, in));
    int IN = (int)m->acts[in].per_sample;
    int ws[2] = {OUT, IN}, bs[1] = {OUT};
    float bound = 1.0f / sqrtf((float)IN);
    if (winit.kind == INIT_KAIMING_FAN_OUT)
        winit.v = sqrtf(2.0f / (float)OUT);
    else if (winit.kind == INIT_UNIFORM)
        winit.v = bound;
    int w = add_param(m, name, "weight", 2, ws, 0, winit);
    TRY(w);
    int b = -1;
    if (bias) {
        mtinit bi = {INIT_UNIFORM, bound};
        b = add_param(m, name, "bias", 1, bs, 0, bi);
        TRY(b);
    }
    int out = new_act(m, OUT, 1, 1);
    TRY(out);
    mlayer *l;
    TRY(add_layer(m, &l));
    l->kind = LK_LINEAR;
    l->in = in;
    l->out = out;
    l->w = w;
    l->b = b;
    l->OC = OUT;
    return out;
}

static int b_dropout(model *m, int in, float p)
{
    if (!(p >= 0.0f && p < 1.0f))
        return pf_err(-EINVAL, "dropout p=%g outside [0, 1)", (double)p);
    if (p == 0.0f)
        return in; /* identity: no layer */
    int out = new_act(m, m->acts[in].C, m->acts[in].H, m->acts[in].W);
    TRY(out);
    mlayer *l;
    TRY(add_layer(m, &l));
    l->kind = LK_DROPOUT;
    l->in = in;
    l->out = out;
    l->p = p;
    l->stat_off = m->n_masks;
    m->n_masks += m->acts[in].per_sample;
    return out;
}

static int build_iresnet(model *m)
{
    const model_desc *d = &m->desc;
    mtinit cinit = {INIT_NORMAL, 0.1f};
    char p[96];
    int x = b_conv(m, "conv1", 0, d->widths[0], 3, 1, 1, 1, cinit);
    TRY(x);
    TRY(x = b_bn(m, "bn1", x, 0));
    TRY(x = b_prelu(m, "prelu", x));
    int inplanes = d->widths[0];
    for (int s = 0; s < 4; s++) {
        int planes = d->widths[s];
        for (int b = 0; b < d->layers[s]; b++) {
            int stride = b == 0 ? 2 : 1;
            int in = x, y;
            snprintf(p, sizeof p, "layer%d.%d.bn1", s + 1, b);
            TRY(y = b_bn(m, p, in, 0));
            snprintf(p, sizeof p, "layer%d.%d.conv1", s + 1, b);
            TRY(y = b_conv(m, p, y, planes, 3, 1, 1, 1, cinit));
            snprintf(p, sizeof p, "layer%d.%d.bn2", s + 1, b);
            TRY(y = b_bn(m, p, y, 0));
            snprintf(p, sizeof p, "layer%d.%d.prelu", s + 1, b);
            TRY(y = b_prelu(m, p, y));
            snprintf(p, sizeof p, "layer%d.%d.conv2", s + 1, b);
            TRY(y = b_conv(m, p, y, planes, 3, stride, 1, 1, cinit));
            snprintf(p, sizeof p, "layer%d.%d.bn3", s + 1, b);
            TRY(y = b_bn(m, p, y, 0));
            int sc = in;
            if (stride != 1 || inplanes != planes) {
                snprintf(p, sizeof p, "layer%d.%d.downsample.0", s + 1, b);
                TRY(sc = b_conv(m, p, in, planes, 1, stride, 0, 1, cinit));
                snprintf(p, sizeof p, "layer%d.%d.downsample.1", s + 1, b);
                TRY(sc = b_bn(m, p, sc, 0));
            }
            TRY(x = b_add(m, y, sc));
            inplanes = planes;
        }
    }
    if (m->acts[x].H != 7 || m->acts[x].W != 7)
        return pf_err(-EINVAL, "iresnet: last stage is %dx%d, expected 7x7", m->acts[x].H, m->acts[x].W);
    TRY(x = b_bn(m, "bn2", x, 0));
    TRY(x = b_flatten(m, x)); /* arcface_torch: bn2, flatten, dropout, fc, features */
    TRY(x = b_dropout(m, x, d->dropout));
    mtinit lin = {INIT_UNIFORM, 0.0f};
    TRY(x = b_linear(m, "fc", x, d->embedding_size, 1, lin));
    TRY(x = b_bn(m, "features", x, 1));
    return x;
}

static int mbf_convblock(model *m, const char *prefix, int in, int out_c, int K, int stride, int pad,
                         int groups, int prelu)
{
    mtinit ki = {INIT_KAIMING_FAN_OUT, 0.0f};
    char p[128];
    int x;
    snprintf(p, sizeof p, "%s.layers.0", prefix);
    TRY(x = b_conv(m, p, in, out_c, K, stride, pad, groups, ki));
    snprintf(p, sizeof p, "%s.layers.1", prefix);
    TRY(x = b_bn(m, p, x, 0));
    if (prelu) {
        snprintf(p, sizeof p, "%s.layers.2", prefix);
        TRY(x = b_prelu(m, p, x));
    }
    return x;
}

static int mbf_depthwise(model *m, const char *prefix, int in, int out_c, int residual, int stride,
                         int groups)
{
    char p[128];
    int x;
    snprintf(p, sizeof p, "%s.layers.0", prefix);
    TRY(x = mbf_convblock(m, p, in, groups, 1, 1, 0, 1, 1));
    snprintf(p, sizeof p, "%s.layers.1", prefix);
    TRY(x = mbf_convblock(m, p, x, groups, 3, stride, 1, groups, 1));
    snprintf(p, sizeof p, "%s.layers.2", prefix);
    TRY(x = mbf_convblock(m, p, x, out_c, 1, 1, 0, 1, 0));
    if (residual)
        TRY(x = b_add(m, in, x));
    return x;
}

static int mbf_residual(model *m, const char *prefix, int in, int c, int n, int groups)
{
    char p[128];
    int x = in;
    for (int k = 0; k < n; k++) {
        snprintf(p, sizeof p, "%s.layers.%d", prefix, k);
        TRY(x = mbf_depthwise(m, p, x, c, 1, 1, groups));
    }
    return x;
}

static int build_mbf(model *m)
{
    const model_desc *d = &m->desc;
    int s = d->mbf_scale, x;
    TRY(x = mbf_convblock(m, "layers.0", 0, 64 * s, 3, 2, 1, 1, 1));
    if (d->layers[0] == 1)
        TRY(x = mbf_convblock(m, "layers.1", x, 64 * s, 3, 1, 1, 64, 1));
    else
        TRY(x = mbf_residual(m, "layers.1", x, 64 * s, d->layers[0], 128));
    TRY(x = mbf_depthwise(m, "layers.2", x, 64 * s, 0, 2, 128));
    TRY(x = mbf_residual(m, "layers.3", x, 64 * s, d->layers[1], 128));
    TRY(x = mbf_depthwise(m, "layers.4", x, 128 * s, 0, 2, 256));
    TRY(x = mbf_residual(m, "layers.5", x, 128 * s, d->layers[2], 256));
    TRY(x = mbf_depthwise(m, "layers.6", x, 128 * s, 0, 2, 512));
    TRY(x = mbf_residual(m, "layers.7", x, 128 * s, d->layers[3], 256));
    TRY(x = mbf_convblock(m, "conv_sep", x, 512, 1, 1, 0, 1, 1));
    if (m->acts[x].H != 7)
        return pf_err(-EINVAL, "mbf: last stage is %dx%d, expected 7x7", m->acts[x].H, m->acts[x].W);
    TRY(x = mbf_convblock(m, "features.layers.0", x, 512, 7, 1, 0, 512, 0));
    mtinit ki = {INIT_KAIMING_FAN_OUT, 0.0f};
    TRY(x = b_linear(m, "features.layers.2", x, d->embedding_size, 0, ki));
    TRY(x = b_bn(m, "features.layers.3", x, 0));
    return x;
}

int model_build_layers(model *m)
{
    int rc = new_act(m, 3, IMG, IMG);
    if (rc >= 0)
        rc = m->desc.kind == MODEL_IRESNET ? build_iresnet(m) : build_mbf(m);
    return rc;
}
