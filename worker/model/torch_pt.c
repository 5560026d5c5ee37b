/* torch.save files: the allow-list pickle interpreter, the zip archive (libzip) and the tensors' bytes
 * (rules and limits in torch_pt.h). */
#include "worker/model/torch_pt.h"

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
#include "common/utf8.h"

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
    static const char *const names[] = {"?",     "None", "bool", "int",    "float",  "str",
                                        "tuple", "list", "dict", "tensor", "global", "storage"};
    return (unsigned)k < sizeof names / sizeof *names ? names[k] : "?";
}

/* The kind with its article, for messages: "None", "a bool", "an int", ... */
static const char *akind(uint8_t k)
{
    static const char *const names[] = {"?",       "None",   "a bool", "an int",   "a float",  "a str",
                                        "a tuple", "a list", "a dict", "a tensor", "a global", "a storage"};
    return k < sizeof names / sizeof *names ? names[k] : "?";
}

/* ---- the interpreter's memory ---- */

/* Values and strings live in chunks freed together; container items in malloc'd arrays (they grow). */
typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    max_align_t mem[];
} chunk;

struct tp_pickle {
    chunk *chunks;
    tp_value **conts; /* every tuple, list and dict (their item arrays) */
    size_t ncont, ccap;
    tp_value *root;
};

/* The interpreter's state while it runs. */
typedef struct pm {
    tp_pickle *p;
    const uint8_t *d;
    size_t size, pos, at; /* at: offset of the opcode being run */
    tp_value **stack;
    size_t sn, scap;
    size_t *marks;
    size_t mn, mcap;
    tp_value **memo;
    size_t memon, memocap;
    tp_storage **stor; /* every storage reference, for the consistency check */
    size_t nstor, storcap;
    size_t bytes, budget;
    const char *what;
} pm;

#define CHUNK_BYTES    (64u << 10)
#define ALLOC_OVERHEAD 16

/* A refusal: "<what>: pickle offset <at>: <problem>". Returns -EPROTO. */
static int perr(const pm *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int perr(const pm *m, const char *fmt, ...)
{
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return pf_err(-EPROTO, "%s: pickle offset %zu: %s", m->what, m->at, msg);
}

/* Counts `added` bytes against the budget. */
static int charge(pm *m, size_t added)
{
    size_t total;
    if (pf_add_size(m->bytes, added, &total) < 0 || total > m->budget)
        return perr(m,
                    "the pickle's values would take more than %zu bytes of memory for a %zu-byte pickle (at "
                    "most %u MiB + %u bytes per byte)",
                    m->budget, m->size, TP_MEM_FIXED >> 20, TP_MEM_PER_BYTE);
    m->bytes = total;
    return 0;
}

/* n bytes (8-aligned, zeroed) in the pickle's chunks. */
static int arena(pm *m, size_t n, void **out)
{
    n = (n + 15) & ~(size_t)15;
    chunk *c = m->p->chunks;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > CHUNK_BYTES ? n : CHUNK_BYTES;
        int rc = charge(m, cap + sizeof(chunk) + ALLOC_OVERHEAD);
        if (rc)
            return rc;
        c = calloc(1, sizeof(chunk) + cap);
        if (!c)
            return pf_err(-ENOMEM, "%s: out of memory reading the pickle", m->what);
        c->cap = cap;
        c->next = m->p->chunks;
        m->p->chunks = c;
    }
    *out = (unsigned char *)c->mem + c->used;
    c->used += n;
    return 0;
}

/* Room for `need` elements of `elem` bytes in *p (capacity *cap), doubling, counted against the budget. */
static int grow(pm *m, void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 8;
    while (c < need)
        c = c > SIZE_MAX / 2 ? need : 2 * c;
    size_t nb;
    if (pf_mul_size(c, elem, &nb) < 0)
        return perr(m, "%zu elements overflow", need);
    int rc = charge(m, (c - *cap) * elem + (*cap ? 0 : ALLOC_OVERHEAD));
    if (rc)
        return rc;
    void *q = realloc(*p, nb);
    if (!q)
        return pf_err(-ENOMEM, "%s: out of memory reading the pickle", m->what);
    *p = q;
    *cap = c;
    return 0;
}

static int new_value(pm *m, tp_kind kind, tp_value **out)
{
    void *v;
    int rc = arena(m, sizeof(tp_value), &v);
    if (rc)
        return rc;
    *out = v;
    (*out)->kind = (uint8_t)kind;
    return 0;
}

static int new_cont(pm *m, tp_kind kind, tp_value **out)
{
    tp_pickle *p = m->p;
    int rc = grow(m, (void **)&p->conts, &p->ccap, p->ncont + 1, sizeof *p->conts);
    if (rc || (rc = new_value(m, kind, out)))
        return rc;
    (*out)->depth = 1;
    p->conts[p->ncont++] = *out;
    return 0;
}

static int is_mutable(const tp_value *v)
{
    return v->kind == TP_LIST || v->kind == TP_DICT;
}

/* Appends items[0..n) to container c: c must not be sealed (placed inside another value) nor be one of the
 * items; the items are sealed; c's depth follows. */
static int cont_add(pm *m, tp_value *c, tp_value *const *items, size_t n)
{
    if (c->sealed)
        return perr(m, "a %s is changed after it was placed inside another value", tp_kind_name(c->kind));
    if (n > TP_MAX_ITEMS - c->u.seq.n)
        return perr(m, "a %s of more than %u elements", tp_kind_name(c->kind), TP_MAX_ITEMS);
    int rc = grow(m, (void **)&c->u.seq.v, &c->u.seq.cap, c->u.seq.n + n, sizeof(tp_value *));
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++) {
        tp_value *x = items[i];
        if (x == c)
            return perr(m, "a %s is placed inside itself", tp_kind_name(c->kind));
        if (x->depth + 1 > TP_MAX_DEPTH)
            return perr(m, "values nested deeper than %d", TP_MAX_DEPTH);
        if (x->depth + 1 > c->depth)
            c->depth = x->depth + 1;
        if (is_mutable(x))
            x->sealed = 1;
        c->u.seq.v[c->u.seq.n++] = x;
    }
    return 0;
}

static int push(pm *m, tp_value *v)
{
    int rc = grow(m, (void **)&m->stack, &m->scap, m->sn + 1, sizeof *m->stack);
    if (rc)
        return rc;
    m->stack[m->sn++] = v;
    return 0;
}

/* Values above the topmost MARK (the only ones an opcode may take, as pickle's metastack has it). */
static size_t avail(const pm *m)
{
    return m->sn - (m->mn ? m->marks[m->mn - 1] : 0);
}

/* Pops the topmost MARK: *from = the stack index it recorded. */
static int pop_mark(pm *m, const char *op, size_t *from)
{
    if (m->mn == 0)
        return perr(m, "%s without a MARK", op);
    *from = m->marks[--m->mn];
    return 0;
}

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* s[0..n) for a message: printable ASCII kept, anything else '?', at most cap - 1 bytes. */
static const char *printable(const char *s, size_t n, char *buf, size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < n && k + 1 < cap; i++)
        buf[k++] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
    buf[k] = 0;
    return buf;
}

/* ---- opcodes ---- */

enum { G_ODICT = 1, G_REBUILD, G_PARAM, G_STORAGE };

/* Every pickle opcode (names as CPython's Lib/pickletools.py), its fixed argument bytes and whether it is
 * allowed. */
typedef struct opinfo {
    uint8_t op, argn, allowed;
    const char *name;
} opinfo;

static const opinfo ops[] = {
    {'(', 0, 1, "MARK"},
    {'.', 0, 1, "STOP"},
    {'0', 0, 0, "POP"},
    {'1', 0, 0, "POP_MARK"},
    {'2', 0, 0, "DUP"},
    {'F', 0, 0, "FLOAT"},
    {'I', 0, 0, "INT"},
    {'J', 4, 1, "BININT"},
    {'K', 1, 1, "BININT1"},
    {'L', 0, 0, "LONG"},
    {'M', 2, 1, "BININT2"},
    {'N', 0, 1, "NONE"},
    {'P', 0, 0, "PERSID"},
    {'Q', 0, 1, "BINPERSID"},
    {'R', 0, 1, "REDUCE"},
    {'S', 0, 0, "STRING"},
    {'T', 0, 0, "BINSTRING"},
    {'U', 0, 0, "SHORT_BINSTRING"},
    {'V', 0, 0, "UNICODE"},
    {'X', 4, 1, "BINUNICODE"},
    {'a', 0, 1, "APPEND"},
    {'b', 0, 1, "BUILD"},
    {'c', 0, 1, "GLOBAL"},
    {'d', 0, 0, "DICT"},
    {'}', 0, 1, "EMPTY_DICT"},
    {'e', 0, 1, "APPENDS"},
    {'g', 0, 0, "GET"},
    {'h', 1, 1, "BINGET"},
    {'i', 0, 0, "INST"},
    {'j', 4, 1, "LONG_BINGET"},
    {'l', 0, 0, "LIST"},
    {']', 0, 1, "EMPTY_LIST"},
    {'o', 0, 0, "OBJ"},
    {'p', 0, 0, "PUT"},
    {'q', 1, 1, "BINPUT"},
    {'r', 4, 1, "LONG_BINPUT"},
    {'s', 0, 1, "SETITEM"},
    {'t', 0, 1, "TUPLE"},
    {')', 0, 1, "EMPTY_TUPLE"},
    {'u', 0, 1, "SETITEMS"},
    {'G', 8, 1, "BINFLOAT"},
    {'B', 0, 0, "BINBYTES"},
    {'C', 0, 0, "SHORT_BINBYTES"},
    {0x80, 1, 1, "PROTO"},
    {0x81, 0, 0, "NEWOBJ"},
    {0x82, 0, 0, "EXT1"},
    {0x83, 0, 0, "EXT2"},
    {0x84, 0, 0, "EXT4"},
    {0x85, 0, 1, "TUPLE1"},
    {0x86, 0, 1, "TUPLE2"},
    {0x87, 0, 1, "TUPLE3"},
    {0x88, 0, 1, "NEWTRUE"},
    {0x89, 0, 1, "NEWFALSE"},
    {0x8a, 1, 1, "LONG1"},
    {0x8b, 0, 0, "LONG4"},
    {0x8c, 1, 1, "SHORT_BINUNICODE"},
    {0x8d, 0, 0, "BINUNICODE8"},
    {0x8e, 0, 0, "BINBYTES8"},
    {0x8f, 0, 0, "EMPTY_SET"},
    {0x90, 0, 0, "ADDITEMS"},
    {0x91, 0, 0, "FROZENSET"},
    {0x92, 0, 0, "NEWOBJ_EX"},
    {0x93, 0, 0, "STACK_GLOBAL"},
    {0x94, 0, 1, "MEMOIZE"},
    {0x95, 8, 1, "FRAME"},
    {0x96, 0, 0, "BYTEARRAY8"},
    {0x97, 0, 0, "NEXT_BUFFER"},
    {0x98, 0, 0, "READONLY_BUFFER"},
};

static const opinfo *op_info(uint8_t op)
{
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
        if (ops[i].op == op)
            return &ops[i];
    return NULL;
}

static int push_int(pm *m, tp_kind kind, int64_t i)
{
    tp_value *v;
    int rc = new_value(m, kind, &v);
    if (rc)
        return rc;
    v->u.i = i;
    return push(m, v);
}

/* BINUNICODE / SHORT_BINUNICODE: the string's length is in arg (argn bytes). */
static int op_string(pm *m, const uint8_t *arg, int argn)
{
    uint64_t n = le(arg, argn);
    if (n > m->size - m->pos)
        return perr(m, "truncated: a string of %llu bytes, %zu left", (unsigned long long)n,
                    m->size - m->pos);
    if (n > TP_MAX_STR)
        return perr(m, "a string of %llu bytes (at most %u)", (unsigned long long)n, TP_MAX_STR);
    const uint8_t *s = m->d + m->pos;
    if (!pf_utf8_valid(s, (size_t)n) || memchr(s, 0, (size_t)n))
        return perr(m, "a string that is not UTF-8 or holds a NUL byte");
    m->pos += (size_t)n;
    tp_value *v;
    char *copy;
    int rc = new_value(m, TP_STR, &v);
    if (rc || (rc = arena(m, (size_t)n + 1, (void **)&copy)))
        return rc;
    memcpy(copy, s, (size_t)n);
    copy[n] = 0;
    v->u.str.s = copy;
    v->u.str.len = (size_t)n;
    return push(m, v);
}

/* LONG1: arg[0] bytes of a little-endian two's complement integer; at most 8. */
static int op_long1(pm *m, const uint8_t *arg)
{
    size_t n = arg[0];
    if (n > m->size - m->pos)
        return perr(m, "truncated: LONG1 of %zu bytes, %zu left", n, m->size - m->pos);
    if (n > 8)
        return perr(m, "an integer of %zu bytes (at most 8)", n);
    uint64_t u = le(m->d + m->pos, (int)n);
    if (n > 0 && n < 8 && (m->d[m->pos + n - 1] & 0x80))
        u |= ~(uint64_t)0 << (8 * n);
    m->pos += n;
    int64_t i;
    memcpy(&i, &u, sizeof i);
    return push_int(m, TP_INT, i);
}

static int op_binfloat(pm *m, const uint8_t *arg)
{
    uint64_t u = 0;
    for (int i = 0; i < 8; i++)
        u = u << 8 | arg[i];
    tp_value *v;
    int rc = new_value(m, TP_FLOAT, &v);
    if (rc)
        return rc;
    memcpy(&v->u.f, &u, sizeof u);
    return push(m, v);
}

/* One line of GLOBAL's argument ("module\n" or "name\n") into *s (not terminated), *n its length. */
static int global_line(pm *m, const char **s, size_t *n)
{
    const uint8_t *p = m->d + m->pos, *nl = memchr(p, '\n', m->size - m->pos < 256 ? m->size - m->pos : 256);
    if (!nl)
        return perr(m, "GLOBAL: no end of line within 256 bytes");
    *s = (const char *)p;
    *n = (size_t)(nl - p);
    m->pos += *n + 1;
    return 0;
}

static int eq(const char *s, size_t n, const char *lit)
{
    return strlen(lit) == n && !memcmp(s, lit, n);
}

static int op_global(pm *m)
{
    static const struct {
        const char *mod, *name, *full;
        int id;
        tp_dtype dtype;
    } allow[] = {
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
    const char *mod, *name;
    size_t nm, nn;
    int rc = global_line(m, &mod, &nm);
    if (rc || (rc = global_line(m, &name, &nn)))
        return rc;
    for (size_t i = 0; i < sizeof allow / sizeof *allow; i++)
        if (eq(mod, nm, allow[i].mod) && eq(name, nn, allow[i].name)) {
            tp_value *v;
            if ((rc = new_value(m, TP_GLOBAL, &v)))
                return rc;
            v->u.g.name = allow[i].full;
            v->u.g.id = allow[i].id;
            v->u.g.dtype = allow[i].dtype;
            return push(m, v);
        }
    char a[80], b[80];
    return pf_err(-EPROTO,
                  "%s: pickle GLOBAL '%s %s' at offset %zu not allowed (only collections.OrderedDict, "
                  "torch._utils._rebuild_tensor_v2 / _rebuild_parameter and torch's storage types)",
                  m->what, printable(mod, nm, a, sizeof a), printable(name, nn, b, sizeof b), m->at);
}

/* A tuple of the values stack[from..sn), replacing them. */
static int make_tuple(pm *m, size_t from)
{
    tp_value *t;
    int rc = new_cont(m, TP_TUPLE, &t);
    if (rc || (rc = cont_add(m, t, m->stack + from, m->sn - from)))
        return rc;
    m->sn = from;
    return push(m, t);
}

static int valid_key(pm *m, const tp_value *k)
{
    if (k->kind != TP_STR && k->kind != TP_INT)
        return perr(m, "a dict key that is %s (only str and int keys are read)", akind(k->kind));
    return 0;
}

/* SETITEM(S) / APPEND(S): stack[from..sn) into the container at stack[from - 1]. */
static int fill(pm *m, const char *op, size_t from, tp_kind want)
{
    size_t base = m->mn ? m->marks[m->mn - 1] : 0;
    if (from <= base)
        return perr(m, "%s: no container below its items", op);
    tp_value *c = m->stack[from - 1];
    size_t n = m->sn - from;
    if (c->kind != want)
        return perr(m, "%s into %s", op, akind(c->kind));
    if (want == TP_DICT) {
        if (n % 2)
            return perr(m, "%s with an odd number of values (%zu)", op, n);
        for (size_t i = 0; i < n; i += 2) {
            int rc = valid_key(m, m->stack[from + i]);
            if (rc)
                return rc;
        }
    }
    int rc = cont_add(m, c, m->stack + from, n);
    m->sn = from;
    return rc;
}

static int int_arg(pm *m, const tp_value *v, const char *what_arg, int64_t *out)
{
    if (v->kind != TP_INT || v->u.i < 0)
        return perr(m, "_rebuild_tensor_v2: %s is %s%s, not a non-negative int", what_arg, akind(v->kind),
                    v->kind == TP_INT ? " below 0" : "");
    *out = v->u.i;
    return 0;
}

/* _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata]). */
static int rebuild_tensor(pm *m, const tp_value *args, tp_value **out)
{
    tp_value *const *a = args->u.seq.v;
    size_t n = args->u.seq.n;
    if (n != 6 && n != 7)
        return perr(m, "_rebuild_tensor_v2 with %zu arguments (expected 6 or 7)", n);
    if (a[0]->kind != TP_STORAGE || a[2]->kind != TP_TUPLE || a[3]->kind != TP_TUPLE ||
        a[4]->kind != TP_BOOL || a[5]->kind != TP_DICT || (n == 7 && a[6]->kind != TP_DICT))
        return perr(m,
                    "_rebuild_tensor_v2(%s, %s, %s, %s, %s, %s%s%s): expected (storage, int, tuple, tuple, "
                    "bool, dict[, dict])",
                    tp_kind_name(a[0]->kind), tp_kind_name(a[1]->kind), tp_kind_name(a[2]->kind),
                    tp_kind_name(a[3]->kind), tp_kind_name(a[4]->kind), tp_kind_name(a[5]->kind),
                    n == 7 ? ", " : "", n == 7 ? tp_kind_name(a[6]->kind) : "");
    size_t nd = a[2]->u.seq.n;
    if (nd > TP_MAX_DIMS || a[3]->u.seq.n != nd)
        return perr(m, "_rebuild_tensor_v2: %zu sizes and %zu strides (equal, at most %d)", nd, a[3]->u.seq.n,
                    TP_MAX_DIMS);
    tp_tensor *t;
    int rc = arena(m, sizeof *t, (void **)&t);
    if (rc || (rc = int_arg(m, a[1], "storage_offset", &t->offset)))
        return rc;
    for (size_t k = 0; k < nd; k++)
        if ((rc = int_arg(m, a[2]->u.seq.v[k], "a size", &t->shape[k])) ||
            (rc = int_arg(m, a[3]->u.seq.v[k], "a stride", &t->stride[k])))
            return rc;
    t->storage = a[0]->u.s;
    t->dtype = t->storage->dtype;
    t->ndim = (int)nd;
    t->requires_grad = (int)a[4]->u.i;
    if ((rc = new_value(m, TP_TENSOR, out)))
        return rc;
    (*out)->u.t = t;
    return 0;
}

/* REDUCE: callable and args on the stack, replaced by the result. */
static int op_reduce(pm *m)
{
    if (avail(m) < 2)
        return perr(m, "REDUCE: stack underflow");
    tp_value *f = m->stack[m->sn - 2], *args = m->stack[m->sn - 1], *r = NULL;
    if (f->kind != TP_GLOBAL || args->kind != TP_TUPLE)
        return perr(m, "REDUCE of %s with %s (only an allowed global with a tuple)", akind(f->kind),
                    akind(args->kind));
    int rc = 0;
    switch (f->u.g.id) {
    case G_ODICT:
        if (args->u.seq.n != 0)
            return perr(m, "collections.OrderedDict with %zu arguments (only OrderedDict())", args->u.seq.n);
        if ((rc = new_cont(m, TP_DICT, &r)))
            return rc;
        r->ordered = 1;
        break;
    case G_REBUILD:
        if ((rc = rebuild_tensor(m, args, &r)))
            return rc;
        break;
    case G_PARAM: {
        tp_value *const *a = args->u.seq.v;
        if (args->u.seq.n != 3 || a[0]->kind != TP_TENSOR || a[1]->kind != TP_BOOL || a[2]->kind != TP_DICT)
            return perr(m, "_rebuild_parameter: expected (tensor, bool, dict)");
        tp_tensor *t;
        if ((rc = arena(m, sizeof *t, (void **)&t)) || (rc = new_value(m, TP_TENSOR, &r)))
            return rc;
        *t = *a[0]->u.t;
        t->requires_grad = (int)a[1]->u.i;
        r->u.t = t;
        break;
    }
    default:
        return perr(m, "REDUCE of %s not allowed (only of OrderedDict and the tensor rebuilders)",
                    f->u.g.name);
    }
    m->sn -= 2;
    return push(m, r);
}

/* BINPERSID: torch's storage reference ('storage', <storage type>, key, location, numel). */
static int op_persid(pm *m)
{
    if (avail(m) < 1)
        return perr(m, "BINPERSID: empty stack");
    const tp_value *pid = m->stack[m->sn - 1];
    tp_value *const *a = pid->u.seq.v;
    if (pid->kind != TP_TUPLE || pid->u.seq.n != 5 || a[0]->kind != TP_STR ||
        strcmp(a[0]->u.str.s, "storage") || a[1]->kind != TP_GLOBAL || a[1]->u.g.id != G_STORAGE ||
        a[2]->kind != TP_STR || a[3]->kind != TP_STR || a[4]->kind != TP_INT || a[4]->u.i < 0)
        return perr(m, "BINPERSID of %s that is not ('storage', <torch storage type>, key, location, numel)",
                    akind(pid->kind));
    uint64_t bytes;
    if (pf_mul_u64((uint64_t)a[4]->u.i, tp_dtype_size(a[1]->u.g.dtype), &bytes) < 0 || bytes > INT64_MAX)
        return perr(m, "storage '%s' of %lld elements overflows", a[2]->u.str.s, (long long)a[4]->u.i);
    tp_storage *s;
    tp_value *v;
    int rc = arena(m, sizeof *s, (void **)&s);
    if (rc || (rc = new_value(m, TP_STORAGE, &v)) ||
        (rc = grow(m, (void **)&m->stor, &m->storcap, m->nstor + 1, sizeof *m->stor)))
        return rc;
    *s = (tp_storage){
        .dtype = a[1]->u.g.dtype, .key = a[2]->u.str.s, .location = a[3]->u.str.s, .numel = a[4]->u.i};
    m->stor[m->nstor++] = s;
    v->u.s = s;
    m->stack[m->sn - 1] = v;
    return 0;
}

/* BUILD: obj.__setstate__(state), allowed on an OrderedDict with a dict (its attributes) or None. */
static int op_build(pm *m)
{
    if (avail(m) < 2)
        return perr(m, "BUILD: stack underflow");
    tp_value *obj = m->stack[m->sn - 2], *state = m->stack[m->sn - 1];
    if (obj->kind != TP_DICT || !obj->ordered || (state->kind != TP_DICT && state->kind != TP_NONE))
        return perr(m, "BUILD on %s with %s (only on an OrderedDict, with a dict or None)",
                    obj->ordered ? "an OrderedDict" : akind(obj->kind), akind(state->kind));
    if (obj->sealed)
        return perr(m, "BUILD on an OrderedDict placed inside another value");
    if (is_mutable(state))
        state->sealed = 1;
    m->sn--;
    return 0;
}

/* BINPUT / LONG_BINPUT / MEMOIZE: memo[i] = the top of the stack; i at most one past the last entry. */
static int op_put(pm *m, uint64_t i, const char *op)
{
    if (avail(m) < 1)
        return perr(m, "%s: empty stack", op);
    if (i > m->memon)
        return perr(m, "%s: memo index %llu skips past %zu", op, (unsigned long long)i, m->memon);
    if (i == m->memon) {
        if (m->memon >= TP_MAX_MEMO)
            return perr(m, "memo of more than %u entries", TP_MAX_MEMO);
        int rc = grow(m, (void **)&m->memo, &m->memocap, m->memon + 1, sizeof *m->memo);
        if (rc)
            return rc;
        m->memon++;
    }
    m->memo[i] = m->stack[m->sn - 1];
    return 0;
}

static int op_get(pm *m, uint64_t i, const char *op)
{
    if (i >= m->memon)
        return perr(m, "%s: memo index %llu was never stored", op, (unsigned long long)i);
    return push(m, m->memo[i]);
}

/* Containers and tuples: EMPTY_*, MARK, TUPLE*, SETITEM(S), APPEND(S). */
static int op_struct(pm *m, uint8_t op, const char *name)
{
    tp_value *v;
    size_t from = 0;
    int rc;
    switch (op) {
    case '}':
    case ']':
    case ')':
        if ((rc = new_cont(m, op == '}' ? TP_DICT : op == ']' ? TP_LIST : TP_TUPLE, &v)))
            return rc;
        return push(m, v);
    case '(':
        if (m->mn >= TP_MAX_DEPTH)
            return perr(m, "more than %d MARKs open", TP_MAX_DEPTH);
        if ((rc = grow(m, (void **)&m->marks, &m->mcap, m->mn + 1, sizeof *m->marks)))
            return rc;
        m->marks[m->mn++] = m->sn;
        return 0;
    case 't':
        if ((rc = pop_mark(m, name, &from)))
            return rc;
        return make_tuple(m, from);
    case 0x85:
    case 0x86:
    case 0x87:
        if (avail(m) < (size_t)(op - 0x84))
            return perr(m, "%s: stack underflow", name);
        return make_tuple(m, m->sn - (size_t)(op - 0x84));
    case 's':
    case 'a':
        if (avail(m) < (op == 's' ? 3u : 2u))
            return perr(m, "%s: stack underflow", name);
        return fill(m, name, m->sn - (op == 's' ? 2 : 1), op == 's' ? TP_DICT : TP_LIST);
    default: /* 'u', 'e' */
        if ((rc = pop_mark(m, name, &from)))
            return rc;
        return fill(m, name, from, op == 'u' ? TP_DICT : TP_LIST);
    }
}

/* Runs one allowed opcode whose fixed argument is arg. Returns 1 at STOP, 0 to go on, or an error. */
static int step(pm *m, const opinfo *oi, const uint8_t *arg)
{
    switch (oi->op) {
    case 0x80:
        if (arg[0] > 5)
            return perr(m, "pickle protocol %d (0..5)", arg[0]);
        return 0;
    case 0x95:
        if (le(arg, 8) > m->size - m->pos)
            return perr(m, "truncated: a FRAME of %llu bytes, %zu left", (unsigned long long)le(arg, 8),
                        m->size - m->pos);
        return 0;
    case '.':
        if (m->mn != 0 || m->sn != 1)
            return perr(m, "STOP with %zu values and %zu MARKs on the stack (expected one value)", m->sn,
                        m->mn);
        m->p->root = m->stack[0];
        return 1;
    case 'X': return op_string(m, arg, 4);
    case 0x8c: return op_string(m, arg, 1);
    case 'J': return push_int(m, TP_INT, (int32_t)(uint32_t)le(arg, 4));
    case 'K': return push_int(m, TP_INT, arg[0]);
    case 'M': return push_int(m, TP_INT, (int64_t)le(arg, 2));
    case 0x8a: return op_long1(m, arg);
    case 'G': return op_binfloat(m, arg);
    case 0x88:
    case 0x89: return push_int(m, TP_BOOL, oi->op == 0x88);
    case 'N': {
        tp_value *v;
        int rc = new_value(m, TP_NONE, &v);
        return rc ? rc : push(m, v);
    }
    case 'q': return op_put(m, arg[0], oi->name);
    case 'r': return op_put(m, le(arg, 4), oi->name);
    case 0x94: return op_put(m, m->memon, oi->name);
    case 'h': return op_get(m, arg[0], oi->name);
    case 'j': return op_get(m, le(arg, 4), oi->name);
    case 'c': return op_global(m);
    case 'R': return op_reduce(m);
    case 'Q': return op_persid(m);
    case 'b': return op_build(m);
    default: return op_struct(m, oi->op, oi->name);
    }
}

static int run(pm *m)
{
    for (;;) {
        m->at = m->pos;
        if (m->pos >= m->size)
            return perr(m, "truncated: no STOP opcode");
        uint8_t op = m->d[m->pos++];
        const opinfo *oi = op_info(op);
        if (!oi)
            return pf_err(-EPROTO, "%s: byte 0x%02x at pickle offset %zu is not a pickle opcode", m->what, op,
                          m->at);
        if (!oi->allowed)
            return pf_err(-EPROTO, "%s: pickle opcode %s (0x%02x) at offset %zu not allowed", m->what,
                          oi->name, op, m->at);
        if (oi->argn > m->size - m->pos)
            return perr(m, "truncated: %s needs %d argument bytes, %zu left", oi->name, oi->argn,
                        m->size - m->pos);
        const uint8_t *arg = m->d + m->pos;
        m->pos += oi->argn;
        int rc = step(m, oi, arg);
        if (rc)
            return rc > 0 ? 0 : rc;
    }
}

/* ---- checks over the whole pickle ---- */

static int cmp_key(const void *a, const void *b)
{
    const tp_value *x = *(tp_value *const *)a, *y = *(tp_value *const *)b;
    if (x->kind != y->kind)
        return x->kind < y->kind ? -1 : 1;
    if (x->kind == TP_INT)
        return x->u.i < y->u.i ? -1 : x->u.i > y->u.i;
    return strcmp(x->u.str.s, y->u.str.s);
}

/* No dict holds a key twice (Python would keep the last value; a pickler never writes one twice). */
static int check_dicts(pm *m)
{
    tp_value **keys = NULL;
    size_t cap = 0;
    int rc = 0;
    for (size_t c = 0; c < m->p->ncont && !rc; c++) {
        const tp_value *d = m->p->conts[c];
        size_t n = d->u.seq.n / 2;
        if (d->kind != TP_DICT || n < 2)
            continue;
        if (n > cap) {
            free(keys);
            cap = n;
            if (!(keys = malloc(cap * sizeof *keys)))
                return pf_err(-ENOMEM, "%s: out of memory checking the pickle's dicts", m->what);
        }
        for (size_t i = 0; i < n; i++)
            keys[i] = d->u.seq.v[2 * i];
        qsort(keys, n, sizeof *keys, cmp_key);
        for (size_t i = 1; i < n && !rc; i++)
            if (!cmp_key(&keys[i - 1], &keys[i])) {
                char b[80];
                rc = keys[i]->kind == TP_INT
                         ? pf_err(-EPROTO, "%s: pickle: a dict holds the key %lld twice", m->what,
                                  (long long)keys[i]->u.i)
                         : pf_err(-EPROTO, "%s: pickle: a dict holds the key '%s' twice", m->what,
                                  printable(keys[i]->u.str.s, keys[i]->u.str.len, b, sizeof b));
            }
    }
    free(keys);
    return rc;
}

static int cmp_storage(const void *a, const void *b)
{
    return strcmp((*(tp_storage *const *)a)->key, (*(tp_storage *const *)b)->key);
}

/* A storage key names one storage: every reference to it has the same dtype and numel. */
static int check_storages(pm *m)
{
    if (m->nstor < 2)
        return 0;
    qsort(m->stor, m->nstor, sizeof *m->stor, cmp_storage);
    for (size_t i = 1; i < m->nstor; i++) {
        const tp_storage *a = m->stor[i - 1], *b = m->stor[i];
        if (!strcmp(a->key, b->key) && (a->dtype != b->dtype || a->numel != b->numel)) {
            char k[80];
            return pf_err(-EPROTO, "%s: pickle: storage '%s' is referenced as %lld x %s and as %lld x %s",
                          m->what, printable(a->key, strlen(a->key), k, sizeof k), (long long)a->numel,
                          tp_dtype_name(a->dtype), (long long)b->numel, tp_dtype_name(b->dtype));
        }
    }
    return 0;
}

int tp_parse_pickle(tp_pickle **out, const void *buf, size_t size, const char *what)
{
    *out = NULL;
    pm m = {.d = buf, .size = size, .what = what};
    size_t per;
    if (pf_mul_size(size, TP_MEM_PER_BYTE, &per) < 0 || pf_add_size(per, TP_MEM_FIXED, &m.budget) < 0)
        m.budget = SIZE_MAX;
    if (!(m.p = calloc(1, sizeof *m.p)))
        return pf_err(-ENOMEM, "%s: out of memory", what);
    int rc = run(&m);
    if (!rc)
        rc = check_dicts(&m);
    if (!rc)
        rc = check_storages(&m);
    free(m.stack);
    free(m.marks);
    free(m.memo);
    free(m.stor);
    if (rc) {
        tp_pickle_free(m.p);
        return rc;
    }
    *out = m.p;
    return 0;
}

const tp_value *tp_pickle_root(const tp_pickle *p)
{
    return p->root;
}

void tp_pickle_free(tp_pickle *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->ncont; i++)
        free(p->conts[i]->u.seq.v);
    free(p->conts);
    while (p->chunks) {
        chunk *c = p->chunks;
        p->chunks = c->next;
        free(c);
    }
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
                      sd ? akind(sd->kind) : "nothing");
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
                        akind(x->kind));
        else
            rc = tp_tensor_check(x->u.t, k->u.str.s, what);
        if (rc) {
            free(v);
            return rc;
        }
        v[i] = (tp_named){k->u.str.s, x->u.t};
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
                      printable(first, strlen(first), b, sizeof b));
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
                          printable(order, strlen(order), b, sizeof b));
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
                    path, akind(root->kind));
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
