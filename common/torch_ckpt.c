/* arcface_torch's checkpoint_gpu_<rank>.pt: the progress it records (common/torch_ckpt.h). */
#include "common/torch_ckpt.h"

#include "common/err.h"
#include "common/torch_pt.h"

#include <errno.h>
#include <string.h>

int tpc_rank_of(const char *name)
{
    static const char pre[] = "checkpoint_gpu_";
    if (strncmp(name, pre, sizeof pre - 1) != 0)
        return -1;
    const char *p = name + sizeof pre - 1;
    if (*p < '0' || *p > '9' || (*p == '0' && p[1] != '.'))
        return -1;
    long r = 0;
    while (*p >= '0' && *p <= '9') {
        r = r * 10 + (*p++ - '0');
        if (r >= 65536)
            return -1;
    }
    return strcmp(p, ".pt") == 0 ? (int)r : -1;
}

int tpc_read_progress(const char *path, tpc_progress *out)
{
    memset(out, 0, sizeof *out);
    const char *slash = strrchr(path, '/');
    if (tpc_rank_of(slash ? slash + 1 : path) < 0)
        return 0;
    tp_file *f;
    int rc = tp_open(&f, path);
    if (rc < 0)
        return rc;
    static const char *const keys[2] = {"global_step", "epoch"};
    int64_t v[2];
    for (int k = 0; k < 2 && rc == 0; k++) {
        const tp_value *x = tp_find(tp_root(f), keys[k]);
        if (!x || x->kind != TP_INT || x->u.i < 0)
            rc = pf_err(-EINVAL, "%s: '%s' is %s, not an int >= 0 (arcface_torch's checkpoint_gpu_<rank>.pt)",
                        path, keys[k], !x ? "missing" : x->kind == TP_INT ? "negative" : tp_kind_name(x->kind));
        else
            v[k] = x->u.i;
    }
    out->lr = -1; /* unknown: a file without state_optimizer */
    if (rc == 0 && tp_find(tp_root(f), "state_optimizer")) {
        const tp_value *x = tp_find(tp_root(f), "state_optimizer/param_groups/0/lr");
        if (!x || x->kind != TP_FLOAT || !(x->u.f >= 0))
            rc = pf_err(-EINVAL, "%s: 'state_optimizer/param_groups/0/lr' is %s, not a float >= 0", path,
                        !x ? "missing" : x->kind == TP_FLOAT ? "negative or NaN" : tp_kind_name(x->kind));
        else
            out->lr = x->u.f;
    }
    tp_close(f);
    if (rc < 0)
        return rc;
    out->present = 1;
    out->global_step = v[0];
    out->epoch = v[1];
    return 0;
}
