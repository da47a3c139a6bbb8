#!/usr/bin/env bash
# Session 47 call 2: PDL (launch_early) + blocked pool gather v2: tests, R50 train A/B (FUSEBOX_CUDA_PDL), cell.
set -uo pipefail
OUT=${OUT:-out/g}
C=${GPU_CHECK_COMMIT:-wip}
GPU_CHECK_COMMIT=$C GPU_CHECK_PARTS=none GPU_CHECK_TARGETS="fusebox fusebox_cuda_tests fusebox_executable_tests" \
GPU_CHECK_TESTS="fusebox_cuda_tests:EncoderHazards.*:EncoderReplay.*:EncoderCache.*:*BatchNorm*:*Pool*:*Fused*:*Pointwise*:ImplicitGemmTest.*Stem* fusebox_executable_tests:*" \
  timeout 420 scripts/gpu_check.sh "$OUT"
cudnn_dir=$(python3 -c 'import nvidia.cudnn; print(list(nvidia.cudnn.__path__)[0])')
export LD_LIBRARY_PATH="$cudnn_dir/lib:$PWD/.gpudeps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fb=build/gpu/tools/fusebox
for pdl in 1 0 1 0; do
  echo "== resnet50 train bf16 b256 FUSEBOX_CUDA_PDL=$pdl at $SECONDS s"
  FUSEBOX_CUDA_PDL=$pdl timeout 60 $fb bench resnet50 --mode train --precision bf16 --batch 256 --steps 30 --warmup 5 2>&1 | grep -E "ms/step|images/s|error|Error" | head -4
done
for pdl in 1 0; do
  echo "== resnet50 infer bf16 b256 FUSEBOX_CUDA_PDL=$pdl at $SECONDS s"
  FUSEBOX_CUDA_PDL=$pdl timeout 60 $fb bench resnet50 --precision bf16 --batch 256 --steps 30 --warmup 5 2>&1 | grep -E "ms/step|images/s|error|Error" | head -3
done
if [ "$SECONDS" -lt 470 ]; then
  GPU_CHECK_COMMIT=$C GPU_CHECK_PARTS=none GPU_CHECK_TARGETS="fusebox" GPU_CHECK_CELLS="train:resnet50" \
  GPU_CHECK_CELLS_LIMIT=40 timeout $((590 - SECONDS)) scripts/gpu_check.sh "$OUT/cells" | grep -v "^==.*build"
fi
echo "== end at $SECONDS s"
