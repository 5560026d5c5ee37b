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
#include "kernels/cuda/cuda_ops.h" /* cuda_loss_scaler: host code, in every build; CUDA helpers when built */
#include "kernels/ops.h"
#include "worker/data/loader.h"
#include "worker/head/optim.h"
#include "worker/head/pfc.h"
#include "worker/head/pfc_cuda.h" /* the GPU head, when the CUDA device is built */
#include "worker/model/model.h"
#include "worker/ps_client.h"

/* arcface_torch's GradScaler: torch.cuda.amp.GradScaler(growth_interval=100), init scale 2^16. */
#define AMP_INIT_SCALE 65536.0f
#define AMP_GROWTH_INTERVAL 100

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
    train_device_info di;
    const ops_device *dev;  /* the model's device: every backbone buffer below marked "device" is its memory */
    ops_ctx *ctx;           /* the model's device context */
    int direct;             /* device memory is plain host memory the loop may hand to host code ("cpu") */
    pf_coll nccl;           /* NCCL over device buffers (cuda) */
    int have_nccl;
    uint8_t nccl_id[CUDA_NCCL_ID_BYTES];
    int have_nccl_id;       /* worker 0 made it (train_open_endpoints) */
    float *h_stage;         /* (nparams) host: staging for the backbone broadcast / allreduce over the ring */
    float *mom;             /* device: SGD momentum (nparams) */
    float *adam_m, *adam_v; /* device: AdamW moments (nparams) */
    int64_t opt_steps;      /* optimizer steps applied (AdamW's count; steps skipped on overflow excluded) */
    size_t nparams;
    float *centers, *grad_centers; /* host (pinned on cuda): pulled rows (k_max, D), their gradients */
    int pinned;
    float *h_emb, *grad_emb; /* host (B, D): embeddings for the CPU head, its embedding gradient */
    float *d_grad_emb;       /* device (B, D): the embedding gradient model_backward reads */
    int loss_scaling;
    cuda_loss_scaler scaler;
#ifdef PFCPS_HAVE_CUDA_OPS
    pfc_cuda gh;            /* the GPU head (cuda): pfc_step's twin on device buffers */
#endif
    int gpu_head;
    float *d_centers, *d_grad_centers; /* device (k_max, D): rows uploaded for the GPU head, their gradients */
    void *side;             /* CUDA side stream for the row upload */
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

int train_device_resolve(const pf_config *cfg, train_device_info *out)
{
    memset(out, 0, sizeof *out);
    if (cfg->fp16 && cfg->bf16)
        return pf_err(-EINVAL, "keys 'fp16' and 'bf16' are both true: set one of them");
    const char *d = cfg->device;
    const char *name = NULL;
    if (!strcmp(d, "cuda")) {
        name = cfg->fp16 ? "cuda-fp16" : cfg->bf16 ? "cuda-bf16" : "cuda";
        out->cuda = 1;
        out->loss_scaling = cfg->fp16;
        snprintf(out->precision, sizeof out->precision, "%s",
                 cfg->fp16   ? "fp16 body (dynamic loss scaling), fp32 master weights, fc and features BN in fp32"
                 : cfg->bf16 ? "bf16 body, fp32 master weights, fc and features BN in fp32"
                             : "fp32");
    } else if (!strcmp(d, "cpu-bf16")) {
        name = "cpu-bf16";
        out->loss_scaling = cfg->fp16;
        snprintf(out->precision, sizeof out->precision, "bf16 body (CPU stand-in of a half device)%s, fp32 master "
                 "weights, fc and features BN in fp32", cfg->fp16 ? " with fp16's dynamic loss scaling" : "");
    } else if (!strcmp(d, "cpu") || !strcmp(d, "cpu-fenced")) {
        name = !strcmp(d, "cpu") ? "cpu" : "cpu-fenced";
        snprintf(out->precision, sizeof out->precision, "fp32");
        if (cfg->fp16 || cfg->bf16)
            snprintf(out->warning, sizeof out->warning,
                     "%s = true: the CPU device has no half-precision path; training in fp32 (device = cuda for "
                     "mixed precision; device = cpu-bf16 is the CPU stand-in of a half device, for tests)",
                     cfg->fp16 ? "fp16" : "bf16");
    } else {
        return pf_err(-EINVAL, "config key 'device': '%s' is not one of: cpu cuda cpu-fenced cpu-bf16", d);
    }
    size_t nl = strlen(name) < sizeof out->name ? strlen(name) : sizeof out->name - 1;
    memcpy(out->name, name, nl);
    out->name[nl] = '\0';
    if (out->cuda) {
#ifndef PFCPS_HAVE_CUDA_OPS
        return pf_err(-ENODEV, "config key 'device' = cuda: this pfcps-worker was built without the CUDA device "
                      "(nvcc, cuDNN or cuBLAS were not found at build time: rebuild with -Dcuda=enabled where the "
                      "CUDA toolkit is installed), or use device = cpu");
#else
        int n = cuda_device_count();
        if (n <= 0)
            return pf_err(-ENODEV, "config key 'device' = cuda: no CUDA GPU is visible on this machine "
                          "(cuda_device_count() = 0: no GPU, no NVIDIA driver, or CUDA_VISIBLE_DEVICES hides them); "
                          "use device = cpu");
#endif
    }
    if (!ops_device_by_name(out->name))
        return pf_err_wrap(-ENODEV, "config key 'device' = %s: device '%s' is not in this binary", d, out->name);
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
    /* Worker 0 of a CUDA run makes the NCCL unique id; it travels as a third part of its address. */
    int nparts = 2;
#ifdef PFCPS_HAVE_NCCL
    if (rc == 0 && rank == 0 && !strcmp(local->device, "cuda")) {
        if ((rc = coll_nccl_unique_id(t->nccl_id)) < 0)
            pf_err_wrap(rc, "making the NCCL unique id");
        t->have_nccl_id = rc == 0;
        nparts = 3;
    }
#endif
    if (rc == 0) {
        const void *parts[3] = {a0, a1, t->nccl_id};
        size_t lens[3] = {l0, l1, CUDA_NCCL_ID_BYTES};
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
        return pf_err(-EINVAL,
                      "this worker's config (servers %d, embedding_size %d, wire_dtype %s, provider %s) differs "
                      "from the run's (servers %d, embedding_size %d, wire_dtype %s, provider %s): give every "
                      "process the same config",
                      local->servers, local->embedding_size, local->wire_dtype, local->provider, run->servers,
                      run->embedding_size, run->wire_dtype, run->provider);
    return 0;
}

/* *p = zero-filled device memory of the model's device. */
static int dev_alloc(trainer *t, void **p, size_t bytes, const char *what)
{
    int rc = t->dev->mem_alloc(t->ctx, p, bytes);
    return rc < 0 ? pf_err_wrap(rc, "device %s: %zu bytes for %s", t->di.name, bytes, what) : 0;
}

static void dev_free(trainer *t, void *p)
{
    if (p && t->dev && t->ctx)
        t->dev->mem_free(t->ctx, p);
}

/* Host buffers for the pulled class-center rows and their gradients (k_max x D each): pinned on cuda (so the
 * copies to and from the GPU run at full speed and asynchronously), plain elsewhere. Says which path class-
 * center rows take on cuda (FI_HMEM straight to GPU memory is detected, not used yet: docs/architecture.md). */
static int rows_alloc(trainer *t, size_t kd)
{
    size_t bytes = (kd ? kd : 1) * sizeof(float);
#ifdef PFCPS_HAVE_CUDA_OPS
    if (t->di.cuda) {
        int rc = cuda_host_pinned_alloc((void **)&t->centers, bytes);
        if (rc == 0 && (rc = cuda_host_pinned_alloc((void **)&t->grad_centers, bytes)) < 0) {
            cuda_host_pinned_free(t->centers);
            t->centers = NULL;
        }
        if (rc < 0)
            return pf_err_wrap(rc, "pinned host buffers for %zu class-center floats", kd);
        t->pinned = 1;
        /* The rows could go straight to GPU memory where the provider offers FI_HMEM for CUDA; ps_client
         * does not register device buffers (yet), so staging is what runs either way: say which. */
        int h = fab_hmem_cuda_supported(t->run.provider);
        const char *staging = "class-center rows: pinned host staging (pulled into pinned host memory, copied to "
                              "the GPU on a side stream during the backbone forward)";
        if (h < 0)
            log_warn("%s; FI_HMEM detection failed: %s", staging, pf_errmsg());
        else if (h == 1)
            log_info("%s; provider %s offers FI_HMEM for CUDA (%s), but pfcps does not register GPU buffers with "
                     "the fabric yet", staging, t->run.provider, pf_errmsg());
        else
            log_info("%s; no FI_HMEM for CUDA on provider %s (%s)", staging, t->run.provider, pf_errmsg());
        return 0;
    }
#endif
    t->centers = malloc(bytes);
    t->grad_centers = malloc(bytes);
    if (!t->centers || !t->grad_centers)
        return pf_err(-ENOMEM, "out of memory for %zu class-center floats", kd);
    return 0;
}

/* The backbone's collective: broadcast of the parameters from rank 0 (bcast != 0), or allreduce (sum) of the
 * gradients. NCCL on device buffers; the ring in place on the CPU device; else the ring on a host copy. */
static int bb_collective(trainer *t, int bcast)
{
    float *buf = bcast ? model_params(t->m) : model_grads(t->m);
    size_t n = t->nparams, bytes = n * sizeof(float);
    pf_coll *c = t->have_nccl ? &t->nccl : &t->coll;
    if (t->have_nccl || t->direct)
        return bcast ? coll_broadcast(c, buf, bytes, 0) : coll_allreduce(c, buf, n, COLL_F32, COLL_SUM);
    int rc = t->dev->mem_d2h(t->ctx, t->h_stage, buf, bytes);
    if (rc == 0)
        rc = bcast ? coll_broadcast(c, t->h_stage, bytes, 0) : coll_allreduce(c, t->h_stage, n, COLL_F32, COLL_SUM);
    if (rc == 0)
        rc = t->dev->mem_h2d(t->ctx, buf, t->h_stage, bytes);
    return rc;
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
    /* A dead server is declared (-ECOMM naming it) once it leaves a send or a liveness probe unanswered for
     * the same bound (ps_client.h); not less: a live server's reply can wait on another worker's long step. */
    ps_client_set_timeout(t->ps, t->wait_s);
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

    /* Backbone on the configured device. The device was checked at start on this worker's own config
     * (worker/main.c); the run's must be the same, since worker 0 made the NCCL id from its own. */
    if (strcmp(t->local.device, run->device) || t->local.fp16 != run->fp16 || t->local.bf16 != run->bf16)
        return pf_err(-EINVAL, "this worker's config (device %s, fp16 %d, bf16 %d) differs from the run's (device "
                      "%s, fp16 %d, bf16 %d): give every process the same config", t->local.device, t->local.fp16,
                      t->local.bf16, run->device, run->fp16, run->bf16);
    if ((rc = train_device_resolve(run, &t->di)) < 0)
        return rc;
    if (t->di.warning[0] && t->rank == 0)
        log_warn("%s", t->di.warning);
#ifdef PFCPS_HAVE_CUDA_OPS
    if (t->di.cuda) {
        int ngpu = cuda_device_count(), gpu = ngpu > 0 ? t->rank % ngpu : 0;
        if ((rc = cuda_set_device(gpu)) < 0)
            return pf_err_wrap(rc, "selecting GPU %d of %d for worker %d", gpu, ngpu, t->rank);
        log_info("GPU %d of %d visible (worker %d)", gpu, ngpu, t->rank);
    }
#endif
    t->dev = ops_device_by_name(t->di.name);
    if (!t->dev)
        return pf_err_wrap(-ENODEV, "device '%s'", t->di.name);
    model_desc desc;
    if ((rc = model_desc_from_name(&desc, run->network, run->embedding_size)) < 0)
        return pf_err_wrap(rc, "network '%s'", run->network);
    if ((rc = model_create_desc(&t->m, &desc, run->batch_size, t->dev)) < 0)
        return pf_err_wrap(rc, "network '%s' on device %s", run->network, t->di.name);
    t->ctx = model_ctx(t->m);
    t->direct = t->dev == &ops_cpu;
    model_init(t->m, (uint64_t)run->seed);
    t->nparams = model_num_params(t->m);

    /* Backbone collectives: NCCL over device buffers on cuda, else the ring (through host staging when the
     * device's memory is not plain host memory). */
    const char *backend = t->direct ? "fabric ring on the parameters in place" : "fabric ring through host staging";
    if (t->di.cuda) {
#ifdef PFCPS_HAVE_NCCL
        const void *id = NULL;
        size_t idlen = 0;
        if (member_addr_part(book->workers[0].addr, book->workers[0].addr_len, 2, &id, &idlen) < 0 ||
            idlen != CUDA_NCCL_ID_BYTES)
            return pf_err(-EPROTO, "worker 0's address-book entry carries no NCCL unique id (was worker 0 started "
                          "with device = cuda? give every process the same config)");
        if ((rc = coll_nccl_create((const uint8_t *)id, t->rank, t->W, &t->nccl)) < 0)
            return pf_err_wrap(rc, "NCCL communicator of %d workers", t->W);
        t->have_nccl = 1;
        backend = "NCCL on device buffers";
#else
        backend = "fabric ring through host staging (this build has no NCCL)";
#endif
    }
    if (!t->direct && !t->have_nccl && !(t->h_stage = malloc(t->nparams * sizeof(float))))
        return pf_err(-ENOMEM, "out of memory for the %zu-float gradient staging buffer", t->nparams);
    /* Same seed on every rank, then rank 0's parameters broadcast (identical by construction; the broadcast
     * makes it so whatever the initialiser does). */
    if ((rc = bb_collective(t, 1)) < 0)
        return pf_err_wrap(rc, "broadcasting the initial parameters");
    log_info("device %s, precision %s; backbone collectives: %s", t->di.name, t->di.precision, backend);
    log_info("backbone %s: %zu parameters (%.1f MB), embedding_size %d, batch %d", run->network, t->nparams,
             t->nparams * 4.0 / 1e6, run->embedding_size, run->batch_size);
    size_t pbytes = t->nparams * sizeof(float);
    if (!strcmp(run->optimizer, "sgd")) {
        rc = dev_alloc(t, (void **)&t->mom, pbytes, "SGD momentum");
    } else if (!strcmp(run->optimizer, "adamw")) {
        rc = dev_alloc(t, (void **)&t->adam_m, pbytes, "AdamW first moment");
        if (rc == 0)
            rc = dev_alloc(t, (void **)&t->adam_v, pbytes, "AdamW second moment");
    } else {
        return pf_err(-EINVAL, "optimizer '%s' is not sgd or adamw", run->optimizer);
    }
    if (rc < 0)
        return rc;
    if (t->di.loss_scaling) {
        /* PFCPS_AMP_INIT_SCALE (tests only): another initial scale, e.g. 2^127 to force overflows. */
        float init = AMP_INIT_SCALE;
        const char *env = getenv("PFCPS_AMP_INIT_SCALE");
        if (env && *env) {
            char *end;
            double v = strtod(env, &end);
            if (*end || !(v > 0) || !isfinite((float)v))
                return pf_err(-EINVAL, "environment PFCPS_AMP_INIT_SCALE='%s' is not a positive float32 number", env);
            init = (float)v;
            log_warn("PFCPS_AMP_INIT_SCALE: initial loss scale %g instead of %g (for tests)", (double)init,
                     (double)AMP_INIT_SCALE);
        }
        if ((rc = cuda_loss_scaler_init(&t->scaler, init, AMP_GROWTH_INTERVAL)) < 0)
            return rc;
        t->loss_scaling = 1;
        log_info("dynamic loss scaling: init scale %g, growth interval %d, growth %g, backoff %g",
                 (double)t->scaler.scale, t->scaler.growth_interval, (double)t->scaler.growth_factor,
                 (double)t->scaler.backoff_factor);
    }

    /* Head. */
    head_params hp = {.s = run->scale, .m1 = run->margin_list[0], .m2 = run->margin_list[1],
                      .m3 = run->margin_list[2],
                      .interclass_filtering_threshold = run->interclass_filtering_threshold, .clamp_loss = 1};
    if ((rc = head_parse_margin_grad(run->margin_grad, &hp.margin_grad)) < 0 ||
        (rc = head_parse_mode(run->head_mode, &hp.mode)) < 0)
        return rc;
    /* On cuda the head runs on the GPU (pfc_cuda): the host pfc only samples, without the CPU head's workspace. */
    if ((rc = pfc_init_flags(&t->head, &hp, &t->coll, run->num_classes, run->sample_rate, (uint64_t)run->seed,
                             run->batch_size, run->embedding_size, t->di.cuda ? PFC_NO_HOST_HEAD : 0)) < 0)
        return rc;
    t->have_head = 1;
    size_t kd = (size_t)t->head.k_max * (size_t)run->embedding_size, bd = (size_t)run->batch_size * run->embedding_size;
    if ((rc = rows_alloc(t, kd)) < 0)
        return rc;
    t->h_emb = malloc(bd * sizeof(float));
    t->grad_emb = malloc(bd * sizeof(float));
    t->labels = malloc((size_t)run->batch_size * sizeof(int64_t));
    if (!t->h_emb || !t->grad_emb || !t->labels)
        return pf_err(-ENOMEM, "out of memory for head buffers (batch %d x %d)", run->batch_size, run->embedding_size);
    if ((rc = dev_alloc(t, (void **)&t->d_grad_emb, bd * sizeof(float), "the embedding gradient")) < 0)
        return rc;
#ifdef PFCPS_HAVE_CUDA_OPS
    if (t->di.cuda) {
        /* The GPU head: its collectives on NCCL, or (no NCCL) on the ring over managed staging buffers. */
        pf_coll *hc = t->W == 1 ? NULL : t->have_nccl ? &t->nccl : &t->coll;
        if ((rc = pfc_cuda_create(&t->gh, &t->head, hc, hc && !t->have_nccl)) < 0)
            return pf_err_wrap(rc, "the GPU head");
        t->gpu_head = 1;
        if ((rc = dev_alloc(t, (void **)&t->d_centers, (kd ? kd : 1) * sizeof(float), "class-center rows")) < 0 ||
            (rc = dev_alloc(t, (void **)&t->d_grad_centers, (kd ? kd : 1) * sizeof(float),
                            "class-center gradients")) < 0)
            return rc;
        if ((rc = cuda_side_stream_create(&t->side)) < 0)
            return pf_err_wrap(rc, "the side stream for class-center rows");
    }
#endif
    log_info("head on the %s, its collectives on %s; label allgather and sampling on the host (fabric ring)",
             t->gpu_head ? "GPU (pfc_cuda)" : "CPU (pfc_step, host copies of the embeddings)",
             t->gpu_head && t->have_nccl ? "NCCL" : t->W == 1 ? "nothing (one worker)" : "the fabric ring");
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
            rc = t->dev->sgd_step(t->ctx, w + T->offset, g + T->offset, t->mom + T->offset, T->count, lr,
                                  (float)t->run.momentum, (float)t->run.weight_decay);
        else
            rc = t->dev->adamw_step(t->ctx, w + T->offset, g + T->offset, t->adam_m + T->offset,
                                    t->adam_v + T->offset, T->count, lr, 0.9, 0.999, 1e-8, t->run.weight_decay,
                                    step1);
        if (rc < 0)
            return pf_err_wrap(rc, "optimizer step on %s", T->name);
    }
    return 0;
}

/* Step 5 for the k rows pulled into t->centers: loss, the embedding gradient (host grad_emb for the CPU
 * head, device d_grad_emb for the GPU head) and the row gradients in t->grad_centers (host) for the push. */
static int run_head(trainer *t, const float *emb, int64_t k, double *loss)
{
    const size_t bd = (size_t)t->run.batch_size * (size_t)t->run.embedding_size;
    const size_t kd = (size_t)k * (size_t)t->run.embedding_size;
#ifdef PFCPS_HAVE_CUDA_OPS
    if (t->gpu_head) {
        int rc = kd ? cuda_h2d_async(t->d_centers, t->centers, kd * sizeof(float), t->side) : 0;
        if (rc == 0)
            rc = cuda_default_stream_wait(t->side);
        if (rc == 0)
            rc = pfc_cuda_step(&t->gh, &t->head, emb, t->d_centers, loss, t->d_grad_emb, t->d_grad_centers);
        if (rc == 0 && kd)
            rc = t->dev->mem_d2h(t->ctx, t->grad_centers, t->d_grad_centers, kd * sizeof(float));
        return rc;
    }
#endif
    (void)kd;
    int rc = t->dev->mem_d2h(t->ctx, t->h_emb, emb, bd * sizeof(float));
    if (rc == 0)
        rc = pfc_step(&t->head, t->h_emb, t->centers, loss, t->grad_emb, t->grad_centers);
    return rc;
}

/* Zeroes the gradients of fixed tensors so that they take no part in clipping. */
static int zero_fixed_grads(trainer *t)
{
    float *g = model_grads(t->m);
    for (int i = 0; i < model_num_tensors(t->m); i++) {
        const model_tensor *T = model_tensor_at(t->m, i);
        if (T->flags & MODEL_TENSOR_FIXED) {
            int rc = t->dev->mem_zero(t->ctx, g + T->offset, T->count * sizeof(float));
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

/* Step 7 after the head: upload the embedding gradient (grad_emb, host; the GPU head wrote d_grad_emb
 * already: upload = 0) and scale it by W (arcface_torch:
 * the AllGather backward multiplies by W and DDP averages the backbone gradients over W, so the mean of the
 * W scaled gradients is the gradient of the global mean loss) and by the loss scale (fp16); backward;
 * allreduce; mean and unscale in one pass (the loss scale is a power of two, so g * (1/W) * (1/scale) in
 * one multiply is exact as two); fixed gradients zeroed; the sum of squares is the loss scaler's found-inf
 * check and clip_grad_norm_(5)'s norm (optim_clip_grad_norm's math); optimizer step unless the scaler says
 * skip. *skipped = 1 when the step was skipped on overflow. */
static int backbone_step(trainer *t, float lr, int upload, int *skipped)
{
    const ops_device *dev = t->dev;
    const size_t bd = (size_t)t->run.batch_size * (size_t)t->run.embedding_size;
    float scale = t->loss_scaling ? t->scaler.scale : 1.0f;
    *skipped = 0;
    int rc = upload ? dev->mem_h2d(t->ctx, t->d_grad_emb, t->grad_emb, bd * sizeof(float)) : 0;
    float gs = (float)t->W * scale;
    if (rc == 0 && gs != 1.0f)
        rc = dev->scale(t->ctx, t->d_grad_emb, bd, gs);
    if (rc == 0)
        rc = model_backward(t->m, t->d_grad_emb, NULL);
    if (rc == 0)
        rc = bb_collective(t, 0);
    float *g = model_grads(t->m);
    float inv = 1.f / (float)t->W;
    if (t->loss_scaling)
        inv *= (float)(1.0 / (double)scale);
    if (rc == 0 && inv != 1.0f)
        rc = dev->scale(t->ctx, g, t->nparams, inv);
    if (rc == 0)
        rc = zero_fixed_grads(t);
    double ss = 0;
    if (rc == 0)
        rc = dev->sumsq(t->ctx, g, t->nparams, &ss);
    if (rc < 0)
        return rc;
    if (t->loss_scaling && !cuda_loss_scaler_update(&t->scaler, !isfinite(ss))) {
        *skipped = 1;
        return 0;
    }
    /* torch.nn.utils.clip_grad_norm_(params, 5): coef = 5 / (norm + 1e-6), applied when below 1. */
    double total = sqrt(ss);
    if (isfinite(total)) {
        double coef = 5.0 / (total + 1e-6);
        if (coef < 1.0 && (rc = dev->scale(t->ctx, g, t->nparams, (float)coef)) < 0)
            return rc;
    }
    t->opt_steps++;
    return optimizer_step(t, lr, t->opt_steps);
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
    const int B = run->batch_size;
    const int64_t total = t->opts.max_steps > 0 ? t->opts.max_steps : t->steps_per_epoch * run->num_epoch;
    int64_t step = 0; /* steps done; the step being run is `step` (0-based), arcface_torch's global_step + 1 */
    int rc = 0, stuck = 0, stopped = 0;
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
                stopped = 1;
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
            /* 5: the head over every worker's sampled columns: on the GPU (the rows go up on the side stream
             * while the queued forward runs; the head, on the default stream, waits for both), or on the
             * CPU on a host copy of the embeddings. */
            double loss = 0;
            if (rc == 0)
                rc = run_head(t, emb, k, &loss);
            /* 6: push the row gradients now; the servers apply them during our backward. */
            if (rc == 0)
                rc = ps_push(t->ps, ids, (size_t)k, t->grad_centers, (float)lr, step, &push);
            /* 7: backbone backward, allreduce, clip, optimizer (grad_emb is d(global mean loss)/d(my
             * embeddings) in both head modes). */
            int skipped = 0;
            float scale_used = t->loss_scaling ? t->scaler.scale : 1.0f;
            if (rc == 0)
                rc = backbone_step(t, (float)lr, !t->gpu_head, &skipped);
            if (rc == 0 && skipped && t->rank == 0)
                log_info("global step %lld: backbone gradients overflowed at loss scale %g: optimizer step "
                         "skipped, scale now %g", (long long)step + 1, (double)scale_used, (double)t->scaler.scale);
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
                if (t->loss_scaling) /* arcface_torch's line with fp16 */
                    log_info("Speed %.2f samples/sec   Loss %.4f   LearningRate %.6f   Epoch: %lld   Global Step: "
                             "%lld   Fp16 Grad Scale: %2.f   Required: %1.f hours",
                             speed, loss_sum / loss_n, lr, (long long)epoch, (long long)step,
                             (double)t->scaler.scale, hours);
                else
                    log_info("Speed %.2f samples/sec   Loss %.4f   LearningRate %.6f   Epoch: %lld   Global Step: "
                             "%lld   Required: %1.f hours",
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
            if ((rc = save_backbone(t, path)) < 0)
                break;
            log_info("epoch %lld done: backbone saved to %s", (long long)epoch, path);
        }
    }
done:
    if (rc == 0 && t->rank == 0 && t->opts.max_steps > 0) {
        char path[1100];
        snprintf(path, sizeof path, "%s/model.ckpt", run->output);
        if ((rc = mkdir_p(run->output)) == 0 && (rc = save_backbone(t, path)) == 0)
            log_info("backbone saved to %s after %lld steps", path, (long long)step);
    }
    if (rc == 0 && t->opts.dump_centers)
        rc = dump_partition(t, step);
    if (t->trace)
        fflush(t->trace);
#ifdef PFCPS_HAVE_CUDA_OPS
    size_t gfree = 0, gtotal = 0;
    if (rc == 0 && t->di.cuda && cuda_mem_info(&gfree, &gtotal) == 0)
        log_info("GPU memory in use at the end (whole device, cudaMemGetInfo): %.0f MiB of %.0f MiB",
                 (double)(gtotal - gfree) / 1048576.0, (double)gtotal / 1048576.0);
#endif
    if (rc == 0 && t->rank == 0) {
        double el = now_s() - t_start;
        if (step == 0)
            log_info("training stopped before the first step: no loss, outputs in %s", run->output);
        else
            log_info("training %s: %lld of %lld steps, first loss %.4f, final loss %.4f, %.2f samples/sec over %.1f s, "
                     "outputs in %s",
                     stopped ? "stopped on request" : "done", (long long)step, (long long)total, first_loss,
                     last_loss, el > 0 ? (double)step * B * t->W / el : 0.0, el, run->output);
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
    dev_free(t, t->mom);
    dev_free(t, t->adam_m);
    dev_free(t, t->adam_v);
    dev_free(t, t->d_grad_emb);
#ifdef PFCPS_HAVE_CUDA_OPS
    if (t->gpu_head)
        pfc_cuda_free(&t->gh);
    if (t->side)
        cuda_side_stream_destroy(t->side);
#endif
    dev_free(t, t->d_centers);
    dev_free(t, t->d_grad_centers);
    if (t->have_nccl)
        coll_destroy(&t->nccl);
    model_free(t->m);
    loader_close(t->ld);
    if (t->have_coll)
        coll_destroy(&t->coll);
    fab_close(t->coll_fab);
    ps_client_destroy(t->ps);
#ifdef PFCPS_HAVE_CUDA_OPS
    if (t->pinned) {
        cuda_host_pinned_free(t->centers);
        cuda_host_pinned_free(t->grad_centers);
        t->centers = t->grad_centers = NULL;
    }
#endif
    free(t->centers);
    free(t->grad_centers);
    free(t->h_emb);
    free(t->grad_emb);
    free(t->h_stage);
    free(t->labels);
    free(t);
}
