#!/usr/bin/env bash
# systemd units (deploy/systemd/*.service) against where `meson install` puts this build: the build is installed
# into a scratch root (meson install --destdir), the units go to its /etc/systemd/system, and `systemd-analyze
# verify --root` must accept pfcps-server@0 and pfcps-worker@0 without a word (it checks that ExecStart names an
# executable there, among the rest); the same units pointing at /opt/pfcps/bin must be refused (the check is
# real). The units keep a working directory (relative `output`) and Restart=on-failure. Skips (77) without
# systemd-analyze.
# Arguments: SERVER WORKER PFCPS SRC BUILD (tests/deploy/local/cluster.sh).
. "$(dirname "$0")/../../expect.sh"
command -v systemd-analyze >/dev/null 2>&1 || skip "systemd-analyze is not installed (package systemd)"
source "$(dirname "$0")/../local/cluster.sh" "$@"
units=$SRC/deploy/systemd
ROOT=$TMP/root

# This build, installed as `meson install` installs it (prefix from the build's options).
meson install -C "$BUILD" --no-rebuild --destdir "$ROOT" >"$TMP/install.log" 2>&1 ||
  { tail -20 "$TMP/install.log"; die "meson install"; }
installed() {
  meson introspect --installed "$BUILD" | python3 -c 'import json, sys
print(next(v for k, v in json.load(sys.stdin).items() if k.endswith("/" + sys.argv[1])))' "$1"
}
# What verify needs besides the units: the targets they depend on by default.
mkdir -p "$ROOT/etc/systemd/system" "$ROOT/usr/lib/systemd/system"
cp -L /usr/lib/systemd/system/*.target "$ROOT/usr/lib/systemd/system/"

for role in server worker; do
  unit=$units/pfcps-$role@.service
  cp "$unit" "$ROOT/etc/systemd/system/"
  exe=$(sed -n 's/^ExecStart=\([^ ]*\) .*/\1/p' "$unit")
  want=$(installed "pfcps-$role") || die "meson introspect: no pfcps-$role among the installed files"
  [ -x "$ROOT$want" ] || die "meson install did not put pfcps-$role at $want"
  if [ "$exe" != "$want" ]; then
    # A build with another prefix: the override the unit's comment describes.
    echo "systemd: this build installs pfcps-$role at $want (unit: $exe): checking with a drop-in"
    mkdir -p "$ROOT/etc/systemd/system/pfcps-$role@.service.d"
    printf '[Service]\nExecStart=\nExecStart=%s --config /etc/pfcps/pfcps.ini --rank %%i\n' "$want" \
      >"$ROOT/etc/systemd/system/pfcps-$role@.service.d/prefix.conf"
  fi
  # What the units promise besides the binary.
  grep -qx "WorkingDirectory=/var/lib/pfcps" "$unit" || die "$unit: no WorkingDirectory=/var/lib/pfcps"
  grep -qx "StateDirectory=pfcps" "$unit" || die "$unit: no StateDirectory=pfcps (creates the working directory)"
  grep -qx "Restart=on-failure" "$unit" || die "$unit: no Restart=on-failure"
done

rc=0
systemd-analyze verify --root="$ROOT" pfcps-server@0.service pfcps-worker@0.service >"$TMP/verify.out" 2>&1 || rc=$?
if [ "$rc" -ne 0 ] || [ -s "$TMP/verify.out" ]; then cat "$TMP/verify.out"; die "systemd-analyze verify: exit $rc"; fi
echo "systemd: systemd-analyze verify accepts pfcps-server@0 and pfcps-worker@0 ($(installed pfcps-server))"

# The control: the units pointing where nothing is installed are refused.
mkdir -p "$TMP/bad/etc/systemd/system"
cp -a "$ROOT/usr" "$TMP/bad/"
sed 's|^ExecStart=[^ ]*/pfcps-server |ExecStart=/opt/pfcps/bin/pfcps-server |' "$units/pfcps-server@.service" \
  >"$TMP/bad/etc/systemd/system/pfcps-server@.service"
systemd-analyze verify --root="$TMP/bad" pfcps-server@0.service >"$TMP/bad.out" 2>&1 &&
  die "systemd-analyze verify accepted ExecStart=/opt/pfcps/bin/pfcps-server, which does not exist"
grep -q "/opt/pfcps/bin/pfcps-server is not executable" "$TMP/bad.out" ||
  { cat "$TMP/bad.out"; die "verify did not name the missing /opt/pfcps/bin/pfcps-server"; }

echo "systemd: PASS"
