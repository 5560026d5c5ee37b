/* Whole-file reads (see file.h). */
#include "common/file.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"

/* Opens path for reading, refusing anything but a regular file before the first read. O_NONBLOCK: opening
 * a FIFO for reading would otherwise wait for a writer. Returns the descriptor (st filled), or the error with
 * a message that does not name the path. */
static int open_regular(const char *path, struct stat *st)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return pf_err(errno == ENOENT ? -ENOENT : -EIO, "cannot open: %s", strerror(errno));
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
        close(fd);
        return pf_err(-EIO, "not a regular file");
    }
    return fd;
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
    int fd = open_regular(path, &st);
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
    int fd = open_regular(path, &st);
    if (fd < 0)
        return fd;
    int rc = read_upto(fd, buf, n, got);
    close(fd);
    return rc;
}

int pf_file_sha256(const char *path, uint8_t d[32])
{
    struct stat st;
    int fd = open_regular(path, &st);
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
