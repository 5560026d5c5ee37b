#!/usr/bin/env bash
# When server 0 (the rendezvous) stops or dies mid-run, or a worker dies, the other workers notice through
# the control connection and exit with a message within seconds, instead of waiting out the data-plane
# timeouts (120 s).
#   case 1: SIGTERM to server 0 -> it broadcasts the shutdown -> the worker stops (after the step in
#           progress if it can finish, exit 0; else exit 1) and says why
#   case 2: SIGKILL to server 0 -> the control connection breaks -> the worker exits 1 naming that
source "$(dirname "$0")/cluster.sh" "$@"
export OMP_NUM_THREADS=1
run_case() {
  local sig=$1 text=$2
  start_endless 1 1 loss-secret "$sig: training did not start"
  kill "-$sig" "${SPIDS[0]}"
  local t0=$SECONDS rc=0
  wait_exit "${WPIDS[0]}" 30 || { show_logs; die "$sig: the worker still runs 30 s after server 0 went away"; }
  wait "${WPIDS[0]}" || rc=$?
  wait "${SPIDS[0]}" 2>/dev/null
  # A shutdown broadcast is an orderly stop (the worker may finish its step and exit 0); a dead server is not.
  [ "$sig" = TERM ] || [ "$rc" -ne 0 ] || die "$sig: the worker exited 0 although server 0 died"
  grep -q "$text" "$TMP/worker0.log" || { show_logs; die "$sig: worker log lacks '$text'"; }
  echo "ok: SIG$sig to server 0: worker exited $rc after $((SECONDS - t0)) s: $(grep -m1 "$text" "$TMP/worker0.log" | sed 's/^.* ERROR //')"
}
run_case TERM "shut the run down"
run_case KILL "lost the control connection"

# case 3: kill -9 of worker 1 of 2 -> the rendezvous tells the others -> worker 0 exits non-zero naming worker 1
# within seconds (not after the 120 s ring timeout); the server, whose table is now ahead of the last
# checkpoint, stops with exit 75 (the run must re-form from its newest checkpoint) and says so.
start_endless 1 2 loss-secret "worker loss: training did not start"
kill -KILL "${WPIDS[1]}"
t0=$SECONDS
wait_exit "${WPIDS[0]}" 30 || { show_logs; die "worker 0 still runs 30 s after worker 1 died"; }
rc=0; wait "${WPIDS[0]}" || rc=$?
[ "$rc" -ne 0 ] || die "worker 0 exited 0 although worker 1 died"
grep -q "worker\[1\].*disconnected without leaving the run" "$TMP/worker0.log" || { show_logs; die "worker 0 does not name worker 1"; }
wait_exit "${SPIDS[0]}" 30 || { show_logs; die "the server still runs 30 s after worker 1 died"; }
src=0; wait "${SPIDS[0]}" || src=$?
[ "$src" -eq 75 ] || { show_logs; die "server exit $src after a worker died, expected 75 (re-form)"; }
grep -q "worker\[1\].*the run is broken; stopping so that it can re-form" "$TMP/server0.log" || { show_logs; die "server 0 does not say why it stopped"; }
echo "ok: SIGKILL to worker 1: worker 0 exited $rc after $((SECONDS - t0)) s: $(grep -m1 "disconnected without" "$TMP/worker0.log" | sed 's/^.* ERROR //')"
echo PASS
