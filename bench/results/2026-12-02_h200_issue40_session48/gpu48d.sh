#!/usr/bin/env bash
# Session 48 call 4 (A/B, part B, same machine right after part A): the tree before this
# session's change (e88bf8d: the changed files' old versions from scratch/base, the new files
# removed), rebuilt, then its efficientnet_b0 and resnet50 train cells.
set -uo pipefail
OUT=${OUT:-out/g}
cp -r scratch/base/. .
rm -f src/passes/fusion/fold_gradient_sums.cpp tests/unit/passes/fold_gradient_sums_test.cpp
rm -rf out/cells_train out/cells_infer
GPU_CHECK_COMMIT=e88bf8d GPU_CHECK_PARTS=none GPU_CHECK_TARGETS="fusebox" \
GPU_CHECK_CELLS="train:efficientnet_b0 train:resnet50" timeout 580 scripts/gpu_check.sh "$OUT"
echo "== end at $SECONDS s"
