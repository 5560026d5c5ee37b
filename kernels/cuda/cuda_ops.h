/* CUDA device ops (host-callable wrappers). Built only where nvcc is found (meson option `cuda`).
 * Every wrapper checks the CUDA return codes and the launch, and returns 0 or a negative code with
 * the CUDA error string in pf_errmsg(). Pointers are device pointers unless named host_. */
#ifndef PFCPS_KERNELS_CUDA_OPS_H
#define PFCPS_KERNELS_CUDA_OPS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA devices visible (0 when there is no GPU or no driver; never an error). */
int cuda_device_count(void);

/* out[i,:] = x[i,:] / max(||x[i,:]||_2, eps) for rows i < n, x and out (n, d) fp32 on the device,
 * in place allowed. Matches torch.nn.functional.normalize(x, dim=1, eps=eps).
 * Returns 0, or -EIO with the CUDA error in pf_errmsg(). */
int cuda_l2_normalize_rows(float *out, const float *x, int n, int d, float eps);

/* Host-buffer convenience for tests: copies (n, d) host rows to the device, normalizes, copies back. */
int cuda_l2_normalize_rows_host(float *host_out, const float *host_x, int n, int d, float eps);

#ifdef __cplusplus
}
#endif
#endif
