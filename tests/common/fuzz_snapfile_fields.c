/* Structure-aware libFuzzer target for the checkpoint readers (common/snapfile.c): the inputs are whole shard
 * files whose digests are right, so the fuzzer gets past the checksums to the field checks. The custom
 * mutator decodes an input's header (tests/common/snapfile_forge.h), rewrites one field (step, shard_id,
 * num_servers, num_workers, num_classes, embedding_size, rows, block_rows, payload_bytes, seed,
 * format_version, kind, dtype, authenticated, run_id, config_digest) to an edge value (0, 1, -1, 2^31, 2^54,
 * INT64_MAX, another field's value, +-1, x2, random bits), or resizes or mutates the payload, then
 * re-encodes it with the payload's SHA-256 and length, the header's SHA-256 and the HMAC under a fixed key
 * recomputed; an input that does not decode gets libFuzzer's byte mutations. Each input then goes through
 * the readers as a resuming server uses them: snapfile_open_stream with the key and without it,
 * snapfile_check_member against its own header, and the shard reader's block loop (block_rows x D x 8 bytes
 * in memory, the rows read block by block) up to snapfile_finish. A read either fails with a message or
 * accepts a file whose fields agree (rows of its rank, payload = rows x D x 8, block at most rows); any
 * crash, sanitizer report, leak, silent refusal or accepted inconsistency is a bug. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checked.h"
#include "common/err.h"
#include "common/snapfile.h"
#include "tests/common/snapfile_forge.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);
size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

/* The key the corpus files are authenticated with: snapfile_key_derive("fuzz-secret"). */
static const snapfile_key *fuzz_key(void)
{
    static snapfile_key k;
    static int done;
    if (!done && snapfile_key_derive("fuzz-secret", &k) == 0)
        done = 1;
    return &k;
}

static uint64_t next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* An edge value for a field whose current value is v (other: another field's value). */
static int64_t edge(uint64_t *s, int64_t v, int64_t other)
{
    static const int64_t table[] = {0,
                                    1,
                                    -1,
                                    2,
                                    3,
                                    7,
                                    64,
                                    65536,
                                    65537,
                                    (int64_t)1 << 31,
                                    (int64_t)1 << 32,
                                    (int64_t)1 << 54,
                                    (int64_t)1 << 61,
                                    INT64_MAX,
                                    INT64_MIN,
                                    1000000000000001LL};
    switch (next(s) % 6) {
    case 0: return table[next(s) % (sizeof table / sizeof table[0])];
    case 1: return other;
    case 2: return v + 1;
    case 3: return v - 1;
    case 4: return v * 2;
    default: return (int64_t)next(s);
    }
}

/* Rewrites one header field of h (or two that change together). */
static void mutate_fields(Pfcps__SnapshotHeader *h, uint64_t *s)
{
    int64_t other = 0;
    switch (next(s) % 8) {
    case 0: other = h->rows; break;
    case 1: other = h->block_rows; break;
    case 2: other = h->embedding_size; break;
    case 3: other = h->num_classes; break;
    case 4: other = (int64_t)h->payload_bytes; break;
    case 5: other = h->num_servers; break;
    case 6: other = h->shard_id; break;
    default: other = h->step; break;
    }
    switch (next(s) % 16) {
    case 0: h->step = edge(s, h->step, other); break;
    case 1: h->shard_id = (int32_t)edge(s, h->shard_id, other); break;
    case 2: h->num_servers = (int32_t)edge(s, h->num_servers, other); break;
    case 3: h->num_workers = (int32_t)edge(s, h->num_workers, other); break;
    case 4: h->num_classes = edge(s, h->num_classes, other); break;
    case 5: h->embedding_size = (int32_t)edge(s, h->embedding_size, other); break;
    case 6: h->rows = edge(s, h->rows, other); break;
    case 7: h->block_rows = edge(s, h->block_rows, other); break;
    case 8: h->payload_bytes = (uint64_t)edge(s, (int64_t)h->payload_bytes, other); break;
    case 9: h->seed = (uint64_t)edge(s, (int64_t)h->seed, other); break;
    case 10: h->format_version = (uint32_t)edge(s, h->format_version, other); break;
    case 11: h->authenticated = !h->authenticated; break;
    case 12: h->run_id.len = next(s) % 2 ? h->run_id.len / 2 : h->run_id.len; break;
    case 13: h->config_digest.len = next(s) % 2 ? h->config_digest.len / 2 : 0; break;
    case 14: {
        /* both counts at once: a consistent shape of another size */
        h->num_classes = edge(s, h->num_classes, other);
        h->rows = h->num_servers > 0 && h->num_classes > h->shard_id
                      ? (h->num_classes - h->shard_id + h->num_servers - 1) / h->num_servers
                      : 0;
        break;
    }
    default: {
        /* Strings point at static text here; the decoded ones are put back before the header is freed (an
         * absent string is protobuf-c's shared empty string, which must not be freed). */
        static char *words[] = {(char *)"worker", (char *)"shard", (char *)"", (char *)"fp16"};
        char *w = words[next(s) % 4];
        if (next(s) % 2)
            h->kind = w;
        else
            h->dtype = w;
        break;
    }
    }
}

/* SHA-256 of p[0, n) into d. */
static void sha(const uint8_t *p, size_t n, uint8_t d[32])
{
    unsigned int l = 0;
    EVP_Digest(p, n, d, &l, EVP_sha256(), NULL);
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed)
{
    uint64_t s = (uint64_t)seed * 0x9E3779B97F4A7C15ull | 1;
    Pfcps__SnapshotHeader *h = forge_decode(data, size);
    if (!h || max_size < SNAPFILE_HDR_AREA || next(&s) % 16 == 0) {
        if (h)
            pfcps__snapshot_header__free_unpacked(h, NULL);
        return LLVMFuzzerMutate(data, size, max_size);
    }
    size_t len = size;
    char *kind = h->kind, *dtype = h->dtype;
    int action = (int)(next(&s) % 4);
    if (action <= 1) {
        mutate_fields(h, &s);
    } else {
        /* The payload: a new length (the one the fields imply, or another), or new bytes; its length and
         * digest follow, so only the field checks can refuse it. */
        size_t payload = size - SNAPFILE_HDR_AREA;
        if (action == 2) {
            uint64_t want = 0;
            if (next(&s) % 2 &&
                pf_mul3_u64((uint64_t)(h->rows > 0 ? h->rows : 0),
                            (uint64_t)(h->embedding_size > 0 ? h->embedding_size : 0), 8, &want) == 0 &&
                want <= max_size - SNAPFILE_HDR_AREA)
                payload = (size_t)want;
            else
                payload = (size_t)(next(&s) % (max_size - SNAPFILE_HDR_AREA + 1));
            if (payload > size - SNAPFILE_HDR_AREA)
                memset(data + size, 0, payload - (size - SNAPFILE_HDR_AREA));
        } else if (payload > 0) {
            payload = LLVMFuzzerMutate(data + SNAPFILE_HDR_AREA, payload, max_size - SNAPFILE_HDR_AREA);
        }
        len = SNAPFILE_HDR_AREA + payload;
        uint8_t d[32];
        sha(data + SNAPFILE_HDR_AREA, payload, d);
        if (h->payload_sha256.len == 32)
            memcpy(h->payload_sha256.data, d, 32);
        h->payload_bytes = payload;
    }
    int rc = forge_encode(data, h, fuzz_key());
    h->kind = kind;
    h->dtype = dtype;
    pfcps__snapshot_header__free_unpacked(h, NULL);
    return rc == 0 ? len : LLVMFuzzerMutate(data, size, max_size);
}

/* The shard reader's loop over an opened file (server/snapshot.c snap_load): one block in memory, the rows
 * read block by block, then the digest. Returns 0 or the refusal. */
static int read_shard(snapfile_reader *r)
{
    const snapfile_meta *m = &r->m;
    int rc = snapfile_check_member(m, r->name, "shard", m->step, m->rank, m->servers);
    if (rc < 0)
        return rc;
    /* What snapfile_check_fields guarantees of an accepted shard file. */
    uint64_t payload = 0;
    size_t block = 0;
    if (m->block_rows < 1 || m->block_rows > (m->rows > 1 ? m->rows : 1) || m->dim < 1 ||
        pf_mul3_u64((uint64_t)m->rows, (uint64_t)m->dim, 2 * sizeof(float), &payload) < 0 ||
        payload != m->payload_bytes ||
        pf_mul3_size((size_t)m->block_rows, (size_t)m->dim, 2 * sizeof(float), &block) < 0 ||
        block > (payload > 2 * sizeof(float) * (size_t)m->dim ? payload : 2 * sizeof(float) * (size_t)m->dim))
        abort();
    float *buf = malloc(block ? block : 1);
    if (!buf)
        return pf_err(-ENOMEM, "out of memory");
    for (int64_t r0 = 0; rc == 0 && r0 < m->rows; r0 += m->block_rows) {
        int64_t n = m->rows - r0 < m->block_rows ? m->rows - r0 : m->block_rows;
        rc = snapfile_read(r, buf, sizeof(float) * 2 * (size_t)n * (size_t)m->dim);
    }
    if (rc == 0 && r->left != 0)
        abort(); /* the rows read are exactly the payload */
    if (rc == 0)
        rc = snapfile_finish(r);
    free(buf);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    for (int keyed = 0; keyed < 2; keyed++) {
        FILE *f = fmemopen((void *)data, size, "rb");
        if (!f)
            return 0;
        snapfile_reader r;
        pf_err_clear();
        int rc = snapfile_open_stream(&r, f, (int64_t)size, "fuzz.snap", keyed ? fuzz_key() : NULL);
        if (rc == 0 && (uint64_t)size != SNAPFILE_HDR_AREA + r.m.payload_bytes)
            abort();
        if (rc == 0 && !strcmp(r.m.role, "shard"))
            rc = read_shard(&r);
        else if (rc == 0)
            rc = snapfile_finish(&r);
        if (rc < 0 && pf_errmsg()[0] == 0)
            abort(); /* every refusal says why */
        snapfile_close(&r);
        fclose(f);
    }
    return 0;
}
