#!/usr/bin/env bash
# The test command: set-up, build, and every test suite.
#   1. main build (gcc, -Werror, CUDA device where nvcc exists): every test
#   2. sanitizer build (address + undefined): the suites tagged 'sanitize'; thread sanitizer build of the
#      in-process parameter-server tests (suite 'tsan': progress, apply and gather threads)
#   3. fuzz build (clang, libFuzzer + ASan): each fuzz target for PFCPS_FUZZ_SECONDS (default 45)
# Ends with one line "N passed, N failed, N skipped" and exits non-zero on any failure.
# Environment: PFCPS_TEST_BUILD (build root, default build-tests), PFCPS_SKIP_SANITIZE=1,
# PFCPS_SKIP_FUZZ=1, PFCPS_FUZZ_SECONDS, PFCPS_TEST_ARGS (extra meson test args, e.g. a test name).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

deploy/setup-deps.sh || { echo "setup-deps failed"; echo "0 passed, 1 failed"; exit 1; }
# The independent references some tests compare against (PyTorch, onnxruntime, safetensors, tensorboard,
# scikit-learn): tests that need them skip, naming what is missing, when this fails; under
# PFCPS_REQUIRE_REFERENCES=1 (.ci/run) the failure counts, and so do those tests (tests/reference/skip.sh).
. tests/reference/skip.sh
pyenv_failure=
if py=$(tests/pyenv.sh | tail -n 1) && [ -x "$py" ]; then
  export PFCPS_PYTHON="$py"
elif ref_required; then
  echo "run.sh: tests/pyenv.sh failed (PFCPS_REQUIRE_REFERENCES=1: a failure)"
  pyenv_failure="tests/pyenv.sh (PFCPS_REQUIRE_REFERENCES=1)"
else
  echo "run.sh: tests/pyenv.sh failed: the tests that compare against Python references will skip"
fi
# Slurm and munge for tests/deploy/slurm/test_slurm.sh (it skips, naming them, when they are missing).
tests/deploy/slurm/deps.sh || echo "run.sh: tests/deploy/slurm/deps.sh failed: the Slurm test will skip"
# Prometheus and promtool for tests/deploy/monitoring (they skip, naming them, when missing).
tests/deploy/monitoring/deps.sh || echo "run.sh: tests/deploy/monitoring/deps.sh failed: the monitoring tests will skip"
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"

B=${PFCPS_TEST_BUILD:-build-tests}
FUZZ_SECONDS=${PFCPS_FUZZ_SECONDS:-45}
failures=()
[ -n "$pyenv_failure" ] && failures+=("$pyenv_failure")
logs=()

# setup_build DIR [meson options...]: configures DIR (reconfigures when it exists).
setup_build() {
  local dir=$1; shift
  if [ -f "$dir/build.ninja" ]; then
    meson setup --reconfigure "$dir" "$@" >"$dir.setup.log" 2>&1
  else
    mkdir -p "$(dirname "$dir")"
    meson setup "$dir" "$@" >"$dir.setup.log" 2>&1
  fi
}

# suite_targets DIR SUITE: the executables of SUITE's tests in the configured build DIR (meson introspect), so
# that a build of one suite compiles exactly what its tests run (a test added to the suite is built with it).
suite_targets() {
  meson introspect "$1" --tests | python3 -c '
import json, os, sys
print(" ".join(sorted({os.path.basename(t["cmd"][0]) for t in json.load(sys.stdin)
                       if "pfcps:" + sys.argv[1] in t["suite"]})))' "$2"
}

# run_build NAME DIR "meson test args" [meson options...]; with COMPILE_SUITE set, only that suite's test
# executables are compiled (and the tests run without rebuilding).
run_build() {
  local name=$1 dir=$2 targs=$3; shift 3
  echo "=== $name build ($dir) ==="
  if ! setup_build "$dir" "$@"; then
    cat "$dir.setup.log"; failures+=("$name: meson setup"); return
  fi
  local COMPILE_TARGETS=
  if [ -n "${COMPILE_SUITE:-}" ]; then
    COMPILE_TARGETS=$(suite_targets "$dir" "$COMPILE_SUITE")
    [ -n "$COMPILE_TARGETS" ] || { failures+=("$name: no test in suite $COMPILE_SUITE"); return; }
  fi
  # shellcheck disable=SC2086
  if ! meson compile -C "$dir" ${COMPILE_TARGETS:-} >"$dir.compile.log" 2>&1; then
    tail -60 "$dir.compile.log"; failures+=("$name: compile"); return
  fi
  echo "=== $name tests ==="
  rm -f "$dir/meson-logs/testlog.json"
  local extra=()
  # libFuzzer exits 77 on a crash by default, which meson would count as SKIP: make it a failure.
  [ "$name" = fuzz ] && extra=("--test-args=-max_total_time=$FUZZ_SECONDS -error_exitcode=1")
  # shellcheck disable=SC2086
  [ -n "${COMPILE_TARGETS:-}" ] && extra+=(--no-rebuild) # only the targets built above
  meson test -C "$dir" --print-errorlogs --num-processes 2 $targs "${extra[@]}" ${PFCPS_TEST_ARGS:-}
  logs+=("$name=$dir/meson-logs/testlog.json")
}

run_build main "$B/main" "" -Dwerror=true

if [ "${PFCPS_SKIP_SANITIZE:-0}" != 1 ]; then
  run_build sanitize "$B/sanitize" "--suite sanitize --timeout-multiplier 4" \
    -Db_sanitize=address,undefined -Db_lundef=false -Dcuda=disabled -Dbuildtype=debug -Dwerror=true
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" COMPILE_SUITE=tsan \
    run_build tsan "$B/tsan" "--suite tsan --timeout-multiplier 4" \
    -Db_sanitize=thread -Dcuda=disabled -Dbuildtype=debugoptimized -Dwerror=true
fi

if [ "${PFCPS_SKIP_FUZZ:-0}" != 1 ]; then
  if command -v clang >/dev/null 2>&1; then
    CC=clang run_build fuzz "$B/fuzz" "--suite fuzz --timeout-multiplier 10" \
      -Dfuzz=true -Dcuda=disabled -Dwerror=false -Db_lundef=false
  else
    echo "fuzz: clang not found, fuzz targets not run"
  fi
fi

python3 "$root/tests/summary.py" "${logs[@]}" -- "${failures[@]}"
