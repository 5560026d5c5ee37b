/* Test harness for multi-process parameter-server tests on 127.0.0.1 (tcp provider): writes a config,
 * spawns pfcps-server processes (from $PFCPS_BUILD/server/pfcps-server), joins test clients as workers
 * through the real rendezvous, and kills every child on every exit path (atexit + SIGTERM/SIGINT/SIGALRM
 * handlers; an alarm bounds each test). */
#ifndef PFCPS_TESTS_SERVER_PST_H
#define PFCPS_TESTS_SERVER_PST_H

#include <stdint.h>
#include <sys/types.h>

#include "worker/ps_client.h"

#define PST_MAX 16

typedef struct pst_cluster {
    int S, W;
    int64_t C;
    int D;
    int port;
    pid_t pids[PST_MAX];
    char cfg_path[256];
    char log_path[PST_MAX][256];
    uint8_t srv_addr[PST_MAX][512]; /* the servers' fabric addresses, from the book of the last pst_join */
    size_t srv_alen[PST_MAX];
} pst_cluster;

/* Starts S servers for W workers with C classes of dimension D, head_mode = local (BSP/SSP step clock);
 * `extra` is appended to the config (e.g. "max_staleness = 2\n" or "head_mode = global\n": a later key
 * overrides), may be NULL. Returns 0, or 77 (skip) when the server binary is missing,
 * or -1. Arms a `seconds` alarm that kills everything. */
int pst_start(pst_cluster *cl, int S, int W, int64_t C, int D, const char *extra, int seconds);

/* Joins as worker `rank` (blocks until all W workers and S servers joined), adds the servers to a new
 * client with wire dtype dt, warms it up. Returns the client or NULL (message printed). */
ps_client *pst_join(pst_cluster *cl, int rank, ps_dtype dt);

/* Joins workers ranks[0..n) concurrently (one thread each); out[i] gets each client. Returns 0 or -1. */
int pst_join_many(pst_cluster *cl, int n, const int *ranks, ps_dtype dt, ps_client **out);

/* SIGTERM to every server, waits up to 10 s each; returns 0 when all exited with status 0, else -1
 * (printing which). Closes the control sessions. */
int pst_stop(pst_cluster *cl);

/* Prints the server logs (on failure). */
void pst_dump_logs(pst_cluster *cl);

/* Initial value of row c (independent float64 re-implementation of the documented generator). */
void pst_init_row(uint64_t seed, int64_t c, int dim, double *row);

/* Seconds since an arbitrary start (monotonic). */
double pst_now(void);

/* Registers an extra child pid to kill on exit (e.g. a forked client). */
void pst_track_child(pid_t pid);

/* Forgets a child the test reaped itself (so nothing signals a pid that may be reused). */
void pst_untrack_child(pid_t pid);

#endif
