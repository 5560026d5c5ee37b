/* Snapfiles: the container of every .snap member file of a checkpoint (a server's shard file, a worker's
 * state; names: common/ckpt.h).
 *
 * Layout: bytes [0, 4096) hold the magic "PFCPSNP1", a u32 little-endian header length, the header (a
 * protobuf SnapshotHeader, proto/ctl.proto), the SHA-256 of the header bytes, zero padding; the payload
 * starts at byte 4096. The header carries
 * the payload's length and SHA-256 (OpenSSL), so a file is accepted only when its size is exactly
 * 4096 + payload_bytes and its payload hashes to the recorded digest: a torn, truncated, padded or corrupt
 * file is refused with a message naming the file and the problem.
 *
 * Writing follows common/atomic_file.h (temp file, fsync, rename, fsync of the folder): the header is written
 * last, at offset 0, once the digest is known; a crash at any point leaves the previous file of that name (or
 * none), never a torn one. */
#ifndef PFCPS_COMMON_SNAPFILE_H
#define PFCPS_COMMON_SNAPFILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/atomic_file.h"

#define SNAPFILE_HDR_AREA 4096
#define SNAPFILE_VERSION  1

/* The header's fields (SnapshotHeader). */
typedef struct snapfile_meta {
    char role[16];          /* "shard" or "worker" (header field kind) */
    int32_t rank;           /* server rank (shard) or worker rank (worker) (header field shard_id) */
    int32_t servers;        /* S of the run that wrote it */
    int32_t workers;        /* W of the run that wrote it */
    int32_t dim;            /* D */
    int64_t num_classes;    /* C */
    int64_t step;           /* checkpoint id: steps completed */
    int64_t rows;           /* shard: local rows; worker: parameters */
    int64_t block_rows;     /* shard: rows per payload block */
    uint64_t seed;          /* the run's seed */
    uint64_t payload_bytes; /* set by snapfile_commit */
    uint8_t sha256[32];     /* set by snapfile_commit */
} snapfile_meta;

typedef struct snapfile_writer {
    pf_atomic_file af;
    void *sha; /* EVP_MD_CTX */
    uint64_t bytes;
    int ok;
} snapfile_writer;

/* Creates <path>.tmp and reserves the header area. `what` names the file in messages ("snapshot"). Returns 0
 * or -EIO / -ENOMEM with a message. */
int snapfile_create(snapfile_writer *w, const char *path, const char *what);

/* Appends n payload bytes (hashed). Returns 0, or -EIO naming the file and the reason (e.g. no space left);
 * after a failure later writes fail too and snapfile_commit refuses. */
int snapfile_write(snapfile_writer *w, const void *p, size_t n);

/* Fills m->payload_bytes and m->sha256, writes the header at offset 0 and commits the file (fsync, rename,
 * folder fsync). On any failure the temp file is removed, the previous file of that name is untouched and
 * -EIO (or -EINVAL: header too large) is returned with a message. */
int snapfile_commit(snapfile_writer *w, snapfile_meta *m);

/* Gives up: removes the temp file. */
void snapfile_abort(snapfile_writer *w);

typedef struct snapfile_reader {
    FILE *f;
    int own; /* close f at the end */
    snapfile_meta m;
    void *sha;
    uint64_t left; /* payload bytes not yet read */
    char name[512];
} snapfile_reader;

/* Opens `path` and checks its header: magic, header length, protobuf, format version, role known, sizes
 * non-negative, and file size == 4096 + payload_bytes. Returns 0 (r->m filled; read the payload with
 * snapfile_read), or -ENOENT / -EINVAL with "<path>: <problem>" in pf_errmsg(). */
int snapfile_open(snapfile_reader *r, const char *path);

/* snapfile_open on an open stream of `size` bytes (not closed by the reader), `name` for messages: the fuzz
 * target's entry. */
int snapfile_open_stream(snapfile_reader *r, FILE *f, int64_t size, const char *name);

/* Reads exactly n payload bytes into p (hashing them). Returns 0, or -EINVAL (past the payload's end, or the
 * file ended early) / -EIO with the file named. */
int snapfile_read(snapfile_reader *r, void *p, size_t n);

/* Reads (and hashes) whatever payload is left, then compares the digest with the header's. Returns 0 or
 * -EINVAL "<name>: payload checksum mismatch (corrupt file)". Does not close. */
int snapfile_finish(snapfile_reader *r);

/* Releases the reader (closes the file when it opened it). */
void snapfile_close(snapfile_reader *r);

/* The whole check of one file: open, hash the payload, compare. Returns 0 with *m, or the error. */
int snapfile_verify(const char *path, snapfile_meta *m);

#endif
