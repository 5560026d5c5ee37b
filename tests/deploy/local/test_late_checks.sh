#!/usr/bin/env bash
# Faults of the config and the output folder are refused before the run forms, each with its message:
# `pfcps config-get` (what deploy/local/launch.sh runs first) refuses warmup_epoch = num_epoch and an unknown
# network; a quoted value keeps its ' ;' (the folder is named by the text inside the quotes); worker 0 refuses
# an output folder it cannot write (under a regular file; a read-only bind mount where mounting is allowed)
# before joining. Nothing is started (the rendezvous address has no listener).
source "$(dirname "$0")/cluster.sh" "$@"
cat >"$TMP/run.ini" <<INI
[train]
$TINY_NET
num_epoch = 3
[data]
$TINY_DATA
output = $TMP/out
[cluster]
rendezvous = 127.0.0.1:1
join_timeout = 2
secret = x
INI
# config-get: warmup as long as training, an unknown network (with file and line), a bad width suffix.
expect_rc "config-get warmup = num_epoch" 2 \
  "key 'warmup_epoch': warmup 3 epochs is not shorter than num_epoch 3 (the lr schedule needs warmup shorter than training)" \
  "$PFCPS" config-get -c "$TMP/run.ini" --set warmup_epoch=3 lr
printf '[train]\nnetwork = r19\n' >"$TMP/net.ini"
expect_rc "config-get unknown network" 2 "$TMP/net.ini:2: key 'network': unknown network 'r19'" \
  "$PFCPS" config-get -c "$TMP/net.ini" network
expect_rc "config-get bad width" 2 "key 'network': network 'r18_w7': width suffix _w7 is not an even number" \
  "$PFCPS" config-get --set network=r18_w7 network
expect_rc "config-get warmup < num_epoch" 0 "2.5" "$PFCPS" config-get -c "$TMP/run.ini" --set warmup_epoch=2.5 warmup_epoch
# The daemons refuse the same before joining.
expect_rc "server warmup = num_epoch" 1 "key 'warmup_epoch': warmup 3 epochs" \
  "$SERVER" --config "$TMP/run.ini" --rank 0 --set warmup_epoch=3
expect_rc "worker unknown network" 1 "key 'network': unknown network 'r19'" \
  "$WORKER" --config "$TMP/run.ini" --rank 0 --set network=r19
# A quoted value keeps its ' ;' (and a comment may follow it); unquoted, ' ;' starts a comment.
printf 'output = "%s/a ;b" ; the run folder\nrec = "x ;y"\n' "$TMP" >"$TMP/quoted.ini"
expect_rc "config-get quoted ' ;'" 0 "$TMP/a ;b" "$PFCPS" config-get -c "$TMP/quoted.ini" output
out=$("$PFCPS" config-get -c "$TMP/quoted.ini" output rec 2>&1)
expect_eq "config-get quoted output rec" "$out" "$TMP/a ;b
x ;y"
printf 'output = %s/a ;b\n' "$TMP" >"$TMP/bare.ini"
expect_rc "config-get bare ' ;'" 0 "$TMP/a" "$PFCPS" config-get -c "$TMP/bare.ini" output
# Worker 0: an output folder under a regular file (root ignores chmod, not ENOTDIR).
: >"$TMP/file"
expect_rc "worker 0 output under a file" 1 \
  "config key 'output': cannot create the folder '$TMP/file/out': Not a directory" \
  "$WORKER" --config "$TMP/run.ini" --rank 0 --set "output=$TMP/file/out"
# Worker 1 does not write the output: it goes on to join (and gives up: no rendezvous listens).
out=$("$WORKER" --config "$TMP/run.ini" --rank 1 --set workers=2 --set "output=$TMP/file/out" 2>&1)
grep -qF "cannot create the folder" <<<"$out" && fail "worker 1 checked the output: $out"
# A read-only file system (EROFS), where a read-only bind mount can be made (root).
mkdir -p "$TMP/ro"
if mount --bind "$TMP/ro" "$TMP/ro" 2>/dev/null && mount -o remount,ro,bind "$TMP/ro" 2>/dev/null; then
  expect_rc "worker 0 read-only output" 1 \
    "config key 'output': cannot create the folder '$TMP/ro/out': Read-only file system" \
    "$WORKER" --config "$TMP/run.ini" --rank 0 --set "output=$TMP/ro/out"
  umount "$TMP/ro" || echo "warning: cannot unmount $TMP/ro"
else
  umount "$TMP/ro" 2>/dev/null
  echo "skip read-only bind mount: cannot mount here (not root?)"
fi
# An existing writable output passes the check (the worker then tries to join and gives up).
out=$("$WORKER" --config "$TMP/run.ini" --rank 0 2>&1)
grep -qF "config key 'output'" <<<"$out" && fail "writable output refused: $out"
[ -d "$TMP/out" ] && [ -z "$(ls -A "$TMP/out")" ] || fail "the probe file was left in $TMP/out"
expect_summary
