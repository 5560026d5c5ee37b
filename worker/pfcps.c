/* pfcps: the command-line tool. One entry per subcommand in `commands` below; add yours there.
 *   pfcps pack [--pad|--resize] [--first-class N] [--identities N] [--quality Q] [--quiet] IMAGE_DIR OUT_PREFIX
 *   pfcps rec-info [--skip-bad] [--decode] PREFIX */
#include "common/err.h"
#include "common/log.h"
#include "worker/data/image.h"
#include "worker/data/pack.h"
#include "worker/data/rec.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

typedef struct pfcps_command {
    const char *name;
    int (*run)(int argc, char **argv);  /* argv[0] is the subcommand name; returns the exit status */
    const char *usage;
} pfcps_command;

static int parse_i64(const char *s, int64_t *v)
{
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno || end == s || *end) return -1;
    *v = x;
    return 0;
}

static int cmd_pack(int argc, char **argv)
{
    pack_opts o;
    pack_opts_default(&o);
    o.progress = 1;
    const char *pos[2];
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        int64_t v;
        if (strcmp(argv[i], "--resize") == 0) o.resize = 1;
        else if (strcmp(argv[i], "--pad") == 0) o.resize = 0;
        else if (strcmp(argv[i], "--quiet") == 0) o.progress = 0;
        else if (strcmp(argv[i], "--first-class") == 0 && i + 1 < argc && parse_i64(argv[i + 1], &v) == 0) {
            o.first_class = v;
            i++;
        } else if (strcmp(argv[i], "--identities") == 0 && i + 1 < argc && parse_i64(argv[i + 1], &v) == 0 && v > 0) {
            o.max_identities = v;
            i++;
        } else if (strcmp(argv[i], "--quality") == 0 && i + 1 < argc && parse_i64(argv[i + 1], &v) == 0) {
            o.quality = (int)v;
            i++;
        } else if (argv[i][0] == '-' || npos == 2) {
            fprintf(stderr, "pfcps pack: unexpected argument '%s'\n", argv[i]);
            return 2;
        } else pos[npos++] = argv[i];
    }
    if (npos != 2) {
        fprintf(stderr, "pfcps pack: needs IMAGE_DIR and OUT_PREFIX\n");
        return 2;
    }
    pack_stats st;
    int rc = pack_dir(pos[0], pos[1], &o, &st);
    if (rc < 0) {
        fprintf(stderr, "pfcps pack: %s\n", pf_errmsg());
        return 1;
    }
    printf("packed %" PRId64 " images of %" PRId64 " identities into %s.rec/.idx (%" PRId64 " kept as is, %" PRId64
           " converted to 112x112 JPEG)\n", st.images, st.classes, pos[1], st.kept, st.converted);
    return 0;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int cmd_rec_info(int argc, char **argv)
{
    int skip = 0, decode = 0;
    const char *prefix = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--skip-bad") == 0) skip = 1;
        else if (strcmp(argv[i], "--decode") == 0) decode = 1;
        else if (argv[i][0] == '-' || prefix) {
            fprintf(stderr, "pfcps rec-info: unexpected argument '%s'\n", argv[i]);
            return 2;
        } else prefix = argv[i];
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
        for (int64_t i = 0; i < rf->num_images; i++) c[i] = rf->images[i].class_id;
        qsort(c, (size_t)rf->num_images, sizeof *c, cmp_i64);
        for (int64_t i = 0; i < rf->num_images; i++) distinct += i == 0 || c[i] != c[i - 1];
        free(c);
    }
    printf("rec         %s (%zu bytes)\n", rf->rec_path, rf->size);
    if (rf->layout == REC_LAYOUT_INSIGHTFACE)
        printf("layout      insightface (header at key 0; identity records at keys %" PRId64 "..%" PRId64 ")\n",
               rf->header_end[0], rf->header_end[1] - 1);
    else printf("layout      im2rec (no header record; every key is an image)\n");
    printf("images      %" PRId64 "\n", rf->num_images);
    printf("classes     %" PRId64 " distinct, label range [%" PRId64 ", %" PRId64 "], num_classes %" PRId64 "%s\n",
           distinct, rf->min_class, rf->max_class, rf->num_classes,
           rf->property_classes ? " (property)" : " (max label + 1)");
    printf("keys        first %" PRId64 ", last %" PRId64 "\n", rf->min_key, rf->max_key);
    if (skip) printf("skipped     %" PRId64 " bad records\n", rf->skipped);
    rec_buf buf = {0};
    rec_payload p;
    if (rec_get(rf, 0, &buf, &p) == 0) {
        tjhandle tj = tjInitDecompress();
        int w = 0, h = 0, ss, cs;
        if (p.image_len >= 2 && p.image[0] == 0xFF && tj &&
            tjDecompressHeader3(tj, p.image, (unsigned long)p.image_len, &w, &h, &ss, &cs) == 0)
            printf("first image JPEG %dx%d, %zu bytes\n", w, h, p.image_len);
        else printf("first image %zu bytes\n", p.image_len);
        if (tj) tjDestroy(tj);
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
            if (rc == 0) rc = img_decode_rgb(&dec, p.image, p.image_len, &w, &h, &rgb);
            if (rc == 0 && (w != IMG_SIZE || h != IMG_SIZE)) {
                if (sizes++ < 10)
                    printf("size        key %" PRId64 " at byte %" PRIu64 ": %dx%d, not %dx%d\n", rf->images[i].key,
                           rf->images[i].offset, w, h, IMG_SIZE, IMG_SIZE);
            } else if (rc < 0 && bad++ < 10)
                printf("bad image   %s: key %" PRId64 " at byte %" PRIu64 ": %s\n", rf->rec_path, rf->images[i].key,
                       rf->images[i].offset, pf_errmsg());
        }
        img_decoder_free(&dec);
        printf("decoded     %" PRId64 " images: %" PRId64 " fail to decode, %" PRId64 " not %dx%d\n", rf->num_images, bad,
               sizes, IMG_SIZE, IMG_SIZE);
    }
    rec_buf_free(&buf);
    rec_close(rf);
    return bad || sizes ? 1 : 0;
}

static const pfcps_command commands[] = {
    {"pack", cmd_pack,
     "pack [--pad|--resize] [--first-class N] [--identities N] [--quality Q] [--quiet] IMAGE_DIR OUT_PREFIX\n"
     "        one subfolder per identity -> OUT_PREFIX.rec/.idx + property; --identities N: first N only"},
    {"rec-info", cmd_rec_info,
     "rec-info [--skip-bad] [--decode] PREFIX\n"
     "        images, classes, label range, layout, keys; --decode: decode every image, exit 1 if any fails"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: pfcps COMMAND [ARGS]\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++) fprintf(f, "  pfcps %s\n", commands[i].usage);
}

int main(int argc, char **argv)
{
    log_init("pfcps", -1);
    if (argc < 2 || strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "pfcps: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
