#!/usr/bin/env bash
# Issue 17 item 6, "late checks": faults that used to surface only after the run formed (or never) are refused
# before it forms, each with its message: `pfcps config-get` (what deploy/local/launch.sh runs first) refuses
# warmup_epoch = num_epoch and an unknown network; a quoted value keeps its ' ;' (it became a folder named
# '"/tmp/...'); worker 0 refuses an output folder it cannot write (under a regular file; a read-only bind mount
# where mounting is allowed) before joining. Nothing is started (the rendezvous address has no listener).
source "$(dirname "$0")/cluster.sh" "$@"
fails=0
cat >"$TMP/run.ini" <<INI
[train]
$TINY_NET
num_epoch = 3
[data]
$TINY_DATA
output = $TMP/out
[cluster]
rendezvous = 127.0.0.1:1
ctl_timeout = 2
secret = x
INI
# expect NAME RC EXPECTED_TEXT COMMAND...: the command exits RC and prints EXPECTED_TEXT (fixed string).
expect() {
  local name=$1 want=$2 text=$3; shift 3
  local out rc=0
  out=$("$@" 2>&1) || rc=$?
  if [ "$rc" -ne "$want" ] || ! grep -qF -- "$text" <<<"$out"; then
    echo "FAIL $name: exit $rc, expected $want and '$text' in:"; echo "$out" | head -3; fails=$((fails + 1))
  else
    echo "ok   $name: $(grep -F -- "$text" <<<"$out" | head -1 | sed 's/^.* ERROR //')"
  fi
}
# config-get: warmup as long as training, an unknown network (with file and line), a bad width suffix.
expect "config-get warmup = num_epoch" 2 \
  "key 'warmup_epoch': warmup 3 epochs is not shorter than num_epoch 3 (the lr schedule needs warmup shorter than training)" \
  "$PFCPS" config-get -c "$TMP/run.ini" --set warmup_epoch=3 lr
printf '[train]\nnetwork = r19\n' >"$TMP/net.ini"
expect "config-get unknown network" 2 "$TMP/net.ini:2: key 'network': unknown network 'r19'" \
  "$PFCPS" config-get -c "$TMP/net.ini" network
expect "config-get bad width" 2 "key 'network': network 'r18_w7': width suffix _w7 is not an even number" \
  "$PFCPS" config-get --set network=r18_w7 network
expect "config-get warmup < num_epoch" 0 "2.5" "$PFCPS" config-get -c "$TMP/run.ini" --set warmup_epoch=2.5 warmup_epoch
# The daemons refuse the same before joining.
expect "server warmup = num_epoch" 1 "key 'warmup_epoch': warmup 3 epochs" \
  "$SERVER" --config "$TMP/run.ini" --rank 0 --set warmup_epoch=3
expect "worker unknown network" 1 "key 'network': unknown network 'r19'" \
  "$WORKER" --config "$TMP/run.ini" --rank 0 --set network=r19
# A quoted value keeps its ' ;' (and a comment may follow it); unquoted, ' ;' starts a comment.
printf 'output = "%s/a ;b" ; the run folder\nrec = "x ;y"\n' "$TMP" >"$TMP/quoted.ini"
expect "config-get quoted ' ;'" 0 "$TMP/a ;b" "$PFCPS" config-get -c "$TMP/quoted.ini" output
out=$("$PFCPS" config-get -c "$TMP/quoted.ini" output rec 2>&1)
[ "$out" = "$TMP/a ;b
x ;y" ] || { echo "FAIL quoted: got '$out'"; fails=$((fails + 1)); }
printf 'output = %s/a ;b\n' "$TMP" >"$TMP/bare.ini"
expect "config-get bare ' ;'" 0 "$TMP/a" "$PFCPS" config-get -c "$TMP/bare.ini" output
# Worker 0: an output folder under a regular file (root ignores chmod, not ENOTDIR).
: >"$TMP/file"
expect "worker 0 output under a file" 1 \
  "config key 'output': cannot create the folder '$TMP/file/out': Not a directory" \
  "$WORKER" --config "$TMP/run.ini" --rank 0 --set "output=$TMP/file/out"
# Worker 1 does not write the output: it goes on to join (and gives up: no rendezvous listens).
out=$("$WORKER" --config "$TMP/run.ini" --rank 1 --set workers=2 --set "output=$TMP/file/out" 2>&1)
grep -qF "cannot create the folder" <<<"$out" && { echo "FAIL worker 1 checked the output: $out"; fails=$((fails + 1)); }
# A read-only file system (EROFS), where a read-only bind mount can be made (root).
mkdir -p "$TMP/ro"
if mount --bind "$TMP/ro" "$TMP/ro" 2>/dev/null && mount -o remount,ro,bind "$TMP/ro" 2>/dev/null; then
  expect "worker 0 read-only output" 1 \
    "config key 'output': cannot create the folder '$TMP/ro/out': Read-only file system" \
    "$WORKER" --config "$TMP/run.ini" --rank 0 --set "output=$TMP/ro/out"
  umount "$TMP/ro" || echo "warning: cannot unmount $TMP/ro"
else
  umount "$TMP/ro" 2>/dev/null
  echo "skip read-only bind mount: cannot mount here (not root?)"
fi
# An existing writable output passes the check (the worker then tries to join and gives up).
out=$("$WORKER" --config "$TMP/run.ini" --rank 0 2>&1)
grep -qF "config key 'output'" <<<"$out" && { echo "FAIL writable output refused: $out"; fails=$((fails + 1)); }
[ -d "$TMP/out" ] && [ -z "$(ls -A "$TMP/out")" ] || { echo "FAIL the probe file was left in $TMP/out"; fails=$((fails + 1)); }
[ "$fails" -eq 0 ] && echo PASS
