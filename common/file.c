/* File reads (see file.h). */
#include "common/file.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/splitmix64.h"

const char *pf_file_kind(const struct stat *st)
{
    if (S_ISREG(st->st_mode))
        return "a regular file";
    if (S_ISDIR(st->st_mode))
        return "a directory";
    if (S_ISFIFO(st->st_mode))
        return "a FIFO";
    if (S_ISCHR(st->st_mode))
        return "a character device";
    if (S_ISBLK(st->st_mode))
        return "a block device";
    if (S_ISSOCK(st->st_mode))
        return "a socket";
    if (S_ISLNK(st->st_mode))
        return "a symbolic link";
    return "not a regular file";
}

/* The error for a failed stat or open of a user's path (errno e). */
static int open_error(int e)
{
    if (e == EACCES || e == EPERM)
        return pf_err(-EACCES, "permission denied");
    return pf_err(e == ENOENT || e == ENOTDIR ? -ENOENT : -EIO, "cannot open: %s", strerror(e));
}

/* The error for a file that is not a regular one. */
static int kind_error(const struct stat *st)
{
    const char *kind = pf_file_kind(st);
    if (!strcmp(kind, "not a regular file"))
        return pf_err(-EIO, "not a regular file");
    return pf_err(-EIO, "%s, not a regular file", kind);
}

/* The checks after a non-blocking open of fd: fstat (the path may have been replaced since it was looked at:
 * the descriptor is what counts), a regular file (or, with allow_chr, a character device), then O_NONBLOCK
 * cleared. Returns fd (filling *st_out when not NULL), or closes it and returns kind_error's or -EIO. */
static int settle_fd(int fd, int allow_chr, struct stat *st_out)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return pf_err(-EIO, "cannot open: fstat: %s", strerror(e));
    }
    if (!S_ISREG(st.st_mode) && !(allow_chr && S_ISCHR(st.st_mode))) {
        close(fd);
        return kind_error(&st);
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
        int e = errno;
        close(fd);
        return pf_err(-EIO, "cannot open: fcntl: %s", strerror(e));
    }
    if (st_out)
        *st_out = st;
    return fd;
}

int pf_open_regular(const char *path, struct stat *st_out)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return open_error(errno);
    if (!S_ISREG(st.st_mode))
        return kind_error(&st);
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return open_error(errno);
    return settle_fd(fd, 0, st_out);
}

/* *f = fd as a stdio stream in `mode`; fd (a descriptor, or a negative error code passed through) is closed
 * when the stream cannot be made. Returns 0, fd's error, or -ENOMEM "out of memory". */
static int stream_of(int fd, const char *mode, FILE **f)
{
    *f = NULL;
    if (fd < 0)
        return fd;
    *f = fdopen(fd, mode);
    if (!*f) {
        close(fd);
        return pf_err(-ENOMEM, "out of memory");
    }
    return 0;
}

int pf_fopen_regular(const char *path, FILE **f)
{
    return stream_of(pf_open_regular(path, NULL), "rb", f);
}

int pf_open_output(const char *path, int flags, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | flags, mode);
    if (fd < 0) {
        int e = errno;
        struct stat st;
        /* ENXIO: a FIFO without a reader, or a socket; EISDIR: a folder. Name what is there. */
        if ((e == ENXIO || e == EISDIR) && stat(path, &st) == 0 && !S_ISREG(st.st_mode))
            return kind_error(&st);
        if (e == EACCES || e == EPERM)
            return pf_err(-EACCES, "permission denied");
        return pf_err(-e, "cannot open: %s", strerror(e));
    }
    return settle_fd(fd, 1, NULL);
}

int pf_fopen_output(const char *path, int append, FILE **f)
{
    return stream_of(pf_open_output(path, O_CREAT | (append ? O_APPEND : O_TRUNC), 0644), append ? "a" : "w", f);
}

/* Reads until n bytes are in buf or the file ends: *got = how many. Returns 0 or -EIO "read failed: ...". */
static int read_upto(int fd, void *buf, size_t n, size_t *got)
{
    *got = 0;
    while (*got < n) {
        ssize_t r = read(fd, (uint8_t *)buf + *got, n - *got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return pf_err(-EIO, "read failed: %s", strerror(errno));
        if (r == 0)
            break;
        *got += (size_t)r;
    }
    return 0;
}

int pf_read_file(const char *path, size_t max_bytes, uint8_t **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    struct stat st;
    int fd = pf_open_regular(path, &st);
    if (fd < 0)
        return fd;
    if (max_bytes > 0 && (uint64_t)st.st_size > (uint64_t)max_bytes) {
        close(fd);
        return pf_err(-EFBIG, "larger than %zu bytes", max_bytes);
    }
    if ((uint64_t)st.st_size >= (uint64_t)SIZE_MAX) {
        close(fd);
        return pf_err(-ENOMEM, "out of memory for %lld bytes", (long long)st.st_size);
    }
    size_t n = (size_t)st.st_size;
    uint8_t *b = malloc(n + 1);
    if (!b) {
        close(fd);
        return pf_err(-ENOMEM, "out of memory for %zu bytes", n);
    }
    size_t got = 0;
    int rc = read_upto(fd, b, n, &got);
    close(fd);
    if (rc < 0) {
        free(b);
        return rc;
    }
    if (got != n) {
        free(b);
        return pf_err(-EIO, "short read (%zu of %zu bytes)", got, n);
    }
    b[n] = 0;
    *data = b;
    *len = n;
    return 0;
}

int pf_read_head(const char *path, void *buf, size_t n, size_t *got)
{
    *got = 0;
    struct stat st;
    int fd = pf_open_regular(path, &st);
    if (fd < 0)
        return fd;
    int rc = read_upto(fd, buf, n, got);
    close(fd);
    return rc;
}

int pf_file_sha256(const char *path, uint8_t d[32])
{
    struct stat st;
    int fd = pf_open_regular(path, &st);
    if (fd < 0)
        return pf_err_wrap(fd, "%s", path);
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    int rc = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) == 1 ? 0 : pf_err(-ENOMEM, "out of memory");
    uint8_t buf[65536];
    while (rc == 0) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            rc = pf_err(-EIO, "%s: read failed: %s", path, strerror(errno));
        else if (n == 0)
            break;
        else
            EVP_DigestUpdate(c, buf, (size_t)n);
    }
    unsigned int len = 0;
    if (rc == 0)
        EVP_DigestFinal_ex(c, d, &len);
    EVP_MD_CTX_free(c);
    close(fd);
    return rc;
}

struct pf_dirset_slot {
    dev_t dev;
    ino_t ino;
    int used;
};

static size_t dirset_home(dev_t dev, ino_t ino, size_t cap)
{
    return (size_t)(splitmix64((uint64_t)ino ^ splitmix64((uint64_t)dev)) & (cap - 1));
}

int pf_dirset_enter(pf_dirset *s, const struct stat *st)
{
    if (2 * (s->n + 1) > s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        struct pf_dirset_slot *v = calloc(cap, sizeof *v);
        if (!v)
            return pf_err(-ENOMEM, "out of memory");
        for (size_t i = 0; i < s->cap; i++) {
            if (!s->slot[i].used)
                continue;
            size_t h = dirset_home(s->slot[i].dev, s->slot[i].ino, cap);
            while (v[h].used)
                h = (h + 1) & (cap - 1);
            v[h] = s->slot[i];
        }
        free(s->slot);
        s->slot = v;
        s->cap = cap;
    }
    size_t h = dirset_home(st->st_dev, st->st_ino, s->cap);
    for (; s->slot[h].used; h = (h + 1) & (s->cap - 1))
        if (s->slot[h].dev == st->st_dev && s->slot[h].ino == st->st_ino)
            return 0;
    s->slot[h] = (struct pf_dirset_slot){st->st_dev, st->st_ino, 1};
    s->n++;
    return 1;
}

void pf_dirset_free(pf_dirset *s)
{
    free(s->slot);
    memset(s, 0, sizeof *s);
}
