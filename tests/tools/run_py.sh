#!/usr/bin/env bash
# Runs a Python test of this folder with $PFCPS_PYTHON (tests/pyenv.sh's venv). Without that interpreter, or
# when the script itself exits 77 for want of a module: SKIP (77), or FAIL under PFCPS_REQUIRE_REFERENCES=1
# (tests/reference/skip.sh).
# Arguments: SCRIPT.py ARGS...
. "$(dirname "$0")/../reference/skip.sh"
script=$1
shift
ref_run_py "$(dirname "$0")/$script" "$@"
