#!/bin/sh
# Backbone benchmark: pfcps CPU backbone (bench_backbone) vs PyTorch CPU (iresnet_torch.py), same
# thread count, r18 and r50, batch 8 and 32, forward+backward samples/s; prints pfcps/PyTorch.
# Creates bench/.venv with torch from PyPI on first use (never used by the tests).
# Usage: bench/backbone/run.sh [build-dir] [threads]     (from the repository root)
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build}
THREADS=${2:-$(nproc)}
VENV=$ROOT/bench/.venv
if [ "${PFCPS_BENCH_SETUP_ONLY:-0}" != 0 ] || [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --upgrade pip
    # PyPI's torch (the CPU-only index is not reachable from every build machine).
    "$VENV/bin/pip" install --quiet torch
fi
[ "${PFCPS_BENCH_SETUP_ONLY:-0}" != 0 ] && exit 0
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS
ITERS=${PFCPS_BENCH_ITERS:-3}
for net in r18 r50; do
    for b in 8 32; do
        p=$("$BUILD/bench/backbone/bench_backbone" "$net" "$b" "$ITERS" | awk '/samples\/s/ {print $NF}')
        t=$("$VENV/bin/python" "$ROOT/bench/backbone/iresnet_torch.py" "$net" "$b" "$ITERS" "$THREADS" | awk '/samples\/s/ {print $NF}')
        r=$(awk -v p="$p" -v t="$t" 'BEGIN { printf "%.3f", p / t }')
        echo "backbone $net batch $b threads $THREADS: pfcps $p samples/s, PyTorch $t samples/s, ratio pfcps/PyTorch $r"
    done
done
