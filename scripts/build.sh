#!/usr/bin/env bash
# Configures and builds one CMake preset (default: release), all of it or the named
# targets. Usage: scripts/build.sh [preset] [target...]
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-release}
shift || true
if [ ! -f "build/$preset/build.ninja" ]; then
  cmake --preset "$preset" >/dev/null
fi
if (($#)); then
  cmake --build --preset "$preset" --target "$@"
else
  cmake --build --preset "$preset"
fi
