#!/usr/bin/env bash
# The Debian packages the deployment tests (tests/deploy) try the manifests with: Slurm (slurmctld, slurmd and
# the client commands) with munge; ip and tc (iproute2) for the network-namespace test. (systemd-analyze, for
# the unit check, comes with systemd, which is not installed for it.) Idempotent: installs only what is
# missing. As root it installs with no prompt; as another user it lists what is missing and exits 1 (the tests
# that need a missing piece skip, naming it).
set -euo pipefail
PACKAGES=(slurm-wlm munge iproute2)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "deploy deps: missing Debian packages: ${missing[*]} (run as root)" >&2
  exit 1
fi
echo "deploy deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
# policy-rc.d 101: the packages' own services (munge, slurmctld, slurmd) are not started by the install.
policy=/usr/sbin/policy-rc.d
own_policy=0
if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && own_policy=1; fi
rc=0
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 || rc=$?
[ "$own_policy" -eq 0 ] || rm -f "$policy"
exit $rc
