#!/usr/bin/env bash
# Builds fusebox on a GPU machine and runs every GPU test and benchmark, writing logs
# and JSON to $1 (default: out/gpu/<date>_<gpu>_gpu_check, one folder per run, named as
# bench/results/README.md names runs). Used on the lent GPUs (no network there):
#   scripts/gpu_check.sh "$OUT"
# cuDNN: the PyTorch environment's nvidia/cudnn package (9.19) is linked and loaded,
# never the older system copy, so compile-time and run-time versions agree.
set -uo pipefail
cd "$(dirname "$0")/.."
# The GPU part of a run's folder name: h200, or h200x4 for four of them; nogpu without one.
gpu_tag() {
  local names count
  names=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || true)
  count=$(printf '%s\n' "$names" | grep -c . || true)
  [ "$count" -gt 0 ] || { echo nogpu; return; }
  local model
  model=$(printf '%s\n' "$names" | head -n 1 | tr 'A-Z' 'a-z' | sed 's/^nvidia //' | awk '{print $1}')
  if [ "$count" -gt 1 ]; then echo "${model}x$count"; else echo "$model"; fi
}
out=${1:-out/gpu/$(date -u +%F)_$(gpu_tag)_gpu_check}
mkdir -p "$out"
log="$out/gpu_check.log"
exec > >(tee "$log") 2>&1

# GPU_CHECK_COMMIT names the tree when the copy on the GPU machine has no current .git.
echo "== $(date -u +%FT%TZ) commit ${GPU_CHECK_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
cudnn_dir=$(python3 -c 'import nvidia.cudnn, os; print(os.path.dirname(nvidia.cudnn.__file__))' 2>/dev/null \
            || python3 -c 'import nvidia.cudnn; print(list(nvidia.cudnn.__path__)[0])' 2>/dev/null || true)
# The MPI collectives are the CPU backend's (tested on CI): not built here.
cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFUSEBOX_WITH_MPI=OFF)
# The GPU image has no libonnx-testdata: a run there carries a copy in .gpudeps/testdata, or
# packed as .gpudeps/testdata.tgz (4 MB instead of 27: the carry limit is 64 MiB, and .deps
# with CUTLASS's headers takes 31).
if [ ! -d .gpudeps/testdata/node ] && [ -f .gpudeps/testdata.tgz ]; then
  tar xzf .gpudeps/testdata.tgz -C .gpudeps
fi
[ -d .gpudeps/testdata/node ] && cmake_args+=(-DFUSEBOX_ONNX_TESTDATA="$PWD/.gpudeps/testdata/node")
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
# GPU_CHECK_TARGETS="fusebox fusebox_executable_tests": only those (a call with a short
# command: the whole tree takes ~4 min on 16 cores, the CLI alone about half).
# shellcheck disable=SC2086  # GPU_CHECK_TARGETS holds several words
if cmake --build build/gpu -j "$(nproc)" ${GPU_CHECK_TARGETS:+--target $GPU_CHECK_TARGETS} \
     -- -k 0 > "$out/build.log" 2>&1; then
  echo "== build ok"; rm -f "$out/build.log"
else
  echo "== build FAILED (continuing with what was built):"; grep -A5 "FAILED" "$out/build.log" | head -40
fi

status=0
# GPU_CHECK_PARTS="tests bench" (default both): a second call on the still-warm machine can
# run the other part against the same build when one call would pass the device time limit.
parts=${GPU_CHECK_PARTS:-tests bench}
# GPU_CHECK_TEST_FILTER=<gtest filter>: instead of the tests part, only those CUDA tests.
if [ -n "${GPU_CHECK_TEST_FILTER:-}" ]; then
  echo "== GPU tests matching $GPU_CHECK_TEST_FILTER"
  build/gpu/tests/fusebox_cuda_tests --gtest_brief=1 --gtest_filter="$GPU_CHECK_TEST_FILTER" \
    > "$out/cuda_tests.log" 2>&1 || status=1
  grep -E "FAILED|PASSED|SKIPPED|tests ran" "$out/cuda_tests.log" | tail -30
fi
# GPU_CHECK_TESTS="fusebox_executable_tests:*CudaExecutable* fusebox_cuda_tests:MatmulTest.*": each
# test binary with its gtest filter (globbing off: the filters hold '*'), before the parts.
if [ -n "${GPU_CHECK_TESTS:-}" ]; then
  set -f
  for t in $GPU_CHECK_TESTS; do
    bin=${t%%:*}; filter=${t#*:}
    echo "== $bin --gtest_filter=$filter"
    build/gpu/tests/"$bin" --gtest_brief=1 --gtest_filter="$filter" > "$out/$bin.log" 2>&1 || status=1
    grep -E "FAILED|PASSED|SKIPPED|tests ran|Failure|exception" "$out/$bin.log" | head -40
    # A filter that names nothing passes silently otherwise (parameterised suites carry a
    # prefix: `Modes/EncoderHazards.*`, not `EncoderHazards.*`).
    if grep -q " 0 tests from 0 test suites ran" "$out/$bin.log"; then
      echo "== $bin: the filter $filter matched no test"; status=1
    fi
  done
  set +f
fi
if [[ " $parts " == *" tests "* ]]; then
echo "== GPU tests"
build/gpu/tests/fusebox_cuda_tests --gtest_brief=1 > "$out/cuda_tests.log" 2>&1 || status=1
grep -E "FAILED|PASSED|SKIPPED|tests ran" "$out/cuda_tests.log" | tail -60
echo "== all ctest (CPU + GPU)"
ctest --test-dir build/gpu -j 8 --output-on-failure > "$out/ctest.log" 2>&1 || status=1
grep -E "tests passed|tests failed|^\s+[0-9]+ - .*(Failed|Exception|SEGFAULT|Timeout)" "$out/ctest.log" | head -60

echo "== ONNX conformance on the GPU"
testdata=$(sed -n 's/^FUSEBOX_ONNX_TESTDATA:PATH=//p' build/gpu/CMakeCache.txt)
build/gpu/tests/fusebox_onnx_conformance --data "$testdata" --skips tests/conformance/skips.txt \
  --device cuda > "$out/conformance_cuda.log" 2>&1 || status=1
tail -15 "$out/conformance_cuda.log"

echo "== resnet50: cuda vs cpu"
fb=build/gpu/tools/fusebox
if $fb zoo resnet50 --out "$out/r50.onnx" > /dev/null &&
   $fb run "$out/r50.onnx" --device cpu --output-dir "$out/r50_cpu" &&
   FUSEBOX_ALLOW_TF32=0 $fb run "$out/r50.onnx" --device cuda --output-dir "$out/r50_cuda" &&
   $fb run "$out/r50.onnx" --device cuda --report --output-dir "$out/r50_cuda_tf32"; then
  # Tolerances (docs/gpu.md): f32 end to end 1e-3 of the largest logit; with TF32
  # convolutions (the default, as PyTorch's cudnn.allow_tf32) 5e-2.
  echo "f32 (FUSEBOX_ALLOW_TF32=0):"
  python3 scripts/compare_outputs.py "$out/r50_cpu" "$out/r50_cuda" --rtol 1e-3 || status=1
  echo "TF32 convolutions (default):"
  python3 scripts/compare_outputs.py "$out/r50_cpu" "$out/r50_cuda_tf32" --rtol 5e-2 || status=1
else
  status=1
fi
rm -f "$out/r50.onnx"

fi

if [[ " $parts " == *" bench "* ]]; then
echo "== benchmarks"
# GPU_CHECK_BENCHES="conv norms" runs only bench_conv/torch_conv.py and bench_norms/
# torch_norms.py (default: every benchmark).
selected() { [ -z "${GPU_CHECK_BENCHES:-}" ] || [[ " $GPU_CHECK_BENCHES " == *" $1 "* ]]; }
for b in build/gpu/bench/bench_*; do
  [ -x "$b" ] || continue
  name=$(basename "$b"); selected "${name#bench_}" || continue
  echo "-- $name"
  "$b" --json "$out/$name.json" || status=1
done
for p in bench/torch_*.py; do
  name=$(basename "$p" .py); selected "${name#torch_}" || continue
  echo "-- $p"
  [ -f "$p" ] && python3 "$p" --json "$out/$name.json" || status=1
done
# The one ResNet-50 convolution below 0.97x PyTorch in session 2 (stage-4 1x1 stride-2
# downsample, fprop): every plan-choice setting (--knobs), with fresh caches.
# GPU_CHECK_BENCHES="conv_knobs" runs this part alone (with PyTorch on the same shape).
if { selected conv || selected conv_knobs; } && [ -x build/gpu/bench/bench_conv ]; then
  echo "-- bench_conv --knobs (l4 downsample fprop)"
  build/gpu/bench/bench_conv --shapes l4_1x1s2_c1024k2048_14 --ops fprop --knobs --no-setup \
    --json "$out/bench_conv_knobs.json" || status=1
  if ! selected conv; then
    python3 bench/torch_conv.py --shapes l4_1x1s2_c1024k2048_14 --ops fprop \
      --json "$out/torch_conv_l4.json" || status=1
  fi
fi
fi

# The device tool brings back only a few files: merge the JSONs into one, drop the arrays.
if [[ " $parts " == *" suite "* ]]; then
echo "== model suite (bench/suite: fusebox vs PyTorch eager, CUDA graph, torch.compile)"
# GPU_CHECK_SUITE_MODE infer|train|both (default infer), GPU_CHECK_SUITE_MODELS a,b,...
# (default all, in models.py's order), GPU_CHECK_SUITE_LIMIT seconds after which no new
# model starts (default 480: a call's limit is 600 s). The suite's folder stays in the tree
# (out/suite: a later call on the warm machine continues it, --resume); its table, JSON and
# logs come back as one suite.tgz (the device tool returns a few files only), with each
# inference cell's fusebox --report (reports/). GPU_CHECK_SUITE_ARGS: more suite options
# (e.g. "--sides fusebox --reuse-torch DIR" to time fusebox alone against earlier PyTorch cells).
suite_dir=${GPU_CHECK_SUITE_DIR:-out/suite}
# shellcheck disable=SC2086  # GPU_CHECK_SUITE_ARGS holds several words
bench/suite/run.sh --fusebox build/gpu/tools/fusebox --out "$suite_dir" --resume --report \
  --mode "${GPU_CHECK_SUITE_MODE:-infer}" --time-limit "${GPU_CHECK_SUITE_LIMIT:-480}" \
  ${GPU_CHECK_SUITE_MODELS:+--models "$GPU_CHECK_SUITE_MODELS"} ${GPU_CHECK_SUITE_ARGS:-} 2>&1 \
  | grep -v '^|' | tail -30 || status=1
grep '^|' "$suite_dir/suite.md" || true
tar czf "$out/suite.tgz" --exclude='*.onnx' --exclude='work' -C "$(dirname "$suite_dir")" \
  "$(basename "$suite_dir")" || status=1
fi

# GPU_CHECK_CELLS="infer:gpt2 train:resnet50": suite cells, fusebox's side alone against PyTorch's
# newest committed cells (bench/suite/torch_ref.py), each cell's report line (peak, plan) shown;
# no cell starts after GPU_CHECK_CELLS_LIMIT seconds of the script (default 480). Tables, JSON
# and reports come back as cells_<mode>.tgz.
if [ -n "${GPU_CHECK_CELLS:-}" ]; then
  python3 bench/suite/torch_ref.py out/torch_ref > /dev/null || status=1
  for c in $GPU_CHECK_CELLS; do
    mode=${c%%:*}; model=${c#*:}
    if [ "$SECONDS" -gt "${GPU_CHECK_CELLS_LIMIT:-480}" ]; then echo "== time limit: $c not run"; continue; fi
    echo "== cell $mode $model"
    bench/suite/run.sh --fusebox build/gpu/tools/fusebox --out "out/cells_$mode" --resume --report \
      --mode "$mode" --models "$model" --sides fusebox --reuse-torch out/torch_ref 2>&1 \
      | grep -v '^|' | tail -3 || status=1
    grep "^| $model" "out/cells_$mode/suite.md" || true
    report="out/cells_$mode/reports/${model}_${mode}.txt"
    [ -f "$report" ] && grep -E "^(peak device memory|memory plan|ms/step|images/s) " "$report"
  done
  for d in out/cells_*; do
    [ -d "$d" ] && tar czf "$out/$(basename "$d").tgz" --exclude='*.onnx' --exclude='work' -C out "$(basename "$d")"
  done
fi

python3 - "$out" <<'PY' || status=1
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
merged = {}
for f in sorted(out.glob("*.json")):
    if f.name == "results.json": continue
    try: merged[f.stem] = json.loads(f.read_text())
    except ValueError as e: merged[f.stem] = {"error": str(e)}
    f.unlink()
(out / "results.json").write_text(json.dumps(merged, indent=1))
PY
rm -rf "$out"/r50_cpu "$out"/r50_cuda "$out"/r50_cuda_tf32 "$out/configure.log"
echo "== done, status $status"
exit $status
