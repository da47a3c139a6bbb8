#!/usr/bin/env bash
# Compiles bench/probes/cudnn_fusions.cpp (against cudnn-frontend, cuDNN and the CUDA runtime)
# and runs it: '#' header lines, then one 'CASE ...' line per case on stdout (the format is in
# the header of the .cpp). The build log goes to stderr.
#
#   bench/probes/cudnn_fusions.sh [--build-only] [--filter a,b] [--dtype bf16|f16|both]
#                                [--iters N] [--warmup N] [--check-n N] [--no-check] [--list]
#
# Environment (default):
#   CUDA_HOME          the CUDA toolkit (/usr/local/cuda)
#   CUDNN_FE_INCLUDE   cudnn-frontend's include dir (.deps/cudnn_frontend/include of this
#                      checkout, else the first cudnn_frontend.h found under .deps/)
#   CUDNN_INCLUDE_DIR  the dir of cudnn.h (none: the one in $CUDA_HOME/include)
#   CUDNN_LIB_DIR      the dir of libcudnn.so* (none: $CUDA_HOME/lib64); -L, rpath, and
#                      LD_LIBRARY_PATH for the run
#   CXX                the compiler (g++; nvcc works too)
#   PROBE_BIN          the binary (out/probe_cudnn_fusions/probe_cudnn_fusions; out/ is ignored
#                      by git). Rebuilt when the source or the compile command changes.
#
# cuDNN from the Python wheel (as on the H100):
#   d=$(python3 -c 'import nvidia.cudnn, os; print(os.path.dirname(nvidia.cudnn.__file__))')
#   CUDNN_INCLUDE_DIR=$d/include CUDNN_LIB_DIR=$d/lib bench/probes/cudnn_fusions.sh > probe.txt
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
src=$repo/bench/probes/cudnn_fusions.cpp
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
CXX=${CXX:-g++}
bin=${PROBE_BIN:-$repo/out/probe_cudnn_fusions/probe_cudnn_fusions}

if [ -z "${CUDNN_FE_INCLUDE:-}" ]; then
  if [ -f "$repo/.deps/cudnn_frontend/include/cudnn_frontend.h" ]; then
    CUDNN_FE_INCLUDE=$repo/.deps/cudnn_frontend/include
  else
    header=$(find "$repo/.deps" -name cudnn_frontend.h -print -quit 2>/dev/null || true)
    CUDNN_FE_INCLUDE=${header:+$(dirname "$header")}
  fi
fi
if [ ! -f "${CUDNN_FE_INCLUDE:-}/cudnn_frontend.h" ]; then
  echo "probe: cudnn_frontend.h not found (set CUDNN_FE_INCLUDE, or run scripts/setup.sh)" >&2
  exit 1
fi

build_only=0
args=()
for a in "$@"; do
  if [ "$a" = --build-only ]; then build_only=1; else args+=("$a"); fi
done

# nvcc takes linker options through -Xlinker and host-compiler ones through -Xcompiler.
is_nvcc=0
case "$(basename "$CXX")" in nvcc*) is_nvcc=1 ;; esac
link() { if [ $is_nvcc = 1 ]; then printf -- '-Xlinker\n%s\n' "$1"; else printf -- '-Wl,%s\n' "$1"; fi; }

flags=(-std=c++20 -O2)
if [ $is_nvcc = 1 ]; then flags+=(-Xcompiler=-Wall); else flags+=(-Wall -Wextra -Wno-missing-field-initializers); fi
# cuDNN's own headers first (a wheel's cudnn.h over the toolkit's), then the frontend, then CUDA.
inc=()
[ -n "${CUDNN_INCLUDE_DIR:-}" ] && inc+=(-isystem "$CUDNN_INCLUDE_DIR")
inc+=(-isystem "$CUDNN_FE_INCLUDE" -isystem "$CUDA_HOME/include")
libs=()
libdirs=()
if [ -n "${CUDNN_LIB_DIR:-}" ]; then
  libdirs+=("$CUDNN_LIB_DIR")
  libs+=(-L"$CUDNN_LIB_DIR")
  # A wheel ships libcudnn.so.9 without the unversioned link.
  if [ -e "$CUDNN_LIB_DIR/libcudnn.so" ]; then libs+=(-lcudnn); else libs+=(-l:libcudnn.so.9); fi
else
  libs+=(-lcudnn)
fi
libdirs+=("$CUDA_HOME/lib64")
libs+=(-L"$CUDA_HOME/lib64" -lcudart -lnvrtc -ldl -lpthread)  # the frontend calls NVRTC itself
for d in "${libdirs[@]}"; do
  while IFS= read -r f; do libs+=("$f"); done < <(link "-rpath,$d")
done

cmd=("$CXX" "${flags[@]}" "${inc[@]}" "$src" -o "$bin" "${libs[@]}")
if [ ! -x "$bin" ] || [ "$src" -nt "$bin" ] || [ "$(cat "$bin.cmd" 2>/dev/null)" != "${cmd[*]}" ]; then
  mkdir -p "$(dirname "$bin")"
  echo "probe: ${cmd[*]}" >&2
  "${cmd[@]}"
  printf '%s' "${cmd[*]}" > "$bin.cmd"
fi
echo "probe: built $bin" >&2
[ $build_only = 1 ] && exit 0

export LD_LIBRARY_PATH="${CUDNN_LIB_DIR:+$CUDNN_LIB_DIR:}$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$bin" "${args[@]}"
