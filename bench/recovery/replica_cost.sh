#!/usr/bin/env bash
# The step-time cost of hot-standby shards (replicas = 1) against replicas = 0, with the real worker (backbone,
# head, pulls and pushes), in one run: PAIRS pairs (default 2) of runs on the recovery benchmarks' 10 ORL
# identities in a class-center table of CLASSES classes (default 2,000,000), D = 512, sample_rate 0.1,
# pfc_update dense, no checkpoint, 3 epochs, with SERVERS servers (default 2) and WORKERS workers (default 1);
# odd pairs run replicas = 0 first, even pairs replicas = 1 first. Per run: the steady step time, the median of
# worker 0's step-to-step log intervals after the first WARMUP steps (default 8; the warm-up apart, its median
# too), and the CPU seconds of all members over the whole run (start-up and the table's fill included) per
# step; then the ratios replicas 1 / 0 per pair.
# --pin: the servers run on the host's last CPU and the workers on the others (taskset), as when servers have
# cores of their own; without it every process shares every core.
# usage: bench/recovery/replica_cost.sh [-b BUILD] [--pin] [--classes N] [--pairs P] [--warmup K]
#                                        [SERVERS [WORKERS]]
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$SRC/build PIN=0 CLASSES=2000000 PAIRS=2 WARMUP=8
while [ $# -gt 0 ]; do
  case $1 in
    -b) BUILD=$2; shift ;;
    --pin) PIN=1 ;;
    --classes) CLASSES=$2; shift ;;
    --pairs) PAIRS=$2; shift ;;
    --warmup) WARMUP=$2; shift ;;
    -*) echo "replica_cost.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
SERVERS=${1:-2}
WORKERS=${2:-1}
PFCPS=$BUILD/tools/pfcps
export OMP_NUM_THREADS=1 PFCPS_SECRET=replica-cost-secret
TMP=$(mktemp -d)
trap 'pkill -KILL -f "$TMP/" 2>/dev/null; rm -rf "$TMP"' EXIT
. "$SRC/bench/recovery/common.sh"
recovery_stage || exit 1
ncpu=$(getconf _NPROCESSORS_ONLN) # (nproc obeys OMP_NUM_THREADS)
[ "$PIN" = 1 ] && [ "$ncpu" -lt 2 ] && { echo "replica_cost.sh: --pin needs 2 CPUs" >&2; exit 2; }
srv_pin=() wrk_pin=()
[ "$PIN" = 1 ] && srv_pin=(taskset -c $((ncpu - 1))) wrk_pin=(taskset -c 0-$((ncpu - 2)))

# cpu_s PID: the user + system CPU seconds of running process PID so far (/proc/PID/stat); run() samples it
# every 0.5 s and keeps each member's last sample.
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat" 2>/dev/null || echo 0; }

# run NAME REPLICAS: one run; prints "STEADY_S WARMUP_S CPU_S_PER_STEP STEPS".
run() {
  local name=$1 rep=$2 p pids=() wp=() s w
  recovery_ini "$name" "$SERVERS" "$WORKERS" "$rep" "$CLASSES" "pfc_update = dense" "embedding_size = 512" \
    "sample_rate = 0.1" "snapshot_every = 0" "num_epoch = 3"
  for ((s = 0; s < SERVERS; s++)); do
    "${srv_pin[@]}" "$BUILD/server/pfcps-server" --config "$TMP/$name.ini" --rank "$s" >"$TMP/$name.s$s.log" 2>&1 &
    pids+=($!)
  done
  for ((w = 0; w < WORKERS; w++)); do
    "${wrk_pin[@]}" "$BUILD/worker/pfcps-worker" --config "$TMP/$name.ini" --rank "$w" >"$TMP/$name.w$w.log" 2>&1 &
    wp+=($!)
  done
  # CPU time: sampled every 0.5 s while the members run (the last sample before each exits)
  local cpu=0 all=("${pids[@]}" "${wp[@]}") last=() i
  while :; do
    local alive=0
    for i in "${!all[@]}"; do
      if kill -0 "${all[$i]}" 2>/dev/null; then alive=1; last[$i]=$(cpu_s "${all[$i]}"); fi
    done
    [ "$alive" = 1 ] || break
    sleep 0.5
  done
  for p in "${all[@]}"; do wait "$p" || { echo "replica_cost.sh: $name: a member failed (logs in $TMP)" >&2; trap - EXIT; exit 1; }; done
  for i in "${!last[@]}"; do cpu=$(python3 -c "print($cpu + ${last[$i]:-0})"); done
  python3 - "$TMP/$name.w0.log" "$WARMUP" "$cpu" <<'PY'
import re, sys, datetime, statistics
path, warm, cpu = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
t = []
for line in open(path):
    if re.search(r"Global Step: \d+ ", line):
        t.append(datetime.datetime.fromisoformat(line.split()[0].rstrip("Z")).timestamp())
d = [b - a for a, b in zip(t, t[1:])]
print(f"{statistics.median(d[warm:]):.3f} {statistics.median(d[:warm]):.3f} {cpu / len(t):.3f} {len(t)}")
PY
}

echo "replica cost: $CLASSES classes, D = 512, sample_rate 0.1, $SERVERS servers + $WORKERS workers, $ncpu CPUs," \
  "$([ "$PIN" = 1 ] && echo "servers pinned to CPU $((ncpu - 1)), workers to the others" || echo "no pinning")"
echo "| pair | replicas | steady s / step | warm-up s / step | CPU s / step (all members, whole run with start-up) | steps |"
echo "|---|---|---|---|---|---|"
for ((k = 1; k <= PAIRS; k++)); do
  order=(0 1)
  [ $((k % 2)) = 0 ] && order=(1 0)
  for rep in "${order[@]}"; do
    read -r st wu cpu n < <(run "p$k.r$rep" "$rep") || exit 1
    eval "st$rep=$st cpu$rep=$cpu"
    echo "| $k | $rep | $st | $wu | $cpu | $n |"
  done
  echo "pair $k: replicas = 1 costs x$(python3 -c "print(round($st1 / $st0, 3))") the steady step of replicas = 0" \
    "(CPU per step x$(python3 -c "print(round($cpu1 / $cpu0, 3))"))"
done
