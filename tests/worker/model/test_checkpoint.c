/* Backbone checkpoints: round trip (parameters and running statistics bit-exact, same forward
 * output), and refusal of corrupt or mismatched files with a clear error, leaving the model as
 * it was: bad magic, flipped payload byte (checksum), truncated, trailing garbage, other network,
 * other embedding size, missing file. Version 2 extras (named float64 scalars: the loss scaler's
 * state): round trip, version 1 files still load, corrupt or oversized extras tables refused. The extras
 * read without a model (model_file_extras, model_file_ident: the run identity a checkpoint's .model carries):
 * round trip, and tensor tables whose counts or shapes lie (checksum resealed) refused without overflow. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/ckpt.h"
#include "common/err.h"
#include "common/file.h"
#include "tests/check.h"
#include "worker/model/model.h"

/* FNV-1a 64 written out here (the checkpoint's checksum, model.h) to re-seal crafted files. */
static uint64_t fnv(const unsigned char *b, size_t n)
{
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001B3ull;
    }
    return h;
}

/* Copies src to dst with `len` bytes at `off` replaced by `bytes`, then (reseal) recomputes the
 * checksum at offset 64 over bytes 72..end, so only the semantic checks can refuse the file. */
static int craft(const char *src, const char *dst, long off, const void *bytes, size_t len, int reseal)
{
    FILE *f = fopen(src, "rb");
    if (!f)
        return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n);
    size_t got = fread(b, 1, (size_t)n, f);
    fclose(f);
    if (got != (size_t)n)
        return -1;
    memcpy(b + off, bytes, len);
    if (reseal) {
        uint64_t h = fnv(b + 72, (size_t)n - 72);
        memcpy(b + 64, &h, 8);
    }
    f = fopen(dst, "wb");
    fwrite(b, 1, (size_t)n, f);
    fclose(f);
    free(b);
    return 0;
}

static long fsize(const char *p)
{
    FILE *f = fopen(p, "rb");
    if (!f)
        return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    return n;
}

static int copy_mod(const char *src, const char *dst, long off, int xor_byte, long truncate_to, int append)
{
    FILE *f = fopen(src, "rb");
    if (!f)
        return -1;
    long n = fsize(src);
    unsigned char *b = malloc((size_t)n + 16);
    if (fread(b, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(b);
        return -1;
    }
    fclose(f);
    if (off >= 0)
        b[off] ^= (unsigned char)xor_byte;
    if (truncate_to >= 0)
        n = truncate_to;
    if (append)
        for (int i = 0; i < 8; i++)
            b[n++] = 0x5a;
    f = fopen(dst, "wb");
    fwrite(b, 1, (size_t)n, f);
    fclose(f);
    free(b);
    return 0;
}

static void expect_refused(model *m, const char *what, const char *path, int want_rc, const char *needle,
                           const float *before, size_t np)
{
    int rc = model_load(m, path);
    int same = !memcmp(model_params(m), before, np * sizeof(float));
    check(rc == want_rc && (!needle || strstr(pf_errmsg(), needle)) && same,
          "%-30s rc %d '%s', model unchanged: %s", what, rc, pf_errmsg(), same ? "yes" : "NO");
}

int main(void)
{
    char dir[] = "/tmp/pfcps_ckpt_XXXXXX";
    if (!mkdtemp(dir))
        DIE("mkdtemp");
    char path[256], bad[256];
    snprintf(path, sizeof path, "%s/r18.ckpt", dir);
    snprintf(bad, sizeof bad, "%s/bad.ckpt", dir);

    model *a, *b;
    if (model_create(&a, "r18", 64, 2) || model_create(&b, "r18", 64, 2))
        DIE("model_create r18");
    model_init(a, 1);
    model_init(b, 2);
    /* one training forward so the running statistics are not the defaults */
    size_t nin = 2 * 3 * 112 * 112;
    float *x = malloc(nin * sizeof *x);
    for (size_t i = 0; i < nin; i++)
        x[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    const float *e;
    if (model_forward(a, x, 2, 1, &e))
        DIE("model_forward");
    int rc = model_save(a, path);
    check(rc == 0, "save %s: rc %d, %ld bytes (params %zu floats + buffers %zu floats)", path, rc,
          fsize(path), model_num_params(a), model_num_buffer_floats(a));
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    check(access(tmp, F_OK) != 0, "no temp file left behind");

    rc = model_load(b, path);
    int pe = !memcmp(model_params(a), model_params(b), model_num_params(a) * sizeof(float));
    int be = !memcmp(model_buffers(a), model_buffers(b), model_num_buffer_floats(a) * sizeof(float));
    check(rc == 0 && pe && be, "load: rc %d, parameters identical: %s, running statistics identical: %s", rc,
          pe ? "yes" : "NO", be ? "yes" : "NO");
    /* same eval output */
    float *ea = malloc(2 * 64 * sizeof *ea);
    model_forward(a, x, 2, 0, &e);
    memcpy(ea, e, 2 * 64 * sizeof *ea);
    model_forward(b, x, 2, 0, &e);
    int oe = !memcmp(ea, e, 2 * 64 * sizeof *ea);
    check(oe, "eval outputs after load identical: %s", oe ? "yes" : "NO");

    /* corrupt files: b keeps its state */
    size_t np = model_num_params(b);
    float *before = malloc(np * sizeof *before);
    model_init(b, 3);
    memcpy(before, model_params(b), np * sizeof *before);
    long n = fsize(path);
    copy_mod(path, bad, 0, 0x01, -1, 0);
    expect_refused(b, "bad magic", bad, -EPROTO, "magic", before, np);
    copy_mod(path, bad, n - 5, 0x40, -1, 0);
    expect_refused(b, "flipped payload byte", bad, -EPROTO, "checksum", before, np);
    copy_mod(path, bad, -1, 0, n - 100, 0);
    expect_refused(b, "truncated", bad, -EPROTO, NULL, before, np);
    copy_mod(path, bad, -1, 0, 40, 0);
    expect_refused(b, "truncated header", bad, -EPROTO, NULL, before, np);
    copy_mod(path, bad, -1, 0, -1, 1);
    expect_refused(b, "trailing bytes", bad, -EPROTO, NULL, before, np);
    copy_mod(path, bad, 8, 0x02, -1, 0);
    expect_refused(b, "unknown version", bad, -EPROTO, "version", before, np);
    copy_mod(path, bad, 80, 0x01, -1, 0); /* inside the tensor table (first name) */
    expect_refused(b, "tensor table altered", bad, -EINVAL, "layout", before, np);
    snprintf(tmp, sizeof tmp, "%s/missing.ckpt", dir);
    expect_refused(b, "missing file", tmp, -ENOENT, "missing.ckpt", before, np);

    model *c;
    if (model_create(&c, "r34", 64, 1) == 0) {
        float *bc = malloc(model_num_params(c) * sizeof *bc);
        memcpy(bc, model_params(c), model_num_params(c) * sizeof *bc);
        expect_refused(c, "other network (r34)", path, -EINVAL, "r18", bc, model_num_params(c));
        free(bc);
        model_free(c);
    }
    if (model_create(&c, "r18", 128, 1) == 0) {
        float *bc = malloc(model_num_params(c) * sizeof *bc);
        memcpy(bc, model_params(c), model_num_params(c) * sizeof *bc);
        expect_refused(c, "other embedding_size", path, -EINVAL, "embedding_size", bc, model_num_params(c));
        free(bc);
        model_free(c);
    }
    snprintf(tmp, sizeof tmp, "%s/nodir/x.ckpt", dir);
    rc = model_save(a, tmp);
    check(rc == -EIO, "save into a missing directory: rc %d '%s'", rc, pf_errmsg());

    /* ---- version 2 extras ---- */
    {
        /* on a narrow r18 (small files): a, b, path, n, np, before are rebound here */
        model *sa = a, *sb = b;
        char plain_path[300];
        snprintf(plain_path, sizeof plain_path, "%s/w16.ckpt", dir);
        if (model_create(&a, "r18_w16", 64, 2) || model_create(&b, "r18_w16", 64, 2))
            DIE("model_create r18_w16");
        model_init(a, 1);
        model_init(b, 3);
        size_t np = model_num_params(b);
        float *before = malloc(np * sizeof *before);
        memcpy(before, model_params(b), np * sizeof *before);
        const char *path = plain_path;
        rc = model_save(a, path);
        long n = fsize(path);
        check(rc == 0, "save r18_w16: rc %d, %ld bytes", rc, n);
        model_extra x[2] = {{"scale", 65536.0}, {"growth_tracker", 37.0}}, y[4];
        char xp[300];
        snprintf(xp, sizeof xp, "%s/x.ckpt", dir);
        rc = model_save_ex(a, xp, x, 2);
        long xn = fsize(xp);
        check(rc == 0 && xn == n + 80, "save_ex with 2 extras: rc %d, %ld bytes (= plain + 2 x 40: %s)", rc,
              xn, xn == n + 80 ? "yes" : "NO");
        int got = -1;
        memset(y, 0, sizeof y);
        model_init(b, 4);
        rc = model_load_ex(b, xp, y, 4, &got);
        pe = !memcmp(model_params(a), model_params(b), np * sizeof(float));
        int xe = got == 2 && !strcmp(y[0].name, "scale") && y[0].value == 65536.0 &&
                 !strcmp(y[1].name, "growth_tracker") && y[1].value == 37.0;
        check(rc == 0 && xe && pe,
              "load_ex: rc %d, %d extras (scale %g, growth_tracker %g), params identical: %s", rc, got,
              y[0].value, y[1].value, pe ? "yes" : "NO");
        rc = model_load(b, xp);
        check(rc == 0, "plain model_load of a file with extras: rc %d", rc);
        /* model_load_digest: the digest of the file's bytes (pf_file_sha256, a separate read) loads; another
         * file's digest is refused, model untouched */
        uint8_t dx[32], dp[32];
        check(pf_file_sha256(xp, dx) == 0 && pf_file_sha256(path, dp) == 0, "digests of the two files");
        model_init(b, 3);
        rc = model_load_digest(b, xp, dx, y, 4, &got);
        pe = !memcmp(model_params(a), model_params(b), np * sizeof(float));
        check(rc == 0 && got == 2 && pe, "load_digest with the file's SHA-256: rc %d, %d extras, params: %s", rc,
              got, pe ? "identical" : "DIFFER");
        model_init(b, 3);
        rc = model_load_digest(b, xp, dp, y, 4, &got);
        int kept = !memcmp(model_params(b), before, np * sizeof(float));
        check(rc == -EINVAL && strstr(pf_errmsg(), "not the one recorded") && kept,
              "load_digest with another file's SHA-256: rc %d '%s', model unchanged: %s", rc, pf_errmsg(),
              kept ? "yes" : "NO");
        model_init(b, 3);
        rc = model_load_ex(b, xp, y, 1, &got);
        int same = !memcmp(model_params(b), before, np * sizeof(float));
        check(rc == -EINVAL && same, "load_ex with room for 1 of 2 extras: rc %d '%s', model unchanged: %s",
              rc, pf_errmsg(), same ? "yes" : "NO");
        /* version 1: the file model_save writes with no extras, version field 2 -> 1 */
        uint32_t v1 = 1;
        craft(path, bad, 8, &v1, 4, 0);
        got = -1;
        rc = model_load_ex(b, bad, y, 4, &got);
        pe = !memcmp(model_params(a), model_params(b), np * sizeof(float));
        check(rc == 0 && got == 0 && pe, "version 1 file: rc %d, %d extras, params identical: %s", rc, got,
              pe ? "yes" : "NO");
        model_init(b, 3);
        long xoff = xn - (long)((np + model_num_buffer_floats(a)) * sizeof(float)) - 80;
        copy_mod(xp, bad, xoff + 2, 0x01, -1, 0);
        expect_refused(b, "extras byte flipped", bad, -EPROTO, "checksum", before, np);
        char unterminated[32];
        memset(unterminated, 'A', sizeof unterminated);
        craft(xp, bad, xoff, unterminated, 32, 1);
        expect_refused(b, "extras name unterminated", bad, -EPROTO, "extras", before, np);
        char dup[32] = "scale";
        craft(xp, bad, xoff + 40, dup, 32, 1); /* second name = first name */
        expect_refused(b, "extras name repeated", bad, -EPROTO, "twice", before, np);
        uint32_t many = 1000, one = 1;
        craft(xp, bad, 20, &many, 4, 1);
        expect_refused(b, "extras count 1000", bad, -EPROTO, "extras", before, np);
        craft(xp, bad, 20, &one, 4, 1);
        expect_refused(b, "extras count 1 of 2", bad, -EPROTO, "bytes", before, np);
        /* model_file_extras / model_file_ident: the extras without a model; the tensor table walked as
         * written, so counts and shapes that lie (checksum resealed) are refused, never overflowed. */
        model_extra z[MODEL_EXTRAS_MAX];
        int nz = -1;
        rc = model_file_extras(xp, z, MODEL_EXTRAS_MAX, &nz, NULL, NULL);
        check(rc == 0 && nz == 2 && !strcmp(z[1].name, "growth_tracker") && z[1].value == 37.0,
              "model_file_extras: rc %d, %d extras", rc, nz);
        ckpt_ident id0, id1;
        rc = model_file_ident(xp, &id1, NULL, NULL);
        check(rc == -ENOENT && strstr(pf_errmsg(), "no run identity"),
              "a file without identity extras: rc %d '%s'", rc, pf_errmsg());
        memset(&id0, 0x7e, sizeof id0);
        char names[CKPT_IDENT_EXTRAS][32];
        uint64_t bits[CKPT_IDENT_EXTRAS];
        model_extra ix[CKPT_IDENT_EXTRAS];
        ckpt_ident_extras(&id0, names, bits);
        for (int i = 0; i < CKPT_IDENT_EXTRAS; i++) {
            memcpy(ix[i].name, names[i], 32);
            memcpy(&ix[i].value, &bits[i], 8);
        }
        char ip[300];
        snprintf(ip, sizeof ip, "%s/ident.ckpt", dir);
        rc = model_save_ex(a, ip, ix, CKPT_IDENT_EXTRAS);
        if (rc == 0)
            rc = model_file_ident(ip, &id1, NULL, NULL);
        check(rc == 0 && !memcmp(&id0, &id1, sizeof id0),
              "run identity as extras: round trip rc %d, equal: %s", rc,
              !memcmp(&id0, &id1, sizeof id0) ? "yes" : "NO");
        unlink(ip);
        uint16_t nl = 0;
        FILE *xf = fopen(xp, "rb");
        if (!xf || fseek(xf, 72, SEEK_SET) != 0 || fread(&nl, 2, 1, xf) != 1)
            DIE("read %s", xp);
        fclose(xf);
        const long shape0 = 72 + 2 + nl + 2, ndim0 = 72 + 2 + nl + 1;
        uint32_t huge[2] = {0xFFFFFFFFu, 0xFFFFFFFFu}, ntens = 0xFFFFFFFFu;
        uint8_t nd = 6;
        struct {
            const char *what;
            long off;
            const void *bytes;
            size_t len;
            const char *needle;
        } lies[] = {{"tensor 0's shape 2^32-1 x 2^32-1", shape0, huge, 8, "tensor"},
                    {"tensor 0 of 6 dimensions", ndim0, &nd, 1, "ndim 6"},
                    {"2^32-1 tensors", 16, &ntens, 4, "tensor "}};
        for (size_t i = 0; i < sizeof lies / sizeof lies[0]; i++) {
            craft(xp, bad, lies[i].off, lies[i].bytes, lies[i].len, 1);
            rc = model_file_extras(bad, z, MODEL_EXTRAS_MAX, &nz, NULL, NULL);
            check(rc == -EPROTO && strstr(pf_errmsg(), bad) && strstr(pf_errmsg(), lies[i].needle),
                  "model_file_extras, %s: rc %d '%s'", lies[i].what, rc, pf_errmsg());
        }
        /* bad tables are refused before anything is written */
        model_extra e1[2] = {{"", 1.0}, {"a", 2.0}}, e2[2] = {{"a", 1.0}, {"a", 2.0}};
        char np2[300];
        snprintf(np2, sizeof np2, "%s/never.ckpt", dir);
        int r1 = model_save_ex(a, np2, e1, 2), r2 = model_save_ex(a, np2, e2, 2),
            r3 = model_save_ex(a, np2, x, MODEL_EXTRAS_MAX + 1), r4 = model_save_ex(a, np2, NULL, 1);
        int none = access(np2, F_OK) != 0;
        check(r1 == -EINVAL && r2 == -EINVAL && r3 == -EINVAL && r4 == -EINVAL && none,
              "save_ex refuses empty name %d, repeated name %d, %d extras %d, NULL table %d; nothing "
              "written: %s",
              r1, r2, MODEL_EXTRAS_MAX + 1, r3, r4, none ? "yes" : "NO");
        unlink(xp);
        unlink(path);
        free(before);
        model_free(a);
        model_free(b);
        a = sa;
        b = sb;
    }

    /* The corpus seeds (tests/worker/model/fuzz_checkpoint_corpus): a version 1 file (the format without
     * extras) and the same file turned into version 2 with two extras by a script (an independent writer of
     * the format): both load, with the same parameters. */
    const char *src = getenv("PFCPS_SOURCE");
    model *w2;
    if (src && model_create(&w2, "r18_w2", 8, 1) == 0) {
        char p1[1024], p2[1024];
        snprintf(p1, sizeof p1, "%s/tests/worker/model/fuzz_checkpoint_corpus/valid_r18_w2_d8.ckpt", src);
        snprintf(p2, sizeof p2, "%s/tests/worker/model/fuzz_checkpoint_corpus/valid_v2_extras.ckpt", src);
        size_t n2 = model_num_params(w2);
        float *q1 = malloc(n2 * 4);
        model_extra y2[2];
        int got = -1;
        int r1 = model_load(w2, p1);
        memcpy(q1, model_params(w2), n2 * 4);
        model_init(w2, 9);
        int r2 = model_load_ex(w2, p2, y2, 2, &got);
        int eq = !memcmp(q1, model_params(w2), n2 * 4);
        int ok = r1 == 0 && r2 == 0 && eq && got == 2 && !strcmp(y2[1].name, "growth_tracker") &&
                 y2[1].value == 37.0 && y2[0].value == 65536.0;
        check(ok, "corpus seeds: version 1 rc %d, version 2 rc %d with %d extras, same parameters: %s", r1,
              r2, got, eq ? "yes" : "NO");
        free(q1);
        model_free(w2);
    }

    unlink(path);
    unlink(bad);
    rmdir(dir);
    free(x);
    free(ea);
    free(before);
    model_free(a);
    model_free(b);
    return check_summary();
}
