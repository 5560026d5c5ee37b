#!/usr/bin/env bash
# fp16_overflow_skip: what a step whose scaled gradients overflow skips. arcface_torch's GradScaler.step skips
# the whole optimizer step, class centers included (one SGD over backbone and centers): the table must not
# move. Device cpu-bf16 with fp16 = true (the loss-scaling path on the CPU), 1 server + 1 worker, 8 synthetic
# classes, sample_rate 1 (every center pulled every step).
#  - init: lr_scheduler = poly_scheduler with warmup, --max-steps 1: step 1 runs at lr 0, so the servers'
#    SGD leaves every center as initialised (w - 0 * v = w): its --dump-centers is the initial table.
#  - skip_step: initial loss scale 2^127 (PFCPS_AMP_INIT_SCALE), default fp16_overflow_skip = step,
#    --max-steps 3: every step overflows (2^127 .. 2^125: the scaled gradients overflow float32), so the
#    final table equals the initial one byte for byte.
#  - skip_backbone: the same with fp16_overflow_skip = backbone (the centers' push before the check): the
#    table moved.
# Arguments: SERVER WORKER PFCPS SRC BUILD
source "$(dirname "$0")/cluster.sh" "$@"
export OMP_NUM_THREADS=1

run() { # run NAME MAX_STEPS [LINE...]
  local name=$1 steps=$2; shift 2
  run_ini "$TMP/$name.ini" 1 1 "fp16-skip-test-secret-0123456" <<INI
[train]
$TINY_BACKBONE
batch_size = 4
device = cpu-bf16
fp16 = true
sample_rate = 1
num_epoch = 4
output = $TMP/$name.out
$(printf '%s\n' "$@")
[data]
rec = synthetic
synthetic = varied
num_classes = 8
num_image = 32
num_workers = 1
INI
  run_cluster "$name: the run failed" "$TMP/$name.ini" 1 1 --max-steps "$steps" --dump-centers "$TMP/$name.centers"
  cp "$TMP/worker0.log" "$TMP/$name.log"
}
run init 1 "lr_scheduler = poly_scheduler" "warmup_epoch = 1"
export PFCPS_AMP_INIT_SCALE=1.7014118346046923e38 # 2^127
run skip_step 3
run skip_backbone 3 "fp16_overflow_skip = backbone"
unset PFCPS_AMP_INIT_SCALE
for n in skip_step skip_backbone; do
  expect_eq "$n: steps that overflowed" "$(grep -c 'backbone gradients overflowed' "$TMP/$n.log")" 3
done
expect_grep "skip_step: the log says the centers were not updated" "class centers not updated either" "$TMP/skip_step.log"
[ -s "$TMP/init.centers.rank0" ] || die "no initial table dumped"
cmp -s "$TMP/init.centers.rank0" "$TMP/skip_step.centers.rank0" &&
  ok "fp16_overflow_skip = step: 3 skipped steps leave the table as initialised ($(stat -c %s "$TMP/init.centers.rank0") bytes)" ||
  fail "fp16_overflow_skip = step: the table moved over skipped steps"
cmp -s "$TMP/init.centers.rank0" "$TMP/skip_backbone.centers.rank0" &&
  fail "fp16_overflow_skip = backbone: the table did not move (the check would not see a skip)" ||
  ok "fp16_overflow_skip = backbone: the centers moved over the same skipped steps"
expect_summary
