#!/usr/bin/env bash
# pretrained_centers through the daemons (server/main.c start-up; the loader's own cases, arcface_torch's
# checkpoint_gpu_<rank>.pt sets included, are tests/server/test_centers_load.py's):
#   - a safetensors file with a 10 x 16 `weight` and `momentum` (written here by hand: JSON header + bytes)
#     loaded by 3 servers and by 1: every server logs the load; one step at lr 1e-30 (an update far below half
#     an ulp of every weight, so no weight moves) and the worker's --dump-centers holds every class with
#     exactly the file's row;
#   - resume = true from that run's checkpoint: the servers load the checkpoint and log that
#     pretrained_centers is ignored;
#   - a file whose `weight` has 9 rows: server 0 refuses to start, naming the key, the file and the tensor, and
#     the worker's log carries that message (ctl_rendezvous_member_failed); the same when server 1 of 2 fails
#     (a NaN in class 1, a row only it reads; ctl_session_fail).
source "$(dirname "$0")/cluster.sh" "$@"
export OMP_NUM_THREADS=1

python3 - "$TMP" <<'PY' || die "cannot write the safetensors files"
import array, json, random, sys
tmp = sys.argv[1]
rnd = random.Random(3)
W = array.array("f", [rnd.gauss(0, 1) for _ in range(10 * 16)])
M = array.array("f", [rnd.gauss(0, 1) for _ in range(10 * 16)])
def write(path, tensors):
    header, data, off = {}, b"", 0
    for name, (a, rows) in tensors.items():
        b = a.tobytes()[:rows * 16 * 4]
        header[name] = {"dtype": "F32", "shape": [rows, 16], "data_offsets": [off, off + len(b)]}
        data += b
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(len(h).to_bytes(8, "little") + h + data)
write(tmp + "/centers.safetensors", {"weight": (W, 10), "momentum": (M, 10)})
write(tmp + "/short.safetensors", {"weight": (W, 9)})
N = array.array("f", W)
N[1 * 16] = float("nan")  # class 1: server 1's row when there are 2 servers
write(tmp + "/nan1.safetensors", {"weight": (N, 10)})
open(tmp + "/weight.f32", "wb").write(W.tobytes())
PY

# write NAME S [LINE...]: $TMP/NAME.ini, 10 synthetic classes, D = 16, output $TMP/NAME.
write() {
  local name=$1 s=$2; shift 2
  run_ini "$TMP/$name.ini" "$s" 1 centers-secret "$@" <<INI
[train]
$TINY_NET
lr = 1e-30
output = $TMP/$name
pretrained_centers = $TMP/centers.safetensors
[data]
$TINY_DATA
num_workers = 1
[server]
snapshot_every = 1
INI
}

# same_table DUMP: the worker's dump (records of u64 class id + 16 float32) holds every class once, each
# equal to the file's row bit for bit.
same_table() {
  python3 - "$1" "$TMP/weight.f32" <<'PY'
import struct, sys
d = open(sys.argv[1], "rb").read()
W = open(sys.argv[2], "rb").read()
rec = 8 + 16 * 4
if len(d) % rec:
    sys.exit("the dump is %d bytes, not a whole number of records" % len(d))
ids = []
for o in range(0, len(d), rec):
    c = struct.unpack_from("<Q", d, o)[0]
    ids.append(c)
    if c >= 10 or d[o + 8:o + rec] != W[c * 64:(c + 1) * 64]:
        sys.exit("class %d differs from the file's row" % c)
if sorted(ids) != list(range(10)):
    sys.exit("classes in the dump: %s" % sorted(ids))
PY
}

for S in 3 1; do
  write "s$S" "$S"
  run_cluster "S=$S: the worker failed" "$TMP/s$S.ini" "$S" 1 --max-steps 1 --dump-centers "$TMP/s$S/dump"
  for ((r = 0; r < S; r++)); do
    grep -q "pretrained_centers: .*centers.safetensors: rows of shard $r/$S from 'weight', momentum from 'momentum'" \
      "$TMP/server$r.log" || { show_logs; die "S=$S: server $r did not log the load"; }
  done
  same_table "$TMP/s$S/dump.rank0" || die "S=$S: the table differs from pretrained_centers' file"
  echo "ok: S=$S: every server loaded its rows; the table after one step at lr 1e-30 equals the file's"
done

# Resume: the checkpoint wins.
write s3 3 "resume = true"
run_cluster "resume: the worker failed" "$TMP/s3.ini" 3 1 --max-steps 1
for ((r = 0; r < 3; r++)); do
  grep -q "loaded checkpoint step 1" "$TMP/server$r.log" || { show_logs; die "resume: server $r did not load step 1"; }
  grep -q "pretrained_centers = .*centers.safetensors ignored: resuming from checkpoint step 1" "$TMP/server$r.log" ||
    { show_logs; die "resume: server $r did not log that pretrained_centers is ignored"; }
  grep -q "pretrained_centers: .*rows of shard" "$TMP/server$r.log" && die "resume: server $r loaded pretrained_centers"
done
echo "ok: resume = true loads the checkpoint and logs pretrained_centers as ignored"

# A bad file: server 0 refuses to start (the worker then has no run to join).
write bad 1 "pretrained_centers = $TMP/short.safetensors"
"$SERVER" --config "$TMP/bad.ini" --rank 0 >"$TMP/server0.log" 2>&1 &
sp=$!; PIDS+=($sp)
"$WORKER" --config "$TMP/bad.ini" --rank 0 --max-steps 1 >"$TMP/worker0.log" 2>&1 &
wp=$!; PIDS+=($wp)
wait_exit "$sp" 60 || { show_logs; die "bad file: server 0 still runs"; }
s=0; wait "$sp" || s=$?
[ "$s" -ne 0 ] || die "bad file: server 0 exited 0"
grep -q "config key 'pretrained_centers' = .*short.safetensors: .*short.safetensors: tensor 'weight' has shape \[9, 16\], not \[10, 16\]" \
  "$TMP/server0.log" || { show_logs; die "bad file: no message naming the key, the file and the tensor"; }
wait_exit "$wp" 60 || kill -KILL "$wp" 2>/dev/null
echo "ok: a weight of 9 rows: server 0 refuses to start ($(grep -o "tensor 'weight'.*" "$TMP/server0.log" | head -1))"
grep -q "server\[0\] (.*) failed: config key 'pretrained_centers' = .*short.safetensors: .*tensor 'weight' has shape \[9, 16\]" \
  "$TMP/worker0.log" || { show_logs; die "bad file: the worker's log does not carry server 0's message"; }
echo "ok: the worker says why: $(grep -o "server\[0\] (.*) failed: .*" "$TMP/worker0.log" | head -1 | cut -c1-200)"

# With 2 servers, server 1 the one that fails (a NaN in class 1, a row only server 1 reads): the worker names
# server 1 and its message.
write bad2 2 "pretrained_centers = $TMP/nan1.safetensors"
"$SERVER" --config "$TMP/bad2.ini" --rank 0 >"$TMP/server0.log" 2>&1 &
sp0=$!; PIDS+=($sp0)
"$SERVER" --config "$TMP/bad2.ini" --rank 1 >"$TMP/server1.log" 2>&1 &
sp1=$!; PIDS+=($sp1)
"$WORKER" --config "$TMP/bad2.ini" --rank 0 --max-steps 1 >"$TMP/worker0.log" 2>&1 &
wp=$!; PIDS+=($wp)
wait_exit "$wp" 60 || { show_logs; die "server 1's bad file: the worker still runs"; }
grep -q "server\[1\] (.*) failed: config key 'pretrained_centers' = .*nan1.safetensors: .*(class 1) element 0 is NaN" \
  "$TMP/worker0.log" || { show_logs; die "server 1's NaN row: the worker's log does not carry server 1's message"; }
echo "ok: server 1's NaN row: the worker says why: $(grep -o "server\[1\] (.*) failed: .*" "$TMP/worker0.log" | head -1 | cut -c1-200)"
kill -KILL "$sp0" "$sp1" 2>/dev/null
echo PASS
