#!/usr/bin/env bash
# Bad checkpoint files: a damaged, truncated or missing member file is refused with a message
# naming the file and the problem, never loaded; resume = true then picks the newest checkpoint that is
# complete on every member, or says there is none and starts from scratch.
# A run (2 servers + 2 workers, 10 ORL identities, 12 steps, snapshot_every 4, snapshot_keep 2) leaves
# checkpoints 8 and 12. Each case damages a copy of them and resumes from it under the launcher:
#   newest:  one payload byte of step 12's shard-1-of-2.snap flipped: every server names the file and
#            "checksum mismatch", the rendezvous says step 12 was skipped, the workers resume at step 8;
#   both:    that, and step 8's worker-1-of-2.snap truncated: worker 1 names the file and "truncated", the
#            rendezvous says no checkpoint is complete on all members and the run starts from scratch;
#   missing: step 12's shard-0-of-2.snap deleted: the servers name the missing file, resume at step 8;
#   model:   one byte of step 12's worker-0-of-2.model flipped: worker 0 names the file, resume at step 8.
# Every resumed run must exit 0 and, since a resume is exact and a fresh start is seeded, end with a
# model.ckpt and a checkpoint 12 (ckpt-info table and backbone SHA-256) equal to the undamaged run's.
# `pfcps ckpt-info` must show each damaged step INCOMPLETE with the file and the problem, and --newest the
# step a resume uses.
source "$(dirname "$0")/cluster.sh" "$@"
export OMP_NUM_THREADS=1 PFCPS_SECRET=bad-ckpt-secret
pack_orl 10

# write_cfg NAME [LINE...]: $TMP/NAME.ini (cluster.sh ckpt_ini: 2 epochs, 2 + 2, keep 2, 10 classes).
write_cfg() {
  local name=$1; shift
  ckpt_ini "$name" 2 2 2 2 10 "$@"
}

# flip FILE: flips the low bit of the byte in the middle of FILE's payload (after the 4096-byte header area).
flip() {
  python3 - "$1" <<'PY' || die "flip $1"
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
off = 4096 + (len(b) - 4096) // 2 if len(b) > 4096 else len(b) // 2
b[off] ^= 1
open(p, "wb").write(b)
PY
}

# info_has NAME PATTERN WHAT: ckpt-info of $TMP/NAME must have a line matching PATTERN (grep -E).
info_has() {
  "$PFCPS" ckpt-info "$TMP/$1" | grep -Eq "$2" || { "$PFCPS" ckpt-info "$TMP/$1"; die "$1: ckpt-info: $3"; }
}

# newest_is NAME STEP: ckpt-info --newest says STEP.
newest_is() {
  local n
  n=$("$PFCPS" ckpt-info --newest "$TMP/$1")
  [ "$n" = "$2" ] || die "$1: ckpt-info --newest says '$n', expected $2"
}

# log_has NAME LOG PATTERN WHAT: $TMP/NAME/logs/LOG.log has a line matching PATTERN (grep -E).
log_has() {
  grep -Eq "$3" "$TMP/$1/logs/$2.log" || { tail -25 "$TMP/$1/logs/$2.log"; die "$1: $2: $4"; }
}

# damaged NAME: a copy of the undamaged run's checkpoints in $TMP/NAME/snapshots, config $TMP/NAME.ini
# with resume = true.
damaged() {
  mkdir -p "$TMP/$1"
  cp -r "$TMP/run/snapshots" "$TMP/$1/" || die "copy"
  write_cfg "$1" "resume = true"
}

# same_result NAME: model.ckpt and checkpoint 12 equal the undamaged run's.
same_result() {
  cmp -s "$TMP/run/model.ckpt" "$TMP/$1/model.ckpt" || die "$1: model.ckpt differs from the undamaged run's"
  [ "$(ckpt_hashes "$TMP/$1" 12)" = "$FINAL" ] ||
    { "$PFCPS" ckpt-info "$TMP/$1"; die "$1: checkpoint 12 differs from the undamaged run's"; }
}

write_cfg run
ckpt_launch run
FINAL=$(ckpt_hashes "$TMP/run" 12)
[ -n "$FINAL" ] && [ -n "$(ckpt_hashes "$TMP/run" 8)" ] ||
  { "$PFCPS" ckpt-info "$TMP/run"; die "run: checkpoints 8 and 12 not both complete"; }

# --- newest: a flipped payload byte in a shard of step 12 --------------------------------------------------
damaged newest
bad=$TMP/newest/snapshots/step-12/shard-1-of-2.snap
flip "$bad"
info_has newest "^step 12: INCOMPLETE .*problem: .*step-12/shard-1-of-2\.snap: .*checksum mismatch" \
  "step 12 not shown INCOMPLETE with the file and 'checksum mismatch'"
info_has newest "^step 8: complete " "step 8 not complete"
newest_is newest 8
ckpt_launch newest
for r in 0 1; do
  log_has newest "server$r" "checkpoint step 12 not usable by this server: $bad: .*checksum mismatch" \
    "does not name $bad and the checksum mismatch"
  ! grep -q "loaded checkpoint step 12" "$TMP/newest/logs/server$r.log" || die "newest: server $r loaded the corrupt step 12"
  log_has newest "server$r" "loaded checkpoint step 8: " "did not load step 8"
done
log_has newest server0 "step 12 skipped: not complete on server\[[01]\]; step 8 is the newest checkpoint complete on all 4 members" \
  "the rendezvous does not say step 12 was skipped for step 8"
for w in 0 1; do
  log_has newest "worker$w" "resuming at checkpoint step 8 \(step 12 skipped" "did not resume at step 8"
done
same_result newest
echo "ok: newest checkpoint corrupt: step 12 refused ($(grep -m1 -o 'shard-1-of-2.snap: [^(]*' "$TMP/newest/logs/server0.log")), resumed at step 8, result identical"

# --- both: the older checkpoint truncated too -------------------------------------------------------------
damaged both
flip "$TMP/both/snapshots/step-12/shard-1-of-2.snap"
trunc=$TMP/both/snapshots/step-8/worker-1-of-2.snap
truncate -s -1000 "$trunc" || die "truncate"
info_has both "^step 12: INCOMPLETE .*problem: .*shard-1-of-2\.snap: .*checksum mismatch" "step 12 not INCOMPLETE (checksum)"
info_has both "^step 8: INCOMPLETE .*problem: .*step-8/worker-1-of-2\.snap: .*truncated" \
  "step 8 not shown INCOMPLETE with the file and 'truncated'"
info_has both "^no complete checkpoint$" "does not say there is no complete checkpoint"
newest_is both 0
ckpt_launch both
log_has both worker1 "checkpoint step 8 not usable by this worker: $trunc: .*truncated" "does not name $trunc as truncated"
log_has both server0 "step 12 skipped: not complete on server\[[01]\]; step 8 skipped: not complete on worker\[1\]; no checkpoint is complete on all 4 members: starting from scratch" \
  "the rendezvous does not say that no checkpoint is complete on all members"
for w in 0 1; do
  ! grep -q "resuming at checkpoint" "$TMP/both/logs/worker$w.log" || die "both: worker $w resumed from a checkpoint"
done
for r in 0 1; do
  ! grep -q "loaded checkpoint" "$TMP/both/logs/server$r.log" || die "both: server $r loaded a checkpoint"
done
log_has both worker0 "training done: 12 of 12 steps, first loss" "did not train from scratch to step 12"
same_result both
echo "ok: both checkpoints bad: the run started from scratch ($(grep -m1 -o 'no checkpoint is complete[^)]*' "$TMP/both/logs/server0.log")), result identical"

# --- missing: a member's file of step 12 deleted ----------------------------------------------------------
damaged missing
rm "$TMP/missing/snapshots/step-12/shard-0-of-2.snap"
info_has missing "^step 12: INCOMPLETE  shards 1/2 .*problem: 1 of 2 shard files" "step 12 not shown with 1 of 2 shard files"
newest_is missing 8
ckpt_launch missing
for r in 0 1; do
  log_has missing "server$r" "checkpoint step 12 not usable by this server: .*shard-0-of-2\.snap missing" \
    "does not name the missing shard-0-of-2.snap"
done
for w in 0 1; do
  log_has missing "worker$w" "resuming at checkpoint step 8 \(step 12 skipped" "did not resume at step 8"
done
same_result missing
echo "ok: a shard file of step 12 missing: resumed at step 8, result identical"

# --- model: worker 0's backbone file of step 12 damaged ---------------------------------------------------
damaged model
badm=$TMP/model/snapshots/step-12/worker-0-of-2.model
flip "$badm"
cp -r "$TMP/model/snapshots" "$TMP/model.before"  # as damaged, for ckpt-info below
ckpt_launch model
log_has model worker0 "checkpoint step 12 not usable by this worker: $badm: " "does not name $badm"
log_has model server0 "step 12 skipped: not complete on worker\[0\]; step 8 is the newest" "the rendezvous does not skip step 12"
for w in 0 1; do
  log_has model "worker$w" "resuming at checkpoint step 8 \(step 12 skipped" "did not resume at step 8"
done
same_result model
echo "ok: worker 0's backbone file of step 12 damaged: $(grep -m1 -o 'worker-0-of-2.model: .*' "$TMP/model/logs/worker0.log"); resumed at step 8, result identical"
# ckpt-info must agree with the members: step 12 is not complete (launch.sh --max-restarts prints its
# --newest as the step a restart resumes from).
"$PFCPS" ckpt-info "$TMP/model.before" | grep -Eq "^step 12: INCOMPLETE .*problem: .*worker-0-of-2\.model" ||
  { "$PFCPS" ckpt-info "$TMP/model.before"; die "model: ckpt-info calls step 12 complete although worker 0's .model is corrupt (the workers refuse it)"; }
n=$("$PFCPS" ckpt-info --newest "$TMP/model.before")
[ "$n" = 8 ] || die "model: ckpt-info --newest says $n, the run resumed from 8"
echo PASS
