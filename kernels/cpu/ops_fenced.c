/* Debugging device "cpu-fenced": ops_cpu behind PROT_NONE device memory. See ops_fenced.h. */
#include "kernels/cpu/ops_fenced.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/err.h"

typedef struct fence_region {
    char *p;
    size_t len; /* mapped bytes (whole pages) */
} fence_region;

static pthread_mutex_t fence_mu = PTHREAD_MUTEX_INITIALIZER;
static fence_region *regions;
static int n_regions, cap_regions;
static int open_depth; /* entries in progress (all threads) */

/* Index of the live region holding [p, p + bytes), or -1. Caller holds fence_mu. */
static int region_of(const void *p, size_t bytes)
{
    uintptr_t a = (uintptr_t)p;
    for (int i = 0; i < n_regions; i++) {
        uintptr_t s = (uintptr_t)regions[i].p;
        if (a >= s && a - s < regions[i].len && bytes <= regions[i].len - (a - s))
            return i;
    }
    return -1;
}

static int protect_all(int prot)
{
    for (int i = 0; i < n_regions; i++)
        if (mprotect(regions[i].p, regions[i].len, prot) != 0)
            return pf_err(-EIO, "cpu-fenced: mprotect(%p, %zu) failed: %s", (void *)regions[i].p,
                          regions[i].len, strerror(errno));
    return 0;
}

/* Opens the fence (all allocations read-write) for one entry. */
static int fence_open(void)
{
    pthread_mutex_lock(&fence_mu);
    int rc = open_depth++ == 0 ? protect_all(PROT_READ | PROT_WRITE) : 0;
    if (rc)
        open_depth--;
    pthread_mutex_unlock(&fence_mu);
    return rc;
}

static int fence_close(void)
{
    pthread_mutex_lock(&fence_mu);
    int rc = --open_depth == 0 ? protect_all(PROT_NONE) : 0;
    pthread_mutex_unlock(&fence_mu);
    return rc;
}

/* 1 when p is NULL or inside a live allocation (with `bytes` following it). */
static int is_dev(const void *p, size_t bytes)
{
    if (!p)
        return 1;
    pthread_mutex_lock(&fence_mu);
    int r = region_of(p, bytes) >= 0;
    pthread_mutex_unlock(&fence_mu);
    return r;
}

/* 1 when no byte of [p, p + bytes) is device memory. */
static int is_host(const void *p, size_t bytes)
{
    uintptr_t a = (uintptr_t)p;
    pthread_mutex_lock(&fence_mu);
    int r = 1;
    for (int i = 0; i < n_regions && r; i++) {
        uintptr_t s = (uintptr_t)regions[i].p;
        if (a < s + regions[i].len && s < a + (bytes ? bytes : 1))
            r = 0;
    }
    pthread_mutex_unlock(&fence_mu);
    return r;
}

#define DEV(entry, arg)                                                                         \
    do {                                                                                        \
        if (!is_dev((arg), 0))                                                                  \
            return pf_err(-EFAULT, "cpu-fenced: %s: argument %s = %p is not device memory",     \
                          entry, #arg, (const void *)(arg));                                   \
    } while (0)

/* Runs `call` (an ops_cpu entry) with the fence open and returns its result (or the fence's). */
#define FENCED(call)                          \
    do {                                      \
        int rc_ = fence_open();               \
        if (rc_)                              \
            return rc_;                       \
        rc_ = (call);                         \
        int rc2_ = fence_close();             \
        return rc_ ? rc_ : rc2_;              \
    } while (0)

/* ---- memory ---- */

static int f_mem_alloc(ops_ctx *c, void **p, size_t bytes)
{
    (void)c;
    *p = NULL;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t len = ((bytes ? bytes : 1) + page - 1) / page * page;
    pthread_mutex_lock(&fence_mu);
    int rc = 0;
    if (n_regions == cap_regions) {
        int nc = cap_regions ? 2 * cap_regions : 64;
        fence_region *r = realloc(regions, (size_t)nc * sizeof *r);
        if (!r) {
            rc = pf_err(-ENOMEM, "cpu-fenced: out of memory for the allocation list");
            goto out;
        }
        regions = r;
        cap_regions = nc;
    }
    /* Anonymous pages are zero-filled. Open while an entry is in progress (nested use). */
    void *q = mmap(NULL, len, open_depth ? PROT_READ | PROT_WRITE : PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (q == MAP_FAILED) {
        rc = pf_err(-ENOMEM, "cpu-fenced: mmap of %zu bytes failed: %s", len, strerror(errno));
        goto out;
    }
    regions[n_regions].p = q;
    regions[n_regions].len = len;
    n_regions++;
    *p = q;
out:
    pthread_mutex_unlock(&fence_mu);
    return rc;
}

static void f_mem_free(ops_ctx *c, void *p)
{
    (void)c;
    if (!p)
        return;
    pthread_mutex_lock(&fence_mu);
    int i = region_of(p, 0);
    if (i < 0 || regions[i].p != (char *)p) {
        fprintf(stderr, "cpu-fenced: mem_free(%p): not a live allocation of this device "
                        "(double free, or not device memory)\n", p);
        abort();
    }
    munmap(regions[i].p, regions[i].len);
    regions[i] = regions[--n_regions];
    pthread_mutex_unlock(&fence_mu);
}

static int f_mem_h2d(ops_ctx *c, void *dst, const void *host_src, size_t bytes)
{
    if (!is_dev(dst, bytes) || !dst)
        return pf_err(-EFAULT, "cpu-fenced: mem_h2d: destination %p (+%zu bytes) is not device "
                      "memory", dst, bytes);
    if (!is_host(host_src, bytes))
        return pf_err(-EFAULT, "cpu-fenced: mem_h2d: source %p is device memory, not host memory",
                      host_src);
    FENCED(ops_cpu.mem_h2d(c, dst, host_src, bytes));
}

static int f_mem_d2h(ops_ctx *c, void *host_dst, const void *src, size_t bytes)
{
    if (!is_dev(src, bytes) || !src)
        return pf_err(-EFAULT, "cpu-fenced: mem_d2h: source %p (+%zu bytes) is not device memory",
                      src, bytes);
    if (!is_host(host_dst, bytes))
        return pf_err(-EFAULT, "cpu-fenced: mem_d2h: destination %p is device memory, not host "
                      "memory", host_dst);
    FENCED(ops_cpu.mem_d2h(c, host_dst, src, bytes));
}

static int f_mem_d2d(ops_ctx *c, void *dst, const void *src, size_t bytes)
{
    if (!dst || !src || !is_dev(dst, bytes) || !is_dev(src, bytes))
        return pf_err(-EFAULT, "cpu-fenced: mem_d2d: %p <- %p (%zu bytes) is not device memory on "
                      "both sides", dst, src, bytes);
    FENCED(ops_cpu.mem_d2d(c, dst, src, bytes));
}

static int f_mem_zero(ops_ctx *c, void *p, size_t bytes)
{
    if (!p || !is_dev(p, bytes))
        return pf_err(-EFAULT, "cpu-fenced: mem_zero: %p (+%zu bytes) is not device memory", p,
                      bytes);
    FENCED(ops_cpu.mem_zero(c, p, bytes));
}

static int f_sync(ops_ctx *c)
{
    return ops_cpu.sync(c);
}

/* ---- layers ---- */

static int f_ctx_create(ops_ctx **out)
{
    return ops_cpu.ctx_create(out);
}

static void f_ctx_destroy(ops_ctx *c)
{
    ops_cpu.ctx_destroy(c);
}

static int f_conv_forward(ops_ctx *c, float *out, const float *inp, const float *weight,
                          const ops_conv_shape *s)
{
    DEV("conv_forward", out); DEV("conv_forward", inp); DEV("conv_forward", weight);
    FENCED(ops_cpu.conv_forward(c, out, inp, weight, s));
}

static int f_conv_backward(ops_ctx *c, float *dinp, int acc, float *dweight, const float *dout,
                           const float *inp, const float *weight, const ops_conv_shape *s)
{
    DEV("conv_backward", dinp); DEV("conv_backward", dweight); DEV("conv_backward", dout);
    DEV("conv_backward", inp); DEV("conv_backward", weight);
    FENCED(ops_cpu.conv_backward(c, dinp, acc, dweight, dout, inp, weight, s));
}

static int f_bn_forward(ops_ctx *c, float *out, double *save_mean, double *save_var,
                        const float *inp, const float *weight, const float *bias,
                        float *running_mean, float *running_var, int B, int C, int HW, float eps,
                        float momentum, int train)
{
    DEV("bn_forward", out); DEV("bn_forward", save_mean); DEV("bn_forward", save_var);
    DEV("bn_forward", inp); DEV("bn_forward", weight); DEV("bn_forward", bias);
    DEV("bn_forward", running_mean); DEV("bn_forward", running_var);
    FENCED(ops_cpu.bn_forward(c, out, save_mean, save_var, inp, weight, bias, running_mean,
                              running_var, B, C, HW, eps, momentum, train));
}

static int f_bn_backward(ops_ctx *c, float *dinp, int acc, float *dweight, float *dbias,
                         const float *dout, const float *inp, const float *weight,
                         const double *save_mean, const double *save_var, int B, int C, int HW,
                         float eps)
{
    DEV("bn_backward", dinp); DEV("bn_backward", dweight); DEV("bn_backward", dbias);
    DEV("bn_backward", dout); DEV("bn_backward", inp); DEV("bn_backward", weight);
    DEV("bn_backward", save_mean); DEV("bn_backward", save_var);
    FENCED(ops_cpu.bn_backward(c, dinp, acc, dweight, dbias, dout, inp, weight, save_mean,
                               save_var, B, C, HW, eps));
}

static int f_prelu_forward(ops_ctx *c, float *out, const float *inp, const float *alpha, int B,
                           int C, int HW)
{
    DEV("prelu_forward", out); DEV("prelu_forward", inp); DEV("prelu_forward", alpha);
    FENCED(ops_cpu.prelu_forward(c, out, inp, alpha, B, C, HW));
}

static int f_prelu_backward(ops_ctx *c, float *dinp, int acc, float *dalpha, const float *dout,
                            const float *inp, const float *alpha, int B, int C, int HW)
{
    DEV("prelu_backward", dinp); DEV("prelu_backward", dalpha); DEV("prelu_backward", dout);
    DEV("prelu_backward", inp); DEV("prelu_backward", alpha);
    FENCED(ops_cpu.prelu_backward(c, dinp, acc, dalpha, dout, inp, alpha, B, C, HW));
}

static int f_linear_forward(ops_ctx *c, float *out, const float *inp, const float *weight,
                            const float *bias, int B, int IN, int OUT)
{
    DEV("linear_forward", out); DEV("linear_forward", inp); DEV("linear_forward", weight);
    DEV("linear_forward", bias);
    FENCED(ops_cpu.linear_forward(c, out, inp, weight, bias, B, IN, OUT));
}

static int f_linear_backward(ops_ctx *c, float *dinp, int acc, float *dweight, float *dbias,
                             const float *dout, const float *inp, const float *weight, int B,
                             int IN, int OUT)
{
    DEV("linear_backward", dinp); DEV("linear_backward", dweight); DEV("linear_backward", dbias);
    DEV("linear_backward", dout); DEV("linear_backward", inp); DEV("linear_backward", weight);
    FENCED(ops_cpu.linear_backward(c, dinp, acc, dweight, dbias, dout, inp, weight, B, IN, OUT));
}

static int f_add_forward(ops_ctx *c, float *out, const float *a, const float *b, size_t n)
{
    DEV("add_forward", out); DEV("add_forward", a); DEV("add_forward", b);
    FENCED(ops_cpu.add_forward(c, out, a, b, n));
}

static int f_acc(ops_ctx *c, float *dst, int acc, const float *src, size_t n)
{
    DEV("acc", dst); DEV("acc", src);
    FENCED(ops_cpu.acc(c, dst, acc, src, n));
}

static int f_act_block(int C)
{
    return ops_cpu.act_block(C);
}

static int f_to_plain(ops_ctx *c, float *dst, const float *src, int B, int C, int HW)
{
    DEV("to_plain", dst); DEV("to_plain", src);
    FENCED(ops_cpu.to_plain(c, dst, src, B, C, HW));
}

static int f_from_plain(ops_ctx *c, float *dst, int acc, const float *src, int B, int C, int HW)
{
    DEV("from_plain", dst); DEV("from_plain", src);
    FENCED(ops_cpu.from_plain(c, dst, acc, src, B, C, HW));
}

static int f_dropout_forward(ops_ctx *c, float *out, float *mask, const float *inp, size_t n,
                             float p, uint64_t seed)
{
    DEV("dropout_forward", out); DEV("dropout_forward", mask); DEV("dropout_forward", inp);
    FENCED(ops_cpu.dropout_forward(c, out, mask, inp, n, p, seed));
}

static int f_dropout_backward(ops_ctx *c, float *dinp, int acc, const float *dout,
                              const float *mask, size_t n)
{
    DEV("dropout_backward", dinp); DEV("dropout_backward", dout); DEV("dropout_backward", mask);
    FENCED(ops_cpu.dropout_backward(c, dinp, acc, dout, mask, n));
}

/* ---- optimizer and gradient utilities ---- */

static int f_sgd_step(ops_ctx *c, float *w, const float *grad, float *mom, size_t n, float lr,
                      float momentum, float weight_decay)
{
    DEV("sgd_step", w); DEV("sgd_step", grad); DEV("sgd_step", mom);
    FENCED(ops_cpu.sgd_step(c, w, grad, mom, n, lr, momentum, weight_decay));
}

static int f_adamw_step(ops_ctx *c, float *w, const float *grad, float *m, float *v, size_t n,
                        double lr, double beta1, double beta2, double eps, double weight_decay,
                        int64_t step)
{
    DEV("adamw_step", w); DEV("adamw_step", grad); DEV("adamw_step", m); DEV("adamw_step", v);
    FENCED(ops_cpu.adamw_step(c, w, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, step));
}

static int f_scale(ops_ctx *c, float *x, size_t n, float a)
{
    DEV("scale", x);
    FENCED(ops_cpu.scale(c, x, n, a));
}

static int f_sumsq(ops_ctx *c, const float *x, size_t n, double *host_out)
{
    DEV("sumsq", x);
    if (!is_host(host_out, sizeof *host_out))
        return pf_err(-EFAULT, "cpu-fenced: sumsq: host_out %p is device memory", (void *)host_out);
    FENCED(ops_cpu.sumsq(c, x, n, host_out));
}

const ops_device ops_cpu_fenced = {
    .name = "cpu-fenced",
    .ctx_create = f_ctx_create,
    .ctx_destroy = f_ctx_destroy,
    .conv_forward = f_conv_forward,
    .conv_backward = f_conv_backward,
    .bn_forward = f_bn_forward,
    .bn_backward = f_bn_backward,
    .prelu_forward = f_prelu_forward,
    .prelu_backward = f_prelu_backward,
    .linear_forward = f_linear_forward,
    .linear_backward = f_linear_backward,
    .add_forward = f_add_forward,
    .acc = f_acc,
    .act_block = f_act_block,
    .to_plain = f_to_plain,
    .from_plain = f_from_plain,
    .dropout_forward = f_dropout_forward,
    .dropout_backward = f_dropout_backward,
    .act_bytes = 4,
    .plain = NULL,
    .mem_alloc = f_mem_alloc,
    .mem_free = f_mem_free,
    .mem_h2d = f_mem_h2d,
    .mem_d2h = f_mem_d2h,
    .mem_d2d = f_mem_d2d,
    .mem_zero = f_mem_zero,
    .sync = f_sync,
    .sgd_step = f_sgd_step,
    .adamw_step = f_adamw_step,
    .scale = f_scale,
    .sumsq = f_sumsq,
};
