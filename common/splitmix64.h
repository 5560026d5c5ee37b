/* SplitMix64's output function (Steele, Lea, Flood, "Fast splittable pseudorandom number generators",
 * OOPSLA 2014; the constants of Vigna's splitmix64.c): a counter-based hash, so a value drawn for index i
 * depends on (seed, i) only. The server's row initialiser, the CPU and the CUDA dropout masks, the
 * model's initialiser and the image augmentation draw through this one definition, so that the devices'
 * streams agree bit for bit. (The class-center sampler, worker/head/sample.c, mixes with the finaliser
 * alone.) Usable from C and from CUDA device code. */
#ifndef PFCPS_COMMON_SPLITMIX64_H
#define PFCPS_COMMON_SPLITMIX64_H

#include <stdint.h>

#ifdef __CUDACC__
#define PF_HOST_DEVICE __host__ __device__
#else
#define PF_HOST_DEVICE
#endif

/* The finaliser of SplitMix64 applied to x + golden gamma: splitmix64(x) is the generator's output for
 * state x. */
static inline PF_HOST_DEVICE uint64_t splitmix64(uint64_t x)
{
    uint64_t z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

#endif
