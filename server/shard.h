/* Shard table: the class centers a server owns, with their SGD momentum, in host memory.
 *
 * Interleaved sharding (DESIGN.md §1): server s of S owns class c iff c mod S == s, at local row c div S.
 * Shard s holds ceil((C - s) / S) rows. Weights and momentum are fp32, (rows x D) each, in one
 * page-aligned anonymous mapping (weights first, momentum after, each page-aligned), plus one byte per
 * row (the init map below): memory per identity is 8 * D + 1 bytes plus page rounding.
 *
 * Initial weights: N(0, 0.01^2) drawn by a counter-based generator keyed by (seed, c), so the content
 * of row c does not depend on S. For row c, with splitmix64(x) the standard SplitMix64 finaliser
 * (z = x + 0x9E3779B97F4A7C15; z = (z ^ z>>30) * 0xBF58476D1CE4E5B9; z = (z ^ z>>27) * 0x94D049BB133111EB;
 * z ^ z>>31):
 *   k = splitmix64(splitmix64(seed) ^ c);  for pair p = 0 .. ceil(D/2)-1:
 *   a = splitmix64(k + 2p), b = splitmix64(k + 2p + 1), u1 = ((a >> 11) + 1) * 2^-53, u2 = (b >> 11) * 2^-53,
 *   r = sqrt(-2 ln u1); w[2p] = 0.01 r cos(2 pi u2); w[2p+1] = 0.01 r sin(2 pi u2)   (Box-Muller, in double,
 *   rounded to float). Momentum starts at 0.
 * Rows are generated on first access (a pull or a push of that row, or shard_checksum), tracked by one
 * byte per row, so start-up costs only the page population of the mapping, not C x D Box-Muller draws;
 * the content is the same as an eager init. Not thread-safe per row: callers never touch one row from two
 * threads at once (the server's apply threads own disjoint rows; gathers run while no apply runs). */
#ifndef PFCPS_SERVER_SHARD_H
#define PFCPS_SERVER_SHARD_H

#include <stddef.h>
#include <stdint.h>

typedef struct shard {
    int64_t num_classes; /* C */
    int servers, rank;   /* S, s */
    int dim;             /* D */
    int64_t rows;        /* local rows */
    float *weight;       /* rows x D */
    float *momentum;     /* rows x D */
    void *base;          /* the mapping */
    size_t bytes;        /* mapping length */
    uint64_t seed;       /* init generator key */
    uint8_t *ready;      /* [rows]: 1 once the row's initial value was generated */
} shard;

/* Local rows of shard s: ceil((C - s) / S), 0 when s >= C. */
int64_t shard_local_rows(int64_t num_classes, int servers, int rank);

/* Bytes the shard will map: 2 page-rounded regions of rows x D x 4 bytes. */
size_t shard_bytes(int64_t num_classes, int servers, int rank, int dim);

/* Allocates shard `rank` of `servers` for C classes of dimension D. With `prefault`, writes every page
 * with `threads` threads so the memory is backed before serving (costly where page faults are slow: 16 s
 * for 4 GiB in this sandbox); without, pages are backed on first touch. Refuses with -ENOMEM and a message
 * (bytes needed vs MemAvailable) when the shard plus a safety margin (1/16 + 256 MiB) would not fit in
 * MemAvailable; -EINVAL for bad sizes. */
int shard_create(shard *sh, int64_t num_classes, int servers, int rank, int dim, uint64_t seed, int threads,
                 int prefault);

void shard_destroy(shard *sh);

/* Bytes this process may still allocate under its memory cgroup (v1 memory.limit_in_bytes - usage, or v2
 * memory.max - memory.current, the smallest over the cgroup and its ancestors), SIZE_MAX when no limit
 * applies; *limit_out (may be NULL) gets the limit that binds. A container's limit is invisible to
 * MemAvailable, which is why the fit check asks both. */
size_t shard_cgroup_room(size_t *limit_out);

/* The fit check shard_create does, alone: 0, or -ENOMEM with the message (bytes needed and MemAvailable, or
 * the cgroup's room and limit). */
int shard_check_fit(int64_t num_classes, int servers, int rank, int dim);

/* The initial value of row c (D floats) per the formula above. */
void shard_init_row(uint64_t seed, int64_t c, int dim, float *row);

/* Checks that every id is a class of this shard. Returns 0, or -ERANGE naming the first bad id (negative,
 * >= C, or c mod S != s) and its index. */
int shard_check_ids(const shard *sh, const int64_t *ids, size_t n);

/* Weight row of local row r (generated first if never touched); its momentum is at the same offset. */
float *shard_row(shard *sh, int64_t lrow);

/* Copies rows of classes ids[0..n) into out (n x D) in wire dtype `dtype` (ps_dtype). Ids must be valid. */
void shard_gather(shard *sh, const int64_t *ids, size_t n, uint32_t dtype, void *out);

/* One PyTorch SGD step (torch.optim.SGD, momentum mu, weight_decay wd, dampening 0, no nesterov) on one
 * row of D elements, computed in double and stored as float:
 *   v = mu * v + (g + wd * w);  w = w - lr * v */
void shard_sgd_row(float *w, float *v, const double *g, int dim, double lr, double mu, double wd);

/* (Generates every row not yet generated, then) a 64-bit FNV-1a-style hash over the weights then the
 * momentum, 8 bytes at a time (h = (h ^ word) * 0x100000001b3, h0 = 0xcbf29ce484222325). */
uint64_t shard_checksum(shard *sh);

#endif
