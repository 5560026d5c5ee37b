/* `pfcps pack` round trips:
 *  - a folder of 3 identities (112x112 JPEGs made from ORL faces here with TurboJPEG, a 112x112 PNG, a
 *    92x112 JPEG, a PGM): 112x112 JPEGs come back byte-identical, labels follow the folders in natural
 *    order (id1, id2, id10), converted images decode to 112x112 and match their source pixels (pad
 *    mode: black borders, face in the middle);
 *  - class ids >= 2^24 (first_class 2^24 + 1 and 2^40 + 3) round-trip exactly;
 *  - ../data/orl (398 grey 92x112 PGM, 40 identities) packs into 398 records, 40 classes, 112x112 RGB;
 *  - the pfcps binary: `pfcps pack` + `pfcps rec-info` on the ORL faces. */
#include "fixture.h"

#include "common/err.h"
#include "common/log.h"
#include "worker/data/pack.h"
#include "worker/data/rec.h"

#include <inttypes.h>
#include <math.h>
#include <png.h>

static char dir[256];

/* Mean |a - b| over a (h, w, 3) region of two RGB images with the given strides (pixels). */
static double mad(const uint8_t *a, int aw, int ax, int ay, const uint8_t *b, int bw, int bx, int by, int w,
                  int h)
{
    double s = 0;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < 3; c++)
                s += fabs((double)a[((size_t)(y + ay) * aw + x + ax) * 3 + c] -
                          (double)b[((size_t)(y + by) * bw + x + bx) * 3 + c]);
    return s / (3.0 * w * h);
}

static uint8_t *orl_rgb(const char *orl, int id, int img, int *w, int *h)
{
    char path[400];
    snprintf(path, sizeof path, "%s/s%d/%d.pgm", orl, id, img);
    int pf = TJPF_RGB;
    return tjLoadImage(path, w, 1, h, &pf, 0);
}

static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    uint8_t *b = malloc(1 << 20);
    *n = fread(b, 1, 1 << 20, f);
    fclose(f);
    return b;
}

/* Builds dir/faces: id1 {a.jpg, b.jpg} (112 JPEG), id2 {a.jpg (112 JPEG), b.png (112 PNG)},
 * id10 {a.jpg (92x112 JPEG), b.pgm (copy of an ORL face)}. */
static int make_faces(const char *orl, char files[6][400])
{
    const char *ids[3] = {"id1", "id2", "id10"};
    char p[400];
    snprintf(p, sizeof p, "%s/faces", dir);
    mkdir(p, 0755);
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/faces/%s", dir, ids[i]);
        mkdir(p, 0755);
    }
    size_t n;
    uint8_t *j;
    snprintf(files[0], 400, "%s/faces/id1/a.jpg", dir);
    snprintf(files[1], 400, "%s/faces/id1/b.jpg", dir);
    snprintf(files[2], 400, "%s/faces/id2/a.jpg", dir);
    snprintf(files[3], 400, "%s/faces/id2/b.png", dir);
    snprintf(files[4], 400, "%s/faces/id10/a.jpg", dir);
    snprintf(files[5], 400, "%s/faces/id10/b.pgm", dir);
    int src[3][2] = {{1, 1}, {1, 2}, {2, 1}};
    for (int k = 0; k < 3; k++) {
        if (!(j = fx_orl_jpeg(orl, src[k][0], src[k][1], 112, 112, 92, &n)))
            return -1;
        fx_write(files[k], j, n);
        free(j);
    }
    /* PNG 112x112 of s2/2 (grey padded to 112 wide, RGB). */
    if (!(j = fx_orl_jpeg(orl, 2, 2, 112, 112, 100, &n)))
        return -1;
    int w, h;
    uint8_t *rgb = fx_decode(j, n, &w, &h);
    free(j);
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    im.width = (png_uint_32)w;
    im.height = (png_uint_32)h;
    im.format = PNG_FORMAT_RGB;
    int ok = png_image_write_to_file(&im, files[3], 0, rgb, 0, NULL);
    free(rgb);
    if (!ok) {
        fprintf(stderr, "png write: %s\n", im.message);
        return -1;
    }
    if (!(j = fx_orl_jpeg(orl, 3, 1, 92, 112, 95, &n)))
        return -1;
    fx_write(files[4], j, n);
    free(j);
    char src_pgm[400];
    snprintf(src_pgm, sizeof src_pgm, "%s/s3/2.pgm", orl);
    uint8_t *pgm = slurp(src_pgm, &n);
    if (!pgm)
        return -1;
    fx_write(files[5], pgm, n);
    free(pgm);
    return 0;
}

static void test_roundtrip(const char *orl)
{
    char files[6][400];
    if (make_faces(orl, files) < 0) {
        CHECK(0, "could not make the face folder");
        return;
    }
    char in[400], out[400];
    snprintf(in, sizeof in, "%s/faces", dir);
    snprintf(out, sizeof out, "%s/packed/train", dir);
    const int64_t firsts[3] = {0, (INT64_C(1) << 24) + 1, (INT64_C(1) << 40) + 3};
    for (int f = 0; f < 3; f++) {
        pack_opts po;
        pack_opts_default(&po);
        po.first_class = firsts[f];
        pack_stats st;
        int rc = pack_dir(in, out, &po, &st);
        CHECK(rc == 0 && st.images == 6 && st.classes == 3 && st.kept == 3 && st.converted == 3,
              "pack: rc %d (%s) images %" PRId64 " kept %" PRId64, rc, pf_errmsg(), st.images, st.kept);
        if (rc < 0)
            return;
        rec_file *rf;
        rc = rec_open(&rf, out, 0, 0);
        CHECK(rc == 0, "open packed: %s", pf_errmsg());
        if (rc < 0)
            return;
        CHECK(rf->layout == REC_LAYOUT_INSIGHTFACE && rf->num_images == 6 &&
                  rf->num_classes == firsts[f] + 3 && rf->property_classes == firsts[f] + 3,
              "layout %d images %" PRId64 " classes %" PRId64, rf->layout, rf->num_images, rf->num_classes);
        int64_t want_class[6] = {0, 0, 1, 1, 2, 2};
        rec_buf s = {0};
        int exact = 0, close = 0;
        for (int i = 0; i < 6 && i < rf->num_images; i++) {
            rec_payload p;
            rc = rec_get(rf, i, &s, &p);
            int64_t c = rf->images[i].class_id;
            CHECK(rc == 0 && c == firsts[f] + want_class[i], "image %d class %" PRId64 " want %" PRId64, i, c,
                  firsts[f] + want_class[i]);
            CHECK(p.label == (float)(firsts[f] + want_class[i]), "image %d float label %.1f", i,
                  (double)p.label);
            if (i < 3) {
                size_t n;
                uint8_t *orig = slurp(files[i], &n);
                CHECK(orig && p.image_len == n && memcmp(orig, p.image, n) == 0,
                      "image %d: bytes differ from %s", i, files[i]);
                exact += orig && p.image_len == n && memcmp(orig, p.image, n) == 0;
                free(orig);
                continue;
            }
            int w, h;
            uint8_t *got = fx_decode(p.image, p.image_len, &w, &h);
            CHECK(got && w == 112 && h == 112, "image %d decodes to %dx%d", i, w, h);
            if (!got || w != 112 || h != 112) {
                free(got);
                continue;
            }
            double d_face, d_border = 0;
            if (i == 3) {
                /* PNG: same pixels up to JPEG q95 loss. */
                size_t n;
                uint8_t *png = slurp(files[3], &n);
                int pw;
                png_image im;
                memset(&im, 0, sizeof im);
                im.version = PNG_IMAGE_VERSION;
                png_image_begin_read_from_memory(&im, png, n);
                im.format = PNG_FORMAT_RGB;
                uint8_t *src = malloc(PNG_IMAGE_SIZE(im));
                png_image_finish_read(&im, NULL, src, 0, NULL);
                pw = (int)im.width;
                CHECK((int)im.height == 112, "PNG height %u", im.height);
                d_face = mad(got, 112, 0, 0, src, pw, 0, 0, 112, 112);
                free(src);
                free(png);
            } else {
                /* 92x112 sources, pad mode: 10 black columns each side, the face in between. */
                int sw, sh;
                uint8_t *src;
                if (i == 4) {
                    size_t n;
                    uint8_t *jb = slurp(files[4], &n);
                    src = fx_decode(jb, n, &sw, &sh);
                    free(jb);
                } else {
                    src = orl_rgb(orl, 3, 2, &sw, &sh);
                }
                CHECK(src && sw == 92 && sh == 112, "source %d is %dx%d", i, sw, sh);
                if (!src) {
                    free(got);
                    continue;
                }
                d_face = mad(got, 112, 10, 0, src, 92, 0, 0, 92, 112);
                for (int y = 0; y < 112; y++)
                    for (int x = 0; x < 112; x++)
                        if (x < 8 || x >= 104)
                            for (int c = 0; c < 3; c++)
                                d_border += got[((size_t)y * 112 + x) * 3 + c];
                d_border /= 112.0 * 16 * 3;
                if (i == 4)
                    free(src);
                else
                    tjFree(src);
            }
            CHECK(d_face < 3.0 && d_border < 3.0, "image %d: mean |diff| face %.2f border %.2f", i, d_face,
                  d_border);
            close += d_face < 3.0 && d_border < 3.0;
            if (f == 0)
                printf("converted image %d: mean |decoded - source| %.3f, border mean %.3f (want < 3)\n", i,
                       d_face, d_border);
            free(got);
        }
        printf("first_class %" PRId64 ": 6 images, classes %" PRId64 "..%" PRId64
               " exact, %d/3 JPEGs byte-identical, %d/3 converted match\n",
               firsts[f], rf->min_class, rf->max_class, exact, close);
        rec_buf_free(&s);
        rec_close(rf);
    }
}

static void test_orl(const char *orl)
{
    char out[400];
    snprintf(out, sizeof out, "%s/orl/train", dir);
    pack_opts po;
    pack_opts_default(&po);
    pack_stats st;
    int rc = pack_dir(orl, out, &po, &st);
    CHECK(rc == 0 && st.images == 398 && st.classes == 40,
          "ORL pack: rc %d %s images %" PRId64 " classes %" PRId64, rc, pf_errmsg(), st.images, st.classes);
    rec_file *rf;
    rc = rec_open(&rf, out, 0, 0);
    CHECK(rc == 0, "open ORL pack: %s", pf_errmsg());
    if (rc < 0)
        return;
    /* `rec` may name the folder: <dir>/train is opened. */
    char folder[400];
    snprintf(folder, sizeof folder, "%s/orl", dir);
    rec_file *rf2;
    int rc2 = rec_open(&rf2, folder, 0, 0);
    CHECK(rc2 == 0 && rf2->num_images == 398, "open by folder: %s", pf_errmsg());
    if (rc2 == 0)
        rec_close(rf2);
    int count[40] = {0}, sized = 0, grey = 0;
    rec_buf s = {0};
    tjhandle tj = tjInitDecompress();
    uint8_t *rgb = malloc(112 * 112 * 3);
    for (int64_t i = 0; i < rf->num_images; i++) {
        rec_payload p;
        if (rec_get(rf, i, &s, &p) < 0)
            continue;
        int64_t c = rf->images[i].class_id;
        if (c >= 0 && c < 40)
            count[c]++;
        int w = 0, h = 0, ss, cs;
        if (tjDecompressHeader3(tj, p.image, (unsigned long)p.image_len, &w, &h, &ss, &cs) == 0 && w == 112 &&
            h == 112 &&
            tjDecompress2(tj, p.image, (unsigned long)p.image_len, rgb, 112, 0, 112, TJPF_RGB, 0) == 0) {
            sized++;
            int maxd = 0;
            for (int k = 0; k < 112 * 112; k++) {
                int d1 = abs(rgb[3 * k] - rgb[3 * k + 1]), d2 = abs(rgb[3 * k] - rgb[3 * k + 2]);
                if (d1 > maxd)
                    maxd = d1;
                if (d2 > maxd)
                    maxd = d2;
            }
            grey += maxd <= 2;
        }
    }
    /* s8/10.pgm and s9/8.pgm are missing from the repository copy: classes 7 and 8 have 9 images. */
    int counts_ok = 1;
    for (int c = 0; c < 40; c++)
        counts_ok &= count[c] == (c == 7 || c == 8 ? 9 : 10);
    CHECK(rf->num_images == 398 && rf->num_classes == 40 && rf->min_class == 0 && rf->max_class == 39,
          "ORL: %" PRId64 " images %" PRId64 " classes", rf->num_images, rf->num_classes);
    CHECK(counts_ok, "per-class counts (s1 -> class 0 ... s40 -> class 39; s8, s9 have 9)");
    CHECK(sized == 398 && grey == 398, "ORL: %d of 398 decode to 112x112 RGB, %d grey", sized, grey);
    printf("ORL pack: %" PRId64 " records, %" PRId64
           " classes, %d decode to 112x112 RGB (R=G=B within 2: %d)\n",
           rf->num_images, rf->num_classes, sized, grey);
    free(rgb);
    tjDestroy(tj);
    rec_buf_free(&s);
    rec_close(rf);

    /* Training split: the first 30 identities (s1..s30; s8 and s9 have 9 images) = 298 images. */
    snprintf(out, sizeof out, "%s/orl30/train", dir);
    po.max_identities = 30;
    rc = pack_dir(orl, out, &po, &st);
    CHECK(rc == 0 && st.images == 298 && st.classes == 30,
          "ORL s1..s30: rc %d images %" PRId64 " classes %" PRId64, rc, st.images, st.classes);
    if (rec_open(&rf, out, 0, 0) == 0) {
        CHECK(rf->num_images == 298 && rf->num_classes == 30 && rf->max_class == 29,
              "s1..s30 pack reads %" PRId64, rf->num_images);
        printf("ORL s1..s30 (--identities 30): %" PRId64 " records, %" PRId64 " classes\n", rf->num_images,
               rf->num_classes);
        rec_close(rf);
    }
}

/* first_class + identities past 2^48: refused, and the message counts the identities of the folder (it
 * said "+ 0 identities": the list was freed before the message was formatted). dir/faces has 3. */
static void test_first_class_limit(void)
{
    char in[400], out[400];
    snprintf(in, sizeof in, "%s/faces", dir);
    snprintf(out, sizeof out, "%s/limit/train", dir);
    pack_opts po;
    pack_opts_default(&po);
    po.first_class = (INT64_C(1) << 48) - 2;
    pack_stats st;
    int rc = pack_dir(in, out, &po, &st);
    CHECK(rc == -EINVAL && strstr(pf_errmsg(), "first_class 281474976710654 + 3 identities exceeds 2^48"),
          "first_class 2^48-2 with 3 identities: rc %d, message '%s'", rc, pf_errmsg());
}

/* A pack that fails part-way (an image that does not decode, last in file order) leaves the pack already at
 * that prefix byte for byte as it was and no partial files (a truncated train.rec/.idx without its header
 * record would read back as a valid im2rec pack). */
static void test_failed_pack_keeps_old(void)
{
    char in[400], out[400], bad[400], p[450];
    snprintf(in, sizeof in, "%s/faces", dir);
    snprintf(out, sizeof out, "%s/keep/train", dir);
    pack_opts po;
    pack_opts_default(&po);
    pack_stats st;
    int rc = pack_dir(in, out, &po, &st);
    CHECK(rc == 0 && st.images == 6, "first pack: rc %d (%s), %" PRId64 " images", rc, pf_errmsg(),
          st.images);
    size_t nrec0 = 0, nidx0 = 0, nrec1 = 0, nidx1 = 0;
    snprintf(p, sizeof p, "%s.rec", out);
    uint8_t *rec0 = slurp(p, &nrec0);
    snprintf(p, sizeof p, "%s.idx", out);
    uint8_t *idx0 = slurp(p, &nidx0);
    snprintf(bad, sizeof bad, "%s/faces/id10/zz.jpg", dir); /* after a.jpg, b.pgm: the pack's last image */
    fx_write(bad, (const uint8_t *)"not a jpeg", 10);
    rc = pack_dir(in, out, &po, &st);
    CHECK(rc == -EPROTO && strstr(pf_errmsg(), "zz.jpg"), "pack with an undecodable image: rc %d (%s)", rc,
          pf_errmsg());
    snprintf(p, sizeof p, "%s.rec", out);
    uint8_t *rec1 = slurp(p, &nrec1);
    snprintf(p, sizeof p, "%s.idx", out);
    uint8_t *idx1 = slurp(p, &nidx1);
    CHECK(rec0 && rec1 && nrec1 == nrec0 && !memcmp(rec0, rec1, nrec0), "train.rec changed: %zu -> %zu bytes",
          nrec0, nrec1);
    CHECK(idx0 && idx1 && nidx1 == nidx0 && !memcmp(idx0, idx1, nidx0), "train.idx changed: %zu -> %zu bytes",
          nidx0, nidx1);
    struct stat sb;
    snprintf(p, sizeof p, "%s.partial.rec", out);
    CHECK(stat(p, &sb) != 0, "%s left behind", p);
    snprintf(p, sizeof p, "%s.partial.idx", out);
    CHECK(stat(p, &sb) != 0, "%s left behind", p);
    unlink(bad);
    free(rec0);
    free(idx0);
    free(rec1);
    free(idx1);
}

/* num_classes larger than the pack's property file (a typo in the config): the pack opens (labels are in
 * range) but a warning names both counts. dir/keep/train was packed from dir/faces: 3 identities. */
static void test_num_classes_vs_property(void)
{
    char prefix[400], logp[400];
    snprintf(prefix, sizeof prefix, "%s/keep/train", dir);
    snprintf(logp, sizeof logp, "%s/warn.log", dir);
    CHECK(log_open_file(logp) == 0, "log file");
    rec_file *rf = NULL;
    int rc = rec_open(&rf, prefix, 10, 0);
    CHECK(rc == 0 && rf && rf->num_classes == 10 && rf->property_classes == 3, "open with num_classes 10: %s",
          pf_errmsg());
    if (rc == 0)
        rec_close(rf);
    rc = rec_open(&rf, prefix, 3, 0); /* equal: no warning */
    if (rc == 0)
        rec_close(rf);
    log_close_file();
    size_t n = 0;
    char *text = (char *)slurp(logp, &n);
    if (text)
        text[n < (1 << 20) ? n : n - 1] = 0;
    CHECK(text && strstr(text, "num_classes 10 is more than the 3 classes") &&
              strstr(text, "class centers 3..9 get no images"),
          "no num_classes warning: %s", text ? text : "(no log)");
    CHECK(text && !strstr(text, "num_classes 3 is"), "warning for num_classes equal to the property: %s",
          text);
    free(text);
}

/* The pfcps binary itself. */
static void test_cli(const char *orl)
{
    const char *build = getenv("PFCPS_BUILD");
    if (!build) {
        printf("PFCPS_BUILD not set: CLI not tested\n");
        return;
    }
    char cmd[1200], line[512];
    snprintf(cmd, sizeof cmd,
             "'%s/tools/pfcps' pack --quiet '%s' '%s/cli/train' >/dev/null 2>&1 && "
             "'%s/tools/pfcps' rec-info '%s/cli/train'",
             build, orl, dir, build, dir);
    FILE *f = popen(cmd, "r");
    int seen = 0;
    while (f && fgets(line, sizeof line, f)) {
        printf("  rec-info: %s", line);
        seen += strncmp(line, "images      398", 15) == 0;
        seen += strstr(line, "40 distinct, label range [0, 39], num_classes 40 (property)") != NULL;
        seen += strstr(line, "insightface") != NULL;
        seen += strstr(line, "first 1, last 398") != NULL;
    }
    int st = f ? pclose(f) : -1;
    CHECK(st == 0 && seen == 4, "pfcps pack + rec-info: status %d, %d of 4 expected lines", st, seen);
    snprintf(cmd, sizeof cmd, "'%s/tools/pfcps' rec-info '%s/nonexistent' 2>&1", build, dir);
    f = popen(cmd, "r");
    int named = 0;
    while (f && fgets(line, sizeof line, f))
        named += strstr(line, "nonexistent.idx: cannot open index") != NULL;
    st = f ? pclose(f) : -1;
    CHECK(st != 0 && named, "rec-info of a missing pack: status %d", st);
}

int main(void)
{
    char ob[300];
    const char *orl = fx_orl(ob, sizeof ob);
    if (!orl) {
        printf("SKIP: ORL faces not found under PFCPS_SOURCE/data/orl\n");
        return 77;
    }
    if (!fx_tmpdir(dir, sizeof dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_roundtrip(orl);
    test_orl(orl);
    test_first_class_limit();
    test_failed_pack_keeps_old();
    test_num_classes_vs_property();
    test_cli(orl);
    fx_rmdir(dir);
    printf("%s: %d failures\n", fails ? "FAIL" : "PASS", fails);
    return fails ? 1 : 0;
}
