/* Dynamic loss scaling for mixed-precision training: torch.amp.GradScaler's update rule (arcface_torch uses
 * init scale 2^16 and growth_interval 100). The loss (here: the embedding gradient) is multiplied by `scale`
 * before the backward; the backbone gradients are unscaled (times 1/scale) and checked; a step with a
 * non-finite gradient is skipped and the scale multiplied by backoff_factor (0.5), else after growth_interval
 * consecutive good steps the scale is multiplied by growth_factor (2). Host state only: the gradient check
 * runs on the device (ops_device.sumsq), so one scaler serves every device.
 * The struct is the state a checkpoint saves (scale, growth_tracker). */
#ifndef PFCPS_WORKER_LOSS_SCALE_H
#define PFCPS_WORKER_LOSS_SCALE_H

typedef struct loss_scaler {
    float scale;          /* init 65536 (2^16) */
    int growth_tracker;   /* consecutive finite steps since the last change */
    float growth_factor;  /* 2 */
    float backoff_factor; /* 0.5 */
    int growth_interval;  /* 2000 in torch, 100 in arcface_torch */
} loss_scaler;

/* Fills the torch defaults with the given init scale and growth interval. Returns 0 or -EINVAL
 * (init_scale not finite and > 0, growth_interval < 1). */
int loss_scaler_init(loss_scaler *s, float init_scale, int growth_interval);

/* torch's _amp_update_scale_ after one step: found_inf != 0 -> scale *= backoff, tracker 0;
 * else tracker + 1, and at growth_interval scale *= growth (kept when that is not finite), tracker 0.
 * Returns 1 when the optimizer step should be applied (found_inf == 0), else 0. */
int loss_scaler_update(loss_scaler *s, int found_inf);

#endif
