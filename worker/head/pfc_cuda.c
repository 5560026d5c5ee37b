/* Partial FC step on the CUDA device: see pfc_cuda.h. Mirrors pfc_step (pfc.c) line by line; the
 * head itself is cuda_head_dist (kernels/cuda/head.cu), the twin of head_forward + head_backward. */
#include "worker/head/pfc_cuda.h"

#ifdef PFCPS_HAVE_CUDA_OPS

#include <limits.h>
#include <math.h>
#include <string.h>

#include "common/err.h"

void pfc_cuda_free(pfc_cuda *x)
{
    if (!x || !x->created) {
        if (x)
            memset(x, 0, sizeof *x);
        return;
    }
    cuda_head_ws_free(&x->ws);
    cuda_free(x->dev_labels);
    cuda_free(x->emb_all);
    cuda_free(x->grad_all);
    cuda_free(x->emb_send);
    cuda_free(x->grad_recv);
    memset(x, 0, sizeof *x);
}

int pfc_cuda_create(pfc_cuda *x, const pfc *host, pf_coll *coll, int coll_host_memory)
{
    if (!x)
        return pf_err(-EINVAL, "pfc_cuda: NULL state");
    memset(x, 0, sizeof *x);
    if (!host || !host->labels_local || !host->labels_all || host->n <= 0 || host->batch <= 0 ||
        host->d <= 0 || host->world_size < 1)
        return pf_err(-EINVAL, "pfc_cuda: the host pfc is not initialized (pfc_init first)");
    if (host->world_size > 1 && !coll)
        return pf_err(-EINVAL, "pfc_cuda: world_size %d needs a device pf_coll (NULL given)",
                      host->world_size);
    if (coll && (!coll->ops || coll->world_size != host->world_size || coll->rank != host->rank))
        return pf_err(-EINVAL,
                      "pfc_cuda: the pf_coll (rank %d of %d) is not the host pfc's group (rank %d of %d)",
                      coll->rank, coll->world_size, host->rank, host->world_size);
    if (host->n > INT_MAX || host->k_max > INT_MAX || host->d > INT_MAX || host->k_max < 0)
        return pf_err(-EINVAL, "pfc_cuda: n %lld, k_max %lld, d %lld: the CUDA head takes at most %d of each",
                      (long long)host->n, (long long)host->k_max, (long long)host->d, INT_MAX);
    const head_params *hp = &host->params;
    if (!(hp->s > 0) || !isfinite(hp->m1) || !isfinite(hp->m2) || !isfinite(hp->m3) ||
        !isfinite(hp->interclass_filtering_threshold))
        return pf_err(-EINVAL, "pfc_cuda: scale %g must be > 0 and margins (%g, %g, %g), threshold %g finite",
                      hp->s, hp->m1, hp->m2, hp->m3, hp->interclass_filtering_threshold);
    int local = hp->mode == HEAD_MODE_LOCAL;
    if (host->n != (local ? host->batch : host->batch * host->world_size))
        return pf_err(-EINVAL, "pfc_cuda: host pfc has n %lld rows for batch %lld, world %d, %s mode",
                      (long long)host->n, (long long)host->batch, host->world_size,
                      local ? "local" : "global");
    if (cuda_device_count() == 0)
        return pf_err(-ENODEV, "pfc_cuda: no CUDA device visible");

    x->params = (cuda_head_params){.s = hp->s,
                                   .m1 = hp->m1,
                                   .m2 = hp->m2,
                                   .m3 = hp->m3,
                                   .tau = hp->interclass_filtering_threshold,
                                   .straight_through = hp->margin_grad == HEAD_MARGIN_GRAD_STRAIGHT_THROUGH,
                                   .clamp_loss = hp->clamp_loss};
    x->local = local;
    x->world_size = host->world_size;
    x->rank = host->rank;
    x->coll = coll;
    x->coll_host = coll_host_memory != 0;
    x->batch = host->batch;
    x->d = host->d;
    x->n = host->n;
    x->k_max = host->k_max;
    x->created = 1; /* from here on pfc_cuda_free releases what was allocated */

    size_t bd = (size_t)(x->batch * x->d), nd = (size_t)(x->n * x->d);
    int global = !local && x->world_size > 1;
    int (*coll_alloc)(void **, size_t) = x->coll_host ? cuda_malloc_managed : cuda_malloc;
    int rc = cuda_head_ws_init_coll(&x->ws, (int)x->n, (int)x->k_max, (int)x->d, x->coll_host);
    if (!rc)
        rc = cuda_malloc((void **)&x->dev_labels, (size_t)x->n * sizeof(int64_t));
    if (!rc && global) {
        if (!(rc = coll_alloc((void **)&x->emb_all, nd * sizeof(float))) &&
            !(rc = coll_alloc((void **)&x->grad_all, nd * sizeof(float))) &&
            !(rc = coll_alloc((void **)&x->grad_recv, bd * sizeof(float))) && x->coll_host)
            rc = coll_alloc((void **)&x->emb_send, bd * sizeof(float));
    }
    if (rc < 0) {
        pfc_cuda_free(x);
        return pf_err_wrap(rc, "pfc_cuda: device state for %lld rows x %lld sampled centers x %lld",
                           (long long)host->n, (long long)host->k_max, (long long)host->d);
    }
    return 0;
}

int pfc_cuda_step(pfc_cuda *x, const pfc *h, const float *dev_embeddings, const float *dev_centers,
                  double *loss, float *dev_grad_embeddings, float *dev_grad_centers)
{
    if (!x || !x->created)
        return pf_err(-EINVAL, "pfc_cuda: step on a state that was not created (pfc_cuda_create)");
    if (!h || !dev_embeddings)
        return pf_err(-EINVAL, "pfc_cuda: NULL %s", h ? "embeddings" : "host pfc");
    if (!h->sampled)
        return pf_err(-EINVAL, "pfc_cuda: step without pfc_sample for this step");
    if (h->n != x->n || h->batch != x->batch || h->d != x->d || h->world_size != x->world_size ||
        h->rank != x->rank || (h->params.mode == HEAD_MODE_LOCAL) != x->local || h->k_max != x->k_max)
        return pf_err(-EINVAL,
                      "pfc_cuda: the host pfc (n %lld, d %lld, rank %d of %d) is not the one this state "
                      "was created from (n %lld, d %lld, rank %d of %d)",
                      (long long)h->n, (long long)h->d, h->rank, h->world_size, (long long)x->n,
                      (long long)x->d, x->rank, x->world_size);
    if (h->k < 0 || h->k > x->k_max || (h->k > 0 && !dev_centers))
        return pf_err(-EINVAL, "pfc_cuda: %lld sampled centers (k_max %lld)%s", (long long)h->k,
                      (long long)x->k_max, h->k > 0 && !dev_centers ? " but no centers given" : "");
    int rc;
    int global = !x->local && x->world_size > 1;
    size_t bd = (size_t)(x->batch * x->d);
    if ((rc = cuda_h2d(x->dev_labels, h->labels_local, (size_t)x->n * sizeof(int64_t))) < 0)
        return pf_err_wrap(rc, "pfc_cuda: upload of the labels");
    const float *emb = dev_embeddings;
    if (global) {
        const float *send = dev_embeddings;
        if (x->coll_host) {
            /* a host backend reads the send buffer on the host: stage the caller's rows in managed memory */
            if ((rc = cuda_d2d(x->emb_send, dev_embeddings, bd * sizeof(float))) < 0 ||
                (rc = cuda_sync()) < 0)
                return pf_err_wrap(rc, "pfc_cuda: staging the embeddings");
            send = x->emb_send;
        }
        if ((rc = coll_allgather(x->coll, send, x->emb_all, bd * sizeof(float))) < 0)
            return pf_err_wrap(rc, "pfc_cuda: allgather of the embeddings");
        emb = x->emb_all;
    }
    int want_grad = dev_grad_embeddings || dev_grad_centers;
    float *gall = global ? x->grad_all : dev_grad_embeddings;
    double l = NAN;
    int64_t orphans = 0;
    rc = cuda_head_dist(&x->params, x->local, &x->ws, x->coll, emb, (int)x->n, dev_centers, (int)h->k,
                        x->dev_labels, &l, &orphans, NULL, want_grad ? gall : NULL, dev_grad_centers);
    if (rc < 0)
        return rc;
    if (global && want_grad) {
        /* Row block r of grad_all belongs to rank r's embeddings: sum it over workers onto rank r. Every
         * rank takes part even when it does not want the result. */
        float *recv = (x->coll_host || !dev_grad_embeddings) ? x->grad_recv : dev_grad_embeddings;
        if (x->coll_host && (rc = cuda_sync()) < 0)
            return pf_err_wrap(rc, "pfc_cuda: head gradients");
        if ((rc = coll_reduce_scatter(x->coll, x->grad_all, recv, bd, COLL_F32)) < 0)
            return pf_err_wrap(rc, "pfc_cuda: reduce-scatter of the embedding gradients");
        if (dev_grad_embeddings && recv != dev_grad_embeddings &&
            (rc = cuda_d2d(dev_grad_embeddings, recv, bd * sizeof(float))) < 0)
            return pf_err_wrap(rc, "pfc_cuda: copy of the embedding gradients");
    }
    if (loss)
        *loss = l;
    if (!isfinite(l))
        return pf_err(-ERANGE, "pfc: loss is %s at step %lld", isnan(l) ? "nan" : "inf", (long long)h->step);
    if (orphans > 0)
        return pf_err(-EPROTO,
                      "pfc: step %lld: %lld of %lld rows have their target class on no worker "
                      "(label or sampling fault; each counts -log(1e-30) = 69.0776)",
                      (long long)h->step, (long long)orphans,
                      (long long)(x->local ? x->n * x->world_size : x->n));
    return 0;
}

#endif /* PFCPS_HAVE_CUDA_OPS */
