/* A worker's checkpoint files: see resume.h. */
#include "worker/resume.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
                 int nx, const wresume_state *st, const float *const *arrays, int narrays, size_t nparams)
{
    char mpath[4300], spath[4300];
    ckpt_member_path(root, step, "worker", rank, W, ".model", mpath, sizeof mpath);
    ckpt_member_path(root, step, "worker", rank, W, ".snap", spath, sizeof spath);
    int rc = model_save_ex(m, mpath, x, nx);
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
    snapfile_meta meta = {.rank = rank, .workers = W, .step = step, .rows = (int64_t)nparams};
    snprintf(meta.role, sizeof meta.role, "worker");
    if ((rc = snapfile_commit(&w, &meta)) < 0)
        unlink(mpath);
    return rc;
}

/* Opens the .snap of worker r of W at step and reads its scalars and the .model digest; checks the header. */
static int open_pair(const char *root, int64_t step, int r, int W, snapfile_reader *rd, wresume_state *st,
                     uint8_t md[32], char *mpath, size_t mlen)
{
    char spath[4300];
    ckpt_member_path(root, step, "worker", r, W, ".snap", spath, sizeof spath);
    ckpt_member_path(root, step, "worker", r, W, ".model", mpath, mlen);
    int rc = snapfile_open(rd, spath);
    if (rc < 0)
        return rc;
    const snapfile_meta *m = &rd->m;
    uint32_t n = 0;
    if (strcmp(m->role, "worker"))
        rc = pf_err(-EINVAL, "%s: a '%s' file, not a worker checkpoint", spath, m->role);
    else if (m->step != step || m->rank != r || m->workers != W)
        rc =
            pf_err(-EINVAL, "%s: header says step %lld, worker %d of %d (file name says step %lld, %d of %d)",
                   spath, (long long)m->step, m->rank, m->workers, (long long)step, r, W);
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

int wresume_check(const char *root, int64_t step, int rank, int W, int *src_rank, int *src_W)
{
    (void)W;
    int W0 = 0, rc = worker_files(root, step, &W0);
    if (rc < 0)
        return rc;
    int r = rank % W0;
    snapfile_reader rd;
    wresume_state st;
    uint8_t md[32], have[32];
    char mpath[4300];
    if ((rc = open_pair(root, step, r, W0, &rd, &st, md, mpath, sizeof mpath)) < 0)
        return rc;
    size_t expect = 4 + sizeof(wresume_scalar) * (size_t)st.n + 32;
    if (rd.m.payload_bytes < expect ||
        (rd.m.payload_bytes - expect) % (4 * (uint64_t)(rd.m.rows ? rd.m.rows : 1)))
        rc = pf_err(-EINVAL, "%s: payload of %llu bytes is not scalars + whole arrays of %lld floats",
                    rd.name, (unsigned long long)rd.m.payload_bytes, (long long)rd.m.rows);
    if (rc == 0)
        rc = snapfile_finish(&rd);
    snapfile_close(&rd);
    if (rc == 0 && (rc = pf_file_sha256(mpath, have)) == 0 && memcmp(have, md, 32) != 0)
        rc = pf_err(-EINVAL, "%s: digest does not match the one its .snap recorded (corrupt or replaced)",
                    mpath);
    if (rc == 0) {
        *src_rank = r;
        *src_W = W0;
    }
    return rc;
}

int wresume_load(const char *root, int64_t step, int rank, int W, model *m, wresume_state *st,
                 float *const *arrays, int narrays, size_t nparams)
{
    int r = 0, W0 = 0, rc = wresume_check(root, step, rank, W, &r, &W0);
    if (rc < 0)
        return rc;
    snapfile_reader rd;
    uint8_t md[32];
    char mpath[4300];
    if ((rc = open_pair(root, step, r, W0, &rd, st, md, mpath, sizeof mpath)) < 0)
        return rc;
    if ((size_t)rd.m.rows != nparams)
        rc = pf_err(-EINVAL, "%s: %lld parameters, this backbone has %zu", rd.name, (long long)rd.m.rows,
                    nparams);
    else if (rd.left != (uint64_t)narrays * nparams * 4)
        rc = pf_err(-EINVAL, "%s: holds %llu optimizer arrays, this optimizer needs %d (another optimizer?)",
                    rd.name, (unsigned long long)(rd.left / (nparams > 0 ? nparams * 4 : 1)), narrays);
    for (int a = 0; rc == 0 && a < narrays; a++)
        rc = snapfile_read(&rd, arrays[a], sizeof(float) * nparams);
    if (rc == 0)
        rc = snapfile_finish(&rd);
    snapfile_close(&rd);
    if (rc == 0)
        rc = model_load_ex(m, mpath, NULL, 0, NULL);
    if (rc < 0)
        return rc;
    log_info("loaded checkpoint step %lld: backbone %s, %d optimizer array(s) of %zu, %d scalars",
             (long long)step, mpath, narrays, nparams, st->n);
    return 0;
}

void wresume_prune(const char *root, int rank, int keep, int64_t protect)
{
    (void)protect; /* the step just written is never older than the newest complete ones */
    ckpt_prune(root, "worker", rank, keep);
}
