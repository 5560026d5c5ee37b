#!/usr/bin/env bash
# What a run leaves besides the backbone: verification during training (val_targets, every `verbose` steps
# and at the end, arcface_torch's log lines), TensorBoard events and the class-center partitions
# (save_centers). 1 server + 2 workers train r18_w8 on 4 ORL identities for 5 epochs (10 steps), scoring
# 20 pairs of 4 other identities every 3 steps.
#  - Verification does not perturb training: the traces equal those of the same run without val_targets.
#  - The accuracy logged at the end equals `pfcps verify --pad` on the saved model.ckpt; a set name whose .bin
#    is not in the rec folder (lfw) is skipped with a warning, as arcface_torch does.
#  - save_centers: each worker's partition file holds exactly its classes (c mod 2 == rank), ascending, and
#    equals the --dump-centers file of the same run byte for byte.
#  - pretrained: runs started from the trained model.ckpt and from its safetensors export train identically,
#    from a lower first loss than the random initialisation; their num_image = 20 (the pack has 40) is warned
#    about (the lr schedule ends early).
#  - TensorBoard: the tensorboard package reads back loss and learning_rate at every logged step with the
#    values of training.log, and the set's accuracy at every verification (skipped, exit 77, without
#    PFCPS_PYTHON / tensorboard, a failure under PFCPS_REQUIRE_REFERENCES=1; everything else is checked first).
source "$(dirname "$0")/cluster.sh" "$@"

pack_orl 4
# 20 pairs of identities s5..s8 (unseen): 10 same, 10 different, in the ORL pairs file's format.
mkdir -p "$TMP/val"
for i in 5 6 7 8; do ln -sfn "$SRC/data/orl/s$i" "$TMP/val/s$i"; done
{
  echo "10 same, 10 different"
  for i in 5 6 7 8 5; do echo "s$i 1 2"; echo "s$i 3 4"; done
  for i in 5 6 7 8 5; do j=$((i % 4 + 5)); echo "s$i 1 s$j 2"; echo "s$i 5 s$j 6"; done
} >"$TMP/val/pairs.txt"

write_run() { # write_run FILE OUTPUT EXTRA_DATA_LINES
  run_ini "$1" 1 2 outputs-test-secret <<INI
[train]
$ORL_NET
num_epoch = 5
frequent = 2
output = $2
[data]
rec = $TMP/train
num_classes = 4
num_workers = 1
verbose = 3
$3
INI
}
export OMP_NUM_THREADS=1
write_run "$TMP/a.ini" "$TMP/a" "val_targets = $TMP/val/pairs.txt, lfw
save_centers = true"
run_cluster "run with val_targets failed" "$TMP/a.ini" 1 2 --trace "$TMP/a_trace{r}" --dump-centers "$TMP/dump"
grep -qF "val_targets: lfw not found ($TMP/lfw.bin): skipped" "$TMP/worker0.log" ||
  die "a val_targets name without its .bin in the rec folder was not skipped with a warning"
write_run "$TMP/b.ini" "$TMP/b" ""
run_cluster "run without val_targets failed" "$TMP/b.ini" 1 2 --trace "$TMP/b_trace{r}"

log=$TMP/a/training.log
n=$(wc -l <"$TMP/a_trace0")
[ "$n" -eq 10 ] || die "expected 10 steps (40 images / 16 per step = 2 per epoch x 5 epochs), trace has $n"
cmp -s "$TMP/a_trace0" "$TMP/b_trace0" && cmp -s "$TMP/a_trace1" "$TMP/b_trace1" ||
  die "verification changed the training: traces differ from the run without val_targets"
for s in 3 6 9 10; do
  grep -q "\[pairs\]\[$s\]Accuracy-Flip: [0-9.]*+-[0-9.]*$" "$log" || die "no Accuracy-Flip line for step $s"
  grep -q "\[pairs\]\[$s\]XNorm: " "$log" || die "no XNorm line for step $s"
  grep -q "\[pairs\]\[$s\]Accuracy-Highest: " "$log" || die "no Accuracy-Highest line for step $s"
done
[ "$(grep -c 'Accuracy-Flip' "$log")" -eq 4 ] || die "expected 4 verifications (steps 3, 6, 9 and the end, 10)"
logged=$(grep -o "\[pairs\]\[10\]Accuracy-Flip: .*" "$log" | sed 's/.*: //')
tool=$("$PFCPS" verify --pad "$TMP/a/model.ckpt" "$TMP/val/pairs.txt" --images "$TMP/val" 2>/dev/null |
  grep -o "Accuracy-Flip: .*" | sed 's/.*: //')
[ -n "$tool" ] && [ "$logged" = "$tool" ] || die "accuracy at the end $logged != pfcps verify on model.ckpt '$tool'"
echo "verification: step 10 Accuracy-Flip $logged (pfcps verify: $tool)"

for r in 0 1; do
  f=$TMP/a/centers/partition.rank$r
  [ -s "$f" ] || die "no $f"
  cmp -s "$f" "$TMP/dump.rank$r" || die "$f differs from the --dump-centers file of the same run"
  # records of 8 + 32*4 bytes: class ids r, r+2 (4 classes, 2 workers)
  [ "$(stat -c %s "$f")" -eq $((2 * (8 + 32 * 4))) ] || die "$f: expected 2 records of 136 bytes"
  ids=$(od -An -t u8 -j 0 -N 8 "$f" | tr -d ' ')/$(od -An -t u8 -j 136 -N 8 "$f" | tr -d ' ')
  [ "$ids" = "$r/$((r + 2))" ] || die "$f holds class ids $ids, expected $r/$((r + 2))"
done
echo "save_centers: partitions of both workers hold their classes"

# pretrained: the trained backbone, as a pfcps checkpoint and as its safetensors export, starts two runs that
# must train identically (the same initial backbone) and unlike the run from the random initialisation.
"$PFCPS" export --format safetensors "$TMP/a/model.ckpt" "$TMP/a.safetensors" || die "export to safetensors"
write_run "$TMP/c.ini" "$TMP/c" "" && sed -i "s|^\[data\]|pretrained = $TMP/a/model.ckpt\nnum_image = 20\n[data]|" "$TMP/c.ini"
run_cluster "run from a pretrained model.ckpt failed" "$TMP/c.ini" 1 2 --max-steps 3 --trace "$TMP/c_trace{r}"
write_run "$TMP/d.ini" "$TMP/d" "" && sed -i "s|^\[data\]|pretrained = $TMP/a.safetensors\nnum_image = 20\n[data]|" "$TMP/d.ini"
run_cluster "run from a pretrained safetensors file failed" "$TMP/d.ini" 1 2 --max-steps 3 --trace "$TMP/d_trace{r}"
grep -q "backbone initialised from $TMP/a.safetensors (pretrained)" "$TMP/worker1.log" ||
  die "worker 1 does not say it loaded the pretrained backbone"
grep -q "num_image 20 is smaller than the 40 images of dataset" "$TMP/worker0.log" ||
  die "num_image below the dataset's image count was not warned about"
cmp -s "$TMP/c_trace0" "$TMP/d_trace0" || die "pretrained from model.ckpt and from its safetensors export differ"
[ "$(wc -l <"$TMP/c_trace0")" -eq 3 ] || die "the pretrained run did not train 3 steps"
c1=$(awk 'NR==1 {print $2}' "$TMP/c_trace0"); b1=$(awk 'NR==1 {print $2}' "$TMP/b_trace0")
awk -v c="$c1" -v b="$b1" 'BEGIN {exit !(c < b)}' ||
  die "the first loss from the trained backbone ($c1) is not below the random initialisation's ($b1)"
echo "pretrained: model.ckpt and safetensors start identically; first loss $c1 vs $b1 from scratch"

# SKIP, or FAIL under PFCPS_REQUIRE_REFERENCES=1, without PFCPS_PYTHON / tensorboard (ref_python, through
# cluster.sh's tests/expect.sh)
ref_python tensorboard
py=$PFCPS_PYTHON
"$py" - "$TMP/a/tensorboard" "$log" <<'PY' || die "TensorBoard events do not match training.log"
import re, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
ea = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
ea.Reload()
log = open(sys.argv[2]).read()
want = {}
for m in re.finditer(r"Loss ([0-9.]+)   LearningRate ([0-9.]+)   Epoch: \d+   Global Step: (\d+)", log):
    want[int(m.group(3))] = (float(m.group(1)), float(m.group(2)))
acc = {int(s): float(a) for s, a in re.findall(r"\[pairs\]\[(\d+)\]Accuracy-Flip: ([0-9.]+)\+-", log)}
tags = ea.Tags()["scalars"]
for t in ("loss", "learning_rate", "time_for_end", "samples_per_sec", "pairs"):
    assert t in tags, f"tag {t} missing: {tags}"
loss = {e.step: e.value for e in ea.Scalars("loss")}
lr = {e.step: e.value for e in ea.Scalars("learning_rate")}
va = {e.step: e.value for e in ea.Scalars("pairs")}
assert sorted(loss) == sorted(want), (sorted(loss), sorted(want))
for s, (l, r) in want.items():
    assert abs(loss[s] - l) <= 5e-5 + 1e-6 * l, (s, loss[s], l)
    assert abs(lr[s] - r) <= 5e-7 + 1e-6 * r, (s, lr[s], r)
assert sorted(va) == sorted(acc), (sorted(va), sorted(acc))
for s, a in acc.items():
    assert abs(va[s] - a) <= 5e-6, (s, va[s], a)
print(f"tensorboard: {len(loss)} loss / learning_rate points and {len(va)} accuracies match training.log")
PY
echo "PASS: verification every 3 steps and at the end, training unchanged by it, TensorBoard and centers written"
