#!/usr/bin/env bash
# Runs a Python test of this folder with $PFCPS_PYTHON (tests/pyenv.sh's venv); SKIP (77) without it.
# Arguments: SCRIPT.py ARGS...
if [ -z "${PFCPS_PYTHON:-}" ]; then echo "SKIP: PFCPS_PYTHON is not set (tests/pyenv.sh)"; exit 77; fi
if [ ! -x "$PFCPS_PYTHON" ]; then echo "SKIP: PFCPS_PYTHON=$PFCPS_PYTHON is not an executable"; exit 77; fi
script=$1
shift
exec "$PFCPS_PYTHON" "$(dirname "$0")/$script" "$@"
