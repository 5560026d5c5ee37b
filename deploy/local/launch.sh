#!/usr/bin/env bash
# Local launcher: starts S pfcps-server and W pfcps-worker daemons on this machine (127.0.0.1),
# waits for the workers to finish, then stops the servers with SIGTERM (a server that exits first makes it stop
# the workers and fail, naming that server; with replicas = 1 a server that dies once the run formed is only
# reported, and the run goes on with its shards' backups; a dead server 0 is failed over by every member,
# docs/architecture.md).
# Ctrl-C (SIGINT) or SIGTERM is passed on to every daemon; none is left behind.
#
# usage: deploy/local/launch.sh -c CONFIG [-b BUILD_DIR] [--max-restarts N] [--set key=value ...]
#   servers/workers counts come from the config (keys `servers`, `workers`) or --set overrides.
#   --max-restarts N (torchrun's flag, default 0): when any daemon dies (non-zero exit, kill -9), stop the
#   others and start all again with resume = true and resume_run = the id of the run this launch formed (so
#   that only its checkpoints count, not another run's in the same folder), at most N times; each restart is
#   printed with the checkpoint step it resumes from (that run's newest complete one, `pfcps ckpt-info`).
#   Checkpoints need snapshot_every > 0. When no restart is left the launch fails, saying so.
#   With replicas = 1 a server other than 0 that dies is started again alone, with the same command line (a
#   restart counted the same way): it rejoins the running run (docs/architecture.md, "Hot-standby shards").
#   So is server 0 (the rendezvous' host) when it died, or exited 76 (stopped past the silence limit, the
#   members failed it over and it fenced itself): its new rendezvous adopts the running run from the
#   members, which reconnect, and it rejoins; without a restart the run goes on without it to its end.
#   A worker killed by a signal, or one that exits 76 (removed from the run: stopped past the silence limit),
#   is started again alone too when the run replaces workers in place (replicas = 1, device not cuda;
#   docs/architecture.md, "Worker replacement in place"): it joins as its
#   own replacement while the others wait.
#   Logs: <output>/logs/server<r>.log and worker<r>.log (output from the config / --set).
#   These values are asked from the daemons' own config parser (`pfcps config-get`), so quoting, inline
#   comments and sections mean here exactly what they mean to the daemons.
#   At exit, when a member logged a checkpoint write that failed (disk full, ...), a warning on stderr says
#   how many of the checkpoint steps failed, on which members, and the newest step every member wrote
#   (from the logs; `pfcps ckpt-info` verifies it). The exit status stays the run's: a failed checkpoint does
#   not fail training (earlier checkpoints stay intact), so a supervisor does not restart a finished run.
#   metrics_address = HOST:PORT (PORT not 0) goes to server 0 only; every other member gets HOST:0 (a free port:
#   they share this machine), and server 0's http://HOST:PORT/targets lists them all (deploy/monitoring).
set -uo pipefail

build=build
config=
max_restarts=0
sets=()
while [ $# -gt 0 ]; do
  case "$1" in
    -c|--config) config=$2; shift 2 ;;
    -b|--build) build=$2; shift 2 ;;
    --max-restarts) max_restarts=$2; shift 2 ;;
    --max-restarts=*) max_restarts=${1#--max-restarts=}; shift ;;
    --set|-s) sets+=("--set" "$2"); shift 2 ;;
    --set=*) sets+=("--set" "${1#--set=}"); shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "launch: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ -n "$config" ] || { echo "launch: -c CONFIG is required" >&2; exit 2; }
[ -f "$config" ] || { echo "launch: config '$config' not found" >&2; exit 2; }
[[ "$max_restarts" =~ ^[0-9]+$ ]] || { echo "launch: --max-restarts '$max_restarts' is not a non-negative integer" >&2; exit 2; }

server_bin=$build/server/pfcps-server
worker_bin=$build/worker/pfcps-worker
tool_bin=$build/tools/pfcps
for b in "$server_bin" "$worker_bin" "$tool_bin"; do
  [ -x "$b" ] || { echo "launch: $b not built (meson compile -C $build)" >&2; exit 2; }
done

# Effective values of the keys the launcher itself needs, from the real parser (file, then every --set in
# order, defaults for keys not given): one line per key. A config the daemons would refuse stops here.
if ! vals=$("$tool_bin" config-get --config "$config" "${sets[@]}" servers workers output snapshot_dir snapshot_every metrics_address replicas device secret); then
  echo "launch: config '$config' refused (see above)" >&2
  exit 2
fi
mapfile -t v <<<"$vals"
S=${v[0]}; W=${v[1]}; out=${v[2]}; snapdir=${v[3]:-$out/snapshots}; snap_every=${v[4]}; maddr=${v[5]:-}
replicas=${v[6]:-0}
# Every daemon refuses to start without a join secret: say so once, here, rather than after a failed start (and
# every restart --max-restarts allows).
if [ "${v[8]}" != set ]; then
  echo "launch: no join secret: set 'secret' in $config, pass --set secret=..., or export PFCPS_SECRET (every daemon refuses to start without one)" >&2
  exit 2
fi
# A lost worker is replaced in place (common/config.h cfg_replaces_workers): replicas = 1, a device other than
# cuda.
replace_workers=0
[ "$replicas" -ge 1 ] && [ "${v[7]}" != cuda ] && replace_workers=1
[ -n "$snapdir" ] || snapdir=$out/snapshots
if [ "$max_restarts" -gt 0 ] && [ "$snap_every" = 0 ]; then
  echo "launch: --max-restarts $max_restarts with snapshot_every = 0: a restart starts over from step 0" >&2
fi
# metrics_address with a fixed port is server 0's; the others (msets) take the same host and a free port.
msets=()
if [ -n "$maddr" ] && [ "${maddr##*:}" != 0 ]; then
  mhost=
  case $maddr in *:*) mhost=${maddr%:*} ;; esac
  msets=(--set "metrics_address=$mhost:0")
  echo "launch: server 0 serves metrics on $maddr (/metrics; /targets lists every member's endpoint)" >&2
fi
mkdir -p "$out/logs" || { echo "launch: cannot create '$out/logs'" >&2; exit 2; }
# A log path that is not a regular file (a FIFO would block the daemon's start until something reads it).
for ((r = 0; r < S + W; r++)); do
  if ((r < S)); then f=$out/logs/server$r.log; else f=$out/logs/worker$((r - S)).log; fi
  if [ -e "$f" ] && [ ! -f "$f" ]; then
    echo "launch: log '$f' is $(stat -c %F "$f"), not a regular file: remove it" >&2
    exit 2
  fi
done

pids=()
server_pids=()
worker_pids=()
# exited PID: true once PID has exited (a child not yet waited for is a zombie, which kill -0 still finds).
exited() { local _p _c st; { read -r _p _c st _ <"/proc/$1/stat"; } 2>/dev/null || return 0; [ "$st" = Z ]; }
# wait_gone SECONDS PIDS...: waits until none of PIDS is alive, at most SECONDS.
wait_gone() {
  local n=$(( $1 * 10 )); shift
  for ((i = 0; i < n; i++)); do
    local alive=0
    for p in "$@"; do exited "$p" || alive=1; done
    [ "$alive" -eq 0 ] && return 0
    sleep 0.1
  done
  return 1
}
# term PID...: asks each daemon to stop (SIGTERM), then continues it (SIGCONT), as systemd does: a stopped
# daemon (SIGSTOP, a debugger) can only act on the SIGTERM once it runs again.
term() {
  local p
  for p in "$@"; do kill -TERM "$p" 2>/dev/null && kill -CONT "$p" 2>/dev/null; done
}
on_signal() {
  echo "launch: signal received, stopping ${#worker_pids[@]} workers, then ${#server_pids[@]} servers" >&2
  # Workers first: they agree to stop after the step in progress and exit 0. Then the servers they
  # were talking to. Whatever is still alive 5 s later is killed.
  term "${worker_pids[@]}"
  wait_gone 5 "${worker_pids[@]}"
  term "${server_pids[@]}"
  wait_gone 5 "${server_pids[@]}"
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  wait 2>/dev/null
  exit 130
}
trap on_signal INT TERM

# lost_after_end I: server 0's log, since this run_once began, says worker I was lost after the end vote. The
# run_formed: whether server 0's rendezvous formed the run since this run_once began (it logs the run id when
# it does).
run_formed() {
  tail -c +$((s0_log_at + 1)) "$out/logs/server0.log" 2>/dev/null | grep -aq "; run id [0-9a-f]\{32\}"
}

# rendezvous logs its verdict on a loss as it sees it: waited for, up to 1 s, until it names worker I lost after
# the end (0) or lost otherwise (1: a replacement begins, or the run re-forms).
lost_after_end() {
  local k v
  for ((k = 0; k < 10; k++)); do
    v=$(tail -c +$((s0_log_at + 1)) "$out/logs/server0.log" 2>/dev/null |
      grep -o -m1 -E "control plane: worker\[$1\] \([^)]*\) (was lost after the end of training|lost:|disconnected|failed|stopped for)")
    case "$v" in
      *"was lost after the end of training") return 0 ;;
      ?*) return 1 ;;
    esac
    sleep 0.1
  done
  return 1
}

# blame WHO S: the failure's cause. A daemon that exited 75 was told by the rendezvous to re-form after a loss;
# one that failed otherwise (killed by a signal other than this launcher's SIGTERM, a crash, an error exit) is
# the loss itself, so it takes the name from a 75 seen first (the first such one keeps it). A 75 after members
# this launcher started again alone (lost_alone) names those losses: the run re-forms because of them. Sets rc
# (the launch's status: the first failure's) and culprit.
blame() {
  if [ "$rc" -eq 0 ]; then
    rc=$2; culprit="$1 (status $2)"
    [ "$2" -eq 75 ] && [ -n "$lost_alone" ] && culprit="$1 (status 75: the run re-forms after the loss of $lost_alone)"
  elif [ "$rc" -eq 75 ] && [ "$2" -ne 0 ] && [ "$2" -ne 75 ] && [ "$2" -ne 143 ] && [ -z "$blamed" ]; then
    culprit="$1 (status $2; the others exited 75 to re-form)"; blamed=1
  fi
}

# run_once [MODE]: starts every daemon (MODE ">>": logs appended, after a restart), waits for the workers,
# then stops the servers. A daemon that exits non-zero first (a start-up refusal, a crash, kill -9) stops the
# others: the run cannot go on without it. Sets rc (0, or the first failure's status) and `culprit`.
run_once() {
  local mode=${1:-">"}
  pids=(); server_pids=(); worker_pids=(); culprit=; blamed=; lost_alone=
  s0_log_at=0 # server 0's log size before this run_once (a restart appends to it)
  [ "$mode" = ">>" ] && s0_log_at=$(stat -c %s "$out/logs/server0.log" 2>/dev/null || echo 0)
  for ((r = 0; r < S; r++)); do
    local ms=()
    [ "$r" -eq 0 ] || ms=("${msets[@]}")
    if [ "$mode" = ">>" ]; then
      "$server_bin" --config "$config" --rank "$r" "${sets[@]}" "${extra[@]}" "${ms[@]}" >>"$out/logs/server$r.log" 2>&1 &
    else
      "$server_bin" --config "$config" --rank "$r" "${sets[@]}" "${extra[@]}" "${ms[@]}" >"$out/logs/server$r.log" 2>&1 &
    fi
    pids+=($!); server_pids+=($!)
  done
  for ((r = 0; r < W; r++)); do
    # Every daemon's own pid is what we signal (never a pipe's): output goes to its log file.
    if [ "$mode" = ">>" ]; then
      "$worker_bin" --config "$config" --rank "$r" "${sets[@]}" "${extra[@]}" "${msets[@]}" >>"$out/logs/worker$r.log" 2>&1 &
    else
      "$worker_bin" --config "$config" --rank "$r" "${sets[@]}" "${extra[@]}" "${msets[@]}" >"$out/logs/worker$r.log" 2>&1 &
    fi
    pids+=($!); worker_pids+=($!)
  done
  # Show worker 0's log here while it runs (tail ends by itself within 0.1 s of worker 0's exit).
  local from=+1
  [ "$mode" = ">>" ] && from=0
  tail -s 0.1 -n "$from" -F --pid="${worker_pids[0]}" "$out/logs/worker0.log" 2>/dev/null &
  tail_pid=$!

  rc=0
  local codes=() scodes=() restarted=() srestarted=() i p s how
  while :; do
    local alive=0 failed=-1
    for i in "${!worker_pids[@]}"; do
      p=${worker_pids[$i]}
      if exited "$p"; then
        if [ -z "${codes[$i]:-}" ]; then s=0; wait "$p" || s=$?; codes[$i]=$s
          # A restarted worker this launcher stopped once the run had ended (below): a SIGTERM that came before
          # its handler was set ends it with 143; either way it had nothing to do.
          if [ "${restarted[$i]:-0}" = 2 ] && { [ "$s" -eq 0 ] || [ "$s" -eq 143 ]; }; then codes[$i]=0; continue; fi
          # A worker killed after the end vote (every final output written): the rendezvous ends the run without
          # it, and it has nothing to do if started again.
          if [ "$s" -gt 128 ] && [ "$replace_workers" -eq 1 ] && lost_after_end "$i"; then
            echo "launch: worker $i exited with status $s after the end of training (every worker had passed the end vote; see $out/logs/server0.log): the run ends without it" >&2
            codes[$i]=0; continue
          fi
          # A worker killed (a signal) in a run that replaces workers in place, or removed from it (76: stopped
          # past the silence limit, the run went on without it): started again alone, with the same command
          # line, it joins as its own replacement and the others redo the step it was lost in.
          if { [ "$s" -gt 128 ] || [ "$s" -eq 76 ]; } && [ "$replace_workers" -eq 1 ] && [ "$restarts" -lt "$max_restarts" ]; then
            restarts=$((restarts + 1))
            # Its log says whether the run had formed with it ("joined:", logged when the join is answered with
            # the address book); before that, the restarted worker just takes the rank its loss freed.
            how="it replaces itself in place"
            grep -q " INFO joined: " "$out/logs/worker$i.log" 2>/dev/null ||
              how="it joins the run, which had not formed with it yet"
            echo "launch: worker $i exited with status $s (see $out/logs/worker$i.log); restart $restarts/$max_restarts of worker $i alone, with the same command line: $how" >&2
            lost_alone="${lost_alone:+$lost_alone, }worker $i (status $s)"
            "$worker_bin" --config "$config" --rank "$i" "${sets[@]}" "${extra[@]}" "${msets[@]}" >>"$out/logs/worker$i.log" 2>&1 &
            worker_pids[$i]=$!; pids+=($!); restarted[$i]=1
            if [ "$i" -eq 0 ]; then # follow the new worker 0's lines in its log (the old tail ends with its pid)
              tail -s 0.1 -n 0 -F --pid="${worker_pids[0]}" "$out/logs/worker0.log" 2>/dev/null &
              tail_pid=$!
            fi
            unset "codes[$i]"
            alive=1
            continue
          fi
          if [ "$s" -ne 0 ]; then
            [ "$failed" -lt 0 ] && failed=$i
            blame "worker $i" "$s"
          fi
        fi
      else
        alive=1
      fi
    done
    if [ "$alive" -eq 0 ]; then
      [ "$failed" -ge 0 ] && echo "launch: worker $failed exited with status $rc (see $out/logs/worker$failed.log)" >&2
      break
    fi
    if [ "$failed" -lt 0 ]; then
      for i in "${!server_pids[@]}"; do
        [ -n "${scodes[$i]:-}" ] && continue
        if exited "${server_pids[$i]}"; then
          s=0; wait "${server_pids[$i]}" || s=$?
          scodes[$i]=$s
          # 0: the run ended in order (server 0 shuts it down once every worker left) while a worker exits.
          [ "$s" -eq 0 ] && continue
          # replicas = 1: the run goes on with the backups of a lost server (the rendezvous fails its shards
          # over, or for server 0 each member does; when it cannot, the workers exit and stop the run below).
          # Server 0 counts only when it died (a signal) or was fenced after a stop past the silence limit (76):
          # exiting on its own otherwise, it told the members to re-form.
          if [ "$replicas" -ge 1 ] && { [ "$i" -ne 0 ] || [ "$s" -gt 128 ] || [ "$s" -eq 76 ]; } &&
            [ "$restarts" -lt "$max_restarts" ]; then
            restarts=$((restarts + 1))
            local how="it rejoins the running run"
            [ "$i" -eq 0 ] && how="its rendezvous adopts the running run from its members, then it rejoins"
            echo "launch: server $i exited with status $s (see $out/logs/server$i.log); replicas = $replicas: restart $restarts/$max_restarts of server $i alone, with the same command line: $how" >&2
            lost_alone="${lost_alone:+$lost_alone, }server $i (status $s)"
            # The same command line as run_once's: server 0 keeps metrics_address's fixed port.
            local ms=()
            [ "$i" -eq 0 ] || ms=("${msets[@]}")
            "$server_bin" --config "$config" --rank "$i" "${sets[@]}" "${extra[@]}" "${ms[@]}" >>"$out/logs/server$i.log" 2>&1 &
            server_pids[$i]=$!; pids+=($!); srestarted[$i]=1
            unset "scodes[$i]"
            continue
          fi
          # Before the run formed there is nothing to fail over to: the rendezvous would wait join_timeout for it.
          if [ "$replicas" -ge 1 ] && ! run_formed; then
            blame "server $i" "$s"; failed=$i
            echo "launch: server $i exited with status $s before the run formed (see $out/logs/server$i.log); the run cannot form without it (a server is started again alone only while --max-restarts has restarts left): stopping the others" >&2
            break
          fi
          if [ "$replicas" -ge 1 ] && [ "$i" -ne 0 ]; then
            echo "launch: server $i exited with status $s (see $out/logs/server$i.log); replicas = $replicas: the run goes on with its shards' backups, one server failure away from the checkpoint re-form" >&2
            continue
          fi
          if [ "$replicas" -ge 1 ] && { [ "$s" -gt 128 ] || [ "$s" -eq 76 ]; }; then
            local why="status $s"
            [ "$s" -eq 76 ] && why="status 76: stopped past the silence limit, failed over and fenced"
            echo "launch: server 0 died ($why; see $out/logs/server0.log); replicas = $replicas: the run goes on without its rendezvous, with its shards' backups (when they have no copy left, the workers stop for the re-form), one server failure away from the checkpoint re-form" >&2
            continue
          fi
          blame "server $i" "$s"; failed=$i
          echo "launch: server $i exited with status $s before the workers finished (see $out/logs/server$i.log); stopping the others" >&2
          break
        fi
      done
      # The run ended in order: every server exited 0, or every worker this launcher did not restart exited 0
      # (a worker exits 0 only once training is over). A restarted worker still running found no run to join
      # (lost after the end of training, it was started again as the run shut down, or with server 0): stopped,
      # it exits 0; a restarted server still waiting is stopped with the servers below.
      local ended=1 firsts=0
      for i in "${!server_pids[@]}"; do [ "${scodes[$i]:-x}" = 0 ] || ended=0; done
      if [ "$ended" -eq 0 ]; then
        ended=1
        for i in "${!worker_pids[@]}"; do
          [ "${restarted[$i]:-0}" = 0 ] || continue
          firsts=$((firsts + 1))
          [ "${codes[$i]:-x}" = 0 ] || ended=0
        done
        [ "$firsts" -gt 0 ] || ended=0
      fi
      if [ "$ended" -eq 1 ]; then
        for i in "${!worker_pids[@]}"; do
          if [ "${restarted[$i]:-0}" = 1 ] && [ -z "${codes[$i]:-}" ] && ! exited "${worker_pids[$i]}"; then
            echo "launch: the run ended (every server, or every worker not restarted, exited 0) while the restarted worker $i waits to join: stopping it" >&2
            term "${worker_pids[$i]}"
            restarted[$i]=2
          fi
        done
      fi
    else
      echo "launch: worker $failed exited with status $rc (see $out/logs/worker$failed.log); stopping the others" >&2
    fi
    if [ "$failed" -ge 0 ]; then
      term "${worker_pids[@]}"
      wait_gone 15 "${worker_pids[@]}" || for p in "${worker_pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
      break
    fi
    sleep 0.2
  done
  for i in "${!worker_pids[@]}"; do
    if [ -z "${codes[$i]:-}" ]; then
      s=0; wait "${worker_pids[$i]}" || s=$?
      [ "$s" -ne 0 ] && blame "worker $i" "$s"
    fi
  done
  wait "$tail_pid" 2>/dev/null
  # Workers are done (or one failed): stop the servers cleanly and collect their exit codes.
  term "${server_pids[@]}"
  wait_gone 30 "${server_pids[@]}" || for p in "${server_pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for i in "${!server_pids[@]}"; do
    # a server whose exit was already taken above (the one that failed first, or one replicas made up for)
    [ -n "${scodes[$i]:-}" ] && continue
    s=0
    wait "${server_pids[$i]}" 2>/dev/null || s=$?
    # 127: already waited for above.
    [ "$s" -eq 143 ] && [ "${srestarted[$i]:-0}" = 1 ] && s=0 # a restart stopped above before its handler was set
    if [ "$s" -gt 128 ] && [ "$s" -ne 143 ] && [ "$replicas" -ge 1 ] && [ "$rc" -eq 0 ]; then
      # Killed as the run ended, every worker done: with replicas the run never needed it to end.
      echo "launch: server $i exited with status $s after every worker finished (see $out/logs/server$i.log); replicas = $replicas: the run had ended (its part of the last checkpoint may be missing: pfcps ckpt-info $snapdir)" >&2
      s=0
    fi
    if [ "$s" -ne 0 ] && [ "$s" -ne 127 ] && [ "$rc" -eq 0 ]; then
      echo "launch: server $i exited with status $s when the run ended (see $out/logs/server$i.log)" >&2
      rc=$s; culprit="server $i (status $s, when the run ended)"
    elif [ "$s" -ne 127 ]; then
      blame "server $i" "$s"
    fi
  done
}

# ckpt_report: the checkpoint steps this launcher's daemons logged (servers: "snapshot step T written|failed|
# not started", workers: "checkpoint step T: worker state written|this worker's state not written"); when any
# member's write failed, a warning naming the failed steps with their members and the newest step every
# member wrote.
ckpt_report() {
  local r f logs=()
  for ((r = 0; r < S; r++)); do f=$out/logs/server$r.log; [ -f "$f" ] && logs+=("server $r:$f"); done
  for ((r = 0; r < W; r++)); do f=$out/logs/worker$r.log; [ -f "$f" ] && logs+=("worker $r:$f"); done
  [ ${#logs[@]} -gt 0 ] || return 0
  local report
  report=$(for l in "${logs[@]}"; do
    sed -nE -e "s/.*snapshot step ([0-9]+) written.*/\1 ok ${l%%:*}/p" \
      -e "s/.*snapshot step ([0-9]+) (failed|not started).*/\1 failed ${l%%:*}/p" \
      -e "s/.*checkpoint step ([0-9]+): worker state written.*/\1 ok ${l%%:*}/p" \
      -e "s/.*checkpoint step ([0-9]+): this worker's state not written.*/\1 failed ${l%%:*}/p" "${l#*:}"
  done | awk -v members=$((S + W)) '
    { key = $1 " " $3 " " $4; if (!(key in seen)) { seen[key] = 1; n[$1]++ }
      if ($2 == "failed") { bad[$1] = bad[$1] (bad[$1] ? ", " : "") $3 " " $4 } else good[$1]++
      steps[$1] = 1 }
    END {
      total = 0; failed = 0; newest = 0; list = ""
      for (t in steps) { k = ++total; while (k > 1 && ord[k - 1] + 0 > t + 0) { ord[k] = ord[k - 1]; k-- }; ord[k] = t }
      for (i = 1; i <= total; i++) { t = ord[i]
        if (t in bad) { failed++; list = list (list ? "; " : "") "step " t ": " bad[t] }
        else if (good[t] >= members) newest = t }
      if (failed) printf "%d of %d checkpoint steps failed on some member (%s); newest step every member wrote: %s\n",
                         failed, total, list, newest ? newest : "none" }')
  [ -z "$report" ] || echo "launch: WARNING: checkpoints: $report (see $out/logs; pfcps ckpt-info $snapdir verifies)" >&2
}

echo "launch: $S servers + $W workers, config $config, logs in $out/logs"
# Every daemon stops in order (SIGTERM) if this launcher dies, even by SIGKILL (common/daemon.h).
export PFCPS_PARENT_PID=$$
extra=()
restarts=0
run_once ">"
while [ "$rc" -ne 0 ] && [ "$restarts" -lt "$max_restarts" ]; do
  restarts=$((restarts + 1))
  # The run this launch formed (server 0 logs its id each time it forms): only its checkpoints count, not those
  # another run left in the same folder. None formed: the config's own resume setting stands.
  run=$(grep -ao "; run id [0-9a-f]\{32\}" "$out/logs/server0.log" 2>/dev/null | tail -n 1 | awk '{print $4}')
  if [ -n "$run" ]; then
    extra=(--set resume=true --set "resume_run=$run")
    step=$("$tool_bin" ckpt-info --newest --run "$run" "$snapdir" 2>/dev/null)
    echo "launch: restart $restarts/$max_restarts after $culprit: every member again with resume = true and resume_run = $run (this launch's run), from checkpoint step ${step:-0}" >&2
  else
    extra=()
    echo "launch: restart $restarts/$max_restarts after $culprit: the run never formed; every member again with the same config" >&2
  fi
  run_once ">>"
done
ckpt_report
if [ "$rc" -ne 0 ]; then
  if [ "$max_restarts" -gt 0 ] && [ "$restarts" -ge "$max_restarts" ]; then
    echo "launch: no restart left: all $max_restarts of --max-restarts were used (each member started again alone counts one, as does each restart of the whole run)" >&2
  fi
  echo "launch: failed with status $rc (the cause: $culprit); logs in $out/logs" >&2
  # This run's logs only: the folder may hold more from an earlier run with more servers or workers.
  for ((r = 0; r < S; r++)); do echo "--- tail $out/logs/server$r.log" >&2; tail -5 "$out/logs/server$r.log" >&2; done
  for ((r = 0; r < W; r++)); do echo "--- tail $out/logs/worker$r.log" >&2; tail -5 "$out/logs/worker$r.log" >&2; done
fi
exit "$rc"
