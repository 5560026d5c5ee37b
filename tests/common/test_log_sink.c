/* The log's file sink (common/log.c, log_open_file): a failed write to the file (training.log on a full disk)
 * is reported once on stderr, naming the file and the error, instead of leaving the file short without a
 * word. Two ways to fail the writes, each in a child process whose stderr goes to a file read back here:
 *   - RLIMIT_FSIZE (SIGXFSZ ignored: write fails with EFBIG), always;
 *   - a 64 KiB tmpfs (ENOSPC, the real full disk), where mounting one is allowed (root), else skipped with
 * the reason. */
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/check.h"

/* Child: stderr to err_path, the file sink at log_path, `lines` long lines; with fsize > 0 the file size
 * limit. Returns the child's exit status. */
static int run_child(const char *log_path, const char *err_path, long fsize, int lines)
{
    int pfd[2];
    if (pipe(pfd) < 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        /* A pipe, not a file: the file size limit would cut stderr too. */
        close(pfd[0]);
        if (dup2(pfd[1], STDERR_FILENO) < 0)
            _exit(3);
        if (fsize > 0) {
            signal(SIGXFSZ, SIG_IGN);
            struct rlimit rl = {(rlim_t)fsize, (rlim_t)fsize};
            if (setrlimit(RLIMIT_FSIZE, &rl) < 0)
                _exit(4);
        }
        log_init("test", 0);
        if (log_open_file(log_path) < 0)
            _exit(5);
        char pad[1001];
        memset(pad, 'x', 1000);
        pad[1000] = '\0';
        for (int i = 0; i < lines; i++)
            log_info("line %d %s", i, pad);
        log_close_file();
        _exit(0);
    }
    close(pfd[1]);
    FILE *out = fopen(err_path, "wb");
    char buf[4096];
    ssize_t n;
    while ((n = read(pfd[0], buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR))
        if (n > 0 && out)
            fwrite(buf, 1, (size_t)n, out);
    close(pfd[0]);
    if (out)
        fclose(out);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Counts the occurrences of `needle` in the file `path`. */
static int count_in_file(const char *path, const char *needle)
{
    static char buf[1 << 22];
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    int c = 0;
    for (const char *p = buf; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        c++;
    return c;
}

static void expect_once(const char *what, const char *log_path, const char *err_path, const char *err_text)
{
    char needle[1200];
    snprintf(needle, sizeof needle, "test: cannot write log file %s: %s;", log_path, err_text);
    int n = count_in_file(err_path, needle);
    int lines = count_in_file(err_path, " INFO line ");
    check(n == 1 && lines == 200, "%s: '%s' %d times (want 1), %d log lines on stderr (want 200)", what,
          needle, n, lines);
}

int main(void)
{
    char dir[] = "/tmp/pfcps-test-log-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char log_path[512], err_path[512];

    /* A file size limit of 4 KiB: the 5th line fails with EFBIG. */
    snprintf(log_path, sizeof log_path, "%s/fsize.log", dir);
    snprintf(err_path, sizeof err_path, "%s/fsize.err", dir);
    int rc = run_child(log_path, err_path, 4096, 200);
    if (rc != 0)
        CHECK(0, "fsize: child exit %d", rc);
    else
        expect_once("RLIMIT_FSIZE", log_path, err_path, strerror(EFBIG));

    /* A full 64 KiB tmpfs: ENOSPC. */
    char mnt[300];
    snprintf(mnt, sizeof mnt, "%s/tmpfs", dir);
    mkdir(mnt, 0755);
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=64k") < 0) {
        printf("skip full tmpfs: cannot mount a tmpfs here: %s\n", strerror(errno));
    } else {
        snprintf(log_path, sizeof log_path, "%s/training.log", mnt);
        snprintf(err_path, sizeof err_path, "%s/tmpfs.err", dir);
        rc = run_child(log_path, err_path, 0, 200);
        if (rc != 0)
            CHECK(0, "tmpfs: child exit %d", rc);
        else
            expect_once("full tmpfs", log_path, err_path, strerror(ENOSPC));
        if (umount(mnt) < 0)
            fprintf(stderr, "warning: cannot unmount %s: %s\n", mnt, strerror(errno));
    }
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary();
}
