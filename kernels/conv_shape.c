/* ops_conv_shape_init (kernels/ops.h): the convolution shape every device and the model share. Plain C,
 * independent of any device: the devices' convolution caches (kernels/conv_cache.c) and worker/model
 * call it. */
#include "kernels/ops.h"

#include <string.h>

#include "common/err.h"

int ops_conv_shape_init(ops_conv_shape *s, int B, int C, int H, int W, int OC, int K, int stride, int pad,
                        int groups)
{
    if (B <= 0 || C <= 0 || H <= 0 || W <= 0 || OC <= 0 || K <= 0 || stride <= 0 || pad < 0 || groups <= 0)
        return pf_err(-EINVAL,
                      "conv shape B=%d C=%d H=%d W=%d OC=%d K=%d stride=%d pad=%d "
                      "groups=%d: sizes must be positive",
                      B, C, H, W, OC, K, stride, pad, groups);
    if (C % groups || OC % groups)
        return pf_err(-EINVAL, "conv groups %d does not divide C=%d and OC=%d", groups, C, OC);
    if (H + 2 * pad < K || W + 2 * pad < K)
        return pf_err(-EINVAL, "conv kernel %d larger than padded input %dx%d", K, H, W);
    memset(s, 0, sizeof *s);
    s->B = B;
    s->C = C;
    s->H = H;
    s->W = W;
    s->OC = OC;
    s->K = K;
    s->stride = stride;
    s->pad = pad;
    s->groups = groups;
    s->OH = (H + 2 * pad - K) / stride + 1;
    s->OW = (W + 2 * pad - K) / stride + 1;
    return 0;
}
