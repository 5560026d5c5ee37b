#!/usr/bin/env bash
# OpenMP threads and idle waits of workers that share a host: 2 servers + 2 workers on this machine train
# the tests' tiny run (r18_w8, embedding 16, batch 4, 20 synthetic classes, 400 images, EPOCHS epochs, default
# 2: 100 steps; a checkpoint every 2 steps) in five settings, each ROUNDS times (default 1):
#   share    OMP_NUM_THREADS unset: each worker takes its share of the cores (cores / 2), idle threads sleep
#            on the completion queue (the defaults)
#   share+poll   the same with PFCPS_FABRIC_WAIT=0 (idle threads poll)
#   all      OMP_NUM_THREADS = cores in each worker (OpenMP's own default), sleeping
#   all+poll     the same, polling
#   all+passive  OMP_NUM_THREADS = cores with OMP_WAIT_POLICY=passive, sleeping
# Per run: the worker's training time ("over X s" of its last line), the warm-up (start to the checkpoint of
# step 10) and the steady step (median of the checkpoint-to-checkpoint intervals after step 10, halved);
# then each setting's steady step against share's.
# usage: bench/threads/run.sh [-b BUILD] [--epochs E] [--rounds R]
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$SRC/build EPOCHS=2 ROUNDS=1
while [ $# -gt 0 ]; do
  case $1 in
    -b) BUILD=$2; shift ;;
    --epochs) EPOCHS=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    *) echo "threads/run.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ -x "$BUILD/worker/pfcps-worker" ] || { echo "threads/run.sh: $BUILD/worker/pfcps-worker not built" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'pkill -KILL -f "$TMP/" 2>/dev/null; rm -rf "$TMP"' EXIT
unset OMP_NUM_THREADS OMP_WAIT_POLICY PFCPS_FABRIC_WAIT
export PFCPS_SECRET=threads-bench-secret
cores=$(nproc)
port=$(python3 "$SRC/tests/free_port.py" 2>/dev/null || echo 29611)

# run NAME ENV...: one run with ENV (VAR=VALUE words) in every daemon's environment; prints
# "TRAIN_S WARMUP_S STEADY_S".
run() {
  local name=$1 d=$TMP/$1 r pids=(); shift
  mkdir -p "$d"
  cat >"$d/run.ini" <<INI
[train]
network = r18_w8
embedding_size = 16
batch_size = 4
num_epoch = $EPOCHS
output = $d/out
[data]
rec = synthetic
synthetic = varied
num_classes = 20
num_image = 400
num_workers = 1
[server]
snapshot_every = 2
[cluster]
servers = 2
workers = 2
rendezvous = 127.0.0.1:$port
INI
  local t0; t0=$(date +%s.%N)
  for r in 0 1; do env "$@" "$BUILD/server/pfcps-server" --config "$d/run.ini" --rank $r >"$d/s$r.log" 2>&1 & pids+=($!); done
  for r in 0 1; do env "$@" "$BUILD/worker/pfcps-worker" --config "$d/run.ini" --rank $r >"$d/w$r.log" 2>&1 & pids+=($!); done
  wait "${pids[@]}" || { echo "threads/run.sh: run $name failed; worker 0's log:" >&2; tail -5 "$d/w0.log" >&2; exit 1; }
  grep -q "training done" "$d/w0.log" || { echo "threads/run.sh: run $name did not finish" >&2; exit 1; }
  # checkpoint lines' times (seconds of the day) and steps -> warm-up to step 10, median interval after it
  awk -v t0="$t0" '
    BEGIN { s0 = t0 - int(t0 / 86400) * 86400 } # UTC seconds of the day, as the log times
    / training done: / { for (i = 1; i <= NF; i++) if ($i == "over") train = $(i + 1) }
    /checkpoint step [0-9]+: worker state written/ {
      split($1, a, "T"); split(a[2], b, ":"); t = b[1] * 3600 + b[2] * 60 + b[3]
      if (t < s0 - 3600) t += 86400 # past midnight
      for (i = 1; i <= NF; i++) if ($i == "step") { s = $(i + 1); sub(":", "", s) }
      if (s + 0 == 10) t10 = t
      if (s + 0 > 10 && prev) d[n++] = (t - prev) / 2
      prev = t
    }
    END {
      for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (d[j] < d[i]) { x = d[i]; d[i] = d[j]; d[j] = x }
      printf "%.2f %.2f %.4f\n", train, t10 - s0, n ? d[int(n / 2)] : 0
    }' "$d/w0.log"
}

names=(share share+poll all all+poll all+passive)
declare -A envs=([share]="" [share+poll]="PFCPS_FABRIC_WAIT=0" [all]="OMP_NUM_THREADS=$cores"
  [all+poll]="OMP_NUM_THREADS=$cores PFCPS_FABRIC_WAIT=0" [all+passive]="OMP_NUM_THREADS=$cores OMP_WAIT_POLICY=passive")
declare -A steady
echo "threads/run.sh: 2 servers + 2 workers on $cores cores, $EPOCHS epochs of 50 steps, $ROUNDS round(s)"
printf "%-12s %-48s %8s %9s %10s\n" setting environment train_s warmup_s steady_s
for ((k = 1; k <= ROUNDS; k++)); do
  for n in "${names[@]}"; do
    # shellcheck disable=SC2086
    read -r tr wu st < <(run "$n-$k" ${envs[$n]} PFCPS_BENCH=1)
    printf "%-12s %-48s %8s %9s %10s\n" "$n" "${envs[$n]:-(defaults)}" "$tr" "$wu" "$st"
    steady[$n]="${steady[$n]:-} $st"
    pkill -KILL -f "$TMP/" 2>/dev/null
  done
done
# the median over the rounds (the lower middle one of an even count), ratio to share
med() { tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
base=$(echo "${steady[share]}" | med)
for n in "${names[@]}"; do
  m=$(echo "${steady[$n]}" | med)
  awk -v n="$n" -v m="$m" -v b="$base" 'BEGIN { printf "steady step %-12s %.4f s: %.2fx share'"'"'s\n", n, m, m / b }'
done
