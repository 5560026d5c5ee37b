/* The allow-list pickle interpreter (rules, limits and messages in pickle.h). */
#include "common/pickle.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checked.h"
#include "common/err.h"
#include "common/utf8.h"

/* ---- opcodes ---- */

/* Every pickle opcode (names as CPython's Lib/pickletools.py), its fixed argument bytes and whether this
 * interpreter runs it (known); a caller allows a subset of the known ones. */
typedef struct opinfo {
    uint8_t op, argn, known;
    const char *name;
} opinfo;

static const opinfo ops[] = {
    {'(', 0, 1, "MARK"},
    {'.', 0, 1, "STOP"},
    {'0', 0, 0, "POP"},
    {'1', 0, 0, "POP_MARK"},
    {'2', 0, 0, "DUP"},
    {'F', 0, 0, "FLOAT"},
    {'I', 0, 1, "INT"},
    {'J', 4, 1, "BININT"},
    {'K', 1, 1, "BININT1"},
    {'L', 0, 0, "LONG"},
    {'M', 2, 1, "BININT2"},
    {'N', 0, 1, "NONE"},
    {'P', 0, 0, "PERSID"},
    {'Q', 0, 1, "BINPERSID"},
    {'R', 0, 1, "REDUCE"},
    {'S', 0, 0, "STRING"},
    {'T', 4, 1, "BINSTRING"},
    {'U', 1, 1, "SHORT_BINSTRING"},
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
    {'B', 4, 1, "BINBYTES"},
    {'C', 1, 1, "SHORT_BINBYTES"},
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
    {0x8e, 8, 1, "BINBYTES8"},
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

/* ---- the machine's memory ---- */

/* Values and strings live in chunks freed together; container items in malloc'd arrays (they grow). */
typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    max_align_t mem[];
} chunk;

struct pk_doc {
    chunk *chunks;
    pk_value **conts; /* every tuple, list and dict (their item arrays) */
    size_t ncont, ccap;
    pk_value *root;
};

struct pk_machine {
    const pk_config *cfg;
    uint8_t allowed[256];
    pk_doc *doc;
    const uint8_t *d;
    size_t size, pos, at; /* at: offset of the opcode being run */
    pk_value **stack;
    size_t sn, scap;
    size_t *marks;
    size_t mn, mcap;
    pk_value **memo;
    size_t memon, memocap;
    pk_value *none, *yes, *no; /* shared, made when first pushed */
    size_t values;             /* pushes so far, against max_values */
    size_t bytes, budget;      /* allocated so far, against mem_fixed + mem_per_byte x size */
};

#define CHUNK_BYTES    (64u << 10)
#define ALLOC_OVERHEAD 16

int pk_fail(pk_machine *m, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return pf_err(-EPROTO, "%s: pickle offset %zu: %s", m->cfg->what, m->at, msg);
}

/* Counts `added` bytes against the budget. */
static int charge(pk_machine *m, size_t added)
{
    size_t total;
    if (pf_add_size(m->bytes, added, &total) < 0 || total > m->budget) {
        const pk_config *c = m->cfg;
        char fixed[48];
        if (c->mem_fixed && c->mem_fixed % (1u << 20) == 0)
            snprintf(fixed, sizeof fixed, "%zu MiB", c->mem_fixed >> 20);
        else
            snprintf(fixed, sizeof fixed, "%zu bytes", c->mem_fixed);
        return pk_fail(m,
                       "the pickle's values would take more than %zu bytes of memory for a %zu-byte pickle "
                       "(at most %s + %zu bytes per byte)",
                       m->budget, m->size, fixed, c->mem_per_byte);
    }
    m->bytes = total;
    return 0;
}

int pk_alloc(pk_machine *m, size_t n, void **out)
{
    if (n > SIZE_MAX - 15)
        return pk_fail(m, "%zu bytes overflow", n);
    n = (n + 15) & ~(size_t)15;
    chunk *c = m->doc->chunks;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > CHUNK_BYTES ? n : CHUNK_BYTES;
        int rc = charge(m, cap > SIZE_MAX - 256 ? SIZE_MAX : cap + sizeof(chunk) + ALLOC_OVERHEAD);
        if (rc)
            return rc;
        c = calloc(1, sizeof(chunk) + cap);
        if (!c)
            return pf_err(-ENOMEM, "%s: out of memory reading the pickle", m->cfg->what);
        c->cap = cap;
        c->next = m->doc->chunks;
        m->doc->chunks = c;
    }
    *out = (unsigned char *)c->mem + c->used;
    c->used += n;
    return 0;
}

/* Room for `need` elements of `elem` bytes in *p (capacity *cap), doubling, counted against the budget. */
static int grow(pk_machine *m, void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 8;
    while (c < need)
        c = c > SIZE_MAX / 2 ? need : 2 * c;
    size_t nb;
    if (pf_mul_size(c, elem, &nb) < 0)
        return pk_fail(m, "%zu elements overflow", need);
    int rc = charge(m, (c - *cap) * elem + (*cap ? 0 : ALLOC_OVERHEAD));
    if (rc)
        return rc;
    void *q = realloc(*p, nb);
    if (!q)
        return pf_err(-ENOMEM, "%s: out of memory reading the pickle", m->cfg->what);
    *p = q;
    *cap = c;
    return 0;
}

int pk_new(pk_machine *m, uint8_t kind, pk_value **out)
{
    int cont = kind == PK_TUPLE || kind == PK_LIST || kind == PK_DICT;
    pk_doc *d = m->doc;
    int rc = cont ? grow(m, (void **)&d->conts, &d->ccap, d->ncont + 1, sizeof *d->conts) : 0;
    void *v;
    if (rc || (rc = pk_alloc(m, sizeof(pk_value), &v)))
        return rc;
    *out = v;
    (*out)->kind = kind;
    if (cont) {
        (*out)->depth = 1;
        d->conts[d->ncont++] = *out;
    }
    return 0;
}

static int is_mutable(const pk_value *v)
{
    return v->kind == PK_LIST || v->kind == PK_DICT;
}

/* Appends items[0..n) to container c: c must not be sealed nor be one of the items; mutable items are
 * sealed; c's depth follows. */
static int cont_add(pk_machine *m, pk_value *c, pk_value *const *items, size_t n)
{
    const pk_config *cfg = m->cfg;
    if (c->sealed)
        return pk_fail(m, "a %s is changed after it was placed inside another value", pk_kind_name(c));
    if (n > cfg->max_items || c->u.seq.n > cfg->max_items - n)
        return pk_fail(m, "a %s of more than %zu elements", pk_kind_name(c), cfg->max_items);
    int rc = grow(m, (void **)&c->u.seq.v, &c->u.seq.cap, c->u.seq.n + n, sizeof(pk_value *));
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++) {
        pk_value *x = items[i];
        if (x == c)
            return pk_fail(m, "a %s is placed inside itself", pk_kind_name(c));
        if (x->depth + 1 > cfg->max_depth)
            return pk_fail(m, "values nested deeper than %u", cfg->max_depth);
        if (x->depth + 1 > c->depth)
            c->depth = x->depth + 1;
        if (is_mutable(x))
            x->sealed = 1;
        c->u.seq.v[c->u.seq.n++] = x;
    }
    return 0;
}

static int push(pk_machine *m, pk_value *v)
{
    if (m->values >= m->cfg->max_values)
        return pk_fail(m, "more than %zu values", m->cfg->max_values);
    int rc = grow(m, (void **)&m->stack, &m->scap, m->sn + 1, sizeof *m->stack);
    if (rc)
        return rc;
    m->values++;
    m->stack[m->sn++] = v;
    return 0;
}

/* Values above the topmost MARK (the only ones an opcode may take, as pickle's metastack has it). */
static size_t avail(const pk_machine *m)
{
    return m->sn - (m->mn ? m->marks[m->mn - 1] : 0);
}

/* Pops the topmost MARK: *from = the stack index it recorded. */
static int pop_mark(pk_machine *m, const char *op, size_t *from)
{
    if (m->mn == 0)
        return pk_fail(m, "%s without a MARK", op);
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

const char *pk_printable(const char *s, size_t n, char *buf, size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < n && k + 1 < cap; i++)
        buf[k++] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
    buf[k] = 0;
    return buf;
}

const char *pk_kind_name(const pk_value *v)
{
    static const char *const names[] = {"?",     "None", "bool", "int",   "float", "str",
                                        "tuple", "list", "dict", "bytes", "global"};
    if (v->kind >= PK_USER)
        return v->u.obj.name ? v->u.obj.name : "?";
    return v->kind < sizeof names / sizeof *names ? names[v->kind] : "?";
}

const char *pk_a_kind(const pk_value *v)
{
    static const char *const names[] = {"?",       "None",   "a bool", "an int",  "a float", "a str",
                                        "a tuple", "a list", "a dict", "a bytes", "a global"};
    if (v->kind >= PK_USER)
        return v->u.obj.aname ? v->u.obj.aname : "?";
    return v->kind < sizeof names / sizeof *names ? names[v->kind] : "?";
}

/* ---- leaves ---- */

static int push_int(pk_machine *m, int64_t i)
{
    pk_value *v;
    int rc = pk_new(m, PK_INT, &v);
    if (rc)
        return rc;
    v->u.i = i;
    return push(m, v);
}

/* None, True, False: one value each per pickle, as Python shares them. */
static int push_shared(pk_machine *m, pk_value **slot, uint8_t kind, int64_t i)
{
    if (!*slot) {
        int rc = pk_new(m, kind, slot);
        if (rc)
            return rc;
        (*slot)->u.i = i;
    }
    return push(m, *slot);
}

static int push_bool(pk_machine *m, int b)
{
    return b ? push_shared(m, &m->yes, PK_BOOL, 1) : push_shared(m, &m->no, PK_BOOL, 0);
}

/* BINUNICODE / SHORT_BINUNICODE (str, copied) and the bytes opcodes (bytes, into the input): the length
 * is in arg (argn bytes); BINSTRING's is signed. */
static int op_string(pk_machine *m, const opinfo *oi, const uint8_t *arg)
{
    uint64_t n = le(arg, oi->argn);
    int is_str = oi->op == 'X' || oi->op == 0x8c;
    const char *what = is_str ? "a string" : "a bytes value";
    if (oi->op == 'T' && (n & 0x80000000u))
        return pk_fail(m, "BINSTRING of a negative length (%d)", (int32_t)(uint32_t)n);
    if (n > m->size - m->pos)
        return pk_fail(m, "truncated: %s of %llu bytes, %zu left", what, (unsigned long long)n,
                       m->size - m->pos);
    if (n > m->cfg->max_str)
        return pk_fail(m, "%s of %llu bytes (at most %zu)", what, (unsigned long long)n, m->cfg->max_str);
    const uint8_t *s = m->d + m->pos;
    if (is_str && (!pf_utf8_valid(s, (size_t)n) || memchr(s, 0, (size_t)n)))
        return pk_fail(m, "a string that is not UTF-8 or holds a NUL byte");
    m->pos += (size_t)n;
    pk_value *v;
    int rc = pk_new(m, is_str ? PK_STR : PK_BYTES, &v);
    if (rc)
        return rc;
    if (is_str) {
        char *copy;
        if ((rc = pk_alloc(m, (size_t)n + 1, (void **)&copy)))
            return rc;
        memcpy(copy, s, (size_t)n);
        v->u.str.s = copy;
    } else {
        v->u.str.s = (const char *)s;
    }
    v->u.str.len = (size_t)n;
    return push(m, v);
}

/* INT: a decimal line; "01" and "00" are True and False (protocols 0 and 1 write bools so). */
static int op_int(pk_machine *m)
{
    size_t left = m->size - m->pos;
    const uint8_t *p = m->d + m->pos, *nl = memchr(p, '\n', left < 24 ? left : 24);
    if (!nl)
        return pk_fail(m, "INT: no end of line within 24 bytes");
    size_t n = (size_t)(nl - p);
    m->pos += n + 1;
    if (n == 2 && p[0] == '0' && (p[1] == '0' || p[1] == '1'))
        return push_bool(m, p[1] == '1');
    size_t k = n > 0 && p[0] == '-';
    uint64_t u = 0;
    if (k == n)
        return pk_fail(m, "INT: not a decimal integer");
    for (; k < n; k++) {
        if (p[k] < '0' || p[k] > '9' || u > (UINT64_MAX - 9) / 10)
            return pk_fail(m, "INT: not a decimal integer within 64 bits");
        u = u * 10 + (uint64_t)(p[k] - '0');
    }
    int neg = p[0] == '-';
    if (u > (uint64_t)INT64_MAX + (uint64_t)neg)
        return pk_fail(m, "INT: not a decimal integer within 64 bits");
    return push_int(m, neg ? (int64_t)(0 - u) : (int64_t)u);
}

/* LONG1: arg[0] bytes of a little-endian two's complement integer; at most 8. */
static int op_long1(pk_machine *m, const uint8_t *arg)
{
    size_t n = arg[0];
    if (n > m->size - m->pos)
        return pk_fail(m, "truncated: LONG1 of %zu bytes, %zu left", n, m->size - m->pos);
    if (n > 8)
        return pk_fail(m, "an integer of %zu bytes (at most 8)", n);
    uint64_t u = le(m->d + m->pos, (int)n);
    if (n > 0 && n < 8 && (m->d[m->pos + n - 1] & 0x80))
        u |= ~(uint64_t)0 << (8 * n);
    m->pos += n;
    int64_t i;
    memcpy(&i, &u, sizeof i);
    return push_int(m, i);
}

static int op_binfloat(pk_machine *m, const uint8_t *arg)
{
    uint64_t u = 0;
    for (int i = 0; i < 8; i++)
        u = u << 8 | arg[i];
    pk_value *v;
    int rc = pk_new(m, PK_FLOAT, &v);
    if (rc)
        return rc;
    memcpy(&v->u.f, &u, sizeof u);
    return push(m, v);
}

/* ---- globals and objects ---- */

/* One line of GLOBAL's argument ("module\n" or "name\n") into *s (not terminated), *n its length. */
static int global_line(pk_machine *m, const char **s, size_t *n)
{
    const uint8_t *p = m->d + m->pos, *nl = memchr(p, '\n', m->size - m->pos < 256 ? m->size - m->pos : 256);
    if (!nl)
        return pk_fail(m, "GLOBAL: no end of line within 256 bytes");
    *s = (const char *)p;
    *n = (size_t)(nl - p);
    m->pos += *n + 1;
    return 0;
}

static int eq(const char *s, size_t n, const char *lit)
{
    return strlen(lit) == n && !memcmp(s, lit, n);
}

static int op_global(pk_machine *m)
{
    const pk_config *c = m->cfg;
    const char *mod, *name;
    size_t nm, nn;
    int rc = global_line(m, &mod, &nm);
    if (rc || (rc = global_line(m, &name, &nn)))
        return rc;
    for (size_t i = 0; i < c->nglobals; i++)
        if (eq(mod, nm, c->globals[i].module) && eq(name, nn, c->globals[i].name)) {
            pk_value *v;
            if ((rc = pk_new(m, PK_GLOBAL, &v)))
                return rc;
            v->u.g.name = c->globals[i].full;
            v->u.g.id = c->globals[i].id;
            v->u.g.arg = c->globals[i].arg;
            return push(m, v);
        }
    char a[80], b[80];
    return pf_err(-EPROTO, "%s: pickle GLOBAL '%s %s' at offset %zu not allowed (%s)", c->what,
                  pk_printable(mod, nm, a, sizeof a), pk_printable(name, nn, b, sizeof b), m->at,
                  c->globals_hint ? c->globals_hint : "no globals are");
}

/* REDUCE: callable and args on the stack, replaced by the callback's result. */
static int op_reduce(pk_machine *m)
{
    if (avail(m) < 2)
        return pk_fail(m, "REDUCE: stack underflow");
    pk_value *f = m->stack[m->sn - 2], *args = m->stack[m->sn - 1], *r = NULL;
    if (f->kind != PK_GLOBAL || args->kind != PK_TUPLE)
        return pk_fail(m, "REDUCE of %s with %s (only an allowed global with a tuple)", pk_a_kind(f),
                       pk_a_kind(args));
    int rc = m->cfg->reduce(m, m->cfg->user, f, args, &r);
    if (rc)
        return rc;
    m->sn -= 2;
    return push(m, r);
}

/* BINPERSID: the persistent id on the stack, replaced by the object the callback names. */
static int op_persid(pk_machine *m)
{
    if (avail(m) < 1)
        return pk_fail(m, "BINPERSID: empty stack");
    pk_value *r = NULL;
    int rc = m->cfg->persid(m, m->cfg->user, m->stack[m->sn - 1], &r);
    if (rc)
        return rc;
    m->sn--;
    return push(m, r);
}

static int op_build(pk_machine *m)
{
    if (avail(m) < 2)
        return pk_fail(m, "BUILD: stack underflow");
    int rc = m->cfg->build(m, m->cfg->user, m->stack[m->sn - 2], m->stack[m->sn - 1]);
    if (rc)
        return rc;
    m->sn--;
    return 0;
}

/* ---- memo and structure ---- */

/* BINPUT / LONG_BINPUT / MEMOIZE: memo[i] = the top of the stack; i at most one past the last entry. */
static int op_put(pk_machine *m, uint64_t i, const char *op)
{
    if (avail(m) < 1)
        return pk_fail(m, "%s: empty stack", op);
    if (i > m->memon)
        return pk_fail(m, "%s: memo index %llu skips past %zu", op, (unsigned long long)i, m->memon);
    if (i == m->memon) {
        if (m->memon >= m->cfg->max_memo)
            return pk_fail(m, "memo of more than %zu entries", m->cfg->max_memo);
        int rc = grow(m, (void **)&m->memo, &m->memocap, m->memon + 1, sizeof *m->memo);
        if (rc)
            return rc;
        m->memon++;
    }
    m->memo[i] = m->stack[m->sn - 1];
    return 0;
}

static int op_get(pk_machine *m, uint64_t i, const char *op)
{
    if (i >= m->memon)
        return pk_fail(m, "%s: memo index %llu was never stored", op, (unsigned long long)i);
    return push(m, m->memo[i]);
}

/* A tuple of the values stack[from..sn), replacing them. */
static int make_tuple(pk_machine *m, size_t from)
{
    pk_value *t;
    int rc = pk_new(m, PK_TUPLE, &t);
    if (rc || (rc = cont_add(m, t, m->stack + from, m->sn - from)))
        return rc;
    m->sn = from;
    return push(m, t);
}

/* SETITEM(S) / APPEND(S): stack[from..sn) into the container at stack[from - 1]. */
static int fill(pk_machine *m, const char *op, size_t from, pk_kind want)
{
    size_t base = m->mn ? m->marks[m->mn - 1] : 0;
    if (from <= base)
        return pk_fail(m, "%s: no container below its items", op);
    pk_value *c = m->stack[from - 1];
    size_t n = m->sn - from;
    if (c->kind != want)
        return pk_fail(m, "%s into %s", op, pk_a_kind(c));
    if (want == PK_DICT) {
        if (n % 2)
            return pk_fail(m, "%s with an odd number of values (%zu)", op, n);
        for (size_t i = 0; i < n; i += 2) {
            const pk_value *k = m->stack[from + i];
            if (k->kind != PK_STR && k->kind != PK_INT)
                return pk_fail(m, "a dict key that is %s (only str and int keys are read)", pk_a_kind(k));
        }
    }
    int rc = cont_add(m, c, m->stack + from, n);
    m->sn = from;
    return rc;
}

/* Containers and tuples: EMPTY_*, MARK, TUPLE*, SETITEM(S), APPEND(S). */
static int op_struct(pk_machine *m, uint8_t op, const char *name)
{
    pk_value *v;
    size_t from = 0;
    int rc;
    switch (op) {
    case '}':
    case ']':
    case ')':
        if ((rc = pk_new(m, op == '}' ? PK_DICT : op == ']' ? PK_LIST : PK_TUPLE, &v)))
            return rc;
        return push(m, v);
    case '(':
        if (m->mn >= m->cfg->max_depth)
            return pk_fail(m, "more than %u MARKs open", m->cfg->max_depth);
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
            return pk_fail(m, "%s: stack underflow", name);
        return make_tuple(m, m->sn - (size_t)(op - 0x84));
    case 's':
    case 'a':
        if (avail(m) < (op == 's' ? 3u : 2u))
            return pk_fail(m, "%s: stack underflow", name);
        return fill(m, name, m->sn - (op == 's' ? 2 : 1), op == 's' ? PK_DICT : PK_LIST);
    default: /* 'u', 'e' */
        if ((rc = pop_mark(m, name, &from)))
            return rc;
        return fill(m, name, from, op == 'u' ? PK_DICT : PK_LIST);
    }
}

/* ---- the loop ---- */

/* Runs one allowed opcode whose fixed argument is arg. Returns 1 at STOP, 0 to go on, or an error. */
static int step(pk_machine *m, const opinfo *oi, const uint8_t *arg)
{
    switch (oi->op) {
    case 0x80:
        if (arg[0] > 5)
            return pk_fail(m, "pickle protocol %d (0..5)", arg[0]);
        return 0;
    case 0x95:
        if (le(arg, 8) > m->size - m->pos)
            return pk_fail(m, "truncated: a FRAME of %llu bytes, %zu left", (unsigned long long)le(arg, 8),
                           m->size - m->pos);
        return 0;
    case '.':
        if (m->mn != 0 || m->sn != 1)
            return pk_fail(m, "STOP with %zu values and %zu MARKs on the stack (expected one value)", m->sn,
                           m->mn);
        m->doc->root = m->stack[0];
        return 1;
    case 'X':
    case 0x8c:
    case 'B':
    case 'C':
    case 0x8e:
    case 'T':
    case 'U': return op_string(m, oi, arg);
    case 'I': return op_int(m);
    case 'J': return push_int(m, (int32_t)(uint32_t)le(arg, 4));
    case 'K': return push_int(m, arg[0]);
    case 'M': return push_int(m, (int64_t)le(arg, 2));
    case 0x8a: return op_long1(m, arg);
    case 'G': return op_binfloat(m, arg);
    case 0x88:
    case 0x89: return push_bool(m, oi->op == 0x88);
    case 'N': return push_shared(m, &m->none, PK_NONE, 0);
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

static int run(pk_machine *m)
{
    const char *what = m->cfg->what;
    for (;;) {
        m->at = m->pos;
        if (m->pos >= m->size)
            return pk_fail(m, "truncated: no STOP opcode");
        uint8_t op = m->d[m->pos++];
        const opinfo *oi = op_info(op);
        if (!oi)
            return pf_err(-EPROTO, "%s: byte 0x%02x at pickle offset %zu is not a pickle opcode", what, op,
                          m->at);
        if (!m->allowed[op])
            return pf_err(-EPROTO, "%s: pickle opcode %s (0x%02x) at offset %zu not allowed", what, oi->name,
                          op, m->at);
        if (oi->argn > m->size - m->pos)
            return pk_fail(m, "truncated: %s needs %d argument bytes, %zu left", oi->name, oi->argn,
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
    const pk_value *x = *(pk_value *const *)a, *y = *(pk_value *const *)b;
    if (x->kind != y->kind)
        return x->kind < y->kind ? -1 : 1;
    if (x->kind == PK_INT)
        return x->u.i < y->u.i ? -1 : x->u.i > y->u.i;
    return strcmp(x->u.str.s, y->u.str.s);
}

/* No dict holds a key twice (Python would keep the last value; a pickler never writes one twice). */
static int check_dicts(pk_machine *m)
{
    const char *what = m->cfg->what;
    pk_value **keys = NULL;
    size_t cap = 0;
    int rc = 0;
    for (size_t c = 0; c < m->doc->ncont && !rc; c++) {
        const pk_value *d = m->doc->conts[c];
        size_t n = d->u.seq.n / 2;
        if (d->kind != PK_DICT || n < 2)
            continue;
        if (n > cap) {
            free(keys);
            cap = n;
            if (!(keys = malloc(cap * sizeof *keys)))
                return pf_err(-ENOMEM, "%s: out of memory checking the pickle's dicts", what);
        }
        for (size_t i = 0; i < n; i++)
            keys[i] = d->u.seq.v[2 * i];
        qsort(keys, n, sizeof *keys, cmp_key);
        for (size_t i = 1; i < n && !rc; i++)
            if (!cmp_key(&keys[i - 1], &keys[i])) {
                char b[80];
                rc = keys[i]->kind == PK_INT
                         ? pf_err(-EPROTO, "%s: pickle: a dict holds the key %lld twice", what,
                                  (long long)keys[i]->u.i)
                         : pf_err(-EPROTO, "%s: pickle: a dict holds the key '%s' twice", what,
                                  pk_printable(keys[i]->u.str.s, keys[i]->u.str.len, b, sizeof b));
            }
    }
    free(keys);
    return rc;
}

/* The allowed opcodes of cfg into m->allowed; -EINVAL for a name the interpreter does not run, an object
 * opcode without its callback or a zero limit. */
static int configure(pk_machine *m, const pk_config *c)
{
    if (!c->what || !c->opcodes || !c->max_depth || !c->max_str || !c->max_items || !c->max_memo ||
        !c->max_values)
        return pf_err(-EINVAL, "pickle interpreter: what, opcodes and every limit must be set");
    for (const char *p = c->opcodes; *p;) {
        size_t n = strcspn(p, " ");
        const opinfo *oi = NULL;
        for (size_t i = 0; n && i < sizeof ops / sizeof *ops && !oi; i++)
            if (ops[i].known && eq(p, n, ops[i].name))
                oi = &ops[i];
        if (n && !oi)
            return pf_err(-EINVAL, "pickle interpreter: %.*s is not an opcode it runs", (int)n, p);
        if (oi &&
            ((oi->op == 'R' && !c->reduce) || (oi->op == 'Q' && !c->persid) || (oi->op == 'b' && !c->build)))
            return pf_err(-EINVAL, "pickle interpreter: %s allowed without its callback", oi->name);
        if (oi)
            m->allowed[oi->op] = 1;
        p += n + (p[n] == ' ');
    }
    return 0;
}

int pk_parse(pk_doc **out, const void *buf, size_t size, const pk_config *cfg)
{
    *out = NULL;
    pk_machine m = {.cfg = cfg, .d = buf, .size = size};
    int rc = configure(&m, cfg);
    if (rc)
        return rc;
    size_t per;
    if (pf_mul_size(size, cfg->mem_per_byte, &per) < 0 || pf_add_size(per, cfg->mem_fixed, &m.budget) < 0)
        m.budget = SIZE_MAX;
    if (!(m.doc = calloc(1, sizeof *m.doc)))
        return pf_err(-ENOMEM, "%s: out of memory", cfg->what);
    rc = run(&m);
    if (!rc)
        rc = check_dicts(&m);
    free(m.stack);
    free(m.marks);
    free(m.memo);
    if (rc) {
        pk_free(m.doc);
        return rc;
    }
    *out = m.doc;
    return 0;
}

const pk_value *pk_root(const pk_doc *d)
{
    return d->root;
}

void pk_free(pk_doc *d)
{
    if (!d)
        return;
    for (size_t i = 0; i < d->ncont; i++)
        free(d->conts[i]->u.seq.v);
    free(d->conts);
    while (d->chunks) {
        chunk *c = d->chunks;
        d->chunks = c->next;
        free(c);
    }
    free(d);
}
