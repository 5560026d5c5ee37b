/* `pfcps ckpt-info [--newest] [--run ID] DIR`: the checkpoints of a run (usage in tools/commands.h). */
#include "tools/commands.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/checked.h"
#include "common/ckpt.h"
#include "common/err.h"
#include "common/file.h"
#include "common/snapfile.h"
#include "server/adamw.h"
#include "server/dense.h"
#include "tools/opts.h"
#include "worker/model/model.h"

static const char ckpt_info_usage[] =
    "usage: pfcps ckpt-info [--newest] [--run ID] DIR\n"
    "  DIR: a run's output folder (its snapshots/ is read) or a checkpoint root (snapshot_dir).\n"
    "  One line per checkpoint step, newest first: complete or not (every member's files present,\n"
    "  valid and of one run: the same run id, seed and config digest), members present, bytes, the\n"
    "  SHA-256 of the class-center table in class order (weights then momentum of class 0, 1, ...;\n"
    "  optimizer = adamw: weights, first then second moment of each class:\n"
    "  the same whatever number of servers held it), of worker 0's backbone (its tensors, parameters\n"
    "  then BN statistics; \"-\" for a pfcps.torch run, whose ranks leave a .module marker each and\n"
    "  keep the backbone in the script's own files); below a complete one, the run id, seed and config\n"
    "  digest. The first problem\n"
    "  of an incomplete checkpoint is named (file and field). With PFCPS_SECRET set, every .snap's HMAC\n"
    "  is verified too (a file forged or written under another secret is refused); without it only the\n"
    "  digests are, and a line says so.\n"
    "  --newest: print only the newest complete step (0: none).\n"
    "  --run ID: only the checkpoints of run ID (32 hex digits, as server 0 logs it: \"run id ...\");\n"
    "  steps written by another run are left out (--newest: the newest complete step of that run).";

static void hex(const uint8_t *d, char *out)
{
    for (int i = 0; i < 32; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
}

static long long file_size(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 ? (long long)st.st_size : 0;
}

/* One shard file being read in class order. */
typedef struct shard_in {
    snapfile_reader r;
    float *buf;      /* the block in memory: n x D weights then n x D momentum (dense: then n row steps) */
    int64_t row0, n; /* its first local row and its rows */
    int64_t block_rows;
    /* pfc_update = dense files (server/snapshot.h): mu, wd, the lr of every step, the maps of skipped steps
     */
    double mw[4];
    double *lr;
    dense_cache dc;
    int have_dc;
    adamw_coef *co; /* AdamW files: each step's scalars (server/adamw.h), from the file's constants and lr */
} shard_in;

/* The identity every file of a step must carry: the first file's (ref_what names it). */
typedef struct step_ident {
    int set;
    ckpt_ident id;
    char what[4400];
} step_ident;

/* Checks that the file `path` carries identity *id: the first one sets it. */
static int same_run(step_ident *si, const char *path, const ckpt_ident *id)
{
    char diff[400];
    if (!si->set) {
        si->set = 1;
        si->id = *id;
        snprintf(si->what, sizeof si->what, "%s's", path);
        return 0;
    }
    if (ckpt_ident_diff(id, &si->id, diff, sizeof diff) == 0)
        return 0;
    return pf_err(-EINVAL, "%s: another run's file: header fields %s (this vs %s)", path, diff, si->what);
}

/* Verifies every shard file of the step (key: NULL or the checkpoint key) and hashes the table in class order
 * into d: each class's weights then momentum (AdamW files: weights, first and second moment) as they stand
 * after `step` steps (a dense file's row that skipped steps gets their closed form, server/dense.h, or under
 * AdamW their replay, server/adamw.h, from the file's lr table; the same bits a server computes). S0 files of
 * C x D, all of one run (si). */
static int table_digest(const char *root, int64_t step, int S0, const snapfile_key *key, step_ident *si,
                        uint8_t d[32], long long *bytes)
{
    shard_in *in = calloc((size_t)S0, sizeof *in);
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    int rc = in && c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) == 1 ? 0 : pf_err(-ENOMEM, "out of memory");
    int opened = 0;
    int64_t C = -1;
    int D = 0;
    for (int s = 0; rc == 0 && s < S0; s++) {
        char p[4300];
        ckpt_member_path(root, step, "shard", s, S0, ".snap", p, sizeof p);
        *bytes += file_size(p);
        /* snapfile_open checks every field against the others (rows of this rank, block_rows, payload). */
        if ((rc = snapfile_open(&in[s].r, p, key)) < 0)
            break;
        opened = s + 1;
        const snapfile_meta *m = &in[s].r.m;
        rc = snapfile_check_member(m, p, "shard", step, s, S0);
        if (rc == 0 && C >= 0 && (m->num_classes != C || m->dim != D))
            rc = pf_err(-EINVAL,
                        "%s: header fields num_classes = %lld, embedding_size = %d; shard 0 says C=%lld D=%d",
                        p, (long long)m->num_classes, m->dim, (long long)C, D);
        if (rc == 0)
            rc = same_run(si, p, &m->id);
        C = m->num_classes;
        D = m->dim;
        in[s].block_rows = m->block_rows;
        size_t block = 0;
        if (rc == 0 && C >= 0 && m->adamw != in[0].r.m.adamw)
            rc = pf_err(-EINVAL, "%s: header field adamw = %d; shard 0 says %d", p, m->adamw, in[0].r.m.adamw);
        if (rc == 0 &&
            pf_mul3_size((size_t)m->block_rows, (size_t)D, (m->adamw ? 3 : 2) * sizeof(float), &block) < 0)
            rc = pf_err(-EINVAL, "%s: header field block_rows = %lld: a block overflows", p,
                        (long long)m->block_rows);
        if (rc == 0 && (m->dense || m->adamw)) { /* the prefix; the row steps add 8 bytes per row to a block */
            if (m->dense)
                block += sizeof(int64_t) * (size_t)m->block_rows;
            in[s].lr = malloc(sizeof(double) * (size_t)(step > 0 ? step : 1));
            if (m->adamw)
                in[s].co = malloc(sizeof(adamw_coef) * (size_t)(step > 0 ? step : 1));
            if (!in[s].lr || (m->adamw && !in[s].co) || dense_cache_init(&in[s].dc, D) < 0)
                rc = pf_err(-ENOMEM, "%s: out of memory for the lr of %lld steps", p, (long long)step);
            in[s].have_dc = in[s].lr != NULL && in[s].dc.tmp != NULL;
            if (rc == 0)
                rc = snapfile_read(&in[s].r, in[s].mw, sizeof(double) * (m->adamw ? 4 : 2));
            if (rc == 0 && step > 0)
                rc = snapfile_read(&in[s].r, in[s].lr, sizeof(double) * (size_t)step);
            const adamw_hp hp = {in[s].mw[0], in[s].mw[1], in[s].mw[2], in[s].mw[3]};
            if (rc == 0 && m->adamw && step > 0)
                adamw_coefs(&hp, in[s].lr, 0, step - 1, 0, in[s].co);
        }
        if (rc == 0 && !(in[s].buf = malloc(block)))
            rc = pf_err(-ENOMEM, "%s: out of memory for a block of %zu bytes", p, block);
    }
    for (int64_t cls = 0; rc == 0 && cls < C; cls++) {
        shard_in *x = &in[cls % S0];
        int64_t lr = cls / S0;
        if (lr >= x->row0 + x->n) { /* next block of that file */
            x->row0 += x->n;
            int64_t left = x->r.m.rows - x->row0;
            x->n = left < x->block_rows ? left : x->block_rows;
            if ((rc = snapfile_read(&x->r, x->buf,
                                    (sizeof(float) * (x->r.m.adamw ? 3 : 2) * (size_t)D +
                                     (x->r.m.dense ? sizeof(int64_t) : 0)) *
                                        (size_t)x->n)) < 0)
                break;
        }
        int64_t k = lr - x->row0;
        const float *w = x->buf + (size_t)k * D, *v = x->buf + ((size_t)x->n + (size_t)k) * D;
        const float *q = x->buf + (2 * (size_t)x->n + (size_t)k) * D;
        if (x->r.m.adamw) { /* AdamW: w, m, v; a dense row replays the zero-gradient steps it skipped */
            int64_t rs = step;
            if (x->r.m.dense)
                memcpy(&rs, x->buf + (size_t)x->n * 3 * D + 2 * (size_t)k, sizeof rs);
            if (rs >= 0 && rs < step) {
                const adamw_hp hp = {x->mw[0], x->mw[1], x->mw[2], x->mw[3]};
                memcpy(x->dc.tmp, w, sizeof(float) * (size_t)D);
                memcpy(x->dc.tmp + D, v, sizeof(float) * (size_t)D);
                memcpy(x->dc.tmp + 2 * (size_t)D, q, sizeof(float) * (size_t)D);
                adamw_replay(x->dc.tmp, x->dc.tmp + D, x->dc.tmp + 2 * (size_t)D, D, &hp, x->co, rs, step - 1);
                w = x->dc.tmp;
                v = x->dc.tmp + D;
                q = x->dc.tmp + 2 * (size_t)D;
            }
        } else if (x->r.m.dense) { /* the row as it stands after `step` steps: the closed form of those it skipped */
            int64_t rs;
            memcpy(&rs, x->buf + (size_t)x->n * 2 * D + 2 * (size_t)k, sizeof rs);
            dense_map M;
            if (rs >= 0 && !dense_cache_get(&x->dc, x->lr, rs, step - 1, x->mw[0], x->mw[1], &M)) {
                memcpy(x->dc.tmp, w, sizeof(float) * (size_t)D);
                memcpy(x->dc.tmp + D, v, sizeof(float) * (size_t)D);
                dense_apply_row(x->dc.tmp, x->dc.tmp + D, D, &M);
                w = x->dc.tmp;
                v = x->dc.tmp + D;
            }
        }
        EVP_DigestUpdate(c, w, sizeof(float) * (size_t)D);
        EVP_DigestUpdate(c, v, sizeof(float) * (size_t)D);
        if (x->r.m.adamw)
            EVP_DigestUpdate(c, q, sizeof(float) * (size_t)D);
    }
    for (int s = 0; rc == 0 && s < S0; s++)
        rc = snapfile_finish(&in[s].r);
    unsigned int len = 0;
    if (rc == 0)
        EVP_DigestFinal_ex(c, d, &len);
    for (int s = 0; in && s < opened; s++)
        snapfile_close(&in[s].r);
    for (int s = 0; in && s < S0; s++) {
        free(in[s].buf);
        free(in[s].lr);
        free(in[s].co);
        if (in[s].have_dc)
            dense_cache_free(&in[s].dc);
    }
    free(in);
    EVP_MD_CTX_free(c);
    return rc;
}

/* Verifies every worker file of the step (key: NULL or the checkpoint key), all of one run (si); *W0
 * writers; the digest of worker 0's backbone (its tensors: the file also holds the run identity) into d.
 * A step without worker .snap files but with pfcps.torch ranks' .module markers (ckpt_module_marker_read):
 * *module = 1, the markers checked (step, rank, run identity), d left as it is. */
static int workers_check(const char *root, int64_t step, const snapfile_key *key, step_ident *si, int *W0,
                         int *present, uint8_t d[32], long long *bytes, int *module)
{
    int count = 0, of = 0;
    *module = 0;
    if (ckpt_scan_members(root, step, "worker", ".snap", &count, &of, NULL, 0) == 0 && count == 0 &&
        ckpt_scan_members(root, step, "worker", ".module", &count, &of, NULL, 0) == 0 && count > 0) {
        /* A PyTorch-module run: each rank's marker, its identity the shards' (the backbone is in the script's
         * own files) */
        *module = 1;
        *present = count;
        if (of < 0)
            return pf_err(-EINVAL, "module markers of different worker counts");
        *W0 = of;
        int rc = 0;
        for (int w = 0; rc == 0 && w < of; w++) {
            char mp[4300];
            ckpt_ident id;
            ckpt_member_path(root, step, "worker", w, of, ".module", mp, sizeof mp);
            *bytes += file_size(mp);
            if ((rc = ckpt_module_marker_read(mp, step, w, of, &id)) == 0)
                rc = same_run(si, mp, &id);
        }
        return rc;
    }
    if (ckpt_scan_members(root, step, "worker", ".snap", &count, &of, NULL, 0) < 0 || count == 0)
        return pf_err(-ENOENT, "no worker files");
    *present = count;
    if (of < 0)
        return pf_err(-EINVAL, "worker files of different worker counts");
    *W0 = of;
    int rc = 0;
    for (int w = 0; rc == 0 && w < of; w++) {
        char sp[4300], mp[4300];
        ckpt_member_path(root, step, "worker", w, of, ".snap", sp, sizeof sp);
        ckpt_member_path(root, step, "worker", w, of, ".model", mp, sizeof mp);
        *bytes += file_size(sp) + file_size(mp);
        snapfile_reader rd;
        if ((rc = snapfile_open(&rd, sp, key)) < 0)
            break;
        const snapfile_meta m = rd.m;
        uint32_t nsc = 0;
        uint8_t recorded[32], md[32], td[32];
        char diff[400];
        rc = snapfile_check_member(&m, sp, "worker", step, w, of);
        if (rc == 0)
            rc = same_run(si, sp, &m.id);
        /* payload: u32 count, count x 32-byte scalars (worker/resume.h), the .model's SHA-256, the arrays */
        if (rc == 0)
            rc = snapfile_read(&rd, &nsc, 4);
        for (uint32_t k = 0; rc == 0 && k < nsc && k < 1024; k++)
            rc = snapfile_read(&rd, md, 32);
        if (rc == 0)
            rc = snapfile_read(&rd, recorded, 32);
        if (rc == 0)
            rc = snapfile_finish(&rd);
        snapfile_close(&rd);
        /* The .model: its digest is the one the .snap recorded, its identity extras the .snap's. */
        ckpt_ident mid;
        if (rc == 0 && (rc = pf_file_sha256(mp, md)) == 0 && memcmp(md, recorded, 32) != 0)
            rc = pf_err(-EINVAL, "%s: digest does not match the one its .snap recorded (corrupt or replaced)",
                        mp);
        if (rc == 0)
            rc = model_file_ident(mp, &mid, NULL, td);
        if (rc == 0 && ckpt_ident_diff(&mid, &m.id, diff, sizeof diff) != 0)
            rc = pf_err(-EINVAL, "%s: its identity extras differ from %s's header: %s (.model vs .snap)", mp,
                        sp, diff);
        if (rc == 0 && w == 0)
            memcpy(d, td, 32);
    }
    return rc;
}

/* The checkpoint root of DIR (DIR/snapshots when that is a folder, else DIR) into root. Returns 0, or 1
 * after printing why DIR is no checkpoint root (missing, not a folder, unreadable). */
static int find_root(const char *dir, char *root, size_t cap)
{
    struct stat st;
    snprintf(root, cap, "%s/snapshots", dir);
    if (stat(root, &st) == 0 && S_ISDIR(st.st_mode))
        return 0;
    snprintf(root, cap, "%s", dir);
    if (stat(root, &st) != 0) {
        fprintf(stderr, "pfcps ckpt-info: %s: %s\n", dir,
                errno == ENOENT   ? "no such folder"
                : errno == EACCES ? "permission denied"
                                  : strerror(errno));
        return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "pfcps ckpt-info: %s: %s, not a folder\n", dir, pf_file_kind(&st));
        return 1;
    }
    return 0;
}

/* The run that wrote a complete step, on a line of its own (the step line is the same for equal results). */
static void print_run_line(const step_ident *si)
{
    char rid[2 * CKPT_RUN_ID_BYTES + 1], cd[65];
    ckpt_run_id_hex(si->id.run_id, rid);
    hex(si->id.config_digest, cd);
    printf("  run %s  seed %llu  config digest %.16s\n", rid, (unsigned long long)si->id.seed, cd);
}

/* The command line: --newest into *newest, --run's id into run[] (*want_run 1), the folder into *dir. Returns
 * 0, or the exit status of a usage error (2, printed). */
static int parse_args(int argc, char **argv, int *newest, int *want_run, uint8_t *run, const char **dir)
{
    static const tool_opt opts[] = {{"--newest", 0}, {"--run", 1}, {NULL, 0}};
    tool_args a;
    int k;
    tool_args_init(&a, "ckpt-info", opts, argc, argv);
    while ((k = tool_args_next(&a)) != TOOL_END) {
        if (k == 0)
            *newest = 1;
        else if (k == 1) {
            if (*want_run) {
                fprintf(stderr, "pfcps ckpt-info: --run given twice (one run at a time)\n");
                return 2;
            }
            if (!a.arg || ckpt_unhex(a.arg, run, CKPT_RUN_ID_BYTES, 0) < 0) {
                tool_opt_bad(&a, "a run id of 32 hex digits");
                return 2;
            }
            *want_run = 1;
        } else if (k == TOOL_UNKNOWN || *dir)
            return tool_unexpected(&a, k == TOOL_UNKNOWN ? a.opt : a.arg, ckpt_info_usage);
        else
            *dir = a.arg;
    }
    if (!*dir) {
        fprintf(stderr, "%s\n", ckpt_info_usage);
        return 2;
    }
    return 0;
}

int cmd_ckpt_info(int argc, char **argv)
{
    int newest = 0, want_run = 0;
    uint8_t run[CKPT_RUN_ID_BYTES];
    const char *dir = NULL;
    int prc = parse_args(argc, argv, &newest, &want_run, run, &dir);
    if (prc)
        return prc;
    char root[4096];
    if (find_root(dir, root, sizeof root))
        return 1;
    /* The checkpoint key, when the join secret is known: every .snap's HMAC is verified. */
    const char *secret = getenv("PFCPS_SECRET");
    snapfile_key key;
    const snapfile_key *kp = NULL;
    if (secret && *secret) {
        if (snapfile_key_derive(secret, &key) < 0) {
            fprintf(stderr, "pfcps ckpt-info: %s\n", pf_errmsg());
            return 1;
        }
        kp = &key;
    }
    int64_t *steps;
    int n = ckpt_list_steps(root, &steps);
    if (n < 0) {
        fprintf(stderr, "pfcps ckpt-info: %s\n", pf_errmsg());
        return 1;
    }
    char want_hex[2 * CKPT_RUN_ID_BYTES + 1] = "";
    if (want_run)
        ckpt_run_id_hex(run, want_hex);
    if (!newest) {
        printf("checkpoints in %s: %d%s%s\n", root, n, want_run ? "; listed: those of run " : "", want_hex);
        printf("%s\n",
               kp ? "authenticated: every .snap's HMAC verified with the key of PFCPS_SECRET"
                  : "not authenticated: PFCPS_SECRET is not set, so only the digests were verified (a "
                    "file forged with recomputed digests is not caught)");
    }
    int64_t best = 0;
    int listed = 0, unknown = 0;
    for (int i = 0; i < n; i++) {
        int count = 0, S0 = 0, W0 = 0, wpresent = 0, module = 0;
        long long bytes = 0;
        uint8_t td[32] = {0}, bd[32] = {0};
        step_ident si = {0};
        ckpt_scan_members(root, steps[i], "shard", ".snap", &count, &S0, NULL, 0);
        int rc = 0;
        if (count == 0)
            rc = pf_err(-ENOENT, "no shard files");
        else if (S0 < 0)
            rc = pf_err(-EINVAL, "shard files of different server counts");
        else if (count != S0)
            rc = pf_err(-ENOENT, "%d of %d shard files", count, S0);
        else
            rc = table_digest(root, steps[i], S0, kp, &si, td, &bytes);
        char why[PF_ERRMSG_MAX] = "";
        if (rc < 0)
            snprintf(why, sizeof why, "%s", pf_errmsg());
        int wrc = workers_check(root, steps[i], kp, &si, &W0, &wpresent, bd, &bytes, &module);
        if (wrc == 0 && wpresent != W0)
            wrc = pf_err(-ENOENT, "%d of %d worker files", wpresent, W0);
        if (wrc < 0 && rc == 0) {
            rc = wrc;
            snprintf(why, sizeof why, "%s", pf_errmsg());
        }
        /* --run: a step known to be another run's is left out (one whose run is unknown, a problem found
         * before any member's header was read, stays listed). */
        if (want_run && si.set && memcmp(si.id.run_id, run, CKPT_RUN_ID_BYTES) != 0)
            continue;
        if (rc == 0 && best == 0)
            best = steps[i];
        listed++;
        unknown += !si.set;
        if (newest)
            continue;
        char th[65] = "-", bh[65] = "-";
        if (rc == 0) {
            hex(td, th);
            if (module)
                snprintf(bh, sizeof bh, "-"); /* in the script's own files */
            else
                hex(bd, bh);
        }
        printf("step %lld: %s  shards %d/%d  %s %d/%d  %.1f MB  table %s  backbone %s%s%s\n",
               (long long)steps[i], rc == 0 ? "complete" : "INCOMPLETE", count, S0 > 0 ? S0 : 0,
               module ? "module ranks" : "workers", wpresent,
               W0 > 0 ? W0 : 0, (double)bytes / 1e6, th, bh, rc == 0 ? "" : "  problem: ", why);
        if (rc == 0)
            print_run_line(&si);
    }
    free(steps);
    if (!newest && want_run)
        printf("%d of the %d steps listed: run %s's%s\n", listed, n, want_hex,
               unknown ? " (or, for those whose files could not be read, of an unknown run)" : "");
    if (newest)
        printf("%lld\n", (long long)best);
    else if (!best)
        printf("no complete checkpoint%s%s\n", want_run ? " of run " : "", want_hex);
    return 0;
}
