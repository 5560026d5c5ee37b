/* IEEE binary16 (fp16) and bfloat16 (bf16) conversions from and to float32, round to nearest even, as the
 * hardware conversions (F16C's vcvtps2ph with rounding mode 0, CUDA's __float2half_rn) and torch's
 * Tensor.to(torch.float16 / torch.bfloat16) do: fp16 overflow becomes inf, values below half of the smallest
 * subnormal (2^-25) become signed zero, NaN stays NaN. Used by the parameter server's wire rows
 * (proto/ps_wire.h) and the fp16 collectives (common/coll.h COLL_F16). Header-only. */
#ifndef PFCPS_COMMON_HALF_H
#define PFCPS_COMMON_HALF_H

#include <stdint.h>

/* fp32 <-> fp16 (IEEE binary16, round to nearest even) and bf16 (round to nearest even). */
static inline uint16_t bf16_from_f32(float f)
{
    union {
        float f;
        uint32_t u;
    } v = {.f = f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((v.u >> 16) | 0x40); /* NaN stays NaN */
    uint32_t round = 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)((v.u + round) >> 16);
}
static inline float bf16_to_f32(uint16_t h)
{
    union {
        uint32_t u;
        float f;
    } v = {.u = (uint32_t)h << 16};
    return v.f;
}
static inline uint16_t f16_from_f32(float f)
{
    union {
        float f;
        uint32_t u;
    } v = {.f = f};
    uint32_t x = v.u, sign = (x >> 16) & 0x8000u;
    int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t mant = x & 0x7fffffu;
    if (((x >> 23) & 0xff) == 0xff)
        return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0)); /* inf/NaN */
    if (exp >= 31)
        return (uint16_t)(sign | 0x7c00u); /* overflow -> inf */
    if (exp <= 0) {                        /* subnormal or zero */
        if (exp < -10)
            return (uint16_t)sign;
        mant |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u)))
            h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)exp << 10) | (mant >> 13), rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++; /* may carry into exponent: correct */
    return (uint16_t)(sign | h);
}
static inline float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, x;
    if (exp == 0) {
        if (mant == 0)
            x = sign;
        else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400u)) {
                mant <<= 1;
                exp--;
            }
            x = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
        }
    } else if (exp == 31)
        x = sign | 0x7f800000u | (mant << 13);
    else
        x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
    union {
        uint32_t u;
        float f;
    } v = {.u = x};
    return v.f;
}

#endif /* PFCPS_COMMON_HALF_H */
