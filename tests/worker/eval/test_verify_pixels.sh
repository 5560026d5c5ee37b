#!/usr/bin/env bash
# Runs test_verify_pixels.py with $PFCPS_PYTHON (tests/pyenv.sh); SKIP (77) without it.
# Arguments: PFCPS SRC
if [ -z "${PFCPS_PYTHON:-}" ]; then echo "SKIP: PFCPS_PYTHON is not set (tests/pyenv.sh: numpy, scikit-learn, Pillow)"; exit 77; fi
exec "$PFCPS_PYTHON" "$(dirname "$0")/test_verify_pixels.py" "$@"
