#!/usr/bin/env bash
# Installs the Debian 12 packages that pfcps's build, tests and quick start need. Idempotent: does
# nothing when every package is present. As root it installs with no prompt; as another user it
# lists what is missing and exits 1.
set -euo pipefail

PACKAGES=(
  # build
  meson ninja-build pkg-config gcc python3 protobuf-c-compiler
  # libraries
  libfabric-dev libfabric-bin libprotobuf-c-dev libinih-dev libturbojpeg0-dev libpng-dev
  libssl-dev libopenblas-dev libdnnl-dev
  # model export: safetensors headers (JSON), ONNX's onnx.proto (compiled by protoc-c)
  libjansson-dev libonnx-dev
  # metrics: the /metrics endpoint (HTTP server), pfcps top (HTTP client)
  libmicrohttpd-dev libcurl4-openssl-dev
  # arcface_torch's checkpoints (torch.save writes a zip archive)
  libzip-dev
  # tests: unit framework, fuzzing and sanitizers with clang
  libcmocka-dev clang libclang-rt-14-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "setup-deps: missing Debian packages: ${missing[*]}" >&2
  echo "setup-deps: run as root, or: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi

echo "setup-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup-deps: done"
