#!/usr/bin/env bash
# A worker that gets SIGTERM/SIGINT while the run is still forming stops at once with exit 0 (a normal
# stop, as the servers do: tests/server ps_mp_forming), instead of waiting out join_timeout (60 s here):
#   A: nothing listens at the rendezvous yet (the worker keeps retrying the join): SIGTERM;
#   B: server 0 is up and the worker has joined, the second worker never comes: SIGINT to the worker,
#      then the server is stopped with SIGTERM (exit 0 as well).
source "$(dirname "$0")/cluster.sh" "$@"
run_ini "$TMP/run.ini" 1 2 forming-secret "join_timeout = 60" <<INI
[train]
$TINY_NET
output = $TMP/out
[data]
$TINY_DATA
INI
# stop_within SIG PID LOG SECONDS: signals PID, which must exit 0 within SECONDS; prints the time taken.
stop_within() {
  local sig=$1 pid=$2 log=$3 lim=$4 t0 t1 rc=0
  t0=$(date +%s.%N)
  kill -"$sig" "$pid"
  wait_exit "$pid" "$lim" || { tail -5 "$log"; die "pid $pid still running ${lim} s after SIG$sig"; }
  wait "$pid" || rc=$?
  t1=$(date +%s.%N)
  [ "$rc" -eq 0 ] || { tail -5 "$log"; die "exit $rc after SIG$sig, expected 0"; }
  grep -q "stopped before the run formed" "$log" || { tail -5 "$log"; die "no 'stopped before the run formed' in $log"; }
  awk -v a="$t0" -v b="$t1" -v s="$sig" 'BEGIN { printf "exit 0 %.2f s after SIG%s\n", b - a, s }'
}

# A: no rendezvous.
start_daemon "$TMP/workerA.log" "$WORKER" --config "$TMP/run.ini" --rank 0
W=$DPID
wait_log "$TMP/workerA.log" "joining the run" 10
sleep 0.5
echo -n "A (no rendezvous yet): worker "; stop_within TERM "$W" "$TMP/workerA.log" 2

# B: server 0 up, worker 0 joined, worker 1 never comes.
start_daemon "$TMP/server.log" "$SERVER" --config "$TMP/run.ini" --rank 0
S=$DPID
start_daemon "$TMP/workerB.log" "$WORKER" --config "$TMP/run.ini" --rank 0
W=$DPID
wait_log "$TMP/workerB.log" "joining the run" 10
sleep 1
echo -n "B (joined, run incomplete): worker "; stop_within INT "$W" "$TMP/workerB.log" 2
echo -n "B: server "; stop_within TERM "$S" "$TMP/server.log" 2
echo PASS
