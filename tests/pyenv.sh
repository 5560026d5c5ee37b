#!/usr/bin/env bash
# The Python used by the tests that check pfcps against independent implementations: Debian's numpy, Pillow, PyTorch
# (1.13, CPU), scikit-learn and onnx, plus a venv (seeing those system packages) with what Debian lacks, from
# PyPI: onnxruntime, safetensors, tensorboard, lizard (tests/lint/lint.sh measures function lengths with
# it) and meson-python (tests/deploy/local/test_torch_partial_fc.sh builds python/ with it, without build
# isolation). Idempotent: installs only what is missing. Prints the venv's python on stdout (last line); the tests find
# it as $PFCPS_PYTHON and skip, naming what is missing, without it.
# Environment: PFCPS_VENV (default <repo>/.venv-tests).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${PFCPS_VENV:-$(pwd)/.venv-tests}
DEB=(python3-numpy python3-torch python3-sklearn python3-onnx python3-pil python3-venv python3-pip)
PIP=(onnxruntime safetensors tensorboard lizard meson-python)

missing=()
for p in "${DEB[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "pyenv: missing Debian packages: ${missing[*]} (run as root)" >&2
    exit 1
  fi
  echo "pyenv: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
# Debian's interpreter (not another python3 on PATH): its dist-packages hold the Debian modules above.
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  rm -rf "$venv"
  echo "pyenv: creating $venv" >&2
  /usr/bin/python3 -m venv --system-site-packages "$venv" >&2
fi
need=()
for p in "${PIP[@]}"; do
  "$venv/bin/python" -m pip show -q "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "pyenv: pip install ${need[*]}" >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${need[@]}" >&2
fi
echo "$venv/bin/python"
