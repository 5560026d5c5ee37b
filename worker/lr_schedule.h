/* arcface_torch's learning-rate schedule (PolyScheduler in lr_scheduler.py, lengths from train_v2.py): linear
 * warmup, then polynomial decay with power 2. */
#ifndef PFCPS_WORKER_LR_SCHEDULE_H
#define PFCPS_WORKER_LR_SCHEDULE_H

#include <stdint.h>

/* arcface_torch's schedule lengths (train_v2.py):
 *   warmup_steps = floor(num_image / total_batch) * warmup_epoch,  total_steps = floor(num_image /
 *   total_batch) * num_epoch  (warmup_epoch may be fractional: like Python, warmup_steps is then a
 *   fractional number of steps and stays a double)
 * Returns 0 or -EINVAL (num_image, total_batch, num_epoch not positive, warmup_epoch negative,
 * warmup_steps >= total_steps while warmup is on). */
int lr_schedule_steps(int64_t num_image, int64_t total_batch, int num_epoch, double warmup_epoch,
                      double *warmup_steps, int64_t *total_steps);

/* arcface_torch PolyScheduler.get_lr() at last_epoch = t (t >= 0): linear warmup then polynomial decay
 * with power 2:
 *   t < warmup:  base_lr * t / warmup
 *   else:        base_lr * (1 - (t - warmup) / (total - warmup))^2,   0 for t >= total
 * In arcface_torch the lr used by optimizer step g (1-based) is get_lr(max(g - 2, 0)) (the scheduler's
 * constructor sets get_lr(0) and step() is called after each optimizer step), and the logged lr at
 * global step g is get_lr(g - 1). pfcps uses lr(t = g - 1) for step g: the value arcface_torch logs. */
double lr_poly(double base_lr, int64_t t, double warmup_steps, int64_t total_steps);

#endif
