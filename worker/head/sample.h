/* Partial FC class-center sampling (docs/architecture.md, One training step, item 2; Partial FC, An et al.
 * 2022, and arcface_torch PartialFC_V2.sample: all positives plus uniformly drawn negatives, sorted ids,
 * labels remapped to positions in the sample).
 *
 * Global mode: worker `rank` owns the classes c with c mod world_size == rank (its partition, of
 * size P = ceil((C - rank) / world_size)); it samples every positive of the global batch inside its
 * partition plus uniform negatives from the rest of its partition, K = max(#positives,
 * sample_count(sample_rate, P, ceil_count)) ids in all. sample_rate 0 (arcface_torch's num_sample = 0, as
 * wf42m_pfc0008_32gpu_r100.py sets): exactly the positives, K = #positives (0 when none of the batch's labels
 * is in the partition).
 * Local mode: the partition is all C classes; the positives are those of the worker's own batch.
 *
 * Randomness is counter-based (splitmix64 of a key hashed from (seed, step, rank) and a counter):
 * the same (seed, step, rank, labels) always gives the same sample, on any machine, with no state.
 * Negatives are drawn with Floyd's algorithm over the non-positive ids of the partition, so memory
 * is O(K) (a hash set of the drawn ids), never O(P): fine for partitions of 100M+ classes. */
#ifndef PFCPS_WORKER_HEAD_SAMPLE_H
#define PFCPS_WORKER_HEAD_SAMPLE_H

#include <stdint.h>

typedef enum { SAMPLE_GLOBAL = 0, SAMPLE_LOCAL = 1 } sample_mode;

typedef struct sample_args {
    int64_t num_classes; /* C > 0 */
    int world_size;      /* W >= 1 */
    int rank;            /* [0, W) */
    double sample_rate;  /* [0, 1]; 1 = the whole partition, 0 = the positives only */
    uint64_t seed;
    int64_t step;
    sample_mode mode;
    int ceil_count;      /* 0: int(rate * P) as arcface_torch (default); 1: ceil (config sample_rounding) */
} sample_args;

/* Number of classes in rank's partition of C classes over W workers: ceil((C - rank) / W) (0 when
 * rank >= C). */
int64_t sample_partition_size(int64_t num_classes, int world_size, int rank);

/* Sampled ids before the positives are forced in: ceil_count 0: arcface_torch PartialFC_V2's
 * num_sample = int(sample_rate * num_local), the double product truncated (0.29 * 100 -> 28, 0.1 * 25 -> 2);
 * ceil_count 1: ceil(sample_rate * partition) with a 1e-9 tolerance against float noise (0.1 * 30 -> 3, not
 * 4). Both clamped to [0, partition]; the whole partition for sample_rate >= 1; 0 for sample_rate 0 (or not
 * positive). */
int64_t sample_count(double sample_rate, int64_t partition, int ceil_count);

/* Samples this rank's class centers for one step.
 *   labels (n): class ids of the global batch (global mode) or of this worker's batch (local mode)
 * Outputs:
 *   *ids_out: malloc'd, sorted ascending, *k_out global class ids (caller frees)
 *   labels_local (n): position of labels[i] in *ids_out, or -1 when it belongs to another
 *     worker's partition (global mode); may be NULL.
 * Errors: -EINVAL (bad args: C <= 0, W < 1, rank outside [0, W), rate outside [0, 1], step < 0),
 * -ERANGE (a label outside [0, C): the message names the row and the label), -ENOMEM. */
int sample_classes(const sample_args *a, const int64_t *labels, int64_t n, int64_t **ids_out, int64_t *k_out,
                   int64_t *labels_local);

/* The counter-based generator the sampler uses: 64 uniform bits for (key, counter), and the key of
 * (seed, step, rank). Exposed for tests and for other reproducible draws. */
uint64_t sample_key(uint64_t seed, int64_t step, int rank);
uint64_t sample_bits(uint64_t key, uint64_t counter);

#endif
