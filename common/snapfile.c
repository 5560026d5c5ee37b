/* Checkpoint file container: see snapfile.h. */
#include "common/snapfile.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/err.h"
#include "ctl.pb-c.h"

static const char magic[8] = {'P', 'F', 'C', 'P', 'S', 'N', 'P', '1'};

static void *sha_new(void)
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(c);
        c = NULL;
    }
    return c;
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
    h->seed = m->seed;
    h->block_rows = m->block_rows;
}

int snapfile_commit(snapfile_writer *w, snapfile_meta *m)
{
    unsigned int len = 0;
    m->payload_bytes = w->bytes;
    EVP_DigestFinal_ex(w->sha, m->sha256, &len);
    EVP_MD_CTX_free(w->sha);
    w->sha = NULL;
    Pfcps__SnapshotHeader h;
    meta_to_pb(m, &h);
    size_t hl = pfcps__snapshot_header__get_packed_size(&h);
    uint8_t area[SNAPFILE_HDR_AREA];
    memset(area, 0, sizeof area);
    if (hl + 12 + 32 > sizeof area) {
        pf_atomic_abort(&w->af);
        return pf_err(-EINVAL, "%s %s: header of %zu bytes does not fit", w->af.what, w->af.path, hl);
    }
    memcpy(area, magic, 8);
    uint32_t l32 = (uint32_t)hl;
    for (int i = 0; i < 4; i++)
        area[8 + i] = (uint8_t)(l32 >> (8 * i));
    pfcps__snapshot_header__pack(&h, area + 12);
    /* The header's own digest follows it, so a damaged header field is caught too. */
    EVP_Digest(area + 12, hl, area + 12 + hl, &len, EVP_sha256(), NULL);
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

/* Checks the fields of a decoded header; 0 or -EINVAL naming the problem. */
static int meta_from_pb(snapfile_reader *r, const Pfcps__SnapshotHeader *h, int64_t size)
{
    snapfile_meta *m = &r->m;
    if (h->format_version != SNAPFILE_VERSION)
        return pf_err(-EINVAL, "%s: format version %u (this build reads %d)", r->name, h->format_version,
                      SNAPFILE_VERSION);
    if (!h->kind || (strcmp(h->kind, "shard") && strcmp(h->kind, "worker")))
        return pf_err(-EINVAL, "%s: unknown role '%s'", r->name, h->kind ? h->kind : "");
    if (!h->dtype || strcmp(h->dtype, "fp32"))
        return pf_err(-EINVAL, "%s: dtype '%s' (this build reads fp32)", r->name, h->dtype ? h->dtype : "");
    if (h->payload_sha256.len != 32)
        return pf_err(-EINVAL, "%s: payload digest is %zu bytes, not 32", r->name, h->payload_sha256.len);
    if (h->step < 0 || h->num_classes < 0 || h->rows < 0 || h->block_rows < 0 || h->embedding_size < 0 ||
        h->num_servers < 0 || h->num_workers < 0 || h->shard_id < 0 || h->payload_bytes > (uint64_t)INT64_MAX)
        return pf_err(-EINVAL, "%s: negative size field in the header", r->name);
    if ((int64_t)h->payload_bytes != size - SNAPFILE_HDR_AREA)
        return pf_err(-EINVAL, "%s: file is %lld bytes but the header says %llu payload bytes after %d (%s)",
                      r->name, (long long)size, (unsigned long long)h->payload_bytes, SNAPFILE_HDR_AREA,
                      (int64_t)h->payload_bytes > size - SNAPFILE_HDR_AREA ? "truncated" : "trailing bytes");
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
    m->seed = h->seed;
    m->payload_bytes = h->payload_bytes;
    memcpy(m->sha256, h->payload_sha256.data, 32);
    r->left = h->payload_bytes;
    return 0;
}

int snapfile_open_stream(snapfile_reader *r, FILE *f, int64_t size, const char *name)
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
    if (hl == 0 || hl > SNAPFILE_HDR_AREA - 12 - 32)
        return pf_err(-EINVAL, "%s: header length %u outside 1..%d", r->name, hl,
                      SNAPFILE_HDR_AREA - 12 - 32);
    uint8_t hd[32];
    unsigned int dl = 0;
    EVP_Digest(area + 12, hl, hd, &dl, EVP_sha256(), NULL);
    if (memcmp(hd, area + 12 + hl, 32) != 0)
        return pf_err(-EINVAL, "%s: header checksum mismatch (corrupt header)", r->name);
    Pfcps__SnapshotHeader *h = pfcps__snapshot_header__unpack(NULL, hl, area + 12);
    if (!h)
        return pf_err(-EINVAL, "%s: header does not decode (corrupt)", r->name);
    for (size_t i = 12 + hl + 32; i < sizeof area; i++)
        if (area[i] != 0) {
            pfcps__snapshot_header__free_unpacked(h, NULL);
            return pf_err(-EINVAL, "%s: header area padding is not zero (corrupt)", r->name);
        }
    int rc = meta_from_pb(r, h, size);
    pfcps__snapshot_header__free_unpacked(h, NULL);
    if (rc < 0)
        return rc;
    if (!(r->sha = sha_new()))
        return pf_err(-ENOMEM, "%s: out of memory", r->name);
    return 0;
}

int snapfile_open(snapfile_reader *r, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        memset(r, 0, sizeof *r);
        return pf_err(e == ENOENT ? -ENOENT : -EIO, "%s: cannot open: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        fclose(f);
        return pf_err(-EIO, "%s: cannot stat: %s", path, strerror(errno));
    }
    int rc = snapfile_open_stream(r, f, (int64_t)st.st_size, path);
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

int snapfile_verify(const char *path, snapfile_meta *m)
{
    snapfile_reader r;
    int rc = snapfile_open(&r, path);
    if (rc < 0)
        return rc;
    rc = snapfile_finish(&r);
    if (rc == 0 && m)
        *m = r.m;
    snapfile_close(&r);
    return rc;
}
