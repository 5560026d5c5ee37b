/* scale_worker: a pfcps worker whose step is the head path only, for the scale benchmark
 * (bench/scale/run.sh).
 *
 *   scale_worker --config FILE --rank W [--set key=value ...] [--steps N] [--warmup N] [--steady N]
 *                [--server-pids PID,PID,...] [--trace FILE] [--wait-fill LOG,LOG,...]
 *
 * It joins a run of real pfcps-server daemons as pfcps-worker does, through the same functions (the data
 * plane's interface from daemon_bind_data_plane; worker/train_net.h: the two fabric endpoints packed in its
 * address-book entry, the connections to the servers and the collectives ring among the workers; between
 * them cli_join_run and the run config from server 0) and then runs, N times, the part of worker/train.c's
 * train_step that touches the class-center table, with synthetic embeddings in place of a backbone:
 *
 *   pfc_sample -> ps_pull -> ps_wait -> pfc_step (CPU head: forward + backward) -> ps_push -> ps_wait
 *
 * Labels are uniform in [0, num_classes) (as `rec = synthetic`), embeddings uniform in [-1, 1) per element,
 * both from SplitMix64 keyed by (seed, step, rank) and made before the step's clock starts. Nothing is
 * allocated per step here beyond what pfc_sample / ps_client do themselves.
 *
 * Printed at the end (one `RESULT key=value ...` line for run.sh, then the same in words):
 *   - warm-up: median ms/step of the first `--warmup` steps (default 10), where rows are first touched; the
 *     fraction of pulled rows that this worker had never pulled before, averaged over those steps;
 *   - steady: median ms/step of the last `--steady` steps (default 10), the same fraction, and the medians of
 *     the phases (sample, pull, head, push: each from its post to its completion);
 *   - bytes moved per step on the wire (last step): pull = ids out + rows back, push = ids + gradients, plus
 * a 64-byte header per message (ps_wire.h: at most ps_wire_rows_per_msg rows per message per server);
 *   - peak RSS (VmHWM) of this process and of each --server-pids process, server bytes per identity =
 *     sum of the servers' VmHWM / num_classes, and per row created = growth of the servers' VmRSS from before
 *     step 0 to after the last step / rows first pulled (W = 1: every row the servers created); minor page
 *     faults per steady step (this process, servers) and the servers' CPU seconds per steady step;
 *   - first and last loss (both must be finite: exit 1 otherwise).
 * --trace FILE: one line per step: step, ms, sample/pull/head/push ms, k, new-row fraction, loss.
 * Metrics: as pfcps-worker, the config key metrics_address starts a Prometheus endpoint (logged `metrics on
 *   HOST:PORT`, reported at join) serving the client's series (ps_client_metrics_on) and, per step,
 *   pfcps_worker_step, pfcps_worker_step_seconds and pfcps_worker_phase_seconds{phase = sample, pull, head,
 *   push} (this step's phases, each from its post to its completion); the series are updated whether or not
 *   the endpoint is on (run.sh --scrape measures what serving and scraping it costs).
 * --wait-fill LOG,...: before step 0, waits (up to 30 min) until every named server log says that every class
 *   center was generated (center_init = eager), so the steps measure a table that is all there; the wait is
 *   reported as fill_s (from this worker's join). */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/cli.h"
#include "common/clock.h"
#include "common/coll.h"
#include "common/config.h"
#include "common/ctl.h"
#include "common/daemon.h"
#include "common/err.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/splitmix64.h"
#include "proto/ps_wire.h"
#include "worker/head/pfc.h"
#include "worker/ps_client.h"
#include "worker/train_net.h"

#define MAX_SERVERS 64

static const char usage[] =
    "usage: scale_worker --config FILE --rank W [--set key=value ...] [--steps N] [--warmup N] [--steady N]\n"
    "                    [--server-pids PID,PID,...] [--trace FILE] [--wait-fill LOG,LOG,...]\n"
    "  the head path of a worker's step (sample, pull, head, push, wait) against running pfcps-server\n"
    "  daemons, synthetic embeddings; prints warm-up and steady-state ms/step, RSS, bytes per step\n";

typedef struct opts {
    long rank, steps, warmup, steady;
    int npids;
    long pids[MAX_SERVERS];
    const char *trace;
    const char *wait_fill; /* comma-separated server logs, or NULL */
} opts;

/* One step's measurements. */
typedef struct step_rec {
    double total, sample, pull, head, push; /* seconds */
    int64_t k;
    double new_frac; /* pulled rows never pulled before by this worker */
    double loss;
    long minflt; /* this process' minor faults during the step */
    double cpu;  /* this process' CPU seconds (user + system) during the step */
} step_rec;

static int parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int parse_opts(int argc, char **argv, opts *o)
{
    *o = (opts){.rank = -1, .steps = 40, .warmup = 10, .steady = 10};
    for (int i = 1; i < argc; i += 2) { /* every option takes a value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = v != NULL;
        if (!strcmp(a, "--rank"))
            ok = ok && parse_long(v, 0, 1000000, &o->rank) == 0;
        else if (!strcmp(a, "--steps"))
            ok = ok && parse_long(v, 1, 1000000, &o->steps) == 0;
        else if (!strcmp(a, "--warmup"))
            ok = ok && parse_long(v, 1, 1000000, &o->warmup) == 0;
        else if (!strcmp(a, "--steady"))
            ok = ok && parse_long(v, 1, 1000000, &o->steady) == 0;
        else if (!strcmp(a, "--trace"))
            o->trace = v;
        else if (!strcmp(a, "--wait-fill"))
            o->wait_fill = v;
        else if (!strcmp(a, "--server-pids") && v) {
            char buf[1024];
            snprintf(buf, sizeof buf, "%s", v);
            char *save = NULL;
            for (char *t = strtok_r(buf, ",", &save); t && ok; t = strtok_r(NULL, ",", &save))
                ok = o->npids < MAX_SERVERS && parse_long(t, 1, 1L << 30, &o->pids[o->npids++]) == 0;
        } else
            ok = 0;
        if (!ok) {
            fprintf(stderr, "scale_worker: bad or unknown argument '%s'%s%s\n%s", a, v ? " " : "", v ? v : "",
                    usage);
            return -1;
        }
    }
    if (o->rank < 0 || o->warmup + o->steady > o->steps) {
        fprintf(stderr, "scale_worker: needs --rank, and --warmup + --steady <= --steps\n%s", usage);
        return -1;
    }
    return 0;
}

/* A "Vm...:" line of /proc/<pid>/status (pid 0: this process) in bytes: "VmHWM" (peak resident set) or
 * "VmRSS" (resident now); -1 if unreadable. */
static long long status_bytes(long pid, const char *key)
{
    char path[64], line[256];
    if (pid)
        snprintf(path, sizeof path, "/proc/%ld/status", pid);
    else
        snprintf(path, sizeof path, "/proc/self/status");
    FILE *f = fopen(path, "r");
    long long kb = -1;
    size_t kl = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ':' && sscanf(line + kl + 1, "%lld", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

/* Minor faults and CPU seconds (user + system) of process pid from /proc/pid/stat; -1 if unreadable. */
static int proc_stat(long pid, long long *minflt, double *cpu_s)
{
    char path[64], buf[2048];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = 0;
    /* Fields after the command name (which may hold spaces) start after the last ')'. */
    char *p = strrchr(buf, ')');
    unsigned long long mf, ut, st;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %llu %*u %*u %*u %llu %llu", &mf, &ut, &st) != 3)
        return -1;
    *minflt = (long long)mf;
    *cpu_s = (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
    return 0;
}

/* This process' minor faults so far; *cpu_s = its CPU seconds (user + system) so far. */
static long self_usage(double *cpu_s)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    *cpu_s = (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
             1e-6 * (double)ru.ru_stime.tv_usec;
    return ru.ru_minflt;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of field `off` (a double inside step_rec) over recs[i0 .. i0+n). */
static double median_of(const step_rec *recs, long i0, long n, size_t off)
{
    double v[4096];
    if (n > 4096)
        n = 4096;
    for (long i = 0; i < n; i++)
        v[i] = *(const double *)((const char *)&recs[i0 + i] + off);
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double mean_new(const step_rec *recs, long i0, long n)
{
    double s = 0;
    for (long i = 0; i < n; i++)
        s += recs[i0 + i].new_frac;
    return s / (double)n;
}

/* The next output of the SplitMix64 generator with state *s. */
static uint64_t next_u64(uint64_t *s)
{
    uint64_t v = splitmix64(*s);
    *s += 0x9E3779B97F4A7C15ull;
    return v;
}

/* Uniform double in [0, 1) from a SplitMix64 state. */
static double unif(uint64_t *s)
{
    return (double)(next_u64(s) >> 11) * 0x1p-53;
}

/* The step's synthetic batch: labels uniform in [0, C), embeddings uniform in [-1, 1). */
static void make_batch(uint64_t seed, int64_t step, int rank, int64_t C, int B, int D, int64_t *labels,
                       float *emb)
{
    uint64_t s = splitmix64(seed ^ splitmix64((uint64_t)step * 1000003u + (uint64_t)rank));
    for (int i = 0; i < B; i++)
        labels[i] = (int64_t)(next_u64(&s) % (uint64_t)C);
    for (int i = 0; i < B * D; i++)
        emb[i] = (float)(2 * unif(&s) - 1);
}

/* Wire bytes of one pull + one push of ids[0..k) over S servers (ps_wire.h): ids out and rows back for the
 * pull, ids + gradients for the push; each message (request and reply) carries a 64-byte header. */
static double wire_bytes(const int64_t *ids, int64_t k, int S, int D, ps_dtype dt)
{
    int64_t per[MAX_SERVERS] = {0};
    for (int64_t i = 0; i < k; i++)
        per[ids[i] % S]++;
    uint32_t rpm = ps_wire_rows_per_msg((uint32_t)D, (uint32_t)dt);
    double row = (double)D * (double)ps_dtype_size(dt), bytes = 0;
    for (int s = 0; s < S; s++) {
        int64_t msgs = (per[s] + rpm - 1) / rpm;
        if (msgs == 0)
            msgs = 1; /* a push to every server, even an empty one */
        /* pull: request (ids) + reply (rows); push: request (ids + grads) + reply (empty) */
        bytes += (double)per[s] * (8 + row) * 2 + 64.0 * 4 * (double)msgs;
    }
    return bytes;
}

/* What the benchmark reads of one server process: at the start of the steady window and at the end (minor
 * faults, CPU seconds), resident set before step 0 and after the last step. */
typedef struct srv_probe {
    long long flt0, flt1;
    double cpu0, cpu1;
    long long rss_start, rss_end;
} srv_probe;

typedef struct bench {
    opts o;
    srv_probe srv[MAX_SERVERS];
    int64_t touched; /* distinct rows pulled so far (this worker's; W = 1: every row the servers created) */
    pf_config cfg, run;
    char host[256];
    int port;
    const char *secret;
    train_net net; /* the parameter-server client and the workers' ring */
    ctl_session *sess;
    pfc x;
    ps_dtype dt;
    double fill_s; /* --wait-fill: seconds from the join until every server's table was generated */
} bench;

/* Endpoints, join, servers, ring, head: what pfcps-worker does (worker/main.c's join_run, worker/train.h's
 * train_open_endpoints + train_setup) for the parts this benchmark uses, through the same functions: the
 * data plane's interface (daemon_bind_data_plane), the two endpoints and their connections
 * (worker/train_net.h). Returns 0 or a negative code (pf_errmsg). */
static int setup(bench *b)
{
    const pf_config *cfg = &b->cfg;
    const int rank = (int)b->o.rank;
    int rc = ps_dtype_parse(cfg->wire_dtype, &b->dt);
    if (rc == 0)
        rc = daemon_bind_data_plane(cfg, b->host, b->port);
    if (rc == 0)
        rc = train_net_set_join_keys(cfg);
    if (rc == 0)
        rc = train_net_open(&b->net, cfg, rank);
    uint8_t packed[CTL_MAX_ADDR];
    size_t plen = sizeof packed;
    if (rc == 0)
        rc = train_net_address(&b->net, NULL, 0, packed, &plen);
    if (rc == 0)
        rc = cli_join_run(cfg, b->host, b->port, CTL_ROLE_WORKER, rank, packed, plen, b->secret, &b->sess,
                          &b->run);
    if (rc < 0)
        return rc;
    const pf_config *run = &b->run;
    if ((rc = train_net_check_run(cfg, run)) < 0)
        return rc;
    if (run->servers > MAX_SERVERS)
        return pf_err(-EINVAL, "at most %d servers", MAX_SERVERS);
    if ((rc = train_net_connect(&b->net, run, ctl_session_book(b->sess), rank, b->secret)) < 0)
        return rc;
    head_params hp;
    if ((rc = head_params_from_config(run, &hp)) < 0)
        return rc;
    hp.clamp_loss = 1;
    return pfc_init(&b->x, &hp, &b->net.coll, run->num_classes, run->sample_rate, (uint64_t)run->seed,
                    run->batch_size, run->embedding_size);
}

/* 1 when file `path` contains `needle`. */
static int file_has(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[4096];
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

/* Waits until each comma-separated log in `logs` says the server's class centers are all generated. */
static int wait_fill(const char *logs, double *secs)
{
    const char *needle = "every class center generated";
    double t0 = pf_now_s();
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", logs);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        while (!file_has(t, needle)) {
            if (pf_now_s() - t0 > 1800)
                return pf_err(-ETIMEDOUT, "%s never said '%s' (center_init = lazy?)", t, needle);
            usleep(100000);
        }
    }
    *secs = pf_now_s() - t0;
    log_info("servers' class centers all generated %.2f s after joining", *secs);
    return 0;
}

/* The per-step series pfcps-worker exports that this step has (the top of the file). */
typedef struct step_metrics {
    pf_metric *step, *step_s, *phase[4]; /* sample, pull, head, push */
} step_metrics;

static void step_metrics_register(step_metrics *m)
{
    m->step = metrics_gauge("pfcps_worker_step", "Global steps completed.", NULL, 0);
    m->step_s = metrics_histogram("pfcps_worker_step_seconds", "Whole step time.", NULL, 0,
                                  metrics_latency_bounds, metrics_latency_nbounds);
    static const char *const names[4] = {"sample", "pull", "head", "push"};
    for (int i = 0; i < 4; i++) {
        const char *labels[] = {"phase", names[i]};
        m->phase[i] = metrics_histogram("pfcps_worker_phase_seconds", "Time of each phase of a step.", labels,
                                        1, metrics_latency_bounds, metrics_latency_nbounds);
    }
}

/* Runs the steps into recs. Returns 0 or a negative code. */
static int run_steps(bench *b, step_rec *recs, double *bytes)
{
    const pf_config *run = &b->run;
    const int B = run->batch_size, D = run->embedding_size;
    const int64_t C = run->num_classes;
    const size_t kd = (size_t)b->x.k_max * (size_t)D;
    float *centers = malloc(kd * sizeof(float)), *gcen = malloc(kd * sizeof(float));
    float *emb = malloc((size_t)B * D * sizeof(float)), *gemb = malloc((size_t)B * D * sizeof(float));
    int64_t *labels = malloc((size_t)B * sizeof(int64_t));
    uint8_t *seen = calloc((size_t)(C + 7) / 8, 1); /* rows this worker pulled before */
    FILE *trace = b->o.trace ? fopen(b->o.trace, "w") : NULL;
    int rc = centers && gcen && emb && gemb && labels && seen ? 0 : pf_err(-ENOMEM, "out of memory");
    if (rc == 0 && b->o.trace && !trace)
        rc = pf_err(-errno, "cannot write %s", b->o.trace);
    /* Touch the buffers once, so their first-touch faults are not in step 0. */
    if (rc == 0) {
        memset(centers, 0, kd * sizeof(float));
        memset(gcen, 0, kd * sizeof(float));
    }
    const double wait_s = b->net.wait_s;
    step_metrics sm;
    step_metrics_register(&sm);
    const long steady0 = b->o.steps - b->o.steady;
    for (long step = 0; rc == 0 && step < b->o.steps; step++) {
        for (int s = 0; s < b->o.npids && step == 0; s++)
            b->srv[s].rss_start = status_bytes(b->o.pids[s], "VmRSS");
        for (int s = 0; s < b->o.npids && step == steady0; s++)
            proc_stat(b->o.pids[s], &b->srv[s].flt0, &b->srv[s].cpu0);
        make_batch((uint64_t)run->seed, step, (int)b->o.rank, C, B, D, labels, emb);
        step_rec *r = &recs[step];
        const int64_t *ids = NULL;
        int64_t k = 0;
        ps_req *req = NULL;
        double c0, c1;
        long f0 = self_usage(&c0);
        double t0 = pf_now_s();
        rc = pfc_sample(&b->x, step, labels, &ids, &k);
        double t1 = pf_now_s();
        if (rc == 0)
            rc = ps_pull(b->net.ps, ids, (size_t)k, centers, step, &req);
        if (rc == 0)
            rc = ps_wait(b->net.ps, req, wait_s);
        double t2 = pf_now_s();
        if (rc == 0)
            rc = pfc_step(&b->x, emb, centers, &r->loss, gemb, gcen);
        double t3 = pf_now_s();
        if (rc == 0)
            rc = ps_push(b->net.ps, ids, (size_t)k, gcen, (float)run->lr, step, &req);
        if (rc == 0)
            rc = ps_wait(b->net.ps, req, wait_s);
        double t4 = pf_now_s();
        r->minflt = self_usage(&c1) - f0;
        r->cpu = c1 - c0;
        if (rc < 0)
            break;
        *r = (step_rec){.total = t4 - t0,
                        .sample = t1 - t0,
                        .pull = t2 - t1,
                        .head = t3 - t2,
                        .push = t4 - t3,
                        .k = k,
                        .loss = r->loss,
                        .minflt = r->minflt,
                        .cpu = r->cpu};
        int64_t fresh = 0;
        for (int64_t i = 0; i < k; i++) {
            uint64_t c = (uint64_t)ids[i];
            if (!(seen[c >> 3] & (1u << (c & 7)))) {
                fresh++;
                seen[c >> 3] |= (uint8_t)(1u << (c & 7));
            }
        }
        r->new_frac = k ? (double)fresh / (double)k : 0;
        metrics_set(sm.step, (double)(step + 1));
        metrics_observe(sm.step_s, r->total);
        metrics_observe(sm.phase[0], r->sample);
        metrics_observe(sm.phase[1], r->pull);
        metrics_observe(sm.phase[2], r->head);
        metrics_observe(sm.phase[3], r->push);
        b->touched += fresh;
        if (step == b->o.steps - 1)
            *bytes = wire_bytes(ids, k, run->servers, D, b->dt);
        if (trace) {
            fprintf(trace, "%ld %.3f %.3f %.3f %.3f %.3f %lld %.4f %.6f\n", step, 1e3 * r->total,
                    1e3 * r->sample, 1e3 * r->pull, 1e3 * r->head, 1e3 * r->push, (long long)k, r->new_frac,
                    r->loss);
            fflush(trace); /* so a long run can be followed */
        }
        if (!isfinite(r->loss))
            rc = pf_err(-EDOM, "loss is %f at step %ld", r->loss, step);
    }
    for (int s = 0; rc == 0 && s < b->o.npids; s++) {
        proc_stat(b->o.pids[s], &b->srv[s].flt1, &b->srv[s].cpu1);
        b->srv[s].rss_end = status_bytes(b->o.pids[s], "VmRSS");
    }
    if (trace)
        fclose(trace);
    free(centers);
    free(gcen);
    free(emb);
    free(gemb);
    free(labels);
    free(seen);
    return rc;
}

/* Prints the RESULT line and its summary in words (see the top of the file). */
static void report(const bench *b, const step_rec *recs, double bytes)
{
    const pf_config *run = &b->run;
    const long n = b->o.steps, nw = b->o.warmup, ns = b->o.steady, s0 = n - ns;
    double warm = median_of(recs, 0, nw, offsetof(step_rec, total));
    double steady = median_of(recs, s0, ns, offsetof(step_rec, total));
    double ph[4] = {median_of(recs, s0, ns, offsetof(step_rec, sample)),
                    median_of(recs, s0, ns, offsetof(step_rec, pull)),
                    median_of(recs, s0, ns, offsetof(step_rec, head)),
                    median_of(recs, s0, ns, offsetof(step_rec, push))};
    long long wrss = status_bytes(0, "VmHWM"), hwm = 0, start = 0, end = 0, flt = 0;
    double cpu = 0;
    for (int s = 0; s < b->o.npids; s++) {
        const srv_probe *p = &b->srv[s];
        long long h = status_bytes(b->o.pids[s], "VmHWM");
        hwm += h > 0 ? h : 0;
        start += p->rss_start > 0 ? p->rss_start : 0;
        end += p->rss_end > 0 ? p->rss_end : 0;
        flt += p->flt1 - p->flt0;
        cpu += p->cpu1 - p->cpu0;
    }
    long wflt = 0;
    double wcpu = 0;
    for (long i = s0; i < n; i++)
        wflt += recs[i].minflt, wcpu += recs[i].cpu;
    const int64_t k = recs[n - 1].k, C = run->num_classes;
    const double per_id = b->o.npids ? (double)hwm / (double)C : 0;
    /* The table's cost per row: what the servers' resident set grew by from before step 0 to after the last
     * step, per row created (rows are created on first touch, so untouched rows cost nothing yet). */
    const double per_row = b->touched ? (double)(end - start) / (double)b->touched : 0;
    printf("RESULT C=%lld D=%d B=%d W=%d S=%d r=%.6g k=%lld steps=%ld warmup_ms=%.1f warmup_new=%.3f "
           "steady_ms=%.1f steady_new=%.3f sample_ms=%.1f pull_ms=%.1f head_ms=%.1f push_ms=%.1f "
           "bytes_per_step=%.0f worker_rss=%lld servers_rss=%lld server_bytes_per_id=%.1f "
           "servers_rss_start=%lld servers_rss_end=%lld rows_touched=%lld server_bytes_per_row=%.1f "
           "worker_minflt_per_step=%.0f server_minflt_per_step=%.0f worker_cpu_s_per_step=%.3f "
           "server_cpu_s_per_step=%.3f fill_s=%.2f "
           "first_loss=%.4f last_loss=%.4f\n",
           (long long)C, run->embedding_size, run->batch_size, run->workers, run->servers, run->sample_rate,
           (long long)k, n, 1e3 * warm, mean_new(recs, 0, nw), 1e3 * steady, mean_new(recs, s0, ns),
           1e3 * ph[0], 1e3 * ph[1], 1e3 * ph[2], 1e3 * ph[3], bytes, wrss, hwm, per_id, start, end,
           (long long)b->touched, per_row, (double)wflt / (double)ns,
           b->o.npids ? (double)flt / (double)ns : 0.0, wcpu / (double)ns,
           b->o.npids ? cpu / (double)ns : 0.0, b->fill_s, recs[0].loss, recs[n - 1].loss);
    printf(
        "C = %lld, k = %lld rows per step: warm-up (first %ld steps, %.0f%% new rows) %.1f ms/step, steady "
        "(last %ld, %.0f%% new rows) %.1f ms/step = sample %.1f + pull %.1f + head %.1f + push %.1f; %.1f MB "
        "on the wire per step; peak RSS worker %.2f GiB, servers %.2f GiB (%.0f bytes per identity; %lld "
        "rows created, %.0f bytes each)\n",
        (long long)C, (long long)k, nw, 100 * mean_new(recs, 0, nw), 1e3 * warm, ns,
        100 * mean_new(recs, s0, ns), 1e3 * steady, 1e3 * ph[0], 1e3 * ph[1], 1e3 * ph[2], 1e3 * ph[3],
        bytes / 1e6, (double)wrss / (1 << 30), (double)hwm / (1 << 30), per_id, (long long)b->touched,
        per_row);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    static bench b;
    daemon_tune_malloc(); /* as pfcps-worker */
    log_init("scale", -1);
    int rest = 0;
    int rc = cli_parse_common(argc, argv, &b.cfg, usage, CLI_CONFIG_OPTIONAL, &rest);
    if (rc == CLI_HELP)
        return 0;
    if (rc < 0) {
        fprintf(stderr, "scale_worker: %s\n", pf_errmsg());
        return 2;
    }
    if (parse_opts(rest, argv, &b.o) < 0)
        return 2;
    log_init("scale", (int)b.o.rank);
    if (cli_member_check(&b.cfg, b.o.rank, b.cfg.workers, "workers", b.host, sizeof b.host, &b.port,
                         &b.secret) < 0) {
        fprintf(stderr, "scale_worker: %s\n%s", pf_errmsg(), usage);
        return 2;
    }
    if (daemon_metrics_start(&b.cfg, "worker", (int)b.o.rank) < 0) {
        fprintf(stderr, "scale_worker: %s\n", pf_errmsg());
        return 2;
    }
    step_rec *recs = calloc((size_t)b.o.steps, sizeof *recs);
    double bytes = 0;
    rc = recs ? setup(&b) : pf_err(-ENOMEM, "out of memory");
    if (rc == 0)
        log_info("joined: C = %lld, D = %d, B = %d, sample_rate %g: up to %lld rows per step",
                 (long long)b.run.num_classes, b.run.embedding_size, b.run.batch_size, b.run.sample_rate,
                 (long long)b.x.k_max);
    if (rc == 0 && b.o.wait_fill)
        rc = wait_fill(b.o.wait_fill, &b.fill_s);
    if (rc == 0)
        rc = run_steps(&b, recs, &bytes);
    if (rc < 0) {
        log_error("%s", pf_errmsg());
        return 1;
    }
    report(&b, recs, bytes);
    /* The ring ends with a barrier (a peer may still send), then leave in order. As pfcps-worker, the process
     * exit releases the endpoints (libfabric 1.17's tcp;ofi_rxm can crash in fi_close while peers go away).
     */
    coll_barrier(&b.net.coll);
    ctl_session_leave(b.sess);
    ctl_session_close(b.sess);
    daemon_exit_now(0); /* the endpoints are left open: see common/daemon.h */
}
