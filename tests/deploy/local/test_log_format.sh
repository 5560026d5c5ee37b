#!/usr/bin/env bash
# log_format = arcface_torch: rank 0's training.log in arcface_torch's own line format, read by a parser written
# here from arcface_torch's format strings (utils_logging.init_logging: logging.Formatter("Training:
# %(asctime)s-%(message)s"), asctime = time.strftime("%Y-%m-%d %H:%M:%S", localtime) + ",%03d" milliseconds;
# utils_callbacks.CallBackLogging: "Speed %.2f samples/sec   Loss %.4f   LearningRate %.6f   Epoch: %d   Global
# Step: %d   Required: %1.f hours"). A 1 + 1 run of 8 steps (frequent 2) under TZ=Asia/Kolkata (UTC+5:30, so local
# time is not UTC): every line of the file parses as arcface_torch's; its times are local (within 10 minutes
# of the test's local clock); the Speed lines are CallBackLogging's: at steps 4, 6, 8 (step 2 only starts its
# clock), each with the lr of the next step in the --trace file (6 decimals; 0 after the last step) and the
# mean loss since the previous line (steps 1..4 for the first); under this TZ a UTC time would be 5:30 h off. The
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
synthetic = varied
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
                   r"Epoch: (\d+)   Global Step: (\d+)   Required: (-?\d+) hours$")  # -0 at the last step, as
# CallBackLogging's own (total_step - global_step - 1) makes it
lines = open(sys.argv[1]).read().splitlines()
trace = {int(r.split()[0]): float(r.split()[2]) for r in open(sys.argv[2])}
losses = {int(r.split()[0]): float(r.split()[1]) for r in open(sys.argv[2])}
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
        # CallBackLogging logs get_last_lr() after the scheduler's step: the lr of step + 1 (the trace's next
        # line; after the last step the schedule has decayed to 0), and the mean loss since its last line (the
        # first line: since step 1, the clock having started at step `frequent` without a line).
        want_lr = trace[step + 1] if step + 1 in trace else 0.0
        if m.group(3) != "%.6f" % want_lr:
            sys.exit("step %d: LearningRate %s, want the next step's lr %r" % (step, m.group(3), want_lr))
        first = steps[-1] + 1 if steps else 1
        mean = sum(losses[g] for g in range(first, step + 1)) / (step + 1 - first)
        if m.group(2) != "%.4f" % mean:
            sys.exit("step %d: Loss %s, want the mean of steps %d..%d %.4f" % (step, m.group(2), first, step, mean))
        steps.append(step)
if steps != [4, 6, 8]:
    sys.exit("Speed lines at steps %r, want [4, 6, 8] (CallBackLogging: step 2 starts the clock)" % steps)
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
