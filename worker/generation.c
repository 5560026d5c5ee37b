/* Two generations of a worker's training state (see generation.h). */
#include "worker/generation.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

/* One generation: the device arrays in one allocation (parameters, buffers, optimizer arrays, gradients when
 * accumulating, in that order) and the host state. */
typedef struct wgen_slot {
    int64_t step; /* the step whose start this holds; -1: empty */
    float *dev;   /* device: params (np) | buffers (nb) | opt[0..n_opt) (np each) | grads (np, acc_k > 1) |
                     worker 0's buffers (nb, src.bn0) */
    int64_t opt_steps;
    loss_scaler scaler;
    uint64_t rng;
    int64_t acc_n;
    int64_t *acc_ids; /* host (acc_cap), acc_k > 1 */
    float *acc_rows;  /* host (acc_cap x row_floats), acc_k > 1 */
} wgen_slot;

struct wgen {
    wgen_src src;
    const ops_device *dev;
    ops_ctx *ctx;
    size_t np, nb; /* model_num_params, model_num_buffer_floats */
    wgen_slot slot[2];
};

/* Whether generations hold a window's gradients and class-center sums (kept inside windows). */
static int holds_window(const wgen_src *src)
{
    return src->acc_k > 1 && !src->starts_only;
}

/* Floats of a slot's device allocation. */
static size_t dev_floats(const wgen *g)
{
    return g->np * (size_t)(1 + g->src.n_opt + holds_window(&g->src)) + g->nb * (size_t)(1 + !!g->src.bn0);
}

int wgen_create(wgen **out, const wgen_src *src)
{
    *out = NULL;
    if (!src->m || src->n_opt < 0 || src->n_opt > 2 || !src->opt_steps || src->acc_k < 1 ||
        (src->n_opt >= 1 && !src->opt[0]) || (src->n_opt == 2 && !src->opt[1]))
        return pf_err(-EINVAL, "generations: no model, optimizer arrays or step count");
    if (src->acc_k > 1 &&
        (!src->acc_ids || !src->acc_rows || !src->acc_n || src->acc_cap < 0 || src->row_floats < 0))
        return pf_err(-EINVAL, "generations: gradient_acc = %d without its class-center sums", src->acc_k);
    wgen *g = calloc(1, sizeof *g);
    if (!g)
        return pf_err(-ENOMEM, "out of memory");
    g->src = *src;
    g->dev = model_device(src->m);
    g->ctx = model_ctx(src->m);
    g->np = model_num_params(src->m);
    g->nb = model_num_buffer_floats(src->m);
    const size_t bytes = dev_floats(g) * sizeof(float);
    int rc = 0;
    for (int i = 0; i < 2 && rc == 0; i++) {
        g->slot[i].step = -1;
        rc = g->dev->mem_alloc(g->ctx, (void **)&g->slot[i].dev, bytes);
        if (rc < 0) {
            rc = pf_err_wrap(rc, "generations: %zu bytes of device memory", bytes);
            break;
        }
        if (holds_window(src)) {
            const size_t cap = src->acc_cap > 0 ? (size_t)src->acc_cap : 1;
            g->slot[i].acc_ids = malloc(cap * sizeof(int64_t));
            g->slot[i].acc_rows = malloc((cap * (size_t)src->row_floats + 1) * sizeof(float));
            if (!g->slot[i].acc_ids || !g->slot[i].acc_rows)
                rc = pf_err(-ENOMEM, "generations: class-center sums of %lld rows", (long long)src->acc_cap);
        }
    }
    if (rc < 0) {
        wgen_free(g);
        return rc;
    }
    *out = g;
    return 0;
}

void wgen_free(wgen *g)
{
    if (!g)
        return;
    for (int i = 0; i < 2; i++) {
        if (g->slot[i].dev)
            g->dev->mem_free(g->ctx, g->slot[i].dev);
        free(g->slot[i].acc_ids);
        free(g->slot[i].acc_rows);
    }
    free(g);
}

/* Does step `step` sit inside a gradient_acc window (the gradients then carry the window's earlier steps)? */
static int in_window(const wgen *g, int64_t step)
{
    return g->src.acc_k > 1 && step % g->src.acc_k != 0;
}

/* Copies between the live state and slot s: to_slot = 1 keeps, 0 restores. The device arrays first (queued
 * on CUDA; the gradients only inside a gradient_acc window), then the host state. Returns 0 or the device's
 * error. */
static int copy_state(wgen *g, wgen_slot *s, int64_t step, int to_slot)
{
    const wgen_src *src = &g->src;
    model *m = src->m;
    float *live[6] = {model_params(m), model_buffers(m)};
    size_t n[6] = {g->np, g->nb};
    int k = 2;
    for (int i = 0; i < src->n_opt; i++, k++) {
        live[k] = src->opt[i];
        n[k] = g->np;
    }
    if (in_window(g, step)) {
        live[k] = model_grads(m);
        n[k++] = g->np;
    }
    if (src->bn0) {
        live[k] = src->bn0;
        n[k++] = g->nb;
    }
    float *at = s->dev;
    for (int i = 0; i < k; i++) {
        int rc = to_slot ? g->dev->mem_d2d(g->ctx, at, live[i], n[i] * sizeof(float))
                         : g->dev->mem_d2d(g->ctx, live[i], at, n[i] * sizeof(float));
        if (rc < 0)
            return pf_err_wrap(rc, "generation of step %lld: device copy", (long long)step);
        at += n[i];
    }
    if (to_slot) {
        s->opt_steps = *src->opt_steps;
        if (src->scaler)
            s->scaler = *src->scaler;
        s->rng = model_rng_state(m);
    } else {
        *src->opt_steps = s->opt_steps;
        if (src->scaler)
            *src->scaler = s->scaler;
        model_set_rng_state(m, s->rng);
    }
    if (src->acc_k > 1 && !holds_window(src)) {
        if (to_slot)
            s->acc_n = 0; /* wgen_keep checked that the sums are empty */
        else
            *src->acc_n = 0;
    } else if (src->acc_k > 1) {
        const int64_t rows = to_slot ? *src->acc_n : s->acc_n;
        const size_t rf = (size_t)src->row_floats;
        int64_t *ids_from = to_slot ? *src->acc_ids : s->acc_ids,
                *ids_to = to_slot ? s->acc_ids : *src->acc_ids;
        float *rows_from = to_slot ? *src->acc_rows : s->acc_rows,
              *rows_to = to_slot ? s->acc_rows : *src->acc_rows;
        if (rows > 0) {
            memcpy(ids_to, ids_from, (size_t)rows * sizeof(int64_t));
            memcpy(rows_to, rows_from, (size_t)rows * rf * sizeof(float));
        }
        if (to_slot)
            s->acc_n = rows;
        else
            *src->acc_n = rows;
    }
    return 0;
}

int wgen_keep(wgen *g, int64_t step)
{
    if (step < 0)
        return pf_err(-EINVAL, "generations: step %lld", (long long)step);
    if (g->src.starts_only && in_window(g, step))
        return pf_err(-EINVAL,
                      "generations: step %lld is inside a gradient_acc = %d window (kept at window starts "
                      "only)",
                      (long long)step, g->src.acc_k);
    if (g->src.acc_k > 1 && !holds_window(&g->src) && *g->src.acc_n != 0)
        return pf_err(-EINVAL, "generations: %lld class-center sums left at the start of window step %lld",
                      (long long)*g->src.acc_n, (long long)step);
    wgen_slot *s = NULL;
    for (int i = 0; i < 2; i++)
        if (g->slot[i].step > step)
            g->slot[i].step = -1; /* an abandoned future */
    for (int i = 0; i < 2 && !s; i++)
        if (g->slot[i].step == step)
            s = &g->slot[i];
    for (int i = 0; i < 2 && !s; i++)
        if (g->slot[i].step < 0)
            s = &g->slot[i];
    if (!s)
        s = g->slot[0].step < g->slot[1].step ? &g->slot[0] : &g->slot[1];
    s->step = -1;
    int rc = copy_state(g, s, step, 1);
    if (rc == 0)
        s->step = step;
    return rc;
}

int wgen_has(const wgen *g, int64_t step)
{
    return step >= 0 && (g->slot[0].step == step || g->slot[1].step == step);
}

void wgen_steps(const wgen *g, int64_t steps[2], int *n)
{
    *n = 0;
    for (int i = 0; i < 2; i++)
        if (g->slot[i].step >= 0)
            steps[(*n)++] = g->slot[i].step;
    if (*n == 2 && steps[0] > steps[1]) {
        int64_t x = steps[0];
        steps[0] = steps[1];
        steps[1] = x;
    }
}

int wgen_restore(wgen *g, int64_t step)
{
    wgen_slot *s = NULL;
    for (int i = 0; i < 2 && !s; i++)
        if (step >= 0 && g->slot[i].step == step)
            s = &g->slot[i];
    if (!s) {
        int64_t held[2];
        int n;
        wgen_steps(g, held, &n);
        char list[64] = "none";
        if (n == 1)
            snprintf(list, sizeof list, "%lld", (long long)held[0]);
        else if (n == 2)
            snprintf(list, sizeof list, "%lld and %lld", (long long)held[0], (long long)held[1]);
        return pf_err(-ENOENT, "no generation holds the start of global step %lld (held: %s)",
                      (long long)step, list);
    }
    int rc = copy_state(g, s, step, 0);
    if (rc == 0 && (rc = g->dev->sync(g->ctx)) < 0)
        rc = pf_err_wrap(rc, "generation of step %lld: device", (long long)step);
    return rc;
}

size_t wgen_keep_bytes(const wgen *g, int64_t step)
{
    size_t b =
        (g->np * (size_t)(1 + g->src.n_opt + in_window(g, step)) + g->nb * (size_t)(1 + !!g->src.bn0)) *
        sizeof(float);
    b += sizeof(int64_t) + sizeof(loss_scaler) + sizeof(uint64_t);
    if (g->src.acc_k > 1)
        b += (size_t)*g->src.acc_n * (sizeof(int64_t) + (size_t)g->src.row_floats * sizeof(float));
    return b;
}

size_t wgen_alloc_bytes(const wgen *g)
{
    size_t b = 2 * dev_floats(g) * sizeof(float);
    if (holds_window(&g->src)) {
        const size_t cap = g->src.acc_cap > 0 ? (size_t)g->src.acc_cap : 1;
        b += 2 * (cap * sizeof(int64_t) + (cap * (size_t)g->src.row_floats + 1) * sizeof(float));
    }
    return b;
}
