/* Shard snapshots: see snapshot.h. */
#include "server/snapshot.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/checked.h"
#include "common/ckpt.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/snapfile.h"

/* Block states. */
enum { B_PENDING = 0, B_COPYING = 1, B_SAVED = 2, B_ASIDE = 3 };

struct snap_job {
    shard *sh;
    int64_t step, block_rows, nblocks;
    _Atomic uint8_t *state; /* [nblocks] */
    void **aside;           /* [nblocks]: copies made by apply threads, until the writer saves them */
    atomic_int aside_failed;
    atomic_llong aside_count;
    char path[4200];
    pthread_t th;
    atomic_int done;
    atomic_llong rows_done; /* rows saved so far (snap_progress) */
    int64_t file_bytes;     /* size of the committed file */
    int rc;
    char err[512];
    double t0, seconds;
    int throttle_ms; /* PFCPS_SNAPSHOT_THROTTLE_MS: a pause per block, so tests can push during the write */
    ckpt_ident id;   /* the run identity the file carries */
    int dense;       /* pfc_update = dense: rows as stored plus each row's step; the lr of every step */
    int adam;        /* optimizer = adamw: each row's two moments; AdamW's constants and the lr of every step */
    double *lr; /* dense or adam: [step]: the lr of steps 0 .. step-1 (shard.step_lr as it stood at snap_start) */
    int keyed;  /* the file carries an HMAC under key */
    snapfile_key key;
};

/* Rows of block b. */
static int64_t block_n(const snap_job *j, int64_t b)
{
    int64_t lo = b * j->block_rows, hi = lo + j->block_rows;
    return (hi > j->sh->rows ? j->sh->rows : hi) - lo;
}

/* Payload bytes of n rows: n x D weights and n x D momentum (fp32; AdamW: n x D weights, first and second
 * moments), and in a dense file n row steps (int64). */
static size_t rows_bytes(int64_t n, int dim, int dense, int adam)
{
    return (size_t)n * ((size_t)dim * (adam ? 3 : 2) * sizeof(float) + (dense ? sizeof(int64_t) : 0));
}

/* Copies block b of the table into dst (rows_bytes of its rows): n x D weights, then n x D momentum (AdamW:
 * n x D first moments, then n x D second moments), then (dense) n row steps (shard.rstep), all as stored: a
 * dense row is not brought up to date (readers do that, with the file's lr table). A row never generated gets
 * its initial value (and zero momentum / moments) in dst only. */
static void copy_block(const snap_job *j, int64_t b, void *dst)
{
    const shard *sh = j->sh;
    const size_t D = (size_t)sh->dim;
    const int64_t n = block_n(j, b), r0 = b * j->block_rows;
    float *dw = dst, *dv = (float *)dst + (size_t)n * D, *dq = (float *)dst + 2 * (size_t)n * D;
    for (int64_t k = 0; k < n; k++) {
        int64_t r = r0 + k;
        if (shard_row_ready(sh, r)) {
            memcpy(dw + (size_t)k * D, sh->weight + (size_t)r * D, D * sizeof(float));
            memcpy(dv + (size_t)k * D, sh->momentum + (size_t)r * D, D * sizeof(float));
            if (j->adam)
                memcpy(dq + (size_t)k * D, sh->sq + (size_t)r * D, D * sizeof(float));
        } else {
            shard_init_row(sh->seed, r * sh->servers + sh->rank, sh->dim, dw + (size_t)k * D);
            memset(dv + (size_t)k * D, 0, D * sizeof(float));
            if (j->adam)
                memset(dq + (size_t)k * D, 0, D * sizeof(float));
        }
    }
    if (j->dense)
        memcpy((char *)dst + rows_bytes(n, sh->dim, 0, j->adam), sh->rstep + r0, sizeof(int64_t) * (size_t)n);
}

void snap_before_update(snap_job *j, int64_t lrow)
{
    int64_t b = lrow / j->block_rows;
    uint8_t s = atomic_load_explicit(&j->state[b], memory_order_acquire);
    if (s >= B_SAVED)
        return;
    uint8_t expect = B_PENDING;
    if (s == B_PENDING && atomic_compare_exchange_strong_explicit(
                              &j->state[b], &expect, B_COPYING, memory_order_acq_rel, memory_order_acquire)) {
        void *p = malloc(rows_bytes(block_n(j, b), j->sh->dim, j->dense, j->adam));
        if (p)
            copy_block(j, b, p);
        else
            atomic_store(&j->aside_failed, 1);
        j->aside[b] = p;
        atomic_fetch_add(&j->aside_count, 1);
        atomic_store_explicit(&j->state[b], B_ASIDE, memory_order_release);
        return;
    }
    while (atomic_load_explicit(&j->state[b], memory_order_acquire) < B_SAVED)
        sched_yield();
}

static void *writer_main(void *arg)
{
    snap_job *j = arg;
    shard *sh = j->sh;
    const size_t D = (size_t)sh->dim;
    void *buf = malloc(rows_bytes(j->block_rows, sh->dim, j->dense, j->adam));
    snapfile_writer w;
    int rc = buf ? snapfile_create(&w, j->path, "snapshot") : pf_err(-ENOMEM, "snapshot: out of memory");
    const int created = rc == 0;
    int writing = created;
    if (writing && (j->dense || j->adam)) { /* the prefix: mu, wd (AdamW: beta1, beta2, eps, wd), the lr of
                                               * steps 0 .. step-1 */
        const double mw[4] = {j->adam ? sh->hp.b1 : sh->mu, j->adam ? sh->hp.b2 : sh->wd, sh->hp.eps, sh->hp.wd};
        if ((rc = snapfile_write(&w, mw, sizeof(double) * (j->adam ? 4 : 2))) < 0 ||
            (j->step > 0 && (rc = snapfile_write(&w, j->lr, sizeof(double) * (size_t)j->step)) < 0))
            writing = 0;
    }
    double t_log = j->t0;
    int64_t rows_done = 0;
    for (int64_t b = 0; b < j->nblocks; b++) {
        const void *src = NULL;
        uint8_t expect = B_PENDING;
        if (atomic_compare_exchange_strong_explicit(&j->state[b], &expect, B_COPYING, memory_order_acq_rel,
                                                    memory_order_acquire)) {
            if (buf)
                copy_block(j, b, buf);
            src = buf;
            atomic_store_explicit(&j->state[b], B_SAVED, memory_order_release);
        } else {
            while (atomic_load_explicit(&j->state[b], memory_order_acquire) == B_COPYING)
                sched_yield();
            src = j->aside[b];
        }
        int64_t n = block_n(j, b);
        if (writing && !src) {
            rc =
                pf_err(-ENOMEM, "snapshot %s: out of memory copying block %lld aside", j->path, (long long)b);
            writing = 0;
        }
        if (writing && (rc = snapfile_write(&w, src, rows_bytes(n, sh->dim, j->dense, j->adam))) < 0)
            writing = 0;
        if (src != buf) {
            free(j->aside[b]);
            j->aside[b] = NULL;
        }
        rows_done += n;
        atomic_store_explicit(&j->rows_done, rows_done, memory_order_relaxed);
        double now = pf_now_s();
        if (writing && now - t_log >= 2.0) {
            log_info("snapshot step %lld: %lld/%lld rows written, %.1f MB/s", (long long)j->step,
                     (long long)rows_done, (long long)sh->rows,
                     (double)rows_done * (j->adam ? 12.0 : 8.0) * (double)D / 1e6 / (now - j->t0));
            t_log = now;
        }
        if (j->throttle_ms > 0) {
            struct timespec ts = {j->throttle_ms / 1000, (long)(j->throttle_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    if (writing) {
        snapfile_meta m = {.rank = sh->rank,
                           .servers = sh->servers,
                           .dim = sh->dim,
                           .num_classes = sh->num_classes,
                           .step = j->step,
                           .rows = sh->rows,
                           .block_rows = j->block_rows,
                           .id = j->id,
                           .dense = j->dense,
                           .adamw = j->adam};
        snprintf(m.role, sizeof m.role, "shard");
        rc = snapfile_commit(&w, &m, j->keyed ? &j->key : NULL);
        struct stat st;
        if (rc == 0 && stat(j->path, &st) == 0)
            j->file_bytes = (int64_t)st.st_size;
    } else if (created) {
        snapfile_abort(&w);
    }
    if (rc < 0)
        snprintf(j->err, sizeof j->err, "%s", pf_errmsg());
    free(buf);
    j->rc = rc;
    j->seconds = pf_now_s() - j->t0;
    atomic_store(&j->done, 1);
    return NULL;
}

static int mkdir_p(const char *path)
{
    char buf[4200];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            mkdir(buf, 0755);
            *p = '/';
        }
    }
    if (mkdir(buf, 0755) < 0 && errno != EEXIST)
        return pf_err(-errno, "cannot create snapshot folder '%s': %s", path, strerror(errno));
    return 0;
}

int snap_start(shard *sh, const char *root, int64_t step, const ckpt_ident *id, const snapfile_key *key,
               snap_job **out)
{
    *out = NULL;
    char dir[4200];
    ckpt_step_dir(root, step, dir, sizeof dir);
    int rc = mkdir_p(dir);
    if (rc < 0)
        return rc;
    snap_job *j = calloc(1, sizeof *j);
    if (!j)
        return pf_err(-ENOMEM, "snapshot: out of memory");
    j->sh = sh;
    j->step = step;
    j->id = *id;
    j->keyed = key != NULL;
    if (key)
        j->key = *key;
    /* ~1 MiB of weights per block. */
    j->block_rows = (1 << 20) / ((int64_t)sh->dim * 4);
    if (j->block_rows > sh->rows) /* one block of every row (readers refuse block_rows > rows) */
        j->block_rows = sh->rows;
    if (j->block_rows < 1)
        j->block_rows = 1;
    j->nblocks = (sh->rows + j->block_rows - 1) / j->block_rows;
    j->state = calloc((size_t)(j->nblocks ? j->nblocks : 1), sizeof(*j->state));
    j->aside = calloc((size_t)(j->nblocks ? j->nblocks : 1), sizeof(void *));
    j->dense = sh->dense;
    j->adam = sh->adam;
    if (j->dense || j->adam) { /* the lr table as it stands now: the apply threads may grow (move) step_lr */
        j->lr = malloc(sizeof(double) * (size_t)(step > 0 ? step : 1));
        for (int64_t t = 0; j->lr && t < step; t++)
            j->lr[t] = t < sh->lr_cap ? sh->step_lr[t] : NAN;
    }
    const char *thr = getenv("PFCPS_SNAPSHOT_THROTTLE_MS");
    j->throttle_ms = thr ? atoi(thr) : 0;
    ckpt_member_path(root, step, "shard", sh->rank, sh->servers, ".snap", j->path, sizeof j->path);
    j->t0 = pf_now_s();
    if (!j->state || !j->aside || ((j->dense || j->adam) && !j->lr) || pthread_create(&j->th, NULL, writer_main, j) != 0) {
        free(j->state);
        free(j->aside);
        free(j->lr);
        free(j);
        return pf_err(-ENOMEM, "snapshot: cannot start the writer");
    }
    log_info("snapshot step %lld: writing %lld rows (%.1f MB) to %s while serving", (long long)step,
             (long long)sh->rows, (double)sh->rows * (j->adam ? 12.0 : 8.0) * sh->dim / 1e6, j->path);
    *out = j;
    return 0;
}

int snap_done(const snap_job *j)
{
    return atomic_load(&((snap_job *)j)->done);
}

int64_t snap_step(const snap_job *j)
{
    return j->step;
}

double snap_progress(const snap_job *j)
{
    if (j->sh->rows <= 0)
        return 1.0;
    return (double)atomic_load_explicit(&((snap_job *)j)->rows_done, memory_order_relaxed) /
           (double)j->sh->rows;
}

int snap_finish(snap_job *j)
{
    return snap_finish_ex(j, NULL);
}

int snap_finish_ex(snap_job *j, snap_outcome *out)
{
    pthread_join(j->th, NULL);
    if (out)
        *out =
            (snap_outcome){.step = j->step, .seconds = j->seconds, .bytes = j->rc == 0 ? j->file_bytes : 0};
    int rc = j->rc;
    if (rc == 0)
        log_info("snapshot step %lld written: %lld rows in %.2f s (%.1f MB/s), %lld blocks copied aside by "
                 "pushes during the write",
                 (long long)j->step, (long long)j->sh->rows, j->seconds,
                 j->seconds > 0 ? (double)j->sh->rows * (j->adam ? 12.0 : 8.0) * j->sh->dim / 1e6 / j->seconds : 0.0,
                 (long long)atomic_load(&j->aside_count));
    else
        log_error("snapshot step %lld failed: %s (earlier snapshots are untouched; serving on)",
                  (long long)j->step, j->err);
    if (rc < 0)
        pf_err(rc, "%s", j->err);
    for (int64_t b = 0; b < j->nblocks; b++)
        free(j->aside[b]);
    free(j->aside);
    free(j->state);
    free(j->lr);
    free(j);
    return rc;
}

void snap_prune(const char *root, int rank, int keep, const ckpt_ident *run)
{
    ckpt_prune(root, "shard", rank, keep, run);
}

/* The S0 of checkpoint `step`'s shard files, checking that all S0 are present. */
static int shard_files(const char *root, int64_t step, int *old_servers)
{
    int count = 0, of = 0;
    if (ckpt_scan_members(root, step, "shard", ".snap", &count, &of, NULL, 0) < 0)
        return pf_err(-ENOENT, "checkpoint step %lld: no folder under %s", (long long)step, root);
    if (count == 0)
        return pf_err(-ENOENT, "checkpoint step %lld: no shard file under %s", (long long)step, root);
    if (of < 0)
        return pf_err(-EINVAL, "checkpoint step %lld: shard files of different server counts",
                      (long long)step);
    if (count != of) {
        uint8_t *seen = calloc((size_t)of, 1);
        int missing = -1;
        if (seen) {
            ckpt_scan_members(root, step, "shard", ".snap", &count, &of, seen, of);
            for (int s = 0; s < of && missing < 0; s++)
                if (!seen[s])
                    missing = s;
        }
        free(seen);
        return pf_err(-ENOENT, "checkpoint step %lld: %d of %d shard files (shard-%d-of-%d.snap missing)",
                      (long long)step, count, of, missing, of);
    }
    *old_servers = of;
    return 0;
}

/* Checks a shard file's header (its fields already checked against each other by snapfile_open) against its
 * name and the run (C, D). */
static int check_meta(const snapfile_meta *m, const char *path, int64_t step, int s, int S0, int64_t C, int D)
{
    int rc = snapfile_check_member(m, path, "shard", step, s, S0);
    if (rc < 0)
        return rc;
    if (m->num_classes != C || m->dim != D)
        return pf_err(-EINVAL,
                      "%s: written for C=%lld D=%d (header fields num_classes, embedding_size), this run has "
                      "C=%lld D=%d",
                      path, (long long)m->num_classes, m->dim, (long long)C, D);
    return 0;
}

/* Checks that shard file `path` carries identity *ref (ref_what names whose: "<first shard file>'s"). */
static int check_ident(const snapfile_meta *m, const char *path, const ckpt_ident *ref, const char *ref_what)
{
    char diff[400];
    if (ckpt_ident_diff(&m->id, ref, diff, sizeof diff) == 0)
        return 0;
    return pf_err(-EINVAL, "%s: another run's file: header fields %s (this vs %s)", path, diff, ref_what);
}

int snap_check(const char *root, int64_t step, int64_t num_classes, int dim, const snapfile_key *key,
               int *old_servers, ckpt_ident *id)
{
    int S0 = 0, rc = shard_files(root, step, &S0);
    ckpt_ident ref;
    char ref_path[4400] = "";
    for (int s = 0; rc == 0 && s < S0; s++) {
        char p[4300];
        snapfile_meta m;
        ckpt_member_path(root, step, "shard", s, S0, ".snap", p, sizeof p);
        rc = snapfile_verify(p, key, &m);
        if (rc == 0)
            rc = check_meta(&m, p, step, s, S0, num_classes, dim);
        if (rc == 0 && s == 0) {
            ref = m.id;
            snprintf(ref_path, sizeof ref_path, "%s's", p);
        } else if (rc == 0) {
            rc = check_ident(&m, p, &ref, ref_path);
        }
    }
    if (rc == 0) {
        *old_servers = S0;
        *id = ref;
    }
    return rc;
}

/* Reads a dense or AdamW file's prefix (mu, wd; AdamW: beta1, beta2, eps, wd; then the lr of steps 0 ..
 * step-1) into mw (nconst doubles) and *lr (allocated; the first such file's) or, when *lr is set already,
 * checks that this file's equals it (every server records the lr every worker pushed: they agree). */
static int read_dense_prefix(snapfile_reader *r, const char *p, int64_t step, double *mw, int nconst,
                             double **lr, const char *first)
{
    int rc = snapfile_read(r, mw, (size_t)nconst * sizeof(double));
    double *x = rc == 0 ? malloc(sizeof(double) * (size_t)(step > 0 ? step : 1)) : NULL;
    if (rc == 0 && !x)
        rc = pf_err(-ENOMEM, "%s: out of memory for the lr of %lld steps", p, (long long)step);
    if (rc == 0 && step > 0)
        rc = snapfile_read(r, x, sizeof(double) * (size_t)step);
    if (rc == 0 && *lr && memcmp(x, *lr, sizeof(double) * (size_t)step) != 0)
        rc = pf_err(-EINVAL, "%s: its lr table (dense update) differs from %s", p, first);
    if (rc == 0 && !*lr) {
        *lr = x;
        return 0;
    }
    free(x);
    return rc;
}

/* What snap_load keeps across the files of a checkpoint: the lr table of the first dense or AdamW file and how
 * its rows are brought up to date with `step` at the load (only when this shard cannot go on from them lazily:
 * a sparse shard, or other constants than the file's). */
typedef struct load_ctx {
    double *flr, mw[4];    /* the lr table; mu, wd (AdamW: beta1, beta2, eps, wd) */
    int catchup, fdense;   /* rows brought up to date here; some file was dense */
    int have_dc;           /* dc set up (SGD dense files brought up to date) */
    dense_cache dc;
    adamw_coef *fco;       /* AdamW files brought up to date: each step's scalars from the file's table */
    adamw_hp fhp;          /* the AdamW file's constants */
    char lr_what[4400];    /* the file the lr table came from */
} load_ctx;

/* Checks that file p (reader r, its header read) holds this shard's optimizer state, and reads its prefix (dense
 * or AdamW files) into L, preparing the catch-up. Returns 0 or a negative code naming the file. */
static int load_prefix(const shard *sh, snapfile_reader *r, const char *p, int64_t step, load_ctx *L)
{
    const int dense = r->m.dense, adam = r->m.adamw;
    int rc = 0;
    L->fdense |= dense;
    if (adam != sh->adam)
        return pf_err(-EINVAL,
                      "%s: written under optimizer = %s (header field adamw = %d), but this run has optimizer = "
                      "%s: the class centers' optimizer state cannot carry over; resume with the optimizer "
                      "that wrote the checkpoint",
                      p, adam ? "adamw" : "sgd", adam, sh->adam ? "adamw" : "sgd");
    if (!adam && !dense)
        return 0;
    if (!L->flr)
        snprintf(L->lr_what, sizeof L->lr_what, "%s's", p);
    if ((rc = read_dense_prefix(r, p, step, L->mw, adam ? 4 : 2, &L->flr, L->lr_what)) < 0)
        return rc;
    if (adam) {
        L->fhp = (adamw_hp){L->mw[0], L->mw[1], L->mw[2], L->mw[3]};
        L->catchup = dense && (!sh->dense || memcmp(&L->fhp, &sh->hp, sizeof L->fhp) != 0);
        if (L->catchup && !L->fco) {
            L->fco = malloc(sizeof(adamw_coef) * (size_t)(step > 0 ? step : 1));
            if (!L->fco)
                return pf_err(-ENOMEM, "%s: out of memory for the AdamW scalars of %lld steps", p, (long long)step);
            if (step > 0)
                adamw_coefs(&L->fhp, L->flr, 0, step - 1, 0, L->fco);
        }
        return 0;
    }
    L->catchup = !sh->dense || L->mw[0] != sh->mu || L->mw[1] != sh->wd;
    if (L->catchup && !L->have_dc) {
        if (dense_cache_init(&L->dc, sh->dim) < 0)
            return pf_err(-ENOMEM, "%s: out of memory", p);
        L->have_dc = 1;
    }
    return 0;
}

int snap_load(shard *sh, const char *root, int64_t step, const snapfile_key *key, const ckpt_ident *expect)
{
    int S0 = 0, rc = shard_files(root, step, &S0);
    if (rc < 0)
        return rc;
    const size_t D = (size_t)sh->dim;
    int64_t loaded = 0;
    double t0 = pf_now_s();
    ckpt_ident ref;
    char ref_what[4400] = "the resumed run's";
    int have_ref = expect != NULL;
    if (expect)
        ref = *expect;
    load_ctx L;
    memset(&L, 0, sizeof L);
    for (int s0 = 0; rc == 0 && s0 < S0; s0++) {
        if (S0 == sh->servers && s0 != sh->rank)
            continue; /* same shape: only this rank's own file holds its rows */
        char p[4300];
        ckpt_member_path(root, step, "shard", s0, S0, ".snap", p, sizeof p);
        snapfile_reader r;
        if ((rc = snapfile_open(&r, p, key)) < 0)
            break;
        rc = check_meta(&r.m, p, step, s0, S0, sh->num_classes, sh->dim);
        if (rc == 0 && have_ref) {
            rc = check_ident(&r.m, p, &ref, ref_what);
        } else if (rc == 0) {
            ref = r.m.id;
            have_ref = 1;
            snprintf(ref_what, sizeof ref_what, "%s's", p);
        }
        const int dense = r.m.dense, adam = r.m.adamw;
        if (rc == 0)
            rc = load_prefix(sh, &r, p, step, &L);
        /* One block in memory: block_rows rows (bounded by snapfile_check_fields). */
        const size_t block = rc == 0 ? rows_bytes(r.m.block_rows, sh->dim, dense, adam) : 0;
        void *buf = rc == 0 ? malloc(block) : NULL;
        if (rc == 0 && !buf)
            rc = pf_err(-ENOMEM, "%s: out of memory for a block of %zu bytes", p, block);
        for (int64_t r0 = 0; rc == 0 && r0 < r.m.rows; r0 += r.m.block_rows) {
            int64_t n = r.m.rows - r0 < r.m.block_rows ? r.m.rows - r0 : r.m.block_rows;
            if ((rc = snapfile_read(&r, buf, rows_bytes(n, sh->dim, dense, adam))) < 0)
                break;
            const float *bw = buf, *bv = (const float *)buf + (size_t)n * D,
                        *bq = (const float *)buf + 2 * (size_t)n * D;
            const int64_t *bs =
                (const int64_t *)(const void *)((const char *)buf + rows_bytes(n, sh->dim, 0, adam));
            for (int64_t k = 0; rc == 0 && k < n; k++) {
                int64_t c = (r0 + k) * S0 + s0;
                if (c % sh->servers != sh->rank)
                    continue;
                int64_t lr = c / sh->servers;
                float *w = sh->weight + (size_t)lr * D, *v = sh->momentum + (size_t)lr * D;
                memcpy(w, bw + (size_t)k * D, D * sizeof(float));
                memcpy(v, bv + (size_t)k * D, D * sizeof(float));
                float *q = adam ? sh->sq + (size_t)lr * D : NULL;
                if (adam)
                    memcpy(q, bq + (size_t)k * D, D * sizeof(float));
                int64_t rs = step; /* a sparse file's rows, and a dense file's brought up to date here */
                if (dense && bs[k] < 0) { /* above step: a global-mode row a faster worker pushed; kept */
                    rc = pf_err(-EINVAL, "%s: class %lld: its row step %lld is negative", p, (long long)c,
                                (long long)bs[k]);
                    break;
                }
                if (adam && dense && L.catchup) { /* the zero-gradient steps it owes, with the file's constants */
                    if (bs[k] < step)
                        adamw_replay(w, v, q, sh->dim, &L.fhp, L.fco, bs[k], step - 1);
                } else if (dense && L.catchup) {
                    dense_map M;
                    if (!dense_cache_get(&L.dc, L.flr, bs[k], step - 1, L.mw[0], L.mw[1], &M))
                        dense_apply_row(w, v, sh->dim, &M);
                } else if (dense) {
                    rs = bs[k];
                }
                if (sh->dense)
                    sh->rstep[lr] = rs;
                sh->ready[lr] = SHARD_ROW_READY;
                loaded++;
            }
        }
        if (rc == 0)
            rc = snapfile_finish(&r);
        free(buf);
        snapfile_close(&r);
    }
    if (rc == 0 && loaded != sh->rows)
        rc = pf_err(-EINVAL, "checkpoint step %lld under %s: %lld of this shard's %lld rows found",
                    (long long)step, root, (long long)loaded, (long long)sh->rows);
    /* The lr of the steps the rows still owe (dense_cache_get reads step_lr[rstep .. t-1]). */
    for (int64_t t = 0; rc == 0 && L.flr && (sh->dense || sh->adam) && t < step; t++)
        rc = shard_dense_set_lr(sh, t, L.flr[t]);
    if (rc == 0)
        log_info(
            "loaded checkpoint step %lld: %lld rows of shard %d/%d from %d shard file(s) of %d servers in "
            "%.2f s%s",
            (long long)step, (long long)loaded, sh->rank, sh->servers, S0 == sh->servers ? 1 : S0, S0,
            pf_now_s() - t0,
            L.flr && L.fdense ? (L.catchup
                       ? " (dense rows brought up to date: this shard's update or momentum / weight decay "
                         "differs from the file's)"
                       : " (dense rows as stored, each at its own step)")
                : "");
    if (L.have_dc)
        dense_cache_free(&L.dc);
    free(L.fco);
    free(L.flr);
    return rc;
}
