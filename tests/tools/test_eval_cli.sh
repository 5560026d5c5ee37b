#!/usr/bin/env bash
# `pfcps verify` / `pfcps embed` on the command line: a run on ORL pairs (the data/orl/pairs_s31-s40.txt format,
# 40 of its pairs) prints XNorm, Accuracy-Flip mean+-std in arcface_torch's %1.5f+-%1.5f form and the best
# threshold, exit 0; every bad input is refused naming the problem: missing checkpoint / set / image folder,
# a pairs file without --images, a pairs line of another shape, a header count that does not match, a missing
# image, an unreadable image, a hostile .bin, bad --folds (usage: exit 2), a non-checkpoint.
# Arguments: PFCPS MAKE_CKPT SRC
set -uo pipefail
. "$(dirname "$0")/../expect.sh"
PFCPS=$1 MAKE_CKPT=$2 SRC=$3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
"$MAKE_CKPT" "$TMP/model.ckpt" r18_w8 16 3 || die "make_ckpt"
ORL=$SRC/data/orl
{ printf '1\t20\n'; sed -n 2,21p "$ORL/pairs_s31-s40.txt"; sed -n 47,66p "$ORL/pairs_s31-s40.txt"; } >"$TMP/pairs.txt"

out=$("$PFCPS" verify --folds 4 "$TMP/model.ckpt" "$TMP/pairs.txt" --images "$ORL" 2>"$TMP/err"); rc=$?
echo "$out"
[ "$rc" -eq 0 ] || fail "verify on ORL pairs: exit $rc: $(cat "$TMP/err")"
expect_grep "Accuracy-Flip mean+-std" '^\[pairs\] Accuracy-Flip: [01]\.[0-9]{5}\+-[01]\.[0-9]{5}$' - <<<"$out"
expect_grep "XNorm" '^\[pairs\] XNorm: [0-9]+\.[0-9]+$' - <<<"$out"
expect_grep "Best-Threshold" '^\[pairs\] Best-Threshold: [0-9]\.[0-9]{2} ' - <<<"$out"
grep -q "80 of 80 images were not 112x112 and were resized" <<<"$out" || fail "the resize is not reported"
grep -q "pairs: 40 (4 folds)" <<<"$out" || fail "pair count not 40"
grep -q "embedded 80/80 images" "$TMP/err" || fail "no progress on stderr"

# expect EXIT_STATUS TEXT ARGS...: `pfcps ARGS` exits EXIT_STATUS and prints TEXT.
expect() {
  local want_rc=$1 want=$2; shift 2
  expect_rc "pfcps $*" "$want_rc" "$want" "$PFCPS" "$@"
}
C=$TMP/model.ckpt
expect 1 "cannot open" verify "$TMP/none.ckpt" "$TMP/pairs.txt" --images "$ORL"
expect 1 "not a pfcps backbone checkpoint" verify "$TMP/pairs.txt" "$TMP/pairs.txt" --images "$ORL"
expect 1 "none.txt: cannot open" verify "$C" "$TMP/none.txt" --images "$ORL"
expect 2 "needs the image folder (--images DIR)" verify "$C" "$TMP/pairs.txt"
read -r first_id first_img _ < <(sed -n 2p "$TMP/pairs.txt")
expect 1 "no image $first_img of '$first_id'" verify "$C" "$TMP/pairs.txt" --images "$TMP"
expect 2 "--folds needs an integer in [1, 256], got '0'" verify --folds 0 "$C" "$TMP/pairs.txt" --images "$ORL"
expect 2 "--folds 41 is more than the set's 40 pairs" verify --folds 41 "$C" "$TMP/pairs.txt" --images "$ORL"
expect 2 "needs CKPT and SET" verify "$C"
printf 's31\t1\t2\ns31\t1\n' >"$TMP/shape.txt"
expect 1 "shape.txt line 2: not a pair line" verify "$C" "$TMP/shape.txt" --images "$ORL"
printf '1\t3\ns31\t1\t2\ns31\t1\ts32\t2\n' >"$TMP/count.txt"
expect 1 "header (line 1) announces 6 pairs, the file has 2" verify "$C" "$TMP/count.txt" --images "$ORL"
mkdir -p "$TMP/imgs/a" && cp "$ORL/s31/1.pgm" "$TMP/imgs/a/1.pgm" && echo "not an image" >"$TMP/imgs/a/2.jpg"
printf 'a\t1\t2\n' >"$TMP/bad_img.txt"
expect 1 "image 1 ($TMP/imgs/a/2.jpg)" verify --folds 1 "$C" "$TMP/bad_img.txt" --images "$TMP/imgs"
printf '\x80\x02c__builtin__\neval\n.' >"$TMP/evil.bin"
expect 1 "GLOBAL" verify "$C" "$TMP/evil.bin"
expect 1 "no such file, folder or RecordIO prefix" embed "$C" "$TMP/nothing" "$TMP/o.npy"
expect 1 "no image file" embed "$C" "$TMP/count.txt" "$TMP/o.npy"
expect 2 "needs CKPT, INPUT and OUT.npy" embed "$C"
expect 2 "--batch needs an integer in [1, 1024]" embed --batch 0 "$C" "$TMP/imgs" "$TMP/o.npy"
expect_summary
