#!/usr/bin/env bash
# deploy/local/launch.sh when a server exits before the workers are done (here server 0 refuses to start: a
# shard of 10^12 classes does not fit in any machine's memory): the launcher stops the workers at once and
# fails naming the server, instead of leaving them to wait ctl_timeout (30 s) for a rendezvous that is gone.
# Nothing of this run may be left running.
set -uo pipefail
SRC=$1 BUILD=$2
TMP=$(mktemp -d)
lp=
cleanup() {
  if [ -n "$lp" ] && kill -0 "$lp" 2>/dev/null; then kill -KILL -- "-$lp" 2>/dev/null; wait "$lp" 2>/dev/null; fi
  rm -rf "$TMP"
}
trap cleanup EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$TMP/run.ini" <<INI
[train]
network = r18_w8
embedding_size = 16
output = $TMP/out
[data]
rec = synthetic
num_classes = 1000000000000
[cluster]
servers = 2
workers = 1
rendezvous = 127.0.0.1:$port
secret = launcher-secret
INI
export OMP_NUM_THREADS=1
t0=$SECONDS
setsid "$SRC/deploy/local/launch.sh" -c "$TMP/run.ini" -b "$BUILD" >"$TMP/launch.out" 2>&1 &
lp=$!
for _ in $(seq 1 200); do kill -0 "$lp" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$lp" 2>/dev/null; then cat "$TMP/launch.out"; echo "FAIL: launcher still running 20 s after server 0 refused to start"; exit 1; fi
rc=0; wait "$lp" || rc=$?
lp=
dt=$((SECONDS - t0))
cat "$TMP/launch.out"
[ "$rc" -ne 0 ] || { echo "FAIL: launcher exit 0"; exit 1; }
grep -q "launch: server 0 exited before the workers finished" "$TMP/launch.out" || { echo "FAIL: the launcher does not name server 0"; exit 1; }
grep -q "refusing to start: shard 0/2 needs" "$TMP/out/logs/server0.log" || { echo "FAIL: server 0 did not refuse"; exit 1; }
left=$(pgrep -f "$TMP/run.ini" | wc -l)
[ "$left" -eq 0 ] || { echo "FAIL: $left processes left behind"; exit 1; }
echo "PASS: launcher exit $rc after $dt s, nothing left"
