/* Overflow-checked sizes: products and sums of counts read from files (header fields, tensor shapes, payload
 * lengths) before they size an allocation, a read or a comparison. Each returns 0 with the exact result in
 * *out, or -EOVERFLOW when the true result does not fit the type, with *out set to the type's maximum (a
 * saturated value: never a wrapped small one, and always written, so a message may print it); callers turn
 * that into a message naming the file and the fields. GCC / clang builtins (__builtin_*_overflow). */
#ifndef PFCPS_COMMON_CHECKED_H
#define PFCPS_COMMON_CHECKED_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

/* *out = a * b (uint64_t). Returns 0, or -EOVERFLOW (*out = UINT64_MAX) when a * b > UINT64_MAX. */
static inline int pf_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    if (__builtin_mul_overflow(a, b, out)) {
        *out = UINT64_MAX;
        return -EOVERFLOW;
    }
    return 0;
}

/* *out = a + b (uint64_t). Returns 0, or -EOVERFLOW (*out = UINT64_MAX) when a + b > UINT64_MAX. */
static inline int pf_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    if (__builtin_add_overflow(a, b, out)) {
        *out = UINT64_MAX;
        return -EOVERFLOW;
    }
    return 0;
}

/* *out = a * b * c (uint64_t), e.g. rows x D x sizeof(float). Returns 0, or -EOVERFLOW (*out = UINT64_MAX)
 * when any partial product exceeds UINT64_MAX. */
static inline int pf_mul3_u64(uint64_t a, uint64_t b, uint64_t c, uint64_t *out)
{
    uint64_t ab;
    if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, out)) {
        *out = UINT64_MAX;
        return -EOVERFLOW;
    }
    return 0;
}

/* *out = a * b (size_t: a byte count to allocate or read). Returns 0, or -EOVERFLOW (*out = SIZE_MAX) when
 * a * b > SIZE_MAX. */
static inline int pf_mul_size(size_t a, size_t b, size_t *out)
{
    if (__builtin_mul_overflow(a, b, out)) {
        *out = SIZE_MAX;
        return -EOVERFLOW;
    }
    return 0;
}

/* *out = a + b (size_t). Returns 0, or -EOVERFLOW (*out = SIZE_MAX) when a + b > SIZE_MAX. */
static inline int pf_add_size(size_t a, size_t b, size_t *out)
{
    if (__builtin_add_overflow(a, b, out)) {
        *out = SIZE_MAX;
        return -EOVERFLOW;
    }
    return 0;
}

/* *out = a * b * c (size_t). Returns 0, or -EOVERFLOW (*out = SIZE_MAX) when any partial product exceeds
 * SIZE_MAX. */
static inline int pf_mul3_size(size_t a, size_t b, size_t c, size_t *out)
{
    size_t ab;
    if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, out)) {
        *out = SIZE_MAX;
        return -EOVERFLOW;
    }
    return 0;
}

/* The size_t value of a uint64_t count: 0 with *out, or -EOVERFLOW (*out = SIZE_MAX) when it exceeds
 * SIZE_MAX (32-bit hosts). */
static inline int pf_u64_to_size(uint64_t v, size_t *out)
{
    if (v > (uint64_t)SIZE_MAX) {
        *out = SIZE_MAX;
        return -EOVERFLOW;
    }
    *out = (size_t)v;
    return 0;
}

#endif
