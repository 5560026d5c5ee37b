#!/bin/sh
# GPU check for a machine with an NVIDIA GPU (CUDA 12+/13 nvcc, cuDNN 9, cuBLAS): builds pfcps with the
# CUDA device, runs the CUDA tests (CUDA vs CPU device for every layer and the reference networks,
# head kernels vs ../shared/reference), times the training step of r50 batch 128 (forward +
# margin-softmax head over K = 100000 centers + backward + SGD) through the CUDA device in fp32 and fp16
# (cuda-fp16) and the same step in PyTorch (fp32, fp16 autocast + GradScaler), and prints samples/s, peak
# GPU memory and the ratios pfcps/PyTorch; then trains end to
# end (1 server + 1 worker, device = cuda, fp16 = true, 30 steps on ORL) and checks that the loss falls.
# Meant to finish well inside 10 minutes: each stage has its own timeout, cut to what is left of a total
# budget (PFCPS_GPU_BUDGET seconds, 540); a stage with under 10 s left is skipped and says so.
#
# A GPU machine that cannot build pfcps (no -dev packages, no network) runs the same checks from a bundle made
# here: bench/gpu/bundle.sh, then bench/gpu/device_check.sh there (those files say how).
# Usage: bench/gpu_check.sh [build-dir]        (from anywhere; default build dir: build-gpu)
# Env:   PFCPS_GPU_ITERS (timed steps, 20), PFCPS_GPU_K (centers, 100000), PFCPS_GPU_BATCH (128),
#        PFCPS_TORCH_PYTHON (a python with CUDA torch), PFCPS_GPU_SKIP_TESTS=1 (timing only),
#        PFCPS_GPU_NO_PIP=1 (never pip install torch),
#        PFCPS_GPU_SKIP_E2E=1 (no end-to-end training run), PFCPS_GPU_BUDGET (total seconds, 540).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build-gpu}
ITERS=${PFCPS_GPU_ITERS:-20}
K=${PFCPS_GPU_K:-100000}
BATCH=${PFCPS_GPU_BATCH:-128}
JOBS=$(nproc 2>/dev/null || echo 4)
T0=$(date +%s)
BUDGET=${PFCPS_GPU_BUDGET:-540}
stamp() { echo "[gpu_check +$(( $(date +%s) - T0 ))s] $*"; }
# tmo CAP: seconds for the next stage, min(CAP, what is left of BUDGET); 0 when under 10 s are left.
tmo() {
    l=$(( T0 + BUDGET - $(date +%s) ))
    [ "$1" -lt "$l" ] && l=$1
    [ "$l" -lt 10 ] && l=0
    echo "$l"
}

stamp "machine: $(uname -n); GPUs:"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "  (nvidia-smi not available)"
command -v nvcc >/dev/null 2>&1 || PATH=$PATH:/usr/local/cuda/bin
nvcc --version 2>/dev/null | tail -1

# 1. build (only the CUDA pieces: library, its tests, the driver)
REFOPT=""
for r in "${PFCPS_REFERENCE:-}" "$ROOT/../shared/reference" "$ROOT/shared/reference"; do
    if [ -n "$r" ] && [ -d "$r/head" ]; then
        REFOPT="-Dreference_dir=$(cd "$r" && pwd)"
        break
    fi
done
[ -n "$REFOPT" ] || echo "gpu_check: no reference folder found (the reference tests will SKIP)"
# nvcc for this GPU's architecture only (one SASS instead of the default sm_80 + sm_90 + PTX: about a third of
# the device-code compile time); PFCPS_GPU_GENCODE overrides, and without nvidia-smi the default stays.
GENCODE=${PFCPS_GPU_GENCODE:-}
if [ -z "$GENCODE" ]; then
    CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
    case "$CAP" in
        [1-9][0-9] | [1-9][0-9][0-9]) GENCODE="-gencode=arch=compute_$CAP,code=sm_$CAP" ;;
    esac
fi
if [ ! -f "$BUILD/build.ninja" ]; then
    stamp "meson setup $BUILD -Dcuda=enabled $REFOPT${GENCODE:+ -Dgpu_gencode=$GENCODE}"
    timeout "$(tmo 90)" meson setup "$BUILD" "$ROOT" -Dcuda=enabled -Dbuildtype=release $REFOPT \
        ${GENCODE:+"-Dgpu_gencode=$GENCODE"} >"$BUILD.setup.log" 2>&1 || {
        tail -30 "$BUILD.setup.log"; echo "gpu_check: meson setup failed"; exit 1; }
fi
# Every executable of the cuda suite (asked from meson, so that new CUDA tests are built without listing
# them here), the bench driver, and the daemons for the end-to-end run.
CUDA_TESTS=$(cd "$BUILD" && meson introspect --tests . 2>/dev/null | python3 -c '
import json, os, sys
b = os.getcwd() + "/"
print(" ".join(sorted({t["cmd"][0][len(b):] for t in json.load(sys.stdin)
                       if "pfcps:cuda" in t["suite"] and t["cmd"][0].startswith(b)})))')
TARGETS="bench/gpu/bench_gpu $CUDA_TESTS server/pfcps-server worker/pfcps-worker tools/pfcps"
stamp "building $TARGETS"
S=$(tmo 240)
[ "$S" -gt 0 ] && timeout "$S" ninja -C "$BUILD" -j"$JOBS" $TARGETS || { echo "gpu_check: build failed"; exit 1; }

# fp32 is fp32 in every stage (tests, benches on both sides): no TF32 from a library's default math.
export NVIDIA_TF32_OVERRIDE=0
# 2. correctness: the cuda suite (SKIPs here mean no GPU was visible: reported, never counted as a pass)
RC_TESTS=0
if [ "${PFCPS_GPU_SKIP_TESTS:-0}" = 0 ]; then
    stamp "meson test --suite cuda (NVIDIA_TF32_OVERRIDE=0: fp32 everywhere)"
    S=$(tmo 150)
    if [ "$S" -gt 0 ]; then
        timeout "$S" meson test -C "$BUILD" --no-rebuild --suite cuda --print-errorlogs || RC_TESTS=1
    else
        echo "gpu_check: no time left for the cuda suite"; RC_TESTS=1
    fi
    grep -hE '^(FAIL|SKIP)|kink' "$BUILD/meson-logs/testlog.txt" | head -60
    grep -hE 'checks failed|networks,' "$BUILD/meson-logs/testlog.txt"
fi

# 3. timing: pfcps CUDA device
stamp "pfcps: r50 batch $BATCH K $K, $ITERS steps"
S=$(tmo 120)
if [ "$S" -gt 0 ]; then
    P_LINE=$(timeout "$S" "$BUILD/bench/gpu/bench_gpu" r50 "$BATCH" "$ITERS" "$K" 2>&1)
    RC_P=$?
else
    P_LINE="gpu_check: no time left for the fp32 bench"; RC_P=1
fi
echo "$P_LINE"
P=$(echo "$P_LINE" | sed -n 's/.*samples\/s \([0-9.]*\).*/\1/p')
stamp "pfcps: r50 batch $BATCH K $K, $ITERS steps, device cuda-fp16 (fp16 body, fp32 master weights)"
S=$(tmo 120)
if [ "$S" -gt 0 ]; then
    P16_LINE=$(timeout "$S" "$BUILD/bench/gpu/bench_gpu" r50 "$BATCH" "$ITERS" "$K" cuda-fp16 2>&1)
    RC_P16=$?
else
    P16_LINE="gpu_check: no time left for the fp16 bench"; RC_P16=1
fi
echo "$P16_LINE"
P16=$(echo "$P16_LINE" | sed -n 's/.*samples\/s \([0-9.]*\).*/\1/p')

# 4. timing: PyTorch (same step); a python with CUDA torch, or none
PY=""
for cand in "${PFCPS_TORCH_PYTHON:-}" "$ROOT/bench/.venv/bin/python" python3; do
    [ -n "$cand" ] || continue
    if "$cand" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        PY=$cand
        break
    fi
done
if [ -z "$PY" ] && [ "${PFCPS_GPU_NO_PIP:-0}" = 0 ] && [ "$(tmo 60)" -gt 0 ]; then
    stamp "no python with CUDA torch; trying pip install torch into $ROOT/bench/.venv"
    (python3 -m venv "$ROOT/bench/.venv" && timeout "$(tmo 60)" "$ROOT/bench/.venv/bin/pip" install --quiet --timeout 10 --retries 1 torch) >/dev/null 2>&1 &&
        "$ROOT/bench/.venv/bin/python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null &&
        PY=$ROOT/bench/.venv/bin/python
fi
T=""
T16=""
T16_LINE=""
if [ -n "$PY" ] && [ "$(tmo 60)" -gt 0 ]; then
    stamp "PyTorch ($PY): r50 batch $BATCH K $K, $ITERS steps, fp32 (TF32 off)"
    T_LINE=$(timeout "$(tmo 90)" "$PY" "$ROOT/bench/gpu/iresnet_torch_gpu.py" r50 "$BATCH" "$ITERS" "$K" 2>&1 | grep -v Warning | tail -1)
    echo "$T_LINE"
    T=$(echo "$T_LINE" | sed -n 's/.*samples\/s \([0-9.]*\).*/\1/p')
    stamp "PyTorch ($PY): r50 batch $BATCH K $K, $ITERS steps, fp16 autocast + GradScaler"
    S=$(tmo 90)
    [ "$S" -gt 0 ] && T16_LINE=$(timeout "$S" "$PY" "$ROOT/bench/gpu/iresnet_torch_gpu.py" r50 "$BATCH" "$ITERS" "$K" --amp 2>&1 | grep -v Warning | tail -1)
    echo "$T16_LINE"
    T16=$(echo "$T16_LINE" | sed -n 's/.*samples\/s \([0-9.]*\).*/\1/p')
else
    echo "PyTorch with CUDA: not available on this machine, or no time left (no ratio)"
fi

if [ -n "$P" ] && [ -n "$T" ]; then
    R=$(awk -v p="$P" -v t="$T" 'BEGIN { printf "%.3f", p / t }')
    echo "RESULT r50 fp32 batch $BATCH K $K: pfcps $P samples/s, PyTorch $T samples/s, ratio pfcps/PyTorch $R"
fi
if [ -n "$P16" ] && [ -n "$T16" ]; then
    R16=$(awk -v p="$P16" -v t="$T16" 'BEGIN { printf "%.3f", p / t }')
    echo "RESULT r50 fp16 batch $BATCH K $K: pfcps $P16 samples/s, PyTorch (amp) $T16 samples/s, ratio pfcps/PyTorch $R16"
fi
# 5. end to end: 1 server + 1 worker train with device = cuda, fp16 = true (cuda-fp16, NCCL, GPU head,
#    pinned class-center rows, dynamic loss scaling) on the 40 ORL identities for 30 steps; the loss must
#    fall (mean of the last 5 steps below 80% of the first 5); samples/s and peak GPU memory printed.
RC_E2E=1
if [ "${PFCPS_GPU_SKIP_E2E:-0}" = 0 ] && [ "$(tmo 120)" -lt 30 ]; then
    echo "gpu_check: no time left for the end-to-end run"
elif [ "${PFCPS_GPU_SKIP_E2E:-0}" = 0 ]; then
    stamp "end to end: device = cuda, fp16 = true, r50 batch 64, ORL 40 identities, 30 steps (bench/gpu/e2e.sh)"
    "$ROOT/bench/gpu/e2e.sh" "$BUILD" "$(tmo 120)" && RC_E2E=0
else
    RC_E2E=0
fi

stamp "done (tests rc $RC_TESTS, pfcps bench rc $RC_P, fp16 $RC_P16, e2e rc $RC_E2E)"
[ "$RC_TESTS" = 0 ] && [ "$RC_P" = 0 ] && [ "$RC_P16" = 0 ] && [ "$RC_E2E" = 0 ]
