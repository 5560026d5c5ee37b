#!/usr/bin/env bash
# deploy/monitoring against a live run: 2 servers and 2 workers training without end (snapshot_every 50)
# through deploy/local/launch.sh (metrics_address = 127.0.0.1:PORT: server 0 on PORT, the others on free
# ports), and Debian's Prometheus with deploy/monitoring/prometheus-local.yml (server 0's /targets as HTTP
# service discovery) and alerts.yml, both with test-sized numbers (below), queried through its HTTP API:
#   1. all 4 targets up (up == 1) with the discovered labels role and rank; the rendezvous counts 4 of 4; both
#      servers export snapshot_every (50); every series name alerts.yml reads has a series;
#   2. the workers' pfcps_worker_step rises, and PfcpsRunStalled is not active;
#   3. at a standstill the rows the servers sent to pulls equal the rows the workers received: SIGSTOP both
#      workers, wait until the servers' counters stop changing (the servers answer what was already sent and
#      are still scraped: their totals are final), SIGSTOP both servers, SIGCONT the workers (they read the
#      replies already on their sockets, then wait for the stopped servers: their totals are final and
#      scraped); then sum(pfcps_server_pulled_rows_total) = sum(pfcps_worker_pulled_rows_total);
#   4. with the servers stopped, PfcpsRunStalled fires for both workers (/api/v1/alerts);
#   5. after SIGCONT of the servers the steps go on and PfcpsRunStalled is no longer active;
#   6. every query of grafana-dashboard.json is accepted by this Prometheus.
# Test-sized numbers: scrape, rule evaluation and discovery every 1 s; in the copy of alerts.yml the stall
# floor is 5 s instead of 300 s and PfcpsRunStalled's `for` 0s instead of 1m (sed on that rule only; the
# shipped thresholds are for real runs, and alerts_test.yml checks the rule's logic with them).
# Skips (77) when prometheus or curl is missing (tests/deploy/monitoring/deps.sh installs prometheus).
source "$(dirname "$0")/../local/cluster.sh" "$@"
command -v prometheus >/dev/null || skip "prometheus is not installed (Debian package prometheus: tests/deploy/monitoring/deps.sh)"
command -v curl >/dev/null || skip "curl is not installed"
export OMP_NUM_THREADS=1
mon=$SRC/deploy/monitoring
logs=$TMP/out/logs

show() {
  for f in "$logs"/*.log "$TMP/launch.out" "$TMP/prometheus.log"; do echo "--- $f"; tail -15 "$f"; done
}
# query EXPR: the value of EXPR's single result at Prometheus's latest data ("none" when the result is empty).
query() {
  curl -fsS --max-time 5 --get --data-urlencode "query=$1" "http://127.0.0.1:$pport/api/v1/query" |
    python3 -c 'import json, sys
r = json.load(sys.stdin)["data"]["result"]
assert len(r) <= 1, r
print(r[0]["value"][1] if r else "none")'
}
# series EXPR: one line per result: its labels role and rank, then its value.
series() {
  curl -fsS --max-time 5 --get --data-urlencode "query=$1" "http://127.0.0.1:$pport/api/v1/query" |
    python3 -c 'import json, sys
for s in json.load(sys.stdin)["data"]["result"]:
    print(s["metric"].get("role", ""), s["metric"].get("rank", ""), s["value"][1])' | sort
}
# firing ALERT: the worker ranks ALERT is firing for, space-separated, sorted ("" when none is active).
firing() {
  curl -fsS --max-time 5 "http://127.0.0.1:$pport/api/v1/alerts" | python3 -c 'import json, sys
a = [x for x in json.load(sys.stdin)["data"]["alerts"] if x["labels"]["alertname"] == sys.argv[1]]
print(" ".join(sorted(x["labels"].get("rank", "?") + ("" if x["state"] == "firing" else "(" + x["state"] + ")") for x in a)))' "$1"
}
# until_eq SECONDS WANT EXPR: polls `query EXPR` (every 0.5 s) until it prints WANT; returns 1 after SECONDS.
until_eq() {
  local i
  for ((i = 0; i < $1 * 2; i++)); do [ "$(query "$3")" = "$2" ] && return 0; sleep 0.5; done
  return 1
}
# settled SECONDS EXPR: polls EXPR every second until it gave the same value (not "none") 4 times in a row,
# i.e. for 3 s: at least 2 scrapes; prints that value. Returns 1 after SECONDS.
settled() {
  local i v last='' n=0
  for ((i = 0; i < $1; i++)); do
    v=$(query "$2")
    if [ "$v" != none ] && [ "$v" = "$last" ]; then n=$((n + 1)); else n=1; fi
    last=$v
    [ "$n" -ge 4 ] && { echo "$v"; return 0; }
    sleep 1
  done
  return 1
}

# The run: launch.sh on a config with metrics_address 127.0.0.1:$mport.
mport=$(free_port)
run_ini "$TMP/run.ini" 2 2 monitoring-secret "metrics_address = 127.0.0.1:$mport" <<INI
[train]
$ENDLESS_NET
output = $TMP/out
[data]
$ENDLESS_DATA
[server]
snapshot_every = 50
INI
start_launcher "$TMP/run.ini"

# Prometheus: the shipped configs with the test-sized numbers.
pport=$(free_port)
mkdir -p "$TMP/prom"
sed -e 's/^\(  *\)\(scrape_interval\|evaluation_interval\|refresh_interval\): 15s$/\1\2: 1s/' \
  -e "s|http://127.0.0.1:9400/targets|http://127.0.0.1:$mport/targets|" "$mon/prometheus-local.yml" >"$TMP/prom/prometheus.yml"
sed -e '/- alert: PfcpsRunStalled/,/- alert:/{s/\([>+] \)300)/\15)/;s/for: 1m/for: 0s/}' "$mon/alerts.yml" >"$TMP/prom/alerts.yml"
expect_eq "test-sized config: 1 s intervals, server 0's /targets" \
  "$(grep -c ': 1s$' "$TMP/prom/prometheus.yml") $(grep -c "127.0.0.1:$mport/targets" "$TMP/prom/prometheus.yml")" "3 1"
expect_eq "test-sized PfcpsRunStalled: floor 5 s, for 0s" \
  "$(diff "$mon/alerts.yml" "$TMP/prom/alerts.yml" | grep -c '^>')" 3
promtool check config "$TMP/prom/prometheus.yml" >"$TMP/promtool.out" 2>&1 || { cat "$TMP/promtool.out"; die "promtool refuses the test config"; }
start_daemon "$TMP/prometheus.log" prometheus --config.file="$TMP/prom/prometheus.yml" \
  --storage.tsdb.path="$TMP/tsdb" --web.listen-address="127.0.0.1:$pport"
for ((i = 0; i < 300; i++)); do curl -fsS --max-time 1 "http://127.0.0.1:$pport/-/ready" >/dev/null 2>&1 && break; sleep 0.1; done
curl -fsS --max-time 1 "http://127.0.0.1:$pport/-/ready" >/dev/null 2>&1 || { show; die "Prometheus is not ready after 30 s"; }

# 1. every target up, discovered through server 0's /targets
wait_log "$logs/server0.log" "metrics on 127.0.0.1:$mport" 60 || { show; die "server 0 did not log 'metrics on 127.0.0.1:$mport'"; }
until_eq 60 4 'count(up{job="pfcps"} == 1)' || { show; series 'up'; die "not all 4 targets up within 60 s"; }
expect_eq "targets up (role rank value)" "$(series 'up{job="pfcps"}' | tr '\n' ',')" \
  "server 0 1,server 1 1,worker 0 1,worker 1 1,"
until_eq 30 4 'pfcps_rendezvous_members{job="pfcps"}' || fail "the rendezvous does not count 4 members"
expect_eq "members expected" "$(query 'pfcps_rendezvous_members_expected{job="pfcps"}')" 4
expect_eq "snapshot_every of both servers (role rank value)" \
  "$(series 'pfcps_server_snapshot_every_steps{job="pfcps"}' | tr '\n' ',')" "server 0 50,server 1 50,"
# Every series the alert rules read exists in this run (a family the daemons do not export would leave its
# alert silent for ever).
expect_rc "the alert rules' series exist" 0 ", 0 missing" python3 - "$mon/alerts.yml" "$pport" <<'PY'
import json, re, sys, urllib.parse, urllib.request
names = sorted(set(re.findall(r"\b(?:pfcps|process)_[a-zA-Z0-9_]*[a-zA-Z0-9]", open(sys.argv[1]).read())))
missing = []
for n in names:
    q = urllib.parse.urlencode({"query": 'count({__name__="%s",job="pfcps"})' % n})
    r = json.load(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[2]}/api/v1/query?{q}", timeout=5))
    if not r["data"]["result"]:
        missing.append(n)
        print("missing:", n)
print(f"{len(names)} names, {len(missing)} missing")
sys.exit(1 if missing else 0)
PY

# 2. steps rise
until_eq 60 2 'count(pfcps_worker_step{job="pfcps"} > 0)' || { show; die "the workers report no step within 60 s"; }
s1=$(query 'min(pfcps_worker_step{job="pfcps"})')
sleep 3
s2=$(query 'min(pfcps_worker_step{job="pfcps"})')
if awk -v a="$s1" -v b="$s2" 'BEGIN {exit !(b > a)}'; then ok "pfcps_worker_step rose: $s1 -> $s2 in 3 s"; else fail "pfcps_worker_step did not rise: $s1 -> $s2"; fi
expect_eq "PfcpsRunStalled not active while training" "$(firing PfcpsRunStalled)" ""

# 3. pulled rows, servers against workers, at a standstill
mapfile -t spid < <(for r in 0 1; do pgrep -P "$LP" -f "pfcps-server .*--rank $r( |\$)"; done)
mapfile -t wpid < <(for r in 0 1; do pgrep -P "$LP" -f "pfcps-worker .*--rank $r( |\$)"; done)
if [ "${#spid[@]}" -ne 2 ] || [ "${#wpid[@]}" -ne 2 ]; then show; die "daemon pids not found: servers ${spid[*]}, workers ${wpid[*]}"; fi
kill -STOP "${wpid[@]}"
S=$(settled 30 'sum(pfcps_server_pulled_rows_total{job="pfcps"})') || { kill -CONT "${wpid[@]}"; show; die "the servers' pulled rows did not settle"; }
kill -STOP "${spid[@]}"
kill -CONT "${wpid[@]}"
until_eq 30 2 'count(up{job="pfcps",role="worker"} == 1)' || { kill -CONT "${spid[@]}"; show; die "the workers are not scraped after SIGCONT"; }
W=$(settled 30 'sum(pfcps_worker_pulled_rows_total{job="pfcps"})') || { kill -CONT "${spid[@]}"; show; die "the workers' pulled rows did not settle"; }
expect_eq "rows pulled: servers' sum = workers' sum (at a standstill)" "$S" "$W"
[ "$S" != 0 ] || fail "no rows pulled"

# 4. the stall alert, while the servers are stopped
t0=$SECONDS
for ((i = 0; i < 60; i++)); do [ "$(firing PfcpsRunStalled)" = "0 1" ] && break; sleep 0.5; done
got=$(firing PfcpsRunStalled)
expect_eq "PfcpsRunStalled firing for workers (after $((SECONDS - t0)) s with the servers stopped)" "$got" "0 1"
expect_eq "servers down while stopped" "$(query 'count(up{job="pfcps",role="server"} == 0)')" 2
stalled_at=$(query 'max(pfcps_worker_step{job="pfcps"})')

# 5. SIGCONT: training goes on, the alert clears
kill -CONT "${spid[@]}"
t0=$SECONDS
rose=0
for ((i = 0; i < 60; i++)); do
  v=$(query 'min(pfcps_worker_step{job="pfcps"})')
  if [ "$v" != none ] && awk -v a="$stalled_at" -v b="$v" 'BEGIN {exit !(b > a)}'; then rose=1; break; fi
  sleep 0.5
done
if [ "$rose" -eq 1 ]; then ok "steps after SIGCONT: $stalled_at -> $v"; else fail "no step within 30 s of SIGCONT ($stalled_at -> $v)"; fi
for ((i = 0; i < 60; i++)); do [ -z "$(firing PfcpsRunStalled)" ] && break; sleep 0.5; done
expect_eq "PfcpsRunStalled cleared (after $((SECONDS - t0)) s)" "$(firing PfcpsRunStalled)" ""
expect_eq "no other alert active" "$(curl -fsS "http://127.0.0.1:$pport/api/v1/alerts" | python3 -c 'import json, sys
print(sorted({a["labels"]["alertname"] for a in json.load(sys.stdin)["data"]["alerts"]} - {"PfcpsMemberLost"}))')" "[]"

# 6. every query of grafana-dashboard.json is valid PromQL to this Prometheus (Grafana's $__rate_interval and
# $run replaced); how many return data is shown (some need events this run has not had: checkpoints, drops).
expect_rc "dashboard queries accepted by Prometheus" 0 "0 refused" python3 - "$mon/grafana-dashboard.json" "$pport" <<'PY'
import json, sys, urllib.parse, urllib.request
exprs = []
def walk(v):
    if isinstance(v, dict):
        for k, x in v.items():
            exprs.append(x) if k == "expr" else walk(x)
    elif isinstance(v, list):
        for x in v:
            walk(x)
walk(json.load(open(sys.argv[1])))
refused, empty = 0, []
for e in exprs:
    q = e.replace("$__rate_interval", "10s").replace("$run", ".*")
    url = f"http://127.0.0.1:{sys.argv[2]}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    try:
        r = json.load(urllib.request.urlopen(url, timeout=5))
    except Exception as err:  # HTTP 400 for a query Prometheus cannot parse
        print(f"refused: {e}: {err}")
        refused += 1
        continue
    if not r["data"]["result"]:
        empty.append(e)
for e in empty:
    print(f"no data (yet): {e}")
print(f"{len(exprs)} queries, {refused} refused, {len(exprs) - len(empty) - refused} with data")
PY
echo "$OUT" | tail -n 12
expect_summary
