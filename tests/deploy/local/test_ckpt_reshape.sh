#!/usr/bin/env bash
# Resume onto another shape: a checkpoint written by 2 servers + 2 workers resumes with
# 3 servers (S=2 -> S'=3: rows redistributed on load, class c to server c mod 3) and with 1 worker
# (W=2 -> W'=1: worker 0 of 1 reads worker 0 of 2's state; the data order follows the new W).
# A reference run (10 ORL identities, 24 steps, snapshot_every 4, every checkpoint kept) trains
# uninterrupted; its checkpoints 8 and 12 are copied into a fresh output folder and each resumed run starts
# from there with resume = true. Checked:
#   - every server logs that it loaded checkpoint step 12 (S'=3: from the 2 shard files of 2 servers), every
#     worker that it resumes at step 12; the run trains on to exit 0 with a finite loss at every step;
#   - the table as loaded equals the saved one: the same shape resumed with --max-steps 12 (nothing left to
#     train) dumps its class centers (--dump-centers), compared bitwise with the weights read from the step-12
#     shard files by tests/deploy/local/ckpt_table.py (an independent reader; it also checks ckpt-info's table digest);
#   - S'=3: sharding only routes rows, so every step's loss after the resume, the checkpoints written after it
#     (ckpt-info table and backbone SHA-256) and model.ckpt equal the uninterrupted 2-server run's;
#   - W'=1: the loss goes on from the checkpoint (not from an untrained start) and falls; the final checkpoint
#     is complete with 1 worker;
#   - snapshot_keep = 2 still holds after the reshape: only the 2 newest checkpoints remain, none left
#     half-pruned by members the new shape no longer has.
source "$(dirname "$0")/cluster.sh" "$@"
export OMP_NUM_THREADS=1 PFCPS_SECRET=reshape-secret
pack_orl 10
TABLE="$SRC/tests/deploy/local/ckpt_table.py"

# write_cfg NAME SERVERS WORKERS KEEP [LINE...]: $TMP/NAME.ini, output $TMP/NAME, 4 epochs of 10 ORL
# identities (24 steps with 2 workers, 48 with 1), a checkpoint every 4 steps, KEEP of them kept. The table
# has 40 classes sampled at 0.25: most rows skip most steps, and pfc_update = dense (the default) moves them
# by the closed form of the skipped steps, so the bit-identity below covers it (shard files hold each row as
# stored with its step; the resumed servers continue from there; ckpt_table.py computes the rows at the step).
write_cfg() {
  local name=$1 s=$2 w=$3 keep=$4; shift 4
  ckpt_ini "$name" 4 "$s" "$w" "$keep" 40 "frequent = 1" "sample_rate = 0.25" "$@"
}

# losses LOG FROM: "step loss" of worker log LOG's step lines after global step FROM.
losses() {
  sed -n 's/.*  Loss \([^ ]*\) .*Global Step: \([0-9]*\) .*/\2 \1/p' "$1" | awk -v f="$2" '$1 > f'
}

# finite_losses NAME LOG FROM N: exactly N step lines after FROM, each loss a finite number.
finite_losses() {
  local got
  got=$(losses "$2" "$3")
  [ "$(echo "$got" | grep -c .)" -eq "$4" ] || { echo "$got"; die "$1: expected $4 logged steps after step $3"; }
  echo "$got" | awk '$2 !~ /^[0-9]+(\.[0-9]+)?$/ {bad = 1} END {exit bad}' ||
    { echo "$got"; die "$1: a loss after the resume is not finite"; }
}

# seed NAME: $TMP/NAME/snapshots with the reference's checkpoints 8 and 12 (the run resumes from 12).
seed() {
  mkdir -p "$TMP/$1/snapshots"
  cp -r "$TMP/ref/snapshots/step-8" "$TMP/ref/snapshots/step-12" "$TMP/$1/snapshots/" || die "copy"
}

# The reference: 2 servers + 2 workers, uninterrupted, every checkpoint kept.
write_cfg ref 2 2 10
ckpt_launch ref
for s in 4 8 12 16 20 24; do
  [ -n "$(ckpt_hashes "$TMP/ref" "$s")" ] || { "$PFCPS" ckpt-info "$TMP/ref"; die "reference: checkpoint $s not complete"; }
done
REF12=$(ckpt_hashes "$TMP/ref" 12)
own=$(python3 "$TABLE" digest "$TMP/ref/snapshots" 12) || die "ckpt_table.py could not read checkpoint 12"
[ "${REF12#table }" != "$REF12" ] && [ "${REF12:6:64}" = "$own" ] ||
  die "ckpt-info's table digest of step 12 ('$REF12') differs from the shard files' own ($own)"
echo "reference: 24 steps; checkpoint 12: $REF12"

# --- S=2 -> S'=3 -------------------------------------------------------------------------------------------
write_cfg s3 3 2 2 "resume = true"
seed s3
ckpt_launch s3
for r in 0 1 2; do
  grep -q "loaded checkpoint step 12: [0-9]* rows of shard $r/3 from 2 shard file(s) of 2 servers" \
    "$TMP/s3/logs/server$r.log" || { tail -20 "$TMP/s3/logs/server$r.log"; die "S'=3: server $r did not load checkpoint 12 from the 2 shard files"; }
done
for w in 0 1; do
  grep -q "resuming at checkpoint step 12 " "$TMP/s3/logs/worker$w.log" ||
    { tail -20 "$TMP/s3/logs/worker$w.log"; die "S'=3: worker $w did not resume at step 12"; }
done
grep -q "training done: 24 of 24 steps" "$TMP/s3/logs/worker0.log" || die "S'=3: training did not reach step 24"
finite_losses "S'=3" "$TMP/s3/logs/worker0.log" 12 12
[ "$(losses "$TMP/s3/logs/worker0.log" 12)" = "$(losses "$TMP/ref/logs/worker0.log" 12)" ] ||
  { paste <(losses "$TMP/s3/logs/worker0.log" 12) <(losses "$TMP/ref/logs/worker0.log" 12); die "S'=3: the losses after the resume differ from the uninterrupted run's"; }
for s in 20 24; do
  "$PFCPS" ckpt-info "$TMP/s3" | grep -q "^step $s: complete  shards 3/3  workers 2/2" ||
    { "$PFCPS" ckpt-info "$TMP/s3"; die "S'=3: checkpoint $s not complete with 3 shards"; }
  [ "$(ckpt_hashes "$TMP/s3" "$s")" = "$(ckpt_hashes "$TMP/ref" "$s")" ] ||
    die "S'=3: checkpoint $s ($(ckpt_hashes "$TMP/s3" "$s")) differs from the uninterrupted run's ($(ckpt_hashes "$TMP/ref" "$s"))"
done
cmp -s "$TMP/ref/model.ckpt" "$TMP/s3/model.ckpt" || die "S'=3: model.ckpt differs from the uninterrupted run's"
echo "ok: S=2 -> S'=3: loaded step 12 on 3 servers; losses, checkpoints 20 and 24 and model.ckpt equal the uninterrupted run's"

# The table as the 3 servers loaded it: resume at 12 with --max-steps 12 (nothing to train) and dump it.
write_cfg load3 3 2 2 "resume = true"
seed load3
run_cluster "S'=3 load: a worker failed" "$TMP/load3.ini" 3 2 --max-steps 12 --dump-centers "$TMP/load3/dump"
grep -q "loaded checkpoint step 12: .* from 2 shard file(s) of 2 servers" "$TMP/server2.log" || die "S'=3 load: server 2 did not load step 12"
grep -q "nothing left to train" "$TMP/worker0.log" || die "S'=3 load: the run trained steps"
python3 "$TABLE" dump-equal "$TMP/ref/snapshots" 12 "$TMP/load3/dump" 2 || die "S'=3: the table as loaded differs from checkpoint 12"
echo "ok: S'=3: the table as loaded equals checkpoint 12's, class by class"

# --- W=2 -> W'=1 -------------------------------------------------------------------------------------------
write_cfg w1 2 1 2 "resume = true"
seed w1
ckpt_launch w1
for r in 0 1; do
  grep -q "loaded checkpoint step 12: 20 rows of shard $r/2 from 1 shard file(s) of 2 servers" "$TMP/w1/logs/server$r.log" ||
    { tail -20 "$TMP/w1/logs/server$r.log"; die "W'=1: server $r did not load checkpoint 12"; }
done
grep -q "loaded checkpoint step 12: backbone $TMP/w1/snapshots/step-12/worker-0-of-2.model" "$TMP/w1/logs/worker0.log" ||
  { tail -20 "$TMP/w1/logs/worker0.log"; die "W'=1: worker 0 did not load worker 0 of 2's state"; }
grep -q "resuming at checkpoint step 12 .*: epoch 1, batch 0 of 12" "$TMP/w1/logs/worker0.log" ||
  die "W'=1: worker 0 did not resume at step 12 (epoch 1, batch 0 of 12 with one worker)"
grep -q "training done: 48 of 48 steps" "$TMP/w1/logs/worker0.log" || die "W'=1: training did not reach step 48"
finite_losses "W'=1" "$TMP/w1/logs/worker0.log" 12 36
read -r first0 _ < <(losses "$TMP/ref/logs/worker0.log" 0 | awk '{print $2}')
read -r after <<<"$(losses "$TMP/w1/logs/worker0.log" 12 | head -5 | awk '{s += $2} END {print s / 5}')"
read -r last <<<"$(losses "$TMP/w1/logs/worker0.log" 12 | tail -5 | awk '{s += $2} END {print s / 5}')"
loss_fell "$first0" "$after" || die "W'=1: the loss after the resume ($after) is that of an untrained start ($first0)"
# Resumed near convergence (the loss is already a tenth of the untrained one), it falls by less than a fresh
# run does: 18% over the 36 steps on an AMD Zen 4 host, more elsewhere; a run that stopped learning stays flat.
loss_fell "$after" "$last" 0.9 || die "W'=1: the loss did not fall after the resume ($after -> $last)"
for s in 44 48; do
  "$PFCPS" ckpt-info "$TMP/w1" | grep -q "^step $s: complete  shards 2/2  workers 1/1" ||
    { "$PFCPS" ckpt-info "$TMP/w1"; die "W'=1: checkpoint $s not complete with 1 worker"; }
done
echo "ok: W=2 -> W'=1: resumed at step 12 (loss $first0 at step 1, $after after the resume, $last at the end); checkpoints 44 and 48 complete"

write_cfg load1 2 1 2 "resume = true"
seed load1
run_cluster "W'=1 load: the worker failed" "$TMP/load1.ini" 2 1 --max-steps 12 --dump-centers "$TMP/load1/dump"
grep -q "nothing left to train" "$TMP/worker0.log" || die "W'=1 load: the run trained steps"
python3 "$TABLE" dump-equal "$TMP/ref/snapshots" 12 "$TMP/load1/dump" 1 || die "W'=1: the table as loaded differs from checkpoint 12"
echo "ok: W'=1: the table as loaded equals checkpoint 12's, class by class"

# --- snapshot_keep after a reshape -------------------------------------------------------------------------
for name in s3 w1; do
  info=$("$PFCPS" ckpt-info "$TMP/$name")
  if ! echo "$info" | grep -q "^checkpoints in .*: 2$" || echo "$info" | grep -q INCOMPLETE; then
    echo "$info"; find "$TMP/$name/snapshots" -type f | sort
    die "$name: snapshot_keep = 2, but more than the 2 newest checkpoints remain after the reshape"
  fi
done
echo "ok: snapshot_keep = 2 holds after both reshapes"
echo PASS
