/* Shard table: allocation, counter-based init, gather, SGD. See shard.h. */
#include "server/shard.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/err.h"
#include "common/splitmix64.h"
#include "proto/ps_wire.h"

int64_t shard_local_rows(int64_t num_classes, int servers, int rank)
{
    if (servers <= 0 || rank < 0 || rank >= servers || num_classes <= rank)
        return 0;
    return (num_classes - rank + servers - 1) / servers;
}

static size_t page_round(size_t b)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (b + pg - 1) / pg * pg;
}

size_t shard_bytes(int64_t num_classes, int servers, int rank, int dim)
{
    size_t one = (size_t)shard_local_rows(num_classes, servers, rank) * (size_t)dim * sizeof(float);
    return 2 * page_round(one ? one : 1);
}

/* MemAvailable from /proc/meminfo in bytes, or 0 when unknown. */
static size_t mem_available(void)
{
    FILE *fp = fopen("/proc/meminfo", "r");
    if (!fp)
        return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof(line), fp)) {
        if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1)
            break;
    }
    fclose(fp);
    return kb * 1024;
}

void shard_init_row(uint64_t seed, int64_t c, int dim, float *row)
{
    uint64_t k = splitmix64(splitmix64(seed) ^ (uint64_t)c);
    for (int p = 0; 2 * p < dim; p++) {
        uint64_t a = splitmix64(k + 2 * (uint64_t)p), b = splitmix64(k + 2 * (uint64_t)p + 1);
        double u1 = (double)((a >> 11) + 1) * 0x1.0p-53, u2 = (double)(b >> 11) * 0x1.0p-53;
        double r = sqrt(-2.0 * log(u1));
        row[2 * p] = (float)(0.01 * r * cos(2.0 * M_PI * u2));
        if (2 * p + 1 < dim)
            row[2 * p + 1] = (float)(0.01 * r * sin(2.0 * M_PI * u2));
    }
}

typedef struct touch_job {
    char *p;
    size_t lo, hi;
} touch_job;

/* Writes one byte per page so the kernel backs the whole mapping now (huge pages where it can). */
static void *touch_thread(void *arg)
{
    touch_job *j = arg;
    for (size_t o = j->lo; o < j->hi; o += 4096)
        j->p[o] = 0;
    return NULL;
}

float *shard_row(shard *sh, int64_t lrow)
{
    float *w = sh->weight + (size_t)lrow * (size_t)sh->dim;
    /* Acquire/release: a snapshot writer (server/snapshot.c) that sees the flag set reads a complete row. */
    if (!__atomic_load_n(&sh->ready[lrow], __ATOMIC_ACQUIRE)) {
        shard_init_row(sh->seed, lrow * sh->servers + sh->rank, sh->dim, w);
        __atomic_store_n(&sh->ready[lrow], 1, __ATOMIC_RELEASE);
    }
    return w;
}

int shard_create(shard *sh, int64_t num_classes, int servers, int rank, int dim, uint64_t seed, int threads,
                 int prefault)
{
    memset(sh, 0, sizeof(*sh));
    if (num_classes <= 0)
        return pf_err(-EINVAL, "num_classes %lld must be positive", (long long)num_classes);
    if (servers <= 0 || rank < 0 || rank >= servers)
        return pf_err(-EINVAL, "server rank %d out of range for %d servers", rank, servers);
    if (dim <= 0 || dim > 65536)
        return pf_err(-EINVAL, "embedding_size %d out of range (1..65536)", dim);
    int64_t rows = shard_local_rows(num_classes, servers, rank);
    int rc = shard_check_fit(num_classes, servers, rank, dim);
    if (rc < 0)
        return rc;
    size_t bytes = shard_bytes(num_classes, servers, rank, dim);
    void *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED)
        return pf_err(-ENOMEM, "mmap of %zu bytes for the shard failed", bytes);
    /* Transparent huge pages only when every page is backed now: fewer TLB misses on random gathers. Backed
     * lazily, a random row access would fault in (and zero) a whole 2 MiB page. */
    if (prefault)
        madvise(base, bytes, MADV_HUGEPAGE);
    sh->num_classes = num_classes;
    sh->servers = servers;
    sh->rank = rank;
    sh->dim = dim;
    sh->rows = rows;
    sh->base = base;
    sh->bytes = bytes;
    sh->weight = base;
    sh->momentum = (float *)((char *)base + bytes / 2); /* anonymous memory is zero: momentum starts at 0 */

    sh->seed = seed;
    sh->ready = calloc((size_t)(rows ? rows : 1), 1);
    if (!sh->ready) {
        munmap(base, bytes);
        memset(sh, 0, sizeof(*sh));
        return pf_err(-ENOMEM, "out of memory for the row map");
    }
    if (prefault) {
        if (threads < 1)
            threads = 1;
        if (threads > 64)
            threads = 64;
        pthread_t tid[64];
        int ok[64] = {0};
        touch_job jobs[64];
        size_t pages = bytes / 4096;
        for (int t = 0; t < threads; t++)
            jobs[t] = (touch_job){base, pages * (size_t)t / (size_t)threads * 4096,
                                  pages * (size_t)(t + 1) / (size_t)threads * 4096};
        for (int t = 1; t < threads; t++)
            ok[t] = pthread_create(&tid[t], NULL, touch_thread, &jobs[t]) == 0;
        touch_thread(&jobs[0]);
        for (int t = 1; t < threads; t++) {
            if (ok[t])
                pthread_join(tid[t], NULL);
            else
                touch_thread(&jobs[t]); /* no thread: do that part here */
        }
    }
    return 0;
}

/* A number from a cgroup file ("max" or a value past 2^62: no limit, returned as SIZE_MAX); 0 when
 * unreadable. */
static size_t cg_read(const char *dir, const char *file)
{
    char p[4200], buf[64];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    FILE *f = fopen(p, "r");
    if (!f)
        return 0;
    size_t v = 0;
    if (fgets(buf, sizeof buf, f)) {
        if (!strncmp(buf, "max", 3))
            v = SIZE_MAX;
        else {
            unsigned long long x = strtoull(buf, NULL, 10);
            v = x >= (1ull << 62) ? SIZE_MAX : (size_t)x;
        }
    }
    fclose(f);
    return v;
}

size_t shard_cgroup_room(size_t *limit_out)
{
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f)
        return SIZE_MAX;
    char line[4096], v2[4096] = "", v1[4096] = "";
    int have_v2 = 0, have_v1 = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (!strncmp(line, "0::", 3)) {
            snprintf(v2, sizeof v2, "%s", line + 3);
            have_v2 = 1;
        }
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (c1 && c2) {
            *c2 = 0;
            /* the controller list may name several: "memory" alone or "cpu,memory" */
            char *ctl = c1 + 1;
            for (char *t = strtok(ctl, ","); t; t = strtok(NULL, ","))
                if (!strcmp(t, "memory")) {
                    snprintf(v1, sizeof v1, "%s", c2 + 1);
                    have_v1 = 1;
                }
        }
    }
    fclose(f);
    /* v1 when a memory hierarchy is mounted there, else v2 (unified). */
    const char *base = have_v1 ? "/sys/fs/cgroup/memory" : "/sys/fs/cgroup";
    const char *lim_f = have_v1 ? "memory.limit_in_bytes" : "memory.max";
    const char *use_f = have_v1 ? "memory.usage_in_bytes" : "memory.current";
    if (!have_v1 && !have_v2)
        return SIZE_MAX;
    char dir[4200];
    snprintf(dir, sizeof dir, "%s%s", base, have_v1 ? v1 : v2);
    if (access(dir, F_OK) != 0) /* a container sees its own cgroup as the root */
        snprintf(dir, sizeof dir, "%s", base);
    size_t room = SIZE_MAX, limit = SIZE_MAX;
    for (;;) {
        size_t lim = cg_read(dir, lim_f), use = cg_read(dir, use_f);
        if (lim && lim != SIZE_MAX) {
            size_t r = lim > use ? lim - use : 0;
            if (r < room) {
                room = r;
                limit = lim;
            }
        }
        char *slash = strrchr(dir, '/');
        if (!slash || (size_t)(slash - dir) < strlen(base))
            break;
        *slash = 0;
    }
    if (limit_out)
        *limit_out = limit;
    return room;
}

int shard_check_fit(int64_t num_classes, int servers, int rank, int dim)
{
    int64_t rows = shard_local_rows(num_classes, servers, rank);
    if (dim <= 0 || rows > (int64_t)(SIZE_MAX / 16 / (size_t)dim))
        return pf_err(-ENOMEM, "shard of %lld rows x D=%d overflows", (long long)rows, dim);
    size_t bytes = shard_bytes(num_classes, servers, rank, dim);
    size_t avail = mem_available();
    size_t need = bytes + (size_t)rows + bytes / 16 + (256u << 20);
    if (avail && need > avail)
        return pf_err(
            -ENOMEM,
            "shard %d/%d needs %.2f GiB (%lld rows x (D=%d x 8 + 1) bytes) + margin, but MemAvailable is "
            "%.2f GiB: use more servers or a smaller num_classes",
            rank, servers, (double)(bytes + (size_t)rows) / (1 << 30), (long long)rows, dim,
            (double)avail / (1 << 30));
    size_t limit = SIZE_MAX, room = shard_cgroup_room(&limit);
    if (room != SIZE_MAX && need > room)
        return pf_err(
            -ENOMEM,
            "shard %d/%d needs %.2f GiB (%lld rows x (D=%d x 8 + 1) bytes) + margin, but this process' "
            "memory cgroup (container limit) allows %.2f GiB more (limit %.2f GiB): the kernel would kill "
            "the server when rows are first touched; use more servers, a smaller num_classes, or a "
            "higher memory limit",
            rank, servers, (double)(bytes + (size_t)rows) / (1 << 30), (long long)rows, dim,
            (double)room / (1 << 30), (double)limit / (1 << 30));
    return 0;
}

void shard_destroy(shard *sh)
{
    if (sh->base)
        munmap(sh->base, sh->bytes);
    free(sh->ready);
    memset(sh, 0, sizeof(*sh));
}

int shard_check_ids(const shard *sh, const int64_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int64_t c = ids[i];
        if (c < 0)
            return pf_err(-ERANGE, "id %lld at index %zu is negative", (long long)c, i);
        if (c >= sh->num_classes)
            return pf_err(-ERANGE, "id %lld at index %zu is >= num_classes %lld", (long long)c, i,
                          (long long)sh->num_classes);
        if (c % sh->servers != sh->rank)
            return pf_err(-ERANGE, "id %lld at index %zu belongs to server %lld, not %d", (long long)c, i,
                          (long long)(c % sh->servers), sh->rank);
    }
    return 0;
}

void shard_gather(shard *sh, const int64_t *ids, size_t n, uint32_t dtype, void *out)
{
    const size_t D = (size_t)sh->dim;
    for (size_t i = 0; i < n; i++) {
        const float *src = shard_row(sh, ids[i] / sh->servers);
        if (dtype == PS_DT_FP32) {
            memcpy((float *)out + i * D, src, D * sizeof(float));
        } else if (dtype == PS_DT_FP16) {
            uint16_t *dst = (uint16_t *)out + i * D;
            for (size_t j = 0; j < D; j++)
                dst[j] = ps_f32_to_f16(src[j]);
        } else {
            uint16_t *dst = (uint16_t *)out + i * D;
            for (size_t j = 0; j < D; j++)
                dst[j] = ps_f32_to_bf16(src[j]);
        }
    }
}

void shard_sgd_row(float *w, float *v, const double *g, int dim, double lr, double mu, double wd)
{
    for (int j = 0; j < dim; j++) {
        double wj = w[j];
        double vj = mu * (double)v[j] + (g[j] + wd * wj);
        v[j] = (float)vj;
        w[j] = (float)(wj - lr * vj);
    }
}

uint64_t shard_checksum(shard *sh)
{
    for (int64_t r = 0; r < sh->rows; r++)
        shard_row(sh, r);
    uint64_t h = 0xcbf29ce484222325ull;
    size_t words = (size_t)sh->rows * (size_t)sh->dim / 2; /* 2 floats per 8-byte word */
    const float *parts[2] = {sh->weight, sh->momentum};
    for (int p = 0; p < 2; p++) {
        const uint64_t *w64 = (const uint64_t *)parts[p];
        for (size_t i = 0; i < words; i++)
            h = (h ^ w64[i]) * 0x100000001b3ull;
        if (((size_t)sh->rows * (size_t)sh->dim) & 1) {
            uint32_t last;
            memcpy(&last, parts[p] + (size_t)sh->rows * sh->dim - 1, 4);
            h = (h ^ last) * 0x100000001b3ull;
        }
    }
    return h;
}
