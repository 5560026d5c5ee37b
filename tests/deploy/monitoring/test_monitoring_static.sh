#!/usr/bin/env bash
# deploy/monitoring checked without a run, by Prometheus's own tools (Debian's prometheus package:
# tests/deploy/monitoring/deps.sh):
#   1. promtool check rules on alerts.yml; promtool test rules on alerts_test.yml (synthetic series: each alert
#      fires and clears at the minutes worked out by hand there);
#   2. promtool check config on every prometheus-*.yml (with alerts.yml beside it). Debian's Prometheus is
#      built without Kubernetes discovery: where promtool refuses kubernetes_sd_configs for that reason, the
#      Kubernetes config is checked with a static target in its place (its relabelling rules still checked);
#   3. grafana-dashboard.json parses (python3 -m json.tool), has panels with queries, and every metric name in
#      its queries and in alerts.yml is a family of docs/metrics.md (check_names.py);
#   4. the Kubernetes pieces agree: in deploy/kubernetes/pfcps.yaml and pfcps-verbs.yaml the ConfigMap's
#      metrics_address port = the pods' prometheus.io/port = every container's port named metrics = the
#      Service's port metrics; servicemonitor.yaml selects that Service and port; prometheus-kubernetes.yml
#      keeps app=pfcps pods; every scrape job is named pfcps (what the rules match) and honours the daemons'
#      labels; the pods' role labels are the ones the rules match (server, worker).
# Usage: test_monitoring_static.sh SRC. Skips (77) when promtool or python3's yaml module is missing.
set -uo pipefail
. "$(dirname "$0")/../../expect.sh"
src=${1:?usage: test_monitoring_static.sh SRC}
mon=$src/deploy/monitoring
command -v promtool >/dev/null || skip "promtool is not installed (Debian package prometheus: tests/deploy/monitoring/deps.sh)"
python3 -c 'import yaml' 2>/dev/null || skip "python3's yaml module is not installed (Debian package python3-yaml)"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# 1. the rules
n_alerts=$(grep -c '^ *- alert: ' "$mon/alerts.yml")
expect_rc "promtool check rules" 0 "SUCCESS: $n_alerts rules found" promtool check rules "$mon/alerts.yml"
expect_rc "promtool test rules" 0 "SUCCESS" promtool test rules "$src/tests/deploy/monitoring/alerts_test.yml"
# Every alert of alerts.yml has a test group (its name in alert_rule_test).
for a in $(sed -n 's/^ *- alert: //p' "$mon/alerts.yml"); do
  grep -Eq "alertname: $a([,}]|\$)" "$src/tests/deploy/monitoring/alerts_test.yml" ||
    fail "alerts_test.yml has no test of $a"
done

# 2. the scrape configs
cp "$mon"/alerts.yml "$mon"/prometheus-*.yml "$TMP/"
for f in "$TMP"/prometheus-*.yml; do
  name=$(basename "$f")
  RC=0
  OUT=$(promtool check config "$f" 2>&1) || RC=$?
  if [ "$RC" -ne 0 ] && grep -q "field kubernetes_sd_configs not found" <<<"$OUT"; then
    # kubernetes_sd_configs (the line and its indented list) -> a static target, the rest unchanged.
    awk '/^    kubernetes_sd_configs:/ {print "    static_configs: [{targets: [\"10.0.0.1:9400\"]}]"; skip = 1; next}
         skip && /^      / {next} {skip = 0; print}' "$f" >"$f.static"
    expect_rc "promtool check config $name (static target for kubernetes_sd_configs: not in Debian's build)" 0 \
      "is valid prometheus config file syntax" promtool check config "$f.static"
  elif [ "$RC" -eq 0 ] && grep -q "is valid prometheus config file syntax" <<<"$OUT"; then
    ok "promtool check config $name"
  else
    expect_failed "promtool check config $name" "exit $RC" "$OUT"
  fi
done

# 3. the dashboard
expect_rc "grafana-dashboard.json parses" 0 "" python3 -m json.tool "$mon/grafana-dashboard.json"
expect_rc "dashboard and alert metric names in docs/metrics.md" 0 ", 0 problems" \
  python3 "$src/tests/deploy/monitoring/check_names.py" "$src/docs/metrics.md" "$mon/grafana-dashboard.json" "$mon/alerts.yml"
expect_rc "dashboard panels" 0 "ok" python3 - "$mon/grafana-dashboard.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
panels = [p for p in d["panels"] if p["type"] != "row"]
ids = [p["id"] for p in d["panels"]]
assert len(ids) == len(set(ids)), f"panel ids repeat: {ids}"
for p in panels:
    assert p.get("targets") and all(t.get("expr") for t in p["targets"]), f"panel {p['title']!r} has no query"
    assert p["datasource"]["uid"] == "${datasource}", f"panel {p['title']!r}: datasource {p['datasource']}"
print(f"ok: {len(panels)} panels, each with queries")
PY

# 4. the Kubernetes pieces agree
expect_rc "Kubernetes metrics port, annotations, Service, ServiceMonitor" 0 "ok" \
  python3 - "$src/deploy/kubernetes/pfcps.yaml" "$src/deploy/kubernetes/pfcps-verbs.yaml" \
  "$mon/servicemonitor.yaml" "$mon/prometheus-kubernetes.yml" "$mon"/prometheus-*.yml <<'PY'
import re, sys, yaml
mans, sm_path, k8s_prom, proms = sys.argv[1:3], sys.argv[3], sys.argv[4], sys.argv[5:]
sm = yaml.safe_load(open(sm_path))
assert sm["kind"] == "ServiceMonitor", sm["kind"]
for path in mans:
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    svc = next(d for d in docs if d["kind"] == "Service")
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    jobs = [d for d in docs if d["kind"] == "Job"]
    m = re.search(r"^\s*metrics_address\s*=\s*(\S+):(\d+)\s*$", cm["data"]["pfcps.ini"], re.M)
    assert m, f"{path}: no metrics_address in the ConfigMap"
    host, port = m.group(1), int(m.group(2))
    assert host == "0.0.0.0", f"{path}: metrics_address host {host}: other pods could not reach it"
    sport = [p for p in svc["spec"]["ports"] if p.get("name") == "metrics"]
    assert sport and sport[0]["port"] == port and sport[0].get("targetPort") == port, f"{path}: Service port {sport}"
    roles = set()
    for j in jobs:
        tmpl = j["spec"]["template"]
        ann = tmpl["metadata"].get("annotations", {})
        assert ann.get("prometheus.io/scrape") == "true", f"{path}: Job {j['metadata']['name']}: {ann}"
        assert ann.get("prometheus.io/port") == str(port), f"{path}: Job {j['metadata']['name']}: {ann}"
        labels = tmpl["metadata"]["labels"]
        roles.add(labels["role"])
        assert labels["app"] == "pfcps"
        for c in tmpl["spec"]["containers"]:
            cp = [p for p in c.get("ports", []) if p.get("name") == "metrics"]
            assert cp and cp[0]["containerPort"] == port, f"{path}: container {c['name']}: ports {c.get('ports')}"
    assert roles == {"server", "worker"}, roles
    sel = sm["spec"]["selector"]["matchLabels"]
    assert all(svc["metadata"]["labels"].get(k) == v for k, v in sel.items()), f"{path}: ServiceMonitor {sel}"
    assert [e["port"] for e in sm["spec"]["endpoints"]] == ["metrics"], sm["spec"]["endpoints"]
    assert sm["spec"]["endpoints"][0].get("honorLabels") is True
    # The operator's job label is the Service's name: what alerts.yml matches.
    assert svc["metadata"]["name"] == "pfcps", svc["metadata"]["name"]
kp = yaml.safe_load(open(k8s_prom))
keep = kp["scrape_configs"][0]["relabel_configs"][0]
assert keep["action"] == "keep" and keep["regex"] == "pfcps;true", keep
for p in proms:
    for sc in yaml.safe_load(open(p))["scrape_configs"]:
        assert sc["job_name"] == "pfcps" and sc.get("honor_labels") is True, f"{p}: {sc['job_name']}"
print("ok: port", port, "everywhere;", len(proms), "scrape configs with job pfcps")
PY
expect_summary
