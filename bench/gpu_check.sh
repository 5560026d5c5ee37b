#!/bin/sh
# GPU check for a machine with an NVIDIA GPU (CUDA 12+/13 nvcc, cuDNN 9, cuBLAS): builds pfcps with the
# CUDA device, runs the CUDA tests (CUDA vs CPU device for every layer and the reference networks,
# head kernels vs ../shared/reference), times the fp32 training step of r50 batch 128 (forward +
# margin-softmax head over K = 100000 centers + backward + SGD) through the CUDA device and the same
# step in PyTorch, and prints samples/s, peak GPU memory and the ratio pfcps/PyTorch.
# Meant to finish well inside 10 minutes (each stage has its own timeout).
#
# Usage: bench/gpu_check.sh [build-dir]        (from anywhere; default build dir: build-gpu)
# Env:   PFCPS_GPU_ITERS (timed steps, 20), PFCPS_GPU_K (centers, 100000), PFCPS_GPU_BATCH (128),
#        PFCPS_TORCH_PYTHON (a python with CUDA torch), PFCPS_GPU_SKIP_TESTS=1 (timing only),
#        PFCPS_GPU_NO_PIP=1 (never pip install torch), PFCPS_GPU_AMP=1 (also PyTorch fp16, information).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build-gpu}
ITERS=${PFCPS_GPU_ITERS:-20}
K=${PFCPS_GPU_K:-100000}
BATCH=${PFCPS_GPU_BATCH:-128}
JOBS=$(nproc 2>/dev/null || echo 4)
T0=$(date +%s)
stamp() { echo "[gpu_check +$(( $(date +%s) - T0 ))s] $*"; }

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
if [ ! -f "$BUILD/build.ninja" ]; then
    stamp "meson setup $BUILD -Dcuda=enabled $REFOPT"
    meson setup "$BUILD" "$ROOT" -Dcuda=enabled -Dbuildtype=release $REFOPT >"$BUILD.setup.log" 2>&1 || {
        tail -30 "$BUILD.setup.log"; echo "gpu_check: meson setup failed"; exit 1; }
fi
TARGETS="bench/gpu/bench_gpu tests/cuda/test_cuda_ops tests/cuda/test_cuda_head tests/cuda/test_cuda_table tests/cuda/test_cuda_backbone tests/cuda/test_loss_scale tests/cuda/test_cuda_nccl tests/common/test_cuda_l2norm"
stamp "building $TARGETS"
timeout 300 ninja -C "$BUILD" -j"$JOBS" $TARGETS || { echo "gpu_check: build failed"; exit 1; }

# 2. correctness: the cuda suite (SKIPs here mean no GPU was visible: reported, never counted as a pass)
RC_TESTS=0
if [ "${PFCPS_GPU_SKIP_TESTS:-0}" = 0 ]; then
    stamp "meson test --suite cuda (NVIDIA_TF32_OVERRIDE=0: fp32 everywhere)"
    export NVIDIA_TF32_OVERRIDE=0
    timeout 240 meson test -C "$BUILD" --no-rebuild --suite cuda --print-errorlogs || RC_TESTS=1
    grep -hE '^(FAIL|SKIP)|kink' "$BUILD/meson-logs/testlog.txt" | head -60
    grep -hE 'checks failed|networks,' "$BUILD/meson-logs/testlog.txt"
fi

# 3. timing: pfcps CUDA device
stamp "pfcps: r50 batch $BATCH K $K, $ITERS steps"
P_LINE=$(timeout 240 "$BUILD/bench/gpu/bench_gpu" r50 "$BATCH" "$ITERS" "$K" 2>&1)
RC_P=$?
echo "$P_LINE"
P=$(echo "$P_LINE" | sed -n 's/.*samples\/s \([0-9.]*\).*/\1/p')

# 4. timing: PyTorch (same step); a python with CUDA torch, or none
PY=""
for cand in "${PFCPS_TORCH_PYTHON:-}" "$ROOT/bench/.venv/bin/python" python3; do
    [ -n "$cand" ] || continue
    if "$cand" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        PY=$cand
        break
    fi
done
if [ -z "$PY" ] && [ "${PFCPS_GPU_NO_PIP:-0}" = 0 ]; then
    stamp "no python with CUDA torch; trying pip install torch into $ROOT/bench/.venv"
    (python3 -m venv "$ROOT/bench/.venv" && timeout 240 "$ROOT/bench/.venv/bin/pip" install --quiet torch) >/dev/null 2>&1 &&
        "$ROOT/bench/.venv/bin/python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null &&
        PY=$ROOT/bench/.venv/bin/python
fi
T=""
if [ -n "$PY" ]; then
    stamp "PyTorch ($PY): r50 batch $BATCH K $K, $ITERS steps, fp32 (TF32 off)"
    T_LINE=$(timeout 240 "$PY" "$ROOT/bench/gpu/iresnet_torch_gpu.py" r50 "$BATCH" "$ITERS" "$K" 2>&1 | grep -v Warning | tail -1)
    echo "$T_LINE"
    T=$(echo "$T_LINE" | sed -n 's/.*samples\/s \([0-9.]*\).*/\1/p')
    if [ -n "${PFCPS_GPU_AMP:-}" ]; then
        timeout 120 "$PY" "$ROOT/bench/gpu/iresnet_torch_gpu.py" r50 "$BATCH" "$ITERS" "$K" --amp 2>&1 | tail -1
    fi
else
    echo "PyTorch with CUDA: not available on this machine (no ratio)"
fi

if [ -n "$P" ] && [ -n "$T" ]; then
    R=$(awk -v p="$P" -v t="$T" 'BEGIN { printf "%.3f", p / t }')
    echo "RESULT r50 fp32 batch $BATCH K $K: pfcps $P samples/s, PyTorch $T samples/s, ratio pfcps/PyTorch $R"
fi
stamp "done (tests rc $RC_TESTS, pfcps bench rc $RC_P)"
[ "$RC_TESTS" = 0 ] && [ "$RC_P" = 0 ]
