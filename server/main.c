/* pfcps-server: one shard of the class-center table, served over the fabric.
 *
 *   pfcps-server --config FILE --rank s [--set key=value ...]
 *
 * Start-up: open the fabric endpoint (provider from the config), rank 0 starts the rendezvous at
 * `rendezvous` (after checking that its shard fits in memory), every rank joins as (server, s, fabric
 * address) and gets the address book and the run config; then the shard is allocated and initialised,
 * every worker's address goes into the AV, and the progress + apply threads start.
 * SIGTERM / SIGINT (or the rendezvous' shutdown broadcast): stop accepting requests, finish the apply in
 * progress, log the counters, exit 0. The same signals while the run is still forming end the wait for the
 * other members within ~0.1 s (ctl_set_interrupt): rank 0 broadcasts the shutdown to the members that joined,
 * exit 0. Exit 1 on a start-up error (message on stderr). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/cli.h"
#include "common/config.h"
#include "common/ctl.h"
#include "common/err.h"
#include "common/fabric.h"
#include "common/log.h"
#include "common/member_addr.h"
#include "server/ps_server.h"

static volatile sig_atomic_t g_stop;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

/* SIGTERM / SIGINT stay blocked from before the shared libraries' constructors run until main() has installed
 * on_signal: libfabric's psm provider pulls in libinfinipath, whose constructor installs a handler that calls
 * exit(1) without a word (and, during libcublasLt's constructor, crashed the worker with SIGSEGV). A stop
 * request in the first few hundred milliseconds now ends in the same orderly stop as a later one. */
static sigset_t stop_signals;
static void block_stop_signals(void) {
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
}
__attribute__((used, section(".preinit_array"))) static void (*const preinit_block_stop_signals)(void) =
    block_stop_signals;

static const char usage[] =
    "usage: pfcps-server --config FILE --rank S [--set key=value ...]\n"
    "  --rank S   this server's rank in [0, servers); rank 0 runs the rendezvous\n";

int main(int argc, char **argv) {
    pf_config cfg;
    int rest = 0;
    log_init("server", -1);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    pthread_sigmask(SIG_UNBLOCK, &stop_signals, NULL); /* a SIGTERM that came during start-up: on_signal now */
    int rc = cli_parse_common(argc, argv, &cfg, usage, CLI_CONFIG_OPTIONAL, &rest);
    if (rc == CLI_HELP) return 0;
    if (rc < 0) {
        log_error("%s", pf_errmsg());
        return 1;
    }
    int rank = -1;
    for (int i = 1; i < rest; i++) {
        if (!strcmp(argv[i], "--rank") && i + 1 < rest) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 0 || v > 1000000) {
                log_error("--rank '%s' is not a non-negative integer", argv[i]);
                return 1;
            }
            rank = (int)v;
        } else {
            log_error("unknown argument '%s'\n%s", argv[i], usage);
            return 1;
        }
    }
    log_init("server", rank);
    const char *secret;
    char host[256];
    int port;
    if (cli_member_check(&cfg, rank, cfg.servers, "servers", host, sizeof(host), &port, &secret) < 0) {
        log_error("%s\n%s", pf_errmsg(), usage);
        return 1;
    }

    ctl_set_interrupt(&g_stop); /* a stop request ends the wait for the run to form */

    ctl_rendezvous *rv = NULL;
    ctl_session *sess = NULL;
    fab_ctx *fab = NULL;
    ps_server *srv = NULL;
    char *ini = NULL;
    int exit_code = 1;

    if (rank == 0) {
        if (cfg_validate(&cfg) < 0) {
            log_error("%s", pf_errmsg());
            goto out;
        }
        /* Refuse before anyone joins when the shard cannot fit. */
        if (shard_check_fit(cfg.num_classes, cfg.servers, 0, cfg.embedding_size) < 0) {
            log_error("refusing to start: %s", pf_errmsg());
            goto out;
        }
    }
    if (fab_open(cfg.provider, &fab) < 0) {
        log_error("%s", pf_errmsg());
        goto out;
    }
    /* A reply towards a worker whose endpoint is gone gives up after 4 x ctl_timeout (the workers' own bound
     * on a data-plane wait) instead of stalling the progress thread forever; later replies to it fail at
     * once (fab_set_timeout). */
    fab_set_timeout(fab, 4 * (cfg.ctl_timeout > 0 ? cfg.ctl_timeout : 30));
    uint8_t addr[FAB_MAX_ADDR];
    size_t alen = sizeof(addr);
    if (fab_getname(fab, addr, &alen) < 0) {
        log_error("%s", pf_errmsg());
        goto out;
    }
    if (rank == 0) {
        ini = cfg_to_ini(&cfg);
        ctl_rendezvous_opts ro = {.bind_host = host, .port = port, .num_servers = cfg.servers,
                                  .num_workers = cfg.workers, .secret = secret,
                                  .max_frame = (size_t)cfg.ctl_max_frame, .timeout_s = cfg.ctl_timeout,
                                  .config_text = ini, .num_classes = cfg.num_classes};
        if (!ini || ctl_rendezvous_start(&ro, &rv) < 0) {
            log_error("%s", ini ? pf_errmsg() : "rendezvous: out of memory"); /* the message names the rendezvous */
            goto out;
        }
        /* ctl_rendezvous_start logged what it bound ("control plane: rendezvous listening on ..."). */
    }
    /* Join (retrying through the whole ctl_timeout) and take the run config from the book. */
    pf_config run;
    if ((rc = cli_join_run(&cfg, host, port, CTL_ROLE_SERVER, rank, addr, alen, secret, &sess, &run)) < 0) {
        if (rc == -EINTR && g_stop) {
            /* Stopped on request before the run formed: a normal stop. Rank 0 tells the members that joined
             * (shutdown broadcast below); another rank's closed connection frees its rank at the rendezvous. */
            log_info("stopping: SIGTERM/SIGINT while waiting for the run to form%s",
                     rv ? " (telling the members that joined)" : "");
            log_info("stopped before the run formed");
            exit_code = 0;
        } else if (rc == -ECANCELED) {
            /* Server 0 stopped (shutdown broadcast) before the run formed: a normal stop here too. */
            log_info("stopping: %s", pf_errmsg());
            log_info("stopped before the run formed");
            exit_code = 0;
        } else {
            log_error("%s", pf_errmsg());
        }
        goto out;
    }
    const ctl_book *book = ctl_session_book(sess);
    ps_dtype dtype = PS_DT_FP32;
    if (ps_dtype_parse(run.wire_dtype, &dtype) < 0) {
        log_error("inconsistent run config: %s", pf_errmsg());
        goto out;
    }
    if (book->num_servers != run.servers || book->num_workers != run.workers) {
        log_error("inconsistent run config: address book %d/%d vs servers %d workers %d", book->num_servers,
                  book->num_workers, run.servers, run.workers);
        goto out;
    }
    ps_server_opts so = {.provider = run.provider, .rank = rank, .servers = run.servers, .workers = run.workers,
                         .dim = run.embedding_size, .num_classes = run.num_classes, .seed = (uint64_t)run.seed,
                         .momentum = run.momentum, .weight_decay = run.weight_decay,
                         .max_staleness = run.max_staleness, .apply_threads = cfg.apply_threads, .fab = fab};
    /* PFCPS_PREFAULT=1 backs every page of the table before serving (no config key for it yet). */
    const char *pf = getenv("PFCPS_PREFAULT");
    so.prefault = pf && *pf == '1';
    so.global_mode = strcmp(run.head_mode, "local") != 0;
    fab = NULL; /* owned by the server from here on */
    if (ps_server_create(&so, &srv) < 0) {
        log_error("refusing to start: %s", pf_errmsg());
        goto out;
    }
    for (int w = 0; w < book->num_workers; w++) {
        /* A worker's entry packs two endpoint names (common/member_addr.h): part 0 talks to servers. */
        const void *waddr = NULL;
        size_t wlen = 0;
        if (member_addr_part(book->workers[w].addr, book->workers[w].addr_len, 0, &waddr, &wlen) < 0 ||
            ps_server_add_worker(srv, w, waddr, wlen) < 0) {
            log_error("%s", pf_errmsg());
            goto out;
        }
    }
    if (ps_server_start(srv) < 0) {
        log_error("%s", pf_errmsg());
        goto out;
    }
    if (run.snapshot_every > 0)
        log_warn("snapshot_every = %d: shard snapshots are not implemented yet; the table lives only in this "
                 "process", run.snapshot_every);
    log_info("serving shard %d/%d to %d workers (head_mode %s: %s, max_staleness %d, %d apply threads)", rank,
             run.servers, run.workers, run.head_mode,
             so.global_mode ? "pushes applied on arrival, read-your-writes pulls" : "BSP/SSP step clock",
             run.max_staleness, cfg.apply_threads);

    int ctl_ok = 1;
    while (!g_stop) {
        if (ctl_ok) {
            int r = ctl_session_wait_shutdown(sess, 0.2);
            if (r == 1) {
                log_info("shutdown broadcast received");
                break;
            }
            if (r == -ENOLINK) {
                /* Another member was lost: its workers stop; this server keeps its shard and serves on. */
                log_warn("%s; serving on", pf_errmsg());
            } else if (r < 0) {
                log_warn("control connection lost (%s); serving until SIGTERM", pf_errmsg());
                ctl_ok = 0;
            }
        } else {
            struct timespec ts = {0, 200000000};
            nanosleep(&ts, NULL);
        }
    }
    log_info("stopping: no new requests; finishing the apply in progress");
    ps_server_stop(srv);
    ps_stat st;
    ps_server_stat(srv, &st);
    log_info("stopped: %lld steps done, %lld pushes applied, %lld row updates, %lld bad requests",
             (long long)st.steps_done, (long long)st.pushes_applied, (long long)st.rows_applied,
             (long long)st.bad_requests);
    exit_code = 0;
out:
    /* The shutdown broadcast is an orderly stop: members that get it stop and exit 0. When server 0 fails (its
     * own join timed out because a member never came, the shard does not fit, ...) the rendezvous just closes,
     * so that the other members stop with an error instead of reporting a clean stop. */
    if (rv && exit_code == 0) ctl_rendezvous_broadcast_shutdown(rv);
    if (sess) ctl_session_close(sess);
    if (rv) ctl_rendezvous_stop(rv);
    if (exit_code == 0 && srv) {
        /* The shard is stopped and every apply finished; what is left is tearing down the endpoint, which
         * the process exit does anyway. libfabric 1.17's tcp;ofi_rxm sometimes crashes inside fi_close(ep)
         * when peers disconnect at the same moment (SIGSEGV in ps_mp_sigterm, ~1 run in 15), which would
         * turn a clean stop into exit 1: leave without it. */
        log_close_file();
        _exit(0);
    }
    ps_server_destroy(srv);
    fab_close(fab);
    free(ini);
    return exit_code;
}
