#!/usr/bin/env bash
# Set up, build and run every test (unit, ONNX conformance; GPU tests skip with a
# message when there is no GPU). Usage: scripts/test.sh [release|asan]
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-release}
scripts/setup.sh
scripts/build.sh "$preset"
ctest --test-dir "build/$preset" --output-on-failure -j "$(nproc)"
