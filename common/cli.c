#include "common/cli.h"

#include "common/err.h"
#include "common/hostport.h"

#include <stdlib.h>
#include <string.h>

void cli_print_common_help(FILE *f)
{
    fputs("Common options:\n"
          "  -c, --config FILE     run config (INI; see docs/configuration.md)\n"
          "  -s, --set KEY=VALUE   override one config key (repeatable, applied in order after FILE)\n"
          "  -h, --help            this help\n",
          f);
}

int cli_parse_common(int argc, char **argv, pf_config *cfg, const char *usage, int flags, int *rest_argc)
{
    const char *config = NULL;
    const char **sets = calloc((size_t)(argc > 0 ? argc : 1), sizeof *sets);
    if (!sets)
        return pf_err(-ENOMEM, "out of memory parsing the command line");
    int nset = 0, out = 1, rc = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        int is_config = 0, is_set = 0;
        if (strcmp(a, "--") == 0) {
            while (i < argc)
                argv[out++] = argv[i++];
            break;
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            if (usage)
                printf("%s\n", usage);
            cli_print_common_help(stdout);
            free(sets);
            return CLI_HELP;
        }
        if (strcmp(a, "-c") == 0 || strcmp(a, "--config") == 0)
            is_config = 1;
        else if (strncmp(a, "--config=", 9) == 0)
            is_config = 1, val = a + 9;
        else if (strcmp(a, "-s") == 0 || strcmp(a, "--set") == 0)
            is_set = 1;
        else if (strncmp(a, "--set=", 6) == 0)
            is_set = 1, val = a + 6;
        if (!is_config && !is_set) {
            argv[out++] = argv[i];
            continue;
        }
        if (!val) {
            if (i + 1 >= argc) {
                rc = pf_err(-EINVAL, "option %s needs %s", a, is_config ? "a file name" : "key=value");
                break;
            }
            val = argv[++i];
        }
        if (is_config) {
            if (config) {
                rc = pf_err(-EINVAL, "--config given twice ('%s' and '%s')", config, val);
                break;
            }
            config = val;
        } else {
            if (!strchr(val, '=')) {
                rc = pf_err(-EINVAL, "--set %s: expected key=value", val);
                break;
            }
            sets[nset++] = val;
        }
    }
    if (rc == 0) {
        argv[out] = NULL;
        *rest_argc = out;
        rc = cfg_load_ex(cfg, config, sets, nset, !(flags & CLI_CONFIG_OPTIONAL));
    }
    free(sets);
    return rc;
}

int cli_member_check(const pf_config *cfg, long rank, int count, const char *what, char *host, size_t hostlen,
                     int *port, const char **secret)
{
    if (rank < 0)
        return pf_err(-EINVAL, "--rank is required");
    if (rank >= count)
        return pf_err(-EINVAL, "--rank %ld is outside [0, %s = %d)", rank, what, count);
    *secret = cfg_secret(cfg);
    if (!*secret || !**secret)
        return pf_err(-EINVAL,
                      "no join secret: set 'secret' in the config or PFCPS_SECRET in the environment");
    if (pf_parse_hostport(cfg->rendezvous, host, hostlen, port) < 0)
        return pf_err(-EINVAL, "rendezvous '%s' is not host:port", cfg->rendezvous);
    return 0;
}

int cli_join_run(const pf_config *cfg, const char *host, int port, int role, int rank, const void *addr,
                 size_t alen, const char *secret, ctl_session **sess, pf_config *run)
{
    int rc = ctl_join(host, port, (ctl_role)role, rank, addr, alen, secret, (size_t)cfg->ctl_max_frame,
                      cfg->join_timeout, sess);
    if (rc < 0)
        return pf_err_wrap(rc, "join");
    cfg_defaults(run);
    rc = cfg_load_text(run, ctl_session_book(*sess)->config_text);
    if (rc < 0)
        return pf_err_wrap(rc, "run config from the rendezvous");
    return 0;
}
