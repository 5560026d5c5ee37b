#!/usr/bin/env bash
# Disk full while writing a checkpoint: the failure is logged naming the file, training goes on,
# the previous checkpoint stays complete and a resume from it works; nothing half-written is left as a
# temp file. snapshot_dir is a small tmpfs (root needed: exit 77, skipped, where it cannot be mounted) on
# which the first checkpoint (step 4) fits and no later one does. 2 servers + 2 workers train 12 steps on
# 10 ORL identities, snapshot_every 4, snapshot_keep 2 (the default):
#   big table (num_classes = 20000: two 2.6 MB shard files, two 2.2 MB worker pairs; tmpfs 13 MiB): after
#     step 4 (9.6 MB) neither both shard files nor both worker pairs of a later step fit, so at least one
#     server and one worker must log "No space left on device" naming its file; the run exits 0, step 4 is
#     complete in `pfcps ckpt-info` with the digests it had, and a resume (snapshots still on the full tmpfs)
#     says "resuming at checkpoint step 4", exits 0 and ends with the first run's model.ckpt;
#   small table (num_classes = 10: shard files of 5 KB, which always fit; tmpfs 7 MiB): only the workers'
#     pairs of steps 8 and 12 fail; the servers write their shards of 8 and 12 whole. Checkpoint 4 is then
#     still the newest complete one and must survive snapshot_keep = 2 pruning, and a resume from it works;
#     the launcher warns "2 of 3 checkpoint steps failed on some member (step 8: worker 0, worker 1; step 12:
#     ...); newest step every member wrote: 4" (the workers that ran out of space named). Then the tmpfs grows to 64 MiB and a resume with
#     snapshot_every = 6 writes checkpoints 6 and 12 whole: its prune removes the shard files the failed
#     checkpoint 8 left (incomplete and older than a complete checkpoint) and checkpoint 4 (beyond
#     snapshot_keep), and the launcher warns of nothing.
source "$(dirname "$0")/cluster.sh" "$@"
# The tmpfs sizes above are those of r18_w8's files (ORL_NET), not of the checkpoint tests' smaller r18_w2.
CKPT_NET=$ORL_NET
export OMP_NUM_THREADS=1 PFCPS_SECRET=disk-full-secret
MNT=$TMP/mnt
mkdir -p "$MNT"
cleanup_mnt() {
  mountpoint -q "$MNT" 2>/dev/null && umount -l "$MNT"
  cleanup
}
trap cleanup_mnt EXIT

# mount_tmpfs SIZE: a fresh tmpfs of SIZE on $MNT (exit 77 where mounting is not allowed).
mount_tmpfs() {
  mountpoint -q "$MNT" && { umount "$MNT" || die "umount $MNT"; }
  mount -t tmpfs -o "size=$1" none "$MNT" 2>"$TMP/mount.err" ||
    skip "cannot mount a tmpfs on $MNT: $(cat "$TMP/mount.err") (needs root / CAP_SYS_ADMIN)"
}
pack_orl 10

# write_cfg NAME CLASSES [LINE...]: $TMP/NAME.ini, output $TMP/NAME, checkpoints on $MNT.
write_cfg() {
  local name=$1 classes=$2; shift 2
  ckpt_ini "$name" 2 2 2 2 "$classes" "snapshot_dir = $MNT" "$@"
}

# launch NAME: deploy/local/launch.sh on $TMP/NAME.ini; it must exit 0.
launch() {
  "$SRC/deploy/local/launch.sh" -b "$BUILD" -c "$TMP/$1.ini" >"$TMP/$1.out" 2>&1 ||
    { tail -30 "$TMP/$1.out"; "$PFCPS" ckpt-info "$MNT"; df -k "$MNT"; die "$1: the launcher failed"; }
  grep -q "training done: 12 of 12 steps" "$TMP/$1/logs/worker0.log" || die "$1: training did not reach step 12"
}

# hashes STEP: "table <sha> backbone <sha>" of checkpoint STEP on $MNT when ckpt-info says it is complete.
hashes() {
  "$PFCPS" ckpt-info "$MNT" | sed -n "s/^step $1: complete .*\(table [0-9a-f]\{64\}  backbone [0-9a-f]\{64\}\).*/\1/p"
}

# step4 NAME: checkpoint 4 is complete, with the digests $H4 (read after the first run), and the newest complete.
step4() {
  local n
  [ -n "$H4" ] && [ "$(hashes 4)" = "$H4" ] ||
    { "$PFCPS" ckpt-info "$MNT"; find "$MNT" -type f | sort; die "$1: checkpoint 4 is no longer complete (or changed) after the failed writes"; }
  n=$("$PFCPS" ckpt-info --newest "$MNT")
  [ "$n" = 4 ] || die "$1: ckpt-info --newest says $n, expected 4"
}

# no_tmp NAME: no temp file of a failed write is left on $MNT.
no_tmp() {
  local left
  left=$(find "$MNT" -name '*.tmp')
  [ -z "$left" ] || die "$1: temp files left after the failed writes: $left"
}

# failed_writes NAME ROLE PATTERN: the count of ROLE logs (server|worker) with a line matching PATTERN.
failed_writes() {
  local n=0 f
  for f in "$TMP/$1/logs/$2"[01].log; do grep -Eq "$3" "$f" && n=$((n + 1)); done
  echo "$n"
}

# resume NAME FROM CLASSES: a resume from $MNT (output $TMP/NAME, num_classes CLASSES as run FROM): exit 0,
# both workers resume at step 4, and the result equals run FROM's (model.ckpt).
resume() {
  write_cfg "$1" "$3" "resume = true"
  launch "$1"
  for w in 0 1; do
    grep -q "resuming at checkpoint step 4 " "$TMP/$1/logs/worker$w.log" ||
      { tail -20 "$TMP/$1/logs/worker$w.log"; die "$1: worker $w did not resume at step 4"; }
  done
  cmp -s "$TMP/$2/model.ckpt" "$TMP/$1/model.ckpt" || die "$1: model.ckpt differs from the run's it resumed"
}

SERVER_FAIL="snapshot step (8|12) failed: .*$MNT/step-(8|12)/shard-[01]-of-2\.snap[^ ]*: write failed: No space left on device"
WORKER_FAIL="checkpoint step (8|12): this worker's state not written: .*$MNT/step-(8|12)/worker-[01]-of-2\.(snap|model)[^ ]*: write failed: No space left on device"

# --- big table: servers and workers run out of space -------------------------------------------------------
mount_tmpfs 13m
write_cfg big 20000
launch big
H4=$(hashes 4)
[ -n "$H4" ] || { "$PFCPS" ckpt-info "$MNT"; die "big: checkpoint 4 not complete (the tmpfs should hold it)"; }
used4=$(du -sb "$MNT/step-4" | cut -f1)
total=$(df -B1 --output=size "$MNT" | tail -1)
[ "$used4" -lt "$total" ] && [ $((2 * used4)) -gt "$total" ] || die "big: sizing: checkpoint 4 is $used4 bytes on a tmpfs of $total"
ns=$(failed_writes big server "$SERVER_FAIL")
nw=$(failed_writes big worker "$WORKER_FAIL")
[ "$ns" -ge 1 ] && [ "$nw" -ge 1 ] ||
  { grep -h "ERROR" "$TMP"/big/logs/*.log; die "big: expected a server and a worker to log 'No space left on device' naming the file ($ns servers, $nw workers did)"; }
! grep -q "step 4.*\(failed\|not written\)" "$TMP"/big/logs/*.log || die "big: checkpoint 4 failed although it fits"
step4 big
no_tmp big
expect_grep "big: the launcher warns of the failed checkpoints" \
  "^launch: WARNING: checkpoints: 2 of 3 checkpoint steps failed on some member \(step 8: .*; step 12: .*\); newest step every member wrote: 4 " \
  "$TMP/big.out"
echo "ok: big table: $ns server(s) and $nw worker(s) logged the full disk, e.g. $(grep -Eho "$SERVER_FAIL" "$TMP"/big/logs/server*.log | head -1 | sed "s#$MNT#MNT#")"
resume big_resume big 20000
step4 big_resume
no_tmp big_resume
echo "ok: big table: resumed at step 4 from the full tmpfs; model.ckpt equals the first run's"

# --- small table: only the workers' pairs fail; checkpoint 4 must survive pruning --------------------------
mount_tmpfs 7m
write_cfg small 10
launch small
H4=$(hashes 4)
nw=$(failed_writes small worker "$WORKER_FAIL")
[ "$nw" -eq 2 ] || { grep -h "ERROR" "$TMP"/small/logs/*.log; die "small: expected both workers to log 'No space left on device' naming the file ($nw did)"; }
for r in 0 1; do
  grep -q "snapshot step 4 written" "$TMP/small/logs/server$r.log" || die "small: server $r did not write checkpoint 4"
done
no_tmp small
# (H4 is empty when checkpoint 4 is no longer complete: step4 then fails, listing what is left.)
if [ -z "$H4" ] && grep -q "snapshot step 4: pruned" "$TMP"/small/logs/server*.log; then
  "$PFCPS" ckpt-info "$MNT"
  die "small: the servers pruned their shard files of checkpoint 4 (snapshot_keep = 2: they hold 8 and 12) although the workers' writes of 8 and 12 failed: no complete checkpoint is left"
fi
step4 small
echo "ok: small table: both workers logged the full disk; checkpoint 4 survived snapshot_keep = 2"
expect_grep "small: the launcher warns of the failed checkpoints" \
  "^launch: WARNING: checkpoints: 2 of 3 checkpoint steps failed on some member \(step 8: worker [01](, worker 1)?; step 12: worker [01](, worker 1)?\); newest step every member wrote: 4 " \
  "$TMP/small.out" || grep -i "warning" "$TMP/small.out"
resume small_resume small 10
step4 small_resume
echo "ok: small table: resumed at step 4"

# --- room again: the next complete checkpoint prunes what the failed ones left --------------------------------
[ -f "$MNT/step-8/shard-0-of-2.snap" ] || die "small: the shard files of the failed checkpoint 8 are not there to be pruned"
mount -o remount,size=64m "$MNT" || die "remount $MNT"
write_cfg pruned 10 "resume = true" "snapshot_every = 6"
launch pruned
grep -q "resuming at checkpoint step 4 " "$TMP/pruned/logs/worker0.log" || die "pruned: did not resume at step 4"
expect_grep "pruned: the failed checkpoint 8 pruned" \
  "checkpoint step 8: pruned \(every member's files, snapshot_keep = 2, incomplete and older than a complete checkpoint\)" \
  <(cat "$TMP"/pruned/logs/*.log)
left=$(cd "$MNT" && find . -type f | sort | tr '\n' ' ')
expect_eq "pruned: only checkpoints 6 and 12 left" "$left" \
  "./step-12/shard-0-of-2.snap ./step-12/shard-1-of-2.snap ./step-12/worker-0-of-2.model ./step-12/worker-0-of-2.snap ./step-12/worker-1-of-2.model ./step-12/worker-1-of-2.snap ./step-6/shard-0-of-2.snap ./step-6/shard-1-of-2.snap ./step-6/worker-0-of-2.model ./step-6/worker-0-of-2.snap ./step-6/worker-1-of-2.model ./step-6/worker-1-of-2.snap "
if grep -q "WARNING: checkpoints" "$TMP/pruned.out"; then fail "pruned: the launcher warns of failed checkpoints"; else ok "pruned: no warning"; fi
expect_summary
