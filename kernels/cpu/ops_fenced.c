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
    int n_open; /* entries in progress that opened it (read-write while > 0) */
} fence_region;

static pthread_mutex_t fence_mu = PTHREAD_MUTEX_INITIALIZER;
static fence_region *regions;
static int n_regions, cap_regions;

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

static int set_prot(fence_region *r, int prot)
{
    if (mprotect(r->p, r->len, prot) != 0)
        return pf_err(-EIO, "cpu-fenced: mprotect(%p, %zu) failed: %s", (void *)r->p, r->len,
                      strerror(errno));
    return 0;
}

#define FENCE_MAX_ARGS 8

/* Closes what fence_open opened: bases[i] (region starts, NULL skipped). */
static int fence_close(char *const *bases, int n)
{
    int rc = 0;
    pthread_mutex_lock(&fence_mu);
    for (int i = 0; i < n; i++) {
        if (!bases[i])
            continue;
        int k = region_of(bases[i], 0);
        if (k >= 0 && --regions[k].n_open == 0 && !rc)
            rc = set_prot(&regions[k], PROT_NONE);
    }
    pthread_mutex_unlock(&fence_mu);
    return rc;
}

/* Checks that each non-NULL ptrs[i] lies in a live allocation (with bytes[i] following it when
 * bytes is not NULL) and opens those allocations (read-write) for one entry; bases receives the
 * region starts for fence_close. Only the allocations an entry's arguments point into are opened:
 * an op that touched any other device memory would fault too. */
static int fence_open(const char *entry, const char *names, const void *const *ptrs, const size_t *bytes,
                      int n, char **bases)
{
    int rc = 0;
    pthread_mutex_lock(&fence_mu);
    for (int i = 0; i < n; i++)
        bases[i] = NULL;
    for (int i = 0; i < n && !rc; i++) {
        if (!ptrs[i])
            continue;
        int k = region_of(ptrs[i], bytes ? bytes[i] : 0);
        if (k < 0) {
            rc = pf_err(-EFAULT, "cpu-fenced: %s: argument %d of (%s) = %p%s is not device memory", entry,
                        i + 1, names, ptrs[i], bytes ? " (with its byte count)" : "");
            break;
        }
        if (regions[k].n_open++ == 0 && (rc = set_prot(&regions[k], PROT_READ | PROT_WRITE))) {
            regions[k].n_open--;
            break;
        }
        bases[i] = regions[k].p;
    }
    pthread_mutex_unlock(&fence_mu);
    if (rc)
        fence_close(bases, n);
    return rc;
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

/* Runs `call` (an ops_cpu entry) with the allocations its device pointer arguments (the list
 * after it) point into open, and returns its result (or the fence's error). sizes: NULL, or the
 * byte count that must follow each pointer inside its allocation. */
#define FENCED_(entry, sizes, call, ...)                                                                     \
    do {                                                                                                     \
        const void *const p_[] = {__VA_ARGS__};                                                              \
        char *b_[FENCE_MAX_ARGS];                                                                            \
        _Static_assert(sizeof p_ / sizeof *p_ <= FENCE_MAX_ARGS, "too many args");                           \
        int n_ = (int)(sizeof p_ / sizeof *p_);                                                              \
        int rc_ = fence_open(entry, #__VA_ARGS__, p_, sizes, n_, b_);                                        \
        if (rc_)                                                                                             \
            return rc_;                                                                                      \
        rc_ = (call);                                                                                        \
        int rc2_ = fence_close(b_, n_);                                                                      \
        return rc_ ? rc_ : rc2_;                                                                             \
    } while (0)
#define FENCED(entry, call, ...) FENCED_(entry, NULL, call, __VA_ARGS__)

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
    /* Anonymous pages are zero-filled. */
    void *q = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (q == MAP_FAILED) {
        rc = pf_err(-ENOMEM, "cpu-fenced: mmap of %zu bytes failed: %s", len, strerror(errno));
        goto out;
    }
    regions[n_regions].p = q;
    regions[n_regions].len = len;
    regions[n_regions].n_open = 0;
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
        fprintf(stderr,
                "cpu-fenced: mem_free(%p): not a live allocation of this device "
                "(double free, or not device memory)\n",
                p);
        abort();
    }
    munmap(regions[i].p, regions[i].len);
    regions[i] = regions[--n_regions];
    pthread_mutex_unlock(&fence_mu);
}

/* Copies: the device side's whole byte range must lie in one allocation (the host side in none). */
#define FENCED_RANGE(entry, call, ...)                                                                       \
    do {                                                                                                     \
        const size_t s_[] = {bytes, bytes};                                                                  \
        FENCED_(entry, s_, call, __VA_ARGS__);                                                               \
    } while (0)

static int f_mem_h2d(ops_ctx *c, void *dst, const void *host_src, size_t bytes)
{
    if (!dst)
        return pf_err(-EFAULT, "cpu-fenced: mem_h2d: destination is NULL");
    if (!is_host(host_src, bytes))
        return pf_err(-EFAULT, "cpu-fenced: mem_h2d: source %p is device memory, not host memory", host_src);
    FENCED_RANGE("mem_h2d", ops_cpu.mem_h2d(c, dst, host_src, bytes), dst);
}

static int f_mem_d2h(ops_ctx *c, void *host_dst, const void *src, size_t bytes)
{
    if (!src)
        return pf_err(-EFAULT, "cpu-fenced: mem_d2h: source is NULL");
    if (!is_host(host_dst, bytes))
        return pf_err(-EFAULT,
                      "cpu-fenced: mem_d2h: destination %p is device memory, not host "
                      "memory",
                      host_dst);
    FENCED_RANGE("mem_d2h", ops_cpu.mem_d2h(c, host_dst, src, bytes), src);
}

static int f_mem_d2d(ops_ctx *c, void *dst, const void *src, size_t bytes)
{
    if (!dst || !src)
        return pf_err(-EFAULT, "cpu-fenced: mem_d2d: NULL pointer");
    FENCED_RANGE("mem_d2d", ops_cpu.mem_d2d(c, dst, src, bytes), dst, src);
}

static int f_mem_zero(ops_ctx *c, void *p, size_t bytes)
{
    if (!p)
        return pf_err(-EFAULT, "cpu-fenced: mem_zero: NULL pointer");
    FENCED_RANGE("mem_zero", ops_cpu.mem_zero(c, p, bytes), p);
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
    FENCED("conv_forward", ops_cpu.conv_forward(c, out, inp, weight, s), out, inp, weight);
}

static int f_conv_backward(ops_ctx *c, float *dinp, int acc, float *dweight, const float *dout,
                           const float *inp, const float *weight, const ops_conv_shape *s)
{
    FENCED("conv_backward", ops_cpu.conv_backward(c, dinp, acc, dweight, dout, inp, weight, s), dinp, dweight,
           dout, inp, weight);
}

static int f_bn_forward(ops_ctx *c, float *out, double *save_mean, double *save_var, const float *inp,
                        const float *weight, const float *bias, float *running_mean, float *running_var,
                        int B, int C, int HW, float eps, float momentum, int train)
{
    FENCED("bn_forward",
           ops_cpu.bn_forward(c, out, save_mean, save_var, inp, weight, bias, running_mean, running_var, B, C,
                              HW, eps, momentum, train),
           out, save_mean, save_var, inp, weight, bias, running_mean, running_var);
}

static int f_bn_backward(ops_ctx *c, float *dinp, int acc, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, const double *save_mean,
                         const double *save_var, int B, int C, int HW, float eps)
{
    FENCED("bn_backward",
           ops_cpu.bn_backward(c, dinp, acc, dweight, dbias, dout, inp, weight, save_mean, save_var, B, C, HW,
                               eps),
           dinp, dweight, dbias, dout, inp, weight, save_mean, save_var);
}

static int f_prelu_forward(ops_ctx *c, float *out, const float *inp, const float *alpha, int B, int C, int HW)
{
    FENCED("prelu_forward", ops_cpu.prelu_forward(c, out, inp, alpha, B, C, HW), out, inp, alpha);
}

static int f_prelu_backward(ops_ctx *c, float *dinp, int acc, float *dalpha, const float *dout,
                            const float *inp, const float *alpha, int B, int C, int HW)
{
    FENCED("prelu_backward", ops_cpu.prelu_backward(c, dinp, acc, dalpha, dout, inp, alpha, B, C, HW), dinp,
           dalpha, dout, inp, alpha);
}

static int f_linear_forward(ops_ctx *c, float *out, const float *inp, const float *weight, const float *bias,
                            int B, int IN, int OUT)
{
    FENCED("linear_forward", ops_cpu.linear_forward(c, out, inp, weight, bias, B, IN, OUT), out, inp, weight,
           bias);
}

static int f_linear_backward(ops_ctx *c, float *dinp, int acc, float *dweight, float *dbias,
                             const float *dout, const float *inp, const float *weight, int B, int IN, int OUT)
{
    FENCED("linear_backward",
           ops_cpu.linear_backward(c, dinp, acc, dweight, dbias, dout, inp, weight, B, IN, OUT), dinp,
           dweight, dbias, dout, inp, weight);
}

static int f_add_forward(ops_ctx *c, float *out, const float *a, const float *b, size_t n)
{
    FENCED("add_forward", ops_cpu.add_forward(c, out, a, b, n), out, a, b);
}

static int f_acc(ops_ctx *c, float *dst, int acc, const float *src, size_t n)
{
    FENCED("acc", ops_cpu.acc(c, dst, acc, src, n), dst, src);
}

static int f_act_block(int C)
{
    return ops_cpu.act_block(C);
}

static int f_to_plain(ops_ctx *c, float *dst, const float *src, int B, int C, int HW)
{
    FENCED("to_plain", ops_cpu.to_plain(c, dst, src, B, C, HW), dst, src);
}

static int f_from_plain(ops_ctx *c, float *dst, int acc, const float *src, int B, int C, int HW)
{
    FENCED("from_plain", ops_cpu.from_plain(c, dst, acc, src, B, C, HW), dst, src);
}

static int f_dropout_forward(ops_ctx *c, float *out, float *mask, const float *inp, size_t n, float p,
                             uint64_t seed)
{
    FENCED("dropout_forward", ops_cpu.dropout_forward(c, out, mask, inp, n, p, seed), out, mask, inp);
}

static int f_dropout_backward(ops_ctx *c, float *dinp, int acc, const float *dout, const float *mask,
                              size_t n)
{
    FENCED("dropout_backward", ops_cpu.dropout_backward(c, dinp, acc, dout, mask, n), dinp, dout, mask);
}

/* ---- optimizer and gradient utilities ---- */

static int f_sgd_step(ops_ctx *c, float *w, const float *grad, float *mom, size_t n, float lr, float momentum,
                      float weight_decay)
{
    FENCED("sgd_step", ops_cpu.sgd_step(c, w, grad, mom, n, lr, momentum, weight_decay), w, grad, mom);
}

static int f_adamw_step(ops_ctx *c, float *w, const float *grad, float *m, float *v, size_t n, double lr,
                        double beta1, double beta2, double eps, double weight_decay, int64_t step)
{
    FENCED("adamw_step", ops_cpu.adamw_step(c, w, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, step),
           w, grad, m, v);
}

static int f_scale(ops_ctx *c, float *x, size_t n, float a)
{
    FENCED("scale", ops_cpu.scale(c, x, n, a), x);
}

static int f_sumsq(ops_ctx *c, const float *x, size_t n, double *host_out)
{
    if (!is_host(host_out, sizeof *host_out))
        return pf_err(-EFAULT, "cpu-fenced: sumsq: host_out %p is device memory", (void *)host_out);
    FENCED("sumsq", ops_cpu.sumsq(c, x, n, host_out), x);
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
