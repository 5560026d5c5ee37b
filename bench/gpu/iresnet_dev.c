/* iresnet on any ops_device with device-resident tensors: see iresnet_dev.h. */
#include "bench/gpu/iresnet_dev.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

#define BN_EPS 1e-5f
#define BN_MOMENTUM 0.1f

enum { OP_CONV, OP_BN, OP_PRELU, OP_ADD, OP_FLATTEN, OP_LINEAR };

typedef struct act {
    int C, H, W;
    float *x, *g;
} act;

typedef struct op {
    int kind, in, in2, out;
    size_t w, b;         /* parameter offsets */
    size_t rm, rv, stat; /* BN: running offsets, save-stat offset (doubles) */
    int fixed_w;         /* BN weight not trained (features) */
    ops_conv_shape s;
    int IN, OUT;
} op;

struct inet {
    const ops_device *dev;
    const devmem *mem;
    ops_ctx *ctx;
    int B;
    act *acts;
    int nacts, capacts;
    op *ops;
    int nops, capops;
    inet_tensor *par, *run;
    int npar, cappar, nrun, caprun;
    size_t npf, nrf, nstat;
    float *params, *grads, *running;
    double *stats;
    int *written;
    int trained; /* a training forward ran */
};

/* ---- host devmem ---- */

static int h_alloc(void **p, size_t bytes)
{
    *p = malloc(bytes ? bytes : 1);
    return *p ? 0 : pf_err(-ENOMEM, "out of memory for %zu bytes", bytes);
}
static void h_release(void *p) { free(p); }
static int h_copy(void *d, const void *s, size_t bytes)
{
    memcpy(d, s, bytes);
    return 0;
}
static int h_fill(float *p, float v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = v;
    return 0;
}
const devmem devmem_host = {h_alloc, h_release, h_copy, h_copy, h_fill, NULL};

/* ---- building ---- */

static int grow(void **p, int *cap, int need, size_t elem)
{
    if (need <= *cap)
        return 0;
    int nc = *cap ? 2 * *cap : 64;
    while (nc < need)
        nc *= 2;
    void *q = realloc(*p, (size_t)nc * elem);
    if (!q)
        return pf_err(-ENOMEM, "iresnet: out of memory");
    *p = q;
    *cap = nc;
    return 0;
}

static int new_act(inet *n, int C, int H, int W)
{
    if (grow((void **)&n->acts, &n->capacts, n->nacts + 1, sizeof(act)))
        return -1;
    act *a = &n->acts[n->nacts];
    memset(a, 0, sizeof *a);
    a->C = C;
    a->H = H;
    a->W = W;
    return n->nacts++;
}

static op *new_op(inet *n, int kind, int in)
{
    if (grow((void **)&n->ops, &n->capops, n->nops + 1, sizeof(op)))
        return NULL;
    op *o = &n->ops[n->nops++];
    memset(o, 0, sizeof *o);
    o->kind = kind;
    o->in = in;
    o->in2 = -1;
    return o;
}

static size_t add_tensor(inet_tensor **t, int *nt, int *cap, size_t *total, const char *prefix,
                         const char *suffix, size_t count)
{
    if (grow((void **)t, cap, *nt + 1, sizeof(inet_tensor)))
        return (size_t)-1;
    inet_tensor *e = &(*t)[(*nt)++];
    snprintf(e->name, sizeof e->name, "%s%s", prefix, suffix);
    e->offset = *total;
    e->count = count;
    *total += count;
    return e->offset;
}

#define PARAM(n, pre, suf, cnt) add_tensor(&(n)->par, &(n)->npar, &(n)->cappar, &(n)->npf, pre, suf, cnt)
#define RUNNING(n, pre, suf, cnt) add_tensor(&(n)->run, &(n)->nrun, &(n)->caprun, &(n)->nrf, pre, suf, cnt)

static int conv(inet *n, int in, int OC, int K, int stride, int pad, const char *name)
{
    act a = n->acts[in];
    op *o = new_op(n, OP_CONV, in);
    if (!o || ops_conv_shape_init(&o->s, n->B, a.C, a.H, a.W, OC, K, stride, pad, 1))
        return -1;
    o->w = PARAM(n, name, ".weight", (size_t)OC * a.C * K * K);
    int out = new_act(n, OC, o->s.OH, o->s.OW);
    n->ops[n->nops - 1].out = out;
    return out;
}

static int bn(inet *n, int in, const char *name, int fixed_w)
{
    act a = n->acts[in];
    op *o = new_op(n, OP_BN, in);
    if (!o)
        return -1;
    o->w = PARAM(n, name, ".weight", (size_t)a.C);
    o->b = PARAM(n, name, ".bias", (size_t)a.C);
    o->rm = RUNNING(n, name, ".running_mean", (size_t)a.C);
    o->rv = RUNNING(n, name, ".running_var", (size_t)a.C);
    o->stat = n->nstat;
    n->nstat += 2 * (size_t)a.C;
    o->fixed_w = fixed_w;
    int out = new_act(n, a.C, a.H, a.W);
    n->ops[n->nops - 1].out = out;
    return out;
}

static int prelu(inet *n, int in, const char *name)
{
    act a = n->acts[in];
    op *o = new_op(n, OP_PRELU, in);
    if (!o)
        return -1;
    o->w = PARAM(n, name, ".weight", (size_t)a.C);
    int out = new_act(n, a.C, a.H, a.W);
    n->ops[n->nops - 1].out = out;
    return out;
}

static int add(inet *n, int x, int y)
{
    act a = n->acts[x];
    op *o = new_op(n, OP_ADD, x);
    if (!o)
        return -1;
    o->in2 = y;
    int out = new_act(n, a.C, a.H, a.W);
    n->ops[n->nops - 1].out = out;
    return out;
}

static int flatten(inet *n, int in)
{
    act a = n->acts[in];
    if (!new_op(n, OP_FLATTEN, in))
        return -1;
    int out = new_act(n, a.C * a.H * a.W, 1, 1);
    n->ops[n->nops - 1].out = out;
    return out;
}

static int linear(inet *n, int in, int OUT, const char *name)
{
    act a = n->acts[in];
    op *o = new_op(n, OP_LINEAR, in);
    if (!o)
        return -1;
    o->IN = a.C * a.H * a.W;
    o->OUT = OUT;
    o->w = PARAM(n, name, ".weight", (size_t)OUT * o->IN);
    o->b = PARAM(n, name, ".bias", (size_t)OUT);
    int out = new_act(n, OUT, 1, 1);
    n->ops[n->nops - 1].out = out;
    return out;
}

static size_t act_n(const inet *n, int t)
{
    const act *a = &n->acts[t];
    return (size_t)n->B * a->C * a->H * a->W;
}

void inet_free(inet *n)
{
    if (!n)
        return;
    const devmem *m = n->mem;
    if (n->acts)
        for (int i = 0; i < n->nacts; i++) {
            m->release(n->acts[i].x);
            m->release(n->acts[i].g);
        }
    m->release(n->params);
    m->release(n->grads);
    m->release(n->running);
    m->release(n->stats);
    if (n->ctx)
        n->dev->ctx_destroy(n->ctx);
    free(n->acts);
    free(n->ops);
    free(n->par);
    free(n->run);
    free(n->written);
    free(n);
}

int inet_create(inet **out, const ops_device *dev, const devmem *mem, const int layers[4],
                const int widths[4], int D, int B)
{
    *out = NULL;
    for (int s = 0; s < 4; s++)
        if (layers[s] < 1 || widths[s] < 1)
            return pf_err(-EINVAL, "iresnet: stage %d has %d blocks of width %d", s + 1, layers[s], widths[s]);
    if (D < 1 || B < 1)
        return pf_err(-EINVAL, "iresnet: D %d, B %d must be positive", D, B);
    inet *n = calloc(1, sizeof *n);
    if (!n)
        return pf_err(-ENOMEM, "iresnet: out of memory");
    n->dev = dev;
    n->mem = mem;
    n->B = B;
    int rc = dev->ctx_create(&n->ctx);
    if (rc) {
        inet_free(n);
        return rc;
    }
    int x = new_act(n, 3, 112, 112);
    x = conv(n, x, widths[0], 3, 1, 1, "conv1");
    x = bn(n, x, "bn1", 0);
    x = prelu(n, x, "prelu");
    int inplanes = widths[0];
    for (int s = 0; s < 4; s++) {
        for (int i = 0; i < layers[s]; i++) {
            char p[48], q[64];
            int stride = i == 0 ? 2 : 1, planes = widths[s];
            snprintf(p, sizeof p, "layer%d.%d.", s + 1, i);
#define NM(suffix) (snprintf(q, sizeof q, "%s%s", p, suffix), q)
            int t = bn(n, x, NM("bn1"), 0);
            t = conv(n, t, planes, 3, 1, 1, NM("conv1"));
            t = bn(n, t, NM("bn2"), 0);
            t = prelu(n, t, NM("prelu"));
            t = conv(n, t, planes, 3, stride, 1, NM("conv2"));
            t = bn(n, t, NM("bn3"), 0);
            int sc = x;
            if (stride != 1 || inplanes != planes) {
                sc = conv(n, x, planes, 1, stride, 0, NM("downsample.0"));
                sc = bn(n, sc, NM("downsample.1"), 0);
            }
#undef NM
            x = add(n, t, sc);
            inplanes = planes;
            if (x < 0)
                break;
        }
    }
    x = bn(n, x, "bn2", 0);
    x = flatten(n, x);
    x = linear(n, x, D, "fc");
    x = bn(n, x, "features", 1);
    if (x < 0) {
        inet_free(n);
        return pf_err(-ENOMEM, "iresnet: building the layer list failed");
    }
    if (!(n->written = calloc((size_t)n->nacts, sizeof *n->written))) {
        inet_free(n);
        return pf_err(-ENOMEM, "iresnet: out of memory");
    }
    if ((rc = mem->alloc((void **)&n->params, n->npf * sizeof(float))) ||
        (rc = mem->alloc((void **)&n->grads, n->npf * sizeof(float))) ||
        (rc = mem->alloc((void **)&n->running, n->nrf * sizeof(float))) ||
        (rc = mem->alloc((void **)&n->stats, n->nstat * sizeof(double)))) {
        inet_free(n);
        return rc;
    }
    for (int t = 0; t < n->nacts; t++)
        if ((rc = mem->alloc((void **)&n->acts[t].x, act_n(n, t) * sizeof(float))) ||
            (rc = mem->alloc((void **)&n->acts[t].g, act_n(n, t) * sizeof(float)))) {
            inet_free(n);
            return pf_err_wrap(rc, "iresnet: activation %d", t);
        }
    if ((rc = mem->fill(n->params, 0.0f, n->npf)) || (rc = mem->fill(n->grads, 0.0f, n->npf)) ||
        (rc = mem->fill(n->running, 0.0f, n->nrf))) {
        inet_free(n);
        return rc;
    }
    for (int i = 0; i < n->nrun; i++) { /* PyTorch's initial running variance is 1 */
        size_t l = strlen(n->run[i].name);
        if (l > 12 && !strcmp(n->run[i].name + l - 12, ".running_var") &&
            (rc = mem->fill(n->running + n->run[i].offset, 1.0f, n->run[i].count))) {
            inet_free(n);
            return rc;
        }
    }
    *out = n;
    return 0;
}

int inet_num_params(const inet *n) { return n->npar; }
const inet_tensor *inet_param(const inet *n, int i) { return &n->par[i]; }
int inet_num_running(const inet *n) { return n->nrun; }
const inet_tensor *inet_running(const inet *n, int i) { return &n->run[i]; }
size_t inet_param_floats(const inet *n) { return n->npf; }
size_t inet_running_floats(const inet *n) { return n->nrf; }
float *inet_params(inet *n) { return n->params; }
float *inet_grads(inet *n) { return n->grads; }
float *inet_running_buf(inet *n) { return n->running; }

int inet_zero_grad(inet *n)
{
    return n->mem->fill(n->grads, 0.0f, n->npf);
}

int inet_forward(inet *n, const float *input, int train, const float **emb)
{
    const ops_device *d = n->dev;
    const int B = n->B;
    int rc = d->from_plain(n->ctx, n->acts[0].x, 0, input, B, 3, 112 * 112);
    for (int i = 0; i < n->nops && !rc; i++) {
        const op *o = &n->ops[i];
        const act *a = &n->acts[o->in], *y = &n->acts[o->out];
        int HW = a->H * a->W;
        switch (o->kind) {
        case OP_CONV:
            rc = d->conv_forward(n->ctx, y->x, a->x, n->params + o->w, &o->s);
            break;
        case OP_BN:
            rc = d->bn_forward(n->ctx, y->x, n->stats + o->stat, n->stats + o->stat + a->C, a->x,
                               n->params + o->w, n->params + o->b, n->running + o->rm,
                               n->running + o->rv, B, a->C, HW, BN_EPS, BN_MOMENTUM, train);
            break;
        case OP_PRELU:
            rc = d->prelu_forward(n->ctx, y->x, a->x, n->params + o->w, B, a->C, HW);
            break;
        case OP_ADD:
            rc = d->add_forward(n->ctx, y->x, a->x, n->acts[o->in2].x, act_n(n, o->out));
            break;
        case OP_FLATTEN:
            rc = d->to_plain(n->ctx, y->x, a->x, B, a->C, HW);
            break;
        case OP_LINEAR:
            rc = d->linear_forward(n->ctx, y->x, a->x, n->params + o->w, n->params + o->b, B, o->IN, o->OUT);
            break;
        }
        if (rc)
            return pf_err_wrap(rc, "iresnet forward, op %d", i);
    }
    if (rc)
        return rc;
    n->trained = train;
    *emb = n->acts[n->nacts - 1].x;
    return 0;
}

int inet_backward(inet *n, const float *grad_emb, float *grad_input)
{
    if (!n->trained)
        return pf_err(-EINVAL, "iresnet backward: no training forward before");
    const ops_device *d = n->dev;
    const int B = n->B;
    memset(n->written, 0, (size_t)n->nacts * sizeof *n->written);
    int last = n->nacts - 1;
    int rc = d->acc(n->ctx, n->acts[last].g, 0, grad_emb, act_n(n, last));
    n->written[last] = 1;
    for (int i = n->nops - 1; i >= 0 && !rc; i--) {
        const op *o = &n->ops[i];
        const act *a = &n->acts[o->in], *y = &n->acts[o->out];
        int HW = a->H * a->W;
        float *din = (o->in == 0 && !grad_input) ? NULL : a->g;
        int acc = n->written[o->in];
        switch (o->kind) {
        case OP_CONV:
            rc = d->conv_backward(n->ctx, din, acc, n->grads + o->w, y->g, a->x, n->params + o->w, &o->s);
            break;
        case OP_BN:
            rc = d->bn_backward(n->ctx, din, acc, o->fixed_w ? NULL : n->grads + o->w, n->grads + o->b,
                                y->g, a->x, n->params + o->w, n->stats + o->stat,
                                n->stats + o->stat + a->C, B, a->C, HW, BN_EPS);
            break;
        case OP_PRELU:
            rc = d->prelu_backward(n->ctx, din, acc, n->grads + o->w, y->g, a->x, n->params + o->w, B,
                                   a->C, HW);
            break;
        case OP_ADD:
            rc = d->acc(n->ctx, a->g, acc, y->g, act_n(n, o->out));
            if (!rc)
                rc = d->acc(n->ctx, n->acts[o->in2].g, n->written[o->in2], y->g, act_n(n, o->out));
            n->written[o->in2] = 1;
            break;
        case OP_FLATTEN:
            rc = d->from_plain(n->ctx, a->g, acc, y->g, B, a->C, HW);
            break;
        case OP_LINEAR:
            rc = d->linear_backward(n->ctx, din, acc, n->grads + o->w, n->grads + o->b, y->g, a->x,
                                    n->params + o->w, B, o->IN, o->OUT);
            break;
        }
        if (din)
            n->written[o->in] = 1;
        if (rc)
            return pf_err_wrap(rc, "iresnet backward, op %d", i);
    }
    if (rc)
        return rc;
    if (grad_input)
        return d->to_plain(n->ctx, grad_input, n->acts[0].g, B, 3, 112 * 112);
    return 0;
}

size_t inet_near_kink(inet *n, double rel)
{
    size_t count = 0;
    if (n->mem->sync && n->mem->sync())
        return (size_t)-1;
    for (int i = 0; i < n->nops; i++) {
        const op *o = &n->ops[i];
        if (o->kind != OP_PRELU)
            continue;
        size_t m = act_n(n, o->in);
        float *h = malloc(m * sizeof *h);
        if (!h || n->mem->d2h(h, n->acts[o->in].x, m * sizeof *h)) {
            free(h);
            return (size_t)-1;
        }
        double ss = 0;
        for (size_t j = 0; j < m; j++)
            ss += (double)h[j] * h[j];
        double thr = rel * sqrt(ss / (double)m);
        for (size_t j = 0; j < m; j++)
            count += fabs((double)h[j]) <= thr;
        free(h);
    }
    return count;
}
