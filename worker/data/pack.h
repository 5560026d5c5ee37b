/* `pfcps pack`: packs a folder of face images (one subfolder per identity) into an InsightFace-style
 * RecordIO dataset, <prefix>.rec + <prefix>.idx + `property` next to them.
 *
 * Layout written: image records at keys 1..N (identities in natural name order, `s2` before `s10`,
 * files in natural order within each; an identity folder may be a link, but each folder is packed once: a
 * link to image_dir itself or a second link to a folder already taken is skipped with a warning naming
 * it), one identity record per class at keys N+1..N+K (flag 2, labels
 * [first image key, end image key)), and the header record at key 0 (flag 2, labels [N+1, N+K+1]),
 * written last so record 0 is not at byte 0, as in the InsightFace packs. Every image record stores its
 * class c as label (float)c and exactly as id2 = REC_ID2_MARKER | c (rec.h); the header stores its key
 * range exactly too (id2 = marker | N+1, id = N+K+1).
 *
 * Images: 112x112 JPEGs are kept byte-exact (after a full test decode); anything else (JPEG of
 * another size, PNG, PGM/PPM/BMP through TurboJPEG's loader) is decoded to RGB (grey replicated),
 * padded (centered on black, scaled down only if larger) or resized to 112x112, and encoded as JPEG. */
#ifndef PFCPS_WORKER_DATA_PACK_H
#define PFCPS_WORKER_DATA_PACK_H

#include <stdint.h>

typedef struct pack_opts {
    int resize;             /* 0 = pad to 112x112 (default), 1 = resize (stretch) to 112x112 */
    int64_t first_class;    /* class id of the first identity (default 0), < 2^48 */
    int quality;            /* JPEG quality of converted images, default 95 */
    int progress;           /* progress bar with rate and ETA on stderr */
    int64_t max_identities; /* pack only the first N identity folders (natural order); 0 = all */
} pack_opts;

typedef struct pack_stats {
    int64_t images, classes;
    int64_t kept;      /* 112x112 JPEGs stored as their original bytes */
    int64_t converted; /* images decoded and re-encoded */
} pack_stats;

void pack_opts_default(pack_opts *o);

/* Packs image_dir into out_prefix.rec/.idx and <dirname(out_prefix)>/property.
 * Errors (pf_errmsg names the file): -ENOENT/-ENOTDIR for image_dir, -EINVAL "no identity folders" /
 * "identity folder X has no images" / first_class out of range, -EPROTO for an image that does not
 * decode (path and reason), -EIO, -ENOMEM. */
int pack_dir(const char *image_dir, const char *out_prefix, const pack_opts *o, pack_stats *st);

#endif
