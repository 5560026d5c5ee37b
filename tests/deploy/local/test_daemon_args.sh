#!/usr/bin/env bash
# Both daemons refuse bad start-up input with exit 1 and a message naming the problem: no --rank, a rank
# outside the run, no join secret, a rendezvous that is not host:port, an unknown argument, a bad config
# key. Nothing is started (no port is bound).
source "$(dirname "$0")/cluster.sh" "$@"
cat >"$TMP/run.ini" <<INI
[train]
embedding_size = 16
[data]
rec = synthetic
synthetic = varied
num_classes = 10
[cluster]
servers = 2
workers = 3
rendezvous = 127.0.0.1:1
INI
# expect NAME EXPECTED_TEXT COMMAND...: the command, run without PFCPS_SECRET, exits 1 and prints
# EXPECTED_TEXT (fixed string).
expect() {
  local name=$1 text=$2; shift 2
  expect_rc "$name" 1 "$text" env -u PFCPS_SECRET "$@"
}
for d in "$SERVER" "$WORKER"; do
  n=$(basename "$d")
  expect "$n no rank" "--rank is required" "$d" --config "$TMP/run.ini" --set secret=x
  expect "$n unknown argument" "unknown argument '--frobnicate'" "$d" --config "$TMP/run.ini" --rank 0 --frobnicate
  expect "$n bad key" "embedding_sise" "$d" --config "$TMP/run.ini" --set embedding_sise=3 --rank 0
  expect "$n no secret" "no join secret" "$d" --config "$TMP/run.ini" --rank 0
  expect "$n bad rendezvous" "rendezvous" "$d" --config "$TMP/run.ini" --rank 0 --set secret=x --set rendezvous=nohost
done
expect "worker unknown network" "key 'network': unknown network 'r19'" "$WORKER" --config "$TMP/run.ini" --rank 0 --set secret=x --set network=r19
expect "server rank outside" "--rank 2 is outside [0, servers = 2)" "$SERVER" --config "$TMP/run.ini" --rank 2 --set secret=x
expect "worker rank outside" "--rank 3 is outside [0, workers = 3)" "$WORKER" --config "$TMP/run.ini" --rank 3 --set secret=x
# Server 0 on a port that is taken: one clear line, the "rendezvous:" prefix once.
python3 -c 'import socket,time; s=socket.socket(); s.bind(("127.0.0.1",0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(60)' >"$TMP/busy" 2>/dev/null &
holder=$!
for _ in $(seq 1 50); do [ -s "$TMP/busy" ] && break; sleep 0.1; done
read -r busy <"$TMP/busy"
expect "server port taken" "ERROR rendezvous: cannot bind 127.0.0.1:$busy: Address already in use" \
  "$SERVER" --config "$TMP/run.ini" --rank 0 --set secret=x --set "rendezvous=127.0.0.1:$busy"
out=$("$SERVER" --config "$TMP/run.ini" --rank 0 --set secret=x --set "rendezvous=127.0.0.1:$busy" 2>&1)
grep -q "rendezvous: rendezvous:" <<<"$out" && fail "server port taken: doubled prefix: $out"
kill "$holder"; wait "$holder" 2>/dev/null
expect_summary
