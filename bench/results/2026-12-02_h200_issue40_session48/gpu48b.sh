#!/usr/bin/env bash
# Session 48 call 2: the relu-less residual norms keep their dy (no copy); fold_gradient_sums'
# write_sum form; tests again, then the train cells of the other residual-BN models.
set -uo pipefail
OUT=${OUT:-out/g}
C=${GPU_CHECK_COMMIT:-wip}
GPU_CHECK_COMMIT=$C GPU_CHECK_PARTS=none \
GPU_CHECK_TESTS="fusebox_cuda_tests:BatchNormChannelsLast*:*BatchNorm* fusebox_passes_tests:* fusebox_cpu_tests:CpuBatchNorm*:*Norm* fusebox_ir_tests:* fusebox_train_tests:CudaTraining.*:TrainSession.Resnet18* fusebox_executable_tests:*ResNet18*" \
GPU_CHECK_CELLS="train:mobilenet_v3_large train:resnext50_32x4d train:efficientnet_b0 train:resnet50" GPU_CHECK_CELLS_LIMIT=440 timeout 570 scripts/gpu_check.sh "$OUT"
echo "== end at $SECONDS s"
