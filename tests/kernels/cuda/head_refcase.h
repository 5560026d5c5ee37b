/* A $PFCPS_REFERENCE/head case (float64 PyTorch) as the CUDA head tests read it: the head's
 * parameters from meta.json, the inputs as float / int64, the references as float64. C and C++. */
#ifndef PFCPS_TESTS_KERNELS_CUDA_HEAD_REFCASE_H
#define PFCPS_TESTS_KERNELS_CUDA_HEAD_REFCASE_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_ops.h"
#ifdef __cplusplus
extern "C" {
#endif
#include "common/err.h"
#include "tests/npy.h"
#ifdef __cplusplus
}
#endif

typedef struct head_refcase {
    char name[256];
    int n, k, d;
    cuda_head_params p;
    float *emb, *cen;                /* (n, d), (k, d) */
    int64_t *lab;                    /* n */
    double rloss, *rlog, *rge, *rgc; /* loss, logits (n, k), grad_embeddings (n, d), grad_centers (k, d) */
} head_refcase;

/* Reads <dir>/<name>. Returns 0, or a negative errno with pf_errmsg() saying what could not be read. */
static inline int head_refcase_load(const char *dir, const char *name, head_refcase *c)
{
    char path[1600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    memset(c, 0, sizeof *c);
    char *meta = npy_read_text(path, "meta.json");
    if (!meta)
        return pf_err(-ENOENT, "%s: cannot read meta.json", path);
    snprintf(c->name, sizeof c->name, "%s", name);
    c->p.s = npy_json_number(meta, "s", NAN);
    c->p.m1 = npy_json_number(meta, "m1", NAN);
    c->p.m2 = npy_json_number(meta, "m2", NAN);
    c->p.m3 = npy_json_number(meta, "m3", NAN);
    c->p.straight_through = strstr(meta, "straight_through") != NULL;
    free(meta);
    npy_array e, w, l, lo, lg, ge, gc;
    int rc;
    if ((rc = npy_load2(path, "embeddings.npy", &e)) || (rc = npy_load2(path, "centers.npy", &w)) ||
        (rc = npy_load2(path, "labels.npy", &l)) || (rc = npy_load2(path, "loss.npy", &lo)) ||
        (rc = npy_load2(path, "logits.npy", &lg)) || (rc = npy_load2(path, "grad_embeddings.npy", &ge)) ||
        (rc = npy_load2(path, "grad_centers.npy", &gc)))
        return rc;
    c->n = (int)e.shape[0];
    c->d = (int)e.shape[1];
    c->k = (int)w.shape[0];
    c->emb = npy_to_f32(&e);
    c->cen = npy_to_f32(&w);
    c->lab = npy_to_i64(&l);
    double *rl = npy_to_f64(&lo);
    c->rloss = rl[0];
    free(rl);
    c->rlog = npy_to_f64(&lg);
    c->rge = npy_to_f64(&ge);
    c->rgc = npy_to_f64(&gc);
    npy_free(&e);
    npy_free(&w);
    npy_free(&l);
    npy_free(&lo);
    npy_free(&lg);
    npy_free(&ge);
    npy_free(&gc);
    return 0;
}

static inline void head_refcase_free(head_refcase *c)
{
    free(c->emb);
    free(c->cen);
    free(c->lab);
    free(c->rlog);
    free(c->rge);
    free(c->rgc);
}

#endif
