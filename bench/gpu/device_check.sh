#!/usr/bin/env bash
# The GPU check from a prebuilt bundle (bench/gpu/bundle.sh), on a machine with an NVIDIA GPU, its driver,
# CUDA 13's runtime and cuBLAS, cuDNN 9 and NCCL 2 somewhere (the toolkit's folders or pip's nvidia-* packages,
# searched), and python3 with CUDA PyTorch; no build tools needed. Run from the root of a checkout of the
# bundle's commit. Stages, each cut to what is left of PFCPS_GPU_BUDGET seconds (default 420):
#   1. the cuda suite (every layer vs the CPU device, the reference networks, the GPU head and pfc_cuda vs the
#      references, fp16/bf16 devices, NCCL): one line per test, the logs in $OUT/tests.log;
#   2. the r50 training step (batch 128, K 100000) of pfcps (fp32, cuda-fp16) and of PyTorch (fp32,
#      autocast + GradScaler): samples/s and the ratios;
#   3. PyTorch's own mixed-precision error on test_model_half's network (bench/gpu/half_error_torch.py);
#   4. arcface_torch parity with device = cuda (tests/deploy/local/test_arcface_parity.sh, one-worker runs);
#   5. end to end: 1 server + 1 worker, device = cuda, fp16 = true, r50 on ORL, 30 steps: the loss must fall;
#   6. compute-sanitizer memcheck on the head, pfc and layer tests, in what time is left.
# The bundle's programs keep the build folder's absolute paths in their tests' environment, so the checkout is
# also reached as /work/main (a symbolic link is made when that path is free). The bundle's lib/ (Debian's
# builds of libfabric, oneDNN, OpenSSL, ...) is put before the machine's libraries for pfcps's programs only
# (the parity test's Python, started by that test's script, gets it too). A SKIP (exit 77) of a cuda test
# counts as a failure here: on a GPU machine it means the GPU was not visible.
# Usage: bench/gpu/device_check.sh [BUNDLE_DIR (default .gpu)]    Output: stdout, and files under $OUT if set.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 1
BD=$(cd "${1:-.gpu}" && pwd) || { echo "device_check: no bundle folder ${1:-.gpu}"; exit 1; }
T0=$(date +%s)
BUDGET=${PFCPS_GPU_BUDGET:-420}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
stamp() { echo "[device_check +$(($(date +%s) - T0))s] $*"; }
# left CAP: seconds for the next stage, min(CAP, what is left of BUDGET); 0 when under 10 s are left.
left() {
  local l=$((T0 + BUDGET - $(date +%s)))
  [ "$1" -lt "$l" ] && l=$1
  [ "$l" -lt 10 ] && l=0
  echo "$l"
}
export PATH=$PATH:/usr/local/cuda/bin
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader ||
  { echo "device_check: nvidia-smi failed: no GPU or driver"; exit 1; }
rm -rf "$BD/x" && mkdir -p "$BD/x" && tar xJf "$BD/bundle.tar.xz" -C "$BD/x" || { echo "device_check: cannot unpack $BD/bundle.tar.xz"; exit 1; }
if [ -L build-gpu ] || [ ! -e build-gpu ]; then
  ln -sfn "$BD/x/build-gpu" build-gpu
else
  echo "device_check: build-gpu is a folder of this checkout, not the bundle: move it away"; exit 1
fi
[ -e /work/main ] || { mkdir -p /work && ln -s "$ROOT" /work/main; }
LP=$BD/x/lib
for n in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2; do
  f=$(find /usr/local /opt /usr/lib -name "$n" 2>/dev/null | head -1)
  echo "  $n: ${f:-NOT FOUND}"
  [ -n "$f" ] && [[ ":$LP:" != *":$(dirname "$f"):"* ]] && LP=$LP:$(dirname "$f")
done
LP=$LP${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# "${PF[@]}" PROGRAM ARGS...: runs one of the bundle's programs with the bundle's libraries
PF=(env "LD_LIBRARY_PATH=$LP")
export NVIDIA_TF32_OVERRIDE=0 PFCPS_SOURCE=$ROOT PFCPS_BUILD=$ROOT/build-gpu
export PFCPS_REFERENCE=$ROOT/build-gpu/tests/reference
find "$BD/x/build-gpu" -type f -perm -u+x | while read -r b; do
  "${PF[@]}" ldd "$b" | grep -q "not found" && echo "  $b: $("${PF[@]}" ldd "$b" | grep 'not found' | tr -d '\t' | tr '\n' ' ')"
done
RC=0

stamp "1. the cuda suite"
: >"$OUT/tests.log"
while read -r name to cmd; do
  S=$(left "$to")
  [ "$S" -gt 0 ] || { echo "TEST $name: no time left"; RC=1; continue; }
  s=$(date +%s%N)
  # shellcheck disable=SC2086
  "${PF[@]}" timeout "$S" $cmd >"$OUT/t.log" 2>&1 </dev/null
  rc=$?
  printf "TEST %-36s rc=%-3s %6d ms\n" "$name" "$rc" "$((($(date +%s%N) - s) / 1000000))"
  [ "$rc" = 0 ] || { RC=1; grep -E "FAIL|SKIP" "$OUT/t.log" | head -12; }
  { echo "=== $name rc=$rc"; cat "$OUT/t.log"; } >>"$OUT/tests.log"
done <"$BD/tests.txt"
rm -f "$OUT/t.log"

stamp "2. r50 batch 128 K 100000: pfcps vs PyTorch"
rate() { sed -n 's/.*samples\/s \([0-9.]*\).*/\1/p'; }
# bounded CAP CMD...: CMD under timeout min(CAP, what is left); a failure (or no time left) sets RC
bounded() {
  local s
  s=$(left "$1"); shift
  [ "$s" -gt 0 ] || { echo "device_check: no time left for $*"; RC=1; return 1; }
  timeout "$s" "$@" || { echo "device_check: failed ($?): $*"; RC=1; return 1; }
}
P=$(bounded 60 "${PF[@]}" build-gpu/bench/gpu/bench_gpu r50 128 20 100000 2>&1 | tail -1); echo "$P"
P16=$(bounded 60 "${PF[@]}" build-gpu/bench/gpu/bench_gpu r50 128 20 100000 cuda-fp16 2>&1 | tail -1); echo "$P16"
T=$(bounded 60 python3 bench/gpu/iresnet_torch_gpu.py r50 128 20 100000 2>&1 | grep -v Warn | tail -1); echo "$T"
T16=$(bounded 60 python3 bench/gpu/iresnet_torch_gpu.py r50 128 20 100000 --amp 2>&1 | grep -v Warn | tail -1); echo "$T16"
for v in "$P" "$P16" "$T" "$T16"; do [ -n "$(echo "$v" | rate)" ] || RC=1; done
awk -v p="$(echo "$P" | rate)" -v t="$(echo "$T" | rate)" -v p16="$(echo "$P16" | rate)" -v t16="$(echo "$T16" | rate)" 'BEGIN {
  if (p > 0 && t > 0) printf "RESULT r50 fp32: pfcps/PyTorch %.3f\n", p / t
  if (p16 > 0 && t16 > 0) printf "RESULT r50 fp16: pfcps/PyTorch (amp) %.3f\n", p16 / t16 }'

stamp "3. PyTorch's mixed-precision error on test_model_half's network"
bounded 60 python3 bench/gpu/half_error_torch.py 4 >"$OUT/half.log" 2>&1
grep -v Warn "$OUT/half.log"

stamp "4. arcface_torch parity, device = cuda"
S=$(left 240)
if [ "$S" -gt 0 ]; then
  (cd build-gpu && LD_LIBRARY_PATH=$LP PFCPS_PYTHON=$(command -v python3) PFCPS_PARITY_DEVICE=cuda \
    PFCPS_PARITY_RUNS=${PFCPS_PARITY_RUNS:-w1_s1_st_dense_r1,w1_s3_exact_dense_r01} \
    timeout "$S" "$ROOT/tests/deploy/local/test_arcface_parity.sh" server/pfcps-server worker/pfcps-worker \
    tools/pfcps "$ROOT" "$ROOT/build-gpu" >"$OUT/parity.log" 2>&1)
  prc=$?
  grep -E "^(w1|w2)|pfcps vs|^PASS|^FAIL" "$OUT/parity.log"
  echo "parity rc=$prc"
  [ "$prc" = 0 ] || RC=1
fi

stamp "5. end to end: device = cuda, fp16 = true, r50 batch 64, ORL, 30 steps"
if [ "$(left 120)" -ge 30 ]; then
  "${PF[@]}" bench/gpu/e2e.sh build-gpu "$(left 120)" || RC=1
else
  echo "device_check: no time left for the end-to-end run"; RC=1
fi

stamp "6. compute-sanitizer memcheck"
for t in test_cuda_head test_cuda_pfc test_cuda_ops; do
  S=$(left 60)
  [ "$S" -gt 0 ] || { echo "  $t: no time left"; continue; }
  "${PF[@]}" timeout "$S" compute-sanitizer --tool memcheck --error-exitcode 9 "build-gpu/tests/kernels/cuda/$t" >"$OUT/san.log" 2>&1
  src=$?
  echo "  $t: rc=$src $(grep 'ERROR SUMMARY' "$OUT/san.log")"
  [ "$src" = 0 ] || RC=1
done
stamp "done: rc $RC"
exit $RC
