#!/usr/bin/env bash
# Session 48 call 3 (A/B, part A): this tree's efficientnet_b0 train cell.
set -uo pipefail
OUT=${OUT:-out/g}
GPU_CHECK_COMMIT=${GPU_CHECK_COMMIT:-wip} GPU_CHECK_PARTS=none GPU_CHECK_TARGETS="fusebox" \
GPU_CHECK_CELLS="train:efficientnet_b0" timeout 580 scripts/gpu_check.sh "$OUT"
echo "== end at $SECONDS s"
