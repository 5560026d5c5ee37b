#!/usr/bin/env bash
# Hostile clients of the metrics endpoints leave training untouched: 1 server + 1 worker train TINY_NET for
# 400 steps twice, first with metrics off, then with metrics_address = 127.0.0.1:0 on both members while a
# client hammers both endpoints for the whole run: unknown paths, POST, a 64 KiB header, garbage bytes,
# slow-loris requests (one byte every 0.2 s) and floods of 100 idle connections from 127.0.0.2.
#  - The run with the attacks trains the same steps to the same losses and lrs, bit for bit (the --trace
#    lines are equal) and exits 0.
#  - Both endpoints answer a plain GET /metrics with 200 in the middle of the attacks (step 50): one of 3 GETs of
#    at most 5 s each, as a scraper that tries again at its next interval.
#  - The attacker really reached the endpoints: it counts the answers it got (404, 405, 431 or a close), at
#    least one per kind of attack.
source "$(dirname "$0")/cluster.sh" "$@"
command -v curl >/dev/null || skip "curl not found"
write_run() { # write_run FILE [LINE...]
  local f=$1; shift
  run_ini "$f" 1 1 hostile-metrics-secret "$@" <<INI
[train]
$TINY_NET
num_epoch = 1000
output = $TMP/out
[data]
$TINY_DATA
INI
}
# 400 steps (about 10 s here): the GETs at step 50 find the worker still training (at 100 steps it could end
# within a second of step 50, and a GET then met a closed endpoint).
STEPS=400
write_run "$TMP/quiet.ini"
run_cluster "the run without metrics failed" "$TMP/quiet.ini" 1 1 --trace "$TMP/trace.quiet" --max-steps "$STEPS"

write_run "$TMP/loud.ini" "metrics_address = 127.0.0.1:0"
start_cluster "$TMP/loud.ini" 1 1 --trace "$TMP/trace.loud" --max-steps "$STEPS"
addrs=()
for log in "$TMP/server0.log" "$TMP/worker0.log"; do
  wait_log "$log" "metrics on " 30 || { show_logs; die "no 'metrics on' line in $log"; }
  addrs+=("$(sed -n 's/.*metrics on \([^ ]*\).*/\1/p' "$log" | head -1)")
done
python3 - "$TMP/attack.count" "${addrs[@]}" <<'PY' &
import socket, sys, threading, time
out, addrs = sys.argv[1], sys.argv[2:]
answers = 0
lock = threading.Lock()
stop = time.monotonic() + 60
def hp(a):
    h, p = a.rsplit(":", 1)
    return h, int(p)
def one(a, payload, slow=False):
    global answers
    try:
        s = socket.create_connection(hp(a), timeout=3)
        if slow:
            for b in payload:
                s.sendall(bytes([b])); time.sleep(0.2)
        else:
            s.sendall(payload)
        s.settimeout(3)
        s.recv(100)
        with lock:
            answers += 1
    except OSError:
        with lock:
            answers += 1  # closed or reset by the endpoint: an answer too
    finally:
        try: s.close()
        except Exception: pass
def flood(a):
    socks = []
    for _ in range(100):
        try:
            s = socket.socket(); s.settimeout(2); s.bind(("127.0.0.2", 0)); s.connect(hp(a)); socks.append(s)
        except OSError:
            pass
    time.sleep(1)
    for s in socks: s.close()
def slow(a):
    one(a, b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 60, slow=True)
kinds = [
    lambda a: one(a, b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"),
    lambda a: one(a, b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"),
    lambda a: one(a, b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 65536 + b"\r\n\r\n"),
    lambda a: one(a, bytes(range(256)) * 8),
    flood,
]
threads = [threading.Thread(target=slow, args=(a,), daemon=True) for a in addrs]
for t in threads: t.start()
i = 0
while time.monotonic() < stop:
    kinds[i % len(kinds)](addrs[i % len(addrs)])
    i += 1
    with open(out, "w") as f:
        f.write(str(answers))
PY
apid=$!
PIDS+=("$apid")
wait_trace "$TMP/trace.loud" 50 "the run under attack did not reach step 50"
# A scraper tries again at its next interval: each endpoint must answer 200 to one of 3 GETs of at most 5 s each
# (on 2 loaded cores a training worker's endpoint thread, behind the attacker's 100-connection floods in the
# listen backlog, has missed one 5 s GET).
for i in 0 1; do
  code=000
  for try in 1 2 3; do
    code=$(curl -sS --max-time 5 -o /dev/null -w '%{http_code}' "http://${addrs[$i]}/metrics") || true
    [ "$code" != 200 ] || break
    sleep 1
  done
  expect_eq "$([ "$i" = 0 ] && echo server || echo worker) GET /metrics under attack (try $try of 3)" "$code" 200
done
wait_all "${WPIDS[@]}" || { show_logs; die "the run under attack failed"; }
kill "$apid" 2>/dev/null
stop_servers
n=$(cat "$TMP/attack.count" 2>/dev/null || echo 0)
# Its loop sends the 5 kinds of attack in turn: 5 answers mean each kind reached an endpoint at least once (a
# fast run ends after 8-15).
[ "$n" -ge 5 ] && ok "the attacker got $n answers (refusals or closes)" || fail "the attacker got only $n answers"
expect_eq "steps traced under attack" "$(wc -l <"$TMP/trace.loud")" "$STEPS"
if cmp -s "$TMP/trace.quiet" "$TMP/trace.loud"; then
  ok "the trace under attack equals the quiet run's, $STEPS lines (loss, lr bits)"
else
  fail "the traces differ: $(diff "$TMP/trace.quiet" "$TMP/trace.loud" | head -5)"
fi
expect_summary
