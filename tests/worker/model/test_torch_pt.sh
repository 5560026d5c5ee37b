#!/usr/bin/env bash
# Runs test_torch_pt.py (torch writes arcface_torch's model.pt / checkpoint_gpu_0.pt, pfcps loads them) with
# $PFCPS_PYTHON (tests/pyenv.sh's venv over Debian's python3-torch). Without it, or when the script exits 77 for
# want of torch or numpy: SKIP, or FAIL under PFCPS_REQUIRE_REFERENCES=1 (tests/reference/skip.sh).
# Arguments: TEST_TORCH_PT (the test program, whose --forward and --tensor modes are pfcps's side).
. "$(dirname "$0")/../../reference/skip.sh"
ref_run_py "$(dirname "$0")/test_torch_pt.py" "$@"
