#!/usr/bin/env bash
# SIGTERM to a server other than server 0 mid-run: it stops serving (after the apply in progress) and the
# rendezvous tells the others that it stopped while the workers still need its shard. The run cannot complete,
# so the worker must exit non-zero naming server[1], even when the step in progress still finished (it used to
# stop "on request" and exit 0, so that deploy/local/launch.sh reported success for a run cut short); server 0
# stops too (exit 75: the run must re-form).
source "$(dirname "$0")/cluster.sh" "$@"
export OMP_NUM_THREADS=1
start_endless 2 1 term-secret "training did not start"
kill -TERM "${SPIDS[1]}"
t0=$SECONDS
wait_exit "${WPIDS[0]}" 30 || { show_logs; die "the worker still runs 30 s after server 1 stopped"; }
rc=0; wait "${WPIDS[0]}" || rc=$?
[ "$rc" -ne 0 ] || { show_logs; die "the worker exited 0 although server 1 stopped mid-run"; }
grep -q "server\[1\].*stopped while the workers still need its shard" "$TMP/worker0.log" || { show_logs; die "the worker does not name server 1"; }
SPIDS=("${SPIDS[0]}")
stop_servers
echo "ok: SIGTERM to server 1: worker exited $rc after $((SECONDS - t0)) s"

# The whole job stopped at once (SIGTERM to the worker and to server 1 together, as systemd or a scheduler
# does): a requested stop, so the worker exits 0 even though it also hears that server 1 left.
start_endless 2 1 term-secret "training did not start (2)"
kill -TERM "${WPIDS[0]}" "${SPIDS[1]}"
wait_exit "${WPIDS[0]}" 30
rc=0; wait "${WPIDS[0]}" || rc=$?
[ "$rc" -eq 0 ] || { show_logs; die "the worker exited $rc when stopped together with server 1, want 0"; }
SPIDS=("${SPIDS[0]}")
stop_servers
echo "ok: SIGTERM to the worker and server 1 together: worker exited 0"
echo PASS
