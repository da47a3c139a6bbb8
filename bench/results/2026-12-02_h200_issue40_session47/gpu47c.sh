#!/usr/bin/env bash
# Session 47 call 3: packed small max pool + blocked gather (no PDL): pool tests, ncu of the pools, cells.
set -uo pipefail
OUT=${OUT:-out/g}
C=${GPU_CHECK_COMMIT:-wip}
GPU_CHECK_COMMIT=$C GPU_CHECK_PARTS=none GPU_CHECK_TARGETS="fusebox fusebox_cuda_tests" \
GPU_CHECK_TESTS="fusebox_cuda_tests:*Pool*:ImplicitGemmTest.*Stem*:EncoderHazards.*" \
  timeout 330 scripts/gpu_check.sh "$OUT"
cudnn_dir=$(python3 -c 'import nvidia.cudnn; print(list(nvidia.cudnn.__path__)[0])')
export LD_LIBRARY_PATH="$cudnn_dir/lib:$PWD/.gpudeps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
echo "== ncu at $SECONDS s"
FUSEBOX_CUDA_GRAPHS=0 timeout 60 /usr/local/cuda/bin/ncu --kernel-name regex:max_pool --launch-count 3 \
  --section SpeedOfLight --section Occupancy build/gpu/tools/fusebox bench resnet50 --mode train \
  --precision bf16 --batch 256 --steps 1 --warmup 0 > "$OUT/ncu_pool.txt" 2>&1
grep -E "^  void|Duration|DRAM Throughput|Compute \(SM\) Throughput|Registers Per" "$OUT/ncu_pool.txt" | sed 's/(PoolWindow.*//' | head -20
echo "== cells at $SECONDS s"
GPU_CHECK_COMMIT=$C GPU_CHECK_PARTS=none GPU_CHECK_TARGETS="fusebox" GPU_CHECK_CELLS="train:resnet50 infer:resnet50 train:densenet121" \
  GPU_CHECK_CELLS_LIMIT=$((560 - SECONDS)) timeout $((585 - SECONDS)) scripts/gpu_check.sh "$OUT/cells" | grep -v "build ok"
echo "== end at $SECONDS s"
