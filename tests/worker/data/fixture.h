/* Helpers for the data-pipeline tests: temp folders, byte-level RecordIO fixtures written by hand from
 * the format facts (not with pfcps's writer), and real JPEGs made from the ORL faces with TurboJPEG. */
#ifndef PFCPS_TESTS_WORKER_DATA_FIXTURE_H
#define PFCPS_TESTS_WORKER_DATA_FIXTURE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>

#include "tests/check.h"

/* Byte buffer for hand-written .rec files. */
typedef struct fx_bytes {
    uint8_t d[1 << 16];
    size_t n;
} fx_bytes;

static inline void fx_u32(fx_bytes *b, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        b->d[b->n++] = (uint8_t)(v >> (8 * i));
}

static inline void fx_u64(fx_bytes *b, uint64_t v)
{
    fx_u32(b, (uint32_t)v);
    fx_u32(b, (uint32_t)(v >> 32));
}

static inline void fx_f32(fx_bytes *b, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    fx_u32(b, u);
}

static inline void fx_raw(fx_bytes *b, const void *p, size_t n)
{
    if (n)
        memcpy(b->d + b->n, p, n);
    b->n += n;
}

static inline void fx_pad4(fx_bytes *b)
{
    while (b->n & 3)
        b->d[b->n++] = 0;
}

/* One cflag-0 chunk holding header (flag 0, label) + image. Returns the chunk's offset. */
static inline size_t fx_record0(fx_bytes *b, float label, uint64_t id, uint64_t id2, const uint8_t *img,
                                size_t n)
{
    size_t off = b->n;
    fx_u32(b, 0xCED7230Au);
    fx_u32(b, (uint32_t)(24 + n)); /* cflag 0 */
    fx_u32(b, 0);
    fx_f32(b, label);
    fx_u64(b, id);
    fx_u64(b, id2);
    fx_raw(b, img, n);
    fx_pad4(b);
    return off;
}

/* One cflag-0 chunk with flag = nl extra labels and an image (may be empty). */
static inline size_t fx_record_labels(fx_bytes *b, const float *labels, uint32_t nl, uint64_t id,
                                      uint64_t id2, const uint8_t *img, size_t n)
{
    size_t off = b->n;
    fx_u32(b, 0xCED7230Au);
    fx_u32(b, (uint32_t)(24 + 4 * nl + n));
    fx_u32(b, nl);
    fx_f32(b, 0.0f);
    fx_u64(b, id);
    fx_u64(b, id2);
    for (uint32_t i = 0; i < nl; i++)
        fx_f32(b, labels[i]);
    fx_raw(b, img, n);
    fx_pad4(b);
    return off;
}

static inline int fx_write(const char *path, const void *d, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        return -1;
    }
    size_t w = fwrite(d, 1, n, f);
    fclose(f);
    return w == n ? 0 : -1;
}

static inline int fx_write_text(const char *path, const char *text)
{
    return fx_write(path, text, strlen(text));
}

/* A fresh temp folder; removed by fx_rmdir. */
static inline char *fx_tmpdir(char *buf, size_t n)
{
    snprintf(buf, n, "/tmp/pfcps-data-test-XXXXXX");
    return mkdtemp(buf);
}

static inline void fx_rmdir(const char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", dir);
}

/* Path of the repository's ORL faces (PFCPS_SOURCE/data/orl), or NULL. */
static inline const char *fx_orl(char *buf, size_t n)
{
    const char *src = getenv("PFCPS_SOURCE");
    snprintf(buf, n, "%s/data/orl", src ? src : ".");
    struct stat st;
    return stat(buf, &st) == 0 ? buf : NULL;
}

/* Loads ORL face sID/IMG.pgm as grey (92x112) and places it in a w x h RGB image centered (cropping or
 * black padding), then JPEG-compresses it. Returns a malloc'd JPEG or NULL. */
static inline uint8_t *fx_orl_jpeg(const char *orl, int id, int img, int w, int h, int quality, size_t *len)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/s%d/%d.pgm", orl, id, img);
    int gw, gh, pf = TJPF_GRAY;
    uint8_t *g = tjLoadImage(path, &gw, 1, &gh, &pf, 0);
    if (!g) {
        fprintf(stderr, "%s: %s\n", path, tjGetErrorStr2(NULL));
        return NULL;
    }
    uint8_t *rgb = calloc((size_t)w * h * 3, 1);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            int sx = x - (w - gw) / 2, sy = y - (h - gh) / 2;
            if (sx < 0 || sy < 0 || sx >= gw || sy >= gh)
                continue;
            for (int c = 0; c < 3; c++)
                rgb[((size_t)y * w + x) * 3 + c] = g[(size_t)sy * gw + sx];
        }
    tjFree(g);
    tjhandle tj = tjInitCompress();
    unsigned char *jpg = NULL;
    unsigned long sz = 0;
    uint8_t *out = NULL;
    if (tjCompress2(tj, rgb, w, 0, h, TJPF_RGB, &jpg, &sz, TJSAMP_420, quality, 0) == 0) {
        out = malloc(sz);
        memcpy(out, jpg, sz);
        *len = sz;
    }
    tjFree(jpg);
    tjDestroy(tj);
    free(rgb);
    return out;
}

/* Decodes a JPEG with TurboJPEG to RGB (malloc'd), independent of pfcps's decoder. */
static inline uint8_t *fx_decode(const uint8_t *jpg, size_t len, int *w, int *h)
{
    tjhandle tj = tjInitDecompress();
    int ss, cs;
    uint8_t *rgb = NULL;
    if (tjDecompressHeader3(tj, jpg, (unsigned long)len, w, h, &ss, &cs) == 0) {
        rgb = malloc((size_t)*w * *h * 3);
        if (tjDecompress2(tj, jpg, (unsigned long)len, rgb, *w, 0, *h, TJPF_RGB, 0) != 0) {
            free(rgb);
            rgb = NULL;
        }
    }
    tjDestroy(tj);
    return rgb;
}

static inline int fx_contains(const char *hay, const char *needle)
{
    return strstr(hay, needle) != NULL;
}

#endif
