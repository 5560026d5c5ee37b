/* Debugging device "cpu-bf16" (kernels/ops.h, act_bytes = 2): the mixed-precision contract on the
 * CPU, so that CPU-only CI exercises the model's half-precision plumbing and the loop's loss
 * scaling. Correctness over speed.
 *
 * Body activations (conv, BatchNorm2d, PReLU, add inputs/outputs and their gradients) are stored as
 * bfloat16 (the upper 16 bits of an IEEE float32; uint16_t elements behind the float * pointers).
 * Layout: the same as the CPU device's (act_block = ops_cpu.act_block: oneDNN nChw8c when 8
 * divides C, else NCHW), element for element, so conversions are elementwise and each body op
 * is: convert its bf16 inputs to fp32 scratch, call ops_cpu on them, round each output once to
 * bf16 (round to nearest, ties to even; NaN stays NaN). Accumulating outputs (acc != 0) convert
 * the destination to fp32 first, let ops_cpu add in fp32, and round the sum once.
 * Like torch.autocast (and the CUDA half devices), convolution weights are rounded to bf16 before
 * the convolution, and the convolution's weight gradient is produced in bf16 (rounded) and then
 * added in fp32 into the fp32 dweight. BN weight/bias/statistics and PReLU slopes stay fp32 (the
 * BN and PReLU math is ops_cpu's: float64 BN sums, fp32 PReLU), as are their gradients.
 * Linear and dropout run after the flatten on the plain device (plain = &ops_cpu): here they
 * return -EINVAL. Memory and optimizer entries are ops_cpu's (host memory), called with the
 * wrapped ops_cpu context. */
#include "kernels/ops.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/conv_cache.h"

enum { SX, SY, SW, SDX, SDW, NSLOT };

struct ops_ctx {
    ops_ctx *cpu; /* the wrapped ops_cpu context */
    float *buf[NSLOT];
    size_t cap[NSLOT];
};

/* fp32 -> bf16, round to nearest even; NaN -> quiet NaN of the same sign; overflow -> inf. */
static inline uint16_t f2bf(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float bf2f(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* dst (n fp32) = the bf16 elements stored at src. */
static void load(float *dst, const float *src, size_t n)
{
    const uint16_t *s = (const uint16_t *)(const void *)src;
    for (size_t i = 0; i < n; i++)
        dst[i] = bf2f(s[i]);
}

/* bf16 elements at dst = round(src[i]). */
static void store(float *dst, const float *src, size_t n)
{
    uint16_t *d = (uint16_t *)(void *)dst;
    for (size_t i = 0; i < n; i++)
        d[i] = f2bf(src[i]);
}

/* Scratch slot k grown to n floats; NULL (with pf_err set) when out of memory. */
static float *slot(ops_ctx *c, int k, size_t n)
{
    if (n > c->cap[k]) {
        float *p = realloc(c->buf[k], (n ? n : 1) * sizeof(float));
        if (!p) {
            pf_err(-ENOMEM, "cpu-bf16: out of memory for %zu floats of scratch", n);
            return NULL;
        }
        c->buf[k] = p;
        c->cap[k] = n;
    }
    return c->buf[k];
}

#define SLOT(var, k, n)                                                                                      \
    do {                                                                                                     \
        if (!((var) = slot(c, (k), (n))))                                                                    \
            return -ENOMEM;                                                                                  \
    } while (0)

/* A forward's fp32 scratch: *x = inp (nx elements) converted, *y a slot of ny floats for the output. */
static int fwd_scratch(ops_ctx *c, float **x, float **y, const float *inp, size_t nx, size_t ny)
{
    SLOT(*x, SX, nx);
    SLOT(*y, SY, ny);
    load(*x, inp, nx);
    return 0;
}

/* A backward's fp32 scratch: *x = inp (nx elements), *dy = dout (ny) converted; *dx = NULL, or with
 * dinp a slot of nx floats holding dinp when acc. */
static int bwd_scratch(ops_ctx *c, float **x, float **dy, float **dx, const float *inp, const float *dout,
                       const float *dinp, int acc, size_t nx, size_t ny)
{
    SLOT(*x, SX, nx);
    SLOT(*dy, SY, ny);
    load(*x, inp, nx);
    load(*dy, dout, ny);
    *dx = NULL;
    if (dinp) {
        SLOT(*dx, SDX, nx);
        if (acc)
            load(*dx, dinp, nx);
    }
    return 0;
}

static int check_act(const char *what, int B, int C, int HW)
{
    if (B <= 0 || C <= 0 || HW <= 0)
        return pf_err(-EINVAL, "cpu-bf16 %s shape B=%d C=%d HW=%d: sizes must be positive", what, B, C, HW);
    return 0;
}

/* w (n) = weight rounded to bf16 (autocast's half copy of the fp32 master weight). */
static void round_weights(float *w, const float *weight, size_t n)
{
    for (size_t i = 0; i < n; i++)
        w[i] = bf2f(f2bf(weight[i]));
}

static int bf_conv_forward(ops_ctx *c, float *out, const float *inp, const float *weight,
                           const ops_conv_shape *s)
{
    int rc = conv_shape_check(s, "cpu-bf16 ");
    if (rc)
        return rc;
    size_t nin = (size_t)s->B * s->C * s->H * s->W, nout = (size_t)s->B * s->OC * s->OH * s->OW;
    size_t nw = (size_t)s->OC * (s->C / s->groups) * s->K * s->K;
    float *x, *y, *w;
    if ((rc = fwd_scratch(c, &x, &y, inp, nin, nout)))
        return rc;
    SLOT(w, SW, nw);
    round_weights(w, weight, nw);
    if ((rc = ops_cpu.conv_forward(c->cpu, y, x, w, s)))
        return rc;
    store(out, y, nout);
    return 0;
}

static int bf_conv_backward(ops_ctx *c, float *dinp, int acc, float *dweight, const float *dout,
                            const float *inp, const float *weight, const ops_conv_shape *s)
{
    int rc = conv_shape_check(s, "cpu-bf16 ");
    if (rc)
        return rc;
    if (!dinp && !dweight)
        return 0;
    size_t nin = (size_t)s->B * s->C * s->H * s->W, nout = (size_t)s->B * s->OC * s->OH * s->OW;
    size_t nw = (size_t)s->OC * (s->C / s->groups) * s->K * s->K;
    float *x, *dy, *w, *dx, *dw = NULL;
    if ((rc = bwd_scratch(c, &x, &dy, &dx, inp, dout, dinp, acc, nin, nout)))
        return rc;
    SLOT(w, SW, nw);
    round_weights(w, weight, nw);
    if (dweight) {
        SLOT(dw, SDW, nw);
        memset(dw, 0, nw * sizeof *dw);
    }
    if ((rc = ops_cpu.conv_backward(c->cpu, dx, acc, dw, dy, x, w, s)))
        return rc;
    if (dinp)
        store(dinp, dx, nin);
    if (dweight) /* the bf16 weight gradient, added into the fp32 master gradient */
        for (size_t i = 0; i < nw; i++)
            dweight[i] += bf2f(f2bf(dw[i]));
    return 0;
}

static int bf_bn_forward(ops_ctx *c, float *out, double *save_mean, double *save_var, const float *inp,
                         const float *weight, const float *bias, float *running_mean, float *running_var,
                         int B, int C, int HW, float eps, float momentum, int train)
{
    int rc = check_act("batchnorm", B, C, HW);
    if (rc)
        return rc;
    size_t n = (size_t)B * C * HW;
    float *x, *y;
    if ((rc = fwd_scratch(c, &x, &y, inp, n, n)))
        return rc;
    if ((rc = ops_cpu.bn_forward(c->cpu, y, save_mean, save_var, x, weight, bias, running_mean, running_var,
                                 B, C, HW, eps, momentum, train)))
        return rc;
    store(out, y, n);
    return 0;
}

static int bf_bn_backward(ops_ctx *c, float *dinp, int acc, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, const double *save_mean,
                          const double *save_var, int B, int C, int HW, float eps)
{
    int rc = check_act("batchnorm", B, C, HW);
    if (rc)
        return rc;
    size_t n = (size_t)B * C * HW;
    float *x, *dy, *dx;
    if ((rc = bwd_scratch(c, &x, &dy, &dx, inp, dout, dinp, acc, n, n)))
        return rc;
    if ((rc = ops_cpu.bn_backward(c->cpu, dx, acc, dweight, dbias, dy, x, weight, save_mean, save_var, B, C,
                                  HW, eps)))
        return rc;
    if (dinp)
        store(dinp, dx, n);
    return 0;
}

static int bf_prelu_forward(ops_ctx *c, float *out, const float *inp, const float *alpha, int B, int C,
                            int HW)
{
    int rc = check_act("prelu", B, C, HW);
    if (rc)
        return rc;
    size_t n = (size_t)B * C * HW;
    float *x, *y;
    if ((rc = fwd_scratch(c, &x, &y, inp, n, n)))
        return rc;
    if ((rc = ops_cpu.prelu_forward(c->cpu, y, x, alpha, B, C, HW)))
        return rc;
    store(out, y, n);
    return 0;
}

static int bf_prelu_backward(ops_ctx *c, float *dinp, int acc, float *dalpha, const float *dout,
                             const float *inp, const float *alpha, int B, int C, int HW)
{
    int rc = check_act("prelu", B, C, HW);
    if (rc)
        return rc;
    size_t n = (size_t)B * C * HW;
    float *x, *dy, *dx;
    if ((rc = bwd_scratch(c, &x, &dy, &dx, inp, dout, dinp, acc, n, n)))
        return rc;
    if ((rc = ops_cpu.prelu_backward(c->cpu, dx, acc, dalpha, dy, x, alpha, B, C, HW)))
        return rc;
    if (dinp)
        store(dinp, dx, n);
    return 0;
}

static int bf_linear_forward(ops_ctx *c, float *out, const float *inp, const float *weight, const float *bias,
                             int B, int IN, int OUT)
{
    (void)c;
    (void)out;
    (void)inp;
    (void)weight;
    (void)bias;
    (void)B;
    (void)IN;
    (void)OUT;
    return pf_err(-EINVAL, "cpu-bf16: linear runs after the flatten, on the plain fp32 device "
                           "(ops_cpu_bf16.plain)");
}

static int bf_linear_backward(ops_ctx *c, float *dinp, int acc, float *dweight, float *dbias,
                              const float *dout, const float *inp, const float *weight, int B, int IN,
                              int OUT)
{
    (void)c;
    (void)dinp;
    (void)acc;
    (void)dweight;
    (void)dbias;
    (void)dout;
    (void)inp;
    (void)weight;
    (void)B;
    (void)IN;
    (void)OUT;
    return pf_err(-EINVAL, "cpu-bf16: linear runs after the flatten, on the plain fp32 device "
                           "(ops_cpu_bf16.plain)");
}

/* out = bf16(a + b) with the sum in fp32; in place on a or b is fine (elementwise). */
static int bf_add_forward(ops_ctx *c, float *out, const float *a, const float *b, size_t n)
{
    (void)c;
    const uint16_t *pa = (const uint16_t *)(const void *)a, *pb = (const uint16_t *)(const void *)b;
    uint16_t *po = (uint16_t *)(void *)out;
    for (size_t i = 0; i < n; i++)
        po[i] = f2bf(bf2f(pa[i]) + bf2f(pb[i]));
    return 0;
}

static int bf_acc(ops_ctx *c, float *dst, int acc, const float *src, size_t n)
{
    (void)c;
    uint16_t *d = (uint16_t *)(void *)dst;
    const uint16_t *s = (const uint16_t *)(const void *)src;
    if (acc) {
        for (size_t i = 0; i < n; i++)
            d[i] = f2bf(bf2f(d[i]) + bf2f(s[i]));
    } else if (d != s) {
        memmove(d, s, n * sizeof *d);
    }
    return 0;
}

static int bf_act_block(int C)
{
    return ops_cpu.act_block(C);
}

/* bf16 device layout -> fp32 NCHW: exact (every bf16 value is a float32). */
static int bf_to_plain(ops_ctx *c, float *dst, const float *src, int B, int C, int HW)
{
    int rc = check_act("to_plain", B, C, HW);
    if (rc)
        return rc;
    size_t n = (size_t)B * C * HW;
    float *x;
    SLOT(x, SX, n);
    load(x, src, n);
    return ops_cpu.to_plain(c->cpu, dst, x, B, C, HW);
}

/* fp32 NCHW -> bf16 device layout: dst = bf16(src) or bf16(dst + src) (one rounding). */
static int bf_from_plain(ops_ctx *c, float *dst, int acc, const float *src, int B, int C, int HW)
{
    int rc = check_act("from_plain", B, C, HW);
    if (rc)
        return rc;
    size_t n = (size_t)B * C * HW;
    float *y;
    SLOT(y, SY, n);
    if (acc)
        load(y, dst, n);
    if ((rc = ops_cpu.from_plain(c->cpu, y, acc, src, B, C, HW)))
        return rc;
    store(dst, y, n);
    return 0;
}

static int bf_dropout_forward(ops_ctx *c, float *out, float *mask, const float *inp, size_t n, float p,
                              uint64_t seed)
{
    (void)c;
    (void)out;
    (void)mask;
    (void)inp;
    (void)n;
    (void)p;
    (void)seed;
    return pf_err(-EINVAL, "cpu-bf16: dropout runs after the flatten, on the plain fp32 device "
                           "(ops_cpu_bf16.plain)");
}

static int bf_dropout_backward(ops_ctx *c, float *dinp, int acc, const float *dout, const float *mask,
                               size_t n)
{
    (void)c;
    (void)dinp;
    (void)acc;
    (void)dout;
    (void)mask;
    (void)n;
    return pf_err(-EINVAL, "cpu-bf16: dropout runs after the flatten, on the plain fp32 device "
                           "(ops_cpu_bf16.plain)");
}

/* ---- memory and optimizer: ops_cpu's, on the wrapped context ---- */

#define NEED(fn)                                                                                             \
    do {                                                                                                     \
        if (!ops_cpu.fn)                                                                                     \
            return pf_err(-ENOSYS, "cpu-bf16: ops_cpu has no " #fn);                                         \
    } while (0)

static int bf_mem_alloc(ops_ctx *c, void **p, size_t bytes)
{
    NEED(mem_alloc);
    return ops_cpu.mem_alloc(c->cpu, p, bytes);
}

static void bf_mem_free(ops_ctx *c, void *p)
{
    if (ops_cpu.mem_free)
        ops_cpu.mem_free(c->cpu, p);
}

static int bf_mem_h2d(ops_ctx *c, void *dst, const void *host_src, size_t bytes)
{
    NEED(mem_h2d);
    return ops_cpu.mem_h2d(c->cpu, dst, host_src, bytes);
}

static int bf_mem_d2h(ops_ctx *c, void *host_dst, const void *src, size_t bytes)
{
    NEED(mem_d2h);
    return ops_cpu.mem_d2h(c->cpu, host_dst, src, bytes);
}

static int bf_mem_d2d(ops_ctx *c, void *dst, const void *src, size_t bytes)
{
    NEED(mem_d2d);
    return ops_cpu.mem_d2d(c->cpu, dst, src, bytes);
}

static int bf_mem_zero(ops_ctx *c, void *p, size_t bytes)
{
    NEED(mem_zero);
    return ops_cpu.mem_zero(c->cpu, p, bytes);
}

static int bf_sync(ops_ctx *c)
{
    NEED(sync);
    return ops_cpu.sync(c->cpu);
}

static int bf_sgd_step(ops_ctx *c, float *w, const float *grad, float *mom, size_t n, float lr,
                       float momentum, float weight_decay)
{
    NEED(sgd_step);
    return ops_cpu.sgd_step(c->cpu, w, grad, mom, n, lr, momentum, weight_decay);
}

static int bf_adamw_step(ops_ctx *c, float *w, const float *grad, float *m, float *v, size_t n, double lr,
                         double beta1, double beta2, double eps, double weight_decay, int64_t step)
{
    NEED(adamw_step);
    return ops_cpu.adamw_step(c->cpu, w, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, step);
}

static int bf_scale(ops_ctx *c, float *x, size_t n, float a)
{
    NEED(scale);
    return ops_cpu.scale(c->cpu, x, n, a);
}

static int bf_sumsq(ops_ctx *c, const float *x, size_t n, double *host_out)
{
    NEED(sumsq);
    return ops_cpu.sumsq(c->cpu, x, n, host_out);
}

/* ---- context ---- */

static void bf_ctx_destroy(ops_ctx *c)
{
    if (!c)
        return;
    if (c->cpu)
        ops_cpu.ctx_destroy(c->cpu);
    for (int k = 0; k < NSLOT; k++)
        free(c->buf[k]);
    free(c);
}

static int bf_ctx_create(ops_ctx **out)
{
    ops_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return pf_err(-ENOMEM, "cpu-bf16 context: out of memory");
    int rc = ops_cpu.ctx_create(&c->cpu);
    if (rc) {
        free(c);
        return pf_err_wrap(rc, "cpu-bf16 context");
    }
    *out = c;
    return 0;
}

const ops_device ops_cpu_bf16 = {
    .name = "cpu-bf16",
    .ctx_create = bf_ctx_create,
    .ctx_destroy = bf_ctx_destroy,
    .conv_forward = bf_conv_forward,
    .conv_backward = bf_conv_backward,
    .bn_forward = bf_bn_forward,
    .bn_backward = bf_bn_backward,
    .prelu_forward = bf_prelu_forward,
    .prelu_backward = bf_prelu_backward,
    .linear_forward = bf_linear_forward,
    .linear_backward = bf_linear_backward,
    .add_forward = bf_add_forward,
    .acc = bf_acc,
    .act_block = bf_act_block,
    .to_plain = bf_to_plain,
    .from_plain = bf_from_plain,
    .dropout_forward = bf_dropout_forward,
    .dropout_backward = bf_dropout_backward,
    .act_bytes = 2,
    .plain = &ops_cpu,
    .mem_alloc = bf_mem_alloc,
    .mem_free = bf_mem_free,
    .mem_h2d = bf_mem_h2d,
    .mem_d2h = bf_mem_d2h,
    .mem_d2d = bf_mem_d2d,
    .mem_zero = bf_mem_zero,
    .sync = bf_sync,
    .sgd_step = bf_sgd_step,
    .adamw_step = bf_adamw_step,
    .scale = bf_scale,
    .sumsq = bf_sumsq,
};
