#include "common/log.h"
#include "common/file.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static char log_role[32] = "pfcps";
static int log_rank = -1;
static log_level log_min = LOG_INFO;
static int log_fd = -1;
static char log_path[1024];  /* the file sink's path, for its write-error report */
static int log_write_failed; /* the file sink's write error was reported (once per log_open_file) */
static log_format log_file_fmt = LOG_FORMAT_PFCPS;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_last_err[1024]; /* the message of the latest ERROR line (log_last_error), under log_lock */

static const char *level_name[] = {"DEBUG", "INFO", "WARN", "ERROR"};

int log_parse_level(const char *name, log_level *out)
{
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(name, level_name[i]) == 0 || (i == 2 && strcasecmp(name, "warning") == 0)) {
            *out = (log_level)i;
            return 0;
        }
    }
    return -EINVAL;
}

void log_init(const char *role, int rank)
{
    snprintf(log_role, sizeof log_role, "%s", role ? role : "pfcps");
    log_rank = rank;
    const char *env = getenv("PFCPS_LOG_LEVEL");
    log_level lv;
    if (env && log_parse_level(env, &lv) == 0)
        log_min = lv;
}

void log_set_level(log_level level)
{
    log_min = level;
}

int log_open_file(const char *path)
{
    int fd = pf_open_output(path, O_CREAT | O_APPEND, 0644);
    if (fd < 0)
        return fd;
    pthread_mutex_lock(&log_lock);
    if (log_fd >= 0)
        close(log_fd);
    log_fd = fd;
    snprintf(log_path, sizeof log_path, "%s", path);
    log_write_failed = 0;
    pthread_mutex_unlock(&log_lock);
    return 0;
}

void log_set_file_format(log_format f)
{
    pthread_mutex_lock(&log_lock);
    log_file_fmt = f;
    pthread_mutex_unlock(&log_lock);
}

int log_parse_format(const char *name, log_format *out)
{
    if (name && !strcmp(name, "pfcps"))
        *out = LOG_FORMAT_PFCPS;
    else if (name && !strcmp(name, "arcface_torch"))
        *out = LOG_FORMAT_ARCFACE;
    else
        return -EINVAL;
    return 0;
}

void log_close_file(void)
{
    pthread_mutex_lock(&log_lock);
    if (log_fd >= 0) {
        fsync(log_fd);
        close(log_fd);
    }
    log_fd = -1;
    pthread_mutex_unlock(&log_lock);
}

/* Writes p[0..n) to fd. Returns 0 or -errno (a write that makes no progress is -ENOSPC). */
static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (w == 0)
            return -ENOSPC;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

void log_write(log_level level, const char *fmt, ...)
{
    if (level < log_min)
        return;
    char line[4096];
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    int n = (int)strftime(line, sizeof line, "%Y-%m-%dT%H:%M:%S", &tm);
    if (log_rank >= 0)
        n += snprintf(line + n, sizeof line - (size_t)n, ".%03dZ pid=%d %s[%d] %s ", (int)(tv.tv_usec / 1000),
                      (int)getpid(), log_role, log_rank, level_name[level]);
    else
        n += snprintf(line + n, sizeof line - (size_t)n, ".%03dZ pid=%d %s %s ", (int)(tv.tv_usec / 1000),
                      (int)getpid(), log_role, level_name[level]);
    const int head = n; /* the message starts here */
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    n += m;
    if (n > (int)sizeof line - 2)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    /* arcface_torch's file line: "Training: " + Python logging's asctime (local time, ",mmm") + "-" + message */
    char aline[sizeof line + 64];
    int an = 0;
    struct tm lt;
    localtime_r(&tv.tv_sec, &lt);
    an = (int)strftime(aline, sizeof aline, "Training: %Y-%m-%d %H:%M:%S", &lt);
    an += snprintf(aline + an, sizeof aline - (size_t)an, ",%03d-", (int)(tv.tv_usec / 1000));
    memcpy(aline + an, line + head, (size_t)(n - head));
    an += n - head;
    pthread_mutex_lock(&log_lock);
    if (level == LOG_ERROR)
        snprintf(log_last_err, sizeof log_last_err, "%.*s", n - head - 1, line + head);
    (void)write_all(STDERR_FILENO, line, (size_t)n);
    int rc = log_fd < 0                              ? 0
             : log_file_fmt == LOG_FORMAT_ARCFACE ? write_all(log_fd, aline, (size_t)an)
                                                  : write_all(log_fd, line, (size_t)n);
    if (rc < 0 && !log_write_failed) {
        /* A full disk (or a file size limit) must not leave the file short without a word: said once, on
         * stderr, which still gets every line. */
        log_write_failed = 1;
        char msg[1200];
        int m2 =
            snprintf(msg, sizeof msg,
                     "%s: cannot write log file %s: %s; it misses this line and may miss later ones (stderr "
                     "still has every line)\n",
                     log_role, log_path, strerror(-rc));
        (void)write_all(STDERR_FILENO, msg, m2 < (int)sizeof msg ? (size_t)m2 : sizeof msg - 1);
    }
    pthread_mutex_unlock(&log_lock);
}

void log_last_error(char *out, size_t cap)
{
    if (!cap)
        return;
    pthread_mutex_lock(&log_lock);
    snprintf(out, cap, "%s", log_last_err);
    pthread_mutex_unlock(&log_lock);
}
