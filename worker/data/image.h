/* Image decode and augmentation for the worker: JPEG through TurboJPEG (tjDecompress2 to RGB), PNG
 * through libpng's simplified API, random horizontal flip, normalize (x/255 - 0.5)/0.5 to [-1, 1], NCHW
 * float32 (arcface_torch's transforms: RandomHorizontalFlip, ToTensor, Normalize(0.5, 0.5)). */
#ifndef PFCPS_WORKER_DATA_IMAGE_H
#define PFCPS_WORKER_DATA_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#define IMG_SIZE     112  /* face crops are 112 x 112 */
#define IMG_MAX_SIDE 8192 /* refuse images larger than this on any side */

/* Per-thread decoder state (TurboJPEG handle and scratch buffers). */
typedef struct img_decoder {
    void *tj;           /* tjhandle for decompression */
    uint8_t *rgb, *tmp; /* scratch, packed RGB */
    size_t rgb_cap, tmp_cap;
} img_decoder;

/* Returns 0 or -ENOMEM. */
int img_decoder_init(img_decoder *d);
/* Releases the TurboJPEG handle and scratch buffers. */
void img_decoder_free(img_decoder *d);

/* Decodes a JPEG or PNG (detected by its signature) to packed RGB, row-major (h, w, 3) uint8; grey
 * images are replicated to 3 channels. *rgb points into the decoder's scratch (valid until the next
 * call). Errors: -EPROTO "not a JPEG or PNG" / "JPEG: <TurboJPEG message>" (TurboJPEG warnings such as
 * premature end of data count as errors: never garbage silently) / "PNG: <libpng message>";
 * -E2BIG for an image over IMG_MAX_SIDE; -ENOMEM. */
int img_decode_rgb(img_decoder *d, const uint8_t *data, size_t len, int *w, int *h, uint8_t **rgb);

/* Decodes a PGM, PPM or BMP held in memory (data, len: the bytes of a file already read and checked) with
 * TurboJPEG's tjLoadImage, which reads only from a path: the bytes go to an anonymous memory file
 * (memfd_create) that tjLoadImage opens as /proc/self/fd/N, so the image decoded is the one read, never
 * whatever the file's path names by then. Grey is replicated to RGB. On success *rgb is packed (h, w, 3)
 * RGB allocated by TurboJPEG (tjFree() it). Errors: -EPROTO "not a JPEG, PNG, PGM, PPM or BMP image:
 * <TurboJPEG message>", -E2BIG for a side outside 1..IMG_MAX_SIDE, -EIO (the memory file), -ENOMEM. */
int img_decode_pnm_bmp(const uint8_t *data, size_t len, int *w, int *h, uint8_t **rgb);

/* Bilinear resize of packed RGB (sh, sw, 3) to (dh, dw, 3), half-pixel centers (OpenCV INTER_LINEAR). */
void img_resize_rgb(const uint8_t *src, int sw, int sh, uint8_t *dst, int dw, int dh);

/* Fits packed RGB (sh, sw, 3) into a (dh, dw, 3) black canvas: scaled down (bilinear, aspect kept) only
 * if larger, centered. Returns 0 or -ENOMEM. */
int img_pad_rgb(const uint8_t *src, int sw, int sh, uint8_t *dst, int dw, int dh);

/* out (3, h, w) float32 = (rgb/255 - 0.5)/0.5 computed in float32 as torchvision does, column order
 * reversed when flip != 0. rgb is packed (h, w, 3) uint8. */
void img_to_chw(const uint8_t *rgb, int w, int h, int flip, float *out);

/* Decode + size check (or resize when resize != 0) + flip + normalize: out is (3, size, size) float32.
 * Errors: those of img_decode_rgb, and -EINVAL "image is WxH, expected SxS (set config key resize = true to
 * resize)". */
int img_load(img_decoder *d, const uint8_t *data, size_t len, int size, int resize, int flip, float *out);

/* Seeded randomness shared by the data pipeline: splitmix64 step and a stateless 64-bit hash. */
uint64_t img_splitmix64(uint64_t *state);
uint64_t img_hash64(uint64_t a, uint64_t b, uint64_t c, uint64_t d);

/* 1 when a file name ends in an image extension the decoders read (case-insensitive .jpg .jpeg .png, and
 * .pgm .ppm .pnm .bmp, which TurboJPEG's tjLoadImage reads), else 0. */
int img_name_is_image(const char *name);

#endif
