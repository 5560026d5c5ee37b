/* pfcps-server: one shard of the class-center table, served over the fabric.
 *
 *   pfcps-server --config FILE --rank s [--set key=value ...]
 *
 * Start-up: the metrics endpoint when metrics_address is set (docs/metrics.md; reported at join, so rank 0's
 * /targets lists it), open the fabric endpoint (provider from the config), rank 0 starts the rendezvous at
 * `rendezvous` (after checking that its shard fits in memory), every rank joins as (server, s, fabric
 * address) and gets the address book and the run config; then the shard is allocated and initialised,
 * every worker's address goes into the AV, and the progress + apply threads start.
 * SIGTERM / SIGINT, the rendezvous' shutdown broadcast, (server 0) every worker having left the run in order
 * (training is over), or, with the rendezvous lost with server 0 under replicas = 1, every worker having said
 * it is done (PS_STAT_DONE): stop accepting requests, apply every step whose pushes are all in (they were
 * acknowledged), finish the snapshot in progress, log the counters, exit 0. A lost member or a lost
 * rendezvous that the run cannot go on without (docs/architecture.md, "Server 0 and the rendezvous"): the
 * same stop, exit 75 (the run must re-form). The
 * same signals while the run is still forming end the wait for the other members within ~0.1 s
 * (ctl_set_interrupt): rank 0 broadcasts the shutdown to the members that joined, exit 0. Exit 1 on a
 * start-up error (message on stderr). */
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/ckpt.h"
#include "common/cli.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/ctl.h"
#include "common/daemon.h"
#include "common/err.h"
#include "common/fabric.h"
#include "common/log.h"
#include "common/member_addr.h"
#include "common/metrics.h"
#include "common/snapfile.h"
#include "common/torch_ckpt.h"
#include "server/ps_server.h"
#include "server/snapshot.h"

static volatile sig_atomic_t g_stop; /* set by SIGTERM / SIGINT (daemon_signals_install) */

static const char usage[] = "usage: pfcps-server --config FILE --rank S [--set key=value ...]\n"
                            "  --rank S   this server's rank in [0, servers); rank 0 runs the rendezvous\n";

/* What main's steps share. */
typedef struct server_daemon {
    pf_config cfg; /* this process' config: file and --set */
    pf_config run; /* the run's config, from the address book (server 0's) */
    int rank;
    const char *secret;
    char host[256]; /* rendezvous host and port */
    int port;
    fab_ctx *fab; /* the endpoint, until ps_server_create takes it */
    fab_ctx *fab_backup; /* replicas = 1: the backup copy's endpoint, until ps_server_create takes it */
    uint8_t addr[CTL_MAX_ADDR]; /* the address-book entry: the endpoint's name (replicas = 1: both names
                                   packed, common/member_addr.h: part 0 the primary, part 1 the backup) */
    size_t alen;
    char *ini;          /* rank 0: the config text the rendezvous sends */
    ctl_rendezvous *rv; /* rank 0 only */
    ctl_session *sess;
    ps_server *srv;
    ps_server *backup; /* replicas = 1: the hot-standby copy of shard (rank - 1) mod S */
    double lease_s;    /* replicas = 1: how long past its lease base the server may act (serve_until_stop) */
    double orphan_t;   /* when serve_until_stop first saw the rendezvous lost with server 0 (0: not yet) */
    double quiet_s;    /* without a rendezvous: workers silent this long end the run (workers_quiet) */
    int rollback_failed; /* a worker replacement's rollback could not be done: the run re-forms */
    int left;            /* say_done: the shutdown broadcast (server 0) and the leave are sent */
    char root[4096];  /* checkpoint root of the run */
    snapfile_key key; /* the checkpoint key, from the join secret (shard files carry its HMAC) */
} server_daemon;

/* The command line: the shared options, then --rank; checks the member settings (rank range, secret,
 * rendezvous address). Returns 0, CLI_HELP, or -1 after logging the error. */
static int parse_args(int argc, char **argv, server_daemon *d)
{
    int rest = 0;
    int rc = daemon_parse_common(argc, argv, &d->cfg, usage, &rest);
    if (rc != 0)
        return rc;
    d->rank = -1;
    for (int i = 1; i < rest; i++) {
        if (!strcmp(argv[i], "--rank") && i + 1 < rest) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 0 || v > 1000000) {
                log_error("--rank '%s' is not a non-negative integer", argv[i]);
                return -1;
            }
            d->rank = (int)v;
        } else {
            log_error("unknown argument '%s'\n%s", argv[i], usage);
            return -1;
        }
    }
    return daemon_member_check(&d->cfg, "server", d->rank, d->cfg.servers, "servers", d->host,
                               sizeof(d->host), &d->port, &d->secret, usage);
}

/* Rank 0 checks the whole config and refuses before anyone joins when its shard cannot fit. Returns 0 or
 * -1 after logging. */
static int check_run_config(const server_daemon *d)
{
    if (d->rank != 0)
        return 0;
    if (cfg_validate(&d->cfg) < 0) {
        log_error("%s", pf_errmsg());
        return -1;
    }
    if (shard_check_fit(d->cfg.num_classes, d->cfg.servers, 0, d->cfg.embedding_size) < 0) {
        log_error("refusing to start: %s", pf_errmsg());
        return -1;
    }
    return 0;
}

/* Opens the fabric endpoint (the config's provider) and reads its address for the address book. Returns 0
 * or -1 after logging. */
static int open_endpoint(server_daemon *d)
{
    if (fab_open(d->cfg.provider, &d->fab) < 0) {
        log_error("%s", pf_errmsg());
        return -1;
    }
    /* A reply towards a worker whose endpoint is gone gives up after 4 x ctl_timeout (the workers' own bound
     * on a data-plane wait) instead of stalling the progress thread forever; later replies to it fail at
     * once (fab_set_timeout). */
    const double post_timeout = 4 * (d->cfg.ctl_timeout > 0 ? d->cfg.ctl_timeout : 30);
    fab_set_timeout(d->fab, post_timeout);
    d->alen = FAB_MAX_ADDR; /* a name fits (fabric.h); the book entry has room for two */
    if (fab_getname(d->fab, d->addr, &d->alen) < 0) {
        log_error("%s", pf_errmsg());
        return -1;
    }
    if (d->cfg.replicas == 0)
        return 0;
    /* replicas = 1: a second endpoint serves the backup copy; both names go into the book entry. */
    uint8_t a0[FAB_MAX_ADDR], a1[FAB_MAX_ADDR];
    size_t l0 = d->alen, l1 = sizeof a1;
    memcpy(a0, d->addr, d->alen);
    if (fab_open(d->cfg.provider, &d->fab_backup) < 0 || fab_getname(d->fab_backup, a1, &l1) < 0) {
        log_error("the backup copy's endpoint: %s", pf_errmsg());
        return -1;
    }
    fab_set_timeout(d->fab_backup, post_timeout);
    const void *parts[2] = {a0, a1};
    const size_t lens[2] = {l0, l1};
    int n = member_addr_pack(d->addr, sizeof d->addr, 2, parts, lens);
    if (n < 0) {
        log_error("%s", pf_errmsg());
        return -1;
    }
    d->alen = (size_t)n;
    return 0;
}

/* Rank 0 starts the rendezvous at host:port with this process' config as the run's. ctl_rendezvous_start
 * logs what it bound. Returns 0, 1 when a stop signal came while its host name did not resolve yet (a normal
 * stop), or -1 after logging. */
static int start_rendezvous(server_daemon *d)
{
    if (d->rank != 0)
        return 0;
    const pf_config *cfg = &d->cfg;
    /* A checkpoint step is resumed only when its files carry this config's seed and config digest. */
    static const uint8_t no_run_id[CKPT_RUN_ID_BYTES];
    ckpt_ident expect;
    if (ckpt_ident_of(cfg, no_run_id, &expect) < 0) {
        log_error("%s", pf_errmsg());
        return -1;
    }
    d->ini = cfg_to_ini(cfg);
    uint8_t pin[CKPT_RUN_ID_BYTES]; /* resume_run (cfg_validate checked it is a run id) */
    const int pinned = cfg->resume_run[0] && ckpt_unhex(cfg->resume_run, pin, CKPT_RUN_ID_BYTES, 0) == 0;
    ctl_rendezvous_opts ro = {.bind_host = d->host,
                              .port = d->port,
                              .num_servers = cfg->servers,
                              .num_workers = cfg->workers,
                              .secret = d->secret,
                              .max_frame = (size_t)cfg->ctl_max_frame,
                              .timeout_s = cfg->ctl_timeout,
                              .bind_timeout_s = cfg->join_timeout,
                              .config_text = d->ini,
                              .num_classes = cfg->num_classes,
                              .resume = cfg->resume,
                              .expect = &expect,
                              .resume_run = pinned ? pin : NULL,
                              .replicas = cfg->replicas,
                              .rejoin = strcmp(cfg->head_mode, "local") != 0,
                              .replace_workers = cfg_replaces_workers(cfg, NULL, 0),
                              .gradient_acc = cfg->gradient_acc,
                              .metrics = 1};
    int rc = d->ini ? ctl_rendezvous_start(&ro, &d->rv) : -ENOMEM;
    if (rc == -EINTR) {
        log_info("stopping: SIGTERM/SIGINT while waiting for the rendezvous host's name to resolve");
        return 1;
    }
    if (rc < 0) {
        log_error("%s",
                  d->ini ? pf_errmsg() : "rendezvous: out of memory"); /* the message names the rendezvous */
        return -1;
    }
    return 0;
}

/* ckpt_step_check for this server: the step's shard files verified whole, HMAC included, and agreeing on the
 * run identity (snap_check). */
static int shard_step_usable(const char *root, int64_t step, void *arg, ckpt_ident *id)
{
    const server_daemon *d = arg;
    int S0 = 0;
    return snap_check(root, step, d->cfg.num_classes, d->cfg.embedding_size, &d->key, &S0, id);
}

/* Server 0 restarted under head_mode = local, where a failed-over server cannot rejoin (its rejoin refused,
 * EEXIST): its rendezvous adopted the running run, which goes on without server 0's copies, and stays its
 * rendezvous (a worker lost later is still replaced in place) until the run ends. Returns 1 (exit 0) when the
 * adopted run ended in order or a stop was asked for, 2 (exit DAEMON_EXIT_REFORM) when it re-forms. */
static int host_rendezvous_only(server_daemon *d)
{
    log_warn(
        "head_mode = local: server 0 cannot rejoin the running run (its shards go on on their other copies); "
        "it hosts the run's rendezvous, holding no shard, until the run ends");
    while (!g_stop && ctl_rendezvous_adopting(d->rv) == 1) {
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
    }
    if (!g_stop && ctl_rendezvous_adopting(d->rv) == 2) {
        log_error("the adopted run re-forms from its newest complete checkpoint: exiting %d",
                  DAEMON_EXIT_REFORM);
        return 2;
    }
    log_info("the adopted run ended%s: stopping its rendezvous", g_stop ? " (or a stop was asked for)" : "");
    return 1;
}

/* Start-up up to the formed run: checks, endpoint, rendezvous (rank 0), then the join (retrying through the
 * whole join_timeout), which takes the run config from the address book. Returns 0 joined, 1 stopped before
 * the run formed (a normal stop; rank 0 tells the members that joined when it stops), or -1 (logged). */
static int join_run(server_daemon *d)
{
    if (check_run_config(d) < 0)
        return -1;
    if (snapfile_key_derive(d->secret, &d->key) < 0) {
        log_error("%s", pf_errmsg());
        return -1;
    }
    char who[32];
    snprintf(who, sizeof who, "shard %d", d->rank);
    if (daemon_list_resume_steps(&d->cfg, "server", who, shard_step_usable, d) < 0)
        return -1;
    int rc = daemon_bind_data_plane(&d->cfg, d->host, d->port);
    if (rc == -EINTR)
        return 1; /* stopped while the rendezvous name did not resolve yet: a normal stop */
    if (rc < 0 || open_endpoint(d) < 0)
        return -1;
    if ((rc = start_rendezvous(d)) != 0)
        return rc;
    /* Server 0 whose rendezvous adopts a running run (restarted: its members resumed it there) joins it as a
     * learner once the members are ready for it: a worker's replacement under way refuses its join (EAGAIN)
     * and the copy step may take a while, so a join that runs out of time is tried again while the adopted
     * run neither re-forms nor ends, within the workers' own bound (4 x ctl_timeout). */
    const double t0 = pf_now_s(), bound = 4 * (d->cfg.ctl_timeout > 0 ? d->cfg.ctl_timeout : 30);
    /* Under head_mode = local the adopted run refuses server 0's rejoin (EEXIST) as a matter of course: that
     * refusal is logged here, as what follows from it, not as an error. */
    const int local = !strcmp(d->cfg.head_mode, "local");
    for (;;) {
        rc = daemon_join(&d->cfg, d->host, d->port, CTL_ROLE_SERVER, d->rank, d->addr, d->alen, d->secret,
                         d->rv ? " (telling the members that joined)" : "",
                         d->rv && local ? DAEMON_JOIN_EEXIST_TO_CALLER : 0, &d->sess, &d->run);
        if (rc != -ETIMEDOUT || !d->rv || ctl_rendezvous_adopting(d->rv) != 1 || g_stop ||
            pf_now_s() - t0 > bound)
            break;
        log_warn(
            "join: this server's rendezvous adopted the running run, which is not ready for this server yet "
            "(a worker's replacement, or the copy step of its rejoin): joining again");
    }
    if (rc == -EEXIST && d->rv && local) {
        if (ctl_rendezvous_adopting(d->rv) == 1) {
            log_info("%s", pf_errmsg());
            return host_rendezvous_only(d);
        }
        /* not the adopted run's refusal: daemon_join left it to be logged here */
        log_error("%s", pf_errmsg());
    }
    if (rc < 0 && d->rv && ctl_rendezvous_adopting(d->rv) != 0) {
        log_error(
            "this server could not rejoin the running run its rendezvous adopted: exiting %d so that the "
            "run re-forms from its newest complete checkpoint",
            DAEMON_EXIT_REFORM);
        return 2;
    }
    return rc < 0 ? -1 : rc;
}

/* Gives shard service srv every worker's address from the book. Returns 0 or -1 after logging. */
static int add_workers(ps_server *srv, const ctl_book *book)
{
    for (int w = 0; w < book->num_workers; w++) {
        /* A worker's entry packs two endpoint names (common/member_addr.h): part 0 talks to servers. */
        const void *waddr = NULL;
        size_t wlen = 0;
        if (member_addr_part(book->workers[w].addr, book->workers[w].addr_len, 0, &waddr, &wlen) < 0 ||
            ps_server_add_worker(srv, w, waddr, wlen) < 0) {
            log_error("%s", pf_errmsg());
            return -1;
        }
    }
    return 0;
}

/* A rejoining server (book.rejoin_epoch > 0; docs/architecture.md, "Hot-standby shards", Rejoin) copies its
 * two shards from checkpoint book.resume_step, which the shards' serving copies write once they applied every
 * push of the steps before it (the workers hold their next pushes until this server is ready). Waits until
 * shard `shard`'s file of that step is in place (written whole, then renamed) and logs what is copied from
 * which server. Returns 0, or -1 after logging when it does not come within ctl_timeout. */
static int rejoin_wait_file(const server_daemon *d, int shard, int from)
{
    const ctl_book *book = ctl_session_book(d->sess);
    char p[4300];
    ckpt_member_path(d->root, book->resume_step, "shard", shard, d->run.servers, ".snap", p, sizeof p);
    const double t0 = pf_now_s(), limit = d->run.ctl_timeout > 0 ? d->run.ctl_timeout : 30;
    struct stat st;
    while (stat(p, &st) != 0) {
        if (g_stop) {
            log_info("rejoin: stopping on request while waiting for shard %d's copy %s", shard, p);
            return -1;
        }
        if (pf_now_s() - t0 > limit) {
            log_error("rejoin: shard %d's copy %s did not appear within %.0f s (server %d writes it)", shard,
                      p, limit, from);
            return -1;
        }
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    log_info("rejoin: copying shard %d from server %d (its serving copy) at checkpoint step %lld: %lld rows, "
             "%lld bytes (%s; waited %.3f s for it)",
             shard, from, (long long)book->resume_step,
             (long long)shard_local_rows(d->run.num_classes, d->run.servers, shard), (long long)st.st_size, p,
             pf_now_s() - t0);
    return 0;
}

/* A rejoining server's copy of one shard into srv: the checkpoint step's file, loaded as a resume loads it.
 * In the tests' build of the server only (pfcps-server-test-hooks, -DPFCPS_TEST_HOOKS),
 * PFCPS_TEST_REJOIN_SKIP_COPY=1 leaves the shard as generated instead (the rejoin test's negative control).
 * Returns 0 or -1 after logging. */
static int rejoin_copy(const server_daemon *d, ps_server *srv, int shard)
{
    const ctl_book *book = ctl_session_book(d->sess);
#ifdef PFCPS_TEST_HOOKS
    const char *skip = getenv("PFCPS_TEST_REJOIN_SKIP_COPY");
    if (skip && !strcmp(skip, "1")) {
        log_warn(
            "rejoin: PFCPS_TEST_REJOIN_SKIP_COPY=1: shard %d NOT copied (a test's negative control: this "
            "copy is wrong)",
            shard);
        return 0;
    }
#endif
    const double t0 = pf_now_s();
    if (ps_server_load(srv, d->root, book->resume_step) < 0) {
        log_error("rejoin: cannot copy shard %d from checkpoint step %lld: %s", shard,
                  (long long)book->resume_step, pf_errmsg());
        return -1;
    }
    log_info("rejoin: shard %d copied (100%%) in %.3f s", shard, pf_now_s() - t0);
    return 0;
}

/* A rejoining server before its primary copy loads: waits for both shard files of the copy's checkpoint
 * (shard r is served by its backup on server r + 1, shard r - 1 by its primary on server r - 1); the primary
 * stays quiet (the backup on server r + 1 goes on writing shard r's snapshots until that server is lost:
 * take_failover) and refuses older epochs. Returns 0 or -1 after logging. */
static int rejoin_prepare(server_daemon *d)
{
    const int S = d->run.servers;
    if (rejoin_wait_file(d, d->rank, (d->rank + 1) % S) < 0 ||
        rejoin_wait_file(d, (d->rank + S - 1) % S, (d->rank + S - 1) % S) < 0)
        return -1;
    ps_server_set_quiet(d->srv);
    ps_server_set_min_epoch(d->srv, ctl_session_book(d->sess)->rejoin_epoch);
    return 0;
}

/* A rejoining server whose copies are loaded and serving tells the rendezvous (which then tells every member
 * that it holds them). In the tests' build of the server only (pfcps-server-test-hooks),
 * PFCPS_TEST_REJOIN_EXIT_BEFORE_READY=1 exits here instead (the rejoin test's learner that dies while
 * copying). Returns 0 or -1 after logging. */
static int rejoin_ready(server_daemon *d)
{
    const ctl_book *book = ctl_session_book(d->sess);
#ifdef PFCPS_TEST_HOOKS
    const char *die = getenv("PFCPS_TEST_REJOIN_EXIT_BEFORE_READY");
    if (die && !strcmp(die, "1")) {
        log_warn("rejoin: PFCPS_TEST_REJOIN_EXIT_BEFORE_READY=1: exiting before telling the rendezvous");
        log_close_file();
        _exit(1);
    }
#endif
    if (ctl_session_rejoin_report(d->sess, CTL_FO_REJOIN_READY, d->rank, book->rejoin_epoch,
                                  book->resume_step) < 0) {
        log_error("rejoin: cannot tell the rendezvous this server is ready: %s", pf_errmsg());
        return -1;
    }
    log_info("rejoin: both copies loaded at step %lld and serving; told the rendezvous",
             (long long)book->resume_step);
    return 0;
}

/* Loads a shard copy from checkpoint book.resume_step: a resume, or a rejoin's copy (rejoin_copy). Returns 0
 * or -1 after logging. */
static int load_copy(const server_daemon *d, ps_server *srv, int shard, const char *what)
{
    const ctl_book *book = ctl_session_book(d->sess);
    if (book->resume_step <= 0)
        return 0;
    if (book->rejoin_epoch)
        return rejoin_copy(d, srv, shard);
    if (ps_server_load(srv, d->root, book->resume_step) < 0) {
        log_error("%scannot load checkpoint step %lld: %s", what, (long long)book->resume_step, pf_errmsg());
        return -1;
    }
    return 0;
}

/* replicas = 1: creates, loads and starts the hot-standby copy of shard (rank - 1) mod S on the second
 * endpoint, with the primary's options `po` otherwise (same step clock, checkpoint and pretrained rows).
 * Returns 0 or -1 after logging. */
static int start_backup(server_daemon *d, const ps_server_opts *po)
{
    const ctl_book *book = ctl_session_book(d->sess);
    const pf_config *run = &d->run;
    if (!d->fab_backup) {
        log_error("inconsistent run config: the run has replicas = %d but this server was started with "
                  "replicas = 0 (no endpoint for a backup copy): give every member the same config",
                  run->replicas);
        return -1;
    }
    ps_server_opts bo = *po;
    bo.rank = (d->rank + run->servers - 1) % run->servers;
    bo.backup = 1;
    bo.fab = d->fab_backup;
    d->fab_backup = NULL; /* owned by the backup copy from here on */
    if (ps_server_create(&bo, &d->backup) < 0) {
        log_error("refusing to start the backup copy of shard %d: %s", bo.rank, pf_errmsg());
        return -1;
    }
    if (book->rejoin_epoch)
        ps_server_set_min_epoch(d->backup, book->rejoin_epoch);
    char what[64];
    snprintf(what, sizeof what, "backup copy of shard %d: ", bo.rank);
    if (load_copy(d, d->backup, bo.rank, what) < 0)
        return -1;
    if (run->pretrained_centers[0] && book->resume_step == 0 &&
        ps_server_load_centers(d->backup, run->pretrained_centers) < 0) {
        log_error("backup copy of shard %d: config key 'pretrained_centers' = %s: %s", bo.rank,
                  run->pretrained_centers, pf_errmsg());
        return -1;
    }
    if (add_workers(d->backup, book) < 0)
        return -1;
    if (ps_server_start(d->backup) < 0) {
        log_error("backup copy of shard %d: %s", bo.rank, pf_errmsg());
        return -1;
    }
    log_info("replicas = 1: serving the backup copy of shard %d too (its primary is server %d)", bo.rank,
             bo.rank);
    return 0;
}

/* Creates this rank's shard service from the run config, gives it every worker's address and starts its
 * threads (replicas = 1: the backup copy's too). Returns 0 or -1 after logging. */
static int start_serving(server_daemon *d)
{
    const ctl_book *book = ctl_session_book(d->sess);
    const pf_config *run = &d->run;
    daemon_warn_unused_local_keys("server", &d->cfg, run);
    ps_dtype dtype = PS_DT_FP32;
    if (ps_dtype_parse(run->wire_dtype, &dtype) < 0) {
        log_error("inconsistent run config: %s", pf_errmsg());
        return -1;
    }
    if (book->num_servers != run->servers || book->num_workers != run->workers) {
        log_error("inconsistent run config: address book %d/%d vs servers %d workers %d", book->num_servers,
                  book->num_workers, run->servers, run->workers);
        return -1;
    }
    ps_server_opts so = {.provider = run->provider,
                         .rank = d->rank,
                         .servers = run->servers,
                         .workers = run->workers,
                         .dim = run->embedding_size,
                         .num_classes = run->num_classes,
                         .seed = (uint64_t)run->seed,
                         .momentum = run->momentum,
                         .weight_decay = run->weight_decay,
                         .adamw = strcmp(run->optimizer, "adamw") == 0,
                         .dense = strcmp(run->pfc_update, "sparse") != 0,
                         .max_staleness = run->max_staleness,
                         .apply_threads = d->cfg.apply_threads,
                         .snapshot_root = d->root,
                         .snapshot_keep = run->snapshot_keep,
                         .start_step = book->resume_step,
                         .token = 0,
                         .ckpt_keyed = 1,
                         .ckpt_key = d->key,
                         .undo = cfg_replaces_workers(run, NULL, 0),
                         .fab = d->fab};
    ckpt_root(run, d->root, sizeof d->root);
    /* A new run from arcface_torch's checkpoint_gpu_<rank>.pt set continues at its global_step: the step
     * clock (and, under dense updates, every row's up-to-date step) starts there; the workers read the same
     * number from the same file (worker/train_setup.c). */
    tpc_progress prog = {0};
    if (run->pretrained_centers[0] && book->resume_step == 0) {
        if (tpc_read_progress(run->pretrained_centers, &prog) < 0) {
            log_error("config key 'pretrained_centers' = %s: %s", run->pretrained_centers, pf_errmsg());
            return -1;
        }
        if (prog.present) {
            so.start_step = prog.global_step;
            log_info("continuing arcface_torch's run of %s: step clock at global_step %lld (epoch %lld done)",
                     run->pretrained_centers, (long long)prog.global_step, (long long)prog.epoch);
        }
    }
    if (ckpt_ident_of(run, book->run_id, &so.ckpt_id) < 0) {
        log_error("%s", pf_errmsg());
        return -1;
    }
    if (ctl_data_token(d->secret, book->run_nonce, &so.token) < 0) {
        log_error("%s", pf_errmsg());
        return -1;
    }
    /* PFCPS_PREFAULT=1 backs every page of the table before serving (no config key for it yet). */
    const char *pf = getenv("PFCPS_PREFAULT");
    so.prefault = pf && *pf == '1';
    so.global_mode = strcmp(run->head_mode, "local") != 0;
    so.fill = strcmp(d->cfg.center_init, "lazy") != 0;
    d->fab = NULL; /* owned by the server from here on */
    if (ps_server_create(&so, &d->srv) < 0) {
        log_error("refusing to start: %s", pf_errmsg());
        return -1;
    }
    log_info("checkpoints: %s (%s)", d->root, book->resume_reason);
    if (book->rejoin_epoch && rejoin_prepare(d) < 0)
        return -1;
    if (load_copy(d, d->srv, d->rank, "") < 0)
        return -1;
    if (run->pretrained_centers[0] && book->resume_step > 0) {
        log_info("pretrained_centers = %s ignored: resuming from checkpoint step %lld",
                 run->pretrained_centers, (long long)book->resume_step);
    } else if (run->pretrained_centers[0] && ps_server_load_centers(d->srv, run->pretrained_centers) < 0) {
        log_error("config key 'pretrained_centers' = %s: %s", run->pretrained_centers, pf_errmsg());
        return -1;
    }
    /* The checkpoint interval, and a resumed run's checkpoint as the last one until the next is written
     * (deploy/monitoring/alerts.yml's PfcpsSnapshotStale compares the steps since it with the interval). */
    pf_metric *every = metrics_gauge("pfcps_server_snapshot_every_steps",
                                     "The run's snapshot_every (0: checkpoints off).", NULL, 0);
    metrics_set(every, run->snapshot_every);
    if (book->resume_step > 0) {
        /* The series ps_server_create registered (same name, no labels). */
        pf_metric *last =
            metrics_gauge("pfcps_server_snapshot_last_step", "Step of the last completed snapshot.", NULL, 0);
        metrics_set(last, (double)book->resume_step);
    }
    if (add_workers(d->srv, book) < 0 || (run->replicas && start_backup(d, &so) < 0))
        return -1;
    if (ps_server_start(d->srv) < 0) {
        log_error("%s", pf_errmsg());
        return -1;
    }
    log_info("serving shard %d/%d to %d workers (head_mode %s: %s, max_staleness %d, %d apply threads, "
             "center_init %s)",
             d->rank, run->servers, run->workers, run->head_mode,
             so.global_mode ? "pushes applied on arrival, read-your-writes pulls" : "BSP/SSP step clock",
             run->max_staleness, d->cfg.apply_threads, d->cfg.center_init);
    return book->rejoin_epoch ? rejoin_ready(d) : 0;
}

/* Serves until SIGTERM / SIGINT, the rendezvous' shutdown broadcast, or (server 0) every worker having left
 * the run in order: training is over (returns 0); or until the run is broken (returns DAEMON_EXIT_REFORM):
 * another member was lost or restarted, or the control connection to server 0 broke. The table then runs
 * ahead of the workers' last checkpoint, so the run can only go on by re-forming from the newest complete
 * checkpoint: this server stops (finishing a snapshot being written) and exits for its supervisor to restart
 * it with resume = true. */
/* A worker's replacement in place (docs/architecture.md, "Worker replacement in place"), worker w:
 * CTL_FO_WORKER_LOST: report how many steps' pushes of w both copies here hold whole (the smaller count);
 * CTL_FO_ROLLBACK: undo every push of the notice's step and later on both copies (each keeps every worker's
 * newest applied push), take the replacement's address for w, report it done. A rollback that cannot be done
 * (a copy applied more than the newest push of some worker at or after the step) ends this server for the
 * re-form: the copies would no longer match an uninterrupted run. */
static void worker_replacement(server_daemon *d, int kind, int w, uint32_t epoch, const char *text)
{
    int64_t step = 0;
    const uint8_t *addr = NULL;
    size_t alen = 0;
    ctl_session_failover_kind(d->sess, &step, &addr, &alen);
    if (kind == CTL_FO_WORKER_LOST) {
        int64_t n = ps_server_worker_pushed(d->srv, w);
        if (d->backup) {
            int64_t b = ps_server_worker_pushed(d->backup, w);
            n = b < n ? b : n;
        }
        log_warn("worker lost (epoch %u): %s; this server holds %lld steps of its pushes whole", epoch, text,
                 (long long)n);
        if (ctl_session_report(d->sess, CTL_FO_WORKER_REPORT, d->rank, epoch, n, NULL, 0) < 0)
            log_error("worker replacement: %s", pf_errmsg());
        return;
    }
    const void *waddr = NULL;
    size_t wlen = 0;
    const double tmo = d->run.ctl_timeout > 0 ? d->run.ctl_timeout : 30;
    int rc = member_addr_part(addr, alen, 0, &waddr, &wlen);
    if (rc == 0 && (rc = ps_server_rollback(d->srv, step, epoch, tmo)) == 0)
        rc = ps_server_replace_worker(d->srv, w, waddr, wlen);
    if (rc == 0 && d->backup && (rc = ps_server_rollback(d->backup, step, epoch, tmo)) == 0)
        rc = ps_server_replace_worker(d->backup, w, waddr, wlen);
    if (rc < 0) {
        char why[PF_ERRMSG_MAX + 64];
        snprintf(why, sizeof why, "rolling back to step %lld for worker %d's replacement: %s", (long long)step, w,
                 pf_errmsg());
        log_error("%s", why);
        ctl_session_fail(d->sess, why);
        d->rollback_failed = 1;
        return;
    }
    log_warn("rolled back (epoch %u): every push of step %lld and later undone on %s; worker %d's replacement "
             "takes its place",
             epoch, (long long)step, d->backup ? "both copies" : "this copy", w);
    if (ctl_session_report(d->sess, CTL_FO_ROLLED_BACK, d->rank, epoch, step, NULL, 0) < 0)
        log_error("worker replacement: %s", pf_errmsg());
}

/* replicas = 1: a failover notice from the rendezvous: every copy here takes the new epoch, the backup copy
 * of the lost server's shard is promoted, and the log says what the run stands on now. */
static void take_failover(server_daemon *d)
{
    int lost = -1;
    const char *text = "";
    uint32_t epoch = ctl_session_failover(d->sess, &lost, &text);
    int kind = ctl_session_failover_kind(d->sess, NULL, NULL, NULL);
    ps_server_set_epoch(d->srv, epoch);
    if (d->backup)
        ps_server_set_epoch(d->backup, epoch);
    if (kind == CTL_FO_WORKER_LOST || kind == CTL_FO_ROLLBACK) {
        worker_replacement(d, kind, lost, epoch, text);
        return;
    }
    if (kind != CTL_FO_LOST) {
        /* A rejoin's notice: the copies here keep serving as they are (a promoted backup goes on writing its
         * shard's snapshots; a rejoined primary stays quiet until the server holding its backup is lost). */
        log_warn("%s (epoch %u): %s", kind == CTL_FO_REJOINED ? "rejoined" : "rejoin", epoch, text);
        return;
    }
    log_warn("failover (epoch %u): %s", epoch, text);
    const int S = d->run.servers;
    if (d->backup && lost == (d->rank + S - 1) % S)
        ps_server_promote(d->backup);
    if (lost == (d->rank + 1) % S) {
        ps_server_promote(d->srv); /* a rejoined primary writes its shard's snapshots from now on */
        log_warn("shard %d lost its backup copy (server %d): it has a single copy, here", d->rank, lost);
    }
}

/* replicas = 1: renews both copies' leases from the control session (ctl_session_lease_base). */
static void renew_lease(server_daemon *d)
{
    double base = ctl_session_lease_base(d->sess);
    if (base <= 0)
        return;
    ps_server_set_lease(d->srv, base + d->lease_s);
    if (d->backup)
        ps_server_set_lease(d->backup, base + d->lease_s);
}

/* The rendezvous is lost with server 0 (ctl_session_orphaned): 1 once every worker told this server's copies
 * that it finished training (ps_client_done), so that the run ends without the rendezvous' shutdown. */
static int workers_done_here(const server_daemon *d)
{
    for (int w = 0; w < d->run.workers; w++)
        if (!ps_server_worker_done(d->srv, w) && !ps_server_worker_done(d->backup, w))
            return 0;
    return 1;
}

/* The rendezvous is lost with server 0 and the workers went quiet: no copy here took a message from any
 * worker for quiet_s (4 x ctl_timeout, the workers' own bound on a data-plane wait; counted from the loss at
 * the earliest), so a worker died as well and no rendezvous is left to say so. */
static int workers_quiet(server_daemon *d)
{
    double now = pf_now_s();
    if (d->orphan_t == 0)
        d->orphan_t = now;
    double last = d->orphan_t, a = ps_server_last_request(d->srv), b = ps_server_last_request(d->backup);
    if (a > last)
        last = a;
    if (b > last)
        last = b;
    return now - last > d->quiet_s;
}

static int serve_until_stop(server_daemon *d)
{
    d->quiet_s = 4 * (d->run.ctl_timeout > 0 ? d->run.ctl_timeout : 30);
    if (d->run.replicas && d->rank != 0) {
        /* A close of the control connection is server 0's failover when the shards keep their copies; a
         * restarted server 0's rendezvous is resumed with the run config's digest. */
        ckpt_ident id;
        if (ckpt_ident_of(&d->run, ctl_session_book(d->sess)->run_id, &id) < 0 ||
            ctl_session_survive_rendezvous_loss(d->sess, id.config_digest) < 0) {
            log_error("%s", pf_errmsg());
            return 1;
        }
        /* and so is a rendezvous that echoes nothing for twice the silence limit (server 0 stopped, hung) */
        ctl_session_set_rendezvous_silence(d->sess, 2 * ctl_member_silence_s(d->run.ctl_timeout));
    }
    if (d->run.replicas) {
        /* The lease ends before the rendezvous removes a silent member (ctl_member_silence_s); heartbeats
         * renew it eight times per lease. Until the first echo the lease counts from now. */
        d->lease_s = ctl_member_silence_s(d->run.ctl_timeout) / 2;
        ctl_session_set_heartbeat(d->sess, d->lease_s / 8);
        ps_server_set_lease(d->srv, pf_now_s() + d->lease_s);
        if (d->backup)
            ps_server_set_lease(d->backup, pf_now_s() + d->lease_s);
    }
    while (!g_stop) {
        if (d->rv && ctl_rendezvous_workers_done(d->rv)) {
            log_info("every worker is done: training is over; shutting the run down");
            return 0; /* finish() broadcasts the shutdown: the other servers stop with 0 */
        }
        if (ctl_session_orphaned(d->sess)) {
            if (workers_done_here(d)) {
                log_info("every worker said it finished training (the rendezvous is lost with server 0): "
                         "training is over; stopping");
                return 0;
            }
            if (workers_quiet(d)) {
                ps_server_fence(d->srv);
                if (d->backup)
                    ps_server_fence(d->backup);
                log_error("no worker sent anything for %.0f s and not every worker said it finished training: "
                          "without the rendezvous (lost with server 0) nothing can tell this server more; it is "
                          "fenced and stops so that the run can re-form from its newest complete checkpoint "
                          "(exit %d)",
                          d->quiet_s, DAEMON_EXIT_REFORM);
                return DAEMON_EXIT_REFORM;
            }
        }
        /* 0.02 s: how soon server 0 sees every worker gone (ctl_rendezvous_workers_done) and stops the run */
        int r = ctl_session_wait_shutdown(d->sess, 0.02);
        if (d->run.replicas)
            renew_lease(d);
        if (r == 1) {
            log_info("shutdown broadcast received");
            return 0;
        }
        if (r == 2) {
            take_failover(d);
            if (d->rollback_failed)
                return DAEMON_EXIT_REFORM;
            continue;
        }
        if (r < 0 && g_stop)
            return 0; /* asked to stop too: members stopping together are not a broken run */
        if (d->rv && ctl_rendezvous_fenced(d->rv)) {
            /* This process was stopped past the silence limit: the members took server 0 for lost and train
             * on with its shards' backups; its rendezvous closed every connection. */
            ps_server_fence(d->srv);
            if (d->backup)
                ps_server_fence(d->backup);
            log_error(
                "this server 0 was stopped longer than the silence limit, so the members take it for lost "
                "(its shards' backups serve them): it is fenced and exits %d so that its supervisor starts "
                "it again: its rendezvous then adopts the run and it rejoins",
                DAEMON_EXIT_REPLACED);
            return DAEMON_EXIT_REPLACED;
        }
        if (r == -ENOLINK && !strcmp(d->cfg.on_member_loss, "serve")) {
            log_warn("%s; serving on (on_member_loss = serve)", pf_errmsg());
            continue;
        }
        if (r < 0 && d->run.replicas && r != -ENOLINK) {
            /* The rendezvous removed this server (silent past its deadline) or cannot be reached: its shards
             * may be served by their other copies already, so nothing here may answer or change anything. */
            ps_server_fence(d->srv);
            if (d->backup)
                ps_server_fence(d->backup);
            log_error("control connection to the rendezvous lost: %s: this server is fenced (replicas = 1: "
                      "its shards go on on their other copies if the run does); exit %d",
                      pf_errmsg(), DAEMON_EXIT_REFORM);
            return DAEMON_EXIT_REFORM;
        }
        if (r < 0) {
            log_error("%s%s: the run is broken; stopping so that it can re-form from the newest complete "
                      "checkpoint (restart every member with resume = true; exit %d)",
                      r == -ENOLINK ? "" : "control connection to the rendezvous lost: ", pf_errmsg(),
                      DAEMON_EXIT_REFORM);
            return DAEMON_EXIT_REFORM;
        }
    }
    return 0;
}

/* Stops taking requests, lets the apply in progress finish, logs the counters. */
static void stop_serving(server_daemon *d)
{
    log_info("stopping: no new requests; finishing the apply in progress");
    ps_server_stop(d->srv);
    ps_server_stop(d->backup);
    ps_stat st;
    ps_server_stat(d->srv, &st);
    log_info("stopped: %lld steps done, %lld pushes applied, %lld row updates, %lld bad requests",
             (long long)st.steps_done, (long long)st.pushes_applied, (long long)st.rows_applied,
             (long long)st.bad_requests);
}

/* Training is over (exit 0): server 0 broadcasts the shutdown and every server leaves the run in order, once.
 * Said before the shard's last snapshot is waited for (stop_serving): that wait sends no heartbeat and may
 * outlast the rendezvous' silence limit (8 GB at 0.7 GB/s), which would report this member lost. */
static void say_done(server_daemon *d)
{
    if (d->left)
        return;
    d->left = 1;
    if (d->rv)
        ctl_rendezvous_broadcast_shutdown(d->rv);
    if (d->sess)
        ctl_session_leave(d->sess); /* an orderly stop: not reported to the others as a lost member */
}

/* Leaves the run and releases what start-up took; returns exit_code (does not return after a clean stop of
 * a started shard). */
static int finish(server_daemon *d, int exit_code)
{
    /* The shutdown broadcast is an orderly stop: members that get it stop and exit 0. When server 0 fails
     * (its own join timed out because a member never came, the shard does not fit, ...) the rendezvous just
     * closes, so that the other members stop with an error instead of reporting a clean stop. */
    if (exit_code == 0)
        say_done(d);
    /* A failure of this server's own (its shard, pretrained_centers, a checkpoint it cannot load): the other
     * members are told its error message, not only that it went. */
    if (d->sess && exit_code != 0 && exit_code != DAEMON_EXIT_REFORM) {
        char why[512];
        log_last_error(why, sizeof why);
        if (d->rv)
            ctl_rendezvous_member_failed(d->rv, CTL_ROLE_SERVER, d->rank, why);
        else
            ctl_session_fail(d->sess, why);
    }
    if (d->sess)
        ctl_session_close(d->sess);
    if (d->rv)
        ctl_rendezvous_stop(d->rv);
    /* The shard is stopped and every apply finished: leave with the endpoint open (daemon_exit_now). */
    if (d->srv && (exit_code == 0 || exit_code == DAEMON_EXIT_REFORM))
        daemon_exit_now(exit_code);
    ps_server_destroy(d->srv);
    ps_server_destroy(d->backup);
    fab_close(d->fab);
    fab_close(d->fab_backup);
    free(d->ini);
    return exit_code;
}

int main(int argc, char **argv)
{
    static server_daemon d;
    daemon_start("server", &g_stop);
    int rc = parse_args(argc, argv, &d);
    if (rc != 0)
        return rc == CLI_HELP ? 0 : 1;
    if (daemon_metrics_start(&d.cfg, "server", (int)d.rank) < 0)
        return 1;
    int exit_code = 1;
    rc = join_run(&d);
    if (rc == 1) {
        exit_code = 0; /* stopped before the run formed */
    } else if (rc == 2) {
        exit_code = DAEMON_EXIT_REFORM; /* answered with a member's loss: the run re-forms */
    } else if (rc == 0 && start_serving(&d) == 0) {
        exit_code = serve_until_stop(&d);
        if (exit_code == 0)
            say_done(&d);
        stop_serving(&d);
    } else if (rc == 0 && g_stop) {
        /* SIGTERM/SIGINT while starting to serve (a rejoining server stopped before it held a copy, a fill
         * cut short): a stop asked for, as before the run formed. */
        log_info("stopped on request before this server served");
        exit_code = 0;
    }
    return finish(&d, exit_code);
}
