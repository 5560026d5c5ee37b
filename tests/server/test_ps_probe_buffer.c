/* A liveness probe (a stat) is answered while another worker holds the server's send buffers: client 0 asks
 * for pulls of more rows than the server has send buffers for (2 here) and then does not progress (a long
 * forward), so the replies' large messages stay in flight towards it; client 1's stat must still be answered
 * within 3 s (the server keeps its last free send buffer for replies other than pulls: push acknowledgements,
 * stats, errors). A probe left unanswered would make a worker without a rendezvous take a live server as lost
 * (worker/ps_client.h, "Dead servers"). Then client 0 progresses and its pull completes with the initial rows
 * (checked against the float64 formula). One server, tcp;ofi_rxm, in one process. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "common/clock.h"
#include "common/err.h"
#include "server/ps_server.h"
#include "tests/server/pst.h"
#include "tests/server/pst_inproc.h"
#include "worker/ps_client.h"

#include "tests/check.h"

#define C    20000
#define D    256
#define N    12000 /* rows client 0 pulls: several messages, each above the provider's eager size */
#define SEED 5

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    ps_server *srv;
    ps_server_opts so = {.provider = "tcp",
                         .rank = 0,
                         .servers = 1,
                         .workers = 2,
                         .dim = D,
                         .num_classes = C,
                         .seed = SEED,
                         .apply_threads = 1,
                         .recv_bufs = 2};
    if (ps_server_create(&so, &srv) < 0) {
        printf("FAIL server: %s\n", pf_errmsg());
        return 1;
    }
    ps_client *cli[2];
    for (int w = 0; w < 2; w++) {
        ps_client_opts o = {
            .provider = "tcp", .rank = w, .servers = 1, .num_classes = C, .dim = D, .window = 8};
        if (ps_client_create(&o, &cli[w]) < 0) {
            printf("FAIL client %d: %s\n", w, pf_errmsg());
            return 1;
        }
    }
    CHECK(pst_connect_inproc(&srv, 1, cli, 2, 10) == 0, "%s", pf_errmsg());
    printf("rows per message at D=%d: %u\n", D, ps_wire_rows_per_msg(D, PS_DT_FP32));
    int64_t *ids = malloc(sizeof(int64_t) * N);
    float *out = malloc(sizeof(float) * N * D);
    for (int i = 0; i < N; i++)
        ids[i] = i;
    ps_req *r = NULL;
    CHECK(ps_pull(cli[0], ids, N, out, 0, &r) == 0, "pull: %s", pf_errmsg());
    /* The server answers client 0's pull messages into its send buffers; client 0 does not progress. */
    struct timespec nap = {0, 300000000};
    nanosleep(&nap, NULL);
    ps_stat st;
    const double t0 = pf_now_s();
    int rc = ps_stat_get(cli[1], 0, &st, 3.0);
    const double dt = pf_now_s() - t0;
    CHECK(rc == 0, "client 1's stat while client 0 holds the pull replies: rc %d (%s) after %.2f s", rc,
          pf_errmsg(), dt);
    if (rc == 0)
        printf("ok   a stat answered in %.3f s while client 0's pull replies waited for it to progress\n",
               dt);
    CHECK(r && ps_wait(cli[0], r, 20) == 0, "client 0's pull: %s", pf_errmsg());
    double err = 0;
    for (int i = 0; i < N; i += 97) {
        double ref[D];
        pst_init_row(SEED, ids[i], D, ref);
        for (int j = 0; j < D; j++)
            err = fmax(err, fabs(out[(size_t)i * D + j] - ref[j]) / fabs(ref[j]));
    }
    CHECK(err <= 0x1p-24 * 1.01, "client 0's pulled rows: max relative error %.3g against float64", err);
    for (int w = 0; w < 2; w++)
        ps_client_destroy(cli[w]);
    ps_server_stop(srv);
    ps_server_destroy(srv);
    free(ids);
    free(out);
    return check_summary();
}
