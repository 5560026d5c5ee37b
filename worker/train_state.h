/* The trainer's state, shared by the worker's set-up (worker/train_setup.c: train_open_endpoints,
 * train_setup, train_close) and its loop (worker/train.c: train_step, train_run). Private to those two
 * files: everything else sees the opaque `trainer` of worker/train.h. */
#ifndef PFCPS_WORKER_TRAIN_STATE_H
#define PFCPS_WORKER_TRAIN_STATE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/config.h"
#include "common/metrics.h"
#include "worker/data/loader.h"
#include "worker/device.h"
#include "worker/eval/set.h"
#include "worker/generation.h"
#include "worker/head/pfc.h"
#include "worker/loss_scale.h"
#include "worker/lr_schedule.h"
#include "worker/model/model.h"
#include "worker/rejoin.h"
#include "worker/resume.h"
#include "worker/tb_writer.h"
#include "worker/train.h"
#include "worker/train_net.h"

/* Verification sets a run scores at most (config key val_targets). */
#define MAX_VAL_TARGETS 8

/* The phases of a step (train_step) as the pfcps_worker_phase_seconds series name them. */
enum { PH_SAMPLE, PH_PULL, PH_HEAD, PH_PUSH, PH_BACKBONE, PH_WAIT, PH_COUNT };

/* The training loop's Prometheus series (docs/metrics.md, "Worker"; the data plane's are the client's,
 * ps_client_metrics_on), registered by train_run and updated by it after every step. */
typedef struct train_metrics {
    pf_metric *step, *epoch, *last_step_ts, *samples, *samples_per_s, *loss, *lr, *loss_scale;
    pf_metric *step_s;          /* histogram: the whole step (stop vote, labels, train_step) */
    pf_metric *phase[PH_COUNT]; /* histograms: phase = sample, pull, head, push, backbone, wait */
    pf_metric *ckpt_ts, *ckpt_step;
    pf_metric *val[MAX_VAL_TARGETS]; /* rank 0: Accuracy-Flip per val_targets set */
} train_metrics;

struct trainer {
    /* Config: the run's (server 0's, from the rendezvous), this worker's own (what the endpoints were opened
     * with), the daemon's options; this worker's rank, W workers, S servers. */
    pf_config run;
    pf_config local;
    train_opts opts;
    int rank, W, S;

    /* Parameter-server client and the workers' collectives ring (worker/train_net.h). */
    train_net net;

    /* Data: the loader, the next batch's labels, arcface_torch's schedule lengths in global steps. */
    loader *ld;
    int64_t *labels; /* (B) the next batch's labels */
    double warmup_steps;
    int64_t total_steps, steps_per_epoch;
    lr_schedule sched; /* config lr_scheduler over those lengths (lr_schedule_at) */

    /* Model and device: the backbone, its parameter count, the device beyond kernels/ops.h. */
    model *m;
    size_t nparams;
    wdev wd;                       /* backbone collective, head buffers, the head on the device */
    uint8_t dev_id[WDEV_ID_BYTES]; /* worker 0 of a cuda run: the NCCL unique id it published */

    /* Optimizer: the backbone's state on the device and dynamic loss scaling. */
    float *mom;             /* device: SGD momentum (nparams) */
    float *adam_m, *adam_v; /* device: AdamW moments (nparams) */
    int64_t opt_steps;      /* optimizer steps applied (AdamW's count; steps skipped on overflow excluded) */
    int loss_scaling;
    loss_scaler scaler;
    int skip_centers; /* fp16_overflow_skip = step: an overflow step pushes no center gradients */
    int grad_fp16;    /* backbone_grad_comm = fp16: torch DDP's fp16_compress_hook (wdev_allreduce_grads) */
    /* gradient_acc = acc_k > 1: the class centers' gradients of the window's steps, summed per class (ids
     * ascending, rows of D floats, acc_n of them; acc_ids2 / acc_rows2 the merge's second buffer), pushed at its
     * last step; room for acc_k x k_max rows. */
    int acc_k;
    int64_t acc_n, acc_cap;
    int64_t *acc_ids, *acc_ids2;
    float *acc_rows, *acc_rows2;
    /* opts.keep_generations: the state at the start of the current and the previous step (train_rewind);
     * NULL when off. */
    wgen *gen;
    /* A run that replaces lost workers, workers 1..W-1: worker 0's BN running statistics as of this worker's
     * last finished step (device, model_num_buffer_floats floats; broadcast from worker 0 at the end of every
     * step, kept in the generations), for a lost worker 0's replacement; NULL elsewhere. */
    float *bn0;

    /* Head: the Partial FC sampler (and, off the GPU, the CPU head). */
    pfc head;
    int have_head;

    /* Logging and metrics. */
    train_metrics mx;
    double phase_s[PH_COUNT];      /* the last train_step's phase times, seconds */
    FILE *trace;                   /* opts.trace_path, or NULL */
    int64_t *trace_keys;           /* opts.trace_batch: (B) the last step's record keys */
    uint8_t *trace_flips;          /* opts.trace_batch: (B) the last step's flips */
    const int64_t *trace_ids;      /* opts.trace_batch: the last step's sampled class ids (the sampler's) */
    int64_t trace_k;               /* their count */
    tb_writer *tb;                 /* rank 0: <output>/tensorboard; NULL when off or after a write error */
    eval_set val[MAX_VAL_TARGETS]; /* rank 0: the val_targets sets */
    double val_highest[MAX_VAL_TARGETS]; /* highest Accuracy-Flip so far, per set */
    int n_val;

    /* Checkpoint state. */
    char ckpt_root[4096];  /* checkpoints (common/ckpt.h) */
    int64_t start_step;    /* > 0: resumed from this checkpoint step (replacing: a live worker's state) */
    int replacing;         /* this process replaces a lost worker in place */
    wresume_state resumed; /* the scalars loaded with it */
    char pretrained_path[CFG_STR + 32]; /* train_setup.c pretrained_file: this rank's checkpoint_gpu file */
    ckpt_ident ckpt_id;    /* the run identity its files carry: the book's run id, the run config's seed and
                              config digest */
    int ckpt_keyed;        /* its .snap files carry an HMAC under ckpt_key (a join secret is known) */
    snapfile_key ckpt_key; /* snapfile_key_derive of the join secret */

    /* A failed-over server rejoining (replicas = 1; docs/architecture.md, "Hot-standby shards", Rejoin). The
     * control watcher writes the notices (train_rejoin_notice), the training thread reads them. */
    rejoin_state rj;

    /* A lost worker replaced in place (cfg_replaces_workers; docs/architecture.md, "Worker replacement in
     * place"). The control watcher writes the notices (train_replace_notice), the training thread reads them. */
    int wr_on;                       /* this run replaces lost workers (its generations are kept: gen) */
    _Atomic uint32_t wr_lost_epoch;  /* epoch of the newest worker-lost notice (0: none) */
    _Atomic uint32_t wr_redo_epoch;  /* epoch of the newest redo notice, stored after wr_redo_step, wr_donor */
    int wr_lost;                     /* the lost worker's rank */
    int64_t wr_redo_step;            /* the step every worker redoes */
    int wr_donor;                    /* the worker whose state the replacement loads */
    /* The end of training (end_vote): set once this worker passed the end vote (every worker's final outputs
     * are written), and once the rendezvous said a worker lost after it ends the run (CTL_FO_RUN_ENDED). */
    atomic_int end_voted;
    atomic_int wr_run_ended;
    int centers_saved; /* save_centers: this worker's partition was written before the end vote */
    int model_saved;   /* rank 0, --max-steps: model.ckpt was written before the end vote */
};

/* The global steps the run trains: --max-steps when given, else num_epoch epochs. */
static inline int64_t train_total_steps(const trainer *t)
{
    return t->opts.max_steps > 0 ? t->opts.max_steps : t->steps_per_epoch * t->run.num_epoch;
}

/* Writes this worker's state (worker/resume.h: the backbone with its BN statistics, the optimizer arrays, the
 * scalars, with the log's first loss and loss sums) as checkpoint `step` under `root`. Returns 0 or
 * wresume_save's error (naming the file). */
int train_write_state(trainer *t, const char *root, int64_t step, double first_loss, double loss_sum,
                      int loss_n);

/* Worker replacement in place (worker/replace.c; docs/architecture.md, "Worker replacement in place"): called
 * by train_run when a step failed while a worker-lost notice is pending. Reopens the collectives endpoint,
 * reports this worker's first unfinished step `step` and its new book entry, waits for the redo, restores the
 * state of the redo step, connects the new ring and, as the donor, writes its state for the replacement.
 * first_loss, loss_sum, loss_n: the log's, for the donor's state. A restarted rendezvous (the previous one
 * lost with server 0 before the redo) that tells the loss again is reported to again. Returns 0 with *redo =
 * the step to go on from and *handled = the newest worker-lost epoch this redo answers; 1 when the rendezvous
 * said the run ended instead (CTL_FO_RUN_ENDED: this worker's vote at the last step, `step`, failed with a
 * worker lost after the others passed it; *redo = step: training is done); or a negative code (the run then
 * re-forms from its checkpoint). */
int train_replace(trainer *t, int64_t step, double first_loss, double loss_sum, int loss_n, int64_t *redo,
                  uint32_t *handled);

/* A step failed in a run that replaces lost workers and no worker-lost notice newer than epoch `after` has
 * come: a lost worker's peers on the ring can see its connections close before the rendezvous' notice
 * arrives. Waits for that notice up to the rendezvous' silence limit plus 2 s (ctl_member_silence_s of
 * ctl_timeout), or until a stop is asked for (the run broke: the watcher's verdict). A run-ended notice
 * (CTL_FO_RUN_ENDED) counts as such a notice. Returns 1 when the notice came (train_replace then takes over),
 * 0 when not. The step's error message is kept. */
int train_replace_await(trainer *t, uint32_t after);

/* mkdir -p: creates `path` and its parents (mode 0755). Returns 0 or -errno, the message naming the path. */
int train_mkdir_p(const char *path);

/* The backbone optimizer's state arrays (device pointers, nparams floats each) into a[0..n): SGD's momentum
 * (n = 1) or AdamW's two moments (n = 2). Returns n. */
int train_opt_arrays(trainer *t, float **a);

#endif
