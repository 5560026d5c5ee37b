/* fab_hmem_cuda_supported against independent sources, for tcp, shm and verbs:
 *  - `fi_info -p <provider> -t FI_EP_RDM -c FI_HMEM` (libfabric's own tool, a separate process): does the
 *    provider offer FI_HMEM at all;
 *  - whether the libfabric library this test is linked with (found in /proc/self/maps) was built with CUDA:
 *    a CUDA build loads the driver by name, so the string "libcuda.so" is in the file;
 *  - whether a GPU driver is present (/dev/nvidiactl).
 * Expected 1 exactly when all three hold. Also: an unknown provider name is -EINVAL naming it.
 * On this project's CI machine (Debian libfabric 1.17, no CUDA, no GPU) both providers must answer 0, and
 * shm shows the case the CUDA probe exists for: it offers FI_HMEM (for host memory) without CUDA. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/fabric.h"

#include "tests/check.h"

/* 1: fi_info lists an FI_EP_RDM endpoint with FI_HMEM for the provider, 0: it does not, -1: fi_info missing.
 */
static int fi_info_offers_hmem(const char *prov)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "fi_info -p '%s' -t FI_EP_RDM -c FI_HMEM 2>&1", prov);
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    char line[512];
    int provider_lines = 0;
    while (fgets(line, sizeof line, p))
        if (strstr(line, "provider:"))
            provider_lines++;
    int st = pclose(p);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
        return -1;
    return provider_lines > 0;
}

/* 1 when the linked libfabric file contains "libcuda.so", 0 when not, -1 when it cannot be found. */
static int libfabric_has_cuda(char *path, size_t plen)
{
    FILE *m = fopen("/proc/self/maps", "r");
    if (!m)
        return -1;
    char line[1024];
    path[0] = 0;
    while (fgets(line, sizeof line, m)) {
        char *s = strchr(line, '/');
        if (s && strstr(s, "libfabric.so")) {
            s[strcspn(s, "\n")] = 0;
            snprintf(path, plen, "%s", s);
            break;
        }
    }
    fclose(m);
    if (!path[0])
        return -1;
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    static const char needle[] = "libcuda.so";
    size_t nl = sizeof needle - 1, have = 0;
    char buf[1 << 16];
    int found = 0;
    size_t got;
    while (!found && (got = fread(buf + have, 1, sizeof buf - have, f)) > 0) {
        size_t tot = have + got;
        for (size_t i = 0; i + nl <= tot; i++)
            if (!memcmp(buf + i, needle, nl)) {
                found = 1;
                break;
            }
        have = tot < nl ? tot : nl - 1; /* keep a tail so a match across reads is seen */
        memmove(buf, buf + tot - have, have);
    }
    fclose(f);
    return found;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    char libpath[512];
    int lib_cuda = libfabric_has_cuda(libpath, sizeof libpath);
    int gpu = access("/dev/nvidiactl", F_OK) == 0;
    printf("libfabric %s: built with CUDA: %s; GPU driver (/dev/nvidiactl): %s\n", libpath[0] ? libpath : "?",
           lib_cuda < 0 ? "unknown"
           : lib_cuda   ? "yes"
                        : "no",
           gpu ? "yes" : "no");
    CHECK(lib_cuda >= 0, "cannot find the linked libfabric in /proc/self/maps");
    static const struct {
        const char *name, *exact;
    } provs[] = {{"tcp", "tcp;ofi_rxm"}, {"shm", "shm"}, {"verbs", "verbs;ofi_rxm"}};
    for (size_t i = 0; i < sizeof provs / sizeof provs[0]; i++) {
        int offers = fi_info_offers_hmem(provs[i].exact);
        if (offers < 0) {
            printf("fi_info is not installed (libfabric-bin): no independent source, SKIP\n");
            return 77;
        }
        int expect = offers && lib_cuda == 1 && gpu;
        int got = fab_hmem_cuda_supported(provs[i].name);
        printf("%s: fi_info offers FI_HMEM: %s -> expected %d, fab_hmem_cuda_supported = %d (%s)\n",
               provs[i].exact, offers ? "yes" : "no", expect, got, pf_errmsg());
        CHECK(got == expect, "%s: fab_hmem_cuda_supported says %d, the independent sources say %d",
              provs[i].name, got, expect);
        CHECK(strstr(pf_errmsg(), provs[i].exact) != NULL, "reason does not name the provider: %s",
              pf_errmsg());
        /* The exact name answers the same as the short one. */
        CHECK(fab_hmem_cuda_supported(provs[i].exact) == got, "%s and %s disagree", provs[i].name,
              provs[i].exact);
    }
    int rc = fab_hmem_cuda_supported("cuda-magic");
    printf("provider 'cuda-magic' -> %d: %s\n", rc, pf_errmsg());
    CHECK(rc == -EINVAL && strstr(pf_errmsg(), "cuda-magic"), "unknown provider not refused by name");
    printf(fails ? "FAILED (%d)\n" : "PASS\n", fails);
    return fails ? 1 : 0;
}
