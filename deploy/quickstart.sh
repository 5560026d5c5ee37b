#!/usr/bin/env bash
# Quick start: set-up, build, and run the main job on a local cluster (servers + workers on 127.0.0.1).
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/setup-deps.sh
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
if [ ! -f build/build.ninja ]; then meson setup build >/dev/null; fi
meson compile -C build
echo
echo "quickstart: built pfcps. The training loop (pfcps-worker + pfcps-server) is not built yet;"
echo "quickstart: nothing was trained. See README.md 'Status' for what exists."
