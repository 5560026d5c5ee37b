#!/bin/sh
# Runs test_tb_events.py with PFCPS_PYTHON (tests/pyenv.sh's venv); when that interpreter or its tensorboard
# package is missing: SKIP (77), saying why, or FAIL under PFCPS_REQUIRE_REFERENCES=1 (tests/reference/skip.sh).
# usage: test_tb_events.sh TB_WRITE_SCALARS
. "$(dirname "$0")/../../reference/skip.sh"
ref_python tensorboard
ref_run_py "$(dirname "$0")/test_tb_events.py" "$@"
