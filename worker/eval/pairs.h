/* Pair lists over an image folder: LFW's pairs.txt and the ORL list data/orl/pairs_s31-s40.txt.
 *
 * Format (both): one pair per line, fields separated by tabs or spaces;
 *   `name i j`            the same identity: images i and j of `name`;
 *   `name1 i name2 j`     different identities.
 * i, j are image numbers (1-based integers). Empty lines are skipped. The first line is a header unless
 * it is itself a pair line: LFW's `folds<TAB>n` (then exactly 2 x folds x n pair lines must follow) or
 * `n` (then 2 x n, pairsDevTrain.txt), anything else free text (ORL's "450 same, 450 different; ..."),
 * not checked. Pairs keep the file's order (arcface_torch's folds are contiguous runs of it).
 *
 * Image paths under DIR, the first that exists of:
 *   DIR/name/name_%04d.jpg  (LFW: Aaron_Peirsol/Aaron_Peirsol_0001.jpg)
 *   DIR/name/%d.pgm, DIR/name/%d.jpg, DIR/name/%d.png  (ORL: s31/1.pgm) */
#ifndef PFCPS_WORKER_EVAL_PAIRS_H
#define PFCPS_WORKER_EVAL_PAIRS_H

#include <stdint.h>

typedef struct eval_pairs {
    int64_t n_pairs;
    char **paths;    /* 2N image paths; pair i = paths[2i], paths[2i+1] */
    uint8_t *issame; /* N */
} eval_pairs;

/* Reads pairs_path and resolves every image under images_dir (each must exist). Returns 0, or
 * -ENOENT / -EIO (the file), -EPROTO "pairs.txt line L: ..." (a line of another shape, a bad image
 * number, a name with '/', a header count that does not match the pairs, no pairs), -ENOENT
 * "line L: no image for NAME I under DIR (tried ...)", -ENOMEM. On failure p is empty. */
int eval_pairs_load(eval_pairs *p, const char *pairs_path, const char *images_dir);

/* Frees what p holds (safe on a zeroed or freed value). */
void eval_pairs_free(eval_pairs *p);

#endif
