/* pf_resolve (common/hostport.h): an address resolves at once; a name that does not resolve is retried until
 * the deadline and then refused naming the host, the reason and how long it waited; a deadline already
 * past tries once; a non-retryable error (unknown service) fails at once; the interrupt flag ends the wait
 * within a tick. Names under .invalid never resolve (RFC 6761); RES_OPTIONS keeps a slow DNS server short. */
#include "common/hostport.h"
#include "common/clock.h"
#include "common/err.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/check.h"

static volatile sig_atomic_t stop_flag;

static void *raise_later(void *arg)
{
    (void)arg;
    usleep(300 * 1000);
    stop_flag = 1;
    return NULL;
}

int main(void)
{
    setenv("RES_OPTIONS", "timeout:1 attempts:1", 1);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    const char *bad = "pfcps-test-no-such-host.invalid";

    double t0 = pf_now_s();
    int rc = pf_resolve("test host", "127.0.0.1", "7000", &hints, t0 + 5, &ai);
    CHECK(rc == 0 && ai && ai->ai_family == AF_INET, "127.0.0.1: rc %d (%s)", rc, pf_errmsg());
    CHECK(pf_now_s() - t0 < 0.5, "127.0.0.1 took %.2f s", pf_now_s() - t0);
    freeaddrinfo(ai);

    t0 = pf_now_s();
    rc = pf_resolve("test host", bad, "7000", &hints, t0 + 1.6, &ai);
    double took = pf_now_s() - t0;
    CHECK(rc == -EINVAL && ai == NULL, "unresolvable: rc %d", rc);
    CHECK(took >= 1.0 && took < 12, "unresolvable: gave up after %.2f s, deadline 1.6 s", took);
    CHECK(strstr(pf_errmsg(), "cannot resolve test host 'pfcps-test-no-such-host.invalid': ") &&
              strstr(pf_errmsg(), "(retried for "),
          "message: %s", pf_errmsg());

    t0 = pf_now_s();
    rc = pf_resolve("test host", bad, "7000", &hints, t0 - 1, &ai);
    CHECK(rc == -EINVAL && !strstr(pf_errmsg(), "retried"), "past deadline: rc %d, %s", rc, pf_errmsg());
    CHECK(pf_now_s() - t0 < 6, "past deadline took %.2f s", pf_now_s() - t0);

    t0 = pf_now_s();
    rc = pf_resolve("test host", "127.0.0.1", "no-such-service-pfcps", &hints, t0 + 5, &ai);
    CHECK(rc == -EINVAL && pf_now_s() - t0 < 0.5, "bad service: rc %d after %.2f s", rc, pf_now_s() - t0);

    pf_resolve_set_interrupt(&stop_flag);
    pthread_t th;
    pthread_create(&th, NULL, raise_later, NULL);
    t0 = pf_now_s();
    rc = pf_resolve("test host", bad, "7000", &hints, t0 + 30, &ai);
    took = pf_now_s() - t0;
    pthread_join(th, NULL);
    CHECK(rc == -EINTR && strstr(pf_errmsg(), "interrupted"), "interrupt: rc %d, %s", rc, pf_errmsg());
    CHECK(took >= 0.25 && took < 6, "interrupt ended the wait after %.2f s", took);
    pf_resolve_set_interrupt(NULL);

    printf("test_hostport: %d failures\n", fails);
    return fails != 0;
}
