#!/usr/bin/env bash
# optimizer = adamw (the class centers train with AdamW on the servers, server/adamw.h): a run stopped at a step
# the uninterrupted run does not checkpoint, then resumed, ends with the same bits as the uninterrupted run,
# under pfc_update = dense with sample_rate 0.25 (most rows skip most steps; their zero-gradient AdamW steps are
# replayed when they are next pulled, pushed or checkpointed) and under pfc_update = sparse.
# Reference: 2 servers + 2 workers, 10 ORL identities in a table of 40 classes sampled at 0.25, 18 steps,
# snapshot_every 4, trained uninterrupted. Then the same run with --max-steps 10 (the last step of a run is a
# checkpoint step: checkpoint 10, a step the reference never checkpoints), resumed with 2 servers and with 3
# (rows, both moments and each row's step redistributed on load). Every resumed run must end with a model.ckpt
# byte-identical to the reference's and a final checkpoint whose `pfcps ckpt-info` table (weights and both
# moments of every class as after the last step) and backbone SHA-256 equal the reference's; the checkpoint
# files must say they hold AdamW state (header field adamw), and the servers' log that they train with AdamW.
# Checkpoint 10's table digest, computed by tests/deploy/local/ckpt_table.py from the files alone (its own
# float32 replay of the AdamW steps the rows skipped), must equal ckpt-info's.
source "$(dirname "$0")/cluster.sh" "$@"
export OMP_NUM_THREADS=1 PFCPS_SECRET=adamw-resume-secret
pack_orl 10

for update in dense sparse; do
  # write_cfg NAME [LINE...]: $TMP/NAME.ini (cluster.sh ckpt_ini: 3 epochs, 2 + 2, keep 2, 40 classes at 0.25).
  write_cfg() {
    local name=$1; shift
    ckpt_ini "$name" 3 2 2 2 40 "sample_rate = 0.25" "pfc_update = $update" "optimizer = adamw" "$@"
  }
  write_cfg ref
  ckpt_launch ref
  REF=$(ckpt_final_line "$TMP/ref")
  expect_grep "$update: reference: 18 steps, final checkpoint complete" \
    "^step 18: table [0-9a-f]{64}  backbone [0-9a-f]{64}$" - <<<"$REF"
  expect_grep "$update: the servers train the centers with AdamW" "AdamW's two moments" "$TMP/ref/logs/server0.log"
  python3 "$SRC/tests/pfcps_snap.py" show "$TMP/ref/snapshots/step-18/shard-0-of-2.snap" >"$TMP/hdr.txt" ||
    die "$update: pfcps_snap.py could not read the checkpoint"
  expect_grep "$update: the shard file says it holds AdamW state" "^adamw = (1|True)$" "$TMP/hdr.txt"

  write_cfg stop10
  run_cluster "$update: the run of 10 steps failed" "$TMP/stop10.ini" 2 2 --max-steps 10
  expect_eq "$update: the newest checkpoint is step 10" "$("$PFCPS" ckpt-info --newest "$TMP/stop10")" 10
  info=$("$PFCPS" ckpt-info "$TMP/stop10" | sed -n 's/^step 10: complete .*table \([0-9a-f]\{64\}\).*/\1/p')
  own=$(python3 "$SRC/tests/deploy/local/ckpt_table.py" digest "$TMP/stop10/snapshots" 10) ||
    die "$update: ckpt_table.py could not read checkpoint 10"
  expect_eq "$update: checkpoint 10's table digest, ckpt_table.py (its own float32 AdamW replay) vs ckpt-info" \
    "$own" "$info"
  for case in "s2 2" "s3 3"; do
    read -r name servers <<<"$case"
    mkdir -p "$TMP/$name"
    cp -r "$TMP/stop10/snapshots" "$TMP/$name/" || die "copy"
    ckpt_ini "$name" 3 "$servers" 2 2 40 "sample_rate = 0.25" "pfc_update = $update" "optimizer = adamw" \
      "resume = true"
    ckpt_launch "$name"
    expect_grep "$update $name: worker 0 resumed at checkpoint 10" "resuming at checkpoint step 10 " \
      "$TMP/$name/logs/worker0.log"
    ckpt_check_same "$name"
  done
  rm -rf "$TMP/ref" "$TMP/stop10" "$TMP/s2" "$TMP/s3"
done
expect_summary
