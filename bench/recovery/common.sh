# bench/recovery/common.sh: what the recovery benchmarks share (sourced; SRC and PFCPS set by the caller).
# recovery_stage: packs 10 ORL identities into $TMP/train (the runs' dataset); TMP must exist.
recovery_stage() {
  mkdir -p "$TMP/stage"
  for i in $(seq 1 10); do ln -sfn "$SRC/data/orl/s$i" "$TMP/stage/s$i"; done
  "$PFCPS" pack --quiet "$TMP/stage" "$TMP/train"
}
# port: a free TCP port on 127.0.0.1, from below the ephemeral range (tests/free_port.py says why).
port() { python3 "$SRC/tests/free_port.py"; }
# final DIR: the newest complete checkpoint's `pfcps ckpt-info` line (table and backbone digests), sizes removed.
final() {
  local s; s=$("$PFCPS" ckpt-info --newest "$1")
  "$PFCPS" ckpt-info "$1" | grep "^step $s: complete" | sed 's/  [0-9.]* MB//'
}
# iso_s LINE: the time of a pfcps log line (its leading ISO 8601 UTC stamp) in seconds since the epoch.
iso_s() { date -u -d "$(cut -d' ' -f1 <<<"$1" | sed 's/Z$//; s/T/ /')" +%s.%N; }
# first_after FILE PATTERN T: the time of FILE's first line matching PATTERN logged after T (empty if none).
first_after() {
  local line s
  while read -r line; do
    s=$(iso_s "$line")
    python3 -c "import sys; sys.exit(0 if $s > $3 else 1)" && { echo "$s"; return; }
  done < <(grep -E "$2" "$1")
}
# last_step_before FILE T: the global step of FILE's last "Global Step: N" line logged at or before T (0 if none).
last_step_before() {
  local line s n=0
  while read -r line; do
    s=$(iso_s "$line")
    python3 -c "import sys; sys.exit(0 if $s <= $2 else 1)" || break
    n=$(sed -n 's/.*Global Step: \([0-9]*\).*/\1/p' <<<"$line")
  done < <(grep -E "Global Step: " "$1")
  echo "${n:-0}"
}
# recovery_ini NAME SERVERS WORKERS REPLICAS CLASSES [LINE...]: $TMP/NAME.ini, the recovery benchmarks' run: the
# 10 ORL identities of recovery_stage in a table of CLASSES classes, r18_w8 with 32-d embeddings and a CosFace
# margin, batch 8, 6 epochs, a log line every step, snapshot_every 4, ctl_timeout and join_timeout 20, output
# $TMP/NAME, a free rendezvous port; each LINE (e.g. "sample_rate = 0.25") appended last, where it overrides.
recovery_ini() {
  local name=$1 s=$2 w=$3 rep=$4 classes=$5; shift 5
  {
    cat <<INI
[train]
network = r18_w8
embedding_size = 32
margin_list = 1.0, 0.0, 0.35
batch_size = 8
lr = 0.1
num_epoch = 6
warmup_epoch = 1
output = $TMP/$name
seed = 7
[data]
rec = $TMP/train
num_classes = $classes
num_workers = 1
frequent = 1
[cluster]
servers = $s
workers = $w
rendezvous = 127.0.0.1:$(port)
ctl_timeout = 20
join_timeout = 20
[server]
snapshot_every = 4
replicas = $rep
[train]
INI
    local l
    for l in "$@"; do echo "$l"; done
  } >"$TMP/$name.ini"
}
