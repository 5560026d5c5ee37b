/* Start-up and stop plumbing that both daemons (pfcps-server, pfcps-worker) share: SIGTERM/SIGINT handling
 * from before main() on, the shared command line and member checks, the data plane's interface, joining the
 * run with a stop request honoured while it is still forming, and the exit that leaves the fabric endpoints
 * to the process exit.
 *
 * SIGTERM and SIGINT are blocked from before the shared libraries' constructors run (a .preinit_array entry
 * in daemon.c, linked into every program that calls daemon_signals_install) until daemon_signals_install has
 * put the daemon's handler in place, so that a stop request during start-up ends in the same orderly stop as
 * a later one. */
#ifndef PFCPS_COMMON_DAEMON_H
#define PFCPS_COMMON_DAEMON_H

#include <signal.h>
#include <stddef.h>

#include "common/ckpt.h"
#include "common/config.h"
#include "common/ctl.h"

/* Exit status when the run must re-form (a member was lost or restarted, or server 0 went away): the
 * supervisor (launch.sh --max-restarts, Kubernetes, systemd) restarts every member with resume = true.
 * EX_TEMPFAIL of sysexits.h. */
#define DAEMON_EXIT_REFORM 75

/* Exit status of a worker that the rendezvous removed from a run that replaces lost workers in place and goes
 * on without it (its silence passed ctl_member_silence_s: the process was stopped, SIGSTOP, or cut off): the
 * supervisor starts it again alone, with the same command line, and it joins as its own replacement
 * (launch.sh --max-restarts does; a restart policy on failure does the same). */
#define DAEMON_EXIT_REPLACED 76

/* First thing in a daemon's main: log_init(role, -1) (the rank is not known yet), daemon_tune_malloc, then
 * daemon_signals_install(stop). role: "server" or "worker", the log lines' role. */
void daemon_start(const char *role, volatile sig_atomic_t *stop);

/* The options both daemons share (cli_parse_common with CLI_CONFIG_OPTIONAL: `--config`, `--set`, `--help`;
 * the run config comes from the rendezvous) into *cfg; the daemon's own options are left in
 * argv[1..*rest_argc). Returns 0, CLI_HELP (help printed: exit 0), or -1 after logging the error. */
int daemon_parse_common(int argc, char **argv, pf_config *cfg, const char *usage, int *rest_argc);

/* After the daemon's own options: the log lines carry (role, rank) from here on (log_init), then the member
 * settings are checked (cli_member_check: rank in [0, count) where `what` names the count's key, "servers"
 * or "workers"; the join secret; the rendezvous host:port, into host (hostlen bytes) and *port).
 * Returns 0, or -1 after logging the error followed by `usage`. */
int daemon_member_check(const pf_config *cfg, const char *role, long rank, int count, const char *what,
                        char *host, size_t hostlen, int *port, const char **secret, const char *usage);

/* Leaves the process at once with exit_code, after flushing stdio and the log file, without closing the
 * fabric endpoints: the process exit releases them, while closing them ourselves risks libfabric 1.17's
 * tcp;ofi_rxm crash inside fi_close(ep) when peers disconnect at the same moment (SIGSEGV ~1 run in 15),
 * which would turn a clean stop into exit 1. The shm regions this process made are unlinked
 * (fab_shm_unlink_regions), since no fi_close does it. Call once the daemon's work is done and written. */
_Noreturn void daemon_exit_now(int exit_code);

/* Installs the SIGTERM/SIGINT handler, which sets *stop to 1 (and records that this process was
 * signalled: daemon_signalled), ignores SIGPIPE, makes ctl_join give up once *stop is set
 * (ctl_set_interrupt), then unblocks SIGTERM/SIGINT: one that came during start-up is handled now.
 * Call once, first thing in main. */
void daemon_signals_install(volatile sig_atomic_t *stop);
/* With PFCPS_PARENT_PID in the environment (the launcher's pid), the daemon also gets SIGTERM when that
 * process dies, however it dies (PR_SET_PDEATHSIG), and stops in order. */

/* 1 when this process got SIGTERM or SIGINT (the stop flag may also be raised by the daemon itself). */
int daemon_signalled(void);

/* Keeps glibc malloc from returning per-step buffers to the kernel: blocks up to 32 MiB come from the heap
 * (M_MMAP_THRESHOLD, its maximum; by default it starts at 128 KiB) and the heap top is trimmed only above
 * 512 MiB free (M_TRIM_THRESHOLD), so a buffer freed and allocated again every step (the sampled ids, a
 * message's rows) reuses pages already backed instead of faulting in zeroed ones each step. Call first thing
 * in main. */
void daemon_tune_malloc(void);

/* Chooses the interface the data plane listens on, from config key data_address: "auto" (default) binds the
 * address this host reaches the rendezvous host:port from (so the data plane follows the configured address
 * and never listens on every interface), "any" leaves the choice to the provider, anything else is used as
 * the address. Logs the choice; shm needs none. Over tcp, also sets libfabric's universe to servers +
 * workers (fab_set_universe) and logs it; an FI_UNIVERSE_SIZE in the environment that is not a positive
 * integer is an error (-EINVAL, logged). Call before opening the fabric endpoints. Returns 0, -EINTR
 * when a stop signal came while the rendezvous name did not resolve yet (a normal stop, logged), or another
 * negative code after logging (no route to the rendezvous within join_timeout). */
int daemon_bind_data_plane(const pf_config *cfg, const char *host, int port);

/* Starts this member's Prometheus endpoint when its config (its own --config / --set: metrics_address is
 * member-local, so several members on one host can each take a free port with ":0") sets metrics_address:
 * metrics_set_identity(role, rank), metrics_start, then logs "metrics on HOST:PORT" (the bound address).
 * metrics_address "" (the default): no endpoint. Either way the bound address ("" when none) is set to be
 * reported at the join (ctl_set_metrics_address). Returns 0, or a negative code after logging the error
 * (address in use, malformed or not of this host): the daemon exits with status 1. */
int daemon_metrics_start(const pf_config *cfg, const char *role, int rank);

/* The run trains with server 0's config (the book's). Keys the member's own config (file and --set) sets to
 * a value that is neither the default nor the run's are not used: one warning names each with both values
 * ("this <role>'s config sets 2 keys that the run does not use ...: lr = 0.3 (0.05), ..."), instead of
 * ignoring them silently. The member-local keys (cfg_member_local_keys) are left out. */
void daemon_warn_unused_local_keys(const char *role, const pf_config *local, const pf_config *run);

/* Joins the run (cli_join_run: host:port as (role, rank) with fabric address addr, up to join_timeout) and
 * loads the run config into *run. A stop before the run formed, SIGTERM/SIGINT while waiting or the
 * rendezvous shutting the run down, is a normal stop: it is logged ("stopping: ...", with `stop_note`
 * appended to the signal case, "" for none; then "stopped before the run formed"), as is a worker's join
 * refused because its run's training is over (-ESHUTDOWN: restarted after it was lost past the end vote).
 * Returns 0 with *sess joined, 1 after such a stop (exit 0), 2 when the rendezvous answered with a member's
 * loss (-ENOLINK: the run re-forms; logged, exit DAEMON_EXIT_REFORM), or a negative code after logging the
 * error (exit 1). flags: DAEMON_JOIN_EEXIST_TO_CALLER returns a refused seat (-EEXIST, the refusal in
 * pf_errmsg()) without logging it, for a caller that has a normal way on from it (server 0 restarted under
 * head_mode = local). */
enum { DAEMON_JOIN_EEXIST_TO_CALLER = 1u };
int daemon_join(const pf_config *cfg, const char *host, int port, ctl_role role, int rank, const void *addr,
                size_t alen, const char *secret, const char *stop_note, unsigned flags, ctl_session **sess,
                pf_config *run);

/* resume = true: lists the checkpoint steps this member can resume from (ckpt_resume_steps over cfg's
 * checkpoint root: `member` "server" or "worker", `who` for messages, `check` (with arg) the member's own
 * test of its file) and reports them at the join (ctl_set_resume_steps), newest first, at most
 * CTL_MAX_RESUME_STEPS. Nothing when resume = false. Returns 0, or -1 after logging why the folder cannot be
 * read (a resume must not start afresh over checkpoints it cannot see). */
int daemon_list_resume_steps(const pf_config *cfg, const char *member, const char *who, ckpt_step_check check,
                             void *arg);

#endif
