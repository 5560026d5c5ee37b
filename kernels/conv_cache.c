/* Shape-keyed convolution plan cache (kernels/conv_cache.h). */
#include "kernels/conv_cache.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"

int conv_shape_check(const ops_conv_shape *s, const char *prefix)
{
    ops_conv_shape chk;
    int rc = ops_conv_shape_init(&chk, s->B, s->C, s->H, s->W, s->OC, s->K, s->stride, s->pad, s->groups);
    if (rc)
        return rc;
    if (chk.OH != s->OH || chk.OW != s->OW)
        return pf_err(-EINVAL, "%sconv shape: OH/OW not derived (use ops_conv_shape_init)", prefix);
    return 0;
}

int conv_cache_get(conv_cache *cc, const conv_cache_fns *fns, void *dev, const ops_conv_shape *s,
                   int need_bwd, void **out)
{
    for (int i = 0; i < cc->n; i++) {
        conv_cache_slot *sl = &cc->v[i];
        if (!memcmp(&sl->s, s, sizeof *s)) {
            if (need_bwd && !sl->has_bwd) {
                int rc = fns->build_bwd(dev, sl->entry);
                if (rc)
                    return rc;
                sl->has_bwd = 1;
            }
            *out = sl->entry;
            return 0;
        }
    }
    int rc = conv_shape_check(s, "");
    if (rc)
        return rc;
    if (cc->n == cc->cap) {
        int cap = cc->cap ? 2 * cc->cap : 32;
        conv_cache_slot *n = realloc(cc->v, (size_t)cap * sizeof *n);
        if (!n)
            return pf_err(-ENOMEM, "conv cache: out of memory");
        cc->v = n;
        cc->cap = cap;
    }
    void *e = calloc(1, fns->entry_size);
    if (!e)
        return pf_err(-ENOMEM, "conv cache: out of memory");
    if ((rc = fns->build_fwd(dev, e, s)) || (need_bwd && (rc = fns->build_bwd(dev, e)))) {
        fns->release(e);
        free(e);
        return pf_err_wrap(rc, "%s B=%d C=%d %dx%d OC=%d K=%d stride %d groups %d", fns->what, s->B, s->C,
                           s->H, s->W, s->OC, s->K, s->stride, s->groups);
    }
    cc->v[cc->n++] = (conv_cache_slot){.s = *s, .entry = e, .has_bwd = need_bwd != 0};
    *out = e;
    return 0;
}

void conv_cache_clear(conv_cache *cc, const conv_cache_fns *fns)
{
    for (int i = 0; i < cc->n; i++) {
        fns->release(cc->v[i].entry);
        free(cc->v[i].entry);
    }
    free(cc->v);
    memset(cc, 0, sizeof *cc);
}
