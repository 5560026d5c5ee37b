/* MXNet RecordIO reader and writer (the format MS1M-ArcFace, Glint360K and WebFace42M ship in).
 *
 * Format (all little-endian), as written by dmlc-core's RecordIOWriter and MXNet's recordio.pack:
 *   .idx   text lines `key<TAB>byte_offset`; records are always located through it.
 *   .rec   chunks: u32 magic 0xCED7230A, u32 lrecord = cflag<<29 | length, `length` data bytes, zero
 *          padding to a 4-byte boundary. cflag 0 = whole record; 1/2/3 = first/middle/last chunk of a
 *          record that was split where its data contained the magic at a 4-byte-aligned offset; the
 *          reader re-inserts the 4 magic bytes between chunks.
 *   payload 24-byte header `u32 flag, f32 label, u64 id, u64 id2`; if flag > 0, `flag` float32 labels
 *          follow and the class is the first of them; then the encoded image (JPEG or PNG) to the end.
 * Layouts: InsightFace packs have a header record at key 0 (flag > 0, no image, label =
 * [first identity-record key, end key]); image keys are 1 .. label[0]-1, identity records follow.
 * im2rec packs have no header: every key in .idx is an image. Both are detected.
 *
 * Class ids >= 2^24 (not exact in float32): pfcps's packer stores every class id c exactly in id2 as
 * REC_ID2_MARKER | c (c < 2^48) and also writes label = (float)c, flag 0. A record whose id2 carries the
 * marker is read as class c, provided (float)c equals its float label (otherwise it is a bad record);
 * every other record reads its class from the float label, which must be finite, integral and >= 0.
 */
#ifndef PFCPS_WORKER_DATA_REC_H
#define PFCPS_WORKER_DATA_REC_H

#include <stddef.h>
#include <stdint.h>

#define REC_MAGIC          0xCED7230Au
#define REC_HEADER_BYTES   24
#define REC_MAX_RECORD     (64u << 20)       /* refuse records larger than 64 MiB */
#define REC_ID2_MARKER     (0x5046ull << 48) /* "PF" in the top 16 bits of id2 */
#define REC_ID2_CLASS_MASK ((1ull << 48) - 1)

/* A growable byte buffer used to join multi-chunk records. */
typedef struct rec_buf {
    uint8_t *data;
    size_t len, cap;
} rec_buf;

/* Frees the buffer's memory and empties it (safe on a zeroed or already freed buffer). */
void rec_buf_free(rec_buf *b);

/* Parsed payload of one record; pointers alias the record data (mmap or the rec_buf). */
typedef struct rec_payload {
    uint32_t flag;         /* number of extra float labels */
    float label;           /* class label as float: header label if flag == 0, else first extra label */
    const uint8_t *labels; /* flag little-endian float32 values (unaligned), NULL when flag == 0 */
    uint64_t id, id2;
    const uint8_t *image; /* encoded image bytes (may be empty) */
    size_t image_len;
} rec_payload;

/* Reads the record whose first chunk starts at byte `off` of the region `base` (`size` bytes).
 * A single-chunk record is returned in place (*data points into base); a multi-chunk record is joined
 * into `scratch` with the magic re-inserted between chunks. *next (may be NULL) gets the offset just
 * past the record's last chunk and its padding.
 * Errors: -EPROTO "truncated chunk header at byte N" / "bad magic 0x... at byte N" / "chunk length L at
 * byte N runs past end of file (size S)" / "unexpected cflag C at byte N"; -EFBIG for a record over
 * REC_MAX_RECORD; -ENOMEM. Messages name the byte offset; callers prefix file and key. */
int rec_read_record(const uint8_t *base, size_t size, uint64_t off, rec_buf *scratch, const uint8_t **data,
                    size_t *len, uint64_t *next);

/* Splits a record's bytes into header, extra labels and image. Errors: -EPROTO "payload of N bytes is
 * shorter than the 24-byte header" / "flag F needs N label bytes, payload has M". */
int rec_parse_payload(const uint8_t *data, size_t len, rec_payload *out);

/* The class id of a parsed payload (see the id2 convention above). `num_classes` > 0 also bounds it.
 * Errors: -ERANGE "label NaN" / "label -1 is negative" / "label 2.5 is not an integer" /
 * "class 1000 >= num_classes 1000" / "id2 class c disagrees with label l". */
int rec_class_of(const rec_payload *p, int64_t num_classes, int64_t *class_id);

/* Little-endian float at p (unaligned). */
float rec_f32(const uint8_t *p);

/* --- indexed reader over <prefix>.rec + <prefix>.idx --- */

typedef enum { REC_LAYOUT_IM2REC = 0, REC_LAYOUT_INSIGHTFACE = 1 } rec_layout;

typedef struct rec_image {
    int64_t key;
    uint64_t offset; /* byte offset of its first chunk in .rec */
    int64_t class_id;
} rec_image;

typedef struct rec_file {
    char rec_path[4096], idx_path[4096];
    const uint8_t *map; /* the whole .rec, read-only mmap */
    size_t size;
    rec_layout layout;
    int64_t header_end[2]; /* InsightFace header label (first identity key, end key), else 0 */
    rec_image *images;     /* in key order */
    int64_t num_images;
    int64_t num_classes;      /* from the options, else `property`, else max class + 1 */
    int64_t property_classes; /* num_classes in `property` (0 when absent) */
    int64_t min_class, max_class;
    int64_t skipped; /* bad records dropped at open (skip_bad_records) */
    int64_t min_key, max_key;
} rec_file;

/* The pack prefix config key `rec` names: "X.rec" / "X.idx" -> "X", a folder D -> "D/train", anything else
 * as given (the pack is <base>.rec + <base>.idx, its property file beside them). Writes base (cap bytes).
 * Returns 0, or -1 when it does not fit. */
int rec_resolve_prefix(const char *rec, char *base, size_t cap);

/* Opens `prefix` (the path without .rec/.idx; a directory means <dir>/train). Reads the .idx, maps the
 * .rec, detects the layout, reads the `property` file next to it when present (`num_classes,h,w`) and
 * validates every image record: its chunks, its header, its class id (< num_classes when num_classes
 * > 0, else < property when present) and that its image starts like a JPEG or PNG.
 * A bad record fails the open with its file, key and byte offset in the message, unless
 * skip_bad_records, in which case it is dropped, counted in rf->skipped and logged (first 10).
 * Damage to the file as a whole (missing file, unparsable .idx line, broken header record, no images)
 * always fails. The .idx, .rec and property files are opened with pf_open_regular (a FIFO, device or
 * folder in their place is refused at once, naming the path and its kind). Errors: -ENOENT, -EACCES, -EIO,
 * -EPROTO, -ERANGE, -EINVAL, -ENOMEM. */
int rec_open(rec_file **out, const char *prefix, int64_t num_classes, int skip_bad_records);

/* Reads image i (0 <= i < num_images) of an open file: payload and image bytes. `scratch` is used for
 * multi-chunk records (one per thread). Errors as rec_read_record, prefixed with file, key, offset. */
int rec_get(const rec_file *rf, int64_t i, rec_buf *scratch, rec_payload *out);

/* Unmaps the .rec and frees the index (NULL is fine). */
void rec_close(rec_file *rf);

/* --- writer (used by `pfcps pack`) --- */

typedef struct rec_writer {
    void *rec, *idx; /* FILE* */
    uint64_t pos;
    char path[4096];
} rec_writer;

/* Creates <prefix>.rec and <prefix>.idx (truncates). Errors: -errno with the path. */
int rec_writer_open(rec_writer *w, const char *prefix);

/* Appends one record (header + `nlabels` extra labels + image) under `key`, splitting it into chunks
 * where its bytes contain the magic at a 4-byte-aligned offset (as dmlc-core does), and writes the
 * .idx line. Errors: -EIO, -EFBIG. */
int rec_writer_put(rec_writer *w, int64_t key, uint32_t flag, float label, uint64_t id, uint64_t id2,
                   const float *labels, const uint8_t *image, size_t image_len);

/* Appends one record whose bytes are already encoded (header included). */
int rec_writer_put_raw(rec_writer *w, int64_t key, const uint8_t *data, size_t len);

/* Flushes and closes both files. Errors: -EIO. */
int rec_writer_close(rec_writer *w);

#endif
