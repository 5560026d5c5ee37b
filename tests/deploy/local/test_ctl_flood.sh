#!/usr/bin/env bash
# Pre-authentication denial of service: 1000 idle and 100 slow (one byte every 0.5 s) unauthenticated TCP
# connections to the rendezvous port, opened as the run forms, must not keep a 2 + 2 run from forming: strangers
# are evicted oldest first when the rendezvous is full (and when server 0 runs out of file descriptors), must
# join within 5 s, and members retry a refusal. The run must train to the same per-step losses as an undisturbed
# run, and server 0's log must hold a bounded number of lines about the strangers (summaries, not one each).
source "$(dirname "$0")/cluster.sh" "$@"
export OMP_NUM_THREADS=1
pack_orl 4
cfg() {
  run_ini "$TMP/$1.ini" 2 2 flood-secret <<INI
[train]
$ORL_NET
num_epoch = 1
output = $TMP/$1
[data]
rec = $TMP/train
num_classes = 4
num_workers = 1
INI
}
cfg ref
run_cluster "reference run" "$TMP/ref.ini" 2 2 --trace "$TMP/ref.trace{r}" --max-steps 4
cfg flood
python3 - "$PORT" >"$TMP/flood.out" 2>&1 <<'PY' &
import socket, sys, time, resource
port = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
idle, slow = [], []
t0 = time.time()
while len(idle) < 1000 and time.time() - t0 < 30:
    s = socket.socket()
    try:
        s.connect(("127.0.0.1", port))
        idle.append(s)
    except OSError:
        s.close()
        time.sleep(0.02)
for _ in range(100):
    s = socket.socket()
    try:
        s.connect(("127.0.0.1", port)); slow.append(s)
    except OSError:
        s.close()
print("opened", len(idle), "idle and", len(slow), "slow connections", flush=True)
end = time.time() + 40
while time.time() < end:
    for s in slow:
        try: s.send(b"\x01")
        except OSError: pass
    time.sleep(0.5)
PY
FLOOD=$!
PIDS+=($FLOOD)
sleep 1
start_cluster "$TMP/flood.ini" 2 2 --trace "$TMP/flood.trace{r}" --max-steps 4
wait_all "${WPIDS[@]}" || { show_logs; cat "$TMP/flood.out"; die "the run did not train under the flood"; }
stop_servers
kill "$FLOOD" 2>/dev/null
cat "$TMP/flood.out"
for r in 0 1; do
  cmp -s "$TMP/ref.trace$r" "$TMP/flood.trace$r" || { diff "$TMP/ref.trace$r" "$TMP/flood.trace$r" | head; die "worker $r's losses differ under the flood"; }
done
n=$(grep -c "without a join\|evicted\|too many connections\|no join\|before join\|out of file descriptors" "$TMP/server0.log")
echo "server 0 log: $n lines about unauthenticated connections; the last:"
grep "without a join\|evicted\|too many connections\|no join\|out of file descriptors" "$TMP/server0.log" | tail -2
[ "$n" -le 40 ] || die "$n log lines about the strangers (want a bounded summary)"
grep -q "run formed" "$TMP/server0.log" || die "the run did not form"
echo PASS
