#!/usr/bin/env bash
# Configures and builds one CMake preset (default: release), all of it or the named
# targets. Usage: scripts/build.sh [preset] [target...]
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-release}
shift || true
if [ ! -f "build/$preset/build.ninja" ]; then
  # Without a GPU the CUDA code is compiled to PTX only (CMakeLists.txt: FUSEBOX_CUDA_SASS),
  # unless FUSEBOX_CUDA_SASS=ON asks for machine code anyway.
  sass=${FUSEBOX_CUDA_SASS:-}
  if [ -z "$sass" ]; then
    if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then sass=ON; else sass=OFF; fi
  fi
  [ "$sass" = ON ] || echo "build.sh: no GPU here: CUDA code compiled to PTX only (FUSEBOX_CUDA_SASS=ON for machine code)"
  cmake --preset "$preset" -DFUSEBOX_CUDA_SASS="$sass" >/dev/null
fi
if (($#)); then
  cmake --build --preset "$preset" --target "$@"
else
  cmake --build --preset "$preset"
fi
