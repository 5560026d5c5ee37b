/* RecordIO reader against byte-level fixtures written here by hand from the format facts (MXNet RecordIO):
 * a flag-0 record, a flag-2 record, a multi-chunk record whose payload contains the magic at aligned
 * offsets, an InsightFace-style pack (header record 0 last in the file, identity records after the
 * images) and an im2rec-style pack (no header, .idx out of key order). The reader must return the exact
 * labels and image bytes. The writer must produce the hand-written multi-chunk bytes. */
#include "fixture.h"

#include "common/err.h"
#include "worker/data/rec.h"

#include <inttypes.h>

static const uint8_t IMG_A[] = {0xFF, 0xD8, 0xFF, 0xE0, 1, 2, 3, 4, 5};           /* 9 bytes: needs padding */
static const uint8_t IMG_B[] = {0xFF, 0xD8, 0xFF, 0xDB, 9, 8, 7, 6};              /* 8 bytes */
static const uint8_t IMG_C[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 42}; /* PNG signature */

static char dir[256];

static void path_of(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", dir, name);
}

/* Single records parsed from memory: flag 0 and flag 2. */
static void test_single_records(void)
{
    fx_bytes b = {.n = 0};
    size_t o0 = fx_record0(&b, 7.0f, 11, 0, IMG_A, sizeof IMG_A);
    float two[2] = {5.0f, 123.5f};
    size_t o2 = fx_record_labels(&b, two, 2, 12, 0, IMG_B, sizeof IMG_B);
    CHECK(o0 == 0 && o2 == 8 + 24 + 12, "offsets %zu %zu", o0, o2); /* 24 + 9 = 33 -> padded to 36 */
    rec_buf scratch = {0};
    const uint8_t *d;
    size_t n;
    uint64_t next;
    rec_payload p;
    int64_t c;
    int rc = rec_read_record(b.d, b.n, o0, &scratch, &d, &n, &next);
    CHECK(rc == 0 && n == 24 + sizeof IMG_A && next == o2, "flag-0 record: rc %d len %zu next %" PRIu64, rc,
          n, next);
    rc = rec_parse_payload(d, n, &p);
    CHECK(rc == 0 && p.flag == 0 && p.label == 7.0f && p.id == 11 && p.id2 == 0, "flag-0 header");
    CHECK(p.image_len == sizeof IMG_A && memcmp(p.image, IMG_A, sizeof IMG_A) == 0, "flag-0 image bytes");
    CHECK(rec_class_of(&p, 0, &c) == 0 && c == 7, "flag-0 class %" PRId64, c);
    printf("flag-0 record: label %.1f class %" PRId64 ", %zu image bytes match\n", (double)p.label, c,
           p.image_len);

    rc = rec_read_record(b.d, b.n, o2, &scratch, &d, &n, &next);
    CHECK(rc == 0 && n == 24 + 8 + sizeof IMG_B && next == b.n, "flag-2 record rc %d len %zu", rc, n);
    rc = rec_parse_payload(d, n, &p);
    CHECK(rc == 0 && p.flag == 2 && p.label == 5.0f && rec_f32(p.labels + 4) == 123.5f, "flag-2 labels");
    CHECK(p.image_len == sizeof IMG_B && memcmp(p.image, IMG_B, sizeof IMG_B) == 0, "flag-2 image bytes");
    CHECK(rec_class_of(&p, 0, &c) == 0 && c == 5, "flag-2 class %" PRId64, c);
    printf("flag-2 record: labels [%.1f, %.1f] class %" PRId64 ", %zu image bytes match\n", (double)p.label,
           (double)rec_f32(p.labels + 4), c, p.image_len);
    rec_buf_free(&scratch);
}

/* Payload with the magic at payload offsets 28 and 36 (4-byte aligned): three chunks. */
static uint8_t MC_PAYLOAD[42];

static size_t multichunk_bytes(fx_bytes *b)
{
    fx_bytes p = {.n = 0};
    fx_u32(&p, 0);    /* flag */
    fx_f32(&p, 3.0f); /* label */
    fx_u64(&p, 9);    /* id */
    fx_u64(&p, 0);    /* id2 */
    const uint8_t img[18] = {0xFF, 0xD8, 0xFF, 0xE0, 0x0A, 0x23, 0xD7, 0xCE, 0x11,
                             0x22, 0x33, 0x44, 0x0A, 0x23, 0xD7, 0xCE, 0x55, 0x66};
    fx_raw(&p, img, sizeof img);
    memcpy(MC_PAYLOAD, p.d, 42);
    size_t off = b->n;
    fx_u32(b, 0xCED7230Au);
    fx_u32(b, 1u << 29 | 28);
    fx_raw(b, p.d, 28); /* first: [0, 28) */
    fx_u32(b, 0xCED7230Au);
    fx_u32(b, 2u << 29 | 4);
    fx_raw(b, p.d + 32, 4); /* middle: [32, 36) */
    fx_u32(b, 0xCED7230Au);
    fx_u32(b, 3u << 29 | 2);
    fx_raw(b, p.d + 40, 2); /* last: [40, 42) */
    fx_pad4(b);
    return off;
}

static void test_multichunk(void)
{
    fx_bytes b = {.n = 0};
    multichunk_bytes(&b);
    CHECK(b.n == 8 + 28 + 8 + 4 + 8 + 4, "multi-chunk fixture is %zu bytes", b.n);
    rec_buf scratch = {0};
    const uint8_t *d;
    size_t n;
    uint64_t next;
    rec_payload p;
    int rc = rec_read_record(b.d, b.n, 0, &scratch, &d, &n, &next);
    CHECK(rc == 0 && n == 42 && memcmp(d, MC_PAYLOAD, 42) == 0 && next == b.n,
          "multi-chunk joined: rc %d len %zu (%s)", rc, n, pf_errmsg());
    rc = rec_parse_payload(d, n, &p);
    CHECK(rc == 0 && p.label == 3.0f && p.image_len == 18 && memcmp(p.image, MC_PAYLOAD + 24, 18) == 0,
          "multi-chunk payload");
    printf("multi-chunk record: 3 chunks joined to %zu bytes with the magic re-inserted at 28 and 36\n", n);

    /* The writer must split the same payload into exactly these bytes. */
    char prefix[300], rp[320];
    path_of(prefix, sizeof prefix, "mc");
    rec_writer w;
    CHECK(rec_writer_open(&w, prefix) == 0, "writer open");
    CHECK(rec_writer_put_raw(&w, 0, MC_PAYLOAD, 42) == 0, "writer put");
    CHECK(rec_writer_close(&w) == 0, "writer close");
    snprintf(rp, sizeof rp, "%s.rec", prefix);
    FILE *f = fopen(rp, "rb");
    uint8_t got[256];
    size_t gn = f ? fread(got, 1, sizeof got, f) : 0;
    if (f)
        fclose(f);
    CHECK(gn == b.n && memcmp(got, b.d, b.n) == 0,
          "writer bytes differ from the hand-written chunks (%zu vs %zu)", gn, b.n);
    printf("writer: split into the same %zu bytes\n", gn);

    /* A record that starts with a middle chunk is refused. */
    fx_bytes bad = {.n = 0};
    fx_u32(&bad, 0xCED7230Au);
    fx_u32(&bad, 2u << 29 | 4);
    fx_u32(&bad, 0);
    rc = rec_read_record(bad.d, bad.n, 0, &scratch, &d, &n, NULL);
    CHECK(rc == -EPROTO && fx_contains(pf_errmsg(), "unexpected cflag 2 at byte 0"), "cflag 2 first: %s",
          pf_errmsg());
    rec_buf_free(&scratch);
}

/* InsightFace layout: images 1..3, identity records 4..5, header key 0 written last. */
static void test_insightface_pack(void)
{
    fx_bytes b = {.n = 0};
    char idx[512];
    size_t k1 = fx_record0(&b, 0.0f, 1, 0, IMG_A, sizeof IMG_A);
    float l2[2] = {1.0f, 0.0f};
    size_t k2 = fx_record_labels(&b, l2, 2, 2, 0, IMG_B, sizeof IMG_B);
    size_t k3 = b.n;
    multichunk_bytes(&b); /* key 3: the multi-chunk record, label 3 */
    float id4[2] = {1.0f, 2.0f}, id5[2] = {2.0f, 4.0f}, h0[2] = {4.0f, 6.0f};
    size_t k4 = fx_record_labels(&b, id4, 2, 0, 0, NULL, 0);
    size_t k5 = fx_record_labels(&b, id5, 2, 0, 0, NULL, 0);
    size_t k0 = fx_record_labels(&b, h0, 2, 0, 0, NULL, 0);
    snprintf(idx, sizeof idx, "1\t%zu\n2\t%zu\n3\t%zu\n4\t%zu\n5\t%zu\n0\t%zu\n", k1, k2, k3, k4, k5, k0);
    char p[400], prefix[300];
    path_of(prefix, sizeof prefix, "insight");
    snprintf(p, sizeof p, "%s.rec", prefix);
    fx_write(p, b.d, b.n);
    snprintf(p, sizeof p, "%s.idx", prefix);
    fx_write_text(p, idx);
    rec_file *rf;
    int rc = rec_open(&rf, prefix, 0, 0);
    CHECK(rc == 0, "open InsightFace pack: %s", pf_errmsg());
    if (rc < 0)
        return;
    CHECK(rf->layout == REC_LAYOUT_INSIGHTFACE && rf->header_end[0] == 4 && rf->header_end[1] == 6, "layout");
    CHECK(rf->num_images == 3, "images %" PRId64, rf->num_images);
    int64_t want_class[3] = {0, 1, 3};
    const uint8_t *want_img[3] = {IMG_A, IMG_B, MC_PAYLOAD + 24};
    size_t want_len[3] = {sizeof IMG_A, sizeof IMG_B, 18};
    rec_buf s = {0};
    for (int i = 0; i < 3 && i < rf->num_images; i++) {
        rec_payload pl;
        rc = rec_get(rf, i, &s, &pl);
        CHECK(rc == 0 && rf->images[i].key == i + 1 && rf->images[i].class_id == want_class[i], "image %d",
              i);
        CHECK(pl.image_len == want_len[i] && memcmp(pl.image, want_img[i], want_len[i]) == 0,
              "image %d bytes", i);
    }
    CHECK(rf->num_classes == 4 && rf->min_key == 1 && rf->max_key == 3, "classes %" PRId64, rf->num_classes);
    printf("InsightFace pack: header [4, 6) at byte %zu, 3 images, classes 0 1 3, bytes match\n", k0);
    rec_buf_free(&s);
    rec_close(rf);

    /* With a property file, num_classes comes from it and bounds the labels. */
    char prop[300];
    path_of(prop, sizeof prop, "property");
    fx_write_text(prop, "3,112,112\n");
    rc = rec_open(&rf, prefix, 0, 0);
    CHECK(rc == -ERANGE && fx_contains(pf_errmsg(), "key 3") &&
              fx_contains(pf_errmsg(), "class 3 >= num_classes 3"),
          "property bound: %s", pf_errmsg());
    if (rc == 0)
        rec_close(rf);
    fx_write_text(prop, "10,112,112\n");
    rc = rec_open(&rf, prefix, 0, 0);
    CHECK(rc == 0 && rf->num_classes == 10 && rf->property_classes == 10, "property 10");
    if (rc == 0)
        rec_close(rf);
    unlink(prop);
}

/* im2rec layout: keys 0..2 all images, key 0 has flag 2 and an image, .idx out of order. */
static void test_im2rec_pack(void)
{
    fx_bytes b = {.n = 0};
    char idx[512];
    size_t k2 = fx_record0(&b, 2.0f, 2, 0, IMG_C, sizeof IMG_C);
    float l0[2] = {4.0f, 0.25f};
    size_t k0 = fx_record_labels(&b, l0, 2, 0, 0, IMG_A, sizeof IMG_A);
    size_t k1 = fx_record0(&b, 1.0f, 1, 0, IMG_B, sizeof IMG_B);
    snprintf(idx, sizeof idx, "2\t%zu\n0\t%zu\n1\t%zu\n", k2, k0, k1);
    char p[400], prefix[300];
    path_of(prefix, sizeof prefix, "im2rec");
    snprintf(p, sizeof p, "%s.rec", prefix);
    fx_write(p, b.d, b.n);
    snprintf(p, sizeof p, "%s.idx", prefix);
    fx_write_text(p, idx);
    rec_file *rf;
    int rc = rec_open(&rf, p, 0, 0); /* the .idx path works as well as the prefix */
    CHECK(rc == 0, "open im2rec pack: %s", pf_errmsg());
    if (rc < 0)
        return;
    CHECK(rf->layout == REC_LAYOUT_IM2REC && rf->num_images == 3, "layout %d images %" PRId64, rf->layout,
          rf->num_images);
    int64_t want_class[3] = {4, 1, 2};
    const uint8_t *want_img[3] = {IMG_A, IMG_B, IMG_C};
    size_t want_len[3] = {sizeof IMG_A, sizeof IMG_B, sizeof IMG_C};
    rec_buf s = {0};
    for (int i = 0; i < 3 && i < rf->num_images; i++) {
        rec_payload pl;
        rc = rec_get(rf, i, &s, &pl);
        CHECK(rc == 0 && rf->images[i].key == i && rf->images[i].class_id == want_class[i],
              "image %d class %" PRId64, i, rf->images[i].class_id);
        CHECK(pl.image_len == want_len[i] && memcmp(pl.image, want_img[i], want_len[i]) == 0,
              "image %d bytes", i);
    }
    CHECK(rf->num_classes == 5, "num_classes %" PRId64 " (max label + 1)", rf->num_classes);
    printf("im2rec pack: 3 images at keys 0..2, classes 4 1 2, num_classes 5, bytes match\n");
    rec_buf_free(&s);
    rec_close(rf);
}

/* Class ids >= 2^24 through the id2 marker; the float label alone would round them. */
static void test_id2_marker(void)
{
    fx_bytes b = {.n = 0};
    int64_t big = (INT64_C(1) << 24) + 1; /* 16777217: float32 rounds it to 16777216 */
    uint64_t marker = 0x5046ull << 48;
    fx_record0(&b, (float)big, 0, marker | (uint64_t)big, IMG_A, sizeof IMG_A);
    rec_buf s = {0};
    const uint8_t *d;
    size_t n;
    rec_payload p;
    int64_t c = -1;
    rec_read_record(b.d, b.n, 0, &s, &d, &n, NULL);
    rec_parse_payload(d, n, &p);
    CHECK(rec_class_of(&p, 0, &c) == 0 && c == big, "id2 class %" PRId64 " want %" PRId64, c, big);
    CHECK((int64_t)p.label == INT64_C(16777216), "the float label alone reads %.1f", (double)p.label);
    printf("id2 marker: class %" PRId64 " exact (float label reads %.0f)\n", c, (double)p.label);
    /* A marker whose class disagrees with the float label is a bad record. */
    b.n = 0;
    fx_record0(&b, 5.0f, 0, marker | 6u, IMG_A, sizeof IMG_A);
    rec_read_record(b.d, b.n, 0, &s, &d, &n, NULL);
    rec_parse_payload(d, n, &p);
    int rc = rec_class_of(&p, 0, &c);
    CHECK(rc == -ERANGE && fx_contains(pf_errmsg(), "id2 class 6 disagrees with label 5"), "mismatch: %s",
          pf_errmsg());
    rec_buf_free(&s);
}

int main(void)
{
    if (!fx_tmpdir(dir, sizeof dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_single_records();
    test_multichunk();
    test_insightface_pack();
    test_im2rec_pack();
    test_id2_marker();
    fx_rmdir(dir);
    printf("%s: %d failures\n", fails ? "FAIL" : "PASS", fails);
    return fails ? 1 : 0;
}
