#include "tests/server/pst_inproc.h"

#include "common/err.h"
#include "common/fabric.h"

int pst_connect_inproc(ps_server **srv, int S, ps_client **cli, int W, double warmup_s)
{
    for (int s = 0; s < S; s++)
        for (int w = 0; w < W; w++) {
            uint8_t a[FAB_MAX_ADDR], b[FAB_MAX_ADDR];
            size_t la = sizeof(a), lb = sizeof(b);
            if (ps_server_getname(srv[s], a, &la) < 0 || ps_client_getname(cli[w], b, &lb) < 0 ||
                ps_server_add_worker(srv[s], w, b, lb) < 0 || ps_client_add_server(cli[w], s, a, la) < 0)
                return pf_err_wrap(-1, "connecting server %d and client %d", s, w);
        }
    for (int s = 0; s < S; s++)
        if (ps_server_start(srv[s]) < 0)
            return pf_err_wrap(-1, "starting server %d", s);
    for (int w = 0; w < W; w++)
        if (ps_client_warmup(cli[w], warmup_s) < 0)
            return pf_err_wrap(-1, "warming client %d up", w);
    return 0;
}
