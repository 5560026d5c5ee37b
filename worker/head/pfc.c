/* Partial FC step glue: see pfc.h. */
#include "worker/head/pfc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

void pfc_free(pfc *x)
{
    if (!x)
        return;
    free(x->labels_all);
    free(x->labels_local);
    free(x->ids);
    free(x->emb_all);
    free(x->grad_all);
    head_ws_free(&x->ws);
    memset(x, 0, sizeof *x);
}

int pfc_init(pfc *x, const head_params *params, pf_coll *coll, int64_t num_classes, double sample_rate,
             uint64_t seed, int64_t batch, int64_t d)
{
    return pfc_init_flags(x, params, coll, num_classes, sample_rate, seed, batch, d, 0);
}

int pfc_init_flags(pfc *x, const head_params *params, pf_coll *coll, int64_t num_classes, double sample_rate,
                   uint64_t seed, int64_t batch, int64_t d, unsigned flags)
{
    memset(x, 0, sizeof *x);
    if (!params)
        return pf_err(-EINVAL, "pfc: no head params");
    if (num_classes <= 0)
        return pf_err(-EINVAL, "pfc: num_classes %lld is not positive", (long long)num_classes);
    if (!(sample_rate >= 0 && sample_rate <= 1))
        return pf_err(-EINVAL, "pfc: sample_rate %g outside [0, 1]", sample_rate);
    if (batch <= 0 || d <= 0)
        return pf_err(-EINVAL, "pfc: batch %lld and embedding_size %lld must be positive", (long long)batch,
                      (long long)d);
    x->params = *params;
    x->coll = coll;
    x->world_size = coll ? coll->world_size : 1;
    x->rank = coll ? coll->rank : 0;
    x->num_classes = num_classes;
    x->sample_rate = sample_rate;
    x->seed = seed;
    x->batch = batch;
    x->d = d;
    int global = params->mode == HEAD_MODE_GLOBAL;
    x->n = global ? batch * x->world_size : batch;
    int64_t part = global ? sample_partition_size(num_classes, x->world_size, x->rank) : num_classes;
    int64_t kmax = sample_count(sample_rate, part, params->sample_ceil), pmax = x->n < part ? x->n : part;
    x->k_max = kmax > pmax ? kmax : pmax;
    x->host_head = !(flags & PFC_NO_HOST_HEAD);
    x->labels_all = malloc((size_t)x->n * sizeof(int64_t));
    x->labels_local = malloc((size_t)x->n * sizeof(int64_t));
    if (global && x->host_head) {
        x->emb_all = malloc((size_t)(x->n * d) * sizeof(float));
        x->grad_all = malloc((size_t)(x->n * d) * sizeof(float));
    }
    if (!x->labels_all || !x->labels_local || (global && x->host_head && (!x->emb_all || !x->grad_all))) {
        pfc_free(x);
        return pf_err(-ENOMEM, "pfc: out of memory for a global batch of %lld x %lld", (long long)batch,
                      (long long)d);
    }
    if (!x->host_head)
        return 0;
    int rc = head_ws_init(&x->ws, x->n, x->k_max, d);
    if (rc < 0) {
        pfc_free(x);
        return rc;
    }
    return 0;
}

int pfc_sample(pfc *x, int64_t step, const int64_t *labels, const int64_t **ids, int64_t *k)
{
    int rc;
    int global = x->params.mode == HEAD_MODE_GLOBAL;
    x->sampled = 0;
    if (global && x->world_size > 1) {
        if ((rc = coll_allgather(x->coll, labels, x->labels_all, (size_t)x->batch * sizeof(int64_t))) < 0)
            return pf_err_wrap(rc, "pfc: allgather of the labels");
    } else {
        memcpy(x->labels_all, labels, (size_t)x->batch * sizeof(int64_t));
    }
    sample_args a = {.num_classes = x->num_classes,
                     .world_size = x->world_size,
                     .rank = x->rank,
                     .sample_rate = x->sample_rate,
                     .seed = x->seed,
                     .step = step,
                     .mode = global ? SAMPLE_GLOBAL : SAMPLE_LOCAL,
                     .ceil_count = x->params.sample_ceil};
    free(x->ids);
    x->ids = NULL;
    x->k = 0;
    if ((rc = sample_classes(&a, x->labels_all, x->n, &x->ids, &x->k, x->labels_local)) < 0)
        return pf_err_wrap(rc, "pfc: step %lld", (long long)step);
    if (x->k > x->k_max)
        return pf_err(-EPROTO, "pfc: sampled %lld ids, more than the %lld planned", (long long)x->k,
                      (long long)x->k_max);
    x->sampled = 1;
    x->step = step;
    if (ids)
        *ids = x->ids;
    if (k)
        *k = x->k;
    return 0;
}

int pfc_step(pfc *x, const float *embeddings, const float *centers, double *loss, float *grad_embeddings,
             float *grad_centers)
{
    if (!x->sampled)
        return pf_err(-EINVAL, "pfc: pfc_step without pfc_sample for this step");
    if (!x->host_head)
        return pf_err(-EINVAL,
                      "pfc: created with PFC_NO_HOST_HEAD (sampling only): the head step runs elsewhere "
                      "(pfc_cuda_step)");
    int rc;
    int global = x->params.mode == HEAD_MODE_GLOBAL && x->world_size > 1;
    size_t bd = (size_t)(x->batch * x->d);
    const float *emb = embeddings;
    if (global) {
        if ((rc = coll_allgather(x->coll, embeddings, x->emb_all, bd * sizeof(float))) < 0)
            return pf_err_wrap(rc, "pfc: allgather of the embeddings");
        emb = x->emb_all;
    }
    int want_grad = grad_embeddings || grad_centers;
    float *gall = global ? x->grad_all : grad_embeddings;
    rc = head_forward(&x->params, &x->ws, x->coll, loss, NULL, emb, centers, x->labels_local, x->n, x->k,
                      x->d);
    if (rc == 0 && want_grad)
        rc = head_backward(&x->params, &x->ws, gall, grad_centers, emb, centers, x->labels_local, x->n, x->k,
                           x->d);
    if (rc < 0)
        return rc;
    x->sampled = 0;
    /* In global mode the row sums include every worker's columns: every rank sees the same count. */
    int64_t orphans = x->ws.no_target;
    if (global && want_grad) {
        /* Row block r of grad_all belongs to rank r's embeddings: sum it over workers onto rank r. */
        if (grad_embeddings) {
            if ((rc = coll_reduce_scatter(x->coll, x->grad_all, grad_embeddings, bd, COLL_F32)) < 0)
                return pf_err_wrap(rc, "pfc: reduce-scatter of the embedding gradients");
        } else {
            /* Every rank must take part in the collective even when it does not want the result. */
            float *tmp = malloc(bd * sizeof(float));
            if (!tmp)
                return pf_err(-ENOMEM, "pfc: out of memory");
            rc = coll_reduce_scatter(x->coll, x->grad_all, tmp, bd, COLL_F32);
            free(tmp);
            if (rc < 0)
                return pf_err_wrap(rc, "pfc: reduce-scatter of the embedding gradients");
        }
    }
    if (loss && !isfinite(*loss))
        return pf_err(-ERANGE, "pfc: loss is %s at step %lld", isnan(*loss) ? "nan" : "inf",
                      (long long)x->step);
    if (orphans > 0)
        return pf_err(-EPROTO,
                      "pfc: step %lld: %lld of %lld rows have their target class on no worker "
                      "(label or sampling fault; each counts -log(1e-30) = 69.0776)",
                      (long long)x->step, (long long)orphans, (long long)x->n);
    return 0;
}
