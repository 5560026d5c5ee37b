#!/usr/bin/env bash
# apt_deps.sh LABEL PACKAGE...: installs the Debian packages some tests need, only those missing. Idempotent.
# As root it installs with no prompt, without starting the packages' own services (policy-rc.d 101 during the
# install); as another user it names what is missing and exits 1 (the tests that need a missing piece skip,
# naming it). LABEL starts its messages. Used by tests/deploy/slurm/deps.sh and tests/deploy/monitoring/deps.sh.
set -euo pipefail
label=$1; shift
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "$label: missing Debian packages: ${missing[*]} (run as root)" >&2
  exit 1
fi
echo "$label: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
policy=/usr/sbin/policy-rc.d
own_policy=0
if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && own_policy=1; fi
rc=0
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 || rc=$?
[ "$own_policy" -eq 0 ] || rm -f "$policy"
exit $rc
