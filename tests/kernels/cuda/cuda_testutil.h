/* Device buffers for the CUDA device tests (kernels/cuda/cuda_ops.h's memory calls; also on the
 * emulated device of cuda_emu_device.cpp): upload, NaN-poisoned output, download. A failure DIEs. */
#ifndef PFCPS_TESTS_KERNELS_CUDA_CUDA_TESTUTIL_H
#define PFCPS_TESTS_KERNELS_CUDA_CUDA_TESTUTIL_H

#include "kernels/cuda/cuda_ops.h"
#include "tests/check.h"

/* Device copy of bytes bytes of host memory. */
static inline void *dev_up(const void *h, size_t bytes)
{
    void *d;
    if (cuda_malloc(&d, bytes) || (bytes && cuda_h2d(d, h, bytes)))
        DIE("device upload of %zu bytes", bytes);
    return d;
}

/* Device copy of a host array (n floats). */
static inline float *dup_dev(const float *h, size_t n)
{
    return (float *)dev_up(h, n * sizeof(float));
}

/* Device buffer of n floats, poisoned with NaN. */
static inline float *nan_dev(size_t n)
{
    void *d;
    if (cuda_malloc(&d, n * sizeof(float)) || cuda_fill_f32(d, NAN, n))
        DIE("device alloc of %zu floats", n);
    return (float *)d;
}

/* Host copy (xmalloc'd) of n device floats, after the device is synchronized. */
static inline float *dl(const float *d, size_t n)
{
    float *h = (float *)xmalloc(n * sizeof *h);
    if (cuda_sync() || cuda_d2h(h, d, n * sizeof(float)))
        DIE("device download of %zu floats", n);
    return h;
}

#endif
