/* arcface_torch's learning-rate schedules: see lr_schedule.h. */
#include "worker/lr_schedule.h"

#include <math.h>
#include <string.h>

#include "common/err.h"

int lr_schedule_steps(int64_t num_image, int64_t total_batch, int num_epoch, double warmup_epoch,
                      double *warmup_steps, int64_t *total_steps)
{
    if (num_image <= 0 || total_batch <= 0 || num_epoch <= 0)
        return pf_err(-EINVAL, "lr schedule: num_image %lld, total batch %lld, num_epoch %d must be positive",
                      (long long)num_image, (long long)total_batch, num_epoch);
    if (!isfinite(warmup_epoch))
        return pf_err(-EINVAL, "lr schedule: warmup_epoch %g is not a finite number", warmup_epoch);
    int64_t per_epoch = num_image / total_batch;
    if (per_epoch == 0)
        return pf_err(-EINVAL, "lr schedule: num_image %lld is smaller than the total batch %lld",
                      (long long)num_image, (long long)total_batch);
    double w = (double)per_epoch * warmup_epoch;
    int64_t t = per_epoch * num_epoch;
    if (w > 0 && w >= (double)t)
        return pf_err(-EINVAL, "lr schedule: warmup %g steps is not shorter than the %lld total steps", w,
                      (long long)t);
    *warmup_steps = w;
    *total_steps = t;
    return 0;
}

double lr_poly(double base_lr, int64_t t, double warmup_steps, int64_t total_steps)
{
    if (t < 0)
        t = 0;
    if ((double)t < warmup_steps)
        return base_lr * (double)t / warmup_steps;
    if (t >= total_steps)
        return 0.0;
    double a = 1.0 - ((double)t - warmup_steps) / ((double)total_steps - warmup_steps);
    return base_lr * a * a;
}

double lr_polynomial_warmup_next(double lr, double base_lr, int64_t l, double warmup_steps,
                                 int64_t total_steps, double power)
{
    if (l <= 0 || l > total_steps)
        return lr;
    const double ld = (double)l, w = warmup_steps, span = (double)total_steps - w;
    if (ld <= w)
        return base_lr * ld / w;
    /* Python: (l - w) and (l - 1 - w) are exact (integers, or a double w minus an integer below 2^53). */
    double f = (1.0 - (ld - w) / span) / (1.0 - ((double)(l - 1) - w) / span);
    return lr * pow(f, power);
}

double lr_polynomial_warmup(double base_lr, int64_t n, double warmup_steps, int64_t total_steps, double power)
{
    double lr = base_lr;
    for (int64_t l = 1; l <= n; l++)
        lr = lr_polynomial_warmup_next(lr, base_lr, l, warmup_steps, total_steps, power);
    return lr;
}

int lr_scheduler_parse(const char *name, lr_scheduler_kind *kind)
{
    if (!strcmp(name, "polynomial_lr_warmup"))
        *kind = LR_POLYNOMIAL_WARMUP;
    else if (!strcmp(name, "poly_scheduler"))
        *kind = LR_POLY_SCHEDULER;
    else
        return pf_err(-EINVAL, "key 'lr_scheduler': unknown schedule '%s' (polynomial_lr_warmup, poly_scheduler)",
                      name);
    return 0;
}

void lr_schedule_init(lr_schedule *s, lr_scheduler_kind kind, double base_lr, double warmup_steps,
                      int64_t total_steps)
{
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->base_lr = base_lr;
    s->warmup_steps = warmup_steps;
    s->total_steps = total_steps;
    s->power = kind == LR_POLY_SCHEDULER ? 2.0 : 1.0;
    s->last = 0;
    s->lr = base_lr;
}

double lr_schedule_at(lr_schedule *s, int64_t step)
{
    if (s->kind == LR_POLY_SCHEDULER)
        return lr_poly(s->base_lr, step, s->warmup_steps, s->total_steps);
    if (step < 0)
        step = 0;
    if (step < s->last) {
        s->last = 0;
        s->lr = s->base_lr;
    }
    while (s->last < step) {
        s->last++;
        s->lr = lr_polynomial_warmup_next(s->lr, s->base_lr, s->last, s->warmup_steps, s->total_steps, s->power);
    }
    return s->lr;
}
