/* `pfcps embed`: embeddings of images through a backbone checkpoint into a .npy (usage in tools/commands.h).
 * INPUT is, in this order of detection:
 *   - a .bin verification set (name ends in .bin, or starts with the pickle PROTO byte): its 2N images in
 * order;
 *   - a RecordIO pack: PREFIX with PREFIX.rec and PREFIX.idx beside it, PREFIX.rec / PREFIX.idx itself, or a
 *     folder holding train.rec + train.idx: its images in key order;
 *   - a folder: every image file (.jpg .jpeg .png .pgm .ppm .pnm .bmp, any case) below it, recursively,
 *     hidden entries skipped, in byte order of the path relative to the folder (LC_ALL=C sort); links are
 *     followed, but into each folder once (the first path in byte order walks it; a loop or a second link
 *     is skipped with a warning);
 *   - otherwise a list file: one image path per line (as written: relative to the current directory),
 *     empty lines skipped. */
#include "tools/commands.h"

#include "common/clock.h"
#include "common/err.h"
#include "common/file.h"
#include "common/log.h"
#include "tools/opts.h"
#include "worker/data/image.h"
#include "worker/data/rec.h"
#include "worker/eval/binset.h"
#include "worker/eval/embed.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

typedef struct embed_input {
    const char *kind; /* "bin", "recordio", "folder", "list" */
    eval_binset bin;
    rec_file *rf;
    rec_buf scratch;
    char **paths;
    int64_t n, cap;
} embed_input;

static int add_path(embed_input *in, const char *p)
{
    if (in->n == in->cap) {
        int64_t c = in->cap ? 2 * in->cap : 256;
        char **q = realloc(in->paths, (size_t)c * sizeof *q);
        if (!q)
            return pf_err(-ENOMEM, "out of memory for %" PRId64 " paths", c);
        in->paths = q;
        in->cap = c;
    }
    if (!(in->paths[in->n] = strdup(p)))
        return pf_err(-ENOMEM, "out of memory");
    in->n++;
    return 0;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The names in folder dir (hidden ones left out) into *names (*n of them, byte order; free each and the
 * array). Returns 0 or the error naming dir. */
static int list_names(const char *dir, char ***names, size_t *n)
{
    *names = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return pf_err(errno == EACCES ? -EACCES : -errno, "%s: cannot open folder: %s", dir, strerror(errno));
    size_t cap = 0;
    int rc = 0;
    struct dirent *e;
    while (!rc && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 64;
            char **v = realloc(*names, cap * sizeof *v);
            if (!v) {
                rc = pf_err(-ENOMEM, "%s: out of memory listing the folder", dir);
                break;
            }
            *names = v;
        }
        if (!((*names)[*n] = strdup(e->d_name)))
            rc = pf_err(-ENOMEM, "%s: out of memory listing the folder", dir);
        else
            (*n)++;
    }
    closedir(d);
    if (*n > 1)
        qsort(*names, *n, sizeof **names, cmp_name);
    return rc;
}

/* Adds every image file below dir (already entered in seen), walking its folders in byte order of their
 * names; a folder reached again through a link (a loop, or a second link to a folder already walked) is
 * skipped with a warning naming the link. */
static int walk(embed_input *in, pf_dirset *seen, const char *dir, int depth)
{
    if (depth > 64)
        return pf_err(-ELOOP, "%s: folders nested deeper than 64", dir);
    char **names;
    size_t n;
    int rc = list_names(dir, &names, &n);
    char p[4096];
    for (size_t i = 0; i < n && !rc; i++) {
        if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, names[i]) >= sizeof p) {
            rc = pf_err(-ENAMETOOLONG, "%s/%s: path too long", dir, names[i]);
            break;
        }
        struct stat st;
        if (stat(p, &st) != 0)
            continue; /* a dangling link */
        if (S_ISDIR(st.st_mode)) {
            int fresh = pf_dirset_enter(seen, &st);
            if (fresh < 0)
                rc = fresh;
            else if (fresh)
                rc = walk(in, seen, p, depth + 1);
            else
                log_warn("%s: a link to a folder already walked (a loop, or a second link to it): skipped",
                         p);
        } else if (S_ISREG(st.st_mode) && img_name_is_image(names[i])) {
            rc = add_path(in, p);
        }
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return rc;
}

/* Every image file below the folder root (see walk). */
static int walk_root(embed_input *in, const char *root, const struct stat *st)
{
    pf_dirset seen = {0};
    int rc = pf_dirset_enter(&seen, st);
    if (rc >= 0)
        rc = walk(in, &seen, root, 0);
    pf_dirset_free(&seen);
    return rc;
}

static int cmp_path(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int exists(const char *prefix, const char *ext)
{
    char p[4300];
    if ((size_t)snprintf(p, sizeof p, "%s%s", prefix, ext) >= sizeof p)
        return 0;
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int input_open(embed_input *in, const char *path)
{
    memset(in, 0, sizeof *in);
    struct stat st;
    int st_ok = stat(path, &st) == 0;
    if (!st_ok && !(exists(path, ".rec") && exists(path, ".idx")))
        return pf_err(-ENOENT, "%s: no such file, folder or RecordIO prefix", path);
    size_t n = strlen(path);
    char prefix[4200];
    snprintf(prefix, sizeof prefix, "%s", path);
    if (n > 4 && (strcmp(path + n - 4, ".rec") == 0 || strcmp(path + n - 4, ".idx") == 0))
        prefix[n - 4] = 0;
    int is_dir = st_ok && S_ISDIR(st.st_mode), is_reg = st_ok && S_ISREG(st.st_mode);
    char train[4200];
    snprintf(train, sizeof train, "%s/train", path);
    if (!is_dir && n >= 4 && strcmp(path + n - 4, ".bin") == 0) {
        in->kind = "bin";
        return eval_binset_load(&in->bin, path);
    }
    if (is_reg) {
        uint8_t c = 0;
        size_t got = 0;
        if (pf_read_head(path, &c, 1, &got) == 0 && got == 1 && c == 0x80) {
            in->kind = "bin";
            return eval_binset_load(&in->bin, path);
        }
    }
    if ((!is_dir && exists(prefix, ".rec") && exists(prefix, ".idx")) ||
        (is_dir && exists(train, ".rec") && exists(train, ".idx"))) {
        in->kind = "recordio";
        int rc = rec_open(&in->rf, is_dir ? train : prefix, 0, 0);
        if (rc == 0)
            in->n = in->rf->num_images;
        return rc;
    }
    int rc;
    if (is_dir) {
        in->kind = "folder";
        if ((rc = walk_root(in, path, &st)))
            return rc;
        qsort(in->paths, (size_t)in->n, sizeof *in->paths, cmp_path);
        if (in->n == 0)
            return pf_err(-ENOENT, "%s: no image files (.jpg .jpeg .png .pgm .ppm .pnm .bmp) below it", path);
        return 0;
    }
    in->kind = "list";
    FILE *f;
    if ((rc = pf_fopen_regular(path, &f)) < 0)
        return pf_err_wrap(rc, "%s", path);
    char line[4096];
    int no = 0;
    rc = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        no++;
        size_t l = strlen(line);
        if (l == sizeof line - 1 && line[l - 1] != '\n') {
            rc = pf_err(-EPROTO, "%s line %d: longer than %zu bytes", path, no, sizeof line - 2);
            break;
        }
        while (l && (line[l - 1] == '\n' || line[l - 1] == '\r'))
            line[--l] = 0;
        if (l == 0)
            continue;
        if (memchr(line, 0, l)) {
            rc = pf_err(-EPROTO, "%s line %d: a NUL byte (not a list of paths)", path, no);
            break;
        }
        if (stat(line, &st) != 0 || !S_ISREG(st.st_mode))
            rc = pf_err(-ENOENT, "%s line %d: no image file '%s'", path, no, line);
        else
            rc = add_path(in, line);
    }
    fclose(f);
    if (!rc && in->n == 0)
        rc = pf_err(-EPROTO, "%s: a list file with no image paths", path);
    return rc;
}

static int input_image(void *arg, int64_t i, eval_image *out)
{
    embed_input *in = arg;
    if (in->bin.img) {
        *out = (eval_image){.data = in->bin.img[i], .len = in->bin.img_len[i]};
        return 0;
    }
    if (in->rf) {
        rec_payload p;
        int rc = rec_get(in->rf, i, &in->scratch, &p);
        if (rc)
            return rc;
        *out = (eval_image){.data = p.image, .len = p.image_len};
        return 0;
    }
    *out = (eval_image){.path = in->paths[i]};
    return 0;
}

static void input_close(embed_input *in)
{
    eval_binset_free(&in->bin);
    rec_close(in->rf);
    rec_buf_free(&in->scratch);
    for (int64_t i = 0; i < in->n && in->paths; i++)
        free(in->paths[i]);
    free(in->paths);
}

int cmd_embed(int argc, char **argv)
{
    eval_embed_opts o = {.batch = 32};
    const char *device = "cpu", *pos[3];
    int npos = 0, k;
    enum { FLIP, PAD, BATCH, DEVICE };
    static const tool_opt opts[] = {{"--flip", 0}, {"--pad", 0}, {"--batch", 1}, {"--device", 1}, {NULL, 0}};
    tool_args a;
    tool_args_init(&a, "embed", opts, argc, argv);
    while ((k = tool_args_next(&a)) != TOOL_END) {
        if (k == FLIP)
            o.flip = 1;
        else if (k == PAD)
            o.pad = 1;
        else if (k == BATCH) {
            if (tool_opt_int(&a, 1, 1024, NULL, &o.batch) < 0)
                return 2;
        } else if (k == DEVICE) {
            if (!a.arg) {
                fprintf(stderr, "pfcps embed: --device needs a device name (cpu, cuda, ...)\n");
                return 2;
            }
            device = a.arg;
        } else if (k == TOOL_UNKNOWN || npos == 3)
            return tool_unexpected(&a, k == TOOL_UNKNOWN ? a.opt : a.arg, NULL);
        else
            pos[npos++] = a.arg;
    }
    if (npos != 3) {
        fprintf(stderr, "pfcps embed: needs CKPT, INPUT and OUT.npy\n");
        return 2;
    }
    const ops_device *dev = ops_device_by_name(device);
    if (!dev) {
        fprintf(stderr, "pfcps embed: --device '%s' is not a device of this build\n", device);
        return 2;
    }
    embed_input in;
    int rc = input_open(&in, pos[1]);
    if (rc) {
        fprintf(stderr, "pfcps embed: %s\n", pf_errmsg());
        input_close(&in);
        return 1;
    }
    model *m = NULL;
    float *emb = NULL, *flip = NULL;
    if ((rc = eval_model_open(&m, pos[0], o.batch, dev)))
        goto fail;
    const model_desc *desc = model_get_desc(m);
    int64_t n = in.bin.img ? 2 * in.bin.n_pairs : in.n;
    size_t count = (size_t)n * (size_t)desc->embedding_size;
    emb = malloc(count * sizeof(float) + 1);
    flip = o.flip ? malloc(count * sizeof(float) + 1) : NULL;
    if (!emb || (o.flip && !flip)) {
        rc = pf_err(-ENOMEM, "out of memory for %" PRId64 " x %d embeddings", n, desc->embedding_size);
        goto fail;
    }
    fprintf(stderr, "pfcps embed: %" PRId64 " images (%s %s) through %s (D %d) on %s, batch %d%s\n", n,
            in.kind, pos[1], desc->name, desc->embedding_size, dev->name, o.batch,
            o.flip ? ", + flipped" : "");
    eval_progress ps = {.what = "pfcps embed", .t0 = pf_now_s()};
    o.progress = eval_progress_stderr;
    o.progress_arg = &ps;
    int64_t refit = 0;
    if ((rc = eval_embed(m, input_image, &in, n, &o, emb, flip, &refit)))
        goto fail;
    if (o.flip)
        for (size_t k = 0; k < count; k++)
            emb[k] += flip[k];
    if ((rc = eval_npy_write_f32(pos[2], emb, n, desc->embedding_size)))
        goto fail;
    printf("wrote %" PRId64 " x %d float32 embeddings to %s (%s)\n", n, desc->embedding_size, pos[2],
           o.flip ? "embedding of the image + of its horizontal flip" : "embedding of the image");
    if (refit)
        printf("note: %" PRId64 " of %" PRId64 " images were not 112x112 and were %s to 112x112\n", refit, n,
               o.pad ? "padded (scaled down only, aspect kept)" : "resized (bilinear)");
    model_free(m);
    free(emb);
    free(flip);
    input_close(&in);
    return 0;
fail:
    fprintf(stderr, "pfcps embed: %s\n", pf_errmsg());
    model_free(m);
    free(emb);
    free(flip);
    input_close(&in);
    return 1;
}
