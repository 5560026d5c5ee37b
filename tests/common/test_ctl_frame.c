/* Control-plane frames and messages: the join MAC against RFC 4231's HMAC-SHA256 test vector (laid
 * out so the vector's message is exactly nonce || u32le(role) || u32le(rank) || addr), frame round
 * trip, partial frames, the size limit, and each malformed message the decoder must refuse.
 *
 * `test_ctl_frame --write-corpus DIR` writes the fuzz seed corpus (tests/common/fuzz_ctl_frame_corpus). */
#include "common/ctl_frame.h"
#include "common/ctl_internal.h"
#include "common/err.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_mac_rfc4231(void **state)
{
    (void)state;
    /* RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?". */
    const char *data = "what do ya want for nothing?";
    const uint8_t want[32] = {0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e, 0x6a, 0x04, 0x24,
                              0x26, 0x08, 0x95, 0x75, 0xc7, 0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27,
                              0x39, 0x83, 0x9d, 0xec, 0x58, 0xb9, 0x64, 0xec, 0x38, 0x43};
    /* nonce = bytes 0..15, role = bytes 16..19 little-endian, rank = 20..23, addr = 24..27. */
    const uint8_t *d = (const uint8_t *)data;
    int role = (int)((uint32_t)d[16] | (uint32_t)d[17] << 8 | (uint32_t)d[18] << 16 | (uint32_t)d[19] << 24);
    int rank = (int)((uint32_t)d[20] | (uint32_t)d[21] << 8 | (uint32_t)d[22] << 16 | (uint32_t)d[23] << 24);
    uint8_t mac[CTL_MAC_LEN];
    assert_int_equal(ctl_join_mac("Jefe", d, 16, role, rank, d + 24, 4, mac), 0);
    assert_memory_equal(mac, want, 32);
    /* Any change of rank changes the mac. */
    uint8_t mac2[CTL_MAC_LEN];
    assert_int_equal(ctl_join_mac("Jefe", d, 16, role, rank + 1, d + 24, 4, mac2), 0);
    assert_memory_not_equal(mac, mac2, 32);
}

static Pfcps__CtlMessage *make_join(Pfcps__CtlMessage *m, Pfcps__Join *j, uint8_t *mac, size_t maclen,
                                    const char *addr)
{
    pfcps__ctl_message__init(m);
    pfcps__join__init(j);
    j->role = PFCPS__ROLE__WORKER;
    j->rank = 3;
    j->fabric_addr.data = (uint8_t *)addr;
    j->fabric_addr.len = strlen(addr);
    j->mac.data = mac;
    j->mac.len = maclen;
    j->protocol_version = CTL_PROTOCOL_VERSION;
    m->body_case = PFCPS__CTL_MESSAGE__BODY_JOIN;
    m->join = j;
    return m;
}

static void test_round_trip_and_partial(void **state)
{
    (void)state;
    uint8_t mac[32];
    memset(mac, 0xab, sizeof mac);
    Pfcps__CtlMessage m;
    Pfcps__Join j;
    make_join(&m, &j, mac, 32, "some-fabric-address");
    uint8_t *frame;
    size_t len;
    assert_int_equal(ctl_frame_encode(&m, 4096, &frame, &len), 0);
    /* The length prefix is the payload size, little-endian. */
    size_t payload = len - 4;
    assert_int_equal(frame[0] | frame[1] << 8 | frame[2] << 16 | frame[3] << 24, (int)payload);
    size_t flen = 0;
    for (size_t k = 0; k < len; k++)
        assert_int_equal(ctl_frame_peek(frame, k, 4096, &flen), 0);
    assert_int_equal(ctl_frame_peek(frame, len, 4096, &flen), 1);
    assert_int_equal(flen, len);
    /* Exactly at the limit is fine, one byte above is not. */
    assert_int_equal(ctl_frame_peek(frame, len, payload, &flen), 1);
    assert_int_equal(ctl_frame_peek(frame, len, payload - 1, &flen), -EMSGSIZE);
    assert_non_null(strstr(pf_errmsg(), "exceeds the maximum"));
    uint8_t *none = NULL;
    assert_int_equal(ctl_frame_encode(&m, payload - 1, &none, &flen), -EMSGSIZE);
    assert_null(none);
    Pfcps__CtlMessage *d;
    assert_int_equal(ctl_msg_decode(frame + 4, payload, &d), 0);
    assert_int_equal(d->body_case, PFCPS__CTL_MESSAGE__BODY_JOIN);
    assert_int_equal(d->join->rank, 3);
    assert_int_equal(d->join->role, PFCPS__ROLE__WORKER);
    assert_int_equal(d->join->fabric_addr.len, strlen("some-fabric-address"));
    assert_memory_equal(d->join->fabric_addr.data, "some-fabric-address", d->join->fabric_addr.len);
    assert_memory_equal(d->join->mac.data, mac, 32);
    pfcps__ctl_message__free_unpacked(d, NULL);
    /* A 4 GiB - 1 announced length is refused without waiting for the bytes. */
    const uint8_t huge[4] = {0xff, 0xff, 0xff, 0xff};
    assert_int_equal(ctl_frame_peek(huge, 4, 1 << 20, &flen), -EMSGSIZE);
    free(frame);
}

static void expect_proto(const uint8_t *p, size_t n, const char *want)
{
    Pfcps__CtlMessage *d = NULL;
    pf_err_clear();
    int rc = ctl_msg_decode(p, n, &d);
    printf("decode of %zu bytes: rc %d: %s\n", n, rc, pf_errmsg());
    assert_int_equal(rc, -EPROTO);
    assert_null(d);
    assert_non_null(strstr(pf_errmsg(), want));
}

static void expect_msg_proto(const Pfcps__CtlMessage *m, const char *want)
{
    size_t n = pfcps__ctl_message__get_packed_size(m);
    uint8_t *buf = malloc(n + 1);
    pfcps__ctl_message__pack(m, buf);
    expect_proto(buf, n, want);
    free(buf);
}

static void test_bad_messages(void **state)
{
    (void)state;
    const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x12, 0x99};
    expect_proto(garbage, sizeof garbage, "undecodable");
    expect_proto(garbage, 0, "no body");                  /* empty payload: a message with no body */
    const uint8_t truncated_field[] = {0x12, 0x20, 0x08}; /* field 2 (join), length 32, one byte */
    expect_proto(truncated_field, sizeof truncated_field, "undecodable");

    uint8_t mac[32] = {0};
    Pfcps__CtlMessage m;
    Pfcps__Join j;
    make_join(&m, &j, mac, 5, "a");
    expect_msg_proto(&m, "mac must be 32 bytes");
    make_join(&m, &j, mac, 32, "a");
    j.role = 7;
    expect_msg_proto(&m, "role 7");
    make_join(&m, &j, mac, 32, "a");
    j.rank = -1;
    expect_msg_proto(&m, "rank -1");
    char big[CTL_MAX_ADDR + 2];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    make_join(&m, &j, mac, 32, big);
    expect_msg_proto(&m, "fabric address");
    /* resume steps: one identity each, of the right lengths */
    int64_t steps[2] = {8, 12};
    Pfcps__CheckpointIdent id = PFCPS__CHECKPOINT_IDENT__INIT, *ids[2] = {&id, &id};
    id.run_id.data = mac;
    id.run_id.len = CKPT_RUN_ID_BYTES;
    id.config_digest.data = mac;
    id.config_digest.len = CKPT_DIGEST_BYTES;
    make_join(&m, &j, mac, 32, "a");
    j.resume_steps = steps;
    j.n_resume_steps = 2;
    j.resume_idents = ids;
    j.n_resume_idents = 1;
    expect_msg_proto(&m, "1 resume identities for 2 resume steps");
    j.n_resume_idents = 2;
    id.run_id.len = 8;
    expect_msg_proto(&m, "resume identity 0: run_id must be 16 bytes");

    Pfcps__Hello h = PFCPS__HELLO__INIT;
    h.nonce.data = mac;
    h.nonce.len = 8;
    pfcps__ctl_message__init(&m);
    m.body_case = PFCPS__CTL_MESSAGE__BODY_HELLO;
    m.hello = &h;
    expect_msg_proto(&m, "nonce must be 32 bytes");

    /* Failover: epoch >= 1, server in range; a valid one decodes with its fields. */
    Pfcps__Failover f;
    ctl_msg_set_failover(&m, &f, 0, 1, "server[1] lost");
    expect_msg_proto(&m, "epoch 0 must be >= 1");
    ctl_msg_set_failover(&m, &f, 2, -3, "server[1] lost");
    expect_msg_proto(&m, "server -3");
    ctl_msg_set_failover(&m, &f, 2, 1, "server[1] lost");
    size_t n = pfcps__ctl_message__get_packed_size(&m);
    uint8_t *buf = malloc(n);
    pfcps__ctl_message__pack(&m, buf);
    Pfcps__CtlMessage *d = NULL;
    assert_int_equal(ctl_msg_decode(buf, n, &d), 0);
    assert_int_equal(d->body_case, PFCPS__CTL_MESSAGE__BODY_FAILOVER);
    assert_int_equal(d->failover->epoch, 2);
    assert_int_equal(d->failover->server, 1);
    assert_string_equal(d->failover->text, "server[1] lost");
    pfcps__ctl_message__free_unpacked(d, NULL);
    free(buf);
}

/* A Resume (a member of a running run to a restarted rendezvous) with valid fields into *r / *m. */
static void make_resume(Pfcps__CtlMessage *m, Pfcps__Resume *r, uint8_t *bytes32, int32_t *lost, size_t nlost)
{
    pfcps__resume__init(r);
    r->role = PFCPS__ROLE__WORKER;
    r->rank = 1;
    r->fabric_addr.data = bytes32;
    r->fabric_addr.len = 8;
    r->mac.data = bytes32;
    r->mac.len = 32;
    r->protocol_version = CTL_PROTOCOL_VERSION;
    r->run_id.data = bytes32;
    r->run_id.len = CKPT_RUN_ID_BYTES;
    r->run_nonce.data = bytes32;
    r->run_nonce.len = 16;
    r->config_digest.data = bytes32;
    r->config_digest.len = CKPT_DIGEST_BYTES;
    r->epoch = 3;
    r->lost_servers = lost;
    r->n_lost_servers = nlost;
    pfcps__ctl_message__init(m);
    m->body_case = PFCPS__CTL_MESSAGE__BODY_RESUME;
    m->resume = r;
}

/* Resume: each field's length and range is checked; a valid one (and its acknowledgement, without a mac)
 * decodes with its fields. Its MAC covers every field (ctl_resume_mac). */
static void test_resume(void **state)
{
    (void)state;
    uint8_t b[32];
    for (int i = 0; i < 32; i++)
        b[i] = (uint8_t)i;
    int32_t lost[2] = {0, 2};
    Pfcps__CtlMessage m;
    Pfcps__Resume r;
    make_resume(&m, &r, b, lost, 2);
    r.role = 5;
    expect_msg_proto(&m, "resume: role 5");
    make_resume(&m, &r, b, lost, 2);
    r.rank = -2;
    expect_msg_proto(&m, "resume: rank -2");
    make_resume(&m, &r, b, lost, 2);
    r.mac.len = 31;
    expect_msg_proto(&m, "resume: mac (31 bytes)");
    make_resume(&m, &r, b, lost, 2);
    r.run_id.len = 15;
    expect_msg_proto(&m, "run_id (15)");
    make_resume(&m, &r, b, lost, 2);
    r.run_nonce.len = 0;
    expect_msg_proto(&m, "run_nonce (0)");
    make_resume(&m, &r, b, lost, 2);
    r.config_digest.len = 16;
    expect_msg_proto(&m, "config_digest (16)");
    int32_t bad_lost[1] = {-1};
    make_resume(&m, &r, b, bad_lost, 1);
    expect_msg_proto(&m, "resume: lost server -1");
    char big[CTL_MAX_ADDR + 1];
    memset(big, 'x', sizeof big);
    make_resume(&m, &r, b, lost, 2);
    r.fabric_addr.data = (uint8_t *)big;
    r.fabric_addr.len = sizeof big;
    expect_msg_proto(&m, "resume: fabric address");
    for (int ack = 0; ack < 2; ack++) {
        make_resume(&m, &r, b, lost, 2);
        if (ack)
            r.mac.len = 0;
        size_t n = pfcps__ctl_message__get_packed_size(&m);
        uint8_t *buf = malloc(n);
        pfcps__ctl_message__pack(&m, buf);
        Pfcps__CtlMessage *d = NULL;
        assert_int_equal(ctl_msg_decode(buf, n, &d), 0);
        assert_int_equal(d->body_case, PFCPS__CTL_MESSAGE__BODY_RESUME);
        assert_int_equal(d->resume->epoch, 3);
        assert_int_equal(d->resume->n_lost_servers, 2);
        assert_int_equal(d->resume->lost_servers[1], 2);
        assert_int_equal(d->resume->mac.len, ack ? 0 : 32);
        assert_string_equal(ctl_msg_name(d->body_case), "resume");
        pfcps__ctl_message__free_unpacked(d, NULL);
        free(buf);
    }
    /* The MAC changes with every field it covers. */
    uint8_t base[32], other[32], nonce[32] = {7};
    assert_int_equal(ctl_resume_mac("s", nonce, 32, 1, 1, b, 8, b, b, b, 3, lost, 2, "lr = 0.1", base), 0);
    assert_int_equal(ctl_resume_mac("s", nonce, 32, 1, 1, b, 8, b, b, b, 4, lost, 2, "lr = 0.1", other), 0);
    assert_memory_not_equal(base, other, 32);
    assert_int_equal(ctl_resume_mac("s", nonce, 32, 1, 1, b, 8, b, b, b, 3, lost, 1, "lr = 0.1", other), 0);
    assert_memory_not_equal(base, other, 32);
    assert_int_equal(ctl_resume_mac("s", nonce, 32, 1, 1, b, 8, b + 1, b, b, 3, lost, 2, "lr = 0.1", other),
                     0);
    assert_memory_not_equal(base, other, 32);
    assert_int_equal(ctl_resume_mac("t", nonce, 32, 1, 1, b, 8, b, b, b, 3, lost, 2, "lr = 0.1", other), 0);
    assert_memory_not_equal(base, other, 32);
    assert_int_equal(ctl_resume_mac("s", nonce, 32, 1, 1, b, 8, b, b, b, 3, lost, 2, "lr = 0.2", other), 0);
    assert_memory_not_equal(base, other, 32); /* the run config text */
    assert_int_equal(ctl_resume_mac("s", nonce, 32, 1, 1, b, 8, b, b, b, 3, lost, 2, "lr = 0.1", other), 0);
    assert_memory_equal(base, other, 32);
}

static void test_book_from_reply(void **state)
{
    (void)state;
    Pfcps__Member mem[3], *ptr[3];
    const char *addrs[3] = {"s0", "w0", "w1"};
    for (int i = 0; i < 3; i++) {
        pfcps__member__init(&mem[i]);
        mem[i].role = i == 0 ? PFCPS__ROLE__SERVER : PFCPS__ROLE__WORKER;
        mem[i].rank = i == 0 ? 0 : i - 1;
        mem[i].fabric_addr.data = (uint8_t *)addrs[i];
        mem[i].fabric_addr.len = 2;
        ptr[i] = &mem[i];
    }
    /* Listed out of order: the book is indexed by rank. */
    Pfcps__Member *shuffled[3] = {ptr[2], ptr[0], ptr[1]};
    Pfcps__JoinReply r = PFCPS__JOIN_REPLY__INIT;
    r.n_members = 3;
    r.members = shuffled;
    r.num_servers = 1;
    r.num_workers = 2;
    r.num_classes = 77;
    r.config_text = (char *)"num_classes = 77\n";
    uint8_t run_id[CKPT_RUN_ID_BYTES];
    memset(run_id, 0x5a, sizeof run_id);
    r.run_id.data = run_id;
    r.run_id.len = sizeof run_id - 1; /* a run id must be 16 bytes */
    ctl_book b;
    assert_int_equal(ctl_book_from_reply(&r, &b), -EPROTO);
    assert_non_null(strstr(pf_errmsg(), "run_id of 15 bytes"));
    r.run_id.len = sizeof run_id;
    assert_int_equal(ctl_book_from_reply(&r, &b), 0);
    assert_memory_equal(b.run_id, run_id, sizeof run_id);
    assert_int_equal(b.num_servers, 1);
    assert_int_equal(b.num_workers, 2);
    assert_int_equal(b.num_classes, 77);
    assert_memory_equal(b.servers[0].addr, "s0", 2);
    assert_memory_equal(b.workers[0].addr, "w0", 2);
    assert_memory_equal(b.workers[1].addr, "w1", 2);
    assert_int_equal(b.workers[1].rank, 1);
    assert_string_equal(b.config_text, "num_classes = 77\n");
    assert_int_equal(b.nlost, 0);
    ctl_book_free(&b);

    /* A replacement's lost servers: copied; one outside [0, num_servers), or too many: refused. */
    int32_t lost[2] = {0, 0};
    r.lost_servers = lost;
    r.n_lost_servers = 1;
    assert_int_equal(ctl_book_from_reply(&r, &b), 0);
    assert_int_equal(b.nlost, 1);
    assert_int_equal(b.lost[0], 0);
    ctl_book_free(&b);
    lost[0] = 1;
    assert_int_equal(ctl_book_from_reply(&r, &b), -EPROTO);
    assert_non_null(strstr(pf_errmsg(), "lost server 1 outside [0, 1)"));
    lost[0] = -1;
    assert_int_equal(ctl_book_from_reply(&r, &b), -EPROTO);
    lost[0] = 0;
    r.n_lost_servers = 2;
    assert_int_equal(ctl_book_from_reply(&r, &b), -EPROTO);
    assert_non_null(strstr(pf_errmsg(), "2 lost servers listed for 1 servers"));
    r.n_lost_servers = 0;
    r.lost_servers = NULL;

    mem[2].rank = 0; /* worker 0 twice, worker 1 missing */
    assert_int_equal(ctl_book_from_reply(&r, &b), -EPROTO);
    assert_non_null(strstr(pf_errmsg(), "listed twice"));
    mem[2].rank = 2; /* outside [0, 2) */
    assert_int_equal(ctl_book_from_reply(&r, &b), -EPROTO);
    assert_non_null(strstr(pf_errmsg(), "outside [0, 2)"));
    mem[2].rank = 1;
    r.n_members = 2;
    assert_int_equal(ctl_book_from_reply(&r, &b), -EPROTO);
    assert_non_null(strstr(pf_errmsg(), "2 members listed"));
}

/* Seed corpus for tests/common/fuzz_ctl_frame.c: one valid frame of each kind, and a few bad ones. */
static int write_seed(const char *dir, const char *name, const Pfcps__CtlMessage *m)
{
    uint8_t *frame;
    size_t len;
    if (ctl_frame_encode(m, 1 << 20, &frame, &len) < 0)
        return -1;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(frame);
        return -1;
    }
    fwrite(frame, 1, len, f);
    fclose(f);
    free(frame);
    return 0;
}

static int write_corpus(const char *dir)
{
    uint8_t nonce[32], mac[32];
    for (int i = 0; i < 32; i++)
        nonce[i] = (uint8_t)(i * 7 + 1), mac[i] = (uint8_t)(255 - i);
    Pfcps__CtlMessage m = PFCPS__CTL_MESSAGE__INIT;
    Pfcps__Hello h = PFCPS__HELLO__INIT;
    h.nonce.data = nonce;
    h.nonce.len = 32;
    h.protocol_version = CTL_PROTOCOL_VERSION;
    m.body_case = PFCPS__CTL_MESSAGE__BODY_HELLO;
    m.hello = &h;
    int rc = write_seed(dir, "hello", &m);
    Pfcps__Join j;
    make_join(&m, &j, mac, 32, "fabric-addr-0123456789");
    rc |= write_seed(dir, "join", &m);
    Pfcps__Member mem[3], *ptr[3];
    for (int i = 0; i < 3; i++) {
        pfcps__member__init(&mem[i]);
        mem[i].role = i < 2 ? PFCPS__ROLE__SERVER : PFCPS__ROLE__WORKER;
        mem[i].rank = i < 2 ? i : 0;
        mem[i].fabric_addr.data = nonce;
        mem[i].fabric_addr.len = (size_t)(8 + i);
        ptr[i] = &mem[i];
    }
    Pfcps__JoinReply r = PFCPS__JOIN_REPLY__INIT;
    r.n_members = 3;
    r.members = ptr;
    r.num_servers = 2;
    r.num_workers = 1;
    r.num_classes = 1000;
    r.config_text = (char *)"[train]\nnum_classes = 1000\n[data]\nrec = synthetic\n";
    r.run_id.data = nonce;
    r.run_id.len = CKPT_RUN_ID_BYTES;
    pfcps__ctl_message__init(&m);
    m.body_case = PFCPS__CTL_MESSAGE__BODY_JOIN_REPLY;
    m.join_reply = &r;
    rc |= write_seed(dir, "join_reply", &m);
    Pfcps__Heartbeat hb = PFCPS__HEARTBEAT__INIT;
    hb.seq = 42;
    pfcps__ctl_message__init(&m);
    m.body_case = PFCPS__CTL_MESSAGE__BODY_HEARTBEAT;
    m.heartbeat = &hb;
    rc |= write_seed(dir, "heartbeat", &m);
    Pfcps__Shutdown sd = PFCPS__SHUTDOWN__INIT;
    sd.reason = (char *)"done";
    pfcps__ctl_message__init(&m);
    m.body_case = PFCPS__CTL_MESSAGE__BODY_SHUTDOWN;
    m.shutdown = &sd;
    rc |= write_seed(dir, "shutdown", &m);
    Pfcps__Error e = PFCPS__ERROR__INIT;
    e.code = 13;
    e.message = (char *)"bad secret";
    pfcps__ctl_message__init(&m);
    m.body_case = PFCPS__CTL_MESSAGE__BODY_ERROR;
    m.error = &e;
    rc |= write_seed(dir, "error", &m);
    Pfcps__Failover fo;
    ctl_msg_set_failover(&m, &fo, 1, 1, "server[1] lost");
    rc |= write_seed(dir, "failover", &m);
    Pfcps__Resume rs;
    int32_t lost[1] = {0};
    make_resume(&m, &rs, nonce, lost, 1);
    rc |= write_seed(dir, "resume", &m);
    printf("wrote seed corpus to %s (rc %d)\n", dir, rc);
    return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--write-corpus") == 0)
        return write_corpus(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mac_rfc4231),
        cmocka_unit_test(test_round_trip_and_partial),
        cmocka_unit_test(test_bad_messages),
        cmocka_unit_test(test_resume),
        cmocka_unit_test(test_book_from_reply),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
