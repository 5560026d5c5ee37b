#!/usr/bin/env bash
# SIGTERM in a daemon's first few hundred milliseconds (while the shared libraries load and initialise, before
# the run forms) is an orderly stop: exit 0 with "stopped before the run formed". libinfinipath (pulled in by
# libfabric's psm provider) installs its own SIGTERM handler in its constructor, which made such a stop exit 1
# without a message (server, worker) or crash the worker with SIGSEGV inside libcublasLt's constructor.
# Exit 143 is also accepted: the signal came before the process ran any code of its own (killed by it).
# Also: a daemon stopped (SIGSTOP) past its join's deadline, then SIGTERM + SIGCONT, stops in order (exit 0).
source "$(dirname "$0")/cluster.sh" "$@"
# Nothing listens at the rendezvous: each daemon keeps trying to join until stopped.
run_ini "$TMP/run.ini" 2 1 startup-secret "join_timeout = 20" <<INI
[train]
$TINY_BACKBONE
output = $TMP/out
[data]
rec = synthetic
synthetic = varied
num_classes = 20
INI
ok=0
for who in server worker; do
  for d in 0.03 0.06 0.1 0.15 0.2 0.3 0.5; do
    if [ "$who" = server ]; then bin=$SERVER; else bin=$WORKER; fi
    start_daemon "$TMP/$who.log" "$bin" --config "$TMP/run.ini" --rank 1 --set workers=2
    p=$DPID
    sleep "$d"
    kill -TERM "$p"
    wait_exit "$p" 10 || { cat "$TMP/$who.log"; die "$who: still running 10 s after SIGTERM at $d s"; }
    rc=0; wait "$p" || rc=$?
    if [ "$rc" -eq 0 ]; then
      grep -q "stopped before the run formed" "$TMP/$who.log" || { cat "$TMP/$who.log"; die "$who: SIGTERM at $d s: exit 0 without saying so"; }
      ok=$((ok + 1))
    elif [ "$rc" -ne 143 ]; then
      cat "$TMP/$who.log"; die "$who: SIGTERM at $d s: exit $rc (want 0 and an orderly stop)"
    fi
    echo "ok: $who, SIGTERM at $d s: exit $rc"
  done
done
[ "$ok" -ge 8 ] || die "only $ok of 14 stops reached the daemons' own handler"
# A daemon stopped (SIGSTOP) while its join waits for the run to form (server 0's rendezvous listens and took
# the join; the run lacks a member), past its join's deadline (join_timeout 2 on that daemon), then asked to
# stop and continued (SIGTERM, then SIGCONT, as launch.sh and systemd stop a daemon): the stop asked for is what
# ends it, exit 0 with "stopped before the run formed", not the join's timeout (exit 1).
start_daemon "$TMP/rendezvous.log" "$SERVER" --config "$TMP/run.ini" --rank 0 --set workers=2
rv=$DPID
wait_log "$TMP/rendezvous.log" "rendezvous listening" 20 || { cat "$TMP/rendezvous.log"; die "server 0's rendezvous did not start"; }
for who in server worker; do
  if [ "$who" = server ]; then bin=$SERVER; else bin=$WORKER; fi
  start_daemon "$TMP/$who-stopped.log" "$bin" --config "$TMP/run.ini" --rank 1 --set workers=2 --set join_timeout=2
  p=$DPID
  wait_log "$TMP/rendezvous.log" "$who\[1\] joined" 20 || { cat "$TMP/rendezvous.log"; die "$who 1 did not join"; }
  kill -STOP "$p"
  sleep 2.5
  kill -TERM "$p"
  kill -CONT "$p"
  wait_exit "$p" 10 || { cat "$TMP/$who-stopped.log"; die "$who: still running 10 s after SIGTERM + SIGCONT"; }
  rc=0; wait "$p" || rc=$?
  [ "$rc" -eq 0 ] && grep -q "stopped before the run formed" "$TMP/$who-stopped.log" ||
    { cat "$TMP/$who-stopped.log"; die "$who: stopped past its join's deadline, then SIGTERM + SIGCONT: exit $rc (want 0, an orderly stop)"; }
  echo "ok: $who, stopped past its join's deadline, then SIGTERM + SIGCONT: exit 0"
done
kill -TERM "$rv"
echo PASS
