/* The face-verification protocol of arcface_torch's eval/verification.py (test(), evaluate(),
 * calculate_roc(), calculate_accuracy()), pure math on embeddings already computed (no I/O):
 *   - XNorm: the mean L2 norm of every un-normalised embedding row (of the images and, with flip, of
 *     the flipped images: verification.py's `_xnorm` over embeddings_list);
 *   - each image's embedding + its flipped image's embedding (when given), L2-normalised
 *     (sklearn.preprocessing.normalize);
 *   - pair i = rows 2i and 2i+1, distance = squared Euclidean distance of the normalised rows;
 *   - thresholds t_j = j * 0.01, j = 0..399 (np.arange(0, 4, 0.01)); a pair is predicted "same" when
 *     dist < t_j (np.less);
 *   - k contiguous folds over the pairs in their order (sklearn KFold(n_splits=k, shuffle=False): the
 *     first N mod k folds hold floor(N/k) + 1 pairs, the others floor(N/k)); for each fold the best
 *     threshold is the first (np.argmax) that maximises the accuracy on the other k-1 folds, and the
 *     fold's accuracy is that threshold's accuracy on the fold; k = 1 trains and tests on all pairs
 *     (verification.py's LFold);
 *   - accuracy mean and population standard deviation (np.mean, np.std) over the folds.
 * Computed in float64 (arcface_torch computes the distances in float32: a distance within float32
 * rounding of a threshold may be classified differently, which moves an accuracy by 1/N at most). */
#ifndef PFCPS_WORKER_EVAL_VERIFY_H
#define PFCPS_WORKER_EVAL_VERIFY_H

#include <stdint.h>

#define EVAL_MAX_FOLDS      256
#define EVAL_THRESHOLDS     400 /* np.arange(0, 4, 0.01) */
#define EVAL_THRESHOLD_STEP 0.01

typedef struct eval_result {
    int64_t n_pairs;
    int folds;
    double acc_mean, acc_std;              /* over the folds (std: population, ddof 0) */
    double threshold_mean;                 /* mean of the folds' best thresholds */
    double xnorm;                          /* mean L2 norm of the un-normalised embeddings */
    double fold_acc[EVAL_MAX_FOLDS];       /* test accuracy of each fold */
    double fold_threshold[EVAL_MAX_FOLDS]; /* best threshold of each fold (chosen on the others) */
} eval_result;

/* emb: (2N, D) float32 embeddings, pair i = rows 2i, 2i+1; emb_flip: NULL, or (2N, D) embeddings of
 * the same images flipped horizontally (added to emb's rows before normalising). issame: N values
 * (nonzero = same identity). folds: 1 <= folds <= min(N, EVAL_MAX_FOLDS). Fills *out.
 * A zero row stays zero after normalising (as sklearn's normalize leaves it).
 * Returns 0, -EINVAL (N < 1, D < 1, folds outside that range, a non-finite embedding), -ENOMEM. */
int eval_verify(const float *emb, const float *emb_flip, int64_t n_pairs, int d, const uint8_t *issame,
                int folds, eval_result *out);

#endif
