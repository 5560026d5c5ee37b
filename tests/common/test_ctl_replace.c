/* The rendezvous' side of a worker's replacement in place (docs/architecture.md, "Worker replacement in
 * place"), with members that are control sessions only (no data plane): 1 server + 2 workers, replicas = 1,
 * head_mode = global, replace_workers = 1, the rendezvous in this process. Cases:
 *   happy:    worker 1's session closes without leaving: the server and worker 0 are told "worker[1] ...
 * lost" (kind 6, epoch 1); a report of another epoch changes nothing; worker 0 reports step 5 with a new book
 * entry, the server 4 whole pushes; a replacement for rank 1 joins (a second one is refused, EEXIST); the
 * server is told to roll back to step 4 = min(5, 4) at epoch 2 with the replacement's entry; once it says
 * rolled back, worker 0 gets the redo (step 4, donor 0, both workers' entries: its new one, the
 * replacement's) and its session's book follows; once it says its state is ready, the replacement's join
 * returns with resume step 4, epoch 2, donor 0 and worker 0's new entry; too_far:  a survivor reports step 9
 * while the server holds 4 pushes (R = 4, the survivor 5 steps past it: it keeps two): the fallback to the
 * re-form, told to every member (-ENOLINK) and the replacement refused; acc:      gradient_acc = 3: reports
 * of step 7 and 8 pushes give the redo step 6 (the window's start); a survivor at step 13 with the redo step
 * 6 is more than one window past it: the fallback; timeout:  no replacement joins within ctl_timeout (1 s):
 * the fallback, naming it; early:    a join for rank 1 while worker 1 is still a member is asked to retry
 * (EAGAIN), then taken; off:      replace_workers = 0: the loss is told at once as a re-form (-ENOLINK);
 *   server_lost: 2 servers: a server failed over before a worker's loss, or lost during its replacement
 *             (before or after the decision), leaves the replacement going on without it; a second worker
 * lost during a replacement re-forms the run (case_server_lost says how each is checked);
 *   adopt:    worker 1 lost together with server 0 (the rendezvous' process): the restarted rendezvous adopts
 *             the run without it and replaces it in place (case_adopt says how);
 *   adopt_mid: server 0 lost during worker 1's replacement: the restarted rendezvous begins it again
 *             (case_adopt_mid);
 *   setup:    a survivor still in its set-up says it has no step to redo: the fallback at once (case_setup);
 *   left:     a survivor leaves in order (training done) during the replacement: the fallback at once;
 *   end_voted: a worker passed the end vote: a worker lost before or after that is not replaced and re-forms
 *             nothing; the run ends (case_end_voted says how). */
#include "common/clock.h"
#include "common/ctl.h"
#include "common/err.h"
#include "tests/check.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#define SECRET "replace-test-secret"
#define MAXF   65536

#include "tests/common/ctl_member.h"

static int g_port_at; /* the port start_n binds (0: a free one) */
static int g_acc; /* the rendezvous' gradient_acc (0: none) */

static ctl_rendezvous *start_n(int servers, int replace, double timeout_s)
{
    ctl_rendezvous_opts o = {.bind_host = "127.0.0.1",
                             .port = g_port_at,
                             .num_servers = servers,
                             .num_workers = 2,
                             .secret = SECRET,
                             .max_frame = MAXF,
                             .timeout_s = timeout_s,
                             .config_text = "[cluster]\nreplicas = 1\n",
                             .replicas = 1,
                             .rejoin = 1,
                             .replace_workers = replace,
                             .gradient_acc = g_acc};
    ctl_rendezvous *rv;
    if (ctl_rendezvous_start(&o, &rv) < 0)
        DIE("rendezvous: %s", pf_errmsg());
    port = ctl_rendezvous_port(rv);
    return rv;
}

static ctl_rendezvous *start(int replace, double timeout_s)
{
    return start_n(1, replace, timeout_s);
}

/* server 0, worker 0, worker 1 joined into m[3]. */
static void join_all(member m[3])
{
    m[0] = (member){.role = CTL_ROLE_SERVER, .rank = 0, .addr = "fab-s0", .timeout = 10};
    m[1] = (member){.role = CTL_ROLE_WORKER, .rank = 0, .addr = "fab-w0", .timeout = 10};
    m[2] = (member){.role = CTL_ROLE_WORKER, .rank = 1, .addr = "fab-w1", .timeout = 10};
    for (int i = 0; i < 3; i++)
        pthread_create(&m[i].th, NULL, join_main, &m[i]);
    for (int i = 0; i < 3; i++) {
        pthread_join(m[i].th, NULL);
        if (m[i].rc < 0)
            DIE("member %d did not join: %s", i, pf_errmsg());
    }
}

/* The next notice on s within 5 s: its kind, rank in *rank, epoch in *epoch, step in *step (-1: none came). */
static int next_notice(ctl_session *s, int *rank, uint32_t *epoch, int64_t *step)
{
    int r = ctl_session_wait_shutdown(s, 5.0);
    if (r != 2)
        return r < 0 ? r : -1;
    *epoch = ctl_session_failover(s, rank, NULL);
    return ctl_session_failover_kind(s, step, NULL, NULL);
}

/* Worker 1 lost: both others get kind 6 for rank 1 at epoch 1. */
static void lose_worker1(member m[3], const char *name)
{
    ctl_session_close(m[2].s); /* without leaving: a crash */
    m[2].s = NULL;
    for (int i = 0; i < 2; i++) {
        int rank = -1;
        uint32_t e = 0;
        int64_t st = 0;
        int k = next_notice(m[i].s, &rank, &e, &st);
        check(k == CTL_FO_WORKER_LOST && rank == 1 && e == 1, "%s: member %d told worker 1 lost at epoch 1 "
              "(kind %d, rank %d, epoch %u)", name, i, k, rank, e);
    }
}

static void case_happy(void)
{
    ctl_rendezvous *rv = start(1, 8);
    member m[3];
    join_all(m);
    lose_worker1(m, "happy");
    /* A report of another epoch is ignored: nothing is decided from it. */
    CHECK(ctl_session_report(m[1].s, CTL_FO_WORKER_REPORT, 0, 7, 1, "stale", 5) == 0, "report");
    CHECK(ctl_session_report(m[1].s, CTL_FO_WORKER_REPORT, 0, 1, 5, "fab-w0-new", 10) == 0, "report");
    CHECK(ctl_session_report(m[0].s, CTL_FO_WORKER_REPORT, 0, 1, 4, NULL, 0) == 0, "report");
    member r = {.role = CTL_ROLE_WORKER, .rank = 1, .addr = "fab-w1-again", .timeout = 10};
    pthread_create(&r.th, NULL, join_main, &r);
    usleep(300000);
    member r2 = {.role = CTL_ROLE_WORKER, .rank = 1, .addr = "fab-w1-third", .timeout = 1};
    join_main(&r2);
    check(r2.rc == -EEXIST, "happy: a second replacement is refused with EEXIST (%d: %s)", r2.rc, pf_errmsg());
    int rank = -1;
    uint32_t e = 0;
    int64_t st = -1;
    int k = next_notice(m[0].s, &rank, &e, &st);
    const uint8_t *a = NULL;
    size_t al = 0;
    ctl_session_failover_kind(m[0].s, NULL, &a, &al);
    check(k == CTL_FO_ROLLBACK && rank == 1 && e == 2 && st == 4, "happy: the server rolls back to step 4 at epoch "
          "2 (kind %d, rank %d, epoch %u, step %lld)", k, rank, e, (long long)st);
    check(al == strlen("fab-w1-again") && !memcmp(a, "fab-w1-again", al), "happy: with the replacement's entry");
    const ctl_book *sb = ctl_session_book(m[0].s);
    check(sb->workers[1].addr_len == al && !memcmp(sb->workers[1].addr, "fab-w1-again", al),
          "happy: the server's book follows the replacement");
    CHECK(ctl_session_report(m[0].s, CTL_FO_ROLLED_BACK, 0, 2, 4, NULL, 0) == 0, "rolled back");
    k = next_notice(m[1].s, &rank, &e, &st);
    check(k == CTL_FO_REDO && rank == 0 && e == 2 && st == 4, "happy: worker 0 redoes step 4 as the donor "
          "(kind %d, donor %d, epoch %u, step %lld)", k, rank, e, (long long)st);
    const ctl_book *wb = ctl_session_book(m[1].s);
    check(wb->workers[0].addr_len == 10 && !memcmp(wb->workers[0].addr, "fab-w0-new", 10) &&
              wb->workers[1].addr_len == 12 && !memcmp(wb->workers[1].addr, "fab-w1-again", 12),
          "happy: worker 0's book has its new entry and the replacement's");
    CHECK(ctl_session_report(m[1].s, CTL_FO_STATE_READY, 0, 2, 4, NULL, 0) == 0, "state ready");
    pthread_join(r.th, NULL);
    check(r.rc == 0, "happy: the replacement's join returns (%s)", r.rc ? pf_errmsg() : "");
    if (r.rc == 0) {
        const ctl_book *b = ctl_session_book(r.s);
        check(b->rejoin_epoch == 2 && b->donor == 0 && b->resume_step == 4,
              "happy: the replacement's book: epoch %u, donor %d, resume step %lld", b->rejoin_epoch, b->donor,
              (long long)b->resume_step);
        check(b->workers[0].addr_len == 10 && !memcmp(b->workers[0].addr, "fab-w0-new", 10),
              "happy: the replacement's book has worker 0's new entry");
        check(ctl_rendezvous_joined(rv) == 3, "happy: the replacement holds worker 1's seat (%d joined)",
              ctl_rendezvous_joined(rv));
        ctl_session_close(r.s);
    }
    ctl_session_close(m[0].s);
    ctl_session_close(m[1].s);
    ctl_rendezvous_stop(rv);
}

/* The fallback: every remaining member is told the re-form (-ENOLINK) with `why` in the message. */
static void expect_fallback(member m[3], const char *name, const char *why)
{
    for (int i = 0; i < 2; i++) {
        int r = ctl_session_wait_shutdown(m[i].s, 6.0);
        check(r == -ENOLINK && strstr(pf_errmsg(), why) && strstr(pf_errmsg(), "re-form"),
              "%s: member %d is told the re-form (%d: %s)", name, i, r, pf_errmsg());
    }
}

/* Worker 1 lost; worker 0 reports step u, the server p whole pushes; the replacement is refused and every
 * member told the re-form, naming `why`. */
static void far_fallback(const char *name, int64_t u, int64_t p, const char *why)
{
    ctl_rendezvous *rv = start(1, 8);
    member m[3];
    join_all(m);
    lose_worker1(m, name);
    CHECK(ctl_session_report(m[1].s, CTL_FO_WORKER_REPORT, 0, 1, u, "fab-w0-new", 10) == 0, "report");
    CHECK(ctl_session_report(m[0].s, CTL_FO_WORKER_REPORT, 0, 1, p, NULL, 0) == 0, "report");
    member r = {.role = CTL_ROLE_WORKER, .rank = 1, .addr = "fab-w1-again", .timeout = 5};
    join_main(&r);
    check(r.rc < 0, "%s: the replacement is refused (%d)", name, r.rc);
    expect_fallback(m, name, why);
    ctl_session_close(m[0].s);
    ctl_session_close(m[1].s);
    ctl_rendezvous_stop(rv);
}

static void case_too_far(void)
{
    far_fallback("too_far", 9, 4, "more than one step past the redo step 4");
}

/* acc: gradient_acc = 3: worker 0 reports step 7, the server 8 whole pushes: the redo step is 6, the start of
 * the window holding 7 (told to the server); then worker 0 at step 13 with the server at 7: the redo step 6 is
 * more than one window behind 13's window (12): the fallback. */
static void case_acc(void)
{
    g_acc = 3;
    ctl_rendezvous *rv = start(1, 8);
    member m[3];
    join_all(m);
    lose_worker1(m, "acc");
    CHECK(ctl_session_report(m[1].s, CTL_FO_WORKER_REPORT, 0, 1, 7, "fab-w0-new", 10) == 0, "report");
    CHECK(ctl_session_report(m[0].s, CTL_FO_WORKER_REPORT, 0, 1, 8, NULL, 0) == 0, "report");
    member r = {.role = CTL_ROLE_WORKER, .rank = 1, .addr = "fab-w1-again", .timeout = 10};
    pthread_create(&r.th, NULL, join_main, &r);
    int rank = -1;
    uint32_t e = 0;
    int64_t st = -1;
    int k = next_notice(m[0].s, &rank, &e, &st);
    check(k == CTL_FO_ROLLBACK && st == 6, "acc: the server rolls back to step 6, the start of step 7's window of "
          "3 (kind %d, step %lld)", k, (long long)st);
    ctl_session_close(m[0].s);
    ctl_session_close(m[1].s);
    pthread_join(r.th, NULL);
    if (r.rc == 0)
        ctl_session_close(r.s);
    ctl_rendezvous_stop(rv);

    far_fallback("acc far", 13, 7, "more than one gradient_acc window past the redo step 6");
    g_acc = 0;
}

static void case_timeout(void)
{
    ctl_rendezvous *rv = start(1, 1);
    member m[3];
    join_all(m);
    double t0 = pf_now_s();
    lose_worker1(m, "timeout");
    expect_fallback(m, "timeout", "no replacement joined within ctl_timeout");
    double dt = pf_now_s() - t0;
    check(dt > 0.9 && dt < 4, "timeout: given up after ctl_timeout (%.2f s)", dt);
    ctl_session_close(m[0].s);
    ctl_session_close(m[1].s);
    ctl_rendezvous_stop(rv);
}

/* setup: worker 1 lost while worker 0 is in its set-up (no step begun): worker 0 says it has no step to redo
 * (CTL_FO_NO_REDO) and the fallback comes at once, naming it, not after ctl_timeout (8 s here). */
static void case_setup(void)
{
    ctl_rendezvous *rv = start(1, 8);
    member m[3];
    join_all(m);
    lose_worker1(m, "setup");
    double t0 = pf_now_s();
    CHECK(ctl_session_report(m[1].s, CTL_FO_NO_REDO, 0, 1, 0, NULL, 0) == 0, "no-redo report");
    expect_fallback(m, "setup", "worker[0] was still in its set-up (no step begun)");
    double dt = pf_now_s() - t0;
    check(dt < 2, "setup: the fallback %.2f s after the report (ctl_timeout 8 s)", dt);
    ctl_session_close(m[0].s);
    ctl_session_close(m[1].s);
    ctl_rendezvous_stop(rv);
}

/* left: worker 1 lost, then worker 0 leaves the run in order (its training is done: worker 1 was lost in the
 * last step or the final save): the server is told the fallback at once, naming it, not after ctl_timeout. */
static void case_left(void)
{
    ctl_rendezvous *rv = start(1, 8);
    member m[3];
    join_all(m);
    lose_worker1(m, "left");
    double t0 = pf_now_s();
    CHECK(ctl_session_leave(m[1].s) == 0, "worker 0 leaves: %s", pf_errmsg());
    int r = ctl_session_wait_shutdown(m[0].s, 6.0);
    double dt = pf_now_s() - t0;
    check(r == -ENOLINK && strstr(pf_errmsg(), "worker[0] left the run (its training is done)") &&
              strstr(pf_errmsg(), "re-form"),
          "left: the server is told the re-form (%d: %s)", r, pf_errmsg());
    check(dt < 2, "left: the fallback %.2f s after worker 0 left (ctl_timeout 8 s)", dt);
    ctl_session_close(m[0].s);
    ctl_session_close(m[1].s);
    ctl_rendezvous_stop(rv);
}

/* The end of the run as seen by the others (every worker's final outputs are written once one of them passed
 * the end vote, CTL_FO_END_VOTED): with `lost_first`, worker 1 is lost before worker 0 says it passed the
 * vote (its replacement under way, a replacement joined and waiting), else after. Either way: no re-form (the
 * server is told nothing more), worker 0, not yet left, is told the run ended (kind 14, worker 1, step 20), a
 * replacement for rank 1 (the one waiting, or one joining later) is refused as "training is over"
 * (-ESHUTDOWN), and once worker 0 leaves every worker is counted gone (ctl_rendezvous_workers_done). */
static void case_end_voted(int lost_first)
{
    const char *name = lost_first ? "end_voted (lost first)" : "end_voted (vote first)";
    ctl_rendezvous *rv = start(1, 8);
    member m[3];
    join_all(m);
    member r = {.role = CTL_ROLE_WORKER, .rank = 1, .addr = "fab-w1-again", .timeout = 5};
    if (lost_first) {
        lose_worker1(m, name);
        pthread_create(&r.th, NULL, join_main, &r);
        usleep(300000);
        CHECK(ctl_session_report(m[1].s, CTL_FO_END_VOTED, 0, 0, 20, NULL, 0) == 0, "end-voted report");
        pthread_join(r.th, NULL);
    } else {
        CHECK(ctl_session_report(m[1].s, CTL_FO_END_VOTED, 0, 0, 20, NULL, 0) == 0, "end-voted report");
        usleep(200000);
        ctl_session_close(m[2].s); /* without leaving: a crash */
        m[2].s = NULL;
    }
    int rank = -1;
    uint32_t e = 0;
    int64_t st = 0;
    int k = next_notice(m[1].s, &rank, &e, &st);
    check(k == CTL_FO_RUN_ENDED && rank == 1 && st == 20,
          "%s: worker 0 is told the run ended (kind %d, rank %d, step %lld)", name, k, rank, (long long)st);
    if (!lost_first)
        join_main(&r);
    check(r.rc == -ESHUTDOWN && strstr(r.msg, "training is over"),
          "%s: a replacement for worker 1 is told training is over (%d: %s)", name, r.rc, r.msg);
    int sr = ctl_session_wait_shutdown(m[0].s, 0.5);
    check(sr == 0, "%s: the server is told of no re-form (%d: %s)", name, sr, sr < 0 ? pf_errmsg() : "");
    check(!ctl_rendezvous_workers_done(rv), "%s: worker 0 has not left yet", name);
    CHECK(ctl_session_leave(m[1].s) == 0, "worker 0 leaves: %s", pf_errmsg());
    double t0 = pf_now_s();
    while (!ctl_rendezvous_workers_done(rv) && pf_now_s() - t0 < 5)
        usleep(10000);
    check(ctl_rendezvous_workers_done(rv), "%s: every worker is gone once worker 0 left", name);
    ctl_session_close(m[0].s);
    ctl_session_close(m[1].s);
    ctl_rendezvous_stop(rv);
}

static void case_early(void)
{
    ctl_rendezvous *rv = start(1, 8);
    member m[3];
    join_all(m);
    member r = {.role = CTL_ROLE_WORKER, .rank = 1, .addr = "fab-w1-again", .timeout = 0.5};
    join_main(&r);
    check(r.rc == -ETIMEDOUT || r.rc == -EAGAIN, "early: a join while worker 1 is a member is retried (%d: %s)",
          r.rc, pf_errmsg());
    check(strstr(pf_errmsg(), "still a member") != NULL, "early: naming why: %s", pf_errmsg());
    lose_worker1(m, "early");
    ctl_session_close(m[0].s);
    ctl_session_close(m[1].s);
    ctl_rendezvous_stop(rv);
}

static void case_off(void)
{
    ctl_rendezvous *rv = start(0, 8);
    member m[3];
    join_all(m);
    ctl_session_close(m[2].s);
    m[2].s = NULL;
    for (int i = 0; i < 2; i++) {
        int r = ctl_session_wait_shutdown(m[i].s, 5.0);
        check(r == -ENOLINK && strstr(pf_errmsg(), "worker[1]"), "off: member %d is told worker 1's loss as a "
              "re-form (%d: %s)", i, r, pf_errmsg());
    }
    ctl_session_close(m[0].s);
    ctl_session_close(m[1].s);
    ctl_rendezvous_stop(rv);
}

/* 2 servers + 2 workers: server 1 lost first (failed over), then worker 1: no replacement (the replacement's
 * book would lack server 1's copies): the re-form; and worker 1 lost first, then server 1 during its
 * replacement: the re-form, naming both. */
/* Four members (2 servers, 2 workers) joined to the rendezvous on `port`. */
static void join_four(member m[4])
{
    const member init[4] = {{.role = CTL_ROLE_SERVER, .rank = 0, .addr = "fab-s0", .timeout = 10},
                            {.role = CTL_ROLE_SERVER, .rank = 1, .addr = "fab-s1", .timeout = 10},
                            {.role = CTL_ROLE_WORKER, .rank = 0, .addr = "fab-w0", .timeout = 10},
                            {.role = CTL_ROLE_WORKER, .rank = 1, .addr = "fab-w1", .timeout = 10}};
    for (int i = 0; i < 4; i++) {
        m[i] = init[i];
        pthread_create(&m[i].th, NULL, join_main, &m[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(m[i].th, NULL);
        if (m[i].rc < 0)
            DIE("member %d did not join: %s", i, pf_errmsg());
    }
}

/* join_four to a fresh rendezvous with 2 servers in this process. */
static ctl_rendezvous *start_four(member m[4])
{
    ctl_rendezvous *rv = start_n(2, 1, 8);
    join_four(m);
    return rv;
}

/* Expects notice `kind` about `rank` at epoch `epoch` on s (step in *st). */
static void expect_notice(ctl_session *s, int kind, int rank, uint32_t epoch, int64_t *st, const char *what)
{
    int r = -1;
    uint32_t e = 0;
    int64_t step = -1;
    int k = next_notice(s, &r, &e, &step);
    check(k == kind && r == rank && e == epoch, "%s (kind %d, rank %d, epoch %u)", what, k, r, e);
    if (st)
        *st = step;
}

/* The rest of a replacement of worker 1 with server 1 failed over (m[0]: server 0, m[2]: worker 0, r: the
 * replacement joining): server 0 is told to roll back at epoch `rb`, says so; worker 0 gets the redo, says
 * its state is ready; the replacement's join returns with server 1 listed as lost (its session left open). */
static void finish_without(const char *name, ctl_session *srv, int srv_rank, ctl_session *w0, member *r,
                           uint32_t rb, int64_t step, int lost)
{
    int64_t st = -1;
    expect_notice(srv, CTL_FO_ROLLBACK, 1, rb, &st, name);
    check(st == step, "%s: roll back to step %lld (%lld)", name, (long long)step, (long long)st);
    CHECK(ctl_session_report(srv, CTL_FO_ROLLED_BACK, srv_rank, rb, step, NULL, 0) == 0, "rolled back");
    expect_notice(w0, CTL_FO_REDO, 0, rb, &st, name);
    CHECK(ctl_session_report(w0, CTL_FO_STATE_READY, 0, rb, step, NULL, 0) == 0, "state ready");
    pthread_join(r->th, NULL);
    check(r->rc == 0, "%s: the replacement's join returns (%s)", name, r->rc ? pf_errmsg() : "");
    if (r->rc == 0) {
        const ctl_book *b = ctl_session_book(r->s);
        check(
            b->rejoin_epoch == rb && b->resume_step == step && b->nlost == 1 && b->lost[0] == lost &&
                b->servers[lost].addr_len == 0,
            "%s: the replacement's book: epoch %u, step %lld, lost servers %d (first %d), server %d's entry "
            "%zu bytes",
            name, b->rejoin_epoch, (long long)b->resume_step, b->nlost, b->nlost ? b->lost[0] : -1, lost,
            b->servers[lost].addr_len);
    }
}

/* finish_without with server 0 (m[0]) live and server 1 lost. */
static void finish_without_server1(const char *name, member m[4], member *r, uint32_t rb, int64_t step)
{
    finish_without(name, m[0].s, 0, m[2].s, r, rb, step, 1);
}

/* A rendezvous of 2 servers + 2 workers (start_n, ctl_timeout 8) in a child process, as in server 0's process,
 * on a free port (set in `port`). Returns the child's pid (to kill it: server 0's process lost). */
static pid_t fork_rendezvous(void)
{
    int up[2];
    if (pipe(up) < 0)
        DIE("pipe");
    pid_t child = fork();
    if (child < 0)
        DIE("fork");
    if (child == 0) {
        close(up[0]);
        start_n(2, 1, 8);
        if (write(up[1], &port, sizeof port) != (ssize_t)sizeof port)
            _exit(1);
        for (;;)
            pause();
    }
    close(up[1]);
    if (read(up[0], &port, sizeof port) != (ssize_t)sizeof port)
        DIE("the rendezvous' process did not start");
    close(up[0]);
    return child;
}

/* server_lost: 2 servers. (a) Server 1 failed over (epoch 1), then worker 1 lost: its replacement goes on
 * without server 1 (epoch 2; server 0 and worker 0 report, the replacement joins, the rollback and the redo
 * at epoch 3 go to the live members only; the replacement's book lists server 1 as lost). (b) Worker 1 lost
 * (epoch 1), server 0 and worker 0 report and the replacement joins, then server 1 is lost before its report:
 * it is failed over (epoch 2) and the decision is taken without its report (epoch 3). (c) The same with
 * server 1 lost after the decision, before it rolled back: the redo goes out once server 0 rolled back. (d)
 * Worker 1 lost, then worker 0: the re-form, naming the second loss. (e) (a) with the rendezvous in a child
 * process, killed once the replacement is seated (server 0's process gone): the replacement, told of server
 * 1's failover only in its join reply, concludes like worker 0 that shard 0 has no copy left (the re-form),
 * not that the run goes on. */
static void case_server_lost(void)
{
    member m[4];
    /* (a) */
    ctl_rendezvous *rv = start_four(m);
    ctl_session_close(m[1].s); /* server 1 lost: failed over */
    m[1].s = NULL;
    expect_notice(m[2].s, CTL_FO_LOST, 1, 1, NULL, "server_lost (a): worker 0 told server 1's failover");
    expect_notice(m[0].s, CTL_FO_LOST, 1, 1, NULL, "server_lost (a): server 0 told server 1's failover");
    ctl_session_close(m[3].s); /* then worker 1 */
    m[3].s = NULL;
    expect_notice(m[0].s, CTL_FO_WORKER_LOST, 1, 2, NULL, "server_lost (a): server 0 told worker 1's loss");
    expect_notice(m[2].s, CTL_FO_WORKER_LOST, 1, 2, NULL, "server_lost (a): worker 0 told worker 1's loss");
    CHECK(ctl_session_report(m[0].s, CTL_FO_WORKER_REPORT, 0, 2, 6, NULL, 0) == 0, "report");
    CHECK(ctl_session_report(m[2].s, CTL_FO_WORKER_REPORT, 0, 2, 6, "fab-w0-new", 10) == 0, "report");
    member r = {.role = CTL_ROLE_WORKER, .rank = 1, .addr = "fab-w1-again", .timeout = 10};
    pthread_create(&r.th, NULL, join_main, &r);
    finish_without_server1("server_lost (a)", m, &r, 3, 6);
    if (r.rc == 0)
        ctl_session_close(r.s);
    ctl_session_close(m[0].s);
    ctl_session_close(m[2].s);
    ctl_rendezvous_stop(rv);

    /* (e) (a) with the rendezvous in a child process, killed once the replacement is seated. */
    pid_t child = fork_rendezvous();
    join_four(m);
    /* As the daemons do at their start, before any notice (the notices after it keep its lost set). */
    CHECK(ctl_session_survive_rendezvous_loss(m[2].s, NULL) == 0, "survive");
    ctl_session_close(m[1].s);
    m[1].s = NULL;
    expect_notice(m[2].s, CTL_FO_LOST, 1, 1, NULL, "server_lost (e): server 1 failed over");
    expect_notice(m[0].s, CTL_FO_LOST, 1, 1, NULL, "server_lost (e): server 1 failed over");
    ctl_session_close(m[3].s);
    m[3].s = NULL;
    expect_notice(m[0].s, CTL_FO_WORKER_LOST, 1, 2, NULL, "server_lost (e): worker 1 lost");
    expect_notice(m[2].s, CTL_FO_WORKER_LOST, 1, 2, NULL, "server_lost (e): worker 1 lost");
    CHECK(ctl_session_report(m[0].s, CTL_FO_WORKER_REPORT, 0, 2, 6, NULL, 0) == 0, "report");
    CHECK(ctl_session_report(m[2].s, CTL_FO_WORKER_REPORT, 0, 2, 6, "fab-w0-new", 10) == 0, "report");
    r = (member){.role = CTL_ROLE_WORKER, .rank = 1, .addr = "fab-w1-again", .timeout = 10};
    pthread_create(&r.th, NULL, join_main, &r);
    finish_without_server1("server_lost (e)", m, &r, 3, 6);
    if (r.rc == 0) {
        /* at the replacement's start, as pfcps-worker does */
        CHECK(ctl_session_survive_rendezvous_loss(r.s, NULL) == 0, "survive");
        kill(child, SIGKILL); /* server 0's process gone */
        waitpid(child, NULL, 0);
        child = 0;
        const char *who[2] = {"worker 0", "the replacement"};
        ctl_session *ss[2] = {m[2].s, r.s};
        for (int i = 0; i < 2; i++) {
            int w = ctl_session_wait_shutdown(ss[i], 5.0);
            check(w < 0 && w != -ETIMEDOUT && strstr(pf_errmsg(), "both copies of shard 0"),
                  "server_lost (e): server 0 lost after the replacement: %s concludes the re-form (%d: %s)",
                  who[i], w, w < 0 ? pf_errmsg() : "a failover");
        }
        ctl_session_close(r.s);
    }
    if (child > 0) {
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
    }
    ctl_session_close(m[0].s);
    ctl_session_close(m[2].s);

    /* (b) and (c) */
    for (int after_decision = 0; after_decision < 2; after_decision++) {
        const char *name = after_decision ? "server_lost (c)" : "server_lost (b)";
        rv = start_four(m);
        ctl_session_close(m[3].s); /* worker 1 lost: its replacement under way */
        m[3].s = NULL;
        for (int i = 0; i < 3; i++)
            expect_notice(m[i].s, CTL_FO_WORKER_LOST, 1, 1, NULL, name);
        CHECK(ctl_session_report(m[0].s, CTL_FO_WORKER_REPORT, 0, 1, 5, NULL, 0) == 0, "report");
        CHECK(ctl_session_report(m[2].s, CTL_FO_WORKER_REPORT, 0, 1, 5, "fab-w0-new", 10) == 0, "report");
        r = (member){.role = CTL_ROLE_WORKER, .rank = 1, .addr = "fab-w1-again", .timeout = 10};
        pthread_create(&r.th, NULL, join_main, &r);
        uint32_t rb = 3;
        if (after_decision) { /* server 1 reports too: the decision (epoch 2), then it is lost */
            usleep(300000);
            CHECK(ctl_session_report(m[1].s, CTL_FO_WORKER_REPORT, 1, 1, 5, NULL, 0) == 0, "report");
            expect_notice(m[1].s, CTL_FO_ROLLBACK, 1, 2, NULL, name);
            rb = 2;
        }
        ctl_session_close(m[1].s); /* server 1 lost */
        m[1].s = NULL;
        if (!after_decision)
            expect_notice(m[0].s, CTL_FO_LOST, 1, 2, NULL, name);
        if (after_decision) { /* server 0's rollback notice (epoch 2) came before the failover (epoch 3) */
            int64_t st = -1;
            expect_notice(m[0].s, CTL_FO_ROLLBACK, 1, 2, &st, name);
            expect_notice(m[0].s, CTL_FO_LOST, 1, 3, NULL, name);
            CHECK(ctl_session_report(m[0].s, CTL_FO_ROLLED_BACK, 0, 2, 5, NULL, 0) == 0, "rolled back");
            expect_notice(m[2].s, CTL_FO_LOST, 1, 3, NULL, name);
            expect_notice(m[2].s, CTL_FO_REDO, 0, 3, NULL, name);
            CHECK(ctl_session_report(m[2].s, CTL_FO_STATE_READY, 0, 3, 5, NULL, 0) == 0, "state ready");
            pthread_join(r.th, NULL);
            check(r.rc == 0 && ctl_session_book(r.s)->nlost == 1 && ctl_session_book(r.s)->rejoin_epoch == 3,
                  "%s: the replacement joins with server 1 listed as lost, at epoch 3 (%s)", name,
                  r.rc ? pf_errmsg() : "");
            if (r.rc == 0)
                ctl_session_close(r.s);
        } else {
            expect_notice(m[2].s, CTL_FO_LOST, 1, 2, NULL, name);
            finish_without_server1(name, m, &r, rb, 5);
            if (r.rc == 0)
                ctl_session_close(r.s);
        }
        ctl_session_close(m[0].s);
        ctl_session_close(m[2].s);
        ctl_rendezvous_stop(rv);
    }

    /* (d) */
    rv = start_four(m);
    ctl_session_close(m[3].s);
    m[3].s = NULL;
    expect_notice(m[0].s, CTL_FO_WORKER_LOST, 1, 1, NULL, "server_lost (d)");
    ctl_session_close(m[2].s); /* worker 0 lost during it: the re-form */
    m[2].s = NULL;
    int rc = ctl_session_wait_shutdown(m[0].s, 5.0);
    check(rc == -ENOLINK && strstr(pf_errmsg(), "worker[0]") && strstr(pf_errmsg(), "was lost too"),
          "server_lost (d): a worker lost during another's replacement re-forms the run (%d: %s)", rc,
          pf_errmsg());
    ctl_session_close(m[0].s);
    ctl_session_close(m[1].s);
    ctl_rendezvous_stop(rv);
}

/* One wait of 0.05 s on s (heartbeats go out); a notice that comes is recorded in *kind, *rank, *epoch unless
 * one is recorded already (*kind >= 0). */
static void poll_one(ctl_session *s, int *kind, int *rank, uint32_t *epoch)
{
    if (ctl_session_wait_shutdown(s, 0.05) == 2 && *kind < 0) {
        *epoch = ctl_session_failover(s, rank, NULL);
        *kind = ctl_session_failover_kind(s, NULL, NULL, NULL);
    }
}

/* Polls s[0..n) in turn (poll_one; every session keeps heartbeating) for up to limit_s until each recorded a
 * notice (kind[i] >= 0; set kind[i] = -1 first to wait for a new one). Returns the seconds until the last one
 * came. */
static double poll_notices(ctl_session **s, int n, double limit_s, int *kind, int *rank, uint32_t *epoch)
{
    const double t0 = pf_now_s();
    for (;;) {
        int got = 0;
        for (int i = 0; i < n; i++)
            got += kind[i] >= 0;
        if (got == n || pf_now_s() - t0 >= limit_s)
            break;
        for (int i = 0; i < n; i++)
            poll_one(s[i], &kind[i], &rank[i], &epoch[i]);
    }
    return pf_now_s() - t0;
}

static const uint8_t g_digest[32]; /* the members' run config digest (a restarted rendezvous checks none) */

/* The four members (join_four) of a rendezvous in a child process (fork_rendezvous), server 1's and worker
 * 0's sessions surviving the rendezvous' loss (ctl_session_survive_rendezvous_loss). Returns the child's pid.
 */
static pid_t fork_four(member m[4])
{
    g_port_at = 0;
    pid_t child = fork_rendezvous();
    join_four(m);
    CHECK(ctl_session_survive_rendezvous_loss(m[1].s, g_digest) == 0, "survive");
    CHECK(ctl_session_survive_rendezvous_loss(m[2].s, g_digest) == 0, "survive");
    return child;
}

/* Server 0's process `child` is gone (killed by the caller, reaped here) and server 0's own session m[0] is
 * closed: server 1 (m[1]) and worker 0 (m[2]), which survive the rendezvous' loss, take the close for server
 * 0's failover at epoch `epoch` and are orphaned (checked as `name`). */
static void server0_gone(pid_t child, member m[4], uint32_t epoch, const char *name)
{
    waitpid(child, NULL, 0);
    ctl_session_close(m[0].s);
    m[0].s = NULL;
    ctl_session *ss[2] = {m[1].s, m[2].s};
    int kind[2] = {-1, -1}, rank[2];
    uint32_t ep[2];
    poll_notices(ss, 2, 5, kind, rank, ep);
    for (int i = 0; i < 2; i++)
        check(kind[i] == CTL_FO_LOST && rank[i] == 0 && ep[i] == epoch && ctl_session_orphaned(ss[i]),
              "%s: member %d took the close for server 0's failover (kind %d, rank %d, epoch %u)", name, i,
              kind[i], rank[i], ep[i]);
}

/* Server 0 restarted: a rendezvous on the same port in this process (returned), and m[1], m[2] polled until
 * both resumed there (checked as `name`); the first notice each got meanwhile or after, up to 6 s, in kind[],
 * rank[], ep[]. `early` (if set) runs once the rendezvous listens, `resumed` once both resumed, each with
 * `arg`. Returns the rendezvous; *waited = the seconds from the resumes to the last of those notices. */
static ctl_rendezvous *server0_back(member m[4], void (*early)(void *), void (*resumed)(void *), void *arg,
                                    int kind[2], int rank[2], uint32_t ep[2], double *waited,
                                    const char *name)
{
    g_port_at = port;
    ctl_rendezvous *rv = start_n(2, 1, 8);
    g_port_at = 0;
    if (early)
        early(arg);
    ctl_session *ss[2] = {m[1].s, m[2].s};
    double t0 = pf_now_s();
    kind[0] = kind[1] = -1; /* the next notice: worker 1's loss, which may come with the last resume */
    while (pf_now_s() - t0 < 5 && (ctl_session_orphaned(ss[0]) || ctl_session_orphaned(ss[1])))
        for (int i = 0; i < 2; i++)
            poll_one(ss[i], &kind[i], &rank[i], &ep[i]);
    check(!ctl_session_orphaned(ss[0]) && !ctl_session_orphaned(ss[1]),
          "%s: both members resumed at the restarted rendezvous", name);
    if (resumed)
        resumed(arg);
    *waited = poll_notices(ss, 2, 6, kind, rank, ep);
    return rv;
}

/* server0_back's hooks for adopt: the replacement's join starts (once the members resumed: variant (a)), or
 * starts and is in 0.3 s later, before the members try to resume 0.25 s after the close (variant (c)). */
static void start_join(void *arg)
{
    member *r = arg;
    pthread_create(&r->th, NULL, join_main, r);
}

static void start_join_early(void *arg)
{
    start_join(arg);
    usleep(300000);
}

/* adopt: worker 1 lost together with server 0 (the rendezvous in a child process, killed with worker 1's
 * session closed: one machine held both). Server 1 and worker 0 take the close as server 0's failover (epoch
 * 1) and resume at a new rendezvous on the same port (server 0 restarted; in this process). (a) The restarted
 * worker 1's join comes once both resumed: the adoption completes at once without worker 1 (epoch 2) and its
 * replacement begins with that join in it: both are told "worker[1] lost" at epoch 3 within 1.5 s of the join
 * (sooner than the silence limit, 2 s); server 1 reports 6 pushes, worker 0 step 6; the rollback to step 6
 * goes to server 1 alone, the redo to worker 0, and the replacement's book lists server 0 as lost. (b) No
 * join comes: the adoption completes the silence limit after the last resume (2 s, not before), worker 1's
 * replacement begins (the notice at epoch 3); worker 1's process, had it been stopped (not killed) until
 * then, has its resume refused with ETIMEDOUT (taken for lost, as a silent member); a join that comes later
 * is taken as the replacement, as in (a). (c) The join comes before the members resume: it is held, and the
 * adoption completes with it as soon as the last member resumed (the notice within 1.5 s of the resumes), as
 * in (a). */
static void case_adopt(void)
{
    for (int variant = 0; variant < 3; variant++) {
        const char *name = variant == 0 ? "adopt (a)" : variant == 1 ? "adopt (b)" : "adopt (c)";
        member m[4];
        pid_t child = fork_four(m);
        kill(child, SIGKILL);
        if (variant == 1) {
            /* (b): worker 1's process lives on but is stopped (not polled) until it was taken for lost */
            CHECK(ctl_session_survive_rendezvous_loss(m[3].s, g_digest) == 0, "survive");
        } else {
            ctl_session_close(m[3].s); /* worker 1, on the same machine */
            m[3].s = NULL;
        }
        server0_gone(child, m, 1, name);
        member r = {.role = CTL_ROLE_WORKER, .rank = 1, .addr = "fab-w1-again", .timeout = 10};
        int kind[2], rank[2];
        uint32_t ep[2];
        double waited = 0;
        ctl_rendezvous *rv =
            server0_back(m, variant == 2 ? start_join_early : NULL, variant == 0 ? start_join : NULL, &r,
                         kind, rank, ep, &waited, name);
        for (int i = 0; i < 2; i++)
            check(kind[i] == CTL_FO_WORKER_LOST && rank[i] == 1 && ep[i] == 3,
                  "%s: member %d told worker 1 lost (kind %d, rank %d, epoch %u)", name, i, kind[i], rank[i],
                  ep[i]);
        if (variant != 1)
            check(waited < 1.5, "%s: the notice came %.2f s after the %s", name, waited,
                  variant == 0 ? "replacement's join started" : "resumes");
        else
            check(waited >= 1.5, "%s: the notice came %.2f s after the resumes (the silence limit: 2 s)",
                  name, waited);
        if (variant == 1) {
            /* The stopped worker 1 runs again: its resume is refused as a removed member's (ETIMEDOUT), so
             * that it exits for its supervisor to start it again. */
            int w = 0;
            const double t0 = pf_now_s();
            while (pf_now_s() - t0 < 4 && w >= 0)
                w = ctl_session_wait_shutdown(m[3].s, 0.2);
            check(w == -ETIMEDOUT && strstr(pf_errmsg(), "being replaced"),
                  "%s: the old worker 1's resume is refused as taken for lost (%d: %s)", name, w,
                  w < 0 ? pf_errmsg() : "");
            ctl_session_close(m[3].s);
            m[3].s = NULL;
        }
        CHECK(ctl_session_report(m[1].s, CTL_FO_WORKER_REPORT, 1, 3, 6, NULL, 0) == 0, "report");
        CHECK(ctl_session_report(m[2].s, CTL_FO_WORKER_REPORT, 0, 3, 6, "fab-w0-new", 10) == 0, "report");
        if (variant == 1)
            pthread_create(&r.th, NULL, join_main, &r);
        finish_without(name, m[1].s, 1, m[2].s, &r, 4, 6, 0);
        if (r.rc == 0)
            ctl_session_close(r.s);
        ctl_session_close(m[1].s);
        ctl_session_close(m[2].s);
        ctl_rendezvous_stop(rv);
    }
}

/* adopt_mid: worker 1 lost first, then server 0 (the rendezvous' process) in the middle of worker 1's
 * replacement: server 1 and worker 0 were told "worker[1] lost" (epoch 1) and reported (6 pushes; step 6) and
 * the replacement joined, waiting for its seat. The close of the rendezvous is server 0's failover for both
 * (epoch 2), not the re-form: a replacement under way needs nothing of the lost rendezvous. At the restarted
 * one both resume, the replacement's join (retried after the close) is held, the adoption completes without
 * worker 1 (epoch 3) and its replacement begins again: "worker[1] lost" at epoch 4, reported again, the
 * rollback to step 6 (epoch 5) to server 1 alone, the redo to worker 0, and the replacement's book lists
 * server 0 as lost. */
static void case_adopt_mid(void)
{
    const char *name = "adopt_mid";
    member m[4];
    pid_t child = fork_four(m);
    ctl_session_close(m[3].s); /* worker 1 lost */
    m[3].s = NULL;
    expect_notice(m[1].s, CTL_FO_WORKER_LOST, 1, 1, NULL, "adopt_mid: server 1 told worker 1's loss");
    expect_notice(m[2].s, CTL_FO_WORKER_LOST, 1, 1, NULL, "adopt_mid: worker 0 told worker 1's loss");
    CHECK(ctl_session_report(m[1].s, CTL_FO_WORKER_REPORT, 1, 1, 6, NULL, 0) == 0, "report");
    CHECK(ctl_session_report(m[2].s, CTL_FO_WORKER_REPORT, 0, 1, 6, "fab-w0-new", 10) == 0, "report");
    member r = {.role = CTL_ROLE_WORKER, .rank = 1, .addr = "fab-w1-again", .timeout = 10};
    pthread_create(&r.th, NULL, join_main, &r);
    usleep(200000); /* the replacement's join is in; server 0 (with server 1's report) holds the decision */
    kill(child, SIGKILL);
    server0_gone(child, m, 2, name);
    int kind[2], rank[2];
    uint32_t ep[2];
    double waited = 0;
    ctl_rendezvous *rv = server0_back(m, NULL, NULL, NULL, kind, rank, ep, &waited, name);
    for (int i = 0; i < 2; i++)
        check(
            kind[i] == CTL_FO_WORKER_LOST && rank[i] == 1 && ep[i] == 4,
            "%s: member %d told worker 1 lost again by the restarted rendezvous (kind %d, rank %d, epoch %u)",
            name, i, kind[i], rank[i], ep[i]);
    check(waited < 1.5, "%s: the notice came %.2f s after the resumes (the replacement's join held)", name,
          waited);
    CHECK(ctl_session_report(m[1].s, CTL_FO_WORKER_REPORT, 1, 4, 6, NULL, 0) == 0, "report");
    CHECK(ctl_session_report(m[2].s, CTL_FO_WORKER_REPORT, 0, 4, 6, "fab-w0-new", 10) == 0, "report");
    finish_without(name, m[1].s, 1, m[2].s, &r, 5, 6, 0);
    if (r.rc == 0)
        ctl_session_close(r.s);
    ctl_session_close(m[1].s);
    ctl_session_close(m[2].s);
    ctl_rendezvous_stop(rv);
}

int main(void)
{
    ctl_set_replicas(1); /* the members' config: replicas = 1, as the run's (a server's join carries it) */
    case_happy();
    case_too_far();
    case_acc();
    case_timeout();
    case_early();
    case_setup();
    case_left();
    case_end_voted(1);
    case_end_voted(0);
    case_off();
    case_server_lost();
    case_adopt();
    case_adopt_mid();
    return check_summary();
}
