/* The .bin verification-set reader (worker/eval/binset.c) against pickles written by Python
 * (make_binsets.py: Python 3 pickle.dump at protocols 3, 4, 5, and Python 2's protocol 2 and protocol 1
 * forms written opcode by opcode and checked loadable by Python's own pickle): every file gives the
 * pairs the script wrote, without pickle, into expected.dat. Then every prefix of each small good file
 * is refused (truncation at every byte), every bad_*.bin is refused with the reason make_binsets.py
 * names, and a few hand-made hostile streams are refused, among them 4 MiB files built to fill the memory
 * (refused at the memory bound, naming the byte) beside a real-shaped set of that size (loaded). Needs
 * PFCPS_PYTHON (exit 77 without). */
#include "tests/check.h"
#include "tests/reference/ref.h"
#include "worker/eval/binset.h"

#include "common/err.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)sz + 1);
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *n = (size_t)sz;
    return b;
}

/* s against expected.dat: u32 N, N issame bytes, 2N x (u32 len, bytes) */
static void compare(const char *what, const eval_binset *s, const uint8_t *e, size_t en)
{
    uint32_t n;
    memcpy(&n, e, 4);
    CHECK(s->n_pairs == n, "%s: %lld pairs, expected %u", what, (long long)s->n_pairs, n);
    if (s->n_pairs != n)
        return;
    size_t off = 4;
    for (uint32_t i = 0; i < n; i++)
        CHECK(s->issame[i] == e[off + i], "%s: issame[%u] %d", what, i, s->issame[i]);
    off += n;
    for (uint32_t i = 0; i < 2 * n && off + 4 <= en; i++) {
        uint32_t len;
        memcpy(&len, e + off, 4);
        off += 4;
        CHECK(s->img_len[i] == len && memcmp(s->img[i], e + off, len) == 0,
              "%s: image %u differs (%zu vs %u bytes)", what, i, s->img_len[i], len);
        off += len;
    }
}

static void refuse(const char *what, const uint8_t *d, size_t n, const char *want)
{
    eval_binset s;
    pf_err_clear();
    int rc = eval_binset_parse(&s, d, n);
    CHECK(rc == -EPROTO, "%s: rc %d, expected -EPROTO (%s)", what, rc, pf_errmsg());
    CHECK(s.img == NULL && s.n_pairs == 0, "%s: set not empty after a refusal", what);
    CHECK(pf_errmsg()[0] != 0, "%s: refused without a message", what);
    if (want)
        CHECK(strstr(pf_errmsg(), want) != NULL, "%s: message '%s' lacks '%s'", what, pf_errmsg(), want);
    eval_binset_free(&s);
}

/* The machine's memory is bounded by the file's size: 4 MiB files built to fill it (empty tuples, 200 MB
 * before the bound; lists of appended lists, 670 MB) are refused once they would take more than 16 MiB +
 * 16 bytes per byte = 16777216 + 16 x 4194304 = 83886080 bytes, naming the byte offset; 4 MiB of nested
 * tuples are refused at the nesting bound, at the 8th TUPLE1 (byte 10: PROTO 2 is bytes 0-1, the list byte 2
 * at depth 1, seven TUPLE1 at bytes 3-9 reach depth 8); a real-shaped set of the same order of size (2^19
 * pairs of 1-byte images, appended 1000 at a time as Python's pickler does) still loads. */
static void memory_bound(void)
{
    const size_t n = 4u << 20;
    uint8_t *h = malloc(n);
    /* PROTO 2, then EMPTY_TUPLE to the end (the last byte STOP) */
    h[0] = 0x80;
    h[1] = 2;
    memset(h + 2, ')', n - 3);
    h[n - 1] = '.';
    refuse("4 MiB of empty tuples", h, n,
           "would take more than 83886080 bytes of memory for a 4194304-byte pickle");
    CHECK(strstr(pf_errmsg(), "verification set: pickle offset ") != NULL, "empty tuples: no byte offset: %s",
          pf_errmsg());
    printf("4 MiB of empty tuples: refused: %s\n", pf_errmsg());
    /* PROTO 2, EMPTY_LIST, then TUPLE1 to the end (the last byte STOP) */
    h[2] = ']';
    memset(h + 3, 0x85, n - 4);
    refuse("4 MiB of nested tuples", h, n, "verification set: pickle offset 10: values nested deeper than 8");
    printf("4 MiB of nested tuples: refused: %s\n", pf_errmsg());
    /* PROTO 2, EMPTY_LIST, then EMPTY_LIST EMPTY_LIST APPEND to the end */
    for (size_t i = 3; i + 3 <= n - 1; i += 3)
        memcpy(h + i, "]]a", 3);
    refuse("4 MiB of appended lists", h, n, "would take more than 83886080 bytes");
    printf("4 MiB of appended lists: refused: %s\n", pf_errmsg());
    free(h);
    /* ( [images] [issame] ) with 2^19 pairs: PROTO 2, EMPTY_LIST, (MARK, 1000 x SHORT_BINBYTES of 1 byte,
     * APPENDS)..., EMPTY_LIST, (MARK, NEWTRUE / NEWFALSE x 1000, APPENDS)..., TUPLE2, STOP */
    const size_t pairs = 1u << 19, imgs = 2 * pairs;
    uint8_t *g = malloc(4 + imgs * 3 + imgs / 1000 * 2 + 4 + pairs + pairs / 1000 * 2 + 16), *q = g;
    *q++ = 0x80;
    *q++ = 2;
    *q++ = ']';
    for (size_t i = 0; i < imgs; i++) {
        if (i % 1000 == 0)
            *q++ = '(';
        *q++ = 'C';
        *q++ = 1;
        *q++ = (uint8_t)i;
        if (i % 1000 == 999 || i == imgs - 1)
            *q++ = 'e';
    }
    *q++ = ']';
    for (size_t i = 0; i < pairs; i++) {
        if (i % 1000 == 0)
            *q++ = '(';
        *q++ = i % 3 ? 0x88 : 0x89;
        if (i % 1000 == 999 || i == pairs - 1)
            *q++ = 'e';
    }
    *q++ = 0x86;
    *q++ = '.';
    eval_binset s;
    int rc = eval_binset_parse(&s, g, (size_t)(q - g));
    CHECK(rc == 0 && s.n_pairs == (int64_t)pairs && s.img_len[imgs - 1] == 1 &&
              s.img[imgs - 1][0] == (uint8_t)(imgs - 1) && s.issame[0] == 0 && s.issame[1] == 1,
          "2^19 pairs of 1-byte images (%zu bytes): rc %d %s", (size_t)(q - g), rc, pf_errmsg());
    printf("2^19 pairs of 1-byte images (%zu bytes): %s\n", (size_t)(q - g), rc ? pf_errmsg() : "loaded");
    eval_binset_free(&s);
    free(g);
}

int main(void)
{
    const char *py, *src = getenv("PFCPS_SOURCE");
    int missing = ref_python(&py);
    if (missing)
        return missing;
    if (!src) {
        printf("FAIL: PFCPS_SOURCE not set (tests/meson.build sets it)\n");
        return 1;
    }
    char dir[] = "/tmp/pfcps-binset-XXXXXX", cmd[8192], p[4200];
    if (!mkdtemp(dir))
        return 1;
    snprintf(cmd, sizeof cmd, "'%s' '%s/tests/worker/eval/make_binsets.py' '%s'", py, src, dir);
    if (system(cmd) != 0) {
        printf("FAIL: %s\n", cmd);
        return 1;
    }
    size_t en, en0;
    snprintf(p, sizeof p, "%s/expected.dat", dir);
    uint8_t *e = slurp(p, &en);
    snprintf(p, sizeof p, "%s/expected_p0.dat", dir);
    uint8_t *e0 = slurp(p, &en0);
    if (!e || !e0)
        return 1;
    const char *good[] = {"py3_p3.bin", "py3_p4.bin", "py3_p5.bin", "py2_p2.bin", "py2_p0.bin"};
    for (size_t g = 0; g < sizeof good / sizeof *good; g++) {
        snprintf(p, sizeof p, "%s/%s", dir, good[g]);
        eval_binset s;
        int rc = eval_binset_load(&s, p);
        CHECK(rc == 0, "%s: %s", good[g], pf_errmsg());
        if (rc == 0)
            compare(good[g], &s, g == 4 ? e0 : e, g == 4 ? en0 : en);
        printf("%s: %lld pairs, %s\n", good[g], (long long)s.n_pairs, rc ? pf_errmsg() : "as written");
        eval_binset_free(&s);
        /* truncated at every byte (in the 70 KB image's bytes every 997th: the rest is opcodes): each
         * prefix is refused (a copy of that size, so ASan sees reads past its end) */
        size_t n;
        uint8_t *d = slurp(p, &n);
        int refused = 0, tried = 0;
        for (size_t k = 0; d && k < n; k++) {
            if (k > 8192 && k + 8192 < n && k % 997)
                continue;
            tried++;
            uint8_t *c = malloc(k ? k : 1);
            memcpy(c, d, k);
            eval_binset t;
            rc = eval_binset_parse(&t, c, k);
            refused += rc == -EPROTO;
            if (rc != -EPROTO)
                CHECK(0, "%s truncated to %zu bytes: rc %d", good[g], k, rc);
            eval_binset_free(&t);
            free(c);
        }
        printf("%s (%zu bytes): %d truncations tried, all refused: %s\n", good[g], n, tried,
               refused == tried ? "yes" : "NO");
        free(d);
    }
    /* bad_*.bin with the reason each must name */
    snprintf(p, sizeof p, "%s/bad.txt", dir);
    size_t bn;
    char *bad = (char *)slurp(p, &bn);
    int nbad = 0;
    if (bad) {
        bad[bn] = 0;
        for (char *line = strtok(bad, "\n"); line; line = strtok(NULL, "\n")) {
            char *tab = strchr(line, '\t');
            if (!tab)
                continue;
            *tab = 0;
            snprintf(p, sizeof p, "%s/%s", dir, line);
            size_t n;
            uint8_t *d = slurp(p, &n);
            refuse(line, d ? d : (uint8_t *)"", d ? n : 0, tab + 1);
            printf("%s: refused: %s\n", line, pf_errmsg());
            free(d);
            nbad++;
        }
    }
    CHECK(nbad >= 20, "only %d bad files", nbad);
    /* by load: the path is named */
    snprintf(p, sizeof p, "%s/bad_reduce.bin", dir);
    eval_binset s;
    CHECK(eval_binset_load(&s, p) == -EPROTO && strstr(pf_errmsg(), "bad_reduce.bin"), "load: %s",
          pf_errmsg());
    CHECK(eval_binset_load(&s, "/nonexistent/lfw.bin") == -ENOENT &&
              strstr(pf_errmsg(), "/nonexistent/lfw.bin"),
          "missing file: %s", pf_errmsg());
    /* more values than BINSET_MAX_VALUES: refused before the memory grows with them */
    size_t big = BINSET_MAX_VALUES + 16;
    uint8_t *h = malloc(big + 3);
    h[0] = 0x80;
    h[1] = 2;
    memset(h + 2, 0x88, big);
    h[big + 2] = '.';
    refuse("NEWTRUE x 2^22+16", h, big + 3, "more than");
    free(h);
    memory_bound();
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        printf("note: could not remove %s\n", dir);
    free(e);
    free(e0);
    free(bad);
    printf("%s\n", fails ? "FAIL" : "ok");
    return fails != 0;
}
