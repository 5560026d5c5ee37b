#!/usr/bin/env bash
# Members start in any order within join_timeout, however short ctl_timeout is (2 s here, the failure
# detector's bound): worker 0 starts 11 s before server 0 (its rendezvous), worker 1 11 s after it. Worker 0
# says every 10 s that it still waits, first for the rendezvous (connection refused), then, in at the
# rendezvous, for the other members; the run then forms and trains to its end (every member exits 0).
# Then a worker whose rendezvous never comes gives up after its join_timeout (2 s here), exit 1, naming it.
source "$(dirname "$0")/cluster.sh" "$@"
export OMP_NUM_THREADS=1
run_ini "$TMP/run.ini" 1 2 order-secret "ctl_timeout = 2" <<INI
[train]
$TINY_NET
output = $TMP/out
[data]
$TINY_DATA
INI
start_daemon "$TMP/worker0.log" "$WORKER" --config "$TMP/run.ini" --rank 0 --max-steps 2
W0=$DPID
wait_log "$TMP/worker0.log" "join: waiting for the rendezvous at 127.0.0.1:$PORT (Connection refused) for 1[0-9] s" 15 ||
  { show_logs; die "worker 0 did not say, 10 s into its join, that it waits for the rendezvous"; }
kill -0 "$W0" 2>/dev/null || { show_logs; die "worker 0 gave up its join before server 0 started"; }
start_daemon "$TMP/server0.log" "$SERVER" --config "$TMP/run.ini" --rank 0
S0=$DPID
wait_log "$TMP/worker0.log" "join: in at the rendezvous, waiting for the other members for 1[0-9] s" 15 ||
  { show_logs; die "worker 0 did not say, 10 s after its join, that it waits for the other members"; }
start_daemon "$TMP/worker1.log" "$WORKER" --config "$TMP/run.ini" --rank 1 --max-steps 2
W1=$DPID
for p in "$W0" "$W1" "$S0"; do
  wait_exit "$p" 120 || { show_logs; die "pid $p still runs 120 s after the last member started"; }
done
rc=0; wait_all "$W0" "$W1" "$S0" || rc=$?
[ "$rc" -eq 0 ] || { show_logs; die "a member exited $rc; want 0 for every member of a run whose members joined in any order"; }
[ -s "$TMP/out/model.ckpt" ] || { show_logs; die "no model.ckpt: the run did not train to its end"; }
echo "ok: worker 0 started 11 s before server 0 and 22 s before worker 1 (ctl_timeout 2 s): the run trained, every member exit 0"

# A rendezvous that never comes: the join gives up after join_timeout (2 s), exit 1, naming it.
t0=$(date +%s.%N)
start_daemon "$TMP/alone.log" "$WORKER" --config "$TMP/run.ini" --rank 0 --set join_timeout=2
wait_exit "$DPID" 20 || { cat "$TMP/alone.log"; die "a worker with join_timeout 2 and no rendezvous still runs after 20 s"; }
rc=0; wait "$DPID" || rc=$?
t1=$(date +%s.%N)
[ "$rc" -eq 1 ] || { cat "$TMP/alone.log"; die "no rendezvous: exit $rc, want 1"; }
grep -q "cannot connect to the rendezvous at 127.0.0.1:$PORT within join_timeout (2 s)" "$TMP/alone.log" ||
  { cat "$TMP/alone.log"; die "no rendezvous: the error does not name join_timeout (2 s)"; }
awk -v a="$t0" -v b="$t1" 'BEGIN { d = b - a; printf "ok: no rendezvous, join_timeout 2 s: exit 1 after %.2f s\n", d; exit !(d >= 1.9) }' ||
  die "no rendezvous: gave up before join_timeout (2 s)"
echo PASS
