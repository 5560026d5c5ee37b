/* Daemon start-up and exit: the SIGTERM/SIGINT block from before the constructors, the handler, the shared
 * command line, the join that a stop request may end, and the exit that leaves the endpoints open (see
 * daemon.h). */
#include "common/daemon.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <stdio.h>
#include <string.h>

#include "common/cli.h"
#include "common/clock.h"
#include "common/fabric.h"
#include "common/err.h"
#include "common/hostport.h"
#include "common/log.h"
#include "common/metrics.h"

static sigset_t stop_signals;
static volatile sig_atomic_t *g_stop;
static volatile sig_atomic_t g_signalled;

/* SIGTERM / SIGINT stay blocked from before the shared libraries' constructors run until
 * daemon_signals_install has installed on_signal: libfabric's psm provider pulls in libinfinipath, whose
 * constructor installs a handler that calls exit(1) without a word (and, during libcublasLt's constructor,
 * can crash the process with SIGSEGV). The .preinit_array entry runs before any constructor; this object
 * file is linked into a daemon because its main calls daemon_signals_install. */
#ifndef PFCPS_NO_PREINIT /* libs_only builds (python/): a shared object may not have a .preinit_array */
static void block_stop_signals(void)
{
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
}
__attribute__((used, section(".preinit_array"))) static void (*const preinit_block_stop_signals)(void) =
    block_stop_signals;
#endif

static void on_signal(int sig)
{
    (void)sig;
    g_signalled = 1;
    *g_stop = 1;
}

void daemon_signals_install(volatile sig_atomic_t *stop)
{
    g_stop = stop;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    ctl_set_interrupt(stop);        /* a stop request ends the wait for the run to form */
    pf_resolve_set_interrupt(stop); /* and the wait for a name to resolve */
    /* PFCPS_PARENT_PID (set by deploy/local/launch.sh): when that process dies (even by SIGKILL) this daemon
     * gets SIGTERM and stops in order, so a killed launcher leaves nothing behind. */
    const char *pp = getenv("PFCPS_PARENT_PID");
    if (pp && *pp) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if ((long)getppid() != strtol(pp, NULL, 10)) /* it died before the prctl */
            raise(SIGTERM);
    }
    pthread_sigmask(SIG_UNBLOCK, &stop_signals,
                    NULL); /* a SIGTERM that came during start-up: on_signal now */
}

void daemon_start(const char *role, volatile sig_atomic_t *stop)
{
    log_init(role, -1);
    daemon_tune_malloc();
    daemon_signals_install(stop);
}

int daemon_parse_common(int argc, char **argv, pf_config *cfg, const char *usage, int *rest_argc)
{
    int rc = cli_parse_common(argc, argv, cfg, usage, CLI_CONFIG_OPTIONAL, rest_argc);
    if (rc == CLI_HELP)
        return CLI_HELP;
    if (rc < 0) {
        log_error("%s", pf_errmsg());
        return -1;
    }
    return 0;
}

int daemon_member_check(const pf_config *cfg, const char *role, long rank, int count, const char *what,
                        char *host, size_t hostlen, int *port, const char **secret, const char *usage)
{
    log_init(role, (int)rank);
    if (cli_member_check(cfg, rank, count, what, host, hostlen, port, secret) < 0) {
        log_error("%s\n%s", pf_errmsg(), usage);
        return -1;
    }
    return 0;
}

void daemon_exit_now(int exit_code)
{
    fflush(NULL);
    log_close_file();
    fab_shm_unlink_regions((long)getpid()); /* the endpoints are not closed: see fabric.h */
    _exit(exit_code);
}

int daemon_signalled(void)
{
    return g_signalled;
}

int daemon_join(const pf_config *cfg, const char *host, int port, ctl_role role, int rank, const void *addr,
                size_t alen, const char *secret, const char *stop_note, unsigned flags, ctl_session **sess,
                pf_config *run)
{
    log_info("joining the run at %s:%d as %s %d (waiting up to join_timeout, %g s, for the whole run)", host,
             port, role == CTL_ROLE_SERVER ? "server" : "worker", rank, cfg->join_timeout);
    ctl_set_replicas(cfg->replicas);
    char keys[CTL_MAX_ENDPOINT_KEYS] = "";
    if (role == CTL_ROLE_WORKER && cfg_keys_text(cfg, cfg_worker_endpoint_keys, keys, sizeof keys) < 0)
        return pf_err_wrap(-EINVAL, "the worker's endpoint keys");
    int krc = ctl_set_endpoint_keys(keys);
    if (krc < 0)
        return krc;
    int rc = cli_join_run(cfg, host, port, role, rank, addr, alen, secret, sess, run);
    if (rc == 0) {
        char hex[2 * CKPT_RUN_ID_BYTES + 1];
        ckpt_run_id_hex(ctl_session_book(*sess)->run_id, hex);
        metrics_set_run(hex);
        return 0;
    }
    if ((g_stop && *g_stop) || rc == -ECANCELED) {
        /* Stopped on request (whatever ended the join then: the interrupt, or its deadline passed while this
         * process was stopped), or server 0 shut the run down, before it formed: a normal stop. */
        if (rc != -ECANCELED)
            log_info("stopping: SIGTERM/SIGINT while waiting for the run to form%s (the join: %s)", stop_note,
                     pf_errmsg());
        else
            log_info("stopping: %s", pf_errmsg());
        log_info("stopped before the run formed");
        return 1;
    }
    if (rc == -EEXIST && (flags & DAEMON_JOIN_EEXIST_TO_CALLER))
        return rc;
    if (rc == -ESHUTDOWN) {
        /* A worker restarted after the training of its run ended (lost after the end vote): a normal stop. */
        log_info("%s: nothing to do; exiting 0", pf_errmsg());
        return 1;
    }
    log_error("%s", pf_errmsg());
    if (rc == -ENOLINK) {
        /* The rendezvous answered the join with a member's loss (e.g. a worker replacement that failed as it was
         * being seated): the run re-forms, and this member with it. */
        log_error("the run re-forms after a lost member: exiting %d so that it can re-form from its newest "
                  "complete checkpoint",
                  DAEMON_EXIT_REFORM);
        return 2;
    }
    return rc;
}

int daemon_list_resume_steps(const pf_config *cfg, const char *member, const char *who, ckpt_step_check check,
                             void *arg)
{
    if (!cfg->resume)
        return 0;
    char root[4096];
    ckpt_root(cfg, root, sizeof root);
    static int64_t ok[CTL_MAX_RESUME_STEPS];
    static ckpt_ident ids[CTL_MAX_RESUME_STEPS];
    int k = ckpt_resume_steps(root, member, who, check, arg, ok, ids, CTL_MAX_RESUME_STEPS);
    if (k < 0) {
        log_error("resume = true: %s", pf_errmsg());
        return -1;
    }
    ctl_set_resume_steps(ok, ids, (size_t)k);
    return 0;
}

int daemon_bind_data_plane(const pf_config *cfg, const char *host, int port)
{
    const int from_env = getenv("FI_UNIVERSE_SIZE") != NULL;
    long uni = fab_set_universe(cfg->provider, (long)cfg->servers + cfg->workers);
    if (uni < 0) {
        log_error("%s", pf_errmsg());
        return (int)uni;
    }
    if (uni > 0)
        log_info("libfabric universe: %ld processes (FI_UNIVERSE_SIZE%s)", uni,
                 from_env ? ", from the environment" : " = servers + workers of this member's config");
    if (!strcmp(cfg->provider, "shm"))
        return 0;
    if (!strcmp(cfg->data_address, "any")) {
        fab_set_source(NULL);
        log_info("data plane: the provider picks the interface (data_address = any)");
        return 0;
    }
    char addr[CFG_STR];
    if (strcmp(cfg->data_address, "auto") != 0) {
        snprintf(addr, sizeof addr, "%s", cfg->data_address);
    } else {
        int rc = pf_route_source(host, port, pf_now_s() + cfg->join_timeout, addr, sizeof addr);
        if (rc == -EINTR) {
            log_info("stopping: SIGTERM/SIGINT while waiting for the rendezvous host's name to resolve");
            return rc;
        }
        if (rc < 0) {
            log_error("data_address = auto: %s", pf_errmsg());
            return rc;
        }
    }
    fab_set_source(addr);
    log_info("data plane: endpoints bind %s (data_address = %s%s)", addr, cfg->data_address,
             strcmp(cfg->data_address, "auto") ? "" : ": the address this host reaches the rendezvous from");
    return 0;
}

void daemon_tune_malloc(void)
{
    mallopt(M_MMAP_THRESHOLD, 32 << 20); /* glibc refuses more than 32 MiB on 64-bit */
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
}

int daemon_metrics_start(const pf_config *cfg, const char *role, int rank)
{
    if (cfg->metrics_address[0]) {
        metrics_set_identity(role, rank);
        char bound[300];
        int rc = metrics_start(cfg->metrics_address, bound, sizeof bound);
        if (rc < 0) {
            log_error("%s", pf_errmsg());
            return rc;
        }
        log_info("metrics on %s", bound);
    }
    int rc = ctl_set_metrics_address(metrics_bound()); /* "" when off */
    if (rc < 0)
        log_error("%s", pf_errmsg());
    return rc;
}

void daemon_warn_unused_local_keys(const char *role, const pf_config *local, const pf_config *run)
{
    pf_config def;
    cfg_defaults(&def);
    char msg[1024];
    int n = cfg_diff(local, run, &def, cfg_member_local_keys, msg, sizeof msg);
    if (n)
        log_warn(
            "this %s's config sets %d key%s that the run does not use (every process trains with the run's "
            "config, server 0's when the run formed; the run's value in parentheses): %s",
            role, n, n > 1 ? "s" : "", msg);
}
