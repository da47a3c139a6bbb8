#!/usr/bin/env bash
# Builds fusebox on a GPU machine and runs every GPU test and benchmark, writing logs
# and JSON to $1 (default: out/gpu). Used on the lent H100 (no network there):
#   scripts/gpu_check.sh "$OUT"
# cuDNN: the PyTorch environment's nvidia/cudnn package (9.19) is linked and loaded,
# never the older system copy, so compile-time and run-time versions agree.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-out/gpu}
mkdir -p "$out"
log="$out/gpu_check.log"
exec > >(tee "$log") 2>&1

echo "== $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
cudnn_dir=$(python3 -c 'import nvidia.cudnn, os; print(os.path.dirname(nvidia.cudnn.__file__))' 2>/dev/null \
            || python3 -c 'import nvidia.cudnn; print(list(nvidia.cudnn.__path__)[0])' 2>/dev/null || true)
cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo)
# The GPU image lacks some Debian -dev packages (ONNX, CLI11, GoogleTest): a run there
# carries them unpacked (dpkg -x) in .gpudeps/ (see docs/gpu.md).
if [ -d .gpudeps/usr ]; then
  cmake_args+=(-DCMAKE_PREFIX_PATH="$PWD/.gpudeps/usr;$PWD/.gpudeps/usr/share/cmake"
               -DCMAKE_CXX_FLAGS_INIT="-isystem $PWD/.gpudeps/usr/include")
  export LD_LIBRARY_PATH="$PWD/.gpudeps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
if [ -n "$cudnn_dir" ] && [ -d "$cudnn_dir/lib" ]; then
  echo "cuDNN from $cudnn_dir"
  cmake_args+=(-DCUDNN_LIBRARY="$(ls "$cudnn_dir"/lib/libcudnn.so* | head -n 1)"
               -DCMAKE_CUDA_FLAGS="-I$cudnn_dir/include" -DCMAKE_CXX_FLAGS="-I$cudnn_dir/include -isystem $PWD/.gpudeps/usr/include")
  export LD_LIBRARY_PATH="$cudnn_dir/lib:${LD_LIBRARY_PATH:-}"
fi
cmake -S . -B build/gpu "${cmake_args[@]}" > "$out/configure.log" 2>&1 || { cat "$out/configure.log"; exit 1; }
# -k 0: build every target that can be built, so one broken file does not hide the rest.
if cmake --build build/gpu -j "$(nproc)" -- -k 0 > "$out/build.log" 2>&1; then
  echo "== build ok"
else
  echo "== build FAILED (continuing with what was built):"; grep -A5 "FAILED" "$out/build.log" | head -40
fi

status=0
echo "== GPU tests"
build/gpu/tests/fusebox_cuda_tests --gtest_brief=1 > "$out/cuda_tests.log" 2>&1 || status=1
grep -E "FAILED|PASSED|SKIPPED|tests ran" "$out/cuda_tests.log" | tail -60
echo "== all ctest (CPU + GPU)"
ctest --test-dir build/gpu -j 8 > "$out/ctest.log" 2>&1 || status=1
tail -40 "$out/ctest.log"

echo "== benchmarks"
for b in bench_norms bench_pointwise_chain; do
  [ -x build/gpu/bench/$b ] && build/gpu/bench/$b --json "$out/$b.json" || status=1
done
for p in bench/torch_*.py; do
  [ -f "$p" ] && python3 "$p" --json "$out/$(basename "$p" .py).json" || status=1
done
echo "== done, status $status"
exit $status
