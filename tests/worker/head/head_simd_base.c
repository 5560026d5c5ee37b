/* A second copy of worker/head/head.c, built without the AVX2 clones (the baseline code alone), its
 * public functions renamed base_*: test_head_simd.c compares its bits with the library's (which runs
 * the AVX2 clone on a CPU that has AVX2). Also exposes the vector exp for an accuracy check. */
#define PFCPS_HEAD_NO_CLONES    1
#define head_parse_margin_grad  base_head_parse_margin_grad
#define head_parse_mode         base_head_parse_mode
#define head_params_from_config base_head_params_from_config
#define head_ws_init            base_head_ws_init
#define head_ws_free            base_head_ws_free
#define head_forward            base_head_forward
#define head_backward           base_head_backward
#define head_center_block       base_head_center_block
#define head_ge_lanes           base_head_ge_lanes
#define head_set_center_block   base_head_set_center_block
#include "worker/head/head.c"

/* exp of 8 values through the head's vector exp (vexp8). */
void base_head_vexp8(const float *x, float *y);
void base_head_vexp8(const float *x, float *y)
{
    st8(y, vexp8(ld8(x)));
}
