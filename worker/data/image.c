/* Image decode and augmentation. See image.h. */
#include "worker/data/image.h"

#include "common/err.h"
#include "common/splitmix64.h"

#include <errno.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <turbojpeg.h>
#include <unistd.h>

int img_decoder_init(img_decoder *d)
{
    memset(d, 0, sizeof *d);
    d->tj = tjInitDecompress();
    if (!d->tj)
        return pf_err(-ENOMEM, "TurboJPEG: %s", tjGetErrorStr2(NULL));
    return 0;
}

void img_decoder_free(img_decoder *d)
{
    if (d->tj)
        tjDestroy(d->tj);
    free(d->rgb);
    free(d->tmp);
    memset(d, 0, sizeof *d);
}

static int grow(uint8_t **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    uint8_t *b = realloc(*buf, need);
    if (!b)
        return pf_err(-ENOMEM, "out of memory for a %zu-byte image", need);
    *buf = b;
    *cap = need;
    return 0;
}

static int decode_png(img_decoder *d, const uint8_t *data, size_t len, int *w, int *h, uint8_t **rgb)
{
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&im, data, len))
        return pf_err(-EPROTO, "PNG: %s", im.message);
    if (im.width == 0 || im.height == 0 || im.width > IMG_MAX_SIDE || im.height > IMG_MAX_SIDE) {
        png_image_free(&im);
        return pf_err(-E2BIG, "PNG: %ux%u image is outside 1..%d per side", im.width, im.height,
                      IMG_MAX_SIDE);
    }
    im.format = PNG_FORMAT_RGB;
    int rc = grow(&d->rgb, &d->rgb_cap, PNG_IMAGE_SIZE(im));
    if (rc < 0) {
        png_image_free(&im);
        return rc;
    }
    if (!png_image_finish_read(&im, NULL, d->rgb, 0, NULL)) {
        rc = pf_err(-EPROTO, "PNG: %s", im.message);
        png_image_free(&im);
        return rc;
    }
    *w = (int)im.width;
    *h = (int)im.height;
    *rgb = d->rgb;
    return 0;
}

/* TurboJPEG 2.1.5 carries state from a failed header read or decompression into the next call (a valid
 * JPEG then fails with the previous message): after any failure start over with a fresh handle. */
static int reset_tj(img_decoder *d, int rc)
{
    tjDestroy(d->tj);
    d->tj = tjInitDecompress();
    return rc;
}

int img_decode_rgb(img_decoder *d, const uint8_t *data, size_t len, int *w, int *h, uint8_t **rgb)
{
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (len >= 8 && memcmp(data, png_sig, 8) == 0)
        return decode_png(d, data, len, w, h, rgb);
    if (len < 3 || data[0] != 0xFF || data[1] != 0xD8)
        return pf_err(-EPROTO, "image of %zu bytes is not a JPEG or PNG", len);
    int iw = 0, ih = 0, ss = 0, cs = 0; /* a tables-only stream leaves them unset */
    if (!d->tj)
        return pf_err(-ENOMEM, "TurboJPEG: no decompressor");
    if (tjDecompressHeader3(d->tj, data, (unsigned long)len, &iw, &ih, &ss, &cs) != 0)
        return reset_tj(d, pf_err(-EPROTO, "JPEG: %s", tjGetErrorStr2(d->tj)));
    if (iw <= 0 || ih <= 0 || iw > IMG_MAX_SIDE || ih > IMG_MAX_SIDE)
        return pf_err(-E2BIG, "JPEG: %dx%d image is outside 1..%d per side", iw, ih, IMG_MAX_SIDE);
    int rc = grow(&d->rgb, &d->rgb_cap, (size_t)iw * (size_t)ih * 3);
    if (rc < 0)
        return rc;
    /* STOPONWARNING: a truncated or corrupt stream is an error, not a half-grey image. */
    if (tjDecompress2(d->tj, data, (unsigned long)len, d->rgb, iw, 0, ih, TJPF_RGB, TJFLAG_STOPONWARNING) !=
        0) {
        return reset_tj(d, pf_err(-EPROTO, "JPEG: %s", tjGetErrorStr2(d->tj)));
    }
    *w = iw;
    *h = ih;
    *rgb = d->rgb;
    return 0;
}

void img_resize_rgb(const uint8_t *src, int sw, int sh, uint8_t *dst, int dw, int dh)
{
    float sx = (float)sw / (float)dw, sy = (float)sh / (float)dh;
    for (int y = 0; y < dh; y++) {
        float fy = ((float)y + 0.5f) * sy - 0.5f;
        if (fy < 0)
            fy = 0;
        int y0 = (int)fy;
        if (y0 > sh - 1)
            y0 = sh - 1;
        int y1 = y0 + 1 < sh ? y0 + 1 : sh - 1;
        float wy = fy - (float)y0;
        if (wy > 1)
            wy = 1;
        for (int x = 0; x < dw; x++) {
            float fx = ((float)x + 0.5f) * sx - 0.5f;
            if (fx < 0)
                fx = 0;
            int x0 = (int)fx;
            if (x0 > sw - 1)
                x0 = sw - 1;
            int x1 = x0 + 1 < sw ? x0 + 1 : sw - 1;
            float wx = fx - (float)x0;
            if (wx > 1)
                wx = 1;
            for (int c = 0; c < 3; c++) {
                float a = src[((size_t)y0 * sw + x0) * 3 + c], b = src[((size_t)y0 * sw + x1) * 3 + c];
                float e = src[((size_t)y1 * sw + x0) * 3 + c], f = src[((size_t)y1 * sw + x1) * 3 + c];
                float v = (a * (1 - wx) + b * wx) * (1 - wy) + (e * (1 - wx) + f * wx) * wy;
                int iv = (int)(v + 0.5f);
                dst[((size_t)y * dw + x) * 3 + c] = (uint8_t)(iv < 0 ? 0 : iv > 255 ? 255 : iv);
            }
        }
    }
}

int img_pad_rgb(const uint8_t *src, int sw, int sh, uint8_t *dst, int dw, int dh)
{
    const uint8_t *s = src;
    uint8_t *scaled = NULL;
    int w = sw, h = sh;
    if (sw > dw || sh > dh) {
        /* Scale down so the whole face fits, keeping the aspect ratio. */
        if ((long)sw * dh >= (long)sh * dw) {
            w = dw;
            h = (int)((long)sh * dw / sw);
        } else {
            h = dh;
            w = (int)((long)sw * dh / sh);
        }
        if (w < 1)
            w = 1;
        if (h < 1)
            h = 1;
        scaled = malloc((size_t)w * h * 3);
        if (!scaled)
            return pf_err(-ENOMEM, "out of memory");
        img_resize_rgb(src, sw, sh, scaled, w, h);
        s = scaled;
    }
    memset(dst, 0, (size_t)dw * dh * 3);
    int ox = (dw - w) / 2, oy = (dh - h) / 2;
    for (int y = 0; y < h; y++)
        memcpy(dst + ((size_t)(y + oy) * dw + ox) * 3, s + (size_t)y * w * 3, (size_t)w * 3);
    free(scaled);
    return 0;
}

/* The 256 normalized values, computed once exactly as torchvision: ToTensor (x / 255 in float32),
 * then Normalize(mean 0.5, std 0.5): (t - 0.5) / 0.5 in float32. */
static float norm_lut[256];
static int norm_lut_ready;

static void init_lut(void)
{
    if (__atomic_load_n(&norm_lut_ready, __ATOMIC_ACQUIRE))
        return;
    float t[256];
    for (int v = 0; v < 256; v++) {
        volatile float x = (float)v / 255.0f;
        t[v] = (x - 0.5f) / 0.5f;
    }
    /* Benign race: every thread computes the same table. */
    memcpy(norm_lut, t, sizeof t);
    __atomic_store_n(&norm_lut_ready, 1, __ATOMIC_RELEASE);
}

void img_to_chw(const uint8_t *rgb, int w, int h, int flip, float *out)
{
    init_lut();
    const float *restrict lut = norm_lut;
    size_t plane = (size_t)w * h;
    /* Pixel-major: sequential loads, three sequential store streams (fastest of the layouts tried). */
    for (int y = 0; y < h; y++) {
        const uint8_t *restrict row = rgb + (size_t)y * w * 3;
        float *restrict r = out + (size_t)y * w, *restrict g = r + plane, *restrict b = g + plane;
        if (flip) {
            for (int x = 0; x < w; x++) {
                const uint8_t *p = row + (size_t)(w - 1 - x) * 3;
                r[x] = lut[p[0]];
                g[x] = lut[p[1]];
                b[x] = lut[p[2]];
            }
        } else {
            for (int x = 0; x < w; x++) {
                const uint8_t *p = row + (size_t)x * 3;
                r[x] = lut[p[0]];
                g[x] = lut[p[1]];
                b[x] = lut[p[2]];
            }
        }
    }
}

int img_load(img_decoder *d, const uint8_t *data, size_t len, int size, int resize, int flip, float *out)
{
    int w, h;
    uint8_t *rgb;
    int rc = img_decode_rgb(d, data, len, &w, &h, &rgb);
    if (rc < 0)
        return rc;
    if (w != size || h != size) {
        if (!resize)
            return pf_err(-EINVAL, "image is %dx%d, expected %dx%d (set config key resize = true to resize)",
                          w, h, size, size);
        rc = grow(&d->tmp, &d->tmp_cap, (size_t)size * size * 3);
        if (rc < 0)
            return rc;
        img_resize_rgb(rgb, w, h, d->tmp, size, size);
        rgb = d->tmp;
    }
    img_to_chw(rgb, size, size, flip, out);
    return 0;
}

uint64_t img_splitmix64(uint64_t *state)
{
    uint64_t z = splitmix64(*state);
    *state += 0x9E3779B97F4A7C15ull;
    return z;
}

uint64_t img_hash64(uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
    uint64_t s = a;
    uint64_t h = img_splitmix64(&s);
    s = h ^ b;
    h = img_splitmix64(&s);
    s = h ^ c;
    h = img_splitmix64(&s);
    s = h ^ d;
    return img_splitmix64(&s);
}

int img_decode_pnm_bmp(const uint8_t *data, size_t len, int *w, int *h, uint8_t **rgb)
{
    *rgb = NULL;
    int fd = memfd_create("pfcps-image", MFD_CLOEXEC);
    if (fd < 0)
        return pf_err(-EIO, "memfd_create: %s", strerror(errno));
    for (size_t at = 0; at < len;) {
        ssize_t n = write(fd, data + at, len - at);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int e = n < 0 ? errno : ENOSPC;
            close(fd);
            return pf_err(e == ENOMEM ? -ENOMEM : -EIO, "writing the image to a memory file: %s",
                          strerror(e));
        }
        at += (size_t)n;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    int pf = TJPF_RGB;
    uint8_t *loaded = tjLoadImage(path, w, 1, h, &pf, 0);
    close(fd);
    if (!loaded)
        return pf_err(-EPROTO, "not a JPEG, PNG, PGM, PPM or BMP image: %s", tjGetErrorStr2(NULL));
    if (*w <= 0 || *h <= 0 || *w > IMG_MAX_SIDE || *h > IMG_MAX_SIDE) {
        tjFree(loaded);
        return pf_err(-E2BIG, "%dx%d image is outside 1..%d per side", *w, *h, IMG_MAX_SIDE);
    }
    *rgb = loaded;
    return 0;
}

int img_name_is_image(const char *name)
{
    static const char *ext[] = {".jpg", ".jpeg", ".png", ".pgm", ".ppm", ".pnm", ".bmp"};
    const char *dot = strrchr(name, '.');
    if (!dot)
        return 0;
    for (size_t i = 0; i < sizeof ext / sizeof *ext; i++)
        if (strcasecmp(dot, ext[i]) == 0)
            return 1;
    return 0;
}
