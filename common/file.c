/* Whole-file reads (see file.h). */
#include "common/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"

int pf_read_file(const char *path, size_t max_bytes, uint8_t **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer; the fstat below
     * refuses it (and any other non-regular file) before the first read. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return pf_err(errno == ENOENT ? -ENOENT : -EIO, "cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return pf_err(-EIO, "not a regular file");
    }
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
    while (got < n) {
        ssize_t r = read(fd, b + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            free(b);
            return pf_err(-EIO, "read failed: %s", strerror(e));
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    if (got != n) {
        free(b);
        return pf_err(-EIO, "short read (%zu of %zu bytes)", got, n);
    }
    b[n] = 0;
    *data = b;
    *len = n;
    return 0;
}
