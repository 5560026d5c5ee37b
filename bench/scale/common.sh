# bench/scale/common.sh: what run.sh and torch_vs_c.sh share (sourced).
# finish_run TAG RC NAME: stops the run's servers (array spids), clears pids, then prints the worker log's
# RESULT lines ($out/TAG.worker.log), or, when RC != 0, NAME's message that TAG failed with the log's last lines.
finish_run() {
  local p
  for p in "${spids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${spids[@]}"; do wait "$p" 2>/dev/null; done
  pids=()
  if [ "$2" -ne 0 ]; then
    echo "$3: $1 failed (exit $2); last lines of $out/$1.worker.log:" >&2
    tail -5 "$out/$1.worker.log" >&2
    return
  fi
  grep '^RESULT' "$out/$1.worker.log"
}
