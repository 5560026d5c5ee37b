/* libFuzzer target for the Prometheus text format reader of `pfcps top` (tools/prom_text.c): the input is a
 * scraped page. A refusal must say why, naming its line ("line N: ..." for malformed text); a page that
 * parses must have samples with valid names in line order, and written back as text (samples only, label
 * values escaped, values at full precision) it must parse again to the same samples: names, labels, values
 * (NaN as NaN) and timestamps. Any crash, sanitizer report or leak is a bug. Built only with -Dfuzz=true
 * (clang). */
#include "common/err.h"
#include "tools/prom_text.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int name_ok(const char *s, int colon)
{
    if (!*s || (*s >= '0' && *s <= '9'))
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' ||
              (colon && *s == ':')))
            return 0;
    return 1;
}

/* Appends the text of s to b (growing it; *len used, *cap allocated). */
static void put(char **b, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        *cap = 2 * (*len + n + 1);
        *b = realloc(*b, *cap);
        if (!*b)
            abort();
    }
    memcpy(*b + *len, s, n);
    *len += n;
}

/* The samples of pg as text: name{label="escaped value",...} value [timestamp], one per line. */
static char *write_page(const prom_page *pg, size_t *len)
{
    char *b = NULL, num[64];
    size_t cap = 0;
    *len = 0;
    for (int k = 0; k < pg->nsamples; k++) {
        const prom_sample *s = &pg->samples[k];
        put(&b, len, &cap, s->name, strlen(s->name));
        put(&b, len, &cap, "{", 1);
        for (int j = 0; j < s->nlabels; j++) {
            put(&b, len, &cap, s->labels[j].name, strlen(s->labels[j].name));
            put(&b, len, &cap, "=\"", 2);
            for (const char *v = s->labels[j].value; *v; v++) {
                const char *e = *v == '\\' ? "\\\\" : *v == '"' ? "\\\"" : *v == '\n' ? "\\n" : NULL;
                put(&b, len, &cap, e ? e : v, e ? 2 : 1);
            }
            put(&b, len, &cap, "\",", 2);
        }
        if (isnan(s->value))
            snprintf(num, sizeof num, "} NaN");
        else if (isinf(s->value))
            snprintf(num, sizeof num, "} %sInf", s->value > 0 ? "+" : "-");
        else
            snprintf(num, sizeof num, "} %.17g", s->value);
        put(&b, len, &cap, num, strlen(num));
        if (s->has_timestamp) {
            snprintf(num, sizeof num, " %lld", (long long)s->timestamp_ms);
            put(&b, len, &cap, num, strlen(num));
        }
        put(&b, len, &cap, "\n", 1);
    }
    return b;
}

static void same_samples(const prom_page *a, const prom_page *b)
{
    if (a->nsamples != b->nsamples)
        abort();
    for (int k = 0; k < a->nsamples; k++) {
        const prom_sample *x = &a->samples[k], *y = &b->samples[k];
        if (strcmp(x->name, y->name) != 0 || x->nlabels != y->nlabels ||
            x->has_timestamp != y->has_timestamp ||
            (x->has_timestamp && x->timestamp_ms != y->timestamp_ms) ||
            (isnan(x->value) ? !isnan(y->value) : x->value != y->value))
            abort();
        for (int j = 0; j < x->nlabels; j++)
            if (strcmp(x->labels[j].name, y->labels[j].name) != 0 ||
                strcmp(x->labels[j].value, y->labels[j].value) != 0)
                abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    prom_page pg;
    int rc = prom_parse((const char *)data, size, &pg);
    if (rc < 0) {
        if (rc == -EINVAL && strncmp(pf_errmsg(), "line ", 5) != 0)
            abort(); /* malformed text is refused naming its line */
        prom_page_free(&pg);
        return 0;
    }
    int lines = 1;
    for (size_t i = 0; i < size; i++)
        lines += data[i] == '\n';
    for (int k = 0; k < pg.nsamples; k++) {
        const prom_sample *s = &pg.samples[k];
        if (!name_ok(s->name, 1) || s->line < 1 || s->line > lines ||
            (k && s->line <= pg.samples[k - 1].line) || s->nlabels > PROM_MAX_LABELS)
            abort();
        for (int j = 0; j < s->nlabels; j++)
            if (!name_ok(s->labels[j].name, 0))
                abort();
    }
    size_t len;
    char *text = write_page(&pg, &len);
    prom_page again;
    if (prom_parse(text ? text : "", len, &again) != 0)
        abort();
    same_samples(&pg, &again);
    prom_page_free(&again);
    prom_page_free(&pg);
    free(text);
    return 0;
}
