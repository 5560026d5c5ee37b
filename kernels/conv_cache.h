/* Shape-keyed cache of convolution plans, shared by the devices (CPU oneDNN primitives, cuDNN
 * descriptors and algorithms, fp32 and half): one entry per ops_conv_shape, created on first use
 * with its forward parts, its backward parts added the first time a backward asks for them.
 * The entry is the device's own (void *); the device supplies how to build and release it. Plain
 * C, usable from C++ (nvcc) through extern "C". */
#ifndef PFCPS_KERNELS_CONV_CACHE_H
#define PFCPS_KERNELS_CONV_CACHE_H

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How a device makes and releases its entries. dev is the device context given to conv_cache_get. */
typedef struct conv_cache_fns {
    size_t entry_size; /* the cache allocates each entry zeroed, this many bytes */
    /* Fills a new (zeroed) entry for shape s with what a forward needs. */
    int (*build_fwd)(void *dev, void *entry, const ops_conv_shape *s);
    /* Adds to a built entry what a backward needs. */
    int (*build_bwd)(void *dev, void *entry);
    /* Releases what the build functions made (also after one of them failed); not the entry itself. */
    void (*release)(void *entry);
    const char *what; /* error context, e.g. "cuDNN conv": "<what> B=.. C=.. HxW OC=.. ..." */
} conv_cache_fns;

typedef struct conv_cache_slot {
    ops_conv_shape s;
    void *entry;
    int has_bwd;
} conv_cache_slot;

/* Zero-initialized is empty. */
typedef struct conv_cache {
    conv_cache_slot *v;
    int n, cap;
} conv_cache;

/* 0 when s is what ops_conv_shape_init makes of its sizes (OH, OW included); else -EINVAL with the
 * reason ("<prefix>conv shape: ..." when only OH/OW disagree). */
int conv_shape_check(const ops_conv_shape *s, const char *prefix);

/* *out = the entry for shape s (with its backward parts when need_bwd), found or created (after
 * conv_shape_check). Returns 0 or a negative errno with pf_err's message (a failed creation leaves
 * nothing cached and its message wrapped with the shape). */
int conv_cache_get(conv_cache *cc, const conv_cache_fns *fns, void *dev, const ops_conv_shape *s,
                   int need_bwd, void **out);

/* Releases and frees every entry and the cache's array; the cache is empty again. */
void conv_cache_clear(conv_cache *cc, const conv_cache_fns *fns);

#ifdef __cplusplus
}
#endif

#endif
