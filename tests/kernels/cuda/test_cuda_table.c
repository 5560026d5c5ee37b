/* Runs everywhere the CUDA device builds (no GPU needed): the ops_cuda table is complete (every
 * entry of kernels/ops.h set, name "cuda", plain NCHW layout), and without a GPU every entry point
 * that needs one refuses cleanly (-ENODEV naming the reason) instead of crashing; with a GPU the
 * context and a head workspace are created and freed. */
#include <stdio.h>
#include <string.h>

#include "common/coll.h"
#include "common/err.h"
#include "kernels/cuda/cuda_ops.h"
#include "tests/check.h"

int main(void)
{
    const ops_device *d = &ops_cuda;
    void (*const entries[])(void) = {
        (void (*)(void))d->ctx_create,       (void (*)(void))d->ctx_destroy,
        (void (*)(void))d->conv_forward,     (void (*)(void))d->conv_backward,
        (void (*)(void))d->bn_forward,       (void (*)(void))d->bn_backward,
        (void (*)(void))d->prelu_forward,    (void (*)(void))d->prelu_backward,
        (void (*)(void))d->linear_forward,   (void (*)(void))d->linear_backward,
        (void (*)(void))d->add_forward,      (void (*)(void))d->acc,
        (void (*)(void))d->act_block,        (void (*)(void))d->to_plain,
        (void (*)(void))d->from_plain,       (void (*)(void))d->dropout_forward,
        (void (*)(void))d->dropout_backward,
    };
    int missing = 0;
    for (size_t i = 0; i < sizeof entries / sizeof *entries; i++)
        missing += entries[i] == NULL;
    check(missing == 0, "ops_cuda table complete: %d of %zu entries NULL", missing,
          sizeof entries / sizeof *entries);
    check(d->name && strcmp(d->name, "cuda") == 0, "ops_cuda name is \"cuda\": %s",
          d->name ? d->name : "NULL");
    check(d->act_block(64) == 1 && d->act_block(3) == 1, "activations plain NCHW (act_block 1)");

    int n = cuda_device_count();
    printf("CUDA devices visible: %d\n", n);
    ops_ctx *ctx = NULL;
    int rc = d->ctx_create(&ctx);
    if (n == 0)
        check(rc == -ENODEV && ctx == NULL, "ctx_create without a GPU -> -ENODEV: %s", pf_errmsg());
    else
        check(rc == 0 && ctx != NULL, "ctx_create with a GPU%s%s", rc ? ": " : "", rc ? pf_errmsg() : "");
    cuda_head_ws ws;
    int hrc = cuda_head_ws_init(&ws, 4, 10, 8);
    if (n == 0) {
        check(hrc == -ENODEV, "cuda_head_ws_init without a GPU -> -ENODEV: %s", pf_errmsg());
    } else {
        check(hrc == 0, "cuda_head_ws_init with a GPU%s%s", hrc ? ": " : "", hrc ? pf_errmsg() : "");
        if (ctx)
            d->ctx_destroy(ctx);
        if (hrc == 0)
            cuda_head_ws_free(&ws);
    }
#ifdef PFCPS_HAVE_NCCL
    {
        uint8_t id[CUDA_NCCL_ID_BYTES] = {0};
        pf_coll c;
        int nrc = coll_nccl_create(id, 2, 2, &c);
        check(nrc == -EINVAL, "coll_nccl_create rank 2 of 2 -> -EINVAL: %s", pf_errmsg());
        if (n == 0) {
            nrc = coll_nccl_create(id, 0, 1, &c);
            check(nrc == -ENODEV, "coll_nccl_create without a GPU -> -ENODEV: %s", pf_errmsg());
        }
    }
#endif
    hrc = cuda_head_ws_init(&ws, 0, 10, 8);
    check(hrc == -EINVAL, "cuda_head_ws_init n_max 0 -> -EINVAL: %s", pf_errmsg());
    return check_summary();
}
