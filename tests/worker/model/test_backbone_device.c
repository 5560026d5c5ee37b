/* The tiny reference networks of $PFCPS_REFERENCE/backbone (float64 PyTorch) through worker/model
 * on one device, named by argv[1] (ops_device_by_name), with every tensor in that device's memory:
 *   cpu-fenced - the CPU device behind PROT_NONE device memory (runs everywhere: proves that
 *                worker/model touches device memory only through the device),
 *   cpu        - the CPU device,
 *   cuda       - the CUDA device with PFCPS_CUDA_BN=exact (float64 batch-norm sums, as the CPU device),
 *   cuda-cudnn - the CUDA device with cuDNN batch norm (fp32 statistics: gradients held to 1e-2);
 * a device whose context cannot be created for want of hardware (-ENODEV) SKIPs (exit 77).
 * First the device's memory and optimizer entries against the CPU device (kernels/ops.h): fresh
 * random inputs each run, outputs poisoned with NaN first; sgd_step, adamw_step and scale bit for bit
 * (same float32 operation order), sumsq to 1e-10 relative (the bound n * eps of a 1e5-term sum in
 * any order). Then r18_w16 (and, off the CPU, mbf) against the same network on the CPU device
 * (compare_to_cpu). Then per network one training forward
 * (output, running statistics), one backward (every parameter gradient but the fixed
 * features.weight, grad_input), one eval forward (eval_output). Each tensor's relative error
 * ||got - ref|| / ||ref|| must be <= 1e-4 (tensors whose reference is rounding noise, rms < 1e-9,
 * are held to max abs <= 1e-4). Gradients of a network with a PReLU input within 1e-7 rms of the
 * kink are held to 1e-2 instead (printed): fp32 can take the other branch there than float64
 * PyTorch, which moves every upstream gradient by ~1e-3. Before the run every activation and
 * activation-gradient buffer, the parameter gradients (model_zero_grad must clear them all) and
 * grad_input are poisoned with NaN; a NaN in any checked tensor fails. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "tests/check.h"
#include "tests/npy.h"
#include "tests/reference/ref.h"
#include "worker/model/model_internal.h"

#define TOL           1e-4
#define GRAD_TOL_KINK 1e-2
/* Two fp32 devices against each other (compare_to_cpu) after a PReLU input took the other branch on one of
 * them, or with cuDNN's fp32 batch-norm statistics: on an H200, small batch-norm bias and weight gradients of
 * mbf moved by up to 1.4e-2 of themselves (3 of 10 runs above 1e-2; bench/RESULTS.md, "GPU"). */
#define GRAD_TOL_FLIP 3e-2
/* fp32 rounding of an activation is ~1e-7 of its scale: closer than that to 0 it may flip. */
#define KINK_REL 1e-7

/* cuDNN batch norm: fp32 statistics move activations across PReLU kinks (~1e-3 on gradients, as
 * oneDNN's fp32 statistics did on the CPU device): gradients held to GRAD_TOL_KINK. */
static int fp32_stats;
static double worst;

/* got against ref: ||got - ref|| / ||ref|| <= tol. A reference that is rounding noise is compared by its
 * largest difference instead: with scale = 0, one of rms < 1e-9 (float64 references), held to max abs <= tol;
 * with scale > 0 (the rms of the whole network's gradient in an fp32 reference), one of rms < NOISE_REL *
 * scale, held to max abs / scale <= tol. The second kind is analytically zero: the bias gradient of a batch
 * norm whose output reaches the loss only through training-mode batch norms and linear layers (iresnet's
 * bn3 and downsample, mbf's projection) is a per-channel sum of input gradients of those batch norms, which
 * sum to zero per channel (float64 PyTorch: ~1e-14 of the gradient scale); in fp32 it is summation noise,
 * and two devices' noise differs by 100% of itself. */
#define NOISE_REL 1e-4
static void cmp_scaled(const char *net, const char *what, const float *got, const double *ref, size_t n,
                       double tol, double scale)
{
    double num = 0, den = 0, mx = 0;
    int nan = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]))
            nan = 1;
        double e = got[i] - ref[i];
        num += e * e;
        den += ref[i] * ref[i];
        if (fabs(e) > mx)
            mx = fabs(e);
    }
    double rms = sqrt(den / (double)(n ? n : 1));
    int noise = scale > 0 ? rms < NOISE_REL * scale : rms < 1e-9;
    double err = !noise ? sqrt(num / den) : scale > 0 ? mx / scale : mx;
    int bad = nan || !(err <= tol);
    /* Counted as check() counts (tests/check.h); printed when failed, and every 16th passing comparison. */
    checks++;
    failures += bad;
    if (!nan && err > worst)
        worst = err;
    if (bad || checks % 16 == 1)
        printf("%-4s %s %-36s n %-8zu %s %.3e%s\n", bad ? "FAIL" : "ok", net, what, n,
               !noise      ? "rel"
               : scale > 0 ? "max abs / gradient rms"
                           : "max abs",
               err, nan ? " (NaN: not written)" : "");
}

static void cmp(const char *net, const char *what, const float *got, const double *ref, size_t n, double tol)
{
    cmp_scaled(net, what, got, ref, n, tol, 0);
}

/* Downloads n floats of the model's device memory at p (after the queued work). */
static float *get(model *m, const float *p, size_t n)
{
    const ops_device *d = model_device(m);
    float *h = malloc(n * sizeof *h);
    if (!h || d->sync(model_ctx(m)) || d->mem_d2h(model_ctx(m), h, p, n * sizeof *h))
        DIE("download");
    return h;
}

/* ---- the device's memory and optimizer entries against the CPU device ---- */

static int bits_equal(const char *what, const float *a, const float *b, size_t n)
{
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
        if (memcmp(&a[i], &b[i], 4))
            bad = i;
    if (bad == n)
        check(1, "%s: bit for bit as the cpu device", what);
    else
        check(0, "%s: element %zu: device %.9g, cpu %.9g", what, bad, (double)a[bad], (double)b[bad]);
    return bad == n;
}

static void check_utilities(const ops_device *dv, ops_ctx *c)
{
    const size_t n = 100003; /* not a multiple of a block */
    const size_t bytes = n * sizeof(float);
    float *hw = malloc(bytes), *hg = malloc(bytes), *hm = malloc(bytes), *hv = malloc(bytes);
    float *cw = malloc(bytes), *cm = malloc(bytes), *cv = malloc(bytes), *got = malloc(bytes),
          *nan = malloc(bytes);
    float *dw, *dg, *dm, *dv2;
    if (dv->mem_alloc(c, (void **)&dw, bytes) || dv->mem_alloc(c, (void **)&dg, bytes) ||
        dv->mem_alloc(c, (void **)&dm, bytes) || dv->mem_alloc(c, (void **)&dv2, bytes))
        DIE("mem_alloc");
    for (size_t i = 0; i < n; i++) {
        hw[i] = 0.5f * frand(-1, 1);
        hg[i] = 0.01f * frand(-1, 1);
        hm[i] = 0.001f * frand(-1, 1);
        hv[i] = 1e-5f * (frand(-1, 1) + 1.0f);
        nan[i] = NAN;
    }
    /* zero-filled allocation, then poisoned */
    if (dv->mem_d2h(c, got, dw, bytes))
        DIE("mem_d2h");
    size_t nz = 0;
    for (size_t i = 0; i < n; i++)
        nz += got[i] != 0.0f;
    check(nz == 0, "%s mem_alloc zero-filled: %zu non-zero of %zu", dv->name, nz, n);
    /* SGD with momentum and weight decay, 2 steps */
    memcpy(cw, hw, bytes);
    memcpy(cm, hm, bytes);
    if (dv->mem_h2d(c, dw, nan, bytes) || dv->mem_h2d(c, dw, hw, bytes) || dv->mem_h2d(c, dg, hg, bytes) ||
        dv->mem_h2d(c, dm, hm, bytes))
        DIE("mem_h2d");
    for (int s = 0; s < 2; s++) {
        if (dv->sgd_step(c, dw, dg, dm, n, 0.1f, 0.9f, 5e-4f))
            DIE("sgd_step");
        ops_cpu.sgd_step(NULL, cw, hg, cm, n, 0.1f, 0.9f, 5e-4f);
    }
    if (dv->mem_d2h(c, got, dw, bytes))
        DIE("mem_d2h");
    int ok = bits_equal("sgd_step weights", got, cw, n);
    if (dv->mem_d2h(c, got, dm, bytes))
        DIE("mem_d2h");
    ok &= bits_equal("sgd_step momentum", got, cm, n);
    /* AdamW steps 1..2 */
    memcpy(cw, hw, bytes);
    memcpy(cm, hm, bytes);
    memcpy(cv, hv, bytes);
    if (dv->mem_h2d(c, dw, hw, bytes) || dv->mem_h2d(c, dm, hm, bytes) || dv->mem_h2d(c, dv2, hv, bytes))
        DIE("mem_h2d");
    for (int s = 1; s <= 2; s++) {
        if (dv->adamw_step(c, dw, dg, dm, dv2, n, 1e-3, 0.9, 0.999, 1e-8, 1e-2, s))
            DIE("adamw_step");
        ops_cpu.adamw_step(NULL, cw, hg, cm, cv, n, 1e-3, 0.9, 0.999, 1e-8, 1e-2, s);
    }
    if (dv->mem_d2h(c, got, dw, bytes))
        DIE("mem_d2h");
    ok &= bits_equal("adamw_step weights", got, cw, n);
    if (dv->mem_d2h(c, got, dv2, bytes))
        DIE("mem_d2h");
    ok &= bits_equal("adamw_step second moment", got, cv, n);
    /* scale, d2d, zero, sumsq */
    memcpy(cw, hw, bytes);
    ops_cpu.scale(NULL, cw, n, 0.37f);
    if (dv->mem_h2d(c, dm, nan, bytes) || dv->mem_h2d(c, dw, hw, bytes) || dv->mem_d2d(c, dm, dw, bytes) ||
        dv->scale(c, dm, n, 0.37f) || dv->mem_d2h(c, got, dm, bytes))
        DIE("d2d / scale");
    ok &= bits_equal("d2d + scale", got, cw, n);
    double ss = 0, ref = 0;
    for (size_t i = 0; i < n; i++)
        ref += (double)hw[i] * hw[i];
    if (dv->sumsq(c, dw, n, &ss))
        DIE("sumsq");
    double rel = fabs(ss - ref) / ref;
    check(rel <= 1e-10, "%s sumsq vs float64: rel %.2e", dv->name, rel);
    ok &= rel <= 1e-10;
    float inf_at[1] = {INFINITY};
    double s_inf = 0;
    if (dv->mem_h2d(c, dw + 777, inf_at, 4) || dv->sumsq(c, dw, n, &s_inf))
        DIE("sumsq inf");
    check(isinf(s_inf), "%s sumsq with an inf: %g", dv->name, s_inf);
    if (dv->mem_zero(c, dw, bytes) || dv->sumsq(c, dw, n, &ss))
        DIE("mem_zero");
    check(ss == 0.0, "%s sumsq after mem_zero: %g", dv->name, ss);
    printf("%s utilities vs cpu: sgd_step, adamw_step, d2d+scale bit for bit %s; sumsq rel %.2e, with an inf "
           "%g, "
           "after mem_zero %g\n",
           dv->name, ok ? "yes" : "NO", rel, s_inf, ss);
    dv->mem_free(c, dw);
    dv->mem_free(c, dg);
    dv->mem_free(c, dm);
    dv->mem_free(c, dv2);
    free(hw);
    free(hg);
    free(hm);
    free(hv);
    free(cw);
    free(cm);
    free(cv);
    free(got);
    free(nan);
}

/* ---- reference networks ---- */

static int int_list(const char *json, const char *key, int out[4])
{
    const char *p = strstr(json, key);
    if (!p || !(p = strchr(p, '[')))
        return -1;
    p++;
    for (int i = 0; i < 4; i++) {
        while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t' || *p == ',')
            p++;
        char *end;
        out[i] = (int)strtol(p, &end, 10);
        if (end == p)
            return -1;
        p = end;
    }
    return 0;
}

/* After a training forward (before the backward): every PReLU input of m in plain NCHW (the device's
 * to_plain: the CPU device keeps channel blocks, nChw8c), concatenated in layer order; *n their count. */
static float *prelu_inputs(model *m, size_t *n)
{
    size_t total = 0, most = 0, off = 0;
    for (int i = 0; i < m->n_layers; i++)
        if (m->layers[i].kind == LK_PRELU) {
            size_t k = (size_t)m->last_B * m->acts[m->layers[i].in].per_sample;
            total += k;
            most = k > most ? k : most;
        }
    float *out = malloc((total ? total : 1) * sizeof *out), *plain;
    if (m->dev->mem_alloc(m->ctx, (void **)&plain, (most ? most : 1) * sizeof(float)))
        DIE("PReLU input buffer");
    for (int i = 0; i < m->n_layers; i++) {
        if (m->layers[i].kind != LK_PRELU)
            continue;
        const mact *a = &m->acts[m->layers[i].in];
        size_t k = (size_t)m->last_B * a->per_sample;
        if (m->dev->to_plain(m->ctx, plain, a->data, m->last_B, a->C, a->H * a->W) || m->dev->sync(m->ctx) ||
            m->dev->mem_d2h(m->ctx, out + off, plain, k * sizeof(float)))
            DIE("PReLU input to plain layout");
        off += k;
    }
    m->dev->mem_free(m->ctx, plain);
    *n = total;
    return out;
}

/* The PReLU inputs of the same network's training forward on two devices (prelu_inputs): the number
 * whose sign differs (the two fp32 runs took different branches of the kink). Their largest difference,
 * relative to the rms of all of them, must be below 1e-3 (the outputs' tolerance): a bigger one means the
 * forwards differ, or the two were not read in the same layout. */
static size_t branch_flips(const float *a, const float *b, size_t n, const char *tag)
{
    size_t flips = 0;
    double ss = 0, mx = 0;
    for (size_t j = 0; j < n; j++) {
        flips += (a[j] > 0) != (b[j] > 0);
        ss += (double)a[j] * a[j];
        if (fabs((double)a[j] - b[j]) > mx)
            mx = fabs((double)a[j] - b[j]);
    }
    double rel = mx / sqrt(ss / (double)(n ? n : 1));
    check(rel <= 1e-3, "%s: PReLU inputs agree to %.2e of their rms (%zu of them)", tag, rel, n);
    return flips;
}

/* After a training forward: number of PReLU inputs x with |x| <= rel * rms(that PReLU's input). */
static size_t near_kink(model *m, double rel)
{
    size_t count = 0;
    if (m->dev->act_bytes != 4)
        return 0;
    for (int i = 0; i < m->n_layers; i++) {
        const mlayer *l = &m->layers[i];
        if (l->kind != LK_PRELU)
            continue;
        size_t k = (size_t)m->last_B * m->acts[l->in].per_sample;
        float *h = get(m, m->acts[l->in].data, k);
        double ss = 0;
        for (size_t j = 0; j < k; j++)
            ss += (double)h[j] * h[j];
        double thr = rel * sqrt(ss / (double)k);
        for (size_t j = 0; j < k; j++)
            count += fabs((double)h[j]) <= thr;
        free(h);
    }
    return count;
}

/* Fills every activation and activation-gradient buffer of m with NaN (bytes of 0xFF: a NaN in
 * fp32, fp16 and bf16 alike). */
static void poison_internals(model *m)
{
    size_t most = 0;
    for (int t = 0; t < m->n_acts; t++)
        if (m->acts[t].per_sample * m->acts[t].elem > most)
            most = m->acts[t].per_sample * m->acts[t].elem;
    for (int k = 0; k < m->n_pool; k++)
        if (m->pool_cap[k] > most)
            most = m->pool_cap[k];
    most *= (size_t)m->B_cap;
    unsigned char *nan = malloc(most);
    memset(nan, 0xFF, most);
    for (int t = 0; t < m->n_acts; t++)
        if (m->dev->mem_h2d(m->ctx, m->acts[t].data, nan,
                            m->acts[t].per_sample * m->acts[t].elem * (size_t)m->B_cap))
            DIE("poison activations");
    for (int k = 0; k < m->n_pool; k++)
        if (m->dev->mem_h2d(m->ctx, m->pool[k], nan, m->pool_cap[k] * (size_t)m->B_cap))
            DIE("poison gradient pool");
    free(nan);
}

static double *load_ref(const char *dir, const char *file, size_t count, const char *net)
{
    npy_array a;
    if (npy_load2(dir, file, &a) || a.count != count) {
        DIE("%s %s/%s: count %zu, expected %zu", net, dir, file, a.count, count);
    }
    double *r = npy_to_f64(&a);
    npy_free(&a);
    return r;
}

static void run_net(const char *dir, const char *name, const ops_device *dev)
{
    char path[1600], sub[1700];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *meta = npy_read_text(path, "meta.json");
    model_desc d;
    memset(&d, 0, sizeof d);
    d.kind = MODEL_IRESNET;
    snprintf(d.name, sizeof d.name, "%.31s", name);
    if (!meta || int_list(meta, "\"layers\"", d.layers) || int_list(meta, "\"widths\"", d.widths)) {
        DIE("%s/meta.json unreadable", path);
    }
    d.embedding_size = (int)npy_json_number(meta, "num_features", 0);
    int B = (int)npy_json_number(meta, "batch", 0);
    free(meta);
    model *m;
    if (model_create_desc(&m, &d, B, dev))
        DIE("%s", name);
    ops_ctx *c = model_ctx(m);
    size_t np = model_num_params(m), nbuf = model_num_buffer_floats(m);
    printf("%s on %s: layers %d %d %d %d widths %d %d %d %d D %d B %d, %zu parameters\n", name, dev->name,
           d.layers[0], d.layers[1], d.layers[2], d.layers[3], d.widths[0], d.widths[1], d.widths[2],
           d.widths[3], d.embedding_size, B, np);
    /* parameters, uploaded through the host copy */
    float *hp = malloc(np * sizeof *hp);
    snprintf(sub, sizeof sub, "%s/params", path);
    for (int i = 0; i < model_num_tensors(m); i++) {
        const model_tensor *t = model_tensor_at(m, i);
        char f[128];
        snprintf(f, sizeof f, "%s.npy", t->name);
        double *v = load_ref(sub, f, t->count, name);
        for (size_t k = 0; k < t->count; k++)
            hp[t->offset + k] = (float)v[k];
        free(v);
    }
    if (model_set_params(m, hp))
        DIE("model_set_params");
    size_t nout = (size_t)B * d.embedding_size, nin = (size_t)B * 3 * 112 * 112;
    npy_array ai, ag;
    if (npy_load2(path, "input.npy", &ai) || npy_load2(path, "grad_output.npy", &ag) || ai.count != nin ||
        ag.count != nout)
        DIE("%s", name);
    float *hin = npy_to_f32(&ai), *hg = npy_to_f32(&ag);
    double *rout = load_ref(path, "output.npy", nout, name),
           *rgi = load_ref(path, "grad_input.npy", nin, name);
    double *reo = load_ref(path, "eval_output.npy", nout, name);
    /* device buffers: the embedding gradient in, the input gradient out (poisoned); gradients poisoned */
    float *dg = NULL, *dgi = NULL, *poison = malloc((np > nin ? np : nin) * sizeof(float));
    for (size_t i = 0; i < (np > nin ? np : nin); i++)
        poison[i] = NAN;
    if (dev->mem_alloc(c, (void **)&dg, nout * 4) || dev->mem_alloc(c, (void **)&dgi, nin * 4) ||
        dev->mem_h2d(c, dg, hg, nout * 4) || dev->mem_h2d(c, dgi, poison, nin * 4) ||
        dev->mem_h2d(c, model_grads(m), poison, np * 4))
        DIE("device buffers");
    /* An eval forward allocates the activations without changing the model (no dropout here); then
     * every activation and activation-gradient buffer is poisoned with NaN: an element a layer fails
     * to write propagates NaN to the checked outputs. */
    const float *emb;
    if (model_forward(m, hin, B, 0, &emb))
        DIE("eval forward (allocation)");
    poison_internals(m);
    model_zero_grad(m);
    if (model_forward(m, hin, B, 1, &emb))
        DIE("training forward");
    float *h = get(m, emb, nout);
    if (model_backward(m, dg, dgi))
        DIE("backward");
    /* Gradients are held to 1e-4 unless an activation sits within KINK_REL rms of a PReLU kink: fp32
     * may then take the other branch than PyTorch's float64 and move upstream gradients by ~1e-3
     * (tests/worker/model/test_model_reference.c); those networks' gradients are held to GRAD_TOL_KINK.
     * (The activations are still those of the training forward.) */
    size_t kinks = near_kink(m, KINK_REL);
    double gtol = kinks == 0 && !fp32_stats ? TOL : GRAD_TOL_KINK;
    printf("%s: %zu PReLU inputs within %.0e rms of the kink: gradients held to %.0e\n", name, kinks,
           KINK_REL, gtol);
    cmp(name, "output", h, rout, nout, TOL);
    free(h);
    h = get(m, dgi, nin);
    cmp(name, "grad_input", h, rgi, nin, gtol);
    free(h);
    float *hgr = malloc(np * 4), *hrun = malloc(nbuf * 4);
    if (dev->sync(c) || model_get_grads(m, hgr) || model_get_buffers(m, hrun))
        DIE("model_get_grads / model_get_buffers");
    snprintf(sub, sizeof sub, "%s/grads", path);
    for (int i = 0; i < model_num_tensors(m); i++) {
        const model_tensor *t = model_tensor_at(m, i);
        if (t->flags & MODEL_TENSOR_FIXED)
            continue;
        char f[128], what[128];
        snprintf(f, sizeof f, "%s.npy", t->name);
        double *r = load_ref(sub, f, t->count, name);
        snprintf(what, sizeof what, "grad %s", t->name);
        cmp(name, what, hgr + t->offset, r, t->count, gtol);
        free(r);
    }
    snprintf(sub, sizeof sub, "%s/running", path);
    for (int i = 0; i < model_num_buffer_tensors(m); i++) {
        const model_tensor *t = model_buffer_tensor_at(m, i);
        char f[128];
        snprintf(f, sizeof f, "%s.npy", t->name);
        double *r = load_ref(sub, f, t->count, name);
        cmp(name, t->name, hrun + t->offset, r, t->count, TOL);
        free(r);
    }
    /* eval forward with the updated running statistics */
    if (model_forward(m, hin, B, 0, &emb))
        DIE("eval forward");
    h = get(m, emb, nout);
    cmp(name, "eval_output", h, reo, nout, TOL);
    free(h);
    free(hgr);
    free(hrun);
    free(hp);
    free(hin);
    free(hg);
    free(rout);
    free(rgi);
    free(reo);
    free(poison);
    dev->mem_free(c, dg);
    dev->mem_free(c, dgi);
    npy_free(&ai);
    npy_free(&ag);
    model_free(m);
}

/* A network without a PyTorch reference here (mbf: grouped and depthwise convolutions, Linear without
 * bias, trainable BatchNorm1d), or a narrow iresnet, on the device against the same network on the CPU
 * device: same initialization, fresh random input and embedding gradient; training forward + backward.
 * Outputs and running statistics within 1e-3 relative, gradients within 1e-3 (GRAD_TOL_FLIP when a PReLU
 * input has the other sign on the device than on the CPU: the two fp32 forwards differ by rounding of ~1e-5
 * of the activations' scale, and an input that close to 0 takes the other branch, which moves every upstream
 * gradient by ~1e-3 and small ones by more; or with cuDNN's fp32 batch-norm statistics); a gradient that is
 * rounding noise at the scale of the network's whole gradient is held by its largest difference relative to
 * that scale (cmp_scaled says why such gradients exist). */
static void compare_to_cpu(const ops_device *dev, const char *net, int D, int B)
{
    model_desc d;
    model *mc, *md;
    if (model_desc_from_name(&d, net, D) || model_create_desc(&mc, &d, B, &ops_cpu) ||
        model_create_desc(&md, &d, B, dev))
        DIE("%s", net);
    model_init(mc, 3);
    model_init(md, 3);
    size_t nin = (size_t)B * 3 * 112 * 112, ne = (size_t)B * D, np = model_num_params(mc);
    size_t nb = model_num_buffer_floats(mc);
    float *x = malloc(nin * 4), *g = malloc(ne * 4), *gin_c = malloc(nin * 4);
    for (size_t i = 0; i < nin; i++)
        x[i] = frand(-1, 1);
    for (size_t i = 0; i < ne; i++)
        g[i] = frand(-1, 1) / (float)ne;
    const float *ec, *ed;
    model_zero_grad(mc);
    model_zero_grad(md);
    float *dg, *dgin;
    ops_ctx *c = model_ctx(md);
    if (dev->mem_alloc(c, (void **)&dg, ne * 4) || dev->mem_alloc(c, (void **)&dgin, nin * 4) ||
        dev->mem_h2d(c, dg, g, ne * 4))
        DIE("device buffers");
    size_t npr, npr_d;
    if (model_forward(mc, x, B, 1, &ec))
        DIE("cpu forward");
    float *pr_c = prelu_inputs(mc, &npr);
    if (model_backward(mc, g, gin_c))
        DIE("cpu backward");
    if (model_forward(md, x, B, 1, &ed))
        DIE("device forward");
    float *pr_d = prelu_inputs(md, &npr_d);
    if (npr_d != npr)
        DIE("%s: %zu PReLU inputs on the device, %zu on the CPU", net, npr_d, npr);
    char tag[64];
    snprintf(tag, sizeof tag, "%s-vs-cpu", net);
    size_t kinks = branch_flips(pr_c, pr_d, npr, tag);
    free(pr_c);
    free(pr_d);
    float *emb = get(md, ed, ne);
    if (model_backward(md, dg, dgin))
        DIE("device backward");
    float *gin = get(md, dgin, nin), *gr = malloc(np * 4), *run = malloc(nb * 4);
    if (model_get_grads(md, gr) || model_get_buffers(md, run))
        DIE("device get");
    double gtol = kinks == 0 && !fp32_stats ? 1e-3 : GRAD_TOL_FLIP;
    printf(
        "%s D=%d B=%d on %s vs cpu: %zu PReLU inputs on the other side of the kink: gradients held to %.0e\n",
        net, D, B, dev->name, kinks, gtol);
    size_t most = np > nin ? np : nin;
    double *ref = malloc(most * sizeof *ref);
    for (size_t i = 0; i < ne; i++)
        ref[i] = ec[i];
    cmp(tag, "output", emb, ref, ne, 1e-3);
    for (size_t i = 0; i < nin; i++)
        ref[i] = gin_c[i];
    cmp(tag, "grad_input", gin, ref, nin, gtol);
    const float *gc = model_grads(mc), *rc = model_buffers(mc);
    double gss = 0;
    size_t gn = 0;
    for (int i = 0; i < model_num_tensors(mc); i++) {
        const model_tensor *t = model_tensor_at(mc, i);
        if (t->flags & MODEL_TENSOR_FIXED)
            continue;
        for (size_t k = 0; k < t->count; k++)
            gss += (double)gc[t->offset + k] * gc[t->offset + k];
        gn += t->count;
    }
    double gscale = sqrt(gss / (double)(gn ? gn : 1));
    for (int i = 0; i < model_num_tensors(mc); i++) {
        const model_tensor *t = model_tensor_at(mc, i);
        if (t->flags & MODEL_TENSOR_FIXED)
            continue;
        for (size_t k = 0; k < t->count; k++)
            ref[k] = gc[t->offset + k];
        char what[128];
        snprintf(what, sizeof what, "grad %s", t->name);
        cmp_scaled(tag, what, gr + t->offset, ref, t->count, gtol, gscale);
    }
    for (size_t i = 0; i < nb; i++)
        ref[i] = rc[i];
    cmp(tag, "running statistics", run, ref, nb, 1e-3);
    free(ref);
    free(x);
    free(g);
    free(gin_c);
    free(emb);
    free(gin);
    free(gr);
    free(run);
    dev->mem_free(c, dg);
    dev->mem_free(c, dgin);
    model_free(mc);
    model_free(md);
}

int main(int argc, char **argv)
{
    const char *which = argc > 1 ? argv[1] : "cpu-fenced";
    const char *devname = which;
    if (!strcmp(which, "cuda")) {
        setenv("PFCPS_CUDA_BN", "exact", 1);
    } else if (!strcmp(which, "cuda-cudnn")) {
        unsetenv("PFCPS_CUDA_BN");
        fp32_stats = 1;
        devname = "cuda";
    }
    const ops_device *dev = ops_device_by_name(devname);
    if (!dev)
        DIE("device '%s'", devname);
    if (dev->act_bytes != 4) {
        printf("FAIL: %s is a mixed-precision device (tests/worker/model/test_model_half.c covers those)\n",
               dev->name);
        return 1;
    }
    ops_ctx *c;
    int rc = dev->ctx_create(&c);
    if (rc == -ENODEV) {
        printf("SKIP: device %s: %s (reference networks not run)\n", dev->name, pf_errmsg());
        return 77;
    }
    if (rc)
        DIE("ctx_create");
    if (!strncmp(which, "cuda", 4))
        printf("CUDA device, batch norm %s\n",
               fp32_stats ? "cuDNN (fp32 statistics)" : "exact (float64 sums)");
    test_seed_mixed(); /* fresh inputs each run, PFCPS_TEST_SEED replays */
    check_utilities(dev, c);
    dev->ctx_destroy(c);
    /* networks against the CPU device (on a CPU device a narrow iresnet only: it is the CPU device) */
    compare_to_cpu(dev, "r18_w16", 64, 2);
    if (strncmp(dev->name, "cpu", 3))
        compare_to_cpu(dev, "mbf", 64, 3);
    char dir[1200];
    int missing = ref_dir(dir, sizeof dir, "backbone");
    if (missing)
        return fails + failures ? check_summary() : missing;
    DIR *dp = opendir(dir);
    if (!dp) {
        printf("FAIL: cannot open %s\n", dir);
        return 1;
    }
    struct dirent *de;
    int nets = 0;
    while ((de = readdir(dp)))
        if (!strncmp(de->d_name, "iresnet_", 8)) {
            run_net(dir, de->d_name, dev);
            nets++;
        }
    closedir(dp);
    printf("%d networks on %s, %d checks, %d failed, worst error %.3e (relative, or for a rounding-noise "
           "tensor its max abs / the gradient rms; tolerance %.0e; gradients of a network with a near-kink "
           "PReLU input %.0e; device vs CPU 1e-3, after a kink flip %.0e)\n",
           nets, which, checks, failures, worst, TOL, GRAD_TOL_KINK, GRAD_TOL_FLIP);
    CHECK(nets > 0, "no iresnet_* network in %s", dir);
    return check_summary();
}
