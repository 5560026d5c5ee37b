/* A process serving metrics for tests/common/test_metrics_http.sh: starts the endpoint on argv[1] (default
 * "127.0.0.1:0"), prints "bound HOST:PORT" on stdout, registers a counter, a gauge with a label value that
 * needs escaping, a histogram and a /targets page, then adds 1 to the counter every 10 ms until killed (or
 * for argv[2] seconds, default 120). When the endpoint cannot start it prints pf_errmsg() on stderr and exits
 * 1 (the address-in-use check). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "common/metrics.h"

static char *targets(void *arg)
{
    (void)arg;
    return strdup("[{\"targets\":[\"127.0.0.1:1\"],\"labels\":{\"role\":\"worker\"}}]\n");
}

int main(int argc, char **argv)
{
    const char *address = argc > 1 ? argv[1] : "127.0.0.1:0";
    double seconds = argc > 2 ? atof(argv[2]) : 120;
    metrics_set_identity("worker", 3);
    metrics_set_run("0123456789abcdef0123456789abcdef");
    char bound[300];
    if (metrics_start(address, bound, sizeof bound) < 0) {
        fprintf(stderr, "%s\n", pf_errmsg());
        return 1;
    }
    printf("bound %s\n", bound);
    fflush(stdout);
    pf_metric *c = metrics_counter("pfcps_test_ticks_total", "Ticks of the test loop.", NULL, 0);
    const char *gl[] = {"path", "C:\\data \"faces\"\nline 2"};
    metrics_set(metrics_gauge("pfcps_test_value", "A gauge with an escaped label value.", gl, 1), -2.5);
    const double b[] = {0.001, 0.01, 0.1};
    pf_metric *h = metrics_histogram("pfcps_test_seconds", "Observed durations.", NULL, 0, b, 3);
    metrics_add_page("/targets", "application/json", targets, NULL);
    struct timespec ts = {0, 10 * 1000 * 1000};
    for (long i = 0; i < (long)(seconds * 100); i++) {
        metrics_add(c, 1);
        metrics_observe(h, (double)(i % 200) * 0.001);
        nanosleep(&ts, NULL);
    }
    metrics_stop();
    return 0;
}
