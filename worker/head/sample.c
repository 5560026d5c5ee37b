/* Class-center sampling: see sample.h. */
#include "worker/head/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

__extension__ typedef unsigned __int128 u128;

/* splitmix64 finalizer (Steele, Lea, Flood 2014). */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t sample_key(uint64_t seed, int64_t step, int rank)
{
    uint64_t k = mix64(seed + 0x9e3779b97f4a7c15ULL);
    k = mix64(k ^ ((uint64_t)step + 0x632be59bd9b4e019ULL));
    k = mix64(k ^ ((uint64_t)(uint32_t)rank + 0x85157af5ULL));
    return k;
}

uint64_t sample_bits(uint64_t key, uint64_t counter)
{
    return mix64(key + (counter + 1) * 0x9e3779b97f4a7c15ULL);
}

/* Uniform integer in [0, bound) (bound > 0), Lemire's multiply-shift with rejection; advances *ctr. */
static uint64_t uniform_below(uint64_t key, uint64_t *ctr, uint64_t bound)
{
    u128 m = (u128)sample_bits(key, (*ctr)++) * bound;
    uint64_t lo = (uint64_t)m;
    if (lo < bound) {
        uint64_t thresh = (0 - bound) % bound;
        while (lo < thresh) {
            m = (u128)sample_bits(key, (*ctr)++) * bound;
            lo = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

int64_t sample_partition_size(int64_t num_classes, int world_size, int rank)
{
    if (num_classes <= 0 || world_size < 1 || rank < 0 || rank >= num_classes)
        return 0;
    return (num_classes - rank + world_size - 1) / world_size;
}

int64_t sample_count(double sample_rate, int64_t partition, int ceil_count)
{
    if (partition <= 0 || !(sample_rate > 0))
        return 0;
    if (sample_rate >= 1.0)
        return partition;
    double x = sample_rate * (double)partition;
    int64_t k = (int64_t)x;
    if (ceil_count && x - (double)k > 1e-9)
        k++;
    return k > partition ? partition : k;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Open-addressing set of int64 >= 0 (empty slot = -1), capacity a power of two. */
typedef struct iset {
    int64_t *slot;
    uint64_t mask;
} iset;

static int iset_init(iset *s, int64_t n)
{
    uint64_t cap = 16;
    while (cap < (uint64_t)n * 2)
        cap <<= 1;
    s->slot = malloc(cap * sizeof(int64_t));
    if (!s->slot)
        return -ENOMEM;
    memset(s->slot, 0xff, cap * sizeof(int64_t));
    s->mask = cap - 1;
    return 0;
}

/* Inserts x; returns 1 if newly inserted, 0 if present. */
static int iset_insert(iset *s, int64_t x)
{
    uint64_t h = mix64((uint64_t)x) & s->mask;
    for (;;) {
        if (s->slot[h] == x)
            return 0;
        if (s->slot[h] < 0) {
            s->slot[h] = x;
            return 1;
        }
        h = (h + 1) & s->mask;
    }
}

/* Position of x in the sorted array a[0..n), or -1. */
static int64_t find_sorted(const int64_t *a, int64_t n, int64_t x)
{
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (a[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (lo < n && a[lo] == x) ? lo : -1;
}

/* The argument checks of sample_classes (see sample.h for the errors). */
static int check_args(const sample_args *a, const int64_t *labels, int64_t n)
{
    if (!a || (!labels && n > 0) || n < 0)
        return pf_err(-EINVAL, "sample: NULL argument or negative n");
    if (a->num_classes <= 0)
        return pf_err(-EINVAL, "sample: num_classes %lld is not positive", (long long)a->num_classes);
    if (a->world_size < 1 || a->rank < 0 || a->rank >= a->world_size)
        return pf_err(-EINVAL, "sample: rank %d outside [0, world_size %d)", a->rank, a->world_size);
    if (!(a->sample_rate >= 0 && a->sample_rate <= 1.0))
        return pf_err(-EINVAL, "sample: sample_rate %g outside [0, 1]", a->sample_rate);
    if (a->step < 0)
        return pf_err(-EINVAL, "sample: step %lld is negative", (long long)a->step);
    for (int64_t i = 0; i < n; i++)
        if (labels[i] < 0 || labels[i] >= a->num_classes)
            return pf_err(-ERANGE, "sample: label %lld of row %lld outside [0, num_classes %lld)",
                          (long long)labels[i], (long long)i, (long long)a->num_classes);
    return 0;
}

/* The positives of this partition (labels c with c mod stride == offset) as local indices c div stride into
 * pos (n slots), sorted and unique; returns their count. */
static int64_t unique_positives(const int64_t *labels, int64_t n, int64_t stride, int64_t offset,
                                int64_t *pos)
{
    int64_t np = 0;
    for (int64_t i = 0; i < n; i++)
        if (labels[i] % stride == offset)
            pos[np++] = labels[i] / stride;
    qsort(pos, (size_t)np, sizeof(int64_t), cmp_i64);
    int64_t u = 0;
    for (int64_t i = 0; i < np; i++)
        if (u == 0 || pos[i] != pos[u - 1])
            pos[u++] = pos[i];
    return u;
}

/* Floyd's algorithm (negatives_hash) with the set as a bitmap of [0, pool): dense samples (r >= ~1/256)
 * touch pool / 8 bytes, and a scan of the bitmap gives the subset in order without a sort. Same draws, same
 * subset as the hash-set path. neg (m): the sorted subset. Returns 0 or -ENOMEM. */
static int negatives_bitmap(uint64_t key, int64_t pool, int64_t m, int64_t *neg)
{
    size_t words = (size_t)((pool + 63) / 64);
    uint64_t *bits = calloc(words, sizeof(uint64_t));
    if (!bits)
        return pf_err(-ENOMEM, "sample: out of memory for a bitmap of %lld ids", (long long)pool);
    uint64_t ctr = 0;
    for (int64_t j = pool - m; j < pool; j++) {
        int64_t t = (int64_t)uniform_below(key, &ctr, (uint64_t)j + 1);
        uint64_t bt = 1ull << (t & 63);
        if (bits[t >> 6] & bt)
            bits[j >> 6] |= 1ull << (j & 63); /* j is above every earlier draw: never in the set */
        else
            bits[t >> 6] |= bt;
    }
    int64_t cnt = 0;
    for (size_t w = 0; w < words; w++)
        for (uint64_t b = bits[w]; b; b &= b - 1)
            neg[cnt++] = (int64_t)(w * 64 + (size_t)__builtin_ctzll(b));
    free(bits);
    return 0;
}

/* Floyd's algorithm: a uniform m-subset of [0, pool) in m draws, its set a hash set (memory proportional
 * to m). neg (m): the sorted subset. Returns 0 or -ENOMEM. */
static int negatives_hash(uint64_t key, int64_t pool, int64_t m, int64_t *neg)
{
    iset set;
    if (iset_init(&set, m) < 0)
        return pf_err(-ENOMEM, "sample: out of memory for the hash set of %lld ids", (long long)m);
    uint64_t ctr = 0;
    int64_t cnt = 0;
    for (int64_t j = pool - m; j < pool; j++) {
        int64_t t = (int64_t)uniform_below(key, &ctr, (uint64_t)j + 1);
        int64_t pick = iset_insert(&set, t) ? t : (iset_insert(&set, j), j);
        neg[cnt++] = pick;
    }
    free(set.slot);
    qsort(neg, (size_t)m, sizeof(int64_t), cmp_i64);
    return 0;
}

/* neg (m): a sorted uniform m-subset of [0, pool) drawn from `key` (all of it when m == pool; a bitmap at
 * dense rates, a hash set at sparse ones). Returns 0 or -ENOMEM. */
static int draw_negatives(uint64_t key, int64_t pool, int64_t m, int64_t *neg)
{
    if (m == pool) {
        for (int64_t r = 0; r < m; r++)
            neg[r] = r;
        return 0;
    }
    if (m <= 0)
        return 0;
    return pool / 64 <= 4 * m ? negatives_bitmap(key, pool, m, neg) : negatives_hash(key, pool, m, neg);
}

/* ids (np + m): the sorted global ids of the positives pos (np, local, sorted) and of the negatives neg
 * (m, indices among the non-positive local ids, sorted; rewritten in place to local ids: the r-th
 * non-positive is r + #{j : pos[j] - j <= r}, pos[j] - j non-decreasing), global id = local * stride +
 * offset. */
static void merge_ids(const int64_t *pos, int64_t np, int64_t *neg, int64_t m, int64_t stride, int64_t offset,
                      int64_t *ids)
{
    int64_t pj = 0;
    for (int64_t r = 0; r < m; r++) {
        while (pj < np && pos[pj] - pj <= neg[r])
            pj++;
        neg[r] += pj;
    }
    int64_t ia = 0, ib = 0;
    for (int64_t o = 0; o < np + m; o++) {
        int64_t loc = (ib >= m || (ia < np && pos[ia] < neg[ib])) ? pos[ia++] : neg[ib++];
        ids[o] = loc * stride + offset;
    }
}

int sample_classes(const sample_args *a, const int64_t *labels, int64_t n, int64_t **ids_out, int64_t *k_out,
                   int64_t *labels_local)
{
    *ids_out = NULL;
    *k_out = 0;
    int rc = check_args(a, labels, n);
    if (rc < 0)
        return rc;
    int global = a->mode == SAMPLE_GLOBAL;
    int64_t stride = global ? a->world_size : 1, offset = global ? a->rank : 0;
    int64_t part = global ? sample_partition_size(a->num_classes, a->world_size, a->rank) : a->num_classes;

    int64_t *pos = malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    if (!pos)
        return pf_err(-ENOMEM, "sample: out of memory");
    int64_t np = unique_positives(labels, n, stride, offset, pos);
    int64_t k = sample_count(a->sample_rate, part, a->ceil_count);
    if (k < np)
        k = np;
    int64_t m = k - np;       /* negatives to draw */
    int64_t pool = part - np; /* non-positive ids available */
    int64_t *ids = malloc((size_t)(k > 0 ? k : 1) * sizeof(int64_t));
    int64_t *neg = malloc((size_t)(m > 0 ? m : 1) * sizeof(int64_t));
    if (!ids || !neg)
        rc = pf_err(-ENOMEM, "sample: out of memory for %lld ids", (long long)k);
    else
        rc = draw_negatives(sample_key(a->seed, a->step, a->rank), pool, m, neg);
    if (rc == 0)
        merge_ids(pos, np, neg, m, stride, offset, ids);
    free(pos);
    free(neg);
    if (rc < 0) {
        free(ids);
        return rc;
    }
    if (labels_local)
        for (int64_t i = 0; i < n; i++)
            labels_local[i] = (labels[i] % stride == offset) ? find_sorted(ids, k, labels[i]) : -1;
    *ids_out = ids;
    *k_out = k;
    return 0;
}
