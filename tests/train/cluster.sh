# Helpers for the multi-process training tests (sourced). Needs SERVER, WORKER, PFCPS (binaries) and
# TMP (a scratch directory). Every daemon started here is killed on exit, whatever happens.
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

# Config lines the tests' run files share (expanded in their heredocs):
# TINY_NET: [train] of the tiny test network (r18_w8, 16-d embeddings, batch 4);
# TINY_DATA: [data] of a synthetic set of 10 classes, 8 images;
# ORL_NET: [train] of the ORL training runs (r18_w8, 32-d embeddings, CosFace margin, batch 8, lr 0.1).
TINY_NET="network = r18_w8
embedding_size = 16
batch_size = 4"
TINY_DATA="rec = synthetic
num_classes = 10
num_image = 8"
ORL_NET="network = r18_w8
embedding_size = 32
margin_list = 1.0, 0.0, 0.35
batch_size = 8
lr = 0.1"

# free_port: a TCP port nobody listens on (the rendezvous binds it).
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# start_cluster CONFIG S W [worker args...]: starts S servers and W workers; pids in SPIDS / WPIDS,
# logs in $TMP/server<r>.log / worker<r>.log. Worker args may contain {r} for the rank.
start_cluster() {
  local cfg=$1 S=$2 W=$3; shift 3
  SPIDS=(); WPIDS=()
  for ((r = 0; r < S; r++)); do
    "$SERVER" --config "$cfg" --rank "$r" >"$TMP/server$r.log" 2>&1 &
    SPIDS+=($!); PIDS+=($!)
  done
  for ((r = 0; r < W; r++)); do
    local args=("${@//\{r\}/$r}")
    "$WORKER" --config "$cfg" --rank "$r" "${args[@]}" >"$TMP/worker$r.log" 2>&1 &
    WPIDS+=($!); PIDS+=($!)
  done
}

# wait_all PIDS...: waits for each; returns the first non-zero status (0 when all exited 0).
wait_all() {
  local rc=0 s
  for p in "$@"; do
    s=0; wait "$p" || s=$?
    [ "$s" -ne 0 ] && [ "$rc" -eq 0 ] && rc=$s
  done
  return $rc
}

# stop_servers: SIGTERM to every server; each must exit 0.
stop_servers() {
  for p in "${SPIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  wait_all "${SPIDS[@]}" || { tail -5 "$TMP"/server*.log; fail "a server did not exit 0 on SIGTERM"; }
}

show_logs() { for f in "$TMP"/*.log; do echo "--- $f"; tail -15 "$f"; done; }
