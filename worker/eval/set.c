/* Verification sets and the verification of a backbone on one (see set.h). */
#include "worker/eval/set.h"

#include "common/err.h"
#include "common/file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int is_pickle(const char *path)
{
    size_t n = strlen(path);
    if (n >= 4 && strcmp(path + n - 4, ".bin") == 0)
        return 1;
    uint8_t c = 0;
    size_t got = 0;
    return pf_read_head(path, &c, 1, &got) == 0 && got == 1 && c == 0x80;
}

int eval_set_open(eval_set *s, const char *path, const char *images_dir)
{
    memset(s, 0, sizeof *s);
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    snprintf(s->name, sizeof s->name, "%s", base);
    char *dot = strrchr(s->name, '.');
    if (dot && dot != s->name)
        *dot = 0;
    int rc;
    if (is_pickle(path)) {
        s->is_bin = 1;
        if ((rc = eval_binset_load(&s->bin, path)))
            goto fail;
        s->n_pairs = s->bin.n_pairs;
        s->issame = s->bin.issame;
        return 0;
    }
    if (!images_dir) {
        rc = pf_err(-EINVAL, "%s is a pairs file: it needs the image folder (--images DIR)", path);
        goto fail;
    }
    if ((rc = eval_pairs_load(&s->pairs, path, images_dir)))
        goto fail;
    s->n_pairs = s->pairs.n_pairs;
    s->issame = s->pairs.issame;
    return 0;
fail:
    eval_set_free(s);
    return rc;
}

int eval_set_image(void *set, int64_t i, eval_image *out)
{
    const eval_set *s = set;
    if (i < 0 || i >= 2 * s->n_pairs)
        return pf_err(-EINVAL, "image %lld of a set of %lld pairs", (long long)i, (long long)s->n_pairs);
    if (s->is_bin)
        *out = (eval_image){.data = s->bin.img[i], .len = s->bin.img_len[i]};
    else
        *out = (eval_image){.path = s->pairs.paths[i]};
    return 0;
}

void eval_set_free(eval_set *s)
{
    eval_binset_free(&s->bin);
    eval_pairs_free(&s->pairs);
    memset(s, 0, sizeof *s);
}

int eval_verify_model(model *m, const eval_set *s, const eval_embed_opts *o, int folds, eval_result *out,
                      int64_t *n_refit)
{
    eval_embed_opts def = {.batch = 32, .flip = 1};
    if (!o)
        o = &def;
    int d = model_get_desc(m)->embedding_size;
    size_t count = 2 * (size_t)s->n_pairs * (size_t)d;
    float *emb = malloc(count * sizeof(float));
    float *flip = o->flip ? malloc(count * sizeof(float)) : NULL;
    int rc;
    if (!emb || (o->flip && !flip)) {
        rc = pf_err(-ENOMEM, "out of memory for %lld x %d embeddings", (long long)(2 * s->n_pairs), d);
        goto out;
    }
    if ((rc = eval_embed(m, eval_set_image, (void *)s, 2 * s->n_pairs, o, emb, flip, n_refit)))
        goto out;
    rc = eval_verify(emb, flip, s->n_pairs, d, s->issame, folds, out);
out:
    free(emb);
    free(flip);
    return rc;
}

int eval_verify_pixels(const eval_set *s, const eval_embed_opts *o, int folds, eval_result *out,
                       int64_t *n_refit)
{
    eval_embed_opts def = {.batch = 32, .flip = 1};
    if (!o)
        o = &def;
    size_t count = 2 * (size_t)s->n_pairs * EVAL_PIXELS_D;
    float *emb = malloc(count * sizeof(float));
    float *flip = o->flip ? malloc(count * sizeof(float)) : NULL;
    int rc;
    if (!emb || (o->flip && !flip)) {
        rc = pf_err(-ENOMEM, "out of memory for %lld x %d pixel vectors", (long long)(2 * s->n_pairs),
                    EVAL_PIXELS_D);
        goto out;
    }
    if ((rc = eval_pixels(eval_set_image, (void *)s, 2 * s->n_pairs, o, emb, flip, n_refit)))
        goto out;
    rc = eval_verify(emb, flip, s->n_pairs, EVAL_PIXELS_D, s->issame, folds, out);
out:
    free(emb);
    free(flip);
    return rc;
}
