#!/usr/bin/env bash
# A run that never forms (server 1 is never started): server 0's own join times out after join_timeout and it
# exits 1, naming the member that never joined; the worker that did join must exit 1 as well, not 0 as after
# an orderly stop ("stopped before the run formed"): a scheduler must not see a worker succeed in a run that
# never trained.
source "$(dirname "$0")/cluster.sh" "$@"
export OMP_NUM_THREADS=1
run_ini "$TMP/run.ini" 2 1 form-secret "join_timeout = 3" <<INI
[train]
$TINY_BACKBONE
output = $TMP/out
[data]
rec = synthetic
synthetic = varied
num_classes = 4
INI
start_cluster "$TMP/run.ini" 1 1 # server 0 and worker 0 only
rc_w=0; wait "${WPIDS[0]}" || rc_w=$?
rc_s=0; wait "${SPIDS[0]}" || rc_s=$?
echo "worker exit $rc_w: $(grep -m1 ERROR "$TMP/worker0.log" | sed 's/^.* ERROR //')"
echo "server 0 exit $rc_s: $(grep -m1 'never joined' "$TMP/server0.log" | sed 's/^.* WARN //')"
[ "$rc_s" -eq 1 ] || { show_logs; die "server 0 exited $rc_s, want 1"; }
[ "$rc_w" -eq 1 ] || { show_logs; die "the worker exited $rc_w for a run that never formed, want 1"; }
grep -q "the run did not form: 1 of 3 members never joined: server\[1\]$" "$TMP/server0.log" ||
  { show_logs; die "server 0 does not name server[1] as never joined"; }
echo PASS
