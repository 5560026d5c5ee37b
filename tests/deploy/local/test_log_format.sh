#!/usr/bin/env bash
# log_format = arcface_torch: rank 0's training.log in arcface_torch's own line format, read by a parser written
# here from arcface_torch's format strings (utils_logging.init_logging: logging.Formatter("Training:
# %(asctime)s-%(message)s"), asctime = time.strftime("%Y-%m-%d %H:%M:%S", localtime) + ",%03d" milliseconds;
# utils_callbacks.CallBackLogging: "Speed %.2f samples/sec   Loss %.4f   LearningRate %.6f   Epoch: %d   Global
# Step: %d   Required: %1.f hours"). A 1 + 1 run of 8 steps (frequent 2) under TZ=Asia/Kolkata (UTC+5:30, so local
# time is not UTC): every line of the file parses as arcface_torch's; its times are local (within 10 minutes
# of the test's local clock); the Speed lines are at steps 2, 4, 6, 8 with the lr of the
# --trace file at those steps (printed with 6 decimals); under this TZ a UTC time would be 5:30 h off. The
# default (log_format = pfcps) keeps pfcps's prefix (ISO UTC time, pid, role, level) in the file, and stderr
# keeps it under both.
# Arguments: SERVER WORKER PFCPS SRC BUILD
source "$(dirname "$0")/cluster.sh" "$@"
export TZ=Asia/Kolkata

run() { # run NAME [LINE...]
  local name=$1; shift
  run_ini "$TMP/$name.ini" 1 1 "log-format-test-secret-0123456" <<INI
[train]
$ONE_STEP_NET
num_epoch = 2
[data]
rec = synthetic
num_classes = 4
num_image = 8
num_workers = 1
frequent = 2
output = $TMP/$name.out
$(printf '%s\n' "$@")
INI
  run_cluster "$name: the run failed" "$TMP/$name.ini" 1 1 --trace "$TMP/$name.trace"
}
run arc "log_format = arcface_torch"
cp "$TMP/worker0.log" "$TMP/arc.stderr"
run plain

python3 - "$TMP/arc.out/training.log" "$TMP/arc.trace" <<'PY' || fail "arcface_torch's format (above)"
import datetime
import re
import sys
import time

LINE = re.compile(r"^Training: (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})-(.*)$")
SPEED = re.compile(r"^Speed (\d+\.\d\d) samples/sec   Loss (\d+\.\d{4})   LearningRate (\d+\.\d{6})   "
                   r"Epoch: (\d+)   Global Step: (\d+)   Required: (\d+) hours$")
lines = open(sys.argv[1]).read().splitlines()
trace = {int(r.split()[0]): float(r.split()[2]) for r in open(sys.argv[2])}
bad = [l for l in lines if not LINE.match(l)]
if bad:
    sys.exit("lines not in arcface_torch's format: %r" % bad[:3])
now = time.time()
steps = []
for l in lines:
    ts, msg = LINE.match(l).groups()
    t = time.mktime(time.strptime(ts[:19], "%Y-%m-%d %H:%M:%S"))  # local time, as asctime
    if abs(t - now) > 600:
        sys.exit("time %s is not local time (now %s)" % (ts, time.strftime("%Y-%m-%d %H:%M:%S")))
    m = SPEED.match(msg)
    if m:
        step = int(m.group(5))
        steps.append(step)
        if m.group(3) != "%.6f" % trace[step]:
            sys.exit("step %d: LearningRate %s, trace lr %r" % (step, m.group(3), trace[step]))
if steps != [2, 4, 6, 8]:
    sys.exit("Speed lines at steps %r, want [2, 4, 6, 8]" % steps)
utc = datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M")
print("%d lines in arcface_torch's format, Speed lines at steps %r; first: %s (UTC now %s)" % (
    len(lines), steps, lines[0], utc))
PY
ok "log_format = arcface_torch: training.log parses as arcface_torch's"
expect_grep "log_format = pfcps (default) keeps pfcps's prefix" \
  '^[0-9-]{10}T[0-9:.]{12}Z pid=[0-9]+ worker\[0\] INFO Speed .*Global Step: 8 ' "$TMP/plain.out/training.log"
expect_grep "stderr keeps pfcps's prefix under arcface_torch" \
  '^[0-9-]{10}T[0-9:.]{12}Z pid=[0-9]+ worker\[0\] INFO Speed ' "$TMP/arc.stderr"
expect_summary
