/* `pfcps plan`: servers, bytes per step and the expected step time of a run (usage in tools/commands.h; the
 * model in tools/plan.h). */
#include "tools/commands.h"
#include "tools/plan.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "tools/opts.h"
#include "proto/ps_wire.h"

/* Defaults of the per-host figures when not measured: stated as assumptions in the output. */
#define DEFAULT_SERVER_MEM_GIB 256.0
#define DEFAULT_MEM_GBS        100.0
#define DEFAULT_GEMM_GFLOPS    15000.0

static const char plan_usage[] =
    "usage: pfcps plan --identities C --workers W --link-gbps G [--dim D] [--sample-rate R | --sampled K]\n"
    "                  [--batch B] [--wire fp32|fp16|bf16] [--head-mode global|local] [--servers S]\n"
    "                  [--server-mem GIB] [--mem-bw GB/S] [--gemm-gflops GFLOP/S] [--backbone-ms MS]\n"
    "                  [--replicas 0|1] [--optimizer sgd|adamw]\n"
    "  C: identities (a number, or with k, M, G: 100M); D: embedding_size (512); R: sample_rate (1.0) or K "
    "rows\n"
    "  per worker per step; B: batch per worker (128); G: each host's link in Gbit/s (HDR InfiniBand: 200).\n"
    "  Per-host figures (measure them: bench/ps, bench/head; defaults are assumptions and are marked so):\n"
    "  server memory a server may use (256 GiB), its memory bandwidth (100 GB/s), the head's GEMM rate on a\n"
    "  worker (15000 GFLOP/s), the backbone's forward + backward per step that hides the transfers (0 ms).\n"
    "  Prints the servers needed for memory and for bandwidth, bytes per step per link, and the step time\n"
    "  bounded by link, server memory and head compute (docs/architecture.md, Performance model; the model\n"
    "  in tools/plan.h). --replicas 1: every shard also has a hot-standby copy on another server\n"
    "  (config key replicas): twice the table memory and push traffic, and each copy\n"
    "  keeps an undo log of a step's pushes for replacing a lost worker in place (2 D floats + 16 bytes per\n"
    "  pushed row; the workers' two kept step states are not counted here: each worker logs them at start).\n"
    "  --optimizer adamw (config key optimizer): the servers also keep AdamW's second moment, 12 D + 9\n"
    "  bytes per identity.";

/* Parses a count with an optional decimal suffix (k, M, G) or an exponent (1e8) into [lo, hi]. */
static int parse_count(const char *s, double lo, double hi, int64_t *out)
{
    if (!s || !*s)
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno)
        return -1;
    if (*end == 'k' || *end == 'K')
        v *= 1e3, end++;
    else if (*end == 'M')
        v *= 1e6, end++;
    else if (*end == 'G')
        v *= 1e9, end++;
    if (*end || !(v >= lo && v <= hi) || v != floor(v))
        return -1;
    *out = (int64_t)v;
    return 0;
}

static int parse_num(const char *s, double lo, double hi, int lo_open, double *out)
{
    if (!s || !*s)
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || errno || !isfinite(v) || v > hi || v < lo || (lo_open && v == lo))
        return -1;
    *out = v;
    return 0;
}

/* "12.3 MB" style (decimal units) for traffic, into buf. */
static const char *fmt_bytes(double b, char *buf, size_t cap)
{
    const char *u[] = {"B", "kB", "MB", "GB", "TB", "PB"};
    int i = 0;
    while (b >= 1000 && i < 5)
        b /= 1000, i++;
    snprintf(buf, cap, "%.*f %s", i ? 2 : 0, b, u[i]);
    return buf;
}

static double gib(double b)
{
    return b / 1073741824.0;
}

typedef struct plan_args {
    plan_in in;
    int have_c, have_w, have_link, have_rate;
    int mem_given, bw_given, gemm_given;
    const char *wire;
} plan_args;

/* The options, in the order of parse_args' table. */
enum {
    IDENTITIES,
    DIM,
    SAMPLE_RATE,
    SAMPLED,
    WORKERS,
    BATCH,
    SERVERS,
    WIRE,
    HEAD_MODE,
    LINK_GBPS,
    SERVER_MEM,
    MEM_BW,
    GEMM_GFLOPS,
    BACKBONE_MS,
    REPLICAS,
    OPTIMIZER
};

/* Returns 0, or 2 after printing the usage error. */
static int parse_args(int argc, char **argv, plan_args *a)
{
    plan_in *in = &a->in;
    *in = (plan_in){.dim = 512,
                    .sample_rate = 1.0,
                    .batch = 128,
                    .wire_bytes = 4,
                    .mem_gbs = DEFAULT_MEM_GBS,
                    .gemm_gflops = DEFAULT_GEMM_GFLOPS,
                    .server_mem_gib = DEFAULT_SERVER_MEM_GIB};
    a->wire = "fp32";
    static const tool_opt opts[] = {
        {"--identities", 1},  {"--dim", 1},         {"--sample-rate", 1}, {"--sampled", 1},
        {"--workers", 1},     {"--batch", 1},       {"--servers", 1},     {"--wire", 1},
        {"--head-mode", 1},   {"--link-gbps", 1},   {"--server-mem", 1},  {"--mem-bw", 1},
        {"--gemm-gflops", 1}, {"--backbone-ms", 1}, {"--replicas", 1},    {"--optimizer", 1},
        {NULL, 0}};
    tool_args ta;
    tool_args_init(&ta, "plan", opts, argc, argv);
    for (int k; (k = tool_args_next(&ta)) != TOOL_END;) {
        const char *v = ta.arg, *want = NULL;
        int64_t n = 0;
        double x = 0;
        if (k == IDENTITIES) {
            want = "an integer in [1, 1e15] (k, M, G suffixes allowed)";
            if (parse_count(v, 1, 1e15, &in->identities) == 0)
                want = NULL, a->have_c = 1;
        } else if (k == DIM) {
            want = "an integer in [1, 65536]";
            if (parse_count(v, 1, 65536, &n) == 0)
                want = NULL, in->dim = (int)n;
        } else if (k == SAMPLE_RATE) {
            want = "a number in (0, 1]";
            if (parse_num(v, 0, 1, 1, &in->sample_rate) == 0)
                want = NULL, a->have_rate = 1;
        } else if (k == SAMPLED) {
            want = "an integer in [1, 1e15] (k, M, G suffixes allowed)";
            if (parse_count(v, 1, 1e15, &in->sampled) == 0)
                want = NULL;
        } else if (k == WORKERS) {
            want = "an integer in [1, 1000000]";
            if (parse_count(v, 1, 1e6, &n) == 0)
                want = NULL, in->workers = (int)n, a->have_w = 1;
        } else if (k == BATCH) {
            want = "an integer in [1, 1000000]";
            if (parse_count(v, 1, 1e6, &n) == 0)
                want = NULL, in->batch = (int)n;
        } else if (k == SERVERS) {
            want = "an integer in [1, 1000000]";
            if (parse_count(v, 1, PLAN_MAX_SERVERS, &n) == 0)
                want = NULL, in->servers = (int)n;
        } else if (k == WIRE) {
            ps_dtype dt;
            want = "one of fp32, fp16, bf16";
            if (v && ps_dtype_parse(v, &dt) == 0)
                want = NULL, in->wire_bytes = (int)ps_dtype_size(dt), a->wire = v;
        } else if (k == HEAD_MODE) {
            want = "global or local";
            if (v && (!strcmp(v, "global") || !strcmp(v, "local")))
                want = NULL, in->local_mode = !strcmp(v, "local");
        } else if (k == LINK_GBPS) {
            want = "a number of Gbit/s > 0";
            if (parse_num(v, 0, 1e9, 1, &in->link_gbps) == 0)
                want = NULL, a->have_link = 1;
        } else if (k == SERVER_MEM) {
            want = "a number of GiB > 0";
            if (parse_num(v, 0, 1e9, 1, &in->server_mem_gib) == 0)
                want = NULL, a->mem_given = 1;
        } else if (k == MEM_BW) {
            want = "a number of GB/s > 0";
            if (parse_num(v, 0, 1e9, 1, &in->mem_gbs) == 0)
                want = NULL, a->bw_given = 1;
        } else if (k == GEMM_GFLOPS) {
            want = "a number of GFLOP/s > 0";
            if (parse_num(v, 0, 1e12, 1, &in->gemm_gflops) == 0)
                want = NULL, a->gemm_given = 1;
        } else if (k == REPLICAS) {
            want = "0 or 1";
            if (v && (!strcmp(v, "0") || !strcmp(v, "1")))
                want = NULL, in->replicas = v[0] - '0';
        } else if (k == OPTIMIZER) {
            want = "sgd or adamw";
            if (v && (!strcmp(v, "sgd") || !strcmp(v, "adamw")))
                want = NULL, in->adamw = !strcmp(v, "adamw");
        } else if (k == BACKBONE_MS) {
            want = "a number of milliseconds >= 0";
            if (parse_num(v, 0, 1e9, 0, &x) == 0)
                want = NULL, in->backbone_s = x / 1e3;
        } else
            return tool_unexpected(&ta, k == TOOL_UNKNOWN ? ta.opt : ta.arg, plan_usage);
        if (want) {
            tool_opt_bad(&ta, want);
            return 2;
        }
    }
    const char *missing = !a->have_c      ? "--identities"
                          : !a->have_w    ? "--workers"
                          : !a->have_link ? "--link-gbps"
                                          : NULL;
    if (missing) {
        fprintf(stderr, "pfcps plan: %s is required\n%s\n", missing, plan_usage);
        return 2;
    }
    if (a->have_rate && in->sampled) {
        fprintf(stderr, "pfcps plan: give --sample-rate or --sampled, not both\n");
        return 2;
    }
    return 0;
}

/* One row of the server-count table: S, the step's terms and what bounds it. */
static void print_servers_row(const plan_in *in, int S)
{
    plan_in m = *in;
    m.servers = S;
    plan_out q;
    if (plan_compute(&m, &q) == 0)
        printf("  %7d  %9.1f  %9.1f  %9.1f  %s\n", S, 1e3 * q.link_s, 1e3 * q.mem_s, 1e3 * q.step_s, q.bound);
}

int cmd_plan(int argc, char **argv)
{
    plan_args a = {0};
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc;
    const plan_in *in = &a.in;
    plan_out p;
    if ((rc = plan_compute(in, &p)) < 0) {
        fprintf(stderr, "pfcps plan: %s\n", pf_errmsg());
        return rc == -ENOSPC ? 1 : 2;
    }
    char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32];
    const char *assumed = " (assumed)";
    printf("pfcps plan: %lld identities, D = %d, ", (long long)in->identities, in->dim);
    if (in->sampled)
        printf("%lld rows sampled per worker and step", (long long)in->sampled);
    else
        printf("sample rate %g", in->sample_rate);
    printf(", %d workers x batch %d, %s head mode, wire %s%s\n", in->workers, in->batch,
           in->local_mode ? "local" : "global", a.wire,
           in->replicas ? ", replicas 1 (each server also holds a copy of another shard)" : "");
    if (in->adamw)
        printf("optimizer adamw: the servers keep two moments per row (12 D + 9 bytes per identity)\n");
    printf("hosts: link %g Gbit/s; server memory %g GiB%s, bandwidth %g GB/s%s; head GEMM %g GFLOP/s%s; "
           "backbone "
           "%g ms per step\n",
           in->link_gbps, in->server_mem_gib, a.mem_given ? "" : assumed, in->mem_gbs,
           a.bw_given ? "" : assumed, in->gemm_gflops, a.gemm_given ? "" : assumed, 1e3 * in->backbone_s);
    printf("per worker and step: partition %lld classes, k = %lld rows sampled, head over N = %lld rows\n",
           (long long)p.partition, (long long)p.k, (long long)p.n);
    printf("memory: %d bytes per identity (8 D + 9), table %s\n", p.bytes_per_identity,
           fmt_bytes(p.table_bytes, b1, sizeof b1));
    printf("  servers needed for memory: %d of %g GiB each\n", p.servers_mem, in->server_mem_gib);
    printf("  servers needed for bandwidth: %d (the fewest for a step within 10%% of %.1f ms, the step with "
           "unlimited servers)\n",
           p.servers_bw, 1e3 * p.step_limit_s);
    printf(
        "  evaluated: %d server%s%s; each: shard %.2f GiB + start-up margin %.2f GiB + request buffers%s %.2f "
        "GiB = %.2f GiB of %g GiB\n",
        p.servers, p.servers > 1 ? "s" : "", in->servers ? " (--servers)" : " (the larger of the two)",
        gib(p.shard_bytes), gib(p.server_need_bytes - p.shard_bytes - p.buffer_bytes),
        in->replicas ? " and undo logs" : "", gib(p.buffer_bytes), gib(p.server_need_bytes),
        in->server_mem_gib);
    printf(
        "bytes per step at %d server%s: worker link: pull %s out + %s in, push %s out + %s in = %s; server "
        "link %s (%.0f rows per server)\n",
        p.servers, p.servers > 1 ? "s" : "", fmt_bytes(p.pull_out_bytes, b1, sizeof b1),
        fmt_bytes(p.pull_in_bytes, b2, sizeof b2), fmt_bytes(p.push_out_bytes, b3, sizeof b3),
        fmt_bytes(p.push_in_bytes, b4, sizeof b4), fmt_bytes(p.worker_link_bytes, b5, sizeof b5),
        fmt_bytes(p.server_link_bytes, b6, sizeof b6), p.server_rows);
    printf("step time at %d server%s (head GEMMs %.3g TFLOP per worker):\n", p.servers,
           p.servers > 1 ? "s" : "", p.head_flop / 1e12);
    printf("  link %.1f ms, server memory %.1f ms, head compute %.1f ms, backbone %.1f ms\n", 1e3 * p.link_s,
           1e3 * p.mem_s, 1e3 * p.head_s, 1e3 * in->backbone_s);
    printf("  step = max(backbone, max(link, server memory)) + head = %.1f ms; bound: %s\n", 1e3 * p.step_s,
           p.bound);
    /* The trade-off between the two counts: doublings from the memory count up to the bandwidth count. */
    if (p.servers_bw > p.servers_mem) {
        printf("step time by server count:\n  servers    link ms  memory ms    step ms  bound\n");
        for (long S = p.servers_mem; S < p.servers_bw; S *= 2)
            print_servers_row(in, (int)S);
        print_servers_row(in, p.servers_bw);
    }
    printf("worker host memory for the head path (rows, gradients, head workspace): %.2f GiB (grows with k, "
           "not with C)\n",
           gib(p.worker_head_bytes));
    return 0;
}
