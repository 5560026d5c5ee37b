/* Files replaced whole (common/atomic_file.h): a committed file has exactly what was written; an aborted
 * one, a commit after a failed write, a write past RLIMIT_FSIZE and a folder that does not exist all leave
 * the previous file byte for byte and no temp file behind, with the message naming the path. Two writers of
 * one path: the second is refused while the first holds it, and two processes replacing one file hundreds of
 * times never leave a torn one (the reader checks each version's own length and fill byte). A FIFO at the
 * temp name is refused at once. */
#include "common/atomic_file.h"
#include "common/err.h"

#include <errno.h>
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

/* One version written by writer `who`, number i: a line "<len> <byte>\n" then len copies of the byte. */
static int write_version(int who, int i)
{
    pf_atomic_file af;
    int rc = pf_atomic_open(&af, path, "test");
    if (rc == -EBUSY) {
        usleep((useconds_t)(200 + (i * 37 + who * 11) % 800)); /* the other writer holds it: refused */
        return 0;
    }
    if (rc < 0)
        return -1;
    int len = 1000 + (i * 7919 + who * 104729) % 30000;
    char byte = (char)('a' + (who * 13 + i) % 26);
    fprintf(af.f, "%d %c\n", len, byte);
    for (int k = 0; k < len; k++) {
        fputc(byte, af.f);
        if (k == len / 2)
            fflush(af.f); /* the temp file half written on disk: what a second writer would cut */
    }
    return pf_atomic_commit(&af, 1) == 0 ? 1 : -1;
}

/* 1 when the file is one whole version, 0 when torn. */
static int whole_version(void)
{
    size_t n;
    char *got = slurp(path, &n);
    int len = 0;
    char byte = 0;
    int hdr = 0;
    if (!got || sscanf(got, "%d %c\n%n", &len, &byte, &hdr) != 2 || hdr <= 0 || (size_t)hdr + (size_t)len != n)
        return 0;
    for (int k = 0; k < len; k++)
        if (got[hdr + k] != byte)
            return 0;
    return 1;
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

    /* A second writer while the first holds the file: refused, naming it; the first one's commit is whole. */
    CHECK(pf_atomic_open(&af, path, "test") == 0, "open 5");
    fputs("held version", af.f);
    pf_atomic_file other;
    CHECK(pf_atomic_open(&other, path, "test") == -EBUSY && strstr(pf_errmsg(), "being written by another"),
          "a second writer of a held file: %s", pf_errmsg());
    pf_atomic_abort(&other); /* after a refused open: must not remove the holder's temp file */
    CHECK(pf_atomic_commit(&af, 1) == 0 && has("held version"), "the holder's commit: %s", pf_errmsg());

    /* Two processes replacing one file 300 times each while this one reads it: never torn. */
    CHECK(write_version(9, 0) == 1 && whole_version(), "a single version is not read back whole");
    pid_t w[2];
    for (int who = 0; who < 2; who++)
        if ((w[who] = fork()) == 0) {
            int wrote = 0;
            for (int i = 0; i < 300; i++) {
                int r = write_version(who, i);
                if (r < 0)
                    _exit(2);
                wrote += r;
            }
            _exit(wrote > 250 ? 250 : wrote); /* versions written; the others were refused (busy) */
        }
    int torn = 0, reads = 0, alive = 2, written[2] = {0, 0};
    while (alive > 0) {
        if (!whole_version())
            torn++;
        reads++;
        for (int who = 0; who < 2; who++) {
            int ws = 0;
            if (w[who] > 0 && waitpid(w[who], &ws, WNOHANG) == w[who]) {
                CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) != 2, "writer %d: a write failed (status %d)", who, ws);
                written[who] = WIFEXITED(ws) ? WEXITSTATUS(ws) : 0;
                w[who] = 0;
                alive--;
            }
        }
    }
    CHECK(torn == 0 && whole_version() && access(tmp, F_OK) != 0,
          "two writers: %d torn of %d reads (temp file left: %s)", torn, reads, access(tmp, F_OK) ? "no" : "yes");
    CHECK(written[0] + written[1] > 0, "neither writer wrote a version");
    printf("two writers, 600 attempts: %d and %d versions written (>= so many, capped at 250), the rest "
           "refused while the other held the file; %d reads, %d torn\n",
           written[0], written[1], reads, torn);

    /* A FIFO at the temp name: refused at once, not waited on. */
    CHECK(mkfifo(tmp, 0600) == 0, "mkfifo %s", tmp);
    CHECK(pf_atomic_open(&af, path, "test") == -EIO && strstr(pf_errmsg(), "FIFO"), "a FIFO at the temp name: %s",
          pf_errmsg());
    unlink(tmp);

    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fails++;
    printf("%s (%d failures)\n", fails ? "FAIL" : "PASS", fails);
    return fails ? 1 : 0;
}
