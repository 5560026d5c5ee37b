/* An allow-list interpreter of Python pickles that never executes one: it runs the pickle's opcodes as a
 * stack machine (stack, MARKs, memo) and builds a tree of plain values. The caller says which opcodes are
 * allowed (by their names in CPython's Lib/pickletools.py), which globals GLOBAL may name, and how REDUCE,
 * BINPERSID and BUILD are resolved (callbacks that build values or refuse); every other opcode, and every
 * other global, is refused naming it and its byte offset. Used by the .bin verification-set reader
 * (worker/eval/binset.c) and torch.save's data.pkl (common/torch_pt.c).
 *
 * Opcodes the interpreter knows (a caller may allow any subset; STOP is always needed):
 *   framing    PROTO (0..5), FRAME (its length must fit in what is left), STOP
 *   leaves     NONE, NEWTRUE, NEWFALSE, INT (a decimal int64 line; "01" / "00" are True / False, as
 *              protocols 0 and 1 write bools), BININT, BININT1, BININT2, LONG1 (at most 8 bytes),
 *              BINFLOAT, BINUNICODE, SHORT_BINUNICODE (str: UTF-8 without NUL, copied),
 *              BINBYTES, SHORT_BINBYTES, BINBYTES8, BINSTRING, SHORT_BINSTRING (bytes: pointing into the
 *              caller's buffer, not copied)
 *   structure  MARK, EMPTY_TUPLE, TUPLE, TUPLE1, TUPLE2, TUPLE3, EMPTY_LIST, APPEND, APPENDS, EMPTY_DICT,
 *              SETITEM, SETITEMS
 *   memo       BINPUT, LONG_BINPUT, MEMOIZE (a PUT names an existing entry or the next one, as every pickler
 *              writes them), BINGET, LONG_BINGET
 *   objects    GLOBAL (only pk_config.globals), REDUCE (an allowed global with a tuple, through
 *              pk_config.reduce), BINPERSID (pk_config.persid), BUILD (pk_config.build)
 *
 * Rules of the tree, whatever the caller allows: dict keys are str or int, and no dict holds a key twice;
 * a list or dict placed inside another value is sealed (never changed afterwards), so values form a tree
 * with shared leaves, never a cycle; nesting (and MARKs open at once) within max_depth; at most max_items
 * elements in one container, max_str bytes in one str or bytes value, max_memo memo entries, max_values
 * values pushed; the bytes the machine allocates (values, containers, stack, memo) within mem_fixed +
 * mem_per_byte x the pickle's size. A refusal is -EPROTO with a message that starts with the caller's
 * `what` and names the byte offset of the opcode: "<what>: pickle offset <N>: <problem>", or for an opcode
 * or global outside the allow-list "<what>: pickle opcode GLOBAL (0x63) at offset 12 not allowed",
 * "<what>: pickle GLOBAL 'posix system' at offset 2 not allowed (<globals_hint>)". */
#ifndef PFCPS_COMMON_PICKLE_H
#define PFCPS_COMMON_PICKLE_H

#include <stddef.h>
#include <stdint.h>

/* Kinds of values. A caller's callbacks may make values of their own kinds, PK_USER and up. */
typedef enum pk_kind {
    PK_NONE = 1,
    PK_BOOL,
    PK_INT,
    PK_FLOAT,
    PK_STR,
    PK_TUPLE,
    PK_LIST,
    PK_DICT,
    PK_BYTES,
    PK_GLOBAL, /* an allowed class or function named by GLOBAL (not called) */
    PK_USER = 16,
} pk_kind;

/* One value, read only once parsed. Values are shared (the memo; None, True and False): the same pointer
 * may appear in several containers. They live as long as the pk_doc that made them. */
typedef struct pk_value pk_value;
struct pk_value {
    uint8_t kind;    /* pk_kind, or a caller's kind >= PK_USER */
    uint8_t ordered; /* PK_DICT: set by a caller's callback (e.g. collections.OrderedDict()) */
    uint8_t sealed;  /* PK_LIST / PK_DICT placed inside another value: no longer changed */
    uint8_t pad;
    uint32_t depth; /* 0 for a leaf; 1 + the deepest element for a container */
    union {
        int64_t i; /* PK_INT; PK_BOOL (0 or 1) */
        double f;  /* PK_FLOAT */
        struct {
            const char *s; /* PK_STR: UTF-8, NUL-terminated, no NUL inside; PK_BYTES: into the input */
            size_t len;
        } str;
        struct {
            pk_value **v; /* PK_TUPLE / PK_LIST: n items; PK_DICT: v[2i] key, v[2i+1] value, n = 2 x pairs */
            size_t n, cap;
        } seq;
        struct {
            const char *name; /* "module.name" as pk_global.full */
            int id, arg;      /* pk_global's */
        } g;                  /* PK_GLOBAL */
        struct {
            const void *p;     /* what the callback made */
            const char *name;  /* its kind's name for messages ("tensor") */
            const char *aname; /* the same with its article ("a tensor") */
        } obj;                 /* kinds >= PK_USER */
    } u;
};

/* A global GLOBAL may name: module and name as pickled, full ("module.name") and the caller's id and arg,
 * copied into the PK_GLOBAL value. */
typedef struct pk_global {
    const char *module, *name, *full;
    int id, arg;
} pk_global;

/* The machine while it runs (for callbacks). */
typedef struct pk_machine pk_machine;

typedef struct pk_config {
    const char *what;    /* names the input in messages */
    const char *opcodes; /* the allowed opcodes: names separated by spaces ("PROTO FRAME STOP MARK ...") */
    const pk_global *globals;
    size_t nglobals;
    const char *globals_hint; /* after a refused GLOBAL: "only collections.OrderedDict, ..." */
    /* REDUCE of fn (a PK_GLOBAL of globals) with args (a PK_TUPLE): *out the result, or a refusal (pk_fail).
     */
    int (*reduce)(pk_machine *m, void *user, const pk_value *fn, const pk_value *args, pk_value **out);
    /* BINPERSID of pid (any value): *out the object it names, or a refusal. */
    int (*persid)(pk_machine *m, void *user, const pk_value *pid, pk_value **out);
    /* BUILD: obj.__setstate__(state); obj stays on the stack. 0, or a refusal. */
    int (*build)(pk_machine *m, void *user, pk_value *obj, pk_value *state);
    void *user; /* passed to the callbacks */
    /* limits (each at least 1) */
    uint32_t max_depth; /* container nesting, and MARKs open at once */
    size_t max_str;     /* bytes of one str or bytes value */
    size_t max_items;   /* elements of one container (a dict's pairs count twice) */
    size_t max_memo;    /* memo entries */
    size_t max_values;  /* values pushed (every opcode that pushes one, BINGET included) */
    size_t mem_fixed;   /* memory: mem_fixed + mem_per_byte x the pickle's size, in bytes */
    size_t mem_per_byte;
} pk_config;

/* A parsed pickle: its values and their memory. */
typedef struct pk_doc pk_doc;

/* Runs the pickle in buf[0..size) under cfg. Bytes values point into buf (it must outlive *out when the
 * pickle may hold any); everything else is copied. Returns 0 with *out (pk_free it), -EPROTO with a message
 * naming the problem and its offset (see the header comment), -EINVAL when cfg names an opcode the
 * interpreter does not know, allows REDUCE / BINPERSID / BUILD without its callback or sets a limit to 0
 * (a caller's mistake), or -ENOMEM. On failure *out is NULL. */
int pk_parse(pk_doc **out, const void *buf, size_t size, const pk_config *cfg);

/* The value the pickle returns (its STOP). */
const pk_value *pk_root(const pk_doc *d);

/* Frees d and every value in it (NULL is fine). */
void pk_free(pk_doc *d);

/* For callbacks: a refusal, -EPROTO with "<what>: pickle offset <N>: <fmt...>" (N the running opcode's). */
int pk_fail(pk_machine *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* For callbacks: n zeroed bytes (16-byte aligned) living as long as the pk_doc, counted against the memory
 * limit. Returns 0, -EPROTO (the limit) or -ENOMEM. */
int pk_alloc(pk_machine *m, size_t n, void **out);

/* For callbacks: a new value of kind (a leaf kind or one >= PK_USER; for PK_TUPLE / PK_LIST / PK_DICT an
 * empty container), zeroed but for kind and depth. Errors as pk_alloc. */
int pk_new(pk_machine *m, uint8_t kind, pk_value **out);

/* The name of v's kind: "None", "bool", "int", "float", "str", "tuple", "list", "dict", "bytes", "global",
 * u.obj.name for a caller's kind ("?" when it has none). */
const char *pk_kind_name(const pk_value *v);

/* The same with its article, for messages: "None", "a bool", "an int", u.obj.aname for a caller's kind. */
const char *pk_a_kind(const pk_value *v);

/* s[0..n) for a message into buf: printable ASCII kept, anything else '?', at most cap - 1 bytes (cap >= 1).
 * Returns buf. */
const char *pk_printable(const char *s, size_t n, char *buf, size_t cap);

#endif
