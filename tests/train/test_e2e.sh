#!/usr/bin/env bash
# End to end on real faces: 2 servers + 2 workers train a narrow iresnet on 8 ORL identities packed
# into RecordIO by `pfcps pack`. The loss must fall by a clear margin (the mean of the last 5 steps
# below 60% of the mean of the first 5); every daemon exits 0, the servers on SIGTERM.
# A second run is stopped by SIGTERM mid-training: every worker and server exits 0.
set -uo pipefail
SERVER=$1 WORKER=$2 PFCPS=$3 SRC=$4
TMP=$(mktemp -d)
source "$(dirname "$0")/cluster.sh"

mkdir -p "$TMP/stage"
for i in 1 2 3 4 5 6 7 8; do ln -s "$SRC/data/orl/s$i" "$TMP/stage/s$i"; done
"$PFCPS" pack --quiet "$TMP/stage" "$TMP/train" || fail "pack"
port=$(free_port)
cat >"$TMP/run.ini" <<INI
[train]
$ORL_NET
num_epoch = 6
frequent = 5
output = $TMP/out
[data]
rec = $TMP/train
num_classes = 8
num_workers = 1
[cluster]
servers = 2
workers = 2
rendezvous = 127.0.0.1:$port
secret = e2e-test-secret
INI
export OMP_NUM_THREADS=1
start_cluster "$TMP/run.ini" 2 2 --trace "$TMP/trace{r}"
wait_all "${WPIDS[@]}" || { show_logs; fail "a worker failed"; }
stop_servers
n=$(wc -l <"$TMP/trace0")
[ "$n" -eq 24 ] || fail "expected 24 steps (80 images / 16 per step x 6 epochs), trace has $n"
cmp -s "$TMP/trace0" "$TMP/trace1" || fail "the two workers saw different global losses"
read -r first last < <(awk '{l[NR]=$2} END {f=0; e=0; for(i=1;i<=5;i++){f+=l[i]; e+=l[NR-5+i]} print f/5, e/5}' "$TMP/trace0")
echo "loss: mean of first 5 steps $first, mean of last 5 steps $last"
awk -v f="$first" -v l="$last" 'BEGIN {exit !(l < 0.6 * f)}' || fail "loss did not fall: $first -> $last"
grep -q "Speed .* samples/sec   Loss .*   LearningRate .*   Epoch: .*   Global Step: 20   Required:" "$TMP/out/training.log" \
  || fail "training.log lacks the arcface_torch log line for step 20"
[ -s "$TMP/out/model.ckpt" ] || fail "no backbone checkpoint"
grep -q "training done: 24 of 24 steps" "$TMP/out/training.log" || fail "training.log lacks 'training done: 24 of 24 steps'"

# SIGTERM mid-run: everyone stops after the current step and exits 0.
port=$(free_port)
sed -i "s/^rendezvous = .*/rendezvous = 127.0.0.1:$port/; s/^num_epoch = .*/num_epoch = 1000/" "$TMP/run.ini"
start_cluster "$TMP/run.ini" 2 2 --trace "$TMP/term{r}"
for _ in $(seq 1 600); do
  [ -s "$TMP/term0" ] && [ "$(wc -l <"$TMP/term0")" -ge 2 ] && break
  sleep 0.1
done
[ "$(wc -l <"$TMP/term0")" -ge 2 ] || { show_logs; fail "the second run did not start training"; }
# Workers first (as the launcher does), then the servers they were talking to.
for p in "${WPIDS[@]}"; do kill -TERM "$p"; done
wait_all "${WPIDS[@]}" || { show_logs; fail "a worker did not exit 0 on SIGTERM"; }
stop_servers
# The final line says the run was cut short, not done.
grep -q "training stopped on request: [0-9]* of 4000 steps" "$TMP/out/training.log" ||
  { show_logs; fail "the stopped run's log does not say 'training stopped on request: N of 4000 steps (4 per epoch x 1000 epochs)'"; }
echo "PASS: loss $first -> $last over $n steps; all daemons exited 0 (also on SIGTERM mid-run)"
