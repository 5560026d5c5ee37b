/* pfcps._C: one pfcps worker inside a Python process, over the C worker's own code (no second implementation
 * of the wire protocol): the control-plane join (common/cli.h cli_join_run, as pfcps-worker and
 * bench/scale/scale_worker join), the two data-plane endpoints (worker/train_net.h: the parameter-server
 * client and the collectives ring among the workers), the sampler and the CPU head (worker/head/pfc.h:
 * pfc_sample, pfc_step), and the pull / push of worker/ps_client.h. pfcps/torch.py builds PartialFC on it.
 *
 * Life cycle: Worker(config, rank, world_size, ...) loads the config and checks it locally (nothing is sent);
 * join(resume_step, ident) joins the run, listing resume_step as the one checkpoint this member can resume
 * from (as pfcps-worker lists the steps of its files), and refuses a run that resumed another step.
 *
 * One step, as worker/train.c's train_step does it for the head path:
 * - Worker.forward(emb, labels, grad_emb): the previous step's push (queued by backward), then pfc_sample
 *   (labels allgathered over the ring), ps_pull + ps_wait, pfc_step (embeddings allgathered, head forward +
 *   backward, the embedding gradient reduce-scattered back); returns the global mean loss and writes
 *   dL/d(this rank's embeddings) into grad_emb;
 * - Worker.pull(labels): the same up to the pull, for a head computed by the caller (rows(),
 *   labels_local(); the rows' gradient goes into grad_rows());
 * - Worker.backward(lr): queues the push of the sampled rows' gradients with lr; it goes to the servers at
 *   the next forward, pull, checkpoint or close, so that checkpoint() can still flag it PS_PUSH_SNAPSHOT;
 * - Worker.skip(): ends a forward that gets no backward with an empty push flagged PS_PUSH_SKIPPED, so the
 *   step clock moves on (the servers leave the table as it was);
 * - Worker.drop_queued(): the queued push of a step whose optimizer step did not run (GradScaler) becomes an
 *   empty push flagged PS_PUSH_SKIPPED;
 * - Worker.checkpoint(): sends the queued push flagged PS_PUSH_SNAPSHOT (the servers snapshot their shards
 *   as checkpoint `step`) and returns that step.
 * Under replicas = 1 the control watcher follows a lost server's failover (ps_client_server_lost) and a
 * restarted server's rejoin, in which the ranks agree at a step's start (step_rejoin) and hold for its copy
 * (worker/rejoin.h, the code pfcps-worker runs).
 *
 * Errors raise pfcps.PfcpsError (a RuntimeError) carrying pf_errmsg() and the negative code in .code. A
 * failure after the step's pull was posted leaves the worker broken (every later call raises, naming the
 * first error): its step clock can no longer match the servers'. Errors before anything was sent (a label
 * outside [0, C), a batch of another size) leave it usable. The blocking calls release the GIL. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cli.h"
#include "common/ckpt.h"
#include "common/clock.h"
#include "common/coll.h"
#include "common/config.h"
#include "common/ctl.h"
#include "common/ctl_book.h"
#include "common/daemon.h"
#include "common/err.h"
#include "common/fabric.h"
#include "common/log.h"
#include "common/torch_ckpt.h"
#include "proto/ps_wire.h"
#include "worker/head/pfc.h"
#include "worker/ps_client.h"
#include "worker/rejoin.h"
#include "worker/train_net.h"

static PyObject *PfcpsError;

/* Raises PfcpsError(msg) with .code = code (a negative errno). Returns NULL. */
static PyObject *raise_code(int code, const char *msg)
{
    if (PyErr_Occurred())
        return NULL; /* an exception a signal handler raised during the call (py_signalled) goes first */
    PyObject *exc = PyObject_CallFunction(PfcpsError, "s", msg);
    if (!exc)
        return NULL;
    PyObject *c = PyLong_FromLong(code);
    if (c) {
        PyObject_SetAttrString(exc, "code", c);
        Py_DECREF(c);
    }
    PyErr_SetObject(PfcpsError, exc);
    Py_DECREF(exc);
    return NULL;
}

/* The thread that imported the module (the main thread: Python runs signal handlers there only). */
static pthread_t g_main_thread;

/* Runs Python's signal handlers from a wait that runs without the GIL (a join's tick, a pull's or push's
 * slice): 1 when one raised (KeyboardInterrupt on Ctrl-C; the exception stays set, so that the call returns
 * it: raise_code keeps it), else 0. Only in the main thread (others: 0, without taking the GIL). */
static int py_signalled(void)
{
    if (!pthread_equal(pthread_self(), g_main_thread))
        return 0;
    PyGILState_STATE g = PyGILState_Ensure();
    int raised = PyErr_CheckSignals() < 0;
    PyGILState_Release(g);
    return raised;
}

typedef struct {
    PyObject_HEAD
    pf_config cfg; /* this process' config: the file, then the overrides */
    pf_config run; /* the run's config (server 0's), from the rendezvous */
    char host[256];
    int port;
    char secret[CFG_STR];
    int rank, world_size;
    train_net net;
    ctl_session *sess;
    int joined;
    /* the control watcher (ctl_session_wait_shutdown every 0.5 s: heartbeats, the shutdown, a lost member) */
    pthread_t watcher;
    int watching;
    int watch_done; /* __atomic */
    int broken;     /* __atomic: the watcher saw the run end or break; broken_msg says how */
    char broken_msg[PF_ERRMSG_MAX];
    /* the head */
    pfc x;
    int head_ready;
    float *centers, *grad_centers; /* (k_max, D) */
    int host_head;                 /* 1: pfc_step runs here (forward); 0: the caller's head (pull) */
    int64_t step;                  /* the step of the next forward (0-based global step) */
    int pending;                   /* forward of `step` done, its backward not yet */
    int nonfinite;                 /* the pending step's loss is not finite: its push goes empty, skipped */
    int queued;                    /* the push of step - 1 is queued (backward or skip), not sent yet */
    double queued_lr;
    uint32_t queued_flags; /* PS_PUSH_SKIPPED for a skipped step */
    int64_t snap_step;     /* the last checkpoint step requested (PS_PUSH_SNAPSHOT), -1: none */
    int64_t resume_step;   /* the checkpoint step the run resumed (the book's), 0: from scratch */
    int64_t start_step;    /* the first step of this run: resume_step, or pretrained_centers' global_step */
    ckpt_ident ident;      /* the run identity of this run's checkpoint files (run id, seed, config digest) */
    char join_msg[2048];   /* join's refusal of the resume step (the rendezvous's reason is up to 1 KiB) */
    int64_t last_k;
    double phase_s[4]; /* the last step's sample, pull, head (forward) and push (backward) wall seconds */
    int failed;        /* a step failed after its pull was posted: failed_msg */
    char failed_msg[2 * PF_ERRMSG_MAX + 128];
    rejoin_state
        rj; /* a failed-over server's rejoin (replicas = 1): the watcher's notices, the agreed copy */
} Worker;

static void *watch_main(void *arg)
{
    Worker *w = arg;
    while (!__atomic_load_n(&w->watch_done, __ATOMIC_ACQUIRE)) {
        int r = ctl_session_wait_shutdown(w->sess, 0.02); /* how long the close waits for watch_done seen */
        if (r == 0)
            continue;
        if (__atomic_load_n(&w->watch_done, __ATOMIC_ACQUIRE))
            break;
        if (r == 2) {
            /* replicas = 1: a server was lost and its shards go on on their other copies (the client retires
             * its messages to the lost copies and sends the rest to the others, as pfcps-worker's). */
            int lost = -1;
            const char *text = "";
            uint32_t epoch = ctl_session_failover(w->sess, &lost, &text);
            const uint8_t *addr = NULL;
            size_t alen = 0;
            const int kind = ctl_session_failover_kind(w->sess, NULL, &addr, &alen);
            if (kind == CTL_FO_RUN_ENDED) {
                /* Sent only to runs whose workers vote at the end (pfcps-worker's): nothing to do. */
                log_info("%s (epoch %u)", text, epoch);
                continue;
            }
            if (kind == CTL_FO_WORKER_LOST || kind == CTL_FO_REDO) {
                /* A lost worker replaced in place needs every worker to go back to a common step (pfcps-worker
                 * keeps two generations of its state); a torch script's own state is not pfcps's to restore,
                 * so this worker stops: the rendezvous falls back to the checkpoint re-form. */
                snprintf(w->broken_msg, sizeof w->broken_msg,
                         "%s (epoch %u); pfcps.torch does not take part in a worker's replacement in place: the "
                         "run re-forms from its checkpoint",
                         text, epoch);
                log_error("%s", w->broken_msg);
                __atomic_store_n(&w->broken, 1, __ATOMIC_RELEASE);
                break;
            }
            if (kind != CTL_FO_LOST) {
                /* A restarted server's rejoin: the ranks agree on its copy's checkpoint step at a step's
                 * start (step_begin), as pfcps-worker's ranks do in their stop vote. */
                log_warn("%s (epoch %u): %s", kind == CTL_FO_REJOINED ? "rejoined" : "rejoin", epoch, text);
                if (w->net.ps) {
                    ps_client_set_rendezvous(w->net.ps, !ctl_session_orphaned(w->sess));
                    ps_client_set_epoch(w->net.ps, epoch);
                }
                rejoin_notice(&w->rj, kind, lost, epoch, addr, alen);
                continue;
            }
            log_warn("failover (epoch %u): %s", epoch, text);
            if (!w->net.ps)
                log_error("failover before this worker's connections were open: server %d's copies were never "
                          "used here", lost);
            else if (ps_client_set_rendezvous(w->net.ps, !ctl_session_orphaned(w->sess)),
                     ps_client_server_lost(w->net.ps, lost, epoch) < 0)
                log_error("failover: %s", pf_errmsg());
            continue;
        }
        if (r == 1)
            snprintf(w->broken_msg, sizeof w->broken_msg,
                     "the rendezvous (server 0) shut the run down: this worker cannot train on");
        else if (r == -ENOLINK)
            snprintf(w->broken_msg, sizeof w->broken_msg, "%s: the run cannot go on without it", pf_errmsg());
        else
            snprintf(w->broken_msg, sizeof w->broken_msg, "lost the control connection to server 0 (%s)",
                     pf_errmsg());
        log_error("%s", w->broken_msg);
        __atomic_store_n(&w->broken, 1, __ATOMIC_RELEASE);
        break;
    }
    return NULL;
}

/* 0, or raises (and returns -1) when the worker cannot take another call. */
static int check_usable(Worker *w)
{
    if (!w->joined)
        return raise_code(-EINVAL, "pfcps worker: not joined (closed, or its join failed)") ? 0 : -1;
    if (w->failed)
        return raise_code(-EPIPE, w->failed_msg) ? 0 : -1;
    if (__atomic_load_n(&w->broken, __ATOMIC_ACQUIRE)) {
        char msg[sizeof w->broken_msg + 64];
        snprintf(msg, sizeof msg, "pfcps worker: %s", w->broken_msg);
        return raise_code(-ENOLINK, msg) ? 0 : -1;
    }
    return 0;
}

/* Marks the worker broken by error rc (pf_errmsg) and raises it. A data-plane error is often the first sign
 * of a member that failed, whose own message reaches the control watcher a moment later: for such an error
 * (-ECOMM, -ECANCELED, -ETIMEDOUT, a connection refused or reset) that report, up to 1 s later, is added, so the
 * error says why. */
static PyObject *fail_step(Worker *w, int rc, const char *what)
{
    char err[PF_ERRMSG_MAX];
    snprintf(err, sizeof err, "%s", pf_errmsg());
    int comm = rc == -ECOMM || rc == -ECANCELED || rc == -ETIMEDOUT || rc == -ECONNRESET || rc == -ECONNREFUSED;
    for (int i = 0; comm && i < 20 && !__atomic_load_n(&w->broken, __ATOMIC_ACQUIRE); i++)
        usleep(50000);
    if (rc != -ENOLINK && __atomic_load_n(&w->broken, __ATOMIC_ACQUIRE))
        snprintf(w->failed_msg, sizeof w->failed_msg, "pfcps worker: step %lld, %.60s: %.200s (%s)",
                 (long long)w->step, what, err, w->broken_msg);
    else
        snprintf(w->failed_msg, sizeof w->failed_msg, "pfcps worker: step %lld, %.60s: %s", (long long)w->step,
                 what, err);
    w->failed = 1;
    return raise_code(rc, w->failed_msg);
}

/* Worker(config, rank, world_size, sets=(), num_classes=0, embedding_size=0): loads `config` (a pfcps INI
 * file) with the `sets` ("key=value" strings, as --set) applied and checks it against the caller before
 * anything is sent: rank in [0, world_size), the file's `workers` equal to world_size (one pfcps worker per
 * torch rank), num_classes and embedding_size (0: not checked) equal to the file's, the join secret (config
 * `secret` or PFCPS_SECRET) and the rendezvous address. Raises PfcpsError naming the mismatch. join() then
 * joins the run. */
static int Worker_init(Worker *w, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"config", "rank", "world_size", "sets", "num_classes", "embedding_size", NULL};
    const char *path;
    int rank, world, want_d = 0;
    long long want_c = 0;
    PyObject *sets_obj = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sii|OLi", kwlist, &path, &rank, &world, &sets_obj, &want_c,
                                     &want_d))
        return -1;
    if (w->joined) {
        raise_code(-EALREADY, "pfcps worker: already joined");
        return -1;
    }
    if (world < 1 || rank < 0 || rank >= world) {
        char msg[128];
        snprintf(msg, sizeof msg, "pfcps worker: rank %d outside [0, world_size %d)", rank, world);
        raise_code(-EINVAL, msg);
        return -1;
    }
    PyObject *seq =
        sets_obj && sets_obj != Py_None ? PySequence_Fast(sets_obj, "sets must be a sequence") : NULL;
    if (sets_obj && sets_obj != Py_None && !seq)
        return -1;
    Py_ssize_t ns = seq ? PySequence_Fast_GET_SIZE(seq) : 0;
    const char **sets = calloc((size_t)ns + 1, sizeof *sets);
    int rc = 0;
    if (!sets) {
        Py_XDECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < ns; i++) {
        sets[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, i));
        if (!sets[i]) {
            free(sets);
            Py_XDECREF(seq);
            return -1;
        }
    }
    w->rank = rank;
    w->world_size = world;
    w->snap_step = -1;
    rejoin_init(&w->rj);
    log_init("torch", rank);
    /* As pfcps-worker: per-step buffers (the sampled ids, the messages' rows) reuse heap pages instead of
     * fresh zeroed mmaps every step (common/daemon.h). Process-wide: the training process' malloc. */
    daemon_tune_malloc();
    rc = cfg_load_ex(&w->cfg, path, sets, (int)ns, 0);
    free(sets);
    Py_XDECREF(seq);
    if (rc < 0) {
        raise_code(rc, pf_errmsg());
        return -1;
    }
    /* One pfcps worker per torch rank: a run of another size would refuse a rank beyond it at the rendezvous
     * ("rank outside the run") or never form (waiting for workers that never come), neither naming the
     * cause. The run's own value is checked again after the join (server 0's config wins). */
    if (w->cfg.workers != world) {
        char msg[PF_ERRMSG_MAX];
        snprintf(msg, sizeof msg,
                 "pfcps worker: %s has workers = %d, but torch.distributed's world size is %d (each torch rank "
                 "is one pfcps worker: start the servers with workers = %d)",
                 path, w->cfg.workers, world, world);
        raise_code(-EINVAL, msg);
        return -1;
    }
    /* The caller's C and D (0: not checked) against the config before joining: a mismatch must not join and
     * leave (a run whose only worker leaves ends). The run's own values are checked after the join. */
    if ((want_c > 0 && w->cfg.num_classes != want_c) || (want_d > 0 && w->cfg.embedding_size != want_d)) {
        char msg[PF_ERRMSG_MAX];
        snprintf(msg, sizeof msg,
                 "pfcps worker: num_classes=%lld, embedding_size=%d asked, but %s has num_classes = %lld, "
                 "embedding_size = %d",
                 want_c, want_d, path, (long long)w->cfg.num_classes, w->cfg.embedding_size);
        raise_code(-EINVAL, msg);
        return -1;
    }
    const char *secret = NULL;
    if ((rc = cli_member_check(&w->cfg, rank, w->cfg.workers, "workers", w->host, sizeof w->host, &w->port,
                               &secret)) < 0) {
        raise_code(rc, pf_errmsg());
        return -1;
    }
    snprintf(w->secret, sizeof w->secret, "%s", secret);
    return 0;
}

/* The identity argument of join(): (run_id: 16 bytes, seed: int, config_digest: 32 bytes). 0 or raises. */
static int parse_ident(PyObject *o, ckpt_ident *id)
{
    const char *rid, *dig;
    Py_ssize_t nrid, ndig;
    unsigned long long seed;
    if (!PyArg_ParseTuple(o, "y#Ky#", &rid, &nrid, &seed, &dig, &ndig))
        return -1;
    if (nrid != CKPT_RUN_ID_BYTES || ndig != CKPT_DIGEST_BYTES) {
        raise_code(-EINVAL, "pfcps worker: a run identity is (16-byte run id, seed, 32-byte config digest)");
        return -1;
    }
    memcpy(id->run_id, rid, CKPT_RUN_ID_BYTES);
    id->seed = (uint64_t)seed;
    memcpy(id->config_digest, dig, CKPT_DIGEST_BYTES);
    return 0;
}

/* join(resume_step=0, ident=None): joins the run as worker `rank` exactly as pfcps-worker does: the data
 * plane's interface (daemon_bind_data_plane), the two endpoints (train_net_open / train_net_address), the
 * join (cli_join_run, up to join_timeout), the run config's check against this one (train_net_check_run;
 * the run's workers must equal world_size), the connections to every server and the ring
 * (train_net_connect). resume_step > 0 with ident (run_id, seed, config_digest) is the one checkpoint this
 * member can resume from, listed at join as pfcps-worker lists the steps of its files: the rendezvous resumes
 * it only when every server holds it with that identity. The run must then resume exactly that step (0: start
 * from scratch), else PfcpsError says what the run did and why (the rendezvous's reason) and this member
 * disconnects without leaving, so that the servers stop instead of training a run this member cannot follow.
 * Raises PfcpsError with pfcps's message on any failure (servers unreachable, wrong secret: "... within
 * join_timeout"). */
static PyObject *Worker_join(Worker *w, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"resume_step", "ident", NULL};
    long long want = 0;
    PyObject *ido = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|LO", kwlist, &want, &ido))
        return NULL;
    if (w->joined)
        return raise_code(-EALREADY, "pfcps worker: already joined");
    if (w->sess || w->secret[0] == '\0')
        return raise_code(-EINVAL, "pfcps worker: join after a failed join or without a loaded config");
    ckpt_ident want_id;
    memset(&want_id, 0, sizeof want_id);
    if (want < 0)
        return raise_code(-EINVAL, "pfcps worker: resume_step < 0");
    if (want > 0 && (ido == Py_None || parse_ident(ido, &want_id) < 0)) {
        if (!PyErr_Occurred())
            raise_code(-EINVAL, "pfcps worker: resume_step > 0 needs the run identity of its checkpoint");
        return NULL;
    }
    int64_t step = (int64_t)want;
    ctl_set_resume_steps(want > 0 ? &step : NULL, want > 0 ? &want_id : NULL, want > 0 ? 1 : 0);
    uint8_t packed[CTL_MAX_ADDR];
    size_t plen = sizeof packed;
    int rc, world = w->world_size, rank = w->rank;
    char *long_msg = w->join_msg;
    long_msg[0] = '\0';
    Py_BEGIN_ALLOW_THREADS
    rc = daemon_bind_data_plane(&w->cfg, w->host, w->port);
    if (rc == 0)
        rc = train_net_set_join_keys(&w->cfg); /* a mismatch is refused before the rank takes a seat */
    if (rc == 0)
        rc = train_net_open(&w->net, &w->cfg, rank);
    w->net.interrupted =
        py_signalled; /* Ctrl-C ends a wait in the ring (the close's barrier, a step's collective) */
    if (rc == 0)
        rc = train_net_address(&w->net, NULL, 0, packed, &plen);
    if (rc == 0) {
        rc = cli_join_run(&w->cfg, w->host, w->port, CTL_ROLE_WORKER, rank, packed, plen, w->secret, &w->sess,
                          &w->run);
        if (rc == -ERANGE) {
            char was[PF_ERRMSG_MAX];
            snprintf(was, sizeof was, "%s", pf_errmsg());
            rc = pf_err(rc, "%s (the run has fewer workers than torch.distributed's world size %d)", was, world);
        }
    }
    if (rc == 0)
        rc = train_net_check_run(&w->cfg, &w->run); /* refused at the join already; kept for a rendezvous
                                                       that does not parse its run config */
    if (rc == 0 && w->run.workers != world)
        rc = pf_err(-EINVAL, "the run has workers = %d, but torch.distributed has world_size %d",
                    w->run.workers, world);
    if (rc == 0) {
        /* The resume step's check: the reason is the rendezvous's (up to 1 KiB), longer than pf_errmsg's
         * buffer, so the message is formatted into `long_msg`. */
        const ctl_book *bk = ctl_session_book(w->sess);
        char hex[2 * CKPT_RUN_ID_BYTES + 1], got[2 * CKPT_RUN_ID_BYTES + 1];
        ckpt_run_id_hex(want_id.run_id, hex);
        ckpt_run_id_hex(bk->run_id, got);
        if (bk->resume_step != step && step > 0) {
            snprintf(long_msg, sizeof w->join_msg,
                     "this module's state (load_state_dict) continues checkpoint step %lld of run %s, but the run "
                     "%s: the servers lack that checkpoint or hold another run's (the rendezvous: %s)",
                     (long long)step, hex, bk->resume_step > 0 ? "resumed another step" : "starts from scratch",
                     bk->resume_reason);
            rc = -ESTALE;
        } else if (bk->resume_step != step) {
            snprintf(long_msg, sizeof w->join_msg,
                     "the run resumed checkpoint step %lld, but this module has no state of it (load the "
                     "script's checkpoint of that step with load_state_dict before the first forward; the "
                     "rendezvous: %s)",
                     (long long)bk->resume_step, bk->resume_reason);
            rc = -ESTALE;
        } else if (step > 0 && memcmp(bk->run_id, want_id.run_id, CKPT_RUN_ID_BYTES) != 0) {
            snprintf(long_msg, sizeof w->join_msg, "checkpoint step %lld: the run resumed run id %s, the state names %s",
                     (long long)step, got, hex);
            rc = -ESTALE;
        }
        if (rc == 0) {
            w->resume_step = w->start_step = bk->resume_step;
            rc = ckpt_ident_of(&w->run, bk->run_id, &w->ident);
        }
        /* A new run from arcface_torch's checkpoint_gpu_<rank>.pt set continues at its global_step: the
         * servers start their step clock there, reading the same file (server/main.c), as pfcps-worker does
         * (worker/train_setup.c setup_import). */
        tpc_progress prog = {0};
        if (rc == 0 && bk->resume_step == 0 && w->run.pretrained_centers[0] &&
            (rc = tpc_read_progress(w->run.pretrained_centers, &prog)) < 0)
            rc = pf_err_wrap(rc, "config key 'pretrained_centers' = %s (the module reads its global_step, as "
                                 "pfcps-worker does: the file must be readable here too)",
                             w->run.pretrained_centers);
        if (rc == 0 && prog.present) {
            w->start_step = prog.global_step;
            log_info("continuing arcface_torch's run of %s at global_step %lld (epoch %lld done)",
                     w->run.pretrained_centers, (long long)prog.global_step, (long long)prog.epoch);
        }
    }
    if (rc == 0) {
        /* The control watcher from here on: a member that fails while the connections open (a server whose
         * start fails after the run formed: its shard, pretrained_centers) ends the wait for it at once
         * (fab_set_interrupt), and its own message (ctl_session_fail) says why. */
        fab_set_interrupt(&w->broken);
        if (w->run.replicas) { /* the rendezvous removes members silent for ctl_member_silence_s */
            ctl_session_set_heartbeat(w->sess, ctl_member_silence_s(w->run.ctl_timeout) / 8);
            /* a close of the control connection is server 0's failover when the shards keep their copies,
             * and a restarted server 0's rendezvous is resumed with the run config's digest */
            rc = ctl_session_survive_rendezvous_loss(w->sess, w->ident.config_digest);
            /* and so is a rendezvous that echoes nothing for twice the silence limit (server 0 stopped) */
            ctl_session_set_rendezvous_silence(w->sess, 2 * ctl_member_silence_s(w->run.ctl_timeout));
        }
        w->watching = pthread_create(&w->watcher, NULL, watch_main, w) == 0;
        if (rc == 0)
            rc = train_net_connect(&w->net, &w->run, ctl_session_book(w->sess), rank, w->secret);
        for (int i = 0; rc < 0 && i < 20 && !__atomic_load_n(&w->broken, __ATOMIC_ACQUIRE); i++)
            usleep(50000);
        if (rc < 0 && __atomic_load_n(&w->broken, __ATOMIC_ACQUIRE))
            snprintf(long_msg, sizeof w->join_msg, "%s (connecting to the servers: %s)", w->broken_msg,
                     pf_errmsg());
    }
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        /* The endpoints stay open until the process exits (common/daemon.h, daemon_exit_now: libfabric 1.17's
         * tcp;ofi_rxm may crash in fi_close while peers go away); the session is closed without a leave, so
         * the other members see this one lost and stop. */
        __atomic_store_n(&w->watch_done, 1, __ATOMIC_RELEASE);
        if (w->watching)
            pthread_join(w->watcher, NULL);
        w->watching = 0;
        if (w->sess) {
            ctl_session_close(w->sess);
            w->sess = NULL;
        }
        w->secret[0] = '\0';
        return raise_code(rc, long_msg[0] ? long_msg : pf_errmsg());
    }
    w->step = w->start_step;
    w->joined = 1;
    Py_RETURN_NONE;
}

/* The head's parameters from config c with the margin loss's values (s, m1, m2, m3, threshold) through the
 * config's rules (margin_combine: arcface_torch's CombinedMarginLoss reads m3 > 0 as CosFace alone and
 * refuses m1 != 1 otherwise; margin_grad; head_mode; gradient_acc). 0, or a negative code with pf_errmsg() naming the
 * key or value pfcps.torch cannot train with. */
static int module_head_params(const pf_config *c0, double s, double m1, double m2, double m3, double thr,
                              head_params *hp)
{
    pf_config c = *c0;
    c.scale = s;
    c.margin_list[0] = m1;
    c.margin_list[1] = m2;
    c.margin_list[2] = m3;
    c.interclass_filtering_threshold = thr;
    int rc = head_params_from_config(&c, hp);
    if (rc < 0) {
        char was[PF_ERRMSG_MAX];
        snprintf(was, sizeof was, "%s", pf_errmsg());
        return pf_err(rc, "the margin loss (s %g, m1 %g, m2 %g, m3 %g): %s", s, m1, m2, m3, was);
    }
    if (hp->mode != HEAD_MODE_GLOBAL)
        return pf_err(-ENOTSUP,
                      "config key 'head_mode' = %s: pfcps.torch.PartialFC trains in global head mode only "
                      "(arcface_torch's PartialFC_V2); set head_mode = global",
                      c.head_mode);
    if (c.gradient_acc != 1)
        return pf_err(-ENOTSUP,
                      "config key 'gradient_acc' = %d: pfcps.torch.PartialFC updates the class centers at every "
                      "backward (no gradient accumulation); set gradient_acc = 1 in the run file",
                      c.gradient_acc);
    return 0;
}

/* check_head(s, m1, m2, m3, threshold): the margin loss's values against this process' config (its
 * margin_combine, margin_grad, head_mode) before joining; raises PfcpsError naming what cannot train. */
static PyObject *Worker_check_head(Worker *w, PyObject *args)
{
    double s, m1, m2, m3, thr;
    if (!PyArg_ParseTuple(args, "ddddd", &s, &m1, &m2, &m3, &thr))
        return NULL;
    head_params hp;
    int rc = module_head_params(&w->cfg, s, m1, m2, m3, thr, &hp);
    if (rc < 0)
        return raise_code(rc, pf_errmsg());
    Py_RETURN_NONE;
}

/* head_init(batch, sample_rate, s, m1, m2, m3, threshold, host_head=True) -> dict: the Partial FC head of this
 * worker (pfc_init, global head mode: the W x batch rows of all workers, this worker's partition of the
 * classes c mod W == rank, the run's margin_grad, the loss floored as arcface_torch's clamp_min(1e-30)).
 * batch: rows per worker per step, fixed from here on. host_head False: sampling only (PFC_NO_HOST_HEAD),
 * for a head the caller computes from pull(), rows() and labels_local(). Returns the head's effective
 * parameters: {"s", "m1", "m2", "m3", "threshold", "margin_grad": "exact" | "straight_through"}, the margin
 * loss's values after the run's margin_combine rules. */
static PyObject *Worker_head_init(Worker *w, PyObject *args)
{
    long long batch;
    double rate, s, m1, m2, m3, thr;
    int host_head = 1;
    if (!PyArg_ParseTuple(args, "Ldddddd|p", &batch, &rate, &s, &m1, &m2, &m3, &thr, &host_head))
        return NULL;
    if (check_usable(w) < 0)
        return NULL;
    if (w->head_ready)
        return raise_code(-EINVAL, "pfcps worker: head_init twice");
    head_params hp;
    int rc = module_head_params(&w->run, s, m1, m2, m3, thr, &hp);
    if (rc < 0)
        return raise_code(rc, pf_errmsg());
    if (hp.m1 != m1 || hp.m2 != m2)
        log_warn("margin (%g, %g, %g): m3 > 0 is CosFace alone in arcface_torch's CombinedMarginLoss, so m1 and m2 "
                 "are unused (margin_combine = full in the run combines them)",
                 m1, m2, m3);
    hp.clamp_loss = 1;
    rc = pfc_init_flags(&w->x, &hp, &w->net.coll, w->run.num_classes, rate, (uint64_t)w->run.seed, batch,
                        w->run.embedding_size, host_head ? 0u : PFC_NO_HOST_HEAD);
    if (rc < 0)
        return raise_code(rc, pf_errmsg());
    size_t kd = (size_t)w->x.k_max * (size_t)w->run.embedding_size;
    w->centers = malloc((kd ? kd : 1) * sizeof(float));
    w->grad_centers = calloc(kd ? kd : 1, sizeof(float));
    if (!w->centers || !w->grad_centers) {
        pfc_free(&w->x);
        return PyErr_NoMemory();
    }
    w->host_head = host_head;
    w->head_ready = 1;
    return Py_BuildValue("{s:d,s:d,s:d,s:d,s:d,s:s}", "s", hp.s, "m1", hp.m1, "m2", hp.m2, "m3", hp.m3,
                         "threshold", hp.interclass_filtering_threshold, "margin_grad",
                         hp.margin_grad == HEAD_MARGIN_GRAD_EXACT ? "exact" : "straight_through");
}

/* ps_wait for req up to the client's bound (net.wait_s), in slices of 0.25 s, giving up with -EINTR when a
 * Python signal handler raised between two slices (Ctrl-C: py_signalled), or with -ENOLINK and the
 * control watcher's report as soon as the run broke (a server that failed says why there, long before the
 * data plane's own bound). The request is then abandoned with the worker broken: no later call makes progress
 * on the client, so no late reply lands in its buffers. Runs without the GIL. */
static int wait_req(Worker *w, ps_req *req)
{
    const double slice = 0.25, until = pf_now_s() + w->net.wait_s;
    for (;;) {
        double left = until - pf_now_s();
        int rc = ps_wait(w->net.ps, req, left < slice ? (left > 0 ? left : 0) : slice);
        if (rc != -ETIMEDOUT || left <= slice)
            return rc;
        if (__atomic_load_n(&w->broken, __ATOMIC_ACQUIRE))
            return pf_err(-ENOLINK, "%s", w->broken_msg);
        if (py_signalled())
            return pf_err(-EINTR, "interrupted by a signal while waiting for the servers");
    }
}

/* Ends the step whose forward got no backward: its push is queued empty, flagged skipped. */
static void queue_skipped(Worker *w)
{
    w->queued = 1;
    w->queued_lr = 0.0;
    w->queued_flags = PS_PUSH_SKIPPED;
    w->nonfinite = 0;
    w->pending = 0;
    w->step++;
}

/* The pending step's loss is `loss`, not finite (an inf or NaN in the embeddings, as fp16 under autocast
 * gives, or in the pulled rows): the step goes on, its loss and gradients as they are (GradScaler finds the
 * inf or NaN and skips the optimizer's step, as with PartialFC_V2), but its push goes empty and flagged
 * skipped, whether optimizer.step() runs or not, so that the class centers shared by every rank keep no inf
 * or NaN. */
static void mark_nonfinite(Worker *w, double loss)
{
    w->nonfinite = 1;
    log_warn("step %lld: the loss is %s (an inf or NaN in the embeddings or the class centers): this step "
             "pushes nothing, the class centers stay as they were (GradScaler skips the backbone's step)",
             (long long)w->step, isnan(loss) ? "nan" : "inf");
}

/* Sends the queued push of step `step - 1` (if any) with `extra` flags added (PS_PUSH_SNAPSHOT; also when
 * it is the push before a rejoining server's copy, rejoin_snapshot_push) and waits for every server to take
 * it. 0 or a negative code (pf_errmsg). Runs without the GIL. */
static int flush_push(Worker *w, uint32_t extra)
{
    if (!w->queued)
        return 0;
    uint32_t flags =
        w->queued_flags | extra | (rejoin_snapshot_push(&w->rj, w->step - 1) ? PS_PUSH_SNAPSHOT : 0);
    /* A skipped step has no rows, but real buffers: the client borrows the gradients (train_net_connect)
     * and refuses NULL. */
    size_t n = (flags & PS_PUSH_SKIPPED) ? 0 : (size_t)w->last_k;
    ps_req *req = NULL;
    double t0 = pf_now_s();
    int rc = ps_push_ex(w->net.ps, w->x.ids, n, w->grad_centers, (float)w->queued_lr, w->step - 1, flags, &req);
    if (rc == 0)
        rc = wait_req(w, req);
    w->phase_s[3] = pf_now_s() - t0;
    if (rc == 0) {
        w->queued = 0;
        if (extra & PS_PUSH_SNAPSHOT)
            w->snap_step = w->step;
    }
    return rc;
}

/* A C-contiguous buffer of `n` items of `itemsize` bytes (writable when asked). 0 or raises. */
static int get_buf(PyObject *o, Py_buffer *b, Py_ssize_t n, Py_ssize_t itemsize, int writable,
                   const char *name)
{
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (b->itemsize != itemsize || b->len != n * itemsize) {
        PyErr_Format(PyExc_ValueError,
                     "pfcps worker: %s has %zd bytes of %zd-byte items, want %zd items of %zd", name, b->len,
                     b->itemsize, n, itemsize);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* rejoin_hold's stop: the run broke (the watcher's report) while the pushes are held. */
static int hold_broken(void *arg)
{
    Worker *w = arg;
    return __atomic_load_n(&w->broken, __ATOMIC_ACQUIRE) ? pf_err(-ENOLINK, "%s", w->broken_msg) : 0;
}

/* A failed-over server's rejoin at the start of step w->step (replicas = 1; worker/rejoin.h): the ranks
 * allreduce (max) their rejoin_vote over the ring, so that all agree at the same step on a rejoin begun,
 * whose copy is then checkpoint step + 1 (the push of this step asks for it); at the start of that
 * checkpoint's step, its push acknowledged, every rank holds until the learner holds its copies. 0 or a
 * negative code. */
static int step_rejoin(Worker *w)
{
    if (!w->run.replicas)
        return 0;
    float v = rejoin_vote(&w->rj);
    int rc = 0;
    if (w->net.have_coll && w->world_size > 1 &&
        (rc = coll_allreduce(&w->net.coll, &v, 1, COLL_F32, COLL_MAX)) < 0)
        return rc;
    rejoin_agree(&w->rj, v > 0 ? (uint32_t)v : 0, w->step + 1);
    if (w->rj.ckpt < 0 || w->step != w->rj.ckpt || w->queued)
        return 0;
    return rejoin_hold(&w->rj, w->sess, w->net.ps, w->rank, w->step, w->run.ctl_timeout, hold_broken, w);
}

/* The start of a step, for forward and pull: ends a forward without backward (skipped), sends the queued
 * push of the step before, takes part in a server's rejoin (step_rejoin), samples (labels: this worker's
 * batch; the labels of all workers are allgathered) and pulls the sampled rows into `centers`. Runs without
 * the GIL. 0, or a negative code with *stage: 0 the push of the step before, 1 sampling, 2 the pull, 4 the
 * rejoin. */
static int step_begin(Worker *w, const int64_t *labels, int64_t *k, int *stage)
{
    const int64_t *ids = NULL;
    if (w->pending)
        queue_skipped(w);
    *stage = 0;
    int rc = flush_push(w, 0);
    if (rc == 0) {
        *stage = 4;
        rc = step_rejoin(w);
    }
    double t0 = pf_now_s(), t1 = t0;
    if (rc == 0) {
        *stage = 1;
        rc = pfc_sample(&w->x, w->step, labels, &ids, k);
        t1 = pf_now_s();
    }
    ps_req *req = NULL;
    if (rc == 0) {
        *stage = 2;
        rc = ps_pull(w->net.ps, ids, (size_t)*k, w->centers, w->step, &req);
    }
    if (rc == 0)
        rc = wait_req(w, req);
    w->phase_s[0] = t1 - t0;
    w->phase_s[1] = pf_now_s() - t1;
    return rc;
}

/* Raises step_begin's (or the head's, stage 3) error: a refused label leaves the worker usable (nothing of
 * this step was sent), anything else breaks it. */
static PyObject *step_error(Worker *w, int rc, int stage)
{
    if (stage == 1 && rc == -ERANGE)
        return raise_code(rc, pf_errmsg()); /* nothing sent for this step: the worker stays usable */
    return fail_step(w, rc,
                     stage == 0   ? "the push of the step before"
                     : stage == 1 ? "sampling"
                     : stage == 2 ? "pull"
                     : stage == 4 ? "a server's rejoin"
                                  : "head");
}

/* forward(embeddings, labels, grad_embeddings) -> loss. embeddings: (batch, D) float32, C-contiguous; labels:
 * (batch) int64; grad_embeddings: writable (batch, D) float32. Samples, pulls and runs the head for step
 * `step` (one step of the whole run: every worker calls it with its own batch), returns the global mean loss
 * over the W x batch rows (float, the same on every rank) and writes dL/d(this rank's embeddings) of that
 * mean into grad_embeddings. The push queued by the previous backward (or a skipped one for a previous
 * forward without backward) goes first. Raises PfcpsError: a label outside [0, num_classes) (the worker
 * stays usable), a server or ring failure, the loss not finite. */
static PyObject *Worker_forward(Worker *w, PyObject *args)
{
    PyObject *eo, *lo, *go;
    if (!PyArg_ParseTuple(args, "OOO", &eo, &lo, &go))
        return NULL;
    if (check_usable(w) < 0)
        return NULL;
    if (!w->head_ready || !w->host_head)
        return raise_code(-EINVAL, "pfcps worker: forward before head_init, or on a head without host head");
    Py_ssize_t B = (Py_ssize_t)w->x.batch, D = w->run.embedding_size;
    Py_buffer eb, lb, gb;
    if (get_buf(eo, &eb, B * D, 4, 0, "embeddings") < 0)
        return NULL;
    if (get_buf(lo, &lb, B, 8, 0, "labels") < 0) {
        PyBuffer_Release(&eb);
        return NULL;
    }
    if (get_buf(go, &gb, B * D, 4, 1, "grad_embeddings") < 0) {
        PyBuffer_Release(&eb);
        PyBuffer_Release(&lb);
        return NULL;
    }
    int rc = 0, stage = 0;
    double loss = 0;
    int64_t k = 0;
    Py_BEGIN_ALLOW_THREADS
    rc = step_begin(w, (const int64_t *)lb.buf, &k, &stage);
    if (rc == 0) {
        double t2 = pf_now_s();
        stage = 3;
        rc = pfc_step(&w->x, (const float *)eb.buf, w->centers, &loss, (float *)gb.buf, w->grad_centers);
        w->phase_s[2] = pf_now_s() - t2;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&eb);
    PyBuffer_Release(&lb);
    PyBuffer_Release(&gb);
    const int nonfinite = rc == -ERANGE && stage == 3 && !isfinite(loss);
    if (rc < 0 && !nonfinite)
        return step_error(w, rc, stage);
    if (nonfinite)
        mark_nonfinite(w, loss);
    w->pending = 1;
    w->last_k = k;
    return PyFloat_FromDouble(loss);
}

/* pull(labels) -> k: forward's sampling and pull without the head, for a head the caller computes (head_init
 * with host_head False): labels (batch) int64. Afterwards rows() holds the k pulled rows (k, D) float32 in the
 * order of sampled_ids(), labels_local() every row of the global batch's column among them (-1: its class is
 * in another worker's partition), and the caller writes the rows' gradient into grad_rows() before
 * backward(lr). Raises as forward. */
static PyObject *Worker_pull(Worker *w, PyObject *args)
{
    PyObject *lo;
    if (!PyArg_ParseTuple(args, "O", &lo))
        return NULL;
    if (check_usable(w) < 0)
        return NULL;
    if (!w->head_ready)
        return raise_code(-EINVAL, "pfcps worker: pull before head_init");
    Py_buffer lb;
    if (get_buf(lo, &lb, (Py_ssize_t)w->x.batch, 8, 0, "labels") < 0)
        return NULL;
    int rc, stage = 0;
    int64_t k = 0;
    Py_BEGIN_ALLOW_THREADS
    rc = step_begin(w, (const int64_t *)lb.buf, &k, &stage);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&lb);
    if (rc < 0)
        return step_error(w, rc, stage);
    w->pending = 1;
    w->last_k = k;
    w->phase_s[2] = 0.0;
    return PyLong_FromLongLong((long long)k);
}

/* rows() / grad_rows(): writable memoryviews of the last pull's k rows (k x D float32: the pulled class
 * centers) and of their gradient, which backward pushes. Valid until the next forward, pull or close; the
 * Worker must outlive them. */
static PyObject *Worker_rows(Worker *w, PyObject *noargs)
{
    (void)noargs;
    if (!w->head_ready || !w->pending)
        return raise_code(-EINVAL, "pfcps worker: rows() without a pull waiting for its backward");
    return PyMemoryView_FromMemory((char *)w->centers,
                                   (Py_ssize_t)(w->last_k * w->run.embedding_size * (int64_t)sizeof(float)),
                                   PyBUF_WRITE);
}

static PyObject *Worker_grad_rows(Worker *w, PyObject *noargs)
{
    (void)noargs;
    if (!w->head_ready || !w->pending)
        return raise_code(-EINVAL, "pfcps worker: grad_rows() without a pull waiting for its backward");
    return PyMemoryView_FromMemory((char *)w->grad_centers,
                                   (Py_ssize_t)(w->last_k * w->run.embedding_size * (int64_t)sizeof(float)),
                                   PyBUF_WRITE);
}

/* labels_local() -> bytes: the last sampling's column of each row of the global batch (W x batch int64,
 * native byte order, rank-major as the allgathered embeddings) among this worker's sampled ids, -1 where
 * the row's class is another worker's. */
static PyObject *Worker_labels_local(Worker *w, PyObject *noargs)
{
    (void)noargs;
    if (!w->head_ready || !w->x.sampled)
        return raise_code(-EINVAL, "pfcps worker: labels_local() before a pull");
    return PyBytes_FromStringAndSize((const char *)w->x.labels_local,
                                     (Py_ssize_t)(w->x.n * (int64_t)sizeof(int64_t)));
}

/* backward(lr, send=False): queues the push of the row gradients of the last forward's sampled rows with
 * learning rate lr (float, the servers apply the run's optimizer at that lr: SGD with its momentum and
 * weight_decay, or AdamW with its weight_decay); it goes
 * to the servers at the next forward, pull, checkpoint or close; with send True at once (the servers' apply
 * then overlaps the caller's work until its next pull, but that step can no longer be a checkpoint). The step
 * is then done. Raises PfcpsError when no forward is pending or the push fails. */
static PyObject *Worker_backward(Worker *w, PyObject *args)
{
    double lr;
    int send = 0;
    if (!PyArg_ParseTuple(args, "d|p", &lr, &send))
        return NULL;
    if (check_usable(w) < 0)
        return NULL;
    if (!w->pending)
        return raise_code(-EINVAL,
                          "pfcps worker: backward without a forward (each forward has one backward)");
    w->queued = 1;
    w->queued_lr = lr;
    w->queued_flags = w->nonfinite ? PS_PUSH_SKIPPED : 0;
    w->nonfinite = 0;
    w->pending = 0;
    w->step++;
    if (send) {
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = flush_push(w, 0);
        Py_END_ALLOW_THREADS
        if (rc < 0)
            return fail_step(w, rc, "push");
    }
    Py_RETURN_NONE;
}

/* skip(): a forward that will get no backward (evaluation, a skipped optimizer step): its empty push,
 * flagged skipped, is queued. No-op when nothing is pending. */
static PyObject *Worker_skip(Worker *w, PyObject *noargs)
{
    (void)noargs;
    if (check_usable(w) < 0)
        return NULL;
    if (w->pending)
        queue_skipped(w);
    Py_RETURN_NONE;
}

/* drop_queued() -> bool: the optimizer step of the step whose push is queued did not run (torch's GradScaler
 * found an inf or NaN gradient and skipped optimizer.step()): the queued push becomes an empty push flagged
 * PS_PUSH_SKIPPED, so the servers leave every class center and its optimizer state as they were, as the skipped
 * torch step leaves PartialFC_V2's weight. Returns True when a push with rows was dropped, False when nothing
 * was queued or the queued push was already a skipped one. */
static PyObject *Worker_drop_queued(Worker *w, PyObject *noargs)
{
    (void)noargs;
    if (check_usable(w) < 0)
        return NULL;
    if (!w->queued || (w->queued_flags & PS_PUSH_SKIPPED))
        Py_RETURN_FALSE;
    w->queued_lr = 0.0;
    w->queued_flags = PS_PUSH_SKIPPED;
    Py_RETURN_TRUE;
}

/* This rank's .module marker of checkpoint w->step in the checkpoint folder (ckpt_module_marker_write), so
 * that the servers sharing the folder count the step complete and prune older ones (snapshot_keep). The
 * servers create the folder at their first checkpoint, which they start once the push just acknowledged is
 * applied: at the first checkpoint that finds no folder it is waited for up to 5 s; a folder that did not
 * come is taken as not on this host, said once, and not waited for again. A failed write is logged: the
 * checkpoint itself is whole. */
static void mark_checkpoint(Worker *w)
{
    static int waited;
    char root[4096];
    ckpt_root(&w->cfg, root, sizeof root);
    int rc = ckpt_module_marker_write(root, w->step, w->rank, w->run.workers, &w->ident);
    for (int i = 0; rc == -ENOENT && !waited && i < 100; i++) {
        usleep(50000);
        rc = ckpt_module_marker_write(root, w->step, w->rank, w->run.workers, &w->ident);
    }
    if (rc == -ENOENT && !waited)
        log_info("checkpoint folder %s is not on this host: no .module markers written (a folder shared with "
                 "the servers gets them, so that they count checkpoints complete and prune old ones)",
                 root);
    else if (rc < 0 && rc != -ENOENT)
        log_warn("checkpoint step %lld: %s (the checkpoint is whole; the servers will not count it complete "
                 "when pruning)",
                 (long long)w->step, pf_errmsg());
    waited = 1;
}

/* checkpoint() -> T: asks the servers for checkpoint T = step (the steps done): the queued push of step T - 1
 * goes now, flagged PS_PUSH_SNAPSHOT, and each server writes its shard as it stands after step T into
 * <snapshot root>/step-<T>/ (server/snapshot.h) while it goes on serving. Returns T; T again when
 * checkpoint T was already asked for or was resumed; 0 before this run's first step when it did not resume
 * (nothing to save: a resume from it starts the run again, at pretrained_centers' global_step if any).
 * Raises PfcpsError between a forward and its backward, or when step T - 1's push already went unflagged
 * (checkpoint after close). */
static PyObject *Worker_checkpoint(Worker *w, PyObject *noargs)
{
    (void)noargs;
    if (check_usable(w) < 0)
        return NULL;
    if (w->pending)
        return raise_code(-EINVAL, "pfcps worker: a checkpoint between a forward and its backward (the step is "
                                   "half done: save after the optimizer step)");
    if ((w->step == w->resume_step && w->resume_step > 0) || w->snap_step == w->step)
        return PyLong_FromLongLong((long long)w->step);
    if (w->step == w->start_step) /* nothing trained in this run yet: resuming it is starting it again */
        return PyLong_FromLong(0);
    if (!w->queued) {
        char msg[200];
        snprintf(msg, sizeof msg,
                 "pfcps worker: checkpoint step %lld cannot be asked for any more: that step's push already "
                 "went to the servers",
                 (long long)w->step);
        return raise_code(-EINVAL, msg);
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = flush_push(w, PS_PUSH_SNAPSHOT);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return fail_step(w, rc, "the checkpoint's push");
    mark_checkpoint(w);
    return PyLong_FromLongLong((long long)w->step);
}

/* nonfinite(loss): the caller's head (head = "torch") found the pending step's loss not finite
 * (mark_nonfinite). */
static PyObject *Worker_nonfinite(Worker *w, PyObject *args)
{
    double loss;
    if (!PyArg_ParseTuple(args, "d", &loss))
        return NULL;
    if (check_usable(w) < 0)
        return NULL;
    mark_nonfinite(w, loss);
    Py_RETURN_NONE;
}

/* fail(message): marks the worker broken after a failure inside a step that the caller's head found (a row
 * without its target class; a loss that is not finite is nonfinite's, not a failure): every later call raises
 * naming it, as after a failure of forward's own head. Raises PfcpsError(message) itself. */
static PyObject *Worker_fail(Worker *w, PyObject *args)
{
    const char *msg;
    if (!PyArg_ParseTuple(args, "s", &msg))
        return NULL;
    snprintf(w->failed_msg, sizeof w->failed_msg, "pfcps worker: step %lld, head: %s", (long long)w->step, msg);
    w->failed = 1;
    return raise_code(-EPROTO, w->failed_msg);
}

/* Stops the watcher, closes the control session and, unless `not_in_order` (the reason it is not) and when
 * the module is healthy, leaves the run in order first: a forward without backward ends skipped, the queued
 * push goes, every rank meets at a ring barrier (a rank still inside a step fails it instead), and under
 * replicas = 1 every live server hears this rank is done. A leave in order tells the rendezvous this worker's
 * training is over (the run ends once every worker left); otherwise the session closes without it, which the
 * run takes as this worker's loss (it re-forms: exit 75). Not in order: the caller says so (an exception ends
 * the script), the module failed (a step's error, a lost member), or a step of the leave failed. Returns 1
 * when it left in order (or was not joined), else 0 with why[n] saying why not. The fabric endpoints stay
 * open until the process exits (as pfcps-worker: common/daemon.h daemon_exit_now). */
static int worker_leave(Worker *w, const char *not_in_order, char *why, size_t n)
{
    if (!w->joined)
        return 1;
    int healthy = !not_in_order && !w->failed && !__atomic_load_n(&w->broken, __ATOMIC_ACQUIRE);
    if (!healthy)
        snprintf(why, n, "%s", not_in_order ? not_in_order : w->failed ? w->failed_msg : w->broken_msg);
    Py_BEGIN_ALLOW_THREADS
    if (healthy && w->pending)
        queue_skipped(w);
    if (healthy && flush_push(w, 0) < 0) {
        snprintf(why, n, "the last step's push failed: %s", pf_errmsg());
        healthy = 0;
    }
    if (healthy && w->net.have_coll && coll_barrier(&w->net.coll) < 0) {
        const int broke = __atomic_load_n(&w->broken, __ATOMIC_ACQUIRE);
        snprintf(why, n,
                 "the ranks' barrier failed (another rank is still inside a step, or lost): %.400s%s%.400s%s",
                 pf_errmsg(), broke ? " (" : "", broke ? w->broken_msg : "", broke ? ")" : "");
        healthy = 0;
    }
    if (!healthy)
        log_warn("leaving the run not in order (%s): the run takes this worker as lost", why);
    /* replicas = 1: every live server hears that this worker is done, so that servers which lost the
     * rendezvous with server 0 stop once every worker is (with the rendezvous its shutdown does that too) */
    if (healthy && w->run.replicas && w->net.ps && ps_client_done(w->net.ps, w->run.ctl_timeout) < 0)
        log_warn("leaving the run: %s", pf_errmsg());
    __atomic_store_n(&w->watch_done, 1, __ATOMIC_RELEASE);
    if (w->watching)
        pthread_join(w->watcher, NULL);
    w->watching = 0;
    if (healthy)
        ctl_session_leave(w->sess);
    ctl_session_close(w->sess);
    Py_END_ALLOW_THREADS
    w->sess = NULL;
    w->joined = 0;
    w->secret[0] = '\0'; /* no second join: the endpoints of this one stay open until the process exits */
    return healthy;
}

/* close(in_order=True, reason=None): leaves the run (worker_leave); in_order=False closes without the leave,
 * so that the run takes this worker as lost (`reason` says why in the log; default "close(in_order=False)").
 * Raises PfcpsError when a leave in order was asked for but could not be (the module failed, the run broke,
 * the last push or the ranks' barrier failed): the run then takes this rank as lost too. */
static PyObject *Worker_close(Worker *w, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"in_order", "reason", NULL};
    int in_order = 1;
    const char *reason = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|pz", kwlist, &in_order, &reason))
        return NULL;
    char why[sizeof w->failed_msg + 64] = "";
    if (worker_leave(w,
                     in_order ? NULL
                     : reason ? reason
                              : "close(in_order=False)",
                     why, sizeof why) ||
        !in_order)
        Py_RETURN_NONE;
    char msg[sizeof why + 160];
    snprintf(msg, sizeof msg,
             "pfcps worker: close(): could not leave the run in order (%s): the run takes this rank as lost "
             "and re-forms from its newest checkpoint",
             why);
    return raise_code(-ENOLINK, msg);
}

static void Worker_dealloc(Worker *w)
{
    char why[sizeof w->failed_msg + 64];
    worker_leave(w, NULL, why, sizeof why);
    fab_set_interrupt(NULL); /* the flag is this Worker's */
    pfc_free(&w->x);
    free(w->centers);
    free(w->grad_centers);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

/* A dict of the config keys the Python side checks or reports. */
static PyObject *config_dict(const pf_config *r)
{
    return Py_BuildValue("{s:L,s:i,s:i,s:i,s:d,s:d,s:d,s:d,s:d,s:(ddd),s:d,s:L,s:i,s:s,s:s,s:s,s:d,s:s,s:s,s:O,s:i,"
                         "s:s,s:s,s:s}",
                         "num_classes", (long long)r->num_classes, "embedding_size", r->embedding_size,
                         "servers", r->servers, "workers", r->workers, "lr", r->lr, "momentum", r->momentum,
                         "weight_decay", r->weight_decay, "sample_rate", r->sample_rate, "scale", r->scale,
                         "margin_list", r->margin_list[0], r->margin_list[1], r->margin_list[2],
                         "interclass_filtering_threshold", r->interclass_filtering_threshold, "seed",
                         (long long)r->seed, "batch_size", r->batch_size, "optimizer", r->optimizer,
                         "pfc_update", r->pfc_update, "head_mode", r->head_mode, "ctl_timeout",
                         r->ctl_timeout, "provider", r->provider, "wire_dtype", r->wire_dtype, "resume",
                         r->resume ? Py_True : Py_False, "snapshot_every", r->snapshot_every, "margin_grad",
                         r->margin_grad, "margin_combine", r->margin_combine, "rendezvous", r->rendezvous);
}

/* run_config: the run's config (server 0's, from the rendezvous), selected keys. */
static PyObject *Worker_run_config(Worker *w, void *closure)
{
    (void)closure;
    if (!w->joined && !w->sess && w->run.num_classes == 0)
        return raise_code(-EINVAL, "pfcps worker: not joined");
    return config_dict(&w->run);
}

/* config: this process' config (the file with the overrides), selected keys. */
static PyObject *Worker_config(Worker *w, void *closure)
{
    (void)closure;
    return config_dict(&w->cfg);
}

/* ident: (run_id: 16 bytes, seed, config_digest: 32 bytes), the identity the run's checkpoint files carry
 * (common/ckpt.h); None before the join. */
static PyObject *Worker_get_ident(Worker *w, void *closure)
{
    (void)closure;
    if (!w->joined)
        Py_RETURN_NONE;
    return Py_BuildValue("(y#Ky#)", (const char *)w->ident.run_id, (Py_ssize_t)CKPT_RUN_ID_BYTES,
                         (unsigned long long)w->ident.seed, (const char *)w->ident.config_digest,
                         (Py_ssize_t)CKPT_DIGEST_BYTES);
}

static PyObject *Worker_get_joined(Worker *w, void *closure)
{
    (void)closure;
    return PyBool_FromLong(w->joined);
}

static PyObject *Worker_get_resume_step(Worker *w, void *closure)
{
    (void)closure;
    return PyLong_FromLongLong((long long)w->resume_step);
}

static PyObject *Worker_get_step(Worker *w, void *closure)
{
    (void)closure;
    return PyLong_FromLongLong((long long)w->step);
}

static PyObject *Worker_get_k(Worker *w, void *closure)
{
    (void)closure;
    return PyLong_FromLongLong((long long)w->last_k);
}

static PyObject *Worker_get_pending(Worker *w, void *closure)
{
    (void)closure;
    return PyBool_FromLong(w->pending);
}

/* sampled_ids() -> bytes: the class ids this worker sampled at the last forward (k int64, native byte order,
 * ascending), the rows it pulled and pushes; b"" before the first forward. */
static PyObject *Worker_sampled_ids(Worker *w, PyObject *noargs)
{
    (void)noargs;
    if (!w->head_ready || !w->x.ids)
        return PyBytes_FromStringAndSize("", 0);
    return PyBytes_FromStringAndSize((const char *)w->x.ids,
                                     (Py_ssize_t)(w->last_k * (int64_t)sizeof(int64_t)));
}

static PyMethodDef Worker_methods[] = {
    {"join", (PyCFunction)(void (*)(void))Worker_join, METH_VARARGS | METH_KEYWORDS,
     "join(resume_step=0, ident=None): join the run, resuming checkpoint resume_step of run identity ident"},
    {"check_head", (PyCFunction)Worker_check_head, METH_VARARGS,
     "check_head(s, m1, m2, m3, threshold): refuse a margin or head key this config cannot train with"},
    {"head_init", (PyCFunction)Worker_head_init, METH_VARARGS,
     "head_init(batch, sample_rate, s, m1, m2, m3, threshold, host_head=True) -> dict: set up the head"},
    {"forward", (PyCFunction)Worker_forward, METH_VARARGS,
     "forward(embeddings, labels, grad_embeddings) -> loss: sample, pull, head forward + backward"},
    {"pull", (PyCFunction)Worker_pull, METH_VARARGS, "pull(labels) -> k: sample and pull, no head"},
    {"rows", (PyCFunction)Worker_rows, METH_NOARGS, "rows() -> memoryview: the pulled rows (k x D float32)"},
    {"grad_rows", (PyCFunction)Worker_grad_rows, METH_NOARGS,
     "grad_rows() -> memoryview: the rows' gradient (k x D float32) that backward pushes"},
    {"labels_local", (PyCFunction)Worker_labels_local, METH_NOARGS,
     "labels_local() -> bytes: each global-batch row's column among the sampled ids (int64, -1: none)"},
    {"backward", (PyCFunction)Worker_backward, METH_VARARGS,
     "backward(lr): queue the push of the sampled rows' gradients at lr"},
    {"fail", (PyCFunction)Worker_fail, METH_VARARGS, "fail(message): mark the worker broken and raise"},
    {"nonfinite", (PyCFunction)Worker_nonfinite, METH_VARARGS,
     "nonfinite(loss): the pending step's loss is not finite: its push goes empty, flagged skipped"},
    {"checkpoint", (PyCFunction)Worker_checkpoint, METH_NOARGS,
     "checkpoint() -> T: ask the servers for checkpoint T (the steps done) and return T"},
    {"skip", (PyCFunction)Worker_skip, METH_NOARGS, "skip(): end a forward that gets no backward"},
    {"drop_queued", (PyCFunction)Worker_drop_queued, METH_NOARGS,
     "drop_queued() -> bool: the queued push becomes an empty skipped one (the optimizer step did not run)"},
    {"close", (PyCFunction)(void (*)(void))Worker_close, METH_VARARGS | METH_KEYWORDS,
     "close(in_order=True, reason=None): leave the run in order (raises when it cannot), or (in_order=False) "
     "close as a lost worker"},
    {"sampled_ids", (PyCFunction)Worker_sampled_ids, METH_NOARGS,
     "sampled_ids() -> bytes: the last forward's sampled class ids (int64, ascending)"},
    {NULL, NULL, 0, NULL},
};

static PyObject *Worker_get_phases(Worker *w, void *closure)
{
    (void)closure;
    return Py_BuildValue("{s:d,s:d,s:d,s:d}", "sample", w->phase_s[0], "pull", w->phase_s[1], "head",
                         w->phase_s[2], "push", w->phase_s[3]);
}

static PyGetSetDef Worker_getset[] = {
    {"run_config", (getter)Worker_run_config, NULL, "the run's config (server 0's), selected keys", NULL},
    {"config", (getter)Worker_config, NULL, "this process' config (file and overrides), selected keys", NULL},
    {"ident", (getter)Worker_get_ident, NULL, "(run_id, seed, config_digest) of the run's checkpoints", NULL},
    {"joined", (getter)Worker_get_joined, NULL, "joined the run and not closed", NULL},
    {"resume_step", (getter)Worker_get_resume_step, NULL, "the checkpoint step the run resumed (0: none)", NULL},
    {"step", (getter)Worker_get_step, NULL, "the global step of the next forward (0-based)", NULL},
    {"k", (getter)Worker_get_k, NULL, "class centers this worker sampled at the last forward", NULL},
    {"pending", (getter)Worker_get_pending, NULL, "a forward waits for its backward", NULL},
    {"phases", (getter)Worker_get_phases, NULL,
     "the last step's wall seconds: sample, pull (post to completion), head (forward + backward), push",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject WorkerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pfcps._C.Worker",
    .tp_basicsize = sizeof(Worker),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Worker(config, rank, world_size, sets=(), num_classes=0, embedding_size=0): one pfcps worker; "
              "join() joins the run",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Worker_init,
    .tp_dealloc = (destructor)Worker_dealloc,
    .tp_methods = Worker_methods,
    .tp_getset = Worker_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "pfcps._C",
    "pfcps's C worker (join, sampling, pull/push, CPU head)",
    -1,
    NULL,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__C(void)
{
    g_main_thread = pthread_self();
    ctl_set_interrupt_check(py_signalled); /* Ctrl-C ends a join (ctl_join's ticks) */
    if (PyType_Ready(&WorkerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    PfcpsError = PyErr_NewExceptionWithDoc(
        "pfcps.PfcpsError", "A pfcps failure; str() is pfcps's message, .code the negative errno",
        PyExc_RuntimeError, NULL);
    if (!PfcpsError) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(PfcpsError); /* the module's reference (PyModule_AddObject steals it); ours stays */
    if (PyModule_AddObject(m, "PfcpsError", PfcpsError) < 0) {
        Py_DECREF(PfcpsError);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&WorkerType);
    if (PyModule_AddObject(m, "Worker", (PyObject *)&WorkerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
