/* common/torch_pt: the allow-list pickle interpreter on pickles written by hand (byte by byte, as
 * CPython's pickletools.dis lists protocol 2: the values of a checkpoint-like dict read back as written;
 * every opcode and global outside the allow-list, os.system among them, refused naming it and its offset;
 * every prefix of a valid pickle refused; cycles, deep nesting, duplicate keys, bad strings, malformed tensor
 * arguments refused), then torch.save's zip archives built here with libzip around a pickle this file writes
 * (the layout torch 1.13 writes: `<stem>/data.pkl` stored, `<stem>/data/<key>` raw storages): tensors read
 * back with their offsets, strides, rows and dtypes; every archive-level refusal (a storage too short for its
 * view, an entry of the wrong size or missing, a data.pkl over the bound or declaring more than deflate
 * yields, a flipped bit (CRC), entries outside a folder, a TorchScript archive, a big-endian one, a legacy
 * torch.save file, truncated archives, a FIFO); and model_load_pretrained of a state_dict and of an arcface_torch checkpoint
 * dict giving the saved model's eval forward bit for bit, with a missing, F64, NaN or extra tensor refused
 * naming it. With --forward / --tensor it is the pfcps side of test_torch_pt.py (files written by torch
 * itself): see tool_forward and tool_tensor. Last, common/torch_ckpt's reading of a checkpoint_gpu file's epoch,
 * global_step and lr, and its refusals. */
#include "common/file.h"
#include "common/torch_ckpt.h"
#include "common/torch_pt.h"
#include "tests/check.h"
#include "tests/worker/model/model_make.h"
#include "worker/model/safetensors.h"

#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zip.h>

static char dir[64];

/* ---- byte buffers and a small pickler (what torch.save writes for a dict of tensors) ---- */

typedef struct buf {
    unsigned char *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *s, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p)
            DIE("out of memory");
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void op(buf *b, int c)
{
    unsigned char x = (unsigned char)c;
    put(b, &x, 1);
}

static void le32(buf *b, uint32_t v)
{
    unsigned char x[4] = {v & 0xff, (v >> 8) & 0xff, (v >> 16) & 0xff, v >> 24};
    put(b, x, 4);
}

static void str(buf *b, const char *s) /* BINUNICODE */
{
    op(b, 'X');
    le32(b, (uint32_t)strlen(s));
    put(b, s, strlen(s));
}

static void integer(buf *b, int64_t v) /* BININT1 / BININT2 / BININT / LONG1, as pickle picks */
{
    if (v >= 0 && v < 256) {
        op(b, 'K');
        op(b, (int)v);
    } else if (v >= 0 && v < 65536) {
        op(b, 'M');
        op(b, (int)(v & 0xff));
        op(b, (int)(v >> 8));
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        op(b, 'J');
        le32(b, (uint32_t)(int32_t)v);
    } else {
        op(b, 0x8a);
        op(b, 8);
        for (int i = 0; i < 8; i++)
            op(b, (int)(((uint64_t)v >> (8 * i)) & 0xff));
    }
}

static void global(buf *b, const char *mod, const char *name)
{
    op(b, 'c');
    put(b, mod, strlen(mod));
    op(b, '\n');
    put(b, name, strlen(name));
    op(b, '\n');
}

static void odict(buf *b) /* OrderedDict() */
{
    global(b, "collections", "OrderedDict");
    op(b, ')');
    op(b, 'R');
}

/* One tensor of a pickle: _rebuild_tensor_v2 over storage `key`. */
typedef struct pt {
    const char *name, *stype, *key;
    int64_t numel, offset;
    int ndim;
    int64_t shape[TP_MAX_DIMS + 1], stride[TP_MAX_DIMS + 1]; /* one more: a pickle of too many dimensions */
} pt;

static void tensor(buf *b, const pt *t)
{
    global(b, "torch._utils", "_rebuild_tensor_v2");
    op(b, '(');
    op(b, '(');
    str(b, "storage");
    global(b, "torch", t->stype);
    str(b, t->key);
    str(b, "cpu");
    integer(b, t->numel);
    op(b, 't');
    op(b, 'Q');
    integer(b, t->offset);
    op(b, '(');
    for (int k = 0; k < t->ndim; k++)
        integer(b, t->shape[k]);
    op(b, 't');
    op(b, '(');
    for (int k = 0; k < t->ndim; k++)
        integer(b, t->stride[k]);
    op(b, 't');
    op(b, 0x89);
    odict(b);
    op(b, 't');
    op(b, 'R');
}

/* An OrderedDict of the tensors with Module.state_dict's `_metadata` BUILD. */
static void state_dict(buf *b, const pt *t, int n)
{
    odict(b);
    op(b, '(');
    for (int i = 0; i < n; i++) {
        str(b, t[i].name);
        tensor(b, &t[i]);
    }
    op(b, 'u');
    op(b, '}');
    str(b, "_metadata");
    odict(b);
    op(b, '(');
    str(b, "");
    op(b, '}');
    str(b, "version");
    integer(b, 1);
    op(b, 's');
    op(b, 'u');
    op(b, 's');
    op(b, 'b');
}

/* ---- zip archives (libzip writes them) ---- */

typedef struct zent {
    const char *name;
    const void *data;
    size_t n;
    int deflate;
} zent;

static void write_zip(const char *path, const zent *e, int n)
{
    int err;
    unlink(path);
    zip_t *za = zip_open(path, ZIP_CREATE | ZIP_TRUNCATE, &err);
    if (!za)
        DIE("zip_open %s: %d", path, err);
    for (int i = 0; i < n; i++) {
        zip_source_t *s = zip_source_buffer(za, e[i].data, e[i].n, 0);
        zip_int64_t idx = s ? zip_file_add(za, e[i].name, s, ZIP_FL_ENC_UTF_8) : -1;
        if (idx < 0 ||
            zip_set_file_compression(za, (zip_uint64_t)idx, e[i].deflate ? ZIP_CM_DEFLATE : ZIP_CM_STORE, 0))
            DIE("zip add %s: %s", e[i].name, zip_strerror(za));
    }
    if (zip_close(za))
        DIE("zip_close %s: %s", path, zip_strerror(za));
}

/* path := an archive `m/` with data.pkl = pk and the storages data/<key[i]>. */
static void write_pt(const char *path, const buf *pk, const char *const *keys, const void *const *data,
                     const size_t *bytes, int ns)
{
    zent *e = xmalloc((size_t)(ns + 2) * sizeof *e);
    char(*names)[64] = xmalloc((size_t)(ns + 1) * sizeof *names);
    int n = 0;
    e[n++] = (zent){"m/data.pkl", pk->p, pk->n, 0};
    for (int i = 0; i < ns; i++) {
        snprintf(names[i], sizeof names[i], "m/data/%s", keys[i]);
        e[n++] = (zent){names[i], data[i], bytes[i], 0};
    }
    e[n++] = (zent){"m/version", "3\n", 2, 0};
    write_zip(path, e, n);
    free(names);
    free(e);
}

/* rc < 0 with a message holding `want`. */
static void refused(int rc, const char *want, const char *what)
{
    check(rc < 0 && strstr(pf_errmsg(), want) != NULL, "%s: refused (%s)", what, pf_errmsg());
}

static int parse(const buf *b, tp_pickle **p)
{
    return tp_parse_pickle(p, b->p, b->n, "hand.pkl");
}

/* ---- the interpreter ---- */

/* {'epoch': 3, 'global_step': 70000, 'lr': 0.1, 'neg': -5, 'big': 2^40, 'flags': [True, False, None],
 * 'pair': (1, 'a'), 'state': {7: {'m': 'x'}}} as pickle protocol 2 writes it (memo entries included). */
static void values(void)
{
    static const unsigned char pk[] = {
        0x80, 2,   '}',  'q',  0,    '(',                          /* PROTO 2, EMPTY_DICT, BINPUT 0, MARK */
        0x8c, 5,   'e',  'p',  'o',  'c',  'h', 'q',  1,   'K', 3, /* 'epoch': 3 */
        'X',  11,  0,    0,    0,    'g',  'l', 'o',  'b', 'a', 'l',  '_',  's',  't',  'e',  'p',  'q',
        2,    'J', 0x70, 0x11, 0x01, 0x00, /* 70000 */
        'X',  2,   0,    0,    0,    'l',  'r', 'q',  3,   'G', 0x3f, 0xb9, 0x99, 0x99, 0x99, 0x99, 0x99,
        0x9a,                                                                                 /* 0.1 */
        'X',  3,   0,    0,    0,    'n',  'e', 'g',  'q', 4,   'J',  0xfb, 0xff, 0xff, 0xff, /* -5 */
        'X',  3,   0,    0,    0,    'b',  'i', 'g',  'q', 5,   0x8a, 6,    0,    0,    0,    0,    0,
        1, /* LONG1 2^40 */
        'X',  5,   0,    0,    0,    'f',  'l', 'a',  'g', 's', 'q',  6,    ']',  'q',  7,    '(',  0x88,
        0x89, 'N', 'e',  'X',  4,    0,    0,   0,    'p', 'a', 'i',  'r',  'q',  8,    'K',  1,    'X',
        1,    0,   0,    0,    'a',  'q',  9,   0x86, 'q', 10,  'X',  5,    0,    0,    0,    's',  't',
        'a',  't', 'e',  'q',  11,   '}',  'q', 12,   'K', 7,   '}',  'q',  13,   'X',  1,    0,    0,
        0,    'm', 'q',  14,   'X',  1,    0,   0,    0,   'x', 'q',  15,   's',  's', /* {7: {'m': 'x'}} */
        'u',  '.',                                                                     /* SETITEMS, STOP */
    };
    tp_pickle *p;
    int rc = tp_parse_pickle(&p, pk, sizeof pk, "values.pkl");
    check(rc == 0, "hand-written checkpoint-like pickle parses (%s)", rc ? pf_errmsg() : "");
    if (rc)
        return;
    const tp_value *r = tp_pickle_root(p), *v;
    check(r->kind == TP_DICT && r->u.seq.n == 16 && !r->ordered, "root: a plain dict of 8 pairs");
    v = tp_dict_get(r, "epoch");
    check(v && v->kind == TP_INT && v->u.i == 3, "epoch = 3 (BININT1)");
    v = tp_dict_get(r, "global_step");
    check(v && v->kind == TP_INT && v->u.i == 70000, "global_step = 70000 (BININT)");
    v = tp_dict_get(r, "lr");
    check(v && v->kind == TP_FLOAT && v->u.f == 0.1, "lr = 0.1 (BINFLOAT, big-endian)");
    v = tp_dict_get(r, "neg");
    check(v && v->kind == TP_INT && v->u.i == -5, "neg = -5 (BININT, signed)");
    v = tp_dict_get(r, "big");
    check(v && v->kind == TP_INT && v->u.i == (int64_t)1 << 40, "big = 2^40 (LONG1 of 6 bytes)");
    v = tp_find(r, "flags");
    check(v && v->kind == TP_LIST && v->u.seq.n == 3 && v->u.seq.v[0]->kind == TP_BOOL &&
              v->u.seq.v[0]->u.i == 1 && v->u.seq.v[1]->kind == TP_BOOL && v->u.seq.v[1]->u.i == 0 &&
              v->u.seq.v[2]->kind == TP_NONE,
          "flags = [True, False, None]");
    v = tp_find(r, "pair/1");
    check(v && v->kind == TP_STR && !strcmp(v->u.str.s, "a") && v->u.str.len == 1,
          "pair/1 = 'a' (tuple index)");
    v = tp_find(r, "state/7/m");
    check(v && v->kind == TP_STR && !strcmp(v->u.str.s, "x"), "state/7/m = 'x' (int key 7)");
    check(tp_find(r, "state/8") == NULL && tp_find(r, "pair/2") == NULL && tp_find(r, "nope") == NULL,
          "missing paths give NULL");
    check(tp_find(r, "state")->depth == 2 && r->depth == 3, "depths: state 2, root 3");
    tp_pickle_free(p);
}

/* A pickle from bytes: PROTO 2 + body + STOP. */
static buf pk_of(const void *body, size_t n)
{
    buf b = {0};
    op(&b, 0x80);
    op(&b, 2);
    put(&b, body, n);
    op(&b, '.');
    return b;
}

static void expect_refused(const void *body, size_t n, const char *want, const char *what)
{
    buf b = pk_of(body, n);
    tp_pickle *p = (tp_pickle *)&b;
    int rc = parse(&b, &p);
    refused(rc, want, what);
    check(rc == 0 || p == NULL, "%s: nothing returned on refusal", what);
    if (rc == 0)
        tp_pickle_free(p);
    free(b.p);
}

/* A pickle body written as a string literal (its length without the terminating NUL). */
#define REFUSED(lit, want, what) expect_refused(lit, sizeof(lit) - 1, want, what)

/* torch's storage reference ('storage', torch.FloatStorage, '0', 'cpu', 6) followed by BINPERSID. */
#define PID                                                                                                  \
    "(X\x07\0\0\0storagectorch\nFloatStorage\nX\x01\0\0\0"                                                   \
    "0"                                                                                                      \
    "X\x03\0\0\0cpuK\x06tQ"

static void refusals(void)
{
    REFUSED("cos\nsystem\nX\x04\0\0\0trueq\x00\x85R",
            "hand.pkl: pickle GLOBAL 'os system' at offset 2 not allowed", "GLOBAL os.system");
    REFUSED("cposix\nsystem\n", "pickle GLOBAL 'posix system' at offset 2 not allowed",
            "GLOBAL posix.system");
    REFUSED("cbuiltins\neval\n", "pickle GLOBAL 'builtins eval' at offset 2", "GLOBAL builtins.eval");
    REFUSED("ctorch\nload\n", "GLOBAL 'torch load'", "GLOBAL torch.load");
    REFUSED("ctorch._utils\n_rebuild_tensor_v3\n", "GLOBAL 'torch._utils _rebuild_tensor_v3'", "a near miss");
    REFUSED("ccollections\nOrderedDict", "GLOBAL: no end of line", "GLOBAL without its end of line");
    REFUSED("\x8c\x05posix\x8c\x06system\x93",
            "hand.pkl: pickle opcode STACK_GLOBAL (0x93) at offset 17 not allowed", "STACK_GLOBAL");
    REFUSED("(iposix\nsystem\n", "pickle opcode INST (0x69) at offset 3 not allowed", "INST");
    REFUSED("(o", "pickle opcode OBJ (0x6f) at offset 3", "OBJ");
    REFUSED(")\x81", "pickle opcode NEWOBJ (0x81) at offset 3", "NEWOBJ");
    REFUSED("P0\n", "pickle opcode PERSID (0x50)", "PERSID (text)");
    REFUSED("S'x'\n", "pickle opcode STRING (0x53)", "STRING");
    REFUSED("C\x01x", "pickle opcode SHORT_BINBYTES (0x43)", "SHORT_BINBYTES");
    REFUSED("\x82\x01", "pickle opcode EXT1 (0x82)", "EXT1");
    REFUSED("K\x01\x32", "pickle opcode DUP (0x32)", "DUP");
    REFUSED("\xff", "byte 0xff at pickle offset 2 is not a pickle opcode", "a byte that is no opcode");
    REFUSED("Q", "BINPERSID: empty stack", "BINPERSID on an empty stack");
    REFUSED("K\x01Q", "BINPERSID of an int that is not ('storage', <torch storage type>",
            "BINPERSID of an int");
    REFUSED("(X\x07\0\0\0storageccollections\nOrderedDict\nX\x01\0\0\0"
            "0"
            "X\x03\0\0\0cpuK\x06tQ",
            "BINPERSID of a tuple that is not", "a storage reference naming OrderedDict as its type");
    REFUSED("ctorch\nFloatStorage\n)R", "REDUCE of torch.FloatStorage not allowed",
            "REDUCE of a storage type");
    REFUSED("ccollections\nOrderedDict\nK\x01\x85R", "collections.OrderedDict with 1 arguments",
            "OrderedDict(1)");
    REFUSED("K\x01)R", "REDUCE of an int with a tuple", "REDUCE of an int");
    REFUSED("}}b", "BUILD on a dict with a dict (only on an OrderedDict", "BUILD on a plain dict");
    REFUSED("]K\x01"
            "b",
            "BUILD on a list with an int", "BUILD on a list");
    REFUSED("ccollections\nOrderedDict\n)RK\x01"
            "b",
            "BUILD on an OrderedDict with an int", "BUILD with an int state");
    REFUSED("K\x01q\x05", "BINPUT: memo index 5 skips past 0", "BINPUT skipping memo entries");
    REFUSED("h\x00", "BINGET: memo index 0 was never stored", "BINGET of an unset entry");
    REFUSED("j\x00\x00\x00\x01", "LONG_BINGET: memo index 16777216 was never stored", "LONG_BINGET far out");
    REFUSED("t", "TUPLE without a MARK", "TUPLE without a MARK");
    REFUSED("K\x01\x86", "TUPLE2: stack underflow", "TUPLE2 with one value");
    REFUSED("(K\x01\x86", "TUPLE2: stack underflow", "TUPLE2 across a MARK");
    REFUSED("K\x01K\x02", "STOP with 2 values and 0 MARKs", "STOP with two values");
    REFUSED("", "STOP with 0 values", "an empty pickle");
    REFUSED("(K\x01", "STOP with 1 values and 1 MARKs", "STOP with a MARK open");
    REFUSED("}G\x3f\xf0\0\0\0\0\0\0K\x01s", "a dict key that is a float", "a float key");
    REFUSED("})K\x01s", "a dict key that is a tuple", "a tuple key");
    REFUSED("}X\x02\0\0\0a\0K\x01s", "a string that is not UTF-8 or holds a NUL byte", "NUL in a string");
    REFUSED("X\x02\0\0\0\xc3\x28", "not UTF-8", "invalid UTF-8");
    REFUSED("X\x02\0\0\0\xc0\x80", "not UTF-8", "overlong UTF-8");
    REFUSED("X\x03\0\0\0\xed\xa0\x80", "not UTF-8", "a UTF-8 surrogate");
    REFUSED("X\xff\xff\xff\x7f", "truncated: a string of 2147483647 bytes", "a string past the end");
    REFUSED("\x8a\x09\1\1\1\1\1\1\1\1\1", "an integer of 9 bytes (at most 8)", "LONG1 of 9 bytes");
    REFUSED("\x80\x06", "pickle protocol 6", "protocol 6");
    REFUSED("\x95\xff\0\0\0\0\0\0\0", "truncated: a FRAME of 255 bytes", "a FRAME past the end");
    REFUSED("}X\x01\0\0\0aK\x01X\x01\0\0\0aK\x02u", "SETITEMS without a MARK", "SETITEMS without a MARK");
    REFUSED("}(X\x01\0\0\0aK\x01X\x01\0\0\0aK\x02u", "hand.pkl: pickle: a dict holds the key 'a' twice",
            "a duplicate str key");
    REFUSED("}(K\x07K\x01K\x07K\x02u", "a dict holds the key 7 twice", "a duplicate int key");
    REFUSED("}(K\x01u", "SETITEMS with an odd number of values (1)", "SETITEMS with a key and no value");
    REFUSED("(K\x01K\x02u", "SETITEMS: no container below its items", "SETITEMS with nothing below the MARK");
    REFUSED("K\x01(K\x01K\x02u", "SETITEMS into an int", "SETITEMS into an int");
    REFUSED("](K\x01K\x02u", "SETITEMS into a list", "SETITEMS into a list");
    REFUSED("}K\x01"
            "a",
            "APPEND into a dict", "APPEND into a dict");
    REFUSED("]q\x00h\x00"
            "a",
            "a list is placed inside itself", "a list appended to itself");
    /* a = []; b = []; b.append(a); a.append(b): a cycle through a list already placed in another */
    REFUSED("]q\x00]q\x01h\x00"
            "aa",
            "a list is changed after it was placed inside another value", "a cycle");
    REFUSED(
        "ctorch._utils\n_rebuild_tensor_v2\n(X\x01\0\0\0xK\x00J\xff\xff\xff\xff\x85K\x01\x85\x89}tR",
        "_rebuild_tensor_v2(str, int, tuple, tuple, bool, dict): expected (storage, int, tuple, tuple, bool, "
        "dict[, dict])",
        "_rebuild_tensor_v2 of a str");
    REFUSED("ctorch._utils\n_rebuild_tensor_v2\n(" PID "K\x00J\xff\xff\xff\xff\x85K\x01\x85\x89}tR",
            "_rebuild_tensor_v2: a size is an int below 0, not a non-negative int", "a negative size");
    REFUSED("ctorch._utils\n_rebuild_tensor_v2\n(" PID "J\xff\xff\xff\xff))\x89}tR",
            "storage_offset is an int below 0", "a negative storage offset");
    REFUSED("ctorch._utils\n_rebuild_tensor_v2\n(" PID "K\x00))\x89tR", "_rebuild_tensor_v2 with 5 arguments",
            "_rebuild_tensor_v2 with 5 arguments");
    REFUSED("ctorch._utils\n_rebuild_parameter\n(K\x01\x89}tR",
            "_rebuild_parameter: expected (tensor, bool, dict)", "_rebuild_parameter of an int");
}

/* Deep nesting: 63 lists each inside the next are read, 65 refused; 65 MARKs open refused; a string over
 * TP_MAX_STR refused. */
static void limits(void)
{
    for (int depth = 63; depth <= 65; depth += 2) {
        buf b = {0};
        op(&b, 0x80);
        op(&b, 2);
        for (int i = 0; i < depth; i++)
            op(&b, ']');
        for (int i = 1; i < depth; i++)
            op(&b, 'a');
        op(&b, '.');
        tp_pickle *p;
        int rc = parse(&b, &p);
        if (depth == 63)
            check(rc == 0 && tp_pickle_root(p)->depth == 63, "63 nested lists: read, depth 63 (%s)",
                  rc ? pf_errmsg() : "");
        else
            refused(rc, "values nested deeper than 64", "65 nested lists");
        if (!rc)
            tp_pickle_free(p);
        free(b.p);
    }
    buf b = {0};
    for (int i = 0; i < 65; i++)
        op(&b, '(');
    expect_refused(b.p, b.n, "more than 64 MARKs open", "65 MARKs open");
    free(b.p);
    buf s = {0};
    op(&s, 'X');
    le32(&s, TP_MAX_STR + 1);
    for (unsigned i = 0; i <= TP_MAX_STR; i++)
        op(&s, 'a');
    expect_refused(s.p, s.n, "a string of 1048577 bytes (at most 1048576)", "a string over TP_MAX_STR");
    free(s.p);
}

/* A valid tensor pickle, read; every proper prefix of it refused; wrong tensor arguments refused. */
static void tensor_pickles(void)
{
    pt t = {"w", "FloatStorage", "0", 6, 0, 2, {2, 3}, {3, 1}};
    buf b = {0};
    op(&b, 0x80);
    op(&b, 2);
    state_dict(&b, &t, 1);
    op(&b, '.');
    tp_pickle *p;
    int rc = parse(&b, &p);
    check(rc == 0, "a one-tensor state_dict with its _metadata BUILD parses (%s)", rc ? pf_errmsg() : "");
    if (!rc) {
        const tp_value *r = tp_pickle_root(p), *w = tp_dict_get(r, "w");
        check(r->kind == TP_DICT && r->ordered && r->u.seq.n == 2, "root: an OrderedDict of one pair");
        const tp_tensor *x = w && w->kind == TP_TENSOR ? tp_tensor_of(w) : NULL;
        check(x && x->dtype == TP_F32 && x->ndim == 2 && x->shape[0] == 2 && x->shape[1] == 3 &&
                  x->stride[0] == 3 && x->stride[1] == 1 && x->offset == 0 && !strcmp(x->storage->key, "0") &&
                  !strcmp(x->storage->location, "cpu") && x->storage->numel == 6 && !x->requires_grad,
              "w: F32 [2, 3] stride [3, 1] at offset 0 of storage '0' (cpu, 6 elements)");
        tp_named *nt;
        int n;
        check(tp_state_dict(r, &nt, &n, "x") == 0 && n == 1 && !strcmp(nt[0].name, "w") && nt[0].t == x,
              "tp_state_dict lists w");
        free(nt);
        tp_pickle_free(p);
    }
    int bad = 0;
    for (size_t k = 0; k < b.n; k++) {
        tp_pickle *q = NULL;
        int r = tp_parse_pickle(&q, b.p, k, "prefix");
        bad += r != -EPROTO || q != NULL || !pf_errmsg()[0];
        if (!r)
            tp_pickle_free(q);
    }
    check(bad == 0, "every one of the %zu proper prefixes is refused with -EPROTO and a message", b.n);
    free(b.p);

    pt nine = {"w", "FloatStorage", "0", 6, 0, 9, {1}, {1}};
    buf c = {0};
    op(&c, 0x80);
    op(&c, 2);
    state_dict(&c, &nine, 1);
    op(&c, '.');
    refused(parse(&c, &p), "9 sizes and 9 strides (equal, at most 8)", "a tensor of 9 dimensions");
    free(c.p);
    pt byte = {"w", "ByteStorage", "0", 6, 0, 1, {6}, {1}};
    c = (buf){0};
    op(&c, 0x80);
    op(&c, 2);
    state_dict(&c, &byte, 1);
    op(&c, '.');
    refused(parse(&c, &p), "GLOBAL 'torch ByteStorage'", "a storage type outside the list (uint8)");
    free(c.p);
    pt two[2] = {{"a", "FloatStorage", "0", 6, 0, 1, {6}, {1}},
                 {"b", "FloatStorage", "0", 5, 0, 1, {5}, {1}}};
    c = (buf){0};
    op(&c, 0x80);
    op(&c, 2);
    state_dict(&c, two, 2);
    op(&c, '.');
    refused(parse(&c, &p), "storage '0' is referenced as", "one storage key with two sizes");
    free(c.p);
    /* {'p': _rebuild_parameter(<tensor of storage '0'>, True, OrderedDict())}, as torch saves an nn.Parameter
     */
    static const char param[] = "\x80\x02}X\x01\0\0\0pctorch._utils\n_rebuild_parameter\n"
                                "ctorch._utils\n_rebuild_tensor_v2\n(" PID "K\x00K\x02\x85K\x01\x85\x89}tR"
                                "\x88"
                                "ccollections\nOrderedDict\n)R\x87Rs.";
    if ((rc = tp_parse_pickle(&p, param, sizeof param - 1, "param")) == 0) {
        const tp_value *v = tp_dict_get(tp_pickle_root(p), "p");
        check(v && v->kind == TP_TENSOR && tp_tensor_of(v)->requires_grad && tp_tensor_of(v)->ndim == 1 &&
                  tp_tensor_of(v)->shape[0] == 2 && tp_tensor_of(v)->storage->numel == 6,
              "_rebuild_parameter: the tensor, requires_grad set");
        tp_pickle_free(p);
    } else
        check(0, "_rebuild_parameter parses (%s)", pf_errmsg());
    /* a state_dict holding an int: tp_state_dict names the entry */
    static const char odd[] = "\x80\x02}(X\x01\0\0\0nK\x01u.";
    if (tp_parse_pickle(&p, odd, sizeof odd - 1, "odd") == 0) {
        tp_named *nt;
        int n;
        refused(tp_state_dict(tp_pickle_root(p), &nt, &n, "odd.pt"),
                "odd.pt: state_dict entry 'n' is an int, not a tensor", "a state_dict entry that is an int");
        tp_pickle_free(p);
    }
}

/* ---- archives ---- */

static void archives(void)
{
    char path[128];
    snprintf(path, sizeof path, "%s/m.pt", dir);
    float s0[12]; /* storage '0': 0..11 */
    for (int i = 0; i < 12; i++)
        s0[i] = (float)i;
    int64_t s1 = -7; /* storage '1': one int64 */
    pt ts[] = {
        {"w", "FloatStorage", "0", 12, 0, 2, {3, 4}, {4, 1}},     /* 3 rows of 4 */
        {"wt", "FloatStorage", "0", 12, 0, 2, {4, 3}, {1, 4}},    /* its transpose */
        {"tail", "FloatStorage", "0", 12, 9, 1, {3}, {1}},        /* from offset 9 */
        {"col", "FloatStorage", "0", 12, 2, 2, {3, 1}, {4, 7}},   /* column 2 (a size-1 dim, any stride) */
        {"nbt", "LongStorage", "1", 1, 0, 0, {0}, {0}},           /* a 0-dim int64 */
        {"empty", "FloatStorage", "0", 12, 12, 2, {0, 5}, {5, 1}} /* no elements */
    };
    int nts = (int)(sizeof ts / sizeof *ts);
    buf b = {0};
    op(&b, 0x80);
    op(&b, 2);
    state_dict(&b, ts, nts);
    op(&b, '.');
    const char *keys[] = {"0", "1"};
    const void *data[] = {s0, &s1};
    size_t bytes[] = {sizeof s0, sizeof s1};
    write_pt(path, &b, keys, data, bytes, 2);
    free(b.p);
    tp_file *f;
    int rc = tp_open(&f, path);
    check(rc == 0, "an archive in torch.save's layout opens (%s)", rc ? pf_errmsg() : "");
    if (rc)
        return;
    tp_named *nt;
    int n;
    rc = tp_state_dict(tp_root(f), &nt, &n, path);
    check(rc == 0 && n == nts, "its state_dict lists %d tensors (%s)", nts, rc ? pf_errmsg() : "");
    if (rc) {
        tp_close(f);
        return;
    }
    float w[12], wt[12], tail[3], col[3], row[4];
    int64_t nbt = 0;
    check(tp_tensor_read(f, nt[0].t, "w", w, sizeof w) == 0 && !memcmp(w, s0, sizeof w), "w: 0..11 in order");
    static const float wt_want[12] = {0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11};
    rc = tp_tensor_read(f, nt[1].t, "wt", wt, sizeof wt);
    check(rc == 0 && !memcmp(wt, wt_want, sizeof wt), "wt (stride [1, 4]): the transpose (%s)",
          rc ? pf_errmsg() : "");
    check(tp_tensor_read(f, nt[2].t, "tail", tail, sizeof tail) == 0 && tail[0] == 9 && tail[1] == 10 &&
              tail[2] == 11,
          "tail (storage offset 9): 9, 10, 11");
    check(tp_tensor_read(f, nt[3].t, "col", col, sizeof col) == 0 && col[0] == 2 && col[1] == 6 &&
              col[2] == 10,
          "col (offset 2, stride [4, 7]): 2, 6, 10");
    check(tp_tensor_read(f, nt[4].t, "nbt", &nbt, sizeof nbt) == 0 && nbt == -7 && nt[4].t->dtype == TP_I64 &&
              nt[4].t->ndim == 0,
          "nbt: a 0-dim I64 = -7");
    check(tp_tensor_read(f, nt[5].t, "empty", NULL, 0) == 0 && tp_tensor_numel(nt[5].t) == 0,
          "empty [0, 5]: nothing to read");
    check(tp_tensor_read_rows(f, nt[0].t, "w", 2, 1, row, sizeof row) == 0 && row[0] == 8 && row[3] == 11,
          "w row 2: 8 .. 11");
    check(tp_tensor_read_rows(f, nt[1].t, "wt", 3, 1, row, 3 * sizeof(float)) == 0 && row[0] == 3 &&
              row[1] == 7 && row[2] == 11,
          "wt row 3: 3, 7, 11");
    refused(tp_tensor_read_rows(f, nt[0].t, "w", 2, 2, row, sizeof row),
            "tensor 'w': rows [2, 4) outside its 3 rows", "rows past the end");
    refused(tp_tensor_read(f, nt[0].t, "w", w, sizeof w - 4), "12 elements of F32 to read into 44 bytes",
            "a destination of the wrong size");
    free(nt);
    tp_close(f);

    /* every proper prefix of the archive: refused (no end of central directory) */
    uint8_t *all;
    size_t size;
    if (pf_read_file(path, 0, &all, &size))
        DIE("read %s", path);
    int bad = 0;
    for (size_t k = 0; k < size; k++) {
        tp_file *g = NULL;
        int r = tp_open_buffer(&g, all, k, "prefix");
        bad += r != -EPROTO || g != NULL || !pf_errmsg()[0];
        tp_close(g);
    }
    check(bad == 0, "each of the %zu proper prefixes of the archive is refused with -EPROTO", size);
    rc = tp_open_buffer(&f, all, size, "whole");
    check(rc == 0 && tp_root(f)->kind == TP_DICT, "the whole archive from memory opens");
    if (!rc)
        tp_close(f);
    /* one bit of storage '0' flipped (its bytes found in the file): the read of the whole storage fails its
     * CRC; a read of part of it (one row, seeking) does not see it */
    unsigned char *at = memmem(all, size, s0, sizeof s0);
    if (at) {
        at[20] ^= 0x40; /* inside element 5, in row 1 of w */
        rc = tp_open_buffer(&f, all, size, "flipped");
        if (!rc && !(rc = tp_state_dict(tp_root(f), &nt, &n, "flipped"))) {
            refused(tp_tensor_read(f, nt[0].t, "w", w, sizeof w), "flipped: tensor 'w': m/data/0: CRC error",
                    "a flipped bit in a storage");
            check(tp_tensor_read_rows(f, nt[0].t, "w", 2, 1, row, sizeof row) == 0 && row[0] == 8,
                  "row 2 of the same storage (no CRC over a part)");
            free(nt);
        }
        check(rc == 0, "the flipped archive opens (%s)", rc ? pf_errmsg() : "");
        tp_close(f);
    } else
        check(0, "storage '0' found in the archive's bytes");
    free(all);
}

/* An archive m/ with data.pkl = a state_dict of `t` over storage '0' holding n0 zero bytes. */
static int open_one(const pt *t, size_t n0, tp_file **f, const char *name)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s.pt", dir, name);
    static float zeros[64];
    buf b = {0};
    op(&b, 0x80);
    op(&b, 2);
    state_dict(&b, t, 1);
    op(&b, '.');
    const char *keys[] = {"0"};
    const void *data[] = {zeros};
    write_pt(path, &b, keys, data, &n0, 1);
    free(b.p);
    int rc = tp_open(f, path);
    check(rc == 0, "%s.pt opens (%s)", name, rc ? pf_errmsg() : "");
    return rc;
}

/* Rewrites the uncompressed size of entry `name` in its local header and in the central directory. */
static void patch_size(const char *path, const char *name, uint32_t size)
{
    uint8_t *d;
    size_t n, ln = strlen(name);
    if (pf_read_file(path, 0, &d, &n))
        DIE("read %s", path);
    int hits = 0;
    for (size_t i = 0; i + 46 + ln <= n; i++) {
        if (!memcmp(d + i, "PK\3\4", 4) && !memcmp(d + i + 30, name, ln) && d[i + 26] == ln &&
            d[i + 27] == 0) {
            memcpy(d + i + 22, &size, 4);
            hits++;
        }
        if (!memcmp(d + i, "PK\1\2", 4) && !memcmp(d + i + 46, name, ln) && d[i + 28] == ln &&
            d[i + 29] == 0) {
            memcpy(d + i + 24, &size, 4);
            hits++;
        }
    }
    if (hits != 2)
        DIE("%s: %d headers of %s", path, hits, name);
    FILE *o = fopen(path, "wb");
    if (!o || fwrite(d, 1, n, o) != n || fclose(o))
        DIE("write %s", path);
    free(d);
}

static void archive_refusals(void)
{
    tp_file *f;
    float x[64];
    pt t = {"layer1.0.conv1.weight", "FloatStorage", "0", 6, 0, 2, {2, 4}, {4, 1}};
    if (open_one(&t, 24, &f, "short") == 0) {
        tp_named *nt;
        int n;
        refused(
            tp_state_dict(tp_root(f), &nt, &n, "short.pt"),
            "short.pt: tensor 'layer1.0.conv1.weight': the view (storage offset 0, shape [2, 4], stride [4, "
            "1]) reaches element 8 of storage '0', which holds 6 F32 elements",
            "a storage too short for its view (tp_state_dict)");
        refused(tp_tensor_read(f, tp_tensor_of(tp_dict_get(tp_root(f), "layer1.0.conv1.weight")),
                               "layer1.0.conv1.weight", x, 32),
                "tensor 'layer1.0.conv1.weight': the view", "the same, tp_tensor_read");
        tp_close(f);
    }
    pt t2 = {"bn.weight", "FloatStorage", "0", 6, 0, 1, {6}, {1}};
    if (open_one(&t2, 20, &f, "entry") == 0) {
        refused(tp_tensor_read(f, tp_tensor_of(tp_dict_get(tp_root(f), "bn.weight")), "bn.weight", x, 24),
                "tensor 'bn.weight': m/data/0 holds 20 bytes, the pickle declares 6 F32 elements (24 bytes)",
                "a storage entry shorter than declared");
        tp_close(f);
    }
    pt t3 = {"bn.bias", "FloatStorage", "9", 6, 0, 1, {6}, {1}};
    if (open_one(&t3, 24, &f, "missing") == 0) {
        refused(tp_tensor_read(f, tp_tensor_of(tp_dict_get(tp_root(f), "bn.bias")), "bn.bias", x, 24),
                "tensor 'bn.bias': m/data/9: missing from the archive", "a storage entry missing");
        tp_close(f);
    }
    /* a stored storage entry whose headers declare 4 GiB: refused before any read */
    char path[128];
    snprintf(path, sizeof path, "%s/entry.pt", dir);
    patch_size(path, "m/data/0", 0xfffffff0u);
    int rc = tp_open(&f, path);
    if (rc == 0) {
        refused(tp_tensor_read(f, tp_tensor_of(tp_dict_get(tp_root(f), "bn.weight")), "bn.weight", x, 24),
                "m/data/0 is stored with 20 bytes but declares 4294967280", "a stored entry declaring 4 GiB");
        tp_close(f);
    } else
        check(pf_errmsg()[0] != 0, "a stored entry declaring 4 GiB: refused at open (%s)", pf_errmsg());

    snprintf(path, sizeof path, "%s/odd.pt", dir);
    buf b = {0};
    op(&b, 0x80);
    op(&b, 2);
    op(&b, '}');
    op(&b, '.');
    zent flat[] = {{"data.pkl", b.p, b.n, 0}};
    write_zip(path, flat, 1);
    refused(tp_open(&f, path), "odd.pt: entry 'data.pkl' is not inside a folder", "entries outside a folder");
    zent ts[] = {{"m/constants.pkl", b.p, b.n, 0}, {"m/code/m.py", "x", 1, 0}};
    write_zip(path, ts, 2);
    refused(tp_open(&f, path), "a TorchScript archive (torch.jit.save)", "a TorchScript archive");
    zent nopkl[] = {{"m/version", "3\n", 2, 0}};
    write_zip(path, nopkl, 1);
    refused(tp_open(&f, path), "no m/data.pkl: not a torch.save archive", "no data.pkl");
    zent big[] = {{"m/data.pkl", b.p, b.n, 0}, {"m/byteorder", "big", 3, 0}};
    write_zip(path, big, 2);
    refused(tp_open(&f, path), "m/byteorder is 'big': only little-endian archives are read", "byteorder big");
    zent little[] = {{"m/data.pkl", b.p, b.n, 1}, {"m/byteorder", "little", 6, 0}};
    write_zip(path, little, 2);
    rc = tp_open(&f, path);
    check(rc == 0 && tp_root(f)->kind == TP_DICT, "byteorder little, data.pkl deflated: read (%s)",
          rc ? pf_errmsg() : "");
    if (!rc)
        tp_close(f);
    /* a deflated entry whose headers declare more than deflate can yield from its bytes */
    patch_size(path, "m/data.pkl", 0x7ffffff0u);
    rc = tp_open(&f, path);
    refused(rc, "m/data.pkl declares 2147483632 bytes from", "a deflated entry declaring 2 GiB (a zip bomb)");
    if (!rc)
        tp_close(f);
    /* a data.pkl over TP_MAX_PICKLE: 17 MiB of MARKs deflated to a few KiB */
    size_t nb = 17u << 20;
    unsigned char *marks = xmalloc(nb);
    memset(marks, '(', nb);
    zent bomb[] = {{"m/data.pkl", marks, nb, 1}};
    write_zip(path, bomb, 1);
    free(marks);
    struct stat st;
    check(stat(path, &st) == 0 && st.st_size < (1 << 20), "a 17 MiB data.pkl deflates to %lld bytes",
          (long long)st.st_size);
    refused(tp_open(&f, path), "m/data.pkl declares 17825792 bytes (at most 16777216)",
            "a data.pkl over 16 MiB");
    free(b.p);
    /* a legacy (pre-zip) torch.save file: PROTO 2, LONG1 of the magic number 0x1950a86a20f9469cfc6c, ... */
    static const unsigned char legacy[] = {0x80, 2,    0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                           0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, '.'};
    FILE *lf = fopen(path, "wb");
    if (!lf || fwrite(legacy, 1, sizeof legacy, lf) != sizeof legacy || fclose(lf))
        DIE("write %s", path);
    refused(tp_open(&f, path), "a legacy torch.save file (a bare pickle: torch < 1.6",
            "a legacy torch.save file");
    refused(tp_open(&f, "/nonexistent/x.pt"), "/nonexistent/x.pt: cannot open", "a missing file");
    snprintf(path, sizeof path, "%s/fifo.pt", dir);
    if (mkfifo(path, 0600) == 0)
        refused(tp_open(&f, path), "fifo.pt: a FIFO, not a regular file", "a FIFO (refused at once)");
}

/* ---- model_load_pretrained of a .pt ---- */

#define NET "r18_w8"
#define DIM 16
#define B   2

/* model_init(seed) plus random BN affine parameters and running statistics (eval-mode BN not the identity).
 */
static model *make(uint64_t seed)
{
    return model_make_perturbed(NET, DIM, B, seed);
}

static float *forward(model *m, const float *x)
{
    const float *e;
    float *y = xmalloc((size_t)B * DIM * sizeof(float));
    if (model_forward(m, x, B, 0, &e) || model_device(m)->mem_d2h(model_ctx(m), y, e, (size_t)B * DIM * 4))
        DIE("forward: %s", pf_errmsg());
    return y;
}

/* m's state_dict as torch writes it: one storage per tensor (key = its index), a 0-dim int64
 * num_batches_tracked after every BN's running_var. Edits: drop the tensor named `drop`, write `f64` as
 * float64, set element 3 of `nan` to NaN, add an extra tensor `extra`. `ckpt` wraps it in arcface_torch's
 * checkpoint dict. */
typedef struct edits {
    const char *drop, *f64, *nan, *extra;
    int ckpt;
} edits;

static void write_model_pt(const model *m, const char *path, edits e)
{
    int nt = model_num_tensors(m), nb = model_num_buffer_tensors(m), cap = 2 * (nt + nb) + 4, n = 0;
    float *p = xmalloc(model_num_params(m) * sizeof(float)),
          *bb = xmalloc(model_num_buffer_floats(m) * sizeof(float));
    if (model_get_params(m, p) || model_get_buffers(m, bb))
        DIE("host copies: %s", pf_errmsg());
    pt *ts = xmalloc((size_t)cap * sizeof *ts);
    const void **data = xmalloc((size_t)cap * sizeof *data);
    size_t *bytes = xmalloc((size_t)cap * sizeof *bytes);
    char(*keys)[16] = xmalloc((size_t)cap * sizeof *keys), (*nbt)[160] = xmalloc((size_t)cap * sizeof *nbt);
    const char **kp = xmalloc((size_t)cap * sizeof *kp);
    static const int64_t zero = 0;
    double *f64 = NULL;
    float *nanbuf = NULL;
    for (int i = 0; i < nt + nb; i++) {
        const model_tensor *t = i < nt ? model_tensor_at(m, i) : model_buffer_tensor_at(m, i - nt);
        const float *v = (i < nt ? p : bb) + t->offset;
        if (e.drop && !strcmp(t->name, e.drop))
            continue;
        snprintf(keys[n], sizeof keys[n], "%d", n);
        ts[n] = (pt){t->name, "FloatStorage", keys[n], (int64_t)t->count, 0, t->ndim, {0}, {0}};
        for (int k = t->ndim - 1, s = 1; k >= 0; s *= t->shape[k], k--) {
            ts[n].shape[k] = t->shape[k];
            ts[n].stride[k] = s;
        }
        data[n] = v;
        bytes[n] = t->count * sizeof(float);
        if (e.f64 && !strcmp(t->name, e.f64)) {
            f64 = xmalloc(t->count * sizeof *f64);
            for (size_t k = 0; k < t->count; k++)
                f64[k] = v[k];
            ts[n].stype = "DoubleStorage";
            data[n] = f64;
            bytes[n] = t->count * sizeof *f64;
        }
        if (e.nan && !strcmp(t->name, e.nan)) {
            nanbuf = (float *)fcopy(v, t->count);
            nanbuf[3] = NAN;
            data[n] = nanbuf;
        }
        n++;
        const char *rv = strstr(t->name, ".running_var");
        if (rv && rv[12] == 0) {
            snprintf(nbt[n], sizeof nbt[n], "%.*s.num_batches_tracked", (int)(rv - t->name), t->name);
            snprintf(keys[n], sizeof keys[n], "%d", n);
            ts[n] = (pt){nbt[n], "LongStorage", keys[n], 1, 0, 0, {0}, {0}};
            data[n] = &zero;
            bytes[n++] = sizeof zero;
        }
    }
    if (e.extra) {
        snprintf(keys[n], sizeof keys[n], "%d", n);
        ts[n] = (pt){e.extra, "FloatStorage", keys[n], 4, 0, 1, {4}, {1}};
        data[n] = p;
        bytes[n++] = 4 * sizeof(float);
    }
    for (int i = 0; i < n; i++)
        kp[i] = keys[i];
    buf b = {0};
    op(&b, 0x80);
    op(&b, 2);
    if (e.ckpt) { /* {'epoch': 2, 'global_step': 70000, 'state_dict_backbone': sd, 'state_dict_softmax_fc':
                     {'weight': ..}} */
        op(&b, '}');
        op(&b, '(');
        str(&b, "epoch");
        integer(&b, 2);
        str(&b, "global_step");
        integer(&b, 70000);
        str(&b, "state_dict_backbone");
        state_dict(&b, ts, n - 1);
        str(&b, "state_dict_softmax_fc");
        op(&b, '}');
        str(&b, "weight");
        tensor(&b, &ts[n - 1]);
        op(&b, 's');
        op(&b, 'u');
    } else
        state_dict(&b, ts, n);
    op(&b, '.');
    write_pt(path, &b, kp, data, bytes, n);
    free(b.p);
    free(p);
    free(bb);
    free(ts);
    free(data);
    free(bytes);
    free(keys);
    free(nbt);
    free(kp);
    free(f64);
    free(nanbuf);
}

static void model_pt(void)
{
    model *a = make(1), *b = make(2);
    float *x = frnd((size_t)B * 3 * 112 * 112, -1, 1), *ya = forward(a, x), *yb = forward(b, x);
    size_t ny = (size_t)B * DIM * sizeof(float);
    check(memcmp(ya, yb, ny) != 0, "seeds 1 and 2 give different outputs (the test can fail)");
    free(yb);
    char path[128];
    snprintf(path, sizeof path, "%s/model.pt", dir);
    write_model_pt(a, path, (edits){0});
    int rc = model_load_pretrained(b, path);
    check(rc == 0, "model_load_pretrained(model.pt) (%s)", rc ? pf_errmsg() : "");
    yb = forward(b, x);
    check(memcmp(ya, yb, ny) == 0, "its eval forward equals the saved model's, bit for bit");
    free(yb);
    model_free(b);

    b = make(3);
    snprintf(path, sizeof path, "%s/checkpoint_gpu_0.pt", dir);
    write_model_pt(a, path, (edits){.extra = "weight", .ckpt = 1});
    rc = model_load_pretrained(b, path);
    check(rc == 0, "model_load_pretrained(checkpoint_gpu_0.pt): its state_dict_backbone (%s)",
          rc ? pf_errmsg() : "");
    yb = forward(b, x);
    check(memcmp(ya, yb, ny) == 0, "its eval forward equals the saved model's, bit for bit");
    tp_file *f;
    if (tp_open(&f, path) == 0) {
        const tp_value *r = tp_root(f), *w = tp_find(r, "state_dict_softmax_fc/weight");
        check(tp_find(r, "global_step")->u.i == 70000 && tp_find(r, "epoch")->u.i == 2 && w &&
                  w->kind == TP_TENSOR && tp_tensor_of(w)->ndim == 1 && tp_tensor_of(w)->shape[0] == 4,
              "its global_step 70000, epoch 2, state_dict_softmax_fc/weight [4] found by path");
        tp_close(f);
    }

    /* refusals: the model is left as it was */
    static const struct {
        edits e;
        const char *want, *what;
    } bad[] = {
        {{.drop = "layer2.1.bn2.running_var"},
         "tensor 'layer2.1.bn2.running_var' missing (network r18_w8, D 16)",
         "a tensor missing"},
        {{.f64 = "conv1.weight"}, "tensor 'conv1.weight' is F64, expected F32", "an F64 tensor"},
        {{.nan = "layer3.0.conv2.weight"}, "tensor 'layer3.0.conv2.weight' element 3 is NaN", "a NaN"},
        {{.extra = "head.weight"}, "tensor 'head.weight' is not part of network r18_w8", "an extra tensor"},
    };
    snprintf(path, sizeof path, "%s/bad.pt", dir);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_model_pt(a, path, bad[i].e);
        char want[256];
        snprintf(want, sizeof want, "pretrained %s: %s", path, bad[i].want);
        refused(model_load_pretrained(b, path), want, bad[i].what);
        float *y = forward(b, x);
        check(memcmp(ya, y, ny) == 0, "%s: the model is unchanged", bad[i].what);
        free(y);
    }
    /* a checkpoint dict without state_dict_backbone */
    buf c = {0};
    op(&c, 0x80);
    op(&c, 2);
    op(&c, '}');
    op(&c, '(');
    str(&c, "epoch");
    integer(&c, 2);
    op(&c, 'u');
    op(&c, '.');
    write_pt(path, &c, NULL, NULL, NULL, 0);
    free(c.p);
    refused(model_load_pretrained(b, path),
            "(no 'state_dict_backbone': read as a state_dict): state_dict entry 'epoch' "
            "is an int, not a tensor",
            "a dict that is neither");
    free(ya);
    free(yb);
    free(x);
    model_free(a);
    model_free(b);
}

/* ---- the tool side of test_torch_pt.py ---- */

/* Raw little-endian bytes: read n bytes of path into a fresh buffer, or write them. */
static void *read_raw(const char *path, size_t n)
{
    uint8_t *d;
    size_t got;
    if (pf_read_file(path, 0, &d, &got) || got != n)
        DIE("%s: %zu bytes, expected %zu", path, got, n);
    return d;
}

static void write_raw(const char *path, const void *d, size_t n)
{
    FILE *o = fopen(path, "wb");
    if (!o || fwrite(d, 1, n, o) != n || fclose(o))
        DIE("write %s", path);
}

/* --forward NET D PRETRAINED B IN OUT: model_create(NET, D), model_load_pretrained(PRETRAINED), the eval
 * forward of B float32 (3, 112, 112) images read raw from IN, written raw (B, D) float32 to OUT. Exit 1 with
 * the message on stderr when the load fails. */
static int tool_forward(char **a)
{
    int D = atoi(a[1]), nb = atoi(a[3]);
    model *m;
    if (model_create(&m, a[0], D, nb))
        DIE("model_create: %s", pf_errmsg());
    if (model_load_pretrained(m, a[2])) {
        fprintf(stderr, "%s\n", pf_errmsg());
        model_free(m);
        return 1;
    }
    float *x = read_raw(a[4], (size_t)nb * 3 * 112 * 112 * sizeof(float)),
          *y = xmalloc((size_t)nb * D * sizeof(float));
    const float *e;
    if (model_forward(m, x, nb, 0, &e) || model_device(m)->mem_d2h(model_ctx(m), y, e, (size_t)nb * D * 4))
        DIE("forward: %s", pf_errmsg());
    write_raw(a[5], y, (size_t)nb * D * sizeof(float));
    free(x);
    free(y);
    model_free(m);
    return 0;
}

/* --tensor FILE PATH OUT: the tensor at tp_find PATH of FILE's pickle, its elements raw to OUT; prints
 * "<dtype> [d0, d1, ...]". Exit 1 with the message on stderr when it cannot. */
static int tool_tensor(char **a)
{
    tp_file *f;
    if (tp_open(&f, a[0])) {
        fprintf(stderr, "%s\n", pf_errmsg());
        return 1;
    }
    const tp_value *v = tp_find(tp_root(f), a[1]);
    if (!v || v->kind != TP_TENSOR) {
        fprintf(stderr, "%s: no tensor at %s\n", a[0], a[1]);
        tp_close(f);
        return 1;
    }
    size_t n = (size_t)tp_tensor_numel(tp_tensor_of(v)) * tp_dtype_size(tp_tensor_of(v)->dtype);
    void *d = xmalloc(n);
    if (tp_tensor_read(f, tp_tensor_of(v), a[1], d, n)) {
        fprintf(stderr, "%s\n", pf_errmsg());
        free(d);
        tp_close(f);
        return 1;
    }
    write_raw(a[2], d, n);
    printf("%s [", tp_dtype_name(tp_tensor_of(v)->dtype));
    for (int k = 0; k < tp_tensor_of(v)->ndim; k++)
        printf("%s%lld", k ? ", " : "", (long long)tp_tensor_of(v)->shape[k]);
    printf("]\n");
    free(d);
    tp_close(f);
    return 0;
}

/* Open file descriptors of this process (/proc/self/fd, less the one reading it). */
static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (!d)
        return -1;
    while (readdir(d))
        n++;
    closedir(d);
    return n - 3; /* ".", "..", and d's own descriptor */
}

/* BINFLOAT: 'G' and the double big-endian. */
static void binfloat(buf *b, double v)
{
    uint64_t u;
    memcpy(&u, &v, 8);
    op(b, 'G');
    for (int i = 7; i >= 0; i--)
        op(b, (int)((u >> (8 * i)) & 0xff));
}

/* path := {'epoch': epoch, 'global_step': step, 'state_optimizer': {'param_groups': [{'lr': lr}]}} as
 * train_v2.py's checkpoint dict holds them (a key is left out when its value is INT64_MIN; lr_int 1 writes the
 * lr as an int, 2 leaves state_optimizer out). */
static void write_progress(const char *path, int64_t epoch, int64_t step, double lr, int lr_int)
{
    buf b = {0};
    op(&b, 0x80);
    op(&b, 2);
    op(&b, '}');
    op(&b, '(');
    if (epoch != INT64_MIN) {
        str(&b, "epoch");
        integer(&b, epoch);
    }
    if (step != INT64_MIN) {
        str(&b, "global_step");
        integer(&b, step);
    }
    if (lr_int != 2) {
        str(&b, "state_optimizer");
        op(&b, '}');
        op(&b, '(');
        str(&b, "param_groups");
        op(&b, ']');
        op(&b, '(');
        op(&b, '}');
        op(&b, '(');
        str(&b, "lr");
        if (lr_int)
            integer(&b, (int64_t)lr);
        else
            binfloat(&b, lr);
        op(&b, 'u');
        op(&b, 'e');
        op(&b, 'u');
    }
    op(&b, 'u');
    op(&b, '.');
    write_pt(path, &b, NULL, NULL, NULL, 0);
    free(b.p);
}

/* common/torch_ckpt: the progress a checkpoint_gpu_<rank>.pt records, and its refusals. */
static void progress(void)
{
    char path[160];
    snprintf(path, sizeof path, "%s/checkpoint_gpu_1.pt", dir);
    write_progress(path, 3, 70000, 0.0625, 0);
    tpc_progress p;
    int rc = tpc_read_progress(path, &p);
    check(rc == 0 && p.present && p.epoch == 3 && p.global_step == 70000 && p.lr == 0.0625,
          "checkpoint_gpu_1.pt: epoch 3, global_step 70000, lr 0.0625 (rc %d, %lld %lld %g)", rc,
          (long long)p.epoch, (long long)p.global_step, p.lr);
    rc = tpc_read_progress("/nonexistent/model.pt", &p);
    check(rc == 0 && !p.present, "another name is no checkpoint_gpu file (nothing read)");
    rc = tpc_read_progress("/nonexistent/checkpoint_gpu_0.pt", &p);
    refused(rc, "checkpoint_gpu_0.pt", "a missing checkpoint_gpu_0.pt");
    write_progress(path, 3, INT64_MIN, 0.0625, 0);
    refused(tpc_read_progress(path, &p), "'global_step' is missing", "no global_step");
    write_progress(path, -1, 5, 0.0625, 0);
    refused(tpc_read_progress(path, &p), "'epoch' is negative", "a negative epoch");
    write_progress(path, 1, 5, 1, 1);
    refused(tpc_read_progress(path, &p), "'state_optimizer/param_groups/0/lr' is int", "an int lr");
    write_progress(path, 2, 24, 0, 2);
    rc = tpc_read_progress(path, &p);
    check(rc == 0 && p.present && p.global_step == 24 && p.lr == -1,
          "no state_optimizer: global_step 24, lr unknown (-1) (rc %d, lr %g)", rc, p.lr);
    write_progress(path, 1, 5, -0.5, 0);
    refused(tpc_read_progress(path, &p), "negative or NaN", "a negative lr");
    check(tpc_rank_of("checkpoint_gpu_12.pt") == 12 && tpc_rank_of("checkpoint_gpu_012.pt") == -1 &&
              tpc_rank_of("checkpoint_gpu_.pt") == -1 && tpc_rank_of("checkpoint_gpu_65536.pt") == -1 &&
              tpc_rank_of("checkpoint_gpu_1.pth") == -1,
          "tpc_rank_of: decimal ranks below 65536, no leading zero, .pt only");
}

int main(int argc, char **argv)
{
    if (argc == 8 && !strcmp(argv[1], "--forward"))
        return tool_forward(argv + 2);
    if (argc == 5 && !strcmp(argv[1], "--tensor"))
        return tool_tensor(argv + 2);
    snprintf(dir, sizeof dir, "/tmp/pfcps-torch-pt-XXXXXX");
    if (!mkdtemp(dir))
        DIE("mkdtemp");
    test_seed_mixed();
    int fds = count_fds();
    values();
    refusals();
    limits();
    tensor_pickles();
    archives();
    archive_refusals();
    model_pt();
    progress();
    check(count_fds() == fds, "no file descriptor left open (%d before, %d after)", fds, count_fds());
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd))
        printf("could not remove %s\n", dir);
    printf("%d checks, %d failures\n", checks, failures);
    return check_summary();
}
