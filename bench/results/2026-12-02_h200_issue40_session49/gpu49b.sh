#!/usr/bin/env bash
# Session 49 call 3: the whole inference suite (12 models) at 79c8972, fusebox's side against
# PyTorch's committed cells; then zoo resnet50's training step with every node's engine (JSON).
set -uo pipefail
OUT=${OUT:-out/g}
M="resnet50 resnext50_32x4d vit_b_16 swin_t convnext_tiny efficientnet_b0 mobilenet_v3_large regnet_y_1_6gf densenet121 deeplabv3_resnet50 unet gpt2"
C=""; for m in $M; do C="$C infer:$m"; done
GPU_CHECK_COMMIT=${GPU_CHECK_COMMIT:-79c8972} GPU_CHECK_PARTS=none GPU_CHECK_TARGETS="fusebox" \
GPU_CHECK_CELLS="$C" GPU_CHECK_CELLS_LIMIT=470 timeout 540 scripts/gpu_check.sh "$OUT"
echo "== end of gpu_check at $SECONDS s"
[ "$SECONDS" -lt 520 ] || exit 0
cudnn_dir=$(python3 -c 'import nvidia.cudnn; print(list(nvidia.cudnn.__path__)[0])')
export LD_LIBRARY_PATH="$cudnn_dir/lib:$PWD/.gpudeps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
mkdir -p out/c50
FUSEBOX_CACHE_DIR=out/c50 timeout $((585 - SECONDS)) build/gpu/tools/fusebox bench resnet50 --mode train \
  --batch 256 --precision bf16 --report --json "$OUT/r50_train_nodes.json" > "$OUT/r50_train_nodes.txt" 2>&1
echo "== r50 nodes rc $? at $SECONDS s"; grep -E "^(ms/step|images/s)" "$OUT/r50_train_nodes.txt"
