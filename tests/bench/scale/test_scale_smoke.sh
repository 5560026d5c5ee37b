#!/usr/bin/env bash
# bench/scale/run.sh end to end at a small size, both ways the servers create class centers:
#   center_init = eager (default): the worker waits for every server's "every class center generated" line;
#   --lazy: centers on first touch, no such line;
# the two runs' losses must be equal (a class center's value does not depend on who generates it, or when).
# Checks per run: exit 0, a table row per series, finite first/last losses, 2 server logs, and the bytes per
# step computed here from the wire format (proto/ps_wire.h: 64-byte header per message, at most
# rows_per_msg = floor(2^20 / (8 + 4 D)) rows per message; pull: ids out, rows in; push: ids + grads out, an
# empty reply in), against run.sh's "MB on the wire / step".
# Usage: test_scale_smoke.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
. "$(dirname "$0")/../../expect.sh"
B=$1 SRC=$2
TMP=$(mktemp -d /tmp/pfcps-scale-smoke.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
C=20000 D=64 S=2
# k = ceil(0.1 x 20000) = 2000 rows (W = 1: the whole table is the partition); 1000 per server (ids c mod 2).
k=2000
rpm=$(( (1 << 20) / (8 + 4 * D) ))
per=$(( k / S )); msgs=$(( (per + rpm - 1) / rpm )); [ $msgs -lt 1 ] && msgs=1
# pull: out ids + headers, in rows + headers; push: out ids + grads + headers, in one reply header per message
want=$(( S * ( (per * 8 + msgs * 64) + (per * D * 4 + msgs * 64) + (per * (8 + D * 4) + msgs * 64) + msgs * 64 ) ))
want_mb=$(awk -v b="$want" 'BEGIN { printf "%.1f", b / 1e6 }')
for mode in eager lazy; do
  out=$TMP/$mode
  extra=(); [ "$mode" = lazy ] && extra=(--lazy)
  PFCPS_SCALE_OUT=$out "$SRC/bench/scale/run.sh" "$B" --classes $C --dim $D --series r --steps 6 --warmup 2 \
    --steady 2 --no-peer "${extra[@]}" >"$TMP/$mode.txt" 2>&1
  rc=$?
  [ $rc -eq 0 ] || { fail "$mode: run.sh exit $rc"; sed -n 1,40p "$TMP/$mode.txt"; continue; }
  row=$(grep "^| $C | $k | " "$TMP/$mode.txt" | tail -1)
  [ -n "$row" ] || { fail "$mode: no memory/traffic row for C = $C, k = $k"; cat "$TMP/$mode.txt"; continue; }
  loss=$(awk -F'|' '{print $(NF-1)}' <<<"$row")
  grep -Eq '^ *[0-9]+\.[0-9]+ -> [0-9]+\.[0-9]+ *$' <<<"$loss" || fail "$mode: losses not finite numbers: '$loss'"
  mb=$(awk -F'|' '{gsub(/ /, "", $9); print $9}' <<<"$row")
  [ "$mb" = "$want_mb" ] || fail "$mode: MB on the wire per step $mb, computed from the wire format $want_mb"
  n=$(grep -l "every class center generated" "$out"/r.$C.server*.log 2>/dev/null | wc -l)
  if [ "$mode" = eager ]; then
    [ "$n" -eq $S ] || fail "eager: $n of $S server logs say every class center was generated"
    grep -q "center_init eager" "$out/r.$C.server0.log" || fail "eager: server 0 does not log center_init eager"
  else
    [ "$n" -eq 0 ] || fail "lazy: $n server logs generated every class center (want none)"
    grep -q "center_init lazy" "$out/r.$C.server0.log" || fail "lazy: server 0 does not log center_init lazy"
  fi
  echo "$mode: $row"
  eval "loss_$mode=\"\$loss\""
done
[ "${loss_eager:-x}" = "${loss_lazy:-y}" ] || fail "losses differ between eager ('${loss_eager:-}') and lazy ('${loss_lazy:-}')"
expect_summary
