/* File reads (common/file.h): pf_read_file returns a regular file's bytes exactly (an empty file as an empty,
 * NUL-terminated buffer) and honours its size limit; a FIFO, a directory, a character device (/dev/null), a
 * missing file and a file without read permission are refused with the message the header names, and a
 * FIFO at once (every read runs under a 10 s alarm: a read that blocks on the FIFO fails the test instead
 * of hanging it). pf_read_head reads the first bytes, pf_fopen_regular opens a stream, pf_file_kind names
 * kinds. pf_file_sha256 against digests published with SHA-256 itself (FIPS 180-2's "abc" and one million
 * 'a', which spans many 64 KiB pieces; the empty string's), with its messages naming the path.
 * The permission case runs as an unprivileged user: directly, or as root in a child that switches to
 * nobody (root reads any file). pf_dirset enters each (device, inode) once, a folder and a link to it
 * being one. */
#include "common/file.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/err.h"
#include "tests/check.h"

static char dir[256];

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "FAIL: a read blocked for 10 s (on the FIFO?)\n";
    if (write(STDOUT_FILENO, msg, sizeof msg - 1) < 0)
        _exit(1);
    _exit(1);
}

static const char *in_dir(const char *name)
{
    static char p[8][512];
    static int i;
    char *r = p[i++ % 8];
    snprintf(r, sizeof p[0], "%s/%s", dir, name);
    return r;
}

static void write_bytes(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b, 1, n, f) != n || fclose(f) != 0)
        DIE("cannot write %s", path);
}

static void hex(const uint8_t d[32], char out[65])
{
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

/* pf_read_file on path must fail with rc and exactly the message want; *data NULL and *len 0 after. */
static void refused(const char *what, const char *path, int rc_want, const char *want)
{
    uint8_t *data = (uint8_t *)"not cleared";
    size_t len = 7;
    alarm(10);
    int rc = pf_read_file(path, 0, &data, &len);
    alarm(0);
    check(rc == rc_want && !strcmp(pf_errmsg(), want) && data == NULL && len == 0,
          "pf_read_file %s: rc %d (want %d) '%s' (want '%s')", what, rc, rc_want, pf_errmsg(), want);
}

/* pf_read_head and pf_file_sha256 refuse path too: the same message, the digest's with the path in front. */
static void refused_all(const char *what, const char *path, int rc_want, const char *want)
{
    refused(what, path, rc_want, want);
    uint8_t head[8], d[32];
    size_t got = 99;
    alarm(10);
    int rc = pf_read_head(path, head, sizeof head, &got);
    alarm(0);
    check(rc == rc_want && !strcmp(pf_errmsg(), want) && got == 0, "pf_read_head %s: rc %d '%s'", what, rc,
          pf_errmsg());
    char with_path[1100];
    snprintf(with_path, sizeof with_path, "%s: %s", path, want);
    alarm(10);
    rc = pf_file_sha256(path, d);
    alarm(0);
    check(rc == rc_want && !strcmp(pf_errmsg(), with_path), "pf_file_sha256 %s: rc %d '%s' (want '%s')", what,
          rc, pf_errmsg(), with_path);
    FILE *f = (FILE *)1;
    alarm(10);
    rc = pf_fopen_regular(path, &f);
    alarm(0);
    check(rc == rc_want && f == NULL && !strcmp(pf_errmsg(), want), "pf_fopen_regular %s: rc %d '%s'", what,
          rc, pf_errmsg());
}

static void regular_files(void)
{
    /* Every byte value, NUL included, and more than one 64 KiB piece. */
    size_t n = 200003;
    uint8_t *b = xmalloc(n);
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)rnd();
    const char *p = in_dir("bytes.bin");
    write_bytes(p, b, n);
    uint8_t *data = NULL;
    size_t len = 0;
    int rc = pf_read_file(p, 0, &data, &len);
    check(rc == 0 && len == n && data && !memcmp(data, b, n) && data[n] == 0,
          "pf_read_file: %zu bytes read back equal, NUL after the end (rc %d, len %zu)", n, rc, len);
    free(data);
    rc = pf_read_file(p, n, &data, &len);
    check(rc == 0 && len == n, "pf_read_file with max_bytes = the size: rc %d, len %zu", rc, len);
    free(data);
    data = (uint8_t *)"x";
    rc = pf_read_file(p, n - 1, &data, &len);
    char want[64];
    snprintf(want, sizeof want, "larger than %zu bytes", n - 1);
    check(rc == -EFBIG && !strcmp(pf_errmsg(), want) && data == NULL && len == 0,
          "pf_read_file with max_bytes one below the size: rc %d '%s'", rc, pf_errmsg());

    uint8_t head[16];
    size_t got = 0;
    rc = pf_read_head(p, head, sizeof head, &got);
    check(rc == 0 && got == sizeof head && !memcmp(head, b, sizeof head), "pf_read_head: the first %zu bytes",
          got);
    const char *s = in_dir("short.bin");
    write_bytes(s, b, 5);
    rc = pf_read_head(s, head, sizeof head, &got);
    check(rc == 0 && got == 5 && !memcmp(head, b, 5), "pf_read_head of a 5-byte file: %zu bytes", got);

    FILE *f = NULL;
    rc = pf_fopen_regular(p, &f);
    uint8_t first[4] = {0};
    check(rc == 0 && f && fread(first, 1, 4, f) == 4 && !memcmp(first, b, 4),
          "pf_fopen_regular: a stream (rc %d)", rc);
    if (f)
        fclose(f);
    int fd = pf_open_regular(p, NULL);
    check(fd >= 0 && !(fcntl(fd, F_GETFL) & O_NONBLOCK) && (fcntl(fd, F_GETFD) & FD_CLOEXEC),
          "pf_open_regular: a blocking, close-on-exec descriptor");
    if (fd >= 0)
        close(fd);

    const char *e = in_dir("empty");
    write_bytes(e, "", 0);
    data = NULL;
    len = 99;
    rc = pf_read_file(e, 0, &data, &len);
    check(rc == 0 && len == 0 && data && data[0] == 0, "pf_read_file of an empty file: rc %d, len %zu, \"\"",
          rc, len);
    free(data);
    rc = pf_read_head(e, head, sizeof head, &got);
    check(rc == 0 && got == 0, "pf_read_head of an empty file: %zu bytes", got);
    free(b);
}

static void digests(void)
{
    static const struct {
        const char *what;
        size_t n; /* bytes of 'a' when text is NULL */
        const char *text, *sha;
    } v[] = {
        {"\"abc\"", 0, "abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"the empty file", 0, "", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"one million 'a'", 1000000, NULL,
         "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"},
    };
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        const char *p = in_dir("digest.in");
        if (v[i].text) {
            write_bytes(p, v[i].text, strlen(v[i].text));
        } else {
            char *a = xmalloc(v[i].n);
            memset(a, 'a', v[i].n);
            write_bytes(p, a, v[i].n);
            free(a);
        }
        uint8_t d[32];
        char got[65] = "";
        int rc = pf_file_sha256(p, d);
        if (rc == 0)
            hex(d, got);
        check(rc == 0 && !strcmp(got, v[i].sha), "pf_file_sha256 of %s: %s", v[i].what,
              rc ? pf_errmsg() : got);
    }
}

/* A file with mode 0 in a folder anyone may enter: an unprivileged reader is refused with "permission
 * denied". Returns 1 when it was refused so. */
static int permission_refused(const char *p)
{
    uint8_t *data = NULL, d[32];
    size_t len = 0;
    int rc = pf_read_file(p, 0, &data, &len);
    int ok1 = rc == -EACCES && !strcmp(pf_errmsg(), "permission denied") && data == NULL;
    printf("     pf_read_file as uid %d: rc %d '%s'\n", (int)geteuid(), rc, pf_errmsg());
    free(data);
    char want[600];
    snprintf(want, sizeof want, "%s: permission denied", p);
    rc = pf_file_sha256(p, d);
    int ok2 = rc == -EACCES && !strcmp(pf_errmsg(), want);
    printf("     pf_file_sha256 as uid %d: rc %d '%s'\n", (int)geteuid(), rc, pf_errmsg());
    return ok1 && ok2;
}

static void permission(void)
{
    const char *p = in_dir("secret");
    write_bytes(p, "secret", 6);
    if (chmod(p, 0) != 0 || chmod(dir, 0755) != 0)
        DIE("chmod");
    if (geteuid() != 0) {
        check(permission_refused(p), "a file without read permission is refused: permission denied");
        return;
    }
    /* Root reads any file: the check runs in a child that becomes nobody (65534). */
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        DIE("fork");
    if (pid == 0) {
        if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0) {
            printf("     cannot switch to uid 65534: %s\n", strerror(errno));
            fflush(stdout);
            _exit(77);
        }
        int ok = permission_refused(p);
        fflush(stdout);
        _exit(ok ? 0 : 1);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77)
        printf("skip the permission case: running as root and cannot switch to an unprivileged user\n");
    else
        check(WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "a file without read permission is refused for uid 65534: permission denied");
}

static void kinds(void)
{
    struct stat st;
    const char *l = in_dir("link");
    const char *sock = in_dir("sock");
    if (symlink("bytes.bin", l) != 0)
        DIE("symlink");
    struct {
        const char *path, *want;
        int follow;
    } k[] = {
        {in_dir("bytes.bin"), "a regular file", 1}, {dir, "a directory", 1},   {in_dir("fifo"), "a FIFO", 1},
        {"/dev/null", "a character device", 1},     {l, "a symbolic link", 0}, {sock, "a socket", 1}};
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", sock);
    if (s < 0 || bind(s, (const struct sockaddr *)&a, sizeof a) != 0)
        DIE("socket %s", sock);
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        int rc = k[i].follow ? stat(k[i].path, &st) : lstat(k[i].path, &st);
        const char *got = rc == 0 ? pf_file_kind(&st) : "(stat failed)";
        check(!strcmp(got, k[i].want), "pf_file_kind(%s): %s", k[i].path, got);
    }
    refused_all("on a socket", sock, -EIO, "a socket, not a regular file");
    close(s);
}

/* pf_open_output / pf_fopen_output: a regular file is created, truncated or appended to; /dev/null is
 * accepted; a FIFO (with and without a reader), a socket and a folder are refused at once, naming the kind. */
static void outputs(void)
{
    char fifo[512], out[512], sock[100];
    snprintf(fifo, sizeof fifo, "%s", in_dir("fifo"));
    snprintf(out, sizeof out, "%s", in_dir("out.txt"));
    snprintf(sock, sizeof sock, "%s", in_dir("out.sock"));
    FILE *f = NULL;
    for (int i = 0; i < 3; i++) { /* "w", then "a" twice: the file holds "x" then "xy" then "xyy" */
        int rc = pf_fopen_output(out, i > 0, &f);
        check(rc == 0 && f, "pf_fopen_output %s (append %d): rc %d '%s'", out, i > 0, rc, pf_errmsg());
        if (f) {
            fputs(i == 0 ? "x" : "y", f);
            fclose(f);
        }
    }
    uint8_t *data = NULL;
    size_t len = 0;
    check(pf_read_file(out, 0, &data, &len) == 0 && len == 3 && !memcmp(data, "xyy", 3),
          "pf_fopen_output: \"w\" then \"a\" twice leaves \"xyy\" (got %zu bytes)", len);
    free(data);
    int rc = pf_fopen_output(out, 0, &f);
    if (rc == 0)
        fclose(f);
    check(rc == 0 && pf_read_file(out, 0, &data, &len) == 0 && len == 0, "pf_fopen_output \"w\" truncates");
    free(data);
    int fd = pf_open_output("/dev/null", O_APPEND, 0);
    check(fd >= 0, "pf_open_output /dev/null: rc %d '%s'", fd, fd < 0 ? pf_errmsg() : "");
    if (fd >= 0)
        close(fd);
    fd = pf_open_output(out, O_CREAT | O_EXCL, 0644);
    check(fd == -EEXIST, "pf_open_output O_EXCL on an existing file: rc %d (want %d)", fd, -EEXIST);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", sock);
    if (s < 0 || bind(s, (const struct sockaddr *)&a, sizeof a) != 0)
        DIE("socket %s", sock);
    int reader = -1;
    struct {
        const char *what, *path, *want;
        int reader;
    } k[] = {{"a FIFO without a reader", fifo, "a FIFO, not a regular file", 0},
             {"a FIFO with a reader", fifo, "a FIFO, not a regular file", 1},
             {"a socket", sock, "a socket, not a regular file", 0},
             {"a folder", dir, "a directory, not a regular file", 0}};
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        if (k[i].reader && reader < 0 && (reader = open(fifo, O_RDONLY | O_NONBLOCK)) < 0)
            DIE("open %s for reading", fifo);
        alarm(10);
        rc = pf_fopen_output(k[i].path, 1, &f);
        alarm(0);
        check(rc == -EIO && f == NULL && !strcmp(pf_errmsg(), k[i].want),
              "pf_fopen_output on %s: rc %d '%s' (want -EIO '%s')", k[i].what, rc, pf_errmsg(), k[i].want);
        if (f)
            fclose(f);
    }
    if (reader >= 0)
        close(reader);
    close(s);
}

/* pf_dirset: a folder is entered once, by (st_dev, st_ino): 5000 made-up folders (inode i on device i % 3,
 * so equal inodes on other devices are other folders) are each new on the first entry and seen on the
 * second, across the set's growth; then real ones through a link: a folder and a link to it are one. */
static void dirsets(void)
{
    pf_dirset s = {0};
    struct stat st;
    memset(&st, 0, sizeof st);
    int first = 0, second = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < 5000; i++) {
            st.st_dev = (dev_t)(i % 3);
            st.st_ino = (ino_t)(i / 3);
            int r = pf_dirset_enter(&s, &st);
            first += pass == 0 && r == 1;
            second += pass == 1 && r == 0;
        }
    check(first == 5000 && second == 5000 && s.n == 5000,
          "pf_dirset: %d of 5000 new on the first entry, %d seen on the second, %zu held", first, second,
          s.n);
    pf_dirset_free(&s);
    check(s.n == 0 && s.cap == 0 && s.slot == NULL, "pf_dirset_free leaves an empty set");
    const char *sub = in_dir("walked"), *link = in_dir("walked-link");
    if (mkdir(sub, 0700) != 0 || symlink("walked", link) != 0)
        DIE("mkdir / symlink under %s", dir);
    struct stat a, b, c;
    if (stat(sub, &a) != 0 || stat(link, &b) != 0 || stat(dir, &c) != 0)
        DIE("stat");
    int r1 = pf_dirset_enter(&s, &a), r2 = pf_dirset_enter(&s, &b), r3 = pf_dirset_enter(&s, &c);
    check(r1 == 1 && r2 == 0 && r3 == 1,
          "pf_dirset on a folder, a link to it, its parent: %d %d %d (want 1 0 1)", r1, r2, r3);
    pf_dirset_free(&s);
}

int main(void)
{
    test_seed_mixed();
    signal(SIGALRM, on_alarm);
    snprintf(dir, sizeof dir, "/tmp/pfcps-test-file-XXXXXX");
    if (!mkdtemp(dir))
        DIE("mkdtemp");

    regular_files();
    digests();

    /* Not regular files: refused before any read, a FIFO without waiting for a writer. */
    const char *fifo = in_dir("fifo");
    if (mkfifo(fifo, 0600) != 0)
        DIE("mkfifo %s", fifo);
    refused_all("on a FIFO", fifo, -EIO, "a FIFO, not a regular file");
    refused_all("on a directory", dir, -EIO, "a directory, not a regular file");
    refused_all("on /dev/null", "/dev/null", -EIO, "a character device, not a regular file");
    refused_all("on a missing file", in_dir("none"), -ENOENT, "cannot open: No such file or directory");
    refused_all("under a missing folder", in_dir("none/x"), -ENOENT,
                "cannot open: No such file or directory");
    refused_all("under a regular file", in_dir("empty/x"), -ENOENT, "cannot open: Not a directory");
    kinds();
    outputs();
    permission();
    dirsets();

    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        printf("warning: could not remove %s\n", dir);
    return check_summary();
}
