/* The command-line options every pfcps daemon and tool shares: `-c/--config FILE`, repeated
 * `--set key=value` (also `-s`), `--help`. Parsing them here keeps one behaviour everywhere. */
#ifndef PFCPS_COMMON_CLI_H
#define PFCPS_COMMON_CLI_H

#include "common/config.h"
#include "common/ctl.h"

#define CLI_HELP 1 /* cli_parse_common printed the help: exit 0 */
#define CLI_CONFIG_OPTIONAL                                                                                  \
    0x1 /* do not require num_classes / rec (a member taking the run config                                  \
           from the rendezvous); ranges are still checked */

/* Parses the shared options out of argv, loads the config (cfg_load: defaults, then FILE, then every
 * --set in order, then validation) into `cfg`, and compacts argv in place to argv[0] followed by the
 * arguments it did not consume, in order (e.g. `--rank 2`), NULL-terminated; *rest_argc is their count
 * including argv[0]. `usage` is the program-specific part printed by --help (may be NULL).
 * Options: `-c FILE`, `--config FILE`, `--config=FILE`, `--set k=v`, `--set=k=v`, `-s k=v`; `--` ends
 * option parsing (it and what follows are left in place).
 * Returns 0, CLI_HELP when --help/-h was given (help printed to stdout), or a negative code with
 * pf_errmsg() naming the problem (missing option argument, more than one --config, config errors). */
int cli_parse_common(int argc, char **argv, pf_config *cfg, const char *usage, int flags, int *rest_argc);

/* Prints the shared options' help to `f` ("  -c, --config FILE ..."). */
void cli_print_common_help(FILE *f);

/* Start-up checks every daemon (server or worker) makes before joining: rank in [0, count) (`what` names
 * the count's key, "servers" or "workers"), a join secret (config `secret` or PFCPS_SECRET), and a
 * `rendezvous` of the form host:port. Fills host (hostlen bytes), *port and *secret. Returns 0 or -EINVAL
 * with pf_errmsg() naming the problem. */
int cli_member_check(const pf_config *cfg, long rank, int count, const char *what, char *host, size_t hostlen,
                     int *port, const char **secret);

/* Joins the run at host:port as (role, rank) with fabric address addr (ctl_join, waiting up to
 * cfg->join_timeout, default 600 s, for the rendezvous to answer and the whole run to join) and loads the run
 * config the rendezvous sent (server 0's) into *run. Returns 0 with *sess, or a negative code with
 * pf_errmsg() saying which of the two failed. */
int cli_join_run(const pf_config *cfg, const char *host, int port, int role, int rank, const void *addr,
                 size_t alen, const char *secret, ctl_session **sess, pf_config *run);

#endif
