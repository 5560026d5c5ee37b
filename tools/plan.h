/* The arithmetic of `pfcps plan` (tools/cmd_plan.c): from a run's shape and the hosts' figures, how many
 * servers it needs and what bounds its step. Pure functions, no I/O, so tests/tools/test_plan.c checks them
 * against values computed by hand.
 *
 * The model (docs/architecture.md, Performance model), per step and worker:
 *   k        = rows a worker samples: ceil(r x P) for its partition of P classes (global head mode: P =
 *              ceil(C / W), the largest partition; local mode: P = C), at least min(N, P) (the positives),
 *              or --sampled k; N = W x B rows in the head (global mode) or B (local);
 *   wire     = pull: k ids out (8 B each) + k rows back (D x wire bytes); push: k x (8 + D x wire bytes); a
 *              64-byte header on each message (pull request and reply, push request and reply; at most
 *              ps_wire_rows_per_msg(D, wire) rows per message and server, proto/ps_wire.h);
 *   link     = the busiest NIC's bytes / link speed: a worker's NIC carries its own pull + push, a server's
 *              the W x k rows of all workers spread over S servers (interleaved sharding), so W / S times a
 *              worker's;
 *   memory   = each server's rows per step (W x k / S) x PLAN_MEM_PASSES x 4 D bytes / memory bandwidth: the
 *              push's SGD reads w, v, g and writes w, v (5 passes), the pull's gather reads the row and
 *              writes the reply (2);
 *   head     = 6 N k D FLOP (three GEMMs: cosines, dL/d embeddings, dL/d centers) / the GEMM rate;
 *   step     = max(backbone, max(link, memory)) + head: the pull runs under the forward and the push under
 * the backward (worker/train.c), the head between them; with no backbone (bench/scale's head path) the
 * transfers and the head add up. Server memory is server/shard.c's: per shard 2 page-rounded regions of rows
 * x D x 4 bytes (weights, momentum) + 1 byte per row (its state) + 8 bytes per row of apply bookkeeping
 * (server/apply.c), i.e. 8 D + 9 bytes per identity; the start-up check wants that + 1/16 of the regions +
 * 256 MiB of MemAvailable; request buffers (server/ps_server.c):
 * PLAN_RECV_BUFS receive and as many send buffers of ps_wire_msg_bytes(D), the pushes of one step held as
 * fp32 chunks (8 + 4 D bytes per row) and the pull replies (D x wire bytes per row). */
#ifndef PFCPS_TOOLS_PLAN_H
#define PFCPS_TOOLS_PLAN_H

#include <stdint.h>

#define PLAN_MEM_PASSES   7   /* server memory passes per row and step: 5 (push SGD) + 2 (pull gather) */
#define PLAN_ADAMW_PASSES 2   /* more under optimizer = adamw: the push also reads and writes the second moment */
#define PLAN_UNDO_PASSES  2   /* replicas = 1, per copy: the undo log's write of the old weights and momentum
                                 (server/undo.c; AdamW one more, its second moment) */
#define PLAN_RECV_BUFS    64  /* server/ps_server.c's receive (and send) buffers */
#define PLAN_MARGIN_MIB   256 /* server/shard.c's start-up margin, beside 1/16 of the table */
#define PLAN_MAX_SERVERS  1000000
#define PLAN_SERVER_SLACK 1.1 /* servers_bw: a step within 10% of the step with unlimited servers */

typedef struct plan_in {
    int64_t identities;    /* C >= 1 */
    int dim;               /* D >= 1 */
    double sample_rate;    /* r in (0, 1], used when sampled == 0 */
    int64_t sampled;       /* > 0: rows each worker samples per step (capped at its partition) */
    int workers;           /* W >= 1 */
    int batch;             /* B >= 1, per worker */
    int wire_bytes;        /* bytes per element on the wire: 4 (fp32), 2 (fp16, bf16) */
    int local_mode;        /* 1: head_mode = local */
    double link_gbps;      /* Gbit/s of each host's link (> 0) */
    double mem_gbs;        /* server host memory bandwidth, GB/s (> 0) */
    double gemm_gflops;    /* worker head GEMM rate, GFLOP/s (> 0) */
    double server_mem_gib; /* memory a server may use (its MemAvailable), GiB (> 0) */
    int servers;           /* > 0: evaluate this many servers; 0: the plan's choice (see plan_out.servers) */
    double backbone_s; /* seconds of backbone forward + backward per step that hide the transfers (>= 0) */
    int replicas;      /* 0, or 1: each server also holds a hot-standby copy of another shard (its table,
                          buffers and the pushes it applies twice; a worker pushes every row to both copies),
                          and each copy keeps an undo log of a step's pushes for
                          replacing a lost worker in place: (2 D floats, AdamW 3 D, + 16 bytes) per pushed row, PLAN_UNDO_PASSES more
                          memory passes per row and copy (AdamW 3) */
    int adamw;         /* 1: optimizer = adamw: a third region of rows x D x 4 bytes (AdamW's second moment),
                          12 D + 9 bytes per identity, PLAN_ADAMW_PASSES more memory passes per pushed row */
} plan_in;

typedef struct plan_out {
    int64_t partition;      /* P: classes of the largest worker partition */
    int64_t k;              /* rows a worker samples per step */
    int64_t n;              /* rows in the head */
    int bytes_per_identity; /* 8 D + 9 (adamw: 12 D + 9) */
    double table_bytes;     /* C x bytes_per_identity: the whole table, before page rounding */
    int servers_mem;        /* fewest servers whose largest shard fits server_mem_gib */
    int servers_bw; /* fewest servers for a step within PLAN_SERVER_SLACK of step_limit_s (plan_compute) */
    int servers;    /* evaluated: in.servers, or max(servers_mem, servers_bw) */
    double shard_bytes;       /* largest shard at `servers`: regions + row map */
    double server_need_bytes; /* shard + start-up margin + request buffers, at `servers` */
    double buffer_bytes;      /* request buffers of one server at `servers` */
    double pull_out_bytes, pull_in_bytes, push_out_bytes, push_in_bytes; /* one worker's NIC per step */
    double worker_link_bytes;                                            /* sum of the four */
    double server_link_bytes; /* one server's NIC per step (all workers' rows / S) */
    double server_rows;       /* rows one server handles per step (W k / S) */
    double link_s;            /* busiest NIC's bytes / link speed */
    double mem_s;             /* server memory passes / bandwidth */
    double head_flop, head_s; /* 6 N k D and its time */
    double transfer_s;        /* max(link_s, mem_s) */
    double step_s;            /* max(backbone_s, transfer_s) + head_s */
    double step_limit_s;      /* the step with unlimited servers: max(backbone_s, a worker's link) + head_s */
    const char *bound;        /* what sets the step: "backbone", "link", "server memory" or "head compute" */
    double worker_head_bytes; /* a worker's host memory for the head path (rows, gradients, head workspace) */
} plan_out;

/* Bytes one server needs at S servers: its largest shard (2 page-rounded regions of ceil(C / S) x D x 4 bytes,
 * 3 under adamw, + 9 bytes per row: row state and apply bookkeeping), the start-up margin (1/16 of the regions
 * + 256 MiB)
 * and its request buffers for rows_step rows per step from all workers (fp32 push chunks + pull replies +
 * the message buffers). */
double plan_server_need(const plan_in *in, int S, double rows_step);

/* Fills out from in (every field of plan_out). Returns 0, or -EINVAL with pf_errmsg() naming the first input
 * out of range, or -ENOSPC (message) when no server count up to PLAN_MAX_SERVERS fits server_mem_gib, or
 * in.servers does not. More servers shorten the transfers (a server's link and memory carry W / S of the
 * rows) until a worker's own link or the backbone bounds them: step_limit_s; servers_bw is the fewest S (>=
 * 1) whose step is within PLAN_SERVER_SLACK (10%) of it (a worker's link time taken at one message per
 * server). */
int plan_compute(const plan_in *in, plan_out *out);

#endif
