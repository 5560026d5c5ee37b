#!/usr/bin/env bash
# gradient_acc = 2 with checkpoints: a checkpoint holds no window's gradients, so checkpoints fall at window
# ends and a resumed run ends with the uninterrupted run's bits.
# Reference: 2 servers + 2 workers, 10 ORL identities in a table of 40 classes sampled at 0.25 (dense update),
# gradient_acc 2, snapshot_every 4, 36 steps, uninterrupted. Then:
#   stop10: --max-steps 10 writes checkpoint 10 (a window end); resumed to the end: model.ckpt and the final
#           checkpoint (ckpt-info table and backbone SHA-256) equal the reference's;
#   stop9:  --max-steps 9 ends inside a window: no checkpoint 9, the newest is 8; resumed: the reference's bits;
#   refused: snapshot_every = 3 with gradient_acc = 2 (a checkpoint inside a window) stops the workers at start,
#           naming both keys.
source "$(dirname "$0")/cluster.sh" "$@"
export OMP_NUM_THREADS=1 PFCPS_SECRET=acc-resume-secret
pack_orl 10

write_cfg() {
  local name=$1; shift
  ckpt_ini "$name" 6 2 2 2 40 "sample_rate = 0.25" "pfc_update = dense" "gradient_acc = 2" "$@"
}
write_cfg ref
ckpt_launch ref
REF=$(ckpt_final_line "$TMP/ref")
expect_grep "reference: 36 steps, final checkpoint complete" "^step 36: table [0-9a-f]{64}  backbone [0-9a-f]{64}$" - <<<"$REF"
expect_grep "reference: the worker logs the accumulation" "gradient_acc = 2: an optimizer step every 2 global steps" \
  "$TMP/ref/logs/worker0.log"

for case in "stop10 10 10" "stop9 9 8"; do
  read -r name steps newest <<<"$case"
  write_cfg "$name"
  run_cluster "$name: the run of $steps steps failed" "$TMP/$name.ini" 2 2 --max-steps "$steps"
  expect_eq "$name: the newest checkpoint" "$("$PFCPS" ckpt-info --newest "$TMP/$name")" "$newest"
  write_cfg "$name" "resume = true"
  ckpt_launch "$name"
  expect_grep "$name: worker 0 resumed at checkpoint $newest" "resuming at checkpoint step $newest " \
    "$TMP/$name/logs/worker0.log"
  ckpt_check_same "$name"
done

ckpt_ini bad 6 2 2 2 40 "gradient_acc = 2" "snapshot_every = 3"
sed -i 's/^snapshot_every = 4$//' "$TMP/bad.ini"
if "$SRC/deploy/local/launch.sh" -b "$BUILD" -c "$TMP/bad.ini" >"$TMP/bad.out" 2>&1; then
  fail "refused: snapshot_every = 3 with gradient_acc = 2 trained"
else
  cat "$TMP/bad.out" "$TMP"/bad/logs/worker*.log 2>/dev/null |
    expect_grep "refused: snapshot_every not a multiple of gradient_acc" \
      "snapshot_every = 3 is not a multiple of gradient_acc = 2" -
fi
expect_summary
