/* Files replaced whole: see atomic_file.h. */
#include "common/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"

int pf_atomic_open(pf_atomic_file *af, const char *path, const char *what)
{
    memset(af, 0, sizeof *af);
    af->what = what ? what : "";
    if ((size_t)snprintf(af->path, sizeof af->path, "%s", path) >= sizeof af->path)
        return pf_err(-EINVAL, "%s%spath too long: %s", af->what, *af->what ? " " : "", path);
    snprintf(af->tmp, sizeof af->tmp, "%s.tmp", path);
    af->f = fopen(af->tmp, "wb");
    if (!af->f)
        return pf_err(-EIO, "%s%s%s: cannot create: %s", af->what, *af->what ? " " : "", af->tmp,
                      strerror(errno));
    return 0;
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

int pf_atomic_commit(pf_atomic_file *af, int ok)
{
    int err = ok ? 0 : errno ? errno : EIO;
    if (ok && (ferror(af->f) || fflush(af->f) != 0 || fsync(fileno(af->f)) != 0)) {
        ok = 0;
        err = errno ? errno : EIO;
    }
    if (fclose(af->f) != 0 && ok) {
        ok = 0;
        err = errno;
    }
    af->f = NULL;
    if (ok && rename(af->tmp, af->path) != 0) {
        ok = 0;
        err = errno;
    }
    if (!ok) {
        unlink(af->tmp);
        return pf_err(-EIO, "%s%s%s: write failed: %s", af->what, *af->what ? " " : "", af->path,
                      strerror(err));
    }
    if (sync_folder(af->path) != 0)
        return pf_err(-EIO, "%s%s%s: written, but the folder could not be synced: %s", af->what,
                      *af->what ? " " : "", af->path, strerror(errno));
    return 0;
}

void pf_atomic_abort(pf_atomic_file *af)
{
    if (af->f)
        fclose(af->f);
    af->f = NULL;
    if (af->tmp[0])
        unlink(af->tmp);
}
