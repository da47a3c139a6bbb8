#!/usr/bin/env bash
# Fuzzes the ONNX importer + shape inference + CPU compile and run (tests/fuzz/fuzz_onnx_model.cpp)
# with libFuzzer under ASan + UBSan for SECONDS (default 60), from the seed corpus
# tests/data/fuzz/corpus. Each new crash, out-of-memory or timeout is minimised into
# tests/data/fuzz/regressions/ (review them: keep one per cause, commit them; ctest's
# fuzz_replay then replays them in every build). docs/fuzzing.md has the details.
#   scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
data=tests/data/fuzz
# The "fuzz" preset (clang, build/fuzz), the fuzz target and the libraries it links only.
nice scripts/build.sh fuzz fuzz_onnx_model
fuzzer=build/fuzz/tests/fuzz/fuzz_onnx_model
work=build/fuzz/work  # the corpus libFuzzer grows, and the raw artifacts
mkdir -p "$work/corpus" "$work/artifacts" "$data/regressions"
# More seeds, where Debian's libonnx-testdata is installed: the ONNX node tests' models (one
# op each, every op of the standard) that fit -max_len.
node_tests=/usr/include/onnx/backend/test/data/node
if [ -d "$node_tests" ] && [ ! -d "$work/onnx_node_seeds" ]; then
  mkdir -p "$work/onnx_node_seeds"
  for m in "$node_tests"/*/model.onnx; do
    [ "$(stat -c %s "$m")" -le 4096 ] && cp "$m" "$work/onnx_node_seeds/$(basename "$(dirname "$m")").onnx"
  done
fi

# -fork=1 runs the inputs in a child process and goes on past a crash, an OOM or a timeout
# (the seeds hold the attacks of issue 38, which crash until they are fixed). Models are small
# (the seeds are under 1 KB); one should import, compile and run in milliseconds, so 10 s is a
# hang; 2 GB of RSS (or one allocation of 1 GB) from a model of 4 KB is a resource attack.
# leak detection off: the CPU backend's thread pool and caches live for the process.
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:symbolize=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
before=$(ls "$work/artifacts")
nice "$fuzzer" -fork=1 -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1 \
  -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
  -artifact_prefix="$work/artifacts/" "$work/corpus" "$data/corpus" \
  $([ -d "$work/onnx_node_seeds" ] && echo "$work/onnx_node_seeds") 2>&1 | tee "$work/last_run.log" |
  grep -E '^#[0-9]+: cov|INFO: fuzzed|crash|==ERROR|BUG' || true

# Each new artifact, minimised (crashes; OOMs and timeouts are kept as they are), named by
# kind and content hash.
for f in $(comm -13 <(echo "$before") <(ls "$work/artifacts")); do
  kind=${f%%-*}
  out=$work/artifacts/min-$f
  if [ "$kind" = crash ]; then
    nice "$fuzzer" -minimize_crash=1 -max_total_time=30 -timeout=10 -rss_limit_mb=2048 \
      -exact_artifact_path="$out" "$work/artifacts/$f" >/dev/null 2>&1 || true
  fi
  [ -s "$out" ] || cp "$work/artifacts/$f" "$out"
  name=$kind-$(sha1sum "$out" | cut -c1-16).onnx
  mv "$out" "$data/regressions/$name"
  echo "fuzz: new $kind: $data/regressions/$name"
done
grep -E 'INFO: fuzzed for|DONE' "$work/last_run.log" | tail -2 || true
