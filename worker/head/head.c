/* Margin-softmax head: see head.h for the math and its sources.
 *
 * Layout of one step: normalize rows (double accumulation), one SGEMM for the cosines (n,k), two
 * passes over the cosine matrix computing the logits on the fly (the raw cosines stay in the buffer
 * so the backward can apply torch.clamp's gradient mask), allreduce of row max then of row sums,
 * then the cosine matrix is overwritten with dL/dcos and two SGEMMs give dL/d en and dL/d wn. */
#include "worker/head/head.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/err.h"

/* Rows are independent in every elementwise pass: split them over OpenMP threads where available. */
#ifdef _OPENMP
#define PARALLEL_ROWS _Pragma("omp parallel for schedule(static)")
#else
#define PARALLEL_ROWS
#endif

#define NORM_EPS     1e-12
#define TARGET_CLAMP 1e-7
/* -log(1e-30): the loss of a row whose target probability is floored (arcface_torch clamp_min). */
#define LOSS_CAP 69.07755278982137

int head_parse_margin_grad(const char *name, head_margin_grad *out)
{
    if (name && strcmp(name, "exact") == 0) {
        *out = HEAD_MARGIN_GRAD_EXACT;
        return 0;
    }
    if (name && strcmp(name, "straight_through") == 0) {
        *out = HEAD_MARGIN_GRAD_STRAIGHT_THROUGH;
        return 0;
    }
    return pf_err(-EINVAL, "margin_grad '%s' is neither 'exact' nor 'straight_through'",
                  name ? name : "(null)");
}

int head_parse_mode(const char *name, head_mode *out)
{
    if (name && strcmp(name, "global") == 0) {
        *out = HEAD_MODE_GLOBAL;
        return 0;
    }
    if (name && strcmp(name, "local") == 0) {
        *out = HEAD_MODE_LOCAL;
        return 0;
    }
    return pf_err(-EINVAL, "head_mode '%s' is neither 'global' nor 'local'", name ? name : "(null)");
}

int head_params_from_config(const pf_config *cfg, head_params *out)
{
    head_params p = {.s = cfg->scale,
                     .m1 = cfg->margin_list[0],
                     .m2 = cfg->margin_list[1],
                     .m3 = cfg->margin_list[2],
                     .interclass_filtering_threshold = cfg->interclass_filtering_threshold};
    int rc;
    if ((rc = head_parse_margin_grad(cfg->margin_grad, &p.margin_grad)) < 0)
        return rc;
    if ((rc = head_parse_mode(cfg->head_mode, &p.mode)) < 0)
        return rc;
    if (!(p.s > 0) || !isfinite(p.m1) || !isfinite(p.m2) || !isfinite(p.m3))
        return pf_err(-EINVAL, "head: scale %g must be > 0 and margin_list (%g, %g, %g) finite", p.s, p.m1,
                      p.m2, p.m3);
    *out = p;
    return 0;
}

void head_ws_free(head_ws *ws)
{
    if (!ws)
        return;
    free(ws->cos);
    free(ws->en);
    free(ws->wn);
    free(ws->inv_e);
    free(ws->inv_w);
    free(ws->row_max);
    free(ws->row_red);
    free(ws->tcos);
    memset(ws, 0, sizeof *ws);
}

int head_ws_init(head_ws *ws, int64_t n_max, int64_t k_max, int64_t d)
{
    memset(ws, 0, sizeof *ws);
    if (n_max <= 0 || k_max < 0 || d <= 0)
        return pf_err(-EINVAL,
                      "head workspace: n_max %lld, k_max %lld, d %lld (need n_max > 0, k_max >= 0, d > 0)",
                      (long long)n_max, (long long)k_max, (long long)d);
    size_t n = (size_t)n_max, k = (size_t)k_max, dd = (size_t)d;
    size_t k1 = k ? k : 1;
    ws->cos = malloc(n * k1 * sizeof(float));
    ws->en = malloc(n * dd * sizeof(float));
    ws->wn = malloc(k1 * dd * sizeof(float));
    ws->inv_e = malloc(n * sizeof(double));
    ws->inv_w = malloc(k1 * sizeof(double));
    ws->row_max = malloc(n * sizeof(float));
    ws->row_red = malloc(3 * n * sizeof(double));
    ws->tcos = malloc(n * sizeof(float));
    if (!ws->cos || !ws->en || !ws->wn || !ws->inv_e || !ws->inv_w || !ws->row_max || !ws->row_red ||
        !ws->tcos) {
        head_ws_free(ws);
        return pf_err(-ENOMEM, "head workspace: out of memory for n %lld x k %lld x d %lld", (long long)n_max,
                      (long long)k_max, (long long)d);
    }
    ws->n_max = n_max;
    ws->k_max = k_max;
    ws->d = d;
    return 0;
}

/* out (rows, d) = in / max(|in|, eps) row by row; inv[r] = 1 / max(|in_r|, eps). */
static void normalize_rows(float *out, double *inv, const float *in, int64_t rows, int64_t d)
{
    PARALLEL_ROWS
    for (int64_t r = 0; r < rows; r++) {
        const float *x = in + r * d;
        double ss = 0.0;
        for (int64_t c = 0; c < d; c++)
            ss += (double)x[c] * x[c];
        double nrm = sqrt(ss);
        double iv = 1.0 / (nrm > NORM_EPS ? nrm : NORM_EPS);
        inv[r] = iv;
        float *y = out + r * d;
        for (int64_t c = 0; c < d; c++)
            y[c] = (float)(x[c] * iv);
    }
}

/* Backward of normalize_rows, in place on g: g_r <- (g_r - y_r (y_r . g_r)) * inv_r, where y is the
 * normalized row. (Below eps the norm is the constant eps and the projection term vanishes.) */
static void normalize_rows_backward(float *g, const float *y, const double *inv, const float *x, int64_t rows,
                                    int64_t d)
{
    PARALLEL_ROWS
    for (int64_t r = 0; r < rows; r++) {
        float *gr = g + r * d;
        const float *yr = y + r * d;
        double ss = 0.0, dot = 0.0;
        for (int64_t c = 0; c < d; c++) {
            ss += (double)x[r * d + c] * x[r * d + c];
            dot += (double)yr[c] * gr[c];
        }
        if (sqrt(ss) <= NORM_EPS)
            dot = 0.0;
        for (int64_t c = 0; c < d; c++)
            gr[c] = (float)((gr[c] - yr[c] * dot) * inv[r]);
    }
}

static inline double clampd(double x, double lo, double hi)
{
    return x < lo ? lo : (x > hi ? hi : x);
}

/* Margin value v for a target cosine c (raw, before the [-1,1] clamp), and dv/dc in *dv. */
static double target_value(const head_params *p, double c, double *dv)
{
    double cc = clampd(c, -1.0, 1.0);
    double t = clampd(cc, -1.0 + TARGET_CLAMP, 1.0 - TARGET_CLAMP);
    double theta = acos(t);
    double v = cos(p->m1 * theta + p->m2) - p->m3;
    if (dv) {
        int outer = (c >= -1.0 && c <= 1.0);
        if (p->margin_grad == HEAD_MARGIN_GRAD_STRAIGHT_THROUGH) {
            *dv = outer ? 1.0 : 0.0;
        } else {
            int inner = (cc >= -1.0 + TARGET_CLAMP && cc <= 1.0 - TARGET_CLAMP);
            *dv = (outer && inner) ? p->m1 * sin(p->m1 * theta + p->m2) / sqrt(1.0 - t * t) : 0.0;
        }
    }
    return v;
}

/* Logit of a non-target cosine c and its derivative dz/dc / s (0 when clamped or filtered). */
static inline float other_value(const head_params *p, float c, float *dv)
{
    float cc = c < -1.0f ? -1.0f : (c > 1.0f ? 1.0f : c);
    if (p->interclass_filtering_threshold > 0 && cc > p->interclass_filtering_threshold) {
        *dv = 0.0f;
        return 0.0f;
    }
    *dv = (c >= -1.0f && c <= 1.0f) ? 1.0f : 0.0f;
    return cc;
}

/* Sum over columns [from, to) of row ci of exp(z - mx) for non-target columns, z = s * v(c); each
 * cosine is replaced by e = exp(z - mx), or by -1 - e where dv/dc is 0 (clamped or filtered). */
static double row_exp(const head_params *p, float *ci, int64_t from, int64_t to, float s, float mx)
{
    double sum = 0.0;
    for (int64_t j = from; j < to; j++) {
        float dv;
        float e = expf(s * other_value(p, ci[j], &dv) - mx);
        sum += e;
        ci[j] = dv != 0.0f ? e : -1.0f - e;
    }
    return sum;
}

int head_forward_backward(const head_params *p, head_ws *ws, pf_coll *coll, const float *embeddings,
                          int64_t n, const float *centers, int64_t k, int64_t d, const int64_t *labels,
                          double *loss, float *logits, float *grad_embeddings, float *grad_centers)
{
    if (!p || !ws || !embeddings || (!centers && k > 0) || !labels)
        return pf_err(-EINVAL, "head: NULL argument");
    if (n <= 0 || n > ws->n_max || k < 0 || k > ws->k_max || d != ws->d)
        return pf_err(
            -EINVAL, "head: n %lld, k %lld, d %lld do not fit the workspace (n_max %lld, k_max %lld, d %lld)",
            (long long)n, (long long)k, (long long)d, (long long)ws->n_max, (long long)ws->k_max,
            (long long)ws->d);
    if (!(p->s > 0) || !isfinite(p->m1) || !isfinite(p->m2) || !isfinite(p->m3))
        return pf_err(-EINVAL, "head: scale %g must be > 0 and margins (%g, %g, %g) finite", p->s, p->m1,
                      p->m2, p->m3);
    for (int64_t i = 0; i < n; i++)
        if (labels[i] < -1 || labels[i] >= k)
            return pf_err(-ERANGE, "head: label %lld of row %lld outside [-1, %lld)", (long long)labels[i],
                          (long long)i, (long long)k);

    int world = coll ? coll->world_size : 1;
    int global = (p->mode == HEAD_MODE_GLOBAL) && coll && world > 1;
    const float s = (float)p->s;
    float *cosm = ws->cos;
    int rc;

    normalize_rows(ws->en, ws->inv_e, embeddings, n, d);
    if (k > 0) {
        normalize_rows(ws->wn, ws->inv_w, centers, k, d);
        /* cos (n,k) = en (n,d) . wn (k,d)^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)k, (int)d, 1.0f, ws->en, (int)d,
                    ws->wn, (int)d, 0.0f, cosm, (int)k);
    }

    /* Pass 1: logits and row max. */
    PARALLEL_ROWS
    for (int64_t i = 0; i < n; i++) {
        const float *ci = cosm + i * k;
        float mx = -INFINITY, dv;
        for (int64_t j = 0; j < k; j++) {
            float z = (j == labels[i]) ? (float)(p->s * target_value(p, ci[j], NULL))
                                       : s * other_value(p, ci[j], &dv);
            if (logits)
                logits[i * k + j] = z;
            if (z > mx)
                mx = z;
        }
        ws->row_max[i] = mx;
    }
    if (global && (rc = coll_allreduce(coll, ws->row_max, (size_t)n, COLL_F32, COLL_MAX)) < 0)
        return pf_err_wrap(rc, "head: allreduce of row max");

    /* Pass 2: row sums of exp(z - max) and the target's z - max. The cosine buffer keeps, for the
     * backward, e = exp(z - max) of each non-target element (or -1 - e where its gradient is masked:
     * clamped or filtered); the target's raw cosine moves to tcos[i]. */
    PARALLEL_ROWS
    for (int64_t i = 0; i < n; i++) {
        float *ci = cosm + i * k;
        int64_t li = labels[i];
        double mx = ws->row_max[i], zt = 0.0, has = 0.0;
        double sum = row_exp(p, ci, 0, li < 0 ? k : li, s, ws->row_max[i]);
        if (li >= 0) {
            double z = p->s * target_value(p, ci[li], NULL);
            double e = exp(z - mx);
            ws->tcos[i] = ci[li];
            ci[li] = (float)e;
            sum += e;
            zt = z - mx;
            has = 1.0;
            sum += row_exp(p, ci, li + 1, k, s, ws->row_max[i]);
        }
        ws->row_red[3 * i] = sum;
        ws->row_red[3 * i + 1] = zt;
        ws->row_red[3 * i + 2] = has;
    }
    if (global && (rc = coll_allreduce(coll, ws->row_red, (size_t)(3 * n), COLL_F64, COLL_SUM)) < 0)
        return pf_err_wrap(rc, "head: allreduce of row sums");

    double total = 0.0;
    ws->no_target = 0;
    for (int64_t i = 0; i < n; i++) {
        double li = LOSS_CAP;
        ws->no_target += !(ws->row_red[3 * i + 2] > 0);
        if (ws->row_red[3 * i + 2] > 0) {
            li = -(ws->row_red[3 * i + 1] - log(ws->row_red[3 * i]));
            if (p->clamp_loss && li > LOSS_CAP)
                li = LOSS_CAP;
        }
        total += li;
    }
    double mean = total / (double)n;
    if (p->mode == HEAD_MODE_LOCAL && coll && world > 1) {
        if ((rc = coll_allreduce(coll, &mean, 1, COLL_F64, COLL_SUM)) < 0)
            return pf_err_wrap(rc, "head: allreduce of the local losses");
        mean /= world;
    }
    if (loss)
        *loss = mean;
    if (!grad_embeddings && !grad_centers)
        return 0;

    /* Backward: cos buffer <- dL/dcos = s * (p - onehot) * g * dv/dc, g = 1/N (global) or 1/(N W) (local). */
    double g = 1.0 / ((double)n * (p->mode == HEAD_MODE_LOCAL ? world : 1));
    PARALLEL_ROWS
    for (int64_t i = 0; i < n; i++) {
        float *ci = cosm + i * k;
        int64_t li = labels[i];
        double mx = ws->row_max[i], inv_sum = 1.0 / ws->row_red[3 * i];
        float scale = (float)(p->s * g * inv_sum);
        for (int64_t j = 0; j < k; j++)
            ci[j] = ci[j] >= 0.0f ? ci[j] * scale : 0.0f;
        if (li >= 0) {
            double dv;
            double z = p->s * target_value(p, ws->tcos[i], &dv);
            double pr = exp(z - mx) * inv_sum;
            ci[li] = (float)(p->s * (pr - 1.0) * g * dv);
        }
    }

    if (grad_embeddings) {
        if (k > 0)
            /* dL/d en (n,d) = dcos (n,k) . wn (k,d) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)d, (int)k, 1.0f, cosm, (int)k,
                        ws->wn, (int)d, 0.0f, grad_embeddings, (int)d);
        else
            memset(grad_embeddings, 0, (size_t)(n * d) * sizeof(float));
        normalize_rows_backward(grad_embeddings, ws->en, ws->inv_e, embeddings, n, d);
    }
    if (grad_centers && k > 0) {
        /* dL/d wn (k,d) = dcos^T (k,n) . en (n,d) */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)k, (int)d, (int)n, 1.0f, cosm, (int)k,
                    ws->en, (int)d, 0.0f, grad_centers, (int)d);
        normalize_rows_backward(grad_centers, ws->wn, ws->inv_w, centers, k, d);
    }
    return 0;
}
