/* The run identity every file of a checkpoint carries (names: common/ckpt.h): which run wrote it, with which
 * seed and which identity-relevant config. A type only, with no dependencies, so that the snapfile container
 * (common/snapfile.h), the control plane (common/ctl_book.h) and the checkpoint folders (common/ckpt.h, which
 * has the functions over it) can all name it. */
#ifndef PFCPS_COMMON_CKPT_IDENT_H
#define PFCPS_COMMON_CKPT_IDENT_H

#include <stdint.h>

#define CKPT_RUN_ID_BYTES 16 /* a run id: random bytes, printed as 32 hex digits */
#define CKPT_DIGEST_BYTES 32 /* a SHA-256 */

typedef struct ckpt_ident {
    uint8_t run_id[CKPT_RUN_ID_BYTES];        /* fixed at the run's first start, kept across resumes */
    uint64_t seed;                            /* config key seed */
    uint8_t config_digest[CKPT_DIGEST_BYTES]; /* ckpt_config_digest of the run config (common/ckpt.h) */
} ckpt_ident;

#endif
