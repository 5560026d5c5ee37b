/* The training loop of one pfcps worker: see train.h. The file reads top to bottom as set-up (servers and
 * ring, data, backbone, head, outputs), one training step (train_step), and the run (train_run: the stop
 * vote, the step, loss checks, logging, checkpoints). Device specifics are behind worker/device.h. */
#include "worker/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/atomic_file.h"
#include "common/clock.h"
#include "common/coll.h"
#include "common/err.h"
#include "common/fabric.h"
#include "common/log.h"
#include "common/member_addr.h"
#include "kernels/ops.h"
#include "worker/data/loader.h"
#include "worker/data/rec.h"
#include "worker/device.h"
#include "worker/eval/set.h"
#include "worker/head/pfc.h"
#include "worker/lr_schedule.h"
#include "worker/loss_scale.h"
#include "worker/model/model.h"
#include "worker/model/safetensors.h"
#include "worker/ps_client.h"
#include "common/ckpt.h"
#include "worker/resume.h"
#include "worker/tb_writer.h"

/* arcface_torch's GradScaler: torch.cuda.amp.GradScaler(growth_interval=100), init scale 2^16. */
#define AMP_INIT_SCALE      65536.0f
#define AMP_GROWTH_INTERVAL 100

/* Verification sets a run scores at most (config key val_targets). */
#define MAX_VAL_TARGETS 8

/* ln(1e30): the loss value when p_target is floored at 1e-30 for every row (no target matched). */
#define STUCK_LOSS 69.07755278982137

struct trainer {
    pf_config run;
    pf_config local; /* what the endpoints were opened with */
    train_opts opts;
    int rank, W, S;
    ps_client *ps;
    fab_ctx *coll_fab;
    pf_coll coll; /* the fabric ring among the workers */
    int have_coll;
    uint8_t dev_id[WDEV_ID_BYTES]; /* worker 0 of a cuda run: the NCCL unique id it published */
    loader *ld;
    model *m;
    wdev wd;  /* the device: backbone collective, head buffers, the head on the device */
    pfc head; /* the sampler (and, off the GPU, the CPU head) */
    int have_head;
    float *mom;             /* device: SGD momentum (nparams) */
    float *adam_m, *adam_v; /* device: AdamW moments (nparams) */
    int64_t opt_steps;      /* optimizer steps applied (AdamW's count; steps skipped on overflow excluded) */
    size_t nparams;
    int loss_scaling;
    loss_scaler scaler;
    int64_t *labels; /* (B) the next batch's labels */
    FILE *trace;
    tb_writer *tb;                 /* rank 0: <output>/tensorboard; NULL when off or after a write error */
    eval_set val[MAX_VAL_TARGETS]; /* rank 0: the val_targets sets */
    double val_highest[MAX_VAL_TARGETS]; /* highest Accuracy-Flip so far, per set */
    int n_val;
    double warmup_steps;
    int64_t total_steps, steps_per_epoch;
    double wait_s;         /* longest wait for a server's answer before the run is declared broken */
    char ckpt_root[4096];  /* checkpoints (common/ckpt.h) */
    int64_t start_step;    /* > 0: resumed from this checkpoint step */
    wresume_state resumed; /* the scalars loaded with it */
};

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
    int rc = ps_dtype_parse(local->wire_dtype, &dt);
    ps_client_opts po = {.provider = local->provider,
                         .rank = rank,
                         .servers = local->servers,
                         .num_classes = local->num_classes > 0 ? local->num_classes : 1,
                         .dim = local->embedding_size,
                         .dtype = dt};
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
    /* The device may add a third part (worker 0 of a cuda run: the NCCL unique id). */
    int nparts = 2;
    if (rc == 0 && (rc = wdev_make_id(local->device, rank, t->dev_id)) == 1) {
        nparts = 3;
        rc = 0;
    }
    if (rc == 0) {
        const void *parts[3] = {a0, a1, t->dev_id};
        size_t lens[3] = {l0, l1, WDEV_ID_BYTES};
        rc = member_addr_pack(addr, *addr_len, nparts, parts, lens);
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
        return pf_err(
            -EINVAL,
            "this worker's config (servers %d, embedding_size %d, wire_dtype %s, provider %s) differs "
            "from the run's (servers %d, embedding_size %d, wire_dtype %s, provider %s): give every "
            "process the same config",
            local->servers, local->embedding_size, local->wire_dtype, local->provider, run->servers,
            run->embedding_size, run->wire_dtype, run->provider);
    return 0;
}

/* Set-up 1: the servers (addresses from the book, connections opened before step 0). */
static int setup_servers(trainer *t, const ctl_book *book)
{
    int rc;
    /* Under BSP a pull waits for the slowest worker's push, so allow several control timeouts. */
    t->wait_s = 4 * (t->run.ctl_timeout > 0 ? t->run.ctl_timeout : 30);
    /* A dead server is declared (-ECOMM naming it) once it leaves a send or a liveness probe unanswered for
     * the same bound (ps_client.h); not less: a live server's reply can wait on another worker's long step.
     */
    ps_client_set_timeout(t->ps, t->wait_s);
    if (book->num_workers != t->W || book->num_servers != t->S)
        return pf_err(-EPROTO, "address book has %d servers / %d workers, run config says %d / %d",
                      book->num_servers, book->num_workers, t->S, t->W);
    uint64_t token = 0;
    if ((rc = ctl_data_token(t->opts.secret ? t->opts.secret : t->run.secret, book->run_nonce, &token)) < 0)
        return rc;
    ps_client_set_token(t->ps, token);
    ps_client_set_borrow_grads(t->ps, 1); /* train_step waits for its push before grad_centers changes */
    for (int s = 0; s < t->S; s++)
        if ((rc = ps_client_add_server(t->ps, s, book->servers[s].addr, book->servers[s].addr_len)) < 0)
            return pf_err_wrap(rc, "server %d address", s);
    if ((rc = ps_client_warmup(t->ps, t->run.ctl_timeout > 0 ? t->run.ctl_timeout : 30)) < 0)
        return pf_err_wrap(rc, "warming up the connections to %d servers", t->S);
    return 0;
}

/* Set-up 2: the collectives ring over every worker's second endpoint. */
static int setup_ring(trainer *t, const ctl_book *book)
{
    const void **addrs = calloc((size_t)t->W, sizeof *addrs);
    size_t *lens = calloc((size_t)t->W, sizeof *lens);
    if (!addrs || !lens) {
        free(addrs);
        free(lens);
        return pf_err(-ENOMEM, "out of memory");
    }
    int rc = 0;
    for (int w = 0; w < t->W && rc == 0; w++) {
        rc = member_addr_part(book->workers[w].addr, book->workers[w].addr_len, 1, &addrs[w], &lens[w]);
        if (rc < 0)
            pf_err_wrap(rc, "worker %d's collective address", w);
    }
    if (rc == 0) {
        coll_fabric_opts co = {.timeout_s = t->run.ctl_timeout > 0 ? t->run.ctl_timeout * 4 : 120};
        rc = coll_fabric_create(t->coll_fab, t->rank, t->W, addrs, lens, &co, &t->coll);
        t->have_coll = rc == 0;
    }
    free(addrs);
    free(lens);
    return rc;
}

/* Set-up 3: the data loader (labels must be below num_classes: the loader checks every record at open) and
 * arcface_torch's schedule lengths. */
static int setup_data(trainer *t)
{
    const pf_config *run = &t->run;
    loader_opts lo;
    loader_opts_from_config(&lo, run, t->rank, t->W);
    int rc = loader_open(&t->ld, &lo);
    if (rc < 0)
        return pf_err_wrap(rc, "dataset '%s'", run->rec);
    t->steps_per_epoch = loader_num_batches(t->ld);
    int64_t num_image = run->num_image > 0 ? run->num_image : loader_num_images(t->ld);
    if (t->steps_per_epoch <= 0)
        return pf_err(-EINVAL,
                      "dataset '%s' has %lld images: not one full batch of %d per worker on %d workers",
                      run->rec, (long long)loader_num_images(t->ld), run->batch_size, t->W);
    if ((rc = lr_schedule_steps(num_image, (int64_t)run->batch_size * t->W, run->num_epoch, run->warmup_epoch,
                                &t->warmup_steps, &t->total_steps)) < 0)
        return rc;
    /* arcface_torch uses num_image only for the schedule length: a smaller one ends the lr early. */
    int64_t have = loader_num_images(t->ld);
    if (t->rank == 0 && run->num_image > 0 && run->num_image < have)
        log_warn(
            "num_image %lld is smaller than the %lld images of dataset '%s': the lr schedule is %lld steps "
            "(warmup %.0f) but %d epochs over the dataset are %lld steps, the last %lld at lr 0 "
            "(arcface_torch uses num_image only for the schedule length; set num_image = %lld, or 0 to "
            "read it from the dataset)",
            (long long)run->num_image, (long long)have, run->rec, (long long)t->total_steps, t->warmup_steps,
            run->num_epoch, (long long)(t->steps_per_epoch * run->num_epoch),
            (long long)(t->steps_per_epoch * run->num_epoch - t->total_steps), (long long)have);
    log_info(
        "dataset %s: %lld images, %lld classes, %lld steps per epoch on each of %d workers, %lld skipped",
        run->rec, (long long)loader_num_images(t->ld), (long long)loader_num_classes(t->ld),
        (long long)t->steps_per_epoch, t->W, (long long)loader_skipped(t->ld));
    return 0;
}

/* *p = zero-filled device memory of the model's device. */
static int dev_alloc(trainer *t, void **p, size_t bytes, const char *what)
{
    int rc = t->wd.dev->mem_alloc(t->wd.ctx, p, bytes);
    return rc < 0 ? pf_err_wrap(rc, "device %s: %zu bytes for %s", t->wd.di.name, bytes, what) : 0;
}

/* The backbone optimizer's state on the device: SGD momentum or AdamW's two moments. */
static int setup_optimizer(trainer *t)
{
    size_t pbytes = t->nparams * sizeof(float);
    if (!strcmp(t->run.optimizer, "sgd"))
        return dev_alloc(t, (void **)&t->mom, pbytes, "SGD momentum");
    if (!strcmp(t->run.optimizer, "adamw")) {
        int rc = dev_alloc(t, (void **)&t->adam_m, pbytes, "AdamW first moment");
        return rc < 0 ? rc : dev_alloc(t, (void **)&t->adam_v, pbytes, "AdamW second moment");
    }
    return pf_err(-EINVAL, "optimizer '%s' is not sgd or adamw", t->run.optimizer);
}

/* Dynamic loss scaling (fp16 on a half device). PFCPS_AMP_INIT_SCALE (tests only): another initial scale,
 * e.g. 2^127 to force overflows. */
static int setup_loss_scaler(trainer *t)
{
    float init = AMP_INIT_SCALE;
    const char *env = getenv("PFCPS_AMP_INIT_SCALE");
    if (env && *env) {
        char *end;
        double v = strtod(env, &end);
        if (*end || !(v > 0) || !isfinite((float)v))
            return pf_err(-EINVAL, "environment PFCPS_AMP_INIT_SCALE='%s' is not a positive float32 number",
                          env);
        init = (float)v;
        log_warn("PFCPS_AMP_INIT_SCALE: initial loss scale %g instead of %g (for tests)", (double)init,
                 (double)AMP_INIT_SCALE);
    }
    int rc = loss_scaler_init(&t->scaler, init, AMP_GROWTH_INTERVAL);
    if (rc < 0)
        return rc;
    t->loss_scaling = 1;
    log_info("dynamic loss scaling: init scale %g, growth interval %d, growth %g, backoff %g",
             (double)t->scaler.scale, t->scaler.growth_interval, (double)t->scaler.growth_factor,
             (double)t->scaler.backoff_factor);
    return 0;
}

/* Set-up 4: the backbone on the configured device, its collective, the same initial parameters on every
 * worker, the optimizer state and the loss scaler. */
static int setup_backbone(trainer *t, const ctl_book *book)
{
    const pf_config *run = &t->run;
    train_device_info di;
    int rc;
    /* The device was checked at start on this worker's own config (worker/main.c); the run's must be the
     * same, since worker 0 made the NCCL id from its own. */
    if (strcmp(t->local.device, run->device) || t->local.fp16 != run->fp16 || t->local.bf16 != run->bf16)
        return pf_err(-EINVAL,
                      "this worker's config (device %s, fp16 %d, bf16 %d) differs from the run's (device "
                      "%s, fp16 %d, bf16 %d): give every process the same config",
                      t->local.device, t->local.fp16, t->local.bf16, run->device, run->fp16, run->bf16);
    if ((rc = train_device_resolve(run, &di)) < 0)
        return rc;
    if (di.warning[0] && t->rank == 0)
        log_warn("%s", di.warning);
    if ((rc = wdev_open(&t->wd, &di, t->rank, t->W)) < 0)
        return rc;
    const ops_device *dev = ops_device_by_name(di.name);
    if (!dev)
        return pf_err_wrap(-ENODEV, "device '%s'", di.name);
    model_desc desc;
    if ((rc = model_desc_from_name(&desc, run->network, run->embedding_size)) < 0)
        return pf_err_wrap(rc, "network '%s'", run->network);
    if ((rc = model_create_desc(&t->m, &desc, run->batch_size, dev)) < 0)
        return pf_err_wrap(rc, "network '%s' on device %s", run->network, di.name);
    model_init(t->m, (uint64_t)run->seed);
    /* Fine-tuning: every worker loads the same file (parameters and BN statistics; the broadcast below covers
     * the parameters only), so it must be readable on every worker's host. */
    if (run->pretrained[0]) {
        if ((rc = model_load_pretrained(t->m, run->pretrained)) < 0)
            return pf_err_wrap(rc, "config key 'pretrained' = %s", run->pretrained);
        log_info("backbone initialised from %s (pretrained)", run->pretrained);
    }
    t->nparams = model_num_params(t->m);
    if ((rc = wdev_backbone(&t->wd, dev, model_ctx(t->m), t->nparams, &t->coll, book)) < 0)
        return rc;
    /* Same seed on every rank, then rank 0's parameters broadcast (identical by construction; the broadcast
     * makes it so whatever the initialiser does). */
    if ((rc = wdev_bcast(&t->wd, model_params(t->m))) < 0)
        return pf_err_wrap(rc, "broadcasting the initial parameters");
    log_info("device %s, precision %s; backbone collectives: %s", di.name, di.precision, t->wd.backend);
    log_info("backbone %s: %zu parameters (%.1f MB), embedding_size %d, batch %d", run->network, t->nparams,
             t->nparams * 4.0 / 1e6, run->embedding_size, run->batch_size);
    if ((rc = setup_optimizer(t)) < 0)
        return rc;
    return di.loss_scaling ? setup_loss_scaler(t) : 0;
}

/* Set-up 5: the Partial FC head: the sampler (on the host for every device) and the head on the device. */
static int setup_head(trainer *t)
{
    const pf_config *run = &t->run;
    head_params hp;
    int rc = head_params_from_config(run, &hp);
    if (rc < 0)
        return rc;
    hp.clamp_loss = 1;
    /* On cuda the head runs on the GPU (pfc_cuda): the host pfc only samples, without the CPU head's
     * workspace. */
    if ((rc = pfc_init_flags(&t->head, &hp, &t->coll, run->num_classes, run->sample_rate, (uint64_t)run->seed,
                             run->batch_size, run->embedding_size, t->wd.di.cuda ? PFC_NO_HOST_HEAD : 0)) < 0)
        return rc;
    t->have_head = 1;
    if ((rc = wdev_head_create(&t->wd, &t->head, run->provider)) < 0)
        return rc;
    if (!(t->labels = malloc((size_t)run->batch_size * sizeof(int64_t))))
        return pf_err(-ENOMEM, "out of memory for head buffers (batch %d x %d)", run->batch_size,
                      run->embedding_size);
    log_info(
        "head: %s margin (%.3g, %.3g, %.3g) scale %.3g, %s gradient, %s mode, sample_rate %.3g: up to %lld "
        "of %lld classes per worker per step",
        run->margin_list[1] > 0 ? "arcface" : "combined", run->margin_list[0], run->margin_list[1],
        run->margin_list[2], run->scale, run->margin_grad, run->head_mode, run->sample_rate,
        (long long)t->head.k_max, (long long)run->num_classes);
    return 0;
}

/* The folder of the dataset: the folder of its pack prefix (rec_resolve_prefix), "." for a bare name. */
static void rec_folder(const char *rec, char *out, size_t cap)
{
    char base[4096];
    if (rec_resolve_prefix(rec, base, sizeof base) < 0)
        snprintf(base, sizeof base, ".");
    const char *slash = strrchr(base, '/');
    snprintf(out, cap, "%.*s", slash ? (int)(slash - base) : 1, slash ? base : ".");
}

/* One val_targets entry as a file: a path (with a '/' or an existing file) as given, else arcface_torch's
 * `<rec folder>/<name>.bin`; a name whose file is not there is skipped with a warning, as arcface_torch's
 * CallBackVerification does (returns 1). A pairs text file (not a .bin pickle) finds its images in its own
 * folder. */
static int open_val_target(trainer *t, const char *entry, eval_set *set)
{
    char path[1100], images[1100];
    struct stat st;
    if (strchr(entry, '/') || stat(entry, &st) == 0) {
        snprintf(path, sizeof path, "%s", entry);
    } else {
        char dir[1024];
        rec_folder(t->run.rec, dir, sizeof dir);
        size_t n = strlen(entry);
        snprintf(path, sizeof path, "%s/%s%s", dir, entry,
                 n > 4 && !strcmp(entry + n - 4, ".bin") ? "" : ".bin");
        if (stat(path, &st) != 0) {
            log_warn("val_targets: %s not found (%s): skipped, as arcface_torch does", entry, path);
            return 1;
        }
    }
    const char *slash = strrchr(path, '/');
    snprintf(images, sizeof images, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    int rc = eval_set_open(set, path, images);
    return rc < 0 ? pf_err_wrap(rc, "config key 'val_targets': '%s' (%s)", entry, path) : 0;
}

/* Rank 0: the verification sets of config key val_targets (comma-separated), opened before step 0 so that a
 * missing or unreadable set stops the run at start, not at the first verification. */
static int setup_val(trainer *t)
{
    if (t->rank != 0 || !t->run.val_targets[0])
        return 0;
    char list[CFG_STR];
    snprintf(list, sizeof list, "%s", t->run.val_targets);
    char *save = NULL;
    for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ' || *tok == '\t')
            tok++;
        char *end = tok + strlen(tok);
        while (end > tok && (end[-1] == ' ' || end[-1] == '\t'))
            *--end = '\0';
        if (!*tok)
            continue;
        if (t->n_val == MAX_VAL_TARGETS)
            return pf_err(-EINVAL, "config key 'val_targets': more than %d sets", MAX_VAL_TARGETS);
        int rc = open_val_target(t, tok, &t->val[t->n_val]);
        if (rc < 0)
            return rc;
        if (rc == 1)
            continue;
        log_info("verification set %s: %lld pairs, scored every %d steps (verbose) and at the end",
                 t->val[t->n_val].name, (long long)t->val[t->n_val].n_pairs, t->run.verbose);
        t->n_val++;
    }
    return 0;
}

/* Set-up 6: rank 0's output folder, training.log and TensorBoard events (<output>/tensorboard; a folder that
 * cannot be written only warns, as training.log); the trace file; the verification sets. */
static int setup_outputs(trainer *t)
{
    if (t->rank == 0) {
        int rc = mkdir_p(t->run.output);
        if (rc < 0)
            return rc;
        char path[1100];
        snprintf(path, sizeof path, "%s/training.log", t->run.output);
        if (log_open_file(path) < 0)
            log_warn("cannot write %s", path);
        snprintf(path, sizeof path, "%s/tensorboard", t->run.output);
        if (tb_open(&t->tb, path) < 0)
            log_warn("no TensorBoard events: %s", pf_errmsg());
        else
            log_info("TensorBoard events: %s (tensorboard --logdir %s)", tb_path(t->tb), path);
    }
    if (t->opts.trace_path) {
        t->trace = fopen(t->opts.trace_path, t->start_step > 0 ? "a" : "w");
        if (!t->trace)
            return pf_err(-errno, "cannot write trace file '%s'", t->opts.trace_path);
    }
    return setup_val(t);
}

/* The optimizer state arrays (device pointers) and their number. */
static int opt_arrays(trainer *t, float **a)
{
    if (t->mom) {
        a[0] = t->mom;
        return 1;
    }
    a[0] = t->adam_m;
    a[1] = t->adam_v;
    return 2;
}

/* Set-up 7 (a resumed run): loads this worker's checkpoint state of step book->resume_step (backbone, BN
 * statistics, optimizer state, loss scaler, dropout generator; worker/resume.h) over what set-up made. */
static int setup_resume(trainer *t, const ctl_book *book)
{
    ckpt_root(&t->run, t->ckpt_root, sizeof t->ckpt_root);
    if (book->resume_step <= 0)
        return 0;
    const int64_t T = book->resume_step;
    float *dev[2], *host[2] = {NULL, NULL};
    int na = opt_arrays(t, dev), rc = 0;
    for (int a = 0; a < na && rc == 0; a++)
        if (!(host[a] = malloc(sizeof(float) * (t->nparams ? t->nparams : 1))))
            rc = pf_err(-ENOMEM, "out of memory loading the optimizer state");
    if (rc == 0)
        rc = wresume_load(t->ckpt_root, T, t->rank, t->W, t->m, &t->resumed, host, na, t->nparams);
    for (int a = 0; a < na && rc == 0; a++)
        rc = t->wd.dev->mem_h2d(t->wd.ctx, dev[a], host[a], sizeof(float) * t->nparams);
    free(host[0]);
    free(host[1]);
    int64_t step = 0, opt = 0, rng = 0, growth = 0;
    double scale = 0;
    if (rc == 0 && (rc = wresume_get_i64(&t->resumed, "step", &step)) == 0 && step != T)
        rc = pf_err(-EINVAL, "checkpoint step %lld: the worker state says step %lld", (long long)T,
                    (long long)step);
    if (rc == 0)
        rc = wresume_get_i64(&t->resumed, "opt_steps", &opt);
    if (rc == 0)
        rc = wresume_get_i64(&t->resumed, "dropout_rng", &rng);
    if (rc == 0 && t->loss_scaling && (rc = wresume_get_f64(&t->resumed, "amp.scale", &scale)) == 0 &&
        (rc = wresume_get_i64(&t->resumed, "amp.growth_tracker", &growth)) == 0) {
        t->scaler.scale = (float)scale;
        t->scaler.growth_tracker = (int)growth;
    }
    if (rc < 0)
        return pf_err_wrap(rc, "resume from checkpoint step %lld", (long long)T);
    t->opt_steps = opt;
    model_set_rng_state(t->m, (uint64_t)rng);
    for (int i = 0; i < t->n_val; i++) {
        char name[24];
        snprintf(name, sizeof name, "val_highest.%d", i);
        wresume_get_f64(&t->resumed, name, &t->val_highest[i]);
    }
    t->start_step = T;
    log_info("resuming at checkpoint step %lld (%s): epoch %lld, batch %lld of %lld", (long long)T,
             book->resume_reason, (long long)(T / t->steps_per_epoch), (long long)(T % t->steps_per_epoch),
             (long long)t->steps_per_epoch);
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
    if ((rc = setup_servers(t, book)) < 0 || (rc = setup_ring(t, book)) < 0 || (rc = setup_data(t)) < 0 ||
        (rc = setup_backbone(t, book)) < 0 || (rc = setup_head(t)) < 0 || (rc = setup_resume(t, book)) < 0)
        return rc;
    return setup_outputs(t);
}

/* Backbone optimizer step on every trainable tensor (fixed ones, the features BN weight, are skipped, as
 * arcface_torch leaves them out: requires_grad = False), on the device. */
static int optimizer_step(trainer *t, float lr, int64_t step1)
{
    float *w = model_params(t->m), *g = model_grads(t->m);
    for (int i = 0; i < model_num_tensors(t->m); i++) {
        const model_tensor *T = model_tensor_at(t->m, i);
        if (T->flags & MODEL_TENSOR_FIXED)
            continue;
        int rc;
        if (t->mom)
            rc = t->wd.dev->sgd_step(t->wd.ctx, w + T->offset, g + T->offset, t->mom + T->offset, T->count,
                                     lr, (float)t->run.momentum, (float)t->run.weight_decay);
        else
            rc = t->wd.dev->adamw_step(t->wd.ctx, w + T->offset, g + T->offset, t->adam_m + T->offset,
                                       t->adam_v + T->offset, T->count, lr, 0.9, 0.999, 1e-8,
                                       t->run.weight_decay, step1);
        if (rc < 0)
            return pf_err_wrap(rc, "optimizer step on %s", T->name);
    }
    return 0;
}

/* Zeroes the gradients of fixed tensors so that they take no part in clipping. */
static int zero_fixed_grads(trainer *t)
{
    float *g = model_grads(t->m);
    for (int i = 0; i < model_num_tensors(t->m); i++) {
        const model_tensor *T = model_tensor_at(t->m, i);
        if (T->flags & MODEL_TENSOR_FIXED) {
            int rc = t->wd.dev->mem_zero(t->wd.ctx, g + T->offset, T->count * sizeof(float));
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

/* Backward, after the head wrote the embedding gradient d_grad_emb (device, B x D): scale it by W
 * (arcface_torch: the AllGather backward multiplies by W and DDP averages the backbone gradients over W, so
 * the mean of the W scaled gradients is the gradient of the global mean loss) and by the loss scale (fp16);
 * backward; allreduce; mean and unscale in one pass (the loss scale is a power of two, so g * (1/W) *
 * (1/scale) in one multiply is exact as two); fixed gradients zeroed; the sum of squares is the loss
 * scaler's found-inf check and clip_grad_norm_(5)'s norm (optim_clip_grad_norm's math); optimizer step
 * unless the scaler says skip (rank 0 logs the skip for global step step + 1). */
static int backbone_step(trainer *t, float lr, int64_t step)
{
    const ops_device *dev = t->wd.dev;
    ops_ctx *ctx = t->wd.ctx;
    float scale = t->loss_scaling ? t->scaler.scale : 1.0f;
    float gs = (float)t->W * scale;
    int rc = gs != 1.0f ? dev->scale(ctx, t->wd.d_grad_emb, t->wd.bd, gs) : 0;
    if (rc == 0)
        rc = model_backward(t->m, t->wd.d_grad_emb, NULL);
    if (rc == 0)
        rc = wdev_allreduce(&t->wd, model_grads(t->m));
    float *g = model_grads(t->m);
    float inv = 1.f / (float)t->W;
    if (t->loss_scaling)
        inv *= (float)(1.0 / (double)scale);
    if (rc == 0 && inv != 1.0f)
        rc = dev->scale(ctx, g, t->nparams, inv);
    if (rc == 0)
        rc = zero_fixed_grads(t);
    double ss = 0;
    if (rc == 0)
        rc = dev->sumsq(ctx, g, t->nparams, &ss);
    if (rc < 0)
        return rc;
    if (t->loss_scaling && !loss_scaler_update(&t->scaler, !isfinite(ss))) {
        if (t->rank == 0)
            log_info(
                "global step %lld: backbone gradients overflowed at loss scale %g: optimizer step skipped, "
                "scale now %g",
                (long long)step + 1, (double)scale, (double)t->scaler.scale);
        return 0;
    }
    /* torch.nn.utils.clip_grad_norm_(params, 5): coef = 5 / (norm + 1e-6), applied when below 1. */
    double total = sqrt(ss);
    if (isfinite(total)) {
        double coef = 5.0 / (total + 1e-6);
        if (coef < 1.0 && (rc = dev->scale(ctx, g, t->nparams, (float)coef)) < 0)
            return rc;
    }
    t->opt_steps++;
    return optimizer_step(t, lr, t->opt_steps);
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
    int wrc = r ? ps_wait(t->ps, r, t->wait_s) : 0;
    return rc < 0 ? rc : wrc;
}

/* One training step (DESIGN.md §3) on the batch whose labels are in t->labels, at global step `step`
 * (0-based) with learning rate lr: sample the class centers, pull them while the backbone runs forward, the
 * margin-softmax head over every worker's sampled columns, push the row gradients (the servers apply them
 * during our backward), backbone backward and optimizer step, wait for the push (read-your-writes before the
 * next pull). push_flags: PS_PUSH_SNAPSHOT on a checkpoint step. *loss = the global mean loss. Returns 0 or
 * the first failing component's negative code. */
static int train_step(trainer *t, int64_t step, double lr, uint32_t push_flags, double *loss)
{
    const int64_t *ids = NULL;
    int64_t k = 0;
    ps_req *pull = NULL, *push = NULL;
    loader_batch *b = NULL;
    const float *emb = NULL;
    int rc = pfc_sample(&t->head, step, t->labels, &ids, &k);
    if (rc == 0)
        rc = ps_pull(t->ps, ids, (size_t)k, t->wd.centers, step, &pull);
    if (rc == 0)
        rc = next_batch(t, &b);
    if (rc == 0) {
        model_zero_grad(t->m);
        rc = model_forward(t->m, b->images, t->run.batch_size, 1, &emb);
    }
    rc = wait_req(t, pull, rc);
    if (rc == 0)
        rc = wdev_head_step(&t->wd, &t->head, emb, k, loss);
    if (rc == 0)
        rc = ps_push_ex(t->ps, ids, (size_t)k, t->wd.grad_centers, (float)lr, step, push_flags, &push);
    if (rc == 0)
        rc = backbone_step(t, (float)lr, step);
    if (b)
        loader_release(t->ld, b);
    return wait_req(t, push, rc);
}

/* The backbone checkpoint; with loss scaling, the scaler's state goes with it (arcface_torch saves the
 * GradScaler with the checkpoint) as extras "amp.scale" and "amp.growth_tracker". */
static int save_backbone(trainer *t, const char *path)
{
    if (!t->loss_scaling)
        return model_save(t->m, path);
    model_extra x[2];
    memset(x, 0, sizeof x);
    memcpy(x[0].name, "amp.scale", sizeof "amp.scale");
    x[0].value = (double)t->scaler.scale;
    memcpy(x[1].name, "amp.growth_tracker", sizeof "amp.growth_tracker");
    x[1].value = (double)t->scaler.growth_tracker;
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
        rc = ps_pull(t->ps, ids, (size_t)n, rows, step, &req);
        if (rc == 0)
            rc = ps_wait(t->ps, req, t->wait_s);
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
    int rc = mkdir_p(dir);
    if (rc == 0)
        rc = dump_partition(t, prefix, step);
    if (rc < 0)
        return pf_err_wrap(rc, "save_centers");
    int64_t rows = t->run.num_classes > t->rank ? (t->run.num_classes - t->rank + t->W - 1) / t->W : 0;
    log_info("class centers: %lld rows of this worker's partition written to %s.rank%d in %.1f s",
             (long long)rows, prefix, t->rank, pf_now_s() - t0);
    return 0;
}

/* Is `step` (steps completed) a checkpoint step? Every snapshot_every steps and the last one (`total`). */
static int is_ckpt_step(const trainer *t, int64_t step, int64_t total)
{
    return t->run.snapshot_every > 0 && (step % t->run.snapshot_every == 0 || step == total);
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
} progress;

/* This worker's part of checkpoint `step` (worker/resume.h); the servers write theirs when they apply the
 * flagged push. A failure (disk full, ...) is logged and training goes on: earlier checkpoints stay intact
 * and a resume uses the newest complete one. */
static void save_checkpoint(trainer *t, const progress *p, int64_t step)
{
    double t0 = pf_now_s();
    char dir[4200];
    ckpt_step_dir(t->ckpt_root, step, dir, sizeof dir);
    wresume_state st = {0};
    wresume_set_i64(&st, "step", step);
    wresume_set_i64(&st, "opt_steps", t->opt_steps);
    wresume_set_i64(&st, "dropout_rng", (int64_t)model_rng_state(t->m));
    wresume_set_f64(&st, "first_loss", p->first_loss);
    wresume_set_f64(&st, "log.loss_sum", p->loss_sum);
    wresume_set_i64(&st, "log.loss_n", p->loss_n);
    if (t->loss_scaling) {
        wresume_set_f64(&st, "amp.scale", (double)t->scaler.scale);
        wresume_set_i64(&st, "amp.growth_tracker", t->scaler.growth_tracker);
    }
    for (int i = 0; i < t->n_val; i++) {
        char name[24];
        snprintf(name, sizeof name, "val_highest.%d", i);
        wresume_set_f64(&st, name, t->val_highest[i]);
    }
    float *dev[2], *host[2] = {NULL, NULL};
    int na = opt_arrays(t, dev);
    int rc = mkdir_p(dir);
    for (int a = 0; a < na && rc == 0; a++) {
        if (!(host[a] = malloc(sizeof(float) * (t->nparams ? t->nparams : 1))))
            rc = pf_err(-ENOMEM, "out of memory");
        else
            rc = t->wd.dev->mem_d2h(t->wd.ctx, host[a], dev[a], sizeof(float) * t->nparams);
    }
    model_extra x[2];
    memset(x, 0, sizeof x);
    memcpy(x[0].name, "amp.scale", sizeof "amp.scale");
    x[0].value = (double)t->scaler.scale;
    memcpy(x[1].name, "amp.growth_tracker", sizeof "amp.growth_tracker");
    x[1].value = (double)t->scaler.growth_tracker;
    if (rc == 0)
        rc = wresume_save(t->ckpt_root, step, t->rank, t->W, t->m, x, t->loss_scaling ? 2 : 0, &st,
                          (const float *const *)host, na, t->nparams);
    free(host[0]);
    free(host[1]);
    if (rc < 0) {
        log_error("checkpoint step %lld: this worker's state not written: %s (training goes on; earlier "
                  "checkpoints are intact)",
                  (long long)step, pf_errmsg());
        return;
    }
    log_info("checkpoint step %lld: worker state written to %s in %.2f s", (long long)step, dir,
             pf_now_s() - t0);
    wresume_prune(t->ckpt_root, t->rank, t->run.snapshot_keep, step);
}

/* Every rank agrees on stopping (a signal reaches the ranks at different times): allreduce (max) of the
 * stop flag. *stop = 1 when any rank asked. */
static int stop_vote(trainer *t, int *stop)
{
    float f = t->opts.stop_flag && *t->opts.stop_flag ? 1.f : 0.f;
    int rc = coll_allreduce(&t->coll, &f, 1, COLL_F32, COLL_MAX);
    *stop = rc == 0 && f > 0;
    return rc;
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
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double wall = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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

/* The trace line of global step `step`, and on rank 0 arcface_torch's log line every `frequent` steps and at
 * the last step (`total`): speed since the last line, mean loss since the last line, lr, epoch, step, the
 * loss scale with fp16, hours left. */
static void log_step(trainer *t, progress *p, int64_t step, int64_t total, int64_t epoch, double loss,
                     double lr)
{
    const pf_config *run = &t->run;
    if (t->trace)
        fprintf(t->trace, "%lld %.17g %.9g\n", (long long)step, loss, lr);
    if (t->rank != 0 || (step % run->frequent != 0 && step != total))
        return;
    double now = pf_now_s();
    double speed = (double)(step - p->step_log) * run->batch_size * t->W / (now - p->t_log);
    double per_step = (now - p->t_start) / (double)step;
    double hours = per_step * (double)(total - step) / 3600.0;
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
    if (t->rank == 0 && t->opts.max_steps > 0) {
        if ((rc = mkdir_p(run->output)) < 0 || (rc = save_model(t)) < 0)
            return rc;
        log_info("backbone saved to %s/model.ckpt after %lld steps", run->output, (long long)step);
    }
    /* Training time: verification excluded (as from the Speed lines). */
    double el = pf_now_s() - p->t_start - p->val_s, vel;
    if (t->n_val && step > 0 && step % run->verbose != 0 && (rc = verify_sets(t, step, &vel)) < 0)
        return rc;
    if (t->opts.dump_centers && (rc = dump_partition(t, t->opts.dump_centers, step)) < 0)
        return rc;
    if (run->save_centers && (rc = save_centers(t, step)) < 0)
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
        log_info(
            "training %s: %lld of %lld steps (all before the checkpoint it resumed from; none trained now), "
            "outputs in %s",
            stopped ? "stopped on request" : "done", (long long)step, (long long)total, run->output);
    else
        log_info("training %s: %lld of %lld steps%s, first loss %.4f, final loss %.4f, %.2f samples/sec over "
                 "%.1f s, outputs in %s",
                 stopped ? "stopped on request" : "done", (long long)step, (long long)total,
                 t->start_step > 0 ? " (resumed at a checkpoint: speed over this process' steps)" : "",
                 p->first_loss, p->last_loss, el > 0 ? (double)here * run->batch_size * t->W / el : 0.0, el,
                 run->output);
    return 0;
}

int train_run(trainer *t)
{
    const pf_config *run = &t->run;
    const int64_t total = t->opts.max_steps > 0 ? t->opts.max_steps : t->steps_per_epoch * run->num_epoch;
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
        if (step >= total)
            log_info("checkpoint step %lld is the last step: nothing left to train", (long long)step);
    }

    for (int64_t epoch = step / t->steps_per_epoch;
         rc == 0 && !stop && step < total && epoch < run->num_epoch; epoch++) {
        int64_t first = epoch == step / t->steps_per_epoch ? step % t->steps_per_epoch : 0;
        if ((rc = loader_start_epoch_at(t->ld, epoch, first)) < 0)
            break;
        while (step < total) {
            if ((rc = stop_vote(t, &stop)) < 0)
                break;
            if (stop) {
                log_info("stop requested: finishing after %lld steps", (long long)step);
                break;
            }
            int have = loader_peek_labels(t->ld, t->labels);
            if (have <= 0) {
                rc = have;
                break;
            }
            const double lr = lr_poly(run->lr, step, t->warmup_steps, t->total_steps);
            double loss = 0;
            uint32_t flags = is_ckpt_step(t, step + 1, total) ? PS_PUSH_SNAPSHOT : 0;
            if ((rc = train_step(t, step, lr, flags, &loss)) < 0)
                break;
            step++;
            if ((rc = check_loss(&p, loss, step, epoch)) < 0)
                break;
            log_step(t, &p, step, total, epoch, loss, lr);
            if (t->n_val && step % run->verbose == 0) {
                double el = 0;
                if ((rc = verify_sets(t, step, &el)) < 0)
                    break;
                p.t_log += el;
                p.val_s += el;
            }
            if (flags)
                save_checkpoint(t, &p, step);
        }
        if (rc == 0 && !stop && t->rank == 0 && t->opts.max_steps == 0) {
            if ((rc = save_model(t)) < 0)
                break;
            log_info("epoch %lld done: backbone saved to %s/model.ckpt", (long long)epoch, run->output);
        }
    }
    if (rc < 0) {
        if (t->trace)
            fflush(t->trace);
        return rc;
    }
    return finish(t, &p, step, total, stop);
}

void train_close(trainer *t)
{
    if (!t)
        return;
    if (t->trace)
        fclose(t->trace);
    if (t->tb && tb_close(t->tb) < 0)
        log_warn("TensorBoard events: %s", pf_errmsg());
    for (int i = 0; i < t->n_val; i++)
        eval_set_free(&t->val[i]);
    if (t->have_head)
        pfc_free(&t->head);
    if (t->m) {
        ops_ctx *ctx = model_ctx(t->m);
        const ops_device *dev = t->wd.dev;
        if (dev) {
            if (t->mom)
                dev->mem_free(ctx, t->mom);
            if (t->adam_m)
                dev->mem_free(ctx, t->adam_m);
            if (t->adam_v)
                dev->mem_free(ctx, t->adam_v);
        }
    }
    wdev_close(&t->wd);
    model_free(t->m);
    loader_close(t->ld);
    if (t->have_coll)
        coll_destroy(&t->coll);
    fab_close(t->coll_fab);
    ps_client_destroy(t->ps);
    free(t->labels);
    free(t);
}
