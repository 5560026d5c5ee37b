#!/usr/bin/env bash
# deploy/local/launch.sh passes SIGTERM on (Ctrl-C in a terminal reaches every process of the group directly) and leaves no process behind: a 1-server 2-worker run is
# interrupted once training has started, with worker 1 stopped (SIGSTOP); the launcher must return within 15 s,
# both workers stop in order after a step, and no pfcps daemon of this run may survive it.
source "$(dirname "$0")/cluster.sh" "$@"
run_ini "$TMP/run.ini" 1 2 launcher-secret <<INI
[train]
$ENDLESS_NET
frequent = 1
output = $TMP/out
[data]
$ENDLESS_DATA
INI
export OMP_NUM_THREADS=1
start_launcher "$TMP/run.ini"
wait_log "$TMP/out/logs/worker0.log" "Global Step: 2 " 60 || { cat "$TMP/launch.out"; die "training did not start"; }
# Worker 1 is stopped (SIGSTOP) when the launcher is asked to stop: the launcher continues each daemon it asks
# to stop (SIGTERM, then SIGCONT, as systemd does), so worker 1 too stops in order after its step, rather than
# being killed once the launcher's grace runs out (which also left worker 0 waiting for it in the ring).
w1=$(pgrep -f -- "pfcps-worker --config $TMP/run.ini --rank 1" | head -1)
[ -n "$w1" ] || die "no worker 1 process"
kill -STOP "$w1"
t0=$(date +%s.%N)
kill -TERM "$LP"
wait_exit "$LP" 15 || die "launcher still running 15 s after SIGTERM"
t1=$(date +%s.%N)
sleep 0.5
left=$(pgrep -f "$TMP/run.ini" | wc -l)
[ "$left" -eq 0 ] || { ps aux | grep "$TMP/run.ini" | grep -v grep; die "$left processes left behind"; }
for w in 0 1; do
  grep -q "stop requested" "$TMP/out/logs/worker$w.log" || { tail -5 "$TMP/out/logs/worker$w.log"; die "worker $w did not stop cleanly"; }
done
echo "PASS: launcher returned $(echo "$t1 - $t0" | bc 2>/dev/null || echo '?') s after SIGTERM, no process left, workers stopped after a step"
