/* safetensors files (Hugging Face's format, https://github.com/huggingface/safetensors, README "Format"):
 *   u64 N (little-endian) | N bytes of UTF-8 JSON header | data
 * The header is one JSON object: for every tensor "name": {"dtype": "F32", "shape": [d0, ...],
 * "data_offsets": [begin, end]} (byte offsets into the data, relative to its start), plus an optional
 * "__metadata__": {"key": "value", ...} (strings only). Data is raw little-endian, C order. The reference
 * implementation (Rust) requires the tensors' byte ranges to tile the data exactly (sorted by offset: each
 * begins where the previous one ends, the last ends at the end of the file), end - begin to equal
 * prod(shape) x the dtype's size, and N <= 100 MB; this reader holds files to the same rules. Writers here
 * pad the header with spaces to a multiple of 8 bytes (as the reference does) and put 8-byte dtypes first.
 *
 * JSON through jansson (libjansson-dev). Read here for the worker's backbone (worker/model/safetensors.h:
 * model_export_safetensors, model_load_pretrained), `pfcps export --centers` and the servers'
 * pretrained_centers (server/centers_load.h). */
#ifndef PFCPS_COMMON_SAFETENSORS_H
#define PFCPS_COMMON_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS    8
#define ST_MAX_HEADER  (100u * 1000u * 1000u) /* the reference implementation's MAX_HEADER_SIZE */
#define ST_DTYPE_CHARS 12

/* One tensor of a parsed file. data points into the file's bytes (not aligned: read with memcpy). */
typedef struct st_tensor {
    const char *name;
    char dtype[ST_DTYPE_CHARS]; /* as in the file: "F32", "I64", "F16", "BF16", ... */
    int ndim;                   /* 0 (a scalar) .. ST_MAX_DIMS */
    int64_t shape[ST_MAX_DIMS];
    const unsigned char *data;
    size_t nbytes; /* = prod(shape) x st_dtype_size(dtype) */
} st_tensor;

typedef struct st_file st_file;

/* Bytes per element of a safetensors dtype name (BOOL U8 I8 F8_E5M2 F8_E4M3 I16 U16 F16 BF16 I32 U32 F32
 * F64 I64 U64), 0 for an unknown one. */
size_t st_dtype_size(const char *dtype);

/* Parses a whole file held in buf[0..size) (not copied: buf must outlive *out). `what` names the input in
 * messages (a path). Returns 0, -EPROTO (malformed: header length beyond the file or above ST_MAX_HEADER,
 * bad JSON or a duplicate key, a field of the wrong type, an unknown dtype, a negative / overflowing shape,
 * offsets out of range, overlapping, leaving gaps, or not matching shape x dtype; every message names the
 * tensor and the problem), -ENOMEM. Never reads outside buf. */
int st_parse(st_file **out, const void *buf, size_t size, const char *what);

/* st_parse of a file read whole. -ENOENT / -EIO (cannot open or read) as well. */
int st_read(st_file **out, const char *path);

void st_free(st_file *f);

/* Tensors in data order (sorted by begin offset; ties by name). */
int st_count(const st_file *f);
const st_tensor *st_at(const st_file *f, int i);
/* The tensor called name, or NULL. */
const st_tensor *st_find(const st_file *f, const char *name);
/* The __metadata__ value of key, or NULL. */
const char *st_metadata(const st_file *f, const char *key);

/* What st_header / st_write write for one tensor. data may be NULL for st_header. */
typedef struct st_entry {
    const char *name;
    const char *dtype; /* a name st_dtype_size knows */
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data; /* prod(shape) x dtype size bytes, little-endian */
} st_entry;

typedef struct st_meta {
    const char *key, *value;
} st_meta;

/* The file's first bytes for these tensors: the u64 length and the JSON header padded with spaces to a
 * multiple of 8. The data follows in this order: tensors with 8-byte elements first, then the others, each
 * group in the order given; entry i's data lands at (*data_offset)[i] bytes after the header (when
 * data_offset is not NULL, n entries). *out is malloc'd, *out_len its size (the data's start in the file);
 * *data_bytes (when not NULL) the data's total size. Returns 0, -EINVAL (empty or duplicate name, a name
 * "__metadata__", unknown dtype, bad shape, sizes whose sum exceeds 2^63 bytes), -ENOMEM. */
int st_header(const st_entry *t, int n, const st_meta *meta, int n_meta, unsigned char **out, size_t *out_len,
              uint64_t *data_offset, uint64_t *data_bytes);

/* Writes a whole file: st_header then each tensor's data, to path.tmp, fsync'd, renamed to path.
 * Returns 0, st_header's errors, -EIO (errno text in the message). */
int st_write(const char *path, const st_entry *t, int n, const st_meta *meta, int n_meta);

#endif
