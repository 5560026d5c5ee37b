/* The training loop of one pfcps worker (docs/architecture.md, "One training step"):
 *
 *   labels of the next batch (loader_peek_labels)
 *   -> pfc_sample: allgather labels, sample this worker's partition (positives + negatives)
 *   -> ps_pull of the sampled class centers, overlapped with
 *   -> backbone forward of the batch
 *   -> pfc_step: allgather embeddings, margin softmax over all workers' columns, reduce-scatter of
 *      the embedding gradients
 *   -> ps_push of the row gradients with this step's lr (the servers apply SGD while we go on)
 *   -> backbone backward, allreduce (mean) of the backbone gradients, clip at 5, optimizer step
 *   -> wait for the push (read-your-writes before the next pull)
 *
 * Everything a step needs is created by train_open_endpoints and train_setup (worker/train_setup.c; the
 * endpoints themselves are worker/train_net.h) from the run config and the address book, so the same code
 * runs the daemon (worker/main.c) and the tests; the step and the run are worker/train.c.
 *
 * Devices (config `device`, kernels/ops.h): the backbone's parameters, gradients, optimizer state and
 * embeddings live in the device's memory and the loop touches them only through the device table
 * (mem_*, sgd_step / adamw_step, scale, sumsq) and worker/device.h (the backbone collective, the head on
 * the device: the GPU head on cuda, the CPU head on host copies of the embeddings elsewhere). Mixed
 * precision (fp16 = true on a half device): torch.amp.GradScaler's dynamic loss scaling (worker/loss_scale.h;
 * init 65536, growth interval 100, arcface_torch), state saved with the backbone as "amp.scale" /
 * "amp.growth_tracker". */
#ifndef PFCPS_WORKER_TRAIN_H
#define PFCPS_WORKER_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "common/config.h"
#include "common/ctl.h"
#include "worker/device.h" /* train_device_resolve */

typedef struct trainer trainer;

typedef struct train_opts {
    int rank;               /* worker rank in [0, workers) */
    const char *trace_path; /* optional: every step's loss (%.17g) and lr appended here, one line per step */
    int trace_batch;        /* with trace_path: each line also names the step's batch (record keys, flips) and
                               this worker's sampled class ids (train.c log_step gives the format) */
    const char *dump_centers; /* optional: at the end, write this worker's partition of the class-center
                                 table (pulled after the last step) to <dump_centers>.rank<r> as raw
                                 (u64 class id, D floats) records, for tests */
    int64_t max_steps;        /* > 0: stop after this many global steps (tests); 0: num_epoch epochs */
    volatile int *stop_flag;  /* set by the signal handler: stop after the current step (all ranks agree) */
    const char *secret;       /* the join secret (config or PFCPS_SECRET): the data-plane token comes from it */
    ctl_session *sess;        /* replicas = 1: the control session, for a rejoin's copy step (worker 0) and a
                                 worker replacement's reports */
    int *interrupt;           /* the process' fab_set_interrupt flag (raised by the control watcher when the
                                 run broke or a worker was lost), lowered once a worker replacement has set
                                 up the redo; NULL: none */
    int keep_generations;     /* 1: keep the state at the start of the current and the previous step
                                 (worker/generation.h) for train_rewind: one device-to-device copy of the
                                 backbone, its BN statistics and optimizer state per step, device memory for
                                 two. 0 (default): nothing kept, nothing allocated */
} train_opts;

/* Opens a worker's endpoints (one towards the servers, one for the ring collectives). The packed fabric
 * address to join the run with (common/member_addr.h) is written to addr / *addr_len (capacity in).
 * Returns 0 or a negative code (fabric errors). */
int train_open_endpoints(trainer **out, const pf_config *local, int rank, uint8_t *addr, size_t *addr_len);

/* Sets up everything from the run config (from the rendezvous) and the address book: server addresses,
 * collectives ring, data loader, backbone, head, optimizer state; logs what it loaded.
 * Fails (negative code, message) on a dataset whose labels exceed num_classes, an unknown network, a
 * server that does not answer. */
int train_setup(trainer *t, const pf_config *run, const ctl_book *book, const train_opts *opts);

/* Runs the epochs (or max_steps). Rank 0 logs the arcface_torch line every `frequent` steps, writes
 * <output>/training.log and saves the backbone to <output>/model.ckpt at each epoch end.
 * Returns 0, or a negative code: -EDOM for a NaN/inf loss (message names the step), -EPROTO for a loss
 * stuck at ln(1e30) = 69.0776 (no target ever matched: a label/sampling fault), or a component's error. */
int train_run(trainer *t);

/* In-place recovery (opts.keep_generations = 1): puts the trainer back at the start of global step `step`
 * (0-based), which must be the step train_run is in or the one before it (the two generations kept): restores
 * the backbone parameters, BN running statistics, optimizer state, loss scaler, dropout generator and gradient
 * accumulation of that step's start (wgen_restore), and repositions the data loader at the step's batch
 * (epoch step / steps per epoch, batch step % steps per epoch; batches decoded ahead are dropped). The
 * learning rate and the Partial FC sample are functions of the step. The caller's loop then goes on at `step`
 * (its epoch counter included); the class centers on the servers are the servers' to roll back. Call it from
 * the training thread, between steps or after a step failed. Returns 0; -EINVAL when generations are not kept;
 * -ENOENT naming the steps held when neither generation holds `step` (nothing changed); or the device's /
 * loader's error. */
int train_rewind(trainer *t, int64_t step);

/* The trainer's parameter-server client (its endpoint opened by train_open_endpoints), for the control
 * watcher's ps_client_server_lost (replicas = 1), which is safe from another thread. */
struct ps_client *train_ps_client(trainer *t);

/* The control watcher's rejoin notices (replicas = 1; docs/architecture.md, "Hot-standby shards", Rejoin):
 * kind CTL_FO_REJOIN_BEGIN (server `server` rejoins at `epoch`: the workers agree, at their next stop vote,
 * on a checkpoint step its copy is taken at, and hold their pushes after it), CTL_FO_REJOINED (its book entry
 * in addr[len]: the held pushes go on to its copies too) or CTL_FO_REJOIN_ABORTED (they go on as before). A
 * rejoined notice not yet taken by the training thread is waited for (up to 10 s) before the next notice is
 * written. Safe from the watcher thread while train_run runs. */
void train_rejoin_notice(trainer *t, int kind, int server, uint32_t epoch, const void *addr, size_t len);

/* The control watcher's worker-replacement notices (docs/architecture.md, "Worker replacement in place"):
 * kind CTL_FO_WORKER_LOST (worker `rank` was lost at `epoch`: the caller then raises the fabric interrupt,
 * and the training thread, once its step fails, reports and waits; train_replace) or CTL_FO_REDO (every
 * worker redoes step `step`; `rank` is the donor) or CTL_FO_RUN_ENDED (worker `rank` was lost after the end
 * vote: a worker whose own vote failed with that loss, waiting in train_replace, finishes instead). Safe from
 * the watcher thread while train_run runs. Returns 2 when this worker passed the end vote already (the notice
 * is of no use to it: the caller leaves the fabric alone), 1 when this run replaces workers in place (the
 * notice was taken), 0 when it does not (a loss then re-forms). */
int train_replace_notice(trainer *t, int kind, int rank, uint32_t epoch, int64_t step);

/* Frees everything. NULL is a no-op. */
void train_close(trainer *t);

#endif
