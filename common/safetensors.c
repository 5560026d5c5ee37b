/* safetensors reader and writer (format and rules in safetensors.h). */
#include "common/safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/atomic_file.h"
#include "common/checked.h"
#include "common/err.h"
#include "common/file.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c reads and writes the format's little-endian data as host memory"
#endif

struct st_file {
    st_tensor *t;
    int n;
    json_t *root;         /* owns the names */
    json_t *meta;         /* __metadata__ or NULL (borrowed from root) */
    unsigned char *owned; /* st_read's buffer */
};

size_t st_dtype_size(const char *d)
{
    static const struct {
        const char *name;
        size_t size;
    } tab[] = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
               {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
               {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
    for (size_t i = 0; d && i < sizeof tab / sizeof *tab; i++)
        if (!strcmp(d, tab[i].name))
            return tab[i].size;
    return 0;
}

/* ---- reading ---- */

static int cmp_tensor(const void *a, const void *b)
{
    const st_tensor *x = a, *y = b;
    if (x->data != y->data)
        return x->data < y->data ? -1 : 1;
    if (x->nbytes != y->nbytes)
        return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* A non-negative JSON integer into *v. */
static int json_u64(const json_t *j, uint64_t *v)
{
    if (!json_is_integer(j) || json_integer_value(j) < 0)
        return -1;
    *v = (uint64_t)json_integer_value(j);
    return 0;
}

/* One "name": {...} entry into t (data offsets checked against the data's size `dlen`, relative to
 * `data`). */
static int parse_entry(st_tensor *t, const char *name, json_t *v, const unsigned char *data, size_t dlen,
                       const char *what)
{
    t->name = name;
    if (!json_is_object(v))
        return pf_err(-EPROTO, "safetensors %s: tensor '%s': not a JSON object", what, name);
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
           *off = json_object_get(v, "data_offsets");
    if (!dt || !sh || !off || json_object_size(v) != 3)
        return pf_err(-EPROTO, "safetensors %s: tensor '%s': needs exactly dtype, shape and data_offsets",
                      what, name);
    const char *ds = json_string_value(dt);
    size_t es = st_dtype_size(ds);
    if (!ds || !es)
        return pf_err(-EPROTO, "safetensors %s: tensor '%s': unknown dtype %s", what, name,
                      ds ? ds : "(not a string)");
    snprintf(t->dtype, sizeof t->dtype, "%s", ds);
    if (!json_is_array(sh) || json_array_size(sh) > ST_MAX_DIMS)
        return pf_err(-EPROTO, "safetensors %s: tensor '%s': shape is not an array of at most %d integers",
                      what, name, ST_MAX_DIMS);
    t->ndim = (int)json_array_size(sh);
    uint64_t count = 1;
    for (int k = 0; k < t->ndim; k++) {
        uint64_t d;
        if (json_u64(json_array_get(sh, (size_t)k), &d) || d > INT64_MAX)
            return pf_err(-EPROTO, "safetensors %s: tensor '%s': shape[%d] is not a non-negative integer",
                          what, name, k);
        t->shape[k] = (int64_t)d;
        if (pf_mul_u64(count, d, &count) < 0)
            return pf_err(-EPROTO, "safetensors %s: tensor '%s': shape overflows", what, name);
    }
    uint64_t b, e, nb;
    if (!json_is_array(off) || json_array_size(off) != 2 || json_u64(json_array_get(off, 0), &b) ||
        json_u64(json_array_get(off, 1), &e))
        return pf_err(-EPROTO, "safetensors %s: tensor '%s': data_offsets is not [begin, end]", what, name);
    if (b > e || e > dlen)
        return pf_err(-EPROTO,
                      "safetensors %s: tensor '%s': data_offsets [%llu, %llu] outside the data (%zu bytes)",
                      what, name, (unsigned long long)b, (unsigned long long)e, dlen);
    if (pf_mul_u64(count, (uint64_t)es, &nb) < 0 || nb != e - b)
        return pf_err(-EPROTO,
                      "safetensors %s: tensor '%s': %llu bytes at data_offsets, %s x shape needs %llu", what,
                      name, (unsigned long long)(e - b), t->dtype, (unsigned long long)nb);
    t->data = data + b;
    t->nbytes = (size_t)nb;
    return 0;
}

int st_parse(st_file **out, const void *buf, size_t size, const char *what)
{
    *out = NULL;
    const unsigned char *p = buf;
    uint64_t n;
    if (size < 8)
        return pf_err(-EPROTO, "safetensors %s: %zu bytes, shorter than the 8-byte header length", what,
                      size);
    memcpy(&n, p, 8);
    if (n > ST_MAX_HEADER || n > size - 8)
        return pf_err(-EPROTO, "safetensors %s: header length %llu beyond the file (%zu bytes) or above %u",
                      what, (unsigned long long)n, size, ST_MAX_HEADER);
    if (n < 2 || p[8] != '{')
        return pf_err(-EPROTO, "safetensors %s: the header is not a JSON object", what);
    st_file *f = calloc(1, sizeof *f);
    if (!f)
        return pf_err(-ENOMEM, "safetensors %s: out of memory", what);
    json_error_t je;
    f->root = json_loadb((const char *)p + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    int rc = 0;
    if (!f->root || !json_is_object(f->root)) {
        rc = pf_err(-EPROTO, "safetensors %s: header is not valid JSON (%s at byte %d)", what,
                    f->root ? "not an object" : je.text, f->root ? 0 : je.position);
        goto fail;
    }
    size_t cap = json_object_size(f->root);
    f->t = calloc(cap ? cap : 1, sizeof *f->t);
    if (!f->t) {
        rc = pf_err(-ENOMEM, "safetensors %s: out of memory", what);
        goto fail;
    }
    const unsigned char *data = p + 8 + n;
    size_t dlen = size - 8 - (size_t)n;
    const char *key;
    json_t *v;
    json_object_foreach(f->root, key, v)
    {
        if (!strcmp(key, "__metadata__")) {
            const char *mk;
            json_t *mv;
            if (!json_is_object(v)) {
                rc = pf_err(-EPROTO, "safetensors %s: __metadata__ is not an object", what);
                goto fail;
            }
            json_object_foreach(v, mk, mv)
            {
                if (!json_is_string(mv)) {
                    rc = pf_err(-EPROTO, "safetensors %s: __metadata__ '%s' is not a string", what, mk);
                    goto fail;
                }
            }
            f->meta = v;
            continue;
        }
        if ((rc = parse_entry(&f->t[f->n], key, v, data, dlen, what)))
            goto fail;
        f->n++;
    }
    qsort(f->t, (size_t)f->n, sizeof *f->t, cmp_tensor);
    /* the byte ranges must tile the data: no overlap, no gap, nothing after the last */
    const unsigned char *at = data;
    for (int i = 0; i < f->n; i++) {
        if (f->t[i].data != at) {
            rc = pf_err(-EPROTO,
                        "safetensors %s: tensor '%s' begins at data byte %zu, expected %zu (%s the previous "
                        "tensor)",
                        what, f->t[i].name, (size_t)(f->t[i].data - data), (size_t)(at - data),
                        f->t[i].data < at ? "overlaps" : "a gap after");
            goto fail;
        }
        at += f->t[i].nbytes;
    }
    if ((size_t)(at - data) != dlen) {
        rc = pf_err(-EPROTO, "safetensors %s: the tensors cover %zu data bytes, the file holds %zu", what,
                    (size_t)(at - data), dlen);
        goto fail;
    }
    *out = f;
    return 0;
fail:
    st_free(f);
    return rc;
}

int st_read(st_file **out, const char *path)
{
    *out = NULL;
    uint8_t *buf;
    size_t size;
    int rc = pf_read_file(path, 0, &buf, &size);
    if (rc)
        return pf_err_wrap(rc, "safetensors %s", path);
    rc = st_parse(out, buf, size, path);
    if (rc) {
        free(buf);
        return rc;
    }
    (*out)->owned = buf;
    return 0;
}

void st_free(st_file *f)
{
    if (!f)
        return;
    free(f->t);
    if (f->root)
        json_decref(f->root);
    free(f->owned);
    free(f);
}

int st_count(const st_file *f)
{
    return f->n;
}

const st_tensor *st_at(const st_file *f, int i)
{
    return i >= 0 && i < f->n ? &f->t[i] : NULL;
}

const st_tensor *st_find(const st_file *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->t[i].name, name))
            return &f->t[i];
    return NULL;
}

const char *st_metadata(const st_file *f, const char *key)
{
    return f->meta ? json_string_value(json_object_get(f->meta, key)) : NULL;
}

/* ---- writing ---- */

/* The bytes of tensor t (element size x shape). Returns 0, or -EOVERFLOW when they exceed UINT64_MAX. */
static int entry_bytes_checked(const st_entry *t, uint64_t *out)
{
    uint64_t c = st_dtype_size(t->dtype);
    for (int k = 0; k < t->ndim; k++)
        if (pf_mul_u64(c, (uint64_t)t->shape[k], &c) < 0)
            return -EOVERFLOW;
    *out = c;
    return 0;
}

/* The bytes of tensor t, once st_header has checked that every size and their sum fit. */
static uint64_t entry_bytes(const st_entry *t)
{
    uint64_t c = 0;
    entry_bytes_checked(t, &c);
    return c;
}

int st_header(const st_entry *t, int n, const st_meta *meta, int n_meta, unsigned char **out, size_t *out_len,
              uint64_t *data_offset, uint64_t *data_bytes)
{
    *out = NULL;
    *out_len = 0;
    json_t *root = json_object();
    if (!root)
        return pf_err(-ENOMEM, "safetensors header: out of memory");
    int rc = 0;
    uint64_t total = 0;
    if (n_meta > 0) {
        json_t *m = json_object();
        if (!m || json_object_set_new(root, "__metadata__", m)) {
            rc = pf_err(-ENOMEM, "safetensors header: out of memory");
            goto out;
        }
        for (int i = 0; i < n_meta; i++)
            if (json_object_set_new(m, meta[i].key, json_string(meta[i].value))) {
                rc = pf_err(-EINVAL, "safetensors header: metadata '%s' is not valid UTF-8", meta[i].key);
                goto out;
            }
    }
    for (int i = 0; i < n; i++) {
        int repeated = 0;
        for (int j = 0; t[i].name && j < i && !repeated; j++)
            repeated = t[j].name && !strcmp(t[j].name, t[i].name);
        if (!t[i].name || !*t[i].name || !strcmp(t[i].name, "__metadata__") || repeated) {
            rc = pf_err(-EINVAL, "safetensors header: tensor name '%s' is empty, reserved or repeated",
                        t[i].name ? t[i].name : "(null)");
            goto out;
        }
        if (!st_dtype_size(t[i].dtype) || t[i].ndim < 0 || t[i].ndim > ST_MAX_DIMS) {
            rc = pf_err(-EINVAL, "safetensors header: tensor '%s': bad dtype or ndim", t[i].name);
            goto out;
        }
        for (int k = 0; k < t[i].ndim; k++)
            if (t[i].shape[k] < 0) {
                rc = pf_err(-EINVAL, "safetensors header: tensor '%s': negative dimension", t[i].name);
                goto out;
            }
        uint64_t nb;
        if (entry_bytes_checked(&t[i], &nb) < 0 || pf_add_u64(total, nb, &total) < 0 || total > INT64_MAX) {
            rc =
                pf_err(-EINVAL, "safetensors header: tensor '%s': the tensors' bytes exceed 2^63", t[i].name);
            goto out;
        }
    }
    /* 8-byte elements first (every tensor then starts aligned to its element size, as the reference's
     * serializer arranges by sorting on alignment) */
    uint64_t off = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n; i++) {
            if ((st_dtype_size(t[i].dtype) == 8) != (pass == 0))
                continue;
            uint64_t nb = entry_bytes(&t[i]);
            json_t *e = json_object(), *sh = json_array();
            if (!e || !sh || json_object_set_new(root, t[i].name, e) ||
                json_object_set_new(e, "dtype", json_string(t[i].dtype)) ||
                json_object_set_new(e, "shape", sh)) {
                json_decref(sh);
                rc = pf_err(-ENOMEM, "safetensors header: out of memory");
                goto out;
            }
            for (int k = 0; k < t[i].ndim; k++)
                json_array_append_new(sh, json_integer(t[i].shape[k]));
            json_object_set_new(e, "data_offsets",
                                json_pack("[I, I]", (json_int_t)off, (json_int_t)(off + nb)));
            if (data_offset)
                data_offset[i] = off;
            off += nb;
        }
    if (data_bytes)
        *data_bytes = off;
    char *js = json_dumps(root, JSON_COMPACT);
    if (!js) {
        rc = pf_err(-ENOMEM, "safetensors header: out of memory");
        goto out;
    }
    size_t jl = strlen(js), padded = (jl + 7) / 8 * 8;
    unsigned char *h = malloc(8 + padded);
    if (!h) {
        free(js);
        rc = pf_err(-ENOMEM, "safetensors header: out of memory");
        goto out;
    }
    uint64_t n64 = padded;
    memcpy(h, &n64, 8);
    memcpy(h + 8, js, jl);
    memset(h + 8 + jl, ' ', padded - jl);
    free(js);
    *out = h;
    *out_len = 8 + padded;
out:
    json_decref(root);
    return rc;
}

int st_write(const char *path, const st_entry *t, int n, const st_meta *meta, int n_meta)
{
    unsigned char *h;
    size_t hl;
    int rc = st_header(t, n, meta, n_meta, &h, &hl, NULL, NULL);
    if (rc)
        return pf_err_wrap(rc, "%s", path);
    pf_atomic_file af;
    if ((rc = pf_atomic_open(&af, path, "safetensors")) < 0) {
        free(h);
        return rc;
    }
    FILE *f = af.f;
    int ok = fwrite(h, 1, hl, f) == hl;
    free(h);
    /* the data in st_header's order */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; ok && i < n; i++) {
            if ((st_dtype_size(t[i].dtype) == 8) != (pass == 0))
                continue;
            uint64_t nb = entry_bytes(&t[i]);
            ok = nb == 0 || fwrite(t[i].data, 1, (size_t)nb, f) == nb;
        }
    return pf_atomic_commit(&af, ok);
}
