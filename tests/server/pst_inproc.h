/* In-process parameter-server tests: one call connects servers and clients created in this process. */
#ifndef PFCPS_TESTS_SERVER_PST_INPROC_H
#define PFCPS_TESTS_SERVER_PST_INPROC_H

#include "server/ps_server.h"
#include "worker/ps_client.h"

/* Gives every server srv[0..S) the address of every client cli[0..W) (as worker w) and every client the
 * address of every server (as server s), starts the servers and warms every client up (ps_client_warmup,
 * warmup_s seconds each). Returns 0, or -1 with pf_errmsg naming the step that failed. */
int pst_connect_inproc(ps_server **srv, int S, ps_client **cli, int W, double warmup_s);

#endif
