/* Dynamic loss scaling: torch.amp.GradScaler's update rule (see loss_scale.h). */
#include "worker/loss_scale.h"

#include <math.h>

#include "common/err.h"

int loss_scaler_init(loss_scaler *s, float init_scale, int growth_interval)
{
    if (!(isfinite(init_scale) && init_scale > 0.0f) || growth_interval < 1)
        return pf_err(-EINVAL, "loss scaler: init scale %g must be finite and > 0, growth interval %d >= 1",
                      (double)init_scale, growth_interval);
    s->scale = init_scale;
    s->growth_tracker = 0;
    s->growth_factor = 2.0f;
    s->backoff_factor = 0.5f;
    s->growth_interval = growth_interval;
    return 0;
}

int loss_scaler_update(loss_scaler *s, int found_inf)
{
    if (found_inf) {
        s->scale *= s->backoff_factor;
        s->growth_tracker = 0;
        return 0;
    }
    int successful = s->growth_tracker + 1;
    if (successful == s->growth_interval) {
        float grown = s->scale * s->growth_factor;
        if (isfinite(grown))
            s->scale = grown;
        s->growth_tracker = 0;
    } else {
        s->growth_tracker = successful;
    }
    return 1;
}
