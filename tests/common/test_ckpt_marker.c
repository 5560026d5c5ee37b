/* pfcps.torch ranks' checkpoint markers (common/ckpt_marker.h, common/ckpt.h): the file holds exactly the six
 * lines of the format, written out by hand here; it reads back to the same identity; every malformed variant
 * (each line, a NUL, a sign, a leading zero, 2^64, upper-case hex, a seventh line, > 1 KiB, another step or
 * rank, a FIFO, a folder) is refused naming the file; and with every rank's marker present a shared folder's
 * old steps are pruned to snapshot_keep, while without them (shard files only) nothing is. Another run's
 * steps in the same folder (real shard .snap files and markers carrying another run id, newer than this
 * run's) are neither counted nor removed when the prune is given this run's identity: this run keeps its own
 * snapshot_keep newest; without the identity they would count as newer complete steps and this run's own
 * would go. */
#include "common/ckpt.h"
#include "common/ckpt_marker.h"
#include "common/err.h"
#include "common/snapfile.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/check.h"

static char root[256];

static void touch(const char *p)
{
    FILE *f = fopen(p, "w");
    if (f)
        fclose(f);
}

static int exists(int64_t step)
{
    char d[512];
    ckpt_step_dir(root, step, d, sizeof d);
    DIR *x = opendir(d);
    if (!x)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(x)))
        n += e->d_name[0] != '.';
    closedir(x);
    return n > 0;
}

/* Step folders 1..4 with both shard files of 2 servers; markers of `ranks` of 2 module ranks in each. */
static void make_steps(const ckpt_ident *id, int ranks)
{
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s/step-*", root);
    if (system(cmd) != 0)
        return;
    for (int64_t t = 1; t <= 4; t++) {
        char d[512], p[600];
        ckpt_step_dir(root, t, d, sizeof d);
        mkdir(d, 0755);
        for (int s = 0; s < 2; s++) {
            ckpt_member_path(root, t, "shard", s, 2, ".snap", p, sizeof p);
            touch(p);
        }
        for (int r = 0; r < ranks; r++)
            ckpt_module_marker_write(root, t, r, 2, id);
    }
}

/* A real shard file of checkpoint `step` of run `id`: 2 classes on 2 servers, D = 1 (one row per shard). */
static void make_shard(int64_t step, int s, const ckpt_ident *id)
{
    char p[600];
    ckpt_member_path(root, step, "shard", s, 2, ".snap", p, sizeof p);
    snapfile_writer w;
    snapfile_meta m = {.rank = s, .servers = 2, .workers = 2, .dim = 1, .num_classes = 2, .step = step,
                       .rows = 1, .block_rows = 1, .id = *id};
    memcpy(m.role, "shard", sizeof "shard");
    const double row = 0.5;
    if (snapfile_create(&w, p, "test shard") < 0 || snapfile_write(&w, &row, sizeof row) < 0 ||
        snapfile_commit(&w, &m, NULL) < 0)
        fprintf(stderr, "shard file %s: %s\n", p, pf_errmsg());
}

/* Checkpoint `step` of run `id`, complete: both shard files and both module ranks' markers. */
static void make_run_step(int64_t step, const ckpt_ident *id)
{
    char d[512];
    ckpt_step_dir(root, step, d, sizeof d);
    mkdir(d, 0755);
    for (int s = 0; s < 2; s++)
        make_shard(step, s, id);
    for (int r = 0; r < 2; r++)
        ckpt_module_marker_write(root, step, r, 2, id);
}

int main(void)
{
    snprintf(root, sizeof root, "/tmp/pfcps-test-marker-XXXXXX");
    if (!mkdtemp(root))
        return 1;
    ckpt_ident id;
    for (int i = 0; i < CKPT_RUN_ID_BYTES; i++)
        id.run_id[i] = (uint8_t)(0xa0 + i);
    for (int i = 0; i < CKPT_DIGEST_BYTES; i++)
        id.config_digest[i] = (uint8_t)(i * 7);
    id.seed = 18446744073709551615ull;

    /* 1. the file, byte for byte, as the format says */
    CHECK(ckpt_module_marker_write(root, 12, 1, 2, &id) == 0, "write: %s", pf_errmsg());
    char want[600], p[600];
    int n = snprintf(want, sizeof want, "pfcps module checkpoint 1\nstep 12\nrank 1 of 2\nrun_id ");
    for (int i = 0; i < 16; i++)
        n += snprintf(want + n, sizeof want - (size_t)n, "%02x", 0xa0 + i);
    n += snprintf(want + n, sizeof want - (size_t)n, "\nseed 18446744073709551615\nconfig_digest ");
    for (int i = 0; i < 32; i++)
        n += snprintf(want + n, sizeof want - (size_t)n, "%02x", (i * 7) & 0xff);
    n += snprintf(want + n, sizeof want - (size_t)n, "\n");
    snprintf(p, sizeof p, "%s/step-12/worker-1-of-2.module", root);
    FILE *f = fopen(p, "r");
    char got[1200] = "";
    size_t gn = f ? fread(got, 1, sizeof got - 1, f) : 0;
    if (f)
        fclose(f);
    CHECK(gn == (size_t)n && !memcmp(got, want, gn), "the marker's text:\n%.*s\nwanted:\n%s", (int)gn, got, want);
    ckpt_ident back;
    memset(&back, 0, sizeof back);
    CHECK(ckpt_module_marker_read(p, 12, 1, 2, &back) == 0 && !memcmp(&back, &id, sizeof id),
          "read back: %s", pf_errmsg());
    CHECK(ckpt_module_marker_read(p, 13, 1, 2, &back) == -EINVAL && strstr(pf_errmsg(), "names step 12"),
          "another step accepted: %s", pf_errmsg());
    CHECK(ckpt_module_marker_read(p, 12, 0, 2, &back) == -EINVAL && strstr(pf_errmsg(), "rank 1 of 2"),
          "another rank accepted: %s", pf_errmsg());

    /* 2. malformed texts: each refused, naming the file */
    /* each variant: `from` (its first occurrence) replaced by `to` of tl bytes (a NUL may be one of them) */
#define V(from, to) {from, to, sizeof(to) - 1}
    struct {
        const char *from, *to;
        size_t tl;
    } bad[] = {
        V("pfcps module checkpoint 1\n", "pfcps module checkpoint 2\n"),
        V("pfcps module checkpoint 1\n", "pfcps module checkpoint 1 \n"),
        V("step 12\n", "step +12\n"),
        V("step 12\n", "step 012\n"),
        V("step 12\n", "step  12\n"),
        V("step 12\n", "step 12 "),
        V("rank 1 of 2\n", "rank 1 of  2\n"),
        V("rank 1 of 2\n", "rank 1/2\n"),
        V("seed 18446744073709551615\n", "seed 18446744073709551616\n"),
        V("seed 18446744073709551615\n", "seed -1\n"),
        V("run_id a0", "run_id A0"),
        V("run_id a0", "run_id a"),
        V("pfcps module checkpoint 1\n", ""),
        V("step 12\n", "step 1\0002\n"),
    };
#undef V
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char t[700];
        const char *at = strstr(want, bad[i].from);
        size_t fl = strlen(bad[i].from), pre = (size_t)(at - want);
        memcpy(t, want, pre);
        memcpy(t + pre, bad[i].to, bad[i].tl);
        memcpy(t + pre + bad[i].tl, at + fl, (size_t)n - pre - fl);
        size_t tn = (size_t)n - fl + bad[i].tl;
        int rc = ckpt_module_marker_parse(t, tn, "m.module", 12, 1, 2, &back);
        CHECK(rc == -EINVAL && strstr(pf_errmsg(), "m.module: "), "variant %zu (\"%s\" -> \"%s\") accepted (rc %d): %s",
              i, bad[i].from, bad[i].to, rc, pf_errmsg());
    }
    char seven[700];
    snprintf(seven, sizeof seven, "%sextra 1\n", want);
    CHECK(ckpt_module_marker_parse(seven, strlen(seven), "m", 12, 1, 2, &back) == -EINVAL &&
              strstr(pf_errmsg(), "more than six"),
          "a seventh line: %s", pf_errmsg());
    CHECK(ckpt_module_marker_parse(want, 2000, "m", 12, 1, 2, &back) == -EINVAL && strstr(pf_errmsg(), "1 KiB"),
          "2000 bytes: %s", pf_errmsg());
    CHECK(ckpt_module_marker_parse(want, (size_t)n, "m", 12, 1, 2, &back) == 0, "the good text: %s", pf_errmsg());

    /* 3. a FIFO and a folder where a marker should be: refused at once */
    char fifo[600], dir[600];
    snprintf(fifo, sizeof fifo, "%s/step-12/worker-0-of-2.module", root);
    CHECK(mkfifo(fifo, 0600) == 0, "mkfifo");
    CHECK(ckpt_module_marker_read(fifo, 12, 0, 2, &back) == -EINVAL && strstr(pf_errmsg(), "not a regular file"),
          "a FIFO: %s", pf_errmsg());
    unlink(fifo);
    snprintf(dir, sizeof dir, "%s/step-12/worker-0-of-2.module", root);
    mkdir(dir, 0755);
    CHECK(ckpt_module_marker_read(dir, 12, 0, 2, &back) == -EINVAL, "a folder: %s", pf_errmsg());
    rmdir(dir);
    CHECK(ckpt_module_marker_write("/nonexistent/pfcps/snapshots", 3, 0, 2, &id) == -ENOENT &&
              access("/nonexistent/pfcps", F_OK) != 0,
          "a root that is not on this host: %s", pf_errmsg());

    /* 4. pruning a shared folder (2 servers' shards + 2 module ranks' markers), snapshot_keep = 2 */
    make_steps(&id, 0);
    ckpt_prune(root, "shard", 0, 2, NULL);
    CHECK(exists(1) && exists(2) && exists(3) && exists(4), "shard files alone: a step was pruned (%d %d %d %d)",
          exists(1), exists(2), exists(3), exists(4));
    make_steps(&id, 1);
    ckpt_prune(root, "shard", 0, 2, NULL);
    CHECK(exists(1) && exists(2) && exists(3) && exists(4), "one of two markers: a step was pruned");
    make_steps(&id, 2);
    ckpt_prune(root, "shard", 0, 2, NULL);
    CHECK(!exists(1) && !exists(2) && exists(3) && exists(4), "every marker: steps %d %d %d %d left (want 3, 4)",
          exists(1), exists(2), exists(3), exists(4));
    printf("markers: exact text, read back, %zu malformed variants + FIFO + folder refused; pruning keeps 3 and 4\n",
           sizeof bad / sizeof *bad + 4);

    /* 5. another run's newer steps 3 and 4 in the folder (an earlier run in the same output); this run (id2)
     * writes steps 1, 2, then 5, each followed by its prune with snapshot_keep = 2 */
    ckpt_ident id2 = id;
    id2.run_id[0] ^= 0xff;
    char cmd0[400];
    snprintf(cmd0, sizeof cmd0, "rm -rf %s/step-*", root);
    CHECK(system(cmd0) == 0, "clearing the steps");
    make_run_step(3, &id);
    make_run_step(4, &id);
    make_run_step(1, &id2);
    ckpt_prune(root, "shard", 0, 2, &id2);
    make_run_step(2, &id2);
    ckpt_prune(root, "shard", 0, 2, &id2);
    CHECK(exists(1) && exists(2) && exists(3) && exists(4),
          "another run's newer steps pruned this run's own: steps %d %d %d %d left (want all)", exists(1), exists(2),
          exists(3), exists(4));
    make_run_step(5, &id2);
    ckpt_prune(root, "shard", 0, 2, &id2);
    CHECK(!exists(1) && exists(2) && exists(3) && exists(4) && exists(5),
          "this run's step 5: steps %d %d %d %d %d left (want 2 and 5 of this run, 3 and 4 of the other)", exists(1),
          exists(2), exists(3), exists(4), exists(5));
    /* the same files judged without an identity: the other run's 4 counts among the newest two, and this
     * run's 2 goes (with the other's 3) */
    ckpt_prune(root, "shard", 0, 2, NULL);
    CHECK(!exists(2) && !exists(3) && exists(4) && exists(5),
          "without an identity: steps %d %d %d %d left (want 4 and 5: the case the identity guards against)",
          exists(2), exists(3), exists(4), exists(5));
    printf("another run's steps: left alone and not counted; this run keeps its newest two\n");

    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0)
        fails++;
    printf("%s (%d failures)\n", fails ? "FAIL" : "PASS", fails);
    return fails ? 1 : 0;
}
