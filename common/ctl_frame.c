/* Control plane, frame and message coding (ctl_frame.h): the length-prefixed frame, the checks every decoded
 * message passes, the join MAC, the address book built from a join reply, and the data-plane token. Built
 * on its own by the fuzz target (tests/common/fuzz_ctl_frame.c), so it needs only protobuf-c, libcrypto and
 * common/err.c. */
#include "common/ctl_frame.h"

#include "common/ctl_internal.h"
#include "common/err.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *ctl_msg_name(int body_case)
{
    switch (body_case) {
    case PFCPS__CTL_MESSAGE__BODY_HELLO: return "hello";
    case PFCPS__CTL_MESSAGE__BODY_JOIN: return "join";
    case PFCPS__CTL_MESSAGE__BODY_JOIN_REPLY: return "join_reply";
    case PFCPS__CTL_MESSAGE__BODY_HEARTBEAT: return "heartbeat";
    case PFCPS__CTL_MESSAGE__BODY_SHUTDOWN: return "shutdown";
    case PFCPS__CTL_MESSAGE__BODY_ERROR: return "error";
    case PFCPS__CTL_MESSAGE__BODY_FAILOVER: return "failover";
    case PFCPS__CTL_MESSAGE__BODY_RESUME: return "resume";
    default: return "empty";
    }
}

void ctl_msg_set_error(Pfcps__CtlMessage *m, Pfcps__Error *e, int code, const char *text)
{
    pfcps__error__init(e);
    e->code = code;
    e->message = (char *)text;
    pfcps__ctl_message__init(m);
    m->body_case = PFCPS__CTL_MESSAGE__BODY_ERROR;
    m->error = e;
}

void ctl_msg_set_failover(Pfcps__CtlMessage *m, Pfcps__Failover *f, uint32_t epoch, int server,
                          const char *text)
{
    pfcps__failover__init(f);
    f->epoch = epoch;
    f->server = server;
    f->text = (char *)text;
    f->kind = CTL_FO_LOST;
    pfcps__ctl_message__init(m);
    m->body_case = PFCPS__CTL_MESSAGE__BODY_FAILOVER;
    m->failover = f;
}

void ctl_msg_set_shutdown(Pfcps__CtlMessage *m, Pfcps__Shutdown *sd, const char *reason)
{
    pfcps__shutdown__init(sd);
    sd->reason = (char *)reason;
    pfcps__ctl_message__init(m);
    m->body_case = PFCPS__CTL_MESSAGE__BODY_SHUTDOWN;
    m->shutdown = sd;
}

int ctl_frame_encode(const Pfcps__CtlMessage *msg, size_t max_frame, uint8_t **out, size_t *out_len)
{
    size_t n = pfcps__ctl_message__get_packed_size(msg);
    if (n > max_frame || n > UINT32_MAX)
        return pf_err(-EMSGSIZE, "control message %s is %zu bytes, above the frame limit %zu",
                      ctl_msg_name(msg->body_case), n, max_frame);
    uint8_t *buf = malloc(n + 4);
    if (!buf)
        return pf_err(-ENOMEM, "out of memory encoding a %zu-byte control frame", n);
    buf[0] = (uint8_t)n;
    buf[1] = (uint8_t)(n >> 8);
    buf[2] = (uint8_t)(n >> 16);
    buf[3] = (uint8_t)(n >> 24);
    pfcps__ctl_message__pack(msg, buf + 4);
    *out = buf;
    *out_len = n + 4;
    return 0;
}

int ctl_frame_peek(const uint8_t *buf, size_t len, size_t max_frame, size_t *frame_len)
{
    if (len < 4)
        return 0;
    uint32_t n = (uint32_t)buf[0] | (uint32_t)buf[1] << 8 | (uint32_t)buf[2] << 16 | (uint32_t)buf[3] << 24;
    if (n > max_frame)
        return pf_err(-EMSGSIZE, "frame length %u exceeds the maximum %zu bytes", n, max_frame);
    if (len < 4 + (size_t)n)
        return 0;
    *frame_len = 4 + (size_t)n;
    return 1;
}

static int check_role_rank(int role, int rank, const char *what)
{
    if (role != PFCPS__ROLE__SERVER && role != PFCPS__ROLE__WORKER)
        return pf_err(-EPROTO, "%s: role %d is neither server (0) nor worker (1)", what, role);
    if (rank < 0 || rank >= CTL_MAX_MEMBERS)
        return pf_err(-EPROTO, "%s: rank %d is outside [0, %d)", what, rank, CTL_MAX_MEMBERS);
    return 0;
}

/* A Failover message's fields: epoch, rank, kind, step and address sizes in range. */
static int check_failover(const Pfcps__CtlMessage *m)
{
    if (!m->failover || !m->failover->text)
        return pf_err(-EPROTO, "failover: missing body");
    if (m->failover->epoch < 1 || m->failover->server < 0 || m->failover->server >= CTL_MAX_MEMBERS)
        return pf_err(-EPROTO, "failover: epoch %u must be >= 1 and server %d in [0, %d)",
                      m->failover->epoch, m->failover->server, CTL_MAX_MEMBERS);
    if (m->failover->kind > CTL_FO_KIND_MAX || m->failover->step < 0 ||
        m->failover->fabric_addr.len > CTL_MAX_ADDR)
        return pf_err(-EPROTO,
                      "failover: kind %u (at most %d), step %lld (>= 0) or a fabric address of %zu "
                      "bytes (at most %d) out of range",
                      m->failover->kind, CTL_FO_KIND_MAX, (long long)m->failover->step,
                      m->failover->fabric_addr.len, CTL_MAX_ADDR);
    if (m->failover->n_worker_addrs > CTL_MAX_MEMBERS)
        return pf_err(-EPROTO, "failover: %zu worker addresses (at most %d)", m->failover->n_worker_addrs,
                      CTL_MAX_MEMBERS);
    for (size_t i = 0; i < m->failover->n_worker_addrs; i++)
        if (m->failover->worker_addrs[i].len > CTL_MAX_ADDR)
            return pf_err(-EPROTO, "failover: worker address %zu of %zu bytes (at most %d)", i,
                          m->failover->worker_addrs[i].len, CTL_MAX_ADDR);
    return 0;
}

int ctl_msg_check(const Pfcps__CtlMessage *m)
{
    switch (m->body_case) {
    case PFCPS__CTL_MESSAGE__BODY_HELLO:
        if (!m->hello || m->hello->nonce.len != CTL_NONCE_LEN || !m->hello->nonce.data)
            return pf_err(-EPROTO, "hello: nonce must be %d bytes", CTL_NONCE_LEN);
        return 0;
    case PFCPS__CTL_MESSAGE__BODY_JOIN: {
        const Pfcps__Join *j = m->join;
        if (!j)
            return pf_err(-EPROTO, "join: missing body");
        int rc = check_role_rank((int)j->role, j->rank, "join");
        if (rc < 0)
            return rc;
        if (j->fabric_addr.len > CTL_MAX_ADDR)
            return pf_err(-EPROTO, "join: fabric address of %zu bytes is longer than %d", j->fabric_addr.len,
                          CTL_MAX_ADDR);
        if (j->mac.len != CTL_MAC_LEN)
            return pf_err(-EPROTO, "join: mac must be %d bytes, got %zu", CTL_MAC_LEN, j->mac.len);
        if (j->n_resume_steps > CTL_MAX_RESUME_STEPS)
            return pf_err(-EPROTO, "join: %zu resume steps listed (at most %d)", j->n_resume_steps,
                          CTL_MAX_RESUME_STEPS);
        for (size_t i = 0; i < j->n_resume_steps; i++)
            if (j->resume_steps[i] <= 0)
                return pf_err(-EPROTO, "join: resume step %lld is not positive",
                              (long long)j->resume_steps[i]);
        if (j->n_resume_idents != j->n_resume_steps)
            return pf_err(-EPROTO, "join: %zu resume identities for %zu resume steps", j->n_resume_idents,
                          j->n_resume_steps);
        for (size_t i = 0; i < j->n_resume_idents; i++) {
            const Pfcps__CheckpointIdent *id = j->resume_idents[i];
            if (!id || id->run_id.len != CKPT_RUN_ID_BYTES || id->config_digest.len != CKPT_DIGEST_BYTES)
                return pf_err(-EPROTO, "join: resume identity %zu: run_id must be %d bytes, config_digest %d",
                              i, CKPT_RUN_ID_BYTES, CKPT_DIGEST_BYTES);
        }
        return 0;
    }
    case PFCPS__CTL_MESSAGE__BODY_JOIN_REPLY: {
        const Pfcps__JoinReply *r = m->join_reply;
        if (!r)
            return pf_err(-EPROTO, "join_reply: missing body");
        if (r->num_servers < 1 || r->num_servers > CTL_MAX_MEMBERS || r->num_workers < 1 ||
            r->num_workers > CTL_MAX_MEMBERS)
            return pf_err(-EPROTO, "join_reply: %d servers / %d workers outside [1, %d]", r->num_servers,
                          r->num_workers, CTL_MAX_MEMBERS);
        if (r->num_classes < 0)
            return pf_err(-EPROTO, "join_reply: negative num_classes %lld", (long long)r->num_classes);
        if (r->run_id.len != CKPT_RUN_ID_BYTES)
            return pf_err(-EPROTO, "join_reply: run_id of %zu bytes, not %d", r->run_id.len,
                          CKPT_RUN_ID_BYTES);
        if (r->n_members != (size_t)r->num_servers + (size_t)r->num_workers)
            return pf_err(-EPROTO, "join_reply: %zu members listed for %d servers + %d workers", r->n_members,
                          r->num_servers, r->num_workers);
        for (size_t i = 0; i < r->n_members; i++) {
            const Pfcps__Member *mb = r->members[i];
            if (!mb)
                return pf_err(-EPROTO, "join_reply: member %zu missing", i);
            int rc = check_role_rank((int)mb->role, mb->rank, "join_reply member");
            if (rc < 0)
                return rc;
            if (mb->fabric_addr.len > CTL_MAX_ADDR)
                return pf_err(-EPROTO, "join_reply: member %zu fabric address of %zu bytes is longer than %d",
                              i, mb->fabric_addr.len, CTL_MAX_ADDR);
        }
        if (!r->config_text)
            return pf_err(-EPROTO, "join_reply: missing config text");
        if (r->donor < 0 || r->donor >= r->num_workers)
            return pf_err(-EPROTO, "join_reply: donor worker %d outside [0, %d)", r->donor, r->num_workers);
        if (r->n_lost_servers > (size_t)r->num_servers)
            return pf_err(-EPROTO, "join_reply: %zu lost servers listed for %d servers", r->n_lost_servers,
                          r->num_servers);
        for (size_t i = 0; i < r->n_lost_servers; i++)
            if (r->lost_servers[i] < 0 || r->lost_servers[i] >= r->num_servers)
                return pf_err(-EPROTO, "join_reply: lost server %d outside [0, %d)", r->lost_servers[i],
                              r->num_servers);
        return 0;
    }
    case PFCPS__CTL_MESSAGE__BODY_HEARTBEAT:
        return m->heartbeat ? 0 : pf_err(-EPROTO, "heartbeat: missing body");
    case PFCPS__CTL_MESSAGE__BODY_SHUTDOWN:
        return m->shutdown && m->shutdown->reason ? 0 : pf_err(-EPROTO, "shutdown: missing body");
    case PFCPS__CTL_MESSAGE__BODY_ERROR:
        return m->error && m->error->message ? 0 : pf_err(-EPROTO, "error: missing body");
    case PFCPS__CTL_MESSAGE__BODY_RESUME: {
        const Pfcps__Resume *r = m->resume;
        if (!r)
            return pf_err(-EPROTO, "resume: missing body");
        int rc = check_role_rank((int)r->role, r->rank, "resume");
        if (rc < 0)
            return rc;
        if (r->fabric_addr.len > CTL_MAX_ADDR)
            return pf_err(-EPROTO, "resume: fabric address of %zu bytes is longer than %d", r->fabric_addr.len,
                          CTL_MAX_ADDR);
        if ((r->mac.len != 0 && r->mac.len != CTL_MAC_LEN) || r->run_id.len != CKPT_RUN_ID_BYTES ||
            r->run_nonce.len != 16 || r->config_digest.len != CKPT_DIGEST_BYTES)
            return pf_err(-EPROTO,
                          "resume: mac (%zu bytes), run_id (%zu), run_nonce (%zu) or config_digest (%zu) not "
                          "of %d (or 0), %d, 16 and %d bytes",
                          r->mac.len, r->run_id.len, r->run_nonce.len, r->config_digest.len, CTL_MAC_LEN,
                          CKPT_RUN_ID_BYTES, CKPT_DIGEST_BYTES);
        if (r->n_lost_servers > CTL_MAX_MEMBERS)
            return pf_err(-EPROTO, "resume: %zu lost servers listed (at most %d)", r->n_lost_servers,
                          CTL_MAX_MEMBERS);
        for (size_t i = 0; i < r->n_lost_servers; i++)
            if (r->lost_servers[i] < 0 || r->lost_servers[i] >= CTL_MAX_MEMBERS)
                return pf_err(-EPROTO, "resume: lost server %d outside [0, %d)", r->lost_servers[i],
                              CTL_MAX_MEMBERS);
        return 0;
    }
    case PFCPS__CTL_MESSAGE__BODY_FAILOVER:
        return check_failover(m);
    default:
        return pf_err(-EPROTO, "message has no body (exactly one of hello/join/join_reply/heartbeat/shutdown/"
                               "error/failover must be set)");
    }
}

int ctl_msg_decode(const uint8_t *payload, size_t len, Pfcps__CtlMessage **out)
{
    Pfcps__CtlMessage *m = pfcps__ctl_message__unpack(NULL, len, payload);
    if (!m)
        return pf_err(-EPROTO, "undecodable control message (%zu bytes are not a valid protobuf CtlMessage)",
                      len);
    int rc = ctl_msg_check(m);
    if (rc < 0) {
        pfcps__ctl_message__free_unpacked(m, NULL);
        return rc;
    }
    *out = m;
    return 0;
}

int ctl_join_mac(const char *secret, const uint8_t *nonce, size_t nonce_len, int role, int rank,
                 const uint8_t *addr, size_t addr_len, uint8_t mac[CTL_MAC_LEN])
{
    size_t n = nonce_len + 8 + addr_len;
    uint8_t *msg = malloc(n ? n : 1);
    if (!msg)
        return pf_err(-ENOMEM, "out of memory computing the join mac");
    if (nonce_len)
        memcpy(msg, nonce, nonce_len);
    uint32_t v[2] = {(uint32_t)role, (uint32_t)rank};
    for (int k = 0; k < 2; k++)
        for (int b = 0; b < 4; b++)
            msg[nonce_len + 4 * (size_t)k + (size_t)b] = (uint8_t)(v[k] >> (8 * b));
    if (addr_len)
        memcpy(msg + nonce_len + 8, addr, addr_len);
    unsigned int maclen = 0;
    const unsigned char *r = HMAC(EVP_sha256(), secret, (int)strlen(secret), msg, n, mac, &maclen);
    free(msg);
    if (!r || maclen != CTL_MAC_LEN)
        return pf_err(-EIO, "HMAC-SHA256 failed in libcrypto");
    return 0;
}

void ctl_book_free(ctl_book *book)
{
    free(book->servers);
    free(book->workers);
    free(book->config_text);
    free(book->lost);
    memset(book, 0, sizeof *book);
}

/* Copies join-reply member mb into its place in book (servers[rank] or workers[rank]), marking it in
 * seen[S + W] (servers first). Returns 0, or -EPROTO when its rank is outside the run or listed twice. */
static int book_place_member(ctl_book *book, const Pfcps__Member *mb, char *seen)
{
    ctl_role role = mb->role == PFCPS__ROLE__SERVER ? CTL_ROLE_SERVER : CTL_ROLE_WORKER;
    int limit = role == CTL_ROLE_SERVER ? book->num_servers : book->num_workers;
    if (mb->rank >= limit)
        return pf_err(-EPROTO, "join_reply: %s rank %d is outside [0, %d)", ctl_role_name((int)role),
                      mb->rank, limit);
    size_t slot = role == CTL_ROLE_SERVER ? (size_t)mb->rank : (size_t)book->num_servers + (size_t)mb->rank;
    if (seen[slot])
        return pf_err(-EPROTO, "join_reply: %s rank %d listed twice", ctl_role_name((int)role), mb->rank);
    seen[slot] = 1;
    ctl_member *dst = role == CTL_ROLE_SERVER ? &book->servers[mb->rank] : &book->workers[mb->rank];
    dst->role = role;
    dst->rank = mb->rank;
    dst->addr_len = mb->fabric_addr.len;
    if (mb->fabric_addr.len)
        memcpy(dst->addr, mb->fabric_addr.data, mb->fabric_addr.len);
    return 0;
}

int ctl_book_from_reply(const Pfcps__JoinReply *r, ctl_book *book)
{
    memset(book, 0, sizeof *book);
    Pfcps__CtlMessage wrap = PFCPS__CTL_MESSAGE__INIT;
    wrap.body_case = PFCPS__CTL_MESSAGE__BODY_JOIN_REPLY;
    wrap.join_reply = (Pfcps__JoinReply *)r;
    int rc = ctl_msg_check(&wrap);
    if (rc < 0)
        return rc;
    book->num_servers = r->num_servers;
    book->num_workers = r->num_workers;
    book->num_classes = r->num_classes;
    book->resume_step = r->resume_step > 0 ? r->resume_step : 0;
    book->rejoin_epoch = r->rejoin_epoch;
    book->donor = r->donor;
    if (r->run_nonce.len == sizeof book->run_nonce)
        memcpy(book->run_nonce, r->run_nonce.data, sizeof book->run_nonce);
    if (r->run_id.len == sizeof book->run_id)
        memcpy(book->run_id, r->run_id.data, sizeof book->run_id);
    snprintf(book->resume_reason, sizeof book->resume_reason, "%s", r->resume_reason ? r->resume_reason : "");
    book->servers = calloc((size_t)r->num_servers, sizeof(ctl_member));
    book->workers = calloc((size_t)r->num_workers, sizeof(ctl_member));
    book->config_text = strdup(r->config_text);
    char *seen = calloc((size_t)r->num_servers + (size_t)r->num_workers, 1);
    book->lost = calloc(r->n_lost_servers ? r->n_lost_servers : 1, sizeof(int));
    if (!book->servers || !book->workers || !book->config_text || !seen || !book->lost)
        rc = pf_err(-ENOMEM, "out of memory building the address book");
    for (size_t i = 0; i < r->n_lost_servers && rc == 0; i++)
        book->lost[book->nlost++] = r->lost_servers[i];
    for (size_t i = 0; i < r->n_members && rc == 0; i++)
        rc = book_place_member(book, r->members[i], seen);
    /* n_members == S + W and no slot twice, so every slot is filled. */
    free(seen);
    if (rc < 0)
        ctl_book_free(book);
    return rc;
}

int ctl_data_token(const char *secret, const uint8_t nonce[16], uint64_t *token)
{
    static const char label[] = "pfcps data plane v1";
    uint8_t msg[sizeof label + 16], mac[32];
    unsigned int len = 0;
    memcpy(msg, label, sizeof label);
    memcpy(msg + sizeof label, nonce, 16);
    if (!secret || !HMAC(EVP_sha256(), secret, (int)strlen(secret), msg, sizeof msg, mac, &len))
        return pf_err(-EIO, "data-plane token: HMAC failed");
    uint64_t t = 0;
    for (int i = 0; i < 8; i++)
        t |= (uint64_t)mac[i] << (8 * i);
    *token = t ? t : 1; /* 0 means "no token" to the servers and clients */
    return 0;
}
