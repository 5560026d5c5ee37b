/* The class-center partitions of a run into one safetensors file (see centers_export.h). */
#include "worker/model/centers_export.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/atomic_file.h"
#include "common/err.h"
#include "common/file.h"
#include "worker/model/safetensors.h"

#define MAX_PARTS 65536

/* D from the run's model.ckpt header (model.h: magic 8 | u32 version | u32 embedding_size ...). */
static int dim_from_ckpt(const char *run_output, int *dim)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/model.ckpt", run_output);
    unsigned char h[16];
    size_t got = 0;
    int rc = pf_read_head(p, h, sizeof h, &got);
    if (rc) {
        char why[256];
        snprintf(why, sizeof why, "%s", pf_errmsg());
        return pf_err(rc, "%s: %s (it gives the embedding size; or pass --dim D)", p, why);
    }
    uint32_t d;
    memcpy(&d, h + 12, 4);
    if (got != sizeof h || memcmp(h, "PFCPSBB1", 8))
        return pf_err(-EPROTO, "%s: not a pfcps backbone checkpoint", p);
    if (d == 0 || d > (1u << 20))
        return pf_err(-EPROTO, "%s: embedding_size %u is not plausible", p, d);
    *dim = (int)d;
    return 0;
}

/* Counts partition.rank0 .. rank<W-1> and refuses a partition.rank<r> with r >= W (a gap). */
static int count_parts(const char *dir, int *W)
{
    DIR *d = opendir(dir);
    if (!d)
        return pf_err(errno == ENOENT ? -ENOENT : -EIO, "%s: cannot open the centers folder: %s", dir,
                      strerror(errno));
    long maxr = -1, n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "partition.rank", 14))
            continue;
        char *end;
        long r = strtol(e->d_name + 14, &end, 10);
        if (*end || end == e->d_name + 14 || r < 0 || r >= MAX_PARTS)
            continue; /* e.g. partition.rank0.tmp */
        n++;
        if (r > maxr)
            maxr = r;
    }
    closedir(d);
    if (n == 0)
        return pf_err(-ENOENT,
                      "%s: no partition.rank<r> files (was the run started with save_centers = true?)", dir);
    if (maxr + 1 != n) {
        for (long r = 0; r <= maxr; r++) {
            char p[4200];
            snprintf(p, sizeof p, "%s/partition.rank%ld", dir, r);
            if (access(p, F_OK) != 0)
                return pf_err(-EINVAL,
                              "%s: missing, but partition.rank%ld is present (one file per worker rank)", p,
                              maxr);
        }
    }
    *W = (int)n;
    return 0;
}

/* The class count C over the W partition files of dir: each must be a whole number of records of
 * rec = 8 + 4 D bytes; C must be positive and small enough for a safetensors offset. */
static int count_classes(const char *dir, int W, int dim, uint64_t *C_out)
{
    const uint64_t rec = 8 + 4 * (uint64_t)dim;
    uint64_t C = 0;
    char p[4200];
    for (int r = 0; r < W; r++) {
        struct stat st;
        snprintf(p, sizeof p, "%s/partition.rank%d", dir, r);
        if (stat(p, &st) != 0)
            return pf_err(errno == ENOENT ? -ENOENT : -EIO, "%s: cannot stat: %s", p, strerror(errno));
        if (!S_ISREG(st.st_mode))
            return pf_err(-EIO, "%s: %s, not a regular file", p, pf_file_kind(&st));
        if ((uint64_t)st.st_size % rec)
            return pf_err(
                -EPROTO,
                "%s: %lld bytes is not a whole number of records of 8 + 4 x %d bytes (truncated, or "
                "another embedding size)",
                p, (long long)st.st_size, dim);
        C += (uint64_t)st.st_size / rec;
    }
    if (C == 0)
        return pf_err(-EINVAL, "%s: the partition files hold no class centers", dir);
    if (C > (uint64_t)INT64_MAX / rec)
        return pf_err(-EINVAL, "%s: %llu classes is too many", dir, (unsigned long long)C);
    *C_out = C;
    return 0;
}

/* The safetensors header of the (C, D) `centers` tensor and its metadata; *hdr is malloc'd. */
static int centers_header(uint64_t C, int dim, int W, unsigned char **hdr, size_t *hl, uint64_t *data_bytes)
{
    char D_s[32], C_s[32], W_s[32];
    snprintf(D_s, sizeof D_s, "%d", dim);
    snprintf(C_s, sizeof C_s, "%llu", (unsigned long long)C);
    snprintf(W_s, sizeof W_s, "%d", W);
    st_meta meta[] = {{"format", "pt"},
                      {"producer", "pfcps"},
                      {"num_classes", C_s},
                      {"embedding_size", D_s},
                      {"world_size", W_s}};
    st_entry e = {.name = "centers", .dtype = "F32", .ndim = 2, .shape = {(int64_t)C, dim}};
    return st_header(&e, 1, meta, 5, hdr, hl, NULL, data_bytes);
}

/* Where the rows go while they are copied: the output file (rows at hl + id x 4 D), the bitmap of the
 * class ids seen so far and a read buffer of `chunk` records. */
typedef struct centers_copy {
    int fd;
    const char *out_tmp;
    size_t hl;
    int dim;
    uint64_t C;
    uint8_t *seen;
    unsigned char *buf;
    size_t chunk;
} centers_copy;

/* Copies one record (u64 class id, D float32) to its row, refusing an id out of range or seen before. */
static int copy_record(centers_copy *cc, const unsigned char *q, const char *p, uint64_t k)
{
    uint64_t id;
    memcpy(&id, q, 8);
    if (id >= cc->C)
        return pf_err(-EINVAL,
                      "%s record %llu: class id %llu out of range: the files hold %llu records, so ids "
                      "must be 0..%llu (an id out of range, or a class missing)",
                      p, (unsigned long long)k, (unsigned long long)id, (unsigned long long)cc->C,
                      (unsigned long long)(cc->C - 1));
    if (cc->seen[id / 8] & (1u << (id % 8)))
        return pf_err(-EINVAL, "%s record %llu: class id %llu appears a second time", p,
                      (unsigned long long)k, (unsigned long long)id);
    cc->seen[id / 8] |= (uint8_t)(1u << (id % 8));
    size_t nb = 4 * (size_t)cc->dim;
    if (pwrite(cc->fd, q + 8, nb, (off_t)(cc->hl + id * nb)) != (ssize_t)nb)
        return pf_err(-EIO, "%s: write failed: %s", cc->out_tmp, strerror(errno));
    return 0;
}

/* Copies every record of the partition file p to its row. */
static int copy_partition(centers_copy *cc, const char *p)
{
    FILE *in;
    int orc = pf_fopen_regular(p, &in);
    if (orc < 0)
        return pf_err_wrap(orc, "%s", p);
    const size_t rec = 8 + 4 * (size_t)cc->dim;
    uint64_t k = 0;
    size_t got;
    int rc = 0;
    while (!rc && (got = fread(cc->buf, rec, cc->chunk, in)) > 0)
        for (size_t i = 0; i < got && !rc; i++, k++)
            rc = copy_record(cc, cc->buf + i * rec, p, k);
    if (!rc && ferror(in))
        rc = pf_err(-EIO, "%s: read failed", p);
    fclose(in);
    return rc;
}

int centers_export_safetensors(const char *run_output, int dim, const char *out, int64_t *num_classes,
                               int *dim_out)
{
    int rc, W = 0;
    if (dim <= 0 && (rc = dim_from_ckpt(run_output, &dim)))
        return rc;
    if (dim > (1 << 20))
        return pf_err(-EINVAL, "embedding size %d is not plausible", dim);
    char dir[4096];
    if ((size_t)snprintf(dir, sizeof dir, "%s/centers", run_output) >= sizeof dir - 32)
        return pf_err(-EINVAL, "path too long: %s", run_output);
    uint64_t C = 0;
    if ((rc = count_parts(dir, &W)) || (rc = count_classes(dir, W, dim, &C)))
        return rc;
    unsigned char *hdr = NULL;
    size_t hl;
    uint64_t data_bytes;
    if ((rc = centers_header(C, dim, W, &hdr, &hl, &data_bytes)))
        return rc;

    pf_atomic_file af;
    centers_copy cc = {.fd = -1, .hl = hl, .dim = dim, .C = C, .chunk = 4096};
    cc.seen = calloc((size_t)(C + 7) / 8, 1);
    cc.buf = malloc(cc.chunk * (8 + 4 * (size_t)dim));
    if (!cc.seen || !cc.buf)
        rc = pf_err(-ENOMEM, "out of memory for %llu classes", (unsigned long long)C);
    else if ((rc = pf_atomic_open(&af, out, "centers export")) == 0) {
        cc.fd = fileno(af.f);
        cc.out_tmp = af.tmp;
        /* The header through the stream, then the rows in place (pwrite) into the file sized up front. */
        int ok = fwrite(hdr, 1, hl, af.f) == hl && fflush(af.f) == 0 &&
                 ftruncate(cc.fd, (off_t)(hl + data_bytes)) == 0;
        char p[4200];
        if (!ok)
            rc = pf_err(-EIO, "%s: write failed: %s", af.tmp, strerror(errno));
        for (int r = 0; r < W && !rc; r++) {
            snprintf(p, sizeof p, "%s/partition.rank%d", dir, r);
            rc = copy_partition(&cc, p);
        }
        /* C records, none out of range, none twice: every class 0..C-1 is present */
        if (rc)
            pf_atomic_abort(&af);
        else
            rc = pf_atomic_commit(&af, 1);
    }
    free(cc.seen);
    free(cc.buf);
    free(hdr);
    if (!rc && num_classes)
        *num_classes = (int64_t)C;
    if (!rc && dim_out)
        *dim_out = dim;
    return rc;
}
