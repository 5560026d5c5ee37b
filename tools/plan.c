/* The arithmetic of `pfcps plan`: see plan.h for the model and where each term comes from. */
#include "tools/plan.h"

#include <math.h>
#include <string.h>

#include "common/err.h"
#include "proto/ps_wire.h"

/* Bytes rounded up to whole 4 KiB pages (server/shard.c maps each region page-aligned). */
static double page_round(double bytes)
{
    double pages = ceil(bytes / 4096.0);
    return (pages < 1 ? 1 : pages) * 4096.0;
}

static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/* Rows per server per step at S servers: every worker sends each server at most ceil(k / S) of its k rows. */
static double rows_per_server(const plan_in *in, int64_t k, int S)
{
    return (double)in->workers * (double)ceil_div(k, S);
}

/* Memory passes of 4 D bytes per row and step on a server (its copies' extra push passes counted apart). */
static int mem_passes(const plan_in *in)
{
    return PLAN_MEM_PASSES + (in->adamw ? PLAN_ADAMW_PASSES : 0);
}

/* replicas = 1 (workers replaced in place, server/undo.c): memory passes per pushed row for the undo logs of
 * both copies (in local mode a row several workers pushed is logged once: an upper bound there). */
static double undo_passes(const plan_in *in)
{
    return in->replicas ? 2.0 * (PLAN_UNDO_PASSES + in->adamw) : 0;
}

/* replicas = 1: the undo log's bytes per row of a step's pushes, per copy: the old weights and momentum
 * (AdamW: both moments) and 16 bytes of row id and step. */
static double plan_undo_row(const plan_in *in)
{
    return in->replicas ? (in->adamw ? 3 : 2) * 4.0 * in->dim + 16 : 0;
}

double plan_server_need(const plan_in *in, int S, double rows_step)
{
    const double D = in->dim;
    int64_t rows = ceil_div(in->identities, S);
    double regions = (in->adamw ? 3 : 2) * page_round((double)rows * D * 4);
    double margin = regions / 16 + (double)PLAN_MARGIN_MIB * 1024 * 1024;
    double msg = (double)ps_wire_msg_bytes((uint32_t)in->dim);
    const double copies = 1 + in->replicas; /* replicas = 1: a second table and endpoint, the pushes twice */
    double buffers =
        copies * (2.0 * PLAN_RECV_BUFS * msg + rows_step * (8 + 4 * D + plan_undo_row(in))) +
                     rows_step * D * in->wire_bytes;
    return copies * (regions + 9.0 * (double)rows + margin) + buffers; /* + row states, apply bookkeeping */
}

/* Messages of one worker's pull (or push) of k rows over S servers: each server's share cut into messages of
 * at most ps_wire_rows_per_msg rows; a push sends at least one message to every server. */
static double messages(const plan_in *in, int64_t k, int S, int push)
{
    const int64_t rpm =
        ps_wire_rows_per_msg((uint32_t)in->dim, in->wire_bytes == 4 ? PS_DT_FP32 : PS_DT_BF16);
    const int64_t q = k / S, rem = k % S;
    int64_t big = ceil_div(q + 1, rpm), small = ceil_div(q, rpm);
    if (push) {
        big = big < 1 ? 1 : big;
        small = small < 1 ? 1 : small;
    }
    return (double)(rem * big + (S - rem) * small);
}

static int check_inputs(const plan_in *in)
{
    if (in->identities < 1)
        return pf_err(-EINVAL, "identities must be at least 1 (got %lld)", (long long)in->identities);
    if (in->dim < 1)
        return pf_err(-EINVAL, "dim must be at least 1 (got %d)", in->dim);
    if (in->sampled < 0 || (in->sampled == 0 && !(in->sample_rate > 0 && in->sample_rate <= 1)))
        return pf_err(-EINVAL, "sample rate must be in (0, 1] (got %g)", in->sample_rate);
    if (in->workers < 1 || in->batch < 1)
        return pf_err(-EINVAL, "workers and batch must be at least 1 (got %d, %d)", in->workers, in->batch);
    if (in->wire_bytes != 2 && in->wire_bytes != 4)
        return pf_err(-EINVAL, "wire element size must be 2 or 4 bytes (got %d)", in->wire_bytes);
    if (!(in->link_gbps > 0) || !(in->mem_gbs > 0) || !(in->gemm_gflops > 0) || !(in->server_mem_gib > 0))
        return pf_err(-EINVAL, "link speed, memory bandwidth, GEMM rate and server memory must be positive");
    if (!(in->backbone_s >= 0) || !isfinite(in->backbone_s))
        return pf_err(-EINVAL, "backbone time must be >= 0 (got %g)", in->backbone_s);
    if (in->servers < 0 || in->servers > PLAN_MAX_SERVERS)
        return pf_err(-EINVAL, "servers must be in [1, %d] (got %d)", PLAN_MAX_SERVERS, in->servers);
    if (in->replicas < 0 || in->replicas > 1 || (in->replicas && in->servers == 1))
        return pf_err(-EINVAL, "replicas must be 0 or 1, and 1 needs at least 2 servers (got %d, servers %d)",
                      in->replicas, in->servers);
    return 0;
}

/* The per-step terms at S servers (k, n and the worker-side bytes already in out). */
static void step_terms(const plan_in *in, int S, plan_out *out)
{
    const double D = in->dim, rate = in->link_gbps * 1e9 / 8;
    double mp = messages(in, out->k, S, 0), mq = messages(in, out->k, S, 1);
    out->pull_out_bytes = 8.0 * (double)out->k + 64 * mp;
    out->pull_in_bytes = (double)out->k * D * in->wire_bytes + 64 * mp;
    /* replicas = 1: every push goes to both copies of its shard */
    out->push_out_bytes = (1 + in->replicas) * ((double)out->k * (8 + D * in->wire_bytes) + 64 * mq);
    out->push_in_bytes = (1 + in->replicas) * 64 * mq;
    out->worker_link_bytes =
        out->pull_out_bytes + out->pull_in_bytes + out->push_out_bytes + out->push_in_bytes;
    /* Links are full duplex; the pull's two directions overlap, and so do the push's, but the push follows
     * the head, which follows the pull. */
    double worker_s =
        (fmax(out->pull_out_bytes, out->pull_in_bytes) + fmax(out->push_out_bytes, out->push_in_bytes)) /
        rate;
    double share = (double)in->workers / S;
    out->server_link_bytes = share * out->worker_link_bytes;
    out->link_s = fmax(worker_s, share * worker_s);
    out->server_rows = (double)in->workers * (double)out->k / S;
    /* replicas = 1: a server also applies its backup copy's pushes (5 of the 7 passes), and both copies write
     * the undo log (PLAN_UNDO_PASSES, AdamW one more) */
    out->mem_s = out->server_rows * (mem_passes(in) + 5 * in->replicas + undo_passes(in)) * 4 * D /
                 (in->mem_gbs * 1e9);
    out->transfer_s = fmax(out->link_s, out->mem_s);
    out->step_s = fmax(in->backbone_s, out->transfer_s) + out->head_s;
    /* What sets the step: the largest of its terms. */
    const char *names[4] = {"head compute", "link", "server memory", "backbone"};
    const double terms[4] = {out->head_s, out->link_s, out->mem_s, in->backbone_s};
    int top = 0;
    for (int i = 1; i < 4; i++)
        if (terms[i] > terms[top])
            top = i;
    out->bound = names[top];
    out->shard_bytes = (1 + in->replicas) * (2 * page_round((double)ceil_div(in->identities, S) * D * 4) +
                                             9.0 * (double)ceil_div(in->identities, S));
    double rs = rows_per_server(in, out->k, S);
    out->server_need_bytes = plan_server_need(in, S, rs);
    out->buffer_bytes =
        (1 + in->replicas) * (2.0 * PLAN_RECV_BUFS * (double)ps_wire_msg_bytes((uint32_t)in->dim) +
                              rs * (8 + 4 * D + plan_undo_row(in))) +
        rs * D * in->wire_bytes;
}

int plan_compute(const plan_in *in, plan_out *out)
{
    memset(out, 0, sizeof *out);
    int rc = check_inputs(in);
    if (rc < 0)
        return rc;
    const int64_t C = in->identities, W = in->workers;
    const double D = in->dim;
    out->partition = in->local_mode ? C : ceil_div(C, W);
    out->n = in->local_mode ? in->batch : (int64_t)in->batch * W;
    const int64_t P = out->partition;
    int64_t k;
    if (in->sampled > 0) {
        k = in->sampled < P ? in->sampled : P;
    } else {
        /* worker/head/sample.c's sample_count under sample_rounding = ceil (ceil(r P) with a 1e-9 tolerance,
         * an upper bound of the default floor's int(r P)), then at least the positives. */
        k = (int64_t)ceil(in->sample_rate * (double)P - 1e-9);
        k = k > P ? P : k;
        int64_t pos = out->n < P ? out->n : P;
        k = k > pos ? k : pos;
    }
    out->k = k;
    out->bytes_per_identity = (in->adamw ? 12 : 8) * in->dim + 9;
    out->table_bytes = (double)C * out->bytes_per_identity;
    out->head_flop = 6.0 * (double)out->n * (double)k * D;
    out->head_s = out->head_flop / (in->gemm_gflops * 1e9);
    double nn = (double)out->n, kk = (double)k;
    out->worker_head_bytes = 2 * kk * D * 4 + (nn * kk + (nn + kk) * D + 2 * nn) * 4 + (4 * nn + kk) * 8 +
                             kk * D * in->wire_bytes + 32 * kk + (in->local_mode ? 0 : 2 * nn * D * 4);

    const double mem = in->server_mem_gib * 1073741824.0;
    out->servers_mem = 0;
    for (int S = 1 + in->replicas; S <= PLAN_MAX_SERVERS && !out->servers_mem; S++)
        if (plan_server_need(in, S, rows_per_server(in, k, S)) <= mem)
            out->servers_mem = S;
    if (!out->servers_mem)
        return pf_err(-ENOSPC, "%lld identities at D = %d do not fit %d servers of %g GiB", (long long)C,
                      in->dim, PLAN_MAX_SERVERS, in->server_mem_gib);
    /* servers_bw: more servers shorten the transfers (a server's link carries W / S of a worker's bytes, its
     * memory W k / S rows) until a worker's own link or the backbone bounds them; the fewest servers whose
     * step is within PLAN_SERVER_SLACK of that limit. A worker's link time is taken at one message per
     * server. */
    plan_out t = *out;
    step_terms(in, 1, &t);
    const double worker_s =
        (fmax(t.pull_out_bytes, t.pull_in_bytes) + fmax(t.push_out_bytes, t.push_in_bytes)) /
        (in->link_gbps * 1e9 / 8);
    out->step_limit_s = fmax(in->backbone_s, worker_s) + out->head_s;
    out->servers_bw = PLAN_MAX_SERVERS;
    for (int S = 1 + in->replicas; S <= PLAN_MAX_SERVERS; S++) {
        double share = (double)W / S, rows = (double)W * kk / S;
        double mem_s = rows * (mem_passes(in) + 5 * in->replicas + undo_passes(in)) * 4 * D / (in->mem_gbs * 1e9);
        double step = fmax(in->backbone_s, fmax(fmax(share, 1) * worker_s, mem_s)) + out->head_s;
        if (step <= PLAN_SERVER_SLACK * out->step_limit_s * (1 + 1e-12)) {
            out->servers_bw = S;
            break;
        }
    }
    int S =
        in->servers ? in->servers : (out->servers_mem > out->servers_bw ? out->servers_mem : out->servers_bw);
    out->servers = S;
    step_terms(in, S, out);
    if (out->server_need_bytes > mem)
        return pf_err(-ENOSPC, "%d server%s of %g GiB %s too few: each needs %.2f GiB (at least %d servers)",
                      S, S > 1 ? "s" : "", in->server_mem_gib, S > 1 ? "are" : "is",
                      out->server_need_bytes / 1073741824.0, out->servers_mem);
    return 0;
}
