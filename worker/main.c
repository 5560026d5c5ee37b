/* pfcps-worker: one training process (one GPU in production; the CPU device here).
 *
 *   pfcps-worker --config FILE --rank W [--set key=value ...] [--max-steps N] [--trace FILE]
 *                [--dump-centers PREFIX]
 *
 * Start-up: open the two fabric endpoints (towards the servers; for the workers' ring collectives), join
 * the run at `rendezvous` as (worker, W), take the run config from the address book (every process
 * trains with the same config: the one server 0 was started with), then train (worker/train.h).
 * SIGTERM / SIGINT: every worker stops after the step in progress (they agree through an allreduce),
 * exit 0. Exit 1 on a start-up or training error, with the message on stderr. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cli.h"
#include "common/config.h"
#include "common/ctl.h"
#include "common/err.h"
#include "common/fabric.h"
#include "common/log.h"
#include "worker/train.h"

static volatile int g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

static const char usage[] =
    "usage: pfcps-worker --config FILE --rank W [--set key=value ...]\n"
    "  --rank W              this worker's rank in [0, workers)\n"
    "  --max-steps N         stop after N global steps (default: num_epoch epochs)\n"
    "  --trace FILE          write every step's loss and learning rate to FILE\n"
    "  --dump-centers PREFIX after training, write this worker's class centers to PREFIX.rank<W>\n";

static int parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi)
        return -EINVAL;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    pf_config cfg;
    int rest = 0;
    log_init("worker", -1);
    int rc = cli_parse_common(argc, argv, &cfg, usage, CLI_CONFIG_OPTIONAL, &rest);
    if (rc == CLI_HELP)
        return 0;
    if (rc < 0) {
        log_error("%s", pf_errmsg());
        return 1;
    }
    long rank = -1, max_steps = 0;
    train_opts topts = {.stop_flag = &g_stop};
    for (int i = 1; i < rest; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < rest ? argv[i + 1] : NULL;
        if (!strcmp(a, "--rank") && v && parse_long(v, 0, 1000000, &rank) == 0) {
            i++;
        } else if (!strcmp(a, "--max-steps") && v && parse_long(v, 1, 1L << 40, &max_steps) == 0) {
            i++;
        } else if (!strcmp(a, "--trace") && v) {
            topts.trace_path = v;
            i++;
        } else if (!strcmp(a, "--dump-centers") && v) {
            topts.dump_centers = v;
            i++;
        } else {
            log_error("bad or unknown argument '%s'%s%s\n%s", a, v ? " " : "", v ? v : "", usage);
            return 1;
        }
    }
    topts.rank = (int)rank;
    topts.max_steps = max_steps;
    log_init("worker", (int)rank);
    const char *secret;
    char host[256];
    int port;
    if (cli_member_check(&cfg, rank, cfg.workers, "workers", host, sizeof host, &port, &secret) < 0) {
        log_error("%s\n%s", pf_errmsg(), usage);
        return 1;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    trainer *t = NULL;
    ctl_session *sess = NULL;
    int exit_code = 1;
    uint8_t addr[CTL_MAX_ADDR];
    size_t alen = sizeof addr;
    if (train_open_endpoints(&t, &cfg, (int)rank, addr, &alen) < 0) {
        log_error("%s", pf_errmsg());
        goto out;
    }
    log_info("fabric provider %s; joining the run at %s:%d", cfg.provider, host, port);
    if (ctl_join(host, port, CTL_ROLE_WORKER, (int)rank, addr, alen, secret, (size_t)cfg.ctl_max_frame,
                 cfg.ctl_timeout > 0 ? cfg.ctl_timeout : 30, &sess) < 0) {
        log_error("join: %s", pf_errmsg());
        goto out;
    }
    const ctl_book *book = ctl_session_book(sess);
    pf_config run;
    cfg_defaults(&run);
    if (cfg_load_text(&run, book->config_text) < 0) {
        log_error("run config from the rendezvous: %s", pf_errmsg());
        goto out;
    }
    log_info("joined: %d servers, %d workers", book->num_servers, book->num_workers);
    if (rank == 0)
        cfg_log(&run);
    if (train_setup(t, &run, book, &topts) < 0 || train_run(t) < 0) {
        log_error("%s", pf_errmsg());
        goto out;
    }
    exit_code = 0;
out:
    train_close(t);
    if (sess)
        ctl_session_close(sess);
    log_close_file();
    return exit_code;
}
