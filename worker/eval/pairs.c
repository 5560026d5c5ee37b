/* LFW / ORL pair lists (see pairs.h). */
#include "worker/eval/pairs.h"

#include "common/err.h"
#include "common/file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PAIRS_MAX_BYTES (256u << 20)

void eval_pairs_free(eval_pairs *p)
{
    if (p->paths)
        for (int64_t i = 0; i < 2 * p->n_pairs; i++)
            free(p->paths[i]);
    free(p->paths);
    free(p->issame);
    memset(p, 0, sizeof *p);
}

/* Splits a line in place on tabs and spaces: up to 8 fields, returns how many (9 when more). */
static int split(char *line, char **f)
{
    int n = 0;
    char *save = NULL;
    for (char *t = strtok_r(line, " \t\r", &save); t; t = strtok_r(NULL, " \t\r", &save)) {
        if (n == 8)
            return 9;
        f[n++] = t;
    }
    return n;
}

static int parse_int(const char *s, long long lo, long long hi, long long *v)
{
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno || end == s || *end || x < lo || x > hi)
        return -1;
    *v = x;
    return 0;
}

/* A pair line: 3 fields (same) or 4 (different) with positive image numbers. */
static int is_pair(char **f, int n)
{
    long long v;
    if (n == 3)
        return parse_int(f[1], 1, 99999999, &v) == 0 && parse_int(f[2], 1, 99999999, &v) == 0;
    if (n == 4)
        return parse_int(f[1], 1, 99999999, &v) == 0 && parse_int(f[3], 1, 99999999, &v) == 0;
    return 0;
}

static int resolve(const char *dir, const char *name, long long i, const char *file, int line, char **out)
{
    if (strchr(name, '/') || strcmp(name, "..") == 0 || strcmp(name, ".") == 0)
        return pf_err(-EPROTO, "%s line %d: name '%s' is not a folder name", file, line, name);
    char cand[4][4096];
    snprintf(cand[0], sizeof cand[0], "%s/%s/%s_%04lld.jpg", dir, name, name, i);
    snprintf(cand[1], sizeof cand[1], "%s/%s/%lld.pgm", dir, name, i);
    snprintf(cand[2], sizeof cand[2], "%s/%s/%lld.jpg", dir, name, i);
    snprintf(cand[3], sizeof cand[3], "%s/%s/%lld.png", dir, name, i);
    for (int k = 0; k < 4; k++) {
        struct stat st;
        if (stat(cand[k], &st) == 0 && S_ISREG(st.st_mode)) {
            *out = strdup(cand[k]);
            return *out ? 0 : pf_err(-ENOMEM, "out of memory");
        }
    }
    return pf_err(-ENOENT, "%s line %d: no image %lld of '%s' under %s (tried %s, %s/%s/%lld.{pgm,jpg,png})",
                  file, line, i, name, dir, cand[0], dir, name, i);
}

int eval_pairs_load(eval_pairs *p, const char *pairs_path, const char *images_dir)
{
    memset(p, 0, sizeof *p);
    uint8_t *bytes;
    size_t size;
    int rc = pf_read_file(pairs_path, PAIRS_MAX_BYTES, &bytes, &size);
    if (rc)
        return pf_err_wrap(rc, "%s", pairs_path);
    char *text = (char *)bytes; /* NUL-terminated by pf_read_file */
    if (memchr(text, 0, size)) {
        free(text);
        return pf_err(-EPROTO, "%s: a NUL byte: not a text pairs file", pairs_path);
    }
    /* at most one pair per line */
    size_t cap = 1;
    for (size_t k = 0; k < size; k++)
        cap += text[k] == '\n';
    p->paths = calloc(2 * cap, sizeof *p->paths);
    p->issame = malloc(cap);
    long long expect = -1;
    int expect_line = 0;
    if (!p->paths || !p->issame) {
        rc = pf_err(-ENOMEM, "%s: out of memory", pairs_path);
        goto out;
    }
    int line = 0, first = 1;
    for (char *s = text, *nl; s && *s; s = nl) {
        nl = strchr(s, '\n');
        if (nl)
            *nl++ = 0;
        line++;
        char *f[8];
        int n = split(s, f);
        if (n == 0)
            continue;
        if (!is_pair(f, n)) {
            if (!first) {
                rc =
                    pf_err(-EPROTO,
                           "%s line %d: not a pair line (expected 'name i j' or 'name1 i name2 j' with image "
                           "numbers >= 1)",
                           pairs_path, line);
                goto out;
            }
            /* the header: LFW's counts are checked, anything else is free text */
            long long a, b;
            if (n == 2 && parse_int(f[0], 1, 1000000, &a) == 0 && parse_int(f[1], 1, 100000000, &b) == 0)
                expect = 2 * a * b;
            else if (n == 1 && parse_int(f[0], 1, 100000000, &a) == 0)
                expect = 2 * a;
            expect_line = line;
            first = 0;
            continue;
        }
        first = 0;
        long long i, j;
        int64_t k = p->n_pairs;
        parse_int(f[1], 1, 99999999, &i);
        parse_int(f[n - 1], 1, 99999999, &j);
        p->issame[k] = n == 3;
        if ((rc = resolve(images_dir, f[0], i, pairs_path, line, &p->paths[2 * k])) ||
            (rc = resolve(images_dir, f[n == 3 ? 0 : 2], j, pairs_path, line, &p->paths[2 * k + 1]))) {
            p->n_pairs = k + 1; /* frees what was resolved */
            goto out;
        }
        p->n_pairs = k + 1;
    }
    if (p->n_pairs == 0) {
        rc = pf_err(-EPROTO, "%s: no pairs", pairs_path);
        goto out;
    }
    if (expect >= 0 && expect != p->n_pairs) {
        rc = pf_err(-EPROTO, "%s: header (line %d) announces %lld pairs, the file has %lld", pairs_path,
                    expect_line, expect, (long long)p->n_pairs);
        goto out;
    }
out:
    free(text);
    if (rc)
        eval_pairs_free(p);
    return rc;
}
