#!/usr/bin/env bash
# pfcps plan's command line: missing and invalid options are refused naming the option (exit 2), runs that no
# server count fits exit 1 with the reason, and one plan prints the figures worked out by hand below
# (tests/tools/test_plan.c checks the arithmetic itself).
set -uo pipefail
. "$(dirname "$0")/../expect.sh"
PFCPS=$1

# expect EXIT_CODE TEXT ARGS...: `pfcps plan ARGS` exits EXIT_CODE and prints TEXT.
expect() {
  local code=$1 want=$2; shift 2
  expect_rc "pfcps plan $*" "$code" "$want" "$PFCPS" plan "$@"
}
req=(--identities 2M --workers 1 --link-gbps 8)
expect 2 "--identities is required" --workers 1 --link-gbps 8
expect 2 "--workers is required" --identities 2M --link-gbps 8
expect 2 "--link-gbps is required" --identities 2M --workers 1
expect 2 "--identities needs an integer in [1, 1e15] (k, M, G suffixes allowed), got '1.5'" --identities 1.5 --workers 1 --link-gbps 8
expect 2 "--identities needs an integer in [1, 1e15] (k, M, G suffixes allowed), got '2X'" --identities 2X --workers 1 --link-gbps 8
expect 2 "--dim needs an integer in [1, 65536], got 'x'" "${req[@]}" --dim x
expect 2 "--dim needs an integer in [1, 65536], got '0'" "${req[@]}" --dim 0
expect 2 "--sample-rate needs a number in (0, 1], got '0'" "${req[@]}" --sample-rate 0
expect 2 "--sample-rate needs a number in (0, 1], got '1.5'" "${req[@]}" --sample-rate 1.5
expect 2 "--sampled needs an integer in [1, 1e15]" "${req[@]}" --sampled 0
expect 2 "give --sample-rate or --sampled, not both" "${req[@]}" --sample-rate 0.1 --sampled 100k
expect 2 "--wire needs one of fp32, fp16, bf16, got 'fp8'" "${req[@]}" --wire fp8
expect 2 "--head-mode needs global or local, got 'both'" "${req[@]}" --head-mode both
expect 2 "--link-gbps needs a number of Gbit/s > 0, got nothing" --identities 2M --workers 1 --link-gbps
expect 2 "--link-gbps needs a number of Gbit/s > 0, got '-3'" --identities 2M --workers 1 --link-gbps -3
expect 2 "--mem-bw needs a number of GB/s > 0, got '0'" "${req[@]}" --mem-bw 0
expect 2 "--backbone-ms needs a number of milliseconds >= 0, got '-1'" "${req[@]}" --backbone-ms -1
expect 2 "unexpected argument '--bogus'" "${req[@]}" --bogus
# No count of 0.25 GiB servers holds anything (the start-up margin alone is 256 MiB); one 10 GiB server is too
# few for 4M identities at D = 512 (16.4 GB of table).
expect 1 "do not fit 1000000 servers of 0.25 GiB" "${req[@]}" --server-mem 0.25
expect 1 "1 server of 10 GiB is too few" --identities 4M --workers 1 --link-gbps 8 --server-mem 10 --servers 1

# C = 2M, D = 512, r = 0.1, W = 1, B = 128, 8 Gbit/s (1e9 B/s), 10 GB/s, 60 GFLOP/s, 10 GiB per server:
#   k = 200000, N = 128; 4105 bytes per identity; table 8210000000 B = 8.21 GB;
#   one server: 2 x 4096000000 + 2000000 rows x 9 + 512000000 + 268435456 margin + 128 x 1048624 + 200000 x
#   (2056 + 2048) buffers = 9945459328 B = 9.26 GiB <= 10 GiB;
#   393 messages (ceil(200000 / 510)) each way: pull in 409600000 + 25152, push out 411200000 + 25152 + ...:
#   link (409625152 + 411225152) / 1e9 = 820.9 ms; memory 200000 x 7 x 2048 / 1e10 = 286.7 ms;
#   head 6 x 128 x 200000 x 512 = 78.6432 GFLOP / 60 = 1310.7 ms; step 820.85 + 1310.72 = 2131.6 ms.
out=$("$PFCPS" plan --identities 2M --sample-rate 0.1 --workers 1 --batch 128 --link-gbps 8 --mem-bw 10 \
  --gemm-gflops 60 --server-mem 10 2>&1); rc=$?
[ "$rc" -eq 0 ] || fail "plan at 2M: exit $rc: $out"
for want in "k = 200000 rows sampled, head over N = 128 rows" "4105 bytes per identity (8 D + 9), table 8.21 GB" \
  "servers needed for memory: 1 of 10 GiB each" "= 9.26 GiB of 10 GiB" \
  "link 820.9 ms, server memory 286.7 ms, head compute 1310.7 ms, backbone 0.0 ms" \
  "= 2131.6 ms; bound: head compute"; do
  grep -qF -- "$want" <<<"$out" || fail "plan at 2M: no '$want' in: $out"
done
# A plan at scale: 100M identities, D = 512, r = 0.1, 64 workers x 128, 200 Gbit/s, defaults elsewhere (256 GiB,
# 100 GB/s, 15000 GFLOP/s). k = 0.1 x 1562500 = 156250, N = 8192. Memory: one server needs 2 x 204.8e9 +
# 9e8 + 25.6e9 + 2^28 + 128 x 1048624 + 64 x 156250 x 4104 = ~477.4 GB (> 256 GiB); two need ~238.8 GB each
# (<= 274.9 GB). Bandwidth: a worker's link at one message per server (307 = ceil(156250 / 510)): (320000000 +
# 19648 + 321250000 + 19648) / 25e9 = 25.65 ms; head 6 x 8192 x 156250 x 512 / 15e12 = 262.14 ms; limit 287.8
# ms, x 1.1 = 316.6 ms: the servers' links (64 / S x 25.65 ms <= 54.43 ms) need S >= 31, their memory (1.4336 s
# / S) S >= 27.
out100=$("$PFCPS" plan --identities 100M --dim 512 --sample-rate 0.1 --workers 64 --batch 128 --link-gbps 200 2>&1)
for want in "k = 156250 rows sampled, head over N = 8192 rows" "servers needed for memory: 2 of 256 GiB each" \
  "servers needed for bandwidth: 31 (the fewest for a step within 10% of 287.8 ms"; do
  grep -qF -- "$want" <<<"$out100" || fail "plan at 100M: no '$want' in: $out100"
done
# Defaults are marked as assumptions; measured figures are not.
grep -qF "server memory 10 GiB, bandwidth 10 GB/s; head GEMM 60 GFLOP/s" <<<"$out" || fail "given figures marked: $out"
out=$("$PFCPS" plan "${req[@]}" 2>&1)
grep -qF "server memory 256 GiB (assumed), bandwidth 100 GB/s (assumed); head GEMM 15000 GFLOP/s (assumed)" <<<"$out" ||
  fail "defaults not marked as assumed: $out"
expect_summary
