/* `pfcps top URL...`: a terminal view of a running job from its daemons' Prometheus endpoints (usage in
 * tools/commands.h; the families in docs/metrics.md).
 *
 * Members: each URL's /targets (Prometheus HTTP service discovery, which server 0 serves: a JSON array of
 * {"targets": ["host:port", ...], "labels": {"role": ..., "rank": ...}}) names the members; a URL that
 * answers /targets otherwise (404, not JSON) is one member itself, and one that cannot be reached keeps its
 * last list. Every refresh GETs each URL's /targets and each member's /metrics in parallel (libcurl multi,
 * 0.8 s per request, so a dead member costs the view no more than that); members that a /targets answer has
 * just added are scraped right after, in a second round. Rates are differences of two scrapes of the same
 * member over the time between their answers (this process's monotonic clock). */
#include "tools/commands.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/hostport.h"
#include "tools/opts.h"
#include "tools/prom_text.h"

#define TOP_TIMEOUT_MS   800
#define TOP_TARGETS_MAX  (1u << 20) /* bytes of a /targets answer */
#define TOP_MAX_MEMBERS  4096
#define TOP_ADDR_MAX     272 /* "host:port", host <= 255 bytes */
#define TOP_MAX_INTERVAL 3600.0

static const char top_usage[] =
    "usage: pfcps top [--interval SECONDS] [--count N | --once] URL [URL ...]\n"
    "  URL: http://HOST:PORT or HOST:PORT of a daemon's metrics endpoint (metrics_address). Its /targets\n"
    "  (server 0 lists every joined member whose metrics are on) names the members to watch; a URL without\n"
    "  /targets is watched itself. Every SECONDS (1) each member's /metrics is read (0.8 s timeout each, in\n"
    "  parallel) and one row per member printed, sorted by role then rank:\n"
    "    STEP, STEP/S, SAMPLES/S (images), LOSS, LR; WAIT: a worker's seconds waited per step (phase wait),\n"
    "    a server's median apply time; MEM: resident memory (% of the memory limit); a server's PULL/S and\n"
    "    PUSH/S (class-center rows), QUEUE (requests waiting), SNAPSHOT (age of the last one).\n"
    "  Rates need two refreshes ('-' before). A member that does not answer shows 'down' and why.\n"
    "  --count N: N refreshes, then exit (0: until Ctrl-C, the default); --once: one refresh, no rates.\n"
    "  Exit 0; 1 when no member answered at the last refresh; 2 on bad usage.";

/* ---- HTTP: GETs in parallel ---- */

typedef struct fetch {
    char url[TOP_ADDR_MAX + 32];
    char addr[TOP_ADDR_MAX]; /* the member's or source's HOST:PORT */
    int member;              /* the member index it scrapes, or -1 - source index for a /targets request */
    char *body;
    size_t len, limit;
    long status;                    /* HTTP status; 0 when nothing was answered */
    double t;                       /* pf_now_s() when it finished */
    char err[CURL_ERROR_SIZE + 64]; /* "" when answered */
} fetch;

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg)
{
    fetch *f = arg;
    size_t n = size * nmemb;
    if (n > f->limit - f->len) {
        snprintf(f->err, sizeof f->err, "answer larger than %zu bytes", f->limit);
        return 0; /* curl stops the transfer */
    }
    char *b = realloc(f->body, f->len + n + 1);
    if (!b) {
        snprintf(f->err, sizeof f->err, "out of memory for the answer");
        return 0;
    }
    memcpy(b + f->len, data, n);
    f->body = b;
    f->len += n;
    return n;
}

/* Runs the n GETs of f in parallel, each limited to TOP_TIMEOUT_MS; fills status, body, t and err. */
static void fetch_all(fetch *f, int n, struct curl_slist *hdr)
{
    CURLM *mh = curl_multi_init();
    char(*errbuf)[CURL_ERROR_SIZE] = calloc((size_t)n + 1, CURL_ERROR_SIZE);
    for (int k = 0; k < n; k++) {
        f[k].status = 0;
        f[k].len = 0;
        f[k].err[0] = '\0';
        CURL *e = mh && errbuf ? curl_easy_init() : NULL;
        if (!e) {
            snprintf(f[k].err, sizeof f[k].err, "cannot start a request (out of memory)");
            f[k].t = pf_now_s();
            continue;
        }
        curl_easy_setopt(e, CURLOPT_URL, f[k].url);
#if LIBCURL_VERSION_NUM >= 0x075500
        curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http");
#else
        curl_easy_setopt(e, CURLOPT_PROTOCOLS, (long)CURLPROTO_HTTP);
#endif
        curl_easy_setopt(e, CURLOPT_NOPROXY, "*");
        curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)TOP_TIMEOUT_MS);
        curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)TOP_TIMEOUT_MS);
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdr);
        curl_easy_setopt(e, CURLOPT_USERAGENT, "pfcps-top");
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(e, CURLOPT_WRITEDATA, &f[k]);
        curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf[k]);
        curl_easy_setopt(e, CURLOPT_PRIVATE, (char *)&f[k]);
        curl_multi_add_handle(mh, e);
    }
    for (int running = mh ? 1 : 0; running;) {
        if (curl_multi_perform(mh, &running) != CURLM_OK)
            running = 0;
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(mh, &left))) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            fetch *x = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&x);
            x->t = pf_now_s();
            if (msg->data.result == CURLE_OK)
                curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &x->status);
            else if (!x->err[0]) {
                const char *why = errbuf[x - f][0] ? errbuf[x - f] : curl_easy_strerror(msg->data.result);
                snprintf(x->err, sizeof x->err, "%s", why);
            }
            curl_multi_remove_handle(mh, msg->easy_handle);
            curl_easy_cleanup(msg->easy_handle);
        }
        if (running)
            curl_multi_poll(mh, NULL, 0, 100, NULL);
    }
    free(errbuf);
    curl_multi_cleanup(mh);
}

/* ---- members and the URLs that name them ---- */

typedef struct target {
    char addr[TOP_ADDR_MAX];
    char role[32];
    int rank; /* -1: not given */
} target;

/* A URL of the command line. */
typedef struct source {
    char addr[TOP_ADDR_MAX];
    int listed; /* its last /targets answer was the JSON: its members are `t` */
    target *t;
    int nt;
    char note[512]; /* why its /targets answer was not used, or targets it skipped ("" when none) */
} source;

typedef struct member {
    target id; /* address and, from /targets, role and rank */
    prom_page cur, prev;
    int have_cur, have_prev;
    double t_cur, t_prev; /* pf_now_s() of each page's answer */
    double wall;          /* Unix time of the current page's answer */
    int up;               /* the last scrape answered a page that parsed */
    int scraped;          /* scraped in this refresh */
    char err[600];
} member;

typedef struct top {
    source *src;
    int nsrc;
    member *m;
    int nm;
    struct curl_slist *hdr;
} top;

/* Sets out to the "host:port" of a URL argument: http://HOST:PORT, HOST:PORT, either with a trailing '/'
 * or "/metrics". Returns 0, or -1 with the reason in why. */
static int parse_addr(const char *arg, char *out, size_t cap, char *why, size_t whycap)
{
    const char *p = arg;
    if (strncasecmp(p, "http://", 7) == 0)
        p += 7;
    else if (strstr(p, "://")) {
        snprintf(why, whycap, "'%s': only http:// URLs (or HOST:PORT)", arg);
        return -1;
    }
    size_t n = strlen(p);
    if (n >= 8 && strcmp(p + n - 8, "/metrics") == 0)
        n -= 8;
    while (n > 0 && p[n - 1] == '/')
        n--;
    if (n == 0 || n >= cap) {
        snprintf(why, whycap, "'%s': %s", arg, n ? "too long" : "no HOST:PORT");
        return -1;
    }
    memcpy(out, p, n);
    out[n] = '\0';
    char host[256];
    int port;
    if (strchr(out, '/')) {
        snprintf(why, whycap, "'%s': a path other than /metrics (the endpoint is HOST:PORT)", arg);
        return -1;
    }
    if (pf_parse_hostport(out, host, sizeof host, &port) < 0) {
        snprintf(why, whycap, "%s", pf_errmsg());
        return -1;
    }
    if (strchr(host, ':') && out[0] != '[') {
        snprintf(why, whycap, "'%s': an IPv6 address goes in brackets: [ADDRESS]:PORT", arg);
        return -1;
    }
    return 0;
}

/* Appends a note to src->note (separated by "; "). */
static void note(source *s, const char *fmt, const char *a, const char *b)
{
    size_t n = strlen(s->note);
    if (n + 3 >= sizeof s->note)
        return;
    if (n)
        n += (size_t)snprintf(s->note + n, sizeof s->note - n, "; ");
    snprintf(s->note + n, sizeof s->note - n, fmt, a, b);
}

/* One group of a /targets answer: its "labels" and every "targets" string into t (deduplicated). */
static int targets_group(source *s, json_t *g, target **t, int *nt)
{
    json_t *list = json_object_get(g, "targets"), *labels = json_object_get(g, "labels"), *x;
    if (!json_is_object(g) || !json_is_array(list) || (labels && !json_is_object(labels)))
        return -1;
    const char *role = labels ? json_string_value(json_object_get(labels, "role")) : NULL;
    const char *rank = labels ? json_string_value(json_object_get(labels, "rank")) : NULL;
    size_t i;
    json_array_foreach(list, i, x)
    {
        const char *a = json_string_value(x);
        char addr[TOP_ADDR_MAX], why[600];
        if (!a)
            return -1;
        if (parse_addr(a, addr, sizeof addr, why, sizeof why) < 0) {
            note(s, "target skipped: %s%s", why, "");
            continue;
        }
        int dup = 0;
        for (int k = 0; k < *nt && !dup; k++)
            dup = strcmp((*t)[k].addr, addr) == 0;
        if (dup || *nt >= TOP_MAX_MEMBERS)
            continue;
        target *q = realloc(*t, (size_t)(*nt + 1) * sizeof *q);
        if (!q)
            return -1;
        *t = q;
        target *y = &q[(*nt)++];
        snprintf(y->addr, sizeof y->addr, "%s", addr);
        snprintf(y->role, sizeof y->role, "%s", role ? role : "");
        char *end = NULL;
        long r = rank ? strtol(rank, &end, 10) : -1;
        y->rank = rank && *rank && !*end && r >= 0 && r < 1000000 ? (int)r : -1;
    }
    return 0;
}

/* Reads a /targets answer into s (its list replaced) when it is Prometheus's HTTP SD JSON. */
static void targets_answer(source *s, const fetch *f)
{
    if (f->err[0] && f->status == 0)
        return; /* no answer: keep the last list */
    s->note[0] = '\0';
    if (f->status != 200) {
        s->listed = 0;
        return;
    }
    json_error_t je;
    json_t *root = json_loadb(f->body ? f->body : "", f->len, JSON_REJECT_DUPLICATES, &je), *g;
    target *t = NULL;
    int nt = 0, bad = !json_is_array(root);
    size_t i;
    if (!bad) {
        json_array_foreach(root, i, g)
        {
            if (targets_group(s, g, &t, &nt) < 0)
                bad = 1;
        }
    }
    if (bad) {
        char what[300];
        snprintf(what, sizeof what, "%s",
                 root ? "not a JSON array of {\"targets\": [...], \"labels\": {...}}" : je.text);
        note(s, "/targets: %s: %s; watched as one member", what, "");
        s->listed = 0;
        free(t);
    } else {
        free(s->t);
        s->t = t;
        s->nt = nt;
        s->listed = 1;
    }
    json_decref(root);
}

/* Finds the member at addr, or -1. */
static int member_find(const top *tp, const char *addr)
{
    for (int k = 0; k < tp->nm; k++)
        if (strcmp(tp->m[k].id.addr, addr) == 0)
            return k;
    return -1;
}

static void member_free(member *m)
{
    prom_page_free(&m->cur);
    prom_page_free(&m->prev);
}

/* Rebuilds the member list from the sources: each listed source's targets, else the source itself; members
 * no longer named are dropped, new ones added (scraped = 0). Returns 0 or -ENOMEM. */
static int members_update(top *tp)
{
    int cap = 0;
    member *m = NULL;
    int nm = 0;
    for (int s = 0; s < tp->nsrc; s++) {
        source *src = &tp->src[s];
        target self = {.rank = -1};
        snprintf(self.addr, sizeof self.addr, "%s", src->addr);
        int n = src->listed ? src->nt : 1;
        for (int k = 0; k < n; k++) {
            const target *t = src->listed ? &src->t[k] : &self;
            int dup = 0;
            for (int j = 0; j < nm && !dup; j++)
                dup = strcmp(m[j].id.addr, t->addr) == 0;
            if (dup || nm >= TOP_MAX_MEMBERS)
                continue;
            if (nm == cap) {
                cap = cap ? 2 * cap : 16;
                member *q = realloc(m, (size_t)cap * sizeof *q);
                if (!q) {
                    free(m);
                    return -ENOMEM;
                }
                m = q;
            }
            int old = member_find(tp, t->addr);
            if (old >= 0) {
                m[nm] = tp->m[old];
                tp->m[old].id.addr[0] = '\0'; /* moved */
            } else
                m[nm] = (member){.id = *t};
            if (src->listed) { /* the labels /targets gives now */
                snprintf(m[nm].id.role, sizeof m[nm].id.role, "%s", t->role);
                m[nm].id.rank = t->rank;
            }
            nm++;
        }
    }
    for (int k = 0; k < tp->nm; k++)
        if (tp->m[k].id.addr[0])
            member_free(&tp->m[k]);
    free(tp->m);
    tp->m = m;
    tp->nm = nm;
    return 0;
}

/* Takes a /metrics answer into member m. */
static void metrics_answer(member *m, const fetch *f)
{
    m->scraped = 1;
    m->up = 0;
    if (f->err[0] || f->status != 200) {
        if (f->err[0])
            snprintf(m->err, sizeof m->err, "%s", f->err);
        else
            snprintf(m->err, sizeof m->err, "HTTP %ld from /metrics", f->status);
        return;
    }
    prom_page pg;
    if (prom_parse(f->body ? f->body : "", f->len, &pg) < 0) {
        snprintf(m->err, sizeof m->err, "malformed /metrics page: %s", pf_errmsg());
        prom_page_free(&pg);
        return;
    }
    prom_page_free(&m->prev);
    m->prev = m->cur;
    m->have_prev = m->have_cur;
    m->t_prev = m->t_cur;
    m->cur = pg;
    m->have_cur = 1;
    m->t_cur = f->t;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    m->wall = (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
    m->up = 1;
    m->err[0] = '\0';
}

/* ---- one row per member ---- */

enum {
    C_ROLE,
    C_RANK,
    C_STEP,
    C_STEPS,
    C_SAMPLES,
    C_LOSS,
    C_LR,
    C_WAIT,
    C_MEM,
    C_PULL,
    C_PUSH,
    C_QUEUE,
    C_SNAP,
    C_ADDR,
    NCOL
};
static const char *const col_name[NCOL] = {"ROLE",   "RANK",  "STEP",     "STEP/S", "SAMPLES/S",
                                           "LOSS",   "LR",    "WAIT",     "MEM",    "PULL/S",
                                           "PUSH/S", "QUEUE", "SNAPSHOT", "ADDRESS"};
static const int col_width[NCOL] = {6, 4, 9, 7, 9, 8, 9, 8, 14, 9, 9, 5, 8, 0};
typedef char cell[64];

/* Copies s into out[cap] with every byte that is not printable ASCII replaced by '?' (a page's labels and
 * an error text reach the terminal: no control sequences through them). */
static void printable(const char *s, char *out, size_t cap)
{
    size_t i = 0;
    for (; s && s[i] && i + 1 < cap; i++)
        out[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
    out[i] = '\0';
}

static int value(const prom_page *pg, const char *name, const char *const *match, int nmatch, double *v)
{
    const prom_sample *s = prom_find(pg, name, match, nmatch);
    if (!s)
        return -1;
    *v = s->value;
    return 0;
}

/* The increase of a series between m's previous and current page; -1 when either lacks it, there is no
 * previous page, or it went down (the process restarted). */
static int increase(const member *m, const char *name, const char *const *match, int nmatch, double *d)
{
    double a, b;
    if (!m->have_prev || value(&m->prev, name, match, nmatch, &a) < 0 ||
        value(&m->cur, name, match, nmatch, &b) < 0 || !(b >= a))
        return -1;
    *d = b - a;
    return 0;
}

/* The increase per second between m's two pages (their answers' times apart); -1 as increase(). */
static int rate(const member *m, const char *name, double *r)
{
    double d, dt = m->t_cur - m->t_prev;
    if (increase(m, name, NULL, 0, &d) < 0 || !(dt > 0))
        return -1;
    *r = d / dt;
    return 0;
}

/* The q-quantile of histogram `name` over the observations between m's two pages (since the process
 * started when there is no previous page), interpolated linearly inside its bucket as Prometheus's
 * histogram_quantile does; NAN when nothing was observed. */
static double hist_quantile(const member *m, const char *name, double q)
{
    char bname[128];
    snprintf(bname, sizeof bname, "%s_bucket", name);
    double le[128], cnt[128];
    int nb = 0;
    for (int k = 0; k < m->cur.nsamples && nb < 128; k++) {
        const prom_sample *s = &m->cur.samples[k];
        const char *l = prom_label_get(s, "le");
        if (strcmp(s->name, bname) != 0 || !l)
            continue;
        const char *match[] = {"le", l};
        double before = 0;
        if (m->have_prev && value(&m->prev, bname, match, 1, &before) < 0)
            continue;
        le[nb] = strcasecmp(l, "+Inf") == 0 ? INFINITY : strtod(l, NULL);
        cnt[nb++] = s->value - before;
    }
    for (int i = 1; i < nb; i++) /* by bound (insertion sort: a few dozen buckets) */
        for (int j = i; j > 0 && le[j] < le[j - 1]; j--) {
            double t = le[j];
            le[j] = le[j - 1], le[j - 1] = t;
            t = cnt[j];
            cnt[j] = cnt[j - 1], cnt[j - 1] = t;
        }
    if (nb < 2 || !isinf(le[nb - 1]) || !(cnt[nb - 1] > 0))
        return NAN;
    double rank = q * cnt[nb - 1];
    for (int b = 0; b < nb; b++) {
        if (cnt[b] < rank)
            continue;
        if (isinf(le[b]))
            return le[b - 1];
        double lo = b ? le[b - 1] : (le[b] > 0 ? 0 : le[b]), clo = b ? cnt[b - 1] : 0;
        return cnt[b] > clo ? lo + (le[b] - lo) * (rank - clo) / (cnt[b] - clo) : le[b];
    }
    return NAN;
}

static void human_bytes(double b, char *out, size_t cap)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int k = 0;
    for (; b >= 1024 && k < 5; k++)
        b /= 1024;
    snprintf(out, cap, k ? "%.1f%s" : "%.0f%s", b, unit[k]);
}

/* An age in whole seconds elapsed (rounded down): 42s, 3m05s, 2h10m, 3d04h. */
static void human_age(double s, char *out, size_t cap)
{
    s = floor(s);
    if (!isfinite(s) || s < 0 || s >= 1e9)
        snprintf(out, cap, "-");
    else if (s < 60)
        snprintf(out, cap, "%.0fs", s);
    else if (s < 3600)
        snprintf(out, cap, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
    else if (s < 86400)
        snprintf(out, cap, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
    else
        snprintf(out, cap, "%dd%02dh", (int)(s / 86400), (int)fmod(s / 3600, 24));
}

/* A short duration: 850us, 12.3ms, 1.20s; longer ones as human_age. */
static void human_secs(double s, char *out, size_t cap)
{
    if (!isfinite(s) || s < 0)
        snprintf(out, cap, "-");
    else if (s < 1e-3)
        snprintf(out, cap, "%.0fus", s * 1e6);
    else if (s < 1)
        snprintf(out, cap, "%.1fms", s * 1e3);
    else if (s < 60)
        snprintf(out, cap, "%.2fs", s);
    else
        human_age(s, out, cap);
}

static void worker_cells(const member *m, cell c[NCOL])
{
    const prom_page *p = &m->cur;
    static const char *const wait[] = {"phase", "wait"};
    double v, d, ds;
    if (value(p, "pfcps_worker_step", NULL, 0, &v) == 0)
        snprintf(c[C_STEP], sizeof(cell), "%.0f", v);
    if (rate(m, "pfcps_worker_step", &v) == 0)
        snprintf(c[C_STEPS], sizeof(cell), "%.2f", v);
    if (rate(m, "pfcps_worker_samples_total", &v) == 0)
        snprintf(c[C_SAMPLES], sizeof(cell), "%.1f", v);
    /* NaN before the member's first step: shown as '-' */
    if (value(p, "pfcps_worker_loss", NULL, 0, &v) == 0 && !isnan(v))
        snprintf(c[C_LOSS], sizeof(cell), "%.4f", v);
    if (value(p, "pfcps_worker_learning_rate", NULL, 0, &v) == 0 && !isnan(v))
        snprintf(c[C_LR], sizeof(cell), "%.4g", v);
    if (increase(m, "pfcps_worker_phase_seconds_sum", wait, 1, &d) == 0 &&
        increase(m, "pfcps_worker_step", NULL, 0, &ds) == 0 && ds > 0)
        human_secs(d / ds, c[C_WAIT], sizeof(cell));
}

static void server_cells(const member *m, cell c[NCOL])
{
    const prom_page *p = &m->cur;
    double v;
    if (value(p, "pfcps_server_step", NULL, 0, &v) == 0)
        snprintf(c[C_STEP], sizeof(cell), "%.0f", v);
    if (rate(m, "pfcps_server_step", &v) == 0)
        snprintf(c[C_STEPS], sizeof(cell), "%.2f", v);
    double p50 = hist_quantile(m, "pfcps_server_apply_seconds", 0.5);
    if (!isnan(p50))
        human_secs(p50, c[C_WAIT], sizeof(cell));
    if (rate(m, "pfcps_server_pulled_rows_total", &v) == 0)
        snprintf(c[C_PULL], sizeof(cell), "%.0f", v);
    if (rate(m, "pfcps_server_pushed_rows_total", &v) == 0)
        snprintf(c[C_PUSH], sizeof(cell), "%.0f", v);
    if (value(p, "pfcps_server_queue_depth", NULL, 0, &v) == 0)
        snprintf(c[C_QUEUE], sizeof(cell), "%.0f", v);
    if (value(p, "pfcps_server_snapshot_last_timestamp_seconds", NULL, 0, &v) == 0) {
        if (v > 0)
            human_age(m->wall - v < 0 ? 0 : m->wall - v, c[C_SNAP], sizeof(cell));
        else
            snprintf(c[C_SNAP], sizeof(cell), "none");
    }
}

/* The role and rank of m: its page's constant labels, else what /targets said. */
static void member_ident(const member *m, char *role, size_t cap, int *rank)
{
    const char *r = NULL, *k = NULL;
    for (int i = 0; m->have_cur && i < m->cur.nsamples && !r; i++) {
        r = prom_label_get(&m->cur.samples[i], "role");
        k = prom_label_get(&m->cur.samples[i], "rank");
    }
    printable(r && *r ? r : m->id.role, role, cap);
    char *end = NULL;
    long x = k && *k ? strtol(k, &end, 10) : -1;
    *rank = k && *k && !*end && x >= 0 && x < 1000000 ? (int)x : m->id.rank;
}

/* Every cell of m's row (m up). */
static void member_cells(const member *m, cell c[NCOL])
{
    int rank;
    for (int k = 0; k < NCOL; k++)
        snprintf(c[k], sizeof(cell), "-");
    member_ident(m, c[C_ROLE], sizeof(cell), &rank);
    if (!c[C_ROLE][0])
        snprintf(c[C_ROLE], sizeof(cell), "?");
    if (rank >= 0)
        snprintf(c[C_RANK], sizeof(cell), "%d", rank);
    else
        snprintf(c[C_RANK], sizeof(cell), "?");
    printable(m->id.addr, c[C_ADDR], sizeof(cell));
    if (strcmp(c[C_ROLE], "worker") == 0)
        worker_cells(m, c);
    else if (strcmp(c[C_ROLE], "server") == 0)
        server_cells(m, c);
    double rss, lim;
    if (value(&m->cur, "process_resident_memory_bytes", NULL, 0, &rss) == 0) {
        char b[32];
        human_bytes(rss, b, sizeof b);
        if (value(&m->cur, "pfcps_memory_limit_bytes", NULL, 0, &lim) == 0 && lim > 0)
            snprintf(c[C_MEM], sizeof(cell), "%s(%.0f%%)", b, 100 * rss / lim);
        else
            snprintf(c[C_MEM], sizeof(cell), "%s", b);
    }
}

/* ---- the view ---- */

typedef struct row_key {
    char role[32];
    int rank;
    const member *m;
} row_key;

/* By role (known roles first, by name), then rank (known first), then address. */
static int row_cmp(const void *a, const void *b)
{
    const row_key *x = a, *y = b;
    if (!x->role[0] != !y->role[0])
        return x->role[0] ? -1 : 1;
    int c = strcmp(x->role, y->role);
    if (c)
        return c;
    if ((x->rank < 0) != (y->rank < 0))
        return x->rank < 0 ? 1 : -1;
    if (x->rank != y->rank)
        return x->rank < y->rank ? -1 : 1;
    return strcmp(x->m->id.addr, y->m->id.addr);
}

/* One line of the table: ROLE and ADDRESS left-aligned, the figures right-aligned. */
static void print_row(const char *const c[NCOL])
{
    for (int k = 0; k < NCOL; k++) {
        if (k == C_ADDR)
            printf("%s\n", c[k]);
        else
            printf(k == C_ROLE ? "%-*s " : "%*s ", col_width[k], c[k]);
    }
}

/* Prints one refresh: a title line, the run, the header, one row per member, the sources' notes. */
static void render(const top *tp, int refresh, int count, double interval, int tty)
{
    row_key *rows = calloc((size_t)tp->nm + 1, sizeof *rows);
    if (!rows)
        return;
    int up = 0;
    char run[40] = "";
    for (int k = 0; k < tp->nm; k++) {
        rows[k].m = &tp->m[k];
        member_ident(&tp->m[k], rows[k].role, sizeof rows[k].role, &rows[k].rank);
        up += tp->m[k].up;
        const prom_sample *s = tp->m[k].up ? prom_find(&tp->m[k].cur, "pfcps_build_info", NULL, 0) : NULL;
        const char *r = s ? prom_label_get(s, "run") : NULL;
        if (!run[0] && r && *r)
            printable(r, run, sizeof run);
    }
    qsort(rows, (size_t)tp->nm, sizeof *rows, row_cmp);
    if (tty)
        fputs("\033[H\033[2J", stdout);
    time_t now = time(NULL);
    struct tm tmv;
    char when[32];
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime_r(&now, &tmv));
    printf("pfcps top  %s  members %d, up %d  (every %gs, refresh %d", when, tp->nm, up, interval, refresh);
    if (count)
        printf(" of %d", count);
    printf(")%s%s\n", run[0] ? "  run " : "", run);
    print_row(col_name);
    for (int r = 0; r < tp->nm; r++) {
        const member *m = rows[r].m;
        cell c[NCOL];
        member_cells(m, c);
        if (!m->up) {
            char err[sizeof m->err];
            printable(m->err, err, sizeof err);
            printf("%-*s %*s down: %s (%s)\n", col_width[C_ROLE], c[C_ROLE], col_width[C_RANK], c[C_RANK],
                   err, c[C_ADDR]);
            continue;
        }
        const char *cells[NCOL];
        for (int k = 0; k < NCOL; k++)
            cells[k] = c[k];
        print_row(cells);
    }
    printf("WAIT: worker seconds waited per step; server median apply time\n");
    for (int s = 0; s < tp->nsrc; s++)
        if (tp->src[s].note[0]) {
            char n[sizeof tp->src[s].note];
            printable(tp->src[s].note, n, sizeof n);
            printf("%s: %s\n", tp->src[s].addr, n);
        }
    if (!tty)
        printf("\n");
    fflush(stdout);
    free(rows);
}

/* GETs each fetch of f and hands the answers over: /targets to sources, /metrics to members by address. */
static void fetch_round(top *tp, fetch *f, int n, int update)
{
    fetch_all(f, n, tp->hdr);
    for (int j = 0; j < n; j++)
        if (f[j].member < 0)
            targets_answer(&tp->src[-1 - f[j].member], &f[j]);
    if (update && members_update(tp) < 0)
        fprintf(stderr, "pfcps top: out of memory for the member list\n");
    for (int j = 0; j < n; j++) {
        int k = f[j].member >= 0 ? member_find(tp, f[j].addr) : -1;
        if (k >= 0)
            metrics_answer(&tp->m[k], &f[j]);
        free(f[j].body);
        f[j].body = NULL;
    }
}

/* Sets f up to GET http://ADDR/WHAT for `who` (a member index, or -1 - a source index); limit: bytes at most.
 */
static void fetch_init(fetch *f, const char *addr, const char *what, int who, size_t limit)
{
    snprintf(f->addr, sizeof f->addr, "%s", addr);
    snprintf(f->url, sizeof f->url, "http://%s/%s", addr, what);
    f->member = who;
    f->limit = limit;
}

/* One refresh: every source's /targets and every known member's /metrics together, then the members that
 * /targets has just added. Returns the members up, or -ENOMEM. */
static int refresh(top *tp)
{
    fetch *f = calloc((size_t)(tp->nsrc + tp->nm), sizeof *f);
    if (!f)
        return -ENOMEM;
    int n = 0;
    for (int s = 0; s < tp->nsrc; s++)
        fetch_init(&f[n++], tp->src[s].addr, "targets", -1 - s, TOP_TARGETS_MAX);
    for (int k = 0; k < tp->nm; k++) {
        tp->m[k].scraped = 0;
        fetch_init(&f[n++], tp->m[k].id.addr, "metrics", k, PROM_TEXT_MAX_BYTES);
    }
    fetch_round(tp, f, n, 1);
    free(f);
    if (!(f = calloc((size_t)tp->nm + 1, sizeof *f)))
        return -ENOMEM;
    n = 0;
    for (int k = 0; k < tp->nm; k++)
        if (!tp->m[k].scraped)
            fetch_init(&f[n++], tp->m[k].id.addr, "metrics", k, PROM_TEXT_MAX_BYTES);
    if (n)
        fetch_round(tp, f, n, 0);
    free(f);
    int up = 0;
    for (int k = 0; k < tp->nm; k++)
        up += tp->m[k].up;
    return up;
}

static volatile sig_atomic_t top_stop;

static void on_stop(int sig)
{
    (void)sig;
    top_stop = 1;
}

/* Sleeps until pf_now_s() reaches t or a signal stops the view. */
static void sleep_until(double t)
{
    for (double left; !top_stop && (left = t - pf_now_s()) > 0;) {
        struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

/* Reads the command line into *interval, *count and the sources. Returns 0 or the exit status 2. */
static int top_args(int argc, char **argv, double *interval, int *count, top *tp)
{
    static const tool_opt opts[] = {{"--interval", 1}, {"--count", 1}, {"--once", 0}, {NULL, 0}};
    tool_args a;
    int k, once = 0, counted = 0;
    tool_args_init(&a, "top", opts, argc, argv);
    while ((k = tool_args_next(&a)) != TOOL_END) {
        char *end = NULL;
        if (k == 0) {
            *interval = a.arg ? strtod(a.arg, &end) : 0;
            if (!a.arg || end == a.arg || *end || !(*interval > 0 && *interval <= TOP_MAX_INTERVAL))
                return tool_opt_bad(&a, "a number of seconds in (0, 3600]"), 2;
        } else if (k == 1) {
            if (tool_opt_int(&a, 0, 1000000000, "an integer >= 0 (0: until Ctrl-C)", count) < 0)
                return 2;
            counted = 1;
        } else if (k == 2)
            once = 1;
        else if (k == TOOL_UNKNOWN)
            return tool_unexpected(&a, a.opt, top_usage);
        else {
            source *q = realloc(tp->src, (size_t)(tp->nsrc + 1) * sizeof *q);
            if (!q)
                return fprintf(stderr, "pfcps top: out of memory\n"), 2;
            tp->src = q;
            source *s = &q[tp->nsrc];
            *s = (source){0};
            char why[600];
            if (parse_addr(a.arg, s->addr, sizeof s->addr, why, sizeof why) < 0)
                return fprintf(stderr, "pfcps top: %s\n", why), 2;
            tp->nsrc++;
        }
    }
    if (once && counted)
        return fprintf(stderr, "pfcps top: give --count or --once, not both\n"), 2;
    if (once)
        *count = 1;
    if (tp->nsrc == 0)
        return fprintf(stderr, "pfcps top: needs at least one URL\n%s\n", top_usage), 2;
    return 0;
}

static void top_free(top *tp)
{
    for (int s = 0; s < tp->nsrc; s++)
        free(tp->src[s].t);
    free(tp->src);
    for (int k = 0; k < tp->nm; k++)
        member_free(&tp->m[k]);
    free(tp->m);
    curl_slist_free_all(tp->hdr);
}

int cmd_top(int argc, char **argv)
{
    double interval = 1;
    int count = 0;
    top tp = {0};
    int rc = top_args(argc, argv, &interval, &count, &tp);
    if (rc) {
        top_free(&tp);
        return rc;
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK ||
        !(tp.hdr = curl_slist_append(NULL, "Accept: text/plain;version=0.0.4"))) {
        fprintf(stderr, "pfcps top: cannot initialise libcurl\n");
        top_free(&tp);
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_stop};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    int tty = isatty(STDOUT_FILENO), up = 0;
    double next = pf_now_s();
    for (int r = 1; !top_stop && (count == 0 || r <= count); r++) {
        if ((up = refresh(&tp)) < 0) {
            fprintf(stderr, "pfcps top: out of memory\n");
            break;
        }
        render(&tp, r, count, interval, tty);
        if (count && r == count)
            break;
        next += interval;
        double now = pf_now_s();
        if (next < now)
            next = now;
        sleep_until(next);
    }
    top_free(&tp);
    curl_global_cleanup();
    return up > 0 ? 0 : 1;
}
