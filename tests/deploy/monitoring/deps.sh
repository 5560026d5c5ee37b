#!/usr/bin/env bash
# The Debian packages the monitoring tests (tests/deploy/monitoring) check deploy/monitoring with: prometheus
# (the server, for the live test, and promtool, for the rule, config and rule unit-test checks) and python3-yaml
# (the static test reads the Kubernetes manifests). Installed by tests/apt_deps.sh (only what is missing, as
# root, prometheus.service not started; another user gets the list and exit 1).
exec "$(dirname "$0")/../../apt_deps.sh" "monitoring deps" prometheus python3-yaml
