#!/usr/bin/env bash
# The /metrics endpoint (common/metrics_http.c) from outside, through curl, promtool and raw sockets
# (python3's socket module), against tests/common/metrics_serve (the endpoint on 127.0.0.1:0, a counter it
# keeps adding to, a gauge with an escaped label value, a histogram, a /targets page):
#   GET /metrics: 200, Content-Type text/plain; version=0.0.4; charset=utf-8, the constant labels, the label
#   value escaped as the format says, the counter growing between scrapes; promtool check metrics accepts it;
#   HEAD 200 without a body; /targets 200 application/json; /nope 404; /metrics%00 404; POST 405 with Allow: GET, HEAD;
#   a 64 KiB header: an error status or a closed connection, and the endpoint serves on;
#   200 connections opened at once by another client (127.0.0.2): a scrape succeeds within 5 s once they are
#   closed, and again while they are still open (the per-client limit leaves room for the scraper);
#   a slow-loris client (one byte of its request head per second) is cut off within 5 s + 1.5 s;
#   a second endpoint on the same address: exit 1, "metrics_address 127.0.0.1:PORT: address already in use";
#   a malformed address: exit 1 naming the port; [::1]:0 serves over IPv6 (where the host has ::1).
# Needs curl and python3; promtool (Debian package prometheus) for its one check: without it the other
# checks run and the test then skips (77) naming promtool.
# Argument: the metrics_serve program.
set -uo pipefail
. "$(dirname "$0")/../expect.sh"
SERVE=${1:?usage: test_metrics_http.sh METRICS_SERVE}
command -v curl >/dev/null || skip "curl missing (Debian package curl)"
command -v python3 >/dev/null || skip "python3 missing"
TMP=$(mktemp -d)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT

# start_serve ADDRESS NAME: starts metrics_serve on ADDRESS; sets ADDR to its bound host:port.
start_serve() {
  "$SERVE" "$1" 100 >"$TMP/$2.out" 2>"$TMP/$2.err" &
  pids+=($!)
  ADDR=
  for _ in $(seq 100); do
    ADDR=$(awk '/^bound /{print $2}' "$TMP/$2.out")
    [ -n "$ADDR" ] && return 0
    sleep 0.05
  done
  die "metrics_serve $1 printed no bound address: $(cat "$TMP/$2.err")"
}

start_serve 127.0.0.1:0 main
A=$ADDR
PORT=${A##*:}
URL=http://$A/metrics
ok "endpoint bound $A"
RUN=0123456789abcdef0123456789abcdef
CL="role=\"worker\",rank=\"3\",run=\"$RUN\""

# scrape NAME: GET /metrics into $TMP/NAME.txt with headers in $TMP/NAME.hdr; prints the status code.
scrape() {
  curl -sS --max-time "${2:-5}" -D "$TMP/$1.hdr" -o "$TMP/$1.txt" -w '%{http_code}' "$URL" 2>"$TMP/$1.curlerr"
}

# --- a normal scrape ---
code=$(scrape s1)
expect_eq "GET /metrics status" "$code" 200
ctype=$(tr -d '\r' <"$TMP/s1.hdr" | awk -F': ' 'tolower($1)=="content-type"{print $2}')
expect_eq "GET /metrics content type" "$ctype" "text/plain; version=0.0.4; charset=utf-8"
expect_grep "constant labels first, build info" "^pfcps_build_info\{$CL,version=\"[0-9]+\.[0-9]+\.[0-9]+\"\} 1$" "$TMP/s1.txt"
# the gauge's label value C:\data "faces"<newline>line 2, escaped by hand: \\ \" \n
want_gauge="pfcps_test_value{$CL,path=\"C:\\\\data \\\"faces\\\"\\nline 2\"} -2.5"
if grep -qxF -- "$want_gauge" "$TMP/s1.txt"; then ok "escaped label value: $want_gauge"; else
  fail "no line '$want_gauge' in the scrape:"$'\n'"$(grep pfcps_test_value "$TMP/s1.txt")"; fi
for fam in process_resident_memory_bytes process_start_time_seconds pfcps_memory_limit_bytes; do
  expect_grep "$fam" "^$fam\{$CL\} [0-9.e+]+$" "$TMP/s1.txt"
done
rss=$(awk -v f="process_resident_memory_bytes{$CL}" '$1==f{print $2}' "$TMP/s1.txt")
rss_ps=$(($(ps -o rss= -p "${pids[0]}") * 1024))
python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if abs(a-b) <= 0.5*b else 1)" \
  "$rss" "$rss_ps" && ok "resident memory $rss bytes, ps says $rss_ps" ||
  fail "process_resident_memory_bytes $rss, ps says $rss_ps bytes"
start=$(awk -v f="process_start_time_seconds{$CL}" '$1==f{print $2}' "$TMP/s1.txt")
python3 -c "import sys,time; s=float(sys.argv[1]); sys.exit(0 if time.time()-30 < s <= time.time() else 1)" "$start" &&
  ok "process start time $start within the last 30 s" || fail "process_start_time_seconds $start is not recent"
expect_grep "histogram +Inf bucket" "^pfcps_test_seconds_bucket\{$CL,le=\"\+Inf\"\} [0-9]+$" "$TMP/s1.txt"
t1=$(awk -v f="pfcps_test_ticks_total{$CL}" '$1==f{print $2}' "$TMP/s1.txt")
sleep 0.3
scrape s2 >/dev/null
t2=$(awk -v f="pfcps_test_ticks_total{$CL}" '$1==f{print $2}' "$TMP/s2.txt")
[ -n "$t1" ] && [ -n "$t2" ] && [ "$t2" -gt "$t1" ] && ok "counter grows between scrapes: $t1 -> $t2" ||
  fail "counter pfcps_test_ticks_total did not grow: '$t1' -> '$t2'"

code=$(curl -sS --max-time 5 -I -o "$TMP/head.hdr" -w '%{http_code} %{size_download}' "$URL")
expect_eq "HEAD /metrics: status and body bytes" "$code" "200 0"
code=$(curl -sS --max-time 5 -o "$TMP/t.json" -w '%{http_code} %{content_type}' "http://$A/targets")
expect_eq "GET /targets" "$code" "200 application/json"
python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$TMP/t.json" && ok "/targets is JSON" || fail "/targets is not JSON"
code=$(curl -sS --max-time 5 -o /dev/null -w '%{http_code}' "http://$A/nope")
expect_eq "GET /nope" "$code" 404
# an escaped NUL names no page: not the text before it (/metrics), not the /targets page
for u in /metrics%00 /metrics%00x /targets%00.json; do
  code=$(curl -sS --max-time 5 -o /dev/null -w '%{http_code}' "http://$A$u")
  expect_eq "GET $u" "$code" 404
done
code=$(curl -sS --max-time 5 -o /dev/null -w '%{http_code}' "http://$A/%6detrics")
expect_eq "GET /%6detrics (an escaped letter still unescapes)" "$code" 200
code=$(curl -sS --max-time 5 -X POST -d 'x=1' -D "$TMP/post.hdr" -o /dev/null -w '%{http_code}' "$URL")
expect_eq "POST /metrics" "$code" 405
expect_grep "405 names the methods" "^Allow: GET, HEAD" "$TMP/post.hdr"

# --- a 64 KiB header ---
big=$(head -c 65536 /dev/zero | tr '\0' 'a')
code=$(curl -sS --max-time 10 -H "X-Big: $big" -o /dev/null -w '%{http_code}' "$URL" 2>"$TMP/big.err")
case $code in
4??) ok "64 KiB header refused with status $code" ;;
000) ok "64 KiB header: connection closed ($(head -c 100 "$TMP/big.err"))" ;;
*) fail "64 KiB header answered $code (an error status or a close expected)" ;;
esac
expect_eq "scrape after the 64 KiB header" "$(scrape s3)" 200

# --- 200 connections at once ---
# flood N HOLD: opens N connections to the endpoint from 127.0.0.2 (another client than the scraper, which
# connects from 127.0.0.1: the per-client limit keeps room for it), each connect within 2 s, keeps them HOLD
# seconds, closes them; prints how many connected.
flood() {
  python3 - "$PORT" "$1" "$2" <<'EOF'
import socket, sys, time
port, n, hold = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
socks = []
for _ in range(n):
    s = socket.socket()
    s.settimeout(2)
    try:
        s.bind(("127.0.0.2", 0))
        s.connect(("127.0.0.1", port))
        socks.append(s)
    except OSError:
        s.close()
time.sleep(hold)
print(len(socks))
for s in socks:
    s.close()
EOF
}
n=$(flood 200 1)
ok "200 idle connections opened ($n connected), held 1 s, closed"
expect_eq "scrape within 5 s after 200 connections closed" "$(scrape s4 5)" 200
# the same while they stay open: the endpoint drops them after its 5 s timeout
flood 200 9 >"$TMP/flood.out" &
fpid=$!
sleep 7
expect_eq "scrape within 5 s, 200 idle connections of another client still open" "$(scrape s5 5)" 200
wait "$fpid"

# --- a slow-loris client ---
slow=$(python3 - "$PORT" <<'EOF'
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2)
t0 = time.monotonic()
s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
closed = None
while time.monotonic() - t0 < 20:
    try:
        s.sendall(b"a")
        s.settimeout(1)
        if s.recv(4096) == b"":
            closed = time.monotonic() - t0
            break
    except socket.timeout:
        continue
    except OSError:
        closed = time.monotonic() - t0
        break
print("none" if closed is None else "%.1f" % closed)
EOF
)
if [ "$slow" != none ] && python3 -c "import sys; sys.exit(0 if 4.5 <= float(sys.argv[1]) <= 6.5 else 1)" "$slow"; then
  ok "slow-loris client cut off after $slow s (timeout 5 s)"
else
  fail "slow-loris client: cut off after '$slow' s (expected 5 s to 6.5 s)"
fi
expect_eq "scrape after the slow-loris client" "$(scrape s6)" 200

# --- bad addresses ---
expect_rc "same address again" 1 "metrics_address $A: address already in use" "$SERVE" "$A" 1
expect_rc "malformed address" 1 "port must be a number in 0-65535" "$SERVE" 127.0.0.1:99999 1
if grep -q '^00000000000000000000000000000001 ' /proc/net/if_inet6 2>/dev/null; then
  start_serve '[::1]:0' v6
  case $ADDR in \[::1\]:[0-9]*) ok "IPv6 endpoint bound $ADDR" ;; *) fail "IPv6 endpoint bound '$ADDR'" ;; esac
  code=$(curl -sS -g --max-time 5 -o /dev/null -w '%{http_code}' "http://$ADDR/metrics")
  expect_eq "GET over IPv6" "$code" 200
else
  echo "note: no ::1 on this host, IPv6 not tried"
fi

# libmicrohttpd says nothing at start-up (it complains on stderr about options given in the wrong order).
if grep -q "MHD_OPTION" "$TMP/main.err"; then fail "libmicrohttpd's start-up complaint: $(cat "$TMP/main.err")"; else ok "no libmicrohttpd option complaint"; fi

# --- promtool ---
if command -v promtool >/dev/null; then
  expect_rc "promtool check metrics" 0 "" promtool check metrics <"$TMP/s1.txt"
  [ -z "$OUT" ] && ok "promtool: no lint findings" || fail "promtool findings: $OUT"
  expect_summary
fi
[ "$expect_fails" -eq 0 ] || expect_summary
skip "promtool missing (Debian package prometheus); every other check passed"
