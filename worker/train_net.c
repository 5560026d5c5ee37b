/* A worker's data-plane endpoints: the parameter-server client and the collectives ring (see train_net.h). */
#include "worker/train_net.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/member_addr.h"

int train_net_open(train_net *n, const pf_config *local, int rank)
{
    ps_dtype dt = PS_DT_FP32;
    int rc = ps_dtype_parse(local->wire_dtype, &dt);
    ps_client_opts po = {.provider = local->provider,
                         .rank = rank,
                         .servers = local->servers,
                         .num_classes = local->num_classes > 0 ? local->num_classes : 1,
                         .dim = local->embedding_size,
                         .dtype = dt,
                         .replicas = local->replicas};
    if (rc == 0)
        rc = ps_client_create(&po, &n->ps);
    if (rc == 0)
        rc = fab_open(local->provider, &n->coll_fab);
    return rc;
}

int train_net_address(train_net *n, const void *extra, size_t extra_len, uint8_t *addr, size_t *addr_len)
{
    uint8_t a0[FAB_MAX_ADDR], a1[FAB_MAX_ADDR];
    size_t l0 = sizeof a0, l1 = sizeof a1;
    int rc = ps_client_getname(n->ps, a0, &l0);
    if (rc == 0)
        rc = fab_getname(n->coll_fab, a1, &l1);
    if (rc < 0)
        return rc;
    const void *parts[3] = {a0, a1, extra};
    size_t lens[3] = {l0, l1, extra_len};
    rc = member_addr_pack(addr, *addr_len, extra ? 3 : 2, parts, lens);
    if (rc < 0)
        return rc;
    *addr_len = (size_t)rc;
    return 0;
}

int train_net_check_run(const pf_config *local, const pf_config *run)
{
    char text[CTL_MAX_ENDPOINT_KEYS], diff[300];
    int rc = cfg_keys_text(local, cfg_data_plane_keys, text, sizeof text);
    if (rc < 0)
        return pf_err_wrap(rc, "the worker's data-plane keys");
    const int nd = cfg_keys_text_diff(text, run, diff, sizeof diff);
    if (nd > 0)
        return pf_err(
            -EINVAL,
            "this worker's config differs from the run's in %d key%s its endpoints are opened with (this "
            "worker's value first, the run's in parentheses): %s; give every process the same config",
            nd, nd > 1 ? "s" : "", diff);
    return 0;
}

int train_net_set_join_keys(const pf_config *cfg)
{
    char text[CTL_MAX_ENDPOINT_KEYS];
    int rc = cfg_keys_text(cfg, cfg_data_plane_keys, text, sizeof text);
    if (rc < 0)
        return pf_err_wrap(rc, "the worker's data-plane keys");
    return ctl_set_endpoint_keys(text);
}

/* The servers: the client's timeout and token, their addresses from the book, connections opened before
 * step 0. */
static int connect_servers(train_net *n, const pf_config *run, const ctl_book *book, const char *secret)
{
    int rc;
    /* A dead server is declared (-ECOMM naming it) once it leaves a send or a liveness probe unanswered for
     * wait_s (ps_client.h); not less: a live server's reply can wait on another worker's long step. */
    ps_client_set_timeout(n->ps, n->wait_s);
    uint64_t token = 0; /* the run's data-plane token (proto/ps_wire.h): servers drop messages without it */
    if ((rc = ctl_data_token(secret, book->run_nonce, &token)) < 0)
        return rc;
    ps_client_set_token(n->ps, token);
    ps_client_set_borrow_grads(n->ps, 1); /* the caller waits for its push before the gradients change */
    if ((rc = ps_client_metrics_on(n->ps)) < 0)
        return rc;
    for (int s = 0; s < run->servers; s++) {
        int lost = 0; /* a replacement's book: failed over and not rejoined (no address) */
        for (int i = 0; i < book->nlost; i++)
            lost |= book->lost[i] == s;
        if (lost)
            continue;
        if (!run->replicas) {
            if ((rc = ps_client_add_server(n->ps, s, book->servers[s].addr, book->servers[s].addr_len)) < 0)
                return pf_err_wrap(rc, "server %d address", s);
            continue;
        }
        /* replicas = 1: server s's entry packs its primary endpoint (shard s) and its backup endpoint (the
         * copy of shard s - 1), common/member_addr.h. */
        const int S = run->servers, b = (s + S - 1) % S;
        for (int part = 0; part < 2; part++) {
            const void *a = NULL;
            size_t al = 0;
            if ((rc = member_addr_part(book->servers[s].addr, book->servers[s].addr_len, part, &a, &al)) <
                    0 ||
                (rc = ps_client_add_copy(n->ps, part ? b : s, part, a, al)) < 0)
                return pf_err_wrap(rc, "server %d address (part %d)", s, part);
        }
    }
    /* A replacement of a lost worker: the servers failed over and not rejoined are retired from the start, as
     * the other workers retired them at each failover. */
    for (int i = 0; i < book->nlost; i++)
        if ((rc = ps_client_server_lost(n->ps, book->lost[i], book->rejoin_epoch)) < 0)
            return pf_err_wrap(rc, "lost server %d", book->lost[i]);
    if (book->nlost)
        log_info("servers failed over and not rejoined: %d of %d (their copies retired from the start)",
                 book->nlost, run->servers);
    if ((rc = ps_client_warmup(n->ps, run->ctl_timeout > 0 ? run->ctl_timeout : 30)) < 0)
        return pf_err_wrap(rc, "warming up the connections to %d servers", run->servers);
    return 0;
}

/* The ring's idle check (coll_fabric_set_idle_check): n->interrupted first; then, while no rendezvous is left
 * to say that both servers of a shard are lost (server 0, its host, is one of those lost), a ring peer that
 * waits on them stops answering like a slow one would, and this worker would wait out the ring's whole bound;
 * its own probes of the servers (ps_client_check_copies) tell it instead. */
static int ring_idle_check(void *arg)
{
    train_net *n = arg;
    if (n->interrupted && n->interrupted())
        return pf_err(-EINTR, "interrupted by a signal");
    int s = ps_client_check_copies(n->ps);
    if (s < 0)
        return 0;
    return pf_err(
        -ECOMM,
        "shard %d has no live copy left (its servers stopped answering this worker's probes, and no "
        "rendezvous is left to say more): the run re-forms from its checkpoint",
        s);
}

int train_net_ring_connect(train_net *n, const ctl_book *book, int rank)
{
    const int W = book->num_workers;
    const void **addrs = calloc((size_t)W, sizeof *addrs);
    size_t *lens = calloc((size_t)W, sizeof *lens);
    if (!addrs || !lens) {
        free(addrs);
        free(lens);
        return pf_err(-ENOMEM, "out of memory");
    }
    int rc = 0;
    for (int w = 0; w < W && rc == 0; w++) {
        rc = member_addr_part(book->workers[w].addr, book->workers[w].addr_len, 1, &addrs[w], &lens[w]);
        if (rc < 0)
            pf_err_wrap(rc, "worker %d's collective address", w);
    }
    if (rc == 0) {
        coll_fabric_opts co = {.timeout_s = n->wait_s};
        rc = coll_fabric_create(n->coll_fab, rank, W, addrs, lens, &co, &n->coll);
        n->have_coll = rc == 0;
        if (rc == 0 && n->ps)
            coll_fabric_set_idle_check(&n->coll, ring_idle_check, n);
    }
    free(addrs);
    free(lens);
    return rc;
}

int train_net_workers_on_host(const train_net *n, const ctl_book *book, int rank)
{
    char mine[64], theirs[64];
    const void *a = NULL;
    size_t al = 0;
    if (rank < 0 || rank >= book->num_workers)
        return -EINVAL;
    int rc = member_addr_part(book->workers[rank].addr, book->workers[rank].addr_len, 1, &a, &al);
    if (rc == 0)
        rc = fab_addr_host(n->coll_fab, a, al, mine, sizeof mine);
    if (rc < 0)
        return rc;
    int same = 0;
    for (int w = 0; w < book->num_workers; w++) {
        if ((rc = member_addr_part(book->workers[w].addr, book->workers[w].addr_len, 1, &a, &al)) < 0 ||
            (rc = fab_addr_host(n->coll_fab, a, al, theirs, sizeof theirs)) < 0)
            return rc;
        same += !strcmp(mine, theirs);
    }
    return same;
}

int train_net_connect(train_net *n, const pf_config *run, const ctl_book *book, int rank, const char *secret)
{
    /* Under BSP a pull waits for the slowest worker's push, so allow several control timeouts. */
    n->wait_s = 4 * (run->ctl_timeout > 0 ? run->ctl_timeout : 30);
    if (book->num_workers != run->workers || book->num_servers != run->servers)
        return pf_err(-EPROTO, "address book has %d servers / %d workers, run config says %d / %d",
                      book->num_servers, book->num_workers, run->servers, run->workers);
    int rc = connect_servers(n, run, book, secret);
    return rc < 0 ? rc : train_net_ring_connect(n, book, rank);
}

int train_net_ring_reopen(train_net *n, const char *provider, uint8_t *addr, size_t *addr_len)
{
    if (n->have_coll)
        coll_destroy(&n->coll);
    n->have_coll = 0;
    fab_close(n->coll_fab);
    n->coll_fab = NULL;
    int rc = fab_open(provider, &n->coll_fab);
    if (rc < 0)
        return pf_err_wrap(rc, "a new collectives endpoint");
    return train_net_address(n, NULL, 0, addr, addr_len);
}

void train_net_close(train_net *n)
{
    if (n->have_coll)
        coll_destroy(&n->coll);
    n->have_coll = 0;
    fab_close(n->coll_fab);
    n->coll_fab = NULL;
    ps_client_destroy(n->ps);
    n->ps = NULL;
}
