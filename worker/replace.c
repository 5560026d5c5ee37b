/* A worker's side of a lost worker's replacement in place (docs/architecture.md, "Worker replacement in
 * place"): a survivor stops where it stands when told a worker was lost, reports the first step it has not
 * finished with a new collectives endpoint, waits for the rendezvous' redo step (the servers have undone every
 * push of it and later by then), restores its state at that step's start (worker/generation.h), connects the
 * new ring and, as the donor, writes its state for the replacement to load. */
#include <errno.h>
#include <stdio.h>
#include <time.h>

#include "common/ckpt.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "worker/device.h"
#include "worker/generation.h"
#include "worker/ps_client.h"
#include "worker/train_state.h"

int train_replace_notice(trainer *t, int kind, int rank, uint32_t epoch, int64_t step)
{
    if (!t || !t->wr_on)
        return 0;
    if (atomic_load(&t->end_voted))
        return 2;
    if (kind == CTL_FO_RUN_ENDED) {
        t->wr_lost = rank;
        atomic_store(&t->wr_run_ended, 1);
        if (atomic_load(&t->wr_lost_epoch) < epoch)
            atomic_store(&t->wr_lost_epoch, epoch);
        return 1;
    }
    if (kind == CTL_FO_WORKER_LOST) {
        t->wr_lost = rank;
        atomic_store(&t->wr_lost_epoch, epoch);
    } else if (kind == CTL_FO_REDO) {
        t->wr_redo_step = step;
        t->wr_donor = rank;
        atomic_store(&t->wr_redo_epoch, epoch);
    }
    return 1;
}

/* Waits until *epoch (a notice's epoch, stored by the control watcher) is newer than `after`, up to limit_s
 * seconds or until a stop is asked for. Returns 0, -ECANCELED (a stop) or -ETIMEDOUT, without a message. */
static int wait_notice(const trainer *t, _Atomic uint32_t *epoch, uint32_t after, double limit_s)
{
    const double t0 = pf_now_s();
    while (atomic_load(epoch) <= after) {
        if (t->opts.stop_flag && *t->opts.stop_flag)
            return -ECANCELED;
        if (pf_now_s() - t0 > limit_s)
            return -ETIMEDOUT;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

/* Reports this worker's first unfinished step and its new ring endpoint for the worker-lost notice of
 * `epoch`. A rendezvous lost with server 0 (-ENOTCONN) is no failure: its restarted one begins the
 * replacement again with a new notice, reported then. Returns 0 or the send's negative code. */
static int report_step(trainer *t, uint32_t epoch, int64_t step, const uint8_t *addr, size_t alen)
{
    int rc = ctl_session_report(t->opts.sess, CTL_FO_WORKER_REPORT, t->rank, epoch, step, addr, alen);
    if (rc == -ENOTCONN) {
        log_warn(
            "worker replacement: the rendezvous is lost with server 0 before this worker's report: waiting "
            "for a restarted one to begin the replacement again");
        return 0;
    }
    return rc;
}

/* Waits for a redo notice newer than the worker-lost notice reported (*reported), up to limit_s after the
 * newest report. A newer worker-lost notice (a restarted rendezvous that begins the replacement again, its
 * predecessor lost with server 0 before the redo) is reported in turn (report_step, the same step and
 * endpoint) and the wait goes on. A stop means the rendezvous said the replacement failed and the run
 * re-forms. Returns 0, 1 when the rendezvous said the run ended instead (CTL_FO_RUN_ENDED), or -ETIMEDOUT /
 * -ECANCELED / the report's code, with a message. */
static int wait_redo(trainer *t, uint32_t *reported, uint32_t seen_redo, int64_t step, const uint8_t *addr,
                     size_t alen, double limit_s)
{
    double t0 = pf_now_s();
    for (;;) {
        const uint32_t after = seen_redo > *reported ? seen_redo : *reported;
        if (atomic_load(&t->wr_run_ended))
            return 1;
        if (atomic_load(&t->wr_redo_epoch) > after)
            return 0;
        const uint32_t lost = atomic_load(&t->wr_lost_epoch);
        if (lost > *reported) {
            log_warn("worker replacement: worker %d lost (epoch %u) again told by a restarted rendezvous: "
                     "reporting step %lld again",
                     t->wr_lost, lost, (long long)step);
            *reported = lost;
            int rc = report_step(t, lost, step, addr, alen);
            if (rc < 0)
                return rc;
            t0 = pf_now_s();
            continue;
        }
        if (t->opts.stop_flag && *t->opts.stop_flag)
            return pf_err(-ECANCELED, "worker replacement: the run stopped while waiting for the redo");
        if (pf_now_s() - t0 > limit_s)
            return pf_err(-ETIMEDOUT, "worker replacement: no redo from the rendezvous within %.0f s",
                          limit_s);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

int train_replace_await(trainer *t, uint32_t after)
{
    if (!t->wr_on)
        return 0;
    const double t0 = pf_now_s(), tmo = t->run.ctl_timeout > 0 ? t->run.ctl_timeout : 30;
    double limit = ctl_member_silence_s(tmo) + 2;
    const int shard = t->net.ps ? ps_client_shard_without_copy(t->net.ps) : -1;
    if (shard >= 0) {
        /* Both copies of a shard are gone: replacing a worker cannot save the run (the re-form can). */
        log_warn(
            "this worker's step failed (%s) and shard %d has no live copy left: no worker replacement can "
            "go on",
            pf_errmsg(), shard);
        return 0;
    }
    if (t->opts.sess && ctl_session_server_lost(t->opts.sess, 0)) {
        /* The rendezvous is lost with server 0 (or a restarted one has not seen server 0 rejoin): a worker lost
         * now is told once server 0 is started again and its rendezvous finds the worker missing among those
         * that resume (the silence limit after the last of them): wait for that, up to 2 x ctl_timeout. */
        limit = 2 * tmo;
        log_warn("this worker's step failed (%s) while the rendezvous is lost with server 0: waiting up to %.0f s "
                 "for a restarted rendezvous to say whether a worker was lost",
                 pf_errmsg(), limit);
    }
    if (wait_notice(t, &t->wr_lost_epoch, after, limit) < 0)
        return 0;
    if (!atomic_load(&t->wr_run_ended))
        log_info("a worker-lost notice came %.3f s after this worker's step failed", pf_now_s() - t0);
    return 1;
}

/* Exchanges the model's BN running statistics with t->bn0 (worker 0's, as this worker holds them), through
 * device scratch. Returns 0 or the device's negative code (the two then possibly mixed: the caller gives up). */
static int swap_rank0_buffers(trainer *t)
{
    const size_t bytes = model_num_buffer_floats(t->m) * sizeof(float);
    float *own = model_buffers(t->m), *tmp = NULL;
    if (!t->bn0 || bytes == 0)
        return 0;
    int rc = t->wd.dev->mem_alloc(t->wd.ctx, (void **)&tmp, bytes);
    if (rc == 0 && (rc = t->wd.dev->mem_d2d(t->wd.ctx, tmp, own, bytes)) == 0 &&
        (rc = t->wd.dev->mem_d2d(t->wd.ctx, own, t->bn0, bytes)) == 0)
        rc = t->wd.dev->mem_d2d(t->wd.ctx, t->bn0, tmp, bytes);
    if (tmp)
        t->wd.dev->mem_free(t->wd.ctx, tmp);
    return rc < 0 ? pf_err_wrap(rc, "worker 0's BN statistics (%zu bytes)", bytes) : 0;
}

/* The donor: its state of the redo step, restored already, goes to <checkpoint root>/replace for the
 * replacement (a folder of its own, so no checkpoint of the run is made to look complete or pruned), with
 * worker 0's BN running statistics in place of its own: they are the ones model.ckpt saves, so a lost worker 0
 * gets its own back, and any other replacement a copy it keeps for a later loss of worker 0 (a worker's own
 * statistics reach no output but worker 0's). */
static int write_for_replacement(trainer *t, int64_t step, uint32_t epoch, double first_loss, double loss_sum,
                                 int loss_n)
{
    char root[4200];
    snprintf(root, sizeof root, "%s/replace", t->ckpt_root);
    const double t0 = pf_now_s();
    int rc = swap_rank0_buffers(t);
    if (rc == 0) {
        rc = train_write_state(t, root, step, first_loss, loss_sum, loss_n);
        int rc2 = swap_rank0_buffers(t);
        rc = rc < 0 ? rc : rc2;
    }
    if (rc < 0)
        return pf_err_wrap(rc, "worker replacement: writing this worker's state of step %lld", (long long)step);
    wresume_prune(root, t->rank, 1, &t->ckpt_id);
    log_info("worker replacement: this worker's state of step %lld written to %s for worker %d's replacement "
             "in %.2f s",
             (long long)step, root, t->wr_lost, pf_now_s() - t0);
    return ctl_session_report(t->opts.sess, CTL_FO_STATE_READY, t->rank, epoch, step, NULL, 0);
}

/* The rendezvous said the run ended (CTL_FO_RUN_ENDED): a worker was lost after the others passed the end
 * vote, which this worker's own vote failed with. Its outputs are written (it voted after writing them), so
 * training is done at `step`, the last. Returns 1 with *redo = step, or -EPROTO when `step` is not the
 * last. */
static int run_ended(trainer *t, int64_t step, int64_t *redo)
{
    const int64_t total = train_total_steps(t);
    if (step != total)
        return pf_err(
            -EPROTO,
            "worker replacement: the rendezvous said the run ended (the others passed the end vote) "
            "while this worker stands at step %lld of %lld",
            (long long)step, (long long)total);
    if (t->opts.interrupt)
        __atomic_store_n(t->opts.interrupt, 0, __ATOMIC_RELEASE);
    log_warn(
        "worker %d was lost after the others passed the end vote at step %lld, this worker's vote failing "
        "with it: every worker's final outputs are written; training is done",
        t->wr_lost, (long long)step);
    *redo = step;
    return 1;
}

int train_replace(trainer *t, int64_t step, double first_loss, double loss_sum, int loss_n, int64_t *redo,
                  uint32_t *handled)
{
    const uint32_t lost_epoch = atomic_load(&t->wr_lost_epoch);
    const uint32_t seen_redo = atomic_load(&t->wr_redo_epoch);
    const double t0 = pf_now_s(), tmo = t->run.ctl_timeout > 0 ? t->run.ctl_timeout : 30;
    if (!t->wr_on || lost_epoch == 0 || !t->opts.sess)
        return pf_err(-EINVAL, "worker replacement: no worker-lost notice");
    if (atomic_load(&t->wr_run_ended))
        return run_ended(t, step, redo);
    /* Steps are counted from 0 here, as "steps completed before it": the log lines' "Global Step: N" counts
     * the steps finished, so step s is the one logged as Global Step s + 1. */
    log_warn("worker %d lost (epoch %u): stopping at step %lld (logged as Global Step: %lld) (%s) to redo "
             "with its "
             "replacement",
             t->wr_lost, lost_epoch, (long long)step, (long long)step + 1, pf_errmsg());
    /* The abandoned step's requests were released by their failed waits; its ring is unusable. */
    if (t->opts.interrupt)
        __atomic_store_n(t->opts.interrupt, 0, __ATOMIC_RELEASE);
    uint8_t addr[CTL_MAX_ADDR];
    size_t alen = sizeof addr;
    int rc = train_net_ring_reopen(&t->net, t->local.provider, addr, &alen);
    uint32_t reported = lost_epoch;
    if (rc == 0)
        rc = report_step(t, lost_epoch, step, addr, alen);
    if (rc == 0)
        rc = wait_redo(t, &reported, seen_redo, step, addr, alen, 2 * tmo);
    if (rc == 1)
        return run_ended(t, step, redo);
    if (rc < 0)
        return rc;
    *handled = reported;
    /* A notice told again while waiting raised the fabric interrupt once more: cleared, unless a newer loss
     * (after the redo) came meanwhile, whose interrupt stays raised. */
    if (t->opts.interrupt) {
        __atomic_store_n(t->opts.interrupt, 0, __ATOMIC_RELEASE);
        if (atomic_load(&t->wr_lost_epoch) > reported)
            __atomic_store_n(t->opts.interrupt, 1, __ATOMIC_RELEASE);
    }
    const uint32_t epoch = atomic_load(&t->wr_redo_epoch);
    const int64_t R = t->wr_redo_step;
    if ((rc = train_rewind(t, R)) < 0)
        return pf_err_wrap(rc, "worker replacement: restoring the state of step %lld", (long long)R);
    ps_client_set_epoch(t->net.ps, epoch);
    if ((rc = train_net_ring_connect(&t->net, ctl_session_book(t->opts.sess), t->rank)) < 0)
        return pf_err_wrap(rc, "worker replacement: the new ring");
    if (t->wr_donor == t->rank && (rc = write_for_replacement(t, R, epoch, first_loss, loss_sum, loss_n)) < 0)
        return rc;
    const int64_t total = train_total_steps(t);
    if (R >= total)
        log_warn(
            "worker replacement (epoch %u): every step was done; worker %d's replacement writes its part of "
            "the final outputs and the run ends with it (%.2f s since the notice)",
            epoch, t->wr_lost, pf_now_s() - t0);
    else
        log_warn(
            "worker replacement (epoch %u): redoing from step %lld (logged as Global Step: %lld) with worker "
            "%d's replacement (%.2f s since the notice)",
            epoch, (long long)R, (long long)R + 1, t->wr_lost, pf_now_s() - t0);
    *redo = R;
    return 0;
}
