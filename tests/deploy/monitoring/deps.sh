#!/usr/bin/env bash
# The Debian packages the monitoring tests (tests/deploy/monitoring) check deploy/monitoring with: prometheus
# (the server, for the live test, and promtool, for the rule, config and rule unit-test checks) and python3-yaml
# (the static test reads the Kubernetes manifests). Idempotent: installs only what is missing. As root it
# installs with no prompt; as another user it names what is missing and exits 1 (the tests that need it skip,
# naming it).
set -euo pipefail
PACKAGES=(prometheus python3-yaml)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "monitoring deps: missing Debian packages: ${missing[*]} (run as root)" >&2
  exit 1
fi
echo "monitoring deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
# policy-rc.d 101: the package's own service (prometheus.service) is not started by the install.
policy=/usr/sbin/policy-rc.d
own_policy=0
if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && own_policy=1; fi
rc=0
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 || rc=$?
[ "$own_policy" -eq 0 ] || rm -f "$policy"
exit $rc
