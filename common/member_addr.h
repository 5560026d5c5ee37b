/* A worker has two fabric endpoints: one towards the parameter servers (ps_client) and one dedicated to
 * the workers' ring collectives (coll_fabric). Both names travel in the one address field of its
 * address-book entry (ctl_member.addr), packed as: u8 count, then per part u8 length + bytes.
 * Servers have a single part (their serving endpoint). On a run with device = cuda and NCCL, worker 0
 * adds a third part: the 128-byte NCCL unique id (CUDA_NCCL_ID_BYTES) every worker builds its NCCL
 * communicator from (worker/train.c). */
#ifndef PFCPS_COMMON_MEMBER_ADDR_H
#define PFCPS_COMMON_MEMBER_ADDR_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/err.h"

/* Packs n parts into out (capacity cap bytes). Returns the packed length, or -ENOSPC. */
static inline int member_addr_pack(uint8_t *out, size_t cap, int n, const void *const *parts,
                                   const size_t *lens)
{
    size_t off = 1;
    if (cap < 1 || n < 0 || n > 255)
        return pf_err(-ENOSPC, "member address: bad part count %d", n);
    out[0] = (uint8_t)n;
    for (int i = 0; i < n; i++) {
        if (lens[i] > 255 || off + 1 + lens[i] > cap)
            return pf_err(-ENOSPC, "member address: part %d (%zu bytes) does not fit in %zu", i, lens[i],
                          cap);
        out[off++] = (uint8_t)lens[i];
        memcpy(out + off, parts[i], lens[i]);
        off += lens[i];
    }
    return (int)off;
}

/* Finds part i of a packed address. Returns 0 with *part and *plen set, or -EPROTO for a malformed address
 * (it came from the network: every length is checked against len). */
static inline int member_addr_part(const uint8_t *addr, size_t len, int i, const void **part, size_t *plen)
{
    if (len < 1 || i < 0 || i >= addr[0])
        return pf_err(-EPROTO, "member address: no part %d (address of %zu bytes)", i, len);
    size_t off = 1;
    for (int k = 0;; k++) {
        if (off + 1 > len || off + 1 + addr[off] > len)
            return pf_err(-EPROTO, "member address: part %d overruns the %zu-byte address", k, len);
        if (k == i) {
            *part = addr + off + 1;
            *plen = addr[off];
            return 0;
        }
        off += 1 + (size_t)addr[off];
    }
}

#endif
