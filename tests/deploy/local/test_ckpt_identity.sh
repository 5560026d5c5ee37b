#!/usr/bin/env bash
# Checkpoint files that lie: every file of a checkpoint carries the run identity (run id, seed, config digest)
# and, under the join secret, an HMAC; a step whose files disagree, come from another run or config, or were
# forged is refused with the file and the field named, and the resume takes the newest step that is sound (a
# run with another config's newer steps is not resumed over: the run does not form).
# Two runs of 2 servers + 2 workers on 10 ORL identities (12 steps, snapshot_every 4, snapshot_keep 2: steps 8
# and 12), one with seed = 7 (run a), one with seed = 2048 (run b). Each case damages a copy of run b's
# checkpoints and resumes from it under the launcher; a resume that falls back to step 8 must end with run b's
# model.ckpt:
#   foreign: step 12's shard-1-of-2.snap of run a copied into run b's step 12: ckpt-info shows step 12
#            INCOMPLETE naming the file and the fields (run_id, seed); every server refuses step 12 naming the
#            file and the fields; the run resumes at step 8;
#   pair:    worker 1's .snap and .model of run a in run b's step 12: the pair agrees with itself, so worker 1
#            lists step 12; the rendezvous skips it as "worker[1]'s files are of another run than server[0]'s"
#            (run_id, seed) and resumes at step 8; ckpt-info names the file;
#   config:  all of run a's step 12 in place of run b's: the files agree with each other, but the rendezvous
#            skips step 12 as "written by a run with another config" (seed 7 vs 2048); resuming at step 8 would
#            write step 12 over run a's files, so the run does not form (launch.sh fails, naming step 12 and step
#            8), and every file is untouched;
#   config_only: run a's step 12 alone: no step can be resumed, and a new run would overwrite run a's files
#            (same step names): the run does not form (launch.sh fails, every member names why), files untouched;
#   forged:  block_rows = 2^54 in both shard files of step 12, their digests and HMAC recomputed with the
#            secret: ckpt-info (with and without the secret) and every server refuse naming the file and
#            block_rows; the run resumes at step 8;
#   secret:  the checkpoints read under another secret: ckpt-info shows every step INCOMPLETE ("forged or
#            written by another run's secret"), the members refuse every step and the run starts afresh; with
#            the old steps renamed 20 and 24 (a longer earlier run), the fresh run's own checkpoints all succeed
#            and end complete (steps 8, 12), and the old run's are left alone;
#   without the secret ckpt-info verifies the digests only and says it could not authenticate.
# The smaller cases: a checkpoint root that is a regular file or under one is an error for ckpt-info (exit 1,
# the reason named) and for a resuming member (it refuses to start, naming the root), not a silent fresh start;
# so is one it has no permission to read (as an unprivileged user, where one can be switched to); step-0072
# and step-99999999999999999999 are skipped with a warning, not taken as steps 72 and INT64_MAX; a folder in
# place of a shard file is "a directory, not a regular file".
source "$(dirname "$0")/cluster.sh" "$@"
export OMP_NUM_THREADS=1 PFCPS_SECRET=identity-secret
pack_orl 10
SNAP="python3 $SRC/tests/pfcps_snap.py"

# write_cfg NAME SEED [LINE...]: $TMP/NAME.ini (cluster.sh ckpt_ini: 2 epochs, 2 + 2, keep 2, 10 classes).
write_cfg() {
  local name=$1 seed=$2; shift 2
  ckpt_ini "$name" 2 2 2 2 10 "seed = $seed" "$@"
}

# log_has NAME LOG PATTERN WHAT: $TMP/NAME/logs/LOG.log has a line matching PATTERN (grep -E).
log_has() {
  expect_grep "$1: $2: $4" "$3" "$TMP/$1/logs/$2.log" || tail -25 "$TMP/$1/logs/$2.log"
}

# damaged NAME: a copy of run b's checkpoints in $TMP/NAME/snapshots, config $TMP/NAME.ini (seed 2048) with
# resume = true.
damaged() {
  mkdir -p "$TMP/$1"
  cp -r "$TMP/b/snapshots" "$TMP/$1/" || die "copy"
  write_cfg "$1" 2048 "resume = true"
}

# resumed_at NAME STEP: both workers resumed at STEP, and the result is run b's.
resumed_at() {
  local w
  for w in 0 1; do log_has "$1" "worker$w" "resuming at checkpoint step $2 " "resumed at step $2"; done
  cmp -s "$TMP/b/model.ckpt" "$TMP/$1/model.ckpt" && ok "$1: model.ckpt equals run b's" ||
    fail "$1: model.ckpt differs from run b's"
}

write_cfg a 7
ckpt_launch a
write_cfg b 2048
ckpt_launch b
for r in a b; do
  [ -n "$(ckpt_hashes "$TMP/$r" 12)" ] && [ -n "$(ckpt_hashes "$TMP/$r" 8)" ] ||
    { "$PFCPS" ckpt-info "$TMP/$r"; die "run $r: checkpoints 8 and 12 not both complete"; }
done
RUN_B=$("$PFCPS" ckpt-info "$TMP/b" | sed -n '/^step 12: complete/{n;s/^  run \([0-9a-f]\{32\}\)  seed 2048  config digest [0-9a-f]\{16\}$/\1/p}')
[ -n "$RUN_B" ] || { "$PFCPS" ckpt-info "$TMP/b"; die "run b: ckpt-info shows no run id, seed 2048 and config digest below step 12"; }
expect_eq "run b: steps 8 and 12 of one run" "$("$PFCPS" ckpt-info "$TMP/b" | grep -c "^  run $RUN_B  seed 2048 ")" 2
expect_grep "run b: authenticated" "^authenticated: every .snap's HMAC verified" <("$PFCPS" ckpt-info "$TMP/b")
expect_rc "without the secret" 0 "not authenticated: PFCPS_SECRET is not set" env -u PFCPS_SECRET "$PFCPS" ckpt-info "$TMP/b"
expect_grep "without the secret: the digests still pass" "^step 12: complete" - <<<"$OUT"

# --- foreign: a shard file of run a in run b's step 12 ------------------------------------------------------
damaged foreign
bad=$TMP/foreign/snapshots/step-12/shard-1-of-2.snap
cp "$TMP/a/snapshots/step-12/shard-1-of-2.snap" "$bad" || die "copy"
expect_rc "foreign: ckpt-info" 0 "step-12/shard-1-of-2.snap: another run's file: header fields run_id" "$PFCPS" ckpt-info "$TMP/foreign"
expect_grep "foreign: ckpt-info shows step 12 INCOMPLETE with the seed" "^step 12: INCOMPLETE .*shard-1-of-2\.snap: .*seed 7 vs 2048" - <<<"$OUT"
expect_eq "foreign: ckpt-info --newest" "$("$PFCPS" ckpt-info --newest "$TMP/foreign")" 8
ckpt_launch foreign
for r in 0 1; do
  log_has foreign "server$r" "checkpoint step 12 not usable by this server: $bad: another run's file: header fields run_id [0-9a-f]{32} vs $RUN_B, seed 7 vs 2048" \
    "refuses step 12 naming the file, run_id and seed"
  log_has foreign "server$r" "loaded checkpoint step 8: " "loaded step 8"
done
log_has foreign server0 "step 12 skipped: not complete on server\[0\]; step 8 is the newest checkpoint complete on all 4 members; run id $RUN_B" \
  "the rendezvous skips step 12 and keeps run b's id"
resumed_at foreign 8

# --- pair: worker 1's pair of run a in run b's step 12 (consistent in itself: only the rendezvous sees it) -----
damaged pair
for ext in snap model; do cp "$TMP/a/snapshots/step-12/worker-1-of-2.$ext" "$TMP/pair/snapshots/step-12/" || die "copy"; done
expect_rc "pair: ckpt-info" 0 "step-12/worker-1-of-2.snap: another run's file: header fields run_id" "$PFCPS" ckpt-info "$TMP/pair"
ckpt_launch pair
log_has pair server0 "step 12 skipped: worker\[1\]'s files are of another run than server\[0\]'s: run_id [0-9a-f]{32} vs $RUN_B, seed 7 vs 2048" \
  "the rendezvous skips step 12 naming worker 1 and the fields"
resumed_at pair 8

# --- config: all of run a's step 12 in place of run b's -----------------------------------------------------
damaged config
rm -rf "$TMP/config/snapshots/step-12"
cp -r "$TMP/a/snapshots/step-12" "$TMP/config/snapshots/" || die "copy"
expect_grep "config: ckpt-info: step 12's files agree among themselves" "^step 12: complete" <("$PFCPS" ckpt-info "$TMP/config")
before=$(cd "$TMP/config/snapshots" && find . -type f | sort | xargs sha256sum)
s=0; "$SRC/deploy/local/launch.sh" -b "$BUILD" -c "$TMP/config.ini" >"$TMP/config.out" 2>&1 || s=$?
[ "$s" -ne 0 ] && ok "config: the launcher fails (status $s)" || fail "config: the launcher exits 0"
log_has config server0 "step 12 skipped: written by a run with another config: seed 7 vs 2048, config_digest [0-9a-f]{16}\.\.\. vs [0-9a-f]{16}\.\.\. \(the files vs this run's config\); resume = true, but step 12, complete on all 4 members, is of a run with another config, newer than any step this run can resume \(step 8\): training from there would overwrite its checkpoints" \
  "the rendezvous names step 12 as another config's, newer than step 8, and does not form the run"
after=$(cd "$TMP/config/snapshots" && find . -type f | sort | xargs sha256sum)
expect_eq "config: both steps' files are untouched and nothing was added" "$after" "$before"

# --- config_only: run a's step 12 alone in run b's snapshots (step 8 gone): resume = true has nothing to resume,
# and a new run would write its steps 4, 8, 12 over run a's: the run does not form, every member exits 1 naming
# why, and run a's files stay as they were.
damaged config_only
rm -rf "$TMP/config_only/snapshots/step-12" "$TMP/config_only/snapshots/step-8"
cp -r "$TMP/a/snapshots/step-12" "$TMP/config_only/snapshots/" || die "copy"
before=$(cd "$TMP/config_only/snapshots" && find . -type f | sort | xargs sha256sum)
s=0; "$SRC/deploy/local/launch.sh" -b "$BUILD" -c "$TMP/config_only.ini" >"$TMP/config_only.out" 2>&1 || s=$?
[ "$s" -ne 0 ] && ok "config_only: the launcher fails (status $s)" || fail "config_only: the launcher exits 0"
log_has config_only server0 "the run does not form: .*resume = true, but step 12, complete on all 4 members, is of a run with another config, newer than any step this run can resume \(none: 0\): training from there would overwrite its checkpoints" \
  "the rendezvous refuses to start a new run over another config's checkpoints"
log_has config_only worker1 "ERROR .*training from there would overwrite its checkpoints" "worker 1 is told why"
after=$(cd "$TMP/config_only/snapshots" && find . -type f | sort | xargs sha256sum)
expect_eq "config_only: run a's checkpoint files are untouched and nothing was added" "$after" "$before"

# --- forged: block_rows = 2^54 in both shard files, digests and HMAC recomputed -----------------------------
damaged forged
for s in 0 1; do
  $SNAP set "$TMP/forged/snapshots/step-12/shard-$s-of-2.snap" block_rows=$((1 << 54)) --secret "$PFCPS_SECRET" || die "forge"
done
f0=$TMP/forged/snapshots/step-12/shard-0-of-2.snap
expect_rc "forged: ckpt-info" 0 "$f0: header field block_rows = 18014398509481984 is outside 1..rows (5)" "$PFCPS" ckpt-info "$TMP/forged"
expect_rc "forged: ckpt-info without the secret" 0 "$f0: header field block_rows = 18014398509481984" env -u PFCPS_SECRET "$PFCPS" ckpt-info "$TMP/forged"
ckpt_launch forged
for r in 0 1; do
  log_has forged "server$r" "checkpoint step 12 not usable by this server: $f0: header field block_rows = 18014398509481984 is outside 1\.\.rows" \
    "refuses step 12 naming the file and block_rows"
done
resumed_at forged 8

# --- secret: the checkpoints under another secret -----------------------------------------------------------
damaged secret
# as steps 20 and 24, later than any the fresh run below writes (a longer earlier run in the same output)
mv "$TMP/secret/snapshots/step-8" "$TMP/secret/snapshots/step-20" && mv "$TMP/secret/snapshots/step-12" "$TMP/secret/snapshots/step-24" ||
  die "rename"
expect_rc "secret: ckpt-info under another secret" 0 "HMAC does not verify: forged or written by another run's secret" \
  env PFCPS_SECRET=another-secret "$PFCPS" ckpt-info "$TMP/secret"
expect_grep "secret: no step complete" "^no complete checkpoint$" - <<<"$OUT"
PFCPS_SECRET=another-secret ckpt_launch secret
log_has secret worker0 "checkpoint step 24 not usable by this worker: .*worker-0-of-2\.snap: HMAC does not verify: forged or written by another run's secret" \
  "refuses step 24 as forged"
log_has secret server0 "no checkpoint is complete on all 4 members: starting from scratch; run id [0-9a-f]{32} \(new: the run starts afresh\)" \
  "starts afresh with a new run id"
cmp -s "$TMP/b/model.ckpt" "$TMP/secret/model.ckpt" && ok "secret: the fresh start equals run b (seeded)" ||
  fail "secret: model.ckpt differs from run b's"
# The fresh run writes steps 4, 8 and 12 beside the old run's 20 and 24: its pruning leaves the old run's files
# out (they would count as newer complete steps and its own would be pruned while being written).
if grep -q "checkpoint steps failed" "$TMP/secret.out"; then
  fail "secret: checkpoint writes failed: $(grep -m1 "checkpoint steps failed" "$TMP/secret.out")"
else
  ok "secret: every checkpoint write of the fresh run succeeded"
fi
expect_rc "secret: the fresh run's checkpoints under its secret" 0 "step 12: complete" \
  env PFCPS_SECRET=another-secret "$PFCPS" ckpt-info "$TMP/secret"
expect_grep "secret: its step 8 complete too (snapshot_keep 2)" "^step 8: complete" - <<<"$OUT"
[ -d "$TMP/secret/snapshots/step-20" ] && [ -d "$TMP/secret/snapshots/step-24" ] &&
  ok "secret: the old run's steps 20 and 24 left alone" || fail "secret: the old run's steps 20 and 24 were removed"

# --- the checkpoint root: a regular file, a path under one, no permission -----------------------------------
echo x >"$TMP/plain"
expect_rc "root is a regular file: ckpt-info" 1 "$TMP/plain: a regular file, not a folder" "$PFCPS" ckpt-info "$TMP/plain"
expect_rc "root under a file: ckpt-info" 1 "$TMP/plain/snapshots: Not a directory" "$PFCPS" ckpt-info "$TMP/plain/snapshots"
write_cfg under 2048 "resume = true" "snapshot_dir = $TMP/plain/snapshots"
if "$SRC/deploy/local/launch.sh" -b "$BUILD" -c "$TMP/under.ini" >"$TMP/under.out" 2>&1; then
  fail "root under a file: the launcher exited 0 (a silent fresh start?)"
else
  ok "root under a file: the launcher failed"
fi
log_has under server0 "resume = true: cannot read the checkpoint root $TMP/plain/snapshots: Not a directory" \
  "refuses to start naming the root"
log_has under server1 "resume = true: cannot read the checkpoint root $TMP/plain/snapshots: Not a directory" \
  "refuses to start naming the root"
log_has under worker0 "config key 'snapshot_dir': cannot create the folder '$TMP/plain/snapshots': Not a directory" \
  "refuses to start naming the root"
if id nobody >/dev/null 2>&1 && command -v setpriv >/dev/null 2>&1; then
  mkdir -p "$TMP/locked/snapshots/step-4"
  chmod 711 "$TMP"
  chmod 700 "$TMP/locked/snapshots"
  expect_rc "root without permission: ckpt-info" 1 "cannot read the checkpoint root $TMP/locked/snapshots: permission denied" \
    setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups "$PFCPS" ckpt-info "$TMP/locked"
  chmod 700 "$TMP"
else
  ok "root without permission: skipped (no user nobody or no setpriv)"
fi

# --- step names: only canonical ones --------------------------------------------------------------------------
mkdir -p "$TMP/names/step-0072" "$TMP/names/step-99999999999999999999" "$TMP/names/step-+8"
cp -r "$TMP/b/snapshots/step-8" "$TMP/names/"
expect_rc "step names" 0 "'step-0072' skipped: not a step folder name" "$PFCPS" ckpt-info "$TMP/names"
expect_grep "step names: the overflowing one skipped" "'step-99999999999999999999' skipped: not a step folder name" - <<<"$OUT"
expect_grep "step names: only step 8 counted" "^checkpoints in $TMP/names: 1$" - <<<"$OUT"

# --- a folder in place of a shard file -------------------------------------------------------------------------
rm "$TMP/names/step-8/shard-1-of-2.snap"
mkdir "$TMP/names/step-8/shard-1-of-2.snap"
expect_rc "a folder as a shard file" 0 "step-8/shard-1-of-2.snap: a directory, not a regular file" "$PFCPS" ckpt-info "$TMP/names"
expect_summary
