/* `pfcps rec-info`: what a RecordIO dataset holds, as the worker's reader sees it (usage in
 * tools/commands.h). */
#include "tools/commands.h"

#include "common/err.h"
#include "worker/data/image.h"
#include "tools/opts.h"
#include "worker/data/rec.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int cmd_rec_info(int argc, char **argv)
{
    int skip = 0, decode = 0, k;
    const char *prefix = NULL;
    enum { SKIP_BAD, DECODE };
    static const tool_opt opts[] = {{"--skip-bad", 0}, {"--decode", 0}, {NULL, 0}};
    tool_args a;
    tool_args_init(&a, "rec-info", opts, argc, argv);
    while ((k = tool_args_next(&a)) != TOOL_END) {
        if (k == SKIP_BAD)
            skip = 1;
        else if (k == DECODE)
            decode = 1;
        else if (k == TOOL_UNKNOWN || prefix)
            return tool_unexpected(&a, k == TOOL_UNKNOWN ? a.opt : a.arg, NULL);
        else
            prefix = a.arg;
    }
    if (!prefix) {
        fprintf(stderr, "pfcps rec-info: needs PREFIX\n");
        return 2;
    }
    rec_file *rf;
    if (rec_open(&rf, prefix, 0, skip) < 0) {
        fprintf(stderr, "pfcps rec-info: %s\n", pf_errmsg());
        return 1;
    }
    int64_t *c = malloc((size_t)rf->num_images * sizeof *c);
    int64_t distinct = 0;
    if (c) {
        for (int64_t i = 0; i < rf->num_images; i++)
            c[i] = rf->images[i].class_id;
        qsort(c, (size_t)rf->num_images, sizeof *c, cmp_i64);
        for (int64_t i = 0; i < rf->num_images; i++)
            distinct += i == 0 || c[i] != c[i - 1];
        free(c);
    }
    printf("rec         %s (%zu bytes)\n", rf->rec_path, rf->size);
    if (rf->layout == REC_LAYOUT_INSIGHTFACE)
        printf("layout      insightface (header at key 0; identity records at keys %" PRId64 "..%" PRId64
               ")\n",
               rf->header_end[0], rf->header_end[1] - 1);
    else
        printf("layout      im2rec (no header record; every key is an image)\n");
    printf("images      %" PRId64 "\n", rf->num_images);
    printf("classes     %" PRId64 " distinct, label range [%" PRId64 ", %" PRId64 "], num_classes %" PRId64
           "%s\n",
           distinct, rf->min_class, rf->max_class, rf->num_classes,
           rf->property_classes ? " (property)" : " (max label + 1)");
    printf("keys        first %" PRId64 ", last %" PRId64 "\n", rf->min_key, rf->max_key);
    if (skip)
        printf("skipped     %" PRId64 " bad records\n", rf->skipped);
    rec_buf buf = {0};
    rec_payload p;
    if (rec_get(rf, 0, &buf, &p) == 0) {
        tjhandle tj = tjInitDecompress();
        int w = 0, h = 0, ss, cs;
        if (p.image_len >= 2 && p.image[0] == 0xFF && tj &&
            tjDecompressHeader3(tj, p.image, (unsigned long)p.image_len, &w, &h, &ss, &cs) == 0)
            printf("first image JPEG %dx%d, %zu bytes\n", w, h, p.image_len);
        else
            printf("first image %zu bytes\n", p.image_len);
        if (tj)
            tjDestroy(tj);
    }
    /* --decode: decode every image (as training would) and report the ones that fail. */
    int64_t bad = 0, sizes = 0;
    if (decode) {
        img_decoder dec;
        if (img_decoder_init(&dec) < 0) {
            fprintf(stderr, "pfcps rec-info: %s\n", pf_errmsg());
            rec_buf_free(&buf);
            rec_close(rf);
            return 1;
        }
        for (int64_t i = 0; i < rf->num_images; i++) {
            int w, h;
            uint8_t *rgb;
            int rc = rec_get(rf, i, &buf, &p);
            if (rc == 0)
                rc = img_decode_rgb(&dec, p.image, p.image_len, &w, &h, &rgb);
            if (rc == 0 && (w != IMG_SIZE || h != IMG_SIZE)) {
                if (sizes++ < 10)
                    printf("size        key %" PRId64 " at byte %" PRIu64 ": %dx%d, not %dx%d\n",
                           rf->images[i].key, rf->images[i].offset, w, h, IMG_SIZE, IMG_SIZE);
            } else if (rc < 0 && bad++ < 10)
                printf("bad image   %s: key %" PRId64 " at byte %" PRIu64 ": %s\n", rf->rec_path,
                       rf->images[i].key, rf->images[i].offset, pf_errmsg());
        }
        img_decoder_free(&dec);
        printf("decoded     %" PRId64 " images: %" PRId64 " fail to decode, %" PRId64 " not %dx%d\n",
               rf->num_images, bad, sizes, IMG_SIZE, IMG_SIZE);
    }
    rec_buf_free(&buf);
    rec_close(rf);
    return bad || sizes ? 1 : 0;
}
