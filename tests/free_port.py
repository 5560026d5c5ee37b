#!/usr/bin/env python3
"""Prints a TCP port of 127.0.0.1 that nothing is bound to now, for a test's daemon to bind next.

The port is drawn at random from below the kernel's ephemeral range (net.ipv4.ip_local_port_range, from
which bind(port 0) also draws, and every outgoing connection its source port): a port from that range can be
taken by any connection's source port between this check and the daemon's bind, and the daemon then fails
with "Address already in use". Ports from 10000 up to the range's start are never handed out that way. If the
range starts at or below 11000, the ports above its end are used instead. Exits 1 when 500 draws found no
free port."""
import random
import socket
import sys


def ephemeral_range():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
            return lo, hi
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def main():
    lo, hi = ephemeral_range()
    first, last = (10000, lo - 1) if lo > 11000 else (hi + 1, 65535)
    if first > last:
        sys.exit("free_port.py: no port outside the ephemeral range %d-%d" % (lo, hi))
    rng = random.SystemRandom()
    for _ in range(500):
        port = rng.randint(first, last)
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            s.close()
        print(port)
        return
    sys.exit("free_port.py: no free port in %d-%d after 500 draws" % (first, last))


if __name__ == "__main__":
    main()
