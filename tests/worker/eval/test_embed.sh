#!/usr/bin/env bash
# Runs test_embed.py with $PFCPS_PYTHON (tests/pyenv.sh); without it or its modules: SKIP (77), or FAIL under
# PFCPS_REQUIRE_REFERENCES=1 (tests/reference/skip.sh).
# Arguments: PFCPS MAKE_CKPT SRC
. "$(dirname "$0")/../../reference/skip.sh"
ref_run_py "$(dirname "$0")/test_embed.py" "$@"
