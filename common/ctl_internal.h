/* What the control plane's files (ctl_frame.c, ctl_forming.c, ctl_rendezvous.c, ctl_session.c) share;
 * private to them. */
#ifndef PFCPS_COMMON_CTL_INTERNAL_H
#define PFCPS_COMMON_CTL_INTERNAL_H

#include "common/ctl.h"

#include <stddef.h>
#include <stdint.h>

/* Milliseconds between checks of the service's stop flag and of a joining member's interrupt flag. */
#define CTL_TICK_MS 100

/* Bytes of a member's metrics address in its join (Join.metrics_address), terminator included: a longer one
 * is refused. */
#define CTL_MAX_METRICS_ADDR 256

/* The MAC of a Resume message (proto/ctl.proto): ctl_join_mac over addr || "\0pfcps resume\0" || run_id (16
 * bytes) || run_nonce (16) || config_digest (32) || u32le(epoch) || u32le(lost[i]) for each of the nlost lost
 * servers || config_text (its bytes, no terminator; NULL counts as ""). Returns 0 or -ENOMEM / -EIO. */
int ctl_resume_mac(const char *secret, const uint8_t *nonce, size_t nonce_len, int role, int rank,
                   const uint8_t *addr, size_t addr_len, const uint8_t *run_id, const uint8_t *run_nonce,
                   const uint8_t *config_digest, uint32_t epoch, const int32_t *lost, size_t nlost,
                   const char *config_text, uint8_t mac[32]);

/* The join MAC of (role, rank, fabric address addr[addr_len], metrics address maddr, replicas, endpoint keys)
 * over the hello's nonce: ctl_join_mac over addr, then "\0pfcps metrics\0" || maddr when maddr is not NULL or
 * "", then "\0pfcps replicas\0" || u32le(replicas) when replicas is not 0, then "\0pfcps endpoint keys\0" ||
 * keys when keys is not NULL or ""; so they are authenticated with the rest while a member without them
 * computes the MAC over addr alone. Returns 0 or -EIO / -ENOMEM (ctl_session.c). */
int ctl_member_mac(const char *secret, const uint8_t *nonce, size_t nonce_len, int role, int rank,
                   const uint8_t *addr, size_t addr_len, const char *maddr, uint32_t replicas,
                   const char *keys, uint8_t mac[32]);

/* "server" or "worker" (role: a ctl_role), for logs and errors. */
static inline const char *ctl_role_name(int role)
{
    return role == CTL_ROLE_SERVER ? "server" : "worker";
}

#endif
