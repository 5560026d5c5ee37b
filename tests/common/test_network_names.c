/* common/config.c's cfg_network_check (the network names the config accepts, so that an unknown one is
 * refused before a run forms) against worker/model/zoo.c's model_desc_from_name (the names the worker can
 * build): both must give the same verdict and the same message on every name of a large generated set
 * (prefixes, stage numbers, width suffixes, near misses, names past zoo.c's 31-character buffers). common/
 * cannot call zoo.c (no arrow from common/ to worker/), so this test is what keeps the copy of the grammar
 * equal. */
#include "common/config.h"
#include "common/err.h"
#include "worker/model/model.h"

#include <stdio.h>
#include <string.h>

static long checked, accepted, mismatches;

static void check(const char *name)
{
    char msg_cfg[PF_ERRMSG_MAX], msg_zoo[PF_ERRMSG_MAX];
    int rc_cfg = cfg_network_check(name);
    snprintf(msg_cfg, sizeof msg_cfg, "%s", rc_cfg < 0 ? pf_errmsg() : "");
    model_desc d;
    int rc_zoo = model_desc_from_name(&d, name, 512);
    snprintf(msg_zoo, sizeof msg_zoo, "%s", rc_zoo < 0 ? pf_errmsg() : "");
    checked++;
    accepted += rc_zoo == 0;
    if (rc_cfg != rc_zoo || strcmp(msg_cfg, msg_zoo) != 0) {
        if (mismatches++ < 20)
            fprintf(stderr, "'%s': config %d '%s', zoo %d '%s'\n", name, rc_cfg, msg_cfg, rc_zoo, msg_zoo);
    }
}

int main(void)
{
    static const char *const prefixes[] = {
        "", "r", "R", "iresnet", "iresnet_", "resnet", "mbf", "mobilefacenet", "x"};
    static const char *const odd_numbers[] = {"018", "+18", " 18", "18 ", "-18", "1e2", "r18", "50x"};
    static const char *const odd_suffixes[] = {"_w",
                                               "_w16x",
                                               "_w-4",
                                               "_w 8",
                                               "_w+8",
                                               "_w08",
                                               "_x16",
                                               "_w16_w16",
                                               "_W16",
                                               "w16",
                                               "__w16",
                                               "_w0x10",
                                               "_w99999999999999999999"};
    char num[32], name[128];
    for (size_t p = 0; p < sizeof prefixes / sizeof *prefixes; p++) {
        for (int n = -1; n <= 210 + (int)(sizeof odd_numbers / sizeof *odd_numbers); n++) {
            if (n < 0)
                num[0] = '\0';
            else if (n <= 210)
                snprintf(num, sizeof num, "%d", n);
            else
                snprintf(num, sizeof num, "%s", odd_numbers[n - 211]);
            for (int w = -1; w <= 520 + (int)(sizeof odd_suffixes / sizeof *odd_suffixes); w++) {
                if (w < 0)
                    snprintf(name, sizeof name, "%s%s", prefixes[p], num);
                else if (w <= 520)
                    snprintf(name, sizeof name, "%s%s_w%d", prefixes[p], num, w);
                else
                    snprintf(name, sizeof name, "%s%s%s", prefixes[p], num, odd_suffixes[w - 521]);
                check(name);
            }
        }
    }
    /* Names at and past the 31 characters zoo.c's buffers hold. */
    static const char *const specials[] = {"",
                                           "mbf ",
                                           " mbf",
                                           "MBF",
                                           "mobilefacenet_w16",
                                           "iresnet",
                                           "r",
                                           "r18_w16aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                                           "r18aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa_w16",
                                           "iresnet18_w16aaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                                           "r18_w000000000000000000000000000016",
                                           "r18_w0000000000000000000000000016",
                                           "r18_w000000000000000000000000016",
                                           "iresnet18_w00000000000000000000016"};
    for (size_t i = 0; i < sizeof specials / sizeof *specials; i++)
        check(specials[i]);
    printf("%ld names checked, %ld accepted by both, %ld mismatches\n", checked, accepted, mismatches);
    return mismatches == 0 && accepted > 0 ? 0 : 1;
}
