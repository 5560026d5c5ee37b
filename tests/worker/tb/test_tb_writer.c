/* worker/tb_writer: CRC-32C against published check values, the event file's name, argument checks, an
 * unwritable directory and a failing write (RLIMIT_FSIZE) reported once with the file named. What the file
 * holds is checked by TensorBoard's own reader in test_tb_events.py. */
#include "worker/tb_writer.h"

#include "common/err.h"
#include "tests/check.h"

#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>


/* Check values: "123456789" is the CRC catalogue's check string (CRC-32/ISCSI check = 0xe3069283); the
 * 32-byte vectors are RFC 3720 appendix B.4; the masked value is tensorboard's
 * tensorflow_stub.pywrap_tensorflow.masked_crc32c(b"123456789") (tensorboard 2.21.0). */
static void test_crc32c(void)
{
    uint8_t zeros[32] = {0}, ones[32], inc[32], dec[32];
    for (int i = 0; i < 32; i++) {
        ones[i] = 0xff;
        inc[i] = (uint8_t)i;
        dec[i] = (uint8_t)(31 - i);
    }
    CHECK(tb_crc32c("123456789", 9) == 0xe3069283u, "got 0x%08x", tb_crc32c("123456789", 9));
    CHECK(tb_crc32c("", 0) == 0u, "got 0x%08x", tb_crc32c("", 0));
    CHECK(tb_crc32c(zeros, 32) == 0x8a9136aau, "got 0x%08x", tb_crc32c(zeros, 32));
    CHECK(tb_crc32c(ones, 32) == 0x62a8ab43u, "got 0x%08x", tb_crc32c(ones, 32));
    CHECK(tb_crc32c(inc, 32) == 0x46dd794eu, "got 0x%08x", tb_crc32c(inc, 32));
    CHECK(tb_crc32c(dec, 32) == 0x113fdb5cu, "got 0x%08x", tb_crc32c(dec, 32));
    CHECK(tb_masked_crc32c("123456789", 9) == 0xc78ab0e5u, "got 0x%08x", tb_masked_crc32c("123456789", 9));
    CHECK(tb_masked_crc32c("", 0) == 0xa282ead8u, "got 0x%08x", tb_masked_crc32c("", 0));
}

static int count_event_files(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strncmp(e->d_name, "events.out.tfevents.", 20) == 0;
    closedir(d);
    return n;
}

/* mkdir -p, the file name (EventFileWriter's: time.hostname.pid.n), two writers never share a file. */
static void test_open(const char *tmp)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/out/run 1/tensorboard", tmp);
    tb_writer *a = NULL, *b = NULL;
    int rc = tb_open(&a, dir);
    CHECK(rc == 0, "tb_open(%s): %d %s", dir, rc, pf_errmsg());
    rc = tb_open(&b, dir);
    CHECK(rc == 0, "second tb_open(%s): %d %s", dir, rc, pf_errmsg());
    if (!a || !b)
        return;
    CHECK(strcmp(tb_path(a), tb_path(b)) != 0, "both writers got %s", tb_path(a));
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    long long t = 0;
    char rest[512] = "";
    const char *base = strrchr(tb_path(a), '/') + 1;
    CHECK(sscanf(base, "events.out.tfevents.%10lld.%511s", &t, rest) == 2, "file name %s", base);
    CHECK(llabs(t - (long long)time(NULL)) < 60, "time %lld in %s", t, base);
    char want[512];
    snprintf(want, sizeof want, "%s.%ld.", host, (long)getpid());
    CHECK(strncmp(rest, want, strlen(want)) == 0, "%s does not go on with %s", base, want);
    CHECK(tb_scalar(a, "loss", 1, 1.7e9, 1.0f) == 0, "%s", pf_errmsg());
    CHECK(tb_close(a) == 0, "%s", pf_errmsg());
    CHECK(tb_close(b) == 0, "%s", pf_errmsg());
    CHECK(count_event_files(dir) == 2, "%d event files in %s", count_event_files(dir), dir);
    CHECK(tb_close(NULL) == 0, "tb_close(NULL)");
}

static void test_arguments(const char *tmp)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/args", tmp);
    tb_writer *w = NULL;
    CHECK(tb_open(&w, NULL) == -EINVAL, "NULL dir");
    CHECK(tb_open(&w, "") == -EINVAL, "empty dir");
    int rc = tb_open(&w, dir);
    CHECK(rc == 0, "tb_open(%s): %d %s", dir, rc, pf_errmsg());
    if (!w)
        return;
    char tag[TB_TAG_MAX + 2];
    memset(tag, 'a', sizeof tag);
    tag[TB_TAG_MAX] = '\0';
    CHECK(tb_scalar(w, tag, 0, 1.7e9, 0.0f) == 0, "a %d-byte tag: %s", TB_TAG_MAX, pf_errmsg());
    tag[TB_TAG_MAX] = 'a';
    tag[TB_TAG_MAX + 1] = '\0';
    CHECK(tb_scalar(w, tag, 0, 1.7e9, 0.0f) == -EINVAL, "a %d-byte tag", TB_TAG_MAX + 1);
    CHECK(strstr(pf_errmsg(), "too long") != NULL, "message: %s", pf_errmsg());
    CHECK(tb_scalar(w, NULL, 0, 1.7e9, 0.0f) == -EINVAL, "NULL tag");
    CHECK(tb_scalar(w, "", 0, 1.7e9, 0.0f) == -EINVAL, "empty tag");
    CHECK(tb_scalar(w, "lo\nss", 0, 1.7e9, 0.0f) == -EINVAL, "tag with a newline");
    CHECK(tb_scalar(w, "l\xc3\xa9", 0, 1.7e9, 0.0f) == -EINVAL, "tag with a non-ASCII byte");
    CHECK(tb_scalar(w, "loss", 0, NAN, 0.0f) == -EINVAL, "NaN wall_time");
    CHECK(tb_scalar(w, "loss", 0, INFINITY, 0.0f) == -EINVAL, "inf wall_time");
    CHECK(tb_scalar(NULL, "loss", 0, 1.7e9, 0.0f) == -EINVAL, "NULL writer");
    CHECK(tb_flush(NULL) == -EINVAL, "NULL writer");
    CHECK(tb_scalar(w, "loss", 0, 1.7e9, NAN) == 0, "NaN value: %s", pf_errmsg());
    CHECK(tb_close(w) == 0, "%s", pf_errmsg());
}

/* A directory that cannot be created: below a regular file (any user, root too), and, when not root, below
 * a directory without write permission. The message names the directory. */
static void test_unwritable(const char *tmp)
{
    char file[4096], dir[4200];
    snprintf(file, sizeof file, "%s/plainfile", tmp);
    FILE *f = fopen(file, "w");
    CHECK(f != NULL, "creating %s", file);
    if (f)
        fclose(f);
    snprintf(dir, sizeof dir, "%s/tensorboard", file);
    tb_writer *w = (tb_writer *)&w;
    int rc = tb_open(&w, dir);
    CHECK(rc == -ENOTDIR, "tb_open(%s) = %d (%s)", dir, rc, pf_errmsg());
    CHECK(w == NULL, "no writer on failure");
    CHECK(strstr(pf_errmsg(), dir) != NULL, "message does not name %s: %s", dir, pf_errmsg());
    printf("below a file: %s\n", pf_errmsg());

    if (geteuid() == 0) {
        printf("running as root: the read-only directory case is not checked (root writes anywhere)\n");
        return;
    }
    char ro[4096];
    snprintf(ro, sizeof ro, "%s/readonly", tmp);
    CHECK(mkdir(ro, 0555) == 0, "mkdir %s", ro);
    snprintf(dir, sizeof dir, "%s/out/tensorboard", ro);
    rc = tb_open(&w, dir);
    CHECK(rc == -EACCES, "tb_open(%s) = %d (%s)", dir, rc, pf_errmsg());
    CHECK(strstr(pf_errmsg(), dir) != NULL, "message does not name %s: %s", dir, pf_errmsg());
    printf("read-only: %s\n", pf_errmsg());
    /* An existing directory without write permission: the file cannot be created. */
    rc = tb_open(&w, ro);
    CHECK(rc == -EACCES, "tb_open(%s) = %d (%s)", ro, rc, pf_errmsg());
    CHECK(strstr(pf_errmsg(), ro) != NULL, "message does not name %s: %s", ro, pf_errmsg());
    chmod(ro, 0755);
}

/* A write that fails (the file may not grow past RLIMIT_FSIZE: write(2) fails with EFBIG, as it fails with
 * ENOSPC on a full disk): tb_flush names the file, every later call returns the same code without writing.
 * In a child, so the limit stays there. */
static void test_write_error(const char *tmp)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/full", tmp);
    pid_t pid = fork();
    if (pid == 0) {
        int bad = 0;
        tb_writer *w = NULL;
        if (tb_open(&w, dir) != 0) {
            fprintf(stderr, "tb_open: %s\n", pf_errmsg());
            _exit(2);
        }
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit lim = {.rlim_cur = 4096, .rlim_max = RLIM_INFINITY};
        if (setrlimit(RLIMIT_FSIZE, &lim) != 0)
            _exit(3);
        int rc = 0;
        for (int step = 0; step < 1000 && rc == 0; step++) {
            rc = tb_scalar(w, "train/a_tag_that_takes_some_room_in_the_file", step, 1.7e9, 0.5f);
            if (rc == 0)
                rc = tb_flush(w);
        }
        fprintf(stderr, "write error: %s\n", pf_errmsg());
        bad += rc != -EFBIG;
        bad += strstr(pf_errmsg(), tb_path(w)) == NULL;
        bad += strstr(pf_errmsg(), "writing") == NULL;
        struct stat st;
        bad += stat(tb_path(w), &st) != 0 || st.st_size != 4096;
        rc = tb_scalar(w, "loss", 1, 1.7e9, 1.0f);
        fprintf(stderr, "after it: %s\n", pf_errmsg());
        bad += rc != -EFBIG;
        bad += strstr(pf_errmsg(), "earlier write failed") == NULL;
        bad += tb_flush(w) != -EFBIG;
        bad += tb_close(w) != -EFBIG;
        _exit(bad ? 1 : 0);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid, "fork/wait");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "write-error child: status 0x%x", status);
}

int main(void)
{
    char tmp[] = "/tmp/pfcps_tb_XXXXXX";
    if (!mkdtemp(tmp)) {
        perror("mkdtemp");
        return 1;
    }
    test_crc32c();
    test_open(tmp);
    test_arguments(tmp);
    test_unwritable(tmp);
    test_write_error(tmp);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmp);
    if (fails) {
        fprintf(stderr, "%d check(s) failed\n", fails);
        return 1;
    }
    printf("tb_writer: all checks passed\n");
    return 0;
}
