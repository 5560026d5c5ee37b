/* The class-center table of a finished run as one safetensors file (`pfcps export --centers`). */
#ifndef PFCPS_WORKER_MODEL_CENTERS_EXPORT_H
#define PFCPS_WORKER_MODEL_CENTERS_EXPORT_H

#include <stdint.h>

/* Reads the partition files <run_output>/centers/partition.rank<r>, r = 0..W-1 (W = how many there are,
 * consecutive from 0), each a sequence of records { u64 class id (little-endian), D float32 } as the workers
 * write them at the end of a run with `save_centers = true` (and `--dump-centers`, worker/train.c
 * dump_partition), and writes out: a safetensors file (safetensors.h) with one tensor `centers`, F32,
 * shape (C, D), row c = class c's center, C = the number of records over all files; __metadata__ format
 * "pt", producer "pfcps", num_classes C, embedding_size D, world_size W.
 * D: `dim` when > 0, else the embedding size in <run_output>/model.ckpt's header (the backbone of the same
 * run). Every class id 0..C-1 must appear exactly once: a file whose size is not a whole number of records
 * (8 + 4 D bytes: truncated, or another D), an id >= C (a class missing elsewhere, or out of range), an id
 * seen twice, a missing partition.rank<r> below a present one, no partition at all: -EINVAL / -EPROTO naming
 * the file (and record) and the problem; nothing is left at out (written to out.tmp, fsync'd, renamed).
 * Memory: C / 8 bytes (a bitmap) + a read buffer; rows are written in place. *num_classes / *dim_out (when
 * not NULL) receive C and D. Returns 0, those errors, -ENOENT / -EIO, -ENOMEM. */
int centers_export_safetensors(const char *run_output, int dim, const char *out, int64_t *num_classes,
                               int *dim_out);

#endif
