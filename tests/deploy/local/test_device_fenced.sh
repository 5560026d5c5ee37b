#!/usr/bin/env bash
# The training loop on device memory, proven on the CPU: 2 workers + 1 server train 10 steps with
# device = cpu (the loop hands the CPU device's memory to the ring collectives in place), then the same
# run with device = cpu-fenced (kernels/cpu/ops_fenced.h: the same arithmetic, but its memory faults when
# host code touches it outside a device call, so the loop must go through mem_h2d / mem_d2h and stage the
# backbone broadcast and allreduce through host buffers). Every step's loss (trace, %.17g), the final
# backbone checkpoint and the class centers dumped from the servers must be bitwise identical: the fenced
# run touched device memory only through the device, and staging is exact. Global mode with SGD, local
# mode with AdamW.
source "$(dirname "$0")/cluster.sh" "$@"
export OMP_NUM_THREADS=1
run() { # run NAME DEVICE HEAD_MODE OPTIMIZER
  local name=$1 dev=$2 mode=$3 opt=$4
  run_ini "$TMP/$name.ini" 1 2 fenced-secret "head_mode = $mode" <<INI
[train]
$TINY_BACKBONE
margin_list = 1.0, 0.5, 0.0
sample_rate = 0.5
optimizer = $opt
lr = 0.05
batch_size = 4
num_epoch = 1
device = $dev
output = $TMP/$name.out
[data]
rec = synthetic
synthetic = varied
num_classes = 24
num_image = 80
num_workers = 1
INI
  run_cluster "$name: a worker failed" "$TMP/$name.ini" 1 2 --trace "$TMP/$name.trace{r}" --dump-centers "$TMP/$name.centers" --max-steps 10
  grep -q "device $dev, precision fp32" "$TMP/worker0.log" || { show_logs; die "$name: no device line for $dev"; }
  cp "$TMP/worker0.log" "$TMP/$name.worker0.txt"
}
same() { cmp -s "$1" "$2" || die "$3: $1 and $2 differ"; }
for combo in "global sgd" "local adamw"; do
  set -- $combo
  run "cpu-$1-$2" cpu "$1" "$2"
  run "fenced-$1-$2" cpu-fenced "$1" "$2"
  a="$TMP/cpu-$1-$2" b="$TMP/fenced-$1-$2"
  [ "$(wc -l <"$a.trace0")" -eq 10 ] || die "$combo: expected 10 steps, trace has $(wc -l <"$a.trace0")"
  for r in 0 1; do
    same "$a.trace$r" "$b.trace$r" "$combo: losses of worker $r"
    same "$a.centers.rank$r" "$b.centers.rank$r" "$combo: class centers of worker $r's partition"
  done
  same "$a.out/model.ckpt" "$b.out/model.ckpt" "$combo: backbone checkpoint"
  grep -q "backbone collectives: fabric ring through host staging" "$b.worker0.txt" || die "$combo: fenced run did not stage"
  echo "ok $combo: 10 losses ($(head -1 "$a.trace0" | cut -d' ' -f2) .. $(tail -1 "$a.trace0" | cut -d' ' -f2)), checkpoint ($(stat -c %s "$a.out/model.ckpt") bytes) and centers bitwise identical on cpu and cpu-fenced"
done
echo PASS
