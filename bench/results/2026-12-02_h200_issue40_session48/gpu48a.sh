#!/usr/bin/env bash
# Session 48 call 1: batch_norm_backward's two-term dy and dy_output (the relu_dx programs
# folded into the residual norms' backward): tests on the GPU and CPU, then the R50 train cell.
set -uo pipefail
OUT=${OUT:-out/g}
C=${GPU_CHECK_COMMIT:-wip}
GPU_CHECK_COMMIT=$C GPU_CHECK_PARTS=none \
GPU_CHECK_TESTS="fusebox_cuda_tests:BatchNormChannelsLast*:*BatchNorm*:ImplicitGemmTest.*TimedByDefault* fusebox_passes_tests:* fusebox_cpu_tests:CpuBatchNorm*:*Norm* fusebox_ir_tests:* fusebox_train_tests:CudaTraining.*:TrainSession.Resnet18* fusebox_executable_tests:*ResNet18*" \
GPU_CHECK_CELLS="train:resnet50" GPU_CHECK_CELLS_LIMIT=470 timeout 560 scripts/gpu_check.sh "$OUT"
echo "== end at $SECONDS s"
