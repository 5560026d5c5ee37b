#!/usr/bin/env bash
# Both servers of a replicas = 1 run killed at once (server 0, the rendezvous' host, included): how long each
# worker takes to stop for the checkpoint re-form, with no rendezvous left to say a server was lost.
# 2 servers + 2 workers on 10 ORL identities (the tests' recovery run: tests/deploy/local/cluster.sh), kill -9
# of both servers once worker 0 has logged step 8; prints each worker's exit status and seconds from the kill.
# usage: bench/recovery/both_lost.sh [-b BUILD] [CTL_TIMEOUT (default 20)] [ROUNDS (default 1)]
set -euo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
B=$SRC/build
if [ "${1:-}" = -b ]; then B=$(cd "$2" && pwd); shift 2; fi
CT=${1:-20} ROUNDS=${2:-1}
round() {
  # shellcheck source=/dev/null
  source "$SRC/tests/deploy/local/cluster.sh" "$B/server/pfcps-server" "$B/worker/pfcps-worker" "$B/tools/pfcps" \
    "$SRC" "$B"
  export OMP_NUM_THREADS=1 PFCPS_SECRET=both-lost-secret
  pack_orl 10 >/dev/null
  ckpt_ini both 6 2 2 2 40 "sample_rate = 0.25" "pfc_update = dense" "frequent = 1" "replicas = 1" \
    "ctl_timeout = $CT"
  start_cluster "$TMP/both.ini" 2 2
  wait_log "$TMP/worker0.log" "Global Step: 8 " 120 || { show_logs; die "worker 0 did not reach step 8"; }
  local t0 p s left=("${WPIDS[@]}") now
  t0=$(date +%s.%N)
  kill -KILL "${SPIDS[1]}" "${SPIDS[0]}"
  while [ ${#left[@]} -gt 0 ]; do
    now=$(date +%s.%N)
    [ "$(echo "$now - $t0 > 600" | bc)" = 0 ] || die "workers ${left[*]} did not stop within 600 s"
    local still=()
    for p in "${left[@]}"; do
      if kill -0 "$p" 2>/dev/null; then still+=("$p"); continue; fi
      s=0; wait "$p" || s=$?
      echo "worker pid $p: exit $s, $(echo "$now - $t0" | bc) s after the kill"
    done
    left=("${still[@]}")
    sleep 0.1
  done
}
for r in $(seq 1 "$ROUNDS"); do
  echo "round $r (ctl_timeout = $CT):"
  out=$( (round) 2>&1 || true) # the test helpers' exit trap ends the subshell non-zero
  grep "^worker pid\|FAIL\|die" <<<"$out" || echo "round $r: no worker stopped (PFCPS_KEEP_TMP=1 keeps the logs)"
done
