#!/usr/bin/env bash
# A worker given a dataset whose labels exceed num_classes fails at start-up with a message naming the
# label and the record; it trains nothing. (3 ORL identities have labels 0..2; the run says 2 classes.)
source "$(dirname "$0")/cluster.sh" "$@"
pack_orl 3
run_ini "$TMP/run.ini" 1 1 bad-labels-secret <<INI
[train]
$TINY_NET
output = $TMP/out
[data]
rec = $TMP/train
num_classes = 2
INI
start_cluster "$TMP/run.ini" 1 1 --trace "$TMP/trace"
rc=0; wait "${WPIDS[0]}" || rc=$?
stop_servers
cat "$TMP/worker0.log" | tail -3
[ "$rc" -ne 0 ] || die "the worker exited 0 on labels >= num_classes"
grep -Eq "(label|class) 2 >= num_classes 2" "$TMP/worker0.log" || die "message does not name label 2"
grep -Eq "key [0-9]+|record [0-9]+" "$TMP/worker0.log" || die "message does not name the record"
[ ! -s "$TMP/trace" ] || die "the worker trained steps before failing"
echo "PASS"
