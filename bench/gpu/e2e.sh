#!/usr/bin/env bash
# The GPU check's end-to-end run: 1 server + 1 worker on loopback train with device = cuda, fp16 = true
# (cuda-fp16, NCCL, the GPU head, pinned class-center rows, dynamic loss scaling) r50 batch 64 on the 40 ORL
# identities (data/orl) for 30 steps. Passes when the worker exits 0 and the loss falls (the mean of the last
# 5 steps below 80% of the first 5); prints the worker's device and speed lines and one RESULT line with
# samples/s at steps 21-30 and the peak GPU memory (nvidia-smi, whole GPU, polled every 0.5 s).
# Usage: bench/gpu/e2e.sh BUILD SECONDS    (BUILD holds server/, worker/, tools/; SECONDS: the worker's limit)
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$1 LIMIT=$2
E=$(mktemp -d)
trap 'rm -rf "$E"' EXIT
"$BUILD/tools/pfcps" pack --quiet "$ROOT/data/orl" "$E/train" >"$E/pack.log" 2>&1 ||
  { cat "$E/pack.log"; echo "e2e: packing ORL failed"; exit 1; }
port=$(python3 "$ROOT/tests/free_port.py") # below the ephemeral range (that file says why)
cat >"$E/run.ini" <<INI
[train]
network = r50
embedding_size = 512
margin_list = 1.0, 0.0, 0.35
batch_size = 64
lr = 0.1
num_epoch = 6
frequent = 10
device = cuda
fp16 = true
output = $E/out
[data]
rec = $E/train
num_classes = 40
num_workers = 4
[cluster]
servers = 1
workers = 1
rendezvous = 127.0.0.1:$port
secret = gpu-check-e2e
INI
(while :; do
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null | head -1 >>"$E/mem"
  sleep 0.5
done) &
poll=$!
"$BUILD/server/pfcps-server" --config "$E/run.ini" --rank 0 >"$E/server.log" 2>&1 &
sp=$!
timeout "$LIMIT" "$BUILD/worker/pfcps-worker" --config "$E/run.ini" --rank 0 --max-steps 30 --trace "$E/trace" \
  >"$E/worker.log" 2>&1
rc=$?
kill -TERM "$sp" 2>/dev/null
wait "$sp" 2>/dev/null
kill "$poll" 2>/dev/null
wait "$poll" 2>/dev/null
grep -E "device |class-center rows|backbone collectives|loss scaling|Speed|GPU memory|training done|ERROR" \
  "$E/worker.log" | sed 's/^/  /' | cut -c1-220
if [ "$rc" != 0 ] || [ ! -s "$E/trace" ]; then
  echo "e2e: the worker failed (exit $rc); last lines:"
  tail -15 "$E/worker.log"
  tail -5 "$E/server.log"
  exit 1
fi
peak=$(sort -n "$E/mem" 2>/dev/null | tail -1)
sps=$(sed -n 's/.*Speed \([0-9.]*\) samples\/sec.*Global Step: 30 .*/\1/p' "$E/worker.log" | tail -1)
awk -v sps="${sps:-?}" -v peak="${peak:-?}" '{l[NR] = $2} END {
  f = 0; e = 0; for (i = 1; i <= 5; i++) {f += l[i]; e += l[NR - 5 + i]}
  printf "RESULT e2e cuda fp16 r50 batch 64: loss %.3f -> %.3f (means of the first / last 5 of 30 steps), " \
         "steps 21-30 %s samples/s, peak GPU memory %s MiB (nvidia-smi, whole GPU)\n", f / 5, e / 5, sps, peak
  if (!(e < 0.8 * f)) { print "e2e: the loss did not fall"; exit 1 } }' "$E/trace"
