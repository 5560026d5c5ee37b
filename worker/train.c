#include "worker/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/coll.h"
#include "common/err.h"
#include "common/fabric.h"
#include "common/log.h"
#include "common/member_addr.h"
#include "server/ps_client.h"
#include "worker/data/loader.h"
#include "worker/head/optim.h"
#include "worker/head/pfc.h"
#include "worker/model/model.h"

/* ln(1e30): the loss value when p_target is floored at 1e-30 for every row (no target matched). */
#define STUCK_LOSS 69.07755278982137

struct trainer {
    pf_config run;
    pf_config local; /* what the endpoints were opened with */
    train_opts opts;
    int rank, W, S;
    ps_client *ps;
    fab_ctx *coll_fab;
    pf_coll coll;
    int have_coll;
    loader *ld;
    model *m;
    pfc head;
    int have_head;
    float *mom;             /* SGD momentum (nparams) */
    float *adam_m, *adam_v; /* AdamW moments (nparams) */
    size_t nparams;
    float *centers, *grad_centers, *grad_emb;
    int64_t *labels;
    FILE *trace;
    double warmup_steps;
    int64_t total_steps, steps_per_epoch;
    double wait_s; /* longest wait for a server's answer before the run is declared broken */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int parse_wire_dtype(const char *s, ps_dtype *out)
{
    if (!strcmp(s, "fp32"))
        *out = PS_DT_FP32;
    else if (!strcmp(s, "fp16"))
        *out = PS_DT_FP16;
    else if (!strcmp(s, "bf16"))
        *out = PS_DT_BF16;
    else
        return pf_err(-EINVAL, "wire_dtype '%s' is not fp32, fp16 or bf16", s);
    return 0;
}

static int mkdir_p(const char *path)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            mkdir(buf, 0755);
            *p = '/';
        }
    }
    if (mkdir(buf, 0755) < 0 && errno != EEXIST)
        return pf_err(-errno, "cannot create output directory '%s': %s", path, strerror(errno));
    return 0;
}

int train_open_endpoints(trainer **out, const pf_config *local, int rank, uint8_t *addr, size_t *addr_len)
{
    trainer *t = calloc(1, sizeof *t);
    if (!t)
        return pf_err(-ENOMEM, "out of memory");
    t->rank = rank;
    t->local = *local;
    ps_dtype dt = PS_DT_FP32;
    int rc = parse_wire_dtype(local->wire_dtype, &dt);
    ps_client_opts po = {.provider = local->provider, .rank = rank, .servers = local->servers,
                         .num_classes = local->num_classes > 0 ? local->num_classes : 1,
                         .dim = local->embedding_size, .dtype = dt};
    if (rc == 0)
        rc = ps_client_create(&po, &t->ps);
    if (rc == 0)
        rc = fab_open(local->provider, &t->coll_fab);
    uint8_t a0[FAB_MAX_ADDR], a1[FAB_MAX_ADDR];
    size_t l0 = sizeof a0, l1 = sizeof a1;
    if (rc == 0)
        rc = ps_client_getname(t->ps, a0, &l0);
    if (rc == 0)
        rc = fab_getname(t->coll_fab, a1, &l1);
    if (rc == 0) {
        const void *parts[2] = {a0, a1};
        size_t lens[2] = {l0, l1};
        rc = member_addr_pack(addr, *addr_len, 2, parts, lens);
        if (rc > 0) {
            *addr_len = (size_t)rc;
            rc = 0;
        }
    }
    if (rc < 0) {
        train_close(t);
        return rc;
    }
    *out = t;
    return 0;
}

/* The ps_client was created before the run config was known (its address had to go into the join):
 * check that what it was created with matches the run. */
static int check_client_matches(const pf_config *local, const pf_config *run)
{
    if (local->servers != run->servers || local->embedding_size != run->embedding_size ||
        strcmp(local->wire_dtype, run->wire_dtype) || strcmp(local->provider, run->provider))
        return pf_err(-EINVAL,
                      "this worker's config (servers %d, embedding_size %d, wire_dtype %s, provider %s) differs "
                      "from the run's (servers %d, embedding_size %d, wire_dtype %s, provider %s): give every "
                      "process the same config",
                      local->servers, local->embedding_size, local->wire_dtype, local->provider, run->servers,
                      run->embedding_size, run->wire_dtype, run->provider);
    return 0;
}

int train_setup(trainer *t, const pf_config *run, const ctl_book *book, const train_opts *opts)
{
    int rc;
    if ((rc = check_client_matches(&t->local, run)) < 0)
        return rc;
    t->run = *run;
    t->opts = *opts;
    t->W = run->workers;
    t->S = run->servers;
    /* Under BSP a pull waits for the slowest worker's push, so allow several control timeouts. */
    t->wait_s = 4 * (run->ctl_timeout > 0 ? run->ctl_timeout : 30);
    if (book->num_workers != t->W || book->num_servers != t->S)
        return pf_err(-EPROTO, "address book has %d servers / %d workers, run config says %d / %d",
                      book->num_servers, book->num_workers, t->S, t->W);

    /* Servers: their single fabric address each; then open the connections before step 0. */
    for (int s = 0; s < t->S; s++)
        if ((rc = ps_client_add_server(t->ps, s, book->servers[s].addr, book->servers[s].addr_len)) < 0)
            return pf_err_wrap(rc, "server %d address", s);
    if ((rc = ps_client_warmup(t->ps, run->ctl_timeout > 0 ? run->ctl_timeout : 30)) < 0)
        return pf_err_wrap(rc, "warming up the connections to %d servers", t->S);

    /* Collectives: a ring over every worker's second endpoint. */
    const void **addrs = calloc((size_t)t->W, sizeof *addrs);
    size_t *lens = calloc((size_t)t->W, sizeof *lens);
    if (!addrs || !lens) {
        free(addrs);
        free(lens);
        return pf_err(-ENOMEM, "out of memory");
    }
    rc = 0;
    for (int w = 0; w < t->W && rc == 0; w++) {
        rc = member_addr_part(book->workers[w].addr, book->workers[w].addr_len, 1, &addrs[w], &lens[w]);
        if (rc < 0)
            pf_err_wrap(rc, "worker %d's collective address", w);
    }
    if (rc == 0) {
        coll_fabric_opts co = {.timeout_s = run->ctl_timeout > 0 ? run->ctl_timeout * 4 : 120};
        rc = coll_fabric_create(t->coll_fab, t->rank, t->W, addrs, lens, &co, &t->coll);
        t->have_coll = rc == 0;
    }
    free(addrs);
    free(lens);
    if (rc < 0)
        return rc;

    /* Data. Labels must be below num_classes: the loader checks every record at open. */
    loader_opts lo;
    loader_opts_from_config(&lo, &t->run, t->rank, t->W);
    if ((rc = loader_open(&t->ld, &lo)) < 0)
        return pf_err_wrap(rc, "dataset '%s'", run->rec);
    t->steps_per_epoch = loader_num_batches(t->ld);
    int64_t num_image = run->num_image > 0 ? run->num_image : loader_num_images(t->ld);
    if (t->steps_per_epoch <= 0)
        return pf_err(-EINVAL, "dataset '%s' has %lld images: not one full batch of %d per worker on %d workers",
                      run->rec, (long long)loader_num_images(t->ld), run->batch_size, t->W);
    if ((rc = optim_schedule_steps(num_image, (int64_t)run->batch_size * t->W, run->num_epoch, run->warmup_epoch,
                                   &t->warmup_steps, &t->total_steps)) < 0)
        return rc;
    log_info("dataset %s: %lld images, %lld classes, %lld steps per epoch on each of %d workers, %lld skipped",
             run->rec, (long long)loader_num_images(t->ld), (long long)loader_num_classes(t->ld),
             (long long)t->steps_per_epoch, t->W, (long long)loader_skipped(t->ld));

    /* Backbone: same seed on every rank, then rank 0's parameters broadcast (identical by construction;
     * the broadcast makes it so whatever the initialiser does). */
    if ((rc = model_create(&t->m, run->network, run->embedding_size, run->batch_size)) < 0)
        return pf_err_wrap(rc, "network '%s'", run->network);
    model_init(t->m, (uint64_t)run->seed);
    t->nparams = model_num_params(t->m);
    if ((rc = coll_broadcast(&t->coll, model_params(t->m), t->nparams * sizeof(float), 0)) < 0)
        return rc;
    log_info("backbone %s: %zu parameters (%.1f MB), embedding_size %d, batch %d", run->network, t->nparams,
             t->nparams * 4.0 / 1e6, run->embedding_size, run->batch_size);
    if (!strcmp(run->optimizer, "sgd")) {
        t->mom = calloc(t->nparams, sizeof(float));
    } else if (!strcmp(run->optimizer, "adamw")) {
        t->adam_m = calloc(t->nparams, sizeof(float));
        t->adam_v = calloc(t->nparams, sizeof(float));
    } else {
        return pf_err(-EINVAL, "optimizer '%s' is not sgd or adamw", run->optimizer);
    }
    if (!t->mom && !(t->adam_m && t->adam_v))
        return pf_err(-ENOMEM, "out of memory for optimizer state");

    /* Head. */
    head_params hp = {.s = run->scale, .m1 = run->margin_list[0], .m2 = run->margin_list[1],
                      .m3 = run->margin_list[2],
                      .interclass_filtering_threshold = run->interclass_filtering_threshold, .clamp_loss = 1};
    if ((rc = head_parse_margin_grad(run->margin_grad, &hp.margin_grad)) < 0 ||
        (rc = head_parse_mode(run->head_mode, &hp.mode)) < 0)
        return rc;
    if ((rc = pfc_init(&t->head, &hp, &t->coll, run->num_classes, run->sample_rate, (uint64_t)run->seed,
                       run->batch_size, run->embedding_size)) < 0)
        return rc;
    t->have_head = 1;
    size_t kd = (size_t)t->head.k_max * (size_t)run->embedding_size;
    t->centers = malloc(kd * sizeof(float));
    t->grad_centers = malloc(kd * sizeof(float));
    t->grad_emb = malloc((size_t)run->batch_size * run->embedding_size * sizeof(float));
    t->labels = malloc((size_t)run->batch_size * sizeof(int64_t));
    if (!t->centers || !t->grad_centers || !t->grad_emb || !t->labels)
        return pf_err(-ENOMEM, "out of memory for head buffers (k_max %lld)", (long long)t->head.k_max);
    log_info("head: %s margin (%.3g, %.3g, %.3g) scale %.3g, %s gradient, %s mode, sample_rate %.3g: up to %lld "
             "of %lld classes per worker per step",
             run->margin_list[1] > 0 ? "arcface" : "combined", run->margin_list[0], run->margin_list[1],
             run->margin_list[2], run->scale, run->margin_grad, run->head_mode, run->sample_rate,
             (long long)t->head.k_max, (long long)run->num_classes);

    if (t->rank == 0) {
        if ((rc = mkdir_p(run->output)) < 0)
            return rc;
        char path[1100];
        snprintf(path, sizeof path, "%s/training.log", run->output);
        if (log_open_file(path) < 0)
            log_warn("cannot write %s", path);
    }
    if (opts->trace_path) {
        t->trace = fopen(opts->trace_path, "w");
        if (!t->trace)
            return pf_err(-errno, "cannot write trace file '%s'", opts->trace_path);
    }
    return 0;
}

/* Backbone optimizer step on every trainable tensor (fixed ones, the features BN weight, are skipped, as
 * arcface_torch leaves them out: requires_grad = False). */
static int optimizer_step(trainer *t, float lr, int64_t step1)
{
    float *w = model_params(t->m), *g = model_grads(t->m);
    for (int i = 0; i < model_num_tensors(t->m); i++) {
        const model_tensor *T = model_tensor_at(t->m, i);
        if (T->flags & MODEL_TENSOR_FIXED)
            continue;
        if (t->mom) {
            optim_sgd_step(w + T->offset, g + T->offset, t->mom + T->offset, T->count, lr, (float)t->run.momentum,
                           (float)t->run.weight_decay);
        } else {
            adamw_params ap = {.lr = lr, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                               .weight_decay = t->run.weight_decay};
            int rc = optim_adamw_step(w + T->offset, g + T->offset, t->adam_m + T->offset, t->adam_v + T->offset,
                                      T->count, &ap, step1);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

/* Zeroes the gradients of fixed tensors so that they take no part in clipping. */
static void zero_fixed_grads(trainer *t)
{
    float *g = model_grads(t->m);
    for (int i = 0; i < model_num_tensors(t->m); i++) {
        const model_tensor *T = model_tensor_at(t->m, i);
        if (T->flags & MODEL_TENSOR_FIXED)
            memset(g + T->offset, 0, T->count * sizeof(float));
    }
}

/* Pulls this worker's whole partition (classes c mod W == rank) after the last step and writes it. */
static int dump_partition(trainer *t, int64_t step)
{
    char path[1100];
    snprintf(path, sizeof path, "%s.rank%d", t->opts.dump_centers, t->rank);
    FILE *f = fopen(path, "wb");
    if (!f)
        return pf_err(-errno, "cannot write '%s'", path);
    int64_t C = t->run.num_classes, D = t->run.embedding_size;
    enum { CHUNK = 4096 };
    int64_t ids[CHUNK];
    float *rows = malloc(sizeof(float) * CHUNK * (size_t)D);
    int rc = rows ? 0 : pf_err(-ENOMEM, "out of memory");
    for (int64_t c0 = t->rank; rc == 0 && c0 < C;) {
        int n = 0;
        for (; n < CHUNK && c0 < C; c0 += t->W)
            ids[n++] = c0;
        ps_req *req;
        rc = ps_pull(t->ps, ids, (size_t)n, rows, step, &req);
        if (rc == 0)
            rc = ps_wait(t->ps, req, t->wait_s);
        for (int i = 0; rc == 0 && i < n; i++) {
            uint64_t id = (uint64_t)ids[i];
            if (fwrite(&id, 8, 1, f) != 1 || fwrite(rows + (size_t)i * D, sizeof(float), (size_t)D, f) != (size_t)D)
                rc = pf_err(-EIO, "writing '%s'", path);
        }
    }
    free(rows);
    if (fclose(f) != 0 && rc == 0)
        rc = pf_err(-EIO, "writing '%s'", path);
    return rc;
}

int train_run(trainer *t)
{
    const pf_config *run = &t->run;
    const int B = run->batch_size, D = run->embedding_size;
    const int64_t total = t->opts.max_steps > 0 ? t->opts.max_steps : t->steps_per_epoch * run->num_epoch;
    int64_t step = 0; /* steps done; the step being run is `step` (0-based), arcface_torch's global_step + 1 */
    int rc = 0, stuck = 0;
    double loss_sum = 0, last_loss = NAN, first_loss = NAN;
    int loss_n = 0;
    double t_start = now_s(), t_log = t_start;
    int64_t step_log = 0;

    for (int64_t epoch = 0; rc == 0 && step < total && epoch < run->num_epoch; epoch++) {
        if ((rc = loader_start_epoch(t->ld, epoch)) < 0)
            break;
        for (;;) {
            if (step >= total)
                break;
            /* Every rank agrees on stopping (a signal reaches the ranks at different times). */
            float stop = t->opts.stop_flag && *t->opts.stop_flag ? 1.f : 0.f;
            if ((rc = coll_allreduce(&t->coll, &stop, 1, COLL_F32, COLL_MAX)) < 0)
                break;
            if (stop > 0) {
                log_info("stop requested: finishing after %lld steps", (long long)step);
                goto done;
            }
            int have = loader_peek_labels(t->ld, t->labels);
            if (have < 0) {
                rc = have;
                break;
            }
            if (have == 0)
                break;
            const double lr = optim_poly_lr(run->lr, step, t->warmup_steps, t->total_steps);

            /* 1-2: labels -> sampled class ids; 3: pull them while the backbone runs. */
            const int64_t *ids;
            int64_t k;
            if ((rc = pfc_sample(&t->head, step, t->labels, &ids, &k)) < 0)
                break;
            ps_req *pull = NULL, *push = NULL;
            if ((rc = ps_pull(t->ps, ids, (size_t)k, t->centers, step, &pull)) < 0)
                break;
            loader_batch *b;
            int got = loader_next(t->ld, &b);
            if (got <= 0) {
                rc = got < 0 ? got : pf_err(-EPROTO, "loader ended a batch after announcing its labels");
                ps_wait(t->ps, pull, t->wait_s);
                break;
            }
            /* 4: backbone forward. */
            const float *emb;
            model_zero_grad(t->m);
            rc = model_forward(t->m, b->images, B, 1, &emb);
            int wrc = ps_wait(t->ps, pull, t->wait_s);
            if (rc == 0)
                rc = wrc;
            /* 5: the head over every worker's sampled columns. */
            double loss = 0;
            if (rc == 0)
                rc = pfc_step(&t->head, emb, t->centers, &loss, t->grad_emb, t->grad_centers);
            /* 6: push the row gradients now; the servers apply them during our backward. */
            if (rc == 0)
                rc = ps_push(t->ps, ids, (size_t)k, t->grad_centers, (float)lr, step, &push);
            /* 7: backbone backward. grad_emb is d(global mean loss)/d(my embeddings) in both head modes;
             * arcface_torch scales it by W (AllGather backward) and DDP averages the backbone gradients
             * over W, so the mean of the W scaled gradients is the gradient of the global mean loss. */
            if (rc == 0) {
                for (size_t i = 0; i < (size_t)B * D; i++)
                    t->grad_emb[i] *= (float)t->W;
                rc = model_backward(t->m, t->grad_emb, NULL);
            }
            if (rc == 0)
                rc = coll_allreduce(&t->coll, model_grads(t->m), t->nparams, COLL_F32, COLL_SUM);
            if (rc == 0) {
                float *g = model_grads(t->m), inv = 1.f / (float)t->W;
                for (size_t i = 0; i < t->nparams; i++)
                    g[i] *= inv;
                zero_fixed_grads(t);
                optim_clip_grad_norm(g, t->nparams, 5.0);
                rc = optimizer_step(t, (float)lr, step + 1);
            }
            loader_release(t->ld, b);
            if (push) {
                wrc = ps_wait(t->ps, push, t->wait_s);
                if (rc == 0)
                    rc = wrc;
            }
            if (rc < 0)
                break;
            step++;

            if (!isfinite(loss)) {
                rc = pf_err(-EDOM, "loss is %f at global step %lld (epoch %lld): stopping", loss, (long long)step,
                            (long long)epoch);
                break;
            }
            stuck = fabs(loss - STUCK_LOSS) < 1e-3 ? stuck + 1 : 0;
            if (stuck >= 20) {
                rc = pf_err(-EPROTO, "loss stuck at ln(1e30) = 69.0776 for 20 steps up to global step %lld: no "
                            "target logit ever matched its class center (label remapping or sampling fault)",
                            (long long)step);
                break;
            }
            if (isnan(first_loss))
                first_loss = loss;
            last_loss = loss;
            loss_sum += loss;
            loss_n++;
            if (t->trace)
                fprintf(t->trace, "%lld %.17g %.9g\n", (long long)step, loss, lr);
            if (t->rank == 0 && (step % run->frequent == 0 || step == total)) {
                double now = now_s();
                double speed = (double)(step - step_log) * B * t->W / (now - t_log);
                double per_step = (now - t_start) / (double)step;
                double hours = per_step * (double)(total - step) / 3600.0;
                log_info("Speed %.2f samples/sec   Loss %.4f   LearningRate %.6f   Epoch: %lld   Global Step: %lld   "
                         "Required: %1.f hours",
                         speed, loss_sum / loss_n, lr, (long long)epoch, (long long)step, hours);
                loss_sum = 0;
                loss_n = 0;
                t_log = now;
                step_log = step;
            }
        }
        if (rc == 0 && t->rank == 0 && t->opts.max_steps == 0) {
            char path[1100];
            snprintf(path, sizeof path, "%s/model.ckpt", run->output);
            if ((rc = model_save(t->m, path)) < 0)
                break;
            log_info("epoch %lld done: backbone saved to %s", (long long)epoch, path);
        }
    }
done:
    if (rc == 0 && t->rank == 0 && t->opts.max_steps > 0) {
        char path[1100];
        snprintf(path, sizeof path, "%s/model.ckpt", run->output);
        if ((rc = mkdir_p(run->output)) == 0 && (rc = model_save(t->m, path)) == 0)
            log_info("backbone saved to %s after %lld steps", path, (long long)step);
    }
    if (rc == 0 && t->opts.dump_centers)
        rc = dump_partition(t, step);
    if (t->trace)
        fflush(t->trace);
    if (rc == 0 && t->rank == 0) {
        double el = now_s() - t_start;
        log_info("training done: %lld steps, first loss %.4f, final loss %.4f, %.2f samples/sec over %.1f s, "
                 "outputs in %s",
                 (long long)step, first_loss, last_loss, el > 0 ? (double)step * B * t->W / el : 0.0, el,
                 run->output);
    }
    return rc;
}

void train_close(trainer *t)
{
    if (!t)
        return;
    if (t->trace)
        fclose(t->trace);
    if (t->have_head)
        pfc_free(&t->head);
    model_free(t->m);
    loader_close(t->ld);
    if (t->have_coll)
        coll_destroy(&t->coll);
    fab_close(t->coll_fab);
    ps_client_destroy(t->ps);
    free(t->mom);
    free(t->adam_m);
    free(t->adam_v);
    free(t->centers);
    free(t->grad_centers);
    free(t->grad_emb);
    free(t->labels);
    free(t);
}
