/* ops_device_by_name (kernels/ops.h): the device tables built into this binary, by name.
 * To add a device, add one line to the table (guarded by the build flag that builds it). */
#include "kernels/ops.h"

#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "kernels/cpu/ops_fenced.h"
#ifdef PFCPS_HAVE_CUDA_OPS
#include "kernels/cuda/cuda_ops.h"
#endif

static const ops_device *const devices[] = {
    &ops_cpu,  &ops_cpu_fenced, &ops_cpu_bf16,
#ifdef PFCPS_HAVE_CUDA_OPS
    &ops_cuda, &ops_cuda_fp16,  &ops_cuda_bf16,
#endif
};

#define N_DEVICES (sizeof devices / sizeof *devices)

const ops_device *ops_device_by_name(const char *name)
{
    char known[256] = "";
    size_t len = 0;
    for (size_t i = 0; i < N_DEVICES; i++) {
        if (name && !strcmp(name, devices[i]->name))
            return devices[i];
        int w = snprintf(known + len, sizeof known - len, "%s%s", i ? ", " : "", devices[i]->name);
        if (w > 0 && (size_t)w < sizeof known - len)
            len += (size_t)w;
    }
    pf_err(-EINVAL, "no device named '%s' in this build (devices: %s%s)", name ? name : "(null)", known,
#ifdef PFCPS_HAVE_CUDA_OPS
           ""
#else
           "; CUDA devices need a build with nvcc, cuDNN and cuBLAS"
#endif
    );
    return NULL;
}
