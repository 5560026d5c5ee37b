/* The metrics registry and its exposition text (see metrics.h). Families and series live in one list guarded
 * by g_mu (registration, removal, rendering); values are C11 atomics updated without the lock: a counter's or
 * gauge's double is kept as its IEEE-754 bits in a uint64 (an add is a compare-and-swap loop), a histogram's
 * buckets are integer counters (not cumulative; rendering sums them). The HTTP endpoint is in
 * metrics_http.c. */
#include "common/metrics.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "common/metrics_internal.h"

#ifndef PFCPS_VERSION
#define PFCPS_VERSION "unknown"
#endif

typedef enum { MT_COUNTER, MT_GAUGE, MT_HISTOGRAM } metric_type;
typedef enum { MK_VALUE, MK_FN, MK_HIST } metric_kind;

typedef struct mfamily {
    char *name;
    char *help;
    metric_type type;
    pf_metric *head, *tail;
    struct mfamily *next;
} mfamily;

struct pf_metric {
    mfamily *fam;
    pf_metric *next;
    char *labels; /* the series' own labels as printed: k="v",k2="v2" ("" for none) */
    metric_kind kind;
    _Atomic uint64_t bits; /* MK_VALUE: the value's double bits */
    double (*fn)(void *arg);
    void *arg;
    int nb;                   /* MK_HIST: bounds */
    double *bounds;           /* nb ascending upper bounds */
    _Atomic uint64_t *counts; /* nb + 1 per-bucket counts (the last: above every bound) */
    _Atomic uint64_t sum_bits;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static mfamily *g_fam_head, *g_fam_tail;
static char g_role[64];
static int g_rank = -1;
static char g_run[96];
static int g_process_registered;

const double metrics_latency_bounds[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                         0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};
const int metrics_latency_nbounds = (int)(sizeof metrics_latency_bounds / sizeof metrics_latency_bounds[0]);

/* ---- values ---- */

static inline uint64_t d2b(double d)
{
    uint64_t b;
    memcpy(&b, &d, sizeof b);
    return b;
}

static inline double b2d(uint64_t b)
{
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

static void atomic_add_double(_Atomic uint64_t *p, double v)
{
    uint64_t old = atomic_load_explicit(p, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(p, &old, d2b(b2d(old) + v), memory_order_relaxed,
                                                  memory_order_relaxed)) {
    }
}

void metrics_add(pf_metric *m, double v)
{
    if (!m || m->kind != MK_VALUE)
        return;
    if (m->fam->type == MT_COUNTER && !(v >= 0))
        return;
    atomic_add_double(&m->bits, v);
}

void metrics_set(pf_metric *m, double v)
{
    if (!m || m->kind != MK_VALUE)
        return;
    atomic_store_explicit(&m->bits, d2b(v), memory_order_relaxed);
}

void metrics_observe(pf_metric *m, double v)
{
    if (!m || m->kind != MK_HIST)
        return;
    int lo = 0, hi = m->nb; /* the first bound >= v (bucket nb: none, or v is NaN) */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (v <= m->bounds[mid])
            hi = mid;
        else if (v > m->bounds[mid])
            lo = mid + 1;
        else { /* NaN */
            lo = hi = m->nb;
        }
    }
    atomic_fetch_add_explicit(&m->counts[lo], 1, memory_order_relaxed);
    atomic_add_double(&m->sum_bits, v);
}

void metrics_format_value(double v, char *out, size_t n)
{
    if (isnan(v)) {
        snprintf(out, n, "NaN");
        return;
    }
    if (isinf(v)) {
        snprintf(out, n, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(out, n, "%.0f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) { /* the shortest text that reads back to v */
        snprintf(out, n, "%.*g", prec, v);
        if (strtod(out, NULL) == v)
            return;
    }
}

/* ---- identity ---- */

void metrics_set_identity(const char *role, int rank)
{
    pthread_mutex_lock(&g_mu);
    snprintf(g_role, sizeof g_role, "%s", role ? role : "");
    g_rank = rank;
    pthread_mutex_unlock(&g_mu);
}

void metrics_set_run(const char *run)
{
    pthread_mutex_lock(&g_mu);
    snprintf(g_run, sizeof g_run, "%s", run ? run : "");
    pthread_mutex_unlock(&g_mu);
}

/* ---- a growing text buffer ---- */

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_reserve(sbuf *b, size_t more)
{
    if (b->oom || b->n + more + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + more + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return;
    }
    b->p = p;
    b->cap = cap;
}

static void sb_put(sbuf *b, const char *s, size_t len)
{
    sb_reserve(b, len);
    if (b->oom)
        return;
    memcpy(b->p + b->n, s, len);
    b->n += len;
    b->p[b->n] = '\0';
}

static void sb_str(sbuf *b, const char *s)
{
    sb_put(b, s, strlen(s));
}

__attribute__((format(printf, 2, 3))) static void sb_printf(sbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char tmp[256];
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0)
        return;
    if ((size_t)k < sizeof tmp) {
        sb_put(b, tmp, (size_t)k);
        return;
    }
    sb_reserve(b, (size_t)k);
    if (b->oom)
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}

/* Appends s escaped: backslash and newline always, the double quote too when `quote` (label values). */
static void sb_escaped(sbuf *b, const char *s, int quote)
{
    for (; *s; s++) {
        if (*s == '\\')
            sb_put(b, "\\\\", 2);
        else if (*s == '\n')
            sb_put(b, "\\n", 2);
        else if (*s == '"' && quote)
            sb_put(b, "\\\"", 2);
        else
            sb_put(b, s, 1);
    }
}

/* ---- registration ---- */

static int valid_name(const char *s)
{
    if (!s || !*s || !((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_' || *s == ':'))
        return 0;
    for (s++; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' ||
              *s == ':'))
            return 0;
    return 1;
}

/* A label key: [a-zA-Z_][a-zA-Z0-9_]*, not reserved ("__" prefix), not a constant label nor le. */
static int check_label_key(const char *name, const char *k)
{
    if (!k || !*k || !((*k >= 'a' && *k <= 'z') || (*k >= 'A' && *k <= 'Z') || *k == '_'))
        return pf_err(-EINVAL, "metric '%s': label key '%s' is not [a-zA-Z_][a-zA-Z0-9_]*", name, k ? k : "(null)");
    for (const char *s = k + 1; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_'))
            return pf_err(-EINVAL, "metric '%s': label key '%s' is not [a-zA-Z_][a-zA-Z0-9_]*", name, k);
    if (k[0] == '_' && k[1] == '_')
        return pf_err(-EINVAL, "metric '%s': label key '%s' is reserved (starts with __)", name, k);
    if (!strcmp(k, "role") || !strcmp(k, "rank") || !strcmp(k, "run") || !strcmp(k, "le"))
        return pf_err(-EINVAL, "metric '%s': label key '%s' is reserved (role, rank, run, le)", name, k);
    return 0;
}

/* The series' own labels as printed (k="v",...), malloc'd into *out. Returns 0 or a negative code. */
static int build_labels(const char *name, const char *const *labels, int nlabels, char **out)
{
    *out = NULL;
    if (nlabels < 0 || (nlabels > 0 && !labels))
        return pf_err(-EINVAL, "metric '%s': %d label pairs without a label array", name, nlabels);
    sbuf b = {0};
    sb_str(&b, "");
    for (int i = 0; i < nlabels; i++) {
        const char *k = labels[2 * i], *v = labels[2 * i + 1];
        int rc = check_label_key(name, k);
        for (int j = 0; rc == 0 && j < i; j++)
            if (!strcmp(labels[2 * j], k))
                rc = pf_err(-EINVAL, "metric '%s': label key '%s' given twice", name, k);
        if (rc < 0) {
            free(b.p);
            return rc;
        }
        sb_printf(&b, "%s%s=\"", i ? "," : "", k);
        sb_escaped(&b, v ? v : "", 1);
        sb_put(&b, "\"", 1);
    }
    if (b.oom) {
        free(b.p);
        return pf_err(-ENOMEM, "metric '%s': out of memory", name);
    }
    *out = b.p;
    return 0;
}

static mfamily *find_family(const char *name)
{
    for (mfamily *f = g_fam_head; f; f = f->next)
        if (!strcmp(f->name, name))
            return f;
    return NULL;
}

static const char *type_name(metric_type t)
{
    return t == MT_COUNTER ? "counter" : t == MT_GAUGE ? "gauge" : "histogram";
}

/* The family `name` of type t (created with `help` when new), or NULL with pf_err (another type, OOM).
 * Called with g_mu held. */
static mfamily *get_family(const char *name, const char *help, metric_type t)
{
    mfamily *f = find_family(name);
    if (f) {
        if (f->type != t) {
            pf_err(-EINVAL, "metric '%s' is already registered as a %s, not a %s", name, type_name(f->type),
                   type_name(t));
            return NULL;
        }
        return f;
    }
    f = calloc(1, sizeof *f);
    if (f) {
        f->name = strdup(name);
        f->help = strdup(help ? help : "");
    }
    if (!f || !f->name || !f->help) {
        if (f) {
            free(f->name);
            free(f->help);
        }
        free(f);
        pf_err(-ENOMEM, "metric '%s': out of memory", name);
        return NULL;
    }
    f->type = t;
    f->next = NULL;
    if (g_fam_tail)
        g_fam_tail->next = f;
    else
        g_fam_head = f;
    g_fam_tail = f;
    return f;
}

static void free_series(pf_metric *m)
{
    if (!m)
        return;
    free(m->labels);
    free(m->bounds);
    free((void *)m->counts);
    free(m);
}

/* A new series (not yet in a family), or NULL on OOM. */
static pf_metric *new_series(metric_kind kind, char *labels, const double *bounds, int nbounds)
{
    pf_metric *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->kind = kind;
    m->labels = labels;
    atomic_init(&m->bits, d2b(0.0));
    atomic_init(&m->sum_bits, d2b(0.0));
    if (kind == MK_HIST) {
        m->nb = nbounds;
        m->bounds = malloc(sizeof(double) * (size_t)(nbounds > 0 ? nbounds : 1));
        m->counts = calloc((size_t)nbounds + 1, sizeof *m->counts);
        if (!m->bounds || !m->counts) {
            m->labels = NULL;
            free_series(m);
            return NULL;
        }
        if (nbounds > 0)
            memcpy(m->bounds, bounds, sizeof(double) * (size_t)nbounds);
        for (int i = 0; i <= nbounds; i++)
            atomic_init(&m->counts[i], 0);
    }
    return m;
}

static int check_bounds(const char *name, const double *bounds, int nbounds)
{
    if (nbounds < 0 || (nbounds > 0 && !bounds) || nbounds > 1000)
        return pf_err(-EINVAL, "histogram '%s': %d bounds (0-1000 expected)", name, nbounds);
    for (int i = 0; i < nbounds; i++) {
        if (!isfinite(bounds[i]))
            return pf_err(-EINVAL, "histogram '%s': bound %d is not finite (+Inf is added)", name, i);
        if (i > 0 && !(bounds[i] > bounds[i - 1]))
            return pf_err(-EINVAL, "histogram '%s': bounds are not strictly ascending at %d (%g after %g)", name,
                          i, bounds[i], bounds[i - 1]);
    }
    return 0;
}

static pf_metric *register_series(const char *name, const char *help, metric_type t, metric_kind kind,
                                  const char *const *labels, int nlabels, const double *bounds, int nbounds,
                                  double (*fn)(void *), void *arg)
{
    int rc = valid_name(name) ? 0 : pf_err(-EINVAL, "metric name '%s' is not [a-zA-Z_:][a-zA-Z0-9_:]*",
                                           name ? name : "(null)");
    if (rc == 0 && kind == MK_HIST)
        rc = check_bounds(name, bounds, nbounds);
    if (rc == 0 && kind == MK_FN && !fn)
        rc = pf_err(-EINVAL, "gauge '%s': no function", name);
    char *text = NULL;
    if (rc == 0)
        rc = build_labels(name, labels, nlabels, &text);
    if (rc < 0) {
        log_warn("metrics: not registered: %s", pf_errmsg());
        return NULL;
    }
    pthread_mutex_lock(&g_mu);
    pf_metric *m = NULL;
    mfamily *f = get_family(name, help, t);
    if (f)
        for (m = f->head; m; m = m->next)
            if (!strcmp(m->labels, text))
                break;
    if (m) { /* already registered */
        free(text);
    } else if (f) {
        m = new_series(kind, text, bounds, nbounds);
        if (m) {
            m->fam = f;
            m->fn = fn;
            m->arg = arg;
            if (f->tail)
                f->tail->next = m;
            else
                f->head = m;
            f->tail = m;
        } else {
            free(text);
            pf_err(-ENOMEM, "metric '%s': out of memory", name);
        }
    } else {
        free(text);
    }
    pthread_mutex_unlock(&g_mu);
    if (!m)
        log_warn("metrics: not registered: %s", pf_errmsg());
    return m;
}

pf_metric *metrics_counter(const char *name, const char *help, const char *const *labels, int nlabels)
{
    return register_series(name, help, MT_COUNTER, MK_VALUE, labels, nlabels, NULL, 0, NULL, NULL);
}

pf_metric *metrics_gauge(const char *name, const char *help, const char *const *labels, int nlabels)
{
    return register_series(name, help, MT_GAUGE, MK_VALUE, labels, nlabels, NULL, 0, NULL, NULL);
}

pf_metric *metrics_histogram(const char *name, const char *help, const char *const *labels, int nlabels,
                             const double *bounds, int nbounds)
{
    return register_series(name, help, MT_HISTOGRAM, MK_HIST, labels, nlabels, bounds, nbounds, NULL, NULL);
}

pf_metric *metrics_gauge_fn(const char *name, const char *help, const char *const *labels, int nlabels,
                            double (*fn)(void *arg), void *arg)
{
    return register_series(name, help, MT_GAUGE, MK_FN, labels, nlabels, NULL, 0, fn, arg);
}

void metrics_remove(pf_metric *m)
{
    if (!m)
        return;
    pthread_mutex_lock(&g_mu);
    mfamily *f = m->fam;
    pf_metric *prev = NULL;
    for (pf_metric *s = f->head; s; prev = s, s = s->next) {
        if (s != m)
            continue;
        if (prev)
            prev->next = s->next;
        else
            f->head = s->next;
        if (f->tail == s)
            f->tail = prev;
        free_series(s);
        break;
    }
    pthread_mutex_unlock(&g_mu);
}

void metrics_reset(void)
{
    pthread_mutex_lock(&g_mu);
    for (mfamily *f = g_fam_head, *fn; f; f = fn) {
        fn = f->next;
        for (pf_metric *m = f->head, *mn; m; m = mn) {
            mn = m->next;
            free_series(m);
        }
        free(f->name);
        free(f->help);
        free(f);
    }
    g_fam_head = g_fam_tail = NULL;
    g_process_registered = 0;
    pthread_mutex_unlock(&g_mu);
    metrics_pages_reset();
}

/* ---- rendering ---- */

/* name{constant labels,own labels[,le="x"]} value */
static void put_sample(sbuf *b, const char *name, const char *suffix, const char *cl, const pf_metric *m,
                       const char *le, double v)
{
    char val[40];
    metrics_format_value(v, val, sizeof val);
    sb_printf(b, "%s%s{%s", name, suffix, cl);
    if (m->labels[0]) {
        sb_put(b, ",", 1);
        sb_str(b, m->labels);
    }
    if (le)
        sb_printf(b, ",le=\"%s\"", le);
    sb_printf(b, "} %s\n", val);
}

static void render_histogram(sbuf *b, const mfamily *f, const char *cl, const pf_metric *m)
{
    uint64_t cum = 0;
    char le[40];
    for (int i = 0; i < m->nb; i++) {
        cum += atomic_load_explicit(&m->counts[i], memory_order_relaxed);
        metrics_format_value(m->bounds[i], le, sizeof le);
        put_sample(b, f->name, "_bucket", cl, m, le, (double)cum);
    }
    cum += atomic_load_explicit(&m->counts[m->nb], memory_order_relaxed);
    put_sample(b, f->name, "_bucket", cl, m, "+Inf", (double)cum);
    put_sample(b, f->name, "_sum", cl, m, NULL, b2d(atomic_load_explicit(&m->sum_bits, memory_order_relaxed)));
    put_sample(b, f->name, "_count", cl, m, NULL, (double)cum); /* = the +Inf bucket, read once */
}

static void render_family(sbuf *b, const mfamily *f, const char *cl)
{
    if (!f->head)
        return;
    sb_printf(b, "# HELP %s ", f->name);
    sb_escaped(b, f->help, 0);
    sb_printf(b, "\n# TYPE %s %s\n", f->name, type_name(f->type));
    for (const pf_metric *m = f->head; m; m = m->next) {
        if (m->kind == MK_HIST)
            render_histogram(b, f, cl, m);
        else
            put_sample(b, f->name, "", cl, m, NULL,
                       m->kind == MK_FN ? m->fn(m->arg)
                                        : b2d(atomic_load_explicit(&m->bits, memory_order_relaxed)));
    }
}

char *metrics_render(void)
{
    sbuf b = {0};
    sb_str(&b, "");
    pthread_mutex_lock(&g_mu);
    sbuf cl = {0}; /* the constant labels */
    sb_str(&cl, "role=\"");
    sb_escaped(&cl, g_role, 1);
    sb_str(&cl, "\",rank=\"");
    if (g_rank >= 0)
        sb_printf(&cl, "%d", g_rank);
    sb_str(&cl, "\",run=\"");
    sb_escaped(&cl, g_run, 1);
    sb_str(&cl, "\"");
    if (!cl.oom)
        for (const mfamily *f = g_fam_head; f; f = f->next)
            render_family(&b, f, cl.p);
    pthread_mutex_unlock(&g_mu);
    int oom = b.oom || cl.oom;
    free(cl.p);
    if (oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

/* ---- the every-daemon families ---- */

/* The first number of file `path` (skipping `skip` words first), or -1. */
static double read_number(const char *path, int skip)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    char w[64];
    double v = -1;
    for (int i = 0; i <= skip; i++)
        if (fscanf(f, "%63s", w) != 1) {
            fclose(f);
            return -1;
        }
    char *end;
    double x = strtod(w, &end);
    if (end != w && *end == '\0')
        v = x;
    fclose(f);
    return v;
}

static double resident_bytes(void *arg)
{
    (void)arg;
    double pages = read_number("/proc/self/statm", 1);
    return pages < 0 ? NAN : pages * (double)sysconf(_SC_PAGESIZE);
}

/* MemTotal of /proc/meminfo in bytes, or NaN. */
static double mem_total(void)
{
    FILE *f = fopen("/proc/meminfo", "re");
    if (!f)
        return NAN;
    char line[256];
    double v = NAN;
    while (fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) {
            v = (double)kb * 1024;
            break;
        }
    }
    fclose(f);
    return v;
}

/* The smallest limit among `file` in cgroup folder `dir` and its parents up to `root`: *lim (bytes; INFINITY
 * for "max"). Returns 1 when some file was read, else 0. */
static int cgroup_limit(const char *root, const char *dir, const char *file, double *lim)
{
    char path[PATH_MAX], sub[PATH_MAX];
    snprintf(sub, sizeof sub, "%s", dir);
    int found = 0;
    *lim = INFINITY;
    for (;;) {
        int len = snprintf(path, sizeof path, "%s%s/%s", root, sub, file);
        FILE *f = len > 0 && (size_t)len < sizeof path ? fopen(path, "re") : NULL;
        if (f) {
            char w[64];
            if (fscanf(f, "%63s", w) == 1) {
                found = 1;
                char *end;
                double x = strtod(w, &end);
                if (strcmp(w, "max") != 0 && end != w && *end == '\0' && x < *lim)
                    *lim = x;
            }
            fclose(f);
        }
        char *slash = strrchr(sub, '/');
        if (!slash)
            break;
        *slash = '\0';
    }
    return found;
}

/* This process's cgroup path in hierarchy `want` of /proc/self/cgroup ("" for v2's "0::", "memory" for v1)
 * into out[n]. Returns 1 when found. */
static int cgroup_path(const char *want, char *out, size_t n)
{
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f)
        return 0;
    char line[PATH_MAX + 64];
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c2 = '\0';
        const char *ctrls = c1 + 1;
        int match = *want ? strstr(ctrls, want) != NULL : (*ctrls == '\0' && !strncmp(line, "0:", 2));
        if (match) {
            snprintf(out, n, "%s", strcmp(c2 + 1, "/") ? c2 + 1 : "");
            found = 1;
        }
    }
    fclose(f);
    return found;
}

static double memory_limit_bytes(void *arg)
{
    (void)arg;
    double total = mem_total(), lim = INFINITY;
    char cg[PATH_MAX];
    int have = 0;
    if (cgroup_path("", cg, sizeof cg))
        have = cgroup_limit("/sys/fs/cgroup", cg, "memory.max", &lim);
    if (!have)
        have = cgroup_limit("/sys/fs/cgroup", "", "memory.max", &lim);
    if (!have && cgroup_path("memory", cg, sizeof cg))
        have = cgroup_limit("/sys/fs/cgroup/memory", cg, "memory.limit_in_bytes", &lim);
    if (!have)
        cgroup_limit("/sys/fs/cgroup/memory", "", "memory.limit_in_bytes", &lim);
    return isfinite(lim) && !(lim > total) ? lim : total; /* v1's "no limit" is a huge number */
}

/* Unix time this process started: /proc/self/stat field 22 (clock ticks after boot) + /proc/stat btime. */
static double process_start_time(void)
{
    double now = (double)time(NULL), btime = -1;
    FILE *f = fopen("/proc/stat", "re");
    if (f) {
        char line[512];
        unsigned long long bt;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "btime %llu", &bt) == 1) {
                btime = (double)bt;
                break;
            }
        fclose(f);
    }
    char st[4096];
    f = fopen("/proc/self/stat", "re");
    size_t n = f ? fread(st, 1, sizeof st - 1, f) : 0;
    if (f)
        fclose(f);
    st[n] = '\0';
    const char *p = strrchr(st, ')'); /* the command name may hold spaces: fields 3.. follow its ')' */
    unsigned long long ticks;
    if (btime < 0 || !p ||
        sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
               &ticks) != 1)
        return now;
    return btime + (double)ticks / (double)sysconf(_SC_CLK_TCK);
}

void metrics_register_process(void)
{
    pthread_mutex_lock(&g_mu);
    int done = g_process_registered;
    g_process_registered = 1;
    pthread_mutex_unlock(&g_mu);
    if (done)
        return;
    const char *vl[] = {"version", PFCPS_VERSION};
    metrics_set(metrics_gauge("pfcps_build_info", "pfcps build: 1, the version in label version.", vl, 1), 1);
    metrics_gauge_fn("process_resident_memory_bytes", "Resident memory size in bytes.", NULL, 0,
                     resident_bytes, NULL);
    metrics_set(metrics_gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
                              NULL, 0),
                process_start_time());
    metrics_gauge_fn("pfcps_memory_limit_bytes",
                     "Memory this process may use: its cgroup's limit (v2 memory.max, v1 memory.limit_in_bytes), "
                     "at most MemTotal.",
                     NULL, 0, memory_limit_bytes, NULL);
}
