/* The backbone's export to / load from arcface_torch's state_dict names (safetensors: common/safetensors.h;
 * torch.save files: common/torch_pt.h). */
#include "worker/model/safetensors.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/atomic_file.h"
#include "common/checked.h"
#include "common/err.h"
#include "common/file.h"
#include "common/torch_pt.h"
#include "worker/model/model_internal.h"

/* ---- the backbone ---- */

static int is_nbt(const char *name)
{
    static const char suf[] = ".num_batches_tracked";
    size_t n = strlen(name), s = sizeof suf - 1;
    return n > s && !strcmp(name + n - s, suf);
}

int model_export_safetensors(const model *m, const char *path)
{
    int nt = m->n_tensors, nb = m->n_buffers, nbn = nb / 2; /* running_mean + running_var per BN */
    int n = nt + nb + nbn;
    st_entry *e = calloc((size_t)n, sizeof *e);
    char(*nbt_names)[sizeof m->tensors[0].name + 24] = calloc((size_t)nbn + 1, sizeof *nbt_names);
    float *hp = malloc((m->n_params ? m->n_params : 1) * sizeof(float));
    float *hb = malloc((m->n_buffer_floats ? m->n_buffer_floats : 1) * sizeof(float));
    static const int64_t zero = 0;
    int rc = 0;
    if (!e || !nbt_names || !hp || !hb) {
        rc = pf_err(-ENOMEM, "export %s: out of memory", path);
        goto out;
    }
    if ((rc = model_get_params(m, hp)) || (rc = model_get_buffers(m, hb))) {
        rc = pf_err_wrap(rc, "export %s: reading the model from device %s", path, m->dev->name);
        goto out;
    }
    int k = 0;
    for (int i = 0; i < nt + nb; i++) {
        const model_tensor *t = i < nt ? &m->tensors[i] : &m->buffers_t[i - nt];
        e[k].name = t->name;
        e[k].dtype = "F32";
        e[k].ndim = t->ndim;
        for (int d = 0; d < t->ndim; d++)
            e[k].shape[d] = t->shape[d];
        e[k].data = (i < nt ? hp : hb) + t->offset;
        k++;
    }
    /* one num_batches_tracked per BN, named after its running_mean */
    int j = 0;
    for (int i = 0; i < nb; i++) {
        const char *name = m->buffers_t[i].name;
        const char *suf = strstr(name, ".running_mean");
        if (!suf || suf[13] != '\0')
            continue;
        if (j >= nbn) {
            rc = pf_err(-EINVAL, "export %s: more running_mean buffers than batch norms", path);
            goto out;
        }
        snprintf(nbt_names[j], sizeof nbt_names[j], "%.*s.num_batches_tracked", (int)(suf - name), name);
        e[k].name = nbt_names[j];
        e[k].dtype = "I64";
        e[k].ndim = 0;
        e[k].data = &zero;
        k++;
        j++;
    }
    char dim[32];
    snprintf(dim, sizeof dim, "%d", m->desc.embedding_size);
    st_meta meta[] = {
        {"format", "pt"}, {"producer", "pfcps"}, {"network", m->desc.name}, {"embedding_size", dim}};
    rc = st_write(path, e, k, meta, (int)(sizeof meta / sizeof *meta));
out:
    free(e);
    free(nbt_names);
    free(hp);
    free(hb);
    return rc;
}

static int shape_str(char *buf, size_t cap, int ndim, const int64_t *s64, const int *s32)
{
    size_t at = 0;
    at += (size_t)snprintf(buf, cap, "[");
    for (int k = 0; k < ndim && at < cap; k++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%lld", k ? ", " : "",
                               s64 ? (long long)s64[k] : (long long)s32[k]);
    if (at < cap)
        snprintf(buf + at, cap - at, "]");
    return 0;
}

/* Checks that file tensor s fits model tensor t. */
static int check_fit(const st_tensor *s, const model_tensor *t, const char *path)
{
    if (strcmp(s->dtype, "F32"))
        return pf_err(-EINVAL, "pretrained %s: tensor '%s' is %s, expected F32", path, t->name, s->dtype);
    int same = s->ndim == t->ndim;
    for (int k = 0; same && k < t->ndim; k++)
        same = s->shape[k] == t->shape[k];
    if (!same) {
        char a[128], b[128];
        shape_str(a, sizeof a, s->ndim, s->shape, NULL);
        shape_str(b, sizeof b, t->ndim, NULL, t->shape);
        return pf_err(-EINVAL, "pretrained %s: tensor '%s' has shape %s, the model needs %s", path, t->name,
                      a, b);
    }
    return 0;
}

/* Refuses a non-finite value in any parameter or buffer of m, given their host copies hp and hb: a NaN or
 * an infinity in a pretrained file would otherwise only show as a NaN loss at the first step. Returns 0
 * or -EINVAL naming the file, the tensor and the element. */
static int check_finite(const model *m, const float *hp, const float *hb, const char *path)
{
    for (int i = 0; i < m->n_tensors + m->n_buffers; i++) {
        int is_param = i < m->n_tensors;
        const model_tensor *t = is_param ? &m->tensors[i] : &m->buffers_t[i - m->n_tensors];
        const float *v = (is_param ? hp : hb) + t->offset;
        for (size_t k = 0; k < t->count; k++)
            if (!isfinite(v[k]))
                return pf_err(-EINVAL, "pretrained %s: tensor '%s' element %zu is %s", path, t->name, k,
                              isnan(v[k]) ? "NaN"
                              : v[k] > 0  ? "+Inf"
                                          : "-Inf");
    }
    return 0;
}

/* Loads a backbone file (model.ckpt) as pretrained weights, refusing non-finite values: m is put back as
 * it was when the file holds one. */
static int load_pretrained_ckpt(model *m, const char *path)
{
    size_t np = m->n_params ? m->n_params : 1, nb = m->n_buffer_floats ? m->n_buffer_floats : 1;
    float *hp = malloc(np * sizeof(float)), *hb = malloc(nb * sizeof(float));
    float *was_p = malloc(np * sizeof(float)), *was_b = malloc(nb * sizeof(float));
    int rc = 0;
    if (!hp || !hb || !was_p || !was_b)
        rc = pf_err(-ENOMEM, "pretrained %s: out of memory", path);
    else if ((rc = model_get_params(m, was_p)) || (rc = model_get_buffers(m, was_b)))
        rc = pf_err_wrap(rc, "pretrained %s: reading the model from device %s", path, m->dev->name);
    else if ((rc = model_load(m, path)))
        rc = pf_err_wrap(rc, "pretrained");
    else if ((rc = model_get_params(m, hp)) || (rc = model_get_buffers(m, hb)))
        rc = pf_err_wrap(rc, "pretrained %s: reading back from device %s", path, m->dev->name);
    else if ((rc = check_finite(m, hp, hb, path))) {
        /* the message stays check_finite's: putting the model back does not set one when it works */
        if (model_set_params(m, was_p) || model_set_buffers(m, was_b))
            rc = pf_err_wrap(rc, "pretrained %s: also failed to put the model back", path);
    }
    free(hp);
    free(hb);
    free(was_p);
    free(was_b);
    return rc;
}

int model_load_pretrained(model *m, const char *path)
{
    char magic[9];
    size_t got = 0;
    int rc = pf_read_head(path, magic, sizeof magic, &got);
    if (rc)
        return pf_err_wrap(rc, "pretrained %s", path);
    if (got >= 8 && !memcmp(magic, "PFCPSBB1", 8))
        return load_pretrained_ckpt(m, path);
    /* torch.save's zip archive ("PK\3\4"), or its legacy bare pickle (PROTO 2, LONG1 of the magic number),
     * which torch_pt.c refuses by name; their backbone becomes a safetensors image checked as below. Neither
     * has the '{' a safetensors header starts with at byte 8 (a zip's compression method is there). */
    st_file *f;
    unsigned char *image = NULL;
    if (got == 9 && magic[8] != '{' && (!memcmp(magic, "PK\3\4", 4) || !memcmp(magic, "\x80\x02\x8a\x0a", 4)))
        rc = tp_read_backbone(path, &f, &image);
    else
        rc = st_read(&f, path);
    if (rc)
        return pf_err_wrap(rc, "pretrained");
    int nt = m->n_tensors, nb = m->n_buffers;
    float *hp = malloc((m->n_params ? m->n_params : 1) * sizeof(float));
    float *hb = malloc((m->n_buffer_floats ? m->n_buffer_floats : 1) * sizeof(float));
    if (!hp || !hb) {
        rc = pf_err(-ENOMEM, "pretrained %s: out of memory", path);
        goto out;
    }
    for (int i = 0; i < nt + nb; i++) {
        const model_tensor *t = i < nt ? &m->tensors[i] : &m->buffers_t[i - nt];
        const st_tensor *s = st_find(f, t->name);
        if (!s) {
            rc = pf_err(-EINVAL, "pretrained %s: tensor '%s' missing (network %s, D %d)", path, t->name,
                        m->desc.name, m->desc.embedding_size);
            goto out;
        }
        if ((rc = check_fit(s, t, path)))
            goto out;
        memcpy((i < nt ? hp : hb) + t->offset, s->data, t->count * sizeof(float));
    }
    for (int i = 0; i < st_count(f); i++) {
        const st_tensor *s = st_at(f, i);
        if (is_nbt(s->name))
            continue;
        if (!model_param(m, s->name, NULL) && !model_buffer(m, s->name, NULL)) {
            rc = pf_err(-EINVAL, "pretrained %s: tensor '%s' is not part of network %s", path, s->name,
                        m->desc.name);
            goto out;
        }
    }
    if ((rc = check_finite(m, hp, hb, path)))
        goto out;
    if ((rc = model_set_params(m, hp)) || (rc = model_set_buffers(m, hb)))
        rc = pf_err_wrap(rc, "pretrained %s: writing to device %s", path, m->dev->name);
out:
    free(hp);
    free(hb);
    st_free(f);
    free(image);
    return rc;
}
