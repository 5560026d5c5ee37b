/* Whole-file reads: one helper for every file pfcps reads into memory at once (checkpoints, safetensors,
 * images being packed or embedded, pairs lists, .bin evaluation sets), and one for a file's SHA-256. */
#ifndef PFCPS_COMMON_FILE_H
#define PFCPS_COMMON_FILE_H

#include <stddef.h>
#include <stdint.h>

/* Reads the whole regular file at path into a fresh malloc'd buffer: *data (free() it; one byte is
 * allocated past the end and set to 0, so a text file may be read as a C string) and *len (bytes).
 * max_bytes > 0 refuses a larger file; 0 means no limit.
 * The file is opened with O_NONBLOCK and fstat'd before any read, so a FIFO, a device or a folder is
 * refused at once instead of blocking the caller.
 * Returns 0, or (the message names the problem, not the path: callers add it with pf_err_wrap)
 *   -ENOENT "cannot open: <reason>" (no such file), -EIO "cannot open: <reason>" (other open failures),
 *   -EIO "not a regular file", -EFBIG "larger than <max_bytes> bytes",
 *   -ENOMEM "out of memory for <n> bytes", -EIO "short read (<got> of <n> bytes)" / "read failed: <reason>".
 * On failure *data is NULL and *len is 0. */
int pf_read_file(const char *path, size_t max_bytes, uint8_t **data, size_t *len);

/* The first bytes of the regular file at path (a header or magic to look at): up to n bytes into buf,
 * *got = how many (fewer when the file is shorter). A FIFO, device or folder is refused before any read,
 * as in pf_read_file. Returns 0, or the errors of pf_read_file (the message does not name the path). */
int pf_read_head(const char *path, void *buf, size_t n, size_t *got);

/* The SHA-256 (FIPS 180-4, OpenSSL's EVP) of the whole regular file at path into d, read in 64 KiB pieces.
 * A FIFO, device or folder is refused before any read, as in pf_read_file. Returns 0, or -ENOENT / -EIO
 * "<path>: cannot open: <reason>", -EIO "<path>: not a regular file" / "<path>: read failed: <reason>",
 * -ENOMEM. */
int pf_file_sha256(const char *path, uint8_t d[32]);

#endif
