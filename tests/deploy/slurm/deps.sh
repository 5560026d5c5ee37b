#!/usr/bin/env bash
# The Debian packages the deployment tests (tests/deploy) try the manifests with: Slurm (slurmctld, slurmd and
# the client commands) with munge; ip and tc (iproute2) for the network-namespace test. (systemd-analyze, for
# the unit check, comes with systemd, which is not installed for it.) Installed by tests/apt_deps.sh (only what
# is missing, as root, services not started; another user gets the list and exit 1).
exec "$(dirname "$0")/../../apt_deps.sh" "deploy deps" slurm-wlm munge iproute2
