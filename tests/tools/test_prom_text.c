/* tools/prom_text.c, the reader of Prometheus's text exposition format that `pfcps top` uses: hand-written
 * pages against the values, labels, help texts and types written by hand below (escapes, blanks, +Inf /
 * -Inf / NaN, timestamps, a last line without '\n', histograms and summaries), malformed pages refused with
 * the line number and the problem named, the bounds; and every page of these tables given to Prometheus's
 * own parser (promtool check metrics, where installed): it must accept what prom_parse accepts and refuse
 * what prom_parse refuses. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/err.h"
#include "tests/check.h"
#include "tools/prom_text.h"

static int parse(const char *text, prom_page *pg)
{
    return prom_parse(text, strlen(text), pg);
}

/* What promtool says of text (a '\n' added when it lacks one: promtool wants every line ended): 1 accepted
 * (exit 0, or 3: lint remarks only), 0 refused (exit 1), -1 promtool missing or failing otherwise. */
static int promtool_accepts(const char *text)
{
    static int have = -1;
    if (have < 0)
        have = system("command -v promtool >/dev/null 2>&1") == 0;
    if (!have)
        return -1;
    char path[] = "/tmp/pfcps_prom_text_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        return -1;
    size_t n = strlen(text);
    int ok = write(fd, text, n) == (ssize_t)n && (n == 0 || text[n - 1] == '\n' || write(fd, "\n", 1) == 1);
    close(fd);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "promtool check metrics < %s >/dev/null 2>&1", path);
    int st = ok ? system(cmd) : -1;
    unlink(path);
    if (st == -1 || !WIFEXITED(st))
        return -1;
    return WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 3 ? 1 : WEXITSTATUS(st) == 1 ? 0 : -1;
}

/* A page the way common/metrics.c writes one, with every form the format allows. */
static void test_page(void)
{
    const char *text = "# HELP pfcps_worker_step global steps completed\n"
                       "# TYPE pfcps_worker_step gauge\n"
                       "pfcps_worker_step{role=\"worker\",rank=\"1\",run=\"\"} 1234\n"
                       "# HELP x_total back\\\\slash and\\nnewline\n"
                       "# TYPE x_total COUNTER\n"
                       "x_total 5 1700000000000\n"
                       "\n"
                       "  \tindented { a = \"1\" ,b=\"2\", } \t3.5e-3   -12\n"
                       "nolabels{} -7\n"
                       "escapes{v=\"a\\\\b\\\"c\\nd\",u=\"\xc3\xa9\xe2\x82\xac\"} .5\n"
                       "infs{s=\"+\"} +Inf\n"
                       "infs{s=\"-\"} -Inf\n"
                       "infs{s=\"lower\"} inf\n"
                       "not_a_number NaN\n"
                       "# a plain comment, ignored: # TYPE inside it\n"
                       "#\n"
                       "# HELP\n"
                       "colon:name_1 1e3\n";
    prom_page pg;
    int rc = parse(text, &pg);
    CHECK(rc == 0, "page: parse returned %d (%s)", rc, pf_errmsg());
    CHECK(pg.nsamples == 10, "page: %d samples, want 10", pg.nsamples);
    if (rc || pg.nsamples != 10)
        return prom_page_free(&pg);
    const prom_sample *s = &pg.samples[0];
    CHECK(strcmp(s->name, "pfcps_worker_step") == 0 && s->value == 1234 && s->nlabels == 3 && s->line == 3,
          "sample 0: %s = %g, %d labels, line %d", s->name, s->value, s->nlabels, s->line);
    CHECK(strcmp(prom_label_get(s, "role"), "worker") == 0 && strcmp(prom_label_get(s, "rank"), "1") == 0 &&
              strcmp(prom_label_get(s, "run"), "") == 0 && prom_label_get(s, "nope") == NULL,
          "sample 0: labels");
    CHECK(strcmp(s->labels[0].name, "role") == 0 && strcmp(s->labels[2].name, "run") == 0, "labels in order");
    s = &pg.samples[1];
    CHECK(s->value == 5 && s->has_timestamp && s->timestamp_ms == 1700000000000LL && s->line == 6,
          "x_total: %g at %lld, line %d", s->value, (long long)s->timestamp_ms, s->line);
    s = &pg.samples[2];
    CHECK(strcmp(s->name, "indented") == 0 && s->value == 3.5e-3 && s->has_timestamp &&
              s->timestamp_ms == -12 && s->nlabels == 2 && strcmp(prom_label_get(s, "b"), "2") == 0 &&
              s->line == 8,
          "indented: %g, %d labels, ts %lld, line %d", s->value, s->nlabels, (long long)s->timestamp_ms,
          s->line);
    s = &pg.samples[3];
    CHECK(s->value == -7 && s->nlabels == 0 && !s->has_timestamp, "nolabels: %g", s->value);
    s = &pg.samples[4];
    CHECK(strcmp(prom_label_get(s, "v"), "a\\b\"c\nd") == 0, "escapes: v = [%s]", prom_label_get(s, "v"));
    CHECK(strcmp(prom_label_get(s, "u"), "\xc3\xa9\xe2\x82\xac") == 0 && s->value == 0.5, "UTF-8 label, .5");
    CHECK(isinf(pg.samples[5].value) && pg.samples[5].value > 0, "+Inf: %g", pg.samples[5].value);
    CHECK(isinf(pg.samples[6].value) && pg.samples[6].value < 0, "-Inf: %g", pg.samples[6].value);
    CHECK(isinf(pg.samples[7].value) && pg.samples[7].value > 0, "inf: %g", pg.samples[7].value);
    CHECK(isnan(pg.samples[8].value), "NaN: %g", pg.samples[8].value);
    CHECK(strcmp(pg.samples[9].name, "colon:name_1") == 0 && pg.samples[9].value == 1000 &&
              pg.samples[9].line == 18,
          "colon:name_1 = %g, line %d", pg.samples[9].value, pg.samples[9].line);
    const char *minus[] = {"s", "-"};
    const prom_sample *f = prom_find(&pg, "infs", minus, 1);
    CHECK(f == &pg.samples[6], "prom_find infs{s=\"-\"}");
    CHECK(prom_find(&pg, "infs", NULL, 0) == &pg.samples[5], "prom_find infs: the first");
    const char *none[] = {"s", "x"};
    CHECK(prom_find(&pg, "infs", none, 1) == NULL && prom_find(&pg, "absent", NULL, 0) == NULL,
          "prom_find misses");
    CHECK(pg.nfamilies == 2, "families: %d, want 2 (those with HELP or TYPE)", pg.nfamilies);
    const prom_family *fam = prom_family_find(&pg, "x_total");
    CHECK(fam && fam->type == PROM_COUNTER && strcmp(fam->help, "back\\slash and\nnewline") == 0,
          "x_total: counter, help unescaped");
    fam = prom_family_find(&pg, "pfcps_worker_step");
    CHECK(fam && fam->type == PROM_GAUGE && strcmp(fam->help, "global steps completed") == 0 &&
              strcmp(prom_type_name(fam->type), "gauge") == 0,
          "pfcps_worker_step: gauge");
    CHECK(prom_family_find(&pg, "indented") == NULL, "no family for samples without HELP / TYPE");
    prom_page_free(&pg);
    CHECK(pg.samples == NULL && pg.nsamples == 0, "prom_page_free zeroes the page");
    CHECK(promtool_accepts(text) != 0, "page: promtool refuses it");
}

/* Histograms and summaries; the last line without '\n'; an empty page. */
static void test_histogram(void)
{
    const char *text = "# TYPE h histogram\n"
                       "h_bucket{le=\"0.005\"} 2\n"
                       "h_bucket{le=\"+Inf\"} 10\n"
                       "h_sum 0.125\n"
                       "h_count 10\n"
                       "# TYPE q summary\n"
                       "q{quantile=\"0.5\"} 0.25\n"
                       "q_sum 3\n"
                       "q_count 4";
    prom_page pg;
    int rc = parse(text, &pg);
    CHECK(rc == 0 && pg.nsamples == 7, "histogram page: rc %d, %d samples (%s)", rc, pg.nsamples,
          pf_errmsg());
    if (rc == 0 && pg.nsamples == 7) {
        const char *inf[] = {"le", "+Inf"};
        const prom_sample *s = prom_find(&pg, "h_bucket", inf, 1);
        CHECK(s && s->value == 10 && s->line == 3, "h_bucket{le=+Inf} = 10 on line 3");
        CHECK(pg.samples[6].value == 4 && pg.samples[6].line == 9,
              "q_count = %g on line %d (no final newline)", pg.samples[6].value, pg.samples[6].line);
        const prom_family *h = prom_family_find(&pg, "h"), *q = prom_family_find(&pg, "q");
        CHECK(h && h->type == PROM_HISTOGRAM && !h->help && q && q->type == PROM_SUMMARY,
              "histogram, summary");
    }
    prom_page_free(&pg);
    CHECK(promtool_accepts(text) != 0, "histogram page: promtool refuses it");
    CHECK(prom_parse("", 0, &pg) == 0 && pg.nsamples == 0, "an empty page: no samples");
    prom_page_free(&pg);
    CHECK(parse("\n\n   \n# only comments\n", &pg) == 0 && pg.nsamples == 0, "blank lines and comments");
    prom_page_free(&pg);
}

/* Pages Prometheus accepts, with their sample counts: each must parse. */
static void test_accepted(void)
{
    static const struct {
        const char *text;
        int nsamples;
    } good[] = {
        {"a{b=\"c\"}1\n", 1},
        {"x {a=\"b\"} 1\n", 1},
        {"x{a=\"b\" , } 1\n", 1},
        {"a{b=\"c\"\t,\td=\"e\"\t}\t1\n", 1},
        {"# TYPE a\n# HELP a \n", 0},
        {"# HELP a \xff\n", 0},
        {"#  TYPE a counter\na 1\n", 1},
        {"\t# HELP a b\n", 0},
        {"a 1 +5\na 2 -5\n", 2},
        {"a NAN\nb inF\nc -Infinity\nd 1.\ne +.5e+3\nf 1e-400\ng -0\n", 7},
        {"# TYPE h histogram\nh_bucket 1\nh 2\n", 2},
        {"# TYPE q summary\nq 1\n", 1},
        {"# TYPE a_bucket gauge\n# TYPE a histogram\na_bucket{le=\"1\"} 1\n", 1},
        {"# TYPE a gauge\na{le=\"x\"} 1\n", 1},
        {"a 1\n\n\na 2\n", 2},
    };
    for (size_t k = 0; k < sizeof good / sizeof *good; k++) {
        prom_page pg;
        int rc = parse(good[k].text, &pg);
        check(rc == 0 && pg.nsamples == good[k].nsamples, "accepted %zu: rc %d (%s), %d samples, want %d", k,
              rc, rc ? pf_errmsg() : "", pg.nsamples, good[k].nsamples);
        prom_page_free(&pg);
        int p = promtool_accepts(good[k].text);
        if (p >= 0)
            check(p == 1, "accepted %zu: promtool accepts it too", k);
    }
}

/* Each malformed page is refused with -EINVAL and a message that starts with its line and names the
 * problem (the message begins with `want`). */
static void test_malformed(void)
{
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"ok 1\nbad{a=\"x\" 1\n",
         "line 2: labels of 'bad': expected ',' or '}' after the value of label 'a', got '1'"},
        {"a{b=\"x\\q\"} 1", "line 1: the value of label 'b': invalid escape: backslash then 'q'"},
        {"a{b=\"open} 1\nb 2\n",
         "line 1: the value of label 'b': not closed by '\"' before the end of the line"},
        {"a 1 2 3", "line 1: unexpected ' ' after the timestamp of 'a'"},
        {"a 1 2 \n", "line 1: unexpected ' ' after the timestamp of 'a'"},
        {"a 1 \n", "line 1: 'a': blanks after the value but no timestamp"},
        {"a 1\t\n", "line 1: 'a': blanks after the value but no timestamp"},
        {"a abc", "line 1: value 'abc' of 'a' is not a number"},
        {"a 0x10", "line 1: value '0x10' of 'a' is not a number"},
        {"a 0x1p3", "line 1: value '0x1p3' of 'a' is not a number"},
        {"a 1_000", "line 1: value '1_000' of 'a' is not a number"},
        {"a 1e", "line 1: value '1e' of 'a' is not a number"},
        {"a -NaN", "line 1: value '-NaN' of 'a' is not a number"},
        {"a 1e999", "line 1: value '1e999' of 'a' is not a number"},
        {"a 1 1.5", "line 1: timestamp '1.5' of 'a' is not an integer of milliseconds"},
        {"a 1 99999999999999999999", "line 1: timestamp '99999999999999999999' of 'a' is not an integer"},
        {"\n\n1a 1", "line 3: expected a metric name, a comment or a blank line, got '1'"},
        {"a\n", "line 1: 'a' has no value"},
        {"a{} \n", "line 1: 'a' has no value"},
        {"a-b 1", "line 1: unexpected '-' in the metric name 'a'"},
        {"a{b=\"1\",b=\"2\"} 1", "line 1: labels of 'a': label 'b' repeated"},
        {"a{__name__=\"x\"} 1", "line 1: labels of 'a': the label name __name__ is reserved"},
        {"a{b=1} 1", "line 1: labels of 'a': expected '\"' to open the value of label 'b', got '1'"},
        {"a{b \"1\"} 1", "line 1: labels of 'a': expected '=' after label name 'b', got '\"'"},
        {"a{1=\"x\"} 1", "line 1: labels of 'a': expected a label name or '}', got '1'"},
        {"x{,} 1", "line 1: labels of 'x': expected a label name or '}', got ','"},
        {"a{b:c=\"x\"} 1", "line 1: labels of 'a': expected '=' after label name 'b', got ':'"},
        {"a{b=\"\xff\"} 1", "line 1: the value of label 'b': not valid UTF-8"},
        {"a{b=\"\xc0\xaf\"} 1", "line 1: the value of label 'b': not valid UTF-8"}, /* overlong '/' */
        {"# TYPE a foo\n", "line 1: # TYPE a: unknown type 'foo'"},
        {"# TYPE a counter \n", "line 1: # TYPE a: unknown type 'counter '"},
        {"# TYPE a counter extra\n", "line 1: # TYPE a: unknown type 'counter extra'"},
        {"# TYPE 9a counter\n", "line 1: # TYPE: expected a metric name, got '9'"},
        {"# HELP a-b x\n", "line 1: # HELP a: unexpected '-' in the metric name"},
        {"# HELP a x\\\"y\n", "line 1: help text: invalid escape: backslash then '\"'"},
        {"# TYPE a counter\n# TYPE a gauge\n", "line 2: second TYPE line for 'a', or TYPE after its samples"},
        {"a 1\n# TYPE a counter\n", "line 2: second TYPE line for 'a', or TYPE after its samples"},
        {"# HELP a x\n# HELP a y\n", "line 2: second HELP line for 'a'"},
        {"# TYPE a counter\n# HELP a h\na 1\n# HELP a h2\n", "line 4: second HELP line for 'a'"},
        {"# TYPE h histogram\nh_bucket{le=\"x\"} 1\n",
         "line 2: le=\"x\" of histogram 'h_bucket' is not a number"},
        {"# TYPE h histogram\nh_sum{le=\"x\"} 1\n", "line 2: le=\"x\" of histogram 'h_sum' is not a number"},
        {"# TYPE q summary\nq_sum{quantile=\"x\"} 1\n",
         "line 2: quantile=\"x\" of summary 'q_sum' is not a number"},
        /* '\r' ends no line: CRLF pages are refused, as Prometheus refuses them */
        {"# TYPE h histogram\r\nh_sum 1\r\n", "line 1: # TYPE h: unknown type 'histogram\r'"},
        {"a 1\r\n", "line 1: value '1\r' of 'a' is not a number"},
        {"a 1\r2\n", "line 1: value '1\r2' of 'a' is not a number"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        prom_page pg;
        int rc = parse(bad[k].text, &pg);
        const char *msg = pf_errmsg();
        check(rc == -EINVAL && strncmp(msg, bad[k].want, strlen(bad[k].want)) == 0,
              "malformed %zu: rc %d, [%s], want [%s]", k, rc, msg, bad[k].want);
        prom_page_free(&pg);
        int p = promtool_accepts(bad[k].text);
        if (p >= 0)
            check(p == 0, "malformed %zu: promtool refuses it too", k);
    }
    /* A NUL byte, on line 2. */
    prom_page pg;
    int rc = prom_parse("a 1\nb 2\0\n", 9, &pg);
    check(rc == -EINVAL && strcmp(pf_errmsg(), "line 2: NUL byte") == 0, "NUL byte: rc %d, [%s]", rc,
          pf_errmsg());
    prom_page_free(&pg);
    /* 65 labels. */
    char many[2048];
    size_t n = (size_t)snprintf(many, sizeof many, "m{");
    for (int k = 0; k < 65; k++)
        n += (size_t)snprintf(many + n, sizeof many - n, "l%d=\"v\",", k);
    snprintf(many + n, sizeof many - n, "} 1\n");
    rc = parse(many, &pg);
    check(rc == -EINVAL && strcmp(pf_errmsg(), "line 1: labels of 'm': more than 64 labels") == 0,
          "65 labels: rc %d, [%s]", rc, pf_errmsg());
    prom_page_free(&pg);
}

/* The size bound, and a large page of many families (linear: the hash of families). */
static void test_sizes(void)
{
    size_t big = (size_t)PROM_TEXT_MAX_BYTES + 1;
    char *b = xmalloc(big);
    memset(b, '\n', big);
    prom_page pg;
    int rc = prom_parse(b, big, &pg);
    check(rc == -E2BIG && strstr(pf_errmsg(), "over the limit of 16777216 bytes"), "%zu bytes: rc %d, [%s]",
          big, rc, pf_errmsg());
    prom_page_free(&pg);
    rc = prom_parse(b, big - 1, &pg);
    check(rc == 0 && pg.nsamples == 0, "%zu blank lines: rc %d", big - 1, rc);
    prom_page_free(&pg);
    /* 100000 families, each with HELP, TYPE and one sample: family k's value is k. */
    size_t n = 0;
    for (int k = 0; k < 100000; k++)
        n += (size_t)snprintf(b + n, big - n, "# HELP f%d h\n# TYPE f%d gauge\nf%d{i=\"%d\"} %d\n", k, k, k,
                              k, k);
    rc = prom_parse(b, n, &pg);
    check(rc == 0 && pg.nsamples == 100000 && pg.nfamilies == 100000, "100000 families: rc %d, %d samples",
          rc, pg.nsamples);
    if (rc == 0 && pg.nsamples == 100000)
        check(pg.samples[76543].value == 76543 && pg.samples[76543].line == 3 * 76543 + 3 &&
                  strcmp(prom_label_get(&pg.samples[76543], "i"), "76543") == 0,
              "sample 76543: value %g, line %d", pg.samples[76543].value, pg.samples[76543].line);
    prom_page_free(&pg);
    free(b);
}

int main(void)
{
    if (promtool_accepts("") < 0)
        printf("promtool missing (or failing): the pages are not given to Prometheus's parser\n");
    test_page();
    test_histogram();
    test_accepted();
    test_malformed();
    test_sizes();
    return check_summary();
}
