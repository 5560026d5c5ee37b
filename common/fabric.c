/* libfabric wrapper: see fabric.h. */
#include "common/fabric.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include "common/err.h"

#define FAB_BACKLOG 4096
#define FAB_SPIN_S  0.01 /* after this long on -FI_EAGAIN a retry loop sleeps FAB_NAP_NS between tries */
#define FAB_NAP_NS  50000

struct fab_ctx {
    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_ep *ep;
    struct fid_cq *cq;
    struct fid_av *av;
    uint64_t next_key;
    double post_timeout; /* seconds a posting call retries -FI_EAGAIN before giving up */
    uint8_t *dead;       /* dead[i]: a post to fi_addr i timed out before; later posts to it fail at once */
    size_t ndead;
    int waitable;         /* the CQ has a wait object: fab_wait blocks in fi_cq_sread */
    pthread_mutex_t lock; /* guards the backlog, next_key and dead */
    fab_comp backlog[FAB_BACKLOG];
    int bl_head, bl_count;
};

/* libfabric returns negative FI_E* codes; the small ones equal errno values, the rest become -EIO. */
static int fab_fail(int rc, const char *call)
{
    int e = rc < 0 ? -rc : rc;
    int code = (e > 0 && e < 256) ? -e : -EIO;
    return pf_err(code, "%s: %s", call, fi_strerror(e));
}

static const char *map_provider(const char *p)
{
    if (!strcmp(p, "tcp"))
        return "tcp;ofi_rxm";
    if (!strcmp(p, "verbs"))
        return "verbs;ofi_rxm";
    if (!strcmp(p, "shm"))
        return "shm";
    if (!strcmp(p, "tcp;ofi_rxm") || !strcmp(p, "verbs;ofi_rxm"))
        return p;
    return NULL;
}

/* fab_set_source's address: endpoints opened after it bind there (tcp, verbs). */
static char g_source[128];

void fab_set_source(const char *node)
{
    snprintf(g_source, sizeof g_source, "%s", node ? node : "");
}

/* Set once libfabric was initialised (its first fi_getinfo in this process reads FI_UNIVERSE_SIZE). */
static atomic_int g_fi_started;

/* Every fi_getinfo of this file: notes that libfabric has started. */
static int getinfo_noted(uint32_t version, const char *node, uint64_t flags, const struct fi_info *hints,
                            struct fi_info **info)
{
    atomic_store(&g_fi_started, 1);
    return fi_getinfo(version, node, NULL, flags, hints, info);
}

long fab_set_universe(const char *provider, long processes)
{
    const char *env = getenv("FI_UNIVERSE_SIZE");
    if (env) {
        char *end = NULL;
        long v = strtol(env, &end, 10);
        if (!*env || *end || v < 1)
            return pf_err(-EINVAL, "FI_UNIVERSE_SIZE='%s' in the environment is not a positive integer (libfabric "
                          "sizes per-endpoint queues by it: unset it or give the job's process count)", env);
        return v;
    }
    const char *prov = map_provider(provider ? provider : "tcp");
    if (!prov || strncmp(prov, "tcp", 3) != 0 || atomic_load(&g_fi_started))
        return 0;
    if (processes < 2)
        processes = 2;
    char v[32];
    snprintf(v, sizeof v, "%ld", processes);
    setenv("FI_UNIVERSE_SIZE", v, 0);
    return processes;
}

int fab_shm_unlink_regions(long pid)
{
    char prefix[32];
    int n = 0, plen = snprintf(prefix, sizeof prefix, "%ld:", pid);
    DIR *d = opendir("/dev/shm");
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, (size_t)plen) != 0)
            continue;
        char path[300];
        snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
        n += unlink(path) == 0;
    }
    closedir(d);
    return n;
}

/* The first shm endpoint of this process: regions named after this pid can only be a dead process's. */
static void shm_unlink_stale_once(void)
{
    int n = fab_shm_unlink_regions((long)getpid());
    if (n > 0)
        fprintf(stderr, "fabric: removed %d stale shm region(s) /dev/shm/%ld:* left by an earlier process with "
                        "this pid\n", n, (long)getpid());
}
static pthread_once_t shm_stale_once = PTHREAD_ONCE_INIT;

int fab_open(const char *provider, fab_ctx **out)
{
    *out = NULL;
    const char *prov = map_provider(provider ? provider : "tcp");
    if (!prov)
        return pf_err(-EINVAL, "unknown provider '%s' (use tcp, shm or verbs)", provider);
    fab_ctx *f = calloc(1, sizeof(*f));
    if (!f)
        return pf_err(-ENOMEM, "fab_open: out of memory");
    pthread_mutex_init(&f->lock, NULL);
    f->next_key = 1;
    f->post_timeout = FAB_DEFAULT_TIMEOUT_S;

    struct fi_info *hints = fi_allocinfo();
    if (!hints) {
        free(f);
        return pf_err(-ENOMEM, "fi_allocinfo failed");
    }
    hints->caps = FI_MSG | FI_RMA;
    hints->ep_attr->type = FI_EP_RDM;
    hints->fabric_attr->prov_name = strdup(prov);
    /* Every registration mode this wrapper knows how to honour; the provider keeps the ones it needs. */
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    hints->domain_attr->threading = FI_THREAD_SAFE;
    hints->domain_attr->control_progress = FI_PROGRESS_MANUAL;
    hints->domain_attr->data_progress = FI_PROGRESS_MANUAL;
    hints->mode = 0;
    hints->addr_format = FI_FORMAT_UNSPEC;

    if (!strcmp(prov, "shm"))
        pthread_once(&shm_stale_once, shm_unlink_stale_once);
    /* A source address (fab_set_source) restricts tcp and verbs to that interface; shm has no address. */
    const char *node = g_source[0] && strcmp(prov, "shm") != 0 ? g_source : NULL;
    int rc = getinfo_noted(FI_VERSION(1, 17), node, node ? FI_SOURCE : 0, hints, &f->info);
    fi_freeinfo(hints);
    if (rc && node) {
        int code = pf_err(-ENODATA,
                          "fi_getinfo(provider %s, source address %s): %s (no interface of this host has "
                          "that address? set data_address)",
                          prov, node, fi_strerror(-rc));
        free(f);
        return code;
    }
    if (rc) {
        int code =
            pf_err(-ENODATA, "fi_getinfo(provider %s, FI_EP_RDM, FI_MSG|FI_RMA): %s", prov, fi_strerror(-rc));
        free(f);
        return code;
    }
    if ((rc = fi_fabric(f->info->fabric_attr, &f->fabric, NULL))) {
        rc = fab_fail(rc, "fi_fabric");
        goto fail;
    }
    if ((rc = fi_domain(f->fabric, f->info, &f->domain, NULL))) {
        rc = fab_fail(rc, "fi_domain");
        goto fail;
    }
    /* A CQ with a wait object lets an idle thread sleep until a completion comes (fab_wait); without one (a
     * provider that has none, or PFCPS_FABRIC_WAIT=0 in the environment) the CQ is polled only. */
    struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_DATA, .wait_obj = FI_WAIT_FD, .size = 0};
    const char *want_wait = getenv("PFCPS_FABRIC_WAIT");
    if (want_wait && !strcmp(want_wait, "0"))
        cq_attr.wait_obj = FI_WAIT_NONE;
    rc = fi_cq_open(f->domain, &cq_attr, &f->cq, NULL);
    f->waitable = rc == 0 && cq_attr.wait_obj != FI_WAIT_NONE;
    if (rc && cq_attr.wait_obj != FI_WAIT_NONE) {
        cq_attr.wait_obj = FI_WAIT_NONE;
        rc = fi_cq_open(f->domain, &cq_attr, &f->cq, NULL);
    }
    if (rc) {
        rc = fab_fail(rc, "fi_cq_open");
        goto fail;
    }
    struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
    if ((rc = fi_av_open(f->domain, &av_attr, &f->av, NULL))) {
        rc = fab_fail(rc, "fi_av_open");
        goto fail;
    }
    if ((rc = fi_endpoint(f->domain, f->info, &f->ep, NULL))) {
        rc = fab_fail(rc, "fi_endpoint");
        goto fail;
    }
    if ((rc = fi_ep_bind(f->ep, &f->cq->fid, FI_TRANSMIT | FI_RECV))) {
        rc = fab_fail(rc, "fi_ep_bind(cq)");
        goto fail;
    }
    if ((rc = fi_ep_bind(f->ep, &f->av->fid, 0))) {
        rc = fab_fail(rc, "fi_ep_bind(av)");
        goto fail;
    }
    if ((rc = fi_enable(f->ep))) {
        rc = fab_fail(rc, "fi_enable");
        goto fail;
    }
    *out = f;
    return 0;
fail:
    fab_close(f);
    return rc;
}

int fab_hmem_cuda_supported(const char *provider)
{
    const char *prov = map_provider(provider ? provider : "tcp");
    if (!prov)
        return pf_err(-EINVAL, "unknown provider '%s' (use tcp, shm or verbs)", provider);
    struct fi_info *hints = fi_allocinfo(), *info = NULL;
    if (!hints)
        return pf_err(-ENOMEM, "fi_allocinfo failed");
    hints->caps = FI_MSG | FI_RMA | FI_HMEM;
    hints->ep_attr->type = FI_EP_RDM;
    hints->fabric_attr->prov_name = strdup(prov);
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT | FI_MR_HMEM;
    hints->domain_attr->threading = FI_THREAD_SAFE;
    hints->domain_attr->control_progress = FI_PROGRESS_MANUAL;
    hints->domain_attr->data_progress = FI_PROGRESS_MANUAL;
    hints->mode = 0;
    hints->addr_format = FI_FORMAT_UNSPEC;
    int rc = getinfo_noted(FI_VERSION(1, 17), NULL, 0, hints, &info);
    fi_freeinfo(hints);
    if (rc == -FI_ENODATA || (rc == 0 && !(info->caps & FI_HMEM))) {
        if (info)
            fi_freeinfo(info);
        pf_err(0,
               "provider %s does not offer FI_HMEM (libfabric %u.%u): class-center rows go through pinned "
               "host buffers",
               prov, FI_MAJOR(fi_version()), FI_MINOR(fi_version()));
        return 0;
    }
    if (rc)
        return pf_err(rc == -FI_ENOMEM ? -ENOMEM : -EIO, "fi_getinfo(provider %s, FI_HMEM): %s", prov,
                      fi_strerror(-rc));
    struct fid_fabric *fabric = NULL;
    struct fid_domain *domain = NULL;
    struct fid_mr *mr = NULL;
    void *page = NULL;
    int ret;
    if ((rc = fi_fabric(info->fabric_attr, &fabric, NULL))) {
        ret = fab_fail(rc, "fi_fabric (FI_HMEM probe)");
        goto out;
    }
    if ((rc = fi_domain(fabric, info, &domain, NULL))) {
        ret = fab_fail(rc, "fi_domain (FI_HMEM probe)");
        goto out;
    }
    if (!(page = aligned_alloc(4096, 4096))) {
        ret = pf_err(-ENOMEM, "FI_HMEM probe: out of memory");
        goto out;
    }
    struct iovec iov = {.iov_base = page, .iov_len = 4096};
    struct fi_mr_attr attr = {.mr_iov = &iov,
                              .iov_count = 1,
                              .access = FI_SEND | FI_RECV,
                              .requested_key = 1,
                              .iface = FI_HMEM_CUDA};
    attr.device.cuda = 0;
    rc = fi_mr_regattr(domain, &attr, 0, &mr);
    if (rc == 0) {
        ret = 1;
        pf_err(0,
               "provider %s offers FI_HMEM with CUDA (mr_mode %s): class-center rows can go straight to GPU "
               "memory",
               prov, (info->domain_attr->mr_mode & FI_MR_HMEM) ? "FI_MR_HMEM" : "without FI_MR_HMEM");
    } else {
        /* -FI_ENOSYS: libfabric's CUDA interface is not initialized (built without CUDA, or no driver/GPU).
         * Any other refusal: the CUDA path is not usable as probed; the host path always works. */
        ret = 0;
        pf_err(0,
               "provider %s offers FI_HMEM but not for CUDA (fi_mr_regattr with FI_HMEM_CUDA: %s): "
               "class-center rows go through pinned host buffers",
               prov, fi_strerror(-rc));
    }
out:
    if (mr)
        fi_close(&mr->fid);
    if (domain)
        fi_close(&domain->fid);
    if (fabric)
        fi_close(&fabric->fid);
    free(page);
    fi_freeinfo(info);
    return ret;
}

void fab_shutdown(fab_ctx *f)
{
    if (!f || !f->ep)
        return;
    fi_close(&f->ep->fid);
    f->ep = NULL;
}

void fab_close(fab_ctx *f)
{
    if (!f)
        return;
    fab_shutdown(f);
    if (f->av)
        fi_close(&f->av->fid);
    if (f->cq)
        fi_close(&f->cq->fid);
    if (f->domain)
        fi_close(&f->domain->fid);
    if (f->fabric)
        fi_close(&f->fabric->fid);
    if (f->info)
        fi_freeinfo(f->info);
    pthread_mutex_destroy(&f->lock);
    free(f->dead);
    free(f);
}

void fab_set_timeout(fab_ctx *f, double seconds)
{
    double v = seconds > 0 ? seconds : FAB_DEFAULT_TIMEOUT_S;
    __atomic_store(&f->post_timeout, &v, __ATOMIC_RELAXED); /* also while another thread's post retries */
}

double fab_timeout(const fab_ctx *f)
{
    double v;
    __atomic_load(&f->post_timeout, &v, __ATOMIC_RELAXED);
    return v;
}

const char *fab_provider(const fab_ctx *f)
{
    return f->info->fabric_attr->prov_name;
}

uint64_t fab_mr_mode(const fab_ctx *f)
{
    return (uint64_t)f->info->domain_attr->mr_mode;
}

void fab_mr_mode_str(uint64_t mode, char *buf, size_t len)
{
    static const struct {
        uint64_t bit;
        const char *name;
    } bits[] = {
        {FI_MR_LOCAL, "FI_MR_LOCAL"},         {FI_MR_RAW, "FI_MR_RAW"},
        {FI_MR_VIRT_ADDR, "FI_MR_VIRT_ADDR"}, {FI_MR_ALLOCATED, "FI_MR_ALLOCATED"},
        {FI_MR_PROV_KEY, "FI_MR_PROV_KEY"},   {FI_MR_MMU_NOTIFY, "FI_MR_MMU_NOTIFY"},
        {FI_MR_RMA_EVENT, "FI_MR_RMA_EVENT"}, {FI_MR_ENDPOINT, "FI_MR_ENDPOINT"},
        {FI_MR_HMEM, "FI_MR_HMEM"},
    };
    size_t used = 0;
    if (len)
        buf[0] = 0;
    for (size_t i = 0; i < sizeof(bits) / sizeof(bits[0]); i++) {
        if (!(mode & bits[i].bit))
            continue;
        int n = snprintf(buf + used, len > used ? len - used : 0, "%s%s", used ? "|" : "", bits[i].name);
        if (n > 0)
            used += (size_t)n;
    }
    if (used == 0)
        snprintf(buf, len, "none");
}

int fab_getname(fab_ctx *f, void *addr, size_t *len)
{
    size_t cap = *len;
    int rc = fi_getname(&f->ep->fid, addr, len);
    if (rc == -FI_ETOOSMALL)
        return pf_err(-ENOSPC, "fi_getname: name needs %zu bytes, have %zu", *len, cap);
    if (rc)
        return fab_fail(rc, "fi_getname");
    return 0;
}

int fab_addr_host(const fab_ctx *f, const void *addr, size_t addr_len, char *out, size_t len)
{
    if (!strcmp(f->info->fabric_attr->prov_name, "shm")) {
        snprintf(out, len, "local");
        return 0;
    }
    uint32_t fmt = f->info->addr_format;
    sa_family_t fam = 0;
    if (fmt == FI_SOCKADDR && addr_len >= sizeof fam)
        memcpy(&fam, addr, sizeof fam);
    if (fmt == FI_SOCKADDR_IN || fam == AF_INET) {
        struct sockaddr_in sa;
        if (addr_len < sizeof sa)
            return -EINVAL;
        memcpy(&sa, addr, sizeof sa);
        return inet_ntop(AF_INET, &sa.sin_addr, out, (socklen_t)len) ? 0 : -EINVAL;
    }
    if (fmt == FI_SOCKADDR_IN6 || fam == AF_INET6) {
        struct sockaddr_in6 sa;
        if (addr_len < sizeof sa)
            return -EINVAL;
        memcpy(&sa, addr, sizeof sa);
        return inet_ntop(AF_INET6, &sa.sin6_addr, out, (socklen_t)len) ? 0 : -EINVAL;
    }
    return -ENOTSUP;
}

int fab_av_insert(fab_ctx *f, const void *addr, size_t len, fi_addr_t *out)
{
    if (len == 0 || len > FAB_MAX_ADDR)
        return pf_err(-EINVAL, "fabric address of %zu bytes is invalid", len);
    int n = fi_av_insert(f->av, addr, 1, out, 0, NULL);
    if (n != 1)
        return pf_err(-EINVAL, "fi_av_insert: provider %s rejected a %zu-byte address (%s)", fab_provider(f),
                      len, n < 0 ? fi_strerror(-n) : "0 inserted");
    return 0;
}

void *fab_buf_alloc(size_t bytes)
{
    const size_t huge = (size_t)2 << 20;
    size_t len = bytes ? (bytes + huge - 1) / huge * huge : huge;
    void *p = aligned_alloc(huge, len);
    if (p)
        madvise(p, len, MADV_HUGEPAGE); /* advice only: without THP the buffer works as it is */
    return p;
}

int fab_mr_reg(fab_ctx *f, void *buf, size_t len, uint64_t access, fab_mr *out)
{
    memset(out, 0, sizeof(*out));
    uint64_t mode = fab_mr_mode(f);
    pthread_mutex_lock(&f->lock);
    uint64_t key = f->next_key++;
    pthread_mutex_unlock(&f->lock);
    int rc = fi_mr_reg(f->domain, buf, len, access, 0, key, 0, &out->mr, NULL);
    if (rc)
        return pf_err_wrap(fab_fail(rc, "fi_mr_reg"), "registering %zu bytes", len);
    if (mode & FI_MR_ENDPOINT) {
        if ((rc = fi_mr_bind(out->mr, &f->ep->fid, 0)) || (rc = fi_mr_enable(out->mr))) {
            fi_close(&out->mr->fid);
            out->mr = NULL;
            return fab_fail(rc, "fi_mr_bind/fi_mr_enable");
        }
    }
    out->desc = fi_mr_desc(out->mr);
    out->key = fi_mr_key(out->mr);
    out->buf = buf;
    out->len = len;
    out->virt_addr = (mode & FI_MR_VIRT_ADDR) != 0;
    return 0;
}

void fab_mr_close(fab_mr *mr)
{
    if (mr && mr->mr)
        fi_close(&mr->mr->fid);
    if (mr)
        memset(mr, 0, sizeof(*mr));
}

void fab_mr_remote(const fab_mr *mr, size_t offset, uint64_t *raddr, uint64_t *rkey)
{
    *raddr = mr->virt_addr ? (uint64_t)(uintptr_t)mr->buf + offset : (uint64_t)offset;
    *rkey = mr->key;
}

/* Reads completions from the CQ into out (max n), translating errors; with timeout_ms >= 0 (a waitable CQ
 * only) sleeps up to that long in fi_cq_sread for the first one. Returns count (0: none, also when woken by
 * fab_wake or a signal) or negative. */
static int cq_take(fab_ctx *f, fab_comp *out, int n, int timeout_ms)
{
    struct fi_cq_data_entry e[64];
    if (n > 64)
        n = 64;
    ssize_t got = timeout_ms >= 0 ? fi_cq_sread(f->cq, e, (size_t)n, NULL, timeout_ms)
                                  : fi_cq_read(f->cq, e, (size_t)n);
    if (timeout_ms >= 0 && (got == -FI_ECANCELED || got == -FI_EINTR || got == -FI_ETIMEDOUT))
        return 0;
    if (got > 0) {
        for (ssize_t i = 0; i < got; i++) {
            out[i] = (fab_comp){.context = e[i].op_context,
                                .flags = e[i].flags,
                                .len = e[i].len,
                                .data = e[i].data,
                                .err = 0};
        }
        return (int)got;
    }
    if (got == -FI_EAGAIN)
        return 0;
    if (got == -FI_EAVAIL) {
        struct fi_cq_err_entry ee;
        memset(&ee, 0, sizeof(ee));
        ssize_t r = fi_cq_readerr(f->cq, &ee, 0);
        if (r < 0)
            return r == -FI_EAGAIN ? 0 : fab_fail((int)r, "fi_cq_readerr");
        out[0] = (fab_comp){.context = ee.op_context,
                            .flags = ee.flags,
                            .len = ee.len,
                            .data = ee.data,
                            .err = ee.err ? -abs((int)ee.err) : -EIO}; /* providers differ in sign */
        return 1;
    }
    return fab_fail((int)got, "fi_cq_read");
}

/* Called when a post meets -FI_EAGAIN: makes progress, parking completions in the backlog. */
static int make_progress(fab_ctx *f)
{
    pthread_mutex_lock(&f->lock);
    int room = FAB_BACKLOG - f->bl_count;
    int rc = 0;
    if (room > 0) {
        fab_comp tmp[64];
        rc = cq_take(f, tmp, room < 64 ? room : 64, -1);
        for (int i = 0; i < rc; i++)
            f->backlog[(f->bl_head + f->bl_count++) % FAB_BACKLOG] = tmp[i];
        if (rc > 0 && f->waitable)
            fi_cq_signal(f->cq); /* a thread asleep in fab_wait: its completions may be among these */
    } else {
        /* Backlog full: still drive the provider so the post can eventually go. */
        fi_cq_read(f->cq, NULL, 0);
    }
    pthread_mutex_unlock(&f->lock);
    return rc < 0 ? rc : 0;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* "peer 3 (fi_sockaddr_in://127.0.0.1:4242)" for dest, or "any peer" for FI_ADDR_UNSPEC. */
static void peer_str(fab_ctx *f, fi_addr_t dest, char *out, size_t len)
{
    if (dest == FI_ADDR_UNSPEC) {
        snprintf(out, len, "any peer");
        return;
    }
    uint8_t addr[FAB_MAX_ADDR];
    size_t alen = sizeof(addr);
    char str[160];
    size_t slen = sizeof(str);
    if (fi_av_lookup(f->av, dest, addr, &alen) == 0 && alen <= sizeof(addr) &&
        fi_av_straddr(f->av, addr, str, &slen))
        snprintf(out, len, "peer %llu (%s)", (unsigned long long)dest, str);
    else
        snprintf(out, len, "peer %llu", (unsigned long long)dest);
}

static int peer_dead(fab_ctx *f, fi_addr_t dest)
{
    if (dest == FI_ADDR_UNSPEC)
        return 0;
    pthread_mutex_lock(&f->lock);
    int d = dest < f->ndead && f->dead[dest];
    pthread_mutex_unlock(&f->lock);
    return d;
}

static void mark_dead(fab_ctx *f, fi_addr_t dest)
{
    if (dest == FI_ADDR_UNSPEC || dest > (1u << 24))
        return;
    pthread_mutex_lock(&f->lock);
    if (dest >= f->ndead) {
        size_t n = (size_t)dest + 64;
        uint8_t *d = realloc(f->dead, n);
        if (d) {
            memset(d + f->ndead, 0, n - f->ndead);
            f->dead = d;
            f->ndead = n;
        }
    }
    if (dest < f->ndead)
        f->dead[dest] = 1;
    pthread_mutex_unlock(&f->lock);
}

/* Retries a posting expression while it returns -FI_EAGAIN, driving progress in between, for at most the
 * context's post timeout (fab_set_timeout). A post that cannot go out for that long means the peer's
 * endpoint is gone or not progressing (libfabric 1.17's tcp;ofi_rxm keeps answering -FI_EAGAIN towards a
 * killed peer forever): the call fails with -ECOMM naming the peer and the call, and the peer is marked so
 * later posts to it fail at once instead of stalling the caller again. Posts towards a peer marked dead
 * fail immediately. */
static const int *g_interrupt; /* fab_set_interrupt's flag (read with __atomic loads) */

void fab_set_interrupt(const int *flag)
{
    __atomic_store_n(&g_interrupt, flag, __ATOMIC_RELEASE);
}

static int interrupted(void)
{
    const int *flag = __atomic_load_n(&g_interrupt, __ATOMIC_ACQUIRE);
    return flag && __atomic_load_n(flag, __ATOMIC_ACQUIRE);
}

int fab_interrupted(void)
{
    return interrupted();
}

#define FAB_RETRY(call, name, dest)                                                                          \
    do {                                                                                                     \
        if (peer_dead(f, (dest)))                                                                            \
            return post_failed(f, (name), (dest), 0, 1);                                                     \
        ssize_t rc_;                                                                                         \
        double t0_ = 0, now_ = 0;                                                                            \
        for (;;) {                                                                                           \
            rc_ = (call);                                                                                    \
            if (rc_ != -FI_EAGAIN)                                                                           \
                break;                                                                                       \
            int p_ = make_progress(f);                                                                       \
            if (p_ < 0)                                                                                      \
                return p_;                                                                                   \
            now_ = mono_s();                                                                                 \
            if (t0_ == 0)                                                                                    \
                t0_ = now_;                                                                                  \
            if (interrupted())                                                                               \
                return pf_err(-ECANCELED, "%s: given up: the run broke", name);                              \
            if (peer_dead(f, (dest)))                                                                        \
                return post_failed(f, (name), (dest), now_ - t0_, 2);                                        \
            if (now_ - t0_ > fab_timeout(f)) {                                                               \
                mark_dead(f, (dest));                                                                        \
                return post_failed(f, (name), (dest), now_ - t0_, 0);                                        \
            }                                                                                                \
            if (now_ - t0_ > FAB_SPIN_S) {                                                                   \
                struct timespec nap_ = {0, FAB_NAP_NS};                                                      \
                nanosleep(&nap_, NULL);                                                                      \
            }                                                                                                \
        }                                                                                                    \
        if (rc_)                                                                                             \
            return fab_fail((int)rc_, name);                                                                 \
        return 0;                                                                                            \
    } while (0)

void fab_mark_peer_dead(fab_ctx *f, fi_addr_t dest)
{
    mark_dead(f, dest);
}

void fab_mark_peer_alive(fab_ctx *f, fi_addr_t dest)
{
    pthread_mutex_lock(&f->lock);
    if (dest != FI_ADDR_UNSPEC && dest < f->ndead)
        f->dead[dest] = 0;
    pthread_mutex_unlock(&f->lock);
}

/* The error of a post to dest that failed: before = 0, its retries ran out after `waited` seconds; 1, an
 * earlier post to it had; 2, fab_mark_peer_dead declared it gone while this post was retrying. */
static int post_failed(fab_ctx *f, const char *call, fi_addr_t dest, double waited, int before)
{
    char peer[256];
    peer_str(f, dest, peer, sizeof(peer));
    if (before == 2)
        return pf_err(-ECOMM, "%s to %s: the peer was declared gone while the post waited (%.1f s)", call,
                      peer, waited);
    if (before)
        return pf_err(
            -ECOMM,
            "%s to %s: the peer is marked gone (an earlier post to it could not go out for %.1f s, or "
            "its loss was announced); the peer's endpoint is closed or not progressing",
            call, peer, fab_timeout(f));
    return pf_err(-ECOMM,
                  "%s to %s: still -FI_EAGAIN after %.1f s of retries (provider %s); the peer's "
                  "endpoint is closed or not progressing",
                  call, peer, waited, fab_provider(f));
}

int fab_send(fab_ctx *f, fi_addr_t dest, const void *buf, size_t len, const fab_mr *mr, void *ctx)
{
    FAB_RETRY(fi_send(f->ep, buf, len, mr ? mr->desc : NULL, dest, ctx), "fi_send", dest);
}

int fab_recv(fab_ctx *f, void *buf, size_t len, const fab_mr *mr, void *ctx)
{
    FAB_RETRY(fi_recv(f->ep, buf, len, mr ? mr->desc : NULL, FI_ADDR_UNSPEC, ctx), "fi_recv", FI_ADDR_UNSPEC);
}

int fab_write(fab_ctx *f, fi_addr_t dest, const void *buf, size_t len, const fab_mr *mr, uint64_t raddr,
              uint64_t rkey, void *ctx)
{
    /* FI_DELIVERY_COMPLETE: the completion means the data is in the target's memory, not merely sent
     * (tcp;ofi_rxm reports plain writes as soon as they left), so a collective can signal the peer next. */
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    void *desc = mr ? mr->desc : NULL;
    struct fi_rma_iov riov = {.addr = raddr, .len = len, .key = rkey};
    struct fi_msg_rma msg = {.msg_iov = &iov,
                             .desc = &desc,
                             .iov_count = 1,
                             .addr = dest,
                             .rma_iov = &riov,
                             .rma_iov_count = 1,
                             .context = ctx};
    FAB_RETRY(fi_writemsg(f->ep, &msg, FI_DELIVERY_COMPLETE | FI_COMPLETION), "fi_writemsg", dest);
}

int fab_read(fab_ctx *f, fi_addr_t dest, void *buf, size_t len, const fab_mr *mr, uint64_t raddr,
             uint64_t rkey, void *ctx)
{
    FAB_RETRY(fi_read(f->ep, buf, len, mr ? mr->desc : NULL, dest, raddr, rkey, ctx), "fi_read", dest);
}

int fab_poll(fab_ctx *f, fab_comp *out, int max)
{
    if (max <= 0)
        return 0;
    int n = 0;
    pthread_mutex_lock(&f->lock);
    while (n < max && f->bl_count > 0) {
        out[n++] = f->backlog[f->bl_head];
        f->bl_head = (f->bl_head + 1) % FAB_BACKLOG;
        f->bl_count--;
    }
    pthread_mutex_unlock(&f->lock);
    if (n < max) {
        int rc = cq_take(f, out + n, max - n, -1);
        if (rc < 0)
            return n > 0 ? n : rc;
        n += rc;
    }
    return n;
}

int fab_can_wait(const fab_ctx *f)
{
    return f->waitable;
}

int fab_wait(fab_ctx *f, fab_comp *out, int max, int timeout_ms)
{
    int n = fab_poll(f, out, max);
    if (n != 0 || !f->waitable || timeout_ms < 0)
        return n;
    return cq_take(f, out, max, timeout_ms);
}

void fab_wake(fab_ctx *f)
{
    if (f && f->waitable)
        fi_cq_signal(f->cq);
}
