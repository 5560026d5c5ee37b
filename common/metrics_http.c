/* The /metrics endpoint (see metrics.h): libmicrohttpd on its own polling thread, on a listening socket bound
 * here (so that the bind's errno names the problem exactly), with limits on connections, memory and time.
 *
 * libmicrohttpd's connection timeout counts idle time only: a client that sends one byte of its request
 * head every second would hold its connection for ever. So each connection also gets a deadline (its accept
 * or its previous response + METRICS_CONNECTION_TIMEOUT_S for the next request head; METRICS_RESPONSE_TIMEOUT_S
 * while a response is sent); a watchdog thread shuts down the socket of a connection past its deadline,
 * which libmicrohttpd then sees as closed. Connections are tracked from libmicrohttpd's STARTED to its CLOSED
 * notification under one mutex, and the socket is closed only after CLOSED, so the watchdog never touches a
 * descriptor that was reused. */
#include "common/metrics.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/metrics_internal.h"

#define MAX_PAGES         16
#define PAGE_FIELD        128
#define CONNECTION_LIMIT  32u
#define PER_IP_LIMIT      16u
#define CONNECTION_MEMORY ((size_t)32 * 1024)
#define CONTENT_TYPE      "text/plain; version=0.0.4; charset=utf-8"

typedef struct page {
    char path[PAGE_FIELD];
    char content_type[PAGE_FIELD];
    char *(*render)(void *arg);
    void *arg;
} page;

/* One accepted connection, from STARTED to CLOSED. */
typedef struct conn_watch {
    int fd;
    double deadline; /* pf_now_s() clock */
    int shut;
    struct conn_watch *prev, *next;
} conn_watch;

static pthread_mutex_t g_page_mu = PTHREAD_MUTEX_INITIALIZER;
static page g_pages[MAX_PAGES];
static int g_npages;

static pthread_mutex_t g_start_mu = PTHREAD_MUTEX_INITIALIZER; /* metrics_start / metrics_stop */
static struct MHD_Daemon *g_daemon;
static char g_bound[300]; /* metrics_bound: the running endpoint's "host:port", "" when stopped */

static pthread_mutex_t g_conn_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_conn_cv = PTHREAD_COND_INITIALIZER;
static conn_watch *g_conns;
static int g_watch_stop;
static pthread_t g_watchdog;

static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static double g_log_window;
static int g_log_lines, g_log_dropped;

/* ---- pages ---- */

int metrics_add_page(const char *path, const char *content_type, char *(*render)(void *arg), void *arg)
{
    if (!path || path[0] != '/' || strlen(path) >= PAGE_FIELD || !strcmp(path, "/metrics"))
        return pf_err(-EINVAL, "metrics page path '%s': must start with '/', be shorter than %d bytes and not be "
                      "/metrics", path ? path : "(null)", PAGE_FIELD);
    if (!content_type || strlen(content_type) >= PAGE_FIELD || !render)
        return pf_err(-EINVAL, "metrics page %s: content type missing or longer than %d bytes, or no render "
                      "function", path, PAGE_FIELD - 1);
    pthread_mutex_lock(&g_page_mu);
    int i = 0;
    while (i < g_npages && strcmp(g_pages[i].path, path) != 0)
        i++;
    if (i == MAX_PAGES) {
        pthread_mutex_unlock(&g_page_mu);
        return pf_err(-ENOSPC, "metrics page %s: %d pages already", path, MAX_PAGES);
    }
    snprintf(g_pages[i].path, PAGE_FIELD, "%s", path);
    snprintf(g_pages[i].content_type, PAGE_FIELD, "%s", content_type);
    g_pages[i].render = render;
    g_pages[i].arg = arg;
    if (i == g_npages)
        g_npages++;
    pthread_mutex_unlock(&g_page_mu);
    return 0;
}

void metrics_pages_reset(void)
{
    pthread_mutex_lock(&g_page_mu);
    g_npages = 0;
    pthread_mutex_unlock(&g_page_mu);
}

/* The page at url into *out; returns 1 when there is one. */
static int find_page(const char *url, page *out)
{
    int found = 0;
    pthread_mutex_lock(&g_page_mu);
    for (int i = 0; i < g_npages && !found; i++)
        if (!strcmp(g_pages[i].path, url)) {
            *out = g_pages[i];
            found = 1;
        }
    pthread_mutex_unlock(&g_page_mu);
    return found;
}

/* ---- requests ---- */

static void set_deadline(struct MHD_Connection *c, double seconds)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    conn_watch *w = ci ? (conn_watch *)ci->socket_context : NULL;
    if (!w)
        return;
    pthread_mutex_lock(&g_conn_mu);
    w->deadline = pf_now_s() + seconds;
    pthread_mutex_unlock(&g_conn_mu);
}

static enum MHD_Result answer_text(struct MHD_Connection *c, unsigned status, const char *text, int allow)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    if (allow)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

/* URL unescaping (MHD_OPTION_UNESCAPE_CALLBACK): MHD_http_unescape, except that a URL holding an escaped NUL
 * ("%00") is left escaped, so it matches no page (404) instead of being read as the text before the NUL
 * ("/metrics%00" as "/metrics"). Returns the length of the result. */
static size_t unescape_url(void *cls, struct MHD_Connection *c, char *s)
{
    (void)cls;
    (void)c;
    for (const char *p = s; (p = strchr(p, '%')) != NULL; p++)
        if (p[1] == '0' && p[2] == '0')
            return strlen(s);
    return MHD_http_unescape(s);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)cls;
    (void)version;
    (void)upload_data;
    (void)upload_data_size;
    (void)con_cls;
    set_deadline(c, METRICS_RESPONSE_TIMEOUT_S);
    page pg;
    int is_metrics = !strcmp(url, "/metrics");
    if (!is_metrics && !find_page(url, &pg))
        return answer_text(c, MHD_HTTP_NOT_FOUND, "not found (the metrics are at /metrics)\n", 0);
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return answer_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed (GET or HEAD)\n", 1);
    char *body = is_metrics ? metrics_render() : pg.render(pg.arg);
    if (!body)
        return answer_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n", 0);
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, is_metrics ? CONTENT_TYPE : pg.content_type);
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)con_cls;
    (void)toe;
    set_deadline(c, METRICS_CONNECTION_TIMEOUT_S); /* for the next request on this connection */
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    (void)cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        conn_watch *w = ci ? calloc(1, sizeof *w) : NULL;
        *socket_context = w;
        if (!w)
            return;
        w->fd = ci->connect_fd;
        pthread_mutex_lock(&g_conn_mu);
        w->deadline = pf_now_s() + METRICS_CONNECTION_TIMEOUT_S;
        w->next = g_conns;
        if (g_conns)
            g_conns->prev = w;
        g_conns = w;
        pthread_mutex_unlock(&g_conn_mu);
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        conn_watch *w = *socket_context;
        *socket_context = NULL;
        if (!w)
            return;
        pthread_mutex_lock(&g_conn_mu);
        if (w->prev)
            w->prev->next = w->next;
        else
            g_conns = w->next;
        if (w->next)
            w->next->prev = w->prev;
        pthread_mutex_unlock(&g_conn_mu);
        free(w);
    }
}

/* Shuts down the sockets of connections past their deadline, every 100 ms, until metrics_stop. */
static void *watchdog_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&g_conn_mu);
    while (!g_watch_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&g_conn_cv, &g_conn_mu, &ts);
        double now = pf_now_s();
        for (conn_watch *w = g_conns; w; w = w->next)
            if (!w->shut && now > w->deadline) {
                shutdown(w->fd, SHUT_RDWR);
                w->shut = 1;
            }
    }
    pthread_mutex_unlock(&g_conn_mu);
    return NULL;
}

/* libmicrohttpd's messages as warnings, at most 5 per 10 s (a flood of refused connections would otherwise
 * flood the log); the number left out is logged with the next one. */
static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    msg[strcspn(msg, "\r\n")] = '\0';
    pthread_mutex_lock(&g_log_mu);
    double now = pf_now_s();
    if (now - g_log_window > 10) {
        g_log_window = now;
        g_log_lines = 0;
    }
    int show = g_log_lines < 5, dropped = show ? g_log_dropped : 0;
    if (show) {
        g_log_lines++;
        g_log_dropped = 0;
    } else {
        g_log_dropped++;
    }
    pthread_mutex_unlock(&g_log_mu);
    if (show && dropped)
        log_warn("metrics endpoint: %s (%d similar messages left out)", msg, dropped);
    else if (show)
        log_warn("metrics endpoint: %s", msg);
}

/* ---- start / stop ---- */

static const char *bind_problem(int err)
{
    switch (err) {
    case EADDRINUSE: return "address already in use";
    case EADDRNOTAVAIL: return "not an address of this host";
    case EACCES: return "permission denied (ports below 1024 need privileges)";
    default: return strerror(err);
    }
}

/* A listening socket on address (host, port), non-blocking; its bound address into bound[cap]. Returns the
 * descriptor or a negative code with pf_errmsg(). */
static int listen_on(const char *address, const char *host, int port, char *bound, size_t cap, int *family)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    char ps[8];
    snprintf(ps, sizeof ps, "%d", port);
    int gr = getaddrinfo(host, ps, &hints, &res);
    if (gr != 0)
        return pf_err(-EINVAL, "metrics_address %s: cannot resolve host '%s': %s", address, host,
                      gr == EAI_SYSTEM ? strerror(errno) : gai_strerror(gr));
    int fd = -1, err = EADDRNOTAVAIL;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 64) < 0) {
            err = errno;
            close(fd);
            fd = -1;
            continue;
        }
        *family = ai->ai_family;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return pf_err(-err, "metrics_address %s: %s", address, bind_problem(err));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char nh[NI_MAXHOST], np[NI_MAXSERV];
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0 ||
        getnameinfo((struct sockaddr *)&ss, sl, nh, sizeof nh, np, sizeof np, NI_NUMERICHOST | NI_NUMERICSERV)) {
        close(fd);
        return pf_err(-EIO, "metrics_address %s: cannot read the bound address back", address);
    }
    if (bound && cap)
        snprintf(bound, cap, ss.ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", nh, np);
    return fd;
}

static void stop_watchdog(void)
{
    pthread_mutex_lock(&g_conn_mu);
    g_watch_stop = 1;
    pthread_cond_broadcast(&g_conn_cv);
    pthread_mutex_unlock(&g_conn_mu);
    pthread_join(g_watchdog, NULL);
}

int metrics_start(const char *address, char *bound, size_t cap)
{
    char host[256];
    int port, family = AF_INET;
    int rc = metrics_parse_address(address, host, sizeof host, &port);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&g_start_mu);
    if (g_daemon) {
        pthread_mutex_unlock(&g_start_mu);
        return pf_err(-EALREADY, "metrics_address %s: the metrics endpoint is already started", address);
    }
    char b[sizeof g_bound];
    int fd = listen_on(address, host, port, b, sizeof b, &family);
    if (fd < 0) {
        pthread_mutex_unlock(&g_start_mu);
        return fd;
    }
    metrics_register_process();
    g_watch_stop = 0;
    rc = pthread_create(&g_watchdog, NULL, watchdog_main, NULL);
    if (rc != 0) {
        close(fd);
        pthread_mutex_unlock(&g_start_mu);
        return pf_err(-rc, "metrics_address %s: cannot start a thread: %s", address, strerror(rc));
    }
    /* The logger first: libmicrohttpd reports the options it parses before it to stderr. */
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG | (family == AF_INET6 ? MHD_USE_IPv6 : 0);
    g_daemon = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, NULL, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
        MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
        MHD_OPTION_CONNECTION_LIMIT, CONNECTION_LIMIT, MHD_OPTION_PER_IP_CONNECTION_LIMIT, PER_IP_LIMIT,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)METRICS_CONNECTION_TIMEOUT_S, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        CONNECTION_MEMORY, MHD_OPTION_NOTIFY_CONNECTION, on_connection, NULL, MHD_OPTION_NOTIFY_COMPLETED,
        on_completed, NULL, MHD_OPTION_UNESCAPE_CALLBACK, unescape_url, NULL, MHD_OPTION_END);
    if (!g_daemon) {
        close(fd);
        stop_watchdog();
        pthread_mutex_unlock(&g_start_mu);
        return pf_err(-EIO, "metrics_address %s: libmicrohttpd could not start its server", address);
    }
    memcpy(g_bound, b, sizeof b);
    if (bound && cap)
        snprintf(bound, cap, "%s", b);
    pthread_mutex_unlock(&g_start_mu);
    return 0;
}

const char *metrics_bound(void)
{
    return g_bound;
}

void metrics_stop(void)
{
    pthread_mutex_lock(&g_start_mu);
    if (g_daemon) {
        MHD_stop_daemon(g_daemon); /* closes the connections (CLOSED unlinks each watch) and the socket */
        g_daemon = NULL;
        g_bound[0] = 0;
        stop_watchdog();
    }
    pthread_mutex_unlock(&g_start_mu);
}
