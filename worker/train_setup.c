/* The worker's set-up (see train.h): everything train_run needs, made from the run config and the address
 * book, one function per part in the order train_setup calls them: the servers and the ring (train_net.h),
 * data, backbone (with the optimizer state and the loss scaler), head, checkpoint state of a resumed run,
 * outputs; and train_close, which releases them. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "common/ckpt.h"
#include "common/checked.h"
#include "common/err.h"
#include "common/file.h"
#include "common/log.h"
#include "common/torch_ckpt.h"
#include "common/torch_pt.h"
#include "kernels/ops.h"
#include "worker/data/rec.h"
#include "worker/lr_schedule.h"
#include "worker/model/safetensors.h"
#include "worker/train_state.h"

/* arcface_torch's GradScaler: torch.cuda.amp.GradScaler(growth_interval=100), init scale 2^16. */
#define AMP_INIT_SCALE      65536.0f
#define AMP_GROWTH_INTERVAL 100

/* mkdir -p (train_state.h). */
int train_mkdir_p(const char *path)
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
    rejoin_init(&t->rj);
    int rc = train_net_open(&t->net, local, rank);
    /* The device may add a third part to the address (worker 0 of a cuda run: the NCCL unique id). */
    int has_id = 0;
    if (rc == 0 && (rc = wdev_make_id(local->device, rank, t->dev_id)) == 1) {
        has_id = 1;
        rc = 0;
    }
    if (rc == 0)
        rc = train_net_address(&t->net, has_id ? t->dev_id : NULL, WDEV_ID_BYTES, addr, addr_len);
    if (rc < 0) {
        train_close(t);
        return rc;
    }
    *out = t;
    return 0;
}

/* Set-up 2: the data loader (labels must be below num_classes: the loader checks every record at open) and
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
    lr_scheduler_kind kind;
    if ((rc = lr_scheduler_parse(run->lr_scheduler, &kind)) < 0)
        return rc;
    lr_schedule_init(&t->sched, kind, run->lr, t->warmup_steps, t->total_steps);
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
    if (!strcmp(t->run.optimizer, "adamw")) { /* the class centers train with AdamW on the servers */
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
    t->skip_centers = strcmp(t->run.fp16_overflow_skip, "backbone") != 0;
    log_info("dynamic loss scaling: init scale %g, growth interval %d, growth %g, backoff %g; an overflow skips "
             "%s",
             (double)t->scaler.scale, t->scaler.growth_interval, (double)t->scaler.growth_factor,
             (double)t->scaler.backoff_factor,
             t->skip_centers ? "the whole step (class centers too)" : "the backbone's step (centers pushed)");
    return 0;
}


/* The backbone file this worker loads for config key `pretrained`: when it names arcface_torch's
 * checkpoint_gpu_<k>.pt and the same folder holds checkpoint_gpu_<rank>.pt, that one (the parameters are the same
 * in every rank's file, the BatchNorm running statistics are each rank's own, as arcface_torch resumes them);
 * otherwise the file named. Points into t->pretrained_path or t->run. */
static const char *pretrained_file(trainer *t)
{
    const char *named = t->run.pretrained, *slash = strrchr(named, '/');
    if (tpc_rank_of(slash ? slash + 1 : named) < 0)
        return named;
    int dir = slash ? (int)(slash - named + 1) : 0;
    snprintf(t->pretrained_path, sizeof t->pretrained_path, "%.*scheckpoint_gpu_%d.pt", dir, named, t->rank);
    struct stat st;
    return stat(t->pretrained_path, &st) == 0 && S_ISREG(st.st_mode) ? t->pretrained_path : named;
}
/* Set-up 3: the backbone on the configured device, its collective, the same initial parameters on every
 * worker, the optimizer state and the loss scaler. */
/* OpenMP threads of this worker's CPU kernels (oneDNN, the CPU ops and head), set on this thread, which runs
 * them. OMP_NUM_THREADS set: it rules. Unset: the cores this process may use (omp_get_num_procs, which obeys
 * its CPU affinity) split evenly between the run's workers on this host (train_net_workers_on_host), at least
 * one each, as torchrun's default of one thread per process avoids oversubscription: OpenMP's default of a
 * thread per core in every worker makes workers that share a host take the cores from each other (libgomp's
 * threads spin while they wait), 2.5x slower per step on 2 cores, 5.8x with idle threads sleeping on the
 * completion queue (bench/RESULTS.md, "Idle progress sleeps on the completion queue"). */
static void setup_threads(trainer *t, const ctl_book *book)
{
#ifdef _OPENMP
    const char *env = getenv("OMP_NUM_THREADS");
    int cores = omp_get_num_procs(), here = train_net_workers_on_host(&t->net, book, t->rank);
    if (env && *env) {
        int n = omp_get_max_threads();
        log_info("OpenMP: %d thread%s (OMP_NUM_THREADS=%s)", n, n == 1 ? "" : "s", env);
        if (here >= 1 && (long)n * here > cores)
            log_warn("OMP_NUM_THREADS=%s with %d workers on this host of %d cores: %d OpenMP threads for %d "
                     "cores; workers whose waiting OpenMP threads spin take the cores from each other (steps "
                     "several times slower): give each worker its share (%d), or unset OMP_NUM_THREADS to "
                     "have it chosen",
                     env, here, cores, n * here, cores, cores / here > 1 ? cores / here : 1);
        return;
    }
    if (here < 1) {
        log_info("OpenMP: %d threads (OMP_NUM_THREADS unset; the workers sharing this host are not known for "
                 "provider %s: set OMP_NUM_THREADS to cores / workers on the host)",
                 omp_get_max_threads(), t->local.provider);
        return;
    }
    int n = cores / here > 1 ? cores / here : 1;
    omp_set_num_threads(n);
    log_info("OpenMP: %d thread%s (OMP_NUM_THREADS unset: %d cores / %d worker%s on this host)", n,
             n == 1 ? "" : "s", cores, here, here == 1 ? "" : "s");
#else
    (void)t;
    (void)book;
#endif
}

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
    setup_threads(t, book);
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
        const char *file = pretrained_file(t);
        if ((rc = model_load_pretrained(t->m, file)) < 0)
            return pf_err_wrap(rc, "config key 'pretrained' = %s", file);
        log_info("backbone initialised from %s (pretrained)", file);
    }
    t->nparams = model_num_params(t->m);
    if ((rc = wdev_backbone(&t->wd, dev, model_ctx(t->m), t->nparams, &t->net.coll, book)) < 0)
        return rc;
    /* Same seed on every rank, then rank 0's parameters broadcast (identical by construction; the broadcast
     * makes it so whatever the initialiser does). */
    if (!book->rejoin_epoch && (rc = wdev_bcast(&t->wd, model_params(t->m))) < 0)
        return pf_err_wrap(rc, "broadcasting the initial parameters");
    /* A replacement (book.rejoin_epoch) loads a live worker's parameters instead: the others do not broadcast. */
    t->grad_fp16 = strcmp(run->backbone_grad_comm, "fp32") != 0;
    log_info("device %s, precision %s; backbone collectives: %s; gradients summed in %s", di.name, di.precision,
             t->wd.backend,
             t->grad_fp16 ? "fp16 (backbone_grad_comm = fp16: DDP's fp16_compress_hook, as arcface_torch)"
                          : "fp32 (backbone_grad_comm = fp32)");
    log_info("backbone %s: %zu parameters (%.1f MB), embedding_size %d, batch %d", run->network, t->nparams,
             t->nparams * 4.0 / 1e6, run->embedding_size, run->batch_size);
    if ((rc = setup_optimizer(t)) < 0)
        return rc;
    return di.loss_scaling ? setup_loss_scaler(t) : 0;
}

/* gradient_acc > 1 (arcface_torch's gradient accumulation): the window's class-center gradients, summed per
 * class on the host (acc_k x k_max rows at most, two buffers for the merge); checkpoints only at window ends. */
static int setup_accumulation(trainer *t)
{
    const pf_config *run = &t->run;
    t->acc_k = run->gradient_acc > 1 ? run->gradient_acc : 1;
    if (t->acc_k == 1)
        return 0;
    if (run->snapshot_every % t->acc_k != 0)
        return pf_err(-EINVAL,
                      "snapshot_every = %d is not a multiple of gradient_acc = %d: a checkpoint must fall at the "
                      "end of an accumulation window (its gradients are not in any file)",
                      run->snapshot_every, t->acc_k);
    int64_t D = run->embedding_size;
    uint64_t c = 0;
    if (pf_mul_u64((uint64_t)t->head.k_max, (uint64_t)t->acc_k, &c) < 0 || c > (uint64_t)(INT64_MAX / D / 8))
        return pf_err(-EINVAL, "gradient_acc = %d x %lld sampled rows overflows", t->acc_k,
                      (long long)t->head.k_max);
    int64_t cap = (int64_t)c;
    t->acc_cap = cap;
    t->acc_ids = malloc((size_t)cap * sizeof(int64_t));
    t->acc_ids2 = malloc((size_t)cap * sizeof(int64_t));
    t->acc_rows = malloc((size_t)(cap * D) * sizeof(float));
    t->acc_rows2 = malloc((size_t)(cap * D) * sizeof(float));
    if (!t->acc_ids || !t->acc_ids2 || !t->acc_rows || !t->acc_rows2)
        return pf_err(-ENOMEM, "out of memory for gradient_acc = %d: %lld class-center rows of %lld floats, twice",
                      t->acc_k, (long long)cap, (long long)D);
    if (t->rank == 0)
        log_info("gradient_acc = %d: an optimizer step every %d global steps on the sum of their gradients (the "
                 "class centers' summed on this worker, up to %lld rows, %.1f MB x 2); the lr, data and logs "
                 "count global steps",
                 t->acc_k, t->acc_k, (long long)cap, (double)cap * (double)D * 4.0 / 1e6);
    return 0;
}

/* Set-up 4: the Partial FC head: the sampler (on the host for every device) and the head on the device. */
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
    if ((rc = pfc_init_flags(&t->head, &hp, &t->net.coll, run->num_classes, run->sample_rate,
                             (uint64_t)run->seed, run->batch_size, run->embedding_size,
                             t->wd.di.cuda ? PFC_NO_HOST_HEAD : 0)) < 0)
        return rc;
    t->have_head = 1;
    if ((rc = wdev_head_create(&t->wd, &t->head, run->provider)) < 0)
        return rc;
    if (!(t->labels = malloc((size_t)run->batch_size * sizeof(int64_t))))
        return pf_err(-ENOMEM, "out of memory for head buffers (batch %d x %d)", run->batch_size,
                      run->embedding_size);
    if ((rc = setup_accumulation(t)) < 0)
        return rc;
    if (hp.m1 != run->margin_list[0] || hp.m2 != run->margin_list[1])
        log_warn("margin_list (%g, %g, %g): m3 > 0 is CosFace alone in arcface_torch's CombinedMarginLoss, so "
                 "m1 and m2 are unused (margin_combine = full combines them)",
                 run->margin_list[0], run->margin_list[1], run->margin_list[2]);
    const char *kind = hp.m3 > 0 ? (hp.m2 != 0 || hp.m1 != 1 ? "combined" : "cosface")
                                 : hp.m1 == 1 && hp.m2 > 0 ? "arcface" : "combined";
    log_info(
        "head: %s margin (%.3g, %.3g, %.3g) scale %.3g, %s gradient, %s mode, sample_rate %.3g: up to %lld "
        "of %lld classes per worker per step",
        kind, hp.m1, hp.m2, hp.m3, run->scale, run->margin_grad, run->head_mode, run->sample_rate,
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

/* Set-up 5: rank 0's output folder, training.log and TensorBoard events (<output>/tensorboard; a folder that
 * cannot be written only warns, as training.log); the trace file; the verification sets. */
static int setup_outputs(trainer *t)
{
    if (t->rank == 0) {
        int rc = train_mkdir_p(t->run.output);
        if (rc < 0)
            return rc;
        char path[1100];
        snprintf(path, sizeof path, "%s/training.log", t->run.output);
        log_format lf;
        if (log_parse_format(t->run.log_format, &lf) < 0)
            return pf_err(-EINVAL, "key 'log_format': '%s' is neither 'pfcps' nor 'arcface_torch'",
                          t->run.log_format);
        log_set_file_format(lf);
        if (log_open_file(path) < 0)
            log_warn("cannot write %s: %s", path, pf_errmsg());
        snprintf(path, sizeof path, "%s/tensorboard", t->run.output);
        if (tb_open(&t->tb, path) < 0)
            log_warn("no TensorBoard events: %s", pf_errmsg());
        else
            log_info("TensorBoard events: %s (tensorboard --logdir %s)", tb_path(t->tb), path);
    }
    if (t->opts.trace_path) {
        int rc = pf_fopen_output(t->opts.trace_path, t->start_step > 0, &t->trace);
        if (rc < 0)
            return pf_err_wrap(rc, "cannot write trace file '%s'", t->opts.trace_path);
        if (t->opts.trace_batch) {
            t->trace_keys = calloc((size_t)t->run.batch_size, sizeof *t->trace_keys);
            t->trace_flips = calloc((size_t)t->run.batch_size, 1);
            if (!t->trace_keys || !t->trace_flips)
                return pf_err(-ENOMEM, "out of memory");
        }
    }
    return setup_val(t);
}

/* The optimizer state arrays (train_state.h). */
int train_opt_arrays(trainer *t, float **a)
{
    if (t->mom) {
        a[0] = t->mom;
        return 1;
    }
    a[0] = t->adam_m;
    a[1] = t->adam_v;
    return 2;
}

/* Set-up 6 (a resumed run): loads this worker's checkpoint state of step book->resume_step (backbone, BN
 * statistics, optimizer state, loss scaler, dropout generator; worker/resume.h) over what set-up made. */
static int setup_resume(trainer *t, const ctl_book *book)
{
    ckpt_root(&t->run, t->ckpt_root, sizeof t->ckpt_root);
    /* The identity and key every file of this run's checkpoints carries. */
    const char *secret = t->opts.secret ? t->opts.secret : t->run.secret;
    int rc0 = ckpt_ident_of(&t->run, book->run_id, &t->ckpt_id);
    if (rc0 == 0 && secret && *secret) {
        rc0 = snapfile_key_derive(secret, &t->ckpt_key);
        t->ckpt_keyed = rc0 == 0;
    }
    if (rc0 < 0)
        return rc0;
    if (book->resume_step <= 0)
        return 0;
    const int64_t T = book->resume_step;
    float *dev[2], *host[2] = {NULL, NULL};
    int na = train_opt_arrays(t, dev), rc = 0;
    for (int a = 0; a < na && rc == 0; a++)
        if (!(host[a] = malloc(sizeof(float) * (t->nparams ? t->nparams : 1))))
            rc = pf_err(-ENOMEM, "out of memory loading the optimizer state");
    /* A replacement (docs/architecture.md, "Worker replacement in place") loads the donor's state of the redo
     * step, which the donor wrote to the root's replace/ folder. */
    char root[sizeof t->ckpt_root + 16];
    snprintf(root, sizeof root, "%s%s", t->ckpt_root, book->rejoin_epoch ? "/replace" : "");
    const int from = book->rejoin_epoch ? book->donor : t->rank;
    if (rc == 0)
        rc = wresume_load(root, T, from, t->W, t->ckpt_keyed ? &t->ckpt_key : NULL, &t->ckpt_id, t->m,
                          &t->resumed, host, na, t->nparams);
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
    t->replacing = book->rejoin_epoch != 0;
    log_info("resuming at checkpoint step %lld (%s): epoch %lld, batch %lld of %lld", (long long)T,
             book->resume_reason, (long long)(T / t->steps_per_epoch), (long long)(T % t->steps_per_epoch),
             (long long)t->steps_per_epoch);
    /* The donor's files served this replacement only (a later one gets a new write): they go now. */
    if (book->rejoin_epoch) {
        ckpt_prune(root, "worker", from, 0, NULL);
        rmdir(root); /* when empty */
    }
    return 0;
}

/* The backbone's SGD momentum from arcface_torch's checkpoint_gpu_<rank>.pt `path` into host (nparams floats,
 * the model's flat parameter layout): state_optimizer's group 0 lists the backbone's parameters in
 * state_dict_backbone order (its tensors minus the buffers); parameter j's momentum_buffer is
 * state/<params[j]>/momentum_buffer, absent for a parameter without a gradient (features.weight), which keeps
 * 0. Returns the number of tensors read, or -EINVAL naming the file and tensor (a count or shape that does not
 * match, a dtype other than F32, a non-finite value) or the reader's errors. */
static int read_momentum(trainer *t, const char *path, float *host)
{
    tp_file *f;
    int rc = tp_open(&f, path), n = 0, got = 0;
    if (rc < 0)
        return rc;
    tp_named *sd = NULL;
    const tp_value *params = tp_find(tp_root(f), "state_optimizer/param_groups/0/params");
    rc = tp_state_dict(tp_find(tp_root(f), "state_dict_backbone"), &sd, &n, path);
    if (rc == 0 && (!params || params->kind != TP_LIST))
        rc = pf_err(-EINVAL, "%s: state_optimizer/param_groups/0/params is not a list", path);
    const float *base = model_params(t->m);
    size_t j = 0;
    for (int i = 0; rc == 0 && i < n; i++) {
        size_t count = 0;
        const float *p = model_param(t->m, sd[i].name, &count);
        if (!p)
            continue; /* a buffer */
        if (j >= params->u.seq.n || params->u.seq.v[j]->kind != TP_INT) {
            rc = pf_err(-EINVAL, "%s: state_optimizer's group 0 lists fewer parameters than the backbone has",
                        path);
            break;
        }
        char key[96];
        snprintf(key, sizeof key, "state_optimizer/state/%lld/momentum_buffer",
                 (long long)params->u.seq.v[j++]->u.i);
        const tp_tensor *m = tp_tensor_of(tp_find(tp_root(f), key));
        if (!m)
            continue;
        float *dst = host + (p - base);
        if (m->dtype != TP_F32 || tp_tensor_numel(m) != (int64_t)count)
            rc = pf_err(-EINVAL, "%s: tensor '%s' (momentum of '%s') is %s with %lld elements, not F32 with %zu",
                        path, key, sd[i].name, tp_dtype_name(m->dtype), (long long)tp_tensor_numel(m), count);
        else if ((rc = tp_tensor_read(f, m, key, dst, count * sizeof(float))) == 0)
            for (size_t k = 0; k < count && rc == 0; k++)
                if (!isfinite(dst[k]))
                    rc = pf_err(-EINVAL, "%s: tensor '%s' element %zu is not finite", path, key, k);
        got += rc == 0;
    }
    if (rc == 0 && j != params->u.seq.n)
        rc = pf_err(-EINVAL, "%s: state_optimizer's group 0 lists %zu parameters, the backbone has %zu", path,
                    params->u.seq.n, j);
    free(sd);
    tp_close(f);
    return rc < 0 ? rc : got;
}

/* Set-up 7 (a new run from arcface_torch's checkpoint_gpu_<rank>.pt files): the run continues at the
 * global_step of the set named by pretrained_centers (the servers start their step clock there too), with the
 * lr schedule and the data position of that step; the backbone's SGD momentum comes from `pretrained` when
 * it is such a file (its parameters and BatchNorm statistics were loaded by setup_backbone). A resumed pfcps
 * checkpoint (book->resume_step > 0) takes precedence. */
static int setup_import(trainer *t, const ctl_book *book)
{
    const pf_config *run = &t->run;
    if (book->resume_step > 0)
        return 0;
    tpc_progress prog = {0};
    int rc = 0;
    if (run->pretrained_centers[0] && (rc = tpc_read_progress(run->pretrained_centers, &prog)) < 0)
        return pf_err_wrap(rc, "config key 'pretrained_centers' = %s", run->pretrained_centers);
    if (prog.present) {
        /* Global steps count from the start of arcface_torch's run (num_epoch's epochs, --max-steps): a set at
         * or past this run's last step leaves nothing to train, and the schedule has no lr for it. */
        const int64_t total = train_total_steps(t);
        if (prog.global_step >= total)
            return pf_err(-ERANGE,
                          "config key 'pretrained_centers' = %s: arcface_torch's run stopped at global_step %lld "
                          "(epoch %lld done), at or past this run's last global step %lld (%s): nothing is left "
                          "to train; raise num_epoch or --max-steps, which count global steps from the start "
                          "of arcface_torch's run",
                          run->pretrained_centers, (long long)prog.global_step, (long long)prog.epoch,
                          (long long)total, t->opts.max_steps > 0 ? "--max-steps" : "num_epoch x steps per epoch");
        t->start_step = prog.global_step;
        double lr = lr_schedule_at(&t->sched, prog.global_step);
        log_info("continuing arcface_torch's run of %s at global_step %lld (epoch %lld done): epoch %lld, "
                 "batch %lld of %lld, lr %.9g",
                 run->pretrained_centers, (long long)prog.global_step, (long long)prog.epoch,
                 (long long)(prog.global_step / t->steps_per_epoch),
                 (long long)(prog.global_step % t->steps_per_epoch), (long long)t->steps_per_epoch, lr);
        if (prog.global_step != prog.epoch * t->steps_per_epoch)
            log_warn("arcface_torch stopped at global_step %lld after %lld epochs; %lld steps per epoch here "
                     "(another global batch?): the data position and schedule are this run's",
                     (long long)prog.global_step, (long long)prog.epoch, (long long)t->steps_per_epoch);
        if (prog.lr >= 0 && fabs(lr - prog.lr) > 1e-6 * fabs(prog.lr))
            log_warn("the lr schedule here gives %.9g at global_step %lld, arcface_torch's optimizer holds %.9g "
                     "(another schedule, global batch or lr?)",
                     lr, (long long)prog.global_step, prog.lr);
    }
    tpc_progress bb = {0};
    const char *file = run->pretrained[0] ? pretrained_file(t) : NULL;
    if (file && (rc = tpc_read_progress(file, &bb)) < 0)
        return pf_err_wrap(rc, "config key 'pretrained' = %s", file);
    /* The backbone and the class centers must come from the same step of the run. */
    if (prog.present && bb.present && bb.global_step != prog.global_step)
        return pf_err(-EINVAL,
                      "config keys 'pretrained' = %s (global_step %lld) and 'pretrained_centers' = %s (global_step "
                      "%lld): the backbone and the class centers are not from the same step",
                      file, (long long)bb.global_step, run->pretrained_centers, (long long)prog.global_step);
    if (prog.present && !bb.present && t->rank == 0)
        log_warn("continuing at global_step %lld with a backbone that is not from %s (pretrained = %s)",
                 (long long)prog.global_step, run->pretrained_centers, file ? file : "unset: initialised afresh");
    if (!bb.present)
        return 0;
    if (!prog.present && t->rank == 0)
        log_info("%s: global_step %lld not continued (pretrained_centers does not name its checkpoint_gpu set): "
                 "starting at step 0 with its backbone and SGD momentum",
                 file, (long long)bb.global_step);
    if (!t->mom) {
        log_warn("%s: the backbone's SGD momentum is not carried into optimizer %s", file,
                 run->optimizer);
        return 0;
    }
    float *host = calloc(t->nparams ? t->nparams : 1, sizeof(float));
    if (!host)
        return pf_err(-ENOMEM, "out of memory reading the backbone momentum");
    int got = read_momentum(t, file, host);
    rc = got < 0 ? got : t->wd.dev->mem_h2d(t->wd.ctx, t->mom, host, sizeof(float) * t->nparams);
    free(host);
    if (rc < 0)
        return pf_err_wrap(rc, "config key 'pretrained' = %s", file);
    log_info("backbone SGD momentum of %d tensors from %s", got, file);
    return 0;
}

/* Workers 1.. of a run that replaces lost workers: t->bn0, their copy of worker 0's BN running statistics
 * (train_state.h), filled by a broadcast from worker 0 at the start (every worker, after its resume), or for a
 * replacement from the state it loaded (the donor wrote worker 0's statistics there; the others do not
 * broadcast). Worker 0 joins the broadcast and keeps no copy. */
static int setup_rank0_buffers(trainer *t, const ctl_book *book)
{
    const size_t nb = model_num_buffer_floats(t->m);
    float *buf = model_buffers(t->m);
    int rc = 0;
    if (t->rank != 0) {
        if ((rc = t->wd.dev->mem_alloc(t->wd.ctx, (void **)&t->bn0, (nb ? nb : 1) * sizeof(float))) < 0)
            return pf_err_wrap(rc, "%zu bytes for worker 0's BN statistics", nb * sizeof(float));
        if (book->rejoin_epoch)
            rc = t->wd.dev->mem_d2d(t->wd.ctx, t->bn0, buf, nb * sizeof(float));
        buf = t->bn0;
    }
    if (rc == 0 && !book->rejoin_epoch && nb)
        rc = wdev_bcast_floats(&t->wd, buf, nb);
    return rc < 0 ? pf_err_wrap(rc, "worker 0's BN statistics (%zu floats)", nb) : 0;
}

/* Set-up 8 (opts.keep_generations): memory for the two generations of the state a step changes
 * (worker/generation.h), reading and writing the trainer's own fields; with them, in a run that replaces
 * lost workers, the copy of worker 0's BN statistics (setup_rank0_buffers). */
static int setup_generations(trainer *t, const ctl_book *book)
{
    if (!t->opts.keep_generations)
        return 0;
    /* With a control session, a run whose lost workers are replaced in place (common/config.h) takes the
     * rendezvous' notices for it (worker/replace.c). */
    t->wr_on = t->opts.sess && cfg_replaces_workers(&t->run, NULL, 0);
    int rc = t->wr_on && t->W > 1 ? setup_rank0_buffers(t, book) : 0;
    if (rc < 0)
        return rc;
    wgen_src src = {.m = t->m, .opt_steps = &t->opt_steps, .scaler = t->loss_scaling ? &t->scaler : NULL,
                    .acc_k = t->acc_k, .starts_only = 1, .bn0 = t->bn0};
    src.n_opt = train_opt_arrays(t, src.opt);
    if (t->acc_k > 1) {
        src.acc_ids = &t->acc_ids;
        src.acc_rows = &t->acc_rows;
        src.acc_n = &t->acc_n;
        src.acc_cap = t->acc_cap;
        src.row_floats = t->run.embedding_size;
    }
    rc = wgen_create(&t->gen, &src);
    if (rc < 0)
        return pf_err_wrap(rc, "keep_generations");
    char per[64] = "per step";
    if (t->acc_k > 1)
        snprintf(per, sizeof per, "per gradient_acc window (every %d steps)", t->acc_k);
    log_info("generations kept for in-place recovery: %.1f MB for two, %.1f MB copied %s",
             (double)wgen_alloc_bytes(t->gen) / 1e6, (double)wgen_keep_bytes(t->gen, 0) / 1e6, per);
    return 0;
}

int train_setup(trainer *t, const pf_config *run, const ctl_book *book, const train_opts *opts)
{
    int rc;
    if ((rc = train_net_check_run(&t->local, run)) < 0)
        return rc;
    t->run = *run;
    t->opts = *opts;
    t->W = run->workers;
    t->S = run->servers;
    /* A replacement of a lost worker talks to the servers at the epoch of its redo (older messages are
     * dropped there). */
    if (book->rejoin_epoch)
        ps_client_set_epoch(t->net.ps, book->rejoin_epoch);
    /* Set-up 1: the servers (connections opened before step 0) and the collectives ring. */
    if ((rc = train_net_connect(&t->net, run, book, t->rank,
                                t->opts.secret ? t->opts.secret : t->run.secret)) < 0 ||
        (rc = setup_data(t)) < 0 || (rc = setup_backbone(t, book)) < 0 || (rc = setup_head(t)) < 0 ||
        (rc = setup_resume(t, book)) < 0 || (rc = setup_import(t, book)) < 0 ||
        (rc = setup_generations(t, book)) < 0)
        return rc;
    return setup_outputs(t);
}

struct ps_client *train_ps_client(trainer *t)
{
    return t ? t->net.ps : NULL;
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
    wgen_free(t->gen);
    if (t->m) {
        ops_ctx *ctx = model_ctx(t->m);
        const ops_device *dev = t->wd.dev;
        if (dev) {
            if (t->bn0)
                dev->mem_free(ctx, t->bn0);
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
    train_net_close(&t->net);
    free(t->labels);
    free(t->acc_ids);
    free(t->acc_ids2);
    free(t->acc_rows);
    free(t->acc_rows2);
    free(t->trace_keys);
    free(t->trace_flips);
    free(t);
}
