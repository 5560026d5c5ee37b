/* libFuzzer target for common/torch_pt.c. An input starting with "PK" is a whole torch.save archive
 * (tp_open_buffer, then every tensor of its state_dict, or of its state_dict_backbone, read whole when it is at
 * most 1 MiB, and its last row); any other input is a data.pkl alone (tp_parse_pickle). A refusal must carry a
 * message and return nothing; a parsed pickle must hold only the kinds of torch_pt.h, its strings
 * NUL-terminated at their length, its containers' depths one more than their deepest element and at most
 * TP_MAX_DEPTH, every element of a container placed in it sealed, its tensors' shapes and strides
 * non-negative. Any crash, sanitizer report or leak is a bug. Seeds: files torch 1.13 wrote (a model.pt and a
 * checkpoint_gpu_0.pt of a small network, with a transposed view, a real SGD step's state and a PolynomialLR),
 * their data.pkl, and Python's own pickles of plain values at protocols 2 and 4. */
#include "common/err.h"
#include "common/torch_pt.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Checks v and what lies below it, visiting at most *budget values (shared values make a DAG). */
static void walk(const tp_value *v, long *budget)
{
    if (--*budget < 0)
        return;
    switch (v->kind) {
    case TP_NONE:
    case TP_BOOL:
    case TP_INT:
    case TP_FLOAT:
    case TP_GLOBAL:
    case TP_STORAGE:
        if (v->depth != 0)
            abort();
        return;
    case TP_STR:
        if (v->depth != 0 || strlen(v->u.str.s) != v->u.str.len)
            abort();
        return;
    case TP_TENSOR: {
        const tp_tensor *t = tp_tensor_of(v);
        if (t->ndim < 0 || t->ndim > TP_MAX_DIMS || t->offset < 0 || t->dtype != t->storage->dtype)
            abort();
        for (int k = 0; k < t->ndim; k++)
            if (t->shape[k] < 0 || t->stride[k] < 0)
                abort();
        return;
    }
    case TP_TUPLE:
    case TP_LIST:
    case TP_DICT: {
        uint32_t deepest = 0;
        if ((v->kind == TP_DICT && v->u.seq.n % 2) || v->depth < 1 || v->depth > TP_MAX_DEPTH)
            abort();
        for (size_t i = 0; i < v->u.seq.n; i++) {
            const tp_value *x = v->u.seq.v[i];
            if (x->depth + 1 > deepest)
                deepest = x->depth + 1;
            if ((x->kind == TP_LIST || x->kind == TP_DICT) && !x->sealed)
                abort();
            if (v->kind == TP_DICT && i % 2 == 0 && x->kind != TP_STR && x->kind != TP_INT)
                abort();
            walk(x, budget);
        }
        if (v->depth != (deepest > 1 ? deepest : 1))
            abort();
        return;
    }
    default: abort();
    }
}

static void refusal(int rc, const void *out)
{
    if (out || (rc != -EPROTO && rc != -ENOMEM && rc != -EIO) || pf_errmsg()[0] == 0)
        abort(); /* every refusal says why and leaves nothing */
}

static void archive(const uint8_t *data, size_t size)
{
    tp_file *f = NULL;
    int rc = tp_open_buffer(&f, data, size, "fuzz");
    if (rc) {
        refusal(rc, f);
        return;
    }
    long budget = 100000;
    walk(tp_root(f), &budget);
    const tp_value *sd = tp_dict_get(tp_root(f), "state_dict_backbone");
    tp_named *nt;
    int n;
    if (tp_state_dict(sd ? sd : tp_root(f), &nt, &n, "fuzz") == 0) {
        for (int i = 0; i < n; i++) {
            const tp_tensor *t = nt[i].t;
            int64_t numel = tp_tensor_numel(t), rows = t->ndim ? t->shape[0] : 1;
            size_t es = tp_dtype_size(t->dtype);
            if (numel < 0 || (uint64_t)numel > (1u << 20) / es)
                continue;
            unsigned char *buf = malloc((size_t)numel * es + 1);
            if (!buf)
                continue;
            rc = tp_tensor_read(f, t, nt[i].name, buf, (size_t)numel * es);
            if (rc && !pf_errmsg()[0])
                abort();
            if (rows > 0)
                (void)tp_tensor_read_rows(f, t, nt[i].name, rows - 1, 1, buf, (size_t)(numel / rows) * es);
            free(buf);
        }
        free(nt);
    }
    tp_close(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size >= 2 && data[0] == 'P' && data[1] == 'K') {
        archive(data, size);
        return 0;
    }
    tp_pickle *p = NULL;
    int rc = tp_parse_pickle(&p, data, size, "fuzz");
    if (rc) {
        refusal(rc, p);
        return 0;
    }
    const tp_value *r = tp_pickle_root(p);
    long budget = 100000;
    walk(r, &budget);
    tp_named *nt;
    int n;
    if (tp_state_dict(r, &nt, &n, "fuzz") == 0)
        free(nt);
    (void)tp_find(r, "state_optimizer/state/0/momentum_buffer");
    (void)tp_find(r, "0/1/2");
    tp_pickle_free(p);
    return 0;
}
