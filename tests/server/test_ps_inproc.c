/* In-process parameter-server test (fast; also runs under ASan+UBSan): 2 servers with their own progress
 * and apply threads, 2 clients (fp32 and bf16 wire), all in one process over tcp;ofi_rxm. Checks pull of
 * initial rows, a multi-message push (rows > one message) summed across clients vs float64, fp16/bf16 wire
 * rounding bounds, a bad request, the workers' done notice (PS_STAT_DONE), and a clean stop. The pulls' rows
 * are gathered by each server's progress and apply threads together (pieces of 64 rows here) and created on
 * first touch (no prefault): concurrent gathers of the same rows by 3 clients. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/fabric.h"
#include "worker/ps_client.h"
#include "worker/ps_client_hooks.h"
#include "server/ps_server.h"
#include "tests/server/pst.h"

#include "tests/server/pst_inproc.h"

#include "tests/check.h"

#define S    2
#define W    3
#define C    5000
#define D    256
#define SEED 77
#define MU   0.9
#define WD   0.001

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    ps_server *srv[S];
    ps_client *cli[W];
    ps_dtype dts[W] = {PS_DT_FP32, PS_DT_BF16, PS_DT_FP16};
    for (int s = 0; s < S; s++) {
        ps_server_opts o = {.provider = "tcp",
                            .rank = s,
                            .servers = S,
                            .workers = W,
                            .dim = D,
                            .num_classes = C,
                            .seed = SEED,
                            .momentum = MU,
                            .weight_decay = WD,
                            .max_staleness = 0,
                            .apply_threads = 2,
                            .recv_bufs = 8};
        if (ps_server_create(&o, &srv[s]) < 0) {
            printf("FAIL server %d: %s\n", s, pf_errmsg());
            return 1;
        }
    }
    for (int w = 0; w < W; w++) {
        ps_client_opts o = {.provider = "tcp",
                            .rank = w,
                            .servers = S,
                            .num_classes = C,
                            .dim = D,
                            .dtype = dts[w],
                            .window = 4};
        if (ps_client_create(&o, &cli[w]) < 0) {
            printf("FAIL client %d: %s\n", w, pf_errmsg());
            return 1;
        }
    }
    CHECK(pst_connect_inproc(srv, S, cli, W, 10) == 0, "%s", pf_errmsg());

    /* 4000 rows per push: more than one message per server (ps_wire_rows_per_msg(40) = 6096 fp32 ... use
     * a window of 4 and a big enough count to need several messages for fp16 too). */
    const int N = 4000;
    uint32_t rpm = ps_wire_rows_per_msg(D, PS_DT_FP32);
    printf("rows per message at D=%d: fp32 %u, fp16 %u\n", D, rpm, ps_wire_rows_per_msg(D, PS_DT_FP16));
    int64_t *ids = malloc(sizeof(int64_t) * N);
    float *g = malloc(sizeof(float) * N * D), *out = malloc(sizeof(float) * N * D);
    for (int i = 0; i < N; i++)
        ids[i] = (i * 7919) % C; /* distinct, unsorted, both shards */
    for (int i = 0; i < N * D; i++)
        g[i] = 0.001f * (float)((i % 13) - 6);
    /* Initial rows through each wire dtype. */
    double e32 = 0, e16 = 0, eb16 = 0;
    for (int w = 0; w < W; w++) {
        ps_req *r;
        CHECK(ps_pull(cli[w], ids, N, out, 0, &r) == 0 && ps_wait(cli[w], r, 20) == 0, "pull: %s",
              pf_errmsg());
        for (int i = 0; i < N; i++) {
            double ref[D];
            pst_init_row(SEED, ids[i], D, ref);
            for (int j = 0; j < D; j++) {
                double e = fabs(out[i * D + j] - ref[j]) / fabs(ref[j]);
                if (w == 0)
                    e32 = fmax(e32, e);
                if (w == 1)
                    eb16 = fmax(eb16, e);
                if (w == 2 && fabs(ref[j]) > 1e-4)
                    e16 = fmax(e16, e); /* normal fp16 range */
            }
        }
    }
    printf("initial rows, max rel err vs float64: fp32 %.3g (<= 2^-24), bf16 %.3g (<= 2^-8), fp16 %.3g (<= "
           "2^-11)\n",
           e32, eb16, e16);
    CHECK(e32 <= 0x1p-24 * 1.01 && eb16 <= 0x1p-8 * 1.01 && e16 <= 0x1p-11 * 1.01, "wire rounding");
    /* Each server gathered its ids (id mod S) once per client; the apply threads gather pieces with the
     * progress thread (their share depends on scheduling: printed, not checked). */
    for (int s = 0; s < S; s++) {
        long long want = 0;
        for (int i = 0; i < N; i++)
            want += ids[i] % S == s;
        want *= W;
        ps_stat st;
        ps_server_stat(srv[s], &st);
        printf("server %d: %lld rows pulled (want %lld), %lld of them gathered by its apply threads\n", s,
               (long long)st.rows_pulled, want, (long long)st.rows_pulled_par);
        CHECK(st.rows_pulled == want && st.rows_pulled_par >= 0 && st.rows_pulled_par <= st.rows_pulled,
              "server %d pull counts", s);
    }
    /* Step 0: every client pushes the same rows; the server must sum the three (wire-rounded) gradients. */
    for (int w = 0; w < W; w++) {
        ps_req *r;
        CHECK(ps_push(cli[w], ids, N, g, 0.05f, 0, &r) == 0 && ps_wait(cli[w], r, 20) == 0, "push: %s",
              pf_errmsg());
    }
    ps_req *r;
    CHECK(ps_pull(cli[0], ids, N, out, 1, &r) == 0 && ps_wait(cli[0], r, 20) == 0, "pull 1: %s", pf_errmsg());
    double maxrel = 0, num = 0, den = 0;
    for (int i = 0; i < N; i++) {
        double ref[D];
        pst_init_row(SEED, ids[i], D, ref);
        for (int j = 0; j < D; j++) {
            float gf = g[i * D + j];
            double gs = (double)gf + bf16_to_f32(bf16_from_f32(gf)) + f16_to_f32(f16_from_f32(gf));
            double w0 = (float)ref[j], want = w0 - 0.05 * (gs + WD * w0);
            maxrel = fmax(maxrel, fabs(out[i * D + j] - want));
            num += (out[i * D + j] - want) * (out[i * D + j] - want);
            den += want * want;
        }
    }
    double rel = sqrt(num / den);
    printf("after one step with 3 pushes of %d rows: rel L2 err vs float64 %.3g (tolerance 1e-6), max abs "
           "%.3g\n",
           N, rel, maxrel);
    CHECK(rel < 1e-6 && maxrel < 1e-8, "summed update");
    /* A bad id through the raw path: error, server still serves. */
    ps_hdr h = {.magic = PS_MAGIC,
                .version = PS_VERSION,
                .op = PS_OP_PULL,
                .client = 2,
                .step = 0,
                .n = 1,
                .dim = D,
                .dtype = 0};
    uint8_t msg[72];
    int64_t bad = C + 1;
    memcpy(msg, &h, 64);
    memcpy(msg + 64, &bad, 8);
    int rc = ps_raw(cli[2], 1, msg, sizeof(msg), 5);
    printf("pull of id C+1 -> %d: %s\n", rc, pf_errmsg());
    CHECK(rc == -ERANGE, "bad id not refused");
    int64_t bad_ids[1] = {-1};
    CHECK(ps_pull(cli[0], bad_ids, 1, out, 1, &r) == -ERANGE, "client-side id check");
    ps_stat st;
    CHECK(ps_stat_get(cli[0], 1, &st, 5) == 0 && st.bad_requests == 1 && st.steps_done == 1,
          "stat: bad %lld steps %lld", (long long)st.bad_requests, (long long)st.steps_done);
    /* A worker that finished says so to every shard (PS_STAT_DONE); a plain stat says nothing. */
    for (int s = 0; s < S; s++)
        CHECK(!ps_server_worker_done(srv[s], 0), "server %d: worker 0 done after a plain stat", s);
    CHECK(ps_client_done(cli[0], 5) == 0 && ps_client_done(cli[2], 5) == 0, "done: %s", pf_errmsg());
    for (int s = 0; s < S; s++)
        CHECK(ps_server_worker_done(srv[s], 0) && !ps_server_worker_done(srv[s], 1) &&
                  ps_server_worker_done(srv[s], 2) && !ps_server_worker_done(srv[s], W) &&
                  !ps_server_worker_done(srv[s], -1),
              "server %d: workers done 0 and 2 only", s);
    for (int w = 0; w < W; w++)
        ps_client_destroy(cli[w]);
    for (int s = 0; s < S; s++)
        ps_server_destroy(srv[s]);
    free(ids), free(g), free(out);
    printf(fails ? "FAILED (%d)\n" : "PASS\n", fails);
    return fails ? 1 : 0;
}
