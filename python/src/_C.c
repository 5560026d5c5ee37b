/* pfcps._C: one pfcps worker inside a Python process, over the C worker's own code (no second implementation
 * of the wire protocol): the control-plane join (common/cli.h cli_join_run, as pfcps-worker and
 * bench/scale/scale_worker join), the two data-plane endpoints (worker/train_net.h: the parameter-server
 * client and the collectives ring among the workers), the sampler and the CPU head (worker/head/pfc.h:
 * pfc_sample, pfc_step), and the pull / push of worker/ps_client.h. pfcps/torch.py builds PartialFC on it.
 *
 * One step, as worker/train.c's train_step does it for the head path:
 * - Worker.forward(emb, labels, grad_emb): pfc_sample (labels allgathered over the ring), ps_pull + ps_wait,
 *   pfc_step (embeddings allgathered, head forward + backward, the embedding gradient reduce-scattered
 *   back); returns the global mean loss and writes dL/d(this rank's embeddings) into grad_emb;
 * - Worker.backward(lr): ps_push of the sampled rows' gradients with lr, ps_wait;
 * - Worker.skip(): ends a forward that gets no backward with an empty push flagged PS_PUSH_SKIPPED, so the
 *   step clock moves on (the servers leave the table as it was).
 *
 * Errors raise pfcps.PfcpsError (a RuntimeError) carrying pf_errmsg() and the negative code in .code. A
 * failure after the step's pull was posted leaves the worker broken (every later call raises, naming the
 * first error): its step clock can no longer match the servers'. Errors before anything was sent (a label
 * outside [0, C), a batch of another size) leave it usable. The blocking calls release the GIL. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cli.h"
#include "common/clock.h"
#include "common/coll.h"
#include "common/config.h"
#include "common/ctl.h"
#include "common/daemon.h"
#include "common/err.h"
#include "common/log.h"
#include "proto/ps_wire.h"
#include "worker/head/pfc.h"
#include "worker/ps_client.h"
#include "worker/train_net.h"

static PyObject *PfcpsError;

/* Raises PfcpsError(msg) with .code = code (a negative errno). Returns NULL. */
static PyObject *raise_code(int code, const char *msg)
{
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
    int64_t step;                  /* the step of the next forward (0-based global step) */
    int pending;                   /* forward of `step` done, its push not sent yet */
    int64_t last_k;
    double phase_s[4]; /* the last step's sample, pull, head (forward) and push (backward) wall seconds */
    int failed;        /* a step failed after its pull was posted: failed_msg */
    char failed_msg[PF_ERRMSG_MAX + 64];
} Worker;

static void *watch_main(void *arg)
{
    Worker *w = arg;
    while (!__atomic_load_n(&w->watch_done, __ATOMIC_ACQUIRE)) {
        int r = ctl_session_wait_shutdown(w->sess, 0.5);
        if (r == 0)
            continue;
        if (__atomic_load_n(&w->watch_done, __ATOMIC_ACQUIRE))
            break;
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

/* Marks the worker broken by error rc (pf_errmsg) and raises it. */
static PyObject *fail_step(Worker *w, int rc, const char *what)
{
    snprintf(w->failed_msg, sizeof w->failed_msg, "pfcps worker: step %lld, %s: %s", (long long)w->step, what,
             pf_errmsg());
    w->failed = 1;
    return raise_code(rc, w->failed_msg);
}

/* Worker(config, rank, world_size, sets=(), num_classes=0, embedding_size=0): loads `config` (a pfcps INI
 * file) with the `sets` ("key=value" strings, as --set) applied, checks rank in [0, workers) and the join
 * secret (config `secret` or PFCPS_SECRET), then joins the run as worker `rank` exactly as pfcps-worker does:
 * the data plane's interface (daemon_bind_data_plane), the two endpoints (train_net_open /
 * train_net_address), the join (cli_join_run, up to ctl_timeout), the run config's check against this one
 * (train_net_check_run; world_size must equal the run's workers), the connections to every server and the
 * ring (train_net_connect). Raises PfcpsError with pfcps's message on any failure (servers unreachable, wrong
 * secret: "... within ctl_timeout"). */
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
        PyErr_SetString(PyExc_RuntimeError, "pfcps worker: already joined");
        return -1;
    }
    if (world < 1 || rank < 0 || rank >= world) {
        PyErr_Format(PyExc_ValueError, "pfcps worker: rank %d outside [0, world_size %d)", rank, world);
        return -1;
    }
    /* The overrides as C strings, "workers=<world_size>" first (the run must have one worker per rank). */
    PyObject *seq =
        sets_obj && sets_obj != Py_None ? PySequence_Fast(sets_obj, "sets must be a sequence") : NULL;
    if (sets_obj && sets_obj != Py_None && !seq)
        return -1;
    Py_ssize_t ns = seq ? PySequence_Fast_GET_SIZE(seq) : 0;
    const char **sets = calloc((size_t)ns + 1, sizeof *sets);
    char wset[64];
    snprintf(wset, sizeof wset, "workers=%d", world);
    int rc = 0;
    if (!sets) {
        Py_XDECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    sets[0] = wset;
    for (Py_ssize_t i = 0; i < ns; i++) {
        sets[i + 1] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, i));
        if (!sets[i + 1]) {
            free(sets);
            Py_XDECREF(seq);
            return -1;
        }
    }
    w->rank = rank;
    w->world_size = world;
    log_init("torch", rank);
    /* As pfcps-worker: per-step buffers (the sampled ids, the messages' rows) reuse heap pages instead of
     * fresh zeroed mmaps every step (common/daemon.h). Process-wide: the training process' malloc. */
    daemon_tune_malloc();
    rc = cfg_load_ex(&w->cfg, path, sets, (int)ns + 1, 0);
    free(sets);
    Py_XDECREF(seq);
    if (rc < 0) {
        raise_code(rc, pf_errmsg());
        return -1;
    }
    /* The caller's C and D (0: not checked) against the config before joining: a mismatch must not join and
     * leave (a run whose only worker leaves ends). The run's own values are checked after the join. */
    if ((want_c > 0 && w->cfg.num_classes != want_c) || (want_d > 0 && w->cfg.embedding_size != want_d)) {
        PyErr_Format(
            PyExc_ValueError,
            "pfcps worker: num_classes=%lld, embedding_size=%d asked, but %s has num_classes = %lld, "
            "embedding_size = %d",
            want_c, want_d, path, (long long)w->cfg.num_classes, w->cfg.embedding_size);
        return -1;
    }
    const char *secret = NULL;
    if ((rc = cli_member_check(&w->cfg, rank, w->cfg.workers, "workers", w->host, sizeof w->host, &w->port,
                               &secret)) < 0) {
        raise_code(rc, pf_errmsg());
        return -1;
    }
    snprintf(w->secret, sizeof w->secret, "%s", secret);
    uint8_t packed[CTL_MAX_ADDR];
    size_t plen = sizeof packed;
    Py_BEGIN_ALLOW_THREADS
    rc = daemon_bind_data_plane(&w->cfg, w->host, w->port);
    if (rc == 0)
        rc = train_net_open(&w->net, &w->cfg, rank);
    if (rc == 0)
        rc = train_net_address(&w->net, NULL, 0, packed, &plen);
    if (rc == 0)
        rc = cli_join_run(&w->cfg, w->host, w->port, CTL_ROLE_WORKER, rank, packed, plen, w->secret, &w->sess,
                          &w->run);
    if (rc == 0)
        rc = train_net_check_run(&w->cfg, &w->run); /* C, D, servers, wire dtype, provider: the run's */
    if (rc == 0 && w->run.workers != world)
        rc = pf_err(-EINVAL, "the run has workers = %d, but torch.distributed has world_size %d",
                    w->run.workers, world);
    if (rc == 0)
        rc = train_net_connect(&w->net, &w->run, ctl_session_book(w->sess), rank, w->secret);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        /* The endpoints stay open until the process exits (common/daemon.h, daemon_exit_now: libfabric 1.17's
         * tcp;ofi_rxm may crash in fi_close while peers go away); the session is closed. */
        if (w->sess) {
            ctl_session_close(w->sess);
            w->sess = NULL;
        }
        raise_code(rc, pf_errmsg());
        return -1;
    }
    w->joined = 1;
    w->watching = pthread_create(&w->watcher, NULL, watch_main, w) == 0;
    return 0;
}

/* head_init(batch, sample_rate, s, m1, m2, m3, threshold): the Partial FC head of this worker (pfc_init,
 * global head mode: the W x batch rows of all workers, this worker's partition of the classes c mod W ==
 * rank, its straight-through margin gradient as arcface_torch's CombinedMarginLoss, the loss floored as its
 * clamp_min(1e-30)). batch: rows per worker per step, fixed from here on. */
static PyObject *Worker_head_init(Worker *w, PyObject *args)
{
    long long batch;
    double rate, s, m1, m2, m3, thr;
    if (!PyArg_ParseTuple(args, "Ldddddd", &batch, &rate, &s, &m1, &m2, &m3, &thr))
        return NULL;
    if (check_usable(w) < 0)
        return NULL;
    if (w->head_ready)
        return raise_code(-EINVAL, "pfcps worker: head_init twice");
    /* The margin loss's values through the config's rules (margin_combine: arcface_torch's CombinedMarginLoss
     * reads m3 > 0 as CosFace alone and refuses m1 != 1 otherwise). */
    pf_config c = w->run;
    c.scale = s;
    c.margin_list[0] = m1;
    c.margin_list[1] = m2;
    c.margin_list[2] = m3;
    c.interclass_filtering_threshold = thr;
    head_params hp;
    int rc = head_params_from_config(&c, &hp);
    if (rc < 0)
        return raise_code(rc, pf_errmsg());
    if (hp.m1 != m1 || hp.m2 != m2)
        log_warn("margin (%g, %g, %g): m3 > 0 is CosFace alone in arcface_torch's CombinedMarginLoss, so m1 and m2 "
                 "are unused (margin_combine = full in the run combines them)",
                 m1, m2, m3);
    hp.margin_grad = HEAD_MARGIN_GRAD_STRAIGHT_THROUGH;
    hp.mode = HEAD_MODE_GLOBAL;
    hp.clamp_loss = 1;
    rc = pfc_init(&w->x, &hp, &w->net.coll, w->run.num_classes, rate, (uint64_t)w->run.seed, batch,
                  w->run.embedding_size);
    if (rc < 0)
        return raise_code(rc, pf_errmsg());
    size_t kd = (size_t)w->x.k_max * (size_t)w->run.embedding_size;
    w->centers = malloc((kd ? kd : 1) * sizeof(float));
    w->grad_centers = malloc((kd ? kd : 1) * sizeof(float));
    if (!w->centers || !w->grad_centers) {
        pfc_free(&w->x);
        return PyErr_NoMemory();
    }
    w->head_ready = 1;
    Py_RETURN_NONE;
}

/* Sends the empty, skipped push of a step whose forward ran without a backward. 0 or a negative code. */
static int push_skipped(Worker *w)
{
    /* No rows, but real buffers: the client borrows the gradients (train_net_connect) and refuses NULL. */
    ps_req *req = NULL;
    int rc = ps_push_ex(w->net.ps, w->x.ids, 0, w->grad_centers, 0.0f, w->step, PS_PUSH_SKIPPED, &req);
    if (rc == 0)
        rc = ps_wait(w->net.ps, req, w->net.wait_s);
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

/* forward(embeddings, labels, grad_embeddings) -> loss. embeddings: (batch, D) float32, C-contiguous; labels:
 * (batch) int64; grad_embeddings: writable (batch, D) float32. Samples, pulls and runs the head for step
 * `step` (one step of the whole run: every worker calls it with its own batch), returns the global mean loss
 * over the W x batch rows (float, the same on every rank) and writes dL/d(this rank's embeddings) of that
 * mean into grad_embeddings. A previous forward without backward gets its skipped push first. Raises
 * PfcpsError: a label outside [0, num_classes) (the worker stays usable), a server or ring failure, the loss
 * not finite. */
static PyObject *Worker_forward(Worker *w, PyObject *args)
{
    PyObject *eo, *lo, *go;
    if (!PyArg_ParseTuple(args, "OOO", &eo, &lo, &go))
        return NULL;
    if (check_usable(w) < 0)
        return NULL;
    if (!w->head_ready)
        return raise_code(-EINVAL, "pfcps worker: forward before head_init");
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
    const int64_t *ids = NULL;
    int64_t k = 0;
    Py_BEGIN_ALLOW_THREADS
    if (w->pending) {
        rc = push_skipped(w);
        if (rc == 0) {
            w->pending = 0;
            w->step++;
        }
    }
    double t0 = pf_now_s(), t1 = t0, t2 = t0, t3 = t0;
    if (rc == 0) {
        stage = 1;
        rc = pfc_sample(&w->x, w->step, (const int64_t *)lb.buf, &ids, &k);
        t1 = pf_now_s();
    }
    ps_req *req = NULL;
    if (rc == 0) {
        stage = 2;
        rc = ps_pull(w->net.ps, ids, (size_t)k, w->centers, w->step, &req);
    }
    if (rc == 0) {
        rc = ps_wait(w->net.ps, req, w->net.wait_s);
        t2 = pf_now_s();
    }
    if (rc == 0) {
        stage = 3;
        rc = pfc_step(&w->x, (const float *)eb.buf, w->centers, &loss, (float *)gb.buf, w->grad_centers);
        t3 = pf_now_s();
    }
    w->phase_s[0] = t1 - t0;
    w->phase_s[1] = t2 - t1;
    w->phase_s[2] = t3 - t2;
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&eb);
    PyBuffer_Release(&lb);
    PyBuffer_Release(&gb);
    if (rc < 0) {
        if (stage == 1 && rc == -ERANGE)
            return raise_code(rc, pf_errmsg()); /* nothing sent for this step: the worker stays usable */
        return fail_step(w, rc,
                         stage == 0   ? "the skipped push of the step before"
                         : stage == 1 ? "sampling"
                         : stage == 2 ? "pull"
                                      : "head");
    }
    w->pending = 1;
    w->last_k = k;
    return PyFloat_FromDouble(loss);
}

/* backward(lr): pushes the row gradients of the last forward's sampled rows with learning rate lr (float, the
 * servers apply SGD with the run's momentum and weight_decay at that lr) and waits for the servers to take
 * it; the step is then done. Raises PfcpsError when no forward is pending or the push fails. */
static PyObject *Worker_backward(Worker *w, PyObject *args)
{
    double lr;
    if (!PyArg_ParseTuple(args, "d", &lr))
        return NULL;
    if (check_usable(w) < 0)
        return NULL;
    if (!w->pending)
        return raise_code(-EINVAL,
                          "pfcps worker: backward without a forward (each forward has one backward)");
    int rc;
    Py_BEGIN_ALLOW_THREADS
    ps_req *req = NULL;
    double t0 = pf_now_s();
    rc = ps_push(w->net.ps, w->x.ids, (size_t)w->last_k, w->grad_centers, (float)lr, w->step, &req);
    if (rc == 0)
        rc = ps_wait(w->net.ps, req, w->net.wait_s);
    w->phase_s[3] = pf_now_s() - t0;
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return fail_step(w, rc, "push");
    w->pending = 0;
    w->step++;
    Py_RETURN_NONE;
}

/* skip(): a forward that will get no backward (evaluation, a skipped optimizer step): its empty push, flagged
 * skipped, goes now. No-op when nothing is pending. */
static PyObject *Worker_skip(Worker *w, PyObject *noargs)
{
    (void)noargs;
    if (check_usable(w) < 0)
        return NULL;
    if (!w->pending)
        Py_RETURN_NONE;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = push_skipped(w);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return fail_step(w, rc, "skipped push");
    w->pending = 0;
    w->step++;
    Py_RETURN_NONE;
}

/* Stops the watcher, leaves the run in order (a pending push is sent skipped first, and every worker meets at
 * a ring barrier when the run is healthy) and closes the control session. The fabric endpoints stay open
 * until the process exits (as pfcps-worker: common/daemon.h daemon_exit_now). */
static void worker_leave(Worker *w)
{
    if (!w->joined)
        return;
    int healthy = !w->failed && !__atomic_load_n(&w->broken, __ATOMIC_ACQUIRE);
    Py_BEGIN_ALLOW_THREADS
    if (healthy && w->pending && push_skipped(w) == 0)
        w->pending = 0;
    if (healthy && w->net.have_coll)
        coll_barrier(&w->net.coll);
    __atomic_store_n(&w->watch_done, 1, __ATOMIC_RELEASE);
    if (w->watching)
        pthread_join(w->watcher, NULL);
    w->watching = 0;
    ctl_session_leave(w->sess);
    ctl_session_close(w->sess);
    Py_END_ALLOW_THREADS
    w->sess = NULL;
    w->joined = 0;
}

static PyObject *Worker_close(Worker *w, PyObject *noargs)
{
    (void)noargs;
    worker_leave(w);
    Py_RETURN_NONE;
}

static void Worker_dealloc(Worker *w)
{
    worker_leave(w);
    pfc_free(&w->x);
    free(w->centers);
    free(w->grad_centers);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

/* run_config: a dict of the run config keys the Python side checks or reports. */
static PyObject *Worker_run_config(Worker *w, void *closure)
{
    (void)closure;
    if (!w->joined && !w->sess && w->run.num_classes == 0)
        return raise_code(-EINVAL, "pfcps worker: not joined");
    const pf_config *r = &w->run;
    return Py_BuildValue("{s:L,s:i,s:i,s:i,s:d,s:d,s:d,s:d,s:d,s:(ddd),s:d,s:L,s:i,s:s,s:s,s:s,s:d,s:s,s:s}",
                         "num_classes", (long long)r->num_classes, "embedding_size", r->embedding_size,
                         "servers", r->servers, "workers", r->workers, "lr", r->lr, "momentum", r->momentum,
                         "weight_decay", r->weight_decay, "sample_rate", r->sample_rate, "scale", r->scale,
                         "margin_list", r->margin_list[0], r->margin_list[1], r->margin_list[2],
                         "interclass_filtering_threshold", r->interclass_filtering_threshold, "seed",
                         (long long)r->seed, "batch_size", r->batch_size, "optimizer", r->optimizer,
                         "pfc_update", r->pfc_update, "head_mode", r->head_mode, "ctl_timeout",
                         r->ctl_timeout, "provider", r->provider, "wire_dtype", r->wire_dtype);
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
    {"head_init", (PyCFunction)Worker_head_init, METH_VARARGS,
     "head_init(batch, sample_rate, s, m1, m2, m3, threshold): set up the Partial FC head (pfc_init)"},
    {"forward", (PyCFunction)Worker_forward, METH_VARARGS,
     "forward(embeddings, labels, grad_embeddings) -> loss: sample, pull, head forward + backward"},
    {"backward", (PyCFunction)Worker_backward, METH_VARARGS,
     "backward(lr): push the sampled rows' gradients at lr and wait"},
    {"skip", (PyCFunction)Worker_skip, METH_NOARGS, "skip(): end a forward that gets no backward"},
    {"close", (PyCFunction)Worker_close, METH_NOARGS, "close(): leave the run in order"},
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
    .tp_doc = "Worker(config, rank, world_size, sets=()): one pfcps worker joined to a run",
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
