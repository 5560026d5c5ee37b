/* The collectives' shared pieces (common/coll.h): the elementwise reduction every backend applies and the fp16
 * gradient mean of torch's fp16_compress_hook. */
#include "common/coll.h"

#include <string.h>

#include "common/half.h"

void coll_reduce(void *dst, const void *src, size_t count, coll_dtype dt, coll_op op)
{
    const unsigned char *s = src;
    if (dt == COLL_F32) {
        float *d = dst, v;
        for (size_t i = 0; i < count; i++) {
            memcpy(&v, s + 4 * i, 4);
            d[i] = op == COLL_SUM ? d[i] + v : (v > d[i] ? v : d[i]);
        }
    } else if (dt == COLL_F64) {
        double *d = dst, v;
        for (size_t i = 0; i < count; i++) {
            memcpy(&v, s + 8 * i, 8);
            d[i] = op == COLL_SUM ? d[i] + v : (v > d[i] ? v : d[i]);
        }
    } else {
        uint16_t *d = dst, v;
        for (size_t i = 0; i < count; i++) {
            memcpy(&v, s + 2 * i, 2);
            float a = f16_to_f32(d[i]), b = f16_to_f32(v);
            /* rounding the float32 sum to fp16 gives the correctly rounded fp16 sum: the float32 rounding
             * (below 2^-13 of the larger operand's fp16 ulp) could only move the sum across an fp16 rounding
             * boundary if the smaller operand carried bits more than 13 places apart, beyond fp16's 11 */
            d[i] = op == COLL_SUM ? f16_from_f32(a + b) : (b > a ? v : d[i]);
        }
    }
}

int coll_allreduce_fp16_mean(pf_coll *c, float *g, uint16_t *h, size_t n)
{
    float w = (float)c->world_size;
    for (size_t i = 0; i < n; i++)
        h[i] = f16_from_f32(f16_to_f32(f16_from_f32(g[i])) / w);
    int rc = coll_allreduce(c, h, n, COLL_F16, COLL_SUM);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < n; i++)
        g[i] = f16_to_f32(h[i]);
    return 0;
}
