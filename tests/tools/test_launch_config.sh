#!/usr/bin/env bash
# deploy/local/launch.sh reads servers / workers / output through the daemons' own parser (pfcps config-get),
# so a config in any form that parser accepts starts the right number of daemons with logs in the right place:
# a quoted `output` (with blanks inside) names the folder without its quotes, and a `workers: 2` line (inih's
# ':' delimiter) counts as `workers = 2`. The run cannot form (join_timeout = 1 s, nobody serves the
# rendezvous' port 1 to the workers in time), so the launcher returns quickly; what is checked is what the launcher did with
# the values: its announcement and the log files it created. Expected values are written by hand from the config
# text. Without a join secret anywhere (file, --set, $PFCPS_SECRET) the launcher refuses before it starts
# anything.
set -uo pipefail
. "$(dirname "$0")/../expect.sh"
SRC=$1 BUILD=$2
unset PFCPS_SECRET
TMP=$(mktemp -d)
lp=
cleanup() {
  # The launcher runs in its own process group (setsid): end that group, by id, on every exit path.
  if [ -n "$lp" ] && kill -0 "$lp" 2>/dev/null; then kill -KILL -- "-$lp" 2>/dev/null; wait "$lp" 2>/dev/null; fi
  rm -rf "$TMP"
}
trap cleanup EXIT

# run_launch OUT_FILE ARGS...: runs the launcher (bounded to 60 s), returns its exit status.
run_launch() {
  local out=$1; shift
  # From inside $TMP, so a mis-parsed relative path lands there (and is checked), not in the caller's folder.
  (cd "$TMP" && exec setsid "$SRC/deploy/local/launch.sh" -b "$BUILD" "$@") >"$out" 2>&1 &
  lp=$!
  for _ in $(seq 1 600); do kill -0 "$lp" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$lp" 2>/dev/null; then fail "launcher still running after 60 s"; kill -KILL -- "-$lp"; fi
  wait "$lp"; local rc=$?
  lp=
  return $rc
}

# logs_are DIR "server0.log ..." : the log folder holds exactly these files.
logs_are() {
  local got
  got=$(cd "$1" 2>/dev/null && ls | sort | tr '\n' ' ')
  [ "$got" = "$2 " ] || fail "logs in '$1': [$got], want [$2]"
}

cat >"$TMP/run.ini" <<INI
# no secret in the file: from the environment below
[train]
network = "r18_w8"   ; quoted
[data]
output = "$TMP/out dir/x y"   ; quoted, blanks inside
[cluster]
servers = 3 ; three
workers: 2
rendezvous = 127.0.0.1:1
join_timeout = 1
INI
# No secret anywhere: refused before anything starts, naming where one goes.
run_launch "$TMP/launch0.out" -c "$TMP/run.ini"; rc=$?
[ "$rc" -eq 2 ] && grep -qF "launch: no join secret: set 'secret' in $TMP/run.ini, pass --set secret=..., or export PFCPS_SECRET" \
  "$TMP/launch0.out" || fail "no secret: exit $rc: $(cat "$TMP/launch0.out")"
[ ! -e "$TMP/out dir" ] || fail "no secret: the launcher created the output folder"
export PFCPS_SECRET=launch-config-secret
run_launch "$TMP/launch1.out" -c "$TMP/run.ini"; rc=$?
head -1 "$TMP/launch1.out"
grep -qF "launch: 3 servers + 2 workers, config $TMP/run.ini, logs in $TMP/out dir/x y/logs" "$TMP/launch1.out" ||
  fail "announcement: $(head -1 "$TMP/launch1.out")"
logs_are "$TMP/out dir/x y/logs" "server0.log server1.log server2.log worker0.log worker1.log"
[ "$rc" -ne 0 ] || fail "launcher exit 0 although the run never formed"
grep -q "joining the run at 127.0.0.1:1 " "$TMP/out dir/x y/logs/worker0.log" || fail "worker 0 did not run with this config"
[ -z "$(ls -d "$TMP"/\"* 2>/dev/null)" ] || fail "a folder named with quotes was created: $(ls -d "$TMP"/\"*)"

# A failed run shows the tails of its own logs only, not of the server2.log / worker1.log left in the same
# folder by the 3 + 2 run above.
run_launch "$TMP/launch4.out" -c "$TMP/run.ini" --set servers=1 --set workers=1; rc=$?
[ "$rc" -ne 0 ] || fail "launcher exit 0 although the run never formed"
grep -qF -- "--- tail $TMP/out dir/x y/logs/server0.log" "$TMP/launch4.out" || fail "failure tail lacks server0.log"
grep -qF -- "--- tail $TMP/out dir/x y/logs/worker0.log" "$TMP/launch4.out" || fail "failure tail lacks worker0.log"
grep -E -- "--- tail .*(server[12]|worker1)\.log" "$TMP/launch4.out" && fail "failure tail shows an earlier run's logs"

# --set overrides, in order, exactly as the daemons apply them.
run_launch "$TMP/launch2.out" -c "$TMP/run.ini" --set workers=1 --set "output=$TMP/other" -s servers=2 -s servers=1
head -1 "$TMP/launch2.out"
grep -qF "launch: 1 servers + 1 workers, config $TMP/run.ini, logs in $TMP/other/logs" "$TMP/launch2.out" ||
  fail "announcement with --set: $(head -1 "$TMP/launch2.out")"
logs_are "$TMP/other/logs" "server0.log worker0.log"

# A FIFO in place of a member's log is refused before anything starts (a daemon would block opening it).
rm -f "$TMP/other/logs/worker0.log" && mkfifo "$TMP/other/logs/worker0.log"
run_launch "$TMP/launch5.out" -c "$TMP/run.ini" --set workers=1 --set "output=$TMP/other" --set servers=1; rc=$?
[ "$rc" -eq 2 ] && grep -qF "launch: log '$TMP/other/logs/worker0.log' is fifo, not a regular file: remove it" \
  "$TMP/launch5.out" || fail "FIFO log: exit $rc: $(cat "$TMP/launch5.out")"
grep -q "servers + " "$TMP/launch5.out" && fail "FIFO log: the launcher started the run: $(cat "$TMP/launch5.out")"

# A config the daemons would refuse is refused by the launcher before it starts anything.
printf '[cluster]\nworkerz = 2\noutput = %s\n' "$TMP/never" >"$TMP/bad.ini"
run_launch "$TMP/launch3.out" -c "$TMP/bad.ini"; rc=$?
cat "$TMP/launch3.out"
[ "$rc" -eq 2 ] && grep -q "unknown key 'workerz'" "$TMP/launch3.out" || fail "bad config: exit $rc"
[ ! -e "$TMP/never" ] || fail "bad config: the launcher created the output folder"

expect_summary
