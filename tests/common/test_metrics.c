/* The metrics registry (common/metrics.h) without its endpoint: the exposition text of a registry holding a
 * counter, gauges (an escaped label value and help text, NaN / +Inf / 1e-05 values, a gauge_fn) and a
 * histogram, compared byte for byte with text written by hand from the format's specification
 * (https://prometheus.io/docs/instrumenting/exposition_formats/); the same registration returning the same
 * series; metrics_remove; 4 threads adding to one counter, gauge and histogram at once summing exactly;
 * invalid metric names, label keys, duplicate keys, type conflicts and bounds refused; update functions
 * ignoring NULL; metrics_parse_address and the config key metrics_address. */
#include "common/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/err.h"
#include "tests/check.h"

static double fn_value(void *arg)
{
    return *(const double *)arg;
}

/* Prints both texts line by line where they differ. */
static void expect_text(const char *what, const char *got, const char *want)
{
    int same = got && !strcmp(got, want);
    check(same, "%s: exposition text as written by hand", what);
    if (!same)
        printf("--- got:\n%s--- want:\n%s---\n", got ? got : "(NULL)\n", want);
}

static void test_exposition(void)
{
    metrics_reset();
    metrics_set_identity("server", 0);
    metrics_set_run("");
    pf_metric *c = metrics_counter("pfcps_t_requests_total", "Requests served.", NULL, 0);
    metrics_add(c, 1);
    metrics_add(c, 2.5);
    metrics_add(c, -4); /* ignored: counters only go up */
    metrics_add(c, NAN);
    const char *gl[] = {"path", "a\\b \"c\"\nd", "kind", "x"};
    pf_metric *g = metrics_gauge("pfcps_t_value", "Line one\nline two \\ done.", gl, 2);
    metrics_set(g, 3);
    metrics_add(g, -5.5);
    const char *gl2[] = {"path", "a\\b \"c\"\nd", "kind", "x"};
    check(metrics_gauge("pfcps_t_value", "other help", gl2, 2) == g, "same name and labels: the same series");
    const char *gl3[] = {"path", "p", "kind", "nan"};
    metrics_set(metrics_gauge("pfcps_t_value", NULL, gl3, 2), NAN);
    const char *gl4[] = {"path", "p", "kind", "inf"};
    metrics_set(metrics_gauge("pfcps_t_value", NULL, gl4, 2), INFINITY);
    const char *gl5[] = {"path", "p", "kind", "gone"};
    pf_metric *gone = metrics_gauge("pfcps_t_value", NULL, gl5, 2);
    metrics_set(gone, 7);
    metrics_remove(gone);
    double small = 1e-5;
    metrics_gauge_fn("pfcps_t_small", "A computed value.", NULL, 0, fn_value, &small);
    const double b[] = {0.125, 1, 4};
    pf_metric *h = metrics_histogram("pfcps_t_seconds", "Durations.", NULL, 0, b, 3);
    const double obs[] = {0.0625, 0.125, 0.5, 2, 16}; /* le 0.125: 2; le 1: 3; le 4: 4; +Inf: 5 */
    for (int i = 0; i < 5; i++)
        metrics_observe(h, obs[i]);
    metrics_add(h, 1); /* not a counter or gauge: ignored */
    char *text = metrics_render();
    expect_text("counter, gauges, histogram (rank 0, run empty)", text,
                "# HELP pfcps_t_requests_total Requests served.\n"
                "# TYPE pfcps_t_requests_total counter\n"
                "pfcps_t_requests_total{role=\"server\",rank=\"0\",run=\"\"} 3.5\n"
                "# HELP pfcps_t_value Line one\\nline two \\\\ done.\n"
                "# TYPE pfcps_t_value gauge\n"
                "pfcps_t_value{role=\"server\",rank=\"0\",run=\"\",path=\"a\\\\b \\\"c\\\"\\nd\",kind=\"x\"} -2.5\n"
                "pfcps_t_value{role=\"server\",rank=\"0\",run=\"\",path=\"p\",kind=\"nan\"} NaN\n"
                "pfcps_t_value{role=\"server\",rank=\"0\",run=\"\",path=\"p\",kind=\"inf\"} +Inf\n"
                "# HELP pfcps_t_small A computed value.\n"
                "# TYPE pfcps_t_small gauge\n"
                "pfcps_t_small{role=\"server\",rank=\"0\",run=\"\"} 1e-05\n"
                "# HELP pfcps_t_seconds Durations.\n"
                "# TYPE pfcps_t_seconds histogram\n"
                "pfcps_t_seconds_bucket{role=\"server\",rank=\"0\",run=\"\",le=\"0.125\"} 2\n"
                "pfcps_t_seconds_bucket{role=\"server\",rank=\"0\",run=\"\",le=\"1\"} 3\n"
                "pfcps_t_seconds_bucket{role=\"server\",rank=\"0\",run=\"\",le=\"4\"} 4\n"
                "pfcps_t_seconds_bucket{role=\"server\",rank=\"0\",run=\"\",le=\"+Inf\"} 5\n"
                "pfcps_t_seconds_sum{role=\"server\",rank=\"0\",run=\"\"} 18.6875\n"
                "pfcps_t_seconds_count{role=\"server\",rank=\"0\",run=\"\"} 5\n");
    free(text);

    /* identity changes; rank -1 prints empty; a family whose series were all removed prints nothing */
    metrics_reset();
    metrics_set_identity("worker", -1);
    metrics_set_run("00112233445566778899aabbccddeeff");
    pf_metric *only = metrics_gauge("pfcps_t_only", "Removed.", NULL, 0);
    metrics_remove(only);
    const char *wl[] = {"server", "12"};
    metrics_set(metrics_counter("pfcps_t_wait_seconds_total", "Waits.", wl, 1), 1234567);
    metrics_set(metrics_gauge("pfcps_t_ratio", "A ratio.", NULL, 0), 0.1);
    metrics_set(metrics_gauge("pfcps_t_big", "A big value.", NULL, 0), 1e300);
    metrics_set(metrics_gauge("pfcps_t_neg", "Negative infinity.", NULL, 0), -INFINITY);
    text = metrics_render();
    expect_text("rank unknown, run set, removed family", text,
                "# HELP pfcps_t_wait_seconds_total Waits.\n"
                "# TYPE pfcps_t_wait_seconds_total counter\n"
                "pfcps_t_wait_seconds_total{role=\"worker\",rank=\"\",run=\"00112233445566778899aabbccddeeff\","
                "server=\"12\"} 1234567\n"
                "# HELP pfcps_t_ratio A ratio.\n"
                "# TYPE pfcps_t_ratio gauge\n"
                "pfcps_t_ratio{role=\"worker\",rank=\"\",run=\"00112233445566778899aabbccddeeff\"} 0.1\n"
                "# HELP pfcps_t_big A big value.\n"
                "# TYPE pfcps_t_big gauge\n"
                "pfcps_t_big{role=\"worker\",rank=\"\",run=\"00112233445566778899aabbccddeeff\"} 1e+300\n"
                "# HELP pfcps_t_neg Negative infinity.\n"
                "# TYPE pfcps_t_neg gauge\n"
                "pfcps_t_neg{role=\"worker\",rank=\"\",run=\"00112233445566778899aabbccddeeff\"} -Inf\n");
    free(text);
}

#define NTHREADS 4
#define NADDS    200000

typedef struct {
    pf_metric *c, *g, *h;
} shared;

static void *adder(void *arg)
{
    const shared *s = arg;
    for (int i = 0; i < NADDS; i++) {
        metrics_add(s->c, 1);
        metrics_add(s->g, 0.5);
        metrics_observe(s->h, (i & 1) ? 0.25 : 2); /* half in le 0.5, half in +Inf */
    }
    return NULL;
}

static void test_concurrent(void)
{
    metrics_reset();
    metrics_set_identity("worker", 1);
    metrics_set_run("");
    const double b[] = {0.5};
    shared s = {metrics_counter("pfcps_t_adds_total", "Adds.", NULL, 0), metrics_gauge("pfcps_t_g", "G.", NULL, 0),
                metrics_histogram("pfcps_t_h", "H.", NULL, 0, b, 1)};
    pthread_t t[NTHREADS];
    for (int i = 0; i < NTHREADS; i++)
        if (pthread_create(&t[i], NULL, adder, &s) != 0)
            DIE("pthread_create");
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(t[i], NULL);
    /* 4 x 200000 = 800000 adds of 1; of 0.5: 400000; observations 400000 x 0.25 + 400000 x 2 = 900000 */
    char *text = metrics_render();
    expect_text("4 threads x 200000 updates", text,
                "# HELP pfcps_t_adds_total Adds.\n"
                "# TYPE pfcps_t_adds_total counter\n"
                "pfcps_t_adds_total{role=\"worker\",rank=\"1\",run=\"\"} 800000\n"
                "# HELP pfcps_t_g G.\n"
                "# TYPE pfcps_t_g gauge\n"
                "pfcps_t_g{role=\"worker\",rank=\"1\",run=\"\"} 400000\n"
                "# HELP pfcps_t_h H.\n"
                "# TYPE pfcps_t_h histogram\n"
                "pfcps_t_h_bucket{role=\"worker\",rank=\"1\",run=\"\",le=\"0.5\"} 400000\n"
                "pfcps_t_h_bucket{role=\"worker\",rank=\"1\",run=\"\",le=\"+Inf\"} 800000\n"
                "pfcps_t_h_sum{role=\"worker\",rank=\"1\",run=\"\"} 900000\n"
                "pfcps_t_h_count{role=\"worker\",rank=\"1\",run=\"\"} 800000\n");
    free(text);
}

static void refused(pf_metric *m, const char *what, const char *msg)
{
    check(m == NULL && strstr(pf_errmsg(), msg) != NULL, "%s refused: %s", what, pf_errmsg());
}

static void test_validation(void)
{
    metrics_reset();
    refused(metrics_counter("1abc", "", NULL, 0), "name starting with a digit", "is not [a-zA-Z_:]");
    refused(metrics_counter("a-b", "", NULL, 0), "name with '-'", "is not [a-zA-Z_:]");
    refused(metrics_counter("", "", NULL, 0), "empty name", "is not [a-zA-Z_:]");
    refused(metrics_gauge("a b", "", NULL, 0), "name with a blank", "is not [a-zA-Z_:]");
    refused(metrics_gauge(NULL, "", NULL, 0), "NULL name", "is not [a-zA-Z_:]");
    const char *reserved[] = {"role", "rank", "run", "le"};
    for (int i = 0; i < 4; i++) {
        const char *l[] = {reserved[i], "v"};
        refused(metrics_gauge("pfcps_t_x", "", l, 1), reserved[i], "is reserved (role, rank, run, le)");
    }
    const char *l1[] = {"__name", "v"};
    refused(metrics_gauge("pfcps_t_x", "", l1, 1), "key __name", "starts with __");
    const char *l2[] = {"9k", "v"};
    refused(metrics_gauge("pfcps_t_x", "", l2, 1), "key 9k", "is not [a-zA-Z_][a-zA-Z0-9_]*");
    const char *l3[] = {"k-1", "v"};
    refused(metrics_gauge("pfcps_t_x", "", l3, 1), "key k-1", "is not [a-zA-Z_][a-zA-Z0-9_]*");
    const char *l4[] = {"k", "a", "k", "b"};
    refused(metrics_gauge("pfcps_t_x", "", l4, 2), "key given twice", "given twice");
    check(metrics_counter("pfcps_t_c_total", "", NULL, 0) != NULL, "counter pfcps_t_c_total registered");
    refused(metrics_gauge("pfcps_t_c_total", "", NULL, 0), "counter name as gauge",
            "already registered as a counter, not a gauge");
    const double up[] = {1, 0.5}, inf[] = {1, INFINITY};
    refused(metrics_histogram("pfcps_t_h1", "", NULL, 0, up, 2), "descending bounds", "not strictly ascending");
    refused(metrics_histogram("pfcps_t_h2", "", NULL, 0, inf, 2), "+Inf bound", "not finite");
    refused(metrics_gauge_fn("pfcps_t_f", "", NULL, 0, NULL, NULL), "gauge_fn without a function", "no function");
    const char *ok[] = {"_k9", "v"};
    check(metrics_gauge("a:b_c9", "", ok, 1) != NULL && metrics_gauge("_x", "", NULL, 0) != NULL,
          "names a:b_c9, _x and key _k9 accepted");
    metrics_add(NULL, 1);
    metrics_set(NULL, 1);
    metrics_observe(NULL, 1);
    metrics_remove(NULL);
    check(1, "updates and remove ignore NULL");
    check(metrics_latency_nbounds == 18 && metrics_latency_bounds[0] == 0.0001 &&
              metrics_latency_bounds[17] == 60,
          "latency bounds: 18, 100 us to 60 s");
}

static void test_address(void)
{
    static const struct {
        const char *in, *host;
        int port;
    } good[] = {{"127.0.0.1:0", "127.0.0.1", 0},  {":9100", "127.0.0.1", 9100}, {"9100", "127.0.0.1", 9100},
                {"[::1]:65535", "::1", 65535},    {"node-3.example:80", "node-3.example", 80},
                {"0.0.0.0:9400", "0.0.0.0", 9400}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        char host[64] = "";
        int port = -1;
        int rc = metrics_parse_address(good[i].in, host, sizeof host, &port);
        check(rc == 0 && !strcmp(host, good[i].host) && port == good[i].port, "address '%s' -> %s port %d",
              good[i].in, host, port);
    }
    static const struct {
        const char *in, *msg;
    } bad[] = {{"", "port must be a number in 0-65535"},         {"host:", "port must be a number in 0-65535"},
               {"host:65536", "port must be a number in 0-65535"}, {"host:-1", "port must be a number"},
               {"host:12a", "port must be a number"},              {"::1:80", "needs brackets"},
               {"a b:1", "host contains ' '"},                     {"host:123456", "port must be a number"},
               {"[]:80", "empty brackets"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char host[64];
        int port;
        int rc = metrics_parse_address(bad[i].in, host, sizeof host, &port);
        check(rc == -EINVAL && strstr(pf_errmsg(), bad[i].msg), "address '%s' refused: %s", bad[i].in,
              pf_errmsg());
    }
    pf_config cfg;
    const char *set_bad[] = {"metrics_address=localhost:99999"};
    int rc = cfg_load_ex(&cfg, NULL, set_bad, 1, 0);
    check(rc == -EINVAL && strstr(pf_errmsg(), "key 'metrics_address'"), "config metrics_address refused: %s",
          pf_errmsg());
    const char *set_ok[] = {"metrics_address=127.0.0.1:0"};
    rc = cfg_load_ex(&cfg, NULL, set_ok, 1, 0);
    check(rc == 0 && !strcmp(cfg.metrics_address, "127.0.0.1:0"), "config metrics_address=127.0.0.1:0 accepted");
    rc = cfg_load_ex(&cfg, NULL, NULL, 0, 0);
    check(rc == 0 && cfg.metrics_address[0] == '\0', "config metrics_address defaults to \"\" (off)");
}

int main(void)
{
    test_exposition();
    test_concurrent();
    test_validation();
    test_address();
    metrics_reset();
    return check_summary();
}
