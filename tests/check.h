/* The assertions and helpers every test program shares, C and C++ (the *_emu tests): CHECK (a failed
 * condition printed with its file and line, counted in `fails`), check (every check printed "ok" or "FAIL",
 * counted in `checks` and `failures`), check_summary, DIE (fatal), the xorshift64 random numbers and the
 * test's seed, checked allocation, random / copied float arrays, and relative L2 errors that fail on an
 * element not written (NaN). All static: each test program has its own state (seed rng_state, counts). */
#ifndef PFCPS_TESTS_CHECK_H
#define PFCPS_TESTS_CHECK_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "common/err.h"
#ifdef __cplusplus
}
#endif

/* ---- random numbers: xorshift64 (rng_state != 0; the test seeds it) ---- */
static uint64_t rng_state __attribute__((unused));

static inline uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static inline int irand(int lo, int hi)
{
    return lo + (int)(rnd() % (uint64_t)(hi - lo + 1));
}
static inline float frand(float lo, float hi)
{
    return lo + (hi - lo) * (float)((rnd() >> 11) * 0x1.0p-53);
}

/* The run's seed, PFCPS_TEST_SEED (decimal) or the time, printed ("seed N (PFCPS_TEST_SEED
 * replays)"); rng_state = the seed mixed (never 0). */
static inline uint64_t test_seed_mixed(void)
{
    const char *e = getenv("PFCPS_TEST_SEED");
    uint64_t seed = e ? strtoull(e, NULL, 10) : (uint64_t)time(NULL);
    printf("seed %llu (PFCPS_TEST_SEED replays)\n", (unsigned long long)seed);
    rng_state = seed * 0x9E3779B97F4A7C15ull | 1;
    return seed;
}

/* The run's seed, PFCPS_TEST_SEED (strtoull base 0) or the time and clock, not printed; rng_state =
 * the seed (1 for 0). */
static inline uint64_t test_seed(void)
{
    const char *se = getenv("PFCPS_TEST_SEED");
    uint64_t seed = se ? strtoull(se, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    rng_state = seed ? seed : 1;
    return seed;
}

/* Fatal test failure: prints FAIL, the message and pf_errmsg(), exits 1. */
#define DIE(...)                                                                                             \
    do {                                                                                                     \
        printf("FAIL: " __VA_ARGS__);                                                                        \
        printf(" (%s)\n", pf_errmsg());                                                                      \
        exit(1);                                                                                             \
    } while (0)

static inline void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        DIE("out of memory");
    return p;
}

/* n floats drawn uniformly in [lo, hi). */
static inline float *frnd(size_t n, float lo, float hi)
{
    float *p = (float *)xmalloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = frand(lo, hi);
    return p;
}

static inline float *fcopy(const float *s, size_t n)
{
    float *p = (float *)xmalloc(n * sizeof *p);
    memcpy(p, s, n * sizeof *p);
    return p;
}

/* ---- the counts: failed CHECKs (fails); check() calls (checks) and their failures (failures) ---- */
static int fails __attribute__((unused)), failures __attribute__((unused)), checks __attribute__((unused));

/* ---- soft assertion: CHECK(cond, fmt, ...) prints the file, line and message of a failed condition and
 * counts it in `fails`; the test's main returns check_summary() ---- */
#define CHECK(cond, ...)                                                                                     \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                      \
            printf(__VA_ARGS__);                                                                             \
            printf("\n");                                                                                    \
            fails++;                                                                                         \
        }                                                                                                    \
    } while (0)

/* Prints PASS or FAILED (count of CHECK and check failures) and returns the test's exit status. */
static inline int check_summary(void)
{
    int n = fails + failures;
    printf(n ? "FAILED (%d)\n" : "PASS\n", n);
    return n ? 1 : 0;
}

/* ---- counted checks: "ok   <message>" / "FAIL <message>" ---- */
static inline void check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void check(int ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%-4s ", ok ? "ok" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    checks++;
    failures += !ok;
}

/* ---- relative L2 error ||a - b|| / ||b|| (||a - b|| when ||b|| == 0) against a float (bf) or a
 * float64 (bd) reference; a NaN in a (an element not written) -> INFINITY ---- */
static inline double rel_l2_of(const float *a, const float *bf, const double *bd, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]))
            return INFINITY;
        double b = bf ? (double)bf[i] : bd[i], e = (double)a[i] - b;
        num += e * e;
        den += b * b;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
static inline double rel_l2(const float *a, const float *b, size_t n)
{
    return rel_l2_of(a, b, NULL, n);
}
static inline double rel_l2_f64(const float *a, const double *b, size_t n)
{
    return rel_l2_of(a, NULL, b, n);
}

#endif
