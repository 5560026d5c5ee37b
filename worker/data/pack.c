/* `pfcps pack`: folder of identities -> RecordIO. Layout and conventions: pack.h, rec.h. */
#include "worker/data/pack.h"

#include "common/atomic_file.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/file.h"
#include "common/log.h"
#include "worker/data/image.h"
#include "worker/data/rec.h"

#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <turbojpeg.h>
#include <unistd.h>

void pack_opts_default(pack_opts *o)
{
    memset(o, 0, sizeof *o);
    o->quality = 95;
}

typedef struct name_list {
    char **v;
    size_t n, cap;
} name_list;

static void names_free(name_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static int names_add(name_list *l, const char *s)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        char **v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return pf_err(-ENOMEM, "out of memory");
        l->v = v;
        l->cap = cap;
    }
    if (!(l->v[l->n] = strdup(s)))
        return pf_err(-ENOMEM, "out of memory");
    l->n++;
    return 0;
}

static int cmp_natural(const void *a, const void *b)
{
    return strverscmp(*(char *const *)a, *(char *const *)b);
}

/* Lists entries of `dir` that are directories (want_dirs) or image files, natural order. */
static int list_dir(const char *dir, int want_dirs, name_list *out)
{
    DIR *d = opendir(dir);
    if (!d)
        return pf_err(errno == ENOTDIR ? -ENOTDIR : -ENOENT, "%s: cannot open folder: %s", dir,
                      strerror(errno));
    struct dirent *e;
    int rc = 0;
    char path[4096];
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (stat(path, &st) != 0)
            continue;
        if (want_dirs ? S_ISDIR(st.st_mode) : (S_ISREG(st.st_mode) && img_name_is_image(e->d_name)))
            if ((rc = names_add(out, e->d_name)) < 0)
                break;
    }
    closedir(d);
    if (rc == 0 && out->n > 1)
        qsort(out->v, out->n, sizeof *out->v, cmp_natural);
    return rc;
}

typedef struct packer {
    const pack_opts *o;
    img_decoder dec;
    tjhandle tjc;
    uint8_t canvas[IMG_SIZE * IMG_SIZE * 3];
    unsigned char *jpeg; /* tjAlloc'd */
    unsigned long jpeg_size;
} packer;

/* Produces the 112x112 JPEG bytes for one file: *out and *out_len point at the original bytes (kept) or
 * at p->jpeg (converted). *orig must be freed by the caller. */
static int encode_one(packer *p, const char *path, uint8_t **orig, const uint8_t **out, size_t *out_len,
                      int *kept)
{
    uint8_t *data = NULL;
    size_t len = 0;
    int rc = pf_read_file(path, REC_MAX_RECORD, &data, &len);
    if (rc < 0)
        return pf_err_wrap(rc, "%s", path);
    *orig = data;
    int w = 0, h = 0;
    uint8_t *rgb = NULL, *loaded = NULL;
    int is_jpeg = len >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF;
    int is_png = len >= 8 && memcmp(data, "\x89PNG\r\n\x1a\n", 8) == 0;
    if (is_jpeg || is_png) {
        rc = img_decode_rgb(&p->dec, data, len, &w, &h, &rgb);
        if (rc < 0)
            return pf_err_wrap(rc, "%s", path);
        if (is_jpeg && w == IMG_SIZE && h == IMG_SIZE) {
            *out = data;
            *out_len = len;
            *kept = 1;
            return 0;
        }
    } else {
        /* PGM, PPM, BMP: TurboJPEG's loader on the bytes read, converting grey to RGB. */
        if ((rc = img_decode_pnm_bmp(data, len, &w, &h, &loaded)) < 0)
            return pf_err_wrap(rc, "%s", path);
        rgb = loaded;
    }
    if (w == IMG_SIZE && h == IMG_SIZE)
        memcpy(p->canvas, rgb, sizeof p->canvas);
    else if (p->o->resize)
        img_resize_rgb(rgb, w, h, p->canvas, IMG_SIZE, IMG_SIZE);
    else
        rc = img_pad_rgb(rgb, w, h, p->canvas, IMG_SIZE, IMG_SIZE);
    if (loaded)
        tjFree(loaded);
    if (rc < 0)
        return rc;
    unsigned long sz = p->jpeg_size;
    if (tjCompress2(p->tjc, p->canvas, IMG_SIZE, 0, IMG_SIZE, TJPF_RGB, &p->jpeg, &sz, TJSAMP_420,
                    p->o->quality, 0) != 0)
        return pf_err(-EIO, "%s: JPEG encode failed: %s", path, tjGetErrorStr2(p->tjc));
    p->jpeg_size = sz > p->jpeg_size ? sz : p->jpeg_size;
    *out = p->jpeg;
    *out_len = sz;
    *kept = 0;
    return 0;
}

/* mkdir -p of the folder part of `prefix`. */
static int make_parent(const char *prefix)
{
    char d[4096];
    snprintf(d, sizeof d, "%s", prefix);
    char *slash = strrchr(d, '/');
    if (!slash || slash == d)
        return 0;
    *slash = 0;
    for (char *q = d + 1; *q; q++) {
        if (*q != '/')
            continue;
        *q = 0;
        if (mkdir(d, 0755) != 0 && errno != EEXIST)
            return pf_err(-errno, "%s: cannot create folder: %s", d, strerror(errno));
        *q = '/';
    }
    if (mkdir(d, 0755) != 0 && errno != EEXIST)
        return pf_err(-errno, "%s: cannot create folder: %s", d, strerror(errno));
    return 0;
}

static void progress(int64_t done, int64_t total, double t0, int final)
{
    static double last;
    double t = pf_now_s();
    if (!final && t - last < 0.25)
        return;
    last = t;
    double el = t - t0, rate = el > 0 ? (double)done / el : 0;
    double eta = rate > 0 ? (double)(total - done) / rate : 0;
    int width = 30, fill = total ? (int)(width * done / total) : width;
    char bar[64];
    for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    int e = (int)(eta + 0.5);
    fprintf(stderr, "\rpack [%s] %" PRId64 "/%" PRId64 " images  %.0f img/s  ETA %d:%02d:%02d%s", bar, done,
            total, rate, e / 3600, e / 60 % 60, e % 60, final ? "\n" : "");
    fflush(stderr);
}

/* Drops from ids (natural order) every identity folder that is a folder already taken, reached again
 * through a link (a link to image_dir itself, or a second link to one identity), with a warning naming the
 * link: its images would otherwise be packed again, as a second class. The first name in natural order
 * keeps the folder. */
static int drop_repeated_folders(const char *image_dir, name_list *ids)
{
    pf_dirset seen = {0};
    struct stat st;
    char path[8192];
    int rc = 0;
    if (stat(image_dir, &st) != 0)
        rc = pf_err(-ENOENT, "%s: cannot stat: %s", image_dir, strerror(errno));
    else
        rc = pf_dirset_enter(&seen, &st);
    size_t kept = 0;
    for (size_t i = 0; i < ids->n && rc >= 0; i++) {
        snprintf(path, sizeof path, "%s/%s", image_dir, ids->v[i]);
        int fresh = stat(path, &st) == 0 ? pf_dirset_enter(&seen, &st) : 1;
        if (fresh < 0) {
            rc = fresh;
        } else if (fresh) {
            ids->v[kept++] = ids->v[i];
        } else {
            log_warn("%s: a link to a folder already packed (the image folder itself, or another identity): "
                     "skipped",
                     path);
            free(ids->v[i]);
        }
    }
    if (rc >= 0)
        ids->n = kept;
    pf_dirset_free(&seen);
    return rc < 0 ? rc : 0;
}

/* Step 1 of pack_dir: the identity folders (natural order, at most o->max_identities) into *ids and each
 * one's images into (*files)[c] (calloc'd, ids->n of them; the caller frees both even on failure);
 * *total = the number of images. */
static int pack_list(const char *image_dir, const pack_opts *o, name_list *ids, name_list **files,
                     int64_t *total)
{
    int rc = list_dir(image_dir, 1, ids);
    if (rc < 0 || (rc = drop_repeated_folders(image_dir, ids)) < 0)
        return rc;
    if (ids->n == 0)
        return pf_err(-EINVAL, "%s: no identity folders (expected one subfolder of images per identity)",
                      image_dir);
    if (o->max_identities < 0)
        return pf_err(-EINVAL, "max_identities %" PRId64 " is negative", o->max_identities);
    if (o->max_identities > 0 && (size_t)o->max_identities < ids->n) {
        for (size_t i = (size_t)o->max_identities; i < ids->n; i++)
            free(ids->v[i]);
        ids->n = (size_t)o->max_identities;
    }
    if ((uint64_t)o->first_class + ids->n - 1 > REC_ID2_CLASS_MASK)
        return pf_err(-EINVAL, "first_class %" PRId64 " + %zu identities exceeds 2^48", o->first_class,
                      ids->n);
    *files = calloc(ids->n, sizeof **files);
    if (!*files)
        return pf_err(-ENOMEM, "out of memory");
    char path[8192];
    *total = 0;
    for (size_t c = 0; c < ids->n; c++) {
        snprintf(path, sizeof path, "%s/%s", image_dir, ids->v[c]);
        if ((rc = list_dir(path, 0, &(*files)[c])) < 0)
            return rc;
        if ((*files)[c].n == 0)
            return pf_err(-EINVAL, "%s: identity folder has no images (.jpg .jpeg .png .pgm .ppm .pnm .bmp)",
                          path);
        *total += (int64_t)(*files)[c].n;
    }
    return 0;
}

/* Step 2: every image as one record, keys 1, 2, ... in identity order (label = class, id2 = marker | class);
 * start[c] = identity c's first key. Returns 0 with *key = the next free key, or the first error. */
static int pack_images(packer *p, rec_writer *w, const char *image_dir, const name_list *ids,
                       const name_list *files, int64_t total, int64_t *start, int64_t *key, pack_stats *st)
{
    const pack_opts *o = p->o;
    char path[8192];
    double t0 = pf_now_s();
    *key = 1;
    for (size_t c = 0; c < ids->n; c++) {
        int64_t cls = o->first_class + (int64_t)c;
        start[c] = *key;
        for (size_t i = 0; i < files[c].n; i++) {
            snprintf(path, sizeof path, "%s/%s/%s", image_dir, ids->v[c], files[c].v[i]);
            uint8_t *orig = NULL;
            const uint8_t *img = NULL;
            size_t ilen = 0;
            int kept = 0;
            int rc = encode_one(p, path, &orig, &img, &ilen, &kept);
            if (rc == 0)
                rc = rec_writer_put(w, *key, 0, (float)cls, (uint64_t)*key, REC_ID2_MARKER | (uint64_t)cls,
                                    NULL, img, ilen);
            free(orig);
            if (rc < 0)
                return rc;
            if (kept)
                st->kept++;
            else
                st->converted++;
            (*key)++;
            st->images++;
            if (o->progress)
                progress(st->images, total, t0, 0);
        }
    }
    start[ids->n] = *key;
    if (o->progress)
        progress(st->images, total, t0, 1);
    return 0;
}

/* Step 3: one record per identity (labels [first key, end key)), then the header at key 0 (last in the
 * file; labels [first identity key, end key], exact values in id / id2 as rec.h describes). */
static int pack_identities(rec_writer *w, size_t n_ids, const int64_t *start, int64_t key)
{
    int64_t first_id = key;
    int rc = 0;
    for (size_t c = 0; c < n_ids && rc == 0; c++) {
        float lab[2] = {(float)start[c], (float)start[c + 1]};
        rc = rec_writer_put(w, key++, 2, 0, (uint64_t)start[c], (uint64_t)start[c + 1], lab, NULL, 0);
    }
    if (rc == 0) {
        float lab[2] = {(float)first_id, (float)key};
        rc = rec_writer_put(w, 0, 2, 0, (uint64_t)key, REC_ID2_MARKER | (uint64_t)first_id, lab, NULL, 0);
    }
    return rc;
}

/* Step 4: closes the writer and, when everything so far succeeded (rc == 0), renames <tmp>.rec/.idx to
 * <out_prefix>.rec/.idx; on failure the temp files are removed. Returns rc or the first new error. */
static int pack_commit(rec_writer *w, const char *tmp, const char *out_prefix, int rc)
{
    int rc2 = rec_writer_close(w);
    if (rc == 0)
        rc = rc2;
    const char *ext[2] = {"rec", "idx"};
    char from[4300], to[4300];
    for (int e = 0; e < 2; e++) {
        snprintf(from, sizeof from, "%s.%s", tmp, ext[e]);
        snprintf(to, sizeof to, "%s.%s", out_prefix, ext[e]);
        if (rc == 0 && rename(from, to) != 0)
            rc = pf_err(-errno, "%s: cannot rename to %s: %s", from, to, strerror(errno));
        if (rc < 0)
            unlink(from);
    }
    return rc;
}

/* Step 5: the `property` file beside the pack: `num_classes,height,width` (replaced whole: atomic_file.h). */
static int pack_property(const char *out_prefix, int64_t num_classes)
{
    char prop[4200];
    const char *slash = strrchr(out_prefix, '/');
    if (slash)
        snprintf(prop, sizeof prop, "%.*s/property", (int)(slash - out_prefix), out_prefix);
    else
        snprintf(prop, sizeof prop, "property");
    pf_atomic_file af;
    int rc = pf_atomic_open(&af, prop, "");
    if (rc < 0)
        return rc;
    int ok = fprintf(af.f, "%" PRId64 ",%d,%d\n", num_classes, IMG_SIZE, IMG_SIZE) > 0;
    return pf_atomic_commit(&af, ok);
}

int pack_dir(const char *image_dir, const char *out_prefix, const pack_opts *o, pack_stats *st)
{
    memset(st, 0, sizeof *st);
    if (o->first_class < 0 || (uint64_t)o->first_class > REC_ID2_CLASS_MASK)
        return pf_err(-EINVAL, "first_class %" PRId64 " is outside 0..2^48-1", o->first_class);
    if (o->quality < 1 || o->quality > 100)
        return pf_err(-EINVAL, "JPEG quality %d is outside 1..100", o->quality);
    name_list ids = {0};
    name_list *files = NULL;
    int64_t total = 0;
    int rc = pack_list(image_dir, o, &ids, &files, &total);
    if (rc < 0)
        goto out;

    packer p = {.o = o};
    rec_writer w = {0};
    int64_t *start = calloc(ids.n + 1, sizeof *start);
    if (!start) {
        rc = pf_err(-ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = img_decoder_init(&p.dec)) < 0) {
        free(start);
        goto out;
    }
    p.tjc = tjInitCompress();
    if (!p.tjc) {
        rc = pf_err(-ENOMEM, "TurboJPEG: %s", tjGetErrorStr2(NULL));
        goto done;
    }
    /* Written under <out_prefix>.partial.rec/.idx and renamed into place only when complete: a pack that
     * fails (an image that does not decode, a full disk) leaves an earlier pack at out_prefix as it was. */
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.partial", out_prefix);
    if ((rc = make_parent(out_prefix)) < 0 || (rc = rec_writer_open(&w, tmp)) < 0)
        goto done;
    int64_t key = 0;
    rc = pack_images(&p, &w, image_dir, &ids, files, total, start, &key, st);
    if (rc == 0)
        rc = pack_identities(&w, ids.n, start, key);
    rc = pack_commit(&w, tmp, out_prefix, rc);
    if (rc == 0)
        rc = pack_property(out_prefix, o->first_class + (int64_t)ids.n);
    st->classes = (int64_t)ids.n;
done:
    if (p.tjc)
        tjDestroy(p.tjc);
    if (p.jpeg)
        tjFree(p.jpeg);
    img_decoder_free(&p.dec);
    free(start);
out:
    for (size_t c = 0; files && c < ids.n; c++)
        names_free(&files[c]);
    free(files);
    names_free(&ids);
    return rc;
}
