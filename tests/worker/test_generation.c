/* The two generations of a worker's state (worker/generation.h) against an uninterrupted run, in-process on
 * the CPU device. A small backbone (r18_w2, D = 16, batch 4, dropout 0.2) trains N steps through the
 * trainer's own backbone path for one worker: model_zero_grad at a window start, training forward, an
 * embedding gradient from a state-dependent loss (emb - target(step)) scaled by the loss scale, backward,
 * unscale, fixed gradients zeroed, sum of squares, the loss scaler's update (an overflow forced at one step
 * by an infinite gradient), clip and optimizer step (worker/optimizer.h), and under gradient accumulation the
 * window's class-center sums on the host, "pushed" (recorded per step) at the window's end. wgen_keep runs at
 * every step start, as train_run calls it.
 *
 * Interrupted runs redo from a step R after wgen_restore, in each case where a survivor can be when a worker
 * is lost: it finished step k (R = k, its current step's start), it finished step k and began k + 1 (R = k,
 * its previous step's start), it was inside step k after the forward and backward (R = k - 1, its previous
 * step's start; and R = k). After going on to N, every parameter, BN running statistic, gradient, optimizer
 * array and scalar (optimizer steps, loss scale and tracker, dropout counter) and every step's push equals
 * the uninterrupted run's bit for bit. A restore of a step not held returns -ENOENT naming the steps held and
 * changes nothing. Cases: SGD with momentum; AdamW with loss scaling; SGD with loss scaling and
 * gradient_acc = 2 (restores inside a window). The first and third also keep a copy of worker 0's BN
 * statistics (wgen_src.bn0), updated at every step's end from the buffers and its own previous value (as the
 * trainer's broadcast rewrites it), so a copy restored from the wrong step shows in the redo's result.
 *
 * --bench NET D B: the cost of wgen_keep for backbone NET (embedding size D, SGD momentum) on the CPU device
 * against a training step (forward, backward, optimizer) at batch B; prints bytes and milliseconds. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"
#include "tests/check.h"
#include "worker/generation.h"
#include "worker/optimizer.h"

enum { B = 4, D = 16, N = 8, ACC_CAP = 64, GROWTH = 2, OVERFLOW_STEP = 3 };

typedef struct rcase {
    const char *name;
    int adamw, scaling, acc_k, bn0;
    int starts_only; /* wgen_src.starts_only: keeps at window starts only (the trainer's use) */
} rcase;

/* One worker's training state and the run's record of its pushes. */
typedef struct rig {
    const rcase *c;
    model *m;
    bopt o;
    int64_t opt_steps;
    loss_scaler sc;
    int64_t *acc_ids;
    float *acc_rows;
    int64_t acc_n;
    double pushed[N]; /* per step: the checksum of what the window's last step pushed (0: nothing) */
    wgen *g;
    float *x, *gemb;
    float *bn0; /* rcase.bn0: the copy of worker 0's BN statistics (model_num_buffer_floats), else NULL */
} rig;

static void rig_open(rig *r, const rcase *c)
{
    memset(r, 0, sizeof *r);
    r->c = c;
    model_desc d;
    if (model_desc_from_name(&d, "r18_w2", D) < 0)
        DIE("model_desc_from_name");
    d.dropout = 0.2f;
    if (model_create_desc(&r->m, &d, B, NULL) < 0)
        DIE("model_create_desc");
    model_init(r->m, 7);
    const size_t np = model_num_params(r->m);
    const ops_device *dev = model_device(r->m);
    ops_ctx *ctx = model_ctx(r->m);
    float **arr[2] = {c->adamw ? &r->o.adam_m : &r->o.mom, &r->o.adam_v};
    for (int i = 0; i < (c->adamw ? 2 : 1); i++)
        if (dev->mem_alloc(ctx, (void **)arr[i], np * sizeof(float)) < 0)
            DIE("optimizer arrays");
    r->o.momentum = 0.9;
    r->o.weight_decay = 5e-4;
    if (loss_scaler_init(&r->sc, 65536.0f, GROWTH) < 0)
        DIE("loss_scaler_init");
    r->acc_ids = xmalloc(ACC_CAP * sizeof *r->acc_ids);
    r->acc_rows = xmalloc(ACC_CAP * D * sizeof *r->acc_rows);
    if (c->bn0)
        r->bn0 = calloc(model_num_buffer_floats(r->m), sizeof(float));
    wgen_src src = {.m = r->m,
                    .opt = {c->adamw ? r->o.adam_m : r->o.mom, r->o.adam_v},
                    .n_opt = c->adamw ? 2 : 1,
                    .opt_steps = &r->opt_steps,
                    .scaler = c->scaling ? &r->sc : NULL,
                    .acc_k = c->acc_k,
                    .starts_only = c->starts_only,
                    .acc_ids = &r->acc_ids,
                    .acc_rows = &r->acc_rows,
                    .acc_n = &r->acc_n,
                    .acc_cap = ACC_CAP,
                    .row_floats = D,
                    .bn0 = r->bn0};
    if (wgen_create(&r->g, &src) < 0)
        DIE("wgen_create");
    r->x = xmalloc((size_t)B * 3 * 112 * 112 * sizeof(float));
    r->gemb = xmalloc((size_t)B * D * sizeof(float));
}

static void rig_close(rig *r)
{
    wgen_free(r->g);
    const ops_device *dev = model_device(r->m);
    dev->mem_free(model_ctx(r->m), r->o.mom);
    dev->mem_free(model_ctx(r->m), r->o.adam_m);
    dev->mem_free(model_ctx(r->m), r->o.adam_v);
    model_free(r->m);
    free(r->acc_ids);
    free(r->acc_rows);
    free(r->x);
    free(r->gemb);
    free(r->bn0);
}

/* The window's class-center sums: the row of class `id` gets `row` added (a new id goes in at the end). */
static void acc_add(rig *r, int64_t id, const float *row)
{
    int64_t i = 0;
    while (i < r->acc_n && r->acc_ids[i] != id)
        i++;
    if (i == r->acc_n) {
        if (r->acc_n >= ACC_CAP)
            DIE("acc sums full");
        r->acc_ids[r->acc_n++] = id;
        memset(r->acc_rows + i * D, 0, D * sizeof(float));
    }
    for (int d = 0; d < D; d++)
        r->acc_rows[i * D + d] += row[d];
}

/* The part of step `step` before the optimizer: the batch, forward, the embedding gradient (scaled),
 * backward, the class-center sums. The images and targets are functions of the step. Returns the loss scale
 * used. */
static float step_grads(rig *r, int64_t step)
{
    const size_t nin = (size_t)B * 3 * 112 * 112;
    for (size_t i = 0; i < nin; i++)
        r->x[i] = sinf((float)i * 0.37f + (float)step * 1.3f);
    if (step % r->c->acc_k == 0)
        model_zero_grad(r->m);
    if (r->c->acc_k == 1)
        r->acc_n =
            0; /* without accumulation a push carries this step's rows only (the trainer's acc_n stays 0) */
    const float *emb;
    if (model_forward(r->m, r->x, B, 1, &emb) < 0)
        DIE("forward at step %lld", (long long)step);
    const float scale = r->c->scaling ? r->sc.scale : 1.0f;
    for (int i = 0; i < B * D; i++) /* d/d emb of 0.5 * mean((emb - target)^2), the host device's memory */
        r->gemb[i] = (emb[i] - cosf((float)(i + 7 * step))) / (float)(B * D) * scale;
    if (r->c->scaling && step == OVERFLOW_STEP)
        r->gemb[0] = INFINITY;
    for (int b = 0; b < B; b++)
        acc_add(r, (step + b) % 5, r->gemb + b * D);
    if (model_backward(r->m, r->gemb, NULL) < 0)
        DIE("backward at step %lld", (long long)step);
    return scale;
}

/* The rest of step `step`: at a window's last step unscale, sum of squares, the scaler, clip and the
 * optimizer step, the push of the window's sums. */
static void step_apply(rig *r, int64_t step, float scale)
{
    if ((step + 1) % r->c->acc_k != 0)
        return;
    const ops_device *dev = model_device(r->m);
    ops_ctx *ctx = model_ctx(r->m);
    double ss = 0;
    if ((scale != 1.0f && dev->scale(ctx, model_grads(r->m), model_num_params(r->m), 1.0f / scale) < 0) ||
        bopt_zero_fixed_grads(r->m) < 0 ||
        dev->sumsq(ctx, model_grads(r->m), model_num_params(r->m), &ss) < 0)
        DIE("gradients at step %lld", (long long)step);
    int skip = r->c->scaling && !loss_scaler_update(&r->sc, !isfinite(ss));
    const float lr = 0.1f * (1.0f - (float)step / (float)(2 * N));
    if (!skip && bopt_clip_apply(r->m, &r->o, lr, ss, &r->opt_steps) < 0)
        DIE("optimizer at step %lld", (long long)step);
    double sum = 1;
    for (int64_t i = 0; !skip && i < r->acc_n; i++)
        for (int d = 0; d < D; d++)
            sum += (double)r->acc_rows[i * D + d] * (double)(r->acc_ids[i] + 1) * (d + 1);
    r->pushed[step] = sum;
    r->acc_n = 0;
}

/* The end of every step with rcase.bn0: the copy of worker 0's statistics becomes the mean of the buffers
 * and its previous value. */
static void bn0_update(rig *r)
{
    const size_t nb = model_num_buffer_floats(r->m);
    const float *buf = model_buffers(r->m); /* host device */
    for (size_t i = 0; r->bn0 && i < nb; i++)
        r->bn0[i] = 0.5f * (r->bn0[i] + buf[i]);
}

/* A keep at the start of `step` (with starts_only, at window starts only, as the trainer keeps). */
static void keep(rig *r, int64_t step)
{
    if (r->c->starts_only && step % r->c->acc_k != 0)
        return;
    if (wgen_keep(r->g, step) < 0)
        DIE("wgen_keep %lld", (long long)step);
}

/* Steps [from, to) with a keep at each start. */
static void run_steps(rig *r, int64_t from, int64_t to)
{
    for (int64_t s = from; s < to; s++) {
        keep(r, s);
        step_apply(r, s, step_grads(r, s));
        bn0_update(r);
    }
}

/* Host copy of everything compared: params, buffers, grads, optimizer arrays, then the scalars. */
typedef struct snap {
    float *f;
    size_t n;
    int64_t opt_steps, acc_n;
    loss_scaler sc;
    uint64_t rng;
    double pushed[N];
} snap;

static snap take(rig *r)
{
    const size_t np = model_num_params(r->m), nb = model_num_buffer_floats(r->m);
    /* params, buffers, grads, two optimizer arrays (the second 0 for SGD), the copy of worker 0's buffers (0
     * without) */
    snap s = {.n = 4 * np + 2 * nb};
    s.f = xmalloc(s.n * sizeof(float));
    if (model_get_params(r->m, s.f) < 0 || model_get_buffers(r->m, s.f + np) < 0 ||
        model_get_grads(r->m, s.f + np + nb) < 0)
        DIE("host copies");
    memcpy(s.f + 2 * np + nb, r->c->adamw ? r->o.adam_m : r->o.mom, np * sizeof(float)); /* host device */
    if (r->c->adamw)
        memcpy(s.f + 3 * np + nb, r->o.adam_v, np * sizeof(float));
    else
        memset(s.f + 3 * np + nb, 0, np * sizeof(float));
    if (r->bn0)
        memcpy(s.f + 4 * np + nb, r->bn0, nb * sizeof(float));
    else
        memset(s.f + 4 * np + nb, 0, nb * sizeof(float));
    s.opt_steps = r->opt_steps;
    s.acc_n = r->acc_n;
    s.sc = r->sc;
    s.rng = model_rng_state(r->m);
    memcpy(s.pushed, r->pushed, sizeof s.pushed);
    return s;
}

static int same(const snap *a, const snap *b)
{
    return a->n == b->n && !memcmp(a->f, b->f, a->n * sizeof(float)) && a->opt_steps == b->opt_steps &&
           a->acc_n == b->acc_n && a->sc.scale == b->sc.scale &&
           a->sc.growth_tracker == b->sc.growth_tracker && a->rng == b->rng &&
           !memcmp(a->pushed, b->pushed, sizeof a->pushed);
}

/* Where a survivor is when the run goes back: 0 finished step k; 1 finished step k and kept k + 1; 2 inside
 * step k after its backward. */
static void interrupted(const rcase *c, const snap *ref, int64_t k, int where, int64_t R)
{
    static const char *const wh[] = {"finished step k", "began step k+1", "inside step k"};
    rig r;
    rig_open(&r, c);
    run_steps(&r, 0, k);
    keep(&r, k);
    float scale = step_grads(&r, k);
    if (where < 2) {
        step_apply(&r, k, scale);
        bn0_update(&r);
    }
    if (where == 1) {
        keep(&r, k + 1);
        step_grads(&r, k + 1);
    }
    if (c->starts_only)
        R -= R % c->acc_k; /* only window starts are held: the rollback goes to the window's start */
    int rc = wgen_restore(r.g, R);
    check(rc == 0 && wgen_has(r.g, R), "%s: k = %lld, %s: restore of step %lld: %d", c->name, (long long)k,
          wh[where], (long long)R, rc);
    /* a step not held (after k + 1 began, k - 1 is gone; with starts_only the window start before the older
     * of the two held): -ENOENT, nothing changes */
    int64_t held[2];
    int nheld;
    wgen_steps(r.g, held, &nheld);
    const int64_t gone = c->starts_only ? held[0] - c->acc_k : where == 1 ? k - 1 : R - 2;
    check(gone >= 0 && !wgen_has(r.g, gone), "%s: step %lld is a step not held", c->name, (long long)gone);
    snap before = take(&r);
    rc = wgen_restore(r.g, gone);
    snap after = take(&r);
    check(rc == -ENOENT && strstr(pf_errmsg(), "held") && same(&before, &after),
          "%s: restore of step %lld (not held): %d (%s), state unchanged %d", c->name, (long long)gone, rc,
          pf_errmsg(), same(&before, &after));
    free(before.f);
    free(after.f);
    run_steps(&r, R, N);
    snap got = take(&r);
    check(same(&got, ref),
          "%s: %s at k = %lld, redo from R = %lld to %d: bitwise equal to the uninterrupted run", c->name,
          wh[where], (long long)k, (long long)R, N);
    free(got.f);
    rig_close(&r);
}

static void run_case(const rcase *c)
{
    rig r;
    rig_open(&r, c);
    run_steps(&r, 0, N);
    snap ref = take(&r);
    rig_close(&r);
    rig_open(&r, c); /* the run is deterministic: a second uninterrupted run is the same */
    run_steps(&r, 0, N);
    snap again = take(&r);
    rig_close(&r);
    check(same(&ref, &again),
          "%s: two uninterrupted runs of %d steps (%lld optimizer steps, loss scale %g) agree", c->name, N,
          (long long)ref.opt_steps, (double)ref.sc.scale);
    free(again.f);
    if (c->scaling)
        check(ref.opt_steps < N / c->acc_k, "%s: the forced overflow skipped an optimizer step", c->name);
    const int64_t ks[] = {4, 5}; /* a gradient_acc = 2 window's first and second step */
    for (int i = 0; i < 2; i++) {
        interrupted(c, &ref, ks[i], 0, ks[i]);
        interrupted(c, &ref, ks[i], 1, ks[i]);
        interrupted(c, &ref, ks[i], 2, ks[i] - 1);
        interrupted(c, &ref, ks[i], 2, ks[i]);
    }
    free(ref.f);
}

/* A fresh wgen: nothing held, -ENOENT naming none; step < 0 refused. */
static void empty_case(void)
{
    static const rcase c = {"empty", 0, 0, 1, 0, 0};
    rig r;
    rig_open(&r, &c);
    int rc = wgen_restore(r.g, 0);
    check(rc == -ENOENT && strstr(pf_errmsg(), "none") && !wgen_has(r.g, 0), "fresh: restore -> %d (%s)", rc,
          pf_errmsg());
    check(wgen_keep(r.g, -1) == -EINVAL, "keep of step -1 refused");
    rig_close(&r);
}

/* starts_only under gradient_acc = 2: no room for a window's gradients (np floats) or class-center sums
 * (ACC_CAP rows) in either generation; a keep inside a window, or at a window start with sums left, is
 * refused, naming why, and changes nothing held. */
static void starts_only_case(void)
{
    static const rcase full = {"acc2", 0, 0, 2, 0, 0}, starts = {"acc2 starts_only", 0, 0, 2, 0, 1};
    rig a, b;
    rig_open(&a, &full);
    rig_open(&b, &starts);
    const size_t np = model_num_params(a.m);
    const size_t saved =
        2 * (np * sizeof(float) + ACC_CAP * sizeof(int64_t) + (ACC_CAP * D + 1) * sizeof(float));
    check(wgen_alloc_bytes(a.g) - wgen_alloc_bytes(b.g) == saved,
          "starts_only allocates %zu bytes less (%zu vs %zu): two gradient copies and two rooms for the sums",
          wgen_alloc_bytes(a.g) - wgen_alloc_bytes(b.g), wgen_alloc_bytes(b.g), wgen_alloc_bytes(a.g));
    keep(&b, 0);
    int rc = wgen_keep(b.g, 1);
    check(rc == -EINVAL && strstr(pf_errmsg(), "inside a gradient_acc = 2 window") && !wgen_has(b.g, 1) &&
              wgen_has(b.g, 0),
          "starts_only: keep of step 1 -> %d (%s)", rc, pf_errmsg());
    b.acc_n = 3;
    rc = wgen_keep(b.g, 2);
    check(rc == -EINVAL && strstr(pf_errmsg(), "3 class-center sums left") && !wgen_has(b.g, 2),
          "starts_only: keep of step 2 with 3 sums left -> %d (%s)", rc, pf_errmsg());
    rc = wgen_restore(b.g, 0);
    check(rc == 0 && b.acc_n == 0, "starts_only: restore of step 0 empties the sums (%lld)",
          (long long)b.acc_n);
    rig_close(&a);
    rig_close(&b);
}

static int bench(const char *net, int d, int batch)
{
    model *m;
    if (model_create(&m, net, d, batch) < 0)
        DIE("model_create %s", net);
    model_init(m, 1);
    const size_t np = model_num_params(m);
    bopt o = {.momentum = 0.9, .weight_decay = 5e-4};
    if (model_device(m)->mem_alloc(model_ctx(m), (void **)&o.mom, np * sizeof(float)) < 0)
        DIE("momentum");
    int64_t opt_steps = 0;
    wgen *g;
    wgen_src src = {.m = m, .opt = {o.mom}, .n_opt = 1, .opt_steps = &opt_steps, .acc_k = 1};
    if (wgen_create(&g, &src) < 0)
        DIE("wgen_create");
    const int reps = 20;
    for (int i = 0; i < 2; i++)
        if (wgen_keep(g, i) < 0)
            DIE("keep");
    double t0 = pf_now_s();
    for (int i = 0; i < reps; i++)
        wgen_keep(g, 2 + i);
    const double keep_ms = (pf_now_s() - t0) / reps * 1e3;
    const size_t nin = (size_t)batch * 3 * 112 * 112;
    float *x = xmalloc(nin * sizeof *x), *ge = xmalloc((size_t)batch * d * sizeof *ge);
    for (size_t i = 0; i < nin; i++)
        x[i] = sinf((float)i * 0.37f);
    for (int i = 0; i < batch * d; i++)
        ge[i] = cosf((float)i) / (float)(batch * d);
    double step_ms = 0;
    for (int it = 0; it < 2; it++) { /* the first allocates the activations and primitives */
        t0 = pf_now_s();
        const float *e;
        model_zero_grad(m);
        if (model_forward(m, x, batch, 1, &e) < 0 || model_backward(m, ge, NULL) < 0 ||
            bopt_clip_apply(m, &o, 0.1f, 1.0, &opt_steps) < 0)
            DIE("step");
        step_ms = (pf_now_s() - t0) * 1e3;
    }
    printf("bench %s D=%d batch %d: %zu parameters, %zu buffer floats; keep copies %.1f MB (%zu bytes) in "
           "%.3f ms "
           "(%.2f GB/s); a training step %.1f ms: keep = %.3f%% of a step; two generations hold %.1f MB\n",
           net, d, batch, np, model_num_buffer_floats(m), wgen_keep_bytes(g, 0) / 1e6, wgen_keep_bytes(g, 0),
           keep_ms, wgen_keep_bytes(g, 0) / keep_ms / 1e6, step_ms, 100.0 * keep_ms / step_ms,
           wgen_alloc_bytes(g) / 1e6);
    free(x);
    free(ge);
    wgen_free(g);
    model_device(m)->mem_free(model_ctx(m), o.mom);
    model_free(m);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 5 && !strcmp(argv[1], "--bench"))
        return bench(argv[2], atoi(argv[3]), atoi(argv[4]));
    empty_case();
    starts_only_case();
    static const rcase cases[] = {
        {"sgd+bn0", 0, 0, 1, 1, 0},
        {"adamw+scaling", 1, 1, 1, 0, 0},
        {"sgd+scaling+acc2+bn0", 0, 1, 2, 1, 0},
        {"adamw+scaling+acc2+bn0 starts_only", 1, 1, 2, 1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        run_case(&cases[i]);
    return check_summary();
}
