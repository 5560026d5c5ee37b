/* Dynamic loss scaling, host state machine (runs without a GPU): torch.amp.GradScaler's rule
 * written out step by step here (init 2^16, x2 after growth_interval finite steps, x0.5 and tracker
 * reset on a non-finite step, growth kept back when the grown scale would overflow) and bad init
 * values refused. */
#include <math.h>
#include <stdio.h>

#include "common/err.h"
#include "tests/check.h"
#include "worker/loss_scale.h"

static void expect(const loss_scaler *s, int applied, int want_applied, float want_scale, int want_tracker,
                   const char *what)
{
    check(applied == want_applied && s->scale == want_scale && s->growth_tracker == want_tracker,
          "%-40s applied %d scale %-10g tracker %d (expected %d %g %d)", what, applied, (double)s->scale,
          s->growth_tracker, want_applied, (double)want_scale, want_tracker);
}

int main(void)
{
    loss_scaler s;
    if (loss_scaler_init(&s, 65536.0f, 3))
        DIE("init");
    int a;
    a = loss_scaler_update(&s, 0);
    expect(&s, a, 1, 65536.0f, 1, "finite step 1");
    a = loss_scaler_update(&s, 0);
    expect(&s, a, 1, 65536.0f, 2, "finite step 2");
    a = loss_scaler_update(&s, 0);
    expect(&s, a, 1, 131072.0f, 0, "finite step 3: grow x2");
    a = loss_scaler_update(&s, 0);
    expect(&s, a, 1, 131072.0f, 1, "finite step 4");
    a = loss_scaler_update(&s, 1);
    expect(&s, a, 0, 65536.0f, 0, "inf: skip, back off x0.5");
    a = loss_scaler_update(&s, 1);
    expect(&s, a, 0, 32768.0f, 0, "inf again");
    a = loss_scaler_update(&s, 0);
    expect(&s, a, 1, 32768.0f, 1, "finite after inf");
    loss_scaler big;
    loss_scaler_init(&big, 3e38f, 1);
    a = loss_scaler_update(&big, 0);
    expect(&big, a, 1, 3e38f, 0, "growth to inf held back");
    int rc1 = loss_scaler_init(&big, 0.0f, 100), rc2 = loss_scaler_init(&big, NAN, 100),
        rc3 = loss_scaler_init(&big, 1.0f, 0);
    check(rc1 == -EINVAL && rc2 == -EINVAL && rc3 == -EINVAL,
          "init scale 0 / NaN / interval 0 refused: %d %d %d (%s)", rc1, rc2, rc3, pf_errmsg());
    return check_summary();
}
