#!/bin/sh
# Backbone benchmark: pfcps's CPU backbone (bench_backbone) against two PyTorch peers measured in the
# same run, with the same threads, batches and networks (iresnet_torch.py, same parameter count):
#   - Debian's torch (python3-torch, the system python3; installed by tests/pyenv.sh or apt-get),
#   - PyPI's torch (`pip install torch` into bench/.venv, gitignored; never used by the tests).
# Per network and batch each prints one line: warm-up steps (first step apart) and the steady state
# (timed steps, median step, samples/s of forward (training mode) + backward). The summary gives
# pfcps / the FASTER torch (and pfcps / each), and the load average before and after.
#
# Usage (from the repository root): bench/backbone/run.sh [build-dir] [threads]
#   build-dir  holds bench/backbone/bench_backbone (default build; `meson compile -C build
#              bench/backbone/bench_backbone`); threads default nproc.
# Environment:
#   PFCPS_BENCH_NETS="r18 r50"  PFCPS_BENCH_BATCHES="8 32"  PFCPS_BENCH_ITERS=5 (timed steps)
#   PFCPS_BENCH_WARMUP=2 (untimed-for-the-ratio steps, reported apart)
#   PFCPS_BENCH_SETUP_ONLY=1    start PyPI torch's install in the background and exit (do this ahead:
#                               it downloads ~3 GB of CUDA wheels; a measuring run waits for it)
#   PFCPS_BENCH_PIP_TIMEOUT=1200  seconds an install may take before PyPI's torch is reported unavailable
#   PFCPS_BENCH_MAX_LOAD        1-minute load average above which the run is not quiet (default 0.5 x cores)
#   PFCPS_BENCH_QUIET_WAIT=180  seconds to wait for the load to fall under that before refusing
#   PFCPS_BENCH_FORCE=1         measure anyway on a loaded machine (every line then says NOT QUIET)
#   PFCPS_BENCH_DEBIAN_PYTHON=/usr/bin/python3   the interpreter with Debian's torch
#   PFCPS_BENCH_VENV=bench/.venv                the venv for PyPI's torch
# Exit status: 0 measured, 1 usage/build error, 3 refused (machine not quiet).
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build}
CORES=$(nproc)
THREADS=${2:-$CORES}
NETS=${PFCPS_BENCH_NETS:-r18 r50}
BATCHES=${PFCPS_BENCH_BATCHES:-8 32}
ITERS=${PFCPS_BENCH_ITERS:-5}
WARMUP=${PFCPS_BENCH_WARMUP:-2}
PIP_TIMEOUT=${PFCPS_BENCH_PIP_TIMEOUT:-1200}
MAX_LOAD=${PFCPS_BENCH_MAX_LOAD:-$(awk -v c="$CORES" 'BEGIN { print 0.5 * c }')}
QUIET_WAIT=${PFCPS_BENCH_QUIET_WAIT:-180}
FORCE=${PFCPS_BENCH_FORCE:-0}
DEBPY=${PFCPS_BENCH_DEBIAN_PYTHON:-/usr/bin/python3}
VENV=${PFCPS_BENCH_VENV:-$ROOT/bench/.venv}
LOG=$VENV/pfcps-install.log
PIDF=$VENV/pfcps-install.pid
PYFILE=$ROOT/bench/backbone/iresnet_torch.py

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
load1() { cut -d' ' -f1 /proc/loadavg; }
above() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a > b) }'; }
pypi_ready() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import torch' >/dev/null 2>&1; }
install_pid() { [ -f "$PIDF" ] && cut -d' ' -f1 "$PIDF"; }
# The install runs as its own session leader: a pid reused by another process is not taken for it.
install_running() {
    p=$(install_pid) && [ -n "$p" ] && [ "$(ps -o sid= -p "$p" 2>/dev/null | tr -d ' ')" = "$p" ]
}

# Starts `pip install torch` into bench/.venv (a venv of Debian's python3 without its system
# packages, so Debian's torch stays out of it) in its own session, logging to $LOG; records
# "pid start-time" in $PIDF.
start_install() {
    mkdir -p "$VENV"
    echo "pfcps: install started $(date -u '+%F %T') UTC" >"$LOG"
    # shellcheck disable=SC2016 # expanded by the inner sh, from its arguments
    setsid sh -c '[ -x "$1/bin/python" ] || "$2" -m venv "$1" || exit 1
        "$1/bin/pip" install --progress-bar off torch || exit 1
        echo "pfcps: install finished $(date -u "+%F %T") UTC"' sh "$VENV" "$DEBPY" >>"$LOG" 2>&1 </dev/null &
    echo "$! $(date +%s)" >"$PIDF"
}

if [ "${PFCPS_BENCH_SETUP_ONLY:-0}" != 0 ]; then
    if pypi_ready; then
        echo "PyPI torch ready in $VENV: $("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
    elif install_running; then
        echo "PyPI torch install already running (pid $(install_pid)); log $LOG"
    else
        start_install
        echo "PyPI torch install started in the background (pid $(install_pid)); log $LOG"
    fi
    exit 0
fi

BIN=$BUILD/bench/backbone/bench_backbone
if [ ! -x "$BIN" ]; then
    echo "run.sh: $BIN not found; build it: meson compile -C $BUILD bench/backbone/bench_backbone" >&2
    exit 1
fi
LOAD_START=$(loadavg)
echo "backbone bench $(date -u '+%F %T') UTC, commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')," \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $CORES cores, threads $THREADS"
echo "networks $NETS, batches $BATCHES, $WARMUP warm-up + $ITERS timed steps each"
echo "load average at start (1/5/15 min): $LOAD_START"

# PyPI's torch: start its install first (before any timing) if it is missing, then wait for it, so
# that no install runs while the peers are timed.
PYPI_WHY=
if ! pypi_ready; then
    install_running || start_install
    echo "waiting for PyPI torch's install (pid $(install_pid), log $LOG, limit ${PIP_TIMEOUT} s from its start)"
    t_start=$(cut -d' ' -f2 "$PIDF")
    while install_running && [ $(($(date +%s) - t_start)) -lt "$PIP_TIMEOUT" ]; do
        sleep 5
    done
    if install_running; then
        p=$(install_pid)
        kill -TERM "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null || true
        PYPI_WHY="pip install torch still running after ${PIP_TIMEOUT} s (stopped; see $LOG)"
    elif ! pypi_ready; then
        PYPI_WHY="pip install torch failed: $(grep -v '^ *$' "$LOG" | tail -1) (see $LOG)"
    fi
fi
DEB_WHY=
if ! "$DEBPY" -c 'import torch' >/dev/null 2>&1; then
    DEB_WHY="no torch in $DEBPY (apt-get install python3-torch, or tests/pyenv.sh as root)"
fi

# A quiet machine: the 1-minute load average under MAX_LOAD (waits up to QUIET_WAIT s for it).
waited=0
while above "$(load1)" "$MAX_LOAD" && [ "$waited" -lt "$QUIET_WAIT" ]; do
    sleep 10
    waited=$((waited + 10))
done
QUIET=yes
if above "$(load1)" "$MAX_LOAD"; then
    if [ "$FORCE" = 0 ]; then
        echo "run.sh: REFUSED: 1-minute load average $(load1) > $MAX_LOAD (0.5 x $CORES cores) after" \
            "waiting ${QUIET_WAIT} s; the machine is not quiet. PFCPS_BENCH_FORCE=1 measures anyway." >&2
        exit 3
    fi
    QUIET=no
    echo "################################################################################"
    echo "# WARNING: NOT QUIET: 1-minute load average $(load1) > $MAX_LOAD (0.5 x $CORES cores)."
    echo "# PFCPS_BENCH_FORCE=1: measuring anyway; these figures are not fit for RESULTS.md."
    echo "################################################################################"
fi
LOAD_BEFORE=$(loadavg)
echo "load average before timing: $LOAD_BEFORE"

export OMP_NUM_THREADS="$THREADS" OPENBLAS_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS"
RES=$(mktemp)
trap 'rm -f "$RES"' EXIT
# measure PEER NET BATCH CMD...: runs CMD, prints its line, appends "net batch peer samples/s
# first-warm-up-step-s median-step-s version params" to $RES.
measure() {
    peer=$1 net=$2 b=$3
    shift 3
    tag=""
    [ "$QUIET" = yes ] || tag=" NOT QUIET"
    if out=$("$@" 2>&1 | tail -1) && echo "$out" | grep -q 'samples/s'; then
        echo "  [$peer, load $(load1)$tag] $out"
        echo "$out" | awk -v n="$net" -v b="$b" -v p="$peer" '{
            for (i = 1; i <= NF; i++) {
                if ($i == "samples/s") s = $(i + 1); if ($i == "first") f = $(i + 1)
                if ($i == "median") m = $(i + 1); if ($i == "params") q = $(i + 1)
            }
            v = ($1 == "torch") ? $2 : "-"; sub(":", "", q)
            print n, b, p, s, f, m, v, q }' >>"$RES"
    else
        echo "  [$peer] FAILED: $out"
    fi
}
PYPI_VERSION=- DEB_VERSION=-
for net in $NETS; do
    for b in $BATCHES; do
        echo "$net batch $b:"
        measure pfcps "$net" "$b" "$BIN" "$net" "$b" "$ITERS" "$WARMUP"
        [ -n "$DEB_WHY" ] || measure debian "$net" "$b" "$DEBPY" "$PYFILE" "$net" "$b" "$ITERS" "$THREADS" "$WARMUP"
        [ -n "$PYPI_WHY" ] || measure pypi "$net" "$b" "$VENV/bin/python" "$PYFILE" "$net" "$b" "$ITERS" "$THREADS" "$WARMUP"
    done
done
LOAD_AFTER=$(loadavg)
DEB_VERSION=$(awk '$3 == "debian" { print $7; exit }' "$RES")
PYPI_VERSION=$(awk '$3 == "pypi" { print $7; exit }' "$RES")

echo
echo "Summary ($THREADS threads; steady samples/s over $ITERS timed steps; warm-up = first step's seconds):"
[ -z "$DEB_WHY" ] || echo "Debian's torch: UNAVAILABLE: $DEB_WHY"
[ -z "$PYPI_WHY" ] || echo "PyPI's torch: UNAVAILABLE: $PYPI_WHY"
echo
echo "| network | batch | pfcps samples/s | Debian torch ${DEB_VERSION:--} samples/s | PyPI torch ${PYPI_VERSION:--} samples/s | faster torch | pfcps / faster torch | pfcps / Debian | pfcps / PyPI | warm-up first step s (pfcps / Debian / PyPI) |"
echo "|---|---|---|---|---|---|---|---|---|---|"
awk '{ k = $1 " " $2; if (!(k in seen)) { seen[k] = 1; order[++n] = k }
       s[k, $3] = $4; f[k, $3] = $5; q[k, $3] = $8 }
     function r(a, b) { return (a != "" && b != "" && b > 0) ? sprintf("%.2f", a / b) : "n/a" }
     function v(x) { return x != "" ? x : "n/a" }
     END {
       for (i = 1; i <= n; i++) {
         k = order[i]; split(k, nb, " ")
         p = s[k, "pfcps"]; d = s[k, "debian"]; y = s[k, "pypi"]
         best = ""; who = "none"
         if (d != "") { best = d; who = "Debian" }
         if (y != "" && (best == "" || y + 0 > best + 0)) { best = y; who = "PyPI" }
         printf "| %s | %s | %s | %s | %s | %s | **%s** | %s | %s | %s / %s / %s |\n", nb[1], nb[2], v(p), v(d), v(y),
                who, r(p, best), r(p, d), r(p, y), v(f[k, "pfcps"]), v(f[k, "debian"]), v(f[k, "pypi"])
         if ((d != "" && q[k, "debian"] != q[k, "pfcps"]) || (y != "" && q[k, "pypi"] != q[k, "pfcps"]))
           printf "WARNING: %s batch %s: parameter counts differ (pfcps %s, Debian %s, PyPI %s)\n", nb[1], nb[2],
                  q[k, "pfcps"], v(q[k, "debian"]), v(q[k, "pypi"])
       }
     }' "$RES"
echo
echo "load average (1/5/15 min): start $LOAD_START, before timing $LOAD_BEFORE, after $LOAD_AFTER"
echo "(the benchmark itself adds about $THREADS to the load while it runs)"
if above "$(echo "$LOAD_AFTER" | cut -d' ' -f1)" "$(awk -v a="$MAX_LOAD" -v t="$THREADS" 'BEGIN { print a + t }')"; then
    echo "WARNING: 1-minute load average after the run ($(echo "$LOAD_AFTER" | cut -d' ' -f1)) > $MAX_LOAD + $THREADS threads: something else ran; re-run in a quiet window."
fi
[ "$QUIET" = yes ] || echo "WARNING: NOT QUIET at start (PFCPS_BENCH_FORCE=1): do not report these figures."
