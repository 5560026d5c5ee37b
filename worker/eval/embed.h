/* Embeddings of images through a backbone (worker/model) on any kernels/ops.h device, batched, in
 * eval mode (BatchNorm running statistics, no dropout), with the preprocessing of arcface_torch's
 * eval/verification.py: decode to RGB, resize to 112x112 when another size, optionally the
 * horizontally flipped copy, then (x/255 - 0.5)/0.5 in NCHW (worker/data/image.h, img_to_chw: the
 * normalisation training uses). */
#ifndef PFCPS_WORKER_EVAL_EMBED_H
#define PFCPS_WORKER_EVAL_EMBED_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"
#include "worker/model/model.h"

/* One image: a file (path != NULL; JPEG and PNG through img_decode_rgb, PGM / PPM / BMP through
 * TurboJPEG's tjLoadImage, grey replicated to RGB, as `pfcps pack` reads them) or encoded JPEG/PNG
 * bytes (data, len; path NULL). */
typedef struct eval_image {
    const char *path;
    const uint8_t *data;
    size_t len;
} eval_image;

/* Image i of a source (0 <= i < n): fills *out; what it points to must stay valid until the next
 * call. Returns 0 or a negative error code with a message. */
typedef int (*eval_image_fn)(void *arg, int64_t i, eval_image *out);

typedef struct eval_embed_opts {
    int batch; /* images per forward; 1 <= batch <= the model's batch capacity (0: 32) */
    int flip;  /* also embed each image flipped horizontally (into out_flip) */
    int pad;   /* another size: fit into a black 112x112 canvas like `pfcps pack --pad`
                * (scaled down only, aspect kept) instead of resizing (bilinear) */
    /* called after each batch (may be NULL): done of total images */
    void (*progress)(void *arg, int64_t done, int64_t total);
    void *progress_arg;
} eval_embed_opts;

/* Reads the network name and embedding size from a model.ckpt's header (worker/model/model.h
 * layout), creates that network on dev (NULL: the CPU device) with room for batches of
 * batch_capacity images, and loads the checkpoint into it. Returns 0 (*out to free with
 * model_free), -ENOENT / -EIO (file), -EPROTO (not a pfcps checkpoint, truncated, corrupt),
 * -EINVAL (unknown network name), -ENOMEM, device errors; messages name the path. */
int eval_model_open(model **out, const char *ckpt_path, int batch_capacity, const ops_device *dev);

/* The untrained network exactly as training starts it (worker/train.c setup_backbone: model_create_desc,
 * then model_init(seed); rank 0's values are what every worker trains from): `network` (model_desc_from_name)
 * with embedding size D on dev (NULL: the CPU device), room for batches of batch_capacity images, BN running
 * statistics as model_init leaves them. Returns 0 (*out to free with model_free), -EINVAL (unknown network
 * or D, message naming it), -ENOMEM, device errors. */
int eval_model_init(model **out, const char *network, int embedding_size, uint64_t seed, int batch_capacity,
                    const ops_device *dev);

/* Embeds n images of the source get(arg, i) through m (eval mode): out (n, D) float32 in source
 * order; out_flip (n, D), when o->flip, the embeddings of the flipped images (else unused, may be
 * NULL). *n_refit (may be NULL) gets how many images were not 112x112 and were resized (or padded).
 * Returns 0, -EINVAL (bad options), the source's error, decode errors (-EPROTO, -E2BIG, -ENOENT,
 * -EIO) prefixed with the image's index and path, -ENOMEM, or the device's error. */
int eval_embed(model *m, eval_image_fn get, void *arg, int64_t n, const eval_embed_opts *o, float *out,
               float *out_flip, int64_t *n_refit);

/* Length of a raw-pixel "embedding" (eval_pixels): the 3x112x112 network input. */
#define EVAL_PIXELS_D (3 * 112 * 112)

/* Raw pixels as embeddings (the baseline `pfcps verify --pixels`): image i of get(arg, i) preprocessed
 * exactly as eval_embed feeds the network (decode to RGB, grey replicated; refit to 112x112 by o->pad;
 * (x/255 - 0.5)/0.5 in CHW order) is row i of out (n, EVAL_PIXELS_D); out_flip, when o->flip, the
 * flipped image's row. o->batch and the progress callback are used as in eval_embed (progress per batch).
 * Returns 0, -EINVAL (bad options), the source's error, decode errors prefixed with the image's index
 * and path. */
int eval_pixels(eval_image_fn get, void *arg, int64_t n, const eval_embed_opts *o, float *out,
                float *out_flip, int64_t *n_refit);

/* Writes rows x cols float32 (C order) as a NumPy .npy file (format 1.0, '<f4'), through path.tmp
 * and a rename. Returns 0 or -EIO naming the path. */
int eval_npy_write_f32(const char *path, const float *data, int64_t rows, int64_t cols);

/* A progress printer for eval_embed_opts.progress: arg is an eval_progress whose `what` names the program
 * ("pfcps embed"); prints "<what>: embedded D/N images (P%), R images/s" on stderr at most every 2 s and at
 * the end. Set t0 = pf_now_s() (common/clock.h) before embedding. */
typedef struct eval_progress {
    const char *what;
    double t0, last;
} eval_progress;
void eval_progress_stderr(void *arg, int64_t done, int64_t total);

#endif
