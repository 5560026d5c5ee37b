#!/usr/bin/env bash
# A run stopped at a step that is not a checkpoint step of the uninterrupted run, then resumed, ends with the
# same bits as the uninterrupted run under pfc_update = dense with sample_rate < 1 (most rows skip most steps
# and move by the closed form of the steps they skipped, server/dense.h).
# Reference: 2 servers + 2 workers, 10 ORL identities in a table of 40 classes sampled at 0.25, 36 steps,
# snapshot_every 4, trained uninterrupted. Then:
#   sigterm:  the same run, SIGTERM to both workers once worker 0 has logged step 9; they agree on the stop,
#             finish the step and exit (no checkpoint is written at a stop: the newest is a periodic one); the
#             servers are stopped; the run is resumed with resume = true under the launcher and trained to the end;
#   stop10:   the same run with --max-steps 10 on the workers: the last step of a run is a checkpoint step, so
#             checkpoint 10 is written, a step the uninterrupted run never checkpoints; copies of it resume
#               with 2 servers,
#               with 3 servers (rows redistributed on load, each with its own step),
#               with snapshot_every = 3 (checkpoints at 12, 15, ..., none of the reference's but 12, 24, 36).
# Every resumed run must end with a model.ckpt byte-identical to the reference's and a final checkpoint whose
# `pfcps ckpt-info` table and backbone SHA-256 equal the reference's. Checkpoint 10's table digest, computed by
# tests/deploy/local/ckpt_table.py from the files alone (its own closed form of the skipped steps), must equal
# ckpt-info's.
source "$(dirname "$0")/cluster.sh" "$@"
export OMP_NUM_THREADS=1 PFCPS_SECRET=stop-resume-secret
pack_orl 10
TABLE="$SRC/tests/deploy/local/ckpt_table.py"

# write_cfg NAME [LINE...]: $TMP/NAME.ini (cluster.sh ckpt_ini: 6 epochs, 2 + 2, keep 2, 40 classes at 0.25).
write_cfg() {
  local name=$1; shift
  ckpt_ini "$name" 6 2 2 2 40 "sample_rate = 0.25" "pfc_update = dense" "$@"
}

write_cfg ref
ckpt_launch ref
REF=$(ckpt_final_line "$TMP/ref")
expect_grep "reference: 36 steps, final checkpoint complete" "^step 36: table [0-9a-f]{64}  backbone [0-9a-f]{64}$" - <<<"$REF"

# --- sigterm: SIGTERM to the workers after 10 steps -----------------------------------------------------------
write_cfg sig "frequent = 1"
start_cluster "$TMP/sig.ini" 2 2
wait_log "$TMP/worker0.log" "Global Step: 9 " 60 || { show_logs; die "sig: worker 0 did not train 9 steps"; }
kill -TERM "${WPIDS[@]}"
wait_all "${WPIDS[@]}" || { show_logs; die "sig: a worker did not exit 0 on SIGTERM"; }
stop_servers
at=$(sed -n 's/.*stop requested: finishing after \([0-9]*\) steps.*/\1/p' "$TMP/sig/logs/worker0.log" "$TMP/worker0.log" 2>/dev/null | head -1)
[ -n "$at" ] && [ "$at" -lt 36 ] || { show_logs; die "sig: worker 0 logged no stop before the end"; }
newest=$("$PFCPS" ckpt-info --newest "$TMP/sig")
echo "sig: stopped after $at steps; newest checkpoint $newest"
write_cfg sig "resume = true"
ckpt_launch sig
expect_grep "sig: worker 0 resumed at checkpoint $newest" "resuming at checkpoint step $newest " "$TMP/sig/logs/worker0.log"
ckpt_check_same sig

# --- stop10: the run ends at step 10 with a checkpoint there ------------------------------------------------
write_cfg stop10
run_cluster "stop10: the run of 10 steps failed" "$TMP/stop10.ini" 2 2 --max-steps 10
expect_eq "stop10: the newest checkpoint is step 10" "$("$PFCPS" ckpt-info --newest "$TMP/stop10")" 10
info=$("$PFCPS" ckpt-info "$TMP/stop10" | sed -n 's/^step 10: complete .*table \([0-9a-f]\{64\}\).*/\1/p')
own=$(python3 "$TABLE" digest "$TMP/stop10/snapshots" 10) || die "ckpt_table.py could not read checkpoint 10"
expect_eq "stop10: checkpoint 10's table digest, ckpt_table.py vs ckpt-info" "$own" "$info"
# ckpt-info --run: a folder with two runs' checkpoints (the reference's step 32, stop10's steps 8 and 10); the
# run ids are the ones server 0 logged when each run formed.
ref_run=$(grep -ao "; run id [0-9a-f]\{32\}" "$TMP/ref/logs/server0.log" | tail -n 1 | awk '{print $4}')
stop_run=$(grep -ao "; run id [0-9a-f]\{32\}" "$TMP/server0.log" | tail -n 1 | awk '{print $4}')
[ -n "$ref_run" ] && [ -n "$stop_run" ] && [ "$ref_run" != "$stop_run" ] ||
  die "run ids from server 0's logs: reference '$ref_run', stop10 '$stop_run'"
mkdir -p "$TMP/mixed/snapshots"
cp -r "$TMP/ref/snapshots/step-32" "$TMP/stop10/snapshots/step-8" "$TMP/stop10/snapshots/step-10" "$TMP/mixed/snapshots/" ||
  die "copy of the checkpoints"
expect_eq "mixed: the newest complete step of any run" "$("$PFCPS" ckpt-info --newest "$TMP/mixed")" 32
expect_eq "mixed: --run of stop10's id" "$("$PFCPS" ckpt-info --newest --run "$stop_run" "$TMP/mixed")" 10
expect_eq "mixed: --run=ID" "$("$PFCPS" ckpt-info --newest --run="$stop_run" "$TMP/mixed")" 10
expect_grep "mixed: the listing of one run counts its steps" "^2 of the 3 steps listed: run $stop_run's$" - \
  <<<"$("$PFCPS" ckpt-info --run "$stop_run" "$TMP/mixed")"
expect_eq "mixed: --run of the reference's id (upper case)" \
  "$("$PFCPS" ckpt-info --newest --run "${ref_run^^}" "$TMP/mixed")" 32
expect_eq "mixed: --run of an id no checkpoint has" \
  "$("$PFCPS" ckpt-info --newest --run 0123456789abcdef0123456789abcdef "$TMP/mixed")" 0
listed=$("$PFCPS" ckpt-info --run "$stop_run" "$TMP/mixed" | grep -o "^step [0-9]*" | tr '\n' ' ')
expect_eq "mixed: the listing of stop10's run" "$listed" "step 10 step 8 "
rc=0; err=$("$PFCPS" ckpt-info --newest --run "${stop_run}0" "$TMP/mixed" 2>&1 >/dev/null) || rc=$?
expect_eq "mixed: a run id of 33 digits is a usage error (exit 2)" "$rc" 2
expect_grep "mixed: the error names --run" "--run needs a run id of 32 hex digits" - <<<"$err"
for case in "s2 2" "s3 3" "every3 2 snapshot_every = 3"; do
  read -r name servers extra <<<"$case"
  mkdir -p "$TMP/$name"
  cp -r "$TMP/stop10/snapshots" "$TMP/$name/" || die "copy"
  ckpt_ini "$name" 6 "$servers" 2 2 40 "sample_rate = 0.25" "pfc_update = dense" "resume = true" ${extra:+"$extra"}
  ckpt_launch "$name"
  expect_grep "$name: worker 0 resumed at checkpoint 10" "resuming at checkpoint step 10 " "$TMP/$name/logs/worker0.log"
  ckpt_check_same "$name"
done
expect_summary
