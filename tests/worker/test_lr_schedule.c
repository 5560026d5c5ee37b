/* arcface_torch's schedules (worker/lr_schedule.h) against values computed by hand: PolynomialLRWarmup
 * (train_v2.py's, the default) from lr_scheduler.py's get_lr and _LRScheduler's constructor step, the older
 * PolyScheduler (lr_scheduler = poly_scheduler) from its closed form, and the schedule lengths. The exact
 * doubles of PolynomialLRWarmup against torch's own scheduler base class: tests/deploy/local/test_lr_torch.sh.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "worker/lr_schedule.h"

#include "tests/check.h"

/* lr of steps 1 .. n (the value after g - 1 scheduler steps) through lr_schedule_at, against want[]. */
static void check_steps(const char *what, double base, double w, int64_t t, const double *want, int n)
{
    lr_schedule s;
    lr_schedule_init(&s, LR_POLYNOMIAL_WARMUP, base, w, t);
    int bad = 0;
    for (int g = 1; g <= n; g++) {
        double lr = lr_schedule_at(&s, g - 1);
        if (!(fabs(lr - want[g - 1]) <= 1e-16)) {
            CHECK(0, "%s: step %d lr %.17g, want %.17g", what, g, lr, want[g - 1]);
            bad = 1;
        }
        double scratch = lr_polynomial_warmup(base, g - 1, w, t, 1.0);
        CHECK(scratch == lr, "%s: step %d from scratch %.17g, running %.17g", what, g, scratch, lr);
    }
    if (!bad)
        printf("ok   %s: %d steps (%.6g %.6g %.6g %.6g ...)\n", what, n, want[0], want[1], want[2], want[3]);
}

static void test_polynomial_warmup(void)
{
    /* Warmup 2 of 12 steps at 0.1: step 1 at base (the constructor's step leaves the group's lr), steps 2-3
     * warm up (0.1 * 1/2, 0.1 * 2/2), then 0.1 * (1 - (g - 3)/10). */
    const double a[12] = {0.1, 0.05, 0.1, 0.09, 0.08, 0.07, 0.06, 0.05, 0.04, 0.03, 0.02, 0.01};
    check_steps("PolynomialLRWarmup w 2 t 12", 0.1, 2, 12, a, 12);
    /* Exact where the arithmetic is: 0.1 * 1 / 2 and 0.1 * 2 / 2 in double; 0.1 * (0.9 / 1.0) is
     * 0.09000000000000001 in double (0.1 * 0.9), the running product's value, not 0.09. */
    CHECK(lr_polynomial_warmup(0.1, 1, 2, 12, 1) == 0.05 && lr_polynomial_warmup(0.1, 2, 2, 12, 1) == 0.1,
          "warmup values not exact");
    CHECK(lr_polynomial_warmup(0.1, 3, 2, 12, 1) == 0.1 * 0.9 && 0.1 * 0.9 != 0.09, "step 4: %.17g",
          lr_polynomial_warmup(0.1, 3, 2, 12, 1));
    /* After total steps: 0 at l = t (1 - (t - w)/(t - w) = 0), then unchanged (l > t). */
    CHECK(lr_polynomial_warmup(0.1, 12, 2, 12, 1) == 0 && lr_polynomial_warmup(0.1, 40, 2, 12, 1) == 0,
          "past the end: %g", lr_polynomial_warmup(0.1, 40, 2, 12, 1));
    /* warmup_epoch -1 (3millions.py: w = -steps per epoch, here -12... any w <= 0) and w = 0: no warmup
     * branch, the product telescopes to 0.1 * (1 - (g - 1)/12). */
    double b[6];
    for (int g = 1; g <= 6; g++)
        b[g - 1] = 0.1 * (12.0 - (g - 1)) / 12.0;
    check_steps("PolynomialLRWarmup w -12 t 12", 0.1, -12, 12, b, 6);
    check_steps("PolynomialLRWarmup w 0 t 12", 0.1, 0, 12, b, 6);
    /* Fractional warmup 2.5: 0.1 * 1/2.5, 0.1 * 2/2.5, then 0.08 * (1 - 0.5/9.5)/(1 + 0.5/9.5) = 0.08 * 0.9,
     * then 0.072 * (1 - 1.5/9.5)/(1 - 0.5/9.5) = 0.072 * 8/9: it never reaches base. */
    const double c[5] = {0.1, 0.04, 0.08, 0.072, 0.064};
    check_steps("PolynomialLRWarmup w 2.5 t 12", 0.1, 2.5, 12, c, 5);
    /* The running state goes back when asked for an earlier step (a resumed run starts anywhere). */
    lr_schedule s;
    lr_schedule_init(&s, LR_POLYNOMIAL_WARMUP, 0.1, 2, 12);
    double late = lr_schedule_at(&s, 9), early = lr_schedule_at(&s, 1), again = lr_schedule_at(&s, 9);
    CHECK(fabs(late - 0.03) < 1e-16 && early == 0.05 && again == late, "restart: %g %g %g", late, early, again);
    /* Power 2 (a PolynomialLRWarmup argument train_v2.py leaves at 1): w 0, t 4: (3/4)^2, then
     * (3/4)^2 * ((2/4)/(3/4))^2 = (2/4)^2. */
    CHECK(fabs(lr_polynomial_warmup(1, 1, 0, 4, 2) - 0.5625) < 1e-16 &&
              fabs(lr_polynomial_warmup(1, 2, 0, 4, 2) - 0.25) < 1e-16,
          "power 2: %g %g", lr_polynomial_warmup(1, 1, 0, 4, 2), lr_polynomial_warmup(1, 2, 0, 4, 2));
    lr_scheduler_kind k;
    CHECK(lr_scheduler_parse("polynomial_lr_warmup", &k) == 0 && k == LR_POLYNOMIAL_WARMUP, "parse default");
    CHECK(lr_scheduler_parse("poly_scheduler", &k) == 0 && k == LR_POLY_SCHEDULER, "parse poly_scheduler");
    CHECK(lr_scheduler_parse("cosine", &k) == -EINVAL && strstr(pf_errmsg(), "'cosine'") &&
              strstr(pf_errmsg(), "lr_scheduler"),
          "parse cosine: %s", pf_errmsg());
}

static void test_poly_scheduler(void)
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
    /* lr_schedule_at under poly_scheduler is lr_poly of the step: warmup 2 of 12 gives 0, 0.05, 0.1, 0.081. */
    lr_schedule s;
    lr_schedule_init(&s, LR_POLY_SCHEDULER, 0.1, 2, 12);
    CHECK(lr_schedule_at(&s, 0) == 0 && lr_schedule_at(&s, 1) == 0.05 && lr_schedule_at(&s, 2) == 0.1 &&
              fabs(lr_schedule_at(&s, 3) - 0.081) < 1e-16,
          "poly_scheduler steps: %g %g %g %g", lr_schedule_at(&s, 0), lr_schedule_at(&s, 1),
          lr_schedule_at(&s, 2), lr_schedule_at(&s, 3));
    printf(
        "ok   PolyScheduler 10000 img / 128 / 20 ep / 1 warmup: steps %g/%lld, lr(0)=%g lr(39)=%g lr(78)=%g "
        "lr(819)=%g lr(1559)=%.3e lr(1560)=%g\n",
        w, (long long)t, lr0, lr39, lr78, lrmid, lrlast, lrend);
    /* No warmup: lr(0) = base, halfway (780) = base/4. Fractional warmup 0.5 epoch = 39 steps. */
    CHECK(lr_schedule_steps(10000, 128, 20, 0, &w, &t) == 0 && w == 0, "no warmup");
    CHECK(lr_poly(0.1, 0, w, t) == 0.1 && fabs(lr_poly(0.1, 780, w, t) - 0.025) < 1e-15, "no warmup lr");
    CHECK(lr_schedule_steps(10000, 128, 20, 0.5, &w, &t) == 0 && w == 39, "half warmup %g", w);
    CHECK(fabs(lr_poly(0.1, 13, w, t) - 0.1 / 3) < 1e-15, "half warmup lr(13) %g", lr_poly(0.1, 13, w, t));
    /* warmup_epoch -1 (3millions.py): 100000 images / 512 = 195 steps per epoch, w = -195, t = 5850. */
    CHECK(lr_schedule_steps(100000, 512, 30, -1, &w, &t) == 0 && w == -195 && t == 5850, "warmup -1: %g %lld",
          w, (long long)t);
    /* Bad input. */
    CHECK(lr_schedule_steps(100, 128, 20, 0, &w, &t) == -EINVAL && strstr(pf_errmsg(), "smaller"),
          "num_image < batch: %s", pf_errmsg());
    CHECK(lr_schedule_steps(10000, 128, 2, 3, &w, &t) == -EINVAL && strstr(pf_errmsg(), "warmup"),
          "warmup >= total: %s", pf_errmsg());
    CHECK(lr_schedule_steps(10000, 128, 2, NAN, &w, &t) == -EINVAL && strstr(pf_errmsg(), "warmup_epoch"),
          "warmup NaN: %s", pf_errmsg());
    CHECK(lr_schedule_steps(10000, 0, 2, 0, &w, &t) == -EINVAL, "batch 0 accepted");
    printf("ok   schedule bad input: %s\n", pf_errmsg());
}

int main(void)
{
    test_polynomial_warmup();
    test_poly_scheduler();
    printf("%s (%d failures)\n", fails ? "FAIL" : "PASS", fails);
    return fails ? 1 : 0;
}
