#!/usr/bin/env bash
# deploy/local/launch.sh when a server exits before the workers are done (here server 0 refuses to start: a
# shard of 10^12 classes does not fit in any machine's memory): the launcher stops the workers at once and
# fails naming the server, instead of leaving them to wait ctl_timeout (30 s) for a rendezvous that is gone.
# Nothing of this run may be left running.
# Then with replicas = 1: server 1 killed (-9) before the run formed, without --max-restarts. There is nothing
# to fail over to yet (the rendezvous would wait join_timeout for it), so the launcher must stop the others at
# once and fail naming server 1, not report that the run goes on with its backups. (When the run formed before
# the kill landed, the try is repeated, 3 tries at most.)
# Last, replicas = 1 under --max-restarts 3: both workers killed at once. launch.sh starts each again alone (a
# worker lost in place), the rendezvous falls back to the re-form (two workers lost), and the restart of the
# whole run must name those losses as its cause, not only the member that exited 75 to re-form.
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

run_ini "$TMP/rep.ini" 2 1 launcher-secret "replicas = 1" <<INI
[train]
$TINY_BACKBONE
output = $TMP/rep
[data]
rec = synthetic
synthetic = varied
num_classes = 20
INI
decided=0
for try in 1 2 3; do
  rm -rf "$TMP/rep"
  start_launcher "$TMP/rep.ini"
  victim=
  for ((i = 0; i < 2000 && ${#victim} == 0; i++)); do
    victim=$(pgrep -f "pfcps-server --config $TMP/rep.ini --rank 1" | head -n 1)
    [ -n "$victim" ] || sleep 0.005
  done
  [ -n "$victim" ] || { cat "$TMP/launch.out"; die "server 1 of the replicas run did not start"; }
  kill -9 "$victim"
  formed=0
  wait_exit "$LP" 20 || formed=1
  if grep -aq "; run id [0-9a-f]\{32\}" "$TMP/rep/logs/server0.log" 2>/dev/null; then
    echo "try $try: the run formed before server 1 was killed; again"
    kill -TERM "$LP" 2>/dev/null; wait_exit "$LP" 30; wait "$LP" 2>/dev/null; LP=
    continue
  fi
  [ "$formed" -eq 0 ] || { cat "$TMP/launch.out"; die "launcher still running 20 s after server 1 died before the run formed"; }
  rc=0; wait "$LP" || rc=$?
  LP=
  cat "$TMP/launch.out"
  [ "$rc" -ne 0 ] || die "replicas = 1, server 1 lost before the run formed: launcher exit 0"
  grep -q "launch: server 1 exited with status 137 before the run formed" "$TMP/launch.out" ||
    die "the launcher does not say that server 1 died before the run formed"
  ! grep -q "the run goes on" "$TMP/launch.out" || die "the launcher said the run goes on"
  left=$(pgrep -f "$TMP/rep.ini" | wc -l)
  [ "$left" -eq 0 ] || die "$left processes left behind"
  echo "PASS: replicas = 1, server 1 killed before the run formed: launcher exit $rc, nothing left"
  decided=1
  break
done
[ "$decided" -eq 1 ] || die "the run formed before the kill in 3 of 3 tries: the case was not tested"

run_ini "$TMP/two.ini" 2 2 launcher-secret "replicas = 1" <<INI
[train]
$TINY_NET
num_epoch = 10
output = $TMP/two
[data]
rec = synthetic
synthetic = varied
num_classes = 10
num_image = 80
[server]
snapshot_every = 2
INI
setsid "$SRC/deploy/local/launch.sh" -c "$TMP/two.ini" -b "$BUILD" --max-restarts 3 >"$TMP/two.out" 2>&1 &
LP=$!
wait_log "$TMP/two/logs/worker0.log" "checkpoint step 6: worker state written" 120 ||
  { cat "$TMP/two.out"; die "two workers: worker 0 did not reach step 6"; }
pkill -KILL -f "pfcps-worker --config $TMP/two.ini"
wait_exit "$LP" 120 || { cat "$TMP/two.out"; die "two workers: the launcher still runs 120 s after the kill"; }
rc=0; wait "$LP" || rc=$?
LP=
cat "$TMP/two.out"
grep -Eq "restart 3/3 after .* \(status 75: the run re-forms after the loss of worker [01] \(status 137\), worker [01] \(status 137\)\)" "$TMP/two.out" ||
  die "two workers: the re-form's restart does not name the two workers lost"
[ "$rc" -eq 0 ] || die "two workers: the re-formed run did not end in order (launcher exit $rc)"
echo "PASS: both workers killed: the re-form's restart names them (launcher exit $rc)"
