#!/usr/bin/env bash
# deploy/quickstart.sh when the launcher refuses its config (`--set num_epoch=1` against the quick start's
# warmup_epoch = 1): it exits with the launcher's status (2), the launcher's and config-get's messages are
# shown, and no summary is printed, though a previous run's training log is there to be misread.
# The refusal comes before any daemon starts, so the script runs in a copy of the tree's deploy/ folder with
# this build's binaries linked in, a stand-in for setup-deps.sh and meson (nothing to install or build), a
# tiny pack (one ORL identity) and a stale training log.
# Arguments: SERVER WORKER PFCPS SRC BUILD
set -uo pipefail
. "$(dirname "$0")/../expect.sh"
SERVER=$1 WORKER=$2 PFCPS=$3 SRC=$4
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

T=$TMP/tree
mkdir -p "$T/deploy/local" "$T/deploy/configs" "$T/build/tools" "$T/build/server" "$T/build/worker" "$TMP/bin" \
  "$T/work_dirs/quickstart/data" "$TMP/stage"
cp "$SRC/deploy/quickstart.sh" "$T/deploy/" && cp "$SRC/deploy/local/launch.sh" "$T/deploy/local/" &&
  cp "$SRC/deploy/configs/quickstart.ini" "$T/deploy/configs/" || die "copying deploy/"
printf '#!/bin/sh\nexit 0\n' >"$T/deploy/setup-deps.sh" && printf '#!/bin/sh\nexit 0\n' >"$TMP/bin/meson" &&
  chmod +x "$T/deploy/setup-deps.sh" "$TMP/bin/meson" && touch "$T/build/build.ninja"
ln -s "$(realpath "$PFCPS")" "$T/build/tools/pfcps" && ln -s "$(realpath "$SERVER")" "$T/build/server/pfcps-server" &&
  ln -s "$(realpath "$WORKER")" "$T/build/worker/pfcps-worker"
ln -sfn "$SRC/data/orl/s1" "$TMP/stage/s1"
"$PFCPS" pack "$TMP/stage" "$T/work_dirs/quickstart/data/train" >/dev/null 2>&1 || die "packing one identity"
cat >"$T/work_dirs/quickstart/training.log" <<'EOF'
Training: 2026-01-01 00:00:00 Speed 99.00 samples/sec   Loss 9.8765   LearningRate 0.100000   Epoch: 7   Global Step: 4242
training done: 12345.6 samples/sec
EOF
touch -d '2 days ago' "$T/work_dirs/quickstart/training.log"

out=$(PATH="$TMP/bin:$PATH" timeout 60 bash "$T/deploy/quickstart.sh" --set num_epoch=1 2>&1)
rc=$?
echo "$out"
[ "$rc" -eq 2 ] || die "quickstart with a refused config: exit $rc, wanted the launcher's 2"
grep -q "warmup 1 epochs is not shorter than num_epoch 1" <<<"$out" || die "config-get's refusal not shown"
grep -q "launch: config 'deploy/configs/quickstart.ini' refused" <<<"$out" || die "the launcher's refusal not shown"
grep -q "the launcher failed (exit 2" <<<"$out" || die "quickstart does not say the launcher failed"
! grep -Eq "quickstart summary|4242|9\.8765|12345\.6|verification on unseen" <<<"$out" ||
  die "a summary printed from the previous run's log"
echo PASS
