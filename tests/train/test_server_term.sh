#!/usr/bin/env bash
# SIGTERM to a server other than server 0 mid-run: it stops serving (after the apply in progress) and the
# rendezvous tells the workers that it left without leaving the run. The run cannot complete, so the worker
# must exit non-zero naming server[1], even when the step in progress still finished (it used to stop "on
# request" and exit 0, so that deploy/local/launch.sh reported success for a run cut short).
set -uo pipefail
SERVER=$1 WORKER=$2
TMP=$(mktemp -d)
source "$(dirname "$0")/cluster.sh"
export OMP_NUM_THREADS=1
port=$(free_port)
cat >"$TMP/run.ini" <<INI
[train]
network = r18_w8
embedding_size = 16
batch_size = 4
num_epoch = 1000
output = $TMP/out
[data]
rec = synthetic
num_classes = 20
num_image = 400
num_workers = 1
[cluster]
servers = 2
workers = 1
rendezvous = 127.0.0.1:$port
secret = term-secret
INI
start_cluster "$TMP/run.ini" 2 1 --trace "$TMP/trace"
for _ in $(seq 1 600); do [ -s "$TMP/trace" ] && break; sleep 0.1; done
[ -s "$TMP/trace" ] || { show_logs; fail "training did not start"; }
kill -TERM "${SPIDS[1]}"
t0=$SECONDS
for _ in $(seq 1 300); do kill -0 "${WPIDS[0]}" 2>/dev/null || break; sleep 0.1; done
kill -0 "${WPIDS[0]}" 2>/dev/null && { show_logs; fail "the worker still runs 30 s after server 1 stopped"; }
rc=0; wait "${WPIDS[0]}" || rc=$?
[ "$rc" -ne 0 ] || { show_logs; fail "the worker exited 0 although server 1 stopped mid-run"; }
grep -q "server\[1\].*disconnected without leaving the run" "$TMP/worker0.log" || { show_logs; fail "the worker does not name server 1"; }
kill -0 "${SPIDS[0]}" 2>/dev/null || fail "server 0 stopped serving when server 1 left"
SPIDS=("${SPIDS[0]}")
stop_servers
echo "ok: SIGTERM to server 1: worker exited $rc after $((SECONDS - t0)) s"

# The whole job stopped at once (SIGTERM to the worker and to server 1 together, as systemd or a scheduler
# does): a requested stop, so the worker exits 0 even though it also hears that server 1 left.
rm -f "$TMP/trace"
start_cluster "$TMP/run.ini" 2 1 --trace "$TMP/trace"
for _ in $(seq 1 600); do [ -s "$TMP/trace" ] && break; sleep 0.1; done
[ -s "$TMP/trace" ] || { show_logs; fail "training did not start (2)"; }
kill -TERM "${WPIDS[0]}" "${SPIDS[1]}"
for _ in $(seq 1 300); do kill -0 "${WPIDS[0]}" 2>/dev/null || break; sleep 0.1; done
rc=0; wait "${WPIDS[0]}" || rc=$?
[ "$rc" -eq 0 ] || { show_logs; fail "the worker exited $rc when stopped together with server 1, want 0"; }
SPIDS=("${SPIDS[0]}")
stop_servers
echo "ok: SIGTERM to the worker and server 1 together: worker exited 0"
echo PASS
