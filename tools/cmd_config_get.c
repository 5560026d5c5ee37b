/* `pfcps config-get`: config values as the daemons parse them (usage in tools/commands.h). */
#include "tools/commands.h"

#include "common/cli.h"
#include "common/config.h"
#include "common/err.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The value `key` has in the effective config, as the daemons see it: looked up in cfg_to_ini's text (every
 * key, formatted so that the parser reads it back to the same value) with the one pair of quotes the parser
 * strips removed. Returns 0, or -ENOENT for a key cfg_to_ini does not write (the secret). */
static int config_value(const char *ini, const char *key, char *out, size_t cap)
{
    size_t kl = strlen(key);
    for (const char *l = ini; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, key, kl) != 0 || strncmp(l + kl, " = ", 3) != 0)
            continue;
        const char *v = l + kl + 3;
        size_t n = strcspn(v, "\n");
        if (n >= 2 && (v[0] == '"' || v[0] == '\'') && v[n - 1] == v[0])
            v++, n -= 2;
        if (n >= cap)
            n = cap - 1;
        memcpy(out, v, n);
        out[n] = 0;
        return 0;
    }
    return -ENOENT;
}

static const char config_get_usage[] =
    "usage: pfcps config-get [-c FILE] [--set KEY=VALUE ...] KEY [KEY ...]\n"
    "  Prints each KEY's value, one per line, as the daemons will see it: FILE parsed by the same parser\n"
    "  (quotes, inline comments, sections, defaults), then every --set in order. The secret is never\n"
    "  printed: KEY `secret` prints `set` or `unset` (in FILE, a --set or $PFCPS_SECRET: the daemons\n"
    "  refuse to start without one).\n"
    "  Exit 2 for an unknown key or a config the daemons would refuse (message on stderr).";

int cmd_config_get(int argc, char **argv)
{
    pf_config cfg;
    int rest = 0;
    int rc = cli_parse_common(argc, argv, &cfg, config_get_usage, CLI_CONFIG_OPTIONAL, &rest);
    if (rc == CLI_HELP)
        return 0;
    if (rc < 0) {
        fprintf(stderr, "pfcps config-get: %s\n", pf_errmsg());
        return 2;
    }
    if (rest < 2) {
        fprintf(stderr, "pfcps config-get: needs at least one KEY\n%s\n", config_get_usage);
        return 2;
    }
    char *ini = cfg_to_ini(&cfg);
    if (!ini) {
        fprintf(stderr, "pfcps config-get: out of memory\n");
        return 1;
    }
    char(*vals)[CFG_STR + 8] = calloc((size_t)rest, sizeof *vals);
    int status = vals ? 0 : 1;
    for (int i = 1; i < rest && status == 0; i++) {
        const char *key = argv[i];
        int known = 0;
        for (int k = 0; k < cfg_key_count(); k++)
            known |= strcmp(cfg_key_name(k), key) == 0;
        if (!known) {
            fprintf(stderr, "pfcps config-get: unknown key '%s' (docs/configuration.md lists them)\n", key);
            status = 2;
        } else if (!strcmp(key, "secret")) {
            snprintf(vals[i], sizeof vals[i], "%s", cfg_secret(&cfg) ? "set" : "unset");
        } else if (config_value(ini, key, vals[i], sizeof vals[i]) < 0) {
            fprintf(stderr, "pfcps config-get: key '%s' is never printed\n", key);
            status = 2;
        }
    }
    /* All or nothing: a caller reading one line per key never gets a partial answer. */
    for (int i = 1; i < rest && status == 0; i++)
        printf("%s\n", vals[i]);
    free(vals);
    free(ini);
    return status;
}
