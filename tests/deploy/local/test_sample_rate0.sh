#!/usr/bin/env bash
# sample_rate = 0 (arcface_torch's wf42m_pfc0008_32gpu_r100.py: Partial FC with the positive class centers
# only) trains end to end: 2 servers, 2 workers, 2 classes, batch 2 per worker (global batch 4), 32 steps.
# Worker r owns class r, so at a step whose 4 labels are all one class the other worker samples nothing
# (K = 0) and the softmax has that one column: every row's loss is -log(1) = 0 (up to rounding). At a step
# with both classes the sample is both classes, exactly what sample_rate 1 samples.
# Checks: 32 finite losses, the same on both workers; at least one step with loss 0 (|loss| < 1e-9: a worker
# with K = 0 took part) and none of those in the sample_rate 1 run beside it (both columns always); step 1
# (same initial weights, same batch) equal bit for bit to the sample_rate 1 run's when its loss is not 0.
# (The sampled sets themselves: tests/worker/head/test_sample.c, test_rate_0.)
# Arguments: SERVER WORKER PFCPS SRC BUILD
source "$(dirname "$0")/cluster.sh" "$@"

run() { # run NAME SAMPLE_RATE
  run_ini "$TMP/$1.ini" 2 2 "sample-rate-0-test-secret-0123" <<INI
[train]
$TINY_BACKBONE
batch_size = 2
sample_rate = $2
num_epoch = 2
output = $TMP/$1.out
[data]
rec = synthetic
synthetic = varied
num_classes = 2
num_image = 64
num_workers = 1
INI
  run_cluster "$1: the run failed" "$TMP/$1.ini" 2 2 --trace "$TMP/$1.trace{r}"
}
run r0 0
run r1 1
expect_eq "steps" "$(wc -l <"$TMP/r0.trace0")" 32
cmp -s "$TMP/r0.trace0" "$TMP/r0.trace1" && ok "both workers traced the same global losses" ||
  fail "the workers' losses differ"
awk '{ if (!($2 == $2 + 0 && $2 < 1e30 && $2 > -1e-9)) bad++ } END { exit bad > 0 }' "$TMP/r0.trace0" &&
  ok "32 finite losses: $(cut -d' ' -f2 "$TMP/r0.trace0" | head -4 | tr '\n' ' ')..." || fail "a loss is not finite"
zero() { awk '{ if ($2 < 1e-9 && $2 > -1e-9) n++ } END { print n + 0 }' "$1"; }
z0=$(zero "$TMP/r0.trace0") z1=$(zero "$TMP/r1.trace0")
[ "$z0" -ge 1 ] && [ "$z0" -lt 32 ] && ok "sample_rate 0: $z0 of 32 steps with one class in the batch (a worker with K = 0), loss 0" ||
  fail "sample_rate 0: $z0 of 32 steps with loss 0 (want at least 1, not all)"
expect_eq "sample_rate 1: steps with loss 0" "$z1" 0
l0=$(head -1 "$TMP/r0.trace0" | cut -d' ' -f2) l1=$(head -1 "$TMP/r1.trace0" | cut -d' ' -f2)
if awk -v a="$l0" 'BEGIN { exit !(a < 1e-9 && a > -1e-9) }'; then
  ok "step 1: one class in the batch: loss $l0 (sample_rate 1: $l1)"
else
  expect_eq "step 1: both classes: sample_rate 0 loss = sample_rate 1 loss" "$l0" "$l1"
fi
expect_summary
