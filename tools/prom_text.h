/* A reader of Prometheus's text exposition format, version 0.0.4
 * (https://prometheus.io/docs/instrumenting/exposition_formats/), as `pfcps top` scrapes it from the daemons'
 * /metrics endpoints (common/metrics.h writes it).
 *
 * A page is lines ending in '\n' (the last one may lack it); blanks are spaces and tabs:
 *   - blank lines, and comments: '#' then anything but HELP / TYPE, ignored; so is "# HELP name" or
 *     "# TYPE name" with nothing after the name;
 *   - `# HELP name text`: the family's help text (the rest of the line, any bytes), escapes \\ and \n;
 *   - `# TYPE name counter|gauge|histogram|summary|untyped` (any case; the rest of the line is the type), at
 *     most once per family and before its samples;
 *   - samples: `name{label="value",...} value [timestamp]`: blanks allowed at the line's start, before '{',
 *     around label names, '=', values and commas, and before the value; `{}` and a trailing comma allowed;
 *     label values escape \\, \" and \n and are UTF-8; a value is a decimal floating-point number, [+-]Inf or
 *     [+-]Infinity or NaN (any case); after the value either the end of the line or blanks and a timestamp
 *     (an integer of milliseconds) that ends the line.
 * Metric names match [a-zA-Z_:][a-zA-Z0-9_:]*, label names [a-zA-Z_][a-zA-Z0-9_]* (and not __name__); a
 * sample repeats no label name. In a histogram family an `le` label, in a summary family a `quantile` label,
 * is a number. Anything else is refused with the line's number and the problem, as Prometheus's expfmt
 * parser (promtool check metrics) refuses it, except that a last line may lack its '\n' and that the
 * bounds below (page size, labels per sample) are this reader's own. tests/tools/test_prom_text.c checks
 * that promtool accepts and refuses the same pages. */
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
