/* The backbone's layer list as an ONNX graph (see onnx_export.h). Every message is built in an arena of
 * calloc'd blocks freed together; tensor data points into the host copies of the model's arrays; the model is
 * packed straight into the file through a ProtobufCBuffer. */
#include "worker/model/onnx_export.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/atomic_file.h"
#include "common/err.h"
#include "onnx.pb-c.h"
#include "worker/model/model_internal.h"

#define BN_EPS 1e-5f /* worker/model/model.c, arcface_torch's BatchNorm eps */

typedef struct arena {
    void **blk;
    size_t n, cap;
    int oom;
} arena;

static void *az(arena *a, size_t bytes)
{
    if (a->oom)
        return NULL;
    if (a->n == a->cap) {
        size_t nc = a->cap ? 2 * a->cap : 256;
        void **q = realloc(a->blk, nc * sizeof *q);
        if (!q) {
            a->oom = 1;
            return NULL;
        }
        a->blk = q;
        a->cap = nc;
    }
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        a->oom = 1;
        return NULL;
    }
    return a->blk[a->n++] = p;
}

static char *astr(arena *a, const char *s)
{
    char *p = az(a, strlen(s) + 1);
    if (p)
        strcpy(p, s);
    return p;
}

static void arena_free(arena *a)
{
    for (size_t i = 0; i < a->n; i++)
        free(a->blk[i]);
    free(a->blk);
}

/* A growable array of message pointers. */
typedef struct vec {
    void **p;
    size_t n, cap;
} vec;

static int vpush(vec *v, void *x)
{
    if (!x)
        return -ENOMEM;
    if (v->n == v->cap) {
        size_t nc = v->cap ? 2 * v->cap : 64;
        void **q = realloc(v->p, nc * sizeof *q);
        if (!q)
            return -ENOMEM;
        v->p = q;
        v->cap = nc;
    }
    v->p[v->n++] = x;
    return 0;
}

typedef struct gb {
    arena a;
    vec nodes, inits;
} gb;

static Onnx__AttributeProto *attr_int(gb *g, const char *name, int64_t v)
{
    Onnx__AttributeProto *at = az(&g->a, sizeof *at);
    if (!at)
        return NULL;
    onnx__attribute_proto__init(at);
    at->name = astr(&g->a, name);
    at->has_type = 1;
    at->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
    at->has_i = 1;
    at->i = v;
    return at;
}

static Onnx__AttributeProto *attr_float(gb *g, const char *name, float v)
{
    Onnx__AttributeProto *at = az(&g->a, sizeof *at);
    if (!at)
        return NULL;
    onnx__attribute_proto__init(at);
    at->name = astr(&g->a, name);
    at->has_type = 1;
    at->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT;
    at->has_f = 1;
    at->f = v;
    return at;
}

static Onnx__AttributeProto *attr_ints(gb *g, const char *name, int n, int64_t v)
{
    Onnx__AttributeProto *at = az(&g->a, sizeof *at);
    int64_t *x = az(&g->a, (size_t)n * sizeof *x);
    if (!at || !x)
        return NULL;
    onnx__attribute_proto__init(at);
    at->name = astr(&g->a, name);
    at->has_type = 1;
    at->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS;
    for (int i = 0; i < n; i++)
        x[i] = v;
    at->n_ints = (size_t)n;
    at->ints = x;
    return at;
}

/* A node op(inputs...) -> out with up to 6 attributes (NULL-terminated lists). */
static int node(gb *g, const char *op, const char *name, const char *const *in, int n_in, const char *out,
                Onnx__AttributeProto **attrs, int n_attrs)
{
    Onnx__NodeProto *nd = az(&g->a, sizeof *nd);
    char **ins = az(&g->a, (size_t)n_in * sizeof *ins);
    char **outs = az(&g->a, sizeof *outs);
    Onnx__AttributeProto **at = az(&g->a, (size_t)n_attrs * sizeof *at);
    if (!nd || !ins || !outs || !at)
        return -ENOMEM;
    onnx__node_proto__init(nd);
    for (int i = 0; i < n_in; i++)
        if (!(ins[i] = astr(&g->a, in[i])))
            return -ENOMEM;
    for (int i = 0; i < n_attrs; i++)
        if (!(at[i] = attrs[i]))
            return -ENOMEM;
    if (!(outs[0] = astr(&g->a, out)))
        return -ENOMEM;
    nd->n_input = (size_t)n_in;
    nd->input = ins;
    nd->n_output = 1;
    nd->output = outs;
    nd->name = astr(&g->a, name);
    nd->op_type = astr(&g->a, op);
    nd->n_attribute = (size_t)n_attrs;
    nd->attribute = at;
    return nd->name && nd->op_type ? vpush(&g->nodes, nd) : -ENOMEM;
}

/* A float initializer called name with the given dims over data (not copied). */
static int init_f32(gb *g, const char *name, int ndim, const int64_t *dims, const float *data, size_t count)
{
    Onnx__TensorProto *t = az(&g->a, sizeof *t);
    int64_t *d = az(&g->a, (size_t)ndim * sizeof *d);
    if (!t || !d)
        return -ENOMEM;
    onnx__tensor_proto__init(t);
    memcpy(d, dims, (size_t)ndim * sizeof *d);
    t->n_dims = (size_t)ndim;
    t->dims = d;
    t->has_data_type = 1;
    t->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
    t->name = astr(&g->a, name);
    t->has_raw_data = 1; /* raw_data: little-endian, as the host's floats */
    t->raw_data.len = count * sizeof(float);
    t->raw_data.data = (uint8_t *)data;
    return t->name ? vpush(&g->inits, t) : -ENOMEM;
}

/* A float tensor value (graph input/output) with dims; a dim < 0 is the symbolic batch "N". */
static Onnx__ValueInfoProto *value_info(gb *g, const char *name, int ndim, const int64_t *dims)
{
    Onnx__ValueInfoProto *v = az(&g->a, sizeof *v);
    Onnx__TypeProto *tp = az(&g->a, sizeof *tp);
    Onnx__TypeProto__Tensor *tt = az(&g->a, sizeof *tt);
    Onnx__TensorShapeProto *sh = az(&g->a, sizeof *sh);
    Onnx__TensorShapeProto__Dimension **dv = az(&g->a, (size_t)ndim * sizeof *dv);
    if (!v || !tp || !tt || !sh || !dv)
        return NULL;
    onnx__value_info_proto__init(v);
    onnx__type_proto__init(tp);
    onnx__type_proto__tensor__init(tt);
    onnx__tensor_shape_proto__init(sh);
    for (int i = 0; i < ndim; i++) {
        Onnx__TensorShapeProto__Dimension *d = az(&g->a, sizeof *d);
        if (!d)
            return NULL;
        onnx__tensor_shape_proto__dimension__init(d);
        if (dims[i] < 0) {
            d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
            if (!(d->dim_param = astr(&g->a, "N")))
                return NULL;
        } else {
            d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
            d->dim_value = dims[i];
        }
        dv[i] = d;
    }
    sh->n_dim = (size_t)ndim;
    sh->dim = dv;
    tt->has_elem_type = 1;
    tt->elem_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
    tt->shape = sh;
    tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    tp->tensor_type = tt;
    v->name = astr(&g->a, name);
    v->type = tp;
    return v->name ? v : NULL;
}

static int init_model_tensor(gb *g, const model_tensor *t, const float *base)
{
    int64_t d[5];
    for (int k = 0; k < t->ndim; k++)
        d[k] = t->shape[k];
    return init_f32(g, t->name, t->ndim, d, base + t->offset, t->count);
}

/* The nodes of every layer; act_name[i] is activation i's value name. */
static int build_nodes(gb *g, const model *m, char **act_name, const float *hp, const float *hb)
{
    char nm[160];
    for (int li = 0; li < m->n_layers; li++) {
        const mlayer *l = &m->layers[li];
        const char *x = act_name[l->in];
        char *out = act_name[l->out];
        int rc = 0;
        switch (l->kind) {
        case LK_CONV: {
            const model_tensor *w = &m->tensors[l->w];
            const char *in[2] = {x, w->name};
            Onnx__AttributeProto *at[5] = {attr_ints(g, "kernel_shape", 2, l->K),
                                           attr_ints(g, "strides", 2, l->stride),
                                           attr_ints(g, "pads", 4, l->pad), attr_ints(g, "dilations", 2, 1),
                                           attr_int(g, "group", l->groups)};
            snprintf(nm, sizeof nm, "Conv_%d", li);
            if (!(rc = init_model_tensor(g, w, hp)))
                rc = node(g, "Conv", nm, in, 2, out, at, 5);
            break;
        }
        case LK_BN: {
            const model_tensor *w = &m->tensors[l->w], *b = &m->tensors[l->b], *rm = &m->buffers_t[l->rm],
                               *rv = &m->buffers_t[l->rv];
            const char *in[5] = {x, w->name, b->name, rm->name, rv->name};
            Onnx__AttributeProto *at[1] = {attr_float(g, "epsilon", BN_EPS)};
            snprintf(nm, sizeof nm, "BatchNormalization_%d", li);
            if (!(rc = init_model_tensor(g, w, hp)) && !(rc = init_model_tensor(g, b, hp)) &&
                !(rc = init_model_tensor(g, rm, hb)) && !(rc = init_model_tensor(g, rv, hb)))
                rc = node(g, "BatchNormalization", nm, in, 5, out, at, 1);
            break;
        }
        case LK_PRELU: {
            const model_tensor *w = &m->tensors[l->w];
            /* (C,1,1): broadcasts over (N,C,H,W) (a (C) slope would meet W) */
            int64_t d[3] = {w->shape[0], 1, 1};
            const char *in[2] = {x, w->name};
            snprintf(nm, sizeof nm, "PRelu_%d", li);
            if (!(rc = init_f32(g, w->name, 3, d, hp + w->offset, w->count)))
                rc = node(g, "PRelu", nm, in, 2, out, NULL, 0);
            break;
        }
        case LK_ADD: {
            const char *in[2] = {x, act_name[l->in2]};
            snprintf(nm, sizeof nm, "Add_%d", li);
            rc = node(g, "Add", nm, in, 2, out, NULL, 0);
            break;
        }
        case LK_FLATTEN: {
            Onnx__AttributeProto *at[1] = {attr_int(g, "axis", 1)};
            snprintf(nm, sizeof nm, "Flatten_%d", li);
            rc = node(g, "Flatten", nm, &x, 1, out, at, 1);
            break;
        }
        case LK_DROPOUT:
            /* eval: the identity, no node; later layers read the input's value */
            act_name[l->out] = act_name[l->in];
            break;
        case LK_LINEAR: {
            const model_tensor *w = &m->tensors[l->w];
            const char *in[3] = {x, w->name, l->b >= 0 ? m->tensors[l->b].name : NULL};
            Onnx__AttributeProto *at[1] = {attr_int(g, "transB", 1)};
            snprintf(nm, sizeof nm, "Gemm_%d", li);
            if (!(rc = init_model_tensor(g, w, hp)) && l->b >= 0)
                rc = init_model_tensor(g, &m->tensors[l->b], hp);
            if (!rc)
                rc = node(g, "Gemm", nm, in, l->b >= 0 ? 3 : 2, out, at, 1);
            break;
        }
        default:
            return pf_err(-EINVAL, "onnx export: layer %d has a kind (%d) the exporter does not know", li,
                          l->kind);
        }
        if (rc)
            return rc == -ENOMEM ? pf_err(-ENOMEM, "onnx export: out of memory") : rc;
    }
    return 0;
}

/* protobuf-c output straight into a FILE. */
typedef struct file_buf {
    ProtobufCBuffer base;
    FILE *f;
    int err;
} file_buf;

static void file_append(ProtobufCBuffer *b, size_t len, const uint8_t *data)
{
    file_buf *fb = (file_buf *)b;
    if (!fb->err && len && fwrite(data, 1, len, fb->f) != len)
        fb->err = errno ? errno : EIO;
}

int model_export_onnx(const model *m, const char *path, int opset)
{
    if (opset < ONNX_EXPORT_OPSET_MIN || opset > ONNX_EXPORT_OPSET_MAX)
        return pf_err(-EINVAL, "onnx export: opset %d (this exporter writes %s)", opset, ONNX_EXPORT_OPSETS);
    gb g = {0};
    float *hp = malloc((m->n_params ? m->n_params : 1) * sizeof(float));
    float *hb = malloc((m->n_buffer_floats ? m->n_buffer_floats : 1) * sizeof(float));
    char **act_name = calloc((size_t)m->n_acts, sizeof *act_name);
    int rc = 0;
    if (!hp || !hb || !act_name) {
        rc = pf_err(-ENOMEM, "onnx export %s: out of memory", path);
        goto out;
    }
    if ((rc = model_get_params(m, hp)) || (rc = model_get_buffers(m, hb))) {
        rc = pf_err_wrap(rc, "onnx export %s: reading the model from device %s", path, m->dev->name);
        goto out;
    }
    for (int i = 0; i < m->n_acts; i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "t%d", i);
        act_name[i] = astr(&g.a, i == 0 ? "data" : i == m->out_act ? "embedding" : nm);
    }
    if (g.a.oom) {
        rc = pf_err(-ENOMEM, "onnx export %s: out of memory", path);
        goto out;
    }
    if ((rc = build_nodes(&g, m, act_name, hp, hb)))
        goto out;

    const model_desc *d = &m->desc;
    int64_t in_dims[4] = {-1, 3, 112, 112}, out_dims[2] = {-1, d->embedding_size};
    Onnx__ValueInfoProto *vin = value_info(&g, "data", 4, in_dims);
    Onnx__ValueInfoProto *vout = value_info(&g, "embedding", 2, out_dims);
    Onnx__GraphProto *graph = az(&g.a, sizeof *graph);
    Onnx__ModelProto *mp = az(&g.a, sizeof *mp);
    Onnx__OperatorSetIdProto *ops = az(&g.a, sizeof *ops);
    Onnx__OperatorSetIdProto **opsv = az(&g.a, sizeof *opsv);
    Onnx__ValueInfoProto **vins = az(&g.a, sizeof *vins), **vouts = az(&g.a, sizeof *vouts);
    Onnx__StringStringEntryProto *props = az(&g.a, 2 * sizeof *props);
    Onnx__StringStringEntryProto **propv = az(&g.a, 2 * sizeof *propv);
    char gname[64], dim[32], doc[256];
    snprintf(gname, sizeof gname, "pfcps_%s", d->name);
    snprintf(dim, sizeof dim, "%d", d->embedding_size);
    snprintf(
        doc, sizeof doc,
        "pfcps %s backbone, eval mode: data (N,3,112,112) float, (pixel/255-0.5)/0.5 -> embedding (N,%d)",
        d->name, d->embedding_size);
    if (!vin || !vout || !graph || !mp || !ops || !opsv || !vins || !vouts || !props || !propv) {
        rc = pf_err(-ENOMEM, "onnx export %s: out of memory", path);
        goto out;
    }
    onnx__graph_proto__init(graph);
    graph->name = astr(&g.a, gname);
    graph->n_node = g.nodes.n;
    graph->node = (Onnx__NodeProto **)g.nodes.p;
    graph->n_initializer = g.inits.n;
    graph->initializer = (Onnx__TensorProto **)g.inits.p;
    vins[0] = vin;
    vouts[0] = vout;
    graph->n_input = 1;
    graph->input = vins;
    graph->n_output = 1;
    graph->output = vouts;
    onnx__operator_set_id_proto__init(ops);
    ops->domain = astr(&g.a, "");
    ops->has_version = 1;
    ops->version = opset;
    opsv[0] = ops;
    for (int i = 0; i < 2; i++) {
        onnx__string_string_entry_proto__init(&props[i]);
        propv[i] = &props[i];
    }
    props[0].key = astr(&g.a, "network");
    props[0].value = astr(&g.a, d->name);
    props[1].key = astr(&g.a, "embedding_size");
    props[1].value = astr(&g.a, dim);
    onnx__model_proto__init(mp);
    mp->has_ir_version = 1;
    mp->ir_version =
        opset >= 15 ? 8 : 7; /* ONNX's versioning table: opset 13/14 came with IR 7, 15..17 IR 8 */
    mp->n_opset_import = 1;
    mp->opset_import = opsv;
    mp->producer_name = astr(&g.a, "pfcps");
    mp->producer_version = astr(&g.a, "0.1.0");
    mp->doc_string = astr(&g.a, doc);
    mp->graph = graph;
    mp->n_metadata_props = 2;
    mp->metadata_props = propv;
    if (g.a.oom) {
        rc = pf_err(-ENOMEM, "onnx export %s: out of memory", path);
        goto out;
    }

    pf_atomic_file af;
    if ((rc = pf_atomic_open(&af, path, "onnx export")) < 0)
        goto out;
    file_buf fb = {.base = {.append = file_append}, .f = af.f};
    errno = 0;
    onnx__model_proto__pack_to_buffer(mp, &fb.base);
    if (fb.err)
        errno = fb.err;
    rc = pf_atomic_commit(&af, !fb.err);
out:
    arena_free(&g.a);
    free(g.nodes.p);
    free(g.inits.p);
    free(act_name);
    free(hp);
    free(hb);
    return rc;
}
