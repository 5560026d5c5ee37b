/* A verification set (N pairs of images + same/different) and the whole verification of a backbone
 * on it: the entry point for `pfcps verify` and for verification during training. */
#ifndef PFCPS_WORKER_EVAL_SET_H
#define PFCPS_WORKER_EVAL_SET_H

#include <stdint.h>

#include "worker/eval/binset.h"
#include "worker/eval/embed.h"
#include "worker/eval/pairs.h"
#include "worker/eval/verify.h"
#include "worker/model/model.h"

typedef struct eval_set {
    char name[64]; /* the file's base name without extension ("lfw", "pairs_s31-s40") */
    int64_t n_pairs;
    const uint8_t *issame; /* N */
    int is_bin;
    eval_binset bin;  /* when is_bin */
    eval_pairs pairs; /* otherwise */
} eval_set;

/* Opens a set: an arcface_torch .bin pickle (binset.h; detected by the pickle's PROTO byte 0x80 or
 * the .bin extension) or a pairs text file (pairs.h) whose images are under images_dir (required
 * then; ignored for .bin). Returns 0, or the errors of eval_binset_load / eval_pairs_load, -EINVAL
 * "a pairs file needs an image folder". On failure s is empty. */
int eval_set_open(eval_set *s, const char *path, const char *images_dir);

/* Image i (0 <= i < 2N) of the set as an eval_image_fn (arg: the eval_set). */
int eval_set_image(void *set, int64_t i, eval_image *out);

/* Frees what s holds (safe on a zeroed or freed set). */
void eval_set_free(eval_set *s);

/* Verifies m on s as arcface_torch's eval/verification.py test() does: embeds the 2N images (and their
 * flips when o->flip, arcface_torch's "Accuracy-Flip"; o may be NULL: batch 32, flip on, resize) with
 * eval_embed in eval mode, then eval_verify with `folds` folds (arcface_torch: 10). *n_refit (may be
 * NULL) gets how many images were not 112x112. Returns 0 or the errors of eval_embed / eval_verify.
 * The model's activations are overwritten (call between training steps). */
int eval_verify_model(model *m, const eval_set *s, const eval_embed_opts *o, int folds, eval_result *out,
                      int64_t *n_refit);

/* eval_verify_model with raw pixels for embeddings (eval_pixels: the network's preprocessed input,
 * EVAL_PIXELS_D floats per image; with o->flip the flipped image's pixels are added before normalising,
 * as for a network): the baseline a trained model should beat. Same returns as eval_verify_model. */
int eval_verify_pixels(const eval_set *s, const eval_embed_opts *o, int folds, eval_result *out,
                       int64_t *n_refit);

#endif
