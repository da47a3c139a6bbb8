#!/usr/bin/env bash
# Installs everything fusebox needs on a fresh Debian 12 machine (idempotent: a
# second run checks and does nothing). Needs root (apt). Reaches only Debian's
# package mirrors and PyPI.
#
#   scripts/setup.sh            # packages + .deps/ (cudnn-frontend headers)
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages: compilers and build tools, test/bench libraries, protobuf +
# ONNX (the importer's proto classes and the ONNX node test data), CLI11, zlib.
PACKAGES=(build-essential cmake ninja-build ccache pkg-config git unzip
          libgtest-dev libgmock-dev libbenchmark-dev
          libprotobuf-dev protobuf-compiler libonnx-dev libonnx-testdata
          libcli11-dev zlib1g-dev clang-format python3-pip)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# cudnn-frontend C++ headers: taken (headers only) from the pinned PyPI wheel,
# whose top-level include/ folder holds them. 1.23.0 is the version probed
# against cuDNN 9.19 on the H100 (shared/research/cudnn_frontend.md).
CUDNN_FE_VERSION=1.23.0
FE_DIR=.deps/cudnn_frontend-$CUDNN_FE_VERSION
if [ ! -f "$FE_DIR/include/cudnn_frontend.h" ]; then
  echo "setup: fetching cudnn-frontend $CUDNN_FE_VERSION headers"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    -d "$tmp" "nvidia-cudnn-frontend==$CUDNN_FE_VERSION"
  wheel=$(ls "$tmp"/nvidia_cudnn_frontend-*.whl | head -n 1)
  rm -rf "$FE_DIR.partial"
  mkdir -p "$FE_DIR.partial"
  unzip -q "$wheel" 'include/*' -d "$FE_DIR.partial"
  test -f "$FE_DIR.partial/include/cudnn_frontend.h"
  rm -rf "$FE_DIR"
  mv "$FE_DIR.partial" "$FE_DIR"
fi
ln -sfn "cudnn_frontend-$CUDNN_FE_VERSION" .deps/cudnn_frontend
echo "setup: ok (cudnn-frontend $CUDNN_FE_VERSION headers in .deps/cudnn_frontend/include)"
