/* Backbone checkpoints: parameters + BN running statistics (+ named float64 extras in version 2),
 * layout documented in model.h. The model's arrays are device memory: saved through a host copy
 * (model_get_params / model_get_buffers), loaded with mem_h2d per tensor. Written as Redis writes
 * its RDB: temp file, fsync, atomic rename. Loaded whole and verified before the model is touched. */
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/atomic_file.h"
#include "common/checked.h"
#include "common/ckpt.h"
#include "common/err.h"
#include "common/file.h"
#include "worker/model/model_internal.h"

#define CK_MAGIC       "PFCPSBB1"
#define CK_VERSION     2u /* 1: no extras (still loaded) */
#define CK_EXTRA_BYTES 40 /* char name[32] + f64 */
#define CK_FIXED       64 /* magic 8 + 4 u32 + network 32 + ... */

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

/* All tensors in checkpoint order: parameters, then running statistics. *data (when data) is
 * the tensor's place in `params` / `bufs` (host copies or the model's device arrays). */
static const model_tensor *ck_tensor(const model *m, int i, float *params, float *bufs, float **data)
{
    if (i < m->n_tensors) {
        if (data)
            *data = params + m->tensors[i].offset;
        return &m->tensors[i];
    }
    if (data)
        *data = bufs + m->buffers_t[i - m->n_tensors].offset;
    return &m->buffers_t[i - m->n_tensors];
}

static int build_table(const model *m, wbuf *w, uint64_t *payload_bytes)
{
    uint64_t off = 0;
    int n = m->n_tensors + m->n_buffers;
    for (int i = 0; i < n; i++) {
        const model_tensor *t = ck_tensor(m, i, NULL, NULL, NULL);
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

static void fixed_header(const model *m, unsigned char hdr[CK_FIXED], uint64_t payload, uint64_t sum,
                         int n_extras)
{
    memset(hdr, 0, CK_FIXED);
    memcpy(hdr, CK_MAGIC, 8);
    uint32_t u[4] = {CK_VERSION, (uint32_t)m->desc.embedding_size, (uint32_t)(m->n_tensors + m->n_buffers),
                     (uint32_t)n_extras};
    memcpy(hdr + 8, u, 16);
    snprintf((char *)hdr + 24, 32, "%s", m->desc.name);
    memcpy(hdr + 56, &payload, 8);
    (void)sum;
}

/* Checks an extras table: n in [0, MODEL_EXTRAS_MAX], names NUL-terminated, 1..31 characters,
 * NUL-padded to 32 bytes when `padded`, unique. */
static int check_extras(const model_extra *x, int n, int padded, const char *what)
{
    if (n < 0 || n > MODEL_EXTRAS_MAX || (n > 0 && !x))
        return pf_err(-EINVAL, "%s: %d extras (at most %d)", what, n, MODEL_EXTRAS_MAX);
    for (int i = 0; i < n; i++) {
        size_t len = strnlen(x[i].name, sizeof x[i].name);
        if (len == 0 || len >= sizeof x[i].name)
            return pf_err(-EINVAL,
                          "%s: extra %d has an empty or unterminated name (1..%zu "
                          "characters)",
                          what, i, sizeof x[i].name - 1);
        for (size_t k = len; padded && k < sizeof x[i].name; k++)
            if (x[i].name[k])
                return pf_err(-EINVAL, "%s: extra '%s' is not NUL-padded", what, x[i].name);
        for (int j = 0; j < i; j++)
            if (!strcmp(x[i].name, x[j].name))
                return pf_err(-EINVAL, "%s: extra '%s' appears twice", what, x[i].name);
    }
    return 0;
}

int model_save(const model *m, const char *path)
{
    return model_save_ex(m, path, NULL, 0);
}

int model_save_ex(const model *m, const char *path, const model_extra *x, int n_extras)
{
    int rc = check_extras(x, n_extras, 0, "model_save_ex");
    if (rc)
        return rc;
    /* the extras as written: names NUL-padded, values little-endian f64 */
    unsigned char ext[MODEL_EXTRAS_MAX * CK_EXTRA_BYTES];
    memset(ext, 0, sizeof ext);
    for (int i = 0; i < n_extras; i++) {
        memcpy(ext + (size_t)i * CK_EXTRA_BYTES, x[i].name, strlen(x[i].name));
        memcpy(ext + (size_t)i * CK_EXTRA_BYTES + 32, &x[i].value, 8);
    }
    size_t ext_n = (size_t)n_extras * CK_EXTRA_BYTES;
    /* host copies of the device arrays */
    float *hp = malloc((m->n_params ? m->n_params : 1) * sizeof(float));
    float *hb = malloc((m->n_buffer_floats ? m->n_buffer_floats : 1) * sizeof(float));
    wbuf table = {0};
    if (!hp || !hb) {
        rc = pf_err(-ENOMEM, "checkpoint %s: out of memory for the host copy", path);
        goto out;
    }
    if ((rc = model_get_params(m, hp)) || (rc = model_get_buffers(m, hb))) {
        rc = pf_err_wrap(rc, "checkpoint %s: reading the model from device %s", path, m->dev->name);
        goto out;
    }
    uint64_t payload = 0;
    if ((rc = build_table(m, &table, &payload)))
        goto out;
    uint64_t sum = fnv1a(FNV_INIT, table.p, table.n);
    sum = fnv1a(sum, ext, ext_n);
    int n = m->n_tensors + m->n_buffers;
    for (int i = 0; i < n; i++) {
        float *d;
        const model_tensor *t = ck_tensor(m, i, hp, hb, &d);
        sum = fnv1a(sum, d, t->count * sizeof(float));
    }
    unsigned char hdr[CK_FIXED + 8];
    fixed_header(m, hdr, payload, sum, n_extras);
    memcpy(hdr + CK_FIXED, &sum, 8);

    pf_atomic_file af;
    if ((rc = pf_atomic_open(&af, path, "checkpoint")) < 0)
        goto out;
    FILE *f = af.f;
    int ok = fwrite(hdr, 1, sizeof hdr, f) == sizeof hdr && fwrite(table.p, 1, table.n, f) == table.n &&
             (ext_n == 0 || fwrite(ext, 1, ext_n, f) == ext_n);
    for (int i = 0; ok && i < n; i++) {
        float *d;
        const model_tensor *t = ck_tensor(m, i, hp, hb, &d);
        ok = fwrite(d, sizeof(float), t->count, f) == t->count;
    }
    rc = pf_atomic_commit(&af, ok);
out:
    free(table.p);
    free(hp);
    free(hb);
    return rc;
}

int model_load(model *m, const char *path)
{
    return model_load_ex(m, path, NULL, 0, NULL);
}

/* Step 1 of a load: the fixed header (magic, version, extras count, network, embedding size, tensor
 * count) against the model. *n_extras receives the extras count. */
static int load_check_header(const model *m, const unsigned char *buf, size_t size, const char *path,
                             uint32_t *n_extras)
{
    if (size < CK_FIXED + 8 || memcmp(buf, CK_MAGIC, 8))
        return pf_err(-EPROTO, "checkpoint %s: not a pfcps backbone checkpoint (bad magic)", path);
    uint32_t u[4];
    memcpy(u, buf + 8, 16);
    if (u[0] != 1 && u[0] != CK_VERSION)
        return pf_err(-EPROTO, "checkpoint %s: version %u, expected 1 or %u", path, u[0], CK_VERSION);
    /* version 1: the last u32 is reserved (no extras) */
    *n_extras = u[0] >= 2 ? u[3] : 0;
    if (*n_extras > MODEL_EXTRAS_MAX)
        return pf_err(-EPROTO, "checkpoint %s: %u extras (at most %d): corrupt header", path, *n_extras,
                      MODEL_EXTRAS_MAX);
    char net[33] = {0};
    memcpy(net, buf + 24, 32);
    if (strcmp(net, m->desc.name))
        return pf_err(-EINVAL, "checkpoint %s: network '%s', model is '%s'", path, net, m->desc.name);
    if (u[1] != (uint32_t)m->desc.embedding_size)
        return pf_err(-EINVAL, "checkpoint %s: embedding_size %u, model has %d", path, u[1],
                      m->desc.embedding_size);
    int n = m->n_tensors + m->n_buffers;
    if (u[2] != (uint32_t)n)
        return pf_err(-EINVAL, "checkpoint %s: %u tensors, model has %d", path, u[2], n);
    return 0;
}

/* Step 2: the tensor table (byte for byte the one this model would write), the file size and the
 * checksum. *extras / *payload receive where the extras table and the tensor data start. */
static int load_check_body(const model *m, const unsigned char *buf, size_t size, uint32_t n_extras,
                           const char *path, const unsigned char **extras, const unsigned char **payload)
{
    uint64_t payload_bytes, sum;
    memcpy(&payload_bytes, buf + 56, 8);
    memcpy(&sum, buf + CK_FIXED, 8);
    wbuf table = {0};
    uint64_t mine = 0;
    size_t hdr = CK_FIXED + 8;
    size_t ext_n = (size_t)n_extras * CK_EXTRA_BYTES;
    int rc = build_table(m, &table, &mine);
    uint64_t expect = 0;
    if (rc == 0 && (pf_add_u64(hdr + table.n + ext_n, mine, &expect) < 0))
        rc = pf_err(-EPROTO, "checkpoint %s: the model's own size overflows", path);
    if (rc == 0 && (size < hdr + table.n || memcmp(buf + hdr, table.p, table.n)))
        rc = pf_err(size < hdr + table.n ? -EPROTO : -EINVAL,
                    "checkpoint %s: tensor table truncated or does not match the model layout "
                    "(names, shapes, dtype)",
                    path);
    else if (rc == 0 && (payload_bytes != mine || size != expect))
        rc = pf_err(-EPROTO, "checkpoint %s: %zu bytes, expected %llu (truncated or padded)", path, size,
                    (unsigned long long)expect);
    else if (rc == 0) {
        uint64_t calc = fnv1a(FNV_INIT, buf + hdr, size - hdr);
        if (calc != sum)
            rc = pf_err(-EPROTO, "checkpoint %s: checksum mismatch (file %016llx, computed %016llx)", path,
                        (unsigned long long)sum, (unsigned long long)calc);
    }
    if (rc == 0) {
        *extras = buf + hdr + table.n;
        *payload = *extras + ext_n;
    }
    free(table.p);
    return rc;
}

/* Step 3: the extras table (n_extras entries of name[32] + f64) into ex, checked. */
static int load_extras(const unsigned char *ep, uint32_t n_extras, model_extra *ex, const char *path)
{
    memset(ex, 0, MODEL_EXTRAS_MAX * sizeof *ex);
    for (uint32_t i = 0; i < n_extras; i++) {
        memcpy(ex[i].name, ep + (size_t)i * CK_EXTRA_BYTES, 32);
        memcpy(&ex[i].value, ep + (size_t)i * CK_EXTRA_BYTES + 32, 8);
    }
    if (check_extras(ex, (int)n_extras, 1, "extras"))
        return pf_err_wrap(-EPROTO, "checkpoint %s: corrupt extras table", path);
    return 0;
}

/* Step 4: every tensor from the payload into the model's device arrays, in checkpoint order. */
static int load_tensors(model *m, const unsigned char *pl, const char *path)
{
    int n = m->n_tensors + m->n_buffers;
    for (int i = 0; i < n; i++) {
        float *d;
        const model_tensor *t = ck_tensor(m, i, m->params, m->bufs, &d);
        int rc = m->dev->mem_h2d(m->ctx, d, pl, t->count * sizeof(float));
        if (rc)
            return pf_err_wrap(rc, "checkpoint %s: writing tensor %s to device %s", path, t->name,
                               m->dev->name);
        pl += t->count * sizeof(float);
    }
    return 0;
}

int model_load_ex(model *m, const char *path, model_extra *x, int cap, int *n_out)
{
    return model_load_digest(m, path, NULL, x, cap, n_out);
}

int model_load_digest(model *m, const char *path, const uint8_t want_sha256[32], model_extra *x, int cap,
                      int *n_out)
{
    if (n_out)
        *n_out = 0;
    if (cap < 0 || (cap > 0 && !x))
        return pf_err(-EINVAL, "model_load_ex: extras capacity %d without a table", cap);
    uint8_t *buf = NULL;
    size_t size = 0;
    int rc = pf_read_file(path, 0, &buf, &size);
    if (rc)
        return pf_err_wrap(rc, "checkpoint %s", path);
    if (want_sha256) {
        uint8_t d[32];
        unsigned int dl = 0;
        if (EVP_Digest(buf, size, d, &dl, EVP_sha256(), NULL) != 1)
            rc = pf_err(-ENOMEM, "checkpoint %s: SHA-256 failed", path);
        else if (memcmp(d, want_sha256, 32) != 0)
            rc = pf_err(-EINVAL, "checkpoint %s: its SHA-256 is not the one recorded for it (corrupt or replaced)",
                        path);
        if (rc) {
            free(buf);
            return rc;
        }
    }
    uint32_t n_extras = 0;
    const unsigned char *ep = NULL, *pl = NULL;
    model_extra ex[MODEL_EXTRAS_MAX];
    if ((rc = load_check_header(m, buf, size, path, &n_extras)) ||
        (rc = load_check_body(m, buf, size, n_extras, path, &ep, &pl)) ||
        (rc = load_extras(ep, n_extras, ex, path)))
        goto out;
    if (x && (int)n_extras > cap) {
        rc = pf_err(-EINVAL, "checkpoint %s: %u extras, room for %d", path, n_extras, cap);
        goto out;
    }
    if ((rc = load_tensors(m, pl, path)))
        goto out;
    if (x)
        memcpy(x, ex, n_extras * sizeof *x);
    if (n_out)
        *n_out = (int)n_extras;
out:
    free(buf);
    return rc;
}

/* Walks the tensor table of a backbone file as written, from buf + at (size bytes in all), for n_tensors
 * entries: *end = where it ends, *payload = the payload bytes its shapes imply. */
static int walk_table(const unsigned char *buf, size_t size, size_t at, uint32_t n_tensors, const char *path,
                      size_t *end, uint64_t *payload)
{
    uint64_t off = 0;
    for (uint32_t i = 0; i < n_tensors; i++) {
        uint16_t nl;
        if (size - at < 2)
            return pf_err(-EPROTO, "checkpoint %s: tensor table truncated at tensor %u", path, i);
        memcpy(&nl, buf + at, 2);
        if (nl == 0 || size - at - 2 < (size_t)nl + 2)
            return pf_err(-EPROTO, "checkpoint %s: tensor %u: name length %u empty or past the file's end",
                          path, i, nl);
        at += 2 + (size_t)nl;
        uint8_t dtype = buf[at], nd = buf[at + 1];
        at += 2;
        if (dtype != 0 || nd < 1 || nd > 5)
            return pf_err(-EPROTO, "checkpoint %s: tensor %u: dtype %u, ndim %u (f32 = 0 and 1..5 dims read)",
                          path, i, dtype, nd);
        if (size - at < (size_t)nd * 4 + 8)
            return pf_err(-EPROTO, "checkpoint %s: tensor %u: shape past the file's end", path, i);
        uint64_t count = 1, bytes = 0, toff = 0;
        for (int k = 0; k < nd; k++) {
            uint32_t d;
            memcpy(&d, buf + at + 4 * (size_t)k, 4);
            if (pf_mul_u64(count, d, &count) < 0)
                return pf_err(-EPROTO, "checkpoint %s: tensor %u: shape overflows", path, i);
        }
        at += (size_t)nd * 4;
        memcpy(&toff, buf + at, 8);
        at += 8;
        if (toff != off)
            return pf_err(-EPROTO,
                          "checkpoint %s: tensor %u: payload offset %llu, the tensors before it end at %llu",
                          path, i, (unsigned long long)toff, (unsigned long long)off);
        if (pf_mul_u64(count, sizeof(float), &bytes) < 0 || pf_add_u64(off, bytes, &off) < 0)
            return pf_err(-EPROTO, "checkpoint %s: tensor %u: payload size overflows", path, i);
    }
    *end = at;
    *payload = off;
    return 0;
}

int model_file_extras(const char *path, model_extra *x, int cap, int *n_out, uint8_t file_sha256[32],
                      uint8_t tensors_sha256[32])
{
    *n_out = 0;
    uint8_t *buf = NULL;
    size_t size = 0;
    int rc = pf_read_file(path, 0, &buf, &size);
    if (rc)
        return pf_err_wrap(rc, "checkpoint %s", path);
    unsigned int dl = 0;
    if (file_sha256 && EVP_Digest(buf, size, file_sha256, &dl, EVP_sha256(), NULL) != 1) {
        free(buf);
        return pf_err(-EIO, "checkpoint %s: SHA-256 failed", path);
    }
    uint32_t u[4] = {0, 0, 0, 0};
    uint64_t payload_bytes = 0, sum = 0, payload = 0, total = 0;
    size_t hdr = CK_FIXED + 8, end = 0;
    if (size < hdr || memcmp(buf, CK_MAGIC, 8)) {
        rc = pf_err(-EPROTO, "checkpoint %s: not a pfcps backbone checkpoint (bad magic)", path);
        goto out;
    }
    memcpy(u, buf + 8, 16);
    memcpy(&payload_bytes, buf + 56, 8);
    memcpy(&sum, buf + CK_FIXED, 8);
    uint32_t n_extras = u[0] >= 2 ? u[3] : 0;
    if (u[0] != 1 && u[0] != CK_VERSION)
        rc = pf_err(-EPROTO, "checkpoint %s: version %u, expected 1 or %u", path, u[0], CK_VERSION);
    else if (n_extras > MODEL_EXTRAS_MAX)
        rc = pf_err(-EPROTO, "checkpoint %s: %u extras (at most %d): corrupt header", path, n_extras,
                    MODEL_EXTRAS_MAX);
    else if (x && (int)n_extras > cap)
        rc = pf_err(-EINVAL, "checkpoint %s: %u extras, room for %d", path, n_extras, cap);
    else
        rc = walk_table(buf, size, hdr, u[2], path, &end, &payload);
    if (rc)
        goto out;
    if (payload != payload_bytes || pf_add_u64(end, (uint64_t)n_extras * CK_EXTRA_BYTES, &total) < 0 ||
        pf_add_u64(total, payload, &total) < 0 || total != size) {
        rc = pf_err(
            -EPROTO,
            "checkpoint %s: %zu bytes, but its header says payload_bytes %llu and its tensors %llu after "
            "a table and extras of %zu bytes (truncated or padded)",
            path, size, (unsigned long long)payload_bytes, (unsigned long long)payload,
            end + (size_t)n_extras * CK_EXTRA_BYTES);
        goto out;
    }
    uint64_t calc = fnv1a(FNV_INIT, buf + hdr, size - hdr);
    if (calc != sum) {
        rc = pf_err(-EPROTO, "checkpoint %s: checksum mismatch (file %016llx, computed %016llx)", path,
                    (unsigned long long)sum, (unsigned long long)calc);
        goto out;
    }
    model_extra ex[MODEL_EXTRAS_MAX];
    if ((rc = load_extras(buf + end, n_extras, ex, path)))
        goto out;
    if (tensors_sha256 &&
        EVP_Digest(buf + size - payload, (size_t)payload, tensors_sha256, &dl, EVP_sha256(), NULL) != 1) {
        rc = pf_err(-EIO, "checkpoint %s: SHA-256 failed", path);
        goto out;
    }
    if (x)
        memcpy(x, ex, n_extras * sizeof *x);
    *n_out = (int)n_extras;
out:
    free(buf);
    return rc;
}

int model_file_ident(const char *path, ckpt_ident *id, uint8_t file_sha256[32], uint8_t tensors_sha256[32])
{
    model_extra ex[MODEL_EXTRAS_MAX];
    char names[MODEL_EXTRAS_MAX][32];
    uint64_t bits[MODEL_EXTRAS_MAX];
    int n = 0, rc = model_file_extras(path, ex, MODEL_EXTRAS_MAX, &n, file_sha256, tensors_sha256);
    if (rc < 0)
        return rc;
    for (int i = 0; i < n; i++) {
        memcpy(names[i], ex[i].name, 32);
        memcpy(&bits[i], &ex[i].value, 8);
    }
    rc = ckpt_ident_from_extras((const char(*)[32])names, bits, n, id);
    return rc < 0 ? pf_err_wrap(rc, "checkpoint %s", path) : 0;
}
