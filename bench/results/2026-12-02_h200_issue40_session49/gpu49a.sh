#!/usr/bin/env bash
# Session 49 call 1: 54fc8a9 (the fold only where no term is an elementwise op's output) on the
# GPU: passes and training tests; train cells efficientnet_b0, mobilenet_v3_large, resnet50; then
# ResNet-50's training step profiled with every node's engine in JSON (item 5's planning).
set -uo pipefail
OUT=${OUT:-out/g}
GPU_CHECK_COMMIT=${GPU_CHECK_COMMIT:-79c8972} GPU_CHECK_PARTS=none \
GPU_CHECK_TARGETS="fusebox fusebox_passes_tests fusebox_train_tests" \
GPU_CHECK_TESTS="fusebox_passes_tests:* fusebox_train_tests:CudaTraining.*:TrainSession.*" \
GPU_CHECK_CELLS="train:efficientnet_b0 train:mobilenet_v3_large train:resnet50" GPU_CHECK_CELLS_LIMIT=400 \
timeout 500 scripts/gpu_check.sh "$OUT"
echo "== end of gpu_check at $SECONDS s"
cudnn_dir=$(python3 -c 'import nvidia.cudnn; print(list(nvidia.cudnn.__path__)[0])')
export LD_LIBRARY_PATH="$cudnn_dir/lib:$PWD/.gpudeps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export FUSEBOX_CACHE_DIR=out/cache_r50; mkdir -p out/cache_r50
timeout 90 build/gpu/tools/fusebox bench out/cells_train/work/resnet50_train.onnx --mode train \
  --precision bf16 --report --json "$OUT/r50_train_nodes.json" > "$OUT/r50_train_nodes.txt" 2>&1
echo "== r50 nodes rc $? at $SECONDS s"; tail -5 "$OUT/r50_train_nodes.txt"
