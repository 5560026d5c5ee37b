/* arcface_torch's verification protocol (see verify.h). */
#include "worker/eval/verify.h"

#include "common/err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The first threshold index j with dist < j * 0.01 (EVAL_THRESHOLDS when none): the pair is predicted
 * "same" at every threshold index >= j. The thresholds are computed as np.arange does (j * step). */
static int first_threshold(double dist)
{
    if (!(dist >= 0))
        return 0; /* not reached: dist is finite and >= 0 */
    double q = dist / EVAL_THRESHOLD_STEP;
    int j = q >= EVAL_THRESHOLDS ? EVAL_THRESHOLDS : (int)q;
    while (j < EVAL_THRESHOLDS && !(dist < j * EVAL_THRESHOLD_STEP))
        j++;
    while (j > 0 && dist < (j - 1) * EVAL_THRESHOLD_STEP)
        j--;
    return j;
}

int eval_verify(const float *emb, const float *emb_flip, int64_t n_pairs, int d, const uint8_t *issame,
                int folds, eval_result *out)
{
    memset(out, 0, sizeof *out);
    if (n_pairs < 1 || d < 1)
        return pf_err(-EINVAL, "verification needs at least one pair (got %lld) and D >= 1 (got %d)",
                      (long long)n_pairs, d);
    if (folds < 1 || folds > EVAL_MAX_FOLDS || folds > n_pairs)
        return pf_err(-EINVAL, "folds %d: needs 1 <= folds <= min(pairs %lld, %d)", folds, (long long)n_pairs,
                      EVAL_MAX_FOLDS);
    /* per pair: the first threshold index predicting "same" */
    int *first = malloc((size_t)n_pairs * sizeof *first);
    /* per fold: counts of same / different pairs by first-threshold index (EVAL_THRESHOLDS + 1 bins) */
    int64_t *hs = calloc((size_t)folds * (EVAL_THRESHOLDS + 1), sizeof *hs);
    int64_t *hd = calloc((size_t)folds * (EVAL_THRESHOLDS + 1), sizeof *hd);
    double *row = malloc(2 * (size_t)d * sizeof *row);
    int rc = 0;
    if (!first || !hs || !hd || !row) {
        rc = pf_err(-ENOMEM, "out of memory for %lld pairs", (long long)n_pairs);
        goto out;
    }
    double xsum = 0;
    for (int64_t i = 0; i < n_pairs; i++) {
        for (int k = 0; k < 2; k++) {
            const float *e = emb + (size_t)(2 * i + k) * (size_t)d;
            const float *f = emb_flip ? emb_flip + (size_t)(2 * i + k) * (size_t)d : NULL;
            double *r = row + (size_t)k * (size_t)d;
            double ne = 0, nf = 0, nr = 0;
            for (int c = 0; c < d; c++) {
                if (!isfinite(e[c]) || (f && !isfinite(f[c]))) {
                    rc = pf_err(-EINVAL, "embedding of image %lld%s is not finite (component %d)",
                                (long long)(2 * i + k), f && !isfinite(f[c]) ? " (flipped)" : "", c);
                    goto out;
                }
                ne += (double)e[c] * e[c];
                r[c] = e[c];
                if (f) {
                    nf += (double)f[c] * f[c];
                    r[c] += f[c];
                }
                nr += r[c] * r[c];
            }
            xsum += sqrt(ne) + (f ? sqrt(nf) : 0);
            nr = sqrt(nr);
            if (nr > 0)
                for (int c = 0; c < d; c++)
                    r[c] /= nr;
        }
        double dist = 0;
        for (int c = 0; c < d; c++) {
            double t = row[c] - row[d + c];
            dist += t * t;
        }
        first[i] = first_threshold(dist);
    }
    out->xnorm = xsum / (double)(2 * n_pairs * (emb_flip ? 2 : 1));

    /* KFold(n_splits=folds, shuffle=False): contiguous, the first N mod k folds one pair larger */
    int64_t base = n_pairs / folds, extra = n_pairs % folds, start = 0;
    int64_t fold_n[EVAL_MAX_FOLDS];
    for (int f = 0; f < folds; f++) {
        fold_n[f] = base + (f < extra);
        for (int64_t i = start; i < start + fold_n[f]; i++)
            (issame[i] ? hs : hd)[(size_t)f * (EVAL_THRESHOLDS + 1) + (size_t)first[i]]++;
        start += fold_n[f];
    }
    /* correct[j] of a pair set = same pairs with first <= j + different pairs with first > j */
    double sum = 0;
    for (int f = 0; f < folds; f++) {
        int64_t best = -1;
        int best_j = 0;
        int64_t cs_tr = 0, cd_tr = 0, cs_te = 0, cd_te = 0; /* cumulative counts up to j */
        int64_t nd_tr = 0, nd_te = 0;
        for (int g = 0; g < folds; g++) {
            if (folds > 1 && g == f)
                continue;
            for (int j = 0; j <= EVAL_THRESHOLDS; j++)
                nd_tr += hd[(size_t)g * (EVAL_THRESHOLDS + 1) + (size_t)j];
        }
        for (int j = 0; j <= EVAL_THRESHOLDS; j++)
            nd_te += hd[(size_t)f * (EVAL_THRESHOLDS + 1) + (size_t)j];
        int64_t correct_te[EVAL_THRESHOLDS];
        for (int j = 0; j < EVAL_THRESHOLDS; j++) {
            for (int g = 0; g < folds; g++) {
                if (folds > 1 && g == f)
                    continue;
                cs_tr += hs[(size_t)g * (EVAL_THRESHOLDS + 1) + (size_t)j];
                cd_tr += hd[(size_t)g * (EVAL_THRESHOLDS + 1) + (size_t)j];
            }
            cs_te += hs[(size_t)f * (EVAL_THRESHOLDS + 1) + (size_t)j];
            cd_te += hd[(size_t)f * (EVAL_THRESHOLDS + 1) + (size_t)j];
            int64_t c_tr = cs_tr + (nd_tr - cd_tr);
            correct_te[j] = cs_te + (nd_te - cd_te);
            if (c_tr > best) { /* strictly greater: the first maximum, as np.argmax */
                best = c_tr;
                best_j = j;
            }
        }
        out->fold_threshold[f] = best_j * EVAL_THRESHOLD_STEP;
        out->fold_acc[f] = (double)correct_te[best_j] / (double)fold_n[f];
        sum += out->fold_acc[f];
    }
    out->n_pairs = n_pairs;
    out->folds = folds;
    out->acc_mean = sum / folds;
    double var = 0, tsum = 0;
    for (int f = 0; f < folds; f++) {
        var += (out->fold_acc[f] - out->acc_mean) * (out->fold_acc[f] - out->acc_mean);
        tsum += out->fold_threshold[f];
    }
    out->acc_std = sqrt(var / folds);
    out->threshold_mean = tsum / folds;
out:
    free(first);
    free(hs);
    free(hd);
    free(row);
    return rc;
}
