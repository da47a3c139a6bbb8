#!/usr/bin/env bash
# Issue 43's benchmark (bench/cpu_vs_onnxruntime.py) on the GPU machine's CPU cores, where no
# build of the fast CPU path exists (the GPU image has no oneDNN) and nothing can be fetched.
#
#   scripts/cpu_bench_gpu_machine.sh pack            # here: fills .cpu16/ (git-ignored, ~46 MB)
#   scripts/cpu_bench_gpu_machine.sh run OUT [ARGS]  # there: ARGS go to cpu_vs_onnxruntime.py
#
# pack: this machine's release CLI (stripped, xz), oneDNN's library, libjpeg.so.62 and libpng16 (the
# Debian libraries the CLI links that the Ubuntu image lacks; libprotobuf and libonnx_proto
# come from .gpudeps/usr, docs/gpu.md), and the onnxruntime wheel that setup.sh pins, for the
# GPU image's Python 3.12, from PyPI. Carry `.cpu16` and `.gpudeps/usr` (not .deps: no build).
# run: unpacks, the wheel into .cpu16/py too (no dependencies: numpy is the image's), and
# runs the benchmark with every core unless ARGS say otherwise; table and JSON into OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
pack_dir=.cpu16
case "${1:-}" in
  pack)
    [ -x build/release/tools/fusebox ] || { echo "build first (scripts/build.sh)" >&2; exit 1; }
    ort_version=$(sed -n 's/^ORT_VERSION=\([^ ]*\).*/\1/p' scripts/setup.sh | head -n 1)
    rm -rf "$pack_dir" && mkdir -p "$pack_dir/wheel"
    strip -o "$pack_dir/fusebox" build/release/tools/fusebox
    xz -3 -T0 "$pack_dir/fusebox"
    xz -3 -T0 -c "$(readlink -f .deps-cpu/onednn/lib/libdnnl.so.3)" > "$pack_dir/libdnnl.so.3.xz"
    cp -L /lib/x86_64-linux-gnu/libjpeg.so.62 /lib/x86_64-linux-gnu/libpng16.so.16 "$pack_dir/"
    "$(ls -d .venv-ort-*/bin/python | head -n 1)" -m pip download "onnxruntime==$ort_version" --no-deps --only-binary=:all: \
      --python-version 3.12 --platform manylinux_2_27_x86_64 -d "$pack_dir/wheel" > /dev/null
    du -sh "$pack_dir"
    ;;
  run)
    out=${2:?usage: $0 run OUT [ARGS...]}
    shift 2
    mkdir -p "$out"
    [ -f "$pack_dir/fusebox" ] || xz -d -k "$pack_dir/fusebox.xz"
    [ -f "$pack_dir/libdnnl.so.3" ] || xz -d -c "$pack_dir/libdnnl.so.3.xz" > "$pack_dir/libdnnl.so.3"
    chmod +x "$pack_dir/fusebox"
    # A wheel is a zip of the installed files: unpacked, it is importable (pip may be absent).
    [ -d "$pack_dir/py/onnxruntime" ] || python3 -m zipfile -e "$pack_dir"/wheel/*.whl "$pack_dir/py"
    cudnn_dir=$(python3 -c 'import nvidia.cudnn; print(list(nvidia.cudnn.__path__)[0])' 2>/dev/null || true)
    export LD_LIBRARY_PATH="$PWD/$pack_dir:$PWD/.gpudeps/usr/lib/x86_64-linux-gnu:${cudnn_dir:+$cudnn_dir/lib:}/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
    export PYTHONPATH="$PWD/$pack_dir/py${PYTHONPATH:+:$PYTHONPATH}"
    "$pack_dir/fusebox" --version
    lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket|Flags)' | cut -c1-160 > "$out/cpu.txt" || true
    python3 bench/cpu_vs_onnxruntime.py --fusebox "$pack_dir/fusebox" --no-reference \
      --json "$out/cpu_vs_onnxruntime.json" "$@" 2>&1 | tee "$out/cpu_vs_onnxruntime.txt"
    ;;
  *)
    echo "usage: $0 pack | run OUT [ARGS...]" >&2
    exit 2
    ;;
esac
