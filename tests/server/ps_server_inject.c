/* Test hook: feeds one message to a parameter server that was never started, through the same request
 * handling and applies the progress thread runs (server/ps_server_internal.h), without a fabric in the way.
 * The fuzz target and the snapshot test drive a server with it. */
#include "tests/server/ps_server_inject.h"

#include <stdlib.h>

#include "common/err.h"
#include "server/ps_server_internal.h"

int ps_server_inject(ps_server *S, const void *msg, size_t len)
{
    if (S->started)
        return pf_err(-EBUSY, "ps_server_inject on a started server");
    pss_handle_msg(S, msg, len);
    pss_apply_drain(S); /* no apply threads: every ready step is applied here */
    int replies = 0;
    pending **pp = &S->pq_head, *prev = NULL;
    while (*pp) {
        pending *p = *pp;
        if (!pss_reply_ready(S, p)) {
            prev = p;
            pp = &p->next;
            continue;
        }
        if (p->status == 0 && p->req.op == PS_OP_PULL) {
            void *out = malloc((size_t)p->req.n * S->sh.dim * ps_dtype_size(p->req.dtype) + 1);
            if (out)
                shard_gather(&S->sh, p->ids, p->req.n, p->req.dtype, out);
            free(out);
        }
        *pp = p->next;
        if (S->pq_tail == p)
            S->pq_tail = prev;
        pss_pend_put(S, p);
        replies++;
    }
    return replies;
}

int ps_server_inject_pool(ps_server *S)
{
    return pss_apply_pool_start(S);
}
