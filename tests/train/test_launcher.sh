#!/usr/bin/env bash
# deploy/local/launch.sh passes SIGTERM on (Ctrl-C in a terminal reaches every process of the group directly) and leaves no process behind: a 1-server 2-worker run is
# interrupted once training has started; the launcher must return within 15 s and no pfcps daemon of
# this run may survive it.
set -uo pipefail
SRC=$1 BUILD=$2
TMP=$(mktemp -d)
cleanup() { pkill -KILL -f "$TMP/run.ini" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$TMP/run.ini" <<INI
[train]
network = r18_w8
embedding_size = 16
batch_size = 4
num_epoch = 1000
frequent = 1
output = $TMP/out
[data]
rec = synthetic
num_classes = 20
num_image = 400
num_workers = 1
[cluster]
servers = 1
workers = 2
rendezvous = 127.0.0.1:$port
secret = launcher-secret
INI
export OMP_NUM_THREADS=1
setsid "$SRC/deploy/local/launch.sh" -c "$TMP/run.ini" -b "$BUILD" >"$TMP/launch.out" 2>&1 &
lp=$!
for _ in $(seq 1 600); do grep -q "Global Step: 2 " "$TMP/out/logs/worker0.log" 2>/dev/null && break; sleep 0.1; done
grep -q "Global Step: 2 " "$TMP/out/logs/worker0.log" || { cat "$TMP/launch.out"; echo "FAIL: training did not start"; exit 1; }
t0=$(date +%s.%N)
kill -TERM "$lp"
for _ in $(seq 1 150); do kill -0 "$lp" 2>/dev/null || break; sleep 0.1; done
kill -0 "$lp" 2>/dev/null && { echo "FAIL: launcher still running 15 s after SIGTERM"; exit 1; }
t1=$(date +%s.%N)
sleep 0.5
left=$(pgrep -f "$TMP/run.ini" | wc -l)
[ "$left" -eq 0 ] || { ps aux | grep "$TMP/run.ini" | grep -v grep; echo "FAIL: $left processes left behind"; exit 1; }
grep -q "stop requested" "$TMP/out/logs/worker0.log" || { tail -5 "$TMP/out/logs/worker0.log"; echo "FAIL: worker 0 did not stop cleanly"; exit 1; }
echo "PASS: launcher returned $(echo "$t1 - $t0" | bc 2>/dev/null || echo '?') s after SIGTERM, no process left, workers stopped after a step"
