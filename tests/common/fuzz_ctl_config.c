/* libFuzzer target for the config text a member receives in the join reply (cfg_load_text): any
 * input must load or be refused with a message, never crash; and whatever loads must survive the
 * round trip (cfg_to_ini, then cfg_load_text again, gives the same text), which is what the
 * rendezvous relies on when it ships its config to every member. The same input also goes through the
 * arcface_torch Python-config reader (cfg_load_py_text). */
#include "common/config.h"
#include "common/err.h"
#include "common/log.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    if (!quiet) {
        log_set_level(LOG_ERROR);
        quiet = 1;
    }
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    pf_config a, b;
    if (cfg_load_text(&a, text) == 0) {
        char *t1 = cfg_to_ini(&a);
        if (cfg_load_text(&b, t1) != 0) {
            fprintf(stderr, "round trip: cfg_to_ini output does not load:\n%s\n", t1);
            abort();
        }
        char *t2 = cfg_to_ini(&b);
        if (strcmp(t1, t2) != 0) {
            fprintf(stderr, "round trip changed the config:\n%s\n---\n%s\n", t1, t2);
            abort();
        }
        free(t1);
        free(t2);
    }
    /* The same bytes as an arcface_torch Python config: applied or refused with a message, never a crash. */
    pf_config py;
    cfg_defaults(&py);
    if (cfg_load_py_text(&py, text, "fuzz.py") < 0 && !pf_errmsg()[0]) {
        fprintf(stderr, "arcface_torch config refused without a message\n");
        abort();
    }
    free(text);
    return 0;
}
