/* The .bin verification set reader: a pickle machine restricted to the opcodes listed in binset.h. */
#include "worker/eval/binset.h"

#include "common/checked.h"
#include "common/err.h"
#include "common/file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Opcode names as in CPython's Lib/pickletools.py (for messages; only some are accepted). */
static const char *op_name(uint8_t op)
{
    switch (op) {
    case '(': return "MARK";
    case '.': return "STOP";
    case '0': return "POP";
    case '1': return "POP_MARK";
    case '2': return "DUP";
    case 'F': return "FLOAT";
    case 'I': return "INT";
    case 'J': return "BININT";
    case 'K': return "BININT1";
    case 'L': return "LONG";
    case 'M': return "BININT2";
    case 'N': return "NONE";
    case 'P': return "PERSID";
    case 'Q': return "BINPERSID";
    case 'R': return "REDUCE";
    case 'S': return "STRING";
    case 'T': return "BINSTRING";
    case 'U': return "SHORT_BINSTRING";
    case 'V': return "UNICODE";
    case 'X': return "BINUNICODE";
    case 'a': return "APPEND";
    case 'b': return "BUILD";
    case 'c': return "GLOBAL";
    case 'd': return "DICT";
    case '}': return "EMPTY_DICT";
    case 'e': return "APPENDS";
    case 'g': return "GET";
    case 'h': return "BINGET";
    case 'i': return "INST";
    case 'j': return "LONG_BINGET";
    case 'l': return "LIST";
    case ']': return "EMPTY_LIST";
    case 'o': return "OBJ";
    case 'p': return "PUT";
    case 'q': return "BINPUT";
    case 'r': return "LONG_BINPUT";
    case 's': return "SETITEM";
    case 't': return "TUPLE";
    case ')': return "EMPTY_TUPLE";
    case 'u': return "SETITEMS";
    case 'G': return "BINFLOAT";
    case 'B': return "BINBYTES";
    case 'C': return "SHORT_BINBYTES";
    case 0x80: return "PROTO";
    case 0x81: return "NEWOBJ";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 0x85: return "TUPLE1";
    case 0x86: return "TUPLE2";
    case 0x87: return "TUPLE3";
    case 0x88: return "NEWTRUE";
    case 0x89: return "NEWFALSE";
    case 0x8a: return "LONG1";
    case 0x8b: return "LONG4";
    case 0x8c: return "SHORT_BINUNICODE";
    case 0x8d: return "BINUNICODE8";
    case 0x8e: return "BINBYTES8";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case 0x92: return "NEWOBJ_EX";
    case 0x93: return "STACK_GLOBAL";
    case 0x94: return "MEMOIZE";
    case 0x95: return "FRAME";
    case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    default: return NULL;
    }
}

enum { V_BYTES = 1, V_BOOL, V_LIST, V_TUPLE };

/* One pickle value: bytes (offset and length into the file), a bool, or a container (by id, so that
 * memo copies share identity as in Python). */
typedef struct pval {
    uint8_t kind;
    uint8_t b;
    uint32_t cont;
    uint64_t off, len;
} pval;

typedef struct pcont {
    uint8_t kind;
    pval *items;
    size_t n, cap;
} pcont;

typedef struct pm {
    const uint8_t *d;
    size_t size, pos;
    pval *stack;
    size_t sn, scap;
    size_t *marks;
    size_t mn, mcap;
    pval *memo;
    size_t memon, memocap;
    pcont *conts;
    size_t cn, ccap;
    size_t values; /* pushes so far, against BINSET_MAX_VALUES */
    size_t at;     /* offset of the opcode being run (for messages) */
    size_t bytes;  /* bytes the arrays above have allocated, against budget */
    size_t budget; /* BINSET_MEM_FIXED + BINSET_MEM_PER_BYTE x the pickle's size */
} pm;

/* What the allocator adds to each allocation, counted against the budget with the bytes asked for. */
#define ALLOC_OVERHEAD 16

/* Makes room for `need` elements of `elem` bytes in *p (capacity *cap): the first allocation holds `first`
 * (at least need), later ones double. Every byte allocated is counted against m->budget, so that the
 * memory a pickle can make the machine take is bounded by its size. Returns 0, -EPROTO naming the byte
 * offset when the budget would be exceeded, or -ENOMEM. */
static int grow(pm *m, void **p, size_t *cap, size_t need, size_t elem, size_t first)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : (first > need ? first : need);
    while (c < need)
        c = c > SIZE_MAX / 2 ? need : 2 * c;
    size_t nb, added, total;
    if (pf_mul_size(c, elem, &nb) < 0 ||
        pf_add_size((c - *cap) * elem, *cap ? 0 : ALLOC_OVERHEAD, &added) < 0 ||
        pf_add_size(m->bytes, added, &total) < 0 || total > m->budget)
        return pf_err(-EPROTO,
                      "at byte %zu: the pickle's lists, tuples and stack would take more than %zu bytes of "
                      "memory for a %zu-byte file (at most %d MiB + %d bytes per byte): not a verification "
                      "set",
                      m->at, m->budget, m->size, BINSET_MEM_FIXED >> 20, BINSET_MEM_PER_BYTE);
    void *q = realloc(*p, nb);
    if (!q)
        return pf_err(-ENOMEM, "out of memory reading the pickle (%zu values)", need);
    *p = q;
    *cap = c;
    m->bytes = total;
    return 0;
}

static int push(pm *m, pval v, size_t at)
{
    if (++m->values > BINSET_MAX_VALUES)
        return pf_err(-EPROTO, "more than %u values at byte %zu: not a verification set", BINSET_MAX_VALUES,
                      at);
    int rc = grow(m, (void **)&m->stack, &m->scap, m->sn + 1, sizeof(pval), 16);
    if (rc)
        return rc;
    m->stack[m->sn++] = v;
    return 0;
}

/* Values above the topmost mark (the only ones an opcode may touch, as in pickle's metastack). */
static size_t avail(const pm *m)
{
    return m->sn - (m->mn ? m->marks[m->mn - 1] : 0);
}

static int new_cont(pm *m, uint8_t kind, pval *out)
{
    int rc = grow(m, (void **)&m->conts, &m->ccap, m->cn + 1, sizeof(pcont), 16);
    if (rc)
        return rc;
    m->conts[m->cn] = (pcont){.kind = kind};
    *out = (pval){.kind = kind, .cont = (uint32_t)m->cn};
    m->cn++;
    return 0;
}

static int cont_add(pm *m, uint32_t c, const pval *v, size_t n)
{
    pcont *k = &m->conts[c];
    if (n == 0)
        return 0;
    /* the first allocation is exact: a tuple never grows, and most lists are filled by one APPENDS */
    int rc = grow(m, (void **)&k->items, &k->cap, k->n + n, sizeof(pval), 0);
    if (rc)
        return rc;
    memcpy(k->items + k->n, v, n * sizeof(pval));
    k->n += n;
    return 0;
}

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void pm_free(pm *m)
{
    for (size_t i = 0; i < m->cn; i++)
        free(m->conts[i].items);
    free(m->conts);
    free(m->stack);
    free(m->marks);
    free(m->memo);
}

static const char *kind_name(const pval *v)
{
    switch (v->kind) {
    case V_BYTES: return "bytes";
    case V_BOOL: return "bool";
    case V_LIST: return "list";
    case V_TUPLE: return "tuple";
    default: return "?";
    }
}

/* Runs the machine to STOP; *top gets the pickled value. */
static int run(pm *m, pval *top)
{
    for (;;) {
        size_t at = m->at = m->pos;
        if (at >= m->size)
            return pf_err(-EPROTO, "truncated at byte %zu: no STOP opcode", at);
        uint8_t op = m->d[m->pos++];
        size_t left = m->size - m->pos;
        const char *name = op_name(op);
        /* argument bytes of fixed-size arguments */
        int argn = 0;
        switch (op) {
        case 0x80:
        case 'U':
        case 'C':
        case 'q':
        case 'h': argn = 1; break;
        case 'T':
        case 'B':
        case 'r':
        case 'j': argn = 4; break;
        case 0x95:
        case 0x8e: argn = 8; break;
        default: break;
        }
        if ((size_t)argn > left)
            return pf_err(-EPROTO, "truncated at byte %zu (%s needs a %d-byte argument, %zu bytes left)", at,
                          name, argn, left);
        const uint8_t *arg = m->d + m->pos;
        m->pos += (size_t)argn;
        left -= (size_t)argn;
        int rc = 0;
        switch (op) {
        case 0x80: /* PROTO */
            if (arg[0] > 5)
                return pf_err(-EPROTO, "pickle protocol %d at byte %zu is not one of 0..5", arg[0], at);
            break;
        case 0x95: { /* FRAME: the frame's length must fit; opcodes are read across frames as usual */
            uint64_t n = le(arg, 8);
            if (n > left)
                return pf_err(-EPROTO, "truncated at byte %zu (FRAME of %llu bytes, %zu left)", at,
                              (unsigned long long)n, left);
            break;
        }
        case '.': /* STOP */
            if (m->mn != 0 || m->sn != 1)
                return pf_err(
                    -EPROTO,
                    "STOP at byte %zu with %zu values and %zu marks on the stack (expected one value)", at,
                    m->sn, m->mn);
            *top = m->stack[0];
            return 0;
        case '(': /* MARK */
            if ((rc = grow(m, (void **)&m->marks, &m->mcap, m->mn + 1, sizeof(size_t), 16)))
                return rc;
            if (++m->values > BINSET_MAX_VALUES)
                return pf_err(-EPROTO, "more than %u values at byte %zu: not a verification set",
                              BINSET_MAX_VALUES, at);
            m->marks[m->mn++] = m->sn;
            break;
        case ']':
        case ')': { /* EMPTY_LIST, EMPTY_TUPLE */
            pval v;
            if ((rc = new_cont(m, op == ']' ? V_LIST : V_TUPLE, &v)) || (rc = push(m, v, at)))
                return rc;
            break;
        }
        case 'U':
        case 'T':
        case 'C':
        case 'B':
        case 0x8e: { /* byte strings */
            uint64_t n = le(arg, argn);
            if (op == 'T' && (n & 0x80000000u))
                return pf_err(-EPROTO, "BINSTRING at byte %zu has a negative length", at);
            if (n > left)
                return pf_err(-EPROTO, "truncated at byte %zu (%s of %llu bytes, %zu bytes left)", at, name,
                              (unsigned long long)n, left);
            pval v = {.kind = V_BYTES, .off = m->pos, .len = n};
            m->pos += (size_t)n;
            if ((rc = push(m, v, at)))
                return rc;
            break;
        }
        case 0x88:
        case 0x89: { /* NEWTRUE, NEWFALSE */
            pval v = {.kind = V_BOOL, .b = op == 0x88};
            if ((rc = push(m, v, at)))
                return rc;
            break;
        }
        case 'I': { /* INT: only the protocol 0/1 bools "I01\n" and "I00\n" */
            if (left < 3 || m->d[m->pos] != '0' || (m->d[m->pos + 1] != '0' && m->d[m->pos + 1] != '1') ||
                m->d[m->pos + 2] != '\n')
                return pf_err(
                    -EPROTO,
                    "INT at byte %zu is not a bool (I01 / I00): only bools are allowed in a verification set",
                    at);
            pval v = {.kind = V_BOOL, .b = m->d[m->pos + 1] == '1'};
            m->pos += 3;
            if ((rc = push(m, v, at)))
                return rc;
            break;
        }
        case 'a': { /* APPEND */
            if (avail(m) < 2)
                return pf_err(-EPROTO, "APPEND at byte %zu: stack underflow", at);
            pval *l = &m->stack[m->sn - 2];
            if (l->kind != V_LIST)
                return pf_err(-EPROTO, "APPEND at byte %zu to a %s", at, kind_name(l));
            if ((rc = cont_add(m, l->cont, &m->stack[m->sn - 1], 1)))
                return rc;
            m->sn--;
            break;
        }
        case 'e': { /* APPENDS */
            if (m->mn == 0)
                return pf_err(-EPROTO, "APPENDS at byte %zu without a MARK", at);
            size_t mk = m->marks[--m->mn];
            if (mk == 0 || avail(m) < m->sn - mk + 1)
                return pf_err(-EPROTO, "APPENDS at byte %zu: no list below the MARK", at);
            pval *l = &m->stack[mk - 1];
            if (l->kind != V_LIST)
                return pf_err(-EPROTO, "APPENDS at byte %zu to a %s", at, kind_name(l));
            if ((rc = cont_add(m, l->cont, m->stack + mk, m->sn - mk)))
                return rc;
            m->sn = mk;
            break;
        }
        case 't':
        case 0x85:
        case 0x86:
        case 0x87: { /* TUPLE, TUPLE1..3 */
            size_t from;
            if (op == 't') {
                if (m->mn == 0)
                    return pf_err(-EPROTO, "TUPLE at byte %zu without a MARK", at);
                from = m->marks[--m->mn];
            } else {
                size_t k = (size_t)(op - 0x84);
                if (avail(m) < k)
                    return pf_err(-EPROTO, "%s at byte %zu: stack underflow", name, at);
                from = m->sn - k;
            }
            if (++m->values > BINSET_MAX_VALUES)
                return pf_err(-EPROTO, "more than %u values at byte %zu: not a verification set",
                              BINSET_MAX_VALUES, at);
            pval v;
            if ((rc = new_cont(m, V_TUPLE, &v)) || (rc = cont_add(m, v.cont, m->stack + from, m->sn - from)))
                return rc;
            m->sn = from;
            /* replaces what it consumed (counted above); the stack may be empty (MARK TUPLE) */
            if ((rc = grow(m, (void **)&m->stack, &m->scap, m->sn + 1, sizeof(pval), 16)))
                return rc;
            m->stack[m->sn++] = v;
            break;
        }
        case 'q':
        case 'r':
        case 0x94: { /* BINPUT, LONG_BINPUT, MEMOIZE */
            if (avail(m) < 1)
                return pf_err(-EPROTO, "%s at byte %zu: empty stack", name, at);
            uint64_t i = op == 0x94 ? m->memon : le(arg, argn);
            if (i > m->memon)
                return pf_err(-EPROTO,
                              "%s at byte %zu: memo index %llu skips past %zu (not written by a pickler)",
                              name, at, (unsigned long long)i, m->memon);
            if (i == m->memon) {
                if (m->memon >= BINSET_MAX_VALUES)
                    return pf_err(-EPROTO, "memo over %u entries at byte %zu", BINSET_MAX_VALUES, at);
                if ((rc = grow(m, (void **)&m->memo, &m->memocap, m->memon + 1, sizeof(pval), 16)))
                    return rc;
                m->memon++;
            }
            m->memo[i] = m->stack[m->sn - 1];
            break;
        }
        case 'h':
        case 'j': { /* BINGET, LONG_BINGET */
            uint64_t i = le(arg, argn);
            if (i >= m->memon)
                return pf_err(-EPROTO, "%s at byte %zu: memo index %llu was never stored", name, at,
                              (unsigned long long)i);
            if ((rc = push(m, m->memo[i], at)))
                return rc;
            break;
        }
        default:
            if (name)
                return pf_err(-EPROTO,
                              "pickle opcode %s (0x%02x) at byte %zu is not allowed in a verification set",
                              name, op, at);
            return pf_err(-EPROTO, "byte 0x%02x at byte %zu is not a pickle opcode", op, at);
        }
    }
}

void eval_binset_free(eval_binset *s)
{
    free(s->img);
    free(s->img_len);
    free(s->issame);
    free(s->owned);
    memset(s, 0, sizeof *s);
}

int eval_binset_parse(eval_binset *s, const uint8_t *data, size_t size)
{
    memset(s, 0, sizeof *s);
    pm m = {.d = data, .size = size};
    size_t per_byte;
    if (pf_mul_size(size, BINSET_MEM_PER_BYTE, &per_byte) < 0 ||
        pf_add_size(per_byte, BINSET_MEM_FIXED, &m.budget) < 0)
        m.budget = SIZE_MAX;
    pval top = {0};
    int rc = run(&m, &top);
    if (rc)
        goto out;
    const char *want = "expected a tuple (list of 2N images, list of N bools)";
    if (top.kind != V_TUPLE || m.conts[top.cont].n != 2) {
        rc = pf_err(-EPROTO, "%s, got a %s%s", want, kind_name(&top),
                    top.kind == V_TUPLE ? " of another length" : "");
        goto out;
    }
    const pval *tv = m.conts[top.cont].items;
    if (tv[0].kind != V_LIST || tv[1].kind != V_LIST) {
        rc = pf_err(-EPROTO, "%s, got (%s, %s)", want, kind_name(&tv[0]), kind_name(&tv[1]));
        goto out;
    }
    const pcont *bins = &m.conts[tv[0].cont], *same = &m.conts[tv[1].cont];
    if (same->n == 0 || bins->n != 2 * same->n) {
        rc = pf_err(-EPROTO, "%zu images for %zu pairs (expected 2 per pair, at least one pair)", bins->n,
                    same->n);
        goto out;
    }
    size_t n = same->n;
    s->img = malloc(2 * n * sizeof *s->img);
    s->img_len = malloc(2 * n * sizeof *s->img_len);
    s->issame = malloc(n);
    if (!s->img || !s->img_len || !s->issame) {
        rc = pf_err(-ENOMEM, "out of memory for %zu pairs", n);
        goto out;
    }
    for (size_t i = 0; i < 2 * n; i++) {
        if (bins->items[i].kind != V_BYTES) {
            rc = pf_err(-EPROTO, "image %zu is a %s, not bytes", i, kind_name(&bins->items[i]));
            goto out;
        }
        s->img[i] = data + bins->items[i].off;
        s->img_len[i] = (size_t)bins->items[i].len;
    }
    for (size_t i = 0; i < n; i++) {
        if (same->items[i].kind != V_BOOL) {
            rc = pf_err(-EPROTO, "issame[%zu] is a %s, not a bool", i, kind_name(&same->items[i]));
            goto out;
        }
        s->issame[i] = same->items[i].b;
    }
    s->n_pairs = (int64_t)n;
out:
    pm_free(&m);
    if (rc)
        eval_binset_free(s);
    return rc;
}

int eval_binset_load(eval_binset *s, const char *path)
{
    memset(s, 0, sizeof *s);
    uint8_t *buf;
    size_t size;
    int rc = pf_read_file(path, 0, &buf, &size);
    if (rc)
        return pf_err_wrap(rc, "%s", path);
    rc = eval_binset_parse(s, buf, size);
    if (rc) {
        free(buf);
        return pf_err_wrap(rc, "%s", path);
    }
    s->owned = buf;
    s->owned_len = size;
    return 0;
}
