#!/usr/bin/env bash
# Worker 0's startup dump says where the join secret came from, although the run config it dumps comes from
# the rendezvous, which never sends the secret: a secret set in the config file (PFCPS_SECRET unset) ->
# "(set)"; from the environment -> "(from PFCPS_SECRET)".
source "$(dirname "$0")/cluster.sh" "$@"
export OMP_NUM_THREADS=1
run() { # run SECRET_LINE: one server + one worker (servers and workers left at their default, 1), 1 step
  run_ini "$TMP/run.ini" - - "" "$1" <<INI
[train]
$ONE_STEP_NET
output = $TMP/out
[data]
$ONE_STEP_DATA
INI
  run_cluster "the worker failed ($1)" "$TMP/run.ini" 1 1 --max-steps 1
}
unset PFCPS_SECRET
run "secret = file-secret"
grep -E -q ": secret +\(set\)$" "$TMP/worker0.log" || { grep ': secret' "$TMP/worker0.log"; die "secret from the config file not shown as (set)"; }
echo "ok: config secret: $(grep -o ': secret.*' "$TMP/worker0.log")"
export PFCPS_SECRET=env-secret
run ""
grep -E -q ": secret +\(from PFCPS_SECRET\)$" "$TMP/worker0.log" || { grep ': secret' "$TMP/worker0.log"; die "secret from the environment not shown as such"; }
echo "ok: environment secret: $(grep -o ': secret.*' "$TMP/worker0.log")"
echo PASS
