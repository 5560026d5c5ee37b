/* A reader of Prometheus's text exposition format, version 0.0.4
 * (https://prometheus.io/docs/instrumenting/exposition_formats/), as `pfcps top` scrapes it from the daemons'
 * /metrics endpoints (common/metrics.h writes it).
 *
 * A page is lines ending in '\n' (the last one may lack it; a '\r' before it is ignored):
 *   - blank lines, and comments: '#' then anything except HELP / TYPE, ignored;
 *   - `# HELP name text`: the family's help text, escapes \\ and \n;
 *   - `# TYPE name counter|gauge|histogram|summary|untyped`, at most once per family and before its samples;
 *   - samples: `name{label="value",...} value [timestamp]`, blanks (spaces, tabs) allowed between the parts
 *     and at the line's start; `{}` and a trailing comma allowed; label values escape \\, \" and \n and are
 *     UTF-8; a value is a decimal floating-point number, +Inf, -Inf or NaN (any case); the timestamp an
 *     integer of milliseconds.
 * Metric names match [a-zA-Z_:][a-zA-Z0-9_:]*, label names [a-zA-Z_][a-zA-Z0-9_]* (and not __name__); a
 * sample repeats no label name. In a histogram family every _bucket sample's `le`, and in a summary every
 * `quantile`, is a number. Anything else is refused with the line's number and the problem, as Prometheus's
 * own parser (expfmt) refuses it. */
#ifndef PFCPS_TOOLS_PROM_TEXT_H
#define PFCPS_TOOLS_PROM_TEXT_H

#include <stddef.h>
#include <stdint.h>

/* The largest page prom_parse reads, bytes (a daemon's page is a few tens of KiB). */
#define PROM_TEXT_MAX_BYTES (16u << 20)
/* The most labels one sample may have. */
#define PROM_MAX_LABELS 64

typedef struct prom_label {
    const char *name, *value; /* NUL-terminated; value unescaped */
} prom_label;

typedef struct prom_sample {
    const char *name;
    const prom_label *labels; /* nlabels, in the page's order */
    int nlabels;
    double value;
    int has_timestamp;
    int64_t timestamp_ms;
    int line; /* 1-based line of the page */
} prom_sample;

typedef enum prom_type { PROM_UNTYPED, PROM_COUNTER, PROM_GAUGE, PROM_HISTOGRAM, PROM_SUMMARY } prom_type;

/* A family named by a # HELP or # TYPE line. */
typedef struct prom_family {
    const char *name;
    prom_type type;   /* PROM_UNTYPED without a # TYPE line */
    const char *help; /* unescaped; NULL without a # HELP line */
} prom_family;

/* A parsed page; every string points into its own storage, freed by prom_page_free. */
typedef struct prom_page {
    prom_sample *samples;
    int nsamples;
    prom_family *families;
    int nfamilies;
    char *strings;      /* storage of every name, label and help text */
    prom_label *labels; /* storage of every sample's labels */
} prom_page;

/* Parses the len bytes of text (not NUL-terminated; a NUL byte is refused) into *page (which the caller
 * frees with prom_page_free, also after a failure). Returns 0; -E2BIG for a page over PROM_TEXT_MAX_BYTES;
 * -EINVAL for malformed text, pf_errmsg() then reading "line N: <the problem>"; -ENOMEM. */
int prom_parse(const char *text, size_t len, prom_page *page);

/* Frees what prom_parse allocated and zeroes *page (a zeroed page is fine). */
void prom_page_free(prom_page *page);

/* The first sample named `name` that has every label of match = {key1, value1, key2, value2, ...} (nmatch
 * pairs; NULL, 0: any), or NULL. */
const prom_sample *prom_find(const prom_page *page, const char *name, const char *const *match, int nmatch);

/* The value of label `name` of sample s, or NULL when it has none. */
const char *prom_label_get(const prom_sample *s, const char *name);

/* The family `name` (from # HELP / # TYPE lines), or NULL. */
const prom_family *prom_family_find(const prom_page *page, const char *name);

/* "counter", "gauge", "histogram", "summary" or "untyped". */
const char *prom_type_name(prom_type t);

#endif
