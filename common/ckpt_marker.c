/* The pfcps.torch ranks' checkpoint markers: see ckpt_marker.h. */
#include "common/ckpt_marker.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

/* Two lowercase hex digits per byte, n bytes, nothing after: 0 or -1. */
static int unhex(const char *s, uint8_t *out, size_t n)
{
    if (strlen(s) != 2 * n)
        return -1;
    for (size_t i = 0; i < 2 * n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned v = 0;
        sscanf(s + 2 * i, "%2x", &v);
        out[i] = (uint8_t)v;
    }
    return 0;
}

int ckpt_module_marker_format(char *buf, size_t cap, int64_t step, int rank, int workers, const ckpt_ident *id)
{
    char rid[2 * CKPT_RUN_ID_BYTES + 1], cd[2 * CKPT_DIGEST_BYTES + 1];
    for (int i = 0; i < CKPT_RUN_ID_BYTES; i++)
        snprintf(rid + 2 * i, 3, "%02x", id->run_id[i]);
    for (int i = 0; i < CKPT_DIGEST_BYTES; i++)
        snprintf(cd + 2 * i, 3, "%02x", id->config_digest[i]);
    int n = snprintf(buf, cap, CKPT_MODULE_MARKER_MAGIC "\nstep %lld\nrank %d of %d\nrun_id %s\nseed %llu\nconfig_digest %s\n",
                     (long long)step, rank, workers, rid, (unsigned long long)id->seed, cd);
    if (n < 0 || (size_t)n >= cap)
        return pf_err(-EINVAL, "module checkpoint marker: a buffer of %zu bytes is too small", cap);
    return n;
}

/* A decimal u64, nothing else (no sign, blank or leading zero): 0 with *v, or -1 (also past 2^64 - 1). */
static int decimal(const char *s, uint64_t *v)
{
    size_t n = strlen(s);
    if (n == 0 || n > 20 || (n > 1 && s[0] == '0'))
        return -1;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        uint64_t d = (uint64_t)(s[i] - '0');
        if (x > (UINT64_MAX - d) / 10)
            return -1;
        x = x * 10 + d;
    }
    *v = x;
    return 0;
}

int ckpt_module_marker_parse(const char *text, size_t n, const char *name, int64_t step, int rank, int workers,
                             ckpt_ident *id)
{
    char buf[CKPT_MODULE_MARKER_MAX + 1];
    if (n > CKPT_MODULE_MARKER_MAX)
        return pf_err(-EINVAL, "%s: not a module checkpoint marker (larger than 1 KiB)", name);
    memcpy(buf, text, n);
    buf[n] = 0;
    if (strlen(buf) != n)
        return pf_err(-EINVAL, "%s: not a module checkpoint marker (a NUL byte in it)", name);
    /* six lines, each ending in a newline, each "<key> <value>" after the first */
    static const char *const key[6] = {CKPT_MODULE_MARKER_MAGIC, "step ", "rank ", "run_id ", "seed ",
                                       "config_digest "};
    char *line[6], *p = buf;
    for (int i = 0; i < 6; i++) {
        char *nl = strchr(p, '\n');
        size_t kl = strlen(key[i]);
        if (!nl || strncmp(p, key[i], kl) != 0 || (i == 0 && nl != p + kl))
            return pf_err(-EINVAL, "%s: not a module checkpoint marker (line %d is not \"%s%s\")", name, i + 1,
                          key[i], i ? "..." : "");
        *nl = 0;
        line[i] = p + kl;
        p = nl + 1;
    }
    if (*p)
        return pf_err(-EINVAL, "%s: not a module checkpoint marker (more than six lines)", name);
    uint64_t t = 0, r = 0, w = 0, seed = 0;
    char *of = strstr(line[2], " of ");
    if (of)
        *of = 0;
    if (decimal(line[1], &t) < 0 || !of || decimal(line[2], &r) < 0 || decimal(of + 4, &w) < 0 ||
        decimal(line[4], &seed) < 0)
        return pf_err(-EINVAL, "%s: step, rank, W or seed is not a plain decimal number", name);
    if ((int64_t)t != step || r != (uint64_t)rank || w != (uint64_t)workers)
        return pf_err(-EINVAL, "%s: names step %llu, rank %llu of %llu (its place says step %lld, rank %d of %d)",
                      name, (unsigned long long)t, (unsigned long long)r, (unsigned long long)w, (long long)step,
                      rank, workers);
    if (unhex(line[3], id->run_id, CKPT_RUN_ID_BYTES) < 0 || unhex(line[5], id->config_digest, CKPT_DIGEST_BYTES) < 0)
        return pf_err(-EINVAL, "%s: run_id or config_digest is not %d / %d lowercase hex digits", name,
                      2 * CKPT_RUN_ID_BYTES, 2 * CKPT_DIGEST_BYTES);
    id->seed = seed;
    return 0;
}
