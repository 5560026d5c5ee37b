#!/usr/bin/env bash
# tests/free_port.py: every port it prints lies outside the kernel's ephemeral range (read here from
# /proc/sys/net/ipv4/ip_local_port_range), at or above 10000, and can be bound on 127.0.0.1 and listened on;
# a port that is taken (held by a listener here) is never printed, even when every draw but one hits it.
. "$(dirname "$0")/expect.sh"
FP=$(dirname "$0")/free_port.py
read -r lo hi </proc/sys/net/ipv4/ip_local_port_range
bad=0
for i in $(seq 1 10); do
  p=$(python3 "$FP") || { fail "free_port.py exited non-zero"; break; }
  if [ "$p" -lt 10000 ] || { [ "$p" -ge "$lo" ] && [ "$p" -le "$hi" ]; }; then
    fail "port $p is below 10000 or inside the ephemeral range $lo-$hi"; bad=1
  fi
  python3 -c "import socket,sys; s=socket.socket(); s.bind(('127.0.0.1', $p)); s.listen()" ||
    { fail "port $p could not be bound"; bad=1; }
done
[ "$bad" -eq 0 ] && ok "10 ports outside $lo-$hi, each bindable"
# A window of two ports, one of them held by a listener here: only the other is ever printed. The window is
# the one above a stub ephemeral range of 1024-65533 (a range starting at or below 11000 leaves the ports
# above its end: 65534 and 65535).
for i in 1 2 3 4 5; do
  out=$(python3 - "$FP" <<'P'
import importlib.util, socket, sys
spec = importlib.util.spec_from_file_location("fp", sys.argv[1])
fp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fp)
held = socket.socket()
held.bind(("127.0.0.1", 65534))
held.listen()
fp.ephemeral_range = lambda: (1024, 65533)
fp.main()
P
  ) || { fail "free_port.py with 65534 held failed: $out"; break; }
  [ "$out" = 65535 ] || { fail "with 65534 held and a window of 65534-65535 it printed '$out', not 65535"; break; }
done
[ "$out" = 65535 ] && ok "a held port is never printed (5 draws in a window of two, one held: 65535 each time)"
expect_summary
