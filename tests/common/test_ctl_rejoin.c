/* The rendezvous' side of a failed-over server's rejoin (docs/architecture.md, "Hot-standby shards", Rejoin),
 * with members that are control sessions only (no data plane): 2 servers + 1 worker, replicas = 1, the
 * rendezvous in this process, ctl_timeout 1 s. Server 1's session closes without leaving (a crash): the
 * others are told it failed over (epoch 1). A restarted server 1 joins as a learner: the worker is told
 * "rejoin begins" (epoch 2), reports the copy step 4, and the learner's join returns with its book (rejoin
 * epoch 2, resume step 4).
 *
 * Case ready: the learner says it is ready, and the worker is told "rejoined" (epoch 3). The rejoined server
 * then sends no heartbeat (it hangs right after its ready): it is lost like any member, the worker told it
 * failed over (epoch 4) within the silence limit (2 s) and a tick.
 *
 * Case hang: the learner never says it is ready (stopped or hung while copying; it heartbeats only once it
 * serves). The rendezvous drops it 3 x ctl_timeout (3 s) after its book, not before, and the worker is told
 * "rejoin aborted" (epoch 2: nothing changed) within its own hold bound (4 x ctl_timeout, 4 s); a ready the
 * learner sends afterwards changes nothing (no "rejoined" follows).
 *
 * Case reform: the worker is lost while the learner holds its book: the run re-forms, and the learner's going
 * is logged as a stop for the re-form, not as a rejoin aborted while "the run goes on as before". Case end:
 * likewise when the run ends while the learner holds its book. Case replicas: a learner started with
 * replicas = 0 is refused at its join, before anything starts; with the run's replicas it then rejoins. Case
 * forming: the same refusal at the run's first forming. */
#include "common/clock.h"
#include "common/ctl.h"
#include "common/err.h"
#include "common/log.h"
#include "tests/check.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#define SECRET  "rejoin-test-secret"
#define MAXF    65536
#define TIMEOUT 1.0

#include "tests/common/ctl_member.h"

/* A rendezvous of 2 servers and 1 worker with replicas = 1 whose run config is `text`. */
static ctl_rendezvous *start_text(const char *text)
{
    ctl_rendezvous_opts o = {.bind_host = "127.0.0.1",
                             .num_servers = 2,
                             .num_workers = 1,
                             .secret = SECRET,
                             .max_frame = MAXF,
                             .timeout_s = TIMEOUT,
                             .config_text = text,
                             .replicas = 1,
                             .rejoin = 1};
    ctl_rendezvous *rv;
    if (ctl_rendezvous_start(&o, &rv) < 0)
        DIE("rendezvous: %s", pf_errmsg());
    port = ctl_rendezvous_port(rv);
    return rv;
}

static ctl_rendezvous *start(void)
{
    return start_text("[cluster]\nreplicas = 1\n");
}

/* The next notice on s within `limit` seconds, serving the heartbeats of `other` meanwhile: its kind (-1:
 * none came), rank in *rank, epoch in *epoch. */
static int next_notice(ctl_session *s, ctl_session *other, double limit, int *rank, uint32_t *epoch)
{
    const double t0 = pf_now_s();
    while (pf_now_s() - t0 < limit) {
        if (other)
            ctl_session_wait_shutdown(other, 0.02);
        int r = ctl_session_wait_shutdown(s, 0.1);
        if (r == 2) {
            *epoch = ctl_session_failover(s, rank, NULL);
            return ctl_session_failover_kind(s, NULL, NULL, NULL);
        }
        if (r != 0)
            return -1;
    }
    return -1;
}

/* Forms the run (m[0] server 0, m[1] server 1, m[2] worker 0) and loses server 1: the worker is told it failed
 * over (epoch 1). */
static void form_and_lose(member m[3], const char *name)
{
    m[0] = (member){.role = CTL_ROLE_SERVER, .rank = 0, .addr = "fab-s0", .timeout = 10};
    m[1] = (member){.role = CTL_ROLE_SERVER, .rank = 1, .addr = "fab-s1", .timeout = 10};
    m[2] = (member){.role = CTL_ROLE_WORKER, .rank = 0, .addr = "fab-w0", .timeout = 10};
    for (int i = 0; i < 3; i++)
        pthread_create(&m[i].th, NULL, join_main, &m[i]);
    for (int i = 0; i < 3; i++) {
        pthread_join(m[i].th, NULL);
        if (m[i].rc < 0)
            DIE("%s: member %d did not join: %s", name, i, pf_errmsg());
    }
    ctl_session_close(m[1].s); /* without leaving: a crash */
    m[1].s = NULL;
    int rank = -1, k;
    uint32_t e = 0;
    k = next_notice(m[2].s, m[0].s, 5.0, &rank, &e);
    CHECK(k == CTL_FO_LOST && rank == 1 && e == 1,
          "%s: the worker is told server 1 failed over at epoch 1 (kind %d, "
          "rank %d, epoch %u)",
          name, k, rank, e);
}

/* Forms the run, loses server 1 (form_and_lose) and starts its learner through the copy step: on return the
 * learner `l` holds its book. */
static void to_book(member m[3], member *l, const char *name)
{
    form_and_lose(m, name);
    int rank = -1, k;
    uint32_t e = 0;
    *l = (member){.role = CTL_ROLE_SERVER, .rank = 1, .addr = "fab-s1-again", .timeout = 10};
    pthread_create(&l->th, NULL, join_main, l);
    k = next_notice(m[2].s, m[0].s, 5.0, &rank, &e);
    CHECK(k == CTL_FO_REJOIN_BEGIN && rank == 1 && e == 2,
          "%s: the worker is told server 1 rejoins at epoch 2 "
          "(kind %d, rank %d, epoch %u)",
          name, k, rank, e);
    CHECK(ctl_session_rejoin_report(m[2].s, CTL_FO_REJOIN_STEP, 1, 2, 4) == 0, "%s: copy step: %s", name,
          pf_errmsg());
    pthread_join(l->th, NULL);
    CHECK(l->rc == 0, "%s: the learner got its book: %s", name, l->rc < 0 ? pf_errmsg() : "");
    const ctl_book *b = ctl_session_book(l->s);
    check(b->rejoin_epoch == 2 && b->resume_step == 4,
          "%s: the learner's book: rejoin epoch %u, copy step %lld", name, b->rejoin_epoch,
          (long long)b->resume_step);
}

/* Server 1 started with replicas = 0 joins the run of start() (replicas = 1): it must be refused (EINVAL,
 * naming both values); the members' config is the run's again on return. */
static void join_one_endpoint(const char *name)
{
    ctl_set_replicas(0);
    member bad = {.role = CTL_ROLE_SERVER, .rank = 1, .addr = "fab-s1-one-endpoint", .timeout = 10};
    pthread_create(&bad.th, NULL, join_main, &bad);
    pthread_join(bad.th, NULL);
    check(bad.rc == -EINVAL && strstr(bad.msg, "started with replicas = 0, the run has replicas = 1"),
          "%s: server 1 with replicas = 0 is refused at its join (rc %d: %s)", name, bad.rc, bad.msg);
    if (bad.s)
        ctl_session_close(bad.s);
    ctl_set_replicas(1);
}

/* Case forming: at the run's first forming, server 1 started with replicas = 0 (its config differs from
 * server 0's) is refused at its join (EINVAL, naming both values) before it takes a seat, and so is worker 0
 * started with another embedding_size (its endpoint keys), while server 0 waits in its join; 10 s after the
 * rendezvous started it logs the seats it waits for and the last refusal; the run then forms with a server 1
 * started with the run's replicas and a worker with the run's endpoint keys. */
static void case_forming(void)
{
    char logp[] = "/tmp/pfcps-ctl-forming-XXXXXX";
    int fd = mkstemp(logp);
    check(fd >= 0 && log_open_file(logp) == 0, "forming: log file %s", logp);
    const double t0 = pf_now_s();
    /* a complete run config, as server 0's (the rendezvous compares a worker's endpoint keys with it) */
    ctl_rendezvous *rv =
        start_text("[cluster]\nreplicas = 1\nservers = 2\nworkers = 1\n[data]\nrec = synthetic\n"
                   "num_classes = 20\n");
    member m[3] = {{.role = CTL_ROLE_SERVER, .rank = 0, .addr = "fab-s0", .timeout = 30},
                   {.role = CTL_ROLE_SERVER, .rank = 1, .addr = "fab-s1", .timeout = 10},
                   {.role = CTL_ROLE_WORKER, .rank = 0, .addr = "fab-w0", .timeout = 10}};
    pthread_create(&m[0].th, NULL, join_main, &m[0]);
    for (int i = 0; i < 100 && ctl_rendezvous_joined(rv) < 1; i++)
        usleep(50000); /* server 0 in before the others' configs change (ctl_set_replicas is process-wide) */
    check(ctl_rendezvous_joined(rv) == 1, "forming: server 0 joined (%d members in)",
          ctl_rendezvous_joined(rv));
    join_one_endpoint("forming");
    /* a worker whose endpoint keys differ from the run's (replicas = 1, embedding_size the default 512) */
    ctl_set_endpoint_keys("replicas = 1\nembedding_size = 32\n");
    member bad = {.role = CTL_ROLE_WORKER, .rank = 0, .addr = "fab-w0-d32", .timeout = 10};
    pthread_create(&bad.th, NULL, join_main, &bad);
    pthread_join(bad.th, NULL);
    check(bad.rc == -EINVAL &&
              strstr(bad.msg, "worker[0] was started with a config that differs from the run's") &&
              strstr(bad.msg, "in 1 key ") && strstr(bad.msg, "embedding_size = 32 (512)"),
          "forming: worker 0 with embedding_size 32 is refused at its join (rc %d: %s)", bad.rc, bad.msg);
    if (bad.s)
        ctl_session_close(bad.s);
    /* The rendezvous' line while it waits (CTL_FORMING_LOG_S = 10 s after its start): server 0 joined, the
     * refused seats missing, the last refusal named. */
    char text[8192] = "";
    int seen = 0;
    while (!seen && pf_now_s() - t0 < 20) { /* the line comes 10 s after the start: wait for it up to 20 s */
        usleep(200000);
        FILE *lf = fopen(logp, "r");
        size_t got = lf ? fread(text, 1, sizeof text - 1, lf) : 0;
        text[got] = '\0';
        if (lf)
            fclose(lf);
        seen = strstr(text, "waiting for the run to form") != NULL;
    }
    check(
        strstr(text, "waiting for the run to form: 1 of 3 members joined, server[1], worker[0] missing (1") &&
            strstr(text, "s since the rendezvous started); joins refused for their config: 2 (the last, ") &&
            strstr(text, " s ago: worker[0] was started with a config that differs from the run's"),
        "forming: the rendezvous names the missing seats and the last refusal 10 s after its start:\n%s",
        text);
    log_close_file();
    unlink(logp);
    if (fd >= 0)
        close(fd);
    /* the run's values, and a key this rendezvous does not know: admitted (below) */
    ctl_set_endpoint_keys("replicas = 1\nembedding_size = 512\nfuture_key = 3\n");
    for (int i = 1; i < 3; i++)
        pthread_create(&m[i].th, NULL, join_main, &m[i]);
    for (int i = 0; i < 3; i++) {
        pthread_join(m[i].th, NULL);
        check(m[i].rc == 0, "forming: member %d joins once server 1 has the run's replicas (rc %d)", i,
              m[i].rc);
    }
    for (int i = 0; i < 3; i++)
        if (m[i].s)
            ctl_session_close(m[i].s);
    ctl_set_endpoint_keys(NULL);
    ctl_rendezvous_stop(rv);
}

/* Case replicas: server 1 started again with replicas = 0 (one endpoint: it could not serve both copies) is
 * refused when it joins (EINVAL, naming both values), before anything starts: the worker is told nothing, and
 * the epoch stays 1. Started with the run's replicas = 1, it then rejoins at epoch 2. */
static void case_replicas(void)
{
    ctl_rendezvous *rv = start();
    member m[3];
    form_and_lose(m, "replicas");
    join_one_endpoint("replicas");
    int rank = -1;
    uint32_t e = 0;
    int k = next_notice(m[2].s, m[0].s, 0.5, &rank, &e);
    check(k == -1, "replicas: the worker is told nothing of the refused join (kind %d)", k);
    member l = {.role = CTL_ROLE_SERVER, .rank = 1, .addr = "fab-s1-again", .timeout = 10};
    pthread_create(&l.th, NULL, join_main, &l);
    k = next_notice(m[2].s, m[0].s, 5.0, &rank, &e);
    check(k == CTL_FO_REJOIN_BEGIN && rank == 1 && e == 2,
          "replicas: started with the run's replicas, server 1 rejoins at epoch 2 (kind %d, rank %d, epoch %u)", k,
          rank, e);
    ctl_session_rejoin_report(m[2].s, CTL_FO_REJOIN_STEP, 1, 2, 4);
    pthread_join(l.th, NULL);
    check(l.rc == 0, "replicas: the learner got its book");
    if (l.s)
        ctl_session_close(l.s);
    ctl_session_close(m[0].s);
    ctl_session_close(m[2].s);
    ctl_rendezvous_stop(rv);
}

static void case_ready(void)
{
    ctl_rendezvous *rv = start();
    member m[3], l;
    to_book(m, &l, "ready");
    check(ctl_session_rejoin_report(l.s, CTL_FO_REJOIN_READY, 1, 2, 4) == 0, "ready: the learner says ready");
    int rank = -1;
    uint32_t e = 0;
    int k = next_notice(m[2].s, m[0].s, 5.0, &rank, &e);
    check(k == CTL_FO_REJOINED && rank == 1 && e == 3,
          "ready: the worker is told server 1 rejoined at epoch 3 "
          "(kind %d, rank %d, epoch %u)",
          k, rank, e);
    const double t0 = pf_now_s();
    k = next_notice(m[2].s, m[0].s, ctl_member_silence_s(TIMEOUT) + 2.0, &rank, &e);
    const double dt = pf_now_s() - t0;
    check(k == CTL_FO_LOST && rank == 1 && e == 4 && dt < ctl_member_silence_s(TIMEOUT) + 0.5,
          "ready: the rejoined server, silent from its ready on, is failed over at epoch 4 after %.2f s "
          "(kind %d, "
          "rank %d, epoch %u)",
          dt, k, rank, e);
    ctl_session_close(l.s);
    ctl_session_close(m[0].s);
    ctl_session_close(m[2].s);
    ctl_rendezvous_stop(rv);
}

static void case_hang(void)
{
    ctl_rendezvous *rv = start();
    member m[3], l;
    to_book(m, &l, "hang");
    const double t0 = pf_now_s();
    int rank = -1;
    uint32_t e = 0;
    int k = next_notice(m[2].s, m[0].s, 4 * TIMEOUT + 1, &rank, &e);
    const double dt = pf_now_s() - t0;
    check(k == CTL_FO_REJOIN_ABORTED && rank == 1 && e == 2,
          "hang: the worker is told server 1's rejoin aborted, epoch 2 (kind %d, rank %d, epoch %u)", k, rank,
          e);
    check(dt > 3 * TIMEOUT - 0.3 && dt < 4 * TIMEOUT,
          "hang: %.2f s after the book: past 3 x ctl_timeout, within the workers' 4 x ctl_timeout", dt);
    /* The learner wakes up: its ready changes nothing (its connection was refused). */
    ctl_session_rejoin_report(l.s, CTL_FO_REJOIN_READY, 1, 2, 4);
    k = next_notice(m[2].s, m[0].s, 0.5, &rank, &e);
    check(k == -1, "hang: the learner's late ready tells the worker nothing (kind %d)", k);
    ctl_session_close(l.s);
    ctl_session_close(m[0].s);
    ctl_session_close(m[2].s);
    ctl_rendezvous_stop(rv);
}

/* 1 when the file at path has a line containing `what`. */
static int file_has(const char *path, const char *what)
{
    FILE *f = fopen(path, "r");
    char line[2048];
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f))
        found = strstr(line, what) != NULL;
    if (f)
        fclose(f);
    return found;
}

/* Cases reform and end: while the learner holds its book the run re-forms (the worker lost; no replacement in
 * this run) or ends (the worker leaves, server 0 broadcasts the shutdown); the learner then stops with the
 * others. Its going is logged as such ("rejoining, stopped <how>"), not as a rejoin aborted with "the run
 * goes on as before" (which it does not). */
static void learner_stops(const char *name, int end)
{
    char path[] = "/tmp/pfcps-test-ctl-rejoin-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0 && log_open_file(path) == 0, "%s: log file", name);
    close(fd);
    ctl_rendezvous *rv = start();
    member m[3], l;
    to_book(m, &l, name);
    if (end) {
        ctl_session_leave(m[2].s);
        ctl_rendezvous_broadcast_shutdown(rv);
    } else {
        ctl_session_close(m[2].s); /* the worker, without leaving: the run re-forms */
        m[2].s = NULL;
    }
    int r = 0;
    const double t0 = pf_now_s();
    while (pf_now_s() - t0 < 5 && (r = ctl_session_wait_shutdown(m[0].s, 0.1)) == 0)
        ;
    check(r == (end ? 1 : -ENOLINK), "%s: server 0 is told the run %s (%d)", name, end ? "ended" : "re-forms",
          r);
    ctl_session_close(l.s); /* the learner stops with the others */
    usleep(300000);
    ctl_session_close(m[0].s);
    if (m[2].s)
        ctl_session_close(m[2].s);
    ctl_rendezvous_stop(rv);
    log_close_file();
    check(file_has(path, end ? "rejoining, stopped with the run's end"
                             : "rejoining, stopped for the checkpoint re-form"),
          "%s: the learner's going is logged as a stop %s", name,
          end ? "with the run's end" : "for the re-form");
    check(!file_has(path, "the run goes on as before"), "%s: no line says the run goes on as before", name);
    unlink(path);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    log_init("test", 0);
    ctl_set_replicas(1); /* the members' config: replicas = 1, as the run's */
    case_ready();
    case_hang();
    learner_stops("reform", 0);
    learner_stops("end", 1);
    case_forming();
    case_replicas();
    return check_summary();
}
