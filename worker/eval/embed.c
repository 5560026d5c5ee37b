/* Batched embedding of images through a backbone (see embed.h). */
#include "worker/eval/embed.h"

#include "common/clock.h"
#include "common/atomic_file.h"
#include "common/err.h"
#include "common/file.h"
#include "worker/data/image.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>
#include <unistd.h>

_Static_assert(EVAL_PIXELS_D == 3 * IMG_SIZE * IMG_SIZE, "a pixel embedding is the network input");

/* An image file larger than this is refused before it is read. */
#define EMBED_MAX_IMAGE_BYTES ((size_t)1 << 30)

#define CK_HEADER 56 /* magic 8 | u32 version, D, n_tensors, n_extras | char network[32] */

int eval_model_open(model **out, const char *ckpt_path, int batch_capacity, const ops_device *dev)
{
    *out = NULL;
    unsigned char h[CK_HEADER];
    size_t got = 0;
    int hrc = pf_read_head(ckpt_path, h, sizeof h, &got);
    if (hrc)
        return pf_err_wrap(hrc, "checkpoint %s", ckpt_path);
    if (got != sizeof h || memcmp(h, "PFCPSBB1", 8) != 0)
        return pf_err(-EPROTO,
                      "checkpoint %s: not a pfcps backbone checkpoint (model.ckpt written by model_save)",
                      ckpt_path);
    uint32_t d;
    memcpy(&d, h + 12, 4);
    char net[33] = {0};
    memcpy(net, h + 24, 32);
    if (d == 0 || d > (1u << 20))
        return pf_err(-EPROTO, "checkpoint %s: embedding_size %u is not plausible", ckpt_path, d);
    model_desc desc;
    int rc = model_desc_from_name(&desc, net, (int)d);
    if (rc)
        return pf_err_wrap(rc, "checkpoint %s: network '%s'", ckpt_path, net);
    model *m;
    if ((rc = model_create_desc(&m, &desc, batch_capacity, dev)))
        return pf_err_wrap(rc, "checkpoint %s: creating %s (D %u)", ckpt_path, net, d);
    if ((rc = model_load(m, ckpt_path))) {
        model_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

int eval_model_init(model **out, const char *network, int embedding_size, uint64_t seed, int batch_capacity,
                    const ops_device *dev)
{
    *out = NULL;
    model_desc desc;
    int rc = model_desc_from_name(&desc, network, embedding_size);
    if (rc)
        return pf_err_wrap(rc, "network '%s' (D %d)", network, embedding_size);
    model *m;
    if ((rc = model_create_desc(&m, &desc, batch_capacity, dev)))
        return pf_err_wrap(rc, "creating %s (D %d)", network, embedding_size);
    model_init(m, seed);
    *out = m;
    return 0;
}

typedef struct embed_scratch {
    img_decoder dec;
    uint8_t *file;
    uint8_t canvas[IMG_SIZE * IMG_SIZE * 3];
} embed_scratch;

/* Image -> (3,112,112) in out (and flipped in out_flip when not NULL). *refit set when resized. */
static int load_one(embed_scratch *s, const eval_image *im, int pad, float *out, float *out_flip, int *refit)
{
    const uint8_t *data = im->data;
    size_t len = im->len;
    uint8_t *rgb = NULL, *loaded = NULL;
    int w = 0, h = 0, rc = 0;
    free(s->file);
    s->file = NULL;
    if (im->path) {
        if ((rc = pf_read_file(im->path, EMBED_MAX_IMAGE_BYTES, &s->file, &len)))
            return rc;
        data = s->file;
    }
    int is_jpeg = len >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF;
    int is_png = len >= 8 && memcmp(data, "\x89PNG\r\n\x1a\n", 8) == 0;
    if (is_jpeg || is_png || !im->path) {
        if ((rc = img_decode_rgb(&s->dec, data, len, &w, &h, &rgb)))
            return rc;
    } else {
        /* PGM / PPM / BMP: TurboJPEG's loader on the bytes read (as pfcps pack), grey replicated to RGB */
        if ((rc = img_decode_pnm_bmp(data, len, &w, &h, &loaded)))
            return rc;
        rgb = loaded;
    }
    *refit = w != IMG_SIZE || h != IMG_SIZE;
    if (*refit) {
        if (pad)
            rc = img_pad_rgb(rgb, w, h, s->canvas, IMG_SIZE, IMG_SIZE);
        else
            img_resize_rgb(rgb, w, h, s->canvas, IMG_SIZE, IMG_SIZE);
        rgb = s->canvas;
        w = h = IMG_SIZE;
    }
    if (rc == 0) {
        img_to_chw(rgb, w, h, 0, out);
        if (out_flip)
            img_to_chw(rgb, w, h, 1, out_flip);
    }
    if (loaded)
        tjFree(loaded);
    return rc;
}

int eval_embed(model *m, eval_image_fn get, void *arg, int64_t n, const eval_embed_opts *o, float *out,
               float *out_flip, int64_t *n_refit)
{
    if (n_refit)
        *n_refit = 0;
    int batch = o && o->batch ? o->batch : 32, flip = o && o->flip, pad = o && o->pad;
    if (batch < 1 || n < 0 || (flip && !out_flip))
        return pf_err(-EINVAL, "eval_embed: batch %d, n %lld, flip %d with%s a flip output", batch,
                      (long long)n, flip, out_flip ? "" : "out");
    const ops_device *dev = model_device(m);
    ops_ctx *ctx = model_ctx(m);
    int d = model_get_desc(m)->embedding_size;
    const size_t px = 3 * IMG_SIZE * IMG_SIZE;
    /* Flipped images go in the same forward as the originals when they fit (2 x batch <= capacity is
     * not known here): run them as a second forward of the same batch. */
    float *in = malloc((size_t)batch * px * sizeof(float));
    float *in_flip = flip ? malloc((size_t)batch * px * sizeof(float)) : NULL;
    embed_scratch *s = calloc(1, sizeof *s);
    int rc = 0;
    if (!in || (flip && !in_flip) || !s) {
        rc = pf_err(-ENOMEM, "eval_embed: out of memory for a batch of %d images", batch);
        goto out;
    }
    if ((rc = img_decoder_init(&s->dec)))
        goto out;
    for (int64_t b0 = 0; b0 < n; b0 += batch) {
        int nb = (int)(n - b0 < batch ? n - b0 : batch);
        for (int k = 0; k < nb; k++) {
            eval_image im;
            int refit = 0;
            if ((rc = get(arg, b0 + k, &im)))
                goto out;
            rc = load_one(s, &im, pad, in + (size_t)k * px, flip ? in_flip + (size_t)k * px : NULL, &refit);
            if (rc) {
                if (im.path)
                    rc = pf_err_wrap(rc, "image %lld (%s)", (long long)(b0 + k), im.path);
                else
                    rc = pf_err_wrap(rc, "image %lld", (long long)(b0 + k));
                goto out;
            }
            if (n_refit)
                *n_refit += refit;
        }
        for (int pass = 0; pass < 1 + flip; pass++) {
            const float *e;
            if ((rc = model_forward(m, pass ? in_flip : in, nb, 0, &e))) {
                rc = pf_err_wrap(rc, "forward of images %lld..%lld", (long long)b0, (long long)(b0 + nb - 1));
                goto out;
            }
            float *dst = (pass ? out_flip : out) + (size_t)b0 * (size_t)d;
            if ((rc = dev->mem_d2h(ctx, dst, e, (size_t)nb * (size_t)d * sizeof(float))))
                goto out;
        }
        if (o && o->progress)
            o->progress(o->progress_arg, b0 + nb, n);
    }
    if (dev->sync)
        rc = dev->sync(ctx);
out:
    if (s) {
        if (s->dec.tj)
            img_decoder_free(&s->dec);
        free(s->file);
    }
    free(s);
    free(in);
    free(in_flip);
    return rc;
}

int eval_pixels(eval_image_fn get, void *arg, int64_t n, const eval_embed_opts *o, float *out,
                float *out_flip, int64_t *n_refit)
{
    if (n_refit)
        *n_refit = 0;
    int batch = o && o->batch ? o->batch : 32, flip = o && o->flip, pad = o && o->pad;
    if (batch < 1 || n < 0 || (flip && !out_flip))
        return pf_err(-EINVAL, "eval_pixels: batch %d, n %lld, flip %d with%s a flip output", batch,
                      (long long)n, flip, out_flip ? "" : "out");
    const size_t px = EVAL_PIXELS_D;
    embed_scratch *s = calloc(1, sizeof *s);
    int rc = 0;
    if (!s)
        return pf_err(-ENOMEM, "eval_pixels: out of memory");
    if ((rc = img_decoder_init(&s->dec)))
        goto out;
    for (int64_t i = 0; i < n; i++) {
        eval_image im;
        int refit = 0;
        if ((rc = get(arg, i, &im)))
            goto out;
        rc = load_one(s, &im, pad, out + (size_t)i * px, flip ? out_flip + (size_t)i * px : NULL, &refit);
        if (rc) {
            if (im.path)
                rc = pf_err_wrap(rc, "image %lld (%s)", (long long)i, im.path);
            else
                rc = pf_err_wrap(rc, "image %lld", (long long)i);
            goto out;
        }
        if (n_refit)
            *n_refit += refit;
        if (o && o->progress && ((i + 1) % batch == 0 || i + 1 == n))
            o->progress(o->progress_arg, i + 1, n);
    }
out:
    if (s->dec.tj)
        img_decoder_free(&s->dec);
    free(s->file);
    free(s);
    return rc;
}

int eval_npy_write_f32(const char *path, const float *data, int64_t rows, int64_t cols)
{
    char hdr[128];
    int len = snprintf(hdr + 10, sizeof hdr - 10,
                       "{'descr': '<f4', 'fortran_order': False, 'shape': (%lld, %lld), }", (long long)rows,
                       (long long)cols);
    /* magic (6) + version (2) + header length (2) + dict, padded with spaces to a multiple of 64, '\n' last
     */
    int total = (10 + len + 1 + 63) / 64 * 64;
    if (total > (int)sizeof hdr)
        return pf_err(-EINVAL, "%s: npy header too long", path);
    memset(hdr + 10 + len, ' ', (size_t)(total - 10 - len));
    hdr[total - 1] = '\n';
    memcpy(hdr, "\x93NUMPY\x01\x00", 8);
    hdr[8] = (char)((total - 10) & 0xff);
    hdr[9] = (char)((total - 10) >> 8);
    pf_atomic_file af;
    int rc = pf_atomic_open(&af, path, "");
    if (rc < 0)
        return rc;
    size_t count = (size_t)rows * (size_t)cols;
    int ok = fwrite(hdr, 1, (size_t)total, af.f) == (size_t)total &&
             fwrite(data, sizeof(float), count, af.f) == count;
    return pf_atomic_commit(&af, ok);
}

void eval_progress_stderr(void *arg, int64_t done, int64_t total)
{
    eval_progress *p = arg;
    double t = pf_now_s();
    if (done < total && t - p->last < 2.0)
        return;
    p->last = t;
    fprintf(stderr, "%s: embedded %" PRId64 "/%" PRId64 " images (%.0f%%), %.1f images/s\n", p->what, done,
            total, total ? 100.0 * (double)done / (double)total : 100.0,
            t > p->t0 ? (double)done / (t - p->t0) : 0.0);
}
