#!/usr/bin/env bash
# Whole models side by side: `fusebox bench` and bench/torch_train.py (PyTorch eager,
# torch.compile, CUDA-graph replay) on the same GPU, model, batch and precision (the targets
# of issues 12 and 13). Writes one JSON per run into OUT and prints the table.
#   bench/models.sh OUT FUSEBOX_BINARY [all|fusebox|torch|table]
# fusebox / torch: one side only (the table joins whatever JSON OUT holds); table: no runs.
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1; fb=$2; sides=${3:-all}
mkdir -p "$out"
status=0
# The plan cache starts empty (a cold compile), then is reused (warm).
export FUSEBOX_CACHE_DIR=$(mktemp -d)

run_fb() {  # name, then fusebox bench arguments
  local name=$1; shift
  [ "$sides" = all ] || [ "$sides" = fusebox ] || return 0
  echo "-- fusebox bench $*"
  "$fb" bench "$@" --json "$out/fb_$name.json" || status=1
}
run_torch() {  # name, then torch_train.py arguments
  local name=$1; shift
  [ "$sides" = all ] || [ "$sides" = torch ] || return 0
  echo "-- torch_train.py $*"
  python3 bench/torch_train.py "$@" --json "$out/torch_$name.json" || status=1
}

run_fb train_bf16_256_cold resnet50 --mode train --batch 256 --precision bf16 --device cuda
run_fb train_bf16_256 resnet50 --mode train --batch 256 --precision bf16 --device cuda
run_fb train_tf32_128 resnet50 --mode train --batch 128 --precision tf32 --device cuda
run_fb infer_bf16_256 resnet50 --mode infer --batch 256 --precision bf16 --device cuda --report
# The same with the inference fusions off (issue 13: what the fusion pass gains).
FUSEBOX_FUSION=0 run_fb infer_bf16_256_unfused resnet50 --mode infer --batch 256 --precision bf16 \
  --device cuda
run_fb infer_tf32_256 resnet50 --mode infer --batch 256 --precision tf32 --device cuda
run_fb host_tiny small_cnn --mode train --batch 8 --image-size 32 --num-classes 10 \
  --device cuda --steps 200
run_torch train_bf16_256 --model resnet50 --mode train --batch 256 --precision bf16 --steps 30 \
  --warmup 5 --compile both
run_torch train_tf32_128 --model resnet50 --mode train --batch 128 --precision tf32 --steps 30 \
  --warmup 5
run_torch infer_bf16_256 --model resnet50 --mode infer --batch 256 --precision bf16 --steps 30 \
  --warmup 5 --cuda-graph
run_torch infer_tf32_256 --model resnet50 --mode infer --batch 256 --precision tf32 --steps 30 \
  --warmup 5 --cuda-graph

python3 - "$out" <<'PY' || status=1
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
def load(name):
    p = out / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None
print(f"{'workload':28} {'fusebox img/s':>14} {'torch variant':>16} {'torch img/s':>12} {'ratio':>7}")
for key in ("train_bf16_256", "train_tf32_128", "infer_bf16_256", "infer_bf16_256_unfused",
            "infer_tf32_256"):
    fb = load("fb_" + key); th = load("torch_" + key.replace("_unfused", ""))
    fbs = fb["images_per_s"] if fb else float("nan")
    for v in (th or {}).get("variants", [{"variant": "-", "images_per_s": float("nan")}]):
        ts = v.get("images_per_s") or float("nan")
        print(f"{key:28} {fbs:14.1f} {v.get('variant', v.get('name', '?')):>16} {ts:12.1f} {fbs / ts:7.3f}")
for key in ("train_bf16_256_cold", "train_bf16_256", "train_tf32_128", "host_tiny"):
    fb = load("fb_" + key)
    if fb:
        print(f"{key:28} compile {fb['compile_s']:.2f} s, host {fb['host_us_per_step']:.1f} us/step, "
              f"peak {fb['peak_device_bytes'] / 2**30:.2f} GiB, median {fb['step_ms_median']:.3f} ms")
PY
rm -rf "$FUSEBOX_CACHE_DIR"
exit $status
