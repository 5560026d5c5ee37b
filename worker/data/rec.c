/* MXNet RecordIO reader and writer. Format and conventions: rec.h. */
#include "worker/data/rec.h"

#include "common/err.h"
#include "common/file.h"
#include "common/log.h"

#include <ctype.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

float rec_f32(const uint8_t *p)
{
    uint32_t u = le32(p);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}

void rec_buf_free(rec_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

static int buf_append(rec_buf *b, const void *src, size_t n)
{
    if (b->len + n > REC_MAX_RECORD)
        return pf_err(-EFBIG, "record larger than %u bytes", REC_MAX_RECORD);
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *d = realloc(b->data, cap);
        if (!d)
            return pf_err(-ENOMEM, "out of memory joining a record");
        b->data = d;
        b->cap = cap;
    }
    if (n)
        memcpy(b->data + b->len, src, n);
    b->len += n;
    return 0;
}

int rec_read_record(const uint8_t *base, size_t size, uint64_t off, rec_buf *scratch, const uint8_t **data,
                    size_t *len, uint64_t *next)
{
    uint64_t pos = off;
    int first = 1;
    scratch->len = 0;
    /* Each chunk is at least 8 bytes, so a record cannot have more chunks than size/8: bounded. */
    for (;;) {
        if (pos > size || size - pos < 8)
            return pf_err(-EPROTO, "truncated chunk header at byte %" PRIu64 " (file size %zu)", pos, size);
        uint32_t magic = le32(base + pos);
        if (magic != REC_MAGIC)
            return pf_err(-EPROTO, "bad magic 0x%08x at byte %" PRIu64 " (expected 0x%08x)", magic, pos,
                          REC_MAGIC);
        uint32_t lrec = le32(base + pos + 4);
        uint32_t cflag = lrec >> 29, clen = lrec & ((1u << 29) - 1);
        if (clen > size - pos - 8)
            return pf_err(-EPROTO,
                          "chunk length %u at byte %" PRIu64 " runs past end of file (size %zu): "
                          "truncated .rec?",
                          clen, pos, size);
        if (clen > REC_MAX_RECORD)
            return pf_err(-EFBIG, "chunk length %u at byte %" PRIu64 " exceeds %u bytes", clen, pos,
                          REC_MAX_RECORD);
        const uint8_t *cdata = base + pos + 8;
        uint64_t after = pos + 8 + (((uint64_t)clen + 3) & ~(uint64_t)3);
        if (after > size)
            after = size;
        if (first) {
            if (cflag == 0) {
                *data = cdata;
                *len = clen;
                if (next)
                    *next = after;
                return 0;
            }
            if (cflag != 1)
                return pf_err(-EPROTO,
                              "unexpected cflag %u at byte %" PRIu64 " (a record starts with 0 or 1)", cflag,
                              pos);
        } else {
            if (cflag != 2 && cflag != 3)
                return pf_err(-EPROTO,
                              "unexpected cflag %u at byte %" PRIu64 " (continuation must be 2 or 3)", cflag,
                              pos);
            uint8_t m[4];
            put32(m, REC_MAGIC);
            int rc = buf_append(scratch, m, 4);
            if (rc < 0)
                return rc;
        }
        int rc = buf_append(scratch, cdata, clen);
        if (rc < 0)
            return rc;
        first = 0;
        pos = after;
        if (cflag == 3) {
            *data = scratch->data ? scratch->data : cdata;
            *len = scratch->len;
            if (next)
                *next = after;
            return 0;
        }
    }
}

int rec_parse_payload(const uint8_t *data, size_t len, rec_payload *out)
{
    memset(out, 0, sizeof *out);
    if (len < REC_HEADER_BYTES)
        return pf_err(-EPROTO, "payload of %zu bytes is shorter than the %d-byte header", len,
                      REC_HEADER_BYTES);
    out->flag = le32(data);
    out->label = rec_f32(data + 4);
    out->id = le64(data + 8);
    out->id2 = le64(data + 16);
    size_t rest = len - REC_HEADER_BYTES;
    const uint8_t *p = data + REC_HEADER_BYTES;
    if (out->flag > 0) {
        if ((uint64_t)out->flag * 4 > rest)
            return pf_err(-EPROTO, "flag %u needs %" PRIu64 " label bytes, payload has %zu", out->flag,
                          (uint64_t)out->flag * 4, rest);
        out->labels = p;
        out->label = rec_f32(p);
        p += (size_t)out->flag * 4;
        rest -= (size_t)out->flag * 4;
    }
    out->image = p;
    out->image_len = rest;
    return 0;
}

int rec_class_of(const rec_payload *p, int64_t num_classes, int64_t *class_id)
{
    float l = p->label;
    int64_t c;
    if ((p->id2 & ~REC_ID2_CLASS_MASK) == REC_ID2_MARKER) {
        c = (int64_t)(p->id2 & REC_ID2_CLASS_MASK);
        if ((float)c != l)
            return pf_err(-ERANGE, "id2 class %" PRId64 " disagrees with label %.9g", c, (double)l);
    } else {
        if (isnan(l))
            return pf_err(-ERANGE, "label is NaN");
        if (isinf(l))
            return pf_err(-ERANGE, "label is infinite");
        if (l < 0)
            return pf_err(-ERANGE, "label %.9g is negative", (double)l);
        if (floorf(l) != l)
            return pf_err(-ERANGE, "label %.9g is not an integer", (double)l);
        if (l >= 9.2e18f)
            return pf_err(-ERANGE, "label %.9g is too large", (double)l);
        c = (int64_t)l;
    }
    if (num_classes > 0 && c >= num_classes)
        return pf_err(-ERANGE, "class %" PRId64 " >= num_classes %" PRId64, c, num_classes);
    *class_id = c;
    return 0;
}

/* ---------------------------------------------------------------- indexed reader */

typedef struct idx_entry {
    int64_t key;
    uint64_t offset;
} idx_entry;

static int cmp_idx(const void *a, const void *b)
{
    const idx_entry *x = a, *y = b;
    return (x->key > y->key) - (x->key < y->key);
}

static const idx_entry *idx_find(const idx_entry *e, size_t n, int64_t key)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (e[mid].key < key)
            lo = mid + 1;
        else if (e[mid].key > key)
            hi = mid;
        else
            return &e[mid];
    }
    return NULL;
}

static int parse_u64(const char **s, uint64_t *v)
{
    const char *p = *s;
    if (!isdigit((unsigned char)*p))
        return -1;
    uint64_t x = 0;
    while (isdigit((unsigned char)*p)) {
        unsigned d = (unsigned)(*p - '0');
        if (x > (UINT64_MAX - d) / 10)
            return -1;
        x = x * 10 + d;
        p++;
    }
    *s = p;
    *v = x;
    return 0;
}

static int read_idx(const char *path, idx_entry **out, size_t *n_out)
{
    FILE *f;
    int orc = pf_fopen_regular(path, &f);
    if (orc < 0)
        return pf_err_wrap(orc, "%s: cannot open index", path);
    idx_entry *e = NULL;
    size_t n = 0, cap = 0, lineno = 0;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t got;
    int rc = 0;
    while ((got = getline(&line, &lcap, f)) >= 0) {
        lineno++;
        const char *p = line;
        while (*p == ' ' || *p == '\r')
            p++;
        if (*p == '\n' || *p == '\0')
            continue;
        uint64_t key, off;
        if (parse_u64(&p, &key) < 0 || (*p != '\t' && *p != ' ') || key > INT64_MAX) {
            rc = pf_err(-EPROTO, "%s: line %zu: expected `key<TAB>byte_offset`, got \"%.40s\"", path, lineno,
                        line);
            break;
        }
        while (*p == '\t' || *p == ' ')
            p++;
        if (parse_u64(&p, &off) < 0) {
            rc = pf_err(-EPROTO, "%s: line %zu: key %" PRIu64 ": bad byte offset \"%.40s\"", path, lineno,
                        key, p);
            break;
        }
        while (*p == ' ' || *p == '\r' || *p == '\t')
            p++;
        if (*p != '\n' && *p != '\0') {
            rc = pf_err(-EPROTO, "%s: line %zu: key %" PRIu64 ": trailing text \"%.40s\"", path, lineno, key,
                        p);
            break;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 1024;
            idx_entry *ne = realloc(e, cap * sizeof *e);
            if (!ne) {
                rc = pf_err(-ENOMEM, "%s: out of memory", path);
                break;
            }
            e = ne;
        }
        e[n].key = (int64_t)key;
        e[n].offset = off;
        n++;
    }
    if (rc == 0 && ferror(f))
        rc = pf_err(-EIO, "%s: read error", path);
    free(line);
    fclose(f);
    if (rc == 0 && n == 0)
        rc = pf_err(-EPROTO, "%s: index is empty", path);
    if (rc == 0) {
        qsort(e, n, sizeof *e, cmp_idx);
        for (size_t i = 1; i < n; i++)
            if (e[i].key == e[i - 1].key) {
                rc = pf_err(-EPROTO, "%s: key %" PRId64 " appears twice", path, e[i].key);
                break;
            }
    }
    if (rc < 0) {
        free(e);
        return rc;
    }
    *out = e;
    *n_out = n;
    return 0;
}

/* Reads `property` (`num_classes,h,w`). Returns 0 with *classes = 0 when absent. */
static int read_property(const char *path, int64_t *classes)
{
    *classes = 0;
    FILE *f;
    int rc = pf_fopen_regular(path, &f);
    if (rc == -ENOENT)
        return 0;
    if (rc < 0)
        return pf_err_wrap(rc, "%s", path);
    char buf[256] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    long long c;
    int h, w;
    if (sscanf(buf, "%lld,%d,%d", &c, &h, &w) != 3 || c <= 0 || h <= 0 || w <= 0)
        return pf_err(-EPROTO, "%s: expected `num_classes,height,width`, got \"%.60s\"", path, buf);
    *classes = c;
    return 0;
}

static int image_magic_ok(const uint8_t *p, size_t n)
{
    static const uint8_t png[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF)
        return 1;
    if (n >= 8 && memcmp(p, png, 8) == 0)
        return 1;
    return 0;
}

void rec_close(rec_file *rf)
{
    if (!rf)
        return;
    if (rf->map && rf->map != MAP_FAILED)
        munmap((void *)rf->map, rf->size);
    free(rf->images);
    free(rf);
}

/* Validates one image record and appends it to rf->images. Returns 0, or the error code with pf_errmsg
 * naming file, key and offset. */
static int check_image(rec_file *rf, int64_t key, const idx_entry *e, int64_t bound, rec_buf *scratch)
{
    if (!e)
        return pf_err(-EPROTO, "%s: key %" PRId64 ": missing from the index", rf->idx_path, key);
    const uint8_t *d;
    size_t n;
    rec_payload p;
    int64_t c;
    int rc = rec_read_record(rf->map, rf->size, e->offset, scratch, &d, &n, NULL);
    if (rc == 0)
        rc = rec_parse_payload(d, n, &p);
    if (rc == 0)
        rc = rec_class_of(&p, bound, &c);
    if (rc == 0 && !image_magic_ok(p.image, p.image_len))
        rc = pf_err(-EPROTO, "image (%zu bytes) is neither JPEG nor PNG", p.image_len);
    if (rc < 0)
        return pf_err_wrap(rc, "%s: key %" PRId64 " at byte %" PRIu64, rf->rec_path, key, e->offset);
    rec_image *im = &rf->images[rf->num_images++];
    im->key = key;
    im->offset = e->offset;
    im->class_id = c;
    if (c < rf->min_class)
        rf->min_class = c;
    if (c > rf->max_class)
        rf->max_class = c;
    return 0;
}

int rec_resolve_prefix(const char *rec, char *base, size_t cap)
{
    struct stat st;
    if ((size_t)snprintf(base, cap, "%s", rec) >= cap)
        return -1;
    size_t bl = strlen(base);
    if (bl > 4 && (strcmp(base + bl - 4, ".rec") == 0 || strcmp(base + bl - 4, ".idx") == 0))
        base[bl - 4] = 0;
    else if (stat(base, &st) == 0 && S_ISDIR(st.st_mode)) {
        if (bl + 7 >= cap)
            return -1;
        strcat(base, "/train");
    }
    return 0;
}

/* Step 1 of rec_open: <base>.rec, <base>.idx and the `property` file beside them from the prefix. */
static int rec_set_paths(rec_file *rf, const char *prefix, char *prop, size_t prop_cap)
{
    char base[4096];
    if (rec_resolve_prefix(prefix, base, sizeof base) < 0)
        return pf_err(-ENAMETOOLONG, "dataset path too long");
    snprintf(rf->rec_path, sizeof rf->rec_path, "%.4090s.rec", base);
    snprintf(rf->idx_path, sizeof rf->idx_path, "%.4090s.idx", base);
    const char *slash = strrchr(base, '/');
    if (slash)
        snprintf(prop, prop_cap, "%.*s/property", (int)(slash - base), base);
    else
        snprintf(prop, prop_cap, "property");
    return 0;
}

/* Step 2: maps the .rec file read-only (rf->map, rf->size), advised for the sequential open-time check. */
static int rec_map_file(rec_file *rf)
{
    struct stat st;
    int fd = pf_open_regular(rf->rec_path, &st);
    if (fd < 0)
        return pf_err_wrap(fd, "%s", rf->rec_path);
    int rc = 0;
    if ((rf->size = (size_t)st.st_size) == 0)
        rc = pf_err(-EPROTO, "%s: file is empty", rf->rec_path);
    else {
        rf->map = mmap(NULL, rf->size, PROT_READ, MAP_SHARED, fd, 0);
        if (rf->map == MAP_FAILED) {
            rf->map = NULL;
            rc = pf_err(-errno, "%s: mmap: %s", rf->rec_path, strerror(errno));
        }
    }
    close(fd);
    if (rc < 0)
        return rc;
    /* The open-time check walks the records in key order, which is file order in packs written by
     * im2rec, InsightFace and pfcps: read ahead. Training reads are random (set after the check). */
    madvise((void *)rf->map, rf->size, MADV_SEQUENTIAL);
    return 0;
}

/* Step 3: the layout. A key-0 record with no image and flag >= 2 is InsightFace's header record, its two
 * labels the range [first identity key, end key) after the image keys 1 .. first identity key - 1
 * (rf->header_end); otherwise every indexed record is an image (im2rec). */
static int rec_read_layout(rec_file *rf, const idx_entry *idx, size_t nidx, rec_buf *scratch)
{
    const idx_entry *e0 = idx_find(idx, nidx, 0);
    rf->layout = REC_LAYOUT_IM2REC;
    if (!e0)
        return 0;
    const uint8_t *d;
    size_t n;
    rec_payload p;
    int rc = rec_read_record(rf->map, rf->size, e0->offset, scratch, &d, &n, NULL);
    if (rc == 0)
        rc = rec_parse_payload(d, n, &p);
    if (rc < 0)
        return pf_err_wrap(rc, "%s: key 0 (header record) at byte %" PRIu64, rf->rec_path, e0->offset);
    if (p.flag == 0 || p.image_len != 0)
        return 0;
    if (p.flag < 2)
        return pf_err(-EPROTO,
                      "%s: key 0 (header record) at byte %" PRIu64 ": flag %u, expected 2 labels "
                      "[first identity key, end key]",
                      rf->rec_path, e0->offset, p.flag);
    float a = rec_f32(p.labels), b = rec_f32(p.labels + 4);
    if (!(a >= 1) || !(b >= a) || floorf(a) != a || floorf(b) != b || a > 9e15f)
        return pf_err(-EPROTO, "%s: key 0 (header record) at byte %" PRIu64 ": bad key range [%.9g, %.9g]",
                      rf->rec_path, e0->offset, (double)a, (double)b);
    rf->layout = REC_LAYOUT_INSIGHTFACE;
    rf->header_end[0] = (int64_t)a;
    rf->header_end[1] = (int64_t)b;
    /* Keys above 2^24 are not exact in float32: pfcps's packer also stores the range exactly,
     * the first identity key in id2 (with the marker) and the end key in id. */
    uint64_t xa = p.id2 & REC_ID2_CLASS_MASK;
    if ((p.id2 & ~REC_ID2_CLASS_MASK) == REC_ID2_MARKER && (float)xa == a && (float)p.id == b && p.id >= xa &&
        p.id <= REC_ID2_CLASS_MASK) {
        rf->header_end[0] = (int64_t)xa;
        rf->header_end[1] = (int64_t)p.id;
    }
    if ((uint64_t)(rf->header_end[0] - 1) > nidx)
        return pf_err(-EPROTO,
                      "%s: key 0 (header record) at byte %" PRIu64 ": header names %" PRId64
                      " image keys but %s has only %zu entries",
                      rf->rec_path, e0->offset, rf->header_end[0] - 1, rf->idx_path, nidx);
    return 0;
}

/* Step 4: checks every image record (keys 1 .. first identity key - 1 for InsightFace, every indexed key
 * for im2rec) into rf->images; a bad one is skipped and counted when skip_bad_records, else the error. */
static int rec_check_images(rec_file *rf, const idx_entry *idx, size_t nidx, int64_t bound,
                            int skip_bad_records, rec_buf *scratch)
{
    int insightface = rf->layout == REC_LAYOUT_INSIGHTFACE;
    int64_t first_key = insightface ? 1 : 0, end_key = insightface ? rf->header_end[0] : 0;
    if (insightface)
        rf->images = calloc((size_t)(end_key > 1 ? end_key - 1 : 1), sizeof *rf->images);
    else
        rf->images = calloc(nidx, sizeof *rf->images);
    if (!rf->images)
        return pf_err(-ENOMEM, "out of memory");
    rf->min_class = INT64_MAX;
    rf->max_class = -1;
    size_t ncheck = insightface ? (size_t)(end_key - first_key) : nidx;
    for (size_t i = 0; i < ncheck; i++) {
        int64_t key = insightface ? first_key + (int64_t)i : idx[i].key;
        const idx_entry *e = insightface ? idx_find(idx, nidx, key) : &idx[i];
        int rc = check_image(rf, key, e, bound, scratch);
        if (rc < 0) {
            if (!skip_bad_records)
                return rc;
            if (rf->skipped < 10)
                log_warn("skipping bad record: %s", pf_errmsg());
            rf->skipped++;
        }
    }
    if (rf->num_images == 0)
        return pf_err(-EPROTO, "%s: no usable image records (%" PRId64 " skipped)", rf->rec_path,
                      rf->skipped);
    return 0;
}

int rec_open(rec_file **out, const char *prefix, int64_t num_classes, int skip_bad_records)
{
    *out = NULL;
    rec_file *rf = calloc(1, sizeof *rf);
    if (!rf)
        return pf_err(-ENOMEM, "out of memory");
    char prop[4096];
    idx_entry *idx = NULL;
    size_t nidx = 0;
    rec_buf scratch = {0};
    int rc;
    if ((rc = rec_set_paths(rf, prefix, prop, sizeof prop)) < 0 ||
        (rc = read_idx(rf->idx_path, &idx, &nidx)) < 0 ||
        (rc = read_property(prop, &rf->property_classes)) < 0 || (rc = rec_map_file(rf)) < 0 ||
        (rc = rec_read_layout(rf, idx, nidx, &scratch)) < 0)
        goto fail;
    int64_t bound = num_classes > 0 ? num_classes : rf->property_classes;
    if ((rc = rec_check_images(rf, idx, nidx, bound, skip_bad_records, &scratch)) < 0)
        goto fail;
    madvise((void *)rf->map, rf->size, MADV_RANDOM);
    rf->min_key = rf->images[0].key;
    rf->max_key = rf->images[rf->num_images - 1].key;
    rf->num_classes = num_classes > 0            ? num_classes
                      : rf->property_classes > 0 ? rf->property_classes
                                                 : rf->max_class + 1;
    if (rf->skipped)
        log_warn("%s: skipped %" PRId64 " bad records", rf->rec_path, rf->skipped);
    if (num_classes > 0 && rf->property_classes > 0 && num_classes > rf->property_classes)
        log_warn(
            "%s: num_classes %" PRId64 " is more than the %" PRId64
            " classes %s gives (class centers %" PRId64 "..%" PRId64 " get no images): is num_classes right?",
            rf->rec_path, num_classes, rf->property_classes, prop, rf->property_classes, num_classes - 1);
    free(idx);
    rec_buf_free(&scratch);
    *out = rf;
    return 0;
fail:
    free(idx);
    rec_buf_free(&scratch);
    rec_close(rf);
    return rc;
}

int rec_get(const rec_file *rf, int64_t i, rec_buf *scratch, rec_payload *out)
{
    if (i < 0 || i >= rf->num_images)
        return pf_err(-ERANGE, "%s: image index %" PRId64 " out of range [0, %" PRId64 ")", rf->rec_path, i,
                      rf->num_images);
    const rec_image *im = &rf->images[i];
    const uint8_t *d;
    size_t n;
    int rc = rec_read_record(rf->map, rf->size, im->offset, scratch, &d, &n, NULL);
    if (rc == 0)
        rc = rec_parse_payload(d, n, out);
    if (rc < 0)
        return pf_err_wrap(rc, "%s: key %" PRId64 " at byte %" PRIu64, rf->rec_path, im->key, im->offset);
    return 0;
}

/* ---------------------------------------------------------------- writer */

int rec_writer_open(rec_writer *w, const char *prefix)
{
    memset(w, 0, sizeof *w);
    char p[4200];
    snprintf(w->path, sizeof w->path, "%s", prefix);
    snprintf(p, sizeof p, "%s.rec", prefix);
    FILE *r = fopen(p, "wb");
    if (!r)
        return pf_err(-errno, "%s: cannot create: %s", p, strerror(errno));
    snprintf(p, sizeof p, "%s.idx", prefix);
    FILE *x = fopen(p, "w");
    if (!x) {
        int e = errno;
        fclose(r);
        return pf_err(-e, "%s: cannot create: %s", p, strerror(e));
    }
    w->rec = r;
    w->idx = x;
    return 0;
}

static int write_chunk(rec_writer *w, uint32_t cflag, const uint8_t *d, size_t n)
{
    uint8_t h[8];
    static const uint8_t zero[4] = {0};
    put32(h, REC_MAGIC);
    put32(h + 4, cflag << 29 | (uint32_t)n);
    size_t pad = (4 - (n & 3)) & 3;
    FILE *f = w->rec;
    if (fwrite(h, 1, 8, f) != 8 || (n && fwrite(d, 1, n, f) != n) || (pad && fwrite(zero, 1, pad, f) != pad))
        return pf_err(-EIO, "%s.rec: write failed", w->path);
    w->pos += 8 + n + pad;
    return 0;
}

int rec_writer_put_raw(rec_writer *w, int64_t key, const uint8_t *data, size_t len)
{
    if (len > REC_MAX_RECORD)
        return pf_err(-EFBIG, "key %" PRId64 ": record of %zu bytes too large", key, len);
    if (fprintf(w->idx, "%" PRId64 "\t%" PRIu64 "\n", key, w->pos) < 0)
        return pf_err(-EIO, "%s.idx: write failed", w->path);
    /* dmlc-core RecordIOWriter::WriteRecord: split at every 4-byte-aligned occurrence of the magic. */
    size_t dptr = 0, lower = len & ~(size_t)3;
    int rc;
    for (size_t i = 0; i < lower; i += 4) {
        if (le32(data + i) == REC_MAGIC) {
            rc = write_chunk(w, dptr == 0 ? 1u : 2u, data + dptr, i - dptr);
            if (rc < 0)
                return rc;
            dptr = i + 4;
        }
    }
    return write_chunk(w, dptr != 0 ? 3u : 0u, data + dptr, len - dptr);
}

int rec_writer_put(rec_writer *w, int64_t key, uint32_t flag, float label, uint64_t id, uint64_t id2,
                   const float *labels, const uint8_t *image, size_t image_len)
{
    size_t n = REC_HEADER_BYTES + (size_t)flag * 4 + image_len;
    if (n > REC_MAX_RECORD)
        return pf_err(-EFBIG, "key %" PRId64 ": record of %zu bytes too large", key, n);
    uint8_t *d = malloc(n);
    if (!d)
        return pf_err(-ENOMEM, "out of memory");
    uint32_t lb;
    put32(d, flag);
    memcpy(&lb, &label, 4);
    put32(d + 4, flag ? 0 : lb);
    put64(d + 8, id);
    put64(d + 16, id2);
    for (uint32_t i = 0; i < flag; i++) {
        memcpy(&lb, &labels[i], 4);
        put32(d + REC_HEADER_BYTES + 4 * i, lb);
    }
    if (image_len)
        memcpy(d + REC_HEADER_BYTES + (size_t)flag * 4, image, image_len);
    int rc = rec_writer_put_raw(w, key, d, n);
    free(d);
    return rc;
}

int rec_writer_close(rec_writer *w)
{
    int rc = 0;
    if (w->rec && fclose(w->rec) != 0)
        rc = pf_err(-EIO, "%s.rec: close failed", w->path);
    if (w->idx && fclose(w->idx) != 0)
        rc = pf_err(-EIO, "%s.idx: close failed", w->path);
    w->rec = w->idx = NULL;
    return rc;
}
