#!/usr/bin/env bash
# Packs a prebuilt GPU check for a machine with a GPU that cannot build pfcps (no Debian -dev packages, no
# network): builds here (nvcc, cuDNN and cuBLAS headers; deploy/setup-deps.sh's packages) the cuda suite's test
# programs, bench/gpu/bench_gpu and the daemons for the GPU's architecture, and writes into OUT
#   bundle.tar.xz  the stripped programs under build-gpu/ (the build folder's layout), the generated references
#                  (build-gpu/tests/reference) and lib/: every shared library they load except the C runtime
#                  (libc, libm, libstdc++, ...) and CUDA's own (cudart, cuBLAS, cuDNN, NCCL: the GPU machine's
#                  match its driver), so that the programs run on a newer glibc
#   tests.txt      the cuda suite, one test a line: NAME TIMEOUT COMMAND... (paths under this build folder)
# Then, on the GPU machine, from a checkout of the same commit with OUT beside it (bench/gpu/device_check.sh
# says how): bench/gpu/device_check.sh OUT.
# Usage: bench/gpu/bundle.sh [BUILD (default build-gpu)] [OUT (default .gpu)] [GENCODE]
#   GENCODE: nvcc's architecture flags for a new BUILD (meson option gpu_gencode; default
#   '-gencode=arch=compute_90,code=sm_90', Hopper: H100, H200); an existing BUILD keeps its own.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
B=${1:-build-gpu} OUT=${2:-.gpu} GENCODE=${3:--gencode=arch=compute_90,code=sm_90}
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
command -v nvcc >/dev/null || { echo "bundle.sh: nvcc not found (the CUDA toolkit)"; exit 1; }
if [ ! -f "$B/build.ninja" ]; then
  py=$(tests/pyenv.sh | tail -n 1) # the references need torch (tests/reference/generate.sh)
  meson setup "$B" -Dcuda=enabled -Dbuildtype=release -Dgpu_gencode="$GENCODE" -Dreference_python="$py" >"$B.setup.log"
fi
tests=$(meson introspect "$B" --tests | python3 -c '
import json, os, sys
b = os.path.abspath(sys.argv[1]) + "/"
for t in json.load(sys.stdin):
    if "pfcps:cuda" not in t["suite"] or t["name"].endswith("_shared") or "emu" in t["name"]:
        continue  # the emulated tests run in CI; _shared: the ../shared reference set, not carried
    print(t["name"], t["timeout"], " ".join(c.replace(b, "build-gpu/") for c in t["cmd"]))' "$B")
progs=$(echo "$tests" | awk '{print $3}' | sed 's|^build-gpu/||' | sort -u)
progs="$progs bench/gpu/bench_gpu server/pfcps-server worker/pfcps-worker tools/pfcps"
echo "bundle.sh: building $(echo "$progs" | wc -w) programs in $B"
# shellcheck disable=SC2086
ninja -C "$B" $progs tests/reference.stamp >/dev/null
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build-gpu/tests" "$stage/lib" "$OUT"
for p in $progs; do
  mkdir -p "$stage/build-gpu/$(dirname "$p")"
  strip -o "$stage/build-gpu/$p" "$B/$p"
done
[ -f "$B/tests/reference/COMPLETE" ] || { echo "bundle.sh: $B/tests/reference is incomplete: $(cat "$B/tests/reference/MISSING" 2>/dev/null)"; exit 1; }
cp -r "$B/tests/reference" "$stage/build-gpu/tests/"
for p in $progs; do ldd "$B/$p"; done | awk '/=>/ {print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|libpthread|librt|libresolv|libgcc_s|libstdc\+\+)\.so|/(libcudart|libcublas|libcublasLt|libcudnn|libnccl)\.so' |
  while read -r l; do cp -L "$l" "$stage/lib/"; done
echo "$tests" >"$OUT/tests.txt"
tar cJf "$OUT/bundle.tar.xz" -C "$stage" .
echo "bundle.sh: $OUT/bundle.tar.xz ($(du -h "$OUT/bundle.tar.xz" | cut -f1)), $(wc -l <"$OUT/tests.txt") tests in $OUT/tests.txt"
