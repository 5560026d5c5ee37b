/* A worker's two data-plane endpoints, as pfcps-worker and bench/scale/scale_worker open and connect them:
 *
 *   endpoint 1: the parameter-server client (worker/ps_client.h), towards the S servers (pull / push)
 *   endpoint 2: the collectives ring among the W workers (common/coll.h, coll_fabric)
 *
 * Order of use: train_net_open and train_net_address before joining (the packed address goes into this
 * worker's address-book entry, common/member_addr.h: part 0 the client, part 1 the ring, an optional part 2
 * from the caller), then, with the run config and the address book from the rendezvous, train_net_check_run
 * and train_net_connect; train_net_close at the end. */
#ifndef PFCPS_WORKER_TRAIN_NET_H
#define PFCPS_WORKER_TRAIN_NET_H

#include <stddef.h>
#include <stdint.h>

#include "common/coll.h"
#include "common/config.h"
#include "common/ctl.h"
#include "common/fabric.h"
#include "worker/ps_client.h"

typedef struct train_net {
    ps_client *ps;     /* endpoint 1: pull / push towards the servers */
    fab_ctx *coll_fab; /* endpoint 2: the ring */
    pf_coll coll;      /* the fabric ring among the workers (valid when have_coll) */
    int have_coll;
    int (*interrupted)(void); /* or NULL: the ring's waits call it once a second after a second without a
                                 message (with the idle check below); nonzero ends the collective with -EINTR
                                 (pfcps.torch: a Python signal handler raised, Ctrl-C) */
    double wait_s; /* seconds: the longest wait for a server's answer or a ring peer before the run is
                      declared broken (4 x ctl_timeout; 120 when ctl_timeout is not set) */
} train_net;

/* Opens both endpoints from this worker's own config (provider, servers, num_classes, embedding_size,
 * wire_dtype; the run config is not known yet). Returns 0, or a negative code with pf_errmsg (an unknown
 * wire_dtype, a fabric error naming the libfabric call); on error what was opened stays in *n for
 * train_net_close. */
int train_net_open(train_net *n, const pf_config *local, int rank);

/* This worker's address-book entry: the two endpoints' fabric names packed into addr (capacity *addr_len
 * bytes in, bytes used out) with common/member_addr.h: part 0 the client, part 1 the ring, and `extra`
 * (extra_len bytes) as part 2 when extra is not NULL (worker 0 of a cuda run: its NCCL unique id).
 * Returns 0 or a negative code (a fabric error, -ENOSPC). */
int train_net_address(train_net *n, const void *extra, size_t extra_len, uint8_t *addr, size_t *addr_len);

/* The client was created before the run config was known (its address had to go into the join): checks that
 * the keys it was created with (common/config.h cfg_data_plane_keys: servers, num_classes, embedding_size,
 * wire_dtype, provider, replicas) have the run's values. Returns 0, or -EINVAL naming each differing key with
 * both values. */
int train_net_check_run(const pf_config *local, const pf_config *run);

/* Has the next join of this process (common/ctl.h ctl_set_endpoint_keys) carry cfg's values of
 * cfg_data_plane_keys, so that the rendezvous refuses a mismatch before the member takes a seat (a worker
 * refused after it joined would leave, and its loss stop the run). For joins through cli_join_run
 * (pfcps.torch, bench/scale); pfcps-worker's daemon_join sends the longer cfg_worker_endpoint_keys. Returns 0
 * or a negative code (-ENOSPC). */
int train_net_set_join_keys(const pf_config *cfg);

/* Connects both endpoints with the run config and the address book: the client's timeout (wait_s), the
 * run's data-plane token (ctl_data_token from `secret` and the book's nonce), borrowed push gradients (the
 * caller waits for each push before changing its gradients), the client's metrics (ps_client_metrics_on),
 * every server's address, a warm-up round trip to
 * each server (up to ctl_timeout seconds); then the ring over every worker's part 1 address. Returns 0 or a
 * negative code with pf_errmsg: -EPROTO when the book's member counts differ from the run config's, the
 * server or worker that failed named otherwise. */
int train_net_connect(train_net *n, const pf_config *run, const ctl_book *book, int rank, const char *secret);

/* The collectives ring over every worker's second endpoint (part 1 of its book entry in `book`), this worker
 * at `rank`. Returns 0 or coll_fabric_create's error. */
int train_net_ring_connect(train_net *n, const ctl_book *book, int rank);

/* Drops the ring and its endpoint (after a failed collective a ring is unusable, and messages of the
 * abandoned collective may still arrive at the old endpoint) and opens a new endpoint for `provider`; writes
 * this worker's new packed book entry (the servers' endpoint as before, the new ring endpoint; no third part)
 * to addr[*addr_len] (capacity in). train_net_ring_connect then builds the new ring. Returns 0 or the fabric
 * error. */
int train_net_ring_reopen(train_net *n, const char *provider, uint8_t *addr, size_t *addr_len);

/* How many of the run's workers (this one included) run on this worker's host: those whose ring endpoint in
 * `book` has the same host as worker `rank`'s (fab_addr_host). Returns the count (>= 1), or -ENOTSUP when the
 * provider's names do not tell the host, or -EINVAL for a malformed book entry. */
int train_net_workers_on_host(const train_net *n, const ctl_book *book, int rank);

/* Releases the ring, its endpoint and the client. A zeroed or partly opened *n is fine. */
void train_net_close(train_net *n);

#endif
