#!/bin/sh
# Runs test_tb_events.py with PFCPS_PYTHON (tests/pyenv.sh's venv); exits 77 (meson: SKIP), saying why, when
# that interpreter or its tensorboard package is missing.
# usage: test_tb_events.sh TB_WRITE_SCALARS
if [ -z "${PFCPS_PYTHON:-}" ] || [ ! -x "$PFCPS_PYTHON" ]; then
    echo "SKIP: PFCPS_PYTHON is not set to a Python interpreter (tests/pyenv.sh makes one)"
    exit 77
fi
if ! "$PFCPS_PYTHON" -c 'import tensorboard' 2>/dev/null; then
    echo "SKIP: $PFCPS_PYTHON has no tensorboard module (tests/pyenv.sh installs it)"
    exit 77
fi
exec "$PFCPS_PYTHON" "$(dirname "$0")/test_tb_events.py" "$@"
