#!/usr/bin/env bash
# Prometheus metrics of a live run (docs/metrics.md): 2 servers + 2 workers on 127.0.0.1 train an endless run
# (ENDLESS_NET / ENDLESS_DATA: 20 classes, sample_rate 1.0, global head mode), every member with
# metrics_address = 127.0.0.1:0; each member's bound address is read from its log line `metrics on HOST:PORT`.
#  - A member serves /metrics while the run is still forming (the servers alone: server 0 counts 2 of 4 members
#    joined, server 1's series carry an empty run label) and while it trains (then the run label is the run
#    id); worker 0's pfcps_worker_step grows between two scrapes; the pages pass `promtool check metrics` (that
#    part skipped, named, without promtool).
#  - Rows pulled add up at a quiescent point: worker 1 is stopped (SIGSTOP) until worker 0 blocks in a
#    collective and its counters hold still (scraped), then worker 0 is stopped and worker 1 continued until it
#    blocks too (scraped), then the servers are scraped: the sum over servers of pfcps_server_pulled_rows_total
#    equals the sum over workers of pfcps_worker_pulled_rows_total (pushed rows likewise), and each worker's
#    rows are its partition's 10 classes (c mod 2 == rank of 20; sample_rate 1.0 pulls all of them every step)
#    times the steps it pulled for: its step count, or one more when it stopped after its next pull.
#  - Server 0's /targets (Prometheus HTTP service discovery) lists exactly the 4 members' bound addresses with
#    their role and rank; its pfcps_rendezvous_member_info series name the same addresses.
#  - The join secret appears in no page.
#  - Each worker takes its share of the host's cores for OpenMP (OMP_NUM_THREADS is unset for this test).
unset OMP_NUM_THREADS
source "$(dirname "$0")/cluster.sh" "$@"
command -v curl >/dev/null || skip "curl not found (needed to scrape the endpoints)"

SECRET=metrics-test-secret-c0ffee-9417
run_ini "$TMP/run.ini" 2 2 "$SECRET" "metrics_address = 127.0.0.1:0" <<INI
[train]
$ENDLESS_NET
output = $TMP/out
[data]
$ENDLESS_DATA
[server]
snapshot_every = 2
INI
start_cluster "$TMP/run.ini" 2 0 # the servers alone first: the run waits for the workers

# bound LOG: the HOST:PORT of the log's `metrics on HOST:PORT` line (waits up to 30 s).
bound() {
  wait_log "$1" "metrics on " 30 || { show_logs; die "no 'metrics on' line in $1"; }
  sed -n 's/.*metrics on \([^ ]*\).*/\1/p' "$1" | head -1
}
declare -A ADDR
for r in 0 1; do ADDR[server$r]=$(bound "$TMP/server$r.log"); done

# scrape MEMBER FILE [PATH]: the member's page (default /metrics) into FILE; dies when it cannot be read.
scrape() {
  curl -fsS --max-time 5 -o "$2" "http://${ADDR[$1]}${3:-/metrics}" || die "$1: GET ${3:-/metrics} failed"
}
# lookup MEMBER FAMILY: V = the value of the family's single series on a fresh scrape; returns 1 unless there
# is exactly one. value MEMBER FAMILY: the same, dying unless there is one.
lookup() {
  scrape "$1" "$TMP/page"
  V=$(awk -v f="$2" '$1 == f || index($1, f "{") == 1 { print $NF; n++ } END { if (n != 1) exit 1 }' "$TMP/page")
}
value() { lookup "$@" || die "$1: expected one series of $2"; }

# The run is forming: both servers joined, no worker yet.
for ((i = 0; i < 100; i++)); do
  lookup server0 pfcps_rendezvous_members && [ "$V" = 2 ] && break
  sleep 0.1
done
expect_eq "server 0 while forming: members joined" "$V" 2
scrape server1 "$TMP/forming.prom"
expect_grep "server 1 while forming: series without a run id" '^pfcps_build_info\{.*run=""' "$TMP/forming.prom"
for r in 0 1; do
  "$WORKER" --config "$TMP/run.ini" --rank "$r" >"$TMP/worker$r.log" 2>&1 &
  WPIDS+=($!) PIDS+=($!)
done
for r in 0 1; do ADDR[worker$r]=$(bound "$TMP/worker$r.log"); done
for m in server0 server1 worker0 worker1; do
  [[ ${ADDR[$m]} =~ ^127\.0\.0\.1:[0-9]+$ ]] || die "$m: bound address '${ADDR[$m]}' is not 127.0.0.1:PORT"
done
# The run trains: each worker's step reaches 2 (at most 60 s).
for m in worker0 worker1; do
  for ((i = 0; i < 600; i++)); do
    lookup "$m" pfcps_worker_step && [ "${V%.*}" -ge 2 ] && break
    sleep 0.1
  done
  [ "${V%.*}" -ge 2 ] 2>/dev/null || { show_logs; die "$m did not train 2 steps in 60 s"; }
done

# Training: the step grows between two scrapes; every page is well-formed and holds no secret.
value worker0 pfcps_worker_step; s1=$V
sleep 1.5
value worker0 pfcps_worker_step; s2=$V
awk -v a="$s1" -v b="$s2" 'BEGIN { exit !(b > a) }' || die "pfcps_worker_step did not grow: $s1 then $s2"
ok "worker 0's pfcps_worker_step grew from $s1 to $s2 in 1.5 s"
# Without OMP_NUM_THREADS each worker takes its share of the cores it may use (2 workers share this host).
cores=$(env -u OMP_THREAD_LIMIT nproc) share=$((cores / 2)); [ "$share" -ge 1 ] || share=1
[ "$share" -eq 1 ] && s="" || s=s
for r in 0 1; do
  expect_grep "worker $r: OpenMP threads split between the 2 workers of this host" \
    "OpenMP: $share thread$s \\(OMP_NUM_THREADS unset: $cores cores / 2 workers on this host\\)" "$TMP/worker$r.log"
done
for m in server0 server1 worker0 worker1; do
  scrape "$m" "$TMP/$m.prom"
  grep -qF "$SECRET" "$TMP/$m.prom" && die "$m: /metrics shows the join secret"
  grep -q "^pfcps_${m%?}_" "$TMP/$m.prom" || die "$m: no pfcps_${m%?}_ family on its page"
  grep -q "run=\"[0-9a-f]\{32\}\"" "$TMP/$m.prom" || die "$m: series without the run id label"
done
for f in pfcps_worker_phase_seconds_count pfcps_worker_server_wait_seconds_total pfcps_worker_pulled_bytes_total \
  pfcps_worker_samples_total pfcps_worker_loss; do
  grep -q "^$f" "$TMP/worker0.prom" || die "worker 0: no $f"
done
for f in pfcps_server_pulled_rows_total pfcps_server_apply_seconds_count pfcps_server_gather_seconds_count \
  pfcps_server_shard_rows pfcps_rendezvous_members; do
  grep -q "^$f" "$TMP/server0.prom" || die "server 0: no $f"
done
# shard 0 of 2 of 20 classes holds 10 rows
value server0 pfcps_server_shard_rows; expect_eq "server 0: pfcps_server_shard_rows (20 classes / 2)" "$V" 10
value server0 pfcps_rendezvous_members_expected; expect_eq "server 0: members expected" "$V" 4
value server0 pfcps_rendezvous_members; expect_eq "server 0: members joined" "$V" 4
if command -v promtool >/dev/null; then
  for m in server0 server1 worker0 worker1; do
    promtool check metrics <"$TMP/$m.prom" >"$TMP/$m.promtool" 2>&1 ||
      { cat "$TMP/$m.promtool"; die "$m: promtool check metrics failed"; }
  done
  ok "promtool check metrics passes on the 4 pages"
else
  echo "SKIP part: promtool not found: pages not checked with promtool check metrics"
fi

# /targets on server 0: the 4 members, at their bound addresses, with role and rank.
scrape server0 "$TMP/targets.json" /targets
grep -qF "$SECRET" "$TMP/targets.json" && die "/targets shows the join secret"
got=$(python3 -c 'import json, sys
for e in json.load(open(sys.argv[1])):
    assert len(e["targets"]) == 1, e
    print(e["labels"]["role"] + e["labels"]["rank"], e["targets"][0])' "$TMP/targets.json" | sort) ||
  die "/targets is not service-discovery JSON: $(cat "$TMP/targets.json")"
want=$(for m in server0 server1 worker0 worker1; do echo "$m ${ADDR[$m]}"; done | sort)
expect_eq "/targets lists the 4 members at their bound addresses" "$got" "$want"
for m in server0 server1 worker0 worker1; do
  grep -q "^pfcps_rendezvous_member_info{.*member_role=\"${m%?}\",member_rank=\"${m: -1}\",metrics_address=\"${ADDR[$m]}\"} 1$" \
    "$TMP/server0.prom" || die "server 0: no pfcps_rendezvous_member_info for $m at ${ADDR[$m]}"
done

# still MEMBER: scrapes MEMBER (a worker) until its rows pulled, rows pushed and step are the same in seven
# scrapes 0.3 s apart (it is blocked: a worker slowed by a loaded host, with a pull in flight, can look still
# for three), at most 30 s; leaves them in P, Q, ST.
still() {
  local prev="" cur i n=0
  for ((i = 0; i < 100; i++)); do
    value "$1" pfcps_worker_pulled_rows_total; P=$V
    value "$1" pfcps_worker_pushed_rows_total; Q=$V
    value "$1" pfcps_worker_step; ST=$V
    cur="$P $Q $ST"
    if [ "$cur" = "$prev" ]; then n=$((n + 1)); else n=0; fi
    [ "$n" -ge 6 ] && return 0
    prev=$cur
    sleep 0.3
  done
  die "$1 did not hold still within 30 s"
}
kill -STOP "${WPIDS[1]}"
still worker0; p0=$P q0=$Q st0=$ST
kill -STOP "${WPIDS[0]}"
kill -CONT "${WPIDS[1]}"
still worker1; p1=$P q1=$Q st1=$ST
# The servers answered everything the workers sent before they blocked: their counters hold still too.
sp=0 sq=0
for s in 0 1; do
  value server$s pfcps_server_pulled_rows_total; sp=$((sp + V))
  value server$s pfcps_server_pushed_rows_total; sq=$((sq + V))
done
# Checkpoints (snapshot_every 2), while nothing new is written: the newest one each member reports is on disk,
# a server's at the size it reports.
root=$TMP/out/snapshots
for s in 0 1; do
  value server$s pfcps_server_snapshots_total; n=$V
  value server$s pfcps_server_snapshot_last_step; T=$V
  value server$s pfcps_server_snapshot_bytes; B=$V
  f=$root/step-$T/shard-$s-of-2.snap
  if [ "$n" -ge 1 ] && [ $((T % 2)) -eq 0 ] && [ -f "$f" ]; then
    expect_eq "server $s: pfcps_server_snapshot_bytes of step $T (of $n snapshots) = the file's size" "$B" \
      "$(stat -c %s "$f")"
  else
    fail "server $s: $n snapshots, the last of step $T: expected >= 1, an even step, and $f"
  fi
done
value worker1 pfcps_worker_checkpoint_last_step; T=$V
value worker1 pfcps_worker_checkpoint_last_timestamp_seconds
if [ "$T" -ge 2 ] && [ -f "$root/step-$T/worker-1-of-2.snap" ] &&
  awk -v t="$V" -v now="$(date +%s)" 'BEGIN { exit !(t > now - 120 && t <= now + 1) }'; then
  ok "worker 1: its newest checkpoint, step $T, is on disk, written at Unix time $V"
else
  fail "worker 1: checkpoint step $T at Unix time $V: not on disk ($root/step-$T) or not within the last 2 minutes"
fi
kill -CONT "${WPIDS[0]}"
expect_eq "rows pulled: servers' sum = workers' sum ($p0 + $p1)" "$sp" "$((p0 + p1))"
expect_eq "rows pushed: servers' sum = workers' sum ($q0 + $q1)" "$sq" "$((q0 + q1))"
for r in 0 1; do
  p=p$r st=st$r
  # 10 classes per partition; pulls of steps 0..step-1, or 0..step when it blocked after its next pull
  [ "${!p}" -eq $((10 * ${!st})) ] || [ "${!p}" -eq $((10 * (${!st} + 1))) ] ||
    fail "worker $r: ${!p} rows pulled after ${!st} steps; expected 10 x ${!st} or 10 x $((${!st} + 1))"
done
ok "worker rows pulled are 10 per step: $p0 after $st0 steps, $p1 after $st1 steps"

# The run goes on after the freeze, then stops in order.
value worker0 pfcps_worker_step; st_after=$V
sleep 1
value worker0 pfcps_worker_step
awk -v a="$st_after" -v b="$V" 'BEGIN { exit !(b > a) }' || fail "the run did not go on after the workers were continued"
kill -TERM "${WPIDS[0]}"
wait_all "${WPIDS[@]}" || { show_logs; die "a worker failed to stop on SIGTERM"; }
stop_servers
echo "metrics of a 2 + 2 run: steps $s1 -> $s2, rows pulled $sp = $p0 + $p1, /targets of 4"
expect_summary
