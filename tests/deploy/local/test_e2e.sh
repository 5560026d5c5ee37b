#!/usr/bin/env bash
# End to end on real faces: 2 servers + 2 workers train a narrow iresnet on 8 ORL identities packed
# into RecordIO by `pfcps pack`. The loss must fall by a clear margin (the mean of the last 5 steps
# below 60% of the mean of the first 5); every daemon exits 0, the servers on SIGTERM.
# A second run is stopped by SIGTERM mid-training: every worker and server exits 0.
source "$(dirname "$0")/cluster.sh" "$@"

pack_orl 8
run_ini "$TMP/run.ini" 2 2 e2e-test-secret <<INI
[train]
$ORL_NET
num_epoch = 6
frequent = 5
output = $TMP/out
[data]
rec = $TMP/train
num_classes = 8
num_workers = 1
INI
export OMP_NUM_THREADS=1
run_cluster "a worker failed" "$TMP/run.ini" 2 2 --trace "$TMP/trace{r}"
n=$(wc -l <"$TMP/trace0")
# 79 images (s8 has 9): arcface_torch's DistributedSampler gives each of the 2 ranks ceil(79 / 2) = 40 samples,
# its drop_last DataLoader 40 // 8 = 5 batches: 5 steps per epoch x 6 epochs.
[ "$n" -eq 30 ] || die "expected 30 steps (ceil(79 images / 2 ranks) // batch 8 = 5 per epoch x 6 epochs), trace has $n"
cmp -s "$TMP/trace0" "$TMP/trace1" || die "the two workers saw different global losses"
read -r first last < <(loss_means "$TMP/trace0")
echo "loss: mean of first 5 steps $first, mean of last 5 steps $last"
loss_fell "$first" "$last" || die "loss did not fall: $first -> $last"
grep -q "Speed .* samples/sec   Loss .*   LearningRate .*   Epoch: .*   Global Step: 20   Required:" "$TMP/out/training.log" \
  || die "training.log lacks the arcface_torch log line for step 20"
[ -s "$TMP/out/model.ckpt" ] || die "no backbone checkpoint"
grep -q "training done: 30 of 30 steps" "$TMP/out/training.log" || die "training.log lacks 'training done: 30 of 30 steps'"

# SIGTERM mid-run: everyone stops after the current step and exits 0.
port=$(free_port)
sed -i "s/^rendezvous = .*/rendezvous = 127.0.0.1:$port/; s/^num_epoch = .*/num_epoch = 1000/" "$TMP/run.ini"
start_cluster "$TMP/run.ini" 2 2 --trace "$TMP/term{r}"
wait_trace "$TMP/term0" 2 "the second run did not start training"
# Workers first (as the launcher does), then the servers they were talking to.
for p in "${WPIDS[@]}"; do kill -TERM "$p"; done
wait_all "${WPIDS[@]}" || { show_logs; die "a worker did not exit 0 on SIGTERM"; }
stop_servers
# The final line says the run was cut short, not done.
grep -q "training stopped on request: [0-9]* of 5000 steps" "$TMP/out/training.log" ||
  { show_logs; die "the stopped run's log does not say 'training stopped on request: N of 5000 steps (5 per epoch x 1000 epochs)'"; }
echo "PASS: loss $first -> $last over $n steps; all daemons exited 0 (also on SIGTERM mid-run)"
