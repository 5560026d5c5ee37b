/* Shard snapshots (server/snapshot.h), in process:
 * 1. point in time: a server (shard 0 of 1, C = 20000, D = 256: 20 row blocks, the writer slowed to 30 ms per
 *    block) gets the pushes of steps 0..2 with PS_PUSH_SNAPSHOT on step 2, then at once the pushes of steps
 *    3..5 (every row) while checkpoint 3 is being written. The file must equal, row for row, the table of a
 *    second server that applied steps 0..2 only; the log must say blocks were copied aside by pushes during
 * the write (so the pushes really landed mid-write), and the live table must differ from the file.
 * 2. reshape: the checkpoint (1 server) loaded into shards 0..2 of 3 gives every class the reference row.
 * 3. bad files: the file truncated at every 1 KiB boundary and at its last byte, every single byte flipped, a
 *    missing shard file, a file of another C or D, a renamed file (shard 1 of 2): every one refused by
 *    snap_check / snap_load with a message naming the file; the intact file still loads.
 * 4. disk errors: a checkpoint root that is a file (nothing can be created) fails snap_start with a message;
 *    /dev/full as the temp file's target fails the write, and the previous checkpoint stays complete.
 * 5. files that lie (a 2-shard checkpoint written with the checkpoint key of a secret): header fields
 * rewritten with the header's SHA-256 and HMAC recomputed (a forger who holds the secret), block_rows = 2^54
 * in both shards first (whose 2 x block_rows x D x 4 wraps to 0 in 64 bits), then rows, embedding_size,
 *    num_classes, shard_id, num_servers, payload_bytes, step, kind, format_version: every one refused by
 *    snap_check, snap_load and `pfcps ckpt-info` (argv[1], with and without PFCPS_SECRET) naming the file and
 *    the field; a field rewritten without the key: refused by the HMAC with the key, by the run identity
 *    without it; a shard of another run (run id, seed): refused naming both files and the fields, and by
 *    snap_load against the resumed run's identity; files without an HMAC refused by a reader with the key; a
 *    folder and a FIFO in place of a shard file: "a directory, not a regular file", the FIFO at once.
 * 6. pfc_update = dense: the file holds the rows as stored with their steps and the lr table; loads into dense
 *    and sparse shards (dense_case). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/ckpt.h"
#include "common/err.h"
#include "common/fabric.h"
#include "common/log.h"
#include "common/snapfile.h"
#include "server/ps_server.h"
#include "server/snapshot.h"
#include "tests/check.h"
#include "tests/common/snapfile_forge.h"
#include "tests/server/ps_server_inject.h"

enum { C = 20000, D = 256, W = 2 };

static char root[256];

static ps_server *make_opts(const char *snap_root, int dense)
{
    ps_server_opts o = {.provider = "tcp",
                        .dense = dense,
                        .rank = 0,
                        .servers = 1,
                        .workers = W,
                        .dim = D,
                        .num_classes = C,
                        .seed = 11,
                        .momentum = 0.9,
                        .weight_decay = 5e-4,
                        .apply_threads = 1,
                        .recv_bufs = 2,
                        .snapshot_root = snap_root};
    ps_server *s = NULL;
    if (ps_server_create(&o, &s) < 0) {
        printf("FAIL: ps_server_create: %s\n", pf_errmsg());
        exit(1);
    }
    uint8_t a[FAB_MAX_ADDR];
    size_t la = sizeof a;
    if (ps_server_getname(s, a, &la) < 0 || ps_server_add_worker(s, 0, a, la) < 0 ||
        ps_server_add_worker(s, 1, a, la) < 0)
        exit(1);
    return s;
}

static ps_server *make(const char *snap_root)
{
    return make_opts(snap_root, 0);
}

/* Pushes of worker w for step t: n ids (a deterministic subset or every row), gradients from a fixed rule. */
static void push(ps_server *s, int w, int64_t t, int all, uint32_t flags)
{
    const uint32_t rpm = ps_wire_rows_per_msg(D, PS_DT_FP32);
    int64_t n = all ? C : 3000;
    int nch = (int)((n + rpm - 1) / rpm);
    size_t cap = sizeof(ps_hdr) + (size_t)rpm * (8 + 4 * D);
    uint8_t *msg = malloc(cap);
    for (int k = 0; k < nch; k++) {
        int64_t lo = (int64_t)k * rpm, hi = lo + rpm < n ? lo + rpm : n;
        ps_hdr h = {.magic = PS_MAGIC,
                    .version = PS_VERSION,
                    .op = PS_OP_PUSH,
                    .client = w,
                    .step = t,
                    .n = (uint32_t)(hi - lo),
                    .dim = D,
                    .dtype = PS_DT_FP32,
                    .chunk = (uint16_t)k,
                    .nchunks = (uint16_t)nch,
                    .lr = 0.1f,
                    .flags = flags};
        memcpy(msg, &h, sizeof h);
        int64_t *ids = (int64_t *)(msg + sizeof h);
        float *g = (float *)(ids + (hi - lo));
        for (int64_t i = lo; i < hi; i++) {
            int64_t c = all ? i : (i * 7 + 13 * t + w) % C;
            ids[i - lo] = c;
            for (int j = 0; j < D; j++)
                g[(i - lo) * D + j] = (float)(((c * 31 + j * 17 + t * 5 + w) % 97) - 48) * 1e-3f;
        }
        ps_server_inject(s, msg, sizeof h + (size_t)(hi - lo) * (8 + 4 * D));
    }
    free(msg);
}

/* Reads checkpoint 3's file into w, v (C x D each, class order: one server). Returns 0 or the error. */
static int read_snapshot(const char *path, float *w, float *v)
{
    snapfile_reader r;
    int rc = snapfile_open(&r, path, NULL);
    if (rc < 0)
        return rc;
    for (int64_t r0 = 0; rc == 0 && r0 < r.m.rows; r0 += r.m.block_rows) {
        int64_t n = r.m.rows - r0 < r.m.block_rows ? r.m.rows - r0 : r.m.block_rows;
        rc = snapfile_read(&r, w + r0 * D, sizeof(float) * (size_t)(n * D));
        if (rc == 0)
            rc = snapfile_read(&r, v + r0 * D, sizeof(float) * (size_t)(n * D));
    }
    if (rc == 0)
        rc = snapfile_finish(&r);
    snapfile_close(&r);
    return rc;
}

static long count_in_file(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    char line[4096];
    long n = -1;
    while (f && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, needle);
        if (p) {
            const char *q = p;
            while (q > line && q[-1] == ' ')
                q--;
            while (q > line && q[-1] >= '0' && q[-1] <= '9')
                q--;
            n = strtol(q, NULL, 10);
        }
    }
    if (f)
        fclose(f);
    return n;
}

static void copy_file(const char *from, const char *to)
{
    char cmd[2200];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
    if (system(cmd) != 0)
        exit(1);
}

/* Part 5: one header field to rewrite (forge_file's edit), named as a refusal must name it. */
typedef struct forged_field {
    const char *field;
    int64_t value;
} forged_field;

static void set_field(Pfcps__SnapshotHeader *h, void *arg)
{
    const forged_field *f = arg;
    if (!strcmp(f->field, "block_rows"))
        h->block_rows = f->value;
    else if (!strcmp(f->field, "rows"))
        h->rows = f->value;
    else if (!strcmp(f->field, "embedding_size"))
        h->embedding_size = (int32_t)f->value;
    else if (!strcmp(f->field, "num_classes"))
        h->num_classes = f->value;
    else if (!strcmp(f->field, "shard_id"))
        h->shard_id = (int32_t)f->value;
    else if (!strcmp(f->field, "num_servers"))
        h->num_servers = (int32_t)f->value;
    else if (!strcmp(f->field, "payload_bytes"))
        h->payload_bytes = (uint64_t)f->value;
    else if (!strcmp(f->field, "step"))
        h->step = f->value;
    else if (!strcmp(f->field, "seed"))
        h->seed = (uint64_t)f->value;
    else if (!strcmp(f->field, "format_version"))
        h->format_version = (uint32_t)f->value;
    else if (!strcmp(f->field, "kind")) {
        free(h->kind); /* decoded from a shard file: allocated, and freed with the header */
        h->kind = strdup("worker");
        h->num_workers = 2; /* a consistent worker file, but named as a shard */
    }
}

/* `pfcps ckpt-info dir` (pfcps: its path, NULL: not run), with PFCPS_SECRET = secret (NULL: unset), must show
 * step T INCOMPLETE naming `file` and `what`. */
static void ckpt_info_refuses(const char *pfcps, const char *dir, const char *secret, int64_t step,
                              const char *file, const char *what)
{
    if (!pfcps)
        return;
    char out[600], cmd[2400];
    snprintf(out, sizeof out, "%s.info", dir);
    if (secret)
        snprintf(cmd, sizeof cmd, "PFCPS_SECRET='%s' '%s' ckpt-info '%s' > '%s' 2>&1", secret, pfcps, dir,
                 out);
    else
        snprintf(cmd, sizeof cmd, "env -u PFCPS_SECRET '%s' ckpt-info '%s' > '%s' 2>&1", pfcps, dir, out);
    int rc = system(cmd);
    size_t len = 0;
    uint8_t *text = forge_read(out, &len);
    char *t = text ? realloc(text, len + 1) : NULL;
    if (t)
        t[len] = 0;
    char want[200];
    snprintf(want, sizeof want, "step %lld: INCOMPLETE", (long long)step);
    int ok = rc == 0 && t && strstr(t, want) && strstr(t, file) && strstr(t, what);
    CHECK(ok, "ckpt-info (%s) does not show step %lld INCOMPLETE naming %s and '%s' (rc %d):\n%s",
          secret ? "with the secret" : "without it", (long long)step, file, what, rc, t ? t : "(no output)");
    free(t);
    unlink(out);
}

/* Part 5: files that lie. A 2-shard checkpoint of C = 10, D = 4 at step 20 under <root>.lie, written with the
 * key of a secret and identity id. */
static void files_that_lie(const char *pfcps)
{
    static const char secret[] = "forge-secret";
    char root2[300], p0[600], p1[600], keep0[700], keep1[700];
    snprintf(root2, sizeof root2, "%s.lie", root);
    mkdir(root2, 0755);
    snapfile_key key, other;
    if (snapfile_key_derive(secret, &key) < 0 || snapfile_key_derive("another-secret", &other) < 0)
        exit(1);
    ckpt_ident id = {.seed = 2048}, foreign = {.seed = 7}, got;
    memset(id.run_id, 0xa1, sizeof id.run_id);
    memset(id.config_digest, 0x3c, sizeof id.config_digest);
    memset(foreign.run_id, 0xb2, sizeof foreign.run_id);
    memset(foreign.config_digest, 0x4d, sizeof foreign.config_digest);
    shard sh[2];
    snap_job *j;
    for (int s = 0; s < 2; s++) {
        shard_create(&sh[s], 10, 2, s, 4, 5, 1, 0);
        CHECK(snap_start(&sh[s], root2, 20, &id, &key, &j) == 0 && snap_finish(j) == 0, "write shard %d: %s",
              s, pf_errmsg());
    }
    ckpt_member_path(root2, 20, "shard", 0, 2, ".snap", p0, sizeof p0);
    ckpt_member_path(root2, 20, "shard", 1, 2, ".snap", p1, sizeof p1);
    snprintf(keep0, sizeof keep0, "%s.orig", p0);
    snprintf(keep1, sizeof keep1, "%s.orig", p1);
    copy_file(p0, keep0);
    copy_file(p1, keep1);
    int S0 = 0;
    CHECK(snap_check(root2, 20, 10, 4, &key, &S0, &got) == 0 && S0 == 2 && !memcmp(&got, &id, sizeof id),
          "intact 2-shard checkpoint refused: %s", pf_errmsg());

    /* block_rows = 2^54 in both shards, digests and HMACs recomputed: refused by every reader. */
    forged_field huge = {"block_rows", (int64_t)1 << 54};
    CHECK(forge_file(p0, set_field, &huge, &key) == 0 && forge_file(p1, set_field, &huge, &key) == 0,
          "forge");
    int rc = snap_check(root2, 20, 10, 4, &key, &S0, &got);
    CHECK(rc < 0 && strstr(pf_errmsg(), p0) && strstr(pf_errmsg(), "block_rows"),
          "block_rows = 2^54: snap_check rc %d (%s)", rc, pf_errmsg());
    printf("block_rows = 2^54 (digest and HMAC recomputed): %s\n", pf_errmsg());
    for (int s = 0; s < 2; s++) {
        shard into;
        shard_create(&into, 10, 2, s, 4, 99, 1, 0);
        rc = snap_load(&into, root2, 20, &key, &id);
        CHECK(rc < 0 && strstr(pf_errmsg(), s ? p1 : p0) && strstr(pf_errmsg(), "block_rows"),
              "block_rows = 2^54: snap_load into shard %d: rc %d (%s)", s, rc, pf_errmsg());
        shard_destroy(&into);
    }
    ckpt_info_refuses(pfcps, root2, secret, 20, "shard-0-of-2.snap", "block_rows");
    ckpt_info_refuses(pfcps, root2, NULL, 20, "shard-0-of-2.snap", "block_rows");

    /* Every other field, one at a time in shard 1 (5 rows of 4: payload 160 bytes). */
    const forged_field lies[] = {
        {"rows", 6},           {"rows", -1},
        {"block_rows", 0},     {"block_rows", 6},
        {"embedding_size", 0}, {"embedding_size", 65537},
        {"embedding_size", 8}, {"num_classes", 1000000000000001LL},
        {"num_classes", 12},   {"shard_id", 2},
        {"shard_id", 0},       {"num_servers", 0},
        {"num_servers", 3},    {"payload_bytes", 168},
        {"step", 21},          {"step", -1},
        {"kind", 0},           {"format_version", 1},
    };
    int nl = (int)(sizeof lies / sizeof lies[0]), named = 0;
    for (int i = 0; i < nl; i++) {
        copy_file(keep0, p0);
        copy_file(keep1, p1);
        CHECK(forge_file(p1, set_field, (void *)&lies[i], &key) == 0, "forge %s", lies[i].field);
        rc = snap_check(root2, 20, 10, 4, &key, &S0, &got);
        int ok = rc < 0 && strstr(pf_errmsg(), p1) && strstr(pf_errmsg(), lies[i].field);
        named += ok;
        CHECK(ok, "%s = %lld in shard 1: rc %d (%s)", lies[i].field, (long long)lies[i].value, rc,
              pf_errmsg());
        if (ok && i < 2)
            printf("  %s\n", pf_errmsg());
    }
    printf("%d of %d forged header fields refused naming the file and the field\n", named, nl);

    /* A field rewritten by someone without the key (the header's SHA-256 recomputed, not the HMAC). */
    copy_file(keep0, p0);
    copy_file(keep1, p1);
    forged_field seed = {"seed", 7};
    CHECK(forge_file(p1, set_field, &seed, NULL) == 0, "forge seed");
    rc = snap_check(root2, 20, 10, 4, &key, &S0, &got);
    CHECK(rc == -EPERM && strstr(pf_errmsg(), p1) &&
              strstr(pf_errmsg(), "forged or written by another run's secret"),
          "seed rewritten without the key: rc %d (%s)", rc, pf_errmsg());
    rc = snap_check(root2, 20, 10, 4, NULL, &S0, &got);
    CHECK(rc < 0 && strstr(pf_errmsg(), p1) && strstr(pf_errmsg(), "seed 7 vs 2048"),
          "seed rewritten, read without the key: rc %d (%s)", rc, pf_errmsg());
    ckpt_info_refuses(pfcps, root2, secret, 20, "shard-1-of-2.snap",
                      "forged or written by another run's secret");
    copy_file(keep1, p1);
    rc = snap_check(root2, 20, 10, 4, &other, &S0, &got);
    CHECK(rc == -EPERM && strstr(pf_errmsg(), p0) && strstr(pf_errmsg(), "HMAC does not verify"),
          "another secret's key accepted: rc %d (%s)", rc, pf_errmsg());
    printf("HMAC: a field rewritten without the key, and a reader with another secret's key: refused\n");

    /* Shard 1 of another run (the same secret, another run id and seed). */
    snap_job *jf;
    CHECK(snap_start(&sh[1], root2, 20, &foreign, &key, &jf) == 0 && snap_finish(jf) == 0, "write foreign");
    rc = snap_check(root2, 20, 10, 4, &key, &S0, &got);
    CHECK(rc < 0 && strstr(pf_errmsg(), p1) && strstr(pf_errmsg(), p0) && strstr(pf_errmsg(), "run_id") &&
              strstr(pf_errmsg(), "seed 7 vs 2048"),
          "a shard of another run accepted: rc %d (%s)", rc, pf_errmsg());
    printf("another run's shard file: %s\n", pf_errmsg());
    ckpt_info_refuses(pfcps, root2, secret, 20, "shard-1-of-2.snap", "run_id");
    shard into;
    shard_create(&into, 10, 2, 1, 4, 99, 1, 0);
    rc = snap_load(&into, root2, 20, &key, &id);
    CHECK(rc < 0 && strstr(pf_errmsg(), p1) && strstr(pf_errmsg(), "seed 7 vs 2048"),
          "snap_load of another run's shard against this run's identity: rc %d (%s)", rc, pf_errmsg());
    shard_destroy(&into);

    /* Files without an HMAC, read with the key. */
    for (int s = 0; s < 2; s++)
        CHECK(snap_start(&sh[s], root2, 20, &id, NULL, &jf) == 0 && snap_finish(jf) == 0, "write unkeyed");
    rc = snap_check(root2, 20, 10, 4, &key, &S0, &got);
    CHECK(rc == -EPERM && strstr(pf_errmsg(), p0) && strstr(pf_errmsg(), "no HMAC"),
          "a file without an HMAC accepted by a reader with the key: rc %d (%s)", rc, pf_errmsg());
    CHECK(snap_check(root2, 20, 10, 4, NULL, &S0, &got) == 0, "unkeyed files refused without a key: %s",
          pf_errmsg());

    /* A folder, then a FIFO, in place of shard 1. */
    unlink(p1);
    mkdir(p1, 0755);
    rc = snap_check(root2, 20, 10, 4, NULL, &S0, &got);
    CHECK(rc < 0 && strstr(pf_errmsg(), p1) && strstr(pf_errmsg(), "a directory, not a regular file"),
          "a folder as a shard file: rc %d (%s)", rc, pf_errmsg());
    printf("a folder in place of a shard file: %s\n", pf_errmsg());
    rmdir(p1);
    if (mkfifo(p1, 0644) == 0) {
        rc = snap_check(root2, 20, 10, 4, NULL, &S0, &got);
        CHECK(rc < 0 && strstr(pf_errmsg(), p1) && strstr(pf_errmsg(), "FIFO"),
              "a FIFO as a shard file: rc %d (%s)", rc, pf_errmsg());
        unlink(p1);
    }
    for (int s = 0; s < 2; s++)
        shard_destroy(&sh[s]);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root2);
    if (system(cmd) != 0)
        fails++;
}

/* Part 6: pfc_update = dense. Two dense servers get the same pushes of steps 0..4 (3000 of the 20000 rows per
 * worker and step: most rows skip most steps), one with PS_PUSH_SNAPSHOT on step 4. Checkpoint 5's file must
 * say dense and hold the table as stored (weights, momentum and each row's step equal to the other server's,
 * bit for bit: nothing brought up to date) and mu, wd and the lr of steps 0..4 (the pushes' 0.1f); loaded
 * into 3 dense shards, every class keeps its stored row and step and every shard gets the lr table; loaded
 * into 3 sparse shards, every class is the closed form of the steps its row skipped (dense_compose +
 * dense_apply_row, server/dense.h) applied to the stored row. */
static void dense_case(void)
{
    char droot[300];
    snprintf(droot, sizeof droot, "%s.dense", root);
    mkdir(droot, 0755);
    ps_server *live = make_opts(droot, 1), *ref = make_opts(NULL, 1);
    for (int64_t t = 0; t < 5; t++)
        for (int w = 0; w < W; w++) {
            push(live, w, t, 0, t == 4 ? PS_PUSH_SNAPSHOT : 0);
            push(ref, w, t, 0, 0);
        }
    ps_server_destroy(live); /* waits for the snapshot */
    shard *rs = (shard *)ps_server_shard(ref);
    char path[512];
    ckpt_member_path(droot, 5, "shard", 0, 1, ".snap", path, sizeof path);
    snapfile_reader r;
    int rc = snapfile_open(&r, path, NULL);
    CHECK(rc == 0 && r.m.dense, "%s: open %d, header field dense %d: %s", path, rc, rc == 0 && r.m.dense,
          pf_errmsg());
    long diff = 0, lagging = 0;
    if (rc == 0) {
        double pre[2 + 5];
        rc = snapfile_read(&r, pre, sizeof pre);
        CHECK(rc == 0 && pre[0] == 0.9 && pre[1] == 5e-4, "dense prefix: mu %g wd %g", pre[0], pre[1]);
        for (int t = 0; rc == 0 && t < 5; t++)
            CHECK(pre[2 + t] == (double)0.1f, "lr of step %d in the file: %.17g", t, pre[2 + t]);
        const size_t rowb = sizeof(float) * 2 * D + sizeof(int64_t);
        char *buf = malloc(rowb * (size_t)r.m.block_rows);
        for (int64_t r0 = 0; rc == 0 && r0 < r.m.rows; r0 += r.m.block_rows) {
            int64_t n = r.m.rows - r0 < r.m.block_rows ? r.m.rows - r0 : r.m.block_rows;
            if ((rc = snapfile_read(&r, buf, rowb * (size_t)n)) < 0)
                break;
            const float *bw = (const float *)buf, *bv = bw + n * D;
            const int64_t *bs = (const int64_t *)(buf + sizeof(float) * 2 * D * (size_t)n);
            for (int64_t k = 0; k < n; k++) {
                int64_t c = r0 + k;
                float *rw = shard_row(rs, c);
                diff += memcmp(rw, bw + k * D, sizeof(float) * D) != 0 ||
                        memcmp(rs->momentum + (rw - rs->weight), bv + k * D, sizeof(float) * D) != 0 ||
                        bs[k] != rs->rstep[c];
                lagging += bs[k] < 5;
            }
        }
        free(buf);
        if (rc == 0)
            rc = snapfile_finish(&r);
        snapfile_close(&r);
    }
    CHECK(rc == 0 && diff == 0, "dense file: %ld of %d rows differ from the table as stored (%s)", diff, C,
          rc ? pf_errmsg() : "");
    CHECK(lagging > C / 2, "only %ld rows lag behind step 5: the case does not test skipped steps", lagging);
    long bad = 0, badlr = 0, moved = 0;
    float *ew = malloc(sizeof(float) * D), *ev = malloc(sizeof(float) * D);
    for (int dense = 1; dense >= 0; dense--)
        for (int s3 = 0; s3 < 3; s3++) {
            shard sh;
            if (shard_create(&sh, C, 3, s3, D, 99, 1, 0) < 0 ||
                (dense && shard_dense_enable(&sh, 0.9, 5e-4, 0) < 0)) {
                printf("FAIL shard_create: %s\n", pf_errmsg());
                exit(1);
            }
            rc = snap_load(&sh, droot, 5, NULL, NULL);
            CHECK(rc == 0, "snap_load of the dense file into %s shard %d of 3: %s", dense ? "dense" : "sparse", s3,
                  pf_errmsg());
            for (int t = 0; dense && t < 5; t++)
                badlr += t >= sh.lr_cap || sh.step_lr[t] != (double)0.1f;
            for (int64_t lr = 0; rc == 0 && lr < sh.rows; lr++) {
                int64_t c = lr * 3 + s3;
                float *rw = shard_row(rs, c);
                memcpy(ew, rw, sizeof(float) * D);
                memcpy(ev, rs->momentum + (rw - rs->weight), sizeof(float) * D);
                dense_map M;
                if (!dense && !dense_compose(rs->step_lr, rs->rstep[c], 4, 0.9, 5e-4, &M)) {
                    dense_apply_row(ew, ev, D, &M);
                    moved++;
                }
                bad += memcmp(sh.weight + lr * D, ew, sizeof(float) * D) != 0 ||
                       memcmp(sh.momentum + lr * D, ev, sizeof(float) * D) != 0 ||
                       (dense && sh.rstep[lr] != rs->rstep[c]);
            }
            shard_destroy(&sh);
        }
    CHECK(bad == 0 && badlr == 0 && moved > C / 2,
          "dense file into 3 dense / 3 sparse shards: %ld rows, %ld lr entries differ (%ld rows caught up)", bad,
          badlr, moved);
    printf("dense: file = table as stored (%ld of %d rows lagging); into 3 dense shards rows, steps and lr kept; "
           "into 3 sparse shards %ld rows brought up to date with step 5\n",
           lagging, C, moved);
    free(ew);
    free(ev);
    ps_server_destroy(ref);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", droot);
    if (system(cmd) != 0)
        fails++;
}

int main(int argc, char **argv)
{
    snprintf(root, sizeof root, "/tmp/pfcps_snap_test.%d", (int)getpid());
    mkdir(root, 0755);
    char logpath[300];
    snprintf(logpath, sizeof logpath, "%s.log", root);
    log_open_file(logpath);
    setenv("PFCPS_SNAPSHOT_THROTTLE_MS", "60", 1);

    /* 1. point in time */
    ps_server *live = make(root), *ref = make(NULL);
    for (int64_t t = 0; t < 3; t++)
        for (int w = 0; w < W; w++)
            push(ref, w, t, 0, 0);
    for (int64_t t = 0; t < 2; t++)
        for (int w = 0; w < W; w++)
            push(live, w, t, 0, 0);
    /* Worker 0's step-3 push (every row) is in before worker 1's push completes step 2, whose apply begins
     * checkpoint 3: step 3 is then applied as soon as worker 1's step-3 push follows, while the (throttled)
     * write goes on, however slowly this process builds its messages (a sanitizer build on loaded cores). */
    push(live, 0, 2, 0, PS_PUSH_SNAPSHOT);
    push(live, 0, 3, 1, 0);
    push(live, 1, 2, 0, PS_PUSH_SNAPSHOT);
    push(live, 1, 3, 1, 0);
    for (int64_t t = 4; t < 6; t++) /* while checkpoint 3 is written: every row changes */
        for (int w = 0; w < W; w++)
            push(live, w, t, 1, 0);
    ps_server_destroy(live); /* waits for the snapshot */
    char path[512];
    ckpt_member_path(root, 3, "shard", 0, 1, ".snap", path, sizeof path);
    float *w = malloc(sizeof(float) * C * D), *v = malloc(sizeof(float) * C * D);
    int rc = read_snapshot(path, w, v);
    CHECK(rc == 0, "read %s: %s", path, pf_errmsg());
    shard *rs = (shard *)ps_server_shard(ref);
    long diff = 0;
    for (int64_t c = 0; rc == 0 && c < C; c++) {
        float *rw = shard_row(rs, c);
        float *rv = rs->momentum + (rw - rs->weight);
        diff +=
            memcmp(rw, w + c * D, sizeof(float) * D) != 0 || memcmp(rv, v + c * D, sizeof(float) * D) != 0;
    }
    CHECK(rc == 0 && diff == 0, "%ld of %d rows of the checkpoint differ from the table after steps 0..2",
          diff, C);
    long aside = count_in_file(logpath, "blocks copied aside");
    CHECK(aside > 0, "no block was copied aside (log says %ld): the pushes did not land during the write",
          aside);
    printf(
        "point in time: %d rows equal the step-3 table; %ld blocks copied aside by pushes during the write\n",
        C, aside);

    /* 2. reshape: one server's checkpoint into 3 shards */
    unsetenv("PFCPS_SNAPSHOT_THROTTLE_MS");
    long bad = 0;
    for (int s3 = 0; s3 < 3; s3++) {
        shard sh;
        if (shard_create(&sh, C, 3, s3, D, 99, 1, 0) < 0) {
            printf("FAIL shard_create: %s\n", pf_errmsg());
            return 1;
        }
        rc = snap_load(&sh, root, 3, NULL, NULL);
        CHECK(rc == 0, "snap_load into shard %d of 3: %s", s3, pf_errmsg());
        for (int64_t lr = 0; rc == 0 && lr < sh.rows; lr++) {
            int64_t c = lr * 3 + s3;
            bad += memcmp(sh.weight + lr * D, w + c * D, sizeof(float) * D) != 0 ||
                   memcmp(sh.momentum + lr * D, v + c * D, sizeof(float) * D) != 0 || !sh.ready[lr];
        }
        shard_destroy(&sh);
    }
    CHECK(bad == 0, "reshape 1 -> 3 servers: %ld rows differ", bad);
    printf("reshape: checkpoint of 1 server loaded into 3 shards, every class equal\n");

    /* 3. bad files: a small checkpoint (C = 10, D = 4) at step 7 */
    shard small;
    shard_create(&small, 10, 1, 0, 4, 5, 1, 0);
    snap_job *j;
    static const ckpt_ident none;
    ckpt_ident got;
    CHECK(snap_start(&small, root, 7, &none, NULL, &j) == 0, "snap_start: %s", pf_errmsg());
    CHECK(snap_finish(j) == 0, "snap_finish: %s", pf_errmsg());
    char good[512], keep[600];
    ckpt_member_path(root, 7, "shard", 0, 1, ".snap", good, sizeof good);
    snprintf(keep, sizeof keep, "%s.orig", root);
    copy_file(good, keep);
    struct stat st;
    stat(keep, &st);
    int S0 = 0;
    CHECK(snap_check(root, 7, 10, 4, NULL, &S0, &got) == 0 && S0 == 1, "intact checkpoint refused: %s",
          pf_errmsg());
    int refused = 0, tried = 0;
    for (off_t cut = 0; cut<st.st_size; cut = cut + 1024> st.st_size ? st.st_size - 1 : cut + 1024) {
        copy_file(keep, good);
        if (truncate(good, cut) != 0)
            return 1;
        tried++;
        if (snap_check(root, 7, 10, 4, NULL, &S0, &got) < 0 && strstr(pf_errmsg(), "shard-0-of-1.snap"))
            refused++;
        else
            printf("FAIL truncated at %lld: not refused (%s)\n", (long long)cut, pf_errmsg());
        if (cut == st.st_size - 1)
            break;
    }
    CHECK(refused == tried, "truncations refused: %d of %d", refused, tried);
    printf("truncated at every 1 KiB boundary and at %lld bytes: %d of %d refused\n",
           (long long)st.st_size - 1, refused, tried);
    refused = tried = 0;
    FILE *kf = fopen(keep, "rb");
    uint8_t *bytes = malloc((size_t)st.st_size);
    if (!kf || fread(bytes, 1, (size_t)st.st_size, kf) != (size_t)st.st_size)
        return 1;
    fclose(kf);
    for (off_t i = 0; i < st.st_size; i++) {
        bytes[i] ^= 0x5a;
        FILE *f = fopen(good, "wb");
        fwrite(bytes, 1, (size_t)st.st_size, f);
        fclose(f);
        bytes[i] ^= 0x5a;
        tried++;
        if (snap_check(root, 7, 10, 4, NULL, &S0, &got) < 0)
            refused++;
        else if (tried - refused < 5)
            printf("FAIL byte %lld flipped: not refused\n", (long long)i);
    }
    CHECK(refused == tried, "flipped bytes refused: %d of %d", refused, tried);
    /* the same file, every field rewritten with the header's digest recomputed, is the job of part 5 */
    printf("every byte flipped in turn: %d of %d refused\n", refused, tried);
    copy_file(keep, good);
    CHECK(snap_check(root, 7, 11, 4, NULL, &S0, &got) < 0 && strstr(pf_errmsg(), "C=10"),
          "wrong C accepted: %s", pf_errmsg());
    CHECK(snap_check(root, 7, 10, 8, NULL, &S0, &got) < 0 && strstr(pf_errmsg(), "D=4"),
          "wrong D accepted: %s", pf_errmsg());
    char renamed[512];
    ckpt_member_path(root, 7, "shard", 1, 2, ".snap", renamed, sizeof renamed);
    if (rename(good, renamed) != 0)
        return 1;
    CHECK(snap_check(root, 7, 10, 4, NULL, &S0, &got) < 0 && strstr(pf_errmsg(), "shard-0-of-2.snap missing"),
          "a lone shard 1 of 2 accepted: %s", pf_errmsg());
    shard s2;
    shard_create(&s2, 10, 2, 1, 4, 5, 1, 0);
    CHECK(snap_load(&s2, root, 7, NULL, NULL) < 0, "snap_load of an incomplete checkpoint succeeded");
    shard_destroy(&s2);
    unlink(renamed);
    copy_file(keep, good);
    CHECK(snap_check(root, 7, 10, 4, NULL, &S0, &got) == 0, "restored checkpoint refused: %s", pf_errmsg());
    printf("wrong C, wrong D, a missing shard file: refused with the file named\n");

    /* 4. disk errors: the temp file on /dev/full; a root that is a file */
    char tmpname[600];
    ckpt_member_path(root, 9, "shard", 0, 1, ".snap.tmp", tmpname, sizeof tmpname);
    char dir9[512];
    ckpt_step_dir(root, 9, dir9, sizeof dir9);
    mkdir(dir9, 0755);
    if (symlink("/dev/full", tmpname) == 0) {
        CHECK(snap_start(&small, root, 9, &none, NULL, &j) == 0, "snap_start: %s", pf_errmsg());
        rc = snap_finish(j);
        CHECK(rc < 0 && strstr(pf_errmsg(), "No space left"), "write to /dev/full: rc %d (%s)", rc,
              pf_errmsg());
        ckpt_member_path(root, 9, "shard", 0, 1, ".snap", tmpname, sizeof tmpname);
        CHECK(access(tmpname, F_OK) != 0, "a failed checkpoint left %s", tmpname);
        CHECK(snap_check(root, 7, 10, 4, NULL, &S0, &got) == 0, "the previous checkpoint is damaged: %s",
              pf_errmsg());
        printf("disk full (/dev/full): write refused (%s); checkpoint 7 intact\n", pf_errmsg());
    } else {
        printf("SKIP part: cannot link /dev/full\n");
    }
    char fileroot[300];
    snprintf(fileroot, sizeof fileroot, "%s.file", root);
    FILE *ff = fopen(fileroot, "w");
    fclose(ff);
    CHECK(snap_start(&small, fileroot, 9, &none, NULL, &j) < 0, "snap_start under a file succeeded");
    unlink(fileroot);
    shard_destroy(&small);

    /* 5. files that lie */
    files_that_lie(argc > 1 ? argv[1] : NULL);

    /* 6. pfc_update = dense */
    dense_case();

    ps_server_destroy(ref);
    free(w);
    free(v);
    free(bytes);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s' '%s'", root, keep, logpath);
    if (system(cmd) != 0)
        fails++;
    printf(fails ? "FAILED\n" : "PASS\n");
    return fails != 0;
}
