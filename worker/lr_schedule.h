/* arcface_torch's learning-rate schedules (lr_scheduler.py, lengths from train_v2.py): PolynomialLRWarmup
 * (today's train_v2.py: linear warmup, then linear decay computed as a running product; pfcps's default)
 * and the older PolyScheduler (linear warmup, then polynomial decay with power 2; config
 * `lr_scheduler = poly_scheduler`). */
#ifndef PFCPS_WORKER_LR_SCHEDULE_H
#define PFCPS_WORKER_LR_SCHEDULE_H

#include <stdint.h>

/* arcface_torch's schedule lengths (train_v2.py):
 *   warmup_steps = floor(num_image / total_batch) * warmup_epoch,  total_steps = floor(num_image /
 *   total_batch) * num_epoch  (warmup_epoch may be fractional: like Python, warmup_steps is then a
 *   fractional number of steps and stays a double; it may be negative, as 3millions.py's -1: no warmup)
 * Returns 0 or -EINVAL (num_image, total_batch, num_epoch not positive, warmup_epoch not finite,
 * warmup_steps >= total_steps while warmup is on). */
int lr_schedule_steps(int64_t num_image, int64_t total_batch, int num_epoch, double warmup_epoch,
                      double *warmup_steps, int64_t *total_steps);

/* arcface_torch PolyScheduler.get_lr() at last_epoch = t (t >= 0): linear warmup then polynomial decay
 * with power 2:
 *   t < warmup:  base_lr * t / warmup
 *   else:        base_lr * (1 - (t - warmup) / (total - warmup))^2,   0 for t >= total
 * In arcface_torch the lr used by optimizer step g (1-based) is get_lr(max(g - 2, 0)) (the scheduler's
 * constructor sets get_lr(0), resets last_epoch to -1, and step() is called after each optimizer step), and
 * the logged lr at global step g is get_lr(g - 1). Under `lr_scheduler = poly_scheduler` pfcps uses
 * lr(t = g - 1) for step g: the value arcface_torch logs. */
double lr_poly(double base_lr, int64_t t, double warmup_steps, int64_t total_steps);

/* One step of arcface_torch's PolynomialLRWarmup (lr_scheduler.py, get_lr, as _LRScheduler.step runs it):
 * the group's lr after scheduler step l (l >= 0), given `lr`, the group's lr after step l - 1 (for l = 0,
 * the optimizer's lr, base_lr):
 *   l == 0 or l > total:  lr (unchanged)
 *   l <= warmup:          base_lr * l / warmup
 *   else:                 lr * ((1.0 - (l - warmup) / (total - warmup)) /
 *                               (1.0 - (l - 1 - warmup) / (total - warmup))) ** power
 * in double, in that operation order (Python's). warmup <= 0 never takes the warmup branch for l >= 1: the
 * product then telescopes to base_lr * (1 - l / total)^power. */
double lr_polynomial_warmup_next(double lr, double base_lr, int64_t l, double warmup_steps,
                                 int64_t total_steps, double power);

/* PolynomialLRWarmup's lr after n scheduler steps (n >= 0; n < 0 is taken as 0), computed from the start:
 * lr_polynomial_warmup_next for l = 0 .. n. In train_v2.py the constructor takes step 0 and every optimizer
 * step is followed by one scheduler step, so optimizer step g (1-based) runs at the value for n = g - 1:
 * base_lr at step 1. O(n). */
double lr_polynomial_warmup(double base_lr, int64_t n, double warmup_steps, int64_t total_steps, double power);

/* The schedules config key `lr_scheduler` names. */
typedef enum {
    LR_POLYNOMIAL_WARMUP = 0, /* "polynomial_lr_warmup": PolynomialLRWarmup, power 1 (default) */
    LR_POLY_SCHEDULER = 1,    /* "poly_scheduler": PolyScheduler, power 2, as lr_poly */
} lr_scheduler_kind;

/* The kind named by `name` ("polynomial_lr_warmup" or "poly_scheduler"). Returns 0 or -EINVAL naming the
 * value and the key. */
int lr_scheduler_parse(const char *name, lr_scheduler_kind *kind);

/* A run's schedule: the kind, its constants, and (PolynomialLRWarmup) the running product's state. */
typedef struct lr_schedule {
    lr_scheduler_kind kind;
    double base_lr, warmup_steps, power;
    int64_t total_steps;
    int64_t last; /* PolynomialLRWarmup: scheduler steps taken so far (last_epoch) */
    double lr;    /* PolynomialLRWarmup: the group's lr after `last` steps */
} lr_schedule;

/* Sets *s to `kind` with base_lr, warmup_steps and total_steps (lr_schedule_steps), power 1 for
 * PolynomialLRWarmup (train_v2.py does not pass one) and 2 for PolyScheduler. */
void lr_schedule_init(lr_schedule *s, lr_scheduler_kind kind, double base_lr, double warmup_steps,
                      int64_t total_steps);

/* The lr of 0-based step `step` (global step step + 1): PolynomialLRWarmup's value after `step` scheduler
 * steps (lr_polynomial_warmup, the same doubles), or lr_poly(step). Advances the running product from its
 * last call, so a loop over increasing steps costs O(1) per step; an earlier step restarts it from 0. */
double lr_schedule_at(lr_schedule *s, int64_t step);

#endif
