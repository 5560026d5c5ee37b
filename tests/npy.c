#include "tests/npy.h"

#include "common/err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int npy_load(const char *path, npy_array *out)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f)
        return pf_err(-ENOENT, "%s: cannot open", path);
    unsigned char pre[10];
    int rc = -EINVAL;
    char *hdr = NULL;
    if (fread(pre, 1, 8, f) != 8 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        pf_err(rc, "%s: not a .npy file", path);
        goto done;
    }
    size_t hlen;
    if (pre[6] == 1) {
        if (fread(pre + 8, 1, 2, f) != 2)
            goto trunc;
        hlen = pre[8] | (size_t)pre[9] << 8;
    } else {
        unsigned char l[4];
        if (fread(l, 1, 4, f) != 4)
            goto trunc;
        hlen = l[0] | (size_t)l[1] << 8 | (size_t)l[2] << 16 | (size_t)l[3] << 24;
    }
    hdr = calloc(1, hlen + 1);
    if (!hdr || fread(hdr, 1, hlen, f) != hlen)
        goto trunc;
    const char *d = strstr(hdr, "'descr':");
    const char *fo = strstr(hdr, "'fortran_order':");
    const char *sh = strstr(hdr, "'shape':");
    if (!d || !fo || !sh) {
        pf_err(rc, "%s: malformed header", path);
        goto done;
    }
    d = strchr(d + 8, '\'');
    if (!d || (d[1] != '<' && d[1] != '|') || (d[2] != 'f' && d[2] != 'i') || (d[3] != '4' && d[3] != '8')) {
        pf_err(rc, "%s: unsupported dtype", path);
        goto done;
    }
    out->dtype = d[2];
    out->itemsize = d[3] - '0';
    if (strncmp(fo + 16, " True", 5) == 0) {
        pf_err(rc, "%s: fortran order not supported", path);
        goto done;
    }
    const char *p = strchr(sh, '(') + 1;
    out->count = 1;
    while (*p && *p != ')') {
        while (*p == ' ' || *p == ',')
            p++;
        if (*p == ')')
            break;
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || out->ndim == 8) {
            pf_err(rc, "%s: bad shape", path);
            goto done;
        }
        out->shape[out->ndim++] = v;
        out->count *= (size_t)v;
        p = end;
    }
    out->data = malloc(out->count * out->itemsize + 1);
    if (!out->data || fread(out->data, out->itemsize, out->count, f) != out->count)
        goto trunc;
    rc = 0;
    goto done;
trunc:
    rc = pf_err(-EINVAL, "%s: truncated", path);
done:
    free(hdr);
    fclose(f);
    if (rc)
        npy_free(out);
    return rc;
}

int npy_load2(const char *dir, const char *name, npy_array *out)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return npy_load(path, out);
}

#define CONVERT(T)                                                                                           \
    T *r = malloc(sizeof(T) * (a->count ? a->count : 1));                                                    \
    if (!r)                                                                                                  \
        return NULL;                                                                                         \
    for (size_t i = 0; i < a->count; i++) {                                                                  \
        if (a->dtype == 'f' && a->itemsize == 4)                                                             \
            r[i] = (T)((const float *)a->data)[i];                                                           \
        else if (a->dtype == 'f')                                                                            \
            r[i] = (T)((const double *)a->data)[i];                                                          \
        else if (a->itemsize == 4)                                                                           \
            r[i] = (T)((const int32_t *)a->data)[i];                                                         \
        else                                                                                                 \
            r[i] = (T)((const int64_t *)a->data)[i];                                                         \
    }                                                                                                        \
    return r;

float *npy_to_f32(const npy_array *a)
{
    CONVERT(float)
}
double *npy_to_f64(const npy_array *a){CONVERT(double)} int64_t *npy_to_i64(const npy_array *a)
{
    CONVERT(int64_t)
}

void npy_free(npy_array *a)
{
    free(a->data);
    a->data = NULL;
}

char *npy_read_text(const char *dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s)
        s[n] = '\0';
    fclose(f);
    return s;
}

double npy_json_number(const char *json, const char *key, double dflt)
{
    char pat[256];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *p = strstr(json, pat);
    if (!p)
        return dflt;
    p = strchr(p + strlen(pat), ':');
    if (!p)
        return dflt;
    char *end;
    double v = strtod(p + 1, &end);
    return end == p + 1 ? dflt : v;
}

int npy_json_int4(const char *json, const char *key, int out[4])
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *p = strstr(json, pat);
    if (!p || !(p = strchr(p, '[')))
        return -1;
    p++;
    for (int i = 0; i < 4; i++) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p)
            return -1;
        out[i] = (int)v;
        p = end;
        while (*p == ',' || *p == ' ' || *p == '\n')
            p++;
    }
    return 0;
}

double *npy_load_f64(const char *dir, const char *name, size_t expect)
{
    npy_array a;
    if (npy_load2(dir, name, &a)) {
        printf("FAIL: %s\n", pf_errmsg());
        return NULL;
    }
    double *d = NULL;
    if (a.count != expect)
        printf("FAIL: %s/%s has %zu values, expected %zu\n", dir, name, a.count, expect);
    else
        d = npy_to_f64(&a);
    npy_free(&a);
    return d;
}

double rel_err_f32_f64(const float *a, const double *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += b[i] * b[i];
    }
    if (isnan(num))
        return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

double max_abs_err_f32_f64(const float *a, const double *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (isnan(d))
            return INFINITY;
        if (d > m)
            m = d;
    }
    return m;
}
