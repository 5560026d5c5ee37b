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

/* Seconds a connection may take to send a request head (counted from its accept or from its previous
 * response) before the endpoint closes it; also libmicrohttpd's idle timeout. */
#define METRICS_CONNECTION_TIMEOUT_S 5
/* Seconds the endpoint gives a client to receive one response. */
#define METRICS_RESPONSE_TIMEOUT_S 30

/* Sets the constant labels of every series: role ("server", "worker") and rank (-1: not yet known, shown as
 * an empty label value). Call again when the rank becomes known. */
void metrics_set_identity(const char *role, int rank);

/* Sets the constant label run (the run id as 32 hex digits, "" until the run formed). */
void metrics_set_run(const char *run);

/* Registers one series of family `name`: labels is {key1, value1, key2, value2, ...} with nlabels pairs
 * (NULL, 0 for none); values are escaped as the format requires (backslash, quote, newline). A family's
 * series share its type and help text (the first registration's); registering the same name and labels
 * (same keys in the same order, same values) again returns the same series. Returns the series, or NULL
 * with pf_errmsg() naming the problem on out of memory, an invalid name ([a-zA-Z_:][a-zA-Z0-9_:]*), an
 * invalid label key ([a-zA-Z_][a-zA-Z0-9_]*, not starting with "__"), a key that is one of the constant
 * labels role, rank, run or the histogram's le, a key given twice, or a name already registered with
 * another type (the update functions ignore NULL, so a metric that could not be registered costs nothing).
 * Series are printed in registration order, families in the order of their first registration. */
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

/* Counter: adds v (>= 0; a negative or NaN v is ignored). Gauge: adds v (any sign). Ignored on a histogram
 * or a gauge_fn series. */
void metrics_add(pf_metric *m, double v);
/* Gauge: sets v. Counter: sets v too, for a counter that mirrors a total kept elsewhere (the caller keeps it
 * from decreasing). Ignored on a histogram or a gauge_fn series. */
void metrics_set(pf_metric *m, double v);
/* Histogram: counts v in its bucket and adds it to the sum. */
void metrics_observe(pf_metric *m, double v);
/* Drops the series from the output (a member that left); m must not be used afterwards. */
void metrics_remove(pf_metric *m);

/* Default latency buckets for step phases and requests, seconds: 100 us to 60 s. */
extern const double metrics_latency_bounds[];
extern const int metrics_latency_nbounds;

/* The whole exposition text (every family that has series: # HELP, # TYPE, its series), malloc'd; NULL on
 * out of memory. Values are written in the shortest form that reads back to the same double ("0.25",
 * "1e-05", "+Inf", "-Inf", "NaN"). */
char *metrics_render(void);

/* Registers the families every daemon exports (docs/metrics.md, "Every daemon"): pfcps_build_info{version}
 * (1), process_resident_memory_bytes (/proc/self/statm), process_start_time_seconds (/proc/self/stat and
 * /proc/stat's btime), pfcps_memory_limit_bytes (cgroup v2 memory.max of this process's cgroup, else cgroup
 * v1 memory.limit_in_bytes, capped at MemTotal of /proc/meminfo; MemTotal when there is no limit). Called by
 * metrics_start; calling it again does nothing. */
void metrics_register_process(void);

/* Drops every family and series and the extra pages (tests; nothing may update a series afterwards). The
 * identity labels stay. */
void metrics_reset(void);

/* Parses a metrics address "host:port", "[v6addr]:port", ":port" or "port" (no host: 127.0.0.1) into
 * host[hostlen] (brackets removed) and *port in 0-65535 (0: the kernel picks one). Returns 0, or -EINVAL with
 * pf_errmsg() naming the address and the problem. */
int metrics_parse_address(const char *address, char *host, size_t hostlen, int *port);

/* Serves a second page at `path` ("/targets", say) on the endpoint: each GET calls render(arg) on the
 * endpoint's thread and answers its malloc'd text (freed by the endpoint) with `content_type`; render
 * returning NULL answers 500. Registering the same path again replaces it. May be called before or after
 * metrics_start. Returns 0, or -EINVAL (path not starting with '/', "/metrics", or longer than 127 bytes;
 * content_type longer than 127 bytes; render NULL), -ENOSPC (16 pages already). */
int metrics_add_page(const char *path, const char *content_type, char *(*render)(void *arg), void *arg);

/* Starts the HTTP endpoint on `address` = "host:port" (port 0: the kernel picks a free one; host "" or no
 * host: 127.0.0.1; a host name is resolved, IPv4 and IPv6 alike). GET (and HEAD) /metrics answers the
 * exposition text as "text/plain; version=0.0.4; charset=utf-8"; pages of metrics_add_page likewise; other
 * paths 404, other methods 405. Connections are limited in number (32 in all, 16 per client address),
 * per-connection memory (32 KiB: a larger request head is refused) and time (a request head must arrive
 * within METRICS_CONNECTION_TIMEOUT_S of the connection or of the previous response, a response must be
 * sent within METRICS_RESPONSE_TIMEOUT_S; otherwise the connection is closed), so slow or hostile clients
 * cannot exhaust the process. Also calls metrics_register_process. The bound "host:port" (numeric host,
 * IPv6 in brackets) goes to bound[cap] (bound may be NULL). Returns 0, or a negative errno with pf_errmsg()
 * "metrics_address <address>: <problem>" (-EADDRINUSE "address already in use", -EINVAL malformed or
 * unresolvable address, -EADDRNOTAVAIL not an address of this host, -EACCES privileged port, -EALREADY
 * already started, other codes from socket/bind/listen or libmicrohttpd). */
int metrics_start(const char *address, char *bound, size_t cap);

/* The running endpoint's bound "host:port" (as metrics_start wrote it to bound), "" when it is not started.
 * Valid until the next metrics_start or metrics_stop. */
const char *metrics_bound(void);

/* Stops the endpoint (if started); the registry stays. */
void metrics_stop(void);

#endif
