/* libFuzzer target for the control-plane decoder: the input is a byte stream as a peer would send
 * it; every frame in it goes through ctl_frame_peek (length, limit), ctl_msg_decode (protobuf-c unpack
 * + ctl_msg_check), and a join reply also through ctl_book_from_reply, exactly as ctl_rendezvous.c and
 * ctl_session.c do. The frame limit is 4 KiB so oversized lengths are exercised. Built only with -Dfuzz=true
 * (clang). */
#include "common/ctl_frame.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t off = 0;
    while (off < size) {
        size_t flen;
        int rc = ctl_frame_peek(data + off, size - off, 4096, &flen);
        if (rc <= 0)
            break; /* need more bytes, or an oversized length: the service drops such a peer */
        Pfcps__CtlMessage *m = NULL;
        if (ctl_msg_decode(data + off + 4, flen - 4, &m) == 0) {
            if (m->body_case == PFCPS__CTL_MESSAGE__BODY_JOIN_REPLY) {
                ctl_book b;
                if (ctl_book_from_reply(m->join_reply, &b) == 0) {
                    /* Touch every entry the way a member reads its book. */
                    volatile size_t sum = strlen(b.config_text);
                    for (int i = 0; i < b.num_servers; i++)
                        sum += b.servers[i].addr_len + (size_t)b.servers[i].rank;
                    for (int i = 0; i < b.num_workers; i++)
                        sum += b.workers[i].addr_len + (size_t)b.workers[i].rank;
                    (void)sum;
                    ctl_book_free(&b);
                }
            } else if (m->body_case == PFCPS__CTL_MESSAGE__BODY_JOIN) {
                uint8_t mac[CTL_MAC_LEN];
                ctl_join_mac("fuzz", m->join->mac.data, m->join->mac.len, (int)m->join->role, m->join->rank,
                             m->join->fabric_addr.data, m->join->fabric_addr.len, mac);
            }
            pfcps__ctl_message__free_unpacked(m, NULL);
        }
        off += flen;
    }
    return 0;
}
