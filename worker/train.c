/* The training loop of one pfcps worker (see train.h): one training step (train_step, and the backbone's
 * backward and optimizer step it calls), the outputs written after steps (checkpoints, the backbone, the
 * class-center partition), and the run (train_run: the stop vote, the step, loss checks, logging,
 * verification, checkpoint cadence). The set-up that makes the trainer is worker/train_setup.c; device
 * specifics are behind worker/device.h. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/atomic_file.h"
#include "common/ckpt.h"
#include "common/clock.h"
#include "common/coll.h"
#include "common/err.h"
#include "common/log.h"
#include "common/member_addr.h"
#include "kernels/ops.h"
#include "worker/lr_schedule.h"
#include "worker/optimizer.h"
#include "worker/ps_client.h"
#include "worker/train_state.h"

/* ln(1e30): the loss value when p_target is floored at 1e-30 for every row (no target matched). */
#define STUCK_LOSS 69.07755278982137

/* Unix time in seconds (CLOCK_REALTIME): timestamps of the metrics and TensorBoard events. */
static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Backward, after the head wrote the embedding gradient d_grad_emb (device, B x D): scale it by W
 * (arcface_torch: the AllGather backward multiplies by W and DDP averages the backbone gradients over W, so
 * the mean of the W scaled gradients is the gradient of the global mean loss) and by the loss scale (fp16);
 * backward; allreduce (backbone_grad_comm: fp16 as DDP's fp16_compress_hook, which returns the mean, or an fp32
 * sum); mean and unscale in one pass (the loss scale is a power of two, so g * (1/W) * (1/scale) in one
 * multiply is exact as two); fixed gradients zeroed; *ss = their sum of squares, the loss
 * scaler's found-inf check (the same on every worker: the gradients are allreduced) and clip_grad_norm_(5)'s
 * norm. *skip = 1 when the scaler says skip (rank 0 logs it for global step step + 1; the scaler is
 * updated). Under gradient_acc, backward adds to the gradients of the window's earlier steps and the
 * collective runs on that running sum each step, as DDP does without no_sync (measured with torch's DDP and
 * fp16_compress_hook: the result of two backwards is hook(hook(g1) + g2)); last = 0 (not the window's last
 * step) stops after the mean, before unscaling, the found-inf check and the sum of squares. Returns 0 or the
 * device's negative code. */
static int backbone_grads(trainer *t, int64_t step, int last, double *ss, int *skip)
{
    const ops_device *dev = t->wd.dev;
    ops_ctx *ctx = t->wd.ctx;
    float scale = t->loss_scaling ? t->scaler.scale : 1.0f;
    float gs = (float)t->W * scale;
    *skip = 0;
    int rc = gs != 1.0f ? dev->scale(ctx, t->wd.d_grad_emb, t->wd.bd, gs) : 0;
    if (rc == 0)
        rc = model_backward(t->m, t->wd.d_grad_emb, NULL);
    if (rc == 0)
        rc = wdev_allreduce_grads(&t->wd, model_grads(t->m), t->grad_fp16);
    float *g = model_grads(t->m);
    float inv = t->grad_fp16 ? 1.f : 1.f / (float)t->W; /* the fp16 collective returns the mean */
    if (last && t->loss_scaling)
        inv *= (float)(1.0 / (double)scale);
    if (rc == 0 && inv != 1.0f)
        rc = dev->scale(ctx, g, t->nparams, inv);
    if (rc < 0 || !last)
        return rc; /* inside a gradient_acc window: the sum goes on, still scaled */
    rc = bopt_zero_fixed_grads(t->m);
    *ss = 0;
    if (rc == 0)
        rc = dev->sumsq(ctx, g, t->nparams, ss);
    if (rc < 0)
        return rc;
    if (t->loss_scaling && !loss_scaler_update(&t->scaler, !isfinite(*ss))) {
        *skip = 1;
        if (t->rank == 0)
            log_info("global step %lld: backbone gradients overflowed at loss scale %g: optimizer step skipped, "
                     "scale now %g (%s)",
                     (long long)step + 1, (double)scale, (double)t->scaler.scale,
                     t->skip_centers ? "class centers not updated either" : "class centers updated");
    }
    return 0;
}

/* After backbone_grads without a skip: clip at 5 from the sum of squares ss, then the optimizer step at lr
 * (worker/optimizer.h). */
static int backbone_apply(trainer *t, float lr, double ss)
{
    const bopt o = {.mom = t->mom, .adam_m = t->adam_m, .adam_v = t->adam_v, .momentum = t->run.momentum,
                    .weight_decay = t->run.weight_decay};
    return bopt_clip_apply(t->m, &o, lr, ss, &t->opt_steps);
}

/* The batch whose labels loader_peek_labels announced. */
static int next_batch(trainer *t, loader_batch **b)
{
    int got = loader_next(t->ld, b);
    if (got > 0)
        return 0;
    *b = NULL;
    return got < 0 ? got : pf_err(-EPROTO, "loader ended a batch after announcing its labels");
}

/* Waits for request r (NULL: none) and returns the first error of rc and the wait's. */
static int wait_req(trainer *t, ps_req *r, int rc)
{
    int wrc = r ? ps_wait(t->net.ps, r, t->net.wait_s) : 0;
    return rc < 0 ? rc : wrc;
}

/* One training step (docs/architecture.md, "One training step") on the batch whose labels are in t->labels,
 * at global step `step` (0-based) with learning rate lr: sample the class centers, pull them while the
 * backbone runs forward, the margin-softmax head over every worker's sampled columns, push the row gradients
 * (the servers apply them during our backward), backbone backward and optimizer step, wait for the push
 * (read-your-writes before the next pull). push_flags: PS_PUSH_SNAPSHOT on a checkpoint step. *loss = the
 * global mean loss. The phases' wall times go to t->phase_s (seconds): sample (pfc_sample with its label
 * allgather), pull (posting the pull, and waiting for it after the forward: the part the forward did not
 * hide), head, push (posting it), backbone (the batch, forward, backward and optimizer step), wait (for the
 * push at the end). Returns 0 or the first failing component's negative code. */
/* gradient_acc: adds this step's k class-center gradients (ids ascending) into the window's sums (acc_ids
 * ascending), a class seen before getting sum + row (float, in step order: torch's accumulation of the weight's
 * .grad). Returns 0, or -EPROTO when the ids are not ascending or the sums would outgrow their room. */
static int acc_merge(trainer *t, const int64_t *ids, const float *rows, int64_t k)
{
    const size_t D = (size_t)t->run.embedding_size;
    int64_t i = 0, j = 0, n = 0;
    while (i < t->acc_n || j < k) {
        if (n >= t->acc_cap || (j > 0 && j < k && ids[j] <= ids[j - 1]))
            return pf_err(-EPROTO, "gradient_acc: %lld sampled ids not ascending or beyond room for %lld rows",
                          (long long)k, (long long)t->acc_cap);
        float *out = t->acc_rows2 + (size_t)n * D;
        if (j >= k || (i < t->acc_n && t->acc_ids[i] < ids[j])) {
            t->acc_ids2[n] = t->acc_ids[i];
            memcpy(out, t->acc_rows + (size_t)i * D, D * sizeof *out);
            i++;
        } else if (i >= t->acc_n || ids[j] < t->acc_ids[i]) {
            t->acc_ids2[n] = ids[j];
            memcpy(out, rows + (size_t)j * D, D * sizeof *out);
            j++;
        } else {
            const float *a = t->acc_rows + (size_t)i * D, *b = rows + (size_t)j * D;
            t->acc_ids2[n] = ids[j];
            for (size_t d = 0; d < D; d++)
                out[d] = a[d] + b[d];
            i++;
            j++;
        }
        n++;
    }
    int64_t *ti = t->acc_ids;
    float *tr = t->acc_rows;
    t->acc_ids = t->acc_ids2;
    t->acc_rows = t->acc_rows2;
    t->acc_ids2 = ti;
    t->acc_rows2 = tr;
    t->acc_n = n;
    return 0;
}

static int train_step(trainer *t, int64_t step, double lr, uint32_t push_flags, double *loss)
{
    const int64_t *ids = NULL;
    int64_t k = 0;
    ps_req *pull = NULL, *push = NULL;
    loader_batch *b = NULL;
    const float *emb = NULL;
    double *ph = t->phase_s, t0 = pf_now_s(), t1;
    int rc = pfc_sample(&t->head, step, t->labels, &ids, &k);
    t1 = pf_now_s();
    ph[PH_SAMPLE] = t1 - t0;
    if (rc == 0)
        rc = ps_pull(t->net.ps, ids, (size_t)k, t->wd.centers, step, &pull);
    t0 = pf_now_s();
    ph[PH_PULL] = t0 - t1;
    if (rc == 0)
        rc = next_batch(t, &b);
    /* gradient_acc: the optimizer steps at the window's last step; the window starts at a multiple of acc_k */
    const int last = (step + 1) % t->acc_k == 0;
    if (rc == 0) {
        if (step % t->acc_k == 0)
            model_zero_grad(t->m);
        rc = model_forward(t->m, b->images, t->run.batch_size, 1, &emb);
    }
    t1 = pf_now_s();
    ph[PH_BACKBONE] = t1 - t0;
    rc = wait_req(t, pull, rc);
    t0 = pf_now_s();
    ph[PH_PULL] += t0 - t1;
    if (rc == 0)
        rc = wdev_head_step(&t->wd, &t->head, emb, k, loss);
    if (rc == 0 && t->acc_k > 1)
        rc = acc_merge(t, ids, t->wd.grad_centers, k);
    t1 = pf_now_s();
    ph[PH_HEAD] = t1 - t0;
    /* fp16_overflow_skip = step: the found-inf check before the push, which is then empty on a skipped step
     * (GradScaler skips the whole optimizer step, class centers included); otherwise the push overlaps the
     * backward and the check skips the backbone's step only. */
    const int check_first = t->loss_scaling && t->skip_centers;
    int skip = 0;
    double ss = 0;
    if (rc == 0 && check_first)
        rc = backbone_grads(t, step, last, &ss, &skip);
    t0 = pf_now_s();
    ph[PH_BACKBONE] += t0 - t1;
    /* The push: this step's rows, or under gradient_acc the window's sums at its last step and before that a
     * push without rows flagged skipped (the servers' step goes by without an update, as the optimizer's). */
    const int64_t *push_ids = t->acc_k > 1 ? t->acc_ids : ids;
    const float *push_rows = t->acc_k > 1 ? t->acc_rows : t->wd.grad_centers;
    size_t push_n = skip || !last ? 0 : t->acc_k > 1 ? (size_t)t->acc_n : (size_t)k;
    if (rc == 0)
        rc = ps_push_ex(t->net.ps, push_ids, push_n, push_rows, (float)lr, step,
                        push_flags | (skip || !last ? PS_PUSH_SKIPPED : 0u), &push);
    t1 = pf_now_s();
    ph[PH_PUSH] = t1 - t0;
    if (rc == 0 && !check_first)
        rc = backbone_grads(t, step, last, &ss, &skip);
    if (rc == 0 && last && !skip)
        rc = backbone_apply(t, (float)lr, ss);
    /* worker 0's BN statistics after this step's forward, on every worker (train_state.h: bn0) */
    if (rc == 0 && t->wr_on && t->W > 1)
        rc = wdev_bcast_floats(&t->wd, t->rank == 0 ? model_buffers(t->m) : t->bn0,
                               model_num_buffer_floats(t->m));
    if (b && t->trace_keys) {
        memcpy(t->trace_keys, b->keys, (size_t)b->n * sizeof *b->keys);
        memcpy(t->trace_flips, b->flips, (size_t)b->n);
        t->trace_ids = ids;
        t->trace_k = k;
    }
    if (b)
        loader_release(t->ld, b);
    t0 = pf_now_s();
    ph[PH_BACKBONE] += t0 - t1;
    t1 = t0;
    rc = wait_req(t, push, rc);
    ph[PH_WAIT] = pf_now_s() - t1;
    if (last)
        t->acc_n = 0; /* the window's sums went with the push (or the scaler skipped them) */
    return rc;
}

/* The loss scaler's state as checkpoint extras: x[0] "amp.scale", x[1] "amp.growth_tracker". */
static void amp_extras(const trainer *t, model_extra x[2])
{
    memset(x, 0, 2 * sizeof *x);
    memcpy(x[0].name, "amp.scale", sizeof "amp.scale");
    x[0].value = (double)t->scaler.scale;
    memcpy(x[1].name, "amp.growth_tracker", sizeof "amp.growth_tracker");
    x[1].value = (double)t->scaler.growth_tracker;
}

/* The backbone checkpoint; with loss scaling, the scaler's state goes with it (arcface_torch saves the
 * GradScaler with the checkpoint) as extras "amp.scale" and "amp.growth_tracker". */
static int save_backbone(trainer *t, const char *path)
{
    if (!t->loss_scaling)
        return model_save(t->m, path);
    model_extra x[2];
    amp_extras(t, x);
    return model_save_ex(t->m, path, x, 2);
}

/* Pulls this worker's whole partition of the class-center table (classes c mod W == rank) after the last step
 * and writes it to <prefix>.rank<r>: raw records (uint64 class id, then D float32, little-endian), class ids
 * ascending; replaced whole (common/atomic_file.h), so a file of that name is complete. */
static int dump_partition(trainer *t, const char *prefix, int64_t step)
{
    char path[1100];
    snprintf(path, sizeof path, "%s.rank%d", prefix, t->rank);
    pf_atomic_file af;
    int rc = pf_atomic_open(&af, path, "class centers");
    if (rc < 0)
        return rc;
    int64_t C = t->run.num_classes, D = t->run.embedding_size;
    enum { CHUNK = 4096 };
    int64_t ids[CHUNK];
    float *rows = malloc(sizeof(float) * CHUNK * (size_t)D);
    rc = rows ? 0 : pf_err(-ENOMEM, "out of memory");
    int ok = 1;
    for (int64_t c0 = t->rank; rc == 0 && ok && c0 < C;) {
        int n = 0;
        for (; n < CHUNK && c0 < C; c0 += t->W)
            ids[n++] = c0;
        ps_req *req;
        rc = ps_pull(t->net.ps, ids, (size_t)n, rows, step, &req);
        if (rc == 0)
            rc = ps_wait(t->net.ps, req, t->net.wait_s);
        for (int i = 0; rc == 0 && ok && i < n; i++) {
            uint64_t id = (uint64_t)ids[i];
            ok = fwrite(&id, 8, 1, af.f) == 1 &&
                 fwrite(rows + (size_t)i * D, sizeof(float), (size_t)D, af.f) == (size_t)D;
        }
    }
    free(rows);
    if (rc < 0) {
        pf_atomic_abort(&af);
        return rc;
    }
    return pf_atomic_commit(&af, ok);
}

/* save_centers = true: this worker's partition of the class-center table to
 * <output>/centers/partition.rank<r> (what `pfcps export --centers <output>` reads). */
static int save_centers(trainer *t, int64_t step)
{
    char dir[1100], prefix[1200];
    snprintf(dir, sizeof dir, "%s/centers", t->run.output);
    snprintf(prefix, sizeof prefix, "%s/partition", dir);
    double t0 = pf_now_s();
    int rc = train_mkdir_p(dir);
    if (rc == 0)
        rc = dump_partition(t, prefix, step);
    if (rc < 0)
        return pf_err_wrap(rc, "save_centers");
    int64_t rows = t->run.num_classes > t->rank ? (t->run.num_classes - t->rank + t->W - 1) / t->W : 0;
    log_info("class centers: %lld rows of this worker's partition written to %s.rank%d in %.1f s",
             (long long)rows, prefix, t->rank, pf_now_s() - t0);
    return 0;
}

/* Is `step` (steps completed) a checkpoint step? Every snapshot_every steps and the last one (`total`), at
 * the end of a gradient_acc window only (a window's gradients are in no file). */
static int is_ckpt_step(const trainer *t, int64_t step, int64_t total)
{
    return t->run.snapshot_every > 0 && step % t->acc_k == 0 &&
           (step % t->run.snapshot_every == 0 || step == total);
}

/* What the run has seen so far, for the log lines and the final summary. */
typedef struct progress {
    double t_start, t_log; /* seconds (pf_now_s): start of training, last log line */
    int64_t step_log;      /* global step of the last log line */
    double loss_sum;       /* losses since the last log line */
    int loss_n;
    double first_loss, last_loss;
    int stuck;    /* consecutive steps with the loss at ln(1e30) */
    double val_s; /* seconds spent in verification (kept out of the speeds) */
    int tic_set;  /* log_format = arcface_torch: CallBackLogging's clock started (its first frequent step) */
} progress;

/* This worker's part of checkpoint `step` (worker/resume.h); the servers write theirs when they apply the
 * flagged push. A failure (disk full, ...) is logged and training goes on: earlier checkpoints stay intact
 * and a resume uses the newest complete one. */
int train_write_state(trainer *t, const char *root, int64_t step, double first_loss, double loss_sum,
                      int loss_n)
{
    wresume_state st = {0};
    wresume_set_i64(&st, "step", step);
    wresume_set_i64(&st, "opt_steps", t->opt_steps);
    wresume_set_i64(&st, "dropout_rng", (int64_t)model_rng_state(t->m));
    wresume_set_f64(&st, "first_loss", first_loss);
    wresume_set_f64(&st, "log.loss_sum", loss_sum);
    wresume_set_i64(&st, "log.loss_n", loss_n);
    if (t->loss_scaling) {
        wresume_set_f64(&st, "amp.scale", (double)t->scaler.scale);
        wresume_set_i64(&st, "amp.growth_tracker", t->scaler.growth_tracker);
    }
    for (int i = 0; i < t->n_val; i++) {
        char name[24];
        snprintf(name, sizeof name, "val_highest.%d", i);
        wresume_set_f64(&st, name, t->val_highest[i]);
    }
    char dir[4200];
    ckpt_step_dir(root, step, dir, sizeof dir);
    float *dev[2], *host[2] = {NULL, NULL};
    int na = train_opt_arrays(t, dev);
    int rc = train_mkdir_p(dir);
    for (int a = 0; a < na && rc == 0; a++) {
        if (!(host[a] = malloc(sizeof(float) * (t->nparams ? t->nparams : 1))))
            rc = pf_err(-ENOMEM, "out of memory");
        else
            rc = t->wd.dev->mem_d2h(t->wd.ctx, host[a], dev[a], sizeof(float) * t->nparams);
    }
    model_extra x[2];
    amp_extras(t, x);
    if (rc == 0)
        rc = wresume_save(root, step, t->rank, t->W, t->m, x, t->loss_scaling ? 2 : 0, &st,
                          (const float *const *)host, na, t->nparams, &t->ckpt_id,
                          t->ckpt_keyed ? &t->ckpt_key : NULL);
    free(host[0]);
    free(host[1]);
    return rc;
}

static void save_checkpoint(trainer *t, const progress *p, int64_t step)
{
    double t0 = pf_now_s();
    char dir[4200];
    ckpt_step_dir(t->ckpt_root, step, dir, sizeof dir);
    if (train_write_state(t, t->ckpt_root, step, p->first_loss, p->loss_sum, p->loss_n) < 0) {
        log_error("checkpoint step %lld: this worker's state not written: %s (training goes on; earlier "
                  "checkpoints are intact)",
                  (long long)step, pf_errmsg());
        return;
    }
    log_info("checkpoint step %lld: worker state written to %s in %.2f s", (long long)step, dir,
             pf_now_s() - t0);
    metrics_set(t->mx.ckpt_ts, wall_s());
    metrics_set(t->mx.ckpt_step, (double)step);
    wresume_prune(t->ckpt_root, t->rank, t->run.snapshot_keep, &t->ckpt_id);
}

/* Every rank agrees on stopping (a signal reaches the ranks at different times) and on a rejoining server's
 * copy (its notice reaches the ranks at different times too): allreduce (max) of the stop flag and of
 * rejoin_vote. *stop = 1 when any rank asked; *rejoin = the newest begun rejoin on any rank (0: none). */
static int stop_vote(trainer *t, int *stop, uint32_t *rejoin)
{
    float f[2] = {t->opts.stop_flag && *t->opts.stop_flag ? 1.f : 0.f, rejoin_vote(&t->rj)};
    int rc = coll_allreduce(&t->net.coll, f, 2, COLL_F32, COLL_MAX);
    *stop = rc == 0 && f[0] > 0;
    *rejoin = rc == 0 && f[1] > 0 ? (uint32_t)f[1] : 0;
    return rc;
}

void train_rejoin_notice(trainer *t, int kind, int server, uint32_t epoch, const void *addr, size_t len)
{
    rejoin_notice(&t->rj, kind, server, epoch, addr, len);
}

/* rejoin_hold's stop: a stop asked for ends the hold (the next stop vote stops every worker). */
static int hold_stop(void *arg)
{
    const trainer *t = arg;
    return t->opts.stop_flag && *t->opts.stop_flag;
}

/* The loss of global step `step` (1-based) in `epoch`: -EDOM when it is not finite, -EPROTO when it sat at
 * ln(1e30) for 20 steps (no target logit ever matched: a label or sampling fault); else recorded in p. */
static int check_loss(progress *p, double loss, int64_t step, int64_t epoch)
{
    if (!isfinite(loss))
        return pf_err(-EDOM, "loss is %f at global step %lld (epoch %lld): stopping", loss, (long long)step,
                      (long long)epoch);
    p->stuck = fabs(loss - STUCK_LOSS) < 1e-3 ? p->stuck + 1 : 0;
    if (p->stuck >= 20)
        return pf_err(-EPROTO,
                      "loss stuck at ln(1e30) = 69.0776 for 20 steps up to global step %lld: no target "
                      "logit ever matched its class center (label remapping or sampling fault)",
                      (long long)step);
    if (isnan(p->first_loss))
        p->first_loss = loss;
    p->last_loss = loss;
    p->loss_sum += loss;
    p->loss_n++;
    return 0;
}

/* Rank 0: scalars for TensorBoard at global step `step`: n (tag, value) pairs, then a flush. A write error is
 * reported once and ends the events (training goes on: they are a view, training.log has the same numbers).
 */
static void tb_scalars(trainer *t, int64_t step, int n, const char *const *tags, const double *values)
{
    if (!t->tb)
        return;
    double wall = wall_s();
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++)
        rc = tb_scalar(t->tb, tags[i], step, wall, (float)values[i]);
    if (rc == 0)
        rc = tb_flush(t->tb);
    if (rc < 0) {
        log_warn("TensorBoard events stopped: %s", pf_errmsg());
        tb_close(t->tb);
        t->tb = NULL;
    }
}

/* Rank 0: scores the model on every val_targets set at global step `step` (arcface_torch's
 * CallBackVerification: eval mode, image + flip, 10 folds), logs arcface_torch's lines and adds each set's
 * Accuracy-Flip to TensorBoard under the set's name. *seconds = the time it took (kept out of the Speed
 * line). Returns 0 or eval_verify_model's error, naming the set. */
static int verify_sets(trainer *t, int64_t step, double *seconds)
{
    double t0 = pf_now_s();
    eval_embed_opts o = {.batch = t->run.batch_size, .flip = 1, .pad = 1};
    for (int i = 0; i < t->n_val; i++) {
        eval_result r;
        int rc = eval_verify_model(t->m, &t->val[i], &o, 10 < t->val[i].n_pairs ? 10 : (int)t->val[i].n_pairs,
                                   &r, NULL);
        if (rc < 0)
            return pf_err_wrap(rc, "verification on %s at global step %lld", t->val[i].name, (long long)step);
        if (r.acc_mean > t->val_highest[i])
            t->val_highest[i] = r.acc_mean;
        metrics_set(t->mx.val[i], r.acc_mean);
        const char *name = t->val[i].name;
        log_info("[%s][%lld]XNorm: %f", name, (long long)step, r.xnorm);
        log_info("[%s][%lld]Accuracy-Flip: %1.5f+-%1.5f", name, (long long)step, r.acc_mean, r.acc_std);
        log_info("[%s][%lld]Accuracy-Highest: %1.5f", name, (long long)step, t->val_highest[i]);
        const char *tags[1] = {name};
        double v[1] = {r.acc_mean};
        tb_scalars(t, step, 1, tags, v);
    }
    *seconds = pf_now_s() - t0;
    return 0;
}

/* The trace line of global step `step`: `STEP LOSS LR` (1-based step, the global mean loss and the step's
 * lr, both %.17g); with --trace-batch followed by ` keys=K,K,... flips=FF... centers=C,C,...`: the .idx keys of
 * this worker's batch in batch order (-1 for synthetic data), one 0/1 digit per image (1 = mirrored), and the
 * class ids this worker sampled (ascending; every worker's together are the step's columns). */
static void trace_step(trainer *t, int64_t step, double loss, double lr)
{
    fprintf(t->trace, "%lld %.17g %.17g", (long long)step, loss, lr);
    if (t->trace_keys) {
        const int64_t B = t->run.batch_size;
        fputs(" keys=", t->trace);
        for (int64_t i = 0; i < B; i++)
            fprintf(t->trace, "%s%lld", i ? "," : "", (long long)t->trace_keys[i]);
        fputs(" flips=", t->trace);
        for (int64_t i = 0; i < B; i++)
            fputc('0' + t->trace_flips[i], t->trace);
        fputs(" centers=", t->trace);
        for (int64_t i = 0; i < t->trace_k; i++)
            fprintf(t->trace, "%s%lld", i ? "," : "", (long long)t->trace_ids[i]);
    }
    fputc('\n', t->trace);
}

/* Rank 0's log line and TensorBoard scalars of log_step at global step `step` (time `now`). */
static void log_line(trainer *t, const progress *p, int64_t step, int64_t total, int64_t epoch, double lr,
                     double now, int upstream)
{
    const pf_config *run = &t->run;
    double hours;
    if (upstream) {
        /* CallBackLogging: the lr shown is get_last_lr() after the scheduler's step, the next step's; the
         * hours left are int(elapsed s) / (steps done here + 1) x (total - step - 1). */
        lr = lr_schedule_at(&t->sched, step);
        double el = floor(now - p->t_start);
        hours = el / (double)(step - t->start_step + 1) * (double)(total - step - 1) / 3600.0;
    } else {
        double per_step = (now - p->t_start) / (double)step;
        hours = per_step * (double)(total - step) / 3600.0;
    }
    double speed = (double)(step - p->step_log) * run->batch_size * t->W / (now - p->t_log);
    if (t->loss_scaling) /* arcface_torch's line with fp16 */
        log_info(
            "Speed %.2f samples/sec   Loss %.4f   LearningRate %.6f   Epoch: %lld   Global Step: %lld   Fp16 "
            "Grad Scale: %2.f   Required: %1.f hours",
            speed, p->loss_sum / p->loss_n, lr, (long long)epoch, (long long)step, (double)t->scaler.scale,
            hours);
    else
        log_info("Speed %.2f samples/sec   Loss %.4f   LearningRate %.6f   Epoch: %lld   Global Step: %lld   "
                 "Required: %1.f hours",
                 speed, p->loss_sum / p->loss_n, lr, (long long)epoch, (long long)step, hours);
    /* arcface_torch's CallBackLogging scalars (loss, learning_rate, time_for_end in hours) and pfcps's. */
    const char *tags[5] = {"loss", "learning_rate", "time_for_end", "samples_per_sec", "loss_scale"};
    double v[5] = {p->loss_sum / p->loss_n, lr, hours, speed, t->loss_scaling ? t->scaler.scale : 1.0};
    tb_scalars(t, step, t->loss_scaling ? 5 : 4, tags, v);
}

/* The trace line of global step `step` (trace_step), and on rank 0 arcface_torch's log line every `frequent`
 * steps and at the last step (`total`): speed since the last line, mean loss since the last line, lr, epoch,
 * step, the loss scale with fp16, hours left. Under log_format = arcface_torch the lines are
 * CallBackLogging's own: none at the first frequent step (it starts the clock) nor at a last step that is not
 * a multiple of frequent, the next step's lr, and its hours-left formula. */
static void log_step(trainer *t, progress *p, int64_t step, int64_t total, int64_t epoch, double loss,
                     double lr)
{
    const pf_config *run = &t->run;
    if (t->trace)
        trace_step(t, step, loss, lr);
    const int upstream = strcmp(run->log_format, "arcface_torch") == 0;
    if (step % run->frequent != 0 && (upstream || step != total))
        return;
    double now = pf_now_s();
    /* CallBackLogging: its first frequent step only starts the clock (the losses keep accumulating). */
    if (upstream && !p->tic_set) {
        p->tic_set = 1;
        p->t_log = now;
        p->step_log = step;
        return;
    }
    /* Every rank keeps the same running sums (the loss is the global mean, the same on every rank), so that a
     * worker 0 replaced in place from another worker's state logs the losses it would have. */
    if (t->rank == 0)
        log_line(t, p, step, total, epoch, lr, now, upstream);
    p->loss_sum = 0;
    p->loss_n = 0;
    p->t_log = now;
    p->step_log = step;
}

/* Rank 0: the backbone to <output>/model.ckpt. */
static int save_model(trainer *t)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/model.ckpt", t->run.output);
    return save_backbone(t, path);
}

/* After the last step: the backbone (max_steps runs), the partition dump, the closing log line. */
static int finish(trainer *t, const progress *p, int64_t step, int64_t total, int stopped)
{
    const pf_config *run = &t->run;
    int rc = 0;
    if (t->rank == 0 && t->opts.max_steps > 0 && !t->model_saved) {
        if ((rc = train_mkdir_p(run->output)) < 0 || (rc = save_model(t)) < 0)
            return rc;
        log_info("backbone saved to %s/model.ckpt after %lld steps", run->output, (long long)step);
    }
    /* Training time: verification excluded (as from the Speed lines). */
    double el = pf_now_s() - p->t_start - p->val_s, vel;
    if (t->n_val && step > 0 && step % run->verbose != 0 && (rc = verify_sets(t, step, &vel)) < 0)
        return rc;
    if (t->opts.dump_centers && (rc = dump_partition(t, t->opts.dump_centers, step)) < 0)
        return rc;
    if (run->save_centers && !t->centers_saved && (rc = save_centers(t, step)) < 0)
        return rc;
    if (t->trace)
        fflush(t->trace);
    wdev_log_memory(&t->wd);
    if (t->rank != 0)
        return 0;
    /* Speeds count the steps this process trained (a resumed run started at t->start_step). */
    const int64_t here = step - t->start_step;
    if (step == 0)
        log_info("training stopped before the first step: no loss, outputs in %s", run->output);
    else if (here == 0)
        log_info("training %s: %lld of %lld steps (all before the %s; none trained now), outputs in %s",
                 stopped ? "stopped on request" : "done", (long long)step, (long long)total,
                 t->replacing ? "live worker's state this process took over" : "checkpoint it resumed from",
                 run->output);
    else
        log_info("training %s: %lld of %lld steps%s, first loss %.4f, final loss %.4f, %.2f samples/sec over "
                 "%.1f s, outputs in %s",
                 stopped ? "stopped on request" : "done", (long long)step, (long long)total,
                 t->replacing        ? " (replaced a lost worker from a live one's state: speed over this "
                                       "process' steps)"
                 : t->start_step > 0 ? " (resumed at a checkpoint: speed over this process' steps)"
                                     : "",
                 p->first_loss, p->last_loss, el > 0 ? (double)here * run->batch_size * t->W / el : 0.0, el,
                 run->output);
    return 0;
}

/* Registers the loop's series (t->mx; docs/metrics.md, "Worker") with their values before the first step
 * (a resumed run: its checkpoint step). */
static void metrics_register(trainer *t)
{
    train_metrics *x = &t->mx;
    x->step =
        metrics_gauge("pfcps_worker_step", "Global steps completed (arcface_torch's global_step).", NULL, 0);
    x->epoch = metrics_gauge("pfcps_worker_epoch", "Current epoch.", NULL, 0);
    x->last_step_ts = metrics_gauge("pfcps_worker_last_step_timestamp_seconds",
                                    "Unix time the last step completed.", NULL, 0);
    x->samples = metrics_counter("pfcps_worker_samples_total", "Images this worker trained on.", NULL, 0);
    x->samples_per_s = metrics_gauge("pfcps_worker_samples_per_second",
                                     "This worker's images per second over the last step.", NULL, 0);
    x->loss = metrics_gauge("pfcps_worker_loss", "The last step's loss (global batch mean).", NULL, 0);
    x->lr = metrics_gauge("pfcps_worker_learning_rate", "The last step's learning rate.", NULL, 0);
    x->step_s = metrics_histogram("pfcps_worker_step_seconds", "Whole step time.", NULL, 0,
                                  metrics_latency_bounds, metrics_latency_nbounds);
    static const char *const names[PH_COUNT] = {"sample", "pull", "head", "push", "backbone", "wait"};
    for (int i = 0; i < PH_COUNT; i++) {
        const char *labels[] = {"phase", names[i]};
        x->phase[i] = metrics_histogram("pfcps_worker_phase_seconds", "Time of each phase of a step.", labels,
                                        1, metrics_latency_bounds, metrics_latency_nbounds);
    }
    x->ckpt_ts = metrics_gauge("pfcps_worker_checkpoint_last_timestamp_seconds",
                               "Unix time of the newest checkpoint written (0: none).", NULL, 0);
    x->ckpt_step =
        metrics_gauge("pfcps_worker_checkpoint_last_step", "Step of the newest checkpoint written.", NULL, 0);
    x->loss_scale =
        metrics_gauge("pfcps_worker_loss_scale", "fp16 dynamic loss scale (1 without fp16).", NULL, 0);
    for (int i = 0; i < t->n_val; i++) {
        const char *labels[] = {"set", t->val[i].name};
        x->val[i] =
            metrics_gauge("pfcps_worker_verification_accuracy", "Last Accuracy-Flip of the set.", labels, 1);
    }
    metrics_set(x->loss, NAN); /* no step yet: not a number, not 0 */
    metrics_set(x->lr, NAN);
    metrics_set(x->step, (double)t->start_step);
    metrics_set(x->epoch, (double)(t->start_step / t->steps_per_epoch));
    metrics_set(x->loss_scale, t->loss_scaling ? (double)t->scaler.scale : 1.0);
}

/* After global step `step` (1-based) of `epoch`, which took `seconds` in all (stop vote to the push's end):
 * the loop's series. */
static void metrics_step(trainer *t, int64_t step, int64_t epoch, double loss, double lr, double seconds)
{
    train_metrics *x = &t->mx;
    metrics_set(x->step, (double)step);
    metrics_set(x->epoch, (double)epoch);
    metrics_set(x->last_step_ts, wall_s());
    metrics_add(x->samples, t->run.batch_size);
    metrics_set(x->samples_per_s, seconds > 0 ? t->run.batch_size / seconds : 0);
    metrics_set(x->loss, loss);
    metrics_set(x->lr, lr);
    metrics_set(x->loss_scale, t->loss_scaling ? (double)t->scaler.scale : 1.0);
    metrics_observe(x->step_s, seconds);
    for (int i = 0; i < PH_COUNT; i++)
        metrics_observe(x->phase[i], t->phase_s[i]);
}

int train_rewind(trainer *t, int64_t step)
{
    if (!t->gen)
        return pf_err(-EINVAL, "rewind to global step %lld: generations not kept (keep_generations off)",
                      (long long)step);
    int rc = wgen_restore(t->gen, step);
    if (rc < 0)
        return pf_err_wrap(rc, "rewind");
    const int64_t epoch = step / t->steps_per_epoch, first = step % t->steps_per_epoch;
    if ((rc = loader_start_epoch_at(t->ld, epoch, first)) < 0)
        return pf_err_wrap(rc, "rewind to global step %lld: data loader", (long long)step);
    metrics_set(t->mx.step, (double)step);
    metrics_set(t->mx.epoch, (double)epoch);
    metrics_set(t->mx.loss_scale, t->loss_scaling ? (double)t->scaler.scale : 1.0);
    log_info(
        "rewound to the start of step %lld (counted from 0: logged as Global Step: %lld), training epoch "
        "%lld, batch %lld",
        (long long)step, (long long)step + 1, (long long)epoch, (long long)first);
    return 0;
}

#ifdef PFCPS_TEST_HOOKS
/* In the tests' build of the worker only (pfcps-worker-test-hooks, -DPFCPS_TEST_HOOKS): with
 * PFCPS_TEST_STEP_FAILS_AT=N, step N (0-based, its first try only) fails at its start with -EIO, as a ring
 * receive fails when the worker on the left dies inside a message, before any worker-lost notice can have
 * come (the replacement test's deterministic form of that race; test_worker_replace.sh). Returns 0 otherwise. */
static int hook_step_fails(int64_t step)
{
    static int fired;
    const char *at = getenv("PFCPS_TEST_STEP_FAILS_AT");
    if (fired || !at || !*at || strtoll(at, NULL, 10) != step)
        return 0;
    fired = 1;
    log_warn("test hook PFCPS_TEST_STEP_FAILS_AT=%lld: failing step %lld", (long long)step, (long long)step);
    return pf_err(-EIO, "test hook PFCPS_TEST_STEP_FAILS_AT=%lld: step %lld fails as a ring receive does when "
                        "the worker on the left dies inside a message",
                  (long long)step, (long long)step);
}

/* PFCPS_TEST_DIES_AT_END (tests' build only; test_worker_replace.sh, cases end and after_end), checked at
 * `where`: "1", the worker kills itself (SIGKILL) once its last step is done, before its part of the final
 * checkpoint and model.ckpt (a worker lost in the final save, made certain); "after", once it passed the end
 * vote (a worker lost after every final output is written); "vote_hangs", its end vote done, it then waits in
 * a second allreduce that no other worker enters (a ring receive blocked on a worker lost inside the vote)
 * until the fabric interrupt ends it; "linger", once it passed the end vote it waits 2 s before it goes on
 * (the run stays open meanwhile). Returns 0, or the second vote's error for vote_hangs. */
static int hook_at_end(trainer *t, const char *where)
{
    const char *e = getenv("PFCPS_TEST_DIES_AT_END");
    if (!e || strcmp(e, where) != 0)
        return 0;
    if (strcmp(where, "linger") == 0) {
        log_warn("test hook PFCPS_TEST_DIES_AT_END=linger: waiting 2 s after the end vote");
        struct timespec ts = {2, 0};
        nanosleep(&ts, NULL);
        return 0;
    }
    if (strcmp(where, "vote_hangs") == 0) {
        log_warn(
            "test hook PFCPS_TEST_DIES_AT_END=vote_hangs: this worker's end vote waits on a ring receive "
            "that no other worker answers");
        float f = 0.f;
        int rc = coll_allreduce(&t->net.coll, &f, 1, COLL_F32, COLL_MAX);
        return rc < 0 ? rc
                      : pf_err(-EIO, "test hook PFCPS_TEST_DIES_AT_END=vote_hangs: a second vote completed");
    }
    log_warn("test hook PFCPS_TEST_DIES_AT_END=%s: killing this worker %s", where,
             strcmp(where, "1") == 0 ? "after its last step, before its final checkpoint part and model.ckpt"
                                     : "after the end vote");
    raise(SIGKILL);
    return 0;
}
#endif

/* The end of training as a step boundary, in a run that replaces lost workers in place (t->wr_on): the state
 * of `total` is kept as a generation and every worker votes once more (an allreduce) after its last step, its
 * part of the final checkpoint and model.ckpt. A worker lost in those writes then finds the others at this
 * vote rather than gone: they report step `total` (or one step back, when its last push is not whole on the
 * servers) and its replacement takes the usual way in. A replacement seated at `total` itself (nothing left
 * to train) first writes what the lost worker may not have: its part of the final checkpoint, and model.ckpt
 * at rank 0. Every worker writes its class-center partition (save_centers), and rank 0 of a --max-steps run
 * its model.ckpt, before it votes. A worker that passed the vote knows every worker's final outputs are
 * written: it tells the rendezvous (CTL_FO_END_VOTED), so that a worker lost from then on ends the run
 * instead of being replaced, and ignores later worker-lost notices (train_replace_notice). Without
 * replacement, or with `total` inside a gradient_acc window (not a state the generations keep), nothing is
 * done. Returns 0, or the vote's error (a worker lost: train_run's replacement). */
static int end_vote(trainer *t, const progress *p, int64_t total)
{
    if (!t->wr_on || !t->gen || total % t->acc_k != 0)
        return 0;
    int rc;
    const int seated_at_end = t->replacing && t->start_step == total;
    if (seated_at_end && is_ckpt_step(t, total, total))
        save_checkpoint(t, p, total);
    /* model.ckpt: written at each epoch end (run_epochs) unless the run stops at --max-steps, or this process
     * trained nothing (a replacement seated at the end) */
    if (t->rank == 0 && (seated_at_end || t->opts.max_steps > 0)) {
        if ((rc = train_mkdir_p(t->run.output)) < 0 || (rc = save_model(t)) < 0)
            return rc;
        t->model_saved = 1;
        if (t->opts.max_steps > 0)
            log_info("backbone saved to %s/model.ckpt after %lld steps", t->run.output, (long long)total);
        else
            log_info("training over: backbone saved to %s/model.ckpt", t->run.output);
    }
    if (t->run.save_centers) {
        if ((rc = save_centers(t, total)) < 0)
            return rc;
        t->centers_saved = 1;
    }
    if ((rc = wgen_keep(t->gen, total)) < 0)
        return rc;
    float f = 0.f;
    if ((rc = coll_allreduce(&t->net.coll, &f, 1, COLL_F32, COLL_MAX)) < 0)
        return rc;
#ifdef PFCPS_TEST_HOOKS
    if ((rc = hook_at_end(t, "vote_hangs")) < 0)
        return rc;
#endif
    atomic_store(&t->end_voted, 1);
    if (t->opts.sess) {
        rc = ctl_session_report(t->opts.sess, CTL_FO_END_VOTED, t->rank, 0, total, NULL, 0);
        if (rc < 0 && rc != -ENOTCONN) /* -ENOTCONN: the rendezvous is lost with server 0, nobody to tell */
            log_warn("end of training: %s", pf_errmsg());
    }
#ifdef PFCPS_TEST_HOOKS
    hook_at_end(t, "after");
    hook_at_end(t, "linger");
#endif
    return 0;
}

/* The epochs from global step *step to `total` (train_run's loop): each step's state kept (a run that replaces
 * lost workers), the stop vote, the step, its logs, verification, checkpoints, a rejoin's hold; model.ckpt at
 * each epoch end (rank 0). *step: the steps done (on an error, the step that failed); *stop: a stop was voted.
 * Returns 0 or the first error. */
static int run_epochs(trainer *t, progress *p, int64_t total, int64_t *step_io, int *stop_io)
{
    const pf_config *run = &t->run;
    int64_t step = *step_io;
    int rc = 0, stop = 0;
    uint32_t rejoin = 0;
    for (int64_t epoch = step / t->steps_per_epoch;
         rc == 0 && !stop && step < total && epoch < run->num_epoch; epoch++) {
        int64_t first = epoch == step / t->steps_per_epoch ? step % t->steps_per_epoch : 0;
        if ((rc = loader_start_epoch_at(t->ld, epoch, first)) < 0)
            break;
        while (step < total) {
            const double t_step = pf_now_s();
            /* The state at the start of the step's gradient_acc window (every step without accumulation),
             * before its first collective: a worker lost in this window's stop vote or later leaves every
             * survivor able to go back to here. A window's later steps are not kept: a redo starts at a window
             * start, since the lost worker's class-center sums of the window are lost with it. */
            if (t->gen && step % t->acc_k == 0 && (rc = wgen_keep(t->gen, step)) < 0)
                break;
            /* a stop at the start of a gradient_acc window only: its gradients would be lost */
            if (step % t->acc_k == 0 && (rc = stop_vote(t, &stop, &rejoin)) < 0)
                break;
            if (!stop)
                rejoin_agree(&t->rj, rejoin, step + t->acc_k);
            if (stop) {
                log_info("stop requested: finishing after %lld steps", (long long)step);
                break;
            }
            int have = loader_peek_labels(t->ld, t->labels);
            if (have <= 0) {
                rc = have;
                break;
            }
            const double lr = lr_schedule_at(&t->sched, step);
            double loss = 0;
            uint32_t flags =
                is_ckpt_step(t, step + 1, total) || rejoin_snapshot_push(&t->rj, step) ? PS_PUSH_SNAPSHOT : 0;
#ifdef PFCPS_TEST_HOOKS
            if ((rc = hook_step_fails(step)) < 0)
                break;
#endif
            if ((rc = train_step(t, step, lr, flags, &loss)) < 0)
                break;
            step++;
            metrics_step(t, step, epoch, loss, lr, pf_now_s() - t_step);
            if ((rc = check_loss(p, loss, step, epoch)) < 0)
                break;
            log_step(t, p, step, total, epoch, loss, lr);
            if (t->n_val && step % run->verbose == 0) {
                double el = 0;
                if ((rc = verify_sets(t, step, &el)) < 0)
                    break;
                p->t_log += el;
                p->val_s += el;
            }
#ifdef PFCPS_TEST_HOOKS
            if (step == total)
                hook_at_end(t, "1");
#endif
            if (flags)
                save_checkpoint(t, p, step);
            if (step == t->rj.ckpt && (rc = rejoin_hold(&t->rj, t->rank == 0 ? t->opts.sess : NULL, t->net.ps,
                                                        t->rank, step, t->run.ctl_timeout, hold_stop, t)) < 0)
                break;
        }
        if (rc == 0 && !stop && t->rank == 0 && t->opts.max_steps == 0) {
            if ((rc = save_model(t)) < 0)
                break;
            log_info("epoch %lld done: backbone saved to %s/model.ckpt", (long long)epoch, run->output);
        }
    }
    if (rc == 0 && !stop && step == total)
        rc = end_vote(t, p, total);
    *step_io = step;
    *stop_io = stop;
    return rc;
}

int train_run(trainer *t)
{
    const int64_t total = train_total_steps(t);
    /* steps done; the step being run is `step` (0-based), arcface_torch's global_step + 1 */
    int64_t step = t->start_step;
    int rc = 0, stop = 0;
    progress p = {.t_start = pf_now_s(), .first_loss = NAN, .last_loss = NAN, .step_log = step};
    p.t_log = p.t_start;
    if (step > 0) {
        int64_t n = 0;
        wresume_get_f64(&t->resumed, "first_loss", &p.first_loss);
        wresume_get_f64(&t->resumed, "log.loss_sum", &p.loss_sum);
        if (wresume_get_i64(&t->resumed, "log.loss_n", &n) == 0)
            p.loss_n = (int)n;
        if (step >= total && t->replacing)
            log_info("the live worker's state taken over is of step %lld, the last: nothing left to train",
                     (long long)step);
        else if (step >= total)
            log_info("checkpoint step %lld is the last step: nothing left to train", (long long)step);
    }
    metrics_register(t);
    if (step % t->acc_k != 0)
        return pf_err(-EINVAL, "resuming at global step %lld, inside a gradient_acc = %d window",
                      (long long)step, t->acc_k);

    uint32_t replaced = 0; /* the newest worker-lost epoch a replacement was set up for */
    for (;;) {
        rc = run_epochs(t, &p, total, &step, &stop);
        if (rc >= 0 || !t->wr_on ||
            (atomic_load(&t->wr_lost_epoch) <= replaced && !train_replace_await(t, replaced)))
            break;
        /* A worker was lost: redo from the step the rendezvous decides, with its replacement. */
        replaced = atomic_load(&t->wr_lost_epoch);
        int64_t redo = 0;
        if ((rc = train_replace(t, step, p.first_loss, p.loss_sum, p.loss_n, &redo, &replaced)) < 0)
            break;
        step = redo;
        if (rc == 1) { /* the run ended (a worker lost after the others passed the end vote) */
            rc = 0;
            break;
        }
    }
    if (rc < 0) {
        if (t->trace)
            fflush(t->trace);
        return rc;
    }
    return finish(t, &p, step, total, stop);
}
