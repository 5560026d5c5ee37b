#!/usr/bin/env bash
# The pfcps tool's command line: every subcommand answers --help and -h (also `pfcps help CMD`) with its usage
# on stdout and exit 0 (`pfcps pack --help` among them); option values out of range are refused naming
# the option (exit 2); `pfcps config-get` prints the value the daemons' parser gives, for the forms that parser
# accepts (sections, inline ';' comments, one pair of quotes, blanks around '=', indented keys, defaults,
# --set in order), and refuses unknown keys, the secret and a config the daemons would refuse.
# Expected values below are written by hand from the config text, not produced by the tool.
set -uo pipefail
. "$(dirname "$0")/../expect.sh"
PFCPS=$1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# Every subcommand the tool lists in its own usage.
cmds=$("$PFCPS" --help | sed -n 's/^  pfcps \([a-z-]*\).*/\1/p')
[ -n "$cmds" ] || fail "pfcps --help lists no commands"
for c in $cmds; do
  for h in --help -h; do
    out=$("$PFCPS" "$c" $h 2>"$TMP/err"); rc=$?
    [ "$rc" -eq 0 ] || fail "pfcps $c $h: exit $rc ($(cat "$TMP/err"))"
    grep -q "^usage: pfcps $c" <<<"$out" || fail "pfcps $c $h: no usage line on stdout: $out"
  done
  # Also after other arguments, and through `pfcps help CMD`.
  out=$("$PFCPS" "$c" x --help 2>&1); rc=$?
  [ "$rc" -eq 0 ] && grep -q "^usage: pfcps $c" <<<"$out" || fail "pfcps $c x --help: exit $rc: $out"
  out=$("$PFCPS" help "$c" 2>&1); rc=$?
  [ "$rc" -eq 0 ] && grep -q "^usage: pfcps $c" <<<"$out" || fail "pfcps help $c: exit $rc: $out"
  echo "pfcps $c: --help, -h, help $c -> usage, exit 0"
done
for must in pack rec-info config-get; do grep -qx "$must" <<<"$cmds" || fail "pfcps --help does not list $must"; done

# Usage errors name the option (exit 2).
# expect_refusal TEXT ARGS...: `pfcps ARGS` is refused (exit 2) with TEXT.
expect_refusal() {
  local want=$1; shift
  expect_rc "pfcps $*" 2 "$want" "$PFCPS" "$@"
}
expect_refusal "--quality needs an integer in [1, 100], got '0'" pack --quality 0 in out
expect_refusal "--quality needs an integer in [1, 100], got nothing" pack --quality
expect_refusal "--first-class needs an integer" pack --first-class x in out
expect_refusal "--first-class needs an integer in [0, 281474976710655]" pack --first-class 281474976710656 in out
expect_refusal "--identities needs an integer in [1," pack --identities 0 in out
expect_refusal "unexpected argument '--bogus'" pack --bogus in out
# --name=value: the same option as --name value, errors name the option alone; a flag refuses a value
expect_refusal "--quality needs an integer in [1, 100], got '0'" pack --quality=0 in out
expect_refusal "--quality needs an integer in [1, 100], got ''" pack --quality= in out
expect_eq "config-get --set=KEY=VALUE" "$(env -u PFCPS_SECRET "$PFCPS" config-get --set=servers=3 servers)" 3
expect_eq "config-get --set=secret=... (a value holding '=')" \
  "$(env -u PFCPS_SECRET "$PFCPS" config-get --set=secret=a=b secret)" set
expect_refusal "unexpected argument '--newest=1'" ckpt-info --newest=1 "$TMP"
expect_refusal "--run given twice" ckpt-info --run 0123456789abcdef0123456789abcdef --run=0123456789abcdef0123456789abcdef "$TMP"
expect_refusal "unknown key 'serverz'" config-get serverz
# The secret: whether one is set (the file, a --set or $PFCPS_SECRET), never its value.
expect_eq "config-get secret without one" "$(env -u PFCPS_SECRET "$PFCPS" config-get secret)" unset
expect_eq "config-get secret from --set" "$(env -u PFCPS_SECRET "$PFCPS" config-get --set secret=hush-123 secret)" set
expect_eq "config-get secret from PFCPS_SECRET" "$(PFCPS_SECRET=hush-456 "$PFCPS" config-get secret)" set
expect_refusal "needs at least one KEY" config-get

# config-get against the parser's accepted forms.
cat >"$TMP/run.ini" <<'INI'
# a comment line
; another comment line
[train]
network = "r18"            ; quoted, inline comment
embedding_size=64
[data]
output = "out dir/with spaces"   ; quoted value with blanks
  frequent = 7
[cluster]
servers = 3 ; three servers
workers   =   2
provider = 'shm'
rendezvous = 127.0.0.1:4242 ; the port
[server]
snapshot_dir = /snap;shot
INI
# check WANT KEY [ARGS...]: `pfcps config-get -c run.ini ARGS KEY` exits 0 printing exactly WANT.
check() {
  local want=$1 key=$2 got rc=0; shift 2
  got=$("$PFCPS" config-get -c "$TMP/run.ini" "$@" "$key" 2>&1) || rc=$?
  expect_eq "config-get $key $*" "exit $rc: $got" "exit 0: $want"
}
check "r18" network
check "64" embedding_size
check "out dir/with spaces" output
check "7" frequent
check "3" servers
check "2" workers
check "shm" provider
check "127.0.0.1:4242" rendezvous
check "/snap;shot" snapshot_dir               # ';' without a blank before it is not a comment
check "fp32" wire_dtype                       # default
check "5" workers --set workers=5
check "4" servers --set servers=5 -s servers=4  # last --set wins
check "a b" output --set "output=a b"
# Several keys: one line each, in order.
got=$("$PFCPS" config-get -c "$TMP/run.ini" servers workers output)
expect_eq "config-get servers workers output" "$got" $'3\n2\nout dir/with spaces'
# A config the daemons refuse is refused here too (same parser), naming the line.
printf '[cluster]\nservers = 0\n' >"$TMP/bad.ini"
expect_refusal "servers" config-get -c "$TMP/bad.ini" servers
printf '[cluster]\nserverz = 2\n' >"$TMP/bad2.ini"
expect_refusal "serverz" config-get -c "$TMP/bad2.ini" servers
# More servers than classes (a shard would be empty): refused here too, not only by server 0 at start-up
# (the launcher asks config-get first, so no daemon starts to wait ctl_timeout for a run that cannot form).
printf '[train]\nnum_classes = 3\n[cluster]\nservers = 5\n' >"$TMP/bad3.ini"
expect_refusal "5 servers for num_classes 3 leaves a shard empty" config-get -c "$TMP/bad3.ini" servers

# OUT_PREFIX naming a folder (ending in '/', or an existing one) packs <folder>/train.rec/.idx + <folder>/property,
# what rec = <folder> reads; neither a hidden <folder>/.rec and .idx nor a <folder>.rec beside it is written.
if [ -d "${PFCPS_SOURCE:-}/data/orl/s1" ]; then
  mkdir -p "$TMP/faces" "$TMP/existing"
  ln -sfn "$PFCPS_SOURCE/data/orl/s1" "$TMP/faces/s1"
  for out in "$TMP/new/" "$TMP/existing"; do
    dirp=${out%/}
    "$PFCPS" pack --quiet "$TMP/faces" "$out" >"$TMP/pack.out" 2>&1 || fail "pack into $out: $(cat "$TMP/pack.out")"
    for f in train.rec train.idx property; do [ -f "$dirp/$f" ] || fail "pack into $out: no $dirp/$f"; done
    [ ! -e "$dirp/.rec" ] && [ ! -e "$dirp.rec" ] || fail "pack into $out: wrote $dirp/.rec or $dirp.rec"
    grep -qF "into $dirp/train.rec/.idx" "$TMP/pack.out" || fail "pack into $out: says $(cat "$TMP/pack.out")"
    info=$("$PFCPS" rec-info "$dirp" 2>&1)
    grep -q "^images      10$" <<<"$info" || fail "rec-info $dirp after pack into $out: $info"
    echo "pack into $out -> $dirp/train.rec, rec-info $dirp: 10 images"
  done
  # --identities beyond the folders there: everything packed, and a note says so.
  "$PFCPS" pack --quiet --identities 99 "$TMP/faces" "$TMP/ids/" >"$TMP/pack.out" 2>&1 || fail "pack --identities 99: $(cat "$TMP/pack.out")"
  grep -qF -- "--identities 99 asked, but $TMP/faces has only 1 identity folders" "$TMP/pack.out" ||
    fail "pack --identities 99 with 1 folder: no note, said [$(cat "$TMP/pack.out")]"
  echo "pack --identities 99 with 1 folder: noted"
else
  fail "ORL faces not found under PFCPS_SOURCE/data/orl"
fi

expect_summary
