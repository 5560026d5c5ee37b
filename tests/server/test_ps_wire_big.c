/* The longest messages of each wire dtype reach the other side: in-process, 1 server, 1 worker (tcp;ofi_rxm),
 * D = 1024, where a full fp16 or bf16 push chunk (510 rows: 64 + 510 x (8 + 2048) = 1048624 bytes) is longer
 * than a full fp32 one (255 rows: 1046584 bytes). Receive buffers sized for fp32 alone truncated it: the
 * server dropped the chunk and the worker waited for its acknowledgement forever.
 * Per dtype (fp16, then bf16, on a client of that wire dtype): a push of 600 rows (one full chunk and a
 * partial one) is acknowledged, then a pull of those rows (in the same dtype) matches float64 momentum SGD of one step from
 * the documented initial rows (pst_init_row) with the dtype-rounded gradient. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/fabric.h"
#include "proto/ps_wire.h"
#include "server/ps_server.h"
#include "tests/server/pst.h"
#include "worker/ps_client.h"

#include "tests/server/pst_inproc.h"

#include "tests/check.h"

#define C    2000
#define D    1024
#define N    600
#define SEED 9
#define MU   0.9
#define WD   5e-4
#define LR   0.05f

static float grad(int64_t id, int j)
{
    return (float)(1e-2 * sin(0.013 * (double)id + 0.31 * (double)j));
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    ps_server_opts so = {.provider = "tcp",
                         .rank = 0,
                         .servers = 1,
                         .workers = 2,
                         .dim = D,
                         .num_classes = C,
                         .seed = SEED,
                         .momentum = MU,
                         .weight_decay = WD,
                         .max_staleness = 1000,
                         .apply_threads = 1,
                         .global_mode = 1};
    ps_dtype dts[2] = {PS_DT_FP16, PS_DT_BF16};
    ps_server *srv;
    ps_client *cli[2];
    if (ps_server_create(&so, &srv) < 0) {
        printf("FAIL setup: %s\n", pf_errmsg());
        return 1;
    }
    for (int w = 0; w < 2; w++) {
        ps_client_opts co = {.provider = "tcp", .rank = w, .servers = 1, .num_classes = C, .dim = D, .dtype = dts[w]};
        if (ps_client_create(&co, &cli[w]) < 0) {
            printf("FAIL client: %s\n", pf_errmsg());
            return 1;
        }
    }
    CHECK(pst_connect_inproc(&srv, 1, cli, 2, 10) == 0, "%s", pf_errmsg());
    printf("D = %d: rows per message fp32 %u, fp16 %u; receive buffers %zu bytes\n", D,
           ps_wire_rows_per_msg(D, PS_DT_FP32), ps_wire_rows_per_msg(D, PS_DT_FP16), ps_wire_msg_bytes(D));
    int64_t *ids = malloc(sizeof(int64_t) * N);
    float *g = malloc(sizeof(float) * (size_t)N * D), *out = malloc(sizeof(float) * (size_t)N * D);
    for (int w = 0; w < 2 && !fails; w++) {
        /* Worker w pushes rows w*N .. w*N+N-1 (disjoint: each row gets one step of its own dtype). */
        for (int i = 0; i < N; i++) {
            ids[i] = (int64_t)w * N + i;
            for (int j = 0; j < D; j++)
                g[(size_t)i * D + j] = grad(ids[i], j);
        }
        ps_req *r;
        int rc = ps_push(cli[w], ids, N, g, LR, 0, &r);
        if (rc == 0)
            rc = ps_wait(cli[w], r, 20);
        CHECK(rc == 0, "%s push of %d rows at D = %d: %s", w ? "bf16" : "fp16", N, D, pf_errmsg());
        if (rc != 0)
            break;
        rc = ps_pull(cli[w], ids, N, out, 1, &r);
        if (rc == 0)
            rc = ps_wait(cli[w], r, 20);
        CHECK(rc == 0, "pull: %s", pf_errmsg());
        /* The pull comes back in the client's wire dtype too: compare within its rounding. */
        double worst = 0;
        for (int i = 0; i < N; i++) {
            double w0[D];
            pst_init_row(SEED, ids[i], D, w0);
            for (int j = 0; j < D; j++) {
                float gf = g[(size_t)i * D + j];
                double gq = w ? bf16_to_f32(bf16_from_f32(gf)) : f16_to_f32(f16_from_f32(gf));
                double wf = (float)w0[j], want = wf - (double)LR * (gq + WD * wf);
                double e = fabs(out[(size_t)i * D + j] - want) / fmax(fabs(want), 1e-3);
                worst = fmax(worst, e);
            }
        }
        double tol = w ? 0x1p-8 * 1.01 : 0x1p-11 * 1.01;
        printf("%s: push of %d rows acknowledged; pulled rows vs float64 after one step: max rel err %.3g "
               "(tolerance %.3g, the wire dtype's rounding)\n",
               w ? "bf16" : "fp16", N, worst, tol);
        CHECK(worst <= tol, "%s rows after the push", w ? "bf16" : "fp16");
    }
    for (int w = 0; w < 2; w++)
        ps_client_destroy(cli[w]);
    ps_server_destroy(srv);
    free(ids), free(g), free(out);
    return check_summary();
}
