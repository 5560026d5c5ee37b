/* The text of a pfcps.torch rank's checkpoint marker (common/ckpt.h ckpt_module_marker_write / _read hold
 * the file side): six lines, each ending in a newline,
 *   pfcps module checkpoint 1
 *   step <T>
 *   rank <r> of <W>
 *   run_id <32 lowercase hex digits>
 *   seed <decimal u64>
 *   config_digest <64 lowercase hex digits>
 * A parser of its own, with no other dependency than common/err.c, so that it is fuzzed alone
 * (tests/common/fuzz_module_marker.c). */
#ifndef PFCPS_COMMON_CKPT_MARKER_H
#define PFCPS_COMMON_CKPT_MARKER_H

#include <stddef.h>
#include <stdint.h>

#include "common/ckpt_ident.h"

#define CKPT_MODULE_MARKER_MAGIC "pfcps module checkpoint 1"
#define CKPT_MODULE_MARKER_MAX 1024 /* bytes: a marker is about 200 */

/* Writes the marker text of checkpoint `step`, rank `rank` of `workers`, identity id into buf[cap]. Returns
 * its length (< CKPT_MODULE_MARKER_MAX), or -EINVAL when cap is too small. */
int ckpt_module_marker_format(char *buf, size_t cap, int64_t step, int rank, int workers, const ckpt_ident *id);

/* Parses text[n] (`name` for messages: the file) as the marker of checkpoint `step`, rank `rank` of
 * `workers`. Numbers are plain decimals (no sign, blank or leading zero). Returns 0 with *id, or -EINVAL
 * "<name>: <what is wrong>": not the six lines, a NUL byte, more than 1 KiB, a number that is not plain
 * decimal, hex of the wrong length or case, another step, rank or W. */
int ckpt_module_marker_parse(const char *text, size_t n, const char *name, int64_t step, int rank, int workers,
                             ckpt_ident *id);

#endif
