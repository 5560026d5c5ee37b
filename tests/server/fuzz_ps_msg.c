/* libFuzzer target: hostile parameter-server requests. The input is a sequence of messages, each a
 * little-endian u16 length then that many bytes, fed to one server (shard 0 of 2, C = 64, D = 4, W = 2,
 * max_staleness 1) through ps_server_inject: header and payload validation, pull gathers, push chunk
 * bookkeeping, step clock and apply all run on hostile bytes under ASan. The server is recreated every
 * 500 inputs so its state stays small. Invariants checked after each input: momentum and weights stay
 * finite (pushes carry finite gradients only if the fuzzer wrote them; non-finite grads are allowed by the
 * protocol, so only memory safety and "no crash / no hang" are asserted), and steps_done never decreases. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/fabric.h"
#include "common/log.h"
#include "server/ps_server.h"
#include "tests/server/ps_server_inject.h"

static ps_server *srvs[2]; /* [0] local head mode (BSP/SSP clock), [1] global head mode */
static int uses;
static int64_t last_steps[2];

static ps_server *make(int global)
{
    ps_server_opts o = {.provider = "tcp",
                        .rank = 0,
                        .servers = 2,
                        .workers = 2,
                        .dim = 4,
                        .num_classes = 64,
                        .seed = 1,
                        .momentum = 0.9,
                        .weight_decay = 1e-3,
                        .max_staleness = 1,
                        .apply_threads = 1,
                        .recv_bufs = 2,
                        .global_mode = global};
    ps_server *s = NULL;
    if (ps_server_create(&o, &s) < 0)
        abort();
    uint8_t a[FAB_MAX_ADDR];
    size_t la = sizeof(a);
    if (ps_server_getname(s, a, &la) < 0)
        abort();
    /* Both worker ranks map to the server's own address: replies are never sent anyway. */
    if (ps_server_add_worker(s, 0, a, la) < 0 || ps_server_add_worker(s, 1, a, la) < 0)
        abort();
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!srvs[0]) {
        log_set_level(LOG_ERROR); /* bad requests log a warning each */
        srvs[0] = make(0);
        srvs[1] = make(1);
    }
    if (++uses % 500 == 0) {
        for (int m = 0; m < 2; m++) {
            ps_server_destroy(srvs[m]);
            srvs[m] = make(m);
            last_steps[m] = 0;
        }
    }
    /* The first byte picks the head mode; the rest is the message sequence. */
    if (size < 1)
        return 0;
    const int mode = data[0] & 1;
    ps_server *srv = srvs[mode];
    data++, size--;
    size_t off = 0;
    uint8_t *msg = malloc(65536);
    while (off + 2 <= size) {
        size_t len = (size_t)data[off] | ((size_t)data[off + 1] << 8);
        off += 2;
        if (len > size - off)
            len = size - off;
        memcpy(msg, data + off, len);
        off += len;
        ps_server_inject(srv, msg, len);
    }
    free(msg);
    ps_stat st;
    ps_server_stat(srv, &st);
    if (st.steps_done < last_steps[mode])
        abort();
    last_steps[mode] = st.steps_done;
    return 0;
}
