#!/usr/bin/env bash
# A run that never forms (server 1 is never started): server 0's own join times out after join_timeout and it
# exits 1, naming the member that never joined; the worker that did join must exit 1 as well, not 0 as after
# an orderly stop ("stopped before the run formed"): a scheduler must not see a worker succeed in a run that
# never trained.
# Then replicas = 1 with server 0 alone: nobody else joins or resumes there, which is also how a server 0 started
# again after its loss ends when its run finished without it; the line says both, naming the members.
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

sed -i 's/^\[cluster\]$/[cluster]\nreplicas = 1/' "$TMP/run.ini"
rm -f "$TMP"/*.log
start_cluster "$TMP/run.ini" 1 0 # server 0 alone
rc_s=0; wait "${SPIDS[0]}" || rc_s=$?
echo "replicas = 1, server 0 alone: exit $rc_s: $(grep -m1 'did not form' "$TMP/server0.log" | sed 's/^.* WARN //')"
[ "$rc_s" -eq 1 ] || { show_logs; die "replicas = 1: server 0 exited $rc_s, want 1"; }
grep -q "the run did not form here: no other member joined or resumed (server\[1\], worker\[0\]); with replicas = 1 .* ended, or re-formed, without it$" \
  "$TMP/server0.log" || { show_logs; die "replicas = 1: server 0 does not say that no other member came"; }
echo PASS
