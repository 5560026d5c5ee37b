/* Test hooks of the parameter-server client, present only in ps_client_hooks_lib (worker/ps_client.c built
 * with -DPFCPS_TEST_HOOKS, ps_client_hooks_dep); the workers' ps_client_lib has none of them. */
#ifndef PFCPS_WORKER_PS_CLIENT_HOOKS_H
#define PFCPS_WORKER_PS_CLIENT_HOOKS_H

#include <stddef.h>

#include "worker/ps_client.h"

/* Sends the raw bytes msg[0..len) to server s as one message and waits up to timeout_s for the reply. The
 * client writes its own req_id over the header's (ps_hdr.req_id) when len covers it, and the run's token over
 * ps_hdr.token when len covers the whole header and a token is set (ps_client_set_token). Returns the reply's
 * status (0 or the server's negative code, with its message in pf_errmsg), -ETIMEDOUT when no reply came
 * (e.g. a message too short to answer), -ERANGE / -ECOMM as ps_stat_get. */
int ps_raw(ps_client *c, int s, const void *msg, size_t len, double timeout_s);

#endif
