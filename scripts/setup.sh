#!/usr/bin/env bash
# Installs everything fusebox needs on a fresh Debian 12 machine (idempotent: a
# second run checks and does nothing). Needs root (apt). Reaches only Debian's
# package mirrors and PyPI.
#
#   scripts/setup.sh            # packages + .deps/ (cudnn-frontend, CUTLASS and NCCL headers)
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages: compilers and build tools, test/bench libraries, protobuf +
# ONNX (the importer's proto classes and the ONNX node test data), CLI11, zlib, libpng and
# libjpeg-turbo (training images decoded on the CPU), Python's headers
# (the Python package's extension module), Open MPI
# (the CPU backend's data-parallel collectives and their tests, docs/distributed.md), clang
# with libFuzzer and the sanitizer runtimes (scripts/fuzz.sh, docs/fuzzing.md).
PACKAGES=(build-essential cmake ninja-build ccache pkg-config git unzip
          libgtest-dev libgmock-dev libbenchmark-dev
          libprotobuf-dev protobuf-compiler libonnx-dev libonnx-testdata
          libcli11-dev zlib1g-dev libpng-dev libjpeg62-turbo-dev
          clang-format python3-pip python3-venv python3-dev
          openmpi-bin libopenmpi-dev clang libclang-rt-dev)
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

# The header-only GPU libraries come from pinned PyPI wheels: fetch_wheel SPEC [PIP_ARGS...]
# downloads one (no dependencies) into a fresh folder under $wheels and prints its path.
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
fetch_wheel() {
  local spec=$1 dir
  shift
  dir=$(mktemp -d -p "$wheels")
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$dir" "$@" "$spec" >&2 || return 1
  ls "$dir"/*.whl
}

# wheel_headers DIR HEADER FOLDER SPEC [PIP_ARGS...]: unless DIR/include/HEADER exists, fetches
# the pinned wheel SPEC and unpacks its FOLDER (a folder of headers) as DIR/include.
wheel_headers() {
  local dir=$1 header=$2 folder=$3 spec=$4 wheel
  shift 4
  [ -f "$dir/include/$header" ] && return 0
  echo "setup: fetching $spec headers"
  wheel=$(fetch_wheel "$spec" "$@")
  rm -rf "$dir.partial"
  mkdir -p "$dir.partial/x"
  unzip -q "$wheel" "$folder/*" -d "$dir.partial/x"
  mv "$dir.partial/x/$folder" "$dir.partial/include"
  rm -rf "$dir.partial/x"
  test -f "$dir.partial/include/$header"
  rm -rf "$dir"
  mv "$dir.partial" "$dir"
}

# cudnn-frontend C++ headers: taken (headers only) from the pinned PyPI wheel,
# whose top-level include/ folder holds them. 1.23.0 is the version probed
# against cuDNN 9.19 on the H100 (shared/research/cudnn_frontend.md).
CUDNN_FE_VERSION=1.23.0
wheel_headers ".deps/cudnn_frontend-$CUDNN_FE_VERSION" cudnn_frontend.h include \
  "nvidia-cudnn-frontend==$CUDNN_FE_VERSION" --python-version 3.11 \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
ln -sfn "cudnn_frontend-$CUDNN_FE_VERSION" .deps/cudnn_frontend

# CUTLASS / CuTe C++ headers (the Hopper convolutions,
# src/backends/cuda/kernels/conv/engines/cutlass/):
# taken from the pinned PyPI wheel, which carries CUTLASS's source under
# cutlass_library/source/. include/ plus tools/util/include/cutlass/util (packed_stride.hpp,
# which the conv collectives include) merged into one include folder.
CUTLASS_VERSION=4.2.0.0
CUTLASS_DIR=.deps/cutlass-$CUTLASS_VERSION
if [ ! -f "$CUTLASS_DIR/include/cutlass/util/packed_stride.hpp" ]; then
  echo "setup: fetching CUTLASS $CUTLASS_VERSION headers"
  wheel=$(fetch_wheel "nvidia-cutlass==$CUTLASS_VERSION")
  source_dir=$(dirname "$wheel")/x/cutlass_library/source
  unzip -q "$wheel" 'cutlass_library/source/include/*' \
    'cutlass_library/source/tools/util/include/cutlass/util/*' -d "$(dirname "$wheel")/x"
  rm -rf "$CUTLASS_DIR.partial"
  mkdir -p "$CUTLASS_DIR.partial"
  mv "$source_dir/include" "$CUTLASS_DIR.partial/include"
  mv "$source_dir/tools/util/include/cutlass/util" \
    "$CUTLASS_DIR.partial/include/cutlass/util"
  test -f "$CUTLASS_DIR.partial/include/cute/tensor.hpp"
  rm -rf "$CUTLASS_DIR"
  mv "$CUTLASS_DIR.partial" "$CUTLASS_DIR"
fi
ln -sfn "cutlass-$CUTLASS_VERSION" .deps/cutlass

# NCCL's headers (backends/cuda/runtime/nccl.cpp; the library is loaded at run time: on the GPU
# machines the PyTorch environment's). 2.28.9 is the NCCL PyTorch 2.11 loads there: one NCCL
# throughout (docs/distributed.md).
NCCL_VERSION=2.28.9
wheel_headers ".deps/nccl-$NCCL_VERSION" nccl.h nvidia/nccl/include \
  "nvidia-nccl-cu13==$NCCL_VERSION" --python-version 3.11 \
  --platform manylinux_2_18_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
ln -sfn "nccl-$NCCL_VERSION" .deps/nccl

# oneDNN (the fast CPU backend, src/backends/cpu_fast/): headers and libdnnl.so from the pinned
# PyPI wheels of oneDNN 3.2 built with GNU OpenMP (onednn-devel-cpu-gomp + onednn-cpu-gomp
# 2023.2.0; self-contained: it needs only libgomp). Why these: the v3 API (Debian 12's
# libdnnl-dev is 2.6, the older v2 API), and the newer PyPI `onednn` wheels are the SYCL build
# (DPC++ and OpenCL runtimes). Into .deps-cpu/, not .deps/: the GPU runs carry .deps/ (a
# 64 MiB limit) and libdnnl.so alone is 52 MiB.
ONEDNN_VERSION=2023.2.0
ONEDNN_DIR=.deps-cpu/onednn-$ONEDNN_VERSION
if [ ! -f "$ONEDNN_DIR/lib/libdnnl.so.3" ] || [ ! -f "$ONEDNN_DIR/include/oneapi/dnnl/dnnl.hpp" ]; then
  echo "setup: fetching oneDNN $ONEDNN_VERSION (cpu, gomp)"
  lib_wheel=$(fetch_wheel "onednn-cpu-gomp==$ONEDNN_VERSION")
  dev_wheel=$(fetch_wheel "onednn-devel-cpu-gomp==$ONEDNN_VERSION")
  rm -rf "$ONEDNN_DIR.partial"
  mkdir -p "$ONEDNN_DIR.partial/x"
  unzip -q "$lib_wheel" -d "$ONEDNN_DIR.partial/x"
  unzip -q "$dev_wheel" -d "$ONEDNN_DIR.partial/x"
  mv "$ONEDNN_DIR.partial/x/onednn_devel_cpu_gomp-$ONEDNN_VERSION.data/data/include" "$ONEDNN_DIR.partial/include"
  mkdir -p "$ONEDNN_DIR.partial/lib"
  # The wheel holds the library three times (no symlinks in a zip): keep one, link the names.
  mv "$ONEDNN_DIR.partial/x/onednn_cpu_gomp-$ONEDNN_VERSION.data/data/lib/libdnnl.so.3.2" "$ONEDNN_DIR.partial/lib/"
  ln -s libdnnl.so.3.2 "$ONEDNN_DIR.partial/lib/libdnnl.so.3"
  ln -s libdnnl.so.3 "$ONEDNN_DIR.partial/lib/libdnnl.so"
  rm -rf "$ONEDNN_DIR.partial/x"
  test -f "$ONEDNN_DIR.partial/include/oneapi/dnnl/dnnl.hpp"
  rm -rf "$ONEDNN_DIR"
  mv "$ONEDNN_DIR.partial" "$ONEDNN_DIR"
fi
ln -sfn "onednn-$ONEDNN_VERSION" .deps-cpu/onednn

# onnxruntime (CPU), onnx and numpy for the cross-check of the CPU backend
# (tests/onnxruntime/crosscheck.py), pinned, from PyPI, in a virtual environment .venv (not
# under .deps/: 300 MB that the GPU runs need not carry).
ORT_VERSION=1.20.1 ONNX_PY_VERSION=1.17.0 NUMPY_VERSION=1.26.4
VENV=.venv-ort-$ORT_VERSION
if ! "$VENV/bin/python" -c "import onnxruntime, onnx, numpy" 2>/dev/null; then
  echo "setup: installing onnxruntime $ORT_VERSION, onnx $ONNX_PY_VERSION, numpy $NUMPY_VERSION into $VENV"
  rm -rf "$VENV.partial"
  /usr/bin/python3 -m venv "$VENV.partial"
  "$VENV.partial/bin/python" -m pip install -q --disable-pip-version-check --only-binary=:all: \
    "onnxruntime==$ORT_VERSION" "onnx==$ONNX_PY_VERSION" "numpy==$NUMPY_VERSION"
  rm -rf "$VENV"
  mv "$VENV.partial" "$VENV"
fi
ln -sfn "$VENV" .venv

# The Python package (python/, docs/python.md): nanobind (the binding; CMake finds it through
# `.venv/bin/python -m nanobind --cmake_dir`), scikit-build-core (`pip install .`) and pytest
# (tests/python), pinned, into the same .venv (numpy is the one above).
NANOBIND_VERSION=3.1.0 SKBUILD_CORE_VERSION=1.1.2 PYTEST_VERSION=9.2.0
PYTHON_PINS=("nanobind==$NANOBIND_VERSION" "scikit-build-core==$SKBUILD_CORE_VERSION"
             "pytest==$PYTEST_VERSION")
if ! "$VENV/bin/python" - "${PYTHON_PINS[@]}" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
for pin in sys.argv[1:]:
    name, wanted = pin.split("==")
    try:
        if version(name) != wanted:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
PY
then
  echo "setup: installing ${PYTHON_PINS[*]} into $VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --only-binary=:all: \
    "${PYTHON_PINS[@]}"
fi
echo "setup: ok (cudnn-frontend $CUDNN_FE_VERSION, CUTLASS $CUTLASS_VERSION, NCCL $NCCL_VERSION headers in .deps/;" \
  "oneDNN $ONEDNN_VERSION in .deps-cpu/; onnxruntime $ORT_VERSION, nanobind $NANOBIND_VERSION," \
  "scikit-build-core $SKBUILD_CORE_VERSION, pytest $PYTEST_VERSION in .venv)"
