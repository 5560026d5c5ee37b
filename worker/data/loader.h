/* The worker's data loader: a RecordIO dataset (rec.h) or synthetic data, decoded and augmented
 * (image.h) by `num_workers` background threads into a bounded queue of batches.
 *
 * Order: each epoch the image list is shuffled with a permutation seeded by (seed, epoch) only, so
 * every rank computes the same permutation; as arcface_torch's DistributedSampler (padded: position p >= N is
 * the permutation's p mod N) under a DataLoader with drop_last, each rank gets floor(ceil(N / world_size) /
 * batch_size) full batches and rank r takes positions r, r + world_size, r + 2 * world_size, ...: the
 * ranks' slices are disjoint except for the padding (fewer than world_size repeated images), never a ragged
 * batch. The flip of an image is seeded by
 * (seed, epoch, key), so batches are identical whatever num_workers is.
 *
 * Labels first: loader_peek_labels() returns the next batch's labels before loader_next() hands the
 * batch over, so the class-center pull starts from them (docs/architecture.md, One training step, items 1
 * and 3) while the backbone still works on the previous batch. It waits until the batch is decoded (the
 * decode threads run ahead by `prefetch` batches, so in steady state it does not wait): the labels it
 * returns are those of the images actually delivered.
 *
 * Bad records: structural damage fails loader_open (rec_open); with skip_bad_records those records are
 * dropped at open and counted. An image that fails to decode later (a corrupt JPEG body) fails
 * loader_peek_labels / loader_next with file, key and byte offset, or with skip_bad_records is counted
 * and replaced by the next record in file order that decodes (its image and its label; at most 16
 * records are tried before the batch fails), so a batch always has batch_size real samples. */
#ifndef PFCPS_WORKER_DATA_LOADER_H
#define PFCPS_WORKER_DATA_LOADER_H

#include <stdint.h>

#include "common/config.h"

/* arcface_torch's SyntheticDataset (dataset.py): every sample has label 1; __len__ is 1,000,000. */
#define ARCFACE_SYNTHETIC_LABEL  1
#define ARCFACE_SYNTHETIC_IMAGES 1000000

typedef struct loader_opts {
    const char *rec;     /* dataset prefix or directory (train.rec/.idx), or "synthetic" */
    int64_t num_classes; /* synthetic: required, 1 .. 2^32; dataset: 0 = from `property` or labels,
                            > 0 = labels must be below it */
    int batch_size;      /* per rank, > 0 */
    int num_workers;     /* decode threads; 0 = decode in the caller's thread */
    int prefetch;        /* batches decoded ahead (queue depth); 0 = 2 * max(1, num_workers) */
    uint64_t seed;
    int rank, world_size;
    int skip_bad_records;
    int shuffle;       /* default 1 */
    int flip;          /* random horizontal flip with p = 0.5, default 1 */
    int resize;        /* resize images that are not image_size (default 0: error) */
    int image_size;    /* default 112 */
    int64_t num_image; /* synthetic_varied: images per epoch over all ranks (default 2^20) */
    int synthetic_varied; /* synthetic: 1 = an image per sample, labels uniform in [0, num_classes), num_image
                             samples per epoch; 0 (default) = arcface_torch's SyntheticDataset: one image,
                             label ARCFACE_SYNTHETIC_LABEL, ARCFACE_SYNTHETIC_IMAGES samples per epoch */
} loader_opts;

typedef struct loader_batch {
    int64_t epoch, index; /* batch `index` (0-based) of `epoch` on this rank */
    int n;                /* batch_size */
    float *images;        /* (n, 3, image_size, image_size) float32 in [-1, 1] */
    int64_t *labels;      /* (n) class ids */
    int64_t *keys;        /* (n) .idx keys of the records (-1 for synthetic) */
    uint8_t *flips;       /* (n) 1 where the image was mirrored horizontally (always 0 for synthetic) */
    int slot;             /* internal */
} loader_batch;

typedef struct loader loader;

/* Defaults: batch_size 128, num_workers 2, seed 2048, rank 0, world_size 1, shuffle 1, flip 1,
 * image_size 112, num_image 1<<20, synthetic_varied 0 (arcface_torch's); rec NULL and num_classes 0 still
 * need to be set. */
void loader_opts_default(loader_opts *o);

/* Fills opts from the run config (rec, num_classes, batch_size, num_workers, seed, skip_bad_records,
 * num_image, synthetic) and the process's rank and world_size. The config must outlive the loader (rec points
 * into it). */
void loader_opts_from_config(loader_opts *o, const pf_config *cfg, int rank, int world_size);

/* Opens the dataset and starts the decode threads (idle until loader_start_epoch).
 * Errors: -EINVAL naming the bad option (batch_size, rank/world_size, num_classes for synthetic,
 * dataset smaller than one global batch); the errors of rec_open; -ENOMEM. */
int loader_open(loader **out, const loader_opts *o);

int64_t loader_num_batches(const loader *l); /* full batches per epoch on each rank */
int64_t loader_num_images(const loader *l);  /* usable images in the dataset (all ranks) */
int64_t loader_num_classes(const loader *l);
int64_t loader_skipped(const loader *l); /* bad records dropped at open + images skipped since */

/* Starts epoch `epoch` (>= 0): computes the order and lets the threads decode ahead. Any batch still
 * held by the caller is taken back. Returns 0 or -ENOMEM. */
int loader_start_epoch(loader *l, int64_t epoch);

/* loader_start_epoch from batch `first_batch` (0 .. loader_num_batches) of the epoch on: the batches are the
 * ones an uninterrupted epoch delivers from there (order and flips depend only on seed, epoch and image), so
 * a resumed run reads what the interrupted one would have. -ERANGE outside that range. */
int loader_start_epoch_at(loader *l, int64_t epoch, int64_t first_batch);

/* The labels of the batch the next loader_next() will return: labels is (batch_size). Waits until
 * that batch is decoded. Returns 1, 0 when the epoch has no more batches, or the batch's error (a
 * record that fails to decode without skip_bad_records; -EBUSY when every slot is held). */
int loader_peek_labels(loader *l, int64_t *labels);

/* Waits for the next batch of the epoch, in order. Returns 1 with *out (hand it back with
 * loader_release before the slot is needed again), 0 at the end of the epoch, or a negative code with
 * pf_errmsg() naming file, key and byte offset of a bad record. */
int loader_next(loader *l, loader_batch **out);

/* Hands a batch from loader_next back so its slot can be refilled (NULL is fine). */
void loader_release(loader *l, loader_batch *b);

/* The dataset image indices (0 .. num_images-1) this rank reads in `epoch`, in order:
 * num_batches * batch_size entries. For tests and tools; synthetic mode returns global positions. */
int loader_epoch_order(const loader *l, int64_t epoch, int64_t *indices);

/* Stops the threads and frees everything. */
void loader_close(loader *l);

#endif
