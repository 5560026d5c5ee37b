#!/usr/bin/env bash
# Paths that lie, given to the pfcps tool: folder walks through symbolic-link loops and FIFOs in place of
# files.
# - `pfcps embed` over a folder holding one image and a link back to a folder above it gives exactly one
#   embedding (not 41), and with two loops (exponential before) one too, within the timeout, each skipped
#   link named in a warning; a second link to a folder already walked is skipped the same way.
# - `pfcps pack` over an image tree with a link to the tree itself and a second link to an identity packs
#   one record of one class, with a warning naming each link.
# - A FIFO given as an embed list file, a pairs file, a checkpoint, a config or a centers partition file is
#   refused at once naming the path and "a FIFO" (opening it for reading would wait for a writer: the
#   timeout).
# Arguments: PFCPS MAKE_CKPT SRC
set -uo pipefail
. "$(dirname "$0")/../expect.sh"
PFCPS=$1 MAKE_CKPT=$2 SRC=$3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
"$MAKE_CKPT" "$TMP/model.ckpt" r18_w8 16 3 || die "make_ckpt"
IMG=$SRC/data/orl/s1/1.pgm

# rows OUT.npy: the first dimension of a .npy's shape
rows() { head -c 128 "$1" | tr -d '\0' | LC_ALL=C sed -n "s/.*'shape': (\([0-9]*\),.*/\1/p"; }

# embed_one NAME WARNINGS: embeds $TMP/NAME (one image inside); wants 1 row and WARNINGS skipped links
embed_one() {
  local name=$1 want_warn=$2
  timeout 30 "$PFCPS" embed "$TMP/model.ckpt" "$TMP/$name" "$TMP/$name.npy" 2>"$TMP/$name.err"
  local rc=$?
  [ "$rc" -eq 0 ] || { fail "embed $name: exit $rc (124: the walk did not end): $(tail -n 3 "$TMP/$name.err")"; return; }
  local n warn
  n=$(rows "$TMP/$name.npy")
  warn=$(grep -c "a link to a folder already walked" "$TMP/$name.err")
  [ "$n" = 1 ] || fail "embed $name: $n embeddings of the one image, wanted 1"
  [ "$warn" -eq "$want_warn" ] || fail "embed $name: $warn warnings, wanted $want_warn: $(cat "$TMP/$name.err")"
  echo "embed $name: $n embedding, $warn skipped links: $(grep -o '[^ ]*: a link to a folder already walked' "$TMP/$name.err" | tr '\n' ' ')"
}

# One loop: loop1/sub/1.pgm, loop1/sub/up -> .. (loop1).
mkdir -p "$TMP/loop1/sub" && cp "$IMG" "$TMP/loop1/sub/1.pgm" && ln -s .. "$TMP/loop1/sub/up"
embed_one loop1 1
grep -q "loop1/sub/up: a link to a folder already walked" "$TMP/loop1.err" || fail "embed loop1: the warning does not name the link"
# Two loops: loop2/a/1.pgm, loop2/a/up -> .. (loop2), loop2/a/self -> . (loop2/a).
mkdir -p "$TMP/loop2/a" && cp "$IMG" "$TMP/loop2/a/1.pgm" && ln -s .. "$TMP/loop2/a/up" && ln -s . "$TMP/loop2/a/self"
embed_one loop2 2
# A second link to a folder already walked (no loop): alias/a/1.pgm, alias/b -> a.
mkdir -p "$TMP/alias/a" && cp "$IMG" "$TMP/alias/a/1.pgm" && ln -s a "$TMP/alias/b"
embed_one alias 1
grep -q "alias/b: a link" "$TMP/alias.err" || fail "embed alias: the second link (b, after a) is not the one skipped"

# pack: tree/a/1.pgm, tree/a/up -> .. (not followed: identity folders hold images), tree/self -> . and
# tree/b -> a (skipped, warned).
mkdir -p "$TMP/tree/a" && cp "$IMG" "$TMP/tree/a/1.pgm" && ln -s .. "$TMP/tree/a/up" && ln -s . "$TMP/tree/self" &&
  ln -s a "$TMP/tree/b"
if timeout 30 "$PFCPS" pack "$TMP/tree" "$TMP/packed/train" >"$TMP/pack.out" 2>"$TMP/pack.err"; then
  info=$("$PFCPS" rec-info "$TMP/packed/train")
  grep -Eq '^images +1$' <<<"$info" || fail "pack: not one image record: $info"
  grep -q "^classes *1 distinct" <<<"$info" || fail "pack: not one class: $info"
  for l in self b; do
    grep -q "tree/$l: a link to a folder already packed" "$TMP/pack.err" || fail "pack: no warning naming tree/$l: $(cat "$TMP/pack.err")"
  done
  echo "pack: $(cat "$TMP/pack.out")"
else
  fail "pack over a tree with link loops: exit $?: $(tail -n 3 "$TMP/pack.err")"
fi

# FIFOs: refused at once, naming the path and its kind.
mkfifo "$TMP/fifo.txt" "$TMP/fifo.ini" "$TMP/fifo.py"
expect_fifo() { # what args...
  local what=$1; shift
  out=$(timeout 20 "$PFCPS" "$@" 2>&1); rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || ! grep -q "$TMP/[^ ]*: a FIFO, not a regular file" <<<"$out"; then
    fail "$what: exit $rc (124: blocked on the FIFO): $out"
  else
    ok "$what: exit $rc: $(tail -n 1 <<<"$out")"
  fi
}
expect_fifo "embed list file" embed "$TMP/model.ckpt" "$TMP/fifo.txt" "$TMP/o.npy"
expect_fifo "verify pairs file" verify "$TMP/model.ckpt" "$TMP/fifo.txt" --images "$SRC/data/orl"
expect_fifo "verify checkpoint" verify "$TMP/fifo.txt" "$TMP/fifo.txt" --images "$SRC/data/orl"
expect_fifo "config (INI)" config-get -c "$TMP/fifo.ini" lr
expect_fifo "config (.py)" config-get -c "$TMP/fifo.py" lr
mkdir -p "$TMP/run/centers" && mkfifo "$TMP/run/centers/fifo.rank0" && ln -s fifo.rank0 "$TMP/run/centers/partition.rank0"
expect_fifo "centers partition" export --centers --dim 4 "$TMP/run" "$TMP/centers.safetensors"

expect_summary
