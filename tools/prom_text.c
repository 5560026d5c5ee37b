/* A reader of Prometheus's text exposition format 0.0.4 (see prom_text.h for the rules). One pass over the
 * page; names, label values and help texts are copied (unescaped) into one block of storage that the source
 * bounds: every string is at most as long as the text it came from, plus its NUL. Families are found through
 * a hash table of names, so a hostile page of many families costs linear time. */
#include "tools/prom_text.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/err.h"
#include "common/utf8.h"

/* A family as the parser tracks it: declared by HELP / TYPE or only named by samples. */
typedef struct fam_state {
    int declared, typed, has_samples;
} fam_state;

typedef struct pcur {
    const char *s;
    size_t n, i;
    int line;
    prom_page *pg;
    size_t spos, scap;   /* strings storage used / allocated */
    size_t nlab, caplab; /* labels used / allocated */
    int capsamp, capfam;
    size_t *lab0;   /* each sample's first label (an index into pg->labels until the end) */
    fam_state *fst; /* per family */
    int *hash;      /* family index + 1 per slot, 0: empty */
    size_t hcap;    /* slots (a power of two) */
} pcur;

static int perr(const pcur *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int perr(const pcur *c, const char *fmt, ...)
{
    char msg[PF_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return pf_err(-EINVAL, "line %d: %s", c->line, msg);
}

/* The character at the cursor as an error message shows it: 'x', or "the end of the line". */
static const char *here(const pcur *c, char buf[16])
{
    if (c->i >= c->n || c->s[c->i] == '\n')
        return "the end of the line";
    unsigned char ch = (unsigned char)c->s[c->i];
    if (ch >= 0x20 && ch < 0x7f)
        snprintf(buf, 16, "'%c'", ch);
    else
        snprintf(buf, 16, "byte 0x%02x", ch);
    return buf;
}

static int peek(const pcur *c)
{
    return c->i < c->n ? (unsigned char)c->s[c->i] : -1;
}

static void skip_blanks(pcur *c)
{
    while (c->i < c->n && (c->s[c->i] == ' ' || c->s[c->i] == '\t'))
        c->i++;
}

static int at_eol(const pcur *c)
{
    return c->i >= c->n || c->s[c->i] == '\n';
}

/* Skips blanks; the line must end there (what = what came before, for the message). */
static int end_line(pcur *c, const char *what)
{
    char b[16];
    skip_blanks(c);
    if (!at_eol(c))
        return perr(c, "unexpected %s after %s", here(c, b), what);
    if (c->i < c->n)
        c->i++;
    c->line++;
    return 0;
}

static void skip_line(pcur *c)
{
    while (c->i < c->n && c->s[c->i] != '\n')
        c->i++;
    if (c->i < c->n)
        c->i++;
    c->line++;
}

/* ---- strings storage ---- */

static char *str_begin(pcur *c)
{
    return c->pg->strings + c->spos;
}

static void str_put(pcur *c, char ch)
{
    if (c->spos + 1 < c->scap) /* the storage is sized so that this always holds */
        c->pg->strings[c->spos++] = ch;
}

static const char *str_end(pcur *c, char *begin)
{
    c->pg->strings[c->spos++] = '\0';
    return begin;
}

static int name_start(int ch, int colon)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_' || (colon && ch == ':');
}

static int name_char(int ch, int colon)
{
    return name_start(ch, colon) || (ch >= '0' && ch <= '9');
}

/* Reads a metric name (colon 1) or label name (colon 0) at the cursor into storage; NULL when the cursor is
 * not at one. */
static const char *read_name(pcur *c, int colon)
{
    if (!name_start(peek(c), colon))
        return NULL;
    char *b = str_begin(c);
    while (name_char(peek(c), colon))
        str_put(c, c->s[c->i++]);
    return str_end(c, b);
}

/* Reads text with escapes up to `close` ('"' for a label value, -1 for a help text: up to the end of the
 * line) into storage. quote: a label value (\" is an escape, UTF-8 is required) or a help text (\" is
 * refused, any bytes). */
static int read_escaped(pcur *c, int close, int quote, const char *what, const char **out)
{
    char *b = str_begin(c);
    size_t start = c->spos;
    for (;;) {
        if (close < 0 && at_eol(c))
            break;
        if (c->i >= c->n || c->s[c->i] == '\n')
            return perr(c, "%s: not closed by '\"' before the end of the line", what);
        char ch = c->s[c->i++];
        if (ch == close)
            break;
        if (ch == '\\') {
            char e = c->i < c->n ? c->s[c->i] : '\0';
            if (e == '\\' || e == 'n' || (quote && e == '"')) {
                c->i++;
                ch = e == 'n' ? '\n' : e;
            } else {
                char bb[16];
                return perr(c, "%s: invalid escape: backslash then %s", what, here(c, bb));
            }
        }
        str_put(c, ch);
    }
    if (quote && !pf_utf8_valid((const uint8_t *)b, c->spos - start))
        return perr(c, "%s: not valid UTF-8", what);
    *out = str_end(c, b);
    return 0;
}

/* Makes room for `need` elements of `elem` bytes in *p (capacity *cap, doubled as needed). Returns 0 or
 * -ENOMEM. */
static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 16;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, n * elem);
    if (!q)
        return pf_err(-ENOMEM, "out of memory for %zu parsed elements", n);
    *p = q;
    *cap = n;
    return 0;
}

/* ---- families: a hash table of names (FNV-1a, linear probing) ---- */

static uint64_t name_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* The family whose name is s[0..n), or -1. */
static int fam_lookup(const pcur *c, const char *s, size_t n)
{
    if (!c->hcap)
        return -1;
    for (size_t k = name_hash(s, n) & (c->hcap - 1);; k = (k + 1) & (c->hcap - 1)) {
        int v = c->hash[k];
        if (!v)
            return -1;
        const char *f = c->pg->families[v - 1].name;
        if (strncmp(f, s, n) == 0 && f[n] == '\0')
            return v - 1;
    }
}

static void fam_insert(pcur *c, int f)
{
    const char *name = c->pg->families[f].name;
    size_t k = name_hash(name, strlen(name)) & (c->hcap - 1);
    while (c->hash[k])
        k = (k + 1) & (c->hcap - 1);
    c->hash[k] = f + 1;
}

/* Adds family `name` (in storage), undeclared. Returns its index or -ENOMEM. */
static int fam_add(pcur *c, const char *name)
{
    prom_page *pg = c->pg;
    size_t n = (size_t)pg->nfamilies, cap = (size_t)c->capfam, capst = cap;
    if (grow((void **)&pg->families, &cap, n + 1, sizeof *pg->families) < 0 ||
        grow((void **)&c->fst, &capst, n + 1, sizeof *c->fst) < 0)
        return -ENOMEM;
    c->capfam = (int)(cap < capst ? cap : capst);
    if ((n + 1) * 2 > c->hcap) {
        size_t hcap = c->hcap ? c->hcap * 2 : 64;
        int *h = calloc(hcap, sizeof *h);
        if (!h)
            return pf_err(-ENOMEM, "out of memory for %zu families", n + 1);
        free(c->hash);
        c->hash = h;
        c->hcap = hcap;
        for (size_t f = 0; f < n; f++)
            fam_insert(c, (int)f);
    }
    pg->families[n] = (prom_family){.name = name, .type = PROM_UNTYPED, .help = NULL};
    c->fst[n] = (fam_state){0, 0, 0};
    pg->nfamilies++;
    fam_insert(c, (int)n);
    return (int)n;
}

/* ---- values ---- */

/* Parses t[0..n) as a sample value: a decimal floating-point number, [+-]Inf / Infinity or NaN (any case).
 * Returns 0 or -1. */
static int parse_number(const char *t, size_t n, double *v)
{
    char buf[512];
    if (n == 0 || n >= sizeof buf)
        return -1;
    memcpy(buf, t, n);
    buf[n] = '\0';
    int sign = buf[0] == '+' || buf[0] == '-';
    if (strcasecmp(buf + sign, "inf") == 0 || strcasecmp(buf + sign, "infinity") == 0) {
        *v = buf[0] == '-' ? -INFINITY : INFINITY;
        return 0;
    }
    if (strcasecmp(buf, "nan") == 0) {
        *v = NAN;
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        if (!isdigit((unsigned char)buf[i]) && !strchr(".eE+-", buf[i]))
            return -1;
    char *end = NULL;
    errno = 0;
    double x = strtod(buf, &end);
    if (end != buf + n || (errno == ERANGE && isinf(x)))
        return -1;
    *v = x;
    return 0;
}

/* Parses t[0..n) as a timestamp: a base-10 int64 of milliseconds. Returns 0 or -1. */
static int parse_timestamp(const char *t, size_t n, int64_t *v)
{
    char buf[32];
    if (n == 0 || n >= sizeof buf)
        return -1;
    memcpy(buf, t, n);
    buf[n] = '\0';
    for (size_t i = (buf[0] == '-' || buf[0] == '+'); i < n; i++)
        if (!isdigit((unsigned char)buf[i]))
            return -1;
    char *end = NULL;
    errno = 0;
    long long x = strtoll(buf, &end, 10);
    if (end != buf + n || errno)
        return -1;
    *v = (int64_t)x;
    return 0;
}

/* The end of the token at the cursor: the next blank or end of line. */
static size_t token_end(const pcur *c)
{
    size_t i = c->i;
    while (i < c->n && c->s[i] != ' ' && c->s[i] != '\t' && c->s[i] != '\n')
        i++;
    return i;
}

/* ---- lines ---- */

/* A comment line at the cursor ('#'): HELP and TYPE are read, anything else skipped. */
static int parse_comment(pcur *c)
{
    char b[16];
    c->i++;
    skip_blanks(c);
    size_t w0 = c->i, w1 = token_end(c);
    int help = w1 - w0 == 4 && memcmp(c->s + w0, "HELP", 4) == 0;
    int type = w1 - w0 == 4 && memcmp(c->s + w0, "TYPE", 4) == 0;
    if (!help && !type) {
        skip_line(c);
        return 0;
    }
    const char *kw = help ? "HELP" : "TYPE";
    c->i = w1;
    skip_blanks(c);
    if (at_eol(c)) /* "# HELP" alone: a plain comment, as Prometheus reads it */
        return end_line(c, kw);
    const char *name = read_name(c, 1);
    if (!name)
        return perr(c, "# %s: expected a metric name, got %s", kw, here(c, b));
    if (!at_eol(c) && peek(c) != ' ' && peek(c) != '\t')
        return perr(c, "# %s %.100s: unexpected %s in the metric name", kw, name, here(c, b));
    skip_blanks(c);
    if (at_eol(c)) /* "# TYPE name" and nothing else: a plain comment too */
        return end_line(c, kw);
    int f = fam_lookup(c, name, strlen(name));
    if (f < 0 && (f = fam_add(c, name)) < 0)
        return f;
    prom_family *fam = &c->pg->families[f];
    c->fst[f].declared = 1;
    if (help) {
        if (fam->help)
            return perr(c, "second HELP line for '%.100s'", name);
        int rc = read_escaped(c, -1, 0, "help text", &fam->help);
        return rc < 0 ? rc : end_line(c, "the help text");
    }
    if (c->fst[f].typed || c->fst[f].has_samples)
        return perr(c, "second TYPE line for '%.100s', or TYPE after its samples", name);
    static const char *const types[] = {"untyped", "counter", "gauge", "histogram", "summary"};
    size_t t0 = c->i, t1 = t0; /* the type is the rest of the line, blanks included */
    while (t1 < c->n && c->s[t1] != '\n')
        t1++;
    for (int t = 0; t < 5; t++)
        if (t1 - t0 == strlen(types[t]) && strncasecmp(c->s + t0, types[t], t1 - t0) == 0) {
            fam->type = (prom_type)t;
            c->fst[f].typed = 1;
            c->i = t1;
            return end_line(c, "the type");
        }
    return perr(c, "# TYPE %.100s: unknown type '%.*s' (counter, gauge, histogram, summary or untyped)", name,
                (int)(t1 - t0 > 40 ? 40 : t1 - t0), c->s + t0);
}

/* The labels of a sample of `metric` at the cursor ('{'), up to and including '}'. */
static int parse_labels(pcur *c, const char *metric)
{
    char b[16], what[128];
    prom_page *pg = c->pg;
    size_t first = c->nlab;
    c->i++;
    for (;;) {
        skip_blanks(c);
        if (peek(c) == '}') {
            c->i++;
            return 0;
        }
        const char *ln = read_name(c, 0);
        if (!ln)
            return perr(c, "labels of '%.100s': expected a label name or '}', got %s", metric, here(c, b));
        if (strcmp(ln, "__name__") == 0)
            return perr(c, "labels of '%.100s': the label name __name__ is reserved", metric);
        for (size_t k = first; k < c->nlab; k++)
            if (strcmp(pg->labels[k].name, ln) == 0)
                return perr(c, "labels of '%.100s': label '%.100s' repeated", metric, ln);
        if (c->nlab - first >= PROM_MAX_LABELS)
            return perr(c, "labels of '%.100s': more than %d labels", metric, PROM_MAX_LABELS);
        skip_blanks(c);
        if (peek(c) != '=')
            return perr(c, "labels of '%.100s': expected '=' after label name '%.100s', got %s", metric, ln,
                        here(c, b));
        c->i++;
        skip_blanks(c);
        if (peek(c) != '"')
            return perr(c, "labels of '%.100s': expected '\"' to open the value of label '%.100s', got %s",
                        metric, ln, here(c, b));
        c->i++;
        snprintf(what, sizeof what, "the value of label '%.64s'", ln);
        const char *v;
        int rc = read_escaped(c, '"', 1, what, &v);
        if (rc < 0 || (rc = grow((void **)&pg->labels, &c->caplab, c->nlab + 1, sizeof *pg->labels)) < 0)
            return rc;
        pg->labels[c->nlab++] = (prom_label){ln, v};
        skip_blanks(c);
        if (peek(c) == ',') {
            c->i++;
            continue;
        }
        if (peek(c) == '}') {
            c->i++;
            return 0;
        }
        return perr(c, "labels of '%.100s': expected ',' or '}' after the value of label '%.100s', got %s",
                    metric, ln, here(c, b));
    }
}

/* Marks the family of the sample just read (index k) as having samples. In a histogram family an `le`
 * label, in a summary family a `quantile` label, must be a number. */
static int sample_family(pcur *c, int k)
{
    prom_page *pg = c->pg;
    const char *name = pg->samples[k].name;
    size_t len = strlen(name);
    static const char *const sufs[] = {"_bucket", "_sum", "_count"};
    int f = -1;
    for (int s = 0; s < 3 && f < 0; s++) {
        size_t sl = strlen(sufs[s]);
        if (len <= sl || strcmp(name + len - sl, sufs[s]) != 0)
            continue;
        int g = fam_lookup(c, name, len - sl);
        if (g >= 0 &&
            (pg->families[g].type == PROM_HISTOGRAM || (pg->families[g].type == PROM_SUMMARY && s > 0)))
            f = g;
    }
    if (f < 0 && (f = fam_lookup(c, name, len)) < 0 && (f = fam_add(c, name)) < 0)
        return f;
    c->fst[f].has_samples = 1;
    prom_type t = pg->families[f].type;
    const char *key = t == PROM_HISTOGRAM ? "le" : t == PROM_SUMMARY ? "quantile" : NULL;
    const prom_label *l = pg->labels + c->lab0[k];
    for (int j = 0; key && j < pg->samples[k].nlabels; j++) {
        double v;
        if (strcmp(l[j].name, key) == 0 && parse_number(l[j].value, strlen(l[j].value), &v) < 0)
            return perr(c, "%s=\"%.40s\" of %s '%.100s' is not a number", key, l[j].value, prom_type_name(t),
                        name);
    }
    return 0;
}

/* A sample line at the cursor. */
static int parse_sample(pcur *c)
{
    char b[16];
    prom_page *pg = c->pg;
    const char *name = read_name(c, 1);
    if (!name)
        return perr(c, "expected a metric name, a comment or a blank line, got %s", here(c, b));
    size_t n = (size_t)pg->nsamples, cap = (size_t)c->capsamp, cap0 = cap;
    if (grow((void **)&pg->samples, &cap, n + 1, sizeof *pg->samples) < 0 ||
        grow((void **)&c->lab0, &cap0, n + 1, sizeof *c->lab0) < 0)
        return -ENOMEM;
    c->capsamp = (int)(cap < cap0 ? cap : cap0);
    prom_sample *sm = &pg->samples[n];
    *sm = (prom_sample){.name = name, .line = c->line};
    c->lab0[n] = c->nlab;
    if (at_eol(c))
        return perr(c, "'%.100s' has no value", name);
    if (peek(c) != '{' && peek(c) != ' ' && peek(c) != '\t')
        return perr(c, "unexpected %s in the metric name '%.100s'", here(c, b), name);
    skip_blanks(c);
    int rc;
    if (peek(c) == '{' && (rc = parse_labels(c, name)) < 0)
        return rc;
    sm->nlabels = (int)(c->nlab - c->lab0[n]);
    skip_blanks(c);
    size_t v1 = token_end(c);
    if (v1 == c->i)
        return perr(c, "'%.100s' has no value", name);
    if (parse_number(c->s + c->i, v1 - c->i, &sm->value) < 0)
        return perr(c, "value '%.*s' of '%.100s' is not a number", (int)(v1 - c->i > 40 ? 40 : v1 - c->i),
                    c->s + c->i, name);
    c->i = v1;
    if (!at_eol(c)) { /* a blank, then the timestamp and nothing else (as Prometheus's expfmt reads it) */
        skip_blanks(c);
        size_t t1 = token_end(c);
        if (t1 == c->i)
            return perr(c, "'%.100s': blanks after the value but no timestamp", name);
        if (parse_timestamp(c->s + c->i, t1 - c->i, &sm->timestamp_ms) < 0)
            return perr(c, "timestamp '%.*s' of '%.100s' is not an integer of milliseconds",
                        (int)(t1 - c->i > 40 ? 40 : t1 - c->i), c->s + c->i, name);
        sm->has_timestamp = 1;
        c->i = t1;
        if (!at_eol(c))
            return perr(c, "unexpected %s after the timestamp of '%.100s'", here(c, b), name);
    }
    if ((rc = sample_family(c, (int)n)) < 0)
        return rc;
    pg->nsamples++;
    return end_line(c, "the sample");
}

/* Points every sample at its labels and keeps only the declared families. */
static void finish(pcur *c)
{
    prom_page *pg = c->pg;
    for (int k = 0; k < pg->nsamples; k++)
        pg->samples[k].labels = pg->labels ? pg->labels + c->lab0[k] : NULL;
    int m = 0;
    for (int f = 0; f < pg->nfamilies; f++)
        if (c->fst[f].declared)
            pg->families[m++] = pg->families[f];
    pg->nfamilies = m;
}

int prom_parse(const char *text, size_t len, prom_page *page)
{
    memset(page, 0, sizeof *page);
    if (len > PROM_TEXT_MAX_BYTES)
        return pf_err(-E2BIG, "page of %zu bytes, over the limit of %u bytes", len, PROM_TEXT_MAX_BYTES);
    const char *nul = len ? memchr(text, 0, len) : NULL;
    if (nul) {
        int line = 1;
        for (const char *p = text; p < nul; p++)
            line += *p == '\n';
        return pf_err(-EINVAL, "line %d: NUL byte", line);
    }
    pcur c = {.s = text, .n = len, .line = 1, .pg = page, .scap = 2 * len + 16};
    if (!(page->strings = malloc(c.scap)))
        return pf_err(-ENOMEM, "out of memory for a page of %zu bytes", len);
    int rc = 0;
    while (rc == 0 && c.i < c.n) {
        skip_blanks(&c);
        if (at_eol(&c))
            rc = end_line(&c, "blanks");
        else if (peek(&c) == '#')
            rc = parse_comment(&c);
        else
            rc = parse_sample(&c);
    }
    if (rc == 0)
        finish(&c);
    free(c.lab0);
    free(c.fst);
    free(c.hash);
    return rc;
}

void prom_page_free(prom_page *page)
{
    free(page->samples);
    free(page->families);
    free(page->strings);
    free(page->labels);
    memset(page, 0, sizeof *page);
}

const char *prom_label_get(const prom_sample *s, const char *name)
{
    for (int j = 0; j < s->nlabels; j++)
        if (strcmp(s->labels[j].name, name) == 0)
            return s->labels[j].value;
    return NULL;
}

const prom_sample *prom_find(const prom_page *page, const char *name, const char *const *match, int nmatch)
{
    for (int k = 0; k < page->nsamples; k++) {
        const prom_sample *s = &page->samples[k];
        if (strcmp(s->name, name) != 0)
            continue;
        int j = 0;
        for (; j < nmatch; j++) {
            const char *v = prom_label_get(s, match[2 * j]);
            if (!v || strcmp(v, match[2 * j + 1]) != 0)
                break;
        }
        if (j == nmatch)
            return s;
    }
    return NULL;
}

const prom_family *prom_family_find(const prom_page *page, const char *name)
{
    for (int f = 0; f < page->nfamilies; f++)
        if (strcmp(page->families[f].name, name) == 0)
            return &page->families[f];
    return NULL;
}

const char *prom_type_name(prom_type t)
{
    static const char *const names[] = {"untyped", "counter", "gauge", "histogram", "summary"};
    return (unsigned)t < 5 ? names[t] : "untyped";
}
