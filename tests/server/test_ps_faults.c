/* No page fault in a step's hot path once the first steps are done, over tcp (tcp;ofi_rxm), in-process:
 * 1 server, 1 worker, each step a pull of K rows and a push of their gradients, waited for. After WARM steps,
 * the process's minor page faults (getrusage) over MEASURE more steps must be 0.
 *
 * Without fab_set_universe, ofi_rxm gives each endpoint a completion queue of (tx + rx depth) x 256 entries of
 * 48 bytes (12 MiB) which every completion walks into for the first time: one fresh page per ~85 completions,
 * page faults in every step until 2^18 completions went by (run this test with --default-universe to see
 * them). With the universe set to the job's 2 processes the queue has (2048 + 2048) x 2 = 8192 entries (96
 * pages), all touched once 8192 completions went by: here, with ~7 completions per endpoint and step, after ~1200
 * steps (hence WARM); at the scale benchmark's sizes (thousands of completions per step: the provider splits
 * large messages into segments) within the first few steps.
 *
 * Also checks fab_set_universe's contract: it sets FI_UNIVERSE_SIZE, an existing FI_UNIVERSE_SIZE wins (one
 * that is not a positive integer is -EINVAL, named), and once libfabric started it changes nothing and
 * returns 0. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "common/err.h"
#include "common/fabric.h"
#include "server/ps_server.h"
#include "worker/ps_client.h"

#include "tests/server/pst_inproc.h"

#include "tests/check.h"

#define C       20000
#define D       64
#define K       2000
#define WARM    2000
#define MEASURE 300

static long minflt(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

int main(int argc, char **argv)
{
    const int default_universe = argc > 1 && !strcmp(argv[1], "--default-universe");
    const char *bad[] = {"", "abc", "0", "-3", "12x"};
    for (int i = 0; i < 5; i++) {
        setenv("FI_UNIVERSE_SIZE", bad[i], 1);
        long u = fab_set_universe("tcp", 2);
        CHECK(u == -EINVAL && strstr(pf_errmsg(), "FI_UNIVERSE_SIZE"),
              "FI_UNIVERSE_SIZE='%s': fab_set_universe returned %ld (%s), want -EINVAL naming it", bad[i], u,
              pf_errmsg());
    }
    setenv("FI_UNIVERSE_SIZE", "7", 1);
    CHECK(fab_set_universe("tcp", 2) == 7, "FI_UNIVERSE_SIZE=7 in the environment must win");
    unsetenv("FI_UNIVERSE_SIZE");
    CHECK(fab_set_universe("shm", 2) == 0 && !getenv("FI_UNIVERSE_SIZE"),
          "fab_set_universe for shm must set nothing and return 0");
    if (!default_universe) {
        long u = fab_set_universe("tcp", 2);
        const char *env = getenv("FI_UNIVERSE_SIZE");
        CHECK(u == 2 && env && !strcmp(env, "2"), "fab_set_universe(tcp, 2) returned %ld, FI_UNIVERSE_SIZE '%s'", u,
              env ? env : "(unset)");
        u = fab_set_universe("tcp", 5);
        CHECK(u == 2, "fab_set_universe(tcp, 5) with FI_UNIVERSE_SIZE=2 set returned %ld (the environment wins: 2)", u);
        CHECK(fab_set_universe("tcp", 1) == 2, "a second call changed the universe");
    }
    ps_server_opts so = {.provider = "tcp",
                         .rank = 0,
                         .servers = 1,
                         .workers = 1,
                         .dim = D,
                         .num_classes = C,
                         .seed = 3,
                         .momentum = 0.9,
                         .weight_decay = 5e-4,
                         .max_staleness = 0,
                         .apply_threads = 1,
                         .prefault = 1};
    ps_client_opts co = {.provider = "tcp", .rank = 0, .servers = 1, .num_classes = C, .dim = D};
    ps_server *srv;
    ps_client *cli;
    if (ps_server_create(&so, &srv) < 0 || ps_client_create(&co, &cli) < 0) {
        CHECK(0, "setup: %s", pf_errmsg());
        return check_summary();
    }
    unsetenv("FI_UNIVERSE_SIZE");
    CHECK(fab_set_universe("tcp", 9) == 0 && !getenv("FI_UNIVERSE_SIZE"),
          "fab_set_universe after libfabric started must change nothing and return 0");
    if (pst_connect_inproc(&srv, 1, &cli, 1, 10) < 0) {
        CHECK(0, "%s", pf_errmsg());
        return check_summary();
    }
    int64_t *ids = malloc(sizeof(int64_t) * K);
    float *g = malloc(sizeof(float) * K * D), *out = malloc(sizeof(float) * K * D);
    for (int i = 0; i < K * D; i++)
        g[i] = 1e-4f * (float)((i % 13) - 6);
    uint64_t x = 88172645463325252ull;
    long f0 = 0;
    for (int t = 0; t < WARM + MEASURE; t++) {
        if (t == WARM)
            f0 = minflt();
        for (int i = 0; i < K; i++) { /* K random ids of C (repeats allowed) */
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            ids[i] = (int64_t)(x % C);
        }
        ps_req *r;
        int rc = ps_pull(cli, ids, K, out, t, &r);
        if (rc == 0)
            rc = ps_wait(cli, r, 30);
        if (rc == 0 && (rc = ps_push(cli, ids, K, g, 0.1f, t, &r)) == 0)
            rc = ps_wait(cli, r, 30);
        if (rc != 0) {
            CHECK(0, "step %d: %s", t, pf_errmsg());
            break;
        }
    }
    long faults = minflt() - f0;
    printf("universe %s: %ld minor page faults in %d steps after %d warm-up steps (pull + push of %d rows, "
           "D = %d)\n",
           default_universe ? "libfabric's default" : "2 (fab_set_universe)", faults, MEASURE, WARM, K, D);
    if (!default_universe)
        CHECK(faults == 0, "%ld page faults in %d steady steps (want 0)", faults, MEASURE);
    ps_client_destroy(cli);
    ps_server_destroy(srv);
    free(ids), free(g), free(out);
    return check_summary();
}
