/* Snapfiles: the container of every .snap member file of a checkpoint (a server's shard file, a worker's
 * state; names: common/ckpt.h).
 *
 * Layout: bytes [0, 4096) hold the magic "PFCPSNP1", a u32 little-endian header length L, the header (L
 * bytes: a protobuf SnapshotHeader, proto/ctl.proto), the SHA-256 of the header bytes, the HMAC-SHA256 of
 * the header bytes under the checkpoint key (all zero when the file is not authenticated), zero padding; the
 * payload starts at byte 4096. The header carries the payload's length and SHA-256 (OpenSSL), the run
 * identity (common/ckpt_ident.h: run id, seed, config digest) and whether the HMAC is there.
 *
 * What a reader accepts: format version 2; a known role; every size field non-negative, bounded, and
 * consistent with the others (snapfile_check_fields: a shard's rows are those of its rank for C and S, its
 * block_rows in 1..rows, its payload exactly rows x D x 8 bytes (dense shards: more, below), all products
 * overflow-checked); a file size of exactly 4096 + payload_bytes; a payload hashing to the recorded digest. A
 * reader given the key (snapfile_key_derive of the join secret) also refuses a file without an HMAC or whose
 * HMAC does not verify ("forged or written by another run's secret"); the HMAC covers the header, and through
 * its payload digest the payload. Every refusal names the file and the field or problem. Files are opened
 * with pf_fopen_regular (common/file.h): a FIFO, folder or device is refused, never waited on.
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
#include "common/ckpt_ident.h"

#define SNAPFILE_HDR_AREA 4096
#define SNAPFILE_VERSION  2
/* Bounds a reader puts on header fields (the config's own limits): D, C, S and W. */
#define SNAPFILE_MAX_DIM     65536
#define SNAPFILE_MAX_CLASSES 1000000000000000LL
#define SNAPFILE_MAX_MEMBERS 65536
/* A shard file's block (block_rows x D weights and momentum, what a reader holds in memory at once) is at
 * most this many bytes, unless it is a single row. Writers use ~2 MiB. */
#define SNAPFILE_MAX_BLOCK_BYTES (256ull << 20)

/* The checkpoint key: HMAC-SHA256(secret, "pfcps checkpoint v1"), derived from the join secret. */
typedef struct snapfile_key {
    uint8_t k[32];
} snapfile_key;

/* Derives the checkpoint key from the join secret (non-empty). Returns 0, or -EINVAL (empty secret) / -EIO
 * (OpenSSL failed) with a message. */
int snapfile_key_derive(const char *secret, snapfile_key *key);

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
    ckpt_ident id;          /* the run that wrote it: run id, seed (header field seed), config digest */
    uint64_t payload_bytes; /* set by snapfile_commit */
    uint8_t sha256[32];     /* set by snapfile_commit */
    int authenticated; /* set by snapfile_commit (a key was given) and by the reader (the file says so) */
    int dense;         /* shard: the pfc_update = dense layout (server/snapshot.h), header field dense */
    int adamw;         /* shard: the optimizer = adamw layout (server/snapshot.h), header field adamw */
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

/* Fills m->payload_bytes, m->sha256 and m->authenticated, writes the header (with its HMAC under key when
 * key is not NULL) at offset 0 and commits the file (fsync, rename, folder fsync). On any failure the temp
 * file is removed, the previous file of that name is untouched and -EIO (or -EINVAL: header too large) is
 * returned with a message. */
int snapfile_commit(snapfile_writer *w, snapfile_meta *m, const snapfile_key *key);

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

/* Opens `path` (a regular file: pf_fopen_regular) and checks its header: magic, header length, header digest,
 * the HMAC when key is not NULL, protobuf, format version, role, identity lengths, every field against the
 * others (snapfile_check_fields), and file size == 4096 + payload_bytes. Returns 0 (r->m filled; read the
 * payload with snapfile_read), or with "<path>: <problem>" in pf_errmsg(): -ENOENT (no such file), -EACCES
 * (permission denied), -EIO ("a directory, not a regular file", read errors), -EINVAL (the header: the
 * field named), -EPERM (key given: "no HMAC" or "HMAC does not verify: forged or written by another run's
 * secret"). */
int snapfile_open(snapfile_reader *r, const char *path, const snapfile_key *key);

/* snapfile_open on an open stream of `size` bytes (not closed by the reader), `name` for messages: the fuzz
 * target's entry. */
int snapfile_open_stream(snapfile_reader *r, FILE *f, int64_t size, const char *name,
                         const snapfile_key *key);

/* Checks a decoded header's fields against each other and against the bounds above (snapfile_open runs it):
 * both roles: 1 <= servers, workers (when set) <= SNAPFILE_MAX_MEMBERS, rank below its role's count, step
 * >= 0. Shard: 1 <= D <= SNAPFILE_MAX_DIM, 0 <= C <= SNAPFILE_MAX_CLASSES, rows = the local rows of rank in
 * C classes over S servers, 1 <= block_rows <= max(rows, 1), block_rows x D x 8 <= SNAPFILE_MAX_BLOCK_BYTES
 * unless block_rows = 1, payload_bytes = rows x D x 8; with dense set (pfc_update = dense, server/snapshot.h)
 * the rows carry 8 more bytes each (block_rows x (D x 8 + 8) bounds the block) and payload_bytes = rows x (D
 * x 8 + 8) + (step + 2) x 8 (mu, wd and the lr of steps 0 .. step-1); with adamw set (optimizer = adamw) a
 * row holds D x 12 bytes (weights and two moments; + 8 when dense) and the prefix is (step + 4) x 8 bytes
 * (beta1, beta2, eps, wd and the lr of steps 0 .. step-1), dense or not. Worker: rows x 4 <= payload_bytes.
 * Every product is overflow-checked (common/checked.h). Returns 0, or -EINVAL "<name>: header field <field>
 * ..." naming the field and the values it disagrees with. */
int snapfile_check_fields(const snapfile_meta *m, const char *name);

/* Checks that a member file's header says what its name says: role, step, rank of n (servers for a shard,
 * workers for a worker file). Returns 0 or -EINVAL "<name>: header says ... (file name says ...)". */
int snapfile_check_member(const snapfile_meta *m, const char *name, const char *role, int64_t step, int rank,
                          int n);

/* Reads exactly n payload bytes into p (hashing them). Returns 0, or -EINVAL (past the payload's end, or the
 * file ended early) / -EIO with the file named. */
int snapfile_read(snapfile_reader *r, void *p, size_t n);

/* Reads (and hashes) whatever payload is left, then compares the digest with the header's. Returns 0 or
 * -EINVAL "<name>: payload checksum mismatch (corrupt file)". Does not close. */
int snapfile_finish(snapfile_reader *r);

/* Releases the reader (closes the file when it opened it). */
void snapfile_close(snapfile_reader *r);

/* The whole check of one file: open (with key, may be NULL), hash the payload, compare. Returns 0 with *m,
 * or the error. */
int snapfile_verify(const char *path, const snapfile_key *key, snapfile_meta *m);

#endif
