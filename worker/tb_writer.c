/* TensorBoard event-file writer: TFRecord framing of serialized tensorboard.Event messages (protobuf-c, from
 * proto/tb_event.proto). Format and sources in tb_writer.h. */
#include "worker/tb_writer.h"

#include "common/err.h"
#include "common/file.h"
#include "tb_event.pb-c.h"

#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct tb_writer {
    int fd;
    char *path;
    uint8_t *buf; /* framed records not yet written */
    size_t len, cap;
    int failed;                  /* 0, or the negative errno of the write that failed (sticky) */
    char failmsg[PF_ERRMSG_MAX]; /* that write's message */
};

/* The n-th file this process opened, the last part of EventFileWriter's file name (its _global_uid). */
static atomic_int tb_files_opened;

/* Bitwise CRC-32C, reflected polynomial 0x82f63b78 (RFC 3720 B.4). A table would be faster; the events of a
 * step are a few hundred bytes, so the eight shifts per byte cost nothing here. */
uint32_t tb_crc32c(const void *data, size_t n)
{
    const uint8_t *p = data;
    uint32_t crc = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
    }
    return crc ^ 0xffffffffu;
}

uint32_t tb_masked_crc32c(const void *data, size_t n)
{
    uint32_t crc = tb_crc32c(data, n);
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Packs `ev` into one TFRecord at the end of the buffer. */
static int append_record(tb_writer *w, const Tensorboard__Event *ev)
{
    size_t n = tensorboard__event__get_packed_size(ev);
    size_t need = w->len + 8 + 4 + n + 4;
    if (need > w->cap) {
        size_t cap = w->cap ? w->cap : 4096;
        while (cap < need)
            cap *= 2;
        uint8_t *buf = realloc(w->buf, cap);
        if (!buf)
            return pf_err(-ENOMEM, "%s: no memory for %zu bytes of events", w->path, cap);
        w->buf = buf;
        w->cap = cap;
    }
    uint8_t *rec = w->buf + w->len;
    for (int i = 0; i < 8; i++)
        rec[i] = (uint8_t)((uint64_t)n >> (8 * i));
    put_le32(rec + 8, tb_masked_crc32c(rec, 8));
    tensorboard__event__pack(ev, rec + 12);
    put_le32(rec + 12 + n, tb_masked_crc32c(rec + 12, n));
    w->len = need;
    return 0;
}

static int failed_again(const tb_writer *w)
{
    return pf_err(w->failed, "%s: an earlier write failed: %s", w->path, w->failmsg);
}

/* mkdir -p: every missing component of `dir`, mode 0755. */
static int make_dirs(const char *dir)
{
    size_t n = strlen(dir);
    char *p = malloc(n + 1);
    if (!p)
        return pf_err(-ENOMEM, "no memory for a path");
    memcpy(p, dir, n + 1);
    int rc = 0;
    for (size_t i = 1; i <= n && rc == 0; i++) {
        if (p[i] != '/' && p[i] != '\0')
            continue;
        char c = p[i];
        p[i] = '\0';
        struct stat st;
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            rc = pf_err(-errno, "creating the TensorBoard directory %s: %s: %s", dir, p, strerror(errno));
        else if (stat(p, &st) != 0)
            rc = pf_err(-errno, "creating the TensorBoard directory %s: %s: %s", dir, p, strerror(errno));
        else if (!S_ISDIR(st.st_mode))
            rc = pf_err(-ENOTDIR, "creating the TensorBoard directory %s: %s is not a directory", dir, p);
        p[i] = c;
    }
    free(p);
    return rc;
}

int tb_open(tb_writer **out, const char *dir)
{
    if (!out || !dir || !dir[0])
        return pf_err(-EINVAL, "tb_open: no directory given");
    *out = NULL;
    int rc = make_dirs(dir);
    if (rc < 0)
        return rc;

    char host[HOST_NAME_MAX + 1] = "localhost";
    if (gethostname(host, sizeof host) != 0 || !host[0])
        strcpy(host, "localhost");
    host[HOST_NAME_MAX] = '\0';
    for (char *c = host; *c; c++)
        if (*c == '/')
            *c = '_';

    tb_writer *w = calloc(1, sizeof *w);
    if (!w)
        return pf_err(-ENOMEM, "no memory for a TensorBoard writer");
    w->fd = -1;
    int uid = atomic_fetch_add(&tb_files_opened, 1);
    const char *fmt = "%s/events.out.tfevents.%010lld.%s.%ld.%d";
    long long now = (long long)time(NULL);
    int n = snprintf(NULL, 0, fmt, dir, now, host, (long)getpid(), uid);
    w->path = malloc((size_t)n + 1);
    if (!w->path) {
        free(w);
        return pf_err(-ENOMEM, "no memory for a TensorBoard writer");
    }
    snprintf(w->path, (size_t)n + 1, fmt, dir, now, host, (long)getpid(), uid);

    w->fd = pf_open_output(w->path, O_CREAT | O_EXCL, 0644);
    if (w->fd < 0) {
        rc = pf_err_wrap(w->fd, "creating the TensorBoard event file %s", w->path);
        tb_close(w);
        return rc;
    }

    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    ev.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
    ev.file_version = "brain.Event:2";
    rc = append_record(w, &ev);
    if (rc == 0)
        rc = tb_flush(w);
    if (rc < 0) {
        tb_close(w);
        return rc;
    }
    *out = w;
    return 0;
}

int tb_scalar(tb_writer *w, const char *tag, int64_t step, double wall_time, float value)
{
    if (!w)
        return pf_err(-EINVAL, "tb_scalar: no writer");
    if (w->failed)
        return failed_again(w);
    if (!tag)
        return pf_err(-EINVAL, "tb_scalar: no tag");
    size_t n = strnlen(tag, TB_TAG_MAX + 1);
    if (n == 0 || n > TB_TAG_MAX)
        return pf_err(-EINVAL, "tb_scalar: %s tag (1..%d bytes allowed)", n ? "too long a" : "an empty",
                      TB_TAG_MAX);
    for (size_t i = 0; i < n; i++)
        if (tag[i] < 0x20 || tag[i] > 0x7e)
            return pf_err(-EINVAL, "tb_scalar: tag \"%.*s\" has byte 0x%02x at %zu (printable ASCII only)",
                          (int)i, tag, (unsigned)(uint8_t)tag[i], i);
    if (!isfinite(wall_time))
        return pf_err(-EINVAL, "tb_scalar: %s: wall_time %g is not finite", tag, wall_time);

    Tensorboard__Summary__Value val = TENSORBOARD__SUMMARY__VALUE__INIT;
    val.tag = (char *)tag;
    val.value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
    val.simple_value = value;
    Tensorboard__Summary__Value *vals[1] = {&val};
    Tensorboard__Summary sum = TENSORBOARD__SUMMARY__INIT;
    sum.n_value = 1;
    sum.value = vals;
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = wall_time;
    ev.step = step;
    ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    return append_record(w, &ev);
}

int tb_flush(tb_writer *w)
{
    if (!w)
        return pf_err(-EINVAL, "tb_flush: no writer");
    if (w->failed)
        return failed_again(w);
    size_t off = 0;
    while (off < w->len) {
        ssize_t n = write(w->fd, w->buf + off, w->len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int code = n < 0 ? -errno : -EIO;
            w->failed = pf_err(code, "writing the TensorBoard event file %s: %s", w->path, strerror(-code));
            snprintf(w->failmsg, sizeof w->failmsg, "%s", strerror(-code));
            w->len = 0;
            return w->failed;
        }
        off += (size_t)n;
    }
    w->len = 0;
    return 0;
}

int tb_close(tb_writer *w)
{
    if (!w)
        return 0;
    int rc = 0;
    if (w->fd >= 0) {
        rc = w->failed ? failed_again(w) : w->len ? tb_flush(w) : 0;
        if (close(w->fd) != 0 && rc == 0)
            rc = pf_err(-errno, "closing the TensorBoard event file %s: %s", w->path, strerror(errno));
    }
    free(w->buf);
    free(w->path);
    free(w);
    return rc;
}

const char *tb_path(const tb_writer *w)
{
    return w ? w->path : NULL;
}
