#!/usr/bin/env bash
# Hostile surroundings soak: a 2 + 2 run on 10 ORL identities (6 epochs) trains while, for its whole length,
#   - 300 strangers churn connections to the rendezvous (connect, stay 0.5-3 s, sometimes send garbage or one
#     byte at a time, close; again), about 100-200 connections a second;
#   - a raw TCP client writes garbage into every server's and worker's data-plane port every 0.2 s.
# The run must finish with exactly the per-step losses of an undisturbed run; prints the number of log lines
# the daemons wrote about the strangers and the time ratio against the undisturbed run.
# usage: bench/hostile/hostile.sh [-b BUILD]
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$SRC/build
[ "${1:-}" = -b ] && BUILD=$2
export OMP_NUM_THREADS=1 PFCPS_SECRET=hostile-secret
TMP=$(mktemp -d)
trap 'kill $FLOOD 2>/dev/null; pkill -KILL -f "$TMP/" 2>/dev/null; rm -rf "$TMP"' EXIT
FLOOD=
mkdir -p "$TMP/stage"
for i in $(seq 1 10); do ln -sfn "$SRC/data/orl/s$i" "$TMP/stage/s$i"; done
"$BUILD/tools/pfcps" pack --quiet "$TMP/stage" "$TMP/train" >/dev/null || exit 1
cfg() {
  PORT=$(python3 "$SRC/tests/free_port.py") # below the ephemeral range (that file says why)
  cat >"$TMP/$1.ini" <<INI
[train]
network = r18_w8
embedding_size = 32
batch_size = 8
num_epoch = 6
warmup_epoch = 1
output = $TMP/$1
[data]
rec = $TMP/train
num_classes = 10
num_workers = 1
[cluster]
servers = 2
workers = 2
rendezvous = 127.0.0.1:$PORT
INI
}
run() { # NAME: starts the 4 daemons with traces, waits for the workers, stops the servers
  local p=() r
  for r in 0 1; do "$BUILD/server/pfcps-server" --config "$TMP/$1.ini" --rank $r >"$TMP/$1.s$r.log" 2>&1 & p+=($!); done
  for r in 0 1; do "$BUILD/worker/pfcps-worker" --config "$TMP/$1.ini" --rank $r --trace "$TMP/$1.trace$r" >"$TMP/$1.w$r.log" 2>&1 & p+=($!); done
  wait "${p[2]}" && wait "${p[3]}"; local rc=$?
  wait "${p[0]}" "${p[1]}" 2>/dev/null
  return $rc
}
cfg calm
t0=$(date +%s.%N); run calm || { tail "$TMP"/calm.*.log; exit 1; }
t_calm=$(python3 -c "import time; print(round(time.time() - $t0, 1))")
cfg storm
python3 - "$PORT" "$TMP" <<'PY' >"$TMP/flood.out" 2>&1 &
import os, random, re, socket, subprocess, sys, threading, time
port, tmp = int(sys.argv[1]), sys.argv[2]
random.seed(1)
stop = time.time() + 600
n_conn = [0]
def stranger():
    while time.time() < stop:
        s = socket.socket()
        try:
            s.connect(("127.0.0.1", port)); n_conn[0] += 1
            k = random.random()
            if k < 0.3: s.send(os.urandom(random.randint(1, 64)))
            elif k < 0.5:
                for _ in range(5): s.send(b"\x00"); time.sleep(0.3)
            time.sleep(random.uniform(0.5, 3.0))
        except OSError:
            time.sleep(0.1)
        finally:
            s.close()
def data_ports():
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    ports = []
    for line in out.splitlines():
        if "pfcps-" in line and tmp[:0] == "":
            m = re.search(r"127\.0\.0\.1:(\d+)", line)
            if m and int(m.group(1)) != port: ports.append(int(m.group(1)))
    return ports
def garbage():
    while time.time() < stop:
        for p in data_ports():
            try:
                s = socket.create_connection(("127.0.0.1", p), timeout=0.5); s.send(os.urandom(512)); s.close()
            except OSError: pass
        time.sleep(0.2)
ts = [threading.Thread(target=stranger, daemon=True) for _ in range(300)] + [threading.Thread(target=garbage, daemon=True)]
for t in ts: t.start()
while True:
    time.sleep(5); print("connections so far:", n_conn[0], flush=True)
PY
FLOOD=$!
sleep 1
t0=$(date +%s.%N); run storm; rc=$?
t_storm=$(python3 -c "import time; print(round(time.time() - $t0, 1))")
kill $FLOOD 2>/dev/null
same=yes
for r in 0 1; do cmp -s "$TMP/calm.trace$r" "$TMP/storm.trace$r" || same=no; done
lines=$(cat "$TMP"/storm.*.log | grep -c "without a join\|evicted\|too many connections\|no join\|before join\|dropped a message\|out of file descriptors")
steps=$(wc -l <"$TMP/storm.trace0")
echo "storm: exit $rc, $steps steps, losses identical to the calm run: $same; $(tail -1 "$TMP/flood.out"); $lines daemon log lines about strangers; $t_storm s vs $t_calm s calm ($(python3 -c "print(round($t_storm / $t_calm, 2))")x)"
[ "$rc" -eq 0 ] && [ "$same" = yes ]
