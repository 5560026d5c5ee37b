#!/usr/bin/env bash
# Worker 0's startup dump says where the join secret came from. The run config it dumps comes from the
# rendezvous, which never sends the secret, so it used to say "(from PFCPS_SECRET)" for a secret set in the
# config file (with PFCPS_SECRET unset). Config secret -> "(set)"; environment -> "(from PFCPS_SECRET)".
set -uo pipefail
SERVER=$1 WORKER=$2
TMP=$(mktemp -d)
source "$(dirname "$0")/cluster.sh"
export OMP_NUM_THREADS=1
run() { # run SECRET_LINE: one server + one worker, 1 step
  local port; port=$(free_port)
  cat >"$TMP/run.ini" <<INI
[train]
network = r18_w8
embedding_size = 16
batch_size = 2
output = $TMP/out
[data]
rec = synthetic
num_classes = 4
num_image = 8
num_workers = 1
[cluster]
rendezvous = 127.0.0.1:$port
$1
INI
  start_cluster "$TMP/run.ini" 1 1 --max-steps 1
  wait_all "${WPIDS[@]}" || { show_logs; fail "the worker failed ($1)"; }
  stop_servers
}
unset PFCPS_SECRET
run "secret = file-secret"
grep -E -q ": secret +\(set\)$" "$TMP/worker0.log" || { grep ': secret' "$TMP/worker0.log"; fail "secret from the config file not shown as (set)"; }
echo "ok: config secret: $(grep -o ': secret.*' "$TMP/worker0.log")"
export PFCPS_SECRET=env-secret
run ""
grep -E -q ": secret +\(from PFCPS_SECRET\)$" "$TMP/worker0.log" || { grep ': secret' "$TMP/worker0.log"; fail "secret from the environment not shown as such"; }
echo "ok: environment secret: $(grep -o ': secret.*' "$TMP/worker0.log")"
echo PASS
