#!/usr/bin/env bash
# Runs test_verify_pixels.py with $PFCPS_PYTHON (tests/pyenv.sh: numpy, scikit-learn, Pillow); without them:
# SKIP (77), or FAIL under PFCPS_REQUIRE_REFERENCES=1 (tests/reference/skip.sh).
# Arguments: PFCPS SRC
. "$(dirname "$0")/../../reference/skip.sh"
ref_run_py "$(dirname "$0")/test_verify_pixels.py" "$@"
