#!/usr/bin/env bash
# Runs test_fp16_hook.py (pfcps's fp16 gradient collective against torch DDP's fp16_compress_hook) with
# $PFCPS_PYTHON. Without it, or when the script exits 77 for want of torch or numpy: SKIP, or FAIL under
# PFCPS_REQUIRE_REFERENCES=1 (tests/reference/skip.sh).
# Arguments: FP16_COMM_TOOL SOURCE_ROOT.
. "$(dirname "$0")/../reference/skip.sh"
ref_run_py "$(dirname "$0")/test_fp16_hook.py" "$@"
