/* Logging: one line per event, `2026-11-29T15:03:13.123Z pid=4242 server[0] INFO message`.
 * ISO-8601 UTC time with milliseconds, pid, role and rank, level. Lines go to stderr and, when
 * log_open_file() was called, also to that file (line-buffered; both flushed on exit).
 * Thread-safe: a line is written with one write(2) per sink. */
#ifndef PFCPS_COMMON_LOG_H
#define PFCPS_COMMON_LOG_H

#include <stdio.h>

typedef enum { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARN = 2, LOG_ERROR = 3 } log_level;

/* Sets the role ("server", "worker", "pfcps", ...) and rank (-1: none) printed on each line. */
void log_init(const char *role, int rank);

/* Lines below `level` are dropped. Default LOG_INFO; PFCPS_LOG_LEVEL=debug|info|warn|error overrides. */
void log_set_level(log_level level);

/* Parses "debug", "info", "warn" or "error"; returns -EINVAL for anything else. */
int log_parse_level(const char *name, log_level *out);

/* Also appends every line to `path` (e.g. <output>/training.log). Returns 0 or -errno. The first failed
 * write to the file (a full disk: ENOSPC; EFBIG; EIO) is reported once on stderr, naming the file and the
 * error; later lines are still tried. */
int log_open_file(const char *path);

/* How lines are written to the file sink (stderr always gets pfcps's format). */
typedef enum {
    LOG_FORMAT_PFCPS = 0,   /* as stderr: `2026-11-29T15:03:13.123Z pid=4242 worker[0] INFO message` */
    LOG_FORMAT_ARCFACE = 1, /* arcface_torch's utils_logging.init_logging: `Training: %(asctime)s-%(message)s`,
                               asctime local time `2026-11-29 16:03:13,123`: `Training: 2026-11-29
                               16:03:13,123-message` (no pid, role or level) */
} log_format;

/* Sets the file sink's line format (default LOG_FORMAT_PFCPS); kept across log_open_file. */
void log_set_file_format(log_format f);

/* Parses "pfcps" or "arcface_torch"; returns -EINVAL for anything else. */
int log_parse_format(const char *name, log_format *out);

/* Closes the file sink (flushes). */
void log_close_file(void);

void log_write(log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The message of this process' latest ERROR line (without time, role or level; "" when none), truncated to
 * cap bytes: what a daemon that fails tells the run's other members (common/ctl.h ctl_session_fail). */
void log_last_error(char *out, size_t cap);

#define log_debug(...) log_write(LOG_DEBUG, __VA_ARGS__)
#define log_info(...)  log_write(LOG_INFO, __VA_ARGS__)
#define log_warn(...)  log_write(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_write(LOG_ERROR, __VA_ARGS__)

#endif
