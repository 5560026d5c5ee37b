/* The model on device memory, proved on a machine without a GPU:
 *  1. ops_device_by_name: the CPU devices by name; an unknown name is refused naming the devices.
 *  2. the memory and optimizer entries of "cpu" and "cpu-fenced" against values computed here
 *     (zero-filled allocation, copies, scale, sumsq in double with inf/NaN, SGD and AdamW held to a
 *     float64 evaluation of torch's formulas) and the fenced device's argument checks (-EFAULT for a
 *     host pointer where device memory belongs).
 *  3. the fence itself: forked children that read or write the model's device memory outside a
 *     device call die with SIGSEGV; a child that goes through the device API exits 0.
 *  4. forward (train and eval) + backward of r18_w16 and mbf on "cpu-fenced" give bit for bit the
 *     embeddings, parameter gradients, input gradient and running statistics of "cpu" (the fenced
 *     device calls the same code; any host access of device memory in worker/model would fault),
 *     and init / get / set / save / load agree across the two devices (mbf with --mbf). */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "tests/check.h"
#include "worker/model/model.h"

static const ops_device *dev_named(const char *n)
{
    const ops_device *d = ops_device_by_name(n);
    CHECK(d && !strcmp(d->name, n), "ops_device_by_name(%s): %s", n, d ? d->name : pf_errmsg());
    return d;
}

static void test_names(void)
{
    dev_named("cpu");
    dev_named("cpu-fenced");
    const ops_device *d = ops_device_by_name("gpu9");
    printf("unknown device: %s\n", pf_errmsg());
    CHECK(!d && strstr(pf_errmsg(), "gpu9") && strstr(pf_errmsg(), "cpu-fenced"),
          "unknown name not refused clearly: '%s'", pf_errmsg());
    CHECK(!ops_device_by_name(NULL), "NULL name accepted");
    /* every device built into this binary fills every entry of kernels/ops.h (no GPU needed) */
    static const char *names[] = {"cpu", "cpu-fenced", "cpu-bf16", "cuda", "cuda-fp16", "cuda-bf16"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const ops_device *t = ops_device_by_name(names[i]);
        if (!t)
            continue;
        int full = t->ctx_create && t->ctx_destroy && t->conv_forward && t->conv_backward && t->bn_forward &&
                   t->bn_backward && t->prelu_forward && t->prelu_backward && t->linear_forward &&
                   t->linear_backward && t->add_forward && t->acc && t->act_block && t->to_plain &&
                   t->from_plain && t->dropout_forward && t->dropout_backward && t->mem_alloc &&
                   t->mem_free && t->mem_h2d && t->mem_d2h && t->mem_d2d && t->mem_zero && t->sync &&
                   t->sgd_step && t->adamw_step && t->scale && t->sumsq &&
                   (t->act_bytes == 4 || t->act_bytes == 2) && (!t->plain || t->plain->act_bytes == 4) &&
                   (t->act_bytes == 4 || t->plain);
        printf("device %-10s act_bytes %d plain %-5s every entry filled: %s\n", t->name, t->act_bytes,
               t->plain ? t->plain->name : "-", full ? "yes" : "NO");
        CHECK(full, "device %s: kernels/ops.h table incomplete or inconsistent", t->name);
    }
}

/* Memory and optimizer entries of one device. */
static void test_entries(const ops_device *dv)
{
    ops_ctx *c;
    if (dv->ctx_create(&c)) {
        CHECK(0, "%s ctx_create: %s", dv->name, pf_errmsg());
        return;
    }
    enum { N = 1000 };
    float *w, *g, *mo, *v;
    CHECK(!dv->mem_alloc(c, (void **)&w, N * 4) && !dv->mem_alloc(c, (void **)&g, N * 4) &&
              !dv->mem_alloc(c, (void **)&mo, N * 4) && !dv->mem_alloc(c, (void **)&v, N * 4),
          "%s mem_alloc: %s", dv->name, pf_errmsg());
    float h[N], hg[N], hw[N], hm[N], hv[N];
    CHECK(!dv->mem_d2h(c, h, w, sizeof h), "%s d2h", dv->name);
    int zero = 1;
    for (int i = 0; i < N; i++)
        zero &= h[i] == 0.0f;
    CHECK(zero, "%s: mem_alloc not zero-filled", dv->name);
    for (int i = 0; i < N; i++) {
        hw[i] = 0.5f * sinf(0.1f * (float)i);
        hg[i] = 0.01f * cosf(0.37f * (float)i) - 0.002f;
    }
    /* copies: h2d, d2d, d2h round trip; mem_zero */
    CHECK(!dv->mem_h2d(c, w, hw, sizeof hw) && !dv->mem_d2d(c, v, w, sizeof hw) &&
              !dv->mem_d2h(c, h, v, sizeof h) && !memcmp(h, hw, sizeof h),
          "%s: h2d/d2d/d2h round trip", dv->name);
    CHECK(!dv->mem_zero(c, v, 10 * 4) && !dv->mem_d2h(c, h, v, sizeof h) && h[9] == 0.0f && h[10] == hw[10],
          "%s: mem_zero of 10 floats", dv->name);
    /* scale and sumsq: 3,4 -> 25; x2; inf and NaN propagate */
    float t[3] = {3.0f, 4.0f, 0.0f};
    double ss = -1;
    CHECK(!dv->mem_h2d(c, v, t, sizeof t) && !dv->sumsq(c, v, 3, &ss) && ss == 25.0,
          "%s: sumsq(3,4,0) = %g, expected 25", dv->name, ss);
    CHECK(!dv->scale(c, v, 2, 2.0f) && !dv->sumsq(c, v, 3, &ss) && ss == 100.0,
          "%s: after scale x2 sumsq = %g, expected 100", dv->name, ss);
    double big = 0;
    for (int i = 0; i < N; i++)
        big += (double)hw[i] * hw[i];
    CHECK(!dv->sumsq(c, w, N, &ss) && fabs(ss - big) <= 1e-12 * big,
          "%s: sumsq of %d = %.17g, "
          "expected %.17g",
          dv->name, N, ss, big);
    t[1] = INFINITY;
    CHECK(!dv->mem_h2d(c, v, t, sizeof t) && !dv->sumsq(c, v, 3, &ss) && isinf(ss), "%s: sumsq with inf = %g",
          dv->name, ss);
    t[1] = NAN;
    CHECK(!dv->mem_h2d(c, v, t, sizeof t) && !dv->sumsq(c, v, 3, &ss) && isnan(ss), "%s: sumsq with NaN = %g",
          dv->name, ss);
    /* SGD, 3 steps, momentum 0.9, wd 5e-4, lr 0.1, against torch's formula in float64 */
    double dw[N], dm[N];
    for (int i = 0; i < N; i++) {
        dw[i] = hw[i];
        dm[i] = 0;
    }
    CHECK(!dv->mem_h2d(c, w, hw, sizeof hw) && !dv->mem_h2d(c, g, hg, sizeof hg) &&
              !dv->mem_zero(c, mo, N * 4),
          "%s: upload", dv->name);
    for (int s = 0; s < 3; s++) {
        CHECK(!dv->sgd_step(c, w, g, mo, N, 0.1f, 0.9f, 5e-4f), "%s sgd: %s", dv->name, pf_errmsg());
        for (int i = 0; i < N; i++) {
            double d = (double)hg[i] + (double)5e-4f * dw[i];
            dm[i] = (double)0.9f * dm[i] + d;
            dw[i] -= (double)0.1f * dm[i];
        }
    }
    double err = 0;
    CHECK(!dv->mem_d2h(c, h, w, sizeof h), "%s d2h", dv->name);
    for (int i = 0; i < N; i++)
        err = fmax(err, fabs(h[i] - dw[i]));
    printf("%s: sgd_step 3 steps, max |w - float64| %.2e\n", dv->name, err);
    CHECK(err < 1e-6, "%s: sgd_step off by %g", dv->name, err);
    /* AdamW, 3 steps, torch defaults with lr 1e-2 */
    double am[N], av[N];
    for (int i = 0; i < N; i++) {
        dw[i] = hw[i];
        am[i] = av[i] = 0;
    }
    CHECK(!dv->mem_h2d(c, w, hw, sizeof hw) && !dv->mem_zero(c, mo, N * 4) && !dv->mem_zero(c, v, N * 4),
          "%s: upload", dv->name);
    for (int s = 1; s <= 3; s++) {
        CHECK(!dv->adamw_step(c, w, g, mo, v, N, 1e-2, 0.9, 0.999, 1e-8, 1e-2, s), "%s adamw: %s", dv->name,
              pf_errmsg());
        for (int i = 0; i < N; i++) {
            dw[i] *= 1 - 1e-2 * 1e-2;
            am[i] = 0.9 * am[i] + 0.1 * hg[i];
            av[i] = 0.999 * av[i] + 0.001 * (double)hg[i] * hg[i];
            double denom = sqrt(av[i]) / sqrt(1 - pow(0.999, s)) + 1e-8;
            dw[i] -= 1e-2 / (1 - pow(0.9, s)) * am[i] / denom;
        }
    }
    err = 0;
    CHECK(!dv->mem_d2h(c, hm, mo, sizeof hm) && !dv->mem_d2h(c, hv, v, sizeof hv) &&
              !dv->mem_d2h(c, h, w, sizeof h),
          "%s d2h", dv->name);
    for (int i = 0; i < N; i++)
        err = fmax(err, fabs(h[i] - dw[i]));
    printf("%s: adamw_step 3 steps, max |w - float64| %.2e\n", dv->name, err);
    CHECK(err < 1e-6, "%s: adamw_step off by %g", dv->name, err);
    CHECK(dv->adamw_step(c, w, g, mo, v, N, 1e-2, 0.9, 0.999, 1e-8, 1e-2, 0) == -EINVAL,
          "%s: adamw step 0 accepted", dv->name);
    if (!strcmp(dv->name, "cpu-fenced")) {
        /* host pointers where device memory belongs, and the reverse */
        int r1 = dv->sgd_step(c, w, hg, mo, N, 0.1f, 0.9f, 0.0f);
        printf("fenced sgd_step with a host gradient: %d '%s'\n", r1, pf_errmsg());
        int r2 = dv->mem_d2h(c, h, hg, sizeof h);
        int r3 = dv->mem_h2d(c, w, v, 16);
        int r4 = dv->mem_h2d(c, w, hw, N * 4 + 8192); /* past the allocation */
        CHECK(r1 == -EFAULT && strstr(pf_errmsg(), "") && r2 == -EFAULT && r3 == -EFAULT && r4 == -EFAULT,
              "fenced argument checks: %d %d %d %d", r1, r2, r3, r4);
    }
    dv->mem_free(c, w);
    dv->mem_free(c, g);
    dv->mem_free(c, mo);
    dv->mem_free(c, v);
    dv->ctx_destroy(c);
}

/* Runs fn(arg) in a forked child; returns the signal that killed it, or -(exit status + 1). */
static int in_child(void (*fn)(void *), void *arg)
{
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
        signal(SIGSEGV, SIG_DFL); /* a sanitizer's handler would turn the fault into exit 1 */
        fn(arg);
        _exit(0);
    }
    int st = 0;
    if (p < 0 || waitpid(p, &st, 0) != p)
        return -1000;
    return WIFSIGNALED(st) ? WTERMSIG(st) : -(WEXITSTATUS(st) + 1);
}

static void child_write_param(void *m)
{
    model_params(m)[3] = 1.0f;
}
static void child_read_grad(void *m)
{
    volatile float x = model_grads(m)[0];
    (void)x;
}
static void child_read_embeddings(void *m)
{
    size_t nin = 3 * 112 * 112;
    float *in = calloc(nin, sizeof *in);
    const float *e;
    if (model_forward(m, in, 1, 1, &e))
        _exit(3);
    volatile float x = e[1]; /* host read of the device embeddings */
    (void)x;
}
static void child_api(void *m)
{
    /* the same accesses through the device: must not fault */
    size_t np = model_num_params(m);
    float *h = malloc(np * sizeof *h);
    if (!h || model_get_params(m, h))
        _exit(3);
    h[3] = 1.0f;
    if (model_set_params(m, h) || model_get_grads(m, h))
        _exit(4);
    const float *e;
    float x[4];
    float *in = calloc(3 * 112 * 112, sizeof *in);
    const ops_device *d = model_device(m);
    if (model_forward(m, in, 1, 1, &e) || d->mem_d2h(model_ctx(m), x, e, sizeof x))
        _exit(5);
}

static void test_fence(void)
{
    model *m;
    if (model_create_desc(&m, &(model_desc){0}, 1, NULL) != -EINVAL) /* bad desc refused */
        CHECK(0, "empty description accepted");
    model_desc d;
    if (model_desc_from_name(&d, "r18_w16", 32) ||
        model_create_desc(&m, &d, 1, ops_device_by_name("cpu-fenced"))) {
        CHECK(0, "fenced model: %s", pf_errmsg());
        return;
    }
    model_init(m, 1);
    struct {
        const char *what;
        void (*fn)(void *);
        int want;
    } cases[] = {
        {"host write of a parameter", child_write_param, SIGSEGV},
        {"host read of a gradient", child_read_grad, SIGSEGV},
        {"host read of the embeddings", child_read_embeddings, SIGSEGV},
        {"the same through the device API", child_api, -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int r = in_child(cases[i].fn, m);
        printf("fence: %-36s -> %s %d (%s)\n", cases[i].what, r > 0 ? "signal" : "exit", r > 0 ? r : -r - 1,
               r == cases[i].want ? "ok" : "FAIL");
        CHECK(r == cases[i].want, "%s: got %d, want %d", cases[i].what, r, cases[i].want);
    }
    /* the model API refuses host pointers where device memory belongs */
    float gh[32] = {0};
    const float *e;
    float *in = calloc(3 * 112 * 112, sizeof *in);
    int rf = model_forward(m, in, 1, 1, &e);
    int rb = model_backward(m, gh, NULL);
    printf("fenced model_backward with a host grad_embeddings: %d '%s'\n", rb, pf_errmsg());
    CHECK(rf == 0 && rb == -EFAULT, "host grad_embeddings: forward %d backward %d", rf, rb);
    free(in);
    model_free(m);
}

/* Downloads n bytes of device memory of m. */
static void *get(model *m, const void *p, size_t n)
{
    void *h = malloc(n ? n : 1);
    if (model_device(m)->mem_d2h(model_ctx(m), h, p, n))
        CHECK(0, "d2h: %s", pf_errmsg());
    return h;
}

static int same(const char *what, const void *a, const void *b, size_t n)
{
    int eq = !memcmp(a, b, n);
    CHECK(eq, "%s differs between cpu and cpu-fenced", what);
    return eq;
}

/* forward (train, eval) + backward on both devices: bit for bit equal */
static void test_bitwise(const char *net, int D, int B)
{
    model_desc d;
    model *mc, *mf;
    if (model_desc_from_name(&d, net, D) || model_create_desc(&mc, &d, B, &ops_cpu) ||
        model_create_desc(&mf, &d, B, ops_device_by_name("cpu-fenced"))) {
        CHECK(0, "%s: %s", net, pf_errmsg());
        return;
    }
    model_init(mc, 7);
    model_init(mf, 7);
    size_t np = model_num_params(mc), nb = model_num_buffer_floats(mc);
    size_t nin = (size_t)B * 3 * 112 * 112, ne = (size_t)B * D;
    float *x = malloc(nin * 4), *g = malloc(ne * 4);
    for (size_t i = 0; i < nin; i++)
        x[i] = sinf(0.011f * (float)i) * cosf(0.0009f * (float)i);
    for (size_t i = 0; i < ne; i++)
        g[i] = cosf(0.3f * (float)i) / (float)ne;
    float *pc = malloc(np * 4), *pf = malloc(np * 4);
    CHECK(!model_get_params(mc, pc) && !model_get_params(mf, pf), "get_params: %s", pf_errmsg());
    same("initial parameters", pc, pf, np * 4);
    /* device buffers for the gradients in, out */
    model *ms[2] = {mc, mf};
    float *emb[2], *gin[2], *grads[2], *bufs[2], *eval[2];
    int ok = 1;
    for (int k = 0; k < 2 && ok; k++) {
        model *m = ms[k];
        const ops_device *dv = model_device(m);
        float *dg, *dgin;
        const float *e;
        ok = !dv->mem_alloc(model_ctx(m), (void **)&dg, ne * 4) &&
             !dv->mem_alloc(model_ctx(m), (void **)&dgin, nin * 4) &&
             !dv->mem_h2d(model_ctx(m), dg, g, ne * 4);
        model_zero_grad(m);
        ok = ok && !model_forward(m, x, B, 1, &e);
        if (ok)
            emb[k] = get(m, e, ne * 4);
        ok = ok && !model_backward(m, dg, dgin);
        if (!ok) {
            CHECK(0, "%s on %s: %s", net, dv->name, pf_errmsg());
            break;
        }
        gin[k] = get(m, dgin, nin * 4);
        grads[k] = malloc(np * 4);
        bufs[k] = malloc(nb * 4);
        CHECK(!model_get_grads(m, grads[k]) && !model_get_buffers(m, bufs[k]), "get: %s", pf_errmsg());
        ok = !model_forward(m, x, B, 0, &e);
        if (ok)
            eval[k] = get(m, e, ne * 4);
        dv->mem_free(model_ctx(m), dg);
        dv->mem_free(model_ctx(m), dgin);
    }
    if (ok) {
        int all = same("embeddings", emb[0], emb[1], ne * 4) &
                  same("parameter gradients", grads[0], grads[1], np * 4) &
                  same("input gradient", gin[0], gin[1], nin * 4) &
                  same("running statistics", bufs[0], bufs[1], nb * 4) &
                  same("eval embeddings", eval[0], eval[1], ne * 4);
        double gs = 0;
        for (size_t i = 0; i < np; i++)
            gs += (double)grads[0][i] * grads[0][i];
        printf("%s D=%d B=%d: %zu parameters, |grad| %.4e: embeddings, gradients, input gradient, "
               "running statistics, eval embeddings bit for bit equal on cpu and cpu-fenced: %s\n",
               net, D, B, np, sqrt(gs), all ? "yes" : "NO");
        CHECK(gs > 0 && isfinite(gs), "gradient norm %g", gs);
        for (int k = 0; k < 2; k++) {
            free(emb[k]);
            free(gin[k]);
            free(grads[k]);
            free(bufs[k]);
            free(eval[k]);
        }
    }
    /* checkpoint across devices and get/set */
    char path[] = "/tmp/pfcps_fenced_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0)
        close(fd);
    model_extra x2[1] = {{"scale", 1024.0}}, y[1];
    int n = 0;
    model_init(mc, 99);
    CHECK(!model_save_ex(mf, path, x2, 1) && !model_load_ex(mc, path, y, 1, &n) && n == 1 &&
              y[0].value == 1024.0,
          "fenced save -> cpu load: %s", pf_errmsg());
    CHECK(!model_get_params(mc, pc) && !model_get_params(mf, pf), "get_params");
    same("parameters after fenced save, cpu load", pc, pf, np * 4);
    for (size_t i = 0; i < np; i++)
        pc[i] = (float)i * 1e-6f;
    CHECK(!model_set_params(mc, pc) && !model_save(mc, path) && !model_load(mf, path) &&
              !model_get_params(mf, pf),
          "cpu save -> fenced load: %s", pf_errmsg());
    same("parameters after set, cpu save, fenced load", pc, pf, np * 4);
    unlink(path);
    free(pc);
    free(pf);
    free(x);
    free(g);
    model_free(mc);
    model_free(mf);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    double t0 = now();
    if (argc > 1 && !strcmp(argv[1], "--mbf")) { /* the larger network: not in the sanitizer build */
        test_bitwise("mbf", 32, 2);
        printf("[%.1f s]\n%s (%d failures)\n", now() - t0, fails ? "FAIL" : "PASS", fails);
        return fails != 0;
    }
    test_names();
    test_entries(&ops_cpu);
    test_entries(ops_device_by_name("cpu-fenced"));
    test_fence();
    printf("[%.1f s]\n", now() - t0);
    test_bitwise("r18_w16", 32, 2);

    printf("%s (%d failures)\n", fails ? "FAIL" : "PASS", fails);
    return fails != 0;
}
