/* Checkpoint folders: see ckpt.h. */
#include "common/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/atomic_file.h"
#include "common/ckpt_marker.h"
#include "common/err.h"
#include "common/log.h"
#include "common/snapfile.h"

const char *const ckpt_ident_keys[] = {"seed",        "network",   "embedding_size",
                                       "num_classes", "num_image", "batch_size",
                                       "sample_rate", "optimizer", NULL};

int ckpt_config_digest(const pf_config *cfg, uint8_t d[CKPT_DIGEST_BYTES])
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    int ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) == 1;
    for (int i = 0; ok && ckpt_ident_keys[i]; i++) {
        char v[CFG_STR + 8], line[CFG_STR + 80];
        if (cfg_format_key(cfg, ckpt_ident_keys[i], v, sizeof v) < 0) {
            EVP_MD_CTX_free(c);
            return pf_err(-EIO, "config digest: %s", pf_errmsg());
        }
        int n = snprintf(line, sizeof line, "%s = %s\n", ckpt_ident_keys[i], v);
        ok = EVP_DigestUpdate(c, line, (size_t)n) == 1;
    }
    unsigned int len = 0;
    ok = ok && EVP_DigestFinal_ex(c, d, &len) == 1 && len == CKPT_DIGEST_BYTES;
    EVP_MD_CTX_free(c);
    return ok ? 0 : pf_err(-EIO, "config digest: SHA-256 failed");
}

int ckpt_ident_of(const pf_config *cfg, const uint8_t run_id[CKPT_RUN_ID_BYTES], ckpt_ident *id)
{
    memset(id, 0, sizeof *id);
    memcpy(id->run_id, run_id, CKPT_RUN_ID_BYTES);
    id->seed = (uint64_t)cfg->seed;
    return ckpt_config_digest(cfg, id->config_digest);
}

static void hex(const uint8_t *p, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 15];
    }
    out[2 * n] = '\0';
}

void ckpt_run_id_hex(const uint8_t run_id[CKPT_RUN_ID_BYTES], char out[2 * CKPT_RUN_ID_BYTES + 1])
{
    hex(run_id, CKPT_RUN_ID_BYTES, out);
}

int ckpt_unhex(const char *s, uint8_t *out, size_t n, int lower_only)
{
    if (strlen(s) != 2 * n || strspn(s, lower_only ? "0123456789abcdef" : "0123456789abcdefABCDEF") != 2 * n)
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        unsigned v = 0;
        sscanf(s + 2 * i, "%2x", &v);
        out[i] = (uint8_t)v;
    }
    return 0;
}

int ckpt_ident_diff(const ckpt_ident *a, const ckpt_ident *b, char *out, size_t cap)
{
    int n = 0;
    size_t len = 0;
    if (cap)
        out[0] = '\0';
    char x[2 * CKPT_DIGEST_BYTES + 1], y[2 * CKPT_DIGEST_BYTES + 1];
    if (memcmp(a->run_id, b->run_id, CKPT_RUN_ID_BYTES)) {
        ckpt_run_id_hex(a->run_id, x);
        ckpt_run_id_hex(b->run_id, y);
        if (len < cap)
            len += (size_t)snprintf(out + len, cap - len, "%srun_id %s vs %s", n ? ", " : "", x, y);
        n++;
    }
    if (a->seed != b->seed) {
        if (len < cap)
            len += (size_t)snprintf(out + len, cap - len, "%sseed %llu vs %llu", n ? ", " : "",
                                    (unsigned long long)a->seed, (unsigned long long)b->seed);
        n++;
    }
    if (memcmp(a->config_digest, b->config_digest, CKPT_DIGEST_BYTES)) {
        hex(a->config_digest, 8, x);
        hex(b->config_digest, 8, y);
        if (len < cap)
            len +=
                (size_t)snprintf(out + len, cap - len, "%sconfig_digest %s... vs %s...", n ? ", " : "", x, y);
        n++;
    }
    return n;
}

/* Little-endian u64 of p[0, 8). */
static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static const char *const extra_names[CKPT_IDENT_EXTRAS] = {
    "ckpt.run_id.0",        "ckpt.run_id.1",        "ckpt.seed",           "ckpt.config_digest.0",
    "ckpt.config_digest.1", "ckpt.config_digest.2", "ckpt.config_digest.3"};

void ckpt_ident_extras(const ckpt_ident *id, char names[CKPT_IDENT_EXTRAS][32],
                       uint64_t bits[CKPT_IDENT_EXTRAS])
{
    for (int i = 0; i < CKPT_IDENT_EXTRAS; i++) {
        memset(names[i], 0, 32);
        snprintf(names[i], 32, "%s", extra_names[i]);
    }
    bits[0] = le64(id->run_id);
    bits[1] = le64(id->run_id + 8);
    bits[2] = id->seed;
    for (int k = 0; k < 4; k++)
        bits[3 + k] = le64(id->config_digest + 8 * k);
}

int ckpt_ident_from_extras(const char (*names)[32], const uint64_t *bits, int n, ckpt_ident *id)
{
    uint64_t v[CKPT_IDENT_EXTRAS];
    for (int i = 0; i < CKPT_IDENT_EXTRAS; i++) {
        int k = 0;
        while (k < n && strncmp(names[k], extra_names[i], 32) != 0)
            k++;
        if (k == n)
            return pf_err(-ENOENT, "no run identity (extra '%s' missing)", extra_names[i]);
        v[i] = bits[k];
    }
    memset(id, 0, sizeof *id);
    put_le64(id->run_id, v[0]);
    put_le64(id->run_id + 8, v[1]);
    id->seed = v[2];
    for (int k = 0; k < 4; k++)
        put_le64(id->config_digest + 8 * k, v[3 + k]);
    return 0;
}

void ckpt_root(const pf_config *cfg, char *buf, size_t n)
{
    if (cfg->snapshot_dir[0])
        snprintf(buf, n, "%s", cfg->snapshot_dir);
    else
        snprintf(buf, n, "%s/snapshots", cfg->output);
}

void ckpt_step_dir(const char *root, int64_t step, char *buf, size_t n)
{
    snprintf(buf, n, "%s/step-%lld", root, (long long)step);
}

void ckpt_member_path(const char *root, int64_t step, const char *role, int r, int n, const char *ext,
                      char *buf, size_t len)
{
    snprintf(buf, len, "%s/step-%lld/%s-%d-of-%d%s", root, (long long)step, role, r, n, ext);
}

int64_t ckpt_parse_step(const char *name)
{
    if (strncmp(name, "step-", 5) != 0)
        return -1;
    const char *d = name + 5;
    if (*d < '1' || *d > '9')
        return -1; /* empty, a sign, a leading zero, or not a number */
    int64_t v = 0;
    for (; *d; d++) {
        if (*d < '0' || *d > '9' || v > (INT64_MAX - (*d - '0')) / 10)
            return -1; /* not a number, or past INT64_MAX */
        v = v * 10 + (*d - '0');
    }
    return v;
}

/* Does name look like a step folder ("step-" then a digit or a sign) without being a canonical one? */
static int looks_like_step(const char *name)
{
    return strncmp(name, "step-", 5) == 0 &&
           ((name[5] >= '0' && name[5] <= '9') || name[5] == '+' || name[5] == '-');
}

static int cmp_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* ckpt_list_steps; warn: log the names that look like steps but are not canonical (the listings a reader
 * acts on; the prune after every checkpoint write does not repeat them). */
static int list_steps(const char *root, int64_t **steps, int warn)
{
    *steps = NULL;
    DIR *d = opendir(root);
    if (!d) {
        int e = errno;
        if (e == ENOENT)
            return 0;
        return pf_err(e == EACCES || e == ENOTDIR ? -e : -EIO, "cannot read the checkpoint root %s: %s", root,
                      e == EACCES ? "permission denied" : strerror(e));
    }
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t t = ckpt_parse_step(e->d_name);
        if (t < 0) {
            if (warn && looks_like_step(e->d_name))
                log_warn(
                    "checkpoint root %s: '%s' skipped: not a step folder name (step-<T>, T > 0 in decimal "
                    "without leading zeros, at most %lld)",
                    root, e->d_name, (long long)INT64_MAX);
            continue;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *p = realloc(*steps, sizeof(int64_t) * (size_t)cap);
            if (!p) {
                closedir(d);
                free(*steps);
                *steps = NULL;
                return pf_err(-ENOMEM, "out of memory listing %s", root);
            }
            *steps = p;
        }
        (*steps)[n++] = t;
    }
    closedir(d);
    if (n)
        qsort(*steps, (size_t)n, sizeof(int64_t), cmp_desc);
    return n;
}

int ckpt_list_steps(const char *root, int64_t **steps)
{
    return list_steps(root, steps, 1);
}

int ckpt_resume_steps(const char *root, const char *member, const char *who, ckpt_step_check check, void *arg,
                      int64_t *usable, ckpt_ident *ids, int cap)
{
    int64_t *steps;
    int n = ckpt_list_steps(root, &steps), k = 0;
    if (n < 0)
        return n;
    for (int i = 0; i < n && k < cap; i++) {
        if (check(root, steps[i], arg, &ids[k]) == 0)
            usable[k++] = steps[i];
        else
            log_warn("resume: checkpoint step %lld not usable by this %s: %s", (long long)steps[i], member,
                     pf_errmsg());
    }
    log_info("resume: %d checkpoint step(s) under %s, %d usable by %s%s", n, root, k, who,
             k ? "" : " (starting from scratch unless every member agrees)");
    free(steps);
    return k;
}

/* r and n of a canonical member file name "<role>-<r>-of-<n><ext>" (0 <= r < n, both in decimal without
 * leading zeros or sign); 0, or -1 for any other name. */
static int parse_member(const char *nm, const char *role, const char *ext, int *r, int *n)
{
    size_t rl = strlen(role), el = strlen(ext), l = strlen(nm);
    if (strncmp(nm, role, rl) != 0 || nm[rl] != '-' || l <= rl + el || strcmp(nm + l - el, ext) != 0)
        return -1;
    int used = 0;
    char tail[64];
    snprintf(tail, sizeof tail, "%%9d-of-%%9d%s%%n", ext);
    if (sscanf(nm + rl + 1, tail, r, n, &used) != 2 || nm[rl + 1 + used] != '\0' || *r < 0 || *n <= 0 ||
        *r >= *n)
        return -1;
    /* Canonical only: the name must be exactly the one ckpt_member_path writes for (r, n). */
    char canon[128];
    snprintf(canon, sizeof canon, "%s-%d-of-%d%s", role, *r, *n, ext);
    return strcmp(canon, nm) == 0 ? 0 : -1;
}

int ckpt_scan_members(const char *root, int64_t step, const char *role, const char *ext, int *count, int *of,
                      uint8_t *seen, int seen_cap)
{
    char dir[4200];
    ckpt_step_dir(root, step, dir, sizeof dir);
    *count = 0;
    *of = 0;
    DIR *d = opendir(dir);
    if (!d)
        return -ENOENT;
    struct dirent *e;
    while ((e = readdir(d))) {
        int r = -1, n = -1;
        if (parse_member(e->d_name, role, ext, &r, &n) < 0)
            continue;
        (*count)++;
        if (*of == 0)
            *of = n;
        else if (*of != n)
            *of = -1;
        if (seen && r < seen_cap)
            seen[r] = 1;
    }
    closedir(d);
    return 0;
}

void ckpt_remove_empty(const char *root)
{
    int64_t *steps;
    int n = list_steps(root, &steps, 0);
    for (int i = 0; i < n; i++) {
        char dir[4200];
        ckpt_step_dir(root, steps[i], dir, sizeof dir);
        rmdir(dir);
    }
    free(steps);
}

/* Are all files of `role` in the step present (count == of > 0, and every .snap's .model for workers; or,
 * for workers, every rank's .module marker: a PyTorch-module run)? */
static int role_complete(const char *root, int64_t step, const char *role)
{
    int count = 0, of = 0;
    if (!strcmp(role, "worker") && ckpt_scan_members(root, step, role, ".module", &count, &of, NULL, 0) == 0 &&
        of > 0 && count == of)
        return 1;
    if (ckpt_scan_members(root, step, role, ".snap", &count, &of, NULL, 0) < 0 || of <= 0 || count != of)
        return 0;
    if (!strcmp(role, "worker")) {
        int mc = 0, mof = 0;
        if (ckpt_scan_members(root, step, role, ".model", &mc, &mof, NULL, 0) < 0 || mc != count || mof != of)
            return 0;
    }
    return 1;
}

/* Does any step hold a file of another member (another rank of `role`, or any file of the other role)? Then
 * the folder is shared by the members. */
static int folder_shared(const char *root, const int64_t *steps, int n, const char *role, int rank)
{
    const char *other = strcmp(role, "shard") ? "shard" : "worker";
    for (int i = 0; i < n; i++) {
        int count = 0, of = 0, ocount = 0, oof = 0;
        uint8_t seen[64] = {0};
        if (ckpt_scan_members(root, steps[i], role, ".snap", &count, &of, seen, 64) < 0)
            continue;
        if (count > 1 || (count == 1 && !seen[rank < 64 ? rank : 0]))
            return 1;
        if (ckpt_scan_members(root, steps[i], other, ".snap", &ocount, &oof, NULL, 0) == 0 && ocount > 0)
            return 1;
    }
    return 0;
}

/* Removes `name`'s files of `role` in the step: rank's own, or (all = 1) every member's. */
static void remove_files(const char *root, int64_t step, const char *role, int rank, int all)
{
    char dir[4200];
    ckpt_step_dir(root, step, dir, sizeof dir);
    DIR *d = opendir(dir);
    if (!d)
        return;
    char mine[64];
    snprintf(mine, sizeof mine, "%s-%d-of-", role, rank);
    size_t rl = strlen(role);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, role, rl) != 0 || e->d_name[rl] != '-')
            continue;
        if (!all && strncmp(e->d_name, mine, strlen(mine)) != 0)
            continue;
        char p[4600];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
}

/* Does step `step` hold a member file of another run than `run`: a .snap whose header, or a .module marker
 * whose text, names another run id? Files that cannot be read (torn, being replaced, refused) do not count
 * either way. */
static int step_foreign(const char *root, int64_t step, const ckpt_ident *run)
{
    char dir[4200];
    ckpt_step_dir(root, step, dir, sizeof dir);
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int foreign = 0;
    struct dirent *e;
    while (!foreign && (e = readdir(d))) {
        const char *nm = e->d_name;
        int r, n;
        char p[4600];
        snprintf(p, sizeof p, "%s/%s", dir, nm);
        ckpt_ident id;
        int have = 0;
        if (parse_member(nm, "shard", ".snap", &r, &n) == 0 || parse_member(nm, "worker", ".snap", &r, &n) == 0) {
            snapfile_reader rd;
            if ((have = snapfile_open(&rd, p, NULL) == 0)) {
                id = rd.m.id;
                snapfile_close(&rd);
            }
        } else if (parse_member(nm, "worker", ".module", &r, &n) == 0) {
            have = ckpt_module_marker_read(p, step, r, n, &id) == 0;
        }
        foreign = have && memcmp(id.run_id, run->run_id, CKPT_RUN_ID_BYTES) != 0;
    }
    closedir(d);
    return foreign;
}

void ckpt_prune(const char *root, const char *role, int rank, int keep, const ckpt_ident *run)
{
    int64_t *steps;
    int n = list_steps(root, &steps, 0);
    if (n <= 0) {
        free(steps);
        return;
    }
    /* Another run's steps are left out of everything below. */
    int own = 0;
    for (int i = 0; i < n; i++)
        if (!run || !step_foreign(root, steps[i], run))
            steps[own++] = steps[i];
    n = own;
    /* A shared folder: a step counts once every member's files are there (complete); only steps older than
     * the `keep` newest complete ones go, so a step that failed on some member never costs the last complete
     * one. A private folder (only this member's files): its own newest `keep`. */
    int shared = folder_shared(root, steps, n, role, rank);
    int kept = 0;
    const char *why = "";
    for (int i = 0; i < n; i++) {
        int counts;
        if (shared) {
            counts = role_complete(root, steps[i], "shard") && role_complete(root, steps[i], "worker");
        } else {
            int count = 0, of = 0;
            uint8_t seen[64] = {0};
            ckpt_scan_members(root, steps[i], role, ".snap", &count, &of, seen, 64);
            counts = seen[rank < 64 ? rank : 0];
        }
        /* An incomplete step older than a complete one in a shared folder: every member finished writing the
         * newer step, and members write their steps in order, so nobody writes to it any more: the files a
         * failed checkpoint left. */
        if (shared && !counts && kept > 0) {
            why = ", incomplete and older than a complete checkpoint";
        } else if (kept < keep) {
            kept += counts;
            continue;
        } else {
            why = "";
        }
        /* Older than the `keep` newest complete steps: nobody writes or resumes from it any more, so in a
         * shared folder any member removes every file of it (the last member to write a checkpoint sees it
         * complete and leaves exactly `keep`; files of members a reshaped run no longer has go too). */
        if (shared) {
            remove_files(root, steps[i], "shard", rank, 1);
            remove_files(root, steps[i], "worker", rank, 1);
        } else {
            remove_files(root, steps[i], role, rank, 0);
        }
        log_info("checkpoint step %lld: pruned (%s, snapshot_keep = %d%s)", (long long)steps[i],
                 shared ? "every member's files" : "this member's files", keep, why);
    }
    free(steps);
    ckpt_remove_empty(root);
}

int ckpt_module_marker_write(const char *root, int64_t step, int rank, int workers, const ckpt_ident *id)
{
    struct stat st;
    if (stat(root, &st) != 0 || !S_ISDIR(st.st_mode))
        return pf_err(-ENOENT, "%s: not a folder on this host", root);
    char dir[4200], path[4300], text[CKPT_MODULE_MARKER_MAX];
    ckpt_step_dir(root, step, dir, sizeof dir);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return pf_err(-EIO, "%s: cannot create: %s", dir, strerror(errno));
    ckpt_member_path(root, step, "worker", rank, workers, ".module", path, sizeof path);
    int n = ckpt_module_marker_format(text, sizeof text, step, rank, workers, id);
    if (n < 0)
        return n;
    pf_atomic_file af;
    int rc = pf_atomic_open(&af, path, "module checkpoint marker");
    if (rc < 0)
        return rc;
    return pf_atomic_commit(&af, fwrite(text, 1, (size_t)n, af.f) == (size_t)n);
}

int ckpt_module_marker_read(const char *path, int64_t step, int rank, int workers, ckpt_ident *id)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return pf_err(-ENOENT, "%s: missing", path);
    if (!S_ISREG(st.st_mode) || st.st_size > CKPT_MODULE_MARKER_MAX)
        return pf_err(-EINVAL, "%s: not a module checkpoint marker (%s)", path,
                      S_ISREG(st.st_mode) ? "larger than 1 KiB" : "not a regular file");
    FILE *f = fopen(path, "r");
    if (!f)
        return pf_err(-ENOENT, "%s: cannot open: %s", path, strerror(errno));
    char text[CKPT_MODULE_MARKER_MAX];
    size_t n = fread(text, 1, sizeof text, f);
    fclose(f);
    return ckpt_module_marker_parse(text, n, path, step, rank, workers, id);
}
