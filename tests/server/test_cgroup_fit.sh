#!/usr/bin/env bash
# A server inside a memory cgroup smaller than its shard (a container limit, invisible to MemAvailable) refuses
# at start naming both numbers, instead of starting and being OOM-killed when rows are first touched. The shard
# here: 500k classes x D = 128 on one server = 0.48 GiB; the cgroup: 128 MiB (small, so MemAvailable passes). Skips (77) where no memory cgroup can
# be made (not root, no cgroup v1 memory controller or v2 memory delegation).
# usage: test_cgroup_fit.sh PFCPS_SERVER
set -uo pipefail
. "$(dirname "$0")/../expect.sh"
SERVER=$1
[ "$(id -u)" -eq 0 ] || skip "needs root to make a memory cgroup"
CG=
if [ -d /sys/fs/cgroup/memory ] && mkdir "/sys/fs/cgroup/memory/pfcps_fit_$$" 2>/dev/null; then
  CG=/sys/fs/cgroup/memory/pfcps_fit_$$
  echo $((128 << 20)) >"$CG/memory.limit_in_bytes" || { rmdir "$CG"; skip "cannot set a v1 limit"; }
elif [ -f /sys/fs/cgroup/cgroup.controllers ] && mkdir "/sys/fs/cgroup/pfcps_fit_$$" 2>/dev/null; then
  CG=/sys/fs/cgroup/pfcps_fit_$$
  echo $((128 << 20)) >"$CG/memory.max" 2>/dev/null || { rmdir "$CG"; skip "no v2 memory controller here"; }
else
  skip "no memory cgroup can be made here"
fi
TMP=$(mktemp -d)
trap 'rmdir "$CG" 2>/dev/null; rm -rf "$TMP"' EXIT
port=$(python3 "$(dirname "$0")/../free_port.py") # below the ephemeral range: see free_port.py
cat >"$TMP/run.ini" <<INI
[train]
embedding_size = 128
output = $TMP/out
[data]
rec = synthetic
synthetic = varied
num_classes = 500000
[cluster]
servers = 1
workers = 1
rendezvous = 127.0.0.1:$port
secret = fit-secret
INI
# 500000 x (128 x 8 + 9) bytes = 0.481 GiB; 128 MiB = 0.125 GiB (printed as 0.12).
# The server runs inside the cgroup (a subshell moved there first); the test shell stays outside.
rc=0
( echo $BASHPID >"$CG/cgroup.procs" && exec "$SERVER" --config "$TMP/run.ini" --rank 0 ) >"$TMP/server.log" 2>&1 || rc=$?
cat "$TMP/server.log" | grep -v " INFO " | head -5
[ "$rc" -eq 1 ] || die "server exit $rc inside a 128 MiB cgroup with a 0.48 GiB shard (want 1: refused)"
grep -q "memory cgroup (container limit) allows [0-9.]* GiB more (limit 0.12 GiB)" "$TMP/server.log" ||
  die "the refusal does not name the cgroup's limit"
grep -q "needs 0.48 GiB (500000 rows" "$TMP/server.log" || die "the refusal does not name the shard's size"
echo PASS
