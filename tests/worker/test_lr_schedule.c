/* arcface_torch's PolyScheduler and schedule lengths (worker/lr_schedule.h) against values computed by hand.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "worker/lr_schedule.h"

#include "tests/check.h"

static void test_schedule(void)
{
    double w;
    int64_t t;
    /* 10000 images, 2 workers x 64: 78 steps per epoch; 20 epochs, 1 warmup epoch. */
    CHECK(lr_schedule_steps(10000, 128, 20, 1.0, &w, &t) == 0 && w == 78 && t == 1560, "steps %g %lld", w,
          (long long)t);
    double lr0 = lr_poly(0.1, 0, w, t), lr39 = lr_poly(0.1, 39, w, t), lr78 = lr_poly(0.1, 78, w, t);
    double lrmid = lr_poly(0.1, 78 + 741, w, t), lrend = lr_poly(0.1, 1560, w, t);
    double lrlast = lr_poly(0.1, 1559, w, t);
    CHECK(lr0 == 0 && fabs(lr39 - 0.05) < 1e-15 && fabs(lr78 - 0.1) < 1e-15 && fabs(lrmid - 0.025) < 1e-15 &&
              lrend == 0 && fabs(lrlast - 0.1 / (1482.0 * 1482.0)) < 1e-18,
          "poly lr: %g %g %g %g %g %g", lr0, lr39, lr78, lrmid, lrend, lrlast);
    printf(
        "ok   PolyScheduler 10000 img / 128 / 20 ep / 1 warmup: steps %g/%lld, lr(0)=%g lr(39)=%g lr(78)=%g "
        "lr(819)=%g lr(1559)=%.3e lr(1560)=%g\n",
        w, (long long)t, lr0, lr39, lr78, lrmid, lrlast, lrend);
    /* No warmup: lr(0) = base, halfway (780) = base/4. Fractional warmup 0.5 epoch = 39 steps. */
    CHECK(lr_schedule_steps(10000, 128, 20, 0, &w, &t) == 0 && w == 0, "no warmup");
    CHECK(lr_poly(0.1, 0, w, t) == 0.1 && fabs(lr_poly(0.1, 780, w, t) - 0.025) < 1e-15, "no warmup lr");
    CHECK(lr_schedule_steps(10000, 128, 20, 0.5, &w, &t) == 0 && w == 39, "half warmup %g", w);
    CHECK(fabs(lr_poly(0.1, 13, w, t) - 0.1 / 3) < 1e-15, "half warmup lr(13) %g", lr_poly(0.1, 13, w, t));
    /* Bad input. */
    CHECK(lr_schedule_steps(100, 128, 20, 0, &w, &t) == -EINVAL && strstr(pf_errmsg(), "smaller"),
          "num_image < batch: %s", pf_errmsg());
    CHECK(lr_schedule_steps(10000, 128, 2, 3, &w, &t) == -EINVAL && strstr(pf_errmsg(), "warmup"),
          "warmup >= total: %s", pf_errmsg());
    CHECK(lr_schedule_steps(10000, 0, 2, 0, &w, &t) == -EINVAL, "batch 0 accepted");
    printf("ok   schedule bad input: %s\n", pf_errmsg());
}

int main(void)
{
    test_schedule();
    printf("%s (%d failures)\n", fails ? "FAIL" : "PASS", fails);
    return fails ? 1 : 0;
}
