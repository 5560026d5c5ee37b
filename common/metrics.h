/* Prometheus metrics of one process: a registry of series (counters, gauges, histograms) updated lock-free
 * from any thread, and a /metrics endpoint that serves them in the Prometheus text exposition format
 * (version 0.0.4, https://prometheus.io/docs/instrumenting/exposition_formats/) over HTTP, served by
 * libmicrohttpd on its own thread.
 *
 * Naming follows Prometheus's conventions (https://prometheus.io/docs/practices/naming/): every family is
 * `pfcps_<role>_<what>_<unit>` in base units (seconds, bytes), counters end in `_total`, latencies are
 * histograms. Every series carries the process's constant labels role, rank and run (metrics_set_identity,
 * metrics_set_run), then its own labels. docs/metrics.md lists the families each daemon exports.
 *
 * Registration may happen at any time, before or after metrics_start; a series is never freed before the
 * process exits except through metrics_remove. Updates are a few atomic operations and never block, so the
 * training step pays nothing measurable whether or not the endpoint is on. */
#ifndef PFCPS_COMMON_METRICS_H
#define PFCPS_COMMON_METRICS_H

#include <stddef.h>

typedef struct pf_metric pf_metric;

/* Sets the constant labels of every series: role ("server", "worker") and rank (-1: not yet known, shown as
 * an empty label value). Call again when the rank becomes known. */
void metrics_set_identity(const char *role, int rank);

/* Sets the constant label run (the run id as 32 hex digits, "" until the run formed). */
void metrics_set_run(const char *run);

/* Registers one series of family `name`: labels is {key1, value1, key2, value2, ...} with nlabels pairs
 * (NULL, 0 for none); values are escaped as the format requires (backslash, quote, newline). A family's
 * series share its type and help text (the first registration's); registering the same name and labels
 * again returns the same series. Returns the series, or NULL on out of memory or an invalid name/label key
 * (the update functions ignore NULL, so a metric that could not be registered costs nothing). */
pf_metric *metrics_counter(const char *name, const char *help, const char *const *labels, int nlabels);
pf_metric *metrics_gauge(const char *name, const char *help, const char *const *labels, int nlabels);

/* A histogram with nbounds ascending upper bounds (seconds or bytes; +Inf is added): exported as
 * name_bucket{le=...} (cumulative), name_sum, name_count. */
pf_metric *metrics_histogram(const char *name, const char *help, const char *const *labels, int nlabels,
                             const double *bounds, int nbounds);

/* A gauge whose value fn(arg) computes at each scrape (called on the endpoint's thread: it must be
 * thread-safe and quick), e.g. resident memory or the age of the newest checkpoint. */
pf_metric *metrics_gauge_fn(const char *name, const char *help, const char *const *labels, int nlabels,
                            double (*fn)(void *arg), void *arg);

/* Counter: adds v (>= 0; a negative v is ignored). Gauge: adds v (any sign). */
void metrics_add(pf_metric *m, double v);
/* Gauge: sets v. */
void metrics_set(pf_metric *m, double v);
/* Histogram: counts v in its bucket and adds it to the sum. */
void metrics_observe(pf_metric *m, double v);
/* Drops the series from the output (a member that left); m must not be used afterwards. */
void metrics_remove(pf_metric *m);

/* Default latency buckets for step phases and requests, seconds: 100 us to 60 s. */
extern const double metrics_latency_bounds[];
extern const int metrics_latency_nbounds;

/* The whole exposition text (every family: # HELP, # TYPE, its series), malloc'd; NULL on out of memory. */
char *metrics_render(void);

/* Starts the HTTP endpoint on `address` = "host:port" (port 0: the kernel picks a free one; host "" or no
 * host: 127.0.0.1). GET /metrics answers the exposition text; other paths 404, other methods 405.
 * Connections are limited in number, per-connection memory and idle time, so slow or hostile clients cannot
 * exhaust the process. The bound "host:port" goes to bound[cap]. Returns 0, or a negative errno with
 * pf_errmsg() naming the address and the problem (-EADDRINUSE "already in use", -EINVAL malformed address,
 * -EALREADY already started). */
int metrics_start(const char *address, char *bound, size_t cap);

/* Stops the endpoint (if started); the registry stays. */
void metrics_stop(void);

#endif
