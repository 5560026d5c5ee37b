#!/usr/bin/env bash
# Writes the reference cases into OUT with make_reference.py, for the build (tests/meson.build); cached: runs
# the generator only when OUT/COMPLETE does not hold the key of its inputs (this folder's scripts,
# tests/tools/arcface_nets.py, bench/backbone/iresnet_torch.py and the Python's path).
# When the Python or one of its modules (torch, numpy) is missing, OUT holds only MISSING, saying why, and the
# build goes on: the reference tests report that reason (tests/reference/ref.h) and skip, or fail under
# PFCPS_REQUIRE_REFERENCES=1. Any other failure of the generator fails the build.
# usage: generate.sh PYTHON OUT STAMP   (PYTHON '' = /usr/bin/python3, Debian's, where python3-torch lives,
#                                        else python3 on PATH)
set -uo pipefail
py=$1 out=$2 stamp=$3
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
if [ -z "$py" ]; then
  if [ -x /usr/bin/python3 ]; then py=/usr/bin/python3; else py=$(command -v python3 || echo python3); fi
fi
key=$({ echo "$py"; cat "$here/make_reference.py" "$here/README.md" "$src/tests/tools/arcface_nets.py" \
  "$src/bench/backbone/iresnet_torch.py"; } | sha256sum | cut -d' ' -f1)

if [ -f "$out/COMPLETE" ] && [ "$(cat "$out/COMPLETE")" = "$key" ]; then
  touch "$stamp"
  exit 0
fi
rm -rf "$out" "$out.tmp"
mkdir -p "$(dirname "$out")"
missing() {
  mkdir -p "$out"
  echo "$*" >"$out/MISSING"
  echo "generate.sh: references not generated: $*" >&2
  touch "$stamp"
  exit 0
}
command -v "$py" >/dev/null 2>&1 || missing "python $py not found (meson option reference_python)"
err=$("$py" "$here/make_reference.py" "$out.tmp" 2>&1 >/dev/null)
rc=$?
if [ "$rc" -eq 3 ]; then
  rm -rf "$out.tmp"
  missing "$(echo "$err" | grep MISSING | tail -n 1 | sed 's/^MISSING: //')"
elif [ "$rc" -ne 0 ]; then
  echo "$err" >&2
  echo "generate.sh: $py $here/make_reference.py failed (exit $rc)" >&2
  rm -rf "$out.tmp"
  exit 1
fi
echo "$key" >"$out.tmp/COMPLETE"
mv "$out.tmp" "$out"
touch "$stamp"
