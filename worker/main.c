/* pfcps-worker: one training process (one GPU in production: device = cuda; or the CPU device).
 *
 *   pfcps-worker --config FILE --rank W [--set key=value ...] [--max-steps N] [--trace FILE [--trace-batch]]
 *                [--dump-centers PREFIX] [--keep-generations]
 *
 * Start-up: the metrics endpoint when metrics_address is set (docs/metrics.md; reported at join), open the
 * two fabric endpoints (towards the servers; for the workers' ring collectives), join
 * the run at `rendezvous` as (worker, W), take the run config from the address book (every process
 * trains with the same config: the one server 0 was started with), then train (worker/train.h). After the
 * last step (replicas = 1) every shard's serving copy is told this worker is done (ps_client_done).
 * SIGTERM / SIGINT: every worker stops after the step in progress (they agree through an allreduce),
 * exit 0. Exit 1 on a start-up or training error, with the message on stderr. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/ckpt.h"
#include "common/cli.h"
#include "common/config.h"
#include "common/ctl.h"
#include "common/daemon.h"
#include "common/err.h"
#include "common/fabric.h"
#include "common/file.h"
#include "common/log.h"
#include "common/metrics.h"
#include "worker/model/model.h"
#include "worker/ps_client.h"
#include "worker/resume.h"
#include "worker/train.h"

/* Set by SIGTERM / SIGINT (daemon_signals_install) and by the control watcher; int on glibc, so it is also
 * train_opts.stop_flag. */
static volatile sig_atomic_t g_stop;

/* Watches the control connection while training runs. Failover notices (replicas = 1; server 0's own, when
 * its connection closes and the shards keep a copy: ctl_session_survive_rendezvous_loss) go to the client
 * and the trainer. A shutdown (server 0 stops: SIGTERM, or a fatal error), a lost member, or a lost server 0
 * the run cannot go on without: ask for a clean stop at the next step boundary, and if the step in progress
 * cannot finish (its servers are gone) within `grace_s`, leave with an error instead of waiting out the
 * data-plane timeouts. */
typedef struct ctl_watch {
    ctl_session *sess;
    trainer *t; /* replicas = 1: its client is told of failovers (ps_client_server_lost) */
    volatile int done;
    int broken; /* __atomic: a member was lost or the control connection broke: the run did not complete */
    int interrupt;       /* __atomic; fab_set_interrupt's flag: raised when the run broke, so that the waits of
                            the step in progress (pulls, pushes, ring collectives) give up at once */
    double grace_s;
    int replaces; /* the run replaces lost workers in place (cfg_replaces_workers) */
    int rank;     /* this worker's rank */
} ctl_watch;

/* How long one wait of the watcher lasts: the longest it takes to see `done` once training ended, which the
 * worker's exit waits for (pthread_join). */
#define WATCH_POLL_S 0.02

static void *ctl_watch_main(void *arg)
{
    ctl_watch *w = arg;
    while (!w->done) {
        int r = ctl_session_wait_shutdown(w->sess, WATCH_POLL_S);
        if (r == 0)
            continue;
        if (w->done)
            break;
        if (r == 2) {
            /* replicas = 1: a server was lost and its shards go on on their other copies, or a restarted
             * server rejoins (the trainer takes those notices). */
            int lost = -1;
            const char *text = "";
            uint32_t epoch = ctl_session_failover(w->sess, &lost, &text);
            const uint8_t *addr = NULL;
            size_t alen = 0;
            int kind = ctl_session_failover_kind(w->sess, NULL, &addr, &alen);
            ps_client *pc = train_ps_client(w->t);
            if (pc) /* whether a rendezvous decides the failovers from here on (ps_client_set_rendezvous) */
                ps_client_set_rendezvous(pc, !ctl_session_orphaned(w->sess));
            if (kind == CTL_FO_WORKER_LOST || kind == CTL_FO_REDO || kind == CTL_FO_RUN_ENDED) {
                int64_t step = 0;
                ctl_session_failover_kind(w->sess, &step, NULL, NULL);
                int taken = train_replace_notice(w->t, kind, lost, epoch, step);
                if (taken == 2) {
                    /* This worker passed the end vote: every final output is written, nothing to redo. */
                    log_info("after the end vote (epoch %u): %s", epoch, text);
                    continue;
                }
                if (kind == CTL_FO_WORKER_LOST)
                    log_warn("worker lost (epoch %u): %s", epoch, text);
                else if (kind == CTL_FO_RUN_ENDED)
                    log_warn("run ended (epoch %u): %s", epoch, text);
                if (taken) {
                    /* End the step's waits now (a run-ended notice: the end vote's ring receive from the
                     * worker lost after the others passed it). */
                    if (kind == CTL_FO_WORKER_LOST || kind == CTL_FO_RUN_ENDED)
                        __atomic_store_n(&w->interrupt, 1, __ATOMIC_RELEASE);
                } else if (kind == CTL_FO_WORKER_LOST && w->replaces) {
                    /* Still in the set-up (no step start kept yet): this worker cannot redo a step, so the
                     * replacement cannot happen; say so at once instead of leaving the rendezvous to wait
                     * ctl_timeout for a report that its set-up (blocked on the lost worker) never sends. */
                    log_warn("worker lost before this worker's first step began: it has no step to redo (the "
                             "run re-forms)");
                    if (ctl_session_report(w->sess, CTL_FO_NO_REDO, w->rank, epoch, 0, NULL, 0) < 0 &&
                        !ctl_session_orphaned(w->sess))
                        log_error("worker replacement: %s", pf_errmsg());
                }
                continue;
            }
            if (kind != CTL_FO_LOST) {
                log_warn("%s (epoch %u): %s", kind == CTL_FO_REJOINED ? "rejoined" : "rejoin", epoch, text);
                if (pc)
                    ps_client_set_epoch(pc, epoch);
                train_rejoin_notice(w->t, kind, lost, epoch, addr, alen);
                continue;
            }
            log_warn("failover (epoch %u): %s", epoch, text);
            if (pc && ps_client_server_lost(pc, lost, epoch) < 0)
                log_error("failover: %s", pf_errmsg());
            continue;
        }
        if (r == -ETIMEDOUT && w->replaces) {
            /* The rendezvous removed this worker for its silence (it was stopped or cut off) and the run goes
             * on without it: a new process of this rank joins as its replacement. Nothing of this one is of
             * use any more (the others redo from a step before its last one), so it exits now. */
            log_error("removed from the run (%s), which replaces lost workers in place: exiting %d so that the "
                      "supervisor starts this worker again alone (it then joins as its own replacement)",
                      pf_errmsg(), DAEMON_EXIT_REPLACED);
            log_close_file();
            _exit(DAEMON_EXIT_REPLACED);
        }
        /* Said before the interrupt below: the training thread then fails at once and the process may exit
         * before this thread logs anything more. */
        if (r == 1)
            log_error("the rendezvous (server 0) shut the run down: stopping");
        else if (r == -ENOLINK)
            log_error("%s: the run cannot go on without it: stopping", pf_errmsg());
        else
            log_error("lost the control connection to server 0 (%s): stopping", pf_errmsg());
        if (r != 1) {
            /* A member was lost (or server 0 with the control connection): the servers stop for the re-form,
             * so the step in progress cannot finish. End its waits now instead of after the grace. */
            __atomic_store_n(&w->broken, 1, __ATOMIC_RELEASE);
            __atomic_store_n(&w->interrupt, 1, __ATOMIC_RELEASE);
        }
        g_stop = 1;
        for (int i = 0; i < (int)(w->grace_s * 10) && !w->done; i++)
            usleep(100000);
        if (!w->done) {
            /* Stopped on request (SIGTERM / SIGINT, e.g. the whole job stopped at once) while a server also
             * left: the step in progress cannot finish, but the stop was asked for, so it is not a failure. */
            int asked = daemon_signalled();
            int code = asked ? 0 : __atomic_load_n(&w->broken, __ATOMIC_ACQUIRE) ? DAEMON_EXIT_REFORM : 1;
            log_error("the step in progress did not finish within %.0f s of the run's shutdown: exiting %d%s",
                      w->grace_s, code, asked ? " (a stop was requested)" : "");
            log_close_file();
            _exit(code);
        }
        break;
    }
    return NULL;
}

static const char usage[] =
    "usage: pfcps-worker --config FILE --rank W [--set key=value ...]\n"
    "  --rank W              this worker's rank in [0, workers)\n"
    "  --max-steps N         stop after N global steps (default: num_epoch epochs)\n"
    "  --trace FILE          write every step's loss and learning rate to FILE\n"
    "  --trace-batch         with --trace: each line also lists the batch's record keys and flips and this\n"
    "                        worker's sampled class ids\n"
    "  --dump-centers PREFIX after training, write this worker's class centers to PREFIX.rank<W>\n"
    "  --keep-generations    keep the state at the start of the current and the previous step in device\n"
    "                        memory (in-place recovery: worker/generation.h); costs a copy per step\n";

/* What main's steps share. */
typedef struct worker_daemon {
    pf_config cfg; /* this process' config: file and --set */
    pf_config run; /* the run's config, from the address book (server 0's) */
    long rank;
    train_opts topts;
    const char *secret;
    char host[256]; /* rendezvous host and port */
    int port;
    trainer *t;
    ctl_session *sess;
    snapfile_key key; /* the checkpoint key, from the join secret (its .snap files carry its HMAC) */
} worker_daemon;

static int parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi)
        return -EINVAL;
    *out = v;
    return 0;
}

/* The command line: the shared options, then this program's; checks the member settings (rank range,
 * secret, rendezvous address). Returns 0, CLI_HELP, or -1 after logging the error. */
static int parse_args(int argc, char **argv, worker_daemon *d)
{
    int rest = 0;
    int rc = daemon_parse_common(argc, argv, &d->cfg, usage, &rest);
    if (rc != 0)
        return rc;
    long rank = -1, max_steps = 0;
    d->topts = (train_opts){.stop_flag = &g_stop};
    for (int i = 1; i < rest; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < rest ? argv[i + 1] : NULL;
        if (!strcmp(a, "--rank") && v && parse_long(v, 0, 1000000, &rank) == 0) {
            i++;
        } else if (!strcmp(a, "--max-steps") && v && parse_long(v, 1, 1L << 40, &max_steps) == 0) {
            i++;
        } else if (!strcmp(a, "--trace") && v) {
            d->topts.trace_path = v;
            i++;
        } else if (!strcmp(a, "--trace-batch")) {
            d->topts.trace_batch = 1;
        } else if (!strcmp(a, "--keep-generations")) {
            d->topts.keep_generations = 1;
        } else if (!strcmp(a, "--dump-centers") && v) {
            d->topts.dump_centers = v;
            i++;
        } else {
            log_error("bad or unknown argument '%s'%s%s\n%s", a, v ? " " : "", v ? v : "", usage);
            return -1;
        }
    }
    d->rank = rank;
    d->topts.rank = (int)rank;
    d->topts.max_steps = max_steps;
    if (daemon_member_check(&d->cfg, "worker", rank, d->cfg.workers, "workers", d->host, sizeof d->host,
                            &d->port, &d->secret, usage) < 0)
        return -1;
    d->topts.secret = d->secret;
    return 0;
}

/* Can `dir` be created (mkdir -p) and written? A probe file is created and removed. Returns 0 or -errno with
 * a message naming `key`, the path and the error (a read-only folder or file system, a path under a regular
 * file, no permission). */
static int check_writable_dir(const char *key, const char *dir)
{
    char buf[CFG_STR + 64];
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) < 0 && errno != EEXIST)
            return pf_err(-errno, "config key '%s': cannot create '%s' (for '%s'): %s", key, buf, dir,
                          strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) < 0 && errno != EEXIST)
        return pf_err(-errno, "config key '%s': cannot create the folder '%s': %s", key, dir,
                      strerror(errno));
    snprintf(buf, sizeof buf, "%s/.pfcps-write-probe.%d", dir, (int)getpid());
    int fd = pf_open_output(buf, O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return pf_err_wrap(fd, "config key '%s': cannot write in the folder '%s'", key, dir);
    int rc = write(fd, "probe\n", 6) == 6 ? 0 : -(errno ? errno : ENOSPC);
    if (close(fd) < 0 && rc == 0)
        rc = -errno;
    unlink(buf);
    if (rc < 0)
        return pf_err(rc, "config key '%s': cannot write in the folder '%s': %s", key, dir, strerror(-rc));
    return 0;
}

/* Rank 0 writes <output> (training.log, model.ckpt, tensorboard/): checked before the run forms, so that a
 * read-only folder stops this worker at once instead of failing at the first checkpoint after an epoch. The
 * servers write snapshot_dir once snapshots exist (snapshot_every > 0; not built yet): checked then too,
 * here, where the launcher runs every process on one host. Returns 0 or -1 after logging. */
static int check_outputs(const pf_config *cfg)
{
    if (check_writable_dir("output", cfg->output) < 0) {
        log_error("%s", pf_errmsg());
        return -1;
    }
    if (cfg->snapshot_dir[0] && cfg->snapshot_every > 0 &&
        check_writable_dir("snapshot_dir", cfg->snapshot_dir) < 0) {
        log_error("%s", pf_errmsg());
        return -1;
    }
    return 0;
}

/* The network name, the device and (rank 0) the output folders are checked before joining, so a typo, a
 * missing GPU or a read-only output stops this worker at once with the key named instead of after the whole
 * run has formed. Returns 0 or -1 after logging. */
static int check_local(const worker_daemon *d)
{
    const pf_config *cfg = &d->cfg;
    model_desc desc;
    if (model_desc_from_name(&desc, cfg->network, cfg->embedding_size) < 0) {
        log_error("config key 'network': %s", pf_errmsg());
        return -1;
    }
    /* device = cuda without the CUDA device in this binary or without a GPU stops here. */
    train_device_info dinfo;
    if (train_device_resolve(cfg, &dinfo) < 0) {
        log_error("%s", pf_errmsg());
        return -1;
    }
    log_info("device %s (config device = %s%s%s), precision %s", dinfo.name, cfg->device,
             cfg->fp16 ? ", fp16" : "", cfg->bf16 ? ", bf16" : "", dinfo.precision);
    return d->rank == 0 ? check_outputs(cfg) : 0;
}

/* ckpt_step_check for this worker: its own .model and .snap files of the step verified, HMAC included, and
 * agreeing on the run identity (wresume_check). */
static int worker_step_usable(const char *root, int64_t step, void *arg, ckpt_ident *id)
{
    const worker_daemon *d = arg;
    int r = 0, W0 = 0;
    return wresume_check(root, step, (int)d->rank, d->cfg.workers, &d->key, &r, &W0, id);
}

/* Opens the two fabric endpoints and joins the run at the rendezvous (retrying through ctl_timeout), taking
 * the run config from the address book. Returns 0 joined, 1 stopped before the run formed (a normal stop),
 * or -1 (logged). */
static int join_run(worker_daemon *d)
{
    uint8_t addr[CTL_MAX_ADDR];
    size_t alen = sizeof addr;
    int brc = daemon_bind_data_plane(&d->cfg, d->host, d->port);
    if (brc == -EINTR)
        return 1; /* stopped while the rendezvous name did not resolve yet: a normal stop */
    if (brc < 0)
        return -1;
    if (train_open_endpoints(&d->t, &d->cfg, (int)d->rank, addr, &alen) < 0) {
        log_error("%s", pf_errmsg());
        return -1;
    }
    if (snapfile_key_derive(d->secret, &d->key) < 0) {
        log_error("%s", pf_errmsg());
        return -1;
    }
    char who[32];
    snprintf(who, sizeof who, "worker %ld", d->rank);
    if (daemon_list_resume_steps(&d->cfg, "worker", who, worker_step_usable, d) < 0)
        return -1;
    log_info("fabric provider %s; joining the run at %s:%d", d->cfg.provider, d->host, d->port);
    int rc = daemon_join(&d->cfg, d->host, d->port, CTL_ROLE_WORKER, (int)d->rank, addr, alen, d->secret, "",
                         0, &d->sess, &d->run);
    return rc < 0 ? -1 : rc;
}

/* Takes the run config from the book: warns about local keys it overrides, logs it (rank 0), and refuses
 * keys that arcface_torch configs carry but this build does not implement where ignoring them silently would
 * do harm (docs/configuration.md marks them). Returns 0 or -1 after logging. */
static int accept_run_config(worker_daemon *d)
{
    const ctl_book *book = ctl_session_book(d->sess);
    pf_config *run = &d->run;
    log_info("joined: %d servers, %d workers", book->num_servers, book->num_workers);
    daemon_warn_unused_local_keys("worker", &d->cfg, run);
    /* The secret never travels, so the run config from the book has none: show where this worker's came from.
     */
    snprintf(run->secret, sizeof run->secret, "%s", d->cfg.secret);
    if (d->rank == 0)
        cfg_log(run);
    /* The run's output is server 0's: checked again where it differs from this worker's own (checked before
     * joining), before any training. */
    if (d->rank == 0 &&
        (strcmp(run->output, d->cfg.output) != 0 || strcmp(run->snapshot_dir, d->cfg.snapshot_dir) != 0 ||
         run->snapshot_every != d->cfg.snapshot_every) &&
        check_outputs(run) < 0)
        return -1;
    if (book->resume_reason[0])
        log_info("checkpoints: %s", book->resume_reason);
    if (run->save_all_states && d->rank == 0)
        log_warn("save_all_states = true: adds nothing here; everything a resume needs (backbone, optimizer, "
                 "class "
                 "centers) is checkpointed every snapshot_every steps (now %d%s)",
                 run->snapshot_every, run->snapshot_every ? "" : ": off");
    return 0;
}

static int train_outcome(const worker_daemon *d, int broken, int rc_train);
static void tell_servers_done(worker_daemon *d);

/* Trains (worker/train.h) with the control watcher running beside. Returns 0 when the run ended or was
 * stopped on request (the servers are then told this worker is done: tell_servers_done), DAEMON_EXIT_REFORM
 * (logged) when a member of the run was lost, 1 (logged) on a training error. */
static int train_watched(worker_daemon *d)
{
    ctl_watch watch = {.sess = d->sess, .t = d->t, .grace_s = 10, .rank = (int)d->rank};
    if (d->run.replicas) { /* the rendezvous removes members silent for ctl_member_silence_s: heartbeat often */
        ctl_session_set_heartbeat(d->sess, ctl_member_silence_s(d->run.ctl_timeout) / 8);
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
    /* A lost worker is replaced in place: every worker keeps the state of its last two step starts. */
    char why[64];
    if (cfg_replaces_workers(&d->run, why, sizeof why))
        d->topts.keep_generations = watch.replaces = 1;
    else if (d->run.replicas && d->rank == 0)
        log_info("a lost worker re-forms the run from its checkpoint (%s: no replacement in place)", why);
    fab_set_interrupt(&watch.interrupt);
    pthread_t watcher;
    int watching = pthread_create(&watcher, NULL, ctl_watch_main, &watch) == 0;
    d->topts.sess = d->sess;
    d->topts.interrupt = &watch.interrupt;
    int rc_train = train_setup(d->t, &d->run, ctl_session_book(d->sess), &d->topts);
    if (rc_train == 0)
        rc_train = train_run(d->t);
    /* The verdict is the training's: a loss told while the servers are told below (the outputs written) does
     * not turn a finished run into a failed one. */
    int code = train_outcome(d, __atomic_load_n(&watch.broken, __ATOMIC_ACQUIRE), rc_train);
    /* The watcher still runs while the servers are told: a server lost meanwhile is failed over (the done notice
     * goes to its shard's other copy) and the heartbeats go on (the rendezvous would remove a silent worker). */
    if (code == 0)
        tell_servers_done(d);
    if (watching) {
        watch.done = 1;
        pthread_join(watcher, NULL);
    }
    fab_set_interrupt(NULL);
    return code;
}

/* train_watched's exit code from the training's result rc_train and whether the control watcher saw the run
 * break (`broken`); logs why when it is not 0. */
static int train_outcome(const worker_daemon *d, int broken, int rc_train)
{
    if (rc_train < 0 && broken && daemon_signalled()) {
        /* Asked to stop (SIGTERM, as when a whole job is stopped at once) while a member also left: the step
         * in progress broke with it, but the stop was requested, as in the watcher's grace. */
        log_info(
            "stopped on request while a member of the run also left (the step in progress did not finish: "
            "%s): exiting 0",
            pf_errmsg());
        return 0;
    }
    if (rc_train < 0) {
        log_error("%s", pf_errmsg());
        if (!broken && d->run.replicas && ctl_session_server_lost(d->sess, 0)) {
            log_error("training failed while server 0 and its rendezvous are lost (no restarted rendezvous said a "
                      "member was lost and replaced): exiting %d so that the run can re-form from its newest "
                      "complete checkpoint",
                      DAEMON_EXIT_REFORM);
            return DAEMON_EXIT_REFORM;
        }
        if (broken) {
            log_error("a member of the run was lost: exiting %d so that the run can re-form from its newest "
                      "complete checkpoint (restart every member with resume = true)",
                      DAEMON_EXIT_REFORM);
            return DAEMON_EXIT_REFORM;
        }
        return 1;
    }
    if (broken && !daemon_signalled()) {
        /* The step in progress finished (e.g. a server stopped by SIGTERM answered it first), but a member
         * is gone: the run stopped short of its end, which is a failure, not a requested stop. (When this
         * worker was itself asked to stop, as when a whole job is stopped at once, it is a requested stop.)
         */
        log_error(
            "training stopped early: a member of the run was lost (see above); exiting %d so that the run "
            "can re-form from its newest complete checkpoint",
            DAEMON_EXIT_REFORM);
        return DAEMON_EXIT_REFORM;
    }
    return 0;
}

/* Closes the control session; after a clean end leaves at once (does not return), else releases the
 * trainer and returns exit_code. */
static int finish(worker_daemon *d, int exit_code)
{
    if (d->sess)
        ctl_session_close(d->sess);
    if (exit_code == 0)
        daemon_exit_now(0); /* training is over and its outputs are written: leave the endpoints open */
    train_close(d->t);
    log_close_file();
    return exit_code;
}

/* replicas = 1: after the last step, tells every shard's serving copy that this worker is done
 * (ps_client_done), so that servers which lost the rendezvous with server 0 (now, or later than this worker
 * left it) stop when every worker did; with the rendezvous the shutdown does that too. A failure is logged
 * only: the outputs are written. */
static void tell_servers_done(worker_daemon *d)
{
    ps_client *pc = d->run.replicas ? train_ps_client(d->t) : NULL;
    if (!pc)
        return;
    if (ps_client_done(pc, d->run.ctl_timeout > 0 ? d->run.ctl_timeout : 30) < 0)
        log_warn("%s", pf_errmsg());
    else if (ctl_session_orphaned(d->sess))
        log_info("told every live server this worker is done (the rendezvous is lost with server 0)");
}

int main(int argc, char **argv)
{
    static worker_daemon d;
    daemon_start("worker", &g_stop);
    int rc = parse_args(argc, argv, &d);
    if (rc != 0)
        return rc == CLI_HELP ? 0 : 1;
    if (daemon_metrics_start(&d.cfg, "worker", (int)d.rank) < 0)
        return 1;
    if (check_local(&d) < 0)
        return 1;
    int exit_code = 1;
    rc = join_run(&d);
    if (rc == 1) {
        exit_code = 0; /* stopped before the run formed */
    } else if (rc == 2) {
        exit_code = DAEMON_EXIT_REFORM; /* answered with a member's loss: the run re-forms */
    } else if (rc == 0 && accept_run_config(&d) == 0 && (exit_code = train_watched(&d)) == 0) {
        /* Done (or stopped on request) in order: say so, so that the rendezvous does not report us lost. */
        ctl_session_leave(d.sess);
    }
    return finish(&d, exit_code);
}
