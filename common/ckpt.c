/* Checkpoint folders: see ckpt.h. */
#include "common/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"

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

/* T of a folder name "step-<T>", or -1. */
static int64_t parse_step(const char *name)
{
    if (strncmp(name, "step-", 5) != 0 || !name[5])
        return -1;
    char *end;
    long long v = strtoll(name + 5, &end, 10);
    return *end || v <= 0 || name[5] == '+' || name[5] == '-' ? -1 : (int64_t)v;
}

static int cmp_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int ckpt_list_steps(const char *root, int64_t **steps)
{
    *steps = NULL;
    DIR *d = opendir(root);
    if (!d)
        return 0;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t t = parse_step(e->d_name);
        if (t < 0)
            continue;
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

int ckpt_resume_steps(const char *root, const char *member, const char *who, ckpt_step_check check, void *arg,
                      int64_t *usable, int cap)
{
    int64_t *steps;
    int n = ckpt_list_steps(root, &steps), k = 0;
    if (n < 0) {
        log_warn("resume: cannot list the checkpoint steps under %s: %s", root, pf_errmsg());
        n = 0;
    }
    for (int i = 0; i < n && k < cap; i++) {
        if (check(root, steps[i], arg) == 0)
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
    size_t rl = strlen(role), el = strlen(ext);
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *nm = e->d_name;
        size_t l = strlen(nm);
        if (strncmp(nm, role, rl) != 0 || nm[rl] != '-' || l <= el || strcmp(nm + l - el, ext) != 0)
            continue;
        int r = -1, n = -1, used = 0;
        char tail[64];
        snprintf(tail, sizeof tail, "%%d-of-%%d%s%%n", ext);
        if (sscanf(nm + rl + 1, tail, &r, &n, &used) != 2 || nm[rl + 1 + used] != '\0' || r < 0 || n <= 0 ||
            r >= n)
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
    int n = ckpt_list_steps(root, &steps);
    for (int i = 0; i < n; i++) {
        char dir[4200];
        ckpt_step_dir(root, steps[i], dir, sizeof dir);
        rmdir(dir);
    }
    free(steps);
}

/* Are all files of `role` in the step present (count == of > 0, and every .snap's .model for workers)? */
static int role_complete(const char *root, int64_t step, const char *role)
{
    int count = 0, of = 0;
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

void ckpt_prune(const char *root, const char *role, int rank, int keep)
{
    int64_t *steps;
    int n = ckpt_list_steps(root, &steps);
    if (n <= 0) {
        free(steps);
        return;
    }
    /* A shared folder: a step counts once every member's files are there (complete); only steps older than
     * the `keep` newest complete ones go, so a step that failed on some member never costs the last complete
     * one. A private folder (only this member's files): its own newest `keep`. */
    int shared = folder_shared(root, steps, n, role, rank);
    int kept = 0;
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
        if (kept < keep) {
            kept += counts;
            continue;
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
        log_info("checkpoint step %lld: pruned (%s, snapshot_keep = %d)", (long long)steps[i],
                 shared ? "every member's files" : "this member's files", keep);
    }
    free(steps);
    ckpt_remove_empty(root);
}
