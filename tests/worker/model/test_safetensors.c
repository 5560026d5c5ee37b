/* worker/model/safetensors: model_export_safetensors -> model_load_pretrained into a fresh model of another
 * seed gives the exported model's eval forward bit for bit (r18_w16, mbf; also from a model.ckpt); a file
 * with a missing tensor, a wrong shape, a wrong dtype, an extra tensor or a truncated header is refused
 * naming the problem, the model untouched; hostile files (header length beyond the file, offsets out of range
 * / overlapping / leaving gaps, sizes not matching the shape, unknown dtypes, malformed JSON, duplicate keys)
 * are refused by st_parse with -EPROTO, and every truncation of a valid file too; a NaN or infinite weight in
 * a safetensors file or a model.ckpt is refused naming the file, tensor and element, and a FIFO at once. (The
 * files' readability by the `safetensors` package and PyTorch is tests/tools/test_export.py.) */
#include "tests/check.h"
#include "tests/worker/model/model_make.h"
#include "worker/model/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define B 3

static char dir[64];

/* model_init(seed) plus random BN affine parameters and running statistics (eval-mode BN not the identity).
 */
static model *make(const char *net, int D, uint64_t seed)
{
    return model_make_perturbed(net, D, B, seed);
}

static float *forward(model *m, const float *x)
{
    const float *e;
    int D = model_get_desc(m)->embedding_size;
    float *y = malloc((size_t)B * D * sizeof(float));
    if (!y || model_forward(m, x, B, 0, &e) ||
        model_device(m)->mem_d2h(model_ctx(m), y, e, (size_t)B * D * 4))
        DIE("forward: %s", pf_errmsg());
    return y;
}

static void roundtrip(const char *net, int D, const float *x)
{
    char st[128], ck[128];
    snprintf(st, sizeof st, "%s/%s.safetensors", dir, net);
    snprintf(ck, sizeof ck, "%s/%s.ckpt", dir, net);
    model *a = make(net, D, 1), *b = make(net, D, 2);
    float *ya = forward(a, x), *yb0 = forward(b, x);
    size_t n = (size_t)B * D * sizeof(float);
    CHECK(memcmp(ya, yb0, n) != 0, "%s: seeds 1 and 2 give the same output (the test could not fail)", net);
    CHECK(model_export_safetensors(a, st) == 0, "%s: export: %s", net, pf_errmsg());
    CHECK(model_load_pretrained(b, st) == 0, "%s: load_pretrained: %s", net, pf_errmsg());
    float *yb = forward(b, x);
    CHECK(memcmp(ya, yb, n) == 0, "%s: eval forward after load_pretrained(safetensors) differs", net);
    /* every tensor of the file: the model's parameters + buffers + one num_batches_tracked per BN */
    st_file *f;
    CHECK(st_read(&f, st) == 0, "%s: st_read: %s", net, pf_errmsg());
    if (f) {
        int nbn = model_num_buffer_tensors(a) / 2;
        CHECK(st_count(f) == model_num_tensors(a) + model_num_buffer_tensors(a) + nbn, "%s: %d tensors", net,
              st_count(f));
        const st_tensor *t = st_find(f, "features.running_var");
        if (!t)
            t = st_find(f, "features.layers.3.running_var");
        CHECK(t && !strcmp(t->dtype, "F32") && t->ndim == 1 && t->shape[0] == D, "%s: features running_var",
              net);
        const char *md = st_metadata(f, "network");
        CHECK(md && !strcmp(md, net), "%s: metadata network %s", net, md ? md : "(none)");
        st_free(f);
    }
    /* from a pfcps checkpoint */
    model *c = make(net, D, 3);
    CHECK(model_save(a, ck) == 0 && model_load_pretrained(c, ck) == 0, "%s: ckpt: %s", net, pf_errmsg());
    float *yc = forward(c, x);
    CHECK(memcmp(ya, yc, n) == 0, "%s: eval forward after load_pretrained(model.ckpt) differs", net);
    printf("%s: export -> load_pretrained (safetensors, model.ckpt): eval forward identical\n", net);
    free(ya);
    free(yb0);
    free(yb);
    free(yc);
    model_free(a);
    model_free(b);
    model_free(c);
}

/* Non-finite weights in a pretrained file are refused naming the file, the tensor and the element, and
 * leave b as it was: a NaN in a parameter and +Inf in a running statistic of a safetensors file, -Inf in a
 * parameter of a model.ckpt. hp, hb: a's parameters and buffers (a is left changed). */
static void nonfinite(model *a, model *b, float *hp, float *hb)
{
    char path[128];
    size_t np = model_num_params(a), nb = model_num_buffer_floats(a);
    float *p = malloc(np * 4), *q = malloc(nb * 4);
    if (!p || !q)
        DIE("out of memory");
    struct {
        const char *tensor, *ext;
        int buffer; /* the tensor is a running statistic */
        size_t elem;
        float value;
        const char *want;
    } cases[] = {
        {"layer1.0.prelu.weight", "safetensors", 0, 3, NAN,
         "bad.safetensors: tensor 'layer1.0.prelu.weight' element 3 is NaN"},
        {"bn2.running_var", "safetensors", 1, 0, INFINITY,
         "bad.safetensors: tensor 'bn2.running_var' element 0 is +Inf"},
        {"fc.weight", "ckpt", 0, 100, -INFINITY, "bad.ckpt: tensor 'fc.weight' element 100 is -Inf"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        memcpy(p, hp, np * 4);
        memcpy(q, hb, nb * 4);
        const model_tensor *t = NULL;
        for (int i = 0; i < (cases[c].buffer ? model_num_buffer_tensors(a) : model_num_tensors(a)); i++) {
            const model_tensor *u = cases[c].buffer ? model_buffer_tensor_at(a, i) : model_tensor_at(a, i);
            if (!strcmp(u->name, cases[c].tensor))
                t = u;
        }
        if (!t)
            DIE("no tensor %s", cases[c].tensor);
        (cases[c].buffer ? q : p)[t->offset + cases[c].elem] = cases[c].value;
        snprintf(path, sizeof path, "%s/bad.%s", dir, cases[c].ext);
        if (model_set_params(a, p) || model_set_buffers(a, q))
            DIE("%s", pf_errmsg());
        if (strcmp(cases[c].ext, "ckpt") ? model_export_safetensors(a, path) : model_save(a, path))
            DIE("writing %s: %s", path, pf_errmsg());
        float *before = malloc(np * 4), *after = malloc(np * 4);
        if (!before || !after || model_get_params(b, before))
            DIE("host copies");
        int rc = model_load_pretrained(b, path);
        CHECK(rc == -EINVAL && strstr(pf_errmsg(), cases[c].want), "%s in %s: rc %d '%s', wanted '%s'",
              cases[c].tensor, cases[c].ext, rc, pf_errmsg(), cases[c].want);
        CHECK(model_get_params(b, after) == 0 && memcmp(before, after, np * 4) == 0,
              "a refused non-finite %s changed the model", cases[c].ext);
        printf("non-finite weight refused: %s\n", pf_errmsg());
        free(before);
        free(after);
    }
    free(p);
    free(q);
}

/* A file with the model's tensors but `drop` left out / `reshape` given another shape / `f16` as F16 / an
 * `extra` tensor: refused naming the tensor, the model unchanged. */
static void refusals(const float *x)
{
    const char *net = "r18_w16";
    model *a = make(net, 16, 5), *b = make(net, 16, 6);
    float *y0 = forward(b, x);
    size_t np = model_num_params(a), nb = model_num_buffer_floats(a);
    float *hp = malloc(np * 4), *hb = malloc(nb * 4);
    if (!hp || !hb || model_get_params(a, hp) || model_get_buffers(a, hb))
        DIE("host copies");
    int nt = model_num_tensors(a), nbt = model_num_buffer_tensors(a);
    st_entry *e = calloc((size_t)(nt + nbt + 1), sizeof *e);
    static const float dummy[4];
    struct {
        const char *what, *target, *want;
        int mode; /* 0 drop, 1 reshape, 2 F16, 3 extra */
    } cases[] = {
        {"missing tensor", "layer2.1.conv2.weight", "tensor 'layer2.1.conv2.weight' missing", 0},
        {"missing buffer", "bn2.running_var", "tensor 'bn2.running_var' missing", 0},
        {"wrong shape", "fc.weight", "tensor 'fc.weight' has shape [6272, 16], the model needs [16, 6272]",
         1},
        {"wrong dtype", "layer1.0.prelu.weight", "tensor 'layer1.0.prelu.weight' is F16, expected F32", 2},
        {"extra tensor", "head.weight", "tensor 'head.weight' is not part of network r18_w16", 3},
    };
    char path[128];
    snprintf(path, sizeof path, "%s/bad.safetensors", dir);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int k = 0;
        for (int i = 0; i < nt + nbt; i++) {
            const model_tensor *t = i < nt ? model_tensor_at(a, i) : model_buffer_tensor_at(a, i - nt);
            if (cases[c].mode == 0 && !strcmp(t->name, cases[c].target))
                continue;
            e[k].name = t->name;
            e[k].dtype = "F32";
            e[k].ndim = t->ndim;
            for (int d = 0; d < t->ndim; d++)
                e[k].shape[d] = t->shape[d];
            e[k].data = (i < nt ? hp : hb) + t->offset;
            if (!strcmp(t->name, cases[c].target) && cases[c].mode == 1) {
                e[k].shape[0] = t->shape[1];
                e[k].shape[1] = t->shape[0];
            }
            if (!strcmp(t->name, cases[c].target) && cases[c].mode == 2)
                e[k].dtype = "F16";
            k++;
        }
        if (cases[c].mode == 3)
            e[k++] =
                (st_entry){.name = "head.weight", .dtype = "F32", .ndim = 1, .shape = {4}, .data = dummy};
        if (st_write(path, e, k, NULL, 0))
            DIE("st_write: %s", pf_errmsg());
        int rc = model_load_pretrained(b, path);
        CHECK(rc == -EINVAL && strstr(pf_errmsg(), cases[c].want), "%s: rc %d, message '%s', wanted '%s'",
              cases[c].what, rc, pf_errmsg(), cases[c].want);
        printf("%s refused: %s\n", cases[c].what, pf_errmsg());
    }
    /* a truncated header: the first 8 + 100 bytes of a real export */
    char good[128];
    snprintf(good, sizeof good, "%s/good.safetensors", dir);
    if (model_export_safetensors(a, good))
        DIE("export: %s", pf_errmsg());
    FILE *in = fopen(good, "rb"), *out = fopen(path, "wb");
    char buf[108];
    if (!in || !out || fread(buf, 1, sizeof buf, in) != sizeof buf ||
        fwrite(buf, 1, sizeof buf, out) != sizeof buf)
        DIE("copy");
    fclose(in);
    fclose(out);
    int rc = model_load_pretrained(b, path);
    CHECK(rc == -EPROTO && strstr(pf_errmsg(), "header length") && strstr(pf_errmsg(), "beyond the file"),
          "truncated header: rc %d '%s'", rc, pf_errmsg());
    printf("truncated header refused: %s\n", pf_errmsg());
    /* another network's file */
    model *mbf = make("mbf", 16, 7);
    rc = model_load_pretrained(mbf, good);
    CHECK(rc == -EINVAL && strstr(pf_errmsg(), "missing"), "r18_w16 file into mbf: rc %d '%s'", rc,
          pf_errmsg());
    rc = model_load_pretrained(b, "/nonexistent/x.safetensors");
    CHECK(rc == -ENOENT, "missing file: rc %d", rc);
    nonfinite(a, b, hp, hb);
    /* a FIFO is refused at once instead of waiting for a writer */
    char fifo[128];
    snprintf(fifo, sizeof fifo, "%s/pretrained.fifo", dir);
    if (mkfifo(fifo, 0600))
        DIE("mkfifo %s", fifo);
    rc = model_load_pretrained(b, fifo);
    CHECK(rc == -EIO && strstr(pf_errmsg(), "pretrained.fifo: a FIFO, not a regular file"),
          "FIFO as pretrained: rc %d '%s'", rc, pf_errmsg());
    printf("FIFO refused: %s\n", pf_errmsg());
    unlink(fifo);
    float *y1 = forward(b, x);
    CHECK(memcmp(y0, y1, (size_t)B * 16 * 4) == 0, "a refused file changed the model");
    free(y0);
    free(y1);
    free(e);
    free(hp);
    free(hb);
    model_free(a);
    model_free(b);
    model_free(mbf);
}

/* A file: u64 header length (hlen, or the JSON's length when hlen < 0), the JSON, then `data` bytes of data.
 */
static size_t mkfile(unsigned char *buf, const char *json, long long hlen, size_t data)
{
    uint64_t n = hlen < 0 ? strlen(json) : (uint64_t)hlen;
    memcpy(buf, &n, 8);
    memcpy(buf + 8, json, strlen(json));
    for (size_t i = 0; i < data; i++)
        buf[8 + strlen(json) + i] = (unsigned char)(i * 7 + 1);
    return 8 + strlen(json) + data;
}

static void hostile(void)
{
    static const struct {
        const char *json;
        long long hlen;
        size_t data;
        const char *want;
    } cases[] = {
        {"{}", 1000, 0, "beyond the file"},
        {"{}", (long long)(1ull << 62), 0, "beyond the file"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", -1, 4, "outside the data"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
         -1, 12, "overlaps"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
         -1, 12, "a gap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 8, "cover 4 data bytes"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", -1, 8, "needs 12"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", -1, 8, "outside the data"},
        {"{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4, "unknown dtype F33"},
        {"{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4, "unknown dtype"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", -1, 4, "shape[0]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", -1, 4, "shape[0]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4611686018427387904],\"data_offsets\":[0,"
         "4]}}",
         -1, 4, "overflows"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", -1, 4,
         "at most 8"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", -1, 4, "needs exactly"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", -1, 4, "needs exactly"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", -1, 4, "not [begin, end]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
         -1, 4, "duplicate"},
        {"{\"a\":", -1, 0, "not valid JSON"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} x", -1, 4, "not valid JSON"},
        {"[1]", -1, 0, "not a JSON object"},
        {"{\"a\":[]}", -1, 0, "not a JSON object"},
        {"{\"__metadata__\":{\"k\":1}}", -1, 0, "is not a string"},
        {"{\"__metadata__\":[]}", -1, 0, "is not an object"},
        {"{}", 1, 0, "not a JSON object"},
    };
    unsigned char buf[512];
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        size_t n = mkfile(buf, cases[c].json, cases[c].hlen, cases[c].data);
        st_file *f = NULL;
        int rc = st_parse(&f, buf, n, "case");
        CHECK(rc == -EPROTO && !f && strstr(pf_errmsg(), cases[c].want),
              "hostile %zu (%s): rc %d '%s', wanted '%s'", c, cases[c].json, rc, pf_errmsg(), cases[c].want);
        st_free(f);
    }
    printf("%zu hostile headers refused\n", sizeof cases / sizeof *cases);
    /* the writer refuses a repeated name and sizes past 2^63 - 1 bytes, the largest JSON offset: 2^31 x 2^31
     * F32 elements are 2^64 bytes (the product overflows), 2^61 F32 elements 2^63 bytes */
    st_entry w[3] = {{.name = "a", .dtype = "F32", .ndim = 1, .shape = {2}},
                     {.name = "a", .dtype = "F32", .ndim = 1, .shape = {2}}};
    unsigned char *hb = NULL;
    size_t hl = 0;
    int wrc = st_header(w, 2, NULL, 0, &hb, &hl, NULL, NULL);
    CHECK(wrc == -EINVAL && strstr(pf_errmsg(), "'a' is empty, reserved or repeated"), "repeated name: %d %s",
          wrc, pf_errmsg());
    w[1] = (st_entry){.name = "b", .dtype = "F32", .ndim = 2, .shape = {1ll << 31, 1ll << 31}};
    wrc = st_header(w, 2, NULL, 0, &hb, &hl, NULL, NULL);
    CHECK(wrc == -EINVAL && strstr(pf_errmsg(), "tensor 'b': the tensors' bytes exceed 2^63"),
          "2^31 x 2^31 F32: %d %s", wrc, pf_errmsg());
    for (int i = 0; i < 3; i++)
        w[i] = (st_entry){.name = i == 0   ? "x"
                                  : i == 1 ? "y"
                                           : "z",
                          .dtype = "F32",
                          .ndim = 1,
                          .shape = {1ll << 61}};
    wrc = st_header(w, 3, NULL, 0, &hb, &hl, NULL, NULL);
    CHECK(wrc == -EINVAL && strstr(pf_errmsg(), "tensor 'x': the tensors' bytes exceed 2^63"),
          "3 x 2^61 F32: %d %s", wrc, pf_errmsg());
    free(hb);
    /* short files */
    st_file *f = NULL;
    CHECK(st_parse(&f, buf, 5, "short") == -EPROTO, "5 bytes accepted");
    /* a valid file (with a scalar, a zero-size tensor, metadata, trailing header spaces) and all its prefixes
     */
    const char *ok =
        "{\"__metadata__\":{\"k\":\"v\"},\"s\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},"
        "\"z\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[8,8]},"
        "\"a\":{\"dtype\":\"F32\",\"shape\":[2,1],\"data_offsets\":[8,16]}}   ";
    size_t n = mkfile(buf, ok, -1, 16);
    int rc = st_parse(&f, buf, n, "valid");
    CHECK(rc == 0, "valid file refused: %s", pf_errmsg());
    if (!rc) {
        const st_tensor *s = st_find(f, "s"), *a = st_find(f, "a"), *z = st_find(f, "z");
        CHECK(st_count(f) == 3 && s && a && z && s->ndim == 0 && s->nbytes == 8 && a->ndim == 2 &&
                  a->shape[0] == 2 && a->data == buf + 8 + strlen(ok) + 8 && z->nbytes == 0,
              "valid file parsed wrong");
        CHECK(st_metadata(f, "k") && !strcmp(st_metadata(f, "k"), "v") && !st_metadata(f, "x"), "metadata");
        st_free(f);
    }
    int prefixes = 0;
    for (size_t k = 0; k < n; k++) {
        f = NULL;
        unsigned char *cp = malloc(k ? k : 1); /* exact size: ASan sees any read past it */
        memcpy(cp, buf, k);
        rc = st_parse(&f, cp, k, "prefix");
        prefixes += rc == -EPROTO && !f;
        st_free(f);
        free(cp);
    }
    CHECK(prefixes == (int)n, "%d of %zu truncations refused", prefixes, n);
    printf("every truncation of a valid %zu-byte file refused\n", n);
}

/* Files written by the safetensors package (numpy save_file: the fuzz seeds
 * tests/worker/model/fuzz_safetensors_corpus).
 */
static void package_files(void)
{
    const char *src = getenv("PFCPS_SOURCE");
    if (!src) {
        printf("PFCPS_SOURCE not set: the safetensors package's files not read\n");
        return;
    }
    char p[1024];
    static const char *names[] = {"two_tensors", "conv_f16_empty", "bn", "empty"};
    static const int counts[] = {2, 3, 3, 0};
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/tests/worker/model/fuzz_safetensors_corpus/%s.safetensors", src, names[i]);
        st_file *f;
        int rc = st_read(&f, p);
        CHECK(rc == 0 && st_count(f) == counts[i], "%s: rc %d %s", p, rc, pf_errmsg());
        if (rc)
            continue;
        if (i == 0) { /* a = arange(6).reshape(2, 3) float32, n = 3 int64 */
            const st_tensor *a = st_find(f, "a"), *n = st_find(f, "n");
            float v[6];
            int64_t nv = 0;
            if (a && a->nbytes == sizeof v)
                memcpy(v, a->data, sizeof v);
            if (n && n->nbytes == 8)
                memcpy(&nv, n->data, 8);
            CHECK(a && n && a->ndim == 2 && a->shape[0] == 2 && a->shape[1] == 3 && v[5] == 5.0f &&
                      v[1] == 1.0f && n->ndim == 0 && !strcmp(n->dtype, "I64") && nv == 3 &&
                      !strcmp(st_metadata(f, "format"), "pt"),
                  "two_tensors read wrong");
        }
        st_free(f);
    }
    printf("the safetensors package's files read\n");
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/pfcps-st-XXXXXX");
    if (!mkdtemp(dir))
        DIE("mkdtemp");
    rng_state = 99;
    float *x = malloc((size_t)B * 3 * 112 * 112 * sizeof(float));
    for (size_t i = 0; i < (size_t)B * 3 * 112 * 112; i++)
        x[i] = frand(-1, 1);
    hostile();
    package_files();
    roundtrip("r18_w16", 32, x);
    roundtrip("mbf", 64, x);
    refusals(x);
    free(x);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        printf("could not remove %s\n", dir);
    printf("%s\n", fails ? "FAILED" : "all passed");
    return fails != 0;
}
