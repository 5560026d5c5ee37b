/* CPU device: the backbone layers of kernels/ops.h on oneDNN (convolution),
 * OpenBLAS (Linear) and plain C (batch normalization, PReLU, add, dropout).
 *
 * Batch normalization is plain C with float64 statistics and sums (see bn_batch_stats for why
 * oneDNN 2.6's batch normalization is not used).
 * oneDNN primitives are created once per shape and kept in the context. Activations are kept in
 * the layout oneDNN's AVX2 convolutions use (nChw8c, see cpu_act_block); weights stay OIHW (the
 * PyTorch layout of the flat parameter array) and are reordered around each call, as is any
 * activation whose layout oneDNN would still pick differently (created with format `any`). */
#include "kernels/ops.h"

#include <cblas.h>
#include <math.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/splitmix64.h"
#include "kernels/conv_cache.h"
#include "kernels/cpu/optim_cpu.h"

#define DN(call)                                                                                             \
    do {                                                                                                     \
        dnnl_status_t st_ = (call);                                                                          \
        if (st_ != dnnl_success)                                                                             \
            return pf_err(-EIO, "oneDNN call %s failed (status %d)", #call, (int)st_);                       \
    } while (0)

/* A primitive argument: the caller's plain buffer (user) and, when oneDNN chose another layout,
 * a library-allocated buffer in that layout plus the reorder between the two. */
typedef struct slot {
    dnnl_memory_t user;
    dnnl_memory_t prim; /* == user when the layouts agree */
    dnnl_primitive_t reorder;
} slot;

typedef struct conv_entry {
    ops_conv_shape s;
    dnnl_primitive_desc_t fwd_pd;
    dnnl_primitive_t fwd, bwd_data, bwd_w;
    slot f_src, f_wei, f_dst;
    slot d_dsrc, d_wei, d_ddst;
    slot w_src, w_dwei, w_ddst;
} conv_entry;

struct ops_ctx {
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    conv_cache conv;
    float *scratch; /* for accumulating outputs of libraries that overwrite */
    size_t scratch_cap;
};

/* The context's scratch buffer, grown to n floats (NULL when out of memory). */
static float *scratch(ops_ctx *c, float **buf, size_t *cap, size_t n)
{
    if (n > *cap) {
        free(*buf);
        *buf = aligned_alloc(64, ((n * sizeof(float) + 63) / 64) * 64);
        *cap = *buf ? n : 0;
    }
    (void)c;
    return *buf;
}

static void add_into(float *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
}

static int exec(ops_ctx *c, dnnl_primitive_t p, int nargs, const dnnl_exec_arg_t *args)
{
    DN(dnnl_primitive_execute(p, c->stream, nargs, args));
    return 0;
}

static int slot_make(ops_ctx *c, slot *s, const dnnl_memory_desc_t *umd, const dnnl_memory_desc_t *pmd,
                     int output)
{
    DN(dnnl_memory_create(&s->user, umd, c->eng, DNNL_MEMORY_NONE));
    if (dnnl_memory_desc_equal(umd, pmd)) {
        s->prim = s->user;
        s->reorder = NULL;
        return 0;
    }
    DN(dnnl_memory_create(&s->prim, pmd, c->eng, DNNL_MEMORY_ALLOCATE));
    dnnl_primitive_desc_t rpd;
    if (output)
        DN(dnnl_reorder_primitive_desc_create(&rpd, pmd, c->eng, umd, c->eng, NULL));
    else
        DN(dnnl_reorder_primitive_desc_create(&rpd, umd, c->eng, pmd, c->eng, NULL));
    dnnl_status_t st = dnnl_primitive_create(&s->reorder, rpd);
    dnnl_primitive_desc_destroy(rpd);
    DN(st);
    return 0;
}

static void slot_free(slot *s)
{
    if (s->reorder)
        dnnl_primitive_destroy(s->reorder);
    if (s->prim && s->prim != s->user)
        dnnl_memory_destroy(s->prim);
    if (s->user)
        dnnl_memory_destroy(s->user);
    memset(s, 0, sizeof *s);
}

/* Binds the caller's buffer; for an input, converts it into the primitive's layout. */
static int slot_in(ops_ctx *c, slot *s, const void *p)
{
    DN(dnnl_memory_set_data_handle(s->user, (void *)p));
    if (s->reorder) {
        dnnl_exec_arg_t a[2] = {{DNNL_ARG_FROM, s->user}, {DNNL_ARG_TO, s->prim}};
        return exec(c, s->reorder, 2, a);
    }
    return 0;
}

static int slot_bind(slot *s, void *p)
{
    DN(dnnl_memory_set_data_handle(s->user, p));
    return 0;
}

/* After the primitive ran: converts an output from the primitive's layout to the caller's. */
static int slot_out(ops_ctx *c, slot *s)
{
    if (s->reorder) {
        dnnl_exec_arg_t a[2] = {{DNNL_ARG_FROM, s->prim}, {DNNL_ARG_TO, s->user}};
        return exec(c, s->reorder, 2, a);
    }
    return 0;
}

static int cpu_act_block(int C);

static void conv_mds(const ops_conv_shape *s, dnnl_memory_desc_t *src, dnnl_memory_desc_t *wei,
                     dnnl_memory_desc_t *dst, int any)
{
    dnnl_dims_t sd = {s->B, s->C, s->H, s->W};
    dnnl_dims_t dd = {s->B, s->OC, s->OH, s->OW};
    dnnl_format_tag_t ts = any ? dnnl_format_tag_any : cpu_act_block(s->C) == 8 ? dnnl_aBcd8b : dnnl_nchw;
    dnnl_format_tag_t td = any ? dnnl_format_tag_any : cpu_act_block(s->OC) == 8 ? dnnl_aBcd8b : dnnl_nchw;
    dnnl_memory_desc_init_by_tag(src, 4, sd, dnnl_f32, ts);
    dnnl_memory_desc_init_by_tag(dst, 4, dd, dnnl_f32, td);
    if (s->groups == 1) {
        dnnl_dims_t wd = {s->OC, s->C, s->K, s->K};
        dnnl_memory_desc_init_by_tag(wei, 4, wd, dnnl_f32, any ? dnnl_format_tag_any : dnnl_oihw);
    } else {
        int g = s->groups;
        dnnl_dims_t wd = {g, s->OC / g, s->C / g, s->K, s->K};
        dnnl_memory_desc_init_by_tag(wei, 5, wd, dnnl_f32, any ? dnnl_format_tag_any : dnnl_goihw);
    }
}

/* A convolution's memory descriptors, in the plain layouts (u: the caller's) and in "any" layout (a: oneDNN
 * picks), and its strides and paddings; the right padding makes the output size exactly OH x OW (PyTorch
 * drops the remainder). */
typedef struct conv_geom {
    dnnl_memory_desc_t su, wu, du, sa, wa, da;
    dnnl_dims_t strides, pad, padr;
} conv_geom;

static void conv_geom_of(const ops_conv_shape *s, conv_geom *g)
{
    conv_mds(s, &g->su, &g->wu, &g->du, 0);
    conv_mds(s, &g->sa, &g->wa, &g->da, 1);
    g->strides[0] = g->strides[1] = s->stride;
    g->pad[0] = g->pad[1] = s->pad;
    g->padr[0] = (s->OH - 1) * s->stride + s->K - s->H - s->pad;
    g->padr[1] = (s->OW - 1) * s->stride + s->K - s->W - s->pad;
}

/* Releases what conv_build_fwd/bwd made (conv_cache_fns.release). */
static void conv_entry_release(void *entry)
{
    conv_entry *e = entry;
    slot *slots[] = {&e->f_src,  &e->f_wei, &e->f_dst,  &e->d_dsrc, &e->d_wei,
                     &e->d_ddst, &e->w_src, &e->w_dwei, &e->w_ddst};
    for (size_t i = 0; i < sizeof slots / sizeof *slots; i++)
        slot_free(slots[i]);
    if (e->fwd)
        dnnl_primitive_destroy(e->fwd);
    if (e->bwd_data)
        dnnl_primitive_destroy(e->bwd_data);
    if (e->bwd_w)
        dnnl_primitive_destroy(e->bwd_w);
    if (e->fwd_pd)
        dnnl_primitive_desc_destroy(e->fwd_pd);
}

#define QMD(pd, what) dnnl_primitive_desc_query_md((pd), (what), 0)

static int conv_build_fwd(void *dev, void *entry, const ops_conv_shape *shape)
{
    ops_ctx *c = dev;
    conv_entry *e = entry;
    e->s = *shape;
    conv_geom g;
    conv_geom_of(&e->s, &g);
    dnnl_convolution_desc_t cd;
    DN(dnnl_convolution_forward_desc_init(&cd, dnnl_forward_training, dnnl_convolution_direct, &g.sa, &g.wa,
                                          NULL, &g.da, g.strides, g.pad, g.padr));
    DN(dnnl_primitive_desc_create(&e->fwd_pd, &cd, NULL, c->eng, NULL));
    DN(dnnl_primitive_create(&e->fwd, e->fwd_pd));
    int rc;
    if ((rc = slot_make(c, &e->f_src, &g.su, QMD(e->fwd_pd, dnnl_query_src_md), 0)) ||
        (rc = slot_make(c, &e->f_wei, &g.wu, QMD(e->fwd_pd, dnnl_query_weights_md), 0)) ||
        (rc = slot_make(c, &e->f_dst, &g.du, QMD(e->fwd_pd, dnnl_query_dst_md), 1)))
        return rc;
    return 0;
}

static int conv_build_bwd(void *dev, void *entry)
{
    ops_ctx *c = dev;
    conv_entry *e = entry;
    conv_geom g;
    conv_geom_of(&e->s, &g);
    dnnl_convolution_desc_t cd;
    dnnl_primitive_desc_t pd;
    int rc;

    DN(dnnl_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, &g.sa, &g.wa, &g.da, g.strides,
                                                g.pad, g.padr));
    DN(dnnl_primitive_desc_create(&pd, &cd, NULL, c->eng, e->fwd_pd));
    dnnl_status_t st = dnnl_primitive_create(&e->bwd_data, pd);
    if (st == dnnl_success && !(rc = slot_make(c, &e->d_dsrc, &g.su, QMD(pd, dnnl_query_diff_src_md), 1)) &&
        !(rc = slot_make(c, &e->d_wei, &g.wu, QMD(pd, dnnl_query_weights_md), 0)))
        rc = slot_make(c, &e->d_ddst, &g.du, QMD(pd, dnnl_query_diff_dst_md), 0);
    else if (st != dnnl_success)
        rc = pf_err(-EIO, "oneDNN convolution backward-data primitive: status %d", (int)st);
    dnnl_primitive_desc_destroy(pd);
    if (rc)
        return rc;

    DN(dnnl_convolution_backward_weights_desc_init(&cd, dnnl_convolution_direct, &g.sa, &g.wa, NULL, &g.da,
                                                   g.strides, g.pad, g.padr));
    DN(dnnl_primitive_desc_create(&pd, &cd, NULL, c->eng, e->fwd_pd));
    st = dnnl_primitive_create(&e->bwd_w, pd);
    if (st == dnnl_success && !(rc = slot_make(c, &e->w_src, &g.su, QMD(pd, dnnl_query_src_md), 0)) &&
        !(rc = slot_make(c, &e->w_dwei, &g.wu, QMD(pd, dnnl_query_diff_weights_md), 1)))
        rc = slot_make(c, &e->w_ddst, &g.du, QMD(pd, dnnl_query_diff_dst_md), 0);
    else if (st != dnnl_success)
        rc = pf_err(-EIO, "oneDNN convolution backward-weights primitive: status %d", (int)st);
    dnnl_primitive_desc_destroy(pd);
    return rc;
}

static const conv_cache_fns conv_fns = {
    .entry_size = sizeof(conv_entry),
    .build_fwd = conv_build_fwd,
    .build_bwd = conv_build_bwd,
    .release = conv_entry_release,
    .what = "conv",
};

static int conv_get(ops_ctx *c, const ops_conv_shape *s, int need_bwd, conv_entry **out)
{
    void *e = NULL;
    int rc = conv_cache_get(&c->conv, &conv_fns, c, s, need_bwd, &e);
    *out = e;
    return rc;
}

/* Runs one of a convolution's primitives on two inputs and one output, each through its slot (slot_in
 * reorders a caller's array into the primitive's layout when they differ, slot_out reorders the result
 * back into dst), then waits for the stream. a0, a1, ao: the DNNL_ARG_* of each. */
static int conv_run(ops_ctx *c, dnnl_primitive_t prim, slot *s0, int a0, const float *x0, slot *s1, int a1,
                    const float *x1, slot *so, int ao, float *dst)
{
    int rc;
    if ((rc = slot_in(c, s0, x0)) || (rc = slot_in(c, s1, x1)) || (rc = slot_bind(so, dst)))
        return rc;
    dnnl_exec_arg_t a[3] = {{a0, s0->prim}, {a1, s1->prim}, {ao, so->prim}};
    if ((rc = exec(c, prim, 3, a)) || (rc = slot_out(c, so)))
        return rc;
    DN(dnnl_stream_wait(c->stream));
    return 0;
}

static int cpu_conv_forward(ops_ctx *c, float *out, const float *inp, const float *weight,
                            const ops_conv_shape *s)
{
    conv_entry *e = NULL;
    int rc = conv_get(c, s, 0, &e);
    if (rc)
        return rc;
    return conv_run(c, e->fwd, &e->f_src, DNNL_ARG_SRC, inp, &e->f_wei, DNNL_ARG_WEIGHTS, weight, &e->f_dst,
                    DNNL_ARG_DST, out);
}

static int cpu_conv_backward(ops_ctx *c, float *dinp, int acc, float *dweight, const float *dout,
                             const float *inp, const float *weight, const ops_conv_shape *s)
{
    conv_entry *e = NULL;
    int rc = conv_get(c, s, 1, &e);
    if (rc)
        return rc;
    if (dinp) {
        size_t n = (size_t)s->B * s->C * s->H * s->W;
        float *dst = dinp;
        if (acc && !(dst = scratch(c, &c->scratch, &c->scratch_cap, n)))
            return pf_err(-ENOMEM, "conv backward: out of memory for %zu floats", n);
        if ((rc = conv_run(c, e->bwd_data, &e->d_ddst, DNNL_ARG_DIFF_DST, dout, &e->d_wei, DNNL_ARG_WEIGHTS,
                           weight, &e->d_dsrc, DNNL_ARG_DIFF_SRC, dst)))
            return rc;
        if (acc)
            add_into(dinp, dst, n);
    }
    if (dweight) {
        size_t n = (size_t)s->OC * (s->C / s->groups) * s->K * s->K;
        float *dst = scratch(c, &c->scratch, &c->scratch_cap, n);
        if (!dst)
            return pf_err(-ENOMEM, "conv backward: out of memory for %zu floats", n);
        if ((rc = conv_run(c, e->bwd_w, &e->w_ddst, DNNL_ARG_DIFF_DST, dout, &e->w_src, DNNL_ARG_SRC, inp,
                           &e->w_dwei, DNNL_ARG_DIFF_WEIGHTS, dst)))
            return rc;
        add_into(dweight, dst, n);
    }
    return 0;
}

/* ---- batch normalization ---- */

/* ---- activation layout ----
 * The CPU device keeps an activation (B,C,H,W) with C % 8 == 0 in oneDNN's nChw8c layout
 * ((B, C/8, H, W, 8): element (b,c,hw) at ((b*C/8 + c/8)*HW + hw)*8 + c%8), the layout its AVX2
 * convolutions compute in, so that no reorder runs around any convolution; other activations
 * (the 3-channel input) are plain NCHW. With HW = 1 both layouts are the same. */
static int cpu_act_block(int C)
{
    return C % 8 == 0 ? 8 : 1;
}

static int cpu_to_plain(ops_ctx *c, float *dst, const float *src, int B, int C, int HW)
{
    (void)c;
    int bs = cpu_act_block(C), nb = C / bs;
    if (bs == 1 || HW == 1) {
        if (dst != src)
            memcpy(dst, src, (size_t)B * C * HW * sizeof(float));
        return 0;
    }
#pragma omp parallel for schedule(static)
    for (int bc = 0; bc < B * nb; bc++) {
        const float *p = src + (size_t)bc * HW * bs;
        float *q = dst + (size_t)bc * HW * bs; /* channel block cb of sample b, plain */
        for (int hw = 0; hw < HW; hw++)
            for (int l = 0; l < bs; l++)
                q[(size_t)l * HW + hw] = p[(size_t)hw * bs + l];
    }
    return 0;
}

static int cpu_from_plain(ops_ctx *c, float *dst, int acc, const float *src, int B, int C, int HW)
{
    (void)c;
    int bs = cpu_act_block(C), nb = C / bs;
    if (bs == 1 || HW == 1) {
        size_t n = (size_t)B * C * HW;
        if (acc)
            add_into(dst, src, n);
        else if (dst != src)
            memcpy(dst, src, n * sizeof(float));
        return 0;
    }
#pragma omp parallel for schedule(static)
    for (int bc = 0; bc < B * nb; bc++) {
        const float *q = src + (size_t)bc * HW * bs;
        float *p = dst + (size_t)bc * HW * bs;
        for (int hw = 0; hw < HW; hw++)
            for (int l = 0; l < bs; l++)
                p[(size_t)hw * bs + l] = (acc ? p[(size_t)hw * bs + l] : 0.0f) + q[(size_t)l * HW + hw];
    }
    return 0;
}

/* The per-channel kernels below (batch norm, PReLU) work on one channel block of bs lanes at a
 * time (cpu_act_block: 8 in nChw8c, 1 in NCHW). Each block body is inlined with bs a constant
 * (BLOCKED picks 8 or 1), so that the lane loops unroll and the per-lane float64 sums stay in
 * registers; each lane's sum still adds its terms in the same order (over b, then hw), so the
 * results do not depend on the lane count. */
#define BLOCK_INLINE static inline __attribute__((always_inline))
#define BLOCKED(bs, body)                                                                                    \
    do {                                                                                                     \
        if ((bs) == 8) {                                                                                     \
            enum { BS = 8 };                                                                                 \
            body;                                                                                            \
        } else {                                                                                             \
            enum { BS = 1 };                                                                                 \
            body;                                                                                            \
        }                                                                                                    \
    } while (0)

/* Mean and biased variance of channel block cb (bs lanes) of inp (B, nb blocks, HW, bs). */
BLOCK_INLINE void bn_stats_block(double *mean, double *var, const float *inp, int B, int nb, int cb, int HW,
                                 const int bs)
{
    const double n = (double)B * HW;
    double s[8] = {0}, s2[8] = {0}, mu[8];
    for (int b = 0; b < B; b++) {
        const float *x = inp + ((size_t)b * nb + cb) * HW * bs;
        for (int hw = 0; hw < HW; hw++)
            for (int l = 0; l < bs; l++)
                s[l] += x[(size_t)hw * bs + l];
    }
    for (int l = 0; l < bs; l++)
        mu[l] = s[l] / n;
    for (int b = 0; b < B; b++) {
        const float *x = inp + ((size_t)b * nb + cb) * HW * bs;
        for (int hw = 0; hw < HW; hw++)
            for (int l = 0; l < bs; l++) {
                double d = (double)x[(size_t)hw * bs + l] - mu[l];
                s2[l] += d * d;
            }
    }
    for (int l = 0; l < bs; l++) {
        mean[cb * bs + l] = mu[l];
        var[cb * bs + l] = s2[l] / n;
    }
}

/* Per-channel batch mean and biased variance of inp (B,C,HW) (device layout), two passes in
 * float64. oneDNN 2.6's training-mode batch norm sums in float32: on 112x112 maps its statistics
 * are off by ~1e-6 relative, enough to move activations across PReLU kinks and to put the
 * network gradients 1e-3 away from PyTorch float64. Exact sums keep them within ~1e-5. */
static void bn_batch_stats(double *mean, double *var, const float *inp, int B, int C, int HW)
{
    const int bs = cpu_act_block(C), nb = C / bs;
#pragma omp parallel for schedule(static)
    for (int cb = 0; cb < nb; cb++)
        BLOCKED(bs, bn_stats_block(mean, var, inp, B, nb, cb, HW, BS));
}

/* out = (x - mean)*k + q on channel block cb (bs lanes), k and q per lane. */
BLOCK_INLINE void bn_affine_block(float *out, const float *inp, const double *mean, const double *k,
                                  const double *q, int B, int nb, int cb, int HW, const int bs)
{
    for (int b = 0; b < B; b++) {
        const float *x = inp + ((size_t)b * nb + cb) * HW * bs;
        float *y = out + ((size_t)b * nb + cb) * HW * bs;
        for (int hw = 0; hw < HW; hw++)
            for (int l = 0; l < bs; l++)
                y[(size_t)hw * bs + l] = (float)(((double)x[(size_t)hw * bs + l] - mean[l]) * k[l] + q[l]);
    }
}

/* Batch-norm forward in plain C: float64 statistics (bn_batch_stats), then per channel
 * out = (x - mean)*k + bias with k = weight/sqrt(var+eps), in float64 so that outputs near 0
 * (PReLU's kink follows) carry no cancellation error. */
static int cpu_bn_forward(ops_ctx *c, float *out, double *save_mean, double *save_var, const float *inp,
                          const float *weight, const float *bias, float *running_mean, float *running_var,
                          int B, int C, int HW, float eps, float momentum, int train)
{
    (void)c;
    if (B <= 0 || C <= 0 || HW <= 0)
        return pf_err(-EINVAL, "batchnorm shape B=%d C=%d HW=%d: sizes must be positive", B, C, HW);
    if (train && (!save_mean || !save_var))
        return pf_err(-EINVAL, "batchnorm training forward needs save_mean and save_var");
    if (!train && (!running_mean || !running_var))
        return pf_err(-EINVAL, "batchnorm eval forward needs running statistics");
    if (train)
        bn_batch_stats(save_mean, save_var, inp, B, C, HW);
    const int bs = cpu_act_block(C), nb = C / bs;
#pragma omp parallel for schedule(static)
    for (int cb = 0; cb < nb; cb++) {
        double mean[8], k[8], q[8];
        for (int l = 0; l < bs; l++) {
            int ch = cb * bs + l;
            mean[l] = train ? save_mean[ch] : running_mean[ch];
            double var = train ? save_var[ch] : running_var[ch];
            k[l] = (double)weight[ch] / sqrt(var + (double)eps);
            q[l] = bias[ch];
        }
        BLOCKED(bs, bn_affine_block(out, inp, mean, k, q, B, nb, cb, HW, BS));
    }
    if (train && running_mean && running_var) {
        double n = (double)B * HW;
        double unbias = n > 1 ? n / (n - 1) : 1.0;
        for (int i = 0; i < C; i++) {
            running_mean[i] = (float)((1.0 - momentum) * running_mean[i] + momentum * save_mean[i]);
            running_var[i] = (float)((1.0 - momentum) * running_var[i] + momentum * save_var[i] * unbias);
        }
    }
    return 0;
}

/* Per-lane sums of dy and dy*(x - mean) over channel block cb (bs lanes). */
BLOCK_INLINE void bn_grad_sums_block(double *sdy, double *sdyx, const float *dout, const float *inp,
                                     const double *mean, int B, int nb, int cb, int HW, const int bs)
{
    double a[8] = {0}, ax[8] = {0};
    for (int b = 0; b < B; b++) {
        const float *x = inp + ((size_t)b * nb + cb) * HW * bs;
        const float *dy = dout + ((size_t)b * nb + cb) * HW * bs;
        for (int hw = 0; hw < HW; hw++)
            for (int l = 0; l < bs; l++) {
                size_t o = (size_t)hw * bs + l;
                a[l] += dy[o];
                ax[l] += (double)dy[o] * ((double)x[o] - mean[l]);
            }
    }
    for (int l = 0; l < bs; l++) {
        sdy[l] = a[l];
        sdyx[l] = ax[l];
    }
}

/* dx (+)= k*(dy - mdy - (x - mean)*kx) on channel block cb (bs lanes). */
BLOCK_INLINE void bn_dx_block(float *dinp, int acc, const float *dout, const float *inp, const double *mean,
                              const double *k, const double *mdy, const double *kx, int B, int nb, int cb,
                              int HW, const int bs)
{
    for (int b = 0; b < B; b++) {
        const float *x = inp + ((size_t)b * nb + cb) * HW * bs;
        const float *dy = dout + ((size_t)b * nb + cb) * HW * bs;
        float *dx = dinp + ((size_t)b * nb + cb) * HW * bs;
        for (int hw = 0; hw < HW; hw++)
            for (int l = 0; l < bs; l++) {
                size_t o = (size_t)hw * bs + l;
                float v = (float)(k[l] * ((double)dy[o] - mdy[l] - ((double)x[o] - mean[l]) * kx[l]));
                dx[o] = acc ? dx[o] + v : v;
            }
    }
}

/* Batch-norm backward in plain C with float64 per-channel sums. oneDNN 2.6's backward sums
 * diff_dst in float32, which loses ~1e-3 relative on 112x112 maps where the terms cancel.
 * Same math as PyTorch: dbias = sum dy, dweight = sum dy*xhat,
 * dx = weight*rstd*(dy - dbias/n - xhat*dweight/n), evaluated in float64: with few samples per
 * channel (BatchNorm1d on a small batch) the three terms nearly cancel (for n = 2 the result
 * scales with eps/(var+eps)). */
static int cpu_bn_backward(ops_ctx *c, float *dinp, int acc, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, const double *save_mean,
                           const double *save_var, int B, int C, int HW, float eps)
{
    (void)c;
    if (B <= 0 || C <= 0 || HW <= 0)
        return pf_err(-EINVAL, "batchnorm shape B=%d C=%d HW=%d: sizes must be positive", B, C, HW);
    const double n = (double)B * HW;
    const int bs = cpu_act_block(C), nb = C / bs;
#pragma omp parallel for schedule(static)
    for (int cb = 0; cb < nb; cb++) {
        double mean[8], rstd[8], sdy[8], sdyx[8], k[8], mdy[8], kx[8];
        for (int l = 0; l < bs; l++) {
            mean[l] = save_mean[cb * bs + l];
            rstd[l] = 1.0 / sqrt(save_var[cb * bs + l] + (double)eps);
        }
        BLOCKED(bs, bn_grad_sums_block(sdy, sdyx, dout, inp, mean, B, nb, cb, HW, BS));
        for (int l = 0; l < bs; l++) {
            int ch = cb * bs + l;
            sdyx[l] *= rstd[l]; /* sum dy * xhat */
            if (dbias)
                dbias[ch] += (float)sdy[l];
            if (dweight)
                dweight[ch] += (float)sdyx[l];
            k[l] = (double)weight[ch] * rstd[l];
            mdy[l] = sdy[l] / n;
            kx[l] = rstd[l] * (sdyx[l] / n);
        }
        if (dinp)
            BLOCKED(bs, bn_dx_block(dinp, acc, dout, inp, mean, k, mdy, kx, B, nb, cb, HW, BS));
    }
    return 0;
}

/* ---- plain C layers ---- */

/* PReLU of one (sample, channel block) plane x (HW, bs) into y, slopes a per lane. */
BLOCK_INLINE void prelu_block(float *y, const float *x, const float *a, int HW, const int bs)
{
    for (int hw = 0; hw < HW; hw++)
        for (int l = 0; l < bs; l++) {
            float v = x[(size_t)hw * bs + l];
            y[(size_t)hw * bs + l] = v > 0.0f ? v : a[l] * v;
        }
}

static int cpu_prelu_forward(ops_ctx *c, float *out, const float *inp, const float *alpha, int B, int C,
                             int HW)
{
    (void)c;
    const int bs = cpu_act_block(C), nb = C / bs;
#pragma omp parallel for schedule(static)
    for (int bc = 0; bc < B * nb; bc++) {
        const int cb = bc % nb;
        BLOCKED(bs,
                prelu_block(out + (size_t)bc * HW * bs, inp + (size_t)bc * HW * bs, alpha + cb * bs, HW, BS));
    }
    return 0;
}

/* PReLU backward on one (sample, channel block) plane: dinp (+)= dy or a*dy (if dinp), and s[l] =
 * the float32 sum over the plane of dy*x where x <= 0 (the slope gradient). */
BLOCK_INLINE void prelu_grad_block(float *dinp, int acc, float *s, const float *x, const float *g,
                                   const float *a, int HW, const int bs)
{
    float t[8] = {0};
    for (int hw = 0; hw < HW; hw++)
        for (int l = 0; l < bs; l++) {
            size_t o = (size_t)hw * bs + l;
            float d = x[o] > 0.0f ? g[o] : a[l] * g[o];
            t[l] += x[o] > 0.0f ? 0.0f : g[o] * x[o];
            if (dinp)
                dinp[o] = acc ? dinp[o] + d : d;
        }
    for (int l = 0; l < bs; l++)
        s[l] = t[l];
}

static int cpu_prelu_backward(ops_ctx *c, float *dinp, int acc, float *dalpha, const float *dout,
                              const float *inp, const float *alpha, int B, int C, int HW)
{
    (void)c;
    const int bs = cpu_act_block(C), nb = C / bs;
#pragma omp parallel for schedule(static)
    for (int cb = 0; cb < nb; cb++) {
        double da[8] = {0};
        for (int b = 0; b < B; b++) {
            size_t base = ((size_t)b * nb + cb) * HW * bs;
            float s[8];
            BLOCKED(bs, prelu_grad_block(dinp ? dinp + base : NULL, acc, s, inp + base, dout + base,
                                         alpha + cb * bs, HW, BS));
            for (int l = 0; l < bs; l++)
                da[l] += s[l];
        }
        if (dalpha)
            for (int l = 0; l < bs; l++)
                dalpha[cb * bs + l] += (float)da[l];
    }
    return 0;
}

static int cpu_linear_forward(ops_ctx *c, float *out, const float *inp, const float *weight,
                              const float *bias, int B, int IN, int OUT)
{
    (void)c;
    if (B <= 0 || IN <= 0 || OUT <= 0)
        return pf_err(-EINVAL, "linear shape B=%d IN=%d OUT=%d: sizes must be positive", B, IN, OUT);
    if (bias) {
        for (int b = 0; b < B; b++)
            memcpy(out + (size_t)b * OUT, bias, (size_t)OUT * sizeof(float));
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, OUT, IN, 1.0f, inp, IN, weight, IN,
                bias ? 1.0f : 0.0f, out, OUT);
    return 0;
}

static int cpu_linear_backward(ops_ctx *c, float *dinp, int acc, float *dweight, float *dbias,
                               const float *dout, const float *inp, const float *weight, int B, int IN,
                               int OUT)
{
    (void)c;
    if (B <= 0 || IN <= 0 || OUT <= 0)
        return pf_err(-EINVAL, "linear shape B=%d IN=%d OUT=%d: sizes must be positive", B, IN, OUT);
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, IN, OUT, 1.0f, dout, OUT, weight, IN,
                    acc ? 1.0f : 0.0f, dinp, IN);
    if (dweight)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OUT, IN, B, 1.0f, dout, OUT, inp, IN, 1.0f,
                    dweight, IN);
    if (dbias)
        for (int b = 0; b < B; b++)
            add_into(dbias, dout + (size_t)b * OUT, (size_t)OUT);
    return 0;
}

static int cpu_add_forward(ops_ctx *c, float *out, const float *a, const float *b, size_t n)
{
    (void)c;
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
    return 0;
}

static int cpu_acc(ops_ctx *c, float *dst, int acc, const float *src, size_t n)
{
    (void)c;
    if (acc)
        add_into(dst, src, n);
    else if (dst != src)
        memmove(dst, src, n * sizeof(float));
    return 0;
}

/* Mask i is drawn by splitmix64 (common/splitmix64.h) from (seed, i) only, the draw the CUDA
 * devices make too. */
static int cpu_dropout_forward(ops_ctx *c, float *out, float *mask, const float *inp, size_t n, float p,
                               uint64_t seed)
{
    (void)c;
    if (!(p >= 0.0f && p < 1.0f))
        return pf_err(-EINVAL, "dropout p=%g outside [0, 1)", (double)p);
    float keep = 1.0f / (1.0f - p);
    for (size_t i = 0; i < n; i++) {
        double u = (double)(splitmix64(seed * 0x100000001B3ull + i) >> 11) * 0x1.0p-53;
        mask[i] = u < (double)p ? 0.0f : keep;
        out[i] = inp[i] * mask[i];
    }
    return 0;
}

static int cpu_dropout_backward(ops_ctx *c, float *dinp, int acc, const float *dout, const float *mask,
                                size_t n)
{
    (void)c;
    for (size_t i = 0; i < n; i++) {
        float d = dout[i] * mask[i];
        dinp[i] = acc ? dinp[i] + d : d;
    }
    return 0;
}

static void cpu_ctx_destroy(ops_ctx *c)
{
    if (!c)
        return;
    conv_cache_clear(&c->conv, &conv_fns);
    free(c->scratch);
    if (c->stream)
        dnnl_stream_destroy(c->stream);
    if (c->eng)
        dnnl_engine_destroy(c->eng);
    free(c);
}

static int cpu_ctx_create(ops_ctx **out)
{
    ops_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return pf_err(-ENOMEM, "ops context: out of memory");
    dnnl_status_t st = dnnl_engine_create(&c->eng, dnnl_cpu, 0);
    if (st == dnnl_success)
        st = dnnl_stream_create(&c->stream, c->eng, dnnl_stream_default_flags);
    if (st != dnnl_success) {
        cpu_ctx_destroy(c);
        return pf_err(-EIO, "oneDNN CPU engine/stream creation failed (status %d)", (int)st);
    }
    *out = c;
    return 0;
}

/* ---- memory, optimizer and gradient utilities (host memory) ---- */

static int cpu_mem_alloc(ops_ctx *c, void **p, size_t bytes)
{
    (void)c;
    *p = calloc(1, bytes ? bytes : 1);
    if (!*p)
        return pf_err(-ENOMEM, "cpu device: out of memory for %zu bytes", bytes);
    return 0;
}

static void cpu_mem_free(ops_ctx *c, void *p)
{
    (void)c;
    free(p);
}

static int cpu_mem_copy(ops_ctx *c, void *dst, const void *src, size_t bytes)
{
    (void)c;
    if (bytes && dst != src)
        memmove(dst, src, bytes);
    return 0;
}

static int cpu_mem_zero(ops_ctx *c, void *p, size_t bytes)
{
    (void)c;
    if (bytes)
        memset(p, 0, bytes);
    return 0;
}

static int cpu_sync(ops_ctx *c)
{
    (void)c;
    return 0;
}

static int cpu_sgd_step(ops_ctx *c, float *w, const float *grad, float *mom, size_t n, float lr,
                        float momentum, float weight_decay)
{
    (void)c;
    optim_cpu_sgd(w, grad, mom, n, lr, momentum, weight_decay);
    return 0;
}

static int cpu_adamw_step(ops_ctx *c, float *w, const float *grad, float *m, float *v, size_t n, double lr,
                          double beta1, double beta2, double eps, double weight_decay, int64_t step)
{
    (void)c;
    if (step < 1)
        return pf_err(-EINVAL, "adamw: step %lld must be >= 1", (long long)step);
    optim_cpu_adamw(w, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, step);
    return 0;
}

static int cpu_scale(ops_ctx *c, float *x, size_t n, float a)
{
    (void)c;
    optim_cpu_scale(x, n, a);
    return 0;
}

static int cpu_sumsq(ops_ctx *c, const float *x, size_t n, double *host_out)
{
    (void)c;
    *host_out = optim_cpu_sumsq(0.0, x, n);
    return 0;
}

const ops_device ops_cpu = {
    .name = "cpu",
    .ctx_create = cpu_ctx_create,
    .ctx_destroy = cpu_ctx_destroy,
    .conv_forward = cpu_conv_forward,
    .conv_backward = cpu_conv_backward,
    .bn_forward = cpu_bn_forward,
    .bn_backward = cpu_bn_backward,
    .prelu_forward = cpu_prelu_forward,
    .prelu_backward = cpu_prelu_backward,
    .linear_forward = cpu_linear_forward,
    .linear_backward = cpu_linear_backward,
    .add_forward = cpu_add_forward,
    .acc = cpu_acc,
    .act_block = cpu_act_block,
    .to_plain = cpu_to_plain,
    .from_plain = cpu_from_plain,
    .dropout_forward = cpu_dropout_forward,
    .dropout_backward = cpu_dropout_backward,
    .act_bytes = 4,
    .plain = NULL,
    .mem_alloc = cpu_mem_alloc,
    .mem_free = cpu_mem_free,
    .mem_h2d = cpu_mem_copy,
    .mem_d2h = cpu_mem_copy,
    .mem_d2d = cpu_mem_copy,
    .mem_zero = cpu_mem_zero,
    .sync = cpu_sync,
    .sgd_step = cpu_sgd_step,
    .adamw_step = cpu_adamw_step,
    .scale = cpu_scale,
    .sumsq = cpu_sumsq,
};
