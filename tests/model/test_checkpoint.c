/* Backbone checkpoints: round trip (parameters and running statistics bit-exact, same forward
 * output), and refusal of corrupt or mismatched files with a clear error, leaving the model as
 * it was: bad magic, flipped payload byte (checksum), truncated, trailing garbage, other network,
 * other embedding size, missing file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "worker/model/model.h"

static int failures = 0;

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

static int copy_mod(const char *src, const char *dst, long off, int xor_byte, long truncate_to,
                    int append)
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

static void expect_refused(model *m, const char *what, const char *path, int want_rc,
                           const char *needle, const float *before, size_t np)
{
    int rc = model_load(m, path);
    int same = !memcmp(model_params(m), before, np * sizeof(float));
    int bad = rc != want_rc || (needle && !strstr(pf_errmsg(), needle)) || !same;
    printf("%-30s rc %d '%s', model unchanged: %s  %s\n", what, rc, pf_errmsg(),
           same ? "yes" : "NO", bad ? "FAIL" : "ok");
    failures += bad;
}

int main(void)
{
    char dir[] = "/tmp/pfcps_ckpt_XXXXXX";
    if (!mkdtemp(dir)) {
        printf("FAIL: mkdtemp\n");
        return 1;
    }
    char path[256], bad[256];
    snprintf(path, sizeof path, "%s/r18.ckpt", dir);
    snprintf(bad, sizeof bad, "%s/bad.ckpt", dir);

    model *a, *b;
    if (model_create(&a, "r18", 64, 2) || model_create(&b, "r18", 64, 2)) {
        printf("FAIL: %s\n", pf_errmsg());
        return 1;
    }
    model_init(a, 1);
    model_init(b, 2);
    /* one training forward so the running statistics are not the defaults */
    size_t nin = 2 * 3 * 112 * 112;
    float *x = malloc(nin * sizeof *x);
    for (size_t i = 0; i < nin; i++)
        x[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    const float *e;
    if (model_forward(a, x, 2, 1, &e)) {
        printf("FAIL: %s\n", pf_errmsg());
        return 1;
    }
    int rc = model_save(a, path);
    printf("save %s: rc %d, %ld bytes (params %zu floats + buffers %zu floats)\n", path, rc,
           fsize(path), model_num_params(a), model_num_buffer_floats(a));
    failures += rc != 0;
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    printf("no temp file left behind: %s\n", access(tmp, F_OK) ? "ok" : "FAIL");
    failures += access(tmp, F_OK) == 0;

    rc = model_load(b, path);
    int pe = !memcmp(model_params(a), model_params(b), model_num_params(a) * sizeof(float));
    int be = !memcmp(model_buffers(a), model_buffers(b), model_num_buffer_floats(a) * sizeof(float));
    printf("load: rc %d, parameters identical: %s, running statistics identical: %s\n", rc,
           pe ? "yes" : "NO", be ? "yes" : "NO");
    failures += rc != 0 || !pe || !be;
    /* same eval output */
    float *ea = malloc(2 * 64 * sizeof *ea);
    model_forward(a, x, 2, 0, &e);
    memcpy(ea, e, 2 * 64 * sizeof *ea);
    model_forward(b, x, 2, 0, &e);
    int oe = !memcmp(ea, e, 2 * 64 * sizeof *ea);
    printf("eval outputs after load identical: %s\n", oe ? "yes" : "NO");
    failures += !oe;

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
        expect_refused(c, "other embedding_size", path, -EINVAL, "embedding_size", bc,
                       model_num_params(c));
        free(bc);
        model_free(c);
    }
    snprintf(tmp, sizeof tmp, "%s/nodir/x.ckpt", dir);
    rc = model_save(a, tmp);
    printf("save into a missing directory: rc %d '%s' %s\n", rc, pf_errmsg(),
           rc == -EIO ? "ok" : "FAIL");
    failures += rc != -EIO;

    unlink(path);
    unlink(bad);
    rmdir(dir);
    free(x); free(ea); free(before);
    model_free(a);
    model_free(b);
    printf("%s (%d failures)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
