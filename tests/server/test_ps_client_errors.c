/* ps_client against a scripted fake server (a raw fabric endpoint in a thread of this process, tcp on
 * 127.0.0.1): a receive that completes with an error must fail the request it belongs to, promptly, and the
 * client must keep a receive posted for every message in flight afterwards.
 *
 * Smallest failing input: the fake answers a pull of one row with a reply 64 bytes longer than the largest
 * message (ps_wire_msg_bytes), so the client's receive completes with -FI_ETRUNC. Before the fix ps_client
 * dropped receive error completions: the pull ended only at ps_wait's timeout (20 s here) with -ETIMEDOUT.
 * Now it fails within 2 s with -EPROTO naming server 0 and the truncation; the next pull, answered properly,
 * returns the fake's rows (values set here), and a stat reaches the fake (the server was not taken for dead).
 *
 * Then a pull the fake holds for a second (a stalled server), waited for in slices of 0.05 s as pfcps.torch
 * waits: the client says "still waiting" once per client timeout / 16 (0.1 s at 1.6 s) counted from the first
 * slice, and each slice's -ETIMEDOUT gives the time since the first. Smallest failing input: every slice
 * restarted the count, so each logged a line ("0 s so far") and the message said "within 0.1 s".
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/fabric.h"
#include "common/log.h"
#include "worker/ps_client.h"
#include "proto/ps_wire.h"

#include "tests/check.h"

#define D 4
#define C 10

typedef struct fake {
    fab_ctx *f;
    fi_addr_t client;
    size_t msg_bytes;
    uint8_t *rbuf, *sbuf;
    fab_mr rmr, smr;
    atomic_int stop;
    int pulls;          /* pull requests seen */
    atomic_int hold;    /* pulls are held, not answered, until `release` */
    atomic_int release; /* the held pull is answered now */
    uint8_t *held;      /* the held pull's bytes */
    size_t held_len;
} fake;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Row value the fake serves for class id, element j. */
static float fake_row(int64_t id, int j)
{
    return (float)(100 * id + j) + 0.25f;
}

/* Answers one request, req[len]: stat -> a ps_stat for C, D, S = 1; the first pull -> a reply 64 bytes longer
 * than any message; later pulls -> fake_row values. */
static void answer(fake *k, const uint8_t *req, size_t len)
{
    ps_hdr h;
    if (len < sizeof h)
        return;
    memcpy(&h, req, sizeof h);
    size_t out = sizeof h;
    int op = h.op;
    h.op = PS_OP_REPLY;
    h.status = 0;
    if (op == PS_OP_STAT) {
        ps_stat st = {.num_classes = C, .rank = 0, .servers = 1, .dim = D, .workers = 1, .local_rows = C};
        memcpy(k->sbuf + out, &st, sizeof st);
        out += sizeof st;
        h.n = 0;
    } else if (op == PS_OP_PULL && k->pulls++ == 0) {
        memset(k->sbuf + out, 0, k->msg_bytes);
        out = k->msg_bytes + 64;
    } else if (op == PS_OP_PULL) {
        for (uint32_t i = 0; i < h.n; i++) {
            int64_t id;
            memcpy(&id, req + sizeof h + 8 * i, 8);
            for (int j = 0; j < D; j++) {
                float v = fake_row(id, j);
                memcpy(k->sbuf + out, &v, 4);
                out += 4;
            }
        }
    } else {
        return;
    }
    memcpy(k->sbuf, &h, sizeof h);
    if (fab_send(k->f, k->client, k->sbuf, out, &k->smr, k->sbuf) < 0)
        printf("fake: send: %s\n", pf_errmsg());
}

static void *fake_main(void *arg)
{
    fake *k = arg;
    while (!atomic_load(&k->stop)) {
        fab_comp comp[4];
        int n = fab_poll(k->f, comp, 4);
        for (int i = 0; i < n; i++) {
            if (comp[i].context != k->rbuf)
                continue; /* our send completed */
            ps_hdr h;
            if (comp[i].err == 0 && atomic_load(&k->hold) && comp[i].len >= sizeof h &&
                (memcpy(&h, k->rbuf, sizeof h), h.op == PS_OP_PULL) && k->held_len == 0) {
                memcpy(k->held, k->rbuf, comp[i].len);
                k->held_len = comp[i].len;
            } else if (comp[i].err == 0) {
                answer(k, k->rbuf, comp[i].len);
            }
            if (fab_recv(k->f, k->rbuf, k->msg_bytes, &k->rmr, k->rbuf) < 0)
                printf("fake: recv: %s\n", pf_errmsg());
        }
        if (k->held_len && atomic_load(&k->release)) {
            answer(k, k->held, k->held_len);
            k->held_len = 0;
        }
        if (n == 0)
            usleep(100);
    }
    return NULL;
}

/* The held pull (see the top): waited for in slices of 0.05 s for 1 s, the log lines counted in a file. */
static void held_pull_in_slices(ps_client *c, fake *k)
{
    char logp[] = "/tmp/pfcps-test-ps-client-errors-XXXXXX";
    int fd = mkstemp(logp);
    CHECK(fd >= 0 && log_open_file(logp) == 0, "log file %s", logp);
    ps_client_set_timeout(c, 1.6);
    atomic_store(&k->hold, 1);
    int64_t ids[2] = {3, 5};
    float rows[2 * D];
    ps_req *r;
    char last[PF_ERRMSG_MAX] = "";
    int rc = ps_pull(c, ids, 2, rows, 0, &r), slices = 0;
    const double t0 = now();
    while (rc == 0 && now() - t0 < 1.0) {
        rc = ps_wait(c, r, 0.05);
        slices++;
        if (rc == -ETIMEDOUT) {
            snprintf(last, sizeof last, "%s", pf_errmsg());
            rc = 0;
        }
    }
    const double waited = now() - t0;
    atomic_store(&k->release, 1);
    if (rc == 0)
        rc = ps_wait(c, r, 5);
    log_close_file();
    CHECK(rc == 0 && rows[D] == fake_row(5, 0), "the held pull, released: rc %d: %s", rc, pf_errmsg());
    double so_far = 0, within = 0;
    const char *w = strstr(last, "within ");
    CHECK(w && sscanf(w, "within %lf s", &within) == 1 && within > waited - 0.1 && within <= waited,
          "the last slice's -ETIMEDOUT after %.2f s of waiting: %s", waited, last);
    FILE *f = fdopen(fd, "r");
    char line[1024];
    int lines = 0;
    while (f && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "still waiting for server 0");
        const char *q = p ? strstr(p, "s so far") : NULL;
        if (!q)
            continue;
        lines++;
        while (q > p && q[-1] == ' ')
            q--;
        while (q > p && (q[-1] == '.' || (q[-1] >= '0' && q[-1] <= '9')))
            q--;
        so_far = atof(q);
    }
    if (f)
        fclose(f);
    unlink(logp);
    printf(
        "held pull: %d slices of 0.05 s in %.2f s; %d \"still waiting\" lines, the last at %.1f s; the last "
        "slice's message: %s\n",
        slices, waited, lines, so_far, last);
    CHECK(lines >= 5 && lines <= 11, "%d \"still waiting\" lines in %.2f s (one per 0.1 s expected)", lines,
          waited);
    CHECK(so_far >= 0.8, "the last \"still waiting\" line counts %.1f s (the wait lasted %.2f s)", so_far,
          waited);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    alarm(60);
    fake k = {0};
    k.msg_bytes = ps_wire_msg_bytes(D);
    k.rbuf = calloc(1, k.msg_bytes);
    k.held = calloc(1, k.msg_bytes);
    k.sbuf = calloc(1, k.msg_bytes + 64);
    int rc = fab_open("tcp", &k.f);
    if (rc == -ENODATA) {
        printf("SKIP: tcp provider not available: %s\n", pf_errmsg());
        return 77;
    }
    ps_client_opts o = {
        .provider = "tcp", .rank = 0, .servers = 1, .num_classes = C, .dim = D, .dtype = PS_DT_FP32};
    ps_client *c = NULL;
    uint8_t name[FAB_MAX_ADDR];
    size_t nlen = sizeof name;
    int ok = rc == 0 && fab_mr_reg(k.f, k.rbuf, k.msg_bytes, FI_RECV, &k.rmr) == 0 &&
             fab_mr_reg(k.f, k.sbuf, k.msg_bytes + 64, FI_SEND, &k.smr) == 0 &&
             fab_recv(k.f, k.rbuf, k.msg_bytes, &k.rmr, k.rbuf) == 0 && ps_client_create(&o, &c) == 0 &&
             ps_client_getname(c, name, &nlen) == 0 && fab_av_insert(k.f, name, nlen, &k.client) == 0;
    nlen = sizeof name;
    ok = ok && fab_getname(k.f, name, &nlen) == 0 && ps_client_add_server(c, 0, name, nlen) == 0;
    CHECK(ok, "set-up: %s", pf_errmsg());
    pthread_t th;
    if (ok) {
        ps_client_set_timeout(c, 10);
        pthread_create(&th, NULL, fake_main, &k);
        rc = ps_client_warmup(c, 10);
        CHECK(rc == 0, "warm-up with the fake server: %s", pf_errmsg());
        int64_t ids[3] = {7, 2, 7};
        float rows[3 * D];
        ps_req *r;
        double t0 = now();
        rc = ps_pull(c, ids, 3, rows, 0, &r);
        if (rc == 0)
            rc = ps_wait(c, r, 20);
        double dt = now() - t0;
        printf("pull answered with a reply of %zu bytes (receive buffers hold %zu): rc %d after %.3f s: %s\n",
               k.msg_bytes + 64, k.msg_bytes, rc, dt, pf_errmsg());
        CHECK(rc == -EPROTO, "expected -EPROTO (%d), got %d", -EPROTO, rc);
        CHECK(dt < 2, "the truncated reply took %.2f s to fail the pull (wait allowed 20 s)", dt);
        CHECK(strstr(pf_errmsg(), "server 0") && strstr(pf_errmsg(), "pull reply"),
              "message does not name server 0 and the pull reply: %s", pf_errmsg());
        /* The receive was replaced and the server is not taken for dead: the next pull gets the fake's rows.
         */
        memset(rows, 0, sizeof rows);
        t0 = now();
        rc = ps_pull(c, ids, 3, rows, 0, &r);
        if (rc == 0)
            rc = ps_wait(c, r, 20);
        printf("next pull: rc %d after %.3f s\n", rc, now() - t0);
        CHECK(rc == 0, "next pull: %s", pf_errmsg());
        int bad = 0;
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < D; j++)
                bad += rows[i * D + j] != fake_row(ids[i], j);
        CHECK(rc != 0 || bad == 0, "%d values differ from the fake's rows", bad);
        ps_stat st;
        rc = ps_stat_get(c, 0, &st, 10);
        CHECK(rc == 0 && st.num_classes == C && st.dim == D, "stat after the error: rc %d: %s", rc,
              pf_errmsg());
        held_pull_in_slices(c, &k);
        atomic_store(&k.stop, 1);
        pthread_join(th, NULL);
    }
    ps_client_destroy(c);
    if (k.f)
        fab_shutdown(k.f);
    fab_mr_close(&k.rmr);
    fab_mr_close(&k.smr);
    fab_close(k.f);
    free(k.rbuf);
    free(k.held);
    free(k.sbuf);
    printf(fails ? "FAILED (%d)\n" : "PASS\n", fails);
    return fails ? 1 : 0;
}
