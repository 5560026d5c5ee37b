/* Test hook of the parameter server (tests/server/ps_server_inject.c, built into the tests and the fuzz
 * target only; the daemon and ps_server_lib have none of it). */
#ifndef PFCPS_TESTS_SERVER_PS_SERVER_INJECT_H
#define PFCPS_TESTS_SERVER_PS_SERVER_INJECT_H

#include <stddef.h>

#include "server/ps_server.h"

/* Handles one message msg[0..len) as if it had been received from the fabric, on the caller's thread (the
 * server must not be started; applies run on this thread), then answers every ready reply into the void (pull
 * rows are gathered into a scratch buffer). The sender is the worker rank in the header, as for real
 * messages. Returns the number of replies, or -EBUSY when the server was started. */
int ps_server_inject(ps_server *srv, const void *msg, size_t len);

/* Starts the server's apply threads (opts.apply_threads) but not its progress thread: ps_server_inject's
 * applies then run on them (rows split among the threads, as in a started server) while the caller waits.
 * ps_server_destroy joins them. Returns 0 or -EAGAIN. */
int ps_server_inject_pool(ps_server *srv);

#endif
