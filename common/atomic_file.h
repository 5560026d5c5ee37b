/* A file written so that a reader finds either the previous file or the whole new one, never a torn one
 * (Redis rdb.c's discipline): write to <path>.tmp, fflush + fsync, close, rename over <path>, fsync the
 * folder so that the rename itself survives a crash. Checkpoints, exports and embeddings are written so.
 * The temp file is held under an exclusive flock(2) from open to rename, so two processes writing the same
 * path at once (a stalled server and the copy that took its shard over) cannot interleave: the second is
 * refused with -EBUSY and the file is the first one's, whole.
 *
 *   pf_atomic_file af;
 *   if ((rc = pf_atomic_open(&af, path, "checkpoint")) < 0) return rc;
 *   int ok = fwrite(..., af.f) == n && ...;
 *   return pf_atomic_commit(&af, ok);   // or pf_atomic_abort(&af) to give up */
#ifndef PFCPS_COMMON_ATOMIC_FILE_H
#define PFCPS_COMMON_ATOMIC_FILE_H

#include <stdio.h>

typedef struct pf_atomic_file {
    FILE *f;          /* write here */
    char path[4096];  /* the file's name once committed */
    char tmp[4100];   /* <path>.tmp while it is written */
    const char *what; /* for messages: "checkpoint", "safetensors", ... (may be "") */
} pf_atomic_file;

/* Creates <path>.tmp for writing, locked, truncating an earlier leftover once the lock is held. Returns 0,
 * or -EINVAL (path too long), -EBUSY "<what> <path>: being written by another process at this moment" (the
 * temp file is locked by another writer), -EIO "<what> <tmp>: cannot create: <reason>" (also when a FIFO,
 * socket or folder sits at the temp name: refused without waiting). */
int pf_atomic_open(pf_atomic_file *af, const char *path, const char *what);

/* Finishes the file: ok != 0 says every write succeeded (ferror is checked too); then fflush, fsync, fclose,
 * rename to path and fsync of its folder. On any failure the temp file is removed, path is left as it was,
 * and -EIO "<what> <path>: write failed: <reason>" is returned; else 0. */
int pf_atomic_commit(pf_atomic_file *af, int ok);

/* Gives up: closes and removes the temp file; path is left as it was. */
void pf_atomic_abort(pf_atomic_file *af);

#endif
