/* Two generations of a worker's training state, for in-place recovery (docs/architecture.md, worker
 * replacement): the state at the start of the current step and at the start of the previous one, so that
 * after a worker is lost mid-step every survivor can go back to a common step R (the current step's start or
 * the previous step's) and redo from there. The trainer keeps one at each gradient_acc window's start (every
 * step without accumulation), so its two are the current and the previous window's starts, and it sets
 * wgen_src.starts_only: no room for a window's sums. Without starts_only a generation inside a window is also
 * kept and restored whole (the window's gradients and class-center sums so far).
 *
 * A generation is everything a training step changes that later steps read:
 *   device: backbone parameters (model_params), BN running statistics (model_buffers), the optimizer's
 *           arrays (SGD momentum, or AdamW's two moments), under gradient accumulation the gradients summed
 *           so far in the window (model_grads), and on workers 1.. the copy of worker 0's BN running
 *           statistics when the source has one (wgen_src.bn0)
 *   host:   the optimizer step count, the loss scaler (scale, growth tracker), the dropout generator's
 *           counter (model_rng_state), and under gradient accumulation the window's class-center gradient
 *           sums (ids, rows, their count)
 * The device arrays are copied device to device (ops_device.mem_d2d on the model's context: a memcpy on the
 * CPU devices, a copy queued on the model's stream on CUDA, ordered with the step's kernels and not blocking
 * the host). Memory for both generations is allocated once by wgen_create; keeping and restoring allocate
 * nothing.
 *
 * Not part of a generation (a function of the step, or outside the worker): the data order and the Partial FC
 * sample (functions of seed, epoch and step), the learning rate (lr_schedule_at(step)), the class centers
 * (the servers'), the head (no state between steps), logging and metrics. */
#ifndef PFCPS_WORKER_GENERATION_H
#define PFCPS_WORKER_GENERATION_H

#include <stddef.h>
#include <stdint.h>

#include "worker/loss_scale.h"
#include "worker/model/model.h"

/* Where the live state is (the trainer's fields, or a test's), read by wgen_keep and written by
 * wgen_restore. The pointers must stay valid for the life of the wgen. */
typedef struct wgen_src {
    model *m;            /* parameters, BN running statistics, gradients, dropout counter; its device */
    float *opt[2];       /* device: the optimizer's arrays, model_num_params floats each: SGD momentum
                            (n_opt = 1) or AdamW's first and second moments (n_opt = 2) */
    int n_opt;           /* 0, 1 or 2 */
    int64_t *opt_steps;  /* optimizer steps applied (AdamW's bias-correction count) */
    loss_scaler *scaler; /* the dynamic loss scaler, or NULL without loss scaling */
    float *bn0;          /* device, model_num_buffer_floats floats, or NULL: worker 0's BN running statistics
                            as this worker holds them (workers 1.. of a run that replaces lost workers: worker 0's
                            are the ones model.ckpt saves, so its replacement must get them back) */
    /* Gradient accumulation (acc_k > 1; 1: none): the model's gradients are kept for steps inside a window
     * (step % acc_k != 0), and the window's class-center gradient sums: *acc_n rows, ids at *acc_ids and
     * rows of row_floats floats at *acc_rows (host memory; pointers to the pointers, which the merge swaps),
     * room for acc_cap rows. */
    int acc_k;
    int starts_only; /* with acc_k > 1: generations are kept only at window starts (step % acc_k == 0), where
                        the window's gradients are zero and its class-center sums empty, so no room is
                        allocated for either (the trainer's use; inside a window wgen_keep is refused) */
    int64_t **acc_ids;
    float **acc_rows;
    int64_t *acc_n;
    int64_t acc_cap;
    int64_t row_floats;
} wgen_src;

typedef struct wgen wgen;

/* Allocates two generations for the state `src` describes (device memory on the model's device for the
 * arrays, host memory for the rest), both empty. Returns 0, -EINVAL (no model, n_opt outside [0, 2], a NULL
 * pointer the fields need, acc_k < 1, acc_cap or row_floats < 0), or the device's -ENOMEM, the message
 * naming the bytes. */
int wgen_create(wgen **out, const wgen_src *src);

/* Frees both generations (before the model's device context goes). NULL is a no-op. */
void wgen_free(wgen *g);

/* At the start of global step `step` (0-based, >= 0): copies the live state into a generation labelled
 * `step`: the one already labelled `step` if any (a step redone after wgen_restore), else an empty one, else
 * the one with the lower step. Generations labelled after `step` (the steps of an abandoned future, after a
 * restore) are emptied. On CUDA the device copies are queued, not waited for. Returns 0, -EINVAL (step < 0;
 * with starts_only, a step inside a window or class-center sums left at a window's start), or the device's
 * error (that generation is then empty). */
int wgen_keep(wgen *g, int64_t step);

/* Whether a generation holds the state at the start of global step `step` (1) or not (0). */
int wgen_has(const wgen *g, int64_t step);

/* Copies the generation of global step `step` back into the live state (the state at the start of that step:
 * parameters, buffers, optimizer, scaler, dropout counter, accumulation) and waits for the device. Both
 * generations stay as they are. Returns 0; -ENOENT when no generation holds `step`, the message naming the
 * steps held, the live state untouched; or the device's error (the live state then partly restored: restore
 * again or give up). */
int wgen_restore(wgen *g, int64_t step);

/* The steps held, for messages: *n (0..2) of them in steps[0..n), ascending. */
void wgen_steps(const wgen *g, int64_t steps[2], int *n);

/* Bytes one wgen_keep copies at step `step` (device arrays and host state; the accumulation sums counted at
 * their capacity), and bytes allocated for both generations (device + host). */
size_t wgen_keep_bytes(const wgen *g, int64_t step);
size_t wgen_alloc_bytes(const wgen *g);

#endif
