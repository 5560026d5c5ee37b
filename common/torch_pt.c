/* torch.save files: the allow-list pickle interpreter, the zip archive (libzip) and the tensors' bytes
 * (rules and limits in torch_pt.h). */
#include "common/torch_pt.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zip.h>

#include "common/checked.h"
#include "common/err.h"
#include "common/file.h"
#include "common/pickle.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "torch_pt.c copies torch's little-endian storages as host memory"
#endif

size_t tp_dtype_size(tp_dtype d)
{
    switch (d) {
    case TP_F32:
    case TP_I32: return 4;
    case TP_F64:
    case TP_I64: return 8;
    case TP_F16:
    case TP_BF16: return 2;
    default: return 0;
    }
}

const char *tp_dtype_name(tp_dtype d)
{
    switch (d) {
    case TP_F32: return "F32";
    case TP_F64: return "F64";
    case TP_F16: return "F16";
    case TP_BF16: return "BF16";
    case TP_I64: return "I64";
    case TP_I32: return "I32";
    default: return "?";
    }
}

const char *tp_kind_name(tp_kind k)
{
    switch (k) {
    case TP_NONE: return "None";
    case TP_BOOL: return "bool";
    case TP_INT: return "int";
    case TP_FLOAT: return "float";
    case TP_STR: return "str";
    case TP_TUPLE: return "tuple";
    case TP_LIST: return "list";
    case TP_DICT: return "dict";
    case TP_GLOBAL: return "global";
    case TP_TENSOR: return "tensor";
    case TP_STORAGE: return "storage";
    default: return "?";
    }
}

/* ---- data.pkl on the pickle interpreter ---- */

enum { G_ODICT = 1, G_REBUILD, G_PARAM, G_STORAGE };

static const pk_global tp_globals[] = {
    {"collections", "OrderedDict", "collections.OrderedDict", G_ODICT, 0},
    {"torch._utils", "_rebuild_tensor_v2", "torch._utils._rebuild_tensor_v2", G_REBUILD, 0},
    {"torch._utils", "_rebuild_parameter", "torch._utils._rebuild_parameter", G_PARAM, 0},
    {"torch", "FloatStorage", "torch.FloatStorage", G_STORAGE, TP_F32},
    {"torch", "DoubleStorage", "torch.DoubleStorage", G_STORAGE, TP_F64},
    {"torch", "HalfStorage", "torch.HalfStorage", G_STORAGE, TP_F16},
    {"torch", "BFloat16Storage", "torch.BFloat16Storage", G_STORAGE, TP_BF16},
    {"torch", "LongStorage", "torch.LongStorage", G_STORAGE, TP_I64},
    {"torch", "IntStorage", "torch.IntStorage", G_STORAGE, TP_I32},
    {"torch.cuda", "FloatStorage", "torch.cuda.FloatStorage", G_STORAGE, TP_F32},
    {"torch.cuda", "DoubleStorage", "torch.cuda.DoubleStorage", G_STORAGE, TP_F64},
    {"torch.cuda", "HalfStorage", "torch.cuda.HalfStorage", G_STORAGE, TP_F16},
    {"torch.cuda", "BFloat16Storage", "torch.cuda.BFloat16Storage", G_STORAGE, TP_BF16},
    {"torch.cuda", "LongStorage", "torch.cuda.LongStorage", G_STORAGE, TP_I64},
    {"torch.cuda", "IntStorage", "torch.cuda.IntStorage", G_STORAGE, TP_I32},
};

struct tp_pickle {
    pk_doc *doc;
};

/* A storage as the interpreter keeps it: every BINPERSID's, in a list (to check one key's references agree).
 */
typedef struct stor_node {
    tp_storage s;
    struct stor_node *next;
} stor_node;

typedef struct tp_parse_state {
    stor_node *stor;
    size_t nstor;
} tp_parse_state;

/* A value of one of torch_pt's own kinds (a tensor, a storage) holding p. */
static int new_obj(pk_machine *m, tp_kind kind, const void *p, pk_value **out)
{
    int rc = pk_new(m, (uint8_t)kind, out);
    if (rc)
        return rc;
    (*out)->u.obj.p = p;
    (*out)->u.obj.name = tp_kind_name(kind);
    (*out)->u.obj.aname = kind == TP_TENSOR ? "a tensor" : "a storage";
    return 0;
}

const tp_tensor *tp_tensor_of(const tp_value *v)
{
    return v && v->kind == TP_TENSOR ? v->u.obj.p : NULL;
}

const tp_storage *tp_storage_of(const tp_value *v)
{
    return v && v->kind == TP_STORAGE ? v->u.obj.p : NULL;
}

static int int_arg(pk_machine *m, const tp_value *v, const char *what_arg, int64_t *out)
{
    if (v->kind != TP_INT || v->u.i < 0)
        return pk_fail(m, "_rebuild_tensor_v2: %s is %s%s, not a non-negative int", what_arg, pk_a_kind(v),
                       v->kind == TP_INT ? " below 0" : "");
    *out = v->u.i;
    return 0;
}

/* _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata]). */
static int rebuild_tensor(pk_machine *m, const tp_value *args, tp_value **out)
{
    tp_value *const *a = args->u.seq.v;
    size_t n = args->u.seq.n;
    if (n != 6 && n != 7)
        return pk_fail(m, "_rebuild_tensor_v2 with %zu arguments (expected 6 or 7)", n);
    if (a[0]->kind != TP_STORAGE || a[2]->kind != TP_TUPLE || a[3]->kind != TP_TUPLE ||
        a[4]->kind != TP_BOOL || a[5]->kind != TP_DICT || (n == 7 && a[6]->kind != TP_DICT))
        return pk_fail(
            m,
            "_rebuild_tensor_v2(%s, %s, %s, %s, %s, %s%s%s): expected (storage, int, tuple, tuple, "
            "bool, dict[, dict])",
            pk_kind_name(a[0]), pk_kind_name(a[1]), pk_kind_name(a[2]), pk_kind_name(a[3]),
            pk_kind_name(a[4]), pk_kind_name(a[5]), n == 7 ? ", " : "", n == 7 ? pk_kind_name(a[6]) : "");
    size_t nd = a[2]->u.seq.n;
    if (nd > TP_MAX_DIMS || a[3]->u.seq.n != nd)
        return pk_fail(m, "_rebuild_tensor_v2: %zu sizes and %zu strides (equal, at most %d)", nd,
                       a[3]->u.seq.n, TP_MAX_DIMS);
    tp_tensor *t;
    int rc = pk_alloc(m, sizeof *t, (void **)&t);
    if (rc || (rc = int_arg(m, a[1], "storage_offset", &t->offset)))
        return rc;
    for (size_t k = 0; k < nd; k++)
        if ((rc = int_arg(m, a[2]->u.seq.v[k], "a size", &t->shape[k])) ||
            (rc = int_arg(m, a[3]->u.seq.v[k], "a stride", &t->stride[k])))
            return rc;
    t->storage = tp_storage_of(a[0]);
    t->dtype = t->storage->dtype;
    t->ndim = (int)nd;
    t->requires_grad = (int)a[4]->u.i;
    return new_obj(m, TP_TENSOR, t, out);
}

/* REDUCE of an allowed global with a tuple: OrderedDict(), _rebuild_tensor_v2(...), _rebuild_parameter(...).
 */
static int tp_reduce(pk_machine *m, void *user, const tp_value *f, const tp_value *args, tp_value **out)
{
    (void)user;
    int rc;
    switch (f->u.g.id) {
    case G_ODICT:
        if (args->u.seq.n != 0)
            return pk_fail(m, "collections.OrderedDict with %zu arguments (only OrderedDict())",
                           args->u.seq.n);
        if ((rc = pk_new(m, PK_DICT, out)))
            return rc;
        (*out)->ordered = 1;
        return 0;
    case G_REBUILD: return rebuild_tensor(m, args, out);
    case G_PARAM: {
        tp_value *const *a = args->u.seq.v;
        if (args->u.seq.n != 3 || a[0]->kind != TP_TENSOR || a[1]->kind != TP_BOOL || a[2]->kind != TP_DICT)
            return pk_fail(m, "_rebuild_parameter: expected (tensor, bool, dict)");
        tp_tensor *t;
        if ((rc = pk_alloc(m, sizeof *t, (void **)&t)))
            return rc;
        *t = *tp_tensor_of(a[0]);
        t->requires_grad = (int)a[1]->u.i;
        return new_obj(m, TP_TENSOR, t, out);
    }
    default:
        return pk_fail(m, "REDUCE of %s not allowed (only of OrderedDict and the tensor rebuilders)",
                       f->u.g.name);
    }
}

/* BINPERSID: torch's storage reference ('storage', <storage type>, key, location, numel). */
static int tp_persid(pk_machine *m, void *user, const tp_value *pid, tp_value **out)
{
    tp_parse_state *ps = user;
    tp_value *const *a = pid->u.seq.v;
    if (pid->kind != TP_TUPLE || pid->u.seq.n != 5 || a[0]->kind != TP_STR ||
        strcmp(a[0]->u.str.s, "storage") || a[1]->kind != TP_GLOBAL || a[1]->u.g.id != G_STORAGE ||
        a[2]->kind != TP_STR || a[3]->kind != TP_STR || a[4]->kind != TP_INT || a[4]->u.i < 0)
        return pk_fail(m,
                       "BINPERSID of %s that is not ('storage', <torch storage type>, key, location, numel)",
                       pk_a_kind(pid));
    tp_dtype dtype = (tp_dtype)a[1]->u.g.arg;
    uint64_t bytes;
    if (pf_mul_u64((uint64_t)a[4]->u.i, tp_dtype_size(dtype), &bytes) < 0 || bytes > INT64_MAX)
        return pk_fail(m, "storage '%s' of %lld elements overflows", a[2]->u.str.s, (long long)a[4]->u.i);
    stor_node *s;
    int rc = pk_alloc(m, sizeof *s, (void **)&s);
    if (rc)
        return rc;
    s->s = (tp_storage){.dtype = dtype, .key = a[2]->u.str.s, .location = a[3]->u.str.s, .numel = a[4]->u.i};
    s->next = ps->stor;
    ps->stor = s;
    ps->nstor++;
    return new_obj(m, TP_STORAGE, &s->s, out);
}

/* BUILD: obj.__setstate__(state), allowed on an OrderedDict with a dict (its attributes) or None. */
static int tp_build(pk_machine *m, void *user, tp_value *obj, tp_value *state)
{
    (void)user;
    if (obj->kind != TP_DICT || !obj->ordered || (state->kind != TP_DICT && state->kind != TP_NONE))
        return pk_fail(m, "BUILD on %s with %s (only on an OrderedDict, with a dict or None)",
                       obj->ordered ? "an OrderedDict" : pk_a_kind(obj), pk_a_kind(state));
    if (obj->sealed)
        return pk_fail(m, "BUILD on an OrderedDict placed inside another value");
    if (state->kind == TP_DICT)
        state->sealed = 1;
    return 0;
}

static int cmp_storage(const void *a, const void *b)
{
    return strcmp((*(tp_storage *const *)a)->key, (*(tp_storage *const *)b)->key);
}

/* A storage key names one storage: every reference to it has the same dtype and numel. */
static int check_storages(const tp_parse_state *ps, const char *what)
{
    if (ps->nstor < 2)
        return 0;
    const tp_storage **v = malloc(ps->nstor * sizeof *v);
    if (!v)
        return pf_err(-ENOMEM, "%s: out of memory checking the pickle's storages", what);
    size_t n = 0;
    for (const stor_node *s = ps->stor; s; s = s->next)
        v[n++] = &s->s;
    qsort(v, n, sizeof *v, cmp_storage);
    int rc = 0;
    for (size_t i = 1; i < n && !rc; i++) {
        const tp_storage *a = v[i - 1], *b = v[i];
        if (!strcmp(a->key, b->key) && (a->dtype != b->dtype || a->numel != b->numel)) {
            char k[80];
            rc = pf_err(-EPROTO, "%s: pickle: storage '%s' is referenced as %lld x %s and as %lld x %s", what,
                        pk_printable(a->key, strlen(a->key), k, sizeof k), (long long)a->numel,
                        tp_dtype_name(a->dtype), (long long)b->numel, tp_dtype_name(b->dtype));
        }
    }
    free(v);
    return rc;
}

int tp_parse_pickle(tp_pickle **out, const void *buf, size_t size, const char *what)
{
    *out = NULL;
    tp_parse_state ps = {0};
    const pk_config cfg = {
        .what = what,
        .opcodes = "PROTO FRAME STOP MARK EMPTY_DICT EMPTY_LIST EMPTY_TUPLE BINUNICODE SHORT_BINUNICODE "
                   "BININT BININT1 BININT2 LONG1 BINFLOAT NEWTRUE NEWFALSE NONE TUPLE TUPLE1 TUPLE2 TUPLE3 "
                   "SETITEM SETITEMS APPEND APPENDS BINPUT LONG_BINPUT MEMOIZE BINGET LONG_BINGET GLOBAL "
                   "REDUCE BINPERSID BUILD",
        .globals = tp_globals,
        .nglobals = sizeof tp_globals / sizeof *tp_globals,
        .globals_hint = "only collections.OrderedDict, torch._utils._rebuild_tensor_v2 / _rebuild_parameter "
                        "and torch's storage types",
        .reduce = tp_reduce,
        .persid = tp_persid,
        .build = tp_build,
        .user = &ps,
        .max_depth = TP_MAX_DEPTH,
        .max_str = TP_MAX_STR,
        .max_items = TP_MAX_ITEMS,
        .max_memo = TP_MAX_MEMO,
        .max_values = SIZE_MAX,
        .mem_fixed = TP_MEM_FIXED,
        .mem_per_byte = TP_MEM_PER_BYTE,
    };
    tp_pickle *p = calloc(1, sizeof *p);
    if (!p)
        return pf_err(-ENOMEM, "%s: out of memory", what);
    int rc = pk_parse(&p->doc, buf, size, &cfg);
    if (!rc)
        rc = check_storages(&ps, what);
    if (rc) {
        tp_pickle_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

const tp_value *tp_pickle_root(const tp_pickle *p)
{
    return pk_root(p->doc);
}

void tp_pickle_free(tp_pickle *p)
{
    if (!p)
        return;
    pk_free(p->doc);
    free(p);
}

/* ---- looking values up ---- */

const tp_value *tp_dict_get(const tp_value *d, const char *key)
{
    if (!d || d->kind != TP_DICT)
        return NULL;
    for (size_t i = 0; i < d->u.seq.n; i += 2) {
        const tp_value *k = d->u.seq.v[i];
        if (k->kind == TP_STR && !strcmp(k->u.str.s, key))
            return d->u.seq.v[i + 1];
    }
    return NULL;
}

const tp_value *tp_dict_get_int(const tp_value *d, int64_t key)
{
    if (!d || d->kind != TP_DICT)
        return NULL;
    for (size_t i = 0; i < d->u.seq.n; i += 2) {
        const tp_value *k = d->u.seq.v[i];
        if (k->kind == TP_INT && k->u.i == key)
            return d->u.seq.v[i + 1];
    }
    return NULL;
}

const tp_value *tp_find(const tp_value *v, const char *path)
{
    char comp[256];
    while (v && *path) {
        size_t n = strcspn(path, "/");
        if (n >= sizeof comp)
            return NULL;
        memcpy(comp, path, n);
        comp[n] = 0;
        path += n + (path[n] == '/');
        char *end;
        errno = 0;
        long long idx = strtoll(comp, &end, 10);
        int is_num =
            n > 0 && *end == 0 && errno == 0 && (comp[0] == '-' || (comp[0] >= '0' && comp[0] <= '9'));
        const tp_value *next = tp_dict_get(v, comp);
        if (!next && is_num && v->kind == TP_DICT)
            next = tp_dict_get_int(v, idx);
        else if (!next && is_num && (v->kind == TP_LIST || v->kind == TP_TUPLE))
            next = idx >= 0 && (unsigned long long)idx < v->u.seq.n ? v->u.seq.v[idx] : NULL;
        v = next;
    }
    return v;
}

/* ---- tensors ---- */

int64_t tp_tensor_numel(const tp_tensor *t)
{
    uint64_t n = 1;
    for (int k = 0; k < t->ndim; k++)
        if (pf_mul_u64(n, (uint64_t)t->shape[k], &n) < 0 || n > INT64_MAX)
            return -1;
    return (int64_t)n;
}

/* "[a, b, c]" of n values into buf. */
static const char *dims_str(const int64_t *v, int n, char *buf, size_t cap)
{
    size_t at = (size_t)snprintf(buf, cap, "[");
    for (int k = 0; k < n && at < cap; k++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%lld", k ? ", " : "", (long long)v[k]);
    if (at < cap)
        snprintf(buf + at, cap - at, "]");
    return buf;
}

/* The storage elements a view spans: 1 + sum_k (shape[k] - 1) x stride[k] (0 when a dimension is 0). */
static int view_extent(const int64_t *shape, const int64_t *stride, int nd, uint64_t *out)
{
    uint64_t e = 1, term;
    for (int k = 0; k < nd; k++) {
        if (shape[k] == 0) {
            *out = 0;
            return 0;
        }
        if (pf_mul_u64((uint64_t)(shape[k] - 1), (uint64_t)stride[k], &term) < 0 ||
            pf_add_u64(e, term, &e) < 0)
            return -1;
    }
    *out = e;
    return 0;
}

int tp_tensor_check(const tp_tensor *t, const char *name, const char *what)
{
    char sh[160], st[160];
    if (t->ndim < 0 || t->ndim > TP_MAX_DIMS)
        return pf_err(-EPROTO, "%s: tensor '%s': %d dimensions (at most %d)", what, name, t->ndim,
                      TP_MAX_DIMS);
    const tp_storage *s = t->storage;
    uint64_t extent, end;
    if (tp_tensor_numel(t) < 0 || view_extent(t->shape, t->stride, t->ndim, &extent) < 0 ||
        pf_add_u64((uint64_t)t->offset, extent, &end) < 0)
        return pf_err(-EPROTO, "%s: tensor '%s': shape %s with stride %s overflows", what, name,
                      dims_str(t->shape, t->ndim, sh, sizeof sh),
                      dims_str(t->stride, t->ndim, st, sizeof st));
    if (end > (uint64_t)s->numel || t->offset > s->numel)
        return pf_err(-EPROTO,
                      "%s: tensor '%s': the view (storage offset %lld, shape %s, stride %s) reaches element "
                      "%llu of storage '%s', which holds %lld %s elements",
                      what, name, (long long)t->offset, dims_str(t->shape, t->ndim, sh, sizeof sh),
                      dims_str(t->stride, t->ndim, st, sizeof st), (unsigned long long)end, s->key,
                      (long long)s->numel, tp_dtype_name(s->dtype));
    return 0;
}

int tp_state_dict(const tp_value *sd, tp_named **out, int *n, const char *what)
{
    *out = NULL;
    *n = 0;
    if (!sd || sd->kind != TP_DICT)
        return pf_err(-EPROTO, "%s: expected a state_dict (a dict of tensors), found %s", what,
                      sd ? pk_a_kind(sd) : "nothing");
    size_t pairs = sd->u.seq.n / 2;
    tp_named *v = malloc((pairs ? pairs : 1) * sizeof *v);
    if (!v)
        return pf_err(-ENOMEM, "%s: out of memory", what);
    for (size_t i = 0; i < pairs; i++) {
        const tp_value *k = sd->u.seq.v[2 * i], *x = sd->u.seq.v[2 * i + 1];
        int rc = 0;
        if (k->kind != TP_STR)
            rc = pf_err(-EPROTO, "%s: state_dict key %lld is an int, not a tensor name", what,
                        (long long)k->u.i);
        else if (x->kind != TP_TENSOR)
            rc = pf_err(-EPROTO, "%s: state_dict entry '%s' is %s, not a tensor", what, k->u.str.s,
                        pk_a_kind(x));
        else
            rc = tp_tensor_check(tp_tensor_of(x), k->u.str.s, what);
        if (rc) {
            free(v);
            return rc;
        }
        v[i] = (tp_named){k->u.str.s, tp_tensor_of(x)};
    }
    *out = v;
    *n = (int)pairs;
    return 0;
}

/* ---- the archive ---- */

struct tp_file {
    zip_t *za;
    char *what;
    char *prefix; /* the entries' folder with its '/' */
    uint64_t archive_bytes;
    tp_pickle *pk;
};

const tp_value *tp_root(const tp_file *f)
{
    return tp_pickle_root(f->pk);
}

const char *tp_name(const tp_file *f)
{
    return f->what;
}

/* The index of <folder>/<rel>, or -1. */
static zip_int64_t locate(const tp_file *f, const char *rel)
{
    size_t n = strlen(f->prefix) + strlen(rel) + 1;
    char *name = malloc(n);
    if (!name)
        return -1;
    snprintf(name, n, "%s%s", f->prefix, rel);
    zip_int64_t i = zip_name_locate(f->za, name, ZIP_FL_ENC_RAW);
    free(name);
    return i;
}

/* zip_stat of entry idx, with the sizes checked: a stored entry's data within the archive, a compressed one
 * declaring at most TP_MAX_INFLATE x its compressed size; no encryption. `label` names it in messages. */
static int stat_entry(const tp_file *f, zip_int64_t idx, const char *label, zip_stat_t *zs)
{
    zip_stat_init(zs);
    if (zip_stat_index(f->za, (zip_uint64_t)idx, 0, zs) < 0)
        return pf_err(-EPROTO, "%s: %s: %s", f->what, label, zip_strerror(f->za));
    const zip_uint64_t need = ZIP_STAT_SIZE | ZIP_STAT_COMP_SIZE | ZIP_STAT_COMP_METHOD;
    if ((zs->valid & need) != need)
        return pf_err(-EPROTO, "%s: %s: the zip directory lacks its sizes", f->what, label);
    if ((zs->valid & ZIP_STAT_ENCRYPTION_METHOD) && zs->encryption_method != ZIP_EM_NONE)
        return pf_err(-EPROTO, "%s: %s is encrypted", f->what, label);
    if (zs->comp_size > f->archive_bytes)
        return pf_err(-EPROTO, "%s: %s declares %llu compressed bytes in a %llu-byte archive", f->what, label,
                      (unsigned long long)zs->comp_size, (unsigned long long)f->archive_bytes);
    if (zs->comp_method == ZIP_CM_STORE && zs->size != zs->comp_size)
        return pf_err(-EPROTO, "%s: %s is stored with %llu bytes but declares %llu", f->what, label,
                      (unsigned long long)zs->comp_size, (unsigned long long)zs->size);
    if (zs->comp_method != ZIP_CM_STORE && zs->size / TP_MAX_INFLATE > zs->comp_size)
        return pf_err(
            -EPROTO,
            "%s: %s declares %llu bytes from %llu compressed (more than deflate's %d:1; a zip bomb?)",
            f->what, label, (unsigned long long)zs->size, (unsigned long long)zs->comp_size, TP_MAX_INFLATE);
    return 0;
}

/* Reads n bytes of zf into dst (dst NULL: skips them). */
static int read_exact(const tp_file *f, zip_file_t *zf, unsigned char *dst, uint64_t n, const char *label)
{
    unsigned char scratch[1 << 14];
    while (n > 0) {
        zip_uint64_t want = dst ? n : (n < sizeof scratch ? n : sizeof scratch);
        zip_int64_t got = zip_fread(zf, dst ? dst : scratch, want);
        if (got < 0)
            return pf_err(-EPROTO, "%s: %s: %s", f->what, label, zip_file_strerror(zf));
        if (got == 0)
            return pf_err(-EPROTO, "%s: %s: truncated (%llu bytes missing)", f->what, label,
                          (unsigned long long)n);
        n -= (uint64_t)got;
        if (dst)
            dst += got;
    }
    return 0;
}

/* Bytes [lo, lo + n) of entry idx (of declared size `size`) into dst; a read to the entry's end also
 * reaches its end of file, where libzip checks the CRC. */
static int read_span(const tp_file *f, zip_int64_t idx, const zip_stat_t *zs, uint64_t lo, uint64_t n,
                     unsigned char *dst, const char *label)
{
    zip_file_t *zf = zip_fopen_index(f->za, (zip_uint64_t)idx, 0);
    if (!zf)
        return pf_err(-EPROTO, "%s: %s: %s", f->what, label, zip_strerror(f->za));
    int rc = 0;
    if (lo > 0 && (zs->comp_method != ZIP_CM_STORE || zip_fseek(zf, (zip_int64_t)lo, SEEK_SET) < 0))
        rc = read_exact(f, zf, NULL, lo, label);
    if (!rc)
        rc = read_exact(f, zf, dst, n, label);
    if (!rc && lo == 0 && n == zs->size) {
        unsigned char extra;
        zip_int64_t got = zip_fread(zf, &extra, 1);
        if (got != 0)
            rc = pf_err(-EPROTO, "%s: %s: %s", f->what, label,
                        got < 0 ? zip_file_strerror(zf) : "more bytes than its declared size");
    }
    zip_fclose(zf);
    return rc;
}

/* The entry data/<key> of t's storage: present, exactly numel x element size bytes (stat_entry's checks). */
static int storage_entry(const tp_file *f, const tp_tensor *t, const char *name, zip_int64_t *idx,
                         zip_stat_t *zs, char *label, size_t label_cap)
{
    const tp_storage *s = t->storage;
    size_t kn = strlen(s->key) + 6;
    char *rel = malloc(kn);
    if (!rel)
        return pf_err(-ENOMEM, "%s: out of memory", f->what);
    snprintf(rel, kn, "data/%s", s->key);
    *idx = locate(f, rel);
    snprintf(label, label_cap, "tensor '%s': %s%s", name, f->prefix, rel);
    free(rel);
    if (*idx < 0)
        return pf_err(-EPROTO, "%s: %s: missing from the archive", f->what, label);
    int rc = stat_entry(f, *idx, label, zs);
    if (rc)
        return rc;
    uint64_t want = (uint64_t)s->numel * tp_dtype_size(s->dtype); /* checked at BINPERSID */
    if (zs->size != want)
        return pf_err(-EPROTO, "%s: %s holds %llu bytes, the pickle declares %lld %s elements (%llu bytes)",
                      f->what, label, (unsigned long long)zs->size, (long long)s->numel,
                      tp_dtype_name(s->dtype), (unsigned long long)want);
    return 0;
}

/* Copies the n-d view (shape, stride in elements) at src into dst in C order. */
static void gather(unsigned char *dst, const unsigned char *src, const int64_t *shape, const int64_t *stride,
                   int nd, size_t es, uint64_t count)
{
    int64_t idx[TP_MAX_DIMS] = {0};
    uint64_t off = 0;
    for (uint64_t e = 0; e < count; e++) {
        memcpy(dst + e * es, src + off * es, es);
        for (int k = nd - 1; k >= 0; k--) {
            if (++idx[k] < shape[k]) {
                off += (uint64_t)stride[k];
                break;
            }
            off -= (uint64_t)(shape[k] - 1) * (uint64_t)stride[k];
            idx[k] = 0;
        }
    }
}

int tp_tensor_read_rows(tp_file *f, const tp_tensor *t, const char *name, int64_t row0, int64_t nrows,
                        void *dst, size_t dst_bytes)
{
    int rc = tp_tensor_check(t, name, f->what);
    if (rc)
        return rc;
    int64_t rows = t->ndim ? t->shape[0] : 1, numel = tp_tensor_numel(t);
    if (row0 < 0 || nrows < 0 || row0 > rows || nrows > rows - row0)
        return pf_err(-EPROTO, "%s: tensor '%s': rows [%lld, %lld) outside its %lld rows", f->what, name,
                      (long long)row0, (long long)row0 + nrows, (long long)rows);
    /* the sub-view: nrows rows from row0, the other dimensions whole */
    int64_t shape[TP_MAX_DIMS], stride[TP_MAX_DIMS];
    int nd = t->ndim ? t->ndim : 1;
    memcpy(shape, t->shape, sizeof shape);
    memcpy(stride, t->stride, sizeof stride);
    if (!t->ndim)
        stride[0] = 0;
    shape[0] = nrows;
    size_t es = tp_dtype_size(t->dtype);
    uint64_t count = rows ? (uint64_t)(numel / rows) * (uint64_t)nrows : 0, extent = 0, bytes;
    if (pf_mul_u64(count, es, &bytes) < 0 || bytes != dst_bytes)
        return pf_err(-EPROTO, "%s: tensor '%s': %llu elements of %s to read into %zu bytes", f->what, name,
                      (unsigned long long)count, tp_dtype_name(t->dtype), dst_bytes);
    if (count == 0)
        return 0;
    view_extent(shape, stride, nd, &extent); /* within the whole view's, checked above */
    uint64_t lo = (uint64_t)t->offset + (uint64_t)row0 * (uint64_t)stride[0];
    int contiguous = extent == count;
    uint64_t expect = 1;
    for (int k = nd - 1; k >= 0 && contiguous; k--) {
        contiguous = shape[k] == 1 || (uint64_t)stride[k] == expect;
        expect *= (uint64_t)shape[k];
    }
    zip_int64_t idx;
    zip_stat_t zs;
    char label[512];
    if ((rc = storage_entry(f, t, name, &idx, &zs, label, sizeof label)))
        return rc;
    if (contiguous)
        return read_span(f, idx, &zs, lo * es, count * es, dst, label);
    unsigned char *tmp = malloc((size_t)(extent * es));
    if (!tmp)
        return pf_err(-ENOMEM, "%s: %s: out of memory for %llu bytes", f->what, label,
                      (unsigned long long)(extent * es));
    if (!(rc = read_span(f, idx, &zs, lo * es, extent * es, tmp, label)))
        gather(dst, tmp, shape, stride, nd, es, count);
    free(tmp);
    return rc;
}

int tp_tensor_read(tp_file *f, const tp_tensor *t, const char *name, void *dst, size_t dst_bytes)
{
    return tp_tensor_read_rows(f, t, name, 0, t->ndim ? t->shape[0] : 1, dst, dst_bytes);
}

/* ---- opening ---- */

/* The entries' folder (from the first entry, as torch's reader takes it), `byteorder` when present, and
 * data.pkl through the interpreter. */
static int read_archive(tp_file *f)
{
    const char *first = zip_get_num_entries(f->za, 0) > 0 ? zip_get_name(f->za, 0, ZIP_FL_ENC_RAW) : NULL;
    const char *slash = first ? strchr(first, '/') : NULL;
    char b[80];
    if (!first)
        return pf_err(-EPROTO, "%s: an empty zip archive, not a torch.save file", f->what);
    if (!slash || slash == first)
        return pf_err(-EPROTO, "%s: entry '%s' is not inside a folder: not a torch.save archive", f->what,
                      pk_printable(first, strlen(first), b, sizeof b));
    if (!(f->prefix = strndup(first, (size_t)(slash - first) + 1)))
        return pf_err(-ENOMEM, "%s: out of memory", f->what);
    zip_int64_t pkl = locate(f, "data.pkl"), bo = locate(f, "byteorder");
    if (locate(f, "constants.pkl") >= 0) /* TorchScript archives have a data.pkl too (of __torch__ classes) */
        return pf_err(-EPROTO, "%s: a TorchScript archive (torch.jit.save), not torch.save of a state_dict",
                      f->what);
    if (pkl < 0)
        return pf_err(-EPROTO, "%s: no %sdata.pkl: not a torch.save archive", f->what, f->prefix);
    zip_stat_t zs;
    char label[320];
    int rc;
    if (bo >= 0) {
        char order[17] = {0};
        snprintf(label, sizeof label, "%sbyteorder", f->prefix);
        if ((rc = stat_entry(f, bo, label, &zs)))
            return rc;
        if (zs.size > 16 || (rc = read_span(f, bo, &zs, 0, zs.size, (unsigned char *)order, label)))
            return rc ? rc
                      : pf_err(-EPROTO, "%s: %s of %llu bytes", f->what, label, (unsigned long long)zs.size);
        if (strcmp(order, "little"))
            return pf_err(-EPROTO, "%s: %s is '%s': only little-endian archives are read", f->what, label,
                          pk_printable(order, strlen(order), b, sizeof b));
    }
    snprintf(label, sizeof label, "%sdata.pkl", f->prefix);
    if ((rc = stat_entry(f, pkl, label, &zs)))
        return rc;
    if (zs.size > TP_MAX_PICKLE)
        return pf_err(-EPROTO, "%s: %s declares %llu bytes (at most %u)", f->what, label,
                      (unsigned long long)zs.size, TP_MAX_PICKLE);
    unsigned char *buf = malloc(zs.size ? (size_t)zs.size : 1);
    if (!buf)
        return pf_err(-ENOMEM, "%s: out of memory for %s", f->what, label);
    if (!(rc = read_span(f, pkl, &zs, 0, zs.size, buf, label)))
        rc = tp_parse_pickle(&f->pk, buf, (size_t)zs.size, f->what);
    free(buf);
    return rc;
}

/* Opens the archive in src (owned from here on). head: the input's first bytes, to name a legacy file. */
static int open_archive(tp_file **out, zip_source_t *src, const char *what, uint64_t archive_bytes,
                        const unsigned char *head, size_t head_n)
{
    zip_error_t ze;
    zip_error_init(&ze);
    zip_t *za = zip_open_from_source(src, ZIP_RDONLY | ZIP_CHECKCONS, &ze);
    int rc;
    if (!za) {
        if (head_n >= 2 && head[0] == 0x80 && head[1] <= 5)
            rc = pf_err(
                -EPROTO,
                "%s: a legacy torch.save file (a bare pickle: torch < 1.6, or "
                "_use_new_zipfile_serialization=False), not the zip format: load and save it again with "
                "torch >= 1.6",
                what);
        else
            rc =
                pf_err(-EPROTO, "%s: not a readable zip archive (libzip: %s)", what, zip_error_strerror(&ze));
        zip_error_fini(&ze);
        zip_source_free(src);
        return rc;
    }
    zip_error_fini(&ze);
    tp_file *f = calloc(1, sizeof *f);
    if (!f || !(f->what = strdup(what))) {
        free(f);
        zip_discard(za);
        return pf_err(-ENOMEM, "%s: out of memory", what);
    }
    f->za = za;
    f->archive_bytes = archive_bytes;
    if ((rc = read_archive(f))) {
        tp_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

int tp_open(tp_file **out, const char *path)
{
    *out = NULL;
    struct stat st;
    int fd = pf_open_regular(path, &st);
    if (fd < 0)
        return pf_err_wrap(fd, "%s", path);
    unsigned char head[4];
    ssize_t hn = pread(fd, head, sizeof head, 0);
    FILE *fp = fdopen(fd, "rb");
    if (!fp) {
        close(fd);
        return pf_err(-ENOMEM, "%s: out of memory", path);
    }
    zip_error_t ze;
    zip_error_init(&ze);
    zip_source_t *src = zip_source_filep_create(fp, 0, -1, &ze);
    if (!src) {
        fclose(fp);
        int rc = pf_err(-EIO, "%s: %s", path, zip_error_strerror(&ze));
        zip_error_fini(&ze);
        return rc;
    }
    zip_error_fini(&ze);
    return open_archive(out, src, path, (uint64_t)st.st_size, head, hn > 0 ? (size_t)hn : 0);
}

int tp_open_buffer(tp_file **out, const void *buf, size_t size, const char *what)
{
    *out = NULL;
    zip_error_t ze;
    zip_error_init(&ze);
    zip_source_t *src = zip_source_buffer_create(buf, size, 0, &ze);
    if (!src) {
        int rc = pf_err(-ENOMEM, "%s: %s", what, zip_error_strerror(&ze));
        zip_error_fini(&ze);
        return rc;
    }
    zip_error_fini(&ze);
    return open_archive(out, src, what, size, buf, size);
}

void tp_close(tp_file *f)
{
    if (!f)
        return;
    if (f->za)
        zip_discard(f->za);
    tp_pickle_free(f->pk);
    free(f->prefix);
    free(f->what);
    free(f);
}

/* ---- the backbone as a safetensors image ---- */

static int cmp_storage_key(const void *a, const void *b)
{
    return strcmp((*(const tp_storage *const *)a)->key, (*(const tp_storage *const *)b)->key);
}

/* Checks every tensor's storage entry and bounds the copy: no view holds more elements than its storage, and
 * all views together hold at most twice the bytes of the distinct storages they view. Fills e (names, dtypes,
 * shapes). */
static int plan_image(tp_file *f, const tp_named *nt, int n, st_entry *e)
{
    const tp_storage **ss = malloc((n ? (size_t)n : 1) * sizeof *ss);
    if (!ss)
        return pf_err(-ENOMEM, "%s: out of memory", f->what);
    uint64_t views = 0, stores = 0;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        const tp_tensor *t = nt[i].t;
        zip_int64_t idx;
        zip_stat_t zs;
        char label[512];
        if ((rc = storage_entry(f, t, nt[i].name, &idx, &zs, label, sizeof label)))
            break;
        if (tp_tensor_numel(t) > t->storage->numel)
            rc =
                pf_err(-EPROTO, "%s: tensor '%s' has %lld elements over a storage of %lld (an expanded view)",
                       f->what, nt[i].name, (long long)tp_tensor_numel(t), (long long)t->storage->numel);
        if (!rc && pf_add_u64(views, (uint64_t)tp_tensor_numel(t) * tp_dtype_size(t->dtype), &views) < 0)
            rc = pf_err(-EPROTO, "%s: the tensors' bytes overflow", f->what);
        ss[i] = t->storage;
        e[i] = (st_entry){.name = nt[i].name, .dtype = tp_dtype_name(t->dtype), .ndim = t->ndim};
        for (int k = 0; k < t->ndim; k++)
            e[i].shape[k] = t->shape[k];
    }
    if (!rc) {
        qsort(ss, (size_t)n, sizeof *ss, cmp_storage_key);
        for (int i = 0; i < n; i++)
            if (i == 0 || strcmp(ss[i]->key, ss[i - 1]->key))
                stores += (uint64_t)ss[i]->numel * tp_dtype_size(ss[i]->dtype);
        if (views / 2 > stores)
            rc = pf_err(-EPROTO,
                        "%s: the tensors' views hold %llu bytes, their storages %llu (views overlapping "
                        "more than twice)",
                        f->what, (unsigned long long)views, (unsigned long long)stores);
    }
    free(ss);
    return rc;
}

/* The tensors nt[0..n) as a safetensors image parsed into *out. */
static int build_image(tp_file *f, const tp_named *nt, int n, st_file **out, unsigned char **image)
{
    st_entry *e = calloc(n ? (size_t)n : 1, sizeof *e);
    uint64_t *off = calloc(n ? (size_t)n : 1, sizeof *off), data_bytes = 0;
    unsigned char *h = NULL, *img = NULL;
    size_t hl = 0;
    int rc = 0;
    if (!e || !off)
        rc = pf_err(-ENOMEM, "%s: out of memory", f->what);
    else if (!(rc = plan_image(f, nt, n, e)) && (rc = st_header(e, n, NULL, 0, &h, &hl, off, &data_bytes)))
        rc = pf_err_wrap(rc, "%s", f->what);
    if (!rc && (data_bytes > SIZE_MAX - hl || !(img = malloc(hl + (size_t)data_bytes))))
        rc = pf_err(-ENOMEM, "%s: out of memory for %llu bytes of tensors", f->what,
                    (unsigned long long)data_bytes);
    if (!rc)
        memcpy(img, h, hl);
    for (int i = 0; i < n && !rc; i++) {
        const tp_tensor *t = nt[i].t;
        size_t bytes = (size_t)tp_tensor_numel(t) * tp_dtype_size(t->dtype);
        rc = tp_tensor_read(f, t, nt[i].name, img + hl + off[i], bytes);
    }
    if (!rc && !(rc = st_parse(out, img, hl + (size_t)data_bytes, f->what))) {
        *image = img;
        img = NULL;
    }
    free(img);
    free(h);
    free(off);
    free(e);
    return rc;
}

int tp_read_backbone(const char *path, st_file **out, unsigned char **image)
{
    *out = NULL;
    *image = NULL;
    tp_file *f;
    int rc = tp_open(&f, path);
    if (rc)
        return rc;
    const tp_value *root = tp_root(f), *sd = tp_dict_get(root, "state_dict_backbone");
    size_t wn = strlen(path) + 80;
    char *what = malloc(wn);
    tp_named *nt = NULL;
    int n = 0;
    if (!what)
        rc = pf_err(-ENOMEM, "%s: out of memory", path);
    else if (root->kind != TP_DICT)
        rc = pf_err(-EPROTO,
                    "%s: the pickle holds %s, neither a state_dict nor a checkpoint with "
                    "'state_dict_backbone'",
                    path, pk_a_kind(root));
    else {
        snprintf(what, wn,
                 sd ? "%s: state_dict_backbone" : "%s (no 'state_dict_backbone': read as a state_dict)",
                 path);
        rc = tp_state_dict(sd ? sd : root, &nt, &n, what);
    }
    if (!rc)
        rc = build_image(f, nt, n, out, image);
    free(nt);
    free(what);
    tp_close(f);
    return rc;
}
