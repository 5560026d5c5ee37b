#!/usr/bin/env bash
# Durable training: kill -9 of a member at a random moment loses nothing beyond the last checkpoint.
# A reference run (2 servers + 2 workers on 10 ORL identities, snapshot_every 4) trains uninterrupted. Then:
#   launcher cases: `launch.sh --max-restarts 2`, kill -9 of server 0 (the rendezvous), of server 1 and of
#     worker 1 after a random number of checkpoints; the launcher restarts every member with resume = true;
#     in server 1's case the folder also holds another run's checkpoints (the reference's, to its last step):
#     the restart resumes this launch's run (resume_run), not the folder's newest checkpoint;
#     after the worker's kill the restarted run resumes within 10 s (the rendezvous' report ends the surviving
#     worker's wait in the ring collective at once; its grace for the step in progress is 10 s);
#   self-restart case: no launcher; every daemon runs under its own supervisor loop that restarts it when it
#     exits non-zero (what Kubernetes' restartPolicy and systemd's Restart=on-failure do), with resume = true
#     from the start; kill -9 of server 1: the restarted member rejoins, the run re-forms and resumes.
# Each run must end with exit 0, a model.ckpt byte-identical to the reference and a final checkpoint whose
# `pfcps ckpt-info` table and backbone SHA-256 equal the reference's (the table hash is computed by
# ckpt-info from the shard files in class order, independently of the daemons' own checksums).
source "$(dirname "$0")/cluster.sh" "$@"
export OMP_NUM_THREADS=1 PFCPS_SECRET=recovery-secret
pack_orl 10

# write_cfg NAME [LINE...]: $TMP/NAME.ini (cluster.sh ckpt_ini: 6 epochs, 2 + 2, keep 2; a table of 40 classes
# for the 10 identities, sampled at 0.25, so that under pfc_update = dense (the default) most rows move by the
# closed form of the steps they skipped, and the byte-identity below covers it).
write_cfg() {
  local name=$1; shift
  ckpt_ini "$name" 6 2 2 2 40 "sample_rate = 0.25" "$@"
}

# final_line DIR: the newest complete checkpoint's ckpt-info line without its size.
final_line() {
  local step
  step=$("$PFCPS" ckpt-info --newest "$1")
  "$PFCPS" ckpt-info "$1" | grep "^step $step: complete" | sed 's/  [0-9.]* MB//'
}

write_cfg ref
"$SRC/deploy/local/launch.sh" -b "$BUILD" -c "$TMP/ref.ini" >"$TMP/ref.out" 2>&1 || { tail -30 "$TMP/ref.out"; die "reference run"; }
REF=$(final_line "$TMP/ref")
TOTAL=$(echo "$REF" | sed -n 's/^step \([0-9]*\):.*/\1/p')
[ -n "$REF" ] && [ "${TOTAL:-0}" -ge 20 ] || die "reference: no final checkpoint ($REF)"
echo "reference: $REF"

# wait_ckpt DIR MIN SECONDS: waits until a complete checkpoint >= MIN exists.
wait_ckpt() {
  local i s
  for ((i = 0; i < $3 * 5; i++)); do
    s=$("$PFCPS" ckpt-info --newest "$1" 2>/dev/null || echo 0)
    [ "${s:-0}" -ge "$2" ] && return 0
    sleep 0.2
  done
  return 1
}

# check_same NAME: model.ckpt and the final checkpoint equal the reference's.
check_same() {
  cmp -s "$TMP/ref/model.ckpt" "$TMP/$1/model.ckpt" || die "$1: model.ckpt differs from the uninterrupted run"
  local got
  got=$(final_line "$TMP/$1")
  [ "$got" = "$REF" ] || die "$1: final checkpoint '$got' differs from the reference '$REF'"
}

RANDOM=$$
for victim in "server --rank 0" "server --rank 1" "worker --rank 1"; do
  name=kill_$(echo "$victim" | tr -dc 'a-z0-9')
  write_cfg "$name"
  if [ "$victim" = "server --rank 1" ]; then
    # Another run's checkpoints in the folder (the reference's: same config, other run id, up to the last step):
    # the restart resumes this launch's run (resume_run), not the folder's newest checkpoint.
    mkdir -p "$TMP/$name" && cp -r "$TMP/ref/snapshots" "$TMP/$name/"
  fi
  setsid "$SRC/deploy/local/launch.sh" -b "$BUILD" --max-restarts 2 -c "$TMP/$name.ini" >"$TMP/$name.out" 2>&1 &
  LP=$!
  at=$((4 * (1 + RANDOM % 3)))
  # This run's checkpoint $at, seen in every member's log (within 0.1 s of its write: the run takes a few
  # seconds in all, and a poll of ckpt-info could see the checkpoint only steps later; the server 1 case's folder
  # also lists the other run's steps from the start), then a random moment within the next few steps.
  for m in server0 server1 worker0 worker1; do
    wait_log "$TMP/$name/logs/$m.log" "snapshot step $at written\|checkpoint step $at: worker state written" 120 ||
      { tail -20 "$TMP/$name.out"; die "$name: no checkpoint $at from $m"; }
  done
  sleep "0.$((RANDOM % 4))"
  role=${victim%% *}
  pid=$(pgrep -f "pfcps-$role --config $TMP/$name.ini ${victim#* }" | head -1)
  [ -n "$pid" ] || die "$name: $victim not found"
  t_kill=$(date +%s.%N)
  kill -KILL "$pid"
  rc=0; wait "$LP" || rc=$?
  LP=
  [ "$rc" -eq 0 ] || { tail -30 "$TMP/$name.out"; die "$name: launcher exit $rc"; }
  if [ "$role" = worker ]; then
    # The surviving worker, waiting for the dead one in a ring collective, gives up as soon as the rendezvous
    # reports the loss (the fabric interrupt), not after its 10 s grace for the step in progress: the
    # restarted run resumes within 10 s of the kill (with the grace it could not: the launcher restarts once
    # every member exited).
    ! grep -q "did not finish within" "$TMP/$name/logs/worker0.log" ||
      die "$name: worker 0 waited out its grace for a step that could not finish"
    line=$(grep "resuming at checkpoint step" "$TMP/$name/logs/worker0.log" | head -1) ||
      die "$name: the restarted worker 0 did not resume"
    dt=$(python3 -c "import datetime as d, sys; t = d.datetime.strptime(sys.argv[1][:23], '%Y-%m-%dT%H:%M:%S.%f')
print(f'{t.replace(tzinfo=d.timezone.utc).timestamp() - float(sys.argv[2]):.2f}')" "$line" "$t_kill")
    python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < 10 else 1)" "$dt" ||
      die "$name: the restarted run resumed $dt s after the kill (the loss should end the survivor's waits at once)"
    echo "ok: the restarted run resumed $dt s after the kill of worker 1"
  fi
  grep -q "restart 1/2 .* from checkpoint step [1-9]" "$TMP/$name.out" || { cat "$TMP/$name.out"; die "$name: no restart line"; }
  # The line names the killed daemon, not a member that exited 75 when told to re-form.
  grep -q "restart 1/2 after $role ${victim##* } (status 137" "$TMP/$name.out" ||
    { cat "$TMP/$name.out"; die "$name: the restart line does not name $role ${victim##* } (killed, status 137) as the cause"; }
  if [ "$victim" = "server --rank 1" ]; then
    run=$(grep -o "run id [0-9a-f]\{32\} (new" "$TMP/$name/logs/server0.log" | head -1 | awk '{print $3}')
    from=$(sed -n 's/.*restart 1\/2 .* from checkpoint step \([0-9]*\).*/\1/p' "$TMP/$name.out")
    grep -q "restart 1/2 .*resume_run = $run (this launch's run)" "$TMP/$name.out" && [ -n "$run" ] &&
      [ "${from:-0}" -lt "$TOTAL" ] ||
      { cat "$TMP/$name.out"; die "$name: the restart did not resume this launch's run ${run:-?} (from step ${from:-?}; the other run's checkpoints reach $TOTAL)"; }
    echo "ok: with another run's checkpoints in the folder (to step $TOTAL), the restart resumed this launch's run $run from step $from"
  fi
  check_same "$name"
  echo "ok: kill -9 of $victim after checkpoint $at: $(grep -m1 'restart 1/2' "$TMP/$name.out" | sed 's/^launch: //'); result identical"
done

# No restart left: kill -9 of server 1 under a launch without --max-restarts fails the launch, and its last line
# names the killed server as the cause (the others exit 75 when told to re-form).
write_cfg norestart
setsid "$SRC/deploy/local/launch.sh" -b "$BUILD" -c "$TMP/norestart.ini" >"$TMP/norestart.out" 2>&1 &
LP=$!
wait_log "$TMP/norestart/logs/server1.log" "snapshot step 4 written" 120 ||
  { tail -20 "$TMP/norestart.out"; die "norestart: no checkpoint 4"; }
pid=$(pgrep -f "pfcps-server --config $TMP/norestart.ini --rank 1" | head -1)
[ -n "$pid" ] || die "norestart: server 1 not found"
kill -KILL "$pid"
rc=0; wait "$LP" || rc=$?
LP=
[ "$rc" -ne 0 ] || die "norestart: the launch exited 0 after server 1 was killed"
grep -q "launch: failed with status $rc (the cause: server 1 (status 137" "$TMP/norestart.out" ||
  { cat "$TMP/norestart.out"; die "norestart: the launch's last line does not name server 1 (status 137) as the cause"; }
echo "ok: without restarts, $(grep -m1 "^launch: failed with status" "$TMP/norestart.out" | sed 's/^launch: //')"

# Self-restart: every daemon under its own supervisor (restart on non-zero exit, at most 5 times).
write_cfg self "resume = true"
supervise() {
  local n=0 rc tag
  tag=$(basename "$1")-$5
  while :; do
    "$@" >>"$TMP/self.$tag.log" 2>&1
    rc=$?
    [ "$rc" -eq 0 ] && return 0
    n=$((n + 1))
    echo "supervisor: $tag exited $rc; restart $n" >>"$TMP/self.sup.log"
    [ "$n" -ge 5 ] && return "$rc"
    sleep 0.5
  done
}
SUP=()
for r in 0 1; do
  supervise "$SERVER" --config "$TMP/self.ini" --rank "$r" &
  SUP+=($!); PIDS+=($!)
done
for r in 0 1; do
  supervise "$WORKER" --config "$TMP/self.ini" --rank "$r" &
  SUP+=($!); PIDS+=($!)
done
wait_ckpt "$TMP/self" 8 120 || die "self: no checkpoint 8"
pid=$(pgrep -f "pfcps-server --config $TMP/self.ini --rank 1" | head -1)
kill -KILL "$pid"
# The workers finish; then the servers are stopped as an operator (or the launcher) does.
wait_all "${SUP[2]}" "${SUP[3]}" || { tail -20 "$TMP"/self.*.log; die "self: a worker's supervisor gave up"; }
for r in 0 1; do pkill -TERM -f "pfcps-server --config $TMP/self.ini --rank $r"; done
wait_all "${SUP[0]}" "${SUP[1]}" || { tail -20 "$TMP"/self.*.log; die "self: a server did not stop with 0"; }
grep -q "server\[1\].*\(disconnected without leaving\|joined again\)" "$TMP/self.pfcps-server-0.log" ||
  die "self: server 0 did not see server 1's loss"
grep -q "resuming at checkpoint step [1-9]" "$TMP/self.pfcps-worker-0.log" || die "self: worker 0 did not resume"
check_same self
echo "ok: self-restarting members after kill -9 of server 1: $(grep -c restart "$TMP/self.sup.log") restarts; result identical"
echo PASS
