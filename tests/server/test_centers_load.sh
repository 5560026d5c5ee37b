#!/usr/bin/env bash
# Runs test_centers_load.py (files written by torch and by hand in safetensors' format, loaded by
# server/centers_load.c) with $PFCPS_PYTHON. Without it, or when the script exits 77 for want of torch or numpy:
# SKIP, or FAIL under PFCPS_REQUIRE_REFERENCES=1 (tests/reference/skip.sh).
# Arguments: TEST_CENTERS_LOAD (the test program).
. "$(dirname "$0")/../reference/skip.sh"
ref_run_py "$(dirname "$0")/test_centers_load.py" "$@"
