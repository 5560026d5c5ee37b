/* arcface_torch's learning-rate schedule: see lr_schedule.h. */
#include "worker/lr_schedule.h"

#include "common/err.h"

int lr_schedule_steps(int64_t num_image, int64_t total_batch, int num_epoch, double warmup_epoch,
                      double *warmup_steps, int64_t *total_steps)
{
    if (num_image <= 0 || total_batch <= 0 || num_epoch <= 0)
        return pf_err(-EINVAL, "lr schedule: num_image %lld, total batch %lld, num_epoch %d must be positive",
                      (long long)num_image, (long long)total_batch, num_epoch);
    if (!(warmup_epoch >= 0))
        return pf_err(-EINVAL, "lr schedule: warmup_epoch %g is negative", warmup_epoch);
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
