/* Data-plane transport: a thin wrapper over libfabric reliable datagram endpoints (FI_EP_RDM) with
 * FI_MSG | FI_RMA, used by the parameter server, its client library and the workers' CPU collectives.
 *
 * Provider: the config value is mapped to an exact libfabric provider name, so fi_getinfo never picks
 * another one (libfabric 1.17 would otherwise offer the experimental `net`):
 *   "tcp"   -> "tcp;ofi_rxm"    (default; what the loopback tests use)
 *   "shm"   -> "shm"            (one host)
 *   "verbs" -> "verbs;ofi_rxm"  (InfiniBand / RoCE; see docs/deploy-verbs.md)
 * Memory registration honours whatever mr_mode bits the chosen provider asks for (FI_MR_LOCAL,
 * FI_MR_VIRT_ADDR, FI_MR_PROV_KEY, FI_MR_ALLOCATED, FI_MR_ENDPOINT): callers always pass the fab_mr of a
 * buffer to every data call and always address remote memory through fab_mr_remote().
 *
 * Progress is manual (FI_PROGRESS_MANUAL): nothing moves unless someone calls fab_poll() or fab_wait(). The
 * parameter server runs a progress thread that polls its CQ continuously and, when idle, sleeps in fab_wait
 * until a completion (or fab_wake) comes; clients progress inside their wait calls. A posting call that meets
 * -FI_EAGAIN drains the CQ into an internal backlog (returned by later fab_poll calls, in order) and retries,
 * so posts never fail for lack of progress. The retrying is bounded: a post still refused after the context's
 * timeout (fab_set_timeout, default FAB_DEFAULT_TIMEOUT_S) fails with -ECOMM naming the peer, which is then
 * marked so that later posts to it fail at once (a killed peer makes libfabric 1.17's tcp;ofi_rxm answer
 * -FI_EAGAIN forever). The domain is opened FI_THREAD_SAFE; the backlog is mutex-protected.
 *
 * Errors: negative errno codes, pf_errmsg() names the libfabric call and its fi_strerror text. */
#ifndef PFCPS_COMMON_FABRIC_H
#define PFCPS_COMMON_FABRIC_H

#include <stddef.h>
#include <stdint.h>

#include <rdma/fabric.h>

#define FAB_MAX_ADDR 256 /* bytes; an endpoint name from fab_getname fits (same as CTL_MAX_ADDR) */
/* Post retry bound of a new context: 4 x the default ctl_timeout, the bound the workers already put on a
 * data-plane wait. Large on purpose: a live peer that does not progress for a while (a worker in a long
 * forward, its pull replies queued) must not be taken for a dead one. */
#define FAB_DEFAULT_TIMEOUT_S 120.0

typedef struct fab_ctx fab_ctx;

/* A registered buffer. `desc` goes into local data calls (needed under FI_MR_LOCAL); a peer addresses it
 * with the (addr, key) pair from fab_mr_remote(). */
typedef struct fab_mr {
    struct fid_mr *mr;
    void *desc;
    void *buf;
    size_t len;
    uint64_t key;
    int virt_addr; /* 1 when the provider wants virtual addresses (FI_MR_VIRT_ADDR), else offsets */
} fab_mr;

/* One completion. `err` is 0 or a negative errno (e.g. -ECANCELED, -ETRUNC from fi_cq_readerr);
 * `context` is what was passed to the posting call; `len` is bytes received (receives only);
 * `flags` the libfabric completion flags (FI_SEND, FI_RECV, FI_READ, FI_WRITE, ...). */
typedef struct fab_comp {
    void *context;
    uint64_t flags;
    size_t len;
    uint64_t data;
    int err;
} fab_comp;

/* Opens fabric, domain, endpoint, a CQ and an AV (FI_AV_TABLE) for `provider` ("tcp", "shm", "verbs",
 * or an exact libfabric provider string such as "tcp;ofi_rxm"). Returns 0 and *out, or -ENODATA when
 * the provider is not available (message names it and the fi_getinfo error), -EINVAL for an unknown
 * name, other negative codes naming the failing fi_* call. */
/* Makes every later fab_open of a tcp or verbs endpoint in this process bind to address `node` (an IP
 * address of this host; NULL or "": the provider's choice, its first non-loopback interface). The daemons set
 * the address their route to the rendezvous leaves from (config key data_address), so the data plane listens
 * where the control plane does, not on every interface. */
void fab_set_source(const char *node);

/* Tells libfabric how many processes the job has (servers + workers) through FI_UNIVERSE_SIZE, its documented
 * setting for the number of peers, when `provider` (as for fab_open) is tcp. ofi_rxm gives its completion
 * queue (tx + rx queue depths) x universe entries of 48 bytes, 12 MiB at libfabric's default of 256, which a
 * tcp endpoint then touches for the first time over its first hundreds of steps (page faults in every step
 * until then). Over tcp an undersized universe costs only that (the queue overflows into a list); a verbs
 * completion queue is a hardware queue, so other providers keep libfabric's default.
 * Takes effect only before this process's first fab_open (libfabric reads it once) and only when the
 * environment does not set FI_UNIVERSE_SIZE (that value wins). Call it before starting threads (setenv).
 * `processes` below 2 counts as 2. Returns the universe size in effect: the environment's, `processes`, or 0
 * when nothing was set (not tcp, or libfabric had already started with its default); -EINVAL (message names
 * it) when the environment's FI_UNIVERSE_SIZE is not a positive integer, whatever the provider. */
long fab_set_universe(const char *provider, long processes);

int fab_open(const char *provider, fab_ctx **out);

/* Whether `provider` ("tcp", "shm", "verbs" or an exact name, as for fab_open) can move data straight to
 * and from CUDA device memory (FI_HMEM with iface FI_HMEM_CUDA: a libfabric built with CUDA, a driver and a
 * GPU present; GPUDirect RDMA on verbs). Asks fi_getinfo for exactly that provider with caps
 * FI_MSG|FI_RMA|FI_HMEM and the mr_mode bits fab_open honours plus FI_MR_HMEM; when it is offered, opens a
 * throw-away fabric + domain and registers one host page with iface FI_HMEM_CUDA: libfabric refuses that
 * with FI_ENOSYS when its CUDA interface is not initialized (a libfabric built without CUDA, as Debian's
 * 1.17, offers FI_HMEM on shm for other interfaces but has no CUDA).
 * Returns 1 (offered: rows can go straight to GPU memory), 0 (not: use pinned host buffers), -EINVAL for an
 * unknown provider name, or another negative code only when libfabric itself fails (out of memory, a broken
 * fabric/domain open). On 0 and 1, pf_errmsg() holds a one-line reason for the start-up log. Opens no
 * endpoint; cheap enough to call once at start. */
int fab_hmem_cuda_supported(const char *provider);

/* Closes the endpoint only (posted receives and operations are cancelled; no more completions), so that
 * registered buffers can then be closed safely before fab_close. Idempotent; NULL is a no-op. */
void fab_shutdown(fab_ctx *f);

/* libfabric 1.17's shm provider backs each endpoint with a region /dev/shm/<pid>:<n>:<n> that only fi_close
 * removes. A process that ends without closing (killed, or a daemon's fast exit) leaves its regions, 16 MiB
 * of memory each, and a later process that gets the same pid cannot open an shm endpoint (fi_enable: EBUSY).
 * fab_open therefore removes this pid's regions before its first shm endpoint, and the daemons remove their
 * own before a fast exit. fab_shm_unlink_regions removes every region of `pid` and returns how many; call it
 * only for a dead pid or for this process after its endpoints are done with. */
int fab_shm_unlink_regions(long pid);

/* Closes everything fab_open opened (the endpoint first if fab_shutdown was not called). Registered buffers
 * must be closed before (after fab_shutdown when receives may still be posted). NULL is a no-op. */
void fab_close(fab_ctx *f);

/* Sets how long a posting call (fab_send, fab_recv, fab_write, fab_read) keeps retrying -FI_EAGAIN before it
 * fails with -ECOMM; seconds <= 0 restores FAB_DEFAULT_TIMEOUT_S. Daemons pass 4 x their ctl_timeout. Safe
 * while another thread posts (the bound is read at each retry). */
void fab_set_timeout(fab_ctx *f, double seconds);

/* Makes every post of this process that is retrying -FI_EAGAIN give up with -ECANCELED once *flag is
 * non-zero, instead of at the context's timeout: a member whose control watcher saw the run break (a peer that
 * failed or left) sets it, so a post towards that peer stops at once. NULL (the default) turns it off. */
void fab_set_interrupt(const int *flag);

/* 1 when fab_set_interrupt's flag is raised (a wait for replies, e.g. worker/ps_client.c ps_wait, gives up
 * then as a post does), else 0. */
int fab_interrupted(void);

/* Declares peer dest gone, as a post whose retries ran out does: posts to it fail with -ECOMM at once, and a
 * post retrying -FI_EAGAIN towards it gives up within one retry. Safe from any thread (the control-plane
 * watcher of a worker calls it when the rendezvous announces a lost server, so the training thread is not
 * held in a post to it until the timeout). */
void fab_mark_peer_dead(fab_ctx *f, fi_addr_t dest);

/* Undoes fab_mark_peer_dead for dest: an address inserted again for a restarted peer (a server rejoining a
 * run) may be given the index of its earlier one. Safe from any thread. */
void fab_mark_peer_alive(fab_ctx *f, fi_addr_t dest);

/* The post retry bound in seconds (fab_set_timeout). */
double fab_timeout(const fab_ctx *f);

/* The exact provider name in use ("tcp;ofi_rxm", "shm", ...). */
const char *fab_provider(const fab_ctx *f);

/* The mr_mode bits the provider asked for. */
uint64_t fab_mr_mode(const fab_ctx *f);

/* Writes the names of the set mr_mode bits ("FI_MR_LOCAL|FI_MR_VIRT_ADDR", or "none") into buf. */
void fab_mr_mode_str(uint64_t mode, char *buf, size_t len);

/* This endpoint's name (opaque bytes, at most FAB_MAX_ADDR) for the address book.
 * *len is the capacity in, bytes written out. Returns 0 or -ENOSPC / -EIO. */
int fab_getname(fab_ctx *f, void *addr, size_t *len);

/* The host of an endpoint name of f's provider, as a key comparable between names: the IP address for the
 * socket address formats (tcp; verbs over IPoIB), "local" for shm (its endpoints are all on this host).
 * Writes a NUL-terminated key of at most len bytes into out. Returns 0, -EINVAL (a name too short for its
 * format) or -ENOTSUP (a format whose host is not known: InfiniBand GIDs, ...). */
int fab_addr_host(const fab_ctx *f, const void *addr, size_t addr_len, char *out, size_t len);

/* Inserts a peer's endpoint name into the AV; *out is the fi_addr to use in data calls.
 * Returns 0 or -EINVAL (the provider rejected the address). */
int fab_av_insert(fab_ctx *f, const void *addr, size_t len, fi_addr_t *out);

/* Allocates `bytes` of message-buffer memory for fab_mr_reg: aligned to 2 MiB, rounded up to a multiple of
 * 2 MiB and advised as transparent huge pages (MADV_HUGEPAGE; THP "madvise" mode honours it). Providers
 * that copy through the kernel (shm's CMA, process_vm_readv) pin the pages of every message: with 2 MiB
 * pages that is one step per 2 MiB, not one per 4 KiB, and the copies miss the TLB less. Free with free().
 * Returns NULL when out of memory (bytes == 0 allocates 2 MiB). */
void *fab_buf_alloc(size_t bytes);

/* Registers `len` bytes at `buf` (which the caller allocated and keeps alive) with `access` bits
 * (FI_SEND | FI_RECV | FI_READ | FI_WRITE for local use; FI_REMOTE_READ / FI_REMOTE_WRITE to expose it
 * to peers). Binds and enables the MR when the provider wants FI_MR_ENDPOINT. Returns 0 or -errno. */
int fab_mr_reg(fab_ctx *f, void *buf, size_t len, uint64_t access, fab_mr *out);

/* Releases a registration made by fab_mr_reg. Zeroed / never-registered fab_mr is a no-op. */
void fab_mr_close(fab_mr *mr);

/* The (remote address, key) a peer must use to reach byte `offset` of `mr` with fab_read/fab_write. */
void fab_mr_remote(const fab_mr *mr, size_t offset, uint64_t *raddr, uint64_t *rkey);

/* Posts a send of `len` bytes at `buf` (inside `mr`) to `dest`; completion carries `ctx`.
 * Returns 0, -ECOMM when the post could not go out within fab_timeout() seconds (or an earlier post to
 * `dest` timed out: the peer is gone; the message names it), or another -errno naming fi_send.
 * fab_recv, fab_write and fab_read return errors the same way. */
int fab_send(fab_ctx *f, fi_addr_t dest, const void *buf, size_t len, const fab_mr *mr, void *ctx);

/* Posts a receive buffer (any source). A message longer than `len` completes with err = -ETRUNC. */
int fab_recv(fab_ctx *f, void *buf, size_t len, const fab_mr *mr, void *ctx);

/* One-sided write of `len` local bytes to the peer's (raddr, rkey) (from its fab_mr_remote). Posted with
 * FI_DELIVERY_COMPLETE: its completion means the bytes are in the peer's memory. */
int fab_write(fab_ctx *f, fi_addr_t dest, const void *buf, size_t len, const fab_mr *mr, uint64_t raddr,
              uint64_t rkey, void *ctx);

/* One-sided read of `len` bytes from the peer's (raddr, rkey) into local `buf`. */
int fab_read(fab_ctx *f, fi_addr_t dest, void *buf, size_t len, const fab_mr *mr, uint64_t raddr,
             uint64_t rkey, void *ctx);

/* Drives progress and returns up to `max` completions (0 when none; never blocks).
 * Failed operations come back as completions with err < 0; the return value is negative only when the
 * CQ itself failed. */
int fab_poll(fab_ctx *f, fab_comp *out, int max);

/* Whether this context's completion queue has a wait object, so fab_wait sleeps instead of returning at once.
 * True when the provider offers an FD wait object (libfabric 1.17's tcp;ofi_rxm does, shm does not) and the
 * environment variable PFCPS_FABRIC_WAIT was not "0" at fab_open; otherwise the CQ is polled only. */
int fab_can_wait(const fab_ctx *f);

/* As fab_poll, but when nothing is ready sleeps up to timeout_ms milliseconds (fi_cq_sread, which drives
 * progress while it waits) for the first completion. Returns early with 0 when another thread calls
 * fab_wake. Without a wait object (fab_can_wait false) it is fab_poll and never sleeps: the caller naps. */
int fab_wait(fab_ctx *f, fab_comp *out, int max, int timeout_ms);

/* Wakes a thread sleeping in fab_wait on f (fi_cq_signal), or makes the next fab_wait return at once.
 * Safe from any thread; a no-op without a wait object or for NULL. */
void fab_wake(fab_ctx *f);

#endif
