/* A full r50 (D = 512) training-mode forward and backward at batch 2 (made for the ASan+UBSan
 * build; also runs in the normal one), then mbf the same way. Checks what can be checked without
 * a reference: finite outputs and gradients, every trainable weight received a non-zero gradient
 * (none skipped by the backward), the fixed features.weight none, and the backward is linear in
 * grad_embeddings (doubling it doubles every gradient, to float rounding). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "worker/model/model.h"

static int run(const char *net)
{
    int fail = 0;
    model *m;
    int B = 2, D = 512;
    if (model_create(&m, net, D, B)) {
        printf("FAIL: %s\n", pf_errmsg());
        return 1;
    }
    model_init(m, 42);
    size_t nin = (size_t)B * 3 * 112 * 112;
    float *x = malloc(nin * sizeof *x), *g = malloc((size_t)B * D * sizeof *g);
    float *gin = malloc(nin * sizeof *gin);
    for (size_t i = 0; i < nin; i++)
        x[i] = sinf((float)i * 0.37f);
    for (int i = 0; i < B * D; i++)
        g[i] = cosf((float)i * 0.11f) / (float)(B * D);
    const float *e;
    model_zero_grad(m);
    if (model_forward(m, x, B, 1, &e) || model_backward(m, g, gin)) {
        printf("FAIL: %s\n", pf_errmsg());
        return 1;
    }
    size_t np = model_num_params(m);
    float *g1 = malloc(np * sizeof *g1);
    memcpy(g1, model_grads(m), np * sizeof *g1);
    int finite = 1;
    for (int i = 0; i < B * D; i++)
        finite &= isfinite(e[i]);
    for (size_t i = 0; i < np; i++)
        finite &= isfinite(g1[i]);
    for (size_t i = 0; i < nin; i++)
        finite &= isfinite(gin[i]);
    printf("%s: %zu params, outputs/grads/grad_input finite: %s\n", net, np, finite ? "ok" : "FAIL");
    fail |= !finite;
    int zero_tensors = 0;
    for (int t = 0; t < model_num_tensors(m); t++) {
        const model_tensor *mt = model_tensor_at(m, t);
        double s = 0;
        for (size_t k = 0; k < mt->count; k++)
            s += fabs(g1[mt->offset + k]);
        int fixed = (mt->flags & MODEL_TENSOR_FIXED) != 0;
        /* Biases may be exactly 0: the features BatchNorm makes sum_b dL/dfc_b = 0, so fc.bias
         * and the bias of bn2 before it get no gradient (PyTorch's too). Weights must get one. */
        if (!fixed && !strstr(mt->name, "weight"))
            continue;
        if (fixed ? s != 0 : s == 0) {
            printf("  %s: gradient sum %g %s\n", mt->name, s, fixed ? "(fixed: must be 0)" : "(zero)");
            zero_tensors++;
        }
    }
    printf("%s: weights with a wrong (zero / non-zero fixed) gradient: %d %s\n", net, zero_tensors,
           zero_tensors ? "FAIL" : "ok");
    fail |= zero_tensors != 0;
    /* linearity in the upstream gradient */
    for (int i = 0; i < B * D; i++)
        g[i] *= 2.0f;
    model_zero_grad(m);
    if (model_forward(m, x, B, 1, &e) || model_backward(m, g, NULL)) {
        printf("FAIL: %s\n", pf_errmsg());
        return 1;
    }
    double num = 0, den = 0;
    for (size_t i = 0; i < np; i++) {
        double d = model_grads(m)[i] - 2.0 * g1[i];
        num += d * d;
        den += 4.0 * g1[i] * g1[i];
    }
    double r = sqrt(num / den);
    /* the second forward updated the running statistics, not the batch statistics: same grads */
    printf("%s: gradients with 2x grad_embeddings vs 2x gradients: rel %.2e %s\n", net, r,
           r < 1e-5 ? "ok" : "FAIL");
    fail |= !(r < 1e-5);
    free(x);
    free(g);
    free(gin);
    free(g1);
    model_free(m);
    return fail;
}

int main(int argc, char **argv)
{
    int fail = 0;
    if (argc > 1) {
        for (int i = 1; i < argc; i++)
            fail |= run(argv[i]);
    } else {
        fail |= run("r50");
        fail |= run("mbf");
    }
    printf("%s\n", fail ? "FAIL" : "PASS");
    return fail;
}
