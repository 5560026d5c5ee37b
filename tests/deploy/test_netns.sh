#!/usr/bin/env bash
# Many hosts on one machine: every daemon of the quick start (2 pfcps-server + 2 pfcps-worker,
# deploy/configs/quickstart.ini on ORL s1..s30 packed as deploy/quickstart.sh packs them; 3 of its 8 epochs,
# PFCPS_NETNS_EPOCHS, and links at 400mbit, PFCPS_NETNS_RATE) runs in a network namespace of its own ("hosts"
# ps0 ps1 wk0 wk1), each with one address on a veth pair whose other end is on a bridge, its egress limited by
# tc tbf, and host names in /etc/netns/<ns>/hosts. The rendezvous is the host name ps0, not an address, and ps0
# is published late: the hosts entries for it are written a few seconds after the daemons start, so server 0
# (binding ps0) and every member (connecting to it) must wait for the name, retrying (common/hostport.c
# pf_resolve) until it resolves. Checks: every daemon logged the wait and then the name resolving; every member
# joined from its own host's address; the run trained (loss fell, model.ckpt written); the servers stopped in
# order (exit 0); the data plane went over the links (bytes through every host's tbf); a name that never
# resolves is refused after join_timeout with the reason. Namespaces, veths, bridge and /etc/netns entries are
# this test's own and removed on exit (also on failure). Skips (77) without root, ip, tc or namespace support.
# Arguments: SERVER WORKER PFCPS SRC BUILD (tests/deploy/local/cluster.sh).
. "$(dirname "$0")/../expect.sh"
[ "$(id -u)" -eq 0 ] || skip "network namespaces need root (ip netns add)"
command -v ip >/dev/null 2>&1 || skip "no 'ip' command (iproute2)"
command -v tc >/dev/null 2>&1 || skip "no 'tc' command (iproute2)"
source "$(dirname "$0")/local/cluster.sh" "$@"

# Names of this run's own objects: interface names have at most 15 characters.
tag=pf$(($$ % 100000))
BR=${tag}br
HOSTS=(ps0 ps1 wk0 wk1)
declare -A NS IP
for i in "${!HOSTS[@]}"; do
  NS[${HOSTS[i]}]=pfcps-$tag-${HOSTS[i]}
  IP[${HOSTS[i]}]=10.77.0.$((10 + i))
done
RATE=${PFCPS_NETNS_RATE:-400mbit}

teardown() {
  local h
  for h in "${HOSTS[@]}"; do
    ip netns pids "${NS[$h]}" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
    ip netns del "${NS[$h]}" 2>/dev/null
    rm -rf "/etc/netns/${NS[$h]}"
    ip link del "${tag}$h" 2>/dev/null
  done
  ip link del "$BR" 2>/dev/null
}
on_exit() { cleanup; teardown; }
trap on_exit EXIT
trap 'exit 143' TERM INT HUP # meson's timeout: still take everything down (bash skips EXIT on a fatal signal)

# nsx HOST CMD...: CMD inside HOST's namespace (with its /etc/hosts).
nsx() { local h=$1; shift; ip netns exec "${NS[$h]}" "$@"; }

# The network: a bridge, and per host a namespace, a veth pair (eth0 inside, ${tag}HOST on the bridge) and
# a hosts file naming every host but ps0.
ip netns add "${NS[ps0]}" 2>"$TMP/netns.err" || skip "cannot create a network namespace: $(cat "$TMP/netns.err")"
ip link add "$BR" type bridge || die "ip link add $BR type bridge"
ip link set "$BR" up || die "bridge up"
for h in "${HOSTS[@]}"; do
  [ "$h" = ps0 ] || ip netns add "${NS[$h]}" || die "ip netns add ${NS[$h]}"
  ip link add "${tag}$h" type veth peer name "${tag}${h}i" || die "veth for $h"
  ip link set "${tag}${h}i" netns "${NS[$h]}" || die "veth into ${NS[$h]}"
  ip link set "${tag}$h" master "$BR" up || die "veth $h onto the bridge"
  nsx "$h" ip link set "${tag}${h}i" name eth0 || die "rename eth0 in $h"
  nsx "$h" ip addr add "${IP[$h]}/24" dev eth0 || die "address for $h"
  nsx "$h" ip link set eth0 up || die "eth0 up in $h"
  nsx "$h" ip link set lo up || die "lo up in $h"
  nsx "$h" tc qdisc add dev eth0 root tbf rate "$RATE" burst 1mb latency 100ms 2>"$TMP/tc.err" ||
    skip "tc tbf is not available: $(cat "$TMP/tc.err")"
  mkdir -p "/etc/netns/${NS[$h]}"
  {
    echo "127.0.0.1 localhost"
    for o in "${HOSTS[@]}"; do [ "$o" = ps0 ] || echo "${IP[$o]} $o"; done
  } >"/etc/netns/${NS[$h]}/hosts"
done
# The links work (by address; ps0's name is not published yet) and names resolve in their namespace.
# reach HOST ADDR: a TCP connect from HOST to ADDR:9 is answered (refused counts) within 2 s.
reach() {
  nsx "$1" python3 -c 'import socket, sys
s = socket.socket(); s.settimeout(2)
try: s.connect((sys.argv[1], 9))
except ConnectionRefusedError: pass
except OSError as e: sys.exit(str(e))' "$2"
}
for h in ps0 ps1 wk1; do
  reach wk0 "${IP[$h]}" || die "wk0 cannot reach $h (${IP[$h]}) over the bridge (bridge netfilter dropping frames?)"
done
[ "$(nsx wk0 getent hosts ps1 | awk '{print $1}')" = "${IP[ps1]}" ] || die "ps1 does not resolve in wk0's namespace"
nsx wk0 getent hosts ps0 >/dev/null && die "ps0 resolves before it is published"

pack_orl 30
cfg=$SRC/deploy/configs/quickstart.ini
EPOCHS=${PFCPS_NETNS_EPOCHS:-3}
sets=(--set "rec=$TMP/train" --set "output=$TMP/out" --set "rendezvous=ps0:29500" --set "num_epoch=$EPOCHS")
export PFCPS_SECRET=netns-test-secret-$$ OMP_NUM_THREADS=1

# launch HOST LOG BINARY ARGS...: a daemon in HOST's namespace; its pid in DPID (and PIDS).
launch() {
  local h=$1 log=$2; shift 2
  ip netns exec "${NS[$h]}" "$@" >"$log" 2>&1 & # a simple command: $! is the daemon (ip execs it)
  DPID=$!; PIDS+=($!)
}
start=$(date +%s.%N)
launch ps0 "$TMP/server0.log" "$SERVER" --config "$cfg" --rank 0 "${sets[@]}"; S0=$DPID
launch ps1 "$TMP/server1.log" "$SERVER" --config "$cfg" --rank 1 "${sets[@]}"; S1=$DPID
launch wk0 "$TMP/worker0.log" "$WORKER" --config "$cfg" --rank 0 "${sets[@]}"; W0=$DPID
launch wk1 "$TMP/worker1.log" "$WORKER" --config "$cfg" --rank 1 "${sets[@]}"; W1=$DPID
SPIDS=("$S0" "$S1")

# Every daemon waits for the name ps0 (up to ctl_timeout, 30 s); once all four are waiting, and 2 s later, ps0
# is published in every namespace.
for d in server0 server1 worker0 worker1; do
  wait_log "$TMP/$d.log" "waiting for name 'ps0'" 20 || { show_logs; die "$d did not wait for the name ps0"; }
done
sleep 2
for d in server0 server1 worker0 worker1; do
  ! grep -q "rendezvous listening\|joined:" "$TMP/$d.log" || { show_logs; die "$d went on before ps0 was published"; }
done
for h in "${HOSTS[@]}"; do echo "${IP[ps0]} ps0" >>"/etc/netns/${NS[$h]}/hosts"; done
published=$(date +%s.%N)

wait_all "$W0" "$W1" || { show_logs; die "a worker did not exit 0"; }
trained=$(date +%s.%N)
kill -TERM "$S0" "$S1"
for r in 0 1; do
  rc=0; wait "${SPIDS[r]}" || rc=$?
  [ "$rc" -eq 0 ] || { show_logs; die "server $r exited $rc on SIGTERM, expected 0"; }
done
for d in server0 server1 worker0 worker1; do
  grep -q "name 'ps0' resolved after" "$TMP/$d.log" || { show_logs; die "$d: no 'name ps0 resolved' line"; }
done
# Server 0 listened on ps0's name; every member came from its own host's address.
grep -q "rendezvous listening on ps0:29500" "$TMP/server0.log" || { show_logs; die "server 0 did not bind ps0:29500"; }
for m in "server[1] ps1" "worker[0] wk0" "worker[1] wk1"; do
  who=${m% *} ip=${IP[${m#* }]}
  grep -qF "$who joined from $ip:" "$TMP/server0.log" || { show_logs; die "$who did not join from $ip"; }
done

log=$TMP/out/training.log
[ -s "$TMP/out/model.ckpt" ] || die "no model.ckpt"
steps=$(grep -o 'Global Step: [0-9]*' "$log" | tail -n 1 | awk '{print $3}')
first=$(grep -m1 -o 'Loss [0-9.]*' "$log" | awk '{print $2}')
last=$(grep -o 'Loss [0-9.]*' "$log" | tail -n 1 | awk '{print $2}')
[ "${steps:-0}" -eq $((EPOCHS * 18)) ] || die "trained ${steps:-0} steps, expected $((EPOCHS * 18))"
loss_fell "$first" "$last" || die "loss did not fall: $first -> $last"

# Every host sent its share through its own rate-limited link: servers the pulled rows (~15 KB a step), workers
# also the backbone's ring allreduce (~6 MB a step); the workers' links were throttled by tbf (overlimits).
for h in "${HOSTS[@]}"; do
  read -r sent over < <(nsx "$h" tc -s qdisc show dev eth0 |
    awk '/Sent/ {for (i = 1; i <= NF; i++) if ($i == "overlimits") o = $(i + 1); print $2, o + 0; exit}')
  echo "netns: $h (${IP[$h]}) sent $sent bytes through tbf $RATE, overlimits $over"
  case $h in
    ps*) [ "${sent:-0}" -gt 100000 ] || die "$h sent only ${sent:-0} bytes through its link" ;;
    wk*) [ "${sent:-0}" -gt 10000000 ] || die "$h sent only ${sent:-0} bytes through its link"
         [ "${over:-0}" -gt 0 ] || die "$h's link was never throttled by tbf (overlimits 0)" ;;
  esac
done

# A name that is never published: refused after join_timeout (3 s here), naming it.
t0=$(date +%s)
launch wk1 "$TMP/never.log" "$WORKER" --config "$cfg" --rank 0 "${sets[@]}" --set rendezvous=never-published:29500 \
  --set join_timeout=3
wait_exit "$DPID" 20 || die "a worker waiting for a name that never resolves still runs after 20 s"
rc=0; wait "$DPID" || rc=$?
t1=$(date +%s)
[ "$rc" -eq 1 ] || { cat "$TMP/never.log"; die "never-published: exit $rc, expected 1"; }
grep -Eq "cannot resolve (the )?rendezvous host 'never-published': .*\(retried for" "$TMP/never.log" ||
  { cat "$TMP/never.log"; die "never-published: no 'cannot resolve ... (retried for' message"; }
[ $((t1 - t0)) -ge 2 ] || die "never-published: gave up after $((t1 - t0)) s, before join_timeout (3 s)"

awk -v s="$steps" -v f="$first" -v l="$last" -v a="$start" -v p="$published" -v t="$trained" 'BEGIN {
  printf "netns: %s steps, loss %s -> %s; ps0 published %.1f s after start, trained %.1f s later\n",
    s, f, l, p - a, t - p }'

# Teardown leaves nothing of this test's.
cleanup; trap - EXIT; teardown
! ip netns list | grep -q "pfcps-$tag-" || die "namespaces left: $(ip netns list | grep "pfcps-$tag-")"
! ip -br link | grep -q "^$tag" || die "links left: $(ip -br link | grep "^$tag")"
for h in "${HOSTS[@]}"; do [ ! -e "/etc/netns/${NS[$h]}" ] || die "/etc/netns/${NS[$h]} left"; done
echo "netns: PASS"
