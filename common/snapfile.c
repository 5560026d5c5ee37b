/* Checkpoint file container: see snapfile.h. */
#include "common/snapfile.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/checked.h"
#include "common/err.h"
#include "common/file.h"
#include "ctl.pb-c.h"

static const char magic[8] = {'P', 'F', 'C', 'P', 'S', 'N', 'P', '1'};

/* The header area: magic 8, u32 length 4, header, SHA-256 32, HMAC 32, zero padding. */
#define AREA_FIXED  12
#define AREA_MAX_HL (SNAPFILE_HDR_AREA - AREA_FIXED - 64)

static void *sha_new(void)
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(c);
        c = NULL;
    }
    return c;
}

int snapfile_key_derive(const char *secret, snapfile_key *key)
{
    static const char label[] = "pfcps checkpoint v1";
    if (!secret || !*secret)
        return pf_err(-EINVAL, "checkpoint key: empty join secret");
    unsigned int len = 0;
    if (!HMAC(EVP_sha256(), secret, (int)strlen(secret), (const unsigned char *)label, sizeof label - 1,
              key->k, &len) ||
        len != sizeof key->k)
        return pf_err(-EIO, "checkpoint key: HMAC-SHA256 failed");
    return 0;
}

/* HMAC-SHA256 of the header bytes under key into mac. */
static int header_mac(const snapfile_key *key, const uint8_t *hdr, size_t hl, uint8_t mac[32])
{
    unsigned int len = 0;
    return HMAC(EVP_sha256(), key->k, sizeof key->k, hdr, hl, mac, &len) && len == 32 ? 0 : -EIO;
}

int snapfile_create(snapfile_writer *w, const char *path, const char *what)
{
    memset(w, 0, sizeof *w);
    int rc = pf_atomic_open(&w->af, path, what);
    if (rc < 0)
        return rc;
    if (!(w->sha = sha_new())) {
        pf_atomic_abort(&w->af);
        return pf_err(-ENOMEM, "%s %s: out of memory", what, path);
    }
    static const uint8_t zero[SNAPFILE_HDR_AREA];
    w->ok = fwrite(zero, 1, sizeof zero, w->af.f) == sizeof zero;
    if (!w->ok) {
        int e = errno;
        snapfile_abort(w);
        return pf_err(-EIO, "%s %s: write failed: %s", what, path, strerror(e));
    }
    return 0;
}

int snapfile_write(snapfile_writer *w, const void *p, size_t n)
{
    if (!w->ok)
        return pf_err(-EIO, "%s %s: an earlier write failed", w->af.what, w->af.tmp);
    if (n && fwrite(p, 1, n, w->af.f) != n) {
        w->ok = 0;
        return pf_err(-EIO, "%s %s: write failed: %s", w->af.what, w->af.tmp, strerror(errno));
    }
    EVP_DigestUpdate(w->sha, p, n);
    w->bytes += n;
    return 0;
}

/* The header message for m. */
static void meta_to_pb(const snapfile_meta *m, Pfcps__SnapshotHeader *h)
{
    pfcps__snapshot_header__init(h);
    h->format_version = SNAPFILE_VERSION;
    h->shard_id = m->rank;
    h->num_servers = m->servers;
    h->num_workers = m->workers;
    h->num_classes = m->num_classes;
    h->embedding_size = m->dim;
    h->step = m->step;
    h->dtype = (char *)"fp32";
    h->payload_bytes = m->payload_bytes;
    h->payload_sha256.data = (uint8_t *)m->sha256;
    h->payload_sha256.len = 32;
    h->rows = m->rows;
    h->kind = (char *)m->role;
    h->seed = m->id.seed;
    h->block_rows = m->block_rows;
    h->run_id.data = (uint8_t *)m->id.run_id;
    h->run_id.len = CKPT_RUN_ID_BYTES;
    h->config_digest.data = (uint8_t *)m->id.config_digest;
    h->config_digest.len = CKPT_DIGEST_BYTES;
    h->authenticated = m->authenticated;
    h->dense = m->dense != 0;
    h->adamw = m->adamw != 0;
}

int snapfile_commit(snapfile_writer *w, snapfile_meta *m, const snapfile_key *key)
{
    unsigned int len = 0;
    m->payload_bytes = w->bytes;
    m->authenticated = key != NULL;
    EVP_DigestFinal_ex(w->sha, m->sha256, &len);
    EVP_MD_CTX_free(w->sha);
    w->sha = NULL;
    Pfcps__SnapshotHeader h;
    meta_to_pb(m, &h);
    size_t hl = pfcps__snapshot_header__get_packed_size(&h);
    uint8_t area[SNAPFILE_HDR_AREA];
    memset(area, 0, sizeof area);
    if (hl > AREA_MAX_HL) {
        pf_atomic_abort(&w->af);
        return pf_err(-EINVAL, "%s %s: header of %zu bytes does not fit", w->af.what, w->af.path, hl);
    }
    memcpy(area, magic, 8);
    uint32_t l32 = (uint32_t)hl;
    for (int i = 0; i < 4; i++)
        area[8 + i] = (uint8_t)(l32 >> (8 * i));
    pfcps__snapshot_header__pack(&h, area + AREA_FIXED);
    /* The header's own digest follows it, so a damaged header field is caught too; then its HMAC, so that a
     * header rewritten without the key (digest recomputed) is caught by a reader that has it. */
    EVP_Digest(area + AREA_FIXED, hl, area + AREA_FIXED + hl, &len, EVP_sha256(), NULL);
    if (key && header_mac(key, area + AREA_FIXED, hl, area + AREA_FIXED + hl + 32) < 0) {
        pf_atomic_abort(&w->af);
        return pf_err(-EIO, "%s %s: HMAC-SHA256 failed", w->af.what, w->af.path);
    }
    int ok =
        w->ok && fseeko(w->af.f, 0, SEEK_SET) == 0 && fwrite(area, 1, sizeof area, w->af.f) == sizeof area;
    return pf_atomic_commit(&w->af, ok);
}

void snapfile_abort(snapfile_writer *w)
{
    if (w->sha)
        EVP_MD_CTX_free(w->sha);
    w->sha = NULL;
    pf_atomic_abort(&w->af);
}

/* Local rows of server s of S for C classes (class c on server c mod S): the classes s, s + S, ... < C. */
static int64_t shard_rows(int64_t C, int S, int s)
{
    return C > s ? (C - s + S - 1) / S : 0;
}

int snapfile_check_fields(const snapfile_meta *m, const char *name)
{
    const int shard = !strcmp(m->role, "shard");
    const int count = shard ? m->servers : m->workers;
    const char *count_field = shard ? "num_servers" : "num_workers";
    if (m->step < 0)
        return pf_err(-EINVAL, "%s: header field step = %lld is negative", name, (long long)m->step);
    if (count < 1 || count > SNAPFILE_MAX_MEMBERS)
        return pf_err(-EINVAL, "%s: header field %s = %d is outside 1..%d", name, count_field, count,
                      SNAPFILE_MAX_MEMBERS);
    if (m->rank < 0 || m->rank >= count)
        return pf_err(-EINVAL, "%s: header field shard_id = %d is outside 0..%s-1 (%d)", name, m->rank,
                      count_field, count - 1);
    if (m->rows < 0)
        return pf_err(-EINVAL, "%s: header field rows = %lld is negative", name, (long long)m->rows);
    if (!shard) {
        uint64_t need = 0;
        if (pf_mul_u64((uint64_t)m->rows, 4, &need) < 0 || need > m->payload_bytes)
            return pf_err(-EINVAL,
                          "%s: header field rows = %lld parameters do not fit payload_bytes = %llu (one fp32 "
                          "array of rows)",
                          name, (long long)m->rows, (unsigned long long)m->payload_bytes);
        return 0;
    }
    if (m->workers < 0 || m->workers > SNAPFILE_MAX_MEMBERS)
        return pf_err(-EINVAL, "%s: header field num_workers = %d is outside 0..%d", name, m->workers,
                      SNAPFILE_MAX_MEMBERS);
    if (m->dim < 1 || m->dim > SNAPFILE_MAX_DIM)
        return pf_err(-EINVAL, "%s: header field embedding_size = %d is outside 1..%d", name, m->dim,
                      SNAPFILE_MAX_DIM);
    if (m->num_classes < 0 || m->num_classes > SNAPFILE_MAX_CLASSES)
        return pf_err(-EINVAL, "%s: header field num_classes = %lld is outside 0..%lld", name,
                      (long long)m->num_classes, (long long)SNAPFILE_MAX_CLASSES);
    const int64_t rows = shard_rows(m->num_classes, m->servers, m->rank);
    if (m->rows != rows)
        return pf_err(-EINVAL,
                      "%s: header field rows = %lld, but shard_id %d of num_servers %d holds %lld of "
                      "num_classes %lld",
                      name, (long long)m->rows, m->rank, m->servers, (long long)rows,
                      (long long)m->num_classes);
    if (m->block_rows < 1 || m->block_rows > (rows > 1 ? rows : 1))
        return pf_err(-EINVAL, "%s: header field block_rows = %lld is outside 1..rows (%lld)", name,
                      (long long)m->block_rows, (long long)rows);
    if (m->dense && !shard)
        return pf_err(-EINVAL, "%s: header field dense is set on a worker file", name);
    if (m->adamw && !shard)
        return pf_err(-EINVAL, "%s: header field adamw is set on a worker file", name);
    /* Bytes per row: weights and momentum (D fp32 each; AdamW: weights and two moments), plus the row's step
     * (int64) in a dense file. */
    const uint64_t row_extra = m->dense ? sizeof(int64_t) : 0;
    const uint64_t per_elem = (m->adamw ? 3 : 2) * sizeof(float);
    const uint64_t row_bytes = (uint64_t)m->dim * per_elem + row_extra; /* D <= SNAPFILE_MAX_DIM */
    uint64_t block = 0, payload = 0, lr_bytes = 0;
    if (pf_mul_u64((uint64_t)m->block_rows, row_bytes, &block) < 0 ||
        (m->block_rows > 1 && block > SNAPFILE_MAX_BLOCK_BYTES))
        return pf_err(
            -EINVAL,
            "%s: header field block_rows = %lld: blocks of block_rows x (embedding_size %d x %d%s) bytes "
            "exceed %llu bytes",
            name, (long long)m->block_rows, m->dim, (int)per_elem, m->dense ? " + 8" : "",
            (unsigned long long)SNAPFILE_MAX_BLOCK_BYTES);
    if (pf_mul_u64((uint64_t)rows, row_bytes, &payload) < 0)
        return pf_err(-EINVAL, "%s: header fields rows %lld x embedding_size %d x %d bytes overflow", name,
                      (long long)rows, m->dim, (int)per_elem);
    /* The prefix: SGD dense files: mu, wd and the lr of steps 0 .. step-1; AdamW files (dense or not): beta1,
     * beta2, eps, wd and the lr of steps 0 .. step-1. */
    const uint64_t consts = m->adamw ? 4 : 2;
    if ((m->dense || m->adamw) &&
        (pf_mul_u64((uint64_t)m->step + consts, sizeof(double), &lr_bytes) < 0 || payload + lr_bytes < payload))
        return pf_err(-EINVAL, "%s: header field step = %lld: its lr table overflows", name,
                      (long long)m->step);
    payload += lr_bytes;
    if (payload != m->payload_bytes && m->adamw)
        return pf_err(-EINVAL,
                      "%s: header field payload_bytes = %llu, but rows %lld x (embedding_size %d x 12%s) bytes + "
                      "(step + 4) x 8 bytes (AdamW: weights, two moments%s, its constants and the lr of every "
                      "step) = %llu",
                      name, (unsigned long long)m->payload_bytes, (long long)rows, m->dim,
                      m->dense ? " + 8" : "", m->dense ? ", row steps" : "", (unsigned long long)payload);
    if (payload != m->payload_bytes)
        return pf_err(
            -EINVAL,
            m->dense ? "%s: header field payload_bytes = %llu, but rows %lld x (embedding_size %d x 8 "
                       "+ 8) bytes + (step + 2) x 8 bytes (dense: rows, row steps, momentum, weight "
                       "decay and the lr of every step) = %llu"
                     : "%s: header field payload_bytes = %llu, but rows %lld x embedding_size %d x 8 "
                       "bytes (weights and momentum) = %llu",
            name, (unsigned long long)m->payload_bytes, (long long)rows, m->dim, (unsigned long long)payload);
    return 0;
}

int snapfile_check_member(const snapfile_meta *m, const char *name, const char *role, int64_t step, int rank,
                          int n)
{
    const int count = !strcmp(role, "shard") ? m->servers : m->workers;
    if (strcmp(m->role, role))
        return pf_err(-EINVAL, "%s: header field kind = '%s' (file name says '%s')", name, m->role, role);
    if (m->step != step || m->rank != rank || count != n)
        return pf_err(-EINVAL,
                      "%s: header says step %lld, %s %d of %d (file name says step %lld, %d of %d): header "
                      "field %s",
                      name, (long long)m->step, role, m->rank, count, (long long)step, rank, n,
                      m->step != step          ? "step"
                      : m->rank != rank        ? "shard_id"
                      : !strcmp(role, "shard") ? "num_servers"
                                               : "num_workers");
    return 0;
}

/* Checks the fields of a decoded header and fills r->m; 0 or -EINVAL naming the field. */
static int meta_from_pb(snapfile_reader *r, const Pfcps__SnapshotHeader *h, int64_t size)
{
    snapfile_meta *m = &r->m;
    if (h->format_version != SNAPFILE_VERSION)
        return pf_err(-EINVAL,
                      "%s: header field format_version = %u (this build reads %d; version 1 files, written "
                      "before checkpoints carried the run identity, are not resumable)",
                      r->name, h->format_version, SNAPFILE_VERSION);
    if (!h->kind || (strcmp(h->kind, "shard") && strcmp(h->kind, "worker")))
        return pf_err(-EINVAL, "%s: header field kind = '%s' (not shard or worker)", r->name,
                      h->kind ? h->kind : "");
    if (!h->dtype || strcmp(h->dtype, "fp32"))
        return pf_err(-EINVAL, "%s: header field dtype = '%s' (this build reads fp32)", r->name,
                      h->dtype ? h->dtype : "");
    if (h->payload_sha256.len != 32)
        return pf_err(-EINVAL, "%s: header field payload_sha256 is %zu bytes, not 32", r->name,
                      h->payload_sha256.len);
    if (h->run_id.len != CKPT_RUN_ID_BYTES)
        return pf_err(-EINVAL, "%s: header field run_id is %zu bytes, not %d", r->name, h->run_id.len,
                      CKPT_RUN_ID_BYTES);
    if (h->config_digest.len != CKPT_DIGEST_BYTES)
        return pf_err(-EINVAL, "%s: header field config_digest is %zu bytes, not %d", r->name,
                      h->config_digest.len, CKPT_DIGEST_BYTES);
    const uint64_t have = (uint64_t)(size - SNAPFILE_HDR_AREA);
    if (h->payload_bytes != have)
        return pf_err(-EINVAL,
                      "%s: file is %lld bytes but header field payload_bytes says %llu after %d (%s)",
                      r->name, (long long)size, (unsigned long long)h->payload_bytes, SNAPFILE_HDR_AREA,
                      h->payload_bytes > have ? "truncated" : "trailing bytes");
    memset(m, 0, sizeof *m);
    snprintf(m->role, sizeof m->role, "%s", h->kind);
    m->rank = h->shard_id;
    m->servers = h->num_servers;
    m->workers = h->num_workers;
    m->dim = h->embedding_size;
    m->num_classes = h->num_classes;
    m->step = h->step;
    m->rows = h->rows;
    m->block_rows = h->block_rows;
    m->id.seed = h->seed;
    memcpy(m->id.run_id, h->run_id.data, CKPT_RUN_ID_BYTES);
    memcpy(m->id.config_digest, h->config_digest.data, CKPT_DIGEST_BYTES);
    m->payload_bytes = h->payload_bytes;
    m->authenticated = h->authenticated;
    m->dense = h->dense;
    m->adamw = h->adamw;
    memcpy(m->sha256, h->payload_sha256.data, 32);
    int rc = snapfile_check_fields(m, r->name);
    if (rc < 0)
        return rc;
    r->left = h->payload_bytes;
    return 0;
}

/* Is every byte of p[0, n) zero? */
static int all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

int snapfile_open_stream(snapfile_reader *r, FILE *f, int64_t size, const char *name, const snapfile_key *key)
{
    memset(r, 0, sizeof *r);
    r->f = f;
    snprintf(r->name, sizeof r->name, "%s", name);
    uint8_t area[SNAPFILE_HDR_AREA];
    if (size < SNAPFILE_HDR_AREA || fread(area, 1, sizeof area, f) != sizeof area)
        return pf_err(-EINVAL, "%s: %lld bytes, shorter than the %d-byte header area (truncated)", r->name,
                      (long long)size, SNAPFILE_HDR_AREA);
    if (memcmp(area, magic, 8) != 0)
        return pf_err(-EINVAL, "%s: not a pfcps checkpoint file (bad magic)", r->name);
    uint32_t hl = 0;
    for (int i = 0; i < 4; i++)
        hl |= (uint32_t)area[8 + i] << (8 * i);
    if (hl == 0 || hl > AREA_MAX_HL)
        return pf_err(-EINVAL, "%s: header length %u outside 1..%d", r->name, hl, AREA_MAX_HL);
    const uint8_t *hdr = area + AREA_FIXED, *hsum = hdr + hl, *hmac = hsum + 32;
    uint8_t hd[32];
    unsigned int dl = 0;
    EVP_Digest(hdr, hl, hd, &dl, EVP_sha256(), NULL);
    if (memcmp(hd, hsum, 32) != 0)
        return pf_err(-EINVAL, "%s: header checksum mismatch (corrupt header)", r->name);
    if (!all_zero(hmac + 32, sizeof area - (size_t)(hmac + 32 - area)))
        return pf_err(-EINVAL, "%s: header area padding is not zero (corrupt)", r->name);
    Pfcps__SnapshotHeader *h = pfcps__snapshot_header__unpack(NULL, hl, hdr);
    if (!h)
        return pf_err(-EINVAL, "%s: header does not decode (corrupt)", r->name);
    int rc = 0;
    if (key) {
        /* The HMAC first: a reader with the key says "forged" before it looks at what the fields claim. */
        uint8_t mac[32];
        if (!h->authenticated)
            rc = pf_err(-EPERM,
                        "%s: no HMAC (header field authenticated is false): written without the join secret, "
                        "or forged",
                        r->name);
        else if (header_mac(key, hdr, hl, mac) < 0)
            rc = pf_err(-EIO, "%s: HMAC-SHA256 failed", r->name);
        else if (CRYPTO_memcmp(mac, hmac, 32) != 0)
            rc = pf_err(-EPERM, "%s: HMAC does not verify: forged or written by another run's secret",
                        r->name);
    } else if (!h->authenticated && !all_zero(hmac, 32)) {
        rc = pf_err(-EINVAL, "%s: an HMAC in a header whose field authenticated is false (corrupt)", r->name);
    }
    if (rc == 0)
        rc = meta_from_pb(r, h, size);
    pfcps__snapshot_header__free_unpacked(h, NULL);
    if (rc < 0)
        return rc;
    if (!(r->sha = sha_new()))
        return pf_err(-ENOMEM, "%s: out of memory", r->name);
    return 0;
}

int snapfile_open(snapfile_reader *r, const char *path, const snapfile_key *key)
{
    memset(r, 0, sizeof *r);
    FILE *f = NULL;
    int rc = pf_fopen_regular(path, &f);
    if (rc < 0)
        return pf_err_wrap(rc, "%s", path);
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        int e = errno;
        fclose(f);
        return pf_err(-EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    rc = snapfile_open_stream(r, f, (int64_t)st.st_size, path, key);
    r->own = 1;
    r->f = f;
    if (rc < 0)
        snapfile_close(r);
    return rc;
}

int snapfile_read(snapfile_reader *r, void *p, size_t n)
{
    if (n > r->left)
        return pf_err(-EINVAL, "%s: reading %zu bytes past the payload's end", r->name, n);
    size_t got = n ? fread(p, 1, n, r->f) : 0;
    if (got != n)
        return pf_err(ferror(r->f) ? -EIO : -EINVAL, "%s: payload ends early (%s)", r->name,
                      ferror(r->f) ? strerror(errno) : "truncated");
    EVP_DigestUpdate(r->sha, p, n);
    r->left -= n;
    return 0;
}

int snapfile_finish(snapfile_reader *r)
{
    uint8_t buf[65536];
    while (r->left > 0) {
        size_t n = r->left < sizeof buf ? (size_t)r->left : sizeof buf;
        int rc = snapfile_read(r, buf, n);
        if (rc < 0)
            return rc;
    }
    uint8_t d[32];
    unsigned int len = 0;
    EVP_DigestFinal_ex(r->sha, d, &len);
    EVP_MD_CTX_free(r->sha);
    r->sha = NULL;
    if (memcmp(d, r->m.sha256, 32) != 0)
        return pf_err(-EINVAL, "%s: payload checksum mismatch (corrupt file)", r->name);
    return 0;
}

void snapfile_close(snapfile_reader *r)
{
    if (r->sha)
        EVP_MD_CTX_free(r->sha);
    r->sha = NULL;
    if (r->own && r->f)
        fclose(r->f);
    r->f = NULL;
}

int snapfile_verify(const char *path, const snapfile_key *key, snapfile_meta *m)
{
    snapfile_reader r;
    int rc = snapfile_open(&r, path, key);
    if (rc < 0)
        return rc;
    rc = snapfile_finish(&r);
    if (rc == 0 && m)
        *m = r.m;
    snapfile_close(&r);
    return rc;
}
