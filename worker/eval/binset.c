/* The .bin verification set reader: the pickle on common/pickle.h's interpreter with the opcodes listed in
 * binset.h, then the shape (tuple of 2N images, N bools). */
#include "worker/eval/binset.h"

#include "common/err.h"
#include "common/file.h"
#include "common/pickle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WHAT "verification set"

static const pk_config binset_pickle = {
    .what = WHAT,
    .opcodes = "PROTO FRAME STOP MARK EMPTY_LIST APPEND APPENDS EMPTY_TUPLE TUPLE TUPLE1 TUPLE2 TUPLE3 "
               "BINBYTES SHORT_BINBYTES BINBYTES8 BINSTRING SHORT_BINSTRING NEWTRUE NEWFALSE INT "
               "BINPUT LONG_BINPUT MEMOIZE BINGET LONG_BINGET",
    .max_depth = BINSET_MAX_DEPTH,
    .max_str = BINSET_MAX_IMAGE,
    .max_items = BINSET_MAX_VALUES,
    .max_memo = BINSET_MAX_VALUES,
    .max_values = BINSET_MAX_VALUES,
    .mem_fixed = BINSET_MEM_FIXED,
    .mem_per_byte = BINSET_MEM_PER_BYTE,
};

void eval_binset_free(eval_binset *s)
{
    free(s->img);
    free(s->img_len);
    free(s->issame);
    free(s->owned);
    memset(s, 0, sizeof *s);
}

/* The pairs of a parsed pickle's root: (list of 2N bytes, list of N bools), N >= 1. */
static int take_pairs(eval_binset *s, const pk_value *top)
{
    const char *want = "expected a tuple (list of 2N images, list of N bools)";
    if (top->kind != PK_TUPLE || top->u.seq.n != 2)
        return pf_err(-EPROTO, WHAT ": %s, got %s%s", want, pk_a_kind(top),
                      top->kind == PK_TUPLE ? " of another length" : "");
    const pk_value *bins = top->u.seq.v[0], *same = top->u.seq.v[1];
    if (bins->kind != PK_LIST || same->kind != PK_LIST)
        return pf_err(-EPROTO, WHAT ": %s, got (%s, %s)", want, pk_kind_name(bins), pk_kind_name(same));
    size_t n = same->u.seq.n;
    if (n == 0 || bins->u.seq.n != 2 * n)
        return pf_err(-EPROTO, WHAT ": %zu images for %zu pairs (expected 2 per pair, at least one pair)",
                      bins->u.seq.n, n);
    s->img = malloc(2 * n * sizeof *s->img);
    s->img_len = malloc(2 * n * sizeof *s->img_len);
    s->issame = malloc(n);
    if (!s->img || !s->img_len || !s->issame)
        return pf_err(-ENOMEM, "out of memory for %zu pairs", n);
    for (size_t i = 0; i < 2 * n; i++) {
        const pk_value *v = bins->u.seq.v[i];
        if (v->kind != PK_BYTES)
            return pf_err(-EPROTO, WHAT ": image %zu is %s, not bytes", i, pk_a_kind(v));
        s->img[i] = (const uint8_t *)v->u.str.s;
        s->img_len[i] = v->u.str.len;
    }
    for (size_t i = 0; i < n; i++) {
        const pk_value *v = same->u.seq.v[i];
        if (v->kind != PK_BOOL)
            return pf_err(-EPROTO, WHAT ": issame[%zu] is %s, not a bool", i, pk_a_kind(v));
        s->issame[i] = (uint8_t)v->u.i;
    }
    s->n_pairs = (int64_t)n;
    return 0;
}

int eval_binset_parse(eval_binset *s, const uint8_t *data, size_t size)
{
    memset(s, 0, sizeof *s);
    pk_doc *doc;
    int rc = pk_parse(&doc, data, size, &binset_pickle);
    if (rc)
        return rc;
    rc = take_pairs(s, pk_root(doc));
    pk_free(doc);
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
