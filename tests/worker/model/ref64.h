/* Plain-C float64 versions of the backbone layers, written from PyTorch's definitions, for the
 * tests: naive loops, no library. They check the device layers (finite differences and direct
 * comparison) and run whole networks in float64. Backward functions ACCUMULATE (+=) into every
 * gradient they are given (NULL skips). */
#ifndef PFCPS_TESTS_WORKER_MODEL_REF64_H
#define PFCPS_TESTS_WORKER_MODEL_REF64_H

#include <math.h>
#include <stddef.h>

/* Output rows o in [lo, hi) whose input row o*stride - pad + k lies in [0, n). */
static inline void conv64_range(int n, int on, int k, int stride, int pad, int *lo, int *hi)
{
    int a = pad - k; /* o*stride >= a */
    *lo = a <= 0 ? 0 : (a + stride - 1) / stride;
    int b = n - 1 + pad - k; /* o*stride <= b */
    *hi = b < 0 ? 0 : b / stride + 1;
    if (*hi > on)
        *hi = on;
    if (*lo > *hi)
        *lo = *hi;
}

/* conv2d without bias: inp (B,C,H,W), w (OC,C/g,K,K) -> out (B,OC,OH,OW); the direct sum over
 * (ci, kh, kw) of w * shifted input, zero padding outside. */
static inline void conv64_forward(double *out, const double *inp, const double *w, int B, int C, int H, int W,
                                  int OC, int K, int stride, int pad, int g)
{
    int OH = (H + 2 * pad - K) / stride + 1, OW = (W + 2 * pad - K) / stride + 1;
    int cg = C / g, og = OC / g;
    for (size_t i = 0; i < (size_t)B * OC * OH * OW; i++)
        out[i] = 0.0;
    for (int b = 0; b < B; b++)
        for (int oc = 0; oc < OC; oc++) {
            int gi = oc / og;
            double *o = out + ((size_t)b * OC + oc) * OH * OW;
            for (int ci = 0; ci < cg; ci++) {
                const double *x = inp + ((size_t)b * C + gi * cg + ci) * H * W;
                for (int kh = 0; kh < K; kh++) {
                    int h0, h1;
                    conv64_range(H, OH, kh, stride, pad, &h0, &h1);
                    for (int kw = 0; kw < K; kw++) {
                        int w0, w1;
                        conv64_range(W, OW, kw, stride, pad, &w0, &w1);
                        double wv = w[(((size_t)oc * cg + ci) * K + kh) * K + kw];
                        for (int oh = h0; oh < h1; oh++) {
                            const double *xr = x + (size_t)(oh * stride - pad + kh) * W - pad + kw;
                            double *orow = o + (size_t)oh * OW;
                            for (int ow = w0; ow < w1; ow++)
                                orow[ow] += wv * xr[ow * stride];
                        }
                    }
                }
            }
        }
}

static inline void conv64_backward(double *dinp, double *dw, const double *dout, const double *inp,
                                   const double *w, int B, int C, int H, int W, int OC, int K, int stride,
                                   int pad, int g)
{
    int OH = (H + 2 * pad - K) / stride + 1, OW = (W + 2 * pad - K) / stride + 1;
    int cg = C / g, og = OC / g;
    for (int b = 0; b < B; b++)
        for (int oc = 0; oc < OC; oc++) {
            int gi = oc / og;
            const double *d = dout + ((size_t)b * OC + oc) * OH * OW;
            for (int ci = 0; ci < cg; ci++) {
                size_t xo = ((size_t)b * C + gi * cg + ci) * H * W;
                for (int kh = 0; kh < K; kh++) {
                    int h0, h1;
                    conv64_range(H, OH, kh, stride, pad, &h0, &h1);
                    for (int kw = 0; kw < K; kw++) {
                        int w0, w1;
                        conv64_range(W, OW, kw, stride, pad, &w0, &w1);
                        size_t wi = (((size_t)oc * cg + ci) * K + kh) * K + kw;
                        double wv = w[wi], s = 0.0;
                        for (int oh = h0; oh < h1; oh++) {
                            size_t r = xo + (size_t)(oh * stride - pad + kh) * W - pad + kw;
                            const double *drow = d + (size_t)oh * OW;
                            for (int ow = w0; ow < w1; ow++) {
                                if (dinp)
                                    dinp[r + (size_t)ow * stride] += drow[ow] * wv;
                                s += drow[ow] * inp[r + (size_t)ow * stride];
                            }
                        }
                        if (dw)
                            dw[wi] += s;
                    }
                }
            }
        }
}

/* BatchNorm (training mode): batch mean, biased var -> mean/var (C); inp, out (B,C,HW) */
static inline void bn64_forward(double *out, double *mean, double *var, const double *inp, const double *w,
                                const double *bias, int B, int C, int HW, double eps)
{
    double n = (double)B * HW;
    for (int c = 0; c < C; c++) {
        double s = 0.0, s2 = 0.0;
        for (int b = 0; b < B; b++)
            for (int i = 0; i < HW; i++)
                s += inp[((size_t)b * C + c) * HW + i];
        double mu = s / n;
        for (int b = 0; b < B; b++)
            for (int i = 0; i < HW; i++) {
                double d = inp[((size_t)b * C + c) * HW + i] - mu;
                s2 += d * d;
            }
        mean[c] = mu;
        var[c] = s2 / n;
        double r = 1.0 / sqrt(var[c] + eps);
        for (int b = 0; b < B; b++)
            for (int i = 0; i < HW; i++) {
                size_t k = ((size_t)b * C + c) * HW + i;
                out[k] = (inp[k] - mu) * r * w[c] + bias[c];
            }
    }
}

static inline void bn64_backward(double *dinp, double *dw, double *db, const double *dout, const double *inp,
                                 const double *w, const double *mean, const double *var, int B, int C, int HW,
                                 double eps)
{
    double n = (double)B * HW;
    for (int c = 0; c < C; c++) {
        double r = 1.0 / sqrt(var[c] + eps), sdy = 0.0, sdyx = 0.0;
        for (int b = 0; b < B; b++)
            for (int i = 0; i < HW; i++) {
                size_t k = ((size_t)b * C + c) * HW + i;
                sdy += dout[k];
                sdyx += dout[k] * (inp[k] - mean[c]) * r;
            }
        if (dw)
            dw[c] += sdyx;
        if (db)
            db[c] += sdy;
        if (dinp)
            for (int b = 0; b < B; b++)
                for (int i = 0; i < HW; i++) {
                    size_t k = ((size_t)b * C + c) * HW + i;
                    double xh = (inp[k] - mean[c]) * r;
                    dinp[k] += w[c] * r * (dout[k] - sdy / n - xh * sdyx / n);
                }
    }
}

/* PReLU; pos (optional) forces the branch per element (1: x > 0 branch, 0: slope branch). */
static inline void prelu64_forward(double *out, const double *inp, const double *a, int B, int C, int HW,
                                   const signed char *pos)
{
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++)
            for (int i = 0; i < HW; i++) {
                size_t k = ((size_t)b * C + c) * HW + i;
                int p = pos ? pos[k] : inp[k] > 0.0;
                out[k] = p ? inp[k] : a[c] * inp[k];
            }
}

static inline void prelu64_backward(double *dinp, double *da, const double *dout, const double *inp,
                                    const double *a, int B, int C, int HW, const signed char *pos)
{
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++)
            for (int i = 0; i < HW; i++) {
                size_t k = ((size_t)b * C + c) * HW + i;
                int p = pos ? pos[k] : inp[k] > 0.0;
                if (dinp)
                    dinp[k] += p ? dout[k] : a[c] * dout[k];
                if (da && !p)
                    da[c] += dout[k] * inp[k];
            }
}

/* Linear: inp (B,IN), w (OUT,IN), bias (OUT) or NULL -> out (B,OUT) */
static inline void linear64_forward(double *out, const double *inp, const double *w, const double *bias,
                                    int B, int IN, int OUT)
{
    for (int b = 0; b < B; b++)
        for (int o = 0; o < OUT; o++) {
            double s = bias ? bias[o] : 0.0;
            for (int i = 0; i < IN; i++)
                s += inp[(size_t)b * IN + i] * w[(size_t)o * IN + i];
            out[(size_t)b * OUT + o] = s;
        }
}

static inline void linear64_backward(double *dinp, double *dw, double *db, const double *dout,
                                     const double *inp, const double *w, int B, int IN, int OUT)
{
    for (int b = 0; b < B; b++)
        for (int o = 0; o < OUT; o++) {
            double d = dout[(size_t)b * OUT + o];
            if (db)
                db[o] += d;
            for (int i = 0; i < IN; i++) {
                if (dinp)
                    dinp[(size_t)b * IN + i] += d * w[(size_t)o * IN + i];
                if (dw)
                    dw[(size_t)o * IN + i] += d * inp[(size_t)b * IN + i];
            }
        }
}

#endif
