#!/usr/bin/env bash
# SIGTERM in a daemon's first few hundred milliseconds (while the shared libraries load and initialise, before
# the run forms) is an orderly stop: exit 0 with "stopped before the run formed". libinfinipath (pulled in by
# libfabric's psm provider) installs its own SIGTERM handler in its constructor, which made such a stop exit 1
# without a message (server, worker) or crash the worker with SIGSEGV inside libcublasLt's constructor.
# Exit 143 is also accepted: the signal came before the process ran any code of its own (killed by it).
source "$(dirname "$0")/cluster.sh" "$@"
# Nothing listens at the rendezvous: each daemon keeps trying to join until stopped.
run_ini "$TMP/run.ini" 2 1 startup-secret "ctl_timeout = 20" <<INI
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
echo PASS
