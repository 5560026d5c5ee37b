/* Backbone names: see netname.h. */
#include "common/netname.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

int pf_network_parse(const char *network, pf_network_name *out)
{
    static const char *const depths[] = {"r18", "r34", "r50", "r100", "r200"};
    memset(out, 0, sizeof *out);
    if (!network)
        return pf_err(-EINVAL, "network name missing");
    char alias[32];
    const char *n = network;
    if (!strncmp(n, "iresnet", 7)) { /* "iresnet50" -> "r50" */
        snprintf(alias, sizeof alias, "r%s", network + 7);
        n = alias;
    }
    /* "r18_w16": r18's blocks with stage widths 16, 32, 64, 128 (a narrow iresnet for CPU runs and the
     * quick start). */
    char base[32];
    int w0 = 64;
    snprintf(base, sizeof base, "%s", n);
    char *wsuf = strstr(base, "_w");
    if (wsuf) {
        char *end;
        long v = strtol(wsuf + 2, &end, 10);
        if (*end || v < 2 || v > 512 || v % 2)
            return pf_err(-EINVAL, "network '%s': width suffix _w%s is not an even number in [2, 512]",
                          network, wsuf + 2);
        w0 = (int)v;
        *wsuf = '\0';
    }
    for (size_t i = 0; i < sizeof depths / sizeof *depths; i++) {
        if (!strcmp(base, depths[i])) {
            out->kind = PF_NET_IRESNET;
            snprintf(out->name, sizeof out->name, "%s", n);
            snprintf(out->depth, sizeof out->depth, "%s", base);
            out->width = w0;
            return 0;
        }
    }
    if (!strcmp(network, "mbf") || !strcmp(network, "mobilefacenet")) {
        out->kind = PF_NET_MBF;
        snprintf(out->name, sizeof out->name, "mbf");
        return 0;
    }
    if (!strncmp(network, "vit_", 4))
        return pf_err(-EINVAL,
                      "network '%s': arcface_torch's ViT backbones (vit_t, vit_s, vit_b, vit_l of its AdamW configs) "
                      "are not built in pfcps; its iresnets (r18 r34 r50 r100 r200) and mbf are: set network to one "
                      "of them (optimizer = adamw trains them and the class centers as those configs do)",
                      network);
    return pf_err(-EINVAL,
                  "unknown network '%s' (known: r18 r34 r50 r100 r200, each optionally with a width suffix "
                  "such as r18_w16, and mbf)",
                  network);
}
