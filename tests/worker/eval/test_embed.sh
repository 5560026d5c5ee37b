#!/usr/bin/env bash
# Runs test_embed.py with $PFCPS_PYTHON (tests/pyenv.sh); SKIP (77) without it.
# Arguments: PFCPS MAKE_CKPT SRC
if [ -z "${PFCPS_PYTHON:-}" ]; then echo "SKIP: PFCPS_PYTHON is not set (tests/pyenv.sh)"; exit 77; fi
exec "$PFCPS_PYTHON" "$(dirname "$0")/test_embed.py" "$@"
