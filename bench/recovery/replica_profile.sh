#!/usr/bin/env bash
# Where the servers' CPU goes with and without hot-standby shards: one bench/scale run (the head path of a
# worker's step, no backbone: bench/scale/run.sh, r series, --no-peer) per replicas value, with perf sampling
# both server processes for SECONDS (default 8) of the steady state (from 6 s after both servers logged
# "every class center generated"); prints the run's step line and, per replicas value, perf's sample count of
# the top symbols divided by the steps done while sampling, taken as SECONDS / the run's steady step time
# (milliseconds of one CPU per step: samples / 499 Hz / steps).
# usage: bench/recovery/replica_profile.sh [-b BUILD] [--classes N] [--provider tcp|shm] [--seconds S]
# Needs perf (linux-perf) and permission to sample the servers (root, or kernel.perf_event_paranoid <= 1).
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$SRC/build CLASSES=1000000 PROVIDER=shm SECONDS_=8 HZ=499
while [ $# -gt 0 ]; do
  case $1 in
    -b) BUILD=$2; shift ;;
    --classes) CLASSES=$2; shift ;;
    --provider) PROVIDER=$2; shift ;;
    --seconds) SECONDS_=$2; shift ;;
    *) echo "replica_profile.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
command -v perf >/dev/null || { echo "replica_profile.sh: perf is not installed (apt-get install linux-perf)" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'pkill -TERM -f "$TMP/" 2>/dev/null; rm -rf "$TMP"' EXIT

for rep in 0 1; do
  out=$TMP/r$rep
  PFCPS_SCALE_OUT=$out "$SRC/bench/scale/run.sh" "$BUILD" --classes "$CLASSES" --series r --steps 60 --warmup 8 \
    --steady 10 --no-peer --replicas "$rep" --provider "$PROVIDER" >"$TMP/run$rep.log" 2>&1 &
  bp=$!
  for _ in $(seq 1 300); do
    [ "$(cat "$out"/*.server*.log 2>/dev/null | grep -c "every class center generated")" -ge $((2 + 2 * rep)) ] && break
    sleep 1
  done
  sleep 6
  pids=$(pgrep -d, -f "pfcps-server --config $out/")
  [ -n "$pids" ] || { echo "replica_profile.sh: the servers of replicas = $rep are not running" >&2; exit 1; }
  perf record -q -o "$TMP/perf$rep.data" -F "$HZ" -p "$pids" -- sleep "$SECONDS_" >/dev/null 2>&1
  wait "$bp"
  line=$(grep "^| $CLASSES " "$TMP/run$rep.log" | head -1)
  steady=$(cut -d'|' -f5 <<<"$line" | awk '{print $1}')
  [ -n "$steady" ] || { echo "replica_profile.sh: replicas = $rep: no step line (see $TMP/run$rep.log)" >&2; trap - EXIT; exit 1; }
  steps=$(awk -v s="$SECONDS_" -v m="$steady" 'BEGIN {printf "%.2f", s * 1000 / m}')
  echo "replicas = $rep: steady $steady ms / step (sample / pull / head / push ms:$(cut -d'|' -f8 <<<"$line")); $steps steps while sampling"
  perf report -i "$TMP/perf$rep.data" -n --no-children --sort sym --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' |
    awk -v n="$steps" -v hz="$HZ" '{t += $2; if (NR <= 10) printf "  %-40s %7.1f ms / step\n", $4, $2 / n * 1000 / hz}
      END {printf "  %-40s %7.1f ms / step\n", "(all server threads)", t / n * 1000 / hz}'
done
