/* pretrained_centers: a new run's class centers from a safetensors file or arcface_torch's
 * checkpoint_gpu_<rank>.pt set (server/centers_load.h). */
#include "server/centers_load.h"

#include "common/torch_ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/file.h"
#include "common/log.h"
#include "common/safetensors.h"
#include "common/torch_pt.h"

/* 0, or -EINVAL naming the first non-finite element of row (file row `frow`, class c). */
static int check_row(const float *row, int dim, const char *file, const char *tensor, int64_t frow, int64_t c)
{
    for (int j = 0; j < dim; j++)
        if (!isfinite(row[j]))
            return pf_err(-EINVAL, "%s: tensor '%s': row %lld (class %lld) element %d is %s: not finite",
                          file, tensor, (long long)frow, (long long)c, j, isnan(row[j]) ? "NaN" : "infinite");
    return 0;
}

static void mark_ready(shard *sh, int64_t lr)
{
    __atomic_store_n(&sh->ready[lr], SHARD_ROW_READY, __ATOMIC_RELEASE);
}

/* ---- safetensors ---- */

/* The tensor of f named a or b (not both), checked C x D F32; NULL with *rc = 0 when neither exists. */
static const st_tensor *st_pick(const st_file *f, const shard *sh, const char *path, const char *a,
                                const char *b, int *rc)
{
    const st_tensor *ta = st_find(f, a), *tb = st_find(f, b);
    *rc = 0;
    if (ta && tb) {
        *rc = pf_err(-EINVAL, "%s: tensors '%s' and '%s' both present: keep one", path, a, b);
        return NULL;
    }
    const st_tensor *t = ta ? ta : tb;
    if (!t)
        return NULL;
    if (strcmp(t->dtype, "F32") != 0)
        *rc = pf_err(-EINVAL, "%s: tensor '%s' has dtype %s, not F32", path, t->name, t->dtype);
    else if (t->ndim != 2 || t->shape[0] != sh->num_classes || t->shape[1] != sh->dim)
        *rc = pf_err(
            -EINVAL,
            "%s: tensor '%s' has shape [%s%lld%s%lld%s], not [%lld, %d] (num_classes x embedding_size)", path,
            t->name, t->ndim > 0 ? "" : "scalar", t->ndim > 0 ? (long long)t->shape[0] : 0LL,
            t->ndim > 1 ? ", " : "", t->ndim > 1 ? (long long)t->shape[1] : 0LL, t->ndim > 2 ? ", ..." : "",
            (long long)sh->num_classes, sh->dim);
    return *rc < 0 ? NULL : t;
}

/* The file mapped read-only (a table of millions of rows is not copied into each server's memory: the page
 * cache holds it once, and a server reads only its rows' pages). */
static int map_file(const char *path, void **map, size_t *size)
{
    struct stat st;
    int fd = pf_open_regular(path, &st);
    if (fd < 0)
        return pf_err_wrap(fd, "%s", path);
    *size = (size_t)st.st_size;
    *map = *size ? mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    int e = errno;
    close(fd);
    if (*size && *map == MAP_FAILED)
        return pf_err(-EIO, "%s: cannot map %zu bytes: %s", path, *size, strerror(e));
    return 0;
}

static int load_safetensors(shard *sh, const char *path)
{
    st_file *f = NULL;
    void *map = NULL;
    size_t size = 0;
    int rc = map_file(path, &map, &size);
    if (rc < 0)
        return rc;
    if ((rc = st_parse(&f, map, size, path)) < 0) {
        if (map)
            munmap(map, size);
        return rc;
    }
    const st_tensor *w = st_pick(f, sh, path, "weight", "centers", &rc);
    const st_tensor *m = NULL;
    if (rc == 0 && !w)
        rc = pf_err(-EINVAL, "%s: no tensor 'weight' (arcface_torch) or 'centers' (pfcps export --centers)",
                    path);
    if (rc == 0)
        m = st_pick(f, sh, path, "momentum", "momentum_buffer", &rc);
    if (rc == 0 && m && sh->adam)
        rc = pf_err(-EINVAL,
                    "%s: tensor '%s' is SGD momentum, but this run has optimizer = adamw (its centers' AdamW "
                    "state starts at zero): give a file with the weights alone",
                    path, m->name);
    const size_t D = (size_t)sh->dim, rb = D * sizeof(float);
    for (int64_t lr = 0; rc == 0 && lr < sh->rows; lr++) {
        int64_t c = lr * sh->servers + sh->rank;
        float *dw = sh->weight + (size_t)lr * D, *dm = sh->momentum + (size_t)lr * D;
        memcpy(dw, w->data + (size_t)c * rb, rb);
        if ((rc = check_row(dw, sh->dim, path, w->name, c, c)) < 0)
            break;
        if (m) {
            memcpy(dm, m->data + (size_t)c * rb, rb);
            if ((rc = check_row(dm, sh->dim, path, m->name, c, c)) < 0)
                break;
        } else {
            memset(dm, 0, rb);
        }
    }
    if (rc == 0)
        log_info("pretrained_centers: %s: rows of shard %d/%d from '%s'%s%s%s", path, sh->rank, sh->servers,
                 w->name, m ? ", momentum from '" : " (momentum 0: no 'momentum' tensor)", m ? m->name : "",
                 m ? "'" : "");
    st_free(f);
    if (map)
        munmap(map, size);
    return rc;
}

/* ---- arcface_torch's checkpoint_gpu_<rank>.pt set ---- */


typedef struct pt_rank {
    tp_file *f;
    const tp_tensor *w, *m; /* the head's weight and momentum (NULL: none) */
    char mname[96];         /* the momentum's path in the pickle */
    int64_t rows, first;    /* rows of w; its first class */
} pt_rank;

/* root[key] as an int, or INT64_MIN when absent or not an int. */
static int64_t pt_int(const tp_file *f, const char *key)
{
    const tp_value *v = tp_find(tp_root(f), key);
    return v && v->kind == TP_INT ? v->u.i : INT64_MIN;
}

/* Logs rank 0's global_step and epoch; a rank file whose global_step or epoch differs from rank 0's is refused
 * (-EINVAL naming both files and values): the set would mix tables of different steps. */
static int check_progress(const pt_rank *R, int W)
{
    static const char *const keys[] = {"global_step", "epoch"};
    int64_t v0[2];
    for (int k = 0; k < 2; k++) {
        v0[k] = pt_int(R[0].f, keys[k]);
        for (int r = 1; r < W; r++) {
            int64_t v = pt_int(R[r].f, keys[k]);
            if (v != v0[k])
                return pf_err(-EINVAL,
                              "%s: %s = %lld, but %s has %lld: the rank files are not from the same step of one "
                              "run",
                              tp_name(R[r].f), keys[k], (long long)v, tp_name(R[0].f), (long long)v0[k]);
        }
    }
    char g[32] = "absent", e[32] = "absent";
    if (v0[0] != INT64_MIN)
        snprintf(g, sizeof g, "%lld", (long long)v0[0]);
    if (v0[1] != INT64_MIN)
        snprintf(e, sizeof e, "%lld", (long long)v0[1]);
    log_info(
        "pretrained_centers: %s: global_step = %s, epoch = %s (the run continues at that step: server/main.c)",
        tp_name(R[0].f), g, e);
    return 0;
}

/* Checks that t is an F32 2-d tensor of `rows` x D (rows < 0: any), naming file and tensor. */
static int pt_check(const tp_file *f, const tp_tensor *t, const char *name, int64_t rows, int dim)
{
    if (t->dtype != TP_F32)
        return pf_err(-EINVAL, "%s: tensor '%s' has dtype %s, not F32", tp_name(f), name,
                      tp_dtype_name(t->dtype));
    if (t->ndim != 2 || t->shape[1] != dim || (rows >= 0 && t->shape[0] != rows)) {
        char shp[160];
        size_t o = 0;
        shp[0] = '\0';
        for (int k = 0; k < t->ndim && o < sizeof shp - 24; k++)
            o += (size_t)snprintf(shp + o, sizeof shp - o, "%s%lld", k ? ", " : "", (long long)t->shape[k]);
        char want[64];
        if (rows >= 0)
            snprintf(want, sizeof want, "%lld", (long long)rows);
        else
            snprintf(want, sizeof want, "rows");
        return pf_err(-EINVAL, "%s: tensor '%s' has shape [%s], not [%s, %d] (embedding_size %d)", tp_name(f),
                      name, shp, want, dim, dim);
    }
    return 0;
}

/* The folder of path (a checkpoint_gpu_<r>.pt) into dir, and W: the highest rank in it + 1. */
static int pt_set_size(const char *path, char *dir, size_t cap, int *W)
{
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (tpc_rank_of(base) < 0)
        return pf_err(-EINVAL,
                      "%s: a torch.save file is read as one of arcface_torch's checkpoint_gpu_<rank>.pt "
                      "(save_all_states); this name is not one",
                      path);
    size_t n = slash ? (size_t)(slash - path) : 0;
    if (n + 2 > cap)
        return pf_err(-EINVAL, "%s: path too long", path);
    if (!slash)
        strcpy(dir, ".");
    else if (n == 0)
        strcpy(dir, "/");
    else {
        memcpy(dir, path, n);
        dir[n] = '\0';
    }
    DIR *dp = opendir(dir);
    if (!dp)
        return pf_err(-errno, "%s: cannot list folder %s: %s", path, dir, strerror(errno));
    *W = 0;
    struct dirent *e;
    while ((e = readdir(dp)) != NULL) {
        int r = tpc_rank_of(e->d_name);
        if (r >= *W)
            *W = r + 1;
    }
    closedir(dp);
    if (*W == 0)
        return pf_err(-ENOENT, "%s: not found in %s", base, dir);
    return 0;
}

/* Opens rank r's file of the set in dir and checks its head tensors (columns, dtype; rows later). */
static int pt_open_rank(const shard *sh, pt_rank *R, int r, int W, const char *dir, const char *path)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/checkpoint_gpu_%d.pt", dir, r);
    struct stat sb;
    if (stat(p, &sb) != 0)
        return pf_err(
            -ENOENT,
            "%s: missing: the set of %s holds checkpoint_gpu_%d.pt, so ranks 0 .. %d must all be there", p,
            path, W - 1, W - 1);
    int rc = tp_open(&R->f, p);
    if (rc < 0)
        return rc;
    const tp_value *root = tp_root(R->f);
    const char *wn = "state_dict_softmax_fc/weight";
    R->w = tp_tensor_of(tp_find(root, wn));
    if (!R->w)
        return pf_err(
            -EINVAL, "%s: no tensor '%s' (arcface_torch's checkpoint_gpu_<rank>.pt, save_all_states)", p, wn);
    if ((rc = tp_tensor_check(R->w, wn, p)) < 0 || (rc = pt_check(R->f, R->w, wn, -1, sh->dim)) < 0)
        return rc;
    R->rows = R->w->shape[0];
    /* The head's momentum: SGD's state of the first parameter of the second group (arcface_torch's
     * module_partial_fc). */
    const tp_value *pv = tp_find(root, "state_optimizer/param_groups/1/params/0");
    if (!pv || pv->kind != TP_INT)
        return 0;
    snprintf(R->mname, sizeof R->mname, "state_optimizer/state/%lld/momentum_buffer", (long long)pv->u.i);
    const tp_value *mv = tp_find(root, R->mname);
    if (!mv)
        return 0;
    R->m = tp_tensor_of(mv);
    if (!R->m)
        return pf_err(-EINVAL, "%s: '%s' is %s, not a tensor", p, R->mname, pk_a_kind(mv));
    if ((rc = tp_tensor_check(R->m, R->mname, p)) < 0 ||
        (rc = pt_check(R->f, R->m, R->mname, R->rows, sh->dim)) < 0)
        return rc;
    return 0;
}

/* The ranks' rows against C and arcface_torch's split; every rank with momentum or none. */
static int pt_check_split(const shard *sh, const pt_rank *R, int W, const char *path, int have_m)
{
    if (have_m != 0 && have_m != W)
        return pf_err(
            -EINVAL,
            "%s: %d of the %d rank files hold the head's momentum_buffer in state_optimizer: all or none",
            path, have_m, W);
    const int64_t C = sh->num_classes, q = C / W, rem = C % W;
    int64_t total = 0;
    for (int r = 0; r < W; r++)
        total += R[r].rows;
    if (total != C) {
        char counts[512];
        size_t o = 0;
        counts[0] = '\0';
        for (int r = 0; r < W && o < sizeof counts - 32; r++)
            o += (size_t)snprintf(counts + o, sizeof counts - o, "%s%lld", r ? " + " : "",
                                  (long long)R[r].rows);
        return pf_err(-EINVAL,
                      "%s: the %d rank files' state_dict_softmax_fc/weight rows add up to %lld (%s), not "
                      "num_classes %lld",
                      path, W, (long long)total, counts, (long long)C);
    }
    for (int r = 0; r < W; r++) {
        int64_t want = q + (r < rem), first = q * r + (r < rem ? r : rem);
        if (R[r].rows != want)
            return pf_err(-EINVAL,
                          "%s: tensor 'state_dict_softmax_fc/weight' has %lld rows, not %lld: rank %d of %d "
                          "holds classes [%lld, %lld) (arcface_torch's split of %lld classes)",
                          tp_name(R[r].f), (long long)R[r].rows, (long long)want, r, W, (long long)first,
                          (long long)(first + want), (long long)C);
    }
    return 0;
}

/* Copies this shard's rows of one rank's tensor t (classes first ..) into dst (weight or momentum), checked
 * finite; reads blocks of blk rows through buf, skipping blocks that hold none of them. */
static int pt_copy(shard *sh, const pt_rank *R, const tp_tensor *t, const char *tn, float *dst, float *buf,
                   int64_t blk)
{
    const size_t D = (size_t)sh->dim, rb = D * sizeof(float);
    const int64_t S = sh->servers;
    for (int64_t r0 = 0; r0 < R->rows; r0 += blk) {
        int64_t n = R->rows - r0 < blk ? R->rows - r0 : blk;
        int64_t c0 = R->first + r0, cfirst = c0 + ((sh->rank - c0 % S) + S) % S;
        if (cfirst >= c0 + n)
            continue;
        int rc = tp_tensor_read_rows(R->f, t, tn, r0, n, buf, (size_t)n * rb);
        if (rc < 0)
            return rc;
        for (int64_t c = cfirst; c < c0 + n; c += S) {
            const float *src = buf + (size_t)(c - c0) * D;
            if ((rc = check_row(src, sh->dim, tp_name(R->f), tn, c - R->first, c)) < 0)
                return rc;
            memcpy(dst + (size_t)(c / S) * D, src, rb);
        }
    }
    return 0;
}

static int load_pt_set(shard *sh, const char *path)
{
    char dir[4096];
    int W = 0;
    int rc = pt_set_size(path, dir, sizeof dir, &W);
    if (rc < 0)
        return rc;
    pt_rank *R = calloc((size_t)W, sizeof *R);
    if (!R)
        return pf_err(-ENOMEM, "out of memory");
    int have_m = 0;
    for (int r = 0; rc == 0 && r < W; r++) {
        rc = pt_open_rank(sh, &R[r], r, W, dir, path);
        R[r].first = r ? R[r - 1].first + R[r - 1].rows : 0;
        have_m += R[r].m != NULL;
    }
    if (rc == 0 && (rc = check_progress(R, W)) == 0)
        rc = pt_check_split(sh, R, W, path, have_m);
    const size_t D = (size_t)sh->dim, rb = D * sizeof(float);
    const int64_t blk = 4096;
    float *buf = rc == 0 ? malloc((size_t)blk * rb) : NULL;
    if (rc == 0 && !buf)
        rc = pf_err(-ENOMEM, "out of memory for %lld rows", (long long)blk);
    for (int r = 0; rc == 0 && r < W; r++) {
        rc = pt_copy(sh, &R[r], R[r].w, "state_dict_softmax_fc/weight", sh->weight, buf, blk);
        if (rc == 0 && R[r].m)
            rc = pt_copy(sh, &R[r], R[r].m, R[r].mname, sh->momentum, buf, blk);
    }
    free(buf);
    if (rc == 0 && !have_m)
        for (int64_t lr = 0; lr < sh->rows; lr++)
            memset(sh->momentum + (size_t)lr * D, 0, rb);
    if (rc == 0)
        log_info("pretrained_centers: %s: rows of shard %d/%d from the %d rank file(s) of %s%s", path,
                 sh->rank, sh->servers, W, dir,
                 have_m ? " with their momentum" : " (momentum 0: none in state_optimizer)");
    for (int r = 0; r < W; r++)
        tp_close(R[r].f);
    free(R);
    return rc;
}

int centers_load(shard *sh, const char *path)
{
    double t0 = pf_now_s();
    unsigned char head[4] = {0};
    size_t got = 0;
    int rc = pf_read_head(path, head, sizeof head, &got);
    if (rc < 0)
        return pf_err_wrap(rc, "%s", path);
    if (got == 4 && memcmp(head, "PK\3\4", 4) == 0 && sh->adam)
        return pf_err(-EINVAL,
                      "%s: an arcface_torch checkpoint_gpu set under optimizer = adamw: continuing its AdamW "
                      "state (exp_avg, exp_avg_sq, step) on the servers is not supported; give a safetensors "
                      "file of the weights alone (the AdamW state then starts at zero)",
                      path);
    if (got == 4 && memcmp(head, "PK\3\4", 4) == 0)
        rc = load_pt_set(sh, path);
    else
        rc = load_safetensors(sh, path);
    if (rc < 0)
        return rc;
    for (int64_t lr = 0; lr < sh->rows; lr++)
        mark_ready(sh, lr);
    log_info("pretrained_centers: %lld rows of shard %d/%d loaded in %.2f s", (long long)sh->rows, sh->rank,
             sh->servers, pf_now_s() - t0);
    return 0;
}
