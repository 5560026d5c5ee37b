#!/usr/bin/env bash
# deploy/local/launch.sh passes SIGTERM on (Ctrl-C in a terminal reaches every process of the group directly) and leaves no process behind: a 1-server 2-worker run is
# interrupted once training has started; the launcher must return within 15 s and no pfcps daemon of
# this run may survive it.
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
t0=$(date +%s.%N)
kill -TERM "$LP"
wait_exit "$LP" 15 || die "launcher still running 15 s after SIGTERM"
t1=$(date +%s.%N)
sleep 0.5
left=$(pgrep -f "$TMP/run.ini" | wc -l)
[ "$left" -eq 0 ] || { ps aux | grep "$TMP/run.ini" | grep -v grep; die "$left processes left behind"; }
grep -q "stop requested" "$TMP/out/logs/worker0.log" || { tail -5 "$TMP/out/logs/worker0.log"; die "worker 0 did not stop cleanly"; }
echo "PASS: launcher returned $(echo "$t1 - $t0" | bc 2>/dev/null || echo '?') s after SIGTERM, no process left, workers stopped after a step"
