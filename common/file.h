/* File reads: one careful open for every file pfcps reads from a path a user gave (configs, checkpoints,
 * safetensors, images being packed or embedded, pairs lists, .bin evaluation sets, index files), a
 * whole-file read and a head read on top of it, a file's SHA-256, and the set of folders a walk has entered
 * (so that no link loop is followed). */
#ifndef PFCPS_COMMON_FILE_H
#define PFCPS_COMMON_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>

/* What kind of file st describes, as words for a message: "a regular file", "a directory", "a FIFO",
 * "a character device", "a block device", "a socket", "a symbolic link" (from lstat), or "not a regular
 * file" for anything else. */
const char *pf_file_kind(const struct stat *st);

/* Opens the regular file at path for reading without ever blocking on it: the path is stat'd first and
 * anything but a regular file is refused before it is opened (a device is never opened); the open itself
 * uses O_NONBLOCK, so a FIFO put in place between the stat and the open does not wait for a writer, and
 * the descriptor is fstat'd again. O_NONBLOCK is cleared before returning, so reads behave as usual.
 * On success returns the descriptor (close-on-exec; close() it) and, when st is not NULL, fills *st.
 * Returns, with a message that names the problem but not the path (callers add it with pf_err_wrap):
 *   -ENOENT "cannot open: <reason>" (no such file, or a missing folder on the way),
 *   -EACCES "permission denied",
 *   -EIO "<kind>, not a regular file" (kind as pf_file_kind: "a FIFO, not a regular file"),
 *   -EIO "cannot open: <reason>" (any other failure). */
int pf_open_regular(const char *path, struct stat *st);

/* pf_open_regular as a stdio stream opened for reading ("rb"): *f on success (fclose() it), NULL on
 * failure. Returns 0, or the errors of pf_open_regular (the message does not name the path), or -ENOMEM
 * "out of memory". */
int pf_fopen_regular(const char *path, FILE **f);

/* Opens path for writing (an output pfcps makes: a log, a trace, an events file, a pid file) without ever
 * blocking on it: O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | flags (flags: O_CREAT, O_APPEND, O_TRUNC,
 * O_EXCL as the caller needs), mode for a file it creates; the descriptor is fstat'd and anything but a
 * regular file or a character device (/dev/null, a terminal) is refused, so a FIFO, socket or folder at the
 * path never makes the daemon wait for a reader. O_NONBLOCK is cleared before returning. Returns the
 * descriptor (close() it), or, with a message that names the problem but not the path:
 *   -EIO "<kind>, not a regular file" (a FIFO, with or without a reader; a socket; a folder), -EACCES "permission denied", -ENOENT / -EEXIST / other -errno "cannot open: <reason>". */
int pf_open_output(const char *path, int flags, mode_t mode);

/* pf_open_output as a stdio stream: append = 1 opens for appending ("a"), 0 truncates ("w"), creating the
 * file in both cases (mode 0644). Returns 0 with *f set (fclose() it), or the errors of pf_open_output, or
 * -ENOMEM "out of memory". */
int pf_fopen_output(const char *path, int append, FILE **f);

/* Reads the whole regular file at path into a fresh malloc'd buffer: *data (free() it; one byte is
 * allocated past the end and set to 0, so a text file may be read as a C string) and *len (bytes).
 * max_bytes > 0 refuses a larger file; 0 means no limit.
 * The file is opened with pf_open_regular, so a FIFO, a device or a folder is refused at once instead of
 * blocking the caller.
 * Returns 0, or (the message names the problem, not the path: callers add it with pf_err_wrap)
 *   the errors of pf_open_regular (-ENOENT, -EACCES "permission denied", -EIO "a FIFO, not a regular file",
 *   ...), -EFBIG "larger than <max_bytes> bytes",
 *   -ENOMEM "out of memory for <n> bytes", -EIO "short read (<got> of <n> bytes)" / "read failed: <reason>".
 * On failure *data is NULL and *len is 0. */
int pf_read_file(const char *path, size_t max_bytes, uint8_t **data, size_t *len);

/* The first bytes of the regular file at path (a header or magic to look at): up to n bytes into buf,
 * *got = how many (fewer when the file is shorter). A FIFO, device or folder is refused before any read,
 * as in pf_read_file. Returns 0, or the errors of pf_read_file (the message does not name the path). */
int pf_read_head(const char *path, void *buf, size_t n, size_t *got);

/* The SHA-256 (FIPS 180-4, OpenSSL's EVP) of the whole regular file at path into d, read in 64 KiB pieces.
 * A FIFO, device or folder is refused before any read, as in pf_read_file. Returns 0, or the errors of
 * pf_open_regular with the path in front ("<path>: a FIFO, not a regular file", "<path>: permission
 * denied", ...), -EIO "<path>: read failed: <reason>", -ENOMEM. */
int pf_file_sha256(const char *path, uint8_t d[32]);

/* The folders a walk has entered, by (st_dev, st_ino), so that a walk following symbolic links enters each
 * folder once: a link back to a folder above (a loop) or a second link to a folder already walked is
 * skipped instead of being walked again (one loop would repeat every file below it until the path gets too
 * long; two loops make the walk exponential). Zero-initialise; pf_dirset_free when done. */
typedef struct pf_dirset {
    struct pf_dirset_slot *slot; /* open addressing, cap a power of two, at most half full */
    size_t n, cap;
} pf_dirset;

/* Marks the folder st describes (stat, following links) as entered. Returns 1 when it was not entered
 * before (walk into it), 0 when it was (skip it), -ENOMEM "out of memory". */
int pf_dirset_enter(pf_dirset *s, const struct stat *st);

/* Frees the set (it may be used again, empty). */
void pf_dirset_free(pf_dirset *s);

#endif
