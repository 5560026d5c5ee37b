/* Row codec of the parameter-server wire (ps_wire.h): fp32 rows to and from the wire dtypes (fp32, fp16,
 * bf16). The client encodes pushed gradients and decodes pulled rows with it, the server decodes pushed
 * gradients and encodes pulled rows (shard_gather), so both sides round the same way. */
#include "proto/ps_wire.h"

#include <string.h>

void ps_rows_encode(void *dst, const float *src, size_t n, uint32_t dtype)
{
    uint8_t *d = dst;
    if (dtype == PS_DT_FP32) {
        memcpy(d, src, n * sizeof(float));
    } else if (dtype == PS_DT_FP16) {
        for (size_t j = 0; j < n; j++) {
            uint16_t x = f16_from_f32(src[j]);
            memcpy(d + 2 * j, &x, 2);
        }
    } else {
        for (size_t j = 0; j < n; j++) {
            uint16_t x = bf16_from_f32(src[j]);
            memcpy(d + 2 * j, &x, 2);
        }
    }
}

void ps_rows_decode(float *dst, const void *src, size_t n, uint32_t dtype)
{
    const uint8_t *s = src;
    if (dtype == PS_DT_FP32) {
        memcpy(dst, s, n * sizeof(float));
    } else if (dtype == PS_DT_FP16) {
        for (size_t j = 0; j < n; j++) {
            uint16_t x;
            memcpy(&x, s + 2 * j, 2);
            dst[j] = f16_to_f32(x);
        }
    } else {
        for (size_t j = 0; j < n; j++) {
            uint16_t x;
            memcpy(&x, s + 2 * j, 2);
            dst[j] = bf16_to_f32(x);
        }
    }
}
