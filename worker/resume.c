/* A worker's checkpoint files: see resume.h. */
#include "worker/resume.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/checked.h"
#include "common/ckpt.h"
#include "common/err.h"
#include "common/file.h"
#include "common/log.h"
#include "common/snapfile.h"

static wresume_scalar *find(wresume_state *st, const char *name)
{
    for (int i = 0; i < st->n; i++)
        if (!strncmp(st->s[i].name, name, sizeof st->s[i].name))
            return &st->s[i];
    return NULL;
}

void wresume_set_i64(wresume_state *st, const char *name, int64_t v)
{
    wresume_scalar *s = find(st, name);
    if (!s && st->n < WRESUME_MAX_SCALARS) {
        s = &st->s[st->n++];
        memset(s, 0, sizeof *s);
        snprintf(s->name, sizeof s->name, "%s", name);
    }
    if (s)
        s->bits = (uint64_t)v;
}

void wresume_set_f64(wresume_state *st, const char *name, double v)
{
    uint64_t b;
    memcpy(&b, &v, 8);
    wresume_set_i64(st, name, (int64_t)b);
}

int wresume_get_i64(const wresume_state *st, const char *name, int64_t *v)
{
    wresume_scalar *s = find((wresume_state *)st, name);
    if (!s)
        return pf_err(-ENOENT, "worker checkpoint has no scalar '%s'", name);
    *v = (int64_t)s->bits;
    return 0;
}

int wresume_get_f64(const wresume_state *st, const char *name, double *v)
{
    int64_t b;
    int rc = wresume_get_i64(st, name, &b);
    if (rc == 0)
        memcpy(v, &b, 8);
    return rc;
}

int wresume_save(const char *root, int64_t step, int rank, int W, const model *m, const model_extra *x,
                 int nx, const wresume_state *st, const float *const *arrays, int narrays, size_t nparams,
                 const ckpt_ident *id, const snapfile_key *key)
{
    char mpath[4300], spath[4300];
    ckpt_member_path(root, step, "worker", rank, W, ".model", mpath, sizeof mpath);
    ckpt_member_path(root, step, "worker", rank, W, ".snap", spath, sizeof spath);
    if (nx < 0 || nx > MODEL_EXTRAS_MAX - CKPT_IDENT_EXTRAS)
        return pf_err(-EINVAL, "worker checkpoint %s: %d extras (at most %d beside the run identity)", mpath,
                      nx, MODEL_EXTRAS_MAX - CKPT_IDENT_EXTRAS);
    /* The model's extras, then the run identity as extras (names and value bits, common/ckpt.h). */
    model_extra ex[MODEL_EXTRAS_MAX];
    char names[CKPT_IDENT_EXTRAS][32];
    uint64_t bits[CKPT_IDENT_EXTRAS];
    memset(ex, 0, sizeof ex);
    if (nx > 0)
        memcpy(ex, x, sizeof *x * (size_t)nx);
    ckpt_ident_extras(id, names, bits);
    for (int i = 0; i < CKPT_IDENT_EXTRAS; i++) {
        memcpy(ex[nx + i].name, names[i], sizeof ex[nx + i].name);
        memcpy(&ex[nx + i].value, &bits[i], 8);
    }
    int rc = model_save_ex(m, mpath, ex, nx + CKPT_IDENT_EXTRAS);
    if (rc < 0)
        return rc;
    uint8_t md[32];
    if ((rc = pf_file_sha256(mpath, md)) < 0)
        return rc;
    snapfile_writer w;
    if ((rc = snapfile_create(&w, spath, "worker checkpoint")) < 0) {
        unlink(mpath);
        return rc;
    }
    uint32_t n = (uint32_t)st->n;
    rc = snapfile_write(&w, &n, 4);
    if (rc == 0)
        rc = snapfile_write(&w, st->s, sizeof(wresume_scalar) * n);
    if (rc == 0)
        rc = snapfile_write(&w, md, 32);
    for (int a = 0; rc == 0 && a < narrays; a++)
        rc = snapfile_write(&w, arrays[a], sizeof(float) * nparams);
    if (rc < 0) {
        snapfile_abort(&w);
        unlink(mpath); /* half a pair is no checkpoint: do not leave it taking space */
        return rc;
    }
    snapfile_meta meta = {.rank = rank, .workers = W, .step = step, .rows = (int64_t)nparams, .id = *id};
    snprintf(meta.role, sizeof meta.role, "worker");
    if ((rc = snapfile_commit(&w, &meta, key)) < 0)
        unlink(mpath);
    return rc;
}

/* Opens the .snap of worker r of W at step (with key) and reads its scalars and the .model digest; checks the
 * header against the file name. */
static int open_pair(const char *root, int64_t step, int r, int W, const snapfile_key *key,
                     snapfile_reader *rd, wresume_state *st, uint8_t md[32], char *mpath, size_t mlen)
{
    char spath[4300];
    ckpt_member_path(root, step, "worker", r, W, ".snap", spath, sizeof spath);
    ckpt_member_path(root, step, "worker", r, W, ".model", mpath, mlen);
    int rc = snapfile_open(rd, spath, key);
    if (rc < 0)
        return rc;
    uint32_t n = 0;
    rc = snapfile_check_member(&rd->m, spath, "worker", step, r, W);
    if (rc == 0)
        rc = snapfile_read(rd, &n, 4);
    if (rc == 0 && n > WRESUME_MAX_SCALARS)
        rc = pf_err(-EINVAL, "%s: %u scalars (at most %d)", spath, n, WRESUME_MAX_SCALARS);
    if (rc == 0) {
        st->n = (int)n;
        rc = snapfile_read(rd, st->s, sizeof(wresume_scalar) * n);
    }
    for (uint32_t i = 0; rc == 0 && i < n; i++)
        if (memchr(st->s[i].name, '\0', sizeof st->s[i].name) == NULL)
            rc = pf_err(-EINVAL, "%s: scalar %u's name is not terminated", spath, i);
    if (rc == 0)
        rc = snapfile_read(rd, md, 32);
    if (rc < 0)
        snapfile_close(rd);
    return rc;
}

/* The writers' count W0 of checkpoint step's worker files (all must agree and all be present). */
static int worker_files(const char *root, int64_t step, int *W0)
{
    int count = 0, of = 0;
    if (ckpt_scan_members(root, step, "worker", ".snap", &count, &of, NULL, 0) < 0 || count == 0)
        return pf_err(-ENOENT, "checkpoint step %lld: no worker file under %s", (long long)step, root);
    if (of < 0)
        return pf_err(-EINVAL, "checkpoint step %lld: worker files of different worker counts",
                      (long long)step);
    *W0 = of;
    return 0;
}

/* Checks the .model at mpath against its .snap (spath, header m): its digest is the recorded one and its
 * identity extras are the .snap header's. */
static int pair_check(const char *spath, const snapfile_meta *m, const char *mpath,
                      const uint8_t recorded[32])
{
    uint8_t md[32];
    ckpt_ident mid;
    char diff[400];
    int rc = pf_file_sha256(mpath, md);
    if (rc < 0)
        return rc;
    if (memcmp(md, recorded, 32) != 0)
        return pf_err(-EINVAL, "%s: digest does not match the one its .snap recorded (corrupt or replaced)",
                      mpath);
    if ((rc = model_file_ident(mpath, &mid, NULL, NULL)) < 0)
        return rc;
    if (ckpt_ident_diff(&mid, &m->id, diff, sizeof diff) != 0)
        return pf_err(-EINVAL, "%s: its identity extras differ from %s's header: %s (.model vs .snap)", mpath,
                      spath, diff);
    return 0;
}

int wresume_check(const char *root, int64_t step, int rank, int W, const snapfile_key *key, int *src_rank,
                  int *src_W, ckpt_ident *id)
{
    (void)W;
    int W0 = 0, rc = worker_files(root, step, &W0);
    if (rc < 0)
        return rc;
    int r = rank % W0;
    snapfile_reader rd;
    wresume_state st;
    uint8_t md[32];
    char mpath[4300];
    if ((rc = open_pair(root, step, r, W0, key, &rd, &st, md, mpath, sizeof mpath)) < 0)
        return rc;
    /* payload: scalars, the .model digest, then whole arrays of rows floats */
    uint64_t expect = 4 + sizeof(wresume_scalar) * (uint64_t)st.n + 32, array = 0;
    if (pf_mul_u64((uint64_t)rd.m.rows, sizeof(float), &array) < 0 || rd.m.payload_bytes < expect ||
        (rd.m.payload_bytes - expect) % (array ? array : 1))
        rc = pf_err(
            -EINVAL,
            "%s: header field payload_bytes = %llu is not the scalars + whole arrays of rows = %lld floats",
            rd.name, (unsigned long long)rd.m.payload_bytes, (long long)rd.m.rows);
    if (rc == 0)
        rc = snapfile_finish(&rd);
    const snapfile_meta m = rd.m;
    char spath[sizeof rd.name];
    snprintf(spath, sizeof spath, "%s", rd.name);
    snapfile_close(&rd);
    if (rc == 0)
        rc = pair_check(spath, &m, mpath, md);
    if (rc == 0) {
        *src_rank = r;
        *src_W = W0;
        *id = m.id;
    }
    return rc;
}

int wresume_load(const char *root, int64_t step, int rank, int W, const snapfile_key *key,
                 const ckpt_ident *expect, model *m, wresume_state *st, float *const *arrays, int narrays,
                 size_t nparams)
{
    int r = 0, W0 = 0;
    ckpt_ident id;
    char diff[400];
    int rc = wresume_check(root, step, rank, W, key, &r, &W0, &id);
    if (rc < 0)
        return rc;
    snapfile_reader rd;
    uint8_t md[32];
    char mpath[4300];
    if ((rc = open_pair(root, step, r, W0, key, &rd, st, md, mpath, sizeof mpath)) < 0)
        return rc;
    uint64_t need = 0;
    if (expect && ckpt_ident_diff(&rd.m.id, expect, diff, sizeof diff) != 0)
        rc = pf_err(-EINVAL, "%s: not this run's file: header fields %s (file vs the resumed run)", rd.name,
                    diff);
    else if ((size_t)rd.m.rows != nparams)
        rc = pf_err(-EINVAL, "%s: %lld parameters, this backbone has %zu", rd.name, (long long)rd.m.rows,
                    nparams);
    else if (pf_mul3_u64((uint64_t)narrays, nparams, sizeof(float), &need) < 0 || rd.left != need)
        rc = pf_err(-EINVAL, "%s: holds %llu optimizer arrays, this optimizer needs %d (another optimizer?)",
                    rd.name, (unsigned long long)(rd.left / (nparams > 0 ? nparams * 4 : 1)), narrays);
    for (int a = 0; rc == 0 && a < narrays; a++)
        rc = snapfile_read(&rd, arrays[a], sizeof(float) * nparams);
    if (rc == 0)
        rc = snapfile_finish(&rd);
    snapfile_close(&rd);
    /* The .model again, through the model's own checks and the recorded digest; its identity extras must still
     * be the pair's. */
    model_extra ex[MODEL_EXTRAS_MAX];
    char names[MODEL_EXTRAS_MAX][32];
    uint64_t bits[MODEL_EXTRAS_MAX];
    int nx = 0;
    ckpt_ident mid;
    if (rc == 0) /* the bytes whose digest the .snap recorded, read once */
        rc = model_load_digest(m, mpath, md, ex, MODEL_EXTRAS_MAX, &nx);
    for (int i = 0; rc == 0 && i < nx; i++) {
        memcpy(names[i], ex[i].name, 32);
        memcpy(&bits[i], &ex[i].value, 8);
    }
    if (rc == 0 && (rc = ckpt_ident_from_extras((const char(*)[32])names, bits, nx, &mid)) < 0)
        rc = pf_err_wrap(rc, "%s", mpath);
    if (rc == 0 && ckpt_ident_diff(&mid, &id, diff, sizeof diff) != 0)
        rc = pf_err(-EINVAL, "%s: replaced while loading: identity extras %s (.model vs .snap)", mpath, diff);
    if (rc < 0)
        return rc;
    log_info("loaded checkpoint step %lld: backbone %s, %d optimizer array(s) of %zu, %d scalars",
             (long long)step, mpath, narrays, nparams, st->n);
    return 0;
}

void wresume_prune(const char *root, int rank, int keep, const ckpt_ident *run)
{
    ckpt_prune(root, "worker", rank, keep, run);
}
