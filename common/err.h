/* Error convention for all of pfcps.
 *
 * Functions that can fail return 0 (or a non-negative count) on success and a negative errno-style
 * code on failure (-EINVAL for bad input, -EIO for I/O, -ENOMEM, -EPROTO for a malformed message,
 * -ETIMEDOUT, -EACCES for failed authentication, -ERANGE for an out-of-range value, ...).
 * The human-readable reason is kept in a per-thread buffer: the failing function writes it with
 * pf_err() and the caller that reports the failure reads it with pf_errmsg(). Daemons never abort()
 * on input that came from the network or a file. */
#ifndef PFCPS_COMMON_ERR_H
#define PFCPS_COMMON_ERR_H

#include <errno.h>

#define PF_ERRMSG_MAX 512

/* Formats a message into this thread's error buffer and returns `code` (a negative errno value),
 * so that a failure reads `return pf_err(-EINVAL, "embedding_size %d is not positive", d);`. */
int pf_err(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepends "prefix: " to this thread's current message and returns `code` (to add context while an
 * error travels up: `return pf_err_wrap(rc, "loading %s", path);`). */
int pf_err_wrap(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* This thread's last error message ("" when none was set). Valid until the next pf_err call. */
const char *pf_errmsg(void);

/* Clears this thread's error message. */
void pf_err_clear(void);

#endif
