/* Files replaced whole: see atomic_file.h. */
#include "common/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"

/* The temp file is opened without truncation and truncated only once this process holds its lock, so a
 * second writer of the same path can never cut a first writer's bytes short. After the lock is taken the
 * name must still lead to the locked file: a writer that held it may have renamed it over <path> meanwhile
 * (then the name is opened again). A FIFO or socket planted at the temp name is refused at once
 * (O_NONBLOCK: opening a FIFO without a reader fails with ENXIO instead of waiting for one). */
int pf_atomic_open(pf_atomic_file *af, const char *path, const char *what)
{
    memset(af, 0, sizeof *af);
    af->what = what ? what : "";
    const char *sp = *af->what ? " " : "";
    if ((size_t)snprintf(af->path, sizeof af->path, "%s", path) >= sizeof af->path)
        return pf_err(-EINVAL, "%s%spath too long: %s", af->what, sp, path);
    snprintf(af->tmp, sizeof af->tmp, "%s.tmp", path);
    for (int attempt = 0; attempt < 16; attempt++) {
        int fd = open(af->tmp, O_WRONLY | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0666);
        if (fd < 0)
            return pf_err(-EIO, "%s%s%s: cannot create: %s", af->what, sp, af->tmp,
                          errno == ENXIO ? "a FIFO without a reader is in the way" : strerror(errno));
        struct stat st, now;
        if (fstat(fd, &st) != 0 || S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode) || S_ISDIR(st.st_mode)) {
            close(fd);
            return pf_err(-EIO, "%s%s%s: cannot create: not a regular file (a FIFO, socket or folder is in the way)",
                          af->what, sp, af->tmp);
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            close(fd);
            if (e == EWOULDBLOCK)
                return pf_err(-EBUSY, "%s%s%s: being written by another process at this moment; not written "
                                      "twice at once",
                              af->what, sp, af->path);
            return pf_err(-EIO, "%s%s%s: cannot lock: %s", af->what, sp, af->tmp, strerror(e));
        }
        if (stat(af->tmp, &now) != 0 || now.st_dev != st.st_dev || now.st_ino != st.st_ino) {
            close(fd); /* the writer that held it renamed it into place: open the name afresh */
            continue;
        }
        int fl = fcntl(fd, F_GETFL);
        if ((S_ISREG(st.st_mode) && ftruncate(fd, 0) != 0) || fl < 0 ||
            fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0 || !(af->f = fdopen(fd, "wb"))) {
            int e = errno;
            close(fd);
            unlink(af->tmp);
            return pf_err(-EIO, "%s%s%s: cannot create: %s", af->what, sp, af->tmp, strerror(e));
        }
        return 0;
    }
    return pf_err(-EBUSY, "%s%s%s: other processes kept replacing it while it was opened", af->what, sp,
                  af->path);
}

/* fsync of the folder holding path, so that a rename into it is durable. */
static int sync_folder(const char *path)
{
    char dir[4096];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) + (slash == path) : 1, slash ? path : ".");
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* The rename (or the unlink of a failed temp file) happens before fclose, while the lock is held: once it
 * is released another writer may open and truncate the temp name. */
int pf_atomic_commit(pf_atomic_file *af, int ok)
{
    const char *sp = *af->what ? " " : "";
    int err = ok ? 0 : errno ? errno : EIO;
    if (ok && (ferror(af->f) || fflush(af->f) != 0 || fsync(fileno(af->f)) != 0)) {
        ok = 0;
        err = errno ? errno : EIO;
    }
    if (ok && rename(af->tmp, af->path) != 0) {
        ok = 0;
        err = errno;
    }
    if (!ok)
        unlink(af->tmp);
    int closed = fclose(af->f) == 0;
    int cerr = errno;
    af->f = NULL;
    if (!ok)
        return pf_err(-EIO, "%s%s%s: write failed: %s", af->what, sp, af->path, strerror(err));
    if (!closed) /* flushed and synced before the rename: the file in place is whole */
        return pf_err(-EIO, "%s%s%s: written, but closing it failed: %s", af->what, sp, af->path,
                      strerror(cerr));
    if (sync_folder(af->path) != 0)
        return pf_err(-EIO, "%s%s%s: written, but the folder could not be synced: %s", af->what, sp, af->path,
                      strerror(errno));
    return 0;
}

void pf_atomic_abort(pf_atomic_file *af)
{
    if (af->f && af->tmp[0])
        unlink(af->tmp); /* while the lock is held (see pf_atomic_commit) */
    if (af->f)
        fclose(af->f);
    af->f = NULL;
}
