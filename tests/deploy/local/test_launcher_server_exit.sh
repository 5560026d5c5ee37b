#!/usr/bin/env bash
# deploy/local/launch.sh when a server exits before the workers are done (here server 0 refuses to start: a
# shard of 10^12 classes does not fit in any machine's memory): the launcher stops the workers at once and
# fails naming the server, instead of leaving them to wait ctl_timeout (30 s) for a rendezvous that is gone.
# Nothing of this run may be left running.
source "$(dirname "$0")/cluster.sh" "$@"
run_ini "$TMP/run.ini" 2 1 launcher-secret <<INI
[train]
$TINY_BACKBONE
output = $TMP/out
[data]
rec = synthetic
synthetic = varied
num_classes = 1000000000000
INI
export OMP_NUM_THREADS=1
t0=$SECONDS
start_launcher "$TMP/run.ini"
wait_exit "$LP" 20 || { cat "$TMP/launch.out"; die "launcher still running 20 s after server 0 refused to start"; }
rc=0; wait "$LP" || rc=$?
LP=
dt=$((SECONDS - t0))
cat "$TMP/launch.out"
[ "$rc" -ne 0 ] || die "launcher exit 0"
grep -q "launch: server 0 exited with status [1-9][0-9]* before the workers finished" "$TMP/launch.out" || die "the launcher does not name server 0"
grep -q "refusing to start: shard 0/2 needs" "$TMP/out/logs/server0.log" || die "server 0 did not refuse"
left=$(pgrep -f "$TMP/run.ini" | wc -l)
[ "$left" -eq 0 ] || die "$left processes left behind"
echo "PASS: launcher exit $rc after $dt s, nothing left"
