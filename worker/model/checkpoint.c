/* Backbone checkpoints: parameters + BN running statistics, layout documented in model.h.
 * Written as Redis writes its RDB: temp file, fsync, atomic rename. Loaded whole and verified
 * before the model is touched. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "worker/model/model_internal.h"

#define CK_MAGIC "PFCPSBB1"
#define CK_VERSION 1u
#define CK_FIXED 64 /* magic 8 + 4 u32 + network 32 + ... */

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001B3ull;
    }
    return h;
}
#define FNV_INIT 0xCBF29CE484222325ull

typedef struct wbuf {
    unsigned char *p;
    size_t n, cap;
} wbuf;

static int put(wbuf *w, const void *src, size_t n)
{
    if (w->n + n > w->cap) {
        size_t nc = w->cap ? w->cap * 2 : 4096;
        while (nc < w->n + n)
            nc *= 2;
        unsigned char *q = realloc(w->p, nc);
        if (!q)
            return pf_err(-ENOMEM, "checkpoint: out of memory");
        w->p = q;
        w->cap = nc;
    }
    memcpy(w->p + w->n, src, n);
    w->n += n;
    return 0;
}

/* All tensors in checkpoint order: parameters, then running statistics. */
static const model_tensor *ck_tensor(const model *m, int i, const float **data)
{
    if (i < m->n_tensors) {
        if (data)
            *data = m->params + m->tensors[i].offset;
        return &m->tensors[i];
    }
    if (data)
        *data = m->bufs + m->buffers_t[i - m->n_tensors].offset;
    return &m->buffers_t[i - m->n_tensors];
}

static int build_table(const model *m, wbuf *w, uint64_t *payload_bytes)
{
    uint64_t off = 0;
    int n = m->n_tensors + m->n_buffers;
    for (int i = 0; i < n; i++) {
        const model_tensor *t = ck_tensor(m, i, NULL);
        uint16_t nl = (uint16_t)strlen(t->name);
        uint8_t dtype = 0, nd = (uint8_t)t->ndim;
        int rc;
        if ((rc = put(w, &nl, 2)) || (rc = put(w, t->name, nl)) || (rc = put(w, &dtype, 1)) ||
            (rc = put(w, &nd, 1)))
            return rc;
        for (int k = 0; k < t->ndim; k++) {
            uint32_t s = (uint32_t)t->shape[k];
            if ((rc = put(w, &s, 4)))
                return rc;
        }
        if ((rc = put(w, &off, 8)))
            return rc;
        off += t->count * sizeof(float);
    }
    *payload_bytes = off;
    return 0;
}

static void fixed_header(const model *m, unsigned char hdr[CK_FIXED], uint64_t payload,
                         uint64_t sum)
{
    memset(hdr, 0, CK_FIXED);
    memcpy(hdr, CK_MAGIC, 8);
    uint32_t u[4] = {CK_VERSION, (uint32_t)m->desc.embedding_size,
                     (uint32_t)(m->n_tensors + m->n_buffers), 0};
    memcpy(hdr + 8, u, 16);
    snprintf((char *)hdr + 24, 32, "%s", m->desc.name);
    memcpy(hdr + 56, &payload, 8);
    (void)sum;
}

int model_save(const model *m, const char *path)
{
    wbuf table = {0};
    uint64_t payload = 0;
    int rc = build_table(m, &table, &payload);
    if (rc) {
        free(table.p);
        return rc;
    }
    uint64_t sum = fnv1a(FNV_INIT, table.p, table.n);
    int n = m->n_tensors + m->n_buffers;
    for (int i = 0; i < n; i++) {
        const float *d;
        const model_tensor *t = ck_tensor(m, i, &d);
        sum = fnv1a(sum, d, t->count * sizeof(float));
    }
    unsigned char hdr[CK_FIXED + 8];
    fixed_header(m, hdr, payload, sum);
    memcpy(hdr + CK_FIXED, &sum, 8);

    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp) {
        free(table.p);
        return pf_err(-EINVAL, "checkpoint path too long: %s", path);
    }
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        rc = pf_err(-EIO, "checkpoint %s: cannot create: %s", tmp, strerror(errno));
        free(table.p);
        return rc;
    }
    int ok = fwrite(hdr, 1, sizeof hdr, f) == sizeof hdr &&
             fwrite(table.p, 1, table.n, f) == table.n;
    for (int i = 0; ok && i < n; i++) {
        const float *d;
        const model_tensor *t = ck_tensor(m, i, &d);
        ok = fwrite(d, sizeof(float), t->count, f) == t->count;
    }
    free(table.p);
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int err = errno;
    if (fclose(f) != 0 && ok) {
        ok = 0;
        err = errno;
    }
    if (!ok || rename(tmp, path) != 0) {
        if (ok)
            err = errno;
        unlink(tmp);
        return pf_err(-EIO, "checkpoint %s: write failed: %s", path, strerror(err));
    }
    return 0;
}

int model_load(model *m, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return pf_err(errno == ENOENT ? -ENOENT : -EIO, "checkpoint %s: cannot open: %s", path,
                      strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        fclose(f);
        return pf_err(-EIO, "checkpoint %s: stat failed", path);
    }
    size_t size = (size_t)st.st_size;
    unsigned char *buf = malloc(size ? size : 1);
    if (!buf) {
        fclose(f);
        return pf_err(-ENOMEM, "checkpoint %s: out of memory for %zu bytes", path, size);
    }
    size_t got = fread(buf, 1, size, f);
    fclose(f);
    int rc = 0;
    if (got != size) {
        rc = pf_err(-EIO, "checkpoint %s: short read", path);
        goto out;
    }
    if (size < CK_FIXED + 8 || memcmp(buf, CK_MAGIC, 8)) {
        rc = pf_err(-EPROTO, "checkpoint %s: not a pfcps backbone checkpoint (bad magic)", path);
        goto out;
    }
    uint32_t u[4];
    memcpy(u, buf + 8, 16);
    if (u[0] != CK_VERSION) {
        rc = pf_err(-EPROTO, "checkpoint %s: version %u, expected %u", path, u[0], CK_VERSION);
        goto out;
    }
    char net[33] = {0};
    memcpy(net, buf + 24, 32);
    if (strcmp(net, m->desc.name)) {
        rc = pf_err(-EINVAL, "checkpoint %s: network '%s', model is '%s'", path, net,
                    m->desc.name);
        goto out;
    }
    if (u[1] != (uint32_t)m->desc.embedding_size) {
        rc = pf_err(-EINVAL, "checkpoint %s: embedding_size %u, model has %d", path, u[1],
                    m->desc.embedding_size);
        goto out;
    }
    int n = m->n_tensors + m->n_buffers;
    if (u[2] != (uint32_t)n) {
        rc = pf_err(-EINVAL, "checkpoint %s: %u tensors, model has %d", path, u[2], n);
        goto out;
    }
    uint64_t payload, sum;
    memcpy(&payload, buf + 56, 8);
    memcpy(&sum, buf + CK_FIXED, 8);
    /* The table must equal the one this model would write, byte for byte. */
    wbuf table = {0};
    uint64_t mine = 0;
    if ((rc = build_table(m, &table, &mine))) {
        free(table.p);
        goto out;
    }
    size_t hdr = CK_FIXED + 8;
    if (size < hdr + table.n || memcmp(buf + hdr, table.p, table.n)) {
        /* find the first differing tensor name for the message */
        free(table.p);
        rc = pf_err(size < hdr + table.n ? -EPROTO : -EINVAL,
                    "checkpoint %s: tensor table truncated or does not match the model layout "
                    "(names, shapes, dtype)", path);
        goto out;
    }
    if (payload != mine || size != hdr + table.n + payload) {
        rc = pf_err(-EPROTO, "checkpoint %s: %zu bytes, expected %zu (truncated or padded)",
                    path, size, (size_t)(hdr + table.n + mine));
        free(table.p);
        goto out;
    }
    uint64_t calc = fnv1a(FNV_INIT, buf + hdr, size - hdr);
    if (calc != sum) {
        rc = pf_err(-EPROTO, "checkpoint %s: checksum mismatch (file %016llx, computed %016llx)",
                    path, (unsigned long long)sum, (unsigned long long)calc);
        free(table.p);
        goto out;
    }
    const unsigned char *pl = buf + hdr + table.n;
    free(table.p);
    for (int i = 0; i < n; i++) {
        const float *d;
        const model_tensor *t = ck_tensor(m, i, &d);
        memcpy((float *)d, pl, t->count * sizeof(float));
        pl += t->count * sizeof(float);
    }
out:
    free(buf);
    return rc;
}
