// Host side of the margin-softmax head (kernels/cuda/head.cu): workspace, cuda_head_forward_backward,
// cuda_head_dist. Private to head.cu, which defines the primitives below with CUDA / cuBLAS; also
// compiled by tests/kernels/cuda/cuda_emu_device.cpp with host primitives and the kernels emulated on the CPU
// (tests/kernels/cuda/cuda_emu.h), so that this exact code runs in CI without a GPU. The includer provides:
//   HEAD_LAUNCH(what, grid, kernel, args...)   launch grid blocks of HEAD_THREADS, return -EIO on failure
//   int head_sgemm(blas, ta, tb, m, n, k, A, lda, B, ldb, C, ldc)   column-major C = op(A) op(B) (fp32)
//   int head_d2h(dst, src, bytes), head_h2d(dst, src, bytes), head_memset0(p, bytes), head_device_sync()
//   int head_blas_create(void **), void head_blas_destroy(void *), void head_dfree(void *)
//   cuda_malloc, cuda_malloc_managed, cuda_device_count (kernels/cuda/cuda_ops.h)
// and includes kernels/cuda/head_kernels.cuh first.
#ifndef PFCPS_KERNELS_CUDA_HEAD_IMPL_CUH
#define PFCPS_KERNELS_CUDA_HEAD_IMPL_CUH

extern "C" void cuda_head_ws_free(cuda_head_ws *ws)
{
    if (!ws)
        return;
    head_dfree(ws->cos);
    head_dfree(ws->en);
    head_dfree(ws->wn);
    head_dfree(ws->inv_e);
    head_dfree(ws->inv_w);
    head_dfree(ws->row_loss);
    free(ws->host_row_loss);
    head_dfree(ws->row_max);
    head_dfree(ws->row_red);
    head_dfree(ws->scal);
    free(ws->host_row_red);
    if (ws->cublas)
        head_blas_destroy(ws->cublas);
    memset(ws, 0, sizeof *ws);
}

extern "C" int cuda_head_ws_init(cuda_head_ws *ws, int n_max, int k_max, int d)
{
    return cuda_head_ws_init_coll(ws, n_max, k_max, d, 0);
}

extern "C" int cuda_head_ws_init_coll(cuda_head_ws *ws, int n_max, int k_max, int d, int coll_host_memory)
{
    if (!ws)
        return pf_err(-EINVAL, "CUDA head workspace: NULL");
    memset(ws, 0, sizeof *ws);
    if (n_max <= 0 || k_max < 0 || d <= 0)
        return pf_err(-EINVAL,
                      "CUDA head workspace: n_max %d, k_max %d, d %d (need n_max > 0, "
                      "k_max >= 0, d > 0)",
                      n_max, k_max, d);
    if (cuda_device_count() == 0)
        return pf_err(-ENODEV, "CUDA head: no GPU visible");
    size_t n = (size_t)n_max, k1 = k_max ? (size_t)k_max : 1, dd = (size_t)d;
    int rc;
    if ((rc = cuda_malloc((void **)&ws->cos, n * k1 * sizeof(float))) ||
        (rc = cuda_malloc((void **)&ws->en, n * dd * sizeof(float))) ||
        (rc = cuda_malloc((void **)&ws->wn, k1 * dd * sizeof(float))) ||
        (rc = cuda_malloc((void **)&ws->inv_e, n * sizeof(double))) ||
        (rc = cuda_malloc((void **)&ws->inv_w, k1 * sizeof(double))) ||
        (rc = cuda_malloc((void **)&ws->row_loss, n * sizeof(double)))) {
        cuda_head_ws_free(ws);
        return pf_err_wrap(rc, "CUDA head workspace n %d x k %d x d %d", n_max, k_max, d);
    }
    /* the buffers cuda_head_dist's collectives see */
    int (*alloc)(void **, size_t) = coll_host_memory ? cuda_malloc_managed : cuda_malloc;
    if ((rc = alloc((void **)&ws->row_max, n * sizeof(float))) ||
        (rc = alloc((void **)&ws->row_red, 4 * n * sizeof(double))) ||
        (rc = alloc((void **)&ws->scal, 4 * sizeof(double)))) {
        cuda_head_ws_free(ws);
        return pf_err_wrap(rc, "CUDA head workspace (row reductions, %s memory) for n %d",
                           coll_host_memory ? "managed" : "device", n_max);
    }
    ws->coll_host = coll_host_memory != 0;
    ws->host_row_loss = (double *)malloc(n * sizeof(double));
    ws->host_row_red = (double *)malloc(4 * n * sizeof(double));
    if (!ws->host_row_loss || !ws->host_row_red) {
        cuda_head_ws_free(ws);
        return pf_err(-ENOMEM, "CUDA head workspace: out of host memory");
    }
    if ((rc = head_blas_create(&ws->cublas)) < 0) {
        cuda_head_ws_free(ws);
        return rc;
    }
    ws->n_max = n_max;
    ws->k_max = k_max;
    ws->d = d;
    return 0;
}

/* Normalized rows and cosines: ws->en, ws->inv_e (n rows), ws->wn, ws->inv_w (k rows),
 * ws->cos (n,k) = en wn^T (cuBLAS, fp32). */
static int head_cosines(cuda_head_ws *ws, const float *embeddings, int n, const float *centers, int k)
{
    const int d = ws->d;
    int rc;
    HEAD_LAUNCH("normalize_rows (embeddings)", n, normalize_inv_k, ws->en, ws->inv_e, embeddings, d);
    if (k > 0) {
        HEAD_LAUNCH("normalize_rows (centers)", k, normalize_inv_k, ws->wn, ws->inv_w, centers, d);
        /* cos (n,k) = en (n,d) wn (k,d)^T, row-major; column-major cos^T = wn en^T */
        if ((rc = head_sgemm(ws->cublas, 1, 0, k, n, d, ws->wn, d, ws->en, d, ws->cos, k)) < 0)
            return rc;
    }
    return 0;
}

/* With ws->cos holding dL/dcos (n,k): the two GEMMs and the normalization backward (each output
 * may be NULL; grad_embeddings is zero when k == 0). */
static int head_backward(cuda_head_ws *ws, const float *embeddings, int n, const float *centers, int k,
                         float *grad_embeddings, float *grad_centers)
{
    const int d = ws->d;
    int rc;
    if (grad_embeddings) {
        if (k > 0)
            /* dL/d en (n,d) = dcos (n,k) wn (k,d): column-major en^T = wn^T dcos^T */
            rc = head_sgemm(ws->cublas, 0, 0, d, n, k, ws->wn, d, ws->cos, k, grad_embeddings, d);
        else
            rc = head_memset0(grad_embeddings, (size_t)n * d * sizeof(float));
        if (rc < 0)
            return rc;
        HEAD_LAUNCH("normalize_rows backward (embeddings)", n, normalize_bwd_k, grad_embeddings, ws->en,
                    ws->inv_e, embeddings, d);
    }
    if (grad_centers && k > 0) {
        /* dL/d wn (k,d) = dcos^T (k,n) en (n,d): column-major wn^T (d,k) = en^T (d,n) dcos (n,k) */
        if ((rc = head_sgemm(ws->cublas, 0, 1, d, k, n, ws->en, d, ws->cos, k, grad_centers, d)) < 0)
            return rc;
        HEAD_LAUNCH("normalize_rows backward (centers)", k, normalize_bwd_k, grad_centers, ws->wn, ws->inv_w,
                    centers, d);
    }
    return 0;
}

extern "C" int cuda_head_forward_backward(const cuda_head_params *p, cuda_head_ws *ws,
                                          const float *embeddings, int n, const float *centers, int k,
                                          const int64_t *labels, double grad_scale, double *host_loss,
                                          float *logits, float *grad_embeddings, float *grad_centers)
{
    if (!p || !ws || !ws->cublas || !embeddings || (!centers && k > 0) || !labels)
        return pf_err(-EINVAL, "CUDA head: NULL argument (or workspace not initialized)");
    if (n <= 0 || n > ws->n_max || k < 0 || k > ws->k_max)
        return pf_err(-EINVAL, "CUDA head: n %d, k %d do not fit the workspace (n_max %d, k_max %d)", n, k,
                      ws->n_max, ws->k_max);
    if (!(p->s > 0) || !isfinite(p->m1) || !isfinite(p->m2) || !isfinite(p->m3))
        return pf_err(-EINVAL, "CUDA head: scale %g must be > 0 and margins (%g, %g, %g) finite", p->s, p->m1,
                      p->m2, p->m3);
    double g = grad_scale != 0.0 ? grad_scale : 1.0 / n;
    int want_grad = grad_embeddings || grad_centers;
    int rc;

    if ((rc = head_cosines(ws, embeddings, n, centers, k)) < 0)
        return rc;
    HEAD_LAUNCH("head_row (margin softmax)", n, head_row_k, ws->cos, logits, labels, k, *p, g, ws->row_loss,
                want_grad);
    if ((rc = head_d2h(ws->host_row_loss, ws->row_loss, (size_t)n * sizeof(double))) < 0)
        return rc;
    double total = 0.0;
    for (int i = 0; i < n; i++) {
        if (ws->host_row_loss[i] == -INFINITY) /* head_row_k's mark of a bad label */
            return pf_err(-ERANGE, "CUDA head: the label of row %d is outside [-1, %d)", i, k);
        total += ws->host_row_loss[i];
    }
    if (host_loss)
        *host_loss = total / n;
    return head_backward(ws, embeddings, n, centers, k, grad_embeddings, grad_centers);
}

/* Before a collective on workspace buffers: a host backend reads them on the host. */
static int coll_ready(const cuda_head_ws *ws)
{
    return ws->coll_host ? head_device_sync() : 0;
}

extern "C" int cuda_head_dist(const cuda_head_params *p, int local_mode, cuda_head_ws *ws, pf_coll *coll,
                              const float *embeddings, int n, const float *centers, int k,
                              const int64_t *labels, double *host_loss, int64_t *host_no_target,
                              float *logits, float *grad_embeddings, float *grad_centers)
{
    if (!p || !ws || !ws->cublas || !ws->row_red || !embeddings || (!centers && k > 0) || !labels)
        return pf_err(-EINVAL, "CUDA head: NULL argument (or workspace not initialized)");
    if (n <= 0 || n > ws->n_max || k < 0 || k > ws->k_max)
        return pf_err(-EINVAL, "CUDA head: n %d, k %d do not fit the workspace (n_max %d, k_max %d)", n, k,
                      ws->n_max, ws->k_max);
    if (!(p->s > 0) || !isfinite(p->m1) || !isfinite(p->m2) || !isfinite(p->m3) || !isfinite(p->tau))
        return pf_err(-EINVAL, "CUDA head: scale %g must be > 0 and margins (%g, %g, %g), tau %g finite",
                      p->s, p->m1, p->m2, p->m3, p->tau);
    if (coll && (!coll->ops || coll->world_size < 1))
        return pf_err(-EINVAL, "CUDA head: collectives handle not initialized");
    const int world = coll ? coll->world_size : 1;
    const int global = !local_mode && world > 1;
    const int local_group = local_mode && world > 1;
    const double g = 1.0 / ((double)n * (local_mode ? world : 1));
    const int want_grad = grad_embeddings || grad_centers;
    int rc;

    if ((rc = head_cosines(ws, embeddings, n, centers, k)) < 0)
        return rc;
    HEAD_LAUNCH("head row max", n, dist_max_k, ws->cos, logits, labels, k, *p, ws->row_max);
    if (global) {
        if ((rc = coll_ready(ws)) < 0)
            return rc;
        if ((rc = coll_allreduce(coll, ws->row_max, (size_t)n, COLL_F32, COLL_MAX)) < 0)
            return pf_err_wrap(rc, "CUDA head: allreduce of row max");
    }
    HEAD_LAUNCH("head row sums", n, dist_sum_k, ws->cos, labels, k, *p, ws->row_max, ws->row_red);
    if (global) {
        if ((rc = coll_ready(ws)) < 0)
            return rc;
        if ((rc = coll_allreduce(coll, ws->row_red, (size_t)4 * n, COLL_F64, COLL_SUM)) < 0)
            return pf_err_wrap(rc, "CUDA head: allreduce of row sums");
    }
    if ((rc = head_d2h(ws->host_row_red, ws->row_red, (size_t)4 * n * sizeof(double))) < 0)
        return rc;

    /* head.c's loss: rows in order, log-softmax of the target, 69.0776 without a target anywhere */
    double total, bad, no_target;
    int bad_row;
    head_dist_loss(ws->host_row_red, n, p->clamp_loss, &total, &no_target, &bad, &bad_row);
    double mean = total / (double)n;
    if (local_group) {
        double sc[4] = {mean, no_target, bad, 0.0};
        if ((rc = head_h2d(ws->scal, sc, sizeof sc)) < 0)
            return rc;
        if ((rc = coll_ready(ws)) < 0)
            return rc;
        if ((rc = coll_allreduce(coll, ws->scal, 4, COLL_F64, COLL_SUM)) < 0)
            return pf_err_wrap(rc, "CUDA head: allreduce of the local losses");
        if ((rc = head_d2h(sc, ws->scal, sizeof sc)) < 0)
            return rc;
        mean = sc[0] / world;
        no_target = sc[1];
        bad = sc[2];
    }
    if (bad > 0) {
        if (bad_row >= 0)
            return pf_err(-ERANGE,
                          "CUDA head: the label of row %d is outside [-1, %d) (%.0f bad label(s) in "
                          "the group)",
                          bad_row, k, bad);
        return pf_err(-ERANGE, "CUDA head: %.0f label(s) outside [-1, k) on another worker of the group",
                      bad);
    }
    if (host_loss)
        *host_loss = mean;
    if (host_no_target)
        *host_no_target = (int64_t)no_target;
    if (!want_grad)
        return 0;
    HEAD_LAUNCH("head dL/dcos", n, dist_grad_k, ws->cos, labels, k, *p, g, ws->row_max, ws->row_red);
    return head_backward(ws, embeddings, n, centers, k, grad_embeddings, grad_centers);
}

#endif
