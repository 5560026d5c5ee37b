/* arcface_torch's Python config files (configs/NAME.py), read without running Python: see config.h,
 * cfg_load_py_text. The grammar is the subset those files use:
 *
 *   file      := [ UTF-8 BOM ] { line }
 *   line      := blank | '#' comment | import | 'config = edict()' | 'config.' KEY '=' value
 *                (each but blank ending the line, or a '#' comment; one statement per line, not indented)
 *   import    := 'import' MODULE [ 'as' NAME ] { ',' MODULE [ 'as' NAME ] }
 *              | 'from' ( { '.' } MODULE | '.' { '.' } ) 'import' ( '*' | NAME [ 'as' NAME ] { ',' ... } )
 *   MODULE    := NAME { '.' NAME }
 *   value     := STRING | 'True' | 'False' | 'None' | arith | '(' [ items ] ')' | '[' [ items ] ']'
 *   items     := value { ',' value } [ ',' ]
 *   arith     := term { ('+' | '-') term };  term := unary { ('*' | '/' | '//') unary }
 *   unary     := ('-' | '+') unary | NUMBER | '(' arith ')' | 'config.' KEY
 *
 * `config.KEY` reads a key this file set on an earlier line (Python: the attribute of the edict being built;
 * one the file never set is an AttributeError there and refused here), e.g. arcface_torch's
 * `config.warmup_epoch = config.num_epoch // 10`.
 * A bracketed value may span lines. Numbers follow Python: int op int stays an int (`30 * 10000`), '/' is a
 * float, literals may carry '_'. Imports are read, never run: they may not bind the name `config`, nor
 * `edict` / `EasyDict` from a module other than easydict (what `config = edict()` builds must be easydict's).
 * Everything else is refused naming the file, line and what was found, so that no file is read differently
 * from what Python would make of it: names, calls, attribute reads, f-strings, dicts, statements joined by
 * ';', an indented line, a second `config = edict()` (Python would start over), a `config.KEY` line before
 * the first `config = edict()`. Nothing is ever executed. */
#include "common/config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"

/* arcface_torch keys pfcps has no use for: read, listed once in a warning, not applied (every key of base.py,
 * which arcface_torch merges under each config, that pfcps does not read, plus forks' additions; wandb_* too).
 * image_size only with the value pfcps trains with (py_check_ignored). */
static const char *const py_ignored[] = {
    "dali", "dali_aug", "using_wandb", "suffix_run_name", "notes", "save_all_states_interval",
    "save_artifacts", "image_size", NULL};

enum { PV_NONE, PV_BOOL, PV_INT, PV_FLOAT, PV_STR, PV_SEQ };

/* A parsed value; a sequence is flattened into text as it is read. */
typedef struct py_value {
    int kind;
    long long i;
    double f;
    char s[CFG_STR]; /* PV_STR: the string; PV_SEQ: its elements as config text, ", "-separated */
} py_value;

/* Keys this file has set, with their values, for `config.KEY` reads. */
#define PY_MAX_VARS 128
typedef struct py_var {
    char key[64];
    py_value v;
} py_var;

typedef struct py_parser {
    py_var vars[PY_MAX_VARS];
    int nvars;
    const char *p, *end;
    int line;      /* line of p */
    int depth;     /* open brackets: newlines inside them are whitespace */
    int made;      /* `config = edict()` was read */
    char err[256]; /* first error */
} py_parser;

static int py_fail(py_parser *ps, const char *what)
{
    if (!ps->err[0]) {
        const char *q = ps->p;
        size_t n = 0;
        while (q + n < ps->end && q[n] != '\n' && n < 24)
            n++;
        snprintf(ps->err, sizeof ps->err, "%s (at '%.*s')", what, (int)n, q);
    }
    return -1;
}

/* Skips spaces, tabs and comments; newlines only inside brackets. */
static void py_skip(py_parser *ps)
{
    while (ps->p < ps->end) {
        char c = *ps->p;
        if (c == ' ' || c == '\t' || c == '\r' || (c == '\\' && ps->p + 1 < ps->end && ps->p[1] == '\n')) {
            if (c == '\\') {
                ps->p++;
                ps->line++;
            }
            ps->p++;
        } else if (c == '\n' && ps->depth > 0) {
            ps->p++;
            ps->line++;
        } else if (c == '#') {
            while (ps->p < ps->end && *ps->p != '\n')
                ps->p++;
        } else {
            break;
        }
    }
}

static int py_word(py_parser *ps, const char *w)
{
    size_t n = strlen(w);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, w, n) != 0)
        return 0;
    if (ps->p + n < ps->end && (isalnum((unsigned char)ps->p[n]) || ps->p[n] == '_'))
        return 0;
    ps->p += n;
    return 1;
}

static int py_string(py_parser *ps, py_value *v)
{
    char q = *ps->p++;
    size_t n = 0;
    while (ps->p < ps->end && *ps->p != q) {
        char c = *ps->p++;
        if (c == '\n')
            return py_fail(ps, "unterminated string");
        if (c == '\\') {
            if (ps->p >= ps->end)
                return py_fail(ps, "unterminated string");
            c = *ps->p++;
            if (c == 'n')
                c = '\n';
            else if (c == 't')
                c = '\t';
            else if (c != '\\' && c != '\'' && c != '"')
                return py_fail(ps, "string escape other than \\\\ \\' \\\" \\n \\t");
        }
        if (n + 1 >= sizeof v->s)
            return py_fail(ps, "string longer than 255 bytes");
        v->s[n++] = c;
    }
    if (ps->p >= ps->end)
        return py_fail(ps, "unterminated string");
    ps->p++;
    v->s[n] = '\0';
    v->kind = PV_STR;
    return 0;
}

static int py_number(py_parser *ps, py_value *v)
{
    char buf[64];
    size_t n = 0;
    int is_float = 0;
    while (ps->p < ps->end) {
        char c = *ps->p;
        if (isdigit((unsigned char)c) || c == '.' || c == '_' || ((c == 'e' || c == 'E') && n > 0) ||
            ((c == '+' || c == '-') && n > 0 && (buf[n - 1] == 'e' || buf[n - 1] == 'E'))) {
            if (c == '.' || c == 'e' || c == 'E')
                is_float = 1;
            if (c != '_') {
                if (n + 1 >= sizeof buf)
                    return py_fail(ps, "number too long");
                buf[n++] = c;
            }
            ps->p++;
        } else {
            break;
        }
    }
    buf[n] = '\0';
    if (n == 0)
        return py_fail(ps, "expected a value");
    char *e;
    errno = 0;
    if (is_float) {
        v->kind = PV_FLOAT;
        v->f = strtod(buf, &e);
    } else {
        v->kind = PV_INT;
        v->i = strtoll(buf, &e, 10);
        if (n > 1 && buf[0] == '0')
            return py_fail(ps, "integer with a leading zero");
    }
    if (*e || errno == ERANGE)
        return py_fail(ps, "not a number");
    return 0;
}

static int py_arith(py_parser *ps, py_value *v);

/* Reads a key name at ps->p into key (cap 64). Returns its length, 0 when there is none. */
static size_t py_key(py_parser *ps, char key[64])
{
    size_t n = 0;
    while (ps->p < ps->end && (isalnum((unsigned char)*ps->p) || *ps->p == '_')) {
        if (n + 1 >= 64)
            return 0;
        key[n++] = *ps->p++;
    }
    key[n] = '\0';
    return n;
}

/* At "config.KEY": the value this file gave KEY, or NULL (not a reference, or a key not set before). */
static const py_value *py_ref(py_parser *ps)
{
    const char *save = ps->p;
    char key[64];
    if (py_word(ps, "config") && ps->p < ps->end && *ps->p == '.') {
        ps->p++;
        if (py_key(ps, key) > 0)
            for (int i = ps->nvars - 1; i >= 0; i--)
                if (!strcmp(ps->vars[i].key, key))
                    return &ps->vars[i].v;
        ps->p = save;
        py_fail(ps, "config.KEY reads a key this file has not set (before this line)");
        return NULL;
    }
    ps->p = save;
    return NULL;
}

/* 1 when ps->p is at "config." (a read of an earlier key). */
static int py_at_ref(const py_parser *ps)
{
    return ps->end - ps->p > 7 && !memcmp(ps->p, "config.", 7);
}

static int py_unary(py_parser *ps, py_value *v)
{
    py_skip(ps);
    if (ps->p >= ps->end)
        return py_fail(ps, "expected a value");
    char c = *ps->p;
    if (c == '-' || c == '+') {
        ps->p++;
        if (py_unary(ps, v) < 0)
            return -1;
        if (c == '-') {
            if (v->kind == PV_INT)
                v->i = -v->i;
            else
                v->f = -v->f;
        }
        return 0;
    }
    if (c == '(') {
        ps->p++;
        ps->depth++;
        if (py_arith(ps, v) < 0)
            return -1;
        py_skip(ps);
        if (ps->p >= ps->end || *ps->p != ')')
            return py_fail(ps, "expected ')'");
        ps->p++;
        ps->depth--;
        return 0;
    }
    if (isdigit((unsigned char)c) || c == '.')
        return py_number(ps, v);
    if (py_at_ref(ps)) {
        const py_value *r = py_ref(ps);
        if (!r)
            return -1;
        if (r->kind != PV_INT && r->kind != PV_FLOAT)
            return py_fail(ps, "arithmetic on a config key that is not a number");
        *v = *r;
        return 0;
    }
    return py_fail(ps, "expected a number");
}

/* v = a op b, Python's int/float rules; '//' on ints floors, '/' is a float. */
static int py_apply(py_parser *ps, py_value *a, const py_value *b, const char *op)
{
    if (a->kind == PV_INT && b->kind == PV_INT && strcmp(op, "/") != 0) {
        long long x = a->i, y = b->i, r;
        if (!strcmp(op, "+")) {
            if (__builtin_add_overflow(x, y, &r))
                return py_fail(ps, "integer overflow");
        } else if (!strcmp(op, "-")) {
            if (__builtin_sub_overflow(x, y, &r))
                return py_fail(ps, "integer overflow");
        } else if (!strcmp(op, "*")) {
            if (__builtin_mul_overflow(x, y, &r))
                return py_fail(ps, "integer overflow");
        } else {
            if (y == 0 || (x == LLONG_MIN && y == -1))
                return py_fail(ps, "integer division by zero or overflow");
            r = x / y;
            if ((x % y != 0) && ((x < 0) != (y < 0)))
                r--;
        }
        a->i = r;
        return 0;
    }
    double x = a->kind == PV_INT ? (double)a->i : a->f, y = b->kind == PV_INT ? (double)b->i : b->f;
    double r;
    if (!strcmp(op, "+"))
        r = x + y;
    else if (!strcmp(op, "-"))
        r = x - y;
    else if (!strcmp(op, "*"))
        r = x * y;
    else {
        if (y == 0)
            return py_fail(ps, "division by zero");
        r = !strcmp(op, "//") ? floor(x / y) : x / y;
    }
    if (!isfinite(r))
        return py_fail(ps, "number out of range");
    a->kind = PV_FLOAT;
    a->f = r;
    return 0;
}

static int py_term(py_parser *ps, py_value *v)
{
    if (py_unary(ps, v) < 0)
        return -1;
    for (;;) {
        py_skip(ps);
        const char *op = NULL;
        if (ps->end - ps->p >= 2 && ps->p[0] == '/' && ps->p[1] == '/')
            op = "//";
        else if (ps->p < ps->end && *ps->p == '*' && !(ps->end - ps->p >= 2 && ps->p[1] == '*'))
            op = "*";
        else if (ps->p < ps->end && *ps->p == '/')
            op = "/";
        if (!op)
            return 0;
        ps->p += strlen(op);
        py_value b;
        if (py_unary(ps, &b) < 0 || py_apply(ps, v, &b, op) < 0)
            return -1;
    }
}

static int py_arith(py_parser *ps, py_value *v)
{
    if (py_term(ps, v) < 0)
        return -1;
    for (;;) {
        py_skip(ps);
        if (ps->p >= ps->end || (*ps->p != '+' && *ps->p != '-'))
            return 0;
        const char *op = *ps->p == '+' ? "+" : "-";
        ps->p++;
        py_value b;
        if (py_term(ps, &b) < 0 || py_apply(ps, v, &b, op) < 0)
            return -1;
    }
}

/* v as config text ("true", "1e-4", "lfw"). */
static void py_text(const py_value *v, char *out, size_t cap)
{
    switch (v->kind) {
    case PV_BOOL: snprintf(out, cap, "%s", v->i ? "true" : "false"); break;
    case PV_INT: snprintf(out, cap, "%lld", v->i); break;
    case PV_FLOAT:
        /* A float stays a float (Python's 128.0, refused where an int is needed, as 256 / 2 would be). */
        snprintf(out, cap, "%.17g", v->f);
        if (!strpbrk(out, ".eEn"))
            strncat(out, ".0", cap - strlen(out) - 1);
        break;
    default: snprintf(out, cap, "%s", v->s); break;
    }
}

static int py_value_of(py_parser *ps, py_value *v, int in_seq);

/* A tuple or list: the elements (scalars) as ", "-separated config text. `open` was consumed. */
static int py_seq(py_parser *ps, py_value *v, char close)
{
    size_t n = 0;
    v->kind = PV_SEQ;
    v->s[0] = '\0';
    for (;;) {
        py_skip(ps);
        if (ps->p < ps->end && *ps->p == close)
            break;
        py_value e;
        if (py_value_of(ps, &e, 1) < 0)
            return -1;
        if (e.kind == PV_NONE)
            return py_fail(ps, "None inside a tuple or list");
        char t[CFG_STR];
        py_text(&e, t, sizeof t);
        int w = snprintf(v->s + n, sizeof v->s - n, "%s%s", n ? ", " : "", t);
        if (w < 0 || (size_t)w >= sizeof v->s - n)
            return py_fail(ps, "tuple or list longer than 255 bytes of text");
        n += (size_t)w;
        py_skip(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == close)
            break;
        return py_fail(ps, close == ')' ? "expected ',' or ')'" : "expected ',' or ']'");
    }
    ps->p++;
    ps->depth--;
    return 0;
}

static int py_value_of(py_parser *ps, py_value *v, int in_seq)
{
    memset(v, 0, sizeof *v);
    py_skip(ps);
    if (ps->p >= ps->end)
        return py_fail(ps, "expected a value");
    char c = *ps->p;
    if (c == '"' || c == '\'')
        return py_string(ps, v);
    if (py_word(ps, "True") || py_word(ps, "False")) {
        v->kind = PV_BOOL;
        v->i = ps->p[-1] == 'e' && ps->p[-2] == 'u';
        return 0;
    }
    if (py_word(ps, "None")) {
        v->kind = PV_NONE;
        return 0;
    }
    if (c == '[' && !in_seq) {
        ps->p++;
        ps->depth++;
        return py_seq(ps, v, ']');
    }
    if (c == '(' && !in_seq) {
        /* A tuple, or a parenthesised number: look for a ',' or an empty pair at this level. */
        const char *save = ps->p;
        int line = ps->line, depth = ps->depth;
        ps->p++;
        ps->depth++;
        py_skip(ps);
        if (ps->p < ps->end && *ps->p == ')')
            return py_seq(ps, v, ')');
        py_value first;
        if (py_value_of(ps, &first, 1) == 0) {
            py_skip(ps);
            if (ps->p < ps->end && *ps->p == ',') {
                ps->p = save + 1;
                ps->line = line;
                ps->depth = depth + 1;
                return py_seq(ps, v, ')');
            }
        }
        ps->err[0] = '\0';
        ps->p = save;
        ps->line = line;
        ps->depth = depth;
    }
    if (py_at_ref(ps)) {
        /* A number takes part in arithmetic; any other value is copied as it is. */
        const char *save = ps->p;
        const py_value *r = py_ref(ps);
        if (!r)
            return -1;
        if (r->kind != PV_INT && r->kind != PV_FLOAT) {
            *v = *r;
            py_skip(ps);
            if (ps->p < ps->end && strchr("+-*/", *ps->p))
                return py_fail(ps, "arithmetic on a config key that is not a number");
            return 0;
        }
        ps->p = save;
        return py_arith(ps, v);
    }
    if (isalpha((unsigned char)c) || c == '_')
        return py_fail(ps, "names, calls and attribute reads are not read (only literals and integer "
                           "arithmetic)");
    return py_arith(ps, v);
}

/* The rest of the logical line must be empty or a comment. */
static int py_end_of_line(py_parser *ps)
{
    py_skip(ps);
    if (ps->p < ps->end && *ps->p == ';')
        return py_fail(ps, "';' joins statements on one line: not read (one statement per line)");
    if (ps->p < ps->end && *ps->p != '\n')
        return py_fail(ps, "unexpected text after the statement");
    return 0;
}

/* A Python name at ps->p into name (cap 64). Returns its length, 0 when there is none (or a longer one). */
static size_t py_name(py_parser *ps, char name[64])
{
    if (ps->p >= ps->end || !(isalpha((unsigned char)*ps->p) || *ps->p == '_'))
        return 0;
    return py_key(ps, name);
}

/* A dotted module name (NAME { '.' NAME }) into mod (cap 256). Returns 0 or -1 (ps->err set). */
static int py_module(py_parser *ps, char *mod, size_t cap)
{
    size_t n = 0;
    for (;;) {
        char part[64];
        py_skip(ps);
        if (py_name(ps, part) == 0)
            return py_fail(ps, "expected a module name");
        int w = snprintf(mod + n, cap - n, "%s%s", n ? "." : "", part);
        if (w < 0 || (size_t)w >= cap - n)
            return py_fail(ps, "module name longer than 255 characters");
        n += (size_t)w;
        py_skip(ps);
        if (ps->p >= ps->end || *ps->p != '.')
            return 0;
        ps->p++;
    }
}

/* An import binds `name` (taken from module `from`, NULL for a plain import): refused when it is `config`,
 * or `edict` / `EasyDict` from anywhere but easydict. */
static int py_bind(py_parser *ps, const char *name, const char *from, const char *what)
{
    if (!strcmp(name, "config"))
        return py_fail(ps, "an import that binds the name 'config' is not read");
    if ((!strcmp(name, "edict") || !strcmp(name, "EasyDict")) &&
        !(from && !strcmp(from, "easydict") && !strcmp(what, "EasyDict")))
        return py_fail(ps,
                       "'edict' / 'EasyDict' imported from elsewhere than 'from easydict import EasyDict' "
                       "is not read");
    return 0;
}

/* [ 'as' NAME ]: the bound name into name (default: `dflt`). */
static int py_as(py_parser *ps, const char *dflt, char name[64])
{
    py_skip(ps);
    if (!py_word(ps, "as")) {
        snprintf(name, 64, "%s", dflt);
        return 0;
    }
    py_skip(ps);
    if (py_name(ps, name) == 0)
        return py_fail(ps, "expected a name after 'as'");
    return 0;
}

/* The rest of an import statement, after 'import' (from_mod NULL) or after 'from' (from_mod set). */
static int py_import(py_parser *ps, int is_from)
{
    char mod[256], name[64];
    if (!is_from) {
        for (;;) {
            if (py_module(ps, mod, sizeof mod) < 0)
                return -1;
            char first[64];
            size_t dot = strcspn(mod, ".");
            snprintf(first, sizeof first, "%.*s", (int)dot, mod);
            if (py_as(ps, first, name) < 0 || py_bind(ps, name, NULL, "") < 0)
                return -1;
            py_skip(ps);
            if (ps->p >= ps->end || *ps->p != ',')
                return py_end_of_line(ps);
            ps->p++;
        }
    }
    /* from: leading dots (a relative import), then a module unless only dots */
    size_t dots = 0;
    py_skip(ps);
    while (ps->p < ps->end && *ps->p == '.') {
        ps->p++;
        dots++;
    }
    py_skip(ps);
    mod[0] = '\0';
    if (!(dots > 0 && py_word(ps, "import"))) {
        if (py_module(ps, mod, sizeof mod) < 0)
            return -1;
        py_skip(ps);
        if (!py_word(ps, "import"))
            return py_fail(ps, "expected 'import' after 'from MODULE'");
    }
    const char *from = dots ? "" : mod; /* a relative module is never easydict */
    py_skip(ps);
    if (ps->p < ps->end && *ps->p == '*') {
        ps->p++;
        /* `from M import *` may bind anything, config and edict included */
        return py_fail(ps, "'import *' is not read (it may bind any name)");
    }
    for (;;) {
        char what[64];
        py_skip(ps);
        if (py_name(ps, what) == 0)
            return py_fail(ps, "expected a name to import");
        if (py_as(ps, what, name) < 0 || py_bind(ps, name, from, what) < 0)
            return -1;
        py_skip(ps);
        if (ps->p >= ps->end || *ps->p != ',')
            return py_end_of_line(ps);
        ps->p++;
    }
}

/* The config name for `output = None`: work_dirs/<file name without .py>, as arcface_torch's get_config. */
static void py_default_output(const char *path, char *out, size_t cap)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t n = strlen(b);
    if (n > 3 && !strcmp(b + n - 3, ".py"))
        n -= 3;
    snprintf(out, cap, "work_dirs/%.*s", (int)n, b);
}

static int py_is_ignored(const char *key)
{
    if (!strncmp(key, "wandb_", 6))
        return 1;
    for (int i = 0; py_ignored[i]; i++)
        if (!strcmp(py_ignored[i], key))
            return 1;
    return 0;
}

/* An ignored key whose other values would change training: image_size (pfcps trains on 112x112 faces) must be
 * 112 or (112, 112). Returns 0, or -1 with ps->err naming the key and value. */
static int py_check_ignored(py_parser *ps, const char *key, const py_value *v)
{
    char text[CFG_STR];
    py_text(v, text, sizeof text);
    if (!strcmp(key, "image_size") &&
        !((v->kind == PV_INT && v->i == 112) || (v->kind == PV_SEQ && !strcmp(v->s, "112, 112")))) {
        snprintf(ps->err, sizeof ps->err, "key 'image_size': %.40s: pfcps trains on 112x112 images only", text);
        return -1;
    }
    return 0;
}

/* One statement at ps->p (a line start). Returns 0, or -1 with ps->err set, or the negative code of cfg_set.
 */
static int py_statement(py_parser *ps, pf_config *cfg, const char *where, char *ignored, size_t icap,
                        int *output_set)
{
    const char *start = ps->p;
    py_skip(ps);
    if (ps->p >= ps->end || *ps->p == '\n')
        return 0;
    if (ps->p != start)
        return py_fail(ps, "an indented statement (Python: unexpected indent) is not read");
    if (py_word(ps, "import"))
        return py_import(ps, 0);
    if (py_word(ps, "from"))
        return py_import(ps, 1);
    if (!py_word(ps, "config"))
        return py_fail(ps, "expected 'config.KEY = value', 'config = edict()' or an import");
    py_skip(ps);
    if (ps->p < ps->end && *ps->p == '=' && !(ps->p + 1 < ps->end && ps->p[1] == '=')) {
        ps->p++;
        py_skip(ps);
        if (!py_word(ps, "edict") && !py_word(ps, "EasyDict"))
            return py_fail(ps, "expected 'config = edict()'");
        py_skip(ps);
        if (ps->end - ps->p < 2 || ps->p[0] != '(' || ps->p[1] != ')')
            return py_fail(ps, "expected 'config = edict()'");
        if (ps->made)
            return py_fail(ps,
                           "a second 'config = edict()' (Python would drop the keys set above) is not read");
        ps->p += 2;
        ps->made = 1;
        return py_end_of_line(ps);
    }
    if (ps->p >= ps->end || *ps->p != '.')
        return py_fail(ps, "expected 'config.KEY = value'");
    if (!ps->made)
        return py_fail(ps, "'config.KEY = value' before 'config = edict()' (Python: NameError) is not read");
    ps->p++;
    char key[64];
    if (py_key(ps, key) == 0)
        return py_fail(ps, "expected a key (at most 63 characters) after 'config.'");
    py_skip(ps);
    if (ps->p >= ps->end || *ps->p != '=' || (ps->p + 1 < ps->end && ps->p[1] == '='))
        return py_fail(ps, "expected '=' after the key");
    ps->p++;
    int line = ps->line;
    py_value v;
    if (py_value_of(ps, &v, 0) < 0 || py_end_of_line(ps) < 0)
        return -1;
    int slot = -1;
    for (int i = 0; i < ps->nvars && slot < 0; i++)
        if (!strcmp(ps->vars[i].key, key))
            slot = i;
    if (slot < 0 && ps->nvars < PY_MAX_VARS)
        slot = ps->nvars++;
    if (slot >= 0) {
        snprintf(ps->vars[slot].key, sizeof ps->vars[slot].key, "%s", key);
        ps->vars[slot].v = v;
    }
    if (py_is_ignored(key)) {
        if (py_check_ignored(ps, key, &v) < 0) {
            ps->line = line;
            return -1;
        }
        size_t l = strlen(ignored);
        snprintf(ignored + l, icap - l, "%s%s", l ? ", " : "", key);
        return 0;
    }
    char text[CFG_STR];
    if (!strcmp(key, "output"))
        *output_set = 1;
    if (v.kind == PV_NONE) {
        if (strcmp(key, "output") != 0)
            return 0; /* None: the default stays */
        py_default_output(where, text, sizeof text);
    } else {
        py_text(&v, text, sizeof text);
    }
    int rc = cfg_set(cfg, key, text);
    if (rc < 0) {
        snprintf(ps->err, sizeof ps->err, "%s", pf_errmsg());
        ps->line = line;
    }
    return rc;
}

/* The statements of text, one per logical line, on the zeroed parser ps. */
static int load_py(py_parser *ps, pf_config *cfg, const char *text, const char *where)
{
    ps->p = text;
    ps->end = text + strlen(text);
    ps->line = 1;
    if (!strncmp(text, "\xEF\xBB\xBF", 3)) /* a UTF-8 byte order mark, which Python skips */
        ps->p += 3;
    char ignored[512] = "";
    int output_set = 0;
    while (ps->p < ps->end) {
        int rc = py_statement(ps, cfg, where, ignored, sizeof ignored, &output_set);
        if (rc < 0)
            return pf_err(rc == -1 ? -EINVAL : rc, "%s:%d: %s", where, ps->line, ps->err);
        if (ps->p < ps->end) { /* at the newline that ends the statement */
            ps->p++;
            ps->line++;
        }
    }
    if (!output_set) {
        char out[CFG_STR];
        py_default_output(where, out, sizeof out);
        cfg_set(cfg, "output", out);
    }
    if (ignored[0])
        log_warn("%s: arcface_torch keys pfcps does not use, ignored: %s", where, ignored);
    return 0;
}

int cfg_load_py_text(pf_config *cfg, const char *text, const char *where)
{
    py_parser *psp = calloc(1, sizeof *psp);
    if (!psp)
        return pf_err(-ENOMEM, "%s: out of memory", where);
    int rc = load_py(psp, cfg, text, where);
    free(psp);
    return rc;
}
