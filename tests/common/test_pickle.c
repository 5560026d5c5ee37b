/* The allow-list pickle interpreter (common/pickle.c) on pickles written here byte by byte, every expected
 * value and offset worked out by hand from the bytes:
 *   - one pickle using every opcode the interpreter runs (40), read into the tree its bytes describe (values,
 *     depths, shared memo entries, bytes pointing into the input, the callbacks' results), and every proper
 *     prefix of it refused;
 *   - refusals naming the opcode, the global or the problem and the byte offset, exactly;
 *   - each limit (depth, MARKs, memo, string and bytes length, elements, values, memory) at its bound;
 *   - the tree's rules (cycles, changed containers, dict keys) and a caller's mistakes in the config. */
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "common/pickle.h"
#include "tests/check.h"

enum { G_THING = 7 };

static const pk_global globals[] = {{"test", "thing", "test.thing", G_THING, 3}};

static const char thing_payload[] = "the thing";

typedef struct user {
    int64_t built; /* BUILD's state, summed */
} user;

/* REDUCE of test.thing(): a value of the caller's own kind. */
static int reduce_cb(pk_machine *m, void *u, const pk_value *fn, const pk_value *args, pk_value **out)
{
    (void)u;
    if (fn->u.g.id != G_THING || args->u.seq.n != 0)
        return pk_fail(m, "only test.thing()");
    int rc = pk_new(m, PK_USER, out);
    if (rc)
        return rc;
    (*out)->u.obj.p = thing_payload;
    (*out)->u.obj.name = "thing";
    (*out)->u.obj.aname = "a thing";
    return 0;
}

/* BINPERSID of an int i: the int 100 x i. */
static int persid_cb(pk_machine *m, void *u, const pk_value *pid, pk_value **out)
{
    (void)u;
    if (pid->kind != PK_INT)
        return pk_fail(m, "a persistent id that is %s", pk_a_kind(pid));
    int rc = pk_new(m, PK_INT, out);
    if (!rc)
        (*out)->u.i = 100 * pid->u.i;
    return rc;
}

/* BUILD of an empty dict with an int state: the state summed into user.built. */
static int build_cb(pk_machine *m, void *u, pk_value *obj, pk_value *state)
{
    if (obj->kind != PK_DICT || state->kind != PK_INT)
        return pk_fail(m, "BUILD on %s with %s", pk_a_kind(obj), pk_a_kind(state));
    ((user *)u)->built += state->u.i;
    return 0;
}

static user the_user;

static pk_config all_ops(void)
{
    return (pk_config){
        .what = "t",
        .opcodes =
            "PROTO FRAME STOP MARK EMPTY_DICT EMPTY_LIST EMPTY_TUPLE BINUNICODE SHORT_BINUNICODE BININT "
            "BININT1 BININT2 LONG1 BINFLOAT NEWTRUE NEWFALSE NONE INT TUPLE TUPLE1 TUPLE2 TUPLE3 SETITEM "
            "SETITEMS APPEND APPENDS BINPUT LONG_BINPUT MEMOIZE BINGET LONG_BINGET GLOBAL REDUCE "
            "BINPERSID BUILD BINBYTES SHORT_BINBYTES BINBYTES8 BINSTRING SHORT_BINSTRING",
        .globals = globals,
        .nglobals = 1,
        .globals_hint = "only test.thing",
        .reduce = reduce_cb,
        .persid = persid_cb,
        .build = build_cb,
        .user = &the_user,
        .max_depth = 16,
        .max_str = 1024,
        .max_items = 1024,
        .max_memo = 1024,
        .max_values = 1024,
        .mem_fixed = 1u << 20,
        .mem_per_byte = 64,
    };
}

/* The body after PROTO 4 and FRAME (offset 11 on). Each line: the opcodes and what they leave. */
/* clang-format off */
#define BODY                                                                                                 \
    "}q\x00"                         /* d = {}; memo[0] = d */                                             \
    "("                              /* MARK */                                                            \
    "X\x01\0\0\0a" "K\x07"           /* 'a': 7 (BINUNICODE, BININT1) */                                    \
    "\x8c\x01" "b" "J\xfe\xff\xff\xff" /* 'b': -2 (BININT) */                                              \
    "\x8c\x01" "c" "M\x34\x12"       /* 'c': 0x1234 = 4660 (BININT2) */                                    \
    "\x8c\x01" "d" "\x8a\x05\0\0\0\0\x80" /* 'd': 0x80_0000_0000 - 2^40 = -2^39 (LONG1, 5 bytes) */         \
    "\x8c\x01" "e" "G\x40\x09\x21\xfb\x54\x44\x2d\x18" /* 'e': pi (BINFLOAT, big-endian) */               \
    "\x8c\x01" "f" "I-42\n"          /* 'f': -42 (INT) */                                                  \
    "\x8c\x01" "g" "I01\n"           /* 'g': True (INT 01) */                                              \
    "u"                              /* SETITEMS */                                                        \
    "\x8c\x01" "h" "]\x94"           /* 'h': a list; memo[1] = it (MEMOIZE) */                             \
    "(\x88\x89N" "e"                 /* APPENDS True, False, None */                                       \
    "C\x02hi" "a" "s"                /* APPEND b'hi' (SHORT_BINBYTES); SETITEM */                          \
    "\x8c\x01" "i" "B\x01\0\0\0x" "\x8e\x01\0\0\0\0\0\0\0y" "T\x01\0\0\0z" "U\x01w" /* bytes x y z w */   \
    "\x87\x86s"                      /* 'i': (b'x', (b'y', b'z', b'w')) (TUPLE3, TUPLE2) */                \
    "\x8c\x01" "j" "(K\x01K\x02t" "\x85" "r\x02\0\0\0" /* ((1, 2),); memo[2] = it (LONG_BINPUT) */         \
    ")\x86s"                         /* 'j': (((1, 2),), ()) */                                            \
    "\x8c\x01" "k" "h\x01s"          /* 'k': memo[1], the list of 'h' (BINGET) */                          \
    "\x8c\x01" "l" "j\x02\0\0\0s"    /* 'l': memo[2] (LONG_BINGET) */                                      \
    "\x8c\x01" "m" "ctest\nthing\n)Rs" /* 'm': test.thing() (GLOBAL, REDUCE) */                            \
    "\x8c\x01" "n" "K\x05Qs"         /* 'n': persistent id 5 -> 500 (BINPERSID) */                         \
    "\x8c\x01" "o" "}K\x09" "bs"     /* 'o': {} after BUILD with 9 */                                      \
    "."
/* clang-format on */

typedef struct buf {
    uint8_t b[1024];
    size_t n;
} buf;

/* PROTO 4, FRAME of the rest, BODY. */
static buf every_opcode(void)
{
    buf p = {{0x80, 4, 0x95}, 11};
    memcpy(p.b + 11, BODY, sizeof(BODY) - 1);
    p.n = 11 + sizeof(BODY) - 1;
    uint64_t rest = p.n - 11;
    for (int i = 0; i < 8; i++)
        p.b[3 + i] = (uint8_t)(rest >> (8 * i));
    return p;
}

static const pk_value *get(const pk_value *d, const char *key)
{
    for (size_t i = 0; d && d->kind == PK_DICT && i < d->u.seq.n; i += 2)
        if (d->u.seq.v[i]->kind == PK_STR && !strcmp(d->u.seq.v[i]->u.str.s, key))
            return d->u.seq.v[i + 1];
    return NULL;
}

static int is_int(const pk_value *v, int64_t want)
{
    return v && v->kind == PK_INT && v->u.i == want;
}

static int is_bytes(const pk_value *v, const char *want)
{
    return v && v->kind == PK_BYTES && v->u.str.len == strlen(want) &&
           !memcmp(v->u.str.s, want, v->u.str.len);
}

static void check_tree(const buf *p, const pk_value *d)
{
    check(d->kind == PK_DICT && d->u.seq.n == 30 && d->depth == 4 && !d->sealed,
          "root: a dict of 15 pairs, depth 4 ('j' is 3 deep), not sealed");
    check(is_int(get(d, "a"), 7) && is_int(get(d, "b"), -2) && is_int(get(d, "c"), 4660),
          "BININT1 7, BININT -2, BININT2 4660");
    check(is_int(get(d, "d"), -549755813888), "LONG1 of 5 bytes 00 00 00 00 80: -2^39");
    const pk_value *e = get(d, "e");
    check(e && e->kind == PK_FLOAT && e->u.f == 3.141592653589793, "BINFLOAT 400921fb54442d18: pi");
    check(is_int(get(d, "f"), -42), "INT -42");
    const pk_value *g = get(d, "g"), *h = get(d, "h");
    check(g && g->kind == PK_BOOL && g->u.i == 1, "INT 01: True");
    check(h && h->kind == PK_LIST && h->u.seq.n == 4 && h->sealed && h->depth == 1,
          "'h': a list of 4, sealed (placed in the dict)");
    if (h && h->kind == PK_LIST && h->u.seq.n == 4) {
        pk_value *const *v = h->u.seq.v;
        check(v[0] == g && v[1]->kind == PK_BOOL && v[1]->u.i == 0 && v[2]->kind == PK_NONE,
              "'h': True (the same value as INT 01's), False, None");
        check(is_bytes(v[3], "hi") && (const uint8_t *)v[3]->u.str.s > p->b &&
                  (const uint8_t *)v[3]->u.str.s < p->b + p->n,
              "'h'[3]: b'hi', pointing into the input");
    }
    const pk_value *i = get(d, "i");
    check(i && i->kind == PK_TUPLE && i->u.seq.n == 2 && is_bytes(i->u.seq.v[0], "x") &&
              i->u.seq.v[1]->kind == PK_TUPLE && i->u.seq.v[1]->u.seq.n == 3 &&
              is_bytes(i->u.seq.v[1]->u.seq.v[0], "y") && is_bytes(i->u.seq.v[1]->u.seq.v[1], "z") &&
              is_bytes(i->u.seq.v[1]->u.seq.v[2], "w"),
          "'i': (b'x', (b'y', b'z', b'w')) from BINBYTES, BINBYTES8, BINSTRING, SHORT_BINSTRING");
    const pk_value *j = get(d, "j"), *l = get(d, "l");
    check(j && j->kind == PK_TUPLE && j->u.seq.n == 2 && j->depth == 3 && j->u.seq.v[1]->kind == PK_TUPLE &&
              j->u.seq.v[1]->u.seq.n == 0,
          "'j': (((1, 2),), ()), depth 3");
    check(l && j && l == j->u.seq.v[0] && l->u.seq.n == 1 && l->u.seq.v[0]->u.seq.n == 2 &&
              is_int(l->u.seq.v[0]->u.seq.v[0], 1) && is_int(l->u.seq.v[0]->u.seq.v[1], 2),
          "'l': memo[2], the same value as 'j'[0], ((1, 2),)");
    check(get(d, "k") == h, "'k': memo[1], the same list as 'h'");
    const pk_value *m = get(d, "m");
    check(m && m->kind == PK_USER && m->u.obj.p == thing_payload && !strcmp(pk_kind_name(m), "thing"),
          "'m': test.thing() through the REDUCE callback");
    check(is_int(get(d, "n"), 500), "'n': BINPERSID of 5 -> 500 through the callback");
    const pk_value *o = get(d, "o");
    check(o && o->kind == PK_DICT && o->u.seq.n == 0 && the_user.built == 9,
          "'o': an empty dict, BUILD's callback given 9");
}

static void every_op(void)
{
    buf p = every_opcode();
    pk_config c = all_ops();
    pk_doc *d;
    int rc = pk_parse(&d, p.b, p.n, &c);
    check(rc == 0, "the pickle of every opcode reads (%s)", rc ? pf_errmsg() : "");
    if (rc)
        return;
    check_tree(&p, pk_root(d));
    pk_free(d);
    int bad = 0;
    for (size_t k = 0; k < p.n; k++) {
        uint8_t cut[1024];
        memcpy(cut, p.b, k);
        pf_err_clear();
        rc = pk_parse(&d, cut, k, &c);
        bad += rc != -EPROTO || d != NULL || !pf_errmsg()[0];
        if (rc == 0)
            pk_free(d);
    }
    check(bad == 0, "each of its %zu proper prefixes refused with -EPROTO and a message", p.n);
}

/* b[0..n) under c: refused with exactly `want`. */
static void refused_as(const pk_config *c, const char *b, size_t n, const char *want)
{
    pk_doc *d = (pk_doc *)&d;
    pf_err_clear();
    int rc = pk_parse(&d, b, n, c);
    check(rc == -EPROTO && d == NULL && !strcmp(pf_errmsg(), want), "%s (got %d: %s)", want, rc, pf_errmsg());
    if (rc == 0)
        pk_free(d);
}

#define REFUSED(c, lit, want) refused_as(c, lit, sizeof(lit) - 1, want)

static void refusals(void)
{
    pk_config c = all_ops();
    pk_config few = c;
    few.opcodes = "PROTO STOP EMPTY_LIST";
    REFUSED(&few, "\x80\x02]K\x01.", "t: pickle opcode BININT1 (0x4b) at offset 3 not allowed");
    REFUSED(&few, "\x80\x02]\x93.", "t: pickle opcode STACK_GLOBAL (0x93) at offset 3 not allowed");
    REFUSED(&c, "\x80\x02\xff", "t: byte 0xff at pickle offset 2 is not a pickle opcode");
    REFUSED(&c, "\x80\x02]cos\nsystem\n",
            "t: pickle GLOBAL 'os system' at offset 3 not allowed (only test.thing)");
    REFUSED(&c, "ctest\nthing", "t: pickle offset 0: GLOBAL: no end of line within 256 bytes");
    REFUSED(&c, "\x80\x06", "t: pickle offset 0: pickle protocol 6 (0..5)");
    REFUSED(&c, "\x95\x05\0\0\0\0\0\0\0].", "t: pickle offset 0: truncated: a FRAME of 5 bytes, 2 left");
    REFUSED(&c, "K", "t: pickle offset 0: truncated: BININT1 needs 1 argument bytes, 0 left");
    REFUSED(&c, "]X\x05\0\0\0ab", "t: pickle offset 1: truncated: a string of 5 bytes, 2 left");
    REFUSED(&c,
            "]T\xfb\xff\xff\xff"
            "ab",
            "t: pickle offset 1: BINSTRING of a negative length (-5)");
    REFUSED(&c, "X\x02\0\0\0\xc3\x28.", "t: pickle offset 0: a string that is not UTF-8 or holds a NUL byte");
    REFUSED(&c, "\x8a\x09\1\1\1\1\1\1\1\1\1.", "t: pickle offset 0: an integer of 9 bytes (at most 8)");
    REFUSED(&c, "I9223372036854775808\n.", "t: pickle offset 0: INT: not a decimal integer within 64 bits");
    REFUSED(&c, "I12x\n.", "t: pickle offset 0: INT: not a decimal integer within 64 bits");
    REFUSED(&c, "I\n.", "t: pickle offset 0: INT: not a decimal integer");
    REFUSED(&c, "K\x01K\x02.",
            "t: pickle offset 4: STOP with 2 values and 0 MARKs on the stack (expected one value)");
    REFUSED(&c, "(K\x01.",
            "t: pickle offset 3: STOP with 1 values and 1 MARKs on the stack (expected one value)");
    REFUSED(&c, "]", "t: pickle offset 1: truncated: no STOP opcode");
    REFUSED(&c, "K\x01\x86", "t: pickle offset 2: TUPLE2: stack underflow");
    REFUSED(&c, "t", "t: pickle offset 0: TUPLE without a MARK");
    REFUSED(&c,
            ")K\x01"
            "a",
            "t: pickle offset 3: APPEND into a tuple");
    REFUSED(&c, "K\x01q\x05", "t: pickle offset 2: BINPUT: memo index 5 skips past 0");
    REFUSED(&c, "h\x00", "t: pickle offset 0: BINGET: memo index 0 was never stored");
    REFUSED(&c, "Q", "t: pickle offset 0: BINPERSID: empty stack");
    REFUSED(&c, "K\x01)R",
            "t: pickle offset 3: REDUCE of an int with a tuple (only an allowed global with a tuple)");
    REFUSED(&c, "ctest\nthing\nK\x01\x85R", "t: pickle offset 15: only test.thing()");
    REFUSED(&c,
            "]K\x01"
            "b",
            "t: pickle offset 3: BUILD on a list with an int");
    REFUSED(&c,
            "]q\x00h\x00"
            "a",
            "t: pickle offset 5: a list is placed inside itself");
    REFUSED(&c,
            "]q\x00]q\x01h\x00"
            "aa",
            "t: pickle offset 9: a list is changed after it was placed inside another value");
    REFUSED(&c, "})K\x01s",
            "t: pickle offset 4: a dict key that is a tuple (only str and int keys are read)");
    REFUSED(&c, "}(K\x07K\x01K\x07K\x02u.", "t: pickle: a dict holds the key 7 twice");
    REFUSED(&c, "}(K\x01u", "t: pickle offset 4: SETITEMS with an odd number of values (1)");
}

static void limits(void)
{
    pk_config c = all_ops();
    c.max_depth = 3;
    /* lists at offsets 0-3; the APPENDs at 4, 5, 6 make depths 2, 3, 4 */
    REFUSED(&c, "]]]]aaa.", "t: pickle offset 6: values nested deeper than 3");
    pk_doc *d;
    check(pk_parse(&d, "]]]aa.", 6, &c) == 0 && pk_root(d)->depth == 3, "three nested lists: depth 3, read");
    pk_free(d);
    REFUSED(&c, "((((", "t: pickle offset 3: more than 3 MARKs open");
    c = all_ops();
    c.max_memo = 2;
    REFUSED(&c, "K\x01q\x00q\x01\x94.", "t: pickle offset 6: memo of more than 2 entries");
    c.max_str = 3;
    REFUSED(&c,
            "C\x04"
            "abcd.",
            "t: pickle offset 0: a bytes value of 4 bytes (at most 3)");
    REFUSED(&c, "X\x04\0\0\0abcd.", "t: pickle offset 0: a string of 4 bytes (at most 3)");
    check(pk_parse(&d,
                   "C\x03"
                   "abc.",
                   6, &c) == 0 &&
              pk_root(d)->u.str.len == 3,
          "3 bytes: read");
    pk_free(d);
    c = all_ops();
    c.max_items = 2;
    REFUSED(&c,
            "](K\x01K\x02K\x03"
            "e.",
            "t: pickle offset 8: a list of more than 2 elements");
    c = all_ops();
    c.max_values = 3;
    REFUSED(&c, "K\x01K\x02K\x03K\x04", "t: pickle offset 6: more than 3 values");
    /* 2 bytes of pickle at 1 byte per byte: the first value's memory is over the bound */
    c = all_ops();
    c.mem_fixed = 0;
    c.mem_per_byte = 1;
    REFUSED(
        &c, "].",
        "t: pickle offset 0: the pickle's values would take more than 2 bytes of memory for a 2-byte pickle "
        "(at most 0 bytes + 1 bytes per byte)");
    c.mem_fixed = 1u << 20;
    c.mem_per_byte = 0;
    check(pk_parse(&d, "].", 2, &c) == 0, "the same within 1 MiB: read");
    pk_free(d);
}

static void config_errors(void)
{
    pk_config c = all_ops();
    pk_doc *d;
    c.opcodes = "PROTO STOP FOO";
    check(pk_parse(&d, ".", 1, &c) == -EINVAL && strstr(pf_errmsg(), "FOO is not an opcode it runs"),
          "an unknown opcode name: -EINVAL (%s)", pf_errmsg());
    c.opcodes = "POP STOP";
    check(pk_parse(&d, ".", 1, &c) == -EINVAL && strstr(pf_errmsg(), "POP is not an opcode it runs"),
          "an opcode it does not run: -EINVAL (%s)", pf_errmsg());
    c = all_ops();
    c.reduce = NULL;
    check(pk_parse(&d, ".", 1, &c) == -EINVAL && strstr(pf_errmsg(), "REDUCE allowed without its callback"),
          "REDUCE without its callback: -EINVAL (%s)", pf_errmsg());
    c = all_ops();
    c.max_depth = 0;
    check(pk_parse(&d, ".", 1, &c) == -EINVAL && d == NULL, "a limit of 0: -EINVAL (%s)", pf_errmsg());
}

int main(void)
{
    every_op();
    refusals();
    limits();
    config_errors();
    return check_summary();
}
