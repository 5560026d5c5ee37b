#!/usr/bin/env bash
# No orphans: after SIGKILL of the launcher, or of server 0 (the rendezvous), no pfcps process of the run is left
# after a bounded wait (15 s), each having said why it stopped.
#   1. launch.sh on an endless run, kill -9 of the launcher: the daemons get SIGTERM (PR_SET_PDEATHSIG) and stop.
#   2. daemons started by hand, kill -9 of server 0: the others lose the rendezvous and exit 75 (re-form).
source "$(dirname "$0")/cluster.sh" "$@"
export OMP_NUM_THREADS=1
run_ini "$TMP/run.ini" 2 2 orphan-secret <<INI
[train]
$ENDLESS_NET
output = $TMP/out
[data]
$ENDLESS_DATA
INI
# alive: pfcps processes of this test's config.
alive() { pgrep -f "pfcps-(server|worker) --config $TMP/run.ini" | wc -l; }
gone_within() {
  local i
  for ((i = 0; i < $1 * 10; i++)); do [ "$(alive)" -eq 0 ] && return 0; sleep 0.1; done
  return 1
}
start_launcher "$TMP/run.ini"
wait_log "$TMP/out/logs/worker0.log" "Global Step" 60 || { cat "$TMP/launch.out"; die "launcher: training did not start"; }
kill -KILL "$LP"
t0=$SECONDS
gone_within 15 || { pgrep -af "$TMP/run.ini"; tail -3 "$TMP"/out/logs/*.log; die "$(alive) daemons alive 15 s after the launcher was killed"; }
LP=
grep -q "stop" "$TMP/out/logs/server0.log" || die "server 0 did not log its stop"
echo "ok: launcher killed: every daemon gone after $((SECONDS - t0)) s"

rm -rf "$TMP/out"
start_cluster "$TMP/run.ini" 2 2 --trace "$TMP/trace{r}"
wait_trace "$TMP/trace0" 2 "manual: training did not start"
kill -KILL "${SPIDS[0]}"
t0=$SECONDS
gone_within 15 || { pgrep -af "$TMP/run.ini"; show_logs; die "$(alive) daemons alive 15 s after server 0 was killed"; }
src=0; wait "${SPIDS[1]}" || src=$?
[ "$src" -eq 75 ] || { show_logs; die "server 1 exit $src after losing the rendezvous (want 75)"; }
grep -q "control connection to the rendezvous lost" "$TMP/server1.log" || die "server 1 does not say it lost the rendezvous"
echo "ok: server 0 killed: every other daemon gone after $((SECONDS - t0)) s (server 1 exit $src)"
echo PASS
