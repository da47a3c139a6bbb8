#!/usr/bin/env bash
# Session 47 call 1: blocked max-pool backward + stem wgrad rule 4: tests, R50 train cell, ncu of the pools.
set -uo pipefail
OUT=${OUT:-out/g}
GPU_CHECK_COMMIT=c89ab45 GPU_CHECK_PARTS=none GPU_CHECK_TARGETS="fusebox fusebox_cuda_tests" \
GPU_CHECK_TESTS="fusebox_cuda_tests:PoolChannelsLast*:BackwardPoolNorm*:*MaxPool*:ImplicitGemmTest.*Stem*:ImplicitGemmTest.*Patch*" \
GPU_CHECK_CELLS="train:resnet50" GPU_CHECK_CELLS_LIMIT=430 scripts/gpu_check.sh "$OUT"
cudnn_dir=$(python3 -c 'import nvidia.cudnn; print(list(nvidia.cudnn.__path__)[0])')
export LD_LIBRARY_PATH="$cudnn_dir/lib:$PWD/.gpudeps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || ls /usr/local/cuda*/bin/ncu | head -1)
echo "== ncu $ncu at $SECONDS s"
FUSEBOX_CUDA_GRAPHS=0 timeout 140 "$ncu" --kernel-name regex:max_pool --launch-count 4 \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
  build/gpu/tools/fusebox bench resnet50 --mode train --precision bf16 --batch 256 --steps 1 --warmup 0 \
  > "$OUT/ncu_pool.txt" 2>&1
echo "ncu rc $? at $SECONDS s"; grep -E "max_pool|Duration|Memory Throughput|Registers Per|Achieved Occ" "$OUT/ncu_pool.txt" | head -40
