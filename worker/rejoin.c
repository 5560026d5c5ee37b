/* A worker's part in a failed-over server's rejoin (see rejoin.h). */
#include "worker/rejoin.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "common/log.h"
#include "common/member_addr.h"
#include "common/clock.h"

static void sleep_ms(void)
{
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
}

void rejoin_init(rejoin_state *r)
{
    memset(r, 0, sizeof *r);
    r->ckpt = -1;
    atomic_store(&r->taken, 1);
}

void rejoin_notice(rejoin_state *r, int kind, int server, uint32_t epoch, const void *addr, size_t len)
{
    for (int i = 0; i < 10000 && !atomic_load(&r->taken); i++)
        sleep_ms();
    if (kind == CTL_FO_REJOIN_BEGIN) {
        r->server = server;
        atomic_store(&r->begin_epoch, epoch);
        return;
    }
    r->end.kind = kind;
    r->end.server = server;
    r->end.len = len <= sizeof r->end.addr ? len : 0;
    if (r->end.len)
        memcpy(r->end.addr, addr, r->end.len);
    atomic_store(&r->taken, kind != CTL_FO_REJOINED);
    atomic_store(&r->end_epoch, epoch);
}

/* "server N", or "a server" while this worker agreed through the vote before its own notice came. */
static const char *server_name(const rejoin_state *r, char *buf, size_t n)
{
    if (atomic_load(&r->begin_epoch) < r->wait_epoch)
        return "a server (its notice not here yet)";
    snprintf(buf, n, "server %d", r->server);
    return buf;
}

float rejoin_vote(const rejoin_state *r)
{
    const uint32_t b = atomic_load(&r->begin_epoch), e = atomic_load(&r->end_epoch);
    return b > e ? (float)b : 0.f;
}

int rejoin_agree(rejoin_state *r, uint32_t agreed, int64_t ckpt)
{
    if (agreed <= r->wait_epoch || r->ckpt >= 0)
        return 0;
    r->wait_epoch = agreed;
    r->ckpt = ckpt;
    char nm[32];
    log_info("%s rejoins (epoch %u): every worker checkpoints at step %lld for its copy and holds its pushes "
             "after it until the copy is done",
             server_name(r, nm, sizeof nm), agreed, (long long)ckpt);
    return 1;
}

int rejoin_hold(rejoin_state *r, ctl_session *sess, ps_client *ps, int rank, int64_t step, double ctl_timeout,
                int (*stop)(void *), void *arg)
{
    const double t0 = pf_now_s(), limit = 4 * (ctl_timeout > 0 ? ctl_timeout : 30);
    int rc = 0;
    r->ckpt = -1;
    if (rank == 0 && sess &&
        (rc = ctl_session_rejoin_report(sess, CTL_FO_REJOIN_STEP, r->server, r->wait_epoch, step)) < 0)
        return pf_err_wrap(rc, "rejoin: telling the rendezvous the copy's checkpoint step %lld",
                           (long long)step);
    while (atomic_load(&r->end_epoch) < r->wait_epoch) {
        int s = stop ? stop(arg) : 0;
        if (s)
            return s > 0 ? 0 : s;
        if (pf_now_s() - t0 > limit) {
            char nm[32];
            return pf_err(-ETIMEDOUT,
                          "rejoin: %s did not become a copy (nor was its rejoin aborted) within %.0f s of "
                          "checkpoint step %lld",
                          server_name(r, nm, sizeof nm), limit, (long long)step);
        }
        sleep_ms();
    }
    const int kind = r->end.kind, server = r->end.server;
    if (kind == CTL_FO_REJOINED) {
        const void *a[2] = {NULL, NULL};
        size_t l[2] = {0, 0};
        for (int i = 0; i < 2 && rc == 0; i++)
            rc = member_addr_part(r->end.addr, r->end.len, i, &a[i], &l[i]);
        if (rc == 0)
            rc = ps_client_server_back(ps, server, a, l, atomic_load(&r->end_epoch));
        atomic_store(&r->taken, 1); /* the watcher may write the next notice from here on */
        if (rc < 0)
            return pf_err_wrap(rc, "rejoin of server %d", server);
    }
    log_info("rejoin of server %d: %s after checkpoint step %lld; pushes held %.3f s", server,
             kind == CTL_FO_REJOINED ? "it holds its copies again" : "aborted, the run goes on as it was",
             (long long)step, pf_now_s() - t0);
    return 0;
}
