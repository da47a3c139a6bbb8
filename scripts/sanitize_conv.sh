#!/usr/bin/env bash
# compute-sanitizer's memcheck and racecheck over the project's convolution kernels (the
# implicit GEMM's main loops and index maps, the depthwise kernels): the
# ImplicitGemmTest.SanitizerSample test of a GPU build. GPU machines only:
#   scripts/sanitize_conv.sh OUT_DIR [TEST_BINARY]
# Writes OUT_DIR/memcheck.log and OUT_DIR/racecheck.log; exits non-zero when a tool reports
# an error or the test fails.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-out/sanitize}
bin=${2:-build/gpu/tests/fusebox_cuda_tests}
mkdir -p "$out"
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
status=0
for tool in memcheck racecheck; do
  "$sanitizer" --tool "$tool" --error-exitcode 99 "$bin" --gtest_brief=1 \
    --gtest_filter='ImplicitGemmTest.SanitizerSample:ImplicitGemmTest.CutlassLoweringsMatchCpu' > "$out/$tool.log" 2>&1
  rc=$?
  echo "== compute-sanitizer --tool $tool: exit $rc"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$out/$tool.log" | tail -4
  [ "$rc" -eq 0 ] || status=1
done
exit $status
