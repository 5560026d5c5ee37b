/* Control-plane frame and message coding, on its own so that the fuzz target can build it without the
 * service and session.
 *
 * Frame: `u32 little-endian payload length` then the payload, a protobuf-c CtlMessage
 * (proto/ctl.proto). A payload longer than the configured maximum is refused before it is read.
 * Decoded messages are checked for the invariants the service and client rely on (exactly one body,
 * roles and ranks in range, byte fields within their sizes), so a hostile peer cannot get past the
 * decoder with a message the rest of the code would misread. */
#ifndef PFCPS_COMMON_CTL_FRAME_H
#define PFCPS_COMMON_CTL_FRAME_H

#include "common/ctl_book.h"
#include "ctl.pb-c.h"

#include <stddef.h>
#include <stdint.h>

/* The control protocol's version: a member and a rendezvous of different versions refuse each other at
 * the join. It also covers the data plane the members it admits speak with each other (a run of one build):
 * 2: Failover kinds 13 (end voted) and 14 (run ended); 3: the workers' ring messages carry their collective's
 * kind (a 20-byte header, common/coll_fabric.c). */
#define CTL_PROTOCOL_VERSION 3
#define CTL_NONCE_LEN        32    /* bytes of the service's random join nonce */
#define CTL_MAC_LEN          32    /* HMAC-SHA256 output bytes */
#define CTL_MAX_MEMBERS      65536 /* per role; matches the config's servers/workers limit */

/* Packs `msg` into a new malloc'd frame (4-byte LE length + payload) in *out, its size in *out_len.
 * Returns 0, -EMSGSIZE when the payload exceeds max_frame bytes, or -ENOMEM. */
int ctl_frame_encode(const Pfcps__CtlMessage *msg, size_t max_frame, uint8_t **out, size_t *out_len);

/* Looks at the bytes received so far (buf, len). Returns 1 with *frame_len = 4 + payload length when a
 * whole frame is there, 0 when more bytes are needed, -EMSGSIZE when the announced payload length is
 * above max_frame (the peer must be dropped: the stream cannot be resynchronised). */
int ctl_frame_peek(const uint8_t *buf, size_t len, size_t max_frame, size_t *frame_len);

/* Unpacks and checks one payload (the bytes after the length). Returns 0 and *out (free with
 * pfcps__ctl_message__free_unpacked(*out, NULL)), or -EPROTO naming what is wrong. */
int ctl_msg_decode(const uint8_t *payload, size_t len, Pfcps__CtlMessage **out);

/* The invariants ctl_msg_decode enforces, on an already unpacked message. Returns 0 or -EPROTO. */
int ctl_msg_check(const Pfcps__CtlMessage *msg);

/* Join MAC: HMAC-SHA256(secret, nonce || u32le(role) || u32le(rank) || addr) into mac[CTL_MAC_LEN]
 * (RFC 2104 HMAC, OpenSSL HMAC()). Returns 0 or -EIO when libcrypto fails. */
int ctl_join_mac(const char *secret, const uint8_t *nonce, size_t nonce_len, int role, int rank,
                 const uint8_t *addr, size_t addr_len, uint8_t mac[CTL_MAC_LEN]);

/* Builds a book from a join reply, checking that it lists each server rank 0..S-1 and each worker rank
 * 0..W-1 exactly once. Returns 0 (free with ctl_book_free), -EPROTO naming the problem, or -ENOMEM. */
int ctl_book_from_reply(const Pfcps__JoinReply *reply, ctl_book *book);

/* Frees what ctl_book_from_reply allocated and zeroes the book. */
void ctl_book_free(ctl_book *book);

/* Makes *m an Error message (code: a positive errno value; text: borrowed) whose body is *e. */
void ctl_msg_set_error(Pfcps__CtlMessage *m, Pfcps__Error *e, int code, const char *text);

/* Makes *m a Failover message (server `server` lost, new membership epoch `epoch` >= 1; text: borrowed)
 * whose body is *f (docs/architecture.md, "Hot-standby shards"). */
void ctl_msg_set_failover(Pfcps__CtlMessage *m, Pfcps__Failover *f, uint32_t epoch, int server,
                          const char *text);

/* Makes *m a Shutdown message (reason: borrowed) whose body is *sd. */
void ctl_msg_set_shutdown(Pfcps__CtlMessage *m, Pfcps__Shutdown *sd, const char *reason);

/* Short name of a message body ("join", "hello", ...) for logs and errors. */
const char *ctl_msg_name(int body_case);

#endif
