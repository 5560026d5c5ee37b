/* Files replaced whole (common/atomic_file.h): a committed file has exactly what was written; an aborted
 * one, a commit after a failed write, a write past RLIMIT_FSIZE and a folder that does not exist all leave
 * the previous file byte for byte and no temp file behind, with the message naming the path. */
#include "common/atomic_file.h"
#include "common/err.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/check.h"

static char dir[256], path[512], tmp[520];

static char *slurp(const char *p, size_t *n)
{
    FILE *f = fopen(p, "rb");
    if (!f)
        return NULL;
    static char buf[1 << 16];
    *n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    return buf;
}

static int has(const char *want)
{
    size_t n;
    char *got = slurp(path, &n);
    return got && n == strlen(want) && memcmp(got, want, n) == 0 && access(tmp, F_OK) != 0;
}

int main(void)
{
    signal(SIGXFSZ, SIG_IGN);
    snprintf(dir, sizeof dir, "/tmp/pfcps-test-atomic-XXXXXX");
    if (!mkdtemp(dir))
        return 1;
    snprintf(path, sizeof path, "%s/file.bin", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);

    pf_atomic_file af;
    CHECK(pf_atomic_open(&af, path, "test") == 0, "open: %s", pf_errmsg());
    fputs("first version", af.f);
    CHECK(pf_atomic_commit(&af, 1) == 0 && has("first version"), "commit: %s", pf_errmsg());

    CHECK(pf_atomic_open(&af, path, "test") == 0, "open 2");
    fputs("torn", af.f);
    pf_atomic_abort(&af);
    CHECK(has("first version"), "abort changed the file or left the temp file");

    CHECK(pf_atomic_open(&af, path, "test") == 0, "open 3");
    fputs("half written", af.f);
    CHECK(pf_atomic_commit(&af, 0) == -EIO && strstr(pf_errmsg(), "test ") &&
              strstr(pf_errmsg(), "write failed"),
          "commit of a failed write: %s", pf_errmsg());
    CHECK(has("first version"), "a failed write replaced the file");

    /* A write past the file-size limit (as a full disk): in a child, so the limit stays there. */
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit rl = {100, 100};
        setrlimit(RLIMIT_FSIZE, &rl);
        pf_atomic_file c;
        if (pf_atomic_open(&c, path, "test") < 0)
            _exit(2);
        char big[4096];
        memset(big, 'x', sizeof big);
        int ok = fwrite(big, 1, sizeof big, c.f) == sizeof big;
        int rc = pf_atomic_commit(&c, ok);
        _exit(rc == -EIO && strstr(pf_errmsg(), "write failed") ? 0 : 3);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "write past RLIMIT_FSIZE: child status %d", st);
    CHECK(has("first version"), "a write past the size limit replaced the file");

    char missing[600];
    snprintf(missing, sizeof missing, "%s/no/such/dir/f", dir);
    CHECK(pf_atomic_open(&af, missing, "test") == -EIO && strstr(pf_errmsg(), "cannot create"),
          "missing folder: %s", pf_errmsg());

    CHECK(pf_atomic_open(&af, path, "") == 0, "open 4");
    fputs("second version", af.f);
    CHECK(pf_atomic_commit(&af, 1) == 0 && has("second version"), "replace: %s", pf_errmsg());

    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fails++;
    printf("%s (%d failures)\n", fails ? "FAIL" : "PASS", fails);
    return fails ? 1 : 0;
}
