/* The verification protocol (worker/eval/verify.c) against an independent implementation: this
 * program draws embeddings (same pairs closer by a per-pair amount, so the squared distances of the
 * normalised rows spread over [0, 4]), writes them with eval_npy_write_f32 (which numpy then reads),
 * runs eval_verify and writes its numbers to results.txt; verify_ref.py recomputes them with numpy and
 * scikit-learn's KFold from the protocol's description (arcface_torch eval/verification.py) and compares
 * to 1e-6: accuracy mean and std, every fold's best threshold, XNorm. Cases: 10 folds with flip, folds
 * that do not divide N, one fold (verification.py's LFold: train = test), one pair per fold. Also the
 * argument refusals. Needs PFCPS_PYTHON (exit 77 without). */
#include "tests/check.h"
#include "tests/reference/ref.h"
#include "worker/eval/embed.h"
#include "worker/eval/verify.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double gauss(void)
{
    double u = (rnd() >> 11) * 0x1.0p-53 + 1e-300, v = (rnd() >> 11) * 0x1.0p-53;
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

typedef struct vcase {
    const char *name;
    int n, d, folds, flip;
} vcase;

int main(void)
{
    const char *py, *src = getenv("PFCPS_SOURCE");
    int missing = ref_python(&py);
    if (missing)
        return missing;
    if (!src) {
        printf("FAIL: PFCPS_SOURCE not set (tests/meson.build sets it)\n");
        return 1;
    }
    char dir[] = "/tmp/pfcps-verify-XXXXXX", p[4200], cmd[8192];
    if (!mkdtemp(dir))
        return 1;
    rng_state = 0x5eed1234abcdULL;
    const vcase cases[] = {
        {"flip10", 600, 16, 10, 1}, {"uneven", 97, 8, 10, 0},  {"onefold", 50, 8, 1, 1},
        {"perpair", 13, 4, 13, 0},  {"wide", 1000, 64, 10, 1},
    };
    snprintf(p, sizeof p, "%s/results.txt", dir);
    FILE *res = fopen(p, "w");
    if (!res)
        return 1;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const vcase *v = &cases[c];
        float *e = malloc(2 * (size_t)v->n * v->d * sizeof(float)),
              *f = malloc(2 * (size_t)v->n * v->d * sizeof(float));
        uint8_t *same = malloc((size_t)v->n);
        float *iss = malloc((size_t)v->n * sizeof(float));
        for (int i = 0; i < v->n; i++) {
            same[i] = (rnd() & 1) != 0;
            iss[i] = same[i];
            double noise = same[i] ? 0.05 + 1.5 * ((rnd() >> 11) * 0x1.0p-53) : 0;
            double scale = 0.5 + 20 * ((rnd() >> 11) * 0x1.0p-53);
            for (int k = 0; k < v->d; k++) {
                double a = gauss();
                e[(2 * (size_t)i) * v->d + k] = (float)(scale * a);
                e[(2 * (size_t)i + 1) * v->d + k] =
                    (float)(scale * (same[i] ? a + noise * gauss() : gauss()));
            }
        }
        for (size_t k = 0; k < 2 * (size_t)v->n * v->d; k++)
            f[k] = e[k] * 0.8f + (float)(0.3 * gauss());
        int ok = 1;
        snprintf(p, sizeof p, "%s/%s_emb.npy", dir, v->name);
        ok &= eval_npy_write_f32(p, e, 2 * v->n, v->d) == 0;
        snprintf(p, sizeof p, "%s/%s_flip.npy", dir, v->name);
        ok &= eval_npy_write_f32(p, f, 2 * v->n, v->d) == 0;
        snprintf(p, sizeof p, "%s/%s_issame.npy", dir, v->name);
        ok &= eval_npy_write_f32(p, iss, v->n, 1) == 0;
        CHECK(ok, "%s: writing the .npy files: %s", v->name, pf_errmsg());
        eval_result r;
        int rc = eval_verify(e, v->flip ? f : NULL, v->n, v->d, same, v->folds, &r);
        CHECK(rc == 0, "%s: %s", v->name, pf_errmsg());
        fprintf(res, "%s %d %d %.17g %.17g %.17g", v->name, v->folds, v->flip, r.acc_mean, r.acc_std,
                r.xnorm);
        for (int k = 0; k < r.folds; k++)
            fprintf(res, " %.17g", r.fold_threshold[k]);
        fprintf(res, "\n");
        printf("%s: N %d, D %d, %d folds, flip %d: accuracy %.5f+-%.5f, xnorm %.4f, threshold %.2f\n",
               v->name, v->n, v->d, v->folds, v->flip, r.acc_mean, r.acc_std, r.xnorm, r.threshold_mean);
        /* argument refusals */
        if (c == 0) {
            CHECK(eval_verify(e, NULL, v->n, v->d, same, 0, &r) == -EINVAL && strstr(pf_errmsg(), "folds 0"),
                  "folds 0: %s", pf_errmsg());
            CHECK(eval_verify(e, NULL, 5, v->d, same, 10, &r) == -EINVAL, "folds > N accepted");
            CHECK(eval_verify(e, NULL, 0, v->d, same, 1, &r) == -EINVAL, "N 0 accepted");
            float keep = e[3];
            e[3] = NAN;
            CHECK(eval_verify(e, NULL, v->n, v->d, same, 10, &r) == -EINVAL &&
                      strstr(pf_errmsg(), "not finite"),
                  "NaN: %s", pf_errmsg());
            e[3] = keep;
        }
        free(e);
        free(f);
        free(same);
        free(iss);
    }
    fclose(res);
    snprintf(cmd, sizeof cmd, "'%s' '%s/tests/worker/eval/verify_ref.py' '%s'", py, src, dir);
    int st = system(cmd);
    if (st != 0) {
        if (WIFEXITED(st) && WEXITSTATUS(st) == 77)
            return ref_missing("verify_ref.py: %s lacks numpy or scikit-learn", py);
        CHECK(0, "verify_ref.py: exit status %d", st);
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        printf("note: could not remove %s\n", dir);
    printf("%s\n", fails ? "FAIL" : "ok");
    return fails != 0;
}
