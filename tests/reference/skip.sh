# How a shell test reports a missing reference or Python dependency, in one place (sourced; tests/reference/ref.h
# is the C side): SKIP (exit 77) naming what is missing, except under PFCPS_REQUIRE_REFERENCES=1 (set by
# .ci/run), where it is a FAIL (exit 1): CI cannot pass without its references.
# Functions:
#   ref_skip WHY...           SKIP or FAIL, as above, with the reason WHY
#   ref_python [MODULE...]    returns when $PFCPS_PYTHON (tests/pyenv.sh's venv) is an executable that imports
#                             every MODULE; else ref_skip naming what is missing
#   ref_run_py SCRIPT ARGS... runs SCRIPT with $PFCPS_PYTHON and exits with its status; a SCRIPT that exits
#                             77 (it skipped, saying why) is a FAIL under PFCPS_REQUIRE_REFERENCES=1

ref_required() {
  [ -n "${PFCPS_REQUIRE_REFERENCES:-}" ] && [ "$PFCPS_REQUIRE_REFERENCES" != 0 ]
}

ref_skip() {
  if ref_required; then
    echo "FAIL: $* (PFCPS_REQUIRE_REFERENCES=1: a missing reference or Python dependency fails)"
    exit 1
  fi
  echo "SKIP: $*"
  exit 77
}

ref_python() {
  [ -n "${PFCPS_PYTHON:-}" ] || ref_skip "PFCPS_PYTHON is not set (tests/pyenv.sh makes it)"
  [ -x "$PFCPS_PYTHON" ] || ref_skip "PFCPS_PYTHON=$PFCPS_PYTHON is not an executable (tests/pyenv.sh)"
  local m
  for m in "$@"; do
    "$PFCPS_PYTHON" -c "import $m" 2>/dev/null ||
      ref_skip "$PFCPS_PYTHON has no $m module (tests/pyenv.sh installs it)"
  done
}

ref_run_py() {
  ref_python
  local rc=0
  "$PFCPS_PYTHON" "$@" || rc=$?
  if [ "$rc" -eq 77 ] && ref_required; then
    echo "FAIL: $1 skipped (PFCPS_REQUIRE_REFERENCES=1: a missing reference or Python dependency fails)"
    exit 1
  fi
  exit "$rc"
}
