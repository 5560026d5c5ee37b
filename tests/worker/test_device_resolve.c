/* train_device_resolve (worker/device.h): config keys device, fp16, bf16 -> the ops device the worker runs,
 * whether loss scaling is on, the warning for a half key on the CPU device, and the refusals. The expected
 * table is written here by hand from the rules in worker/device.h and docs/configuration.md. device = cuda
 * is resolved on every machine: without a GPU (or without the CUDA device in this build) the call must
 * refuse with -ENODEV naming key 'device' and the cause, with the name it would have used still filled in. */
#include <errno.h>
#include <string.h>

#include "common/config.h"
#include "common/err.h"
#include "tests/check.h"
#include "worker/device.h"
#ifdef PFCPS_HAVE_CUDA_OPS
#include "kernels/cuda/cuda_ops.h"
#endif

typedef struct tcase {
    const char *device;
    int fp16, bf16;
    const char *name; /* resolved ops device */
    int cuda, loss_scaling, warns;
} tcase;

static const tcase cases[] = {
    {"cpu", 0, 0, "cpu", 0, 0, 0},
    {"cpu", 1, 0, "cpu", 0, 0, 1},
    {"cpu", 0, 1, "cpu", 0, 0, 1},
    {"cpu-fenced", 0, 0, "cpu-fenced", 0, 0, 0},
    {"cpu-fenced", 1, 0, "cpu-fenced", 0, 0, 1},
    {"cpu-bf16", 0, 0, "cpu-bf16", 0, 0, 0},
    {"cpu-bf16", 1, 0, "cpu-bf16", 0, 1, 0},
    {"cpu-bf16", 0, 1, "cpu-bf16", 0, 0, 0},
    {"cuda", 0, 0, "cuda", 1, 0, 0},
    {"cuda", 1, 0, "cuda-fp16", 1, 1, 0},
    {"cuda", 0, 1, "cuda-bf16", 1, 0, 0},
};

int main(void)
{
    int gpus = 0;
#ifdef PFCPS_HAVE_CUDA_OPS
    gpus = cuda_device_count();
#endif
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const tcase *c = &cases[i];
        pf_config cfg;
        cfg_defaults(&cfg);
        snprintf(cfg.device, sizeof cfg.device, "%s", c->device);
        cfg.fp16 = c->fp16;
        cfg.bf16 = c->bf16;
        train_device_info di;
        int rc = train_device_resolve(&cfg, &di);
        int want_rc = c->cuda && gpus == 0 ? -ENODEV : 0;
        CHECK(rc == want_rc, "%s fp16 %d bf16 %d: rc %d, want %d (%s)", c->device, c->fp16, c->bf16, rc,
              want_rc, pf_errmsg());
        CHECK(!strcmp(di.name, c->name), "%s fp16 %d bf16 %d: device '%s', want '%s'", c->device, c->fp16,
              c->bf16, di.name, c->name);
        CHECK(di.cuda == c->cuda && di.loss_scaling == c->loss_scaling,
              "%s fp16 %d bf16 %d: cuda %d loss_scaling %d, want %d %d", c->device, c->fp16, c->bf16, di.cuda,
              di.loss_scaling, c->cuda, c->loss_scaling);
        CHECK((di.warning[0] != 0) == c->warns, "%s fp16 %d bf16 %d: warning '%s'", c->device, c->fp16,
              c->bf16, di.warning);
        if (rc == -ENODEV)
            CHECK(strstr(pf_errmsg(), "config key 'device' = cuda") &&
                      (strstr(pf_errmsg(), "no CUDA GPU is visible") ||
                       strstr(pf_errmsg(), "built without the CUDA device")),
                  "refusal does not name the key and the cause: %s", pf_errmsg());
        printf("%-10s fp16 %d bf16 %d -> %-10s loss scaling %d%s%s\n", c->device, c->fp16, c->bf16, di.name,
               di.loss_scaling, rc ? "  refused: " : "", rc ? pf_errmsg() : "");
    }
    /* Refusals that do not depend on the machine. */
    pf_config cfg;
    cfg_defaults(&cfg);
    train_device_info di;
    cfg.fp16 = cfg.bf16 = 1;
    CHECK(train_device_resolve(&cfg, &di) == -EINVAL && strstr(pf_errmsg(), "'fp16' and 'bf16'"),
          "fp16 + bf16: %s", pf_errmsg());
    cfg_defaults(&cfg);
    snprintf(cfg.device, sizeof cfg.device, "gpu");
    CHECK(train_device_resolve(&cfg, &di) == -EINVAL && strstr(pf_errmsg(), "cpu cuda cpu-fenced cpu-bf16"),
          "device gpu: %s", pf_errmsg());
    printf("%s (%d GPUs visible)\n", fails ? "FAILED" : "all device choices as expected", gpus);
    return fails != 0;
}
