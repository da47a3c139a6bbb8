#!/usr/bin/env bash
# Two builds of fusebox timed in the same call on the same GPU, alternating, so that a
# restructuring can be shown to change nothing (issue 39's target) or a change to gain what
# it claims: ResNet-50 bf16 training and inference (batch 256) through `fusebox bench`, and
# every ResNet-50 convolution on the project's engines against cuDNN (`bench_conv --own`,
# bf16). Each side runs ROUNDS times, A B A B..., so a drift of the machine shows in both.
#   bench/compare_trees.sh OUT BUILD_A BUILD_B [ROUNDS]
# BUILD_*: CMake build folders holding tools/fusebox and bench/bench_conv. Writes one JSON per
# run into OUT (a_train_1.json, b_conv.json, ...) and prints the medians side by side.
# COMPARE_PARTS="models conv" (default both) runs a part alone.
set -uo pipefail
out=$1; a=$2; b=$3; rounds=${4:-2}
mkdir -p "$out"
parts=${COMPARE_PARTS:-models conv}
status=0
# Each side compiles its own plans from cold caches of its own (the plan formats may differ).
for side in a b; do mkdir -p "$out/cache_$side"; done

bench_model() {  # side build mode round
  local side=$1 build=$2 mode=$3 round=$4
  FUSEBOX_CACHE_DIR="$out/cache_$side" "$build/tools/fusebox" bench resnet50 --mode "$mode" \
    --batch 256 --precision bf16 --device cuda --json "$out/${side}_${mode}_${round}.json" \
    > "$out/${side}_${mode}_${round}.log" 2>&1 || { echo "side $side $mode round $round failed"; status=1; }
}

if [[ " $parts " == *" models "* ]]; then
  for round in $(seq 1 "$rounds"); do
    for mode in train infer; do
      bench_model a "$a" "$mode" "$round"
      bench_model b "$b" "$mode" "$round"
    done
  done
fi
if [[ " $parts " == *" conv "* ]]; then
  for side in a b; do
    build=$a; [ "$side" = b ] && build=$b
    FUSEBOX_CACHE_DIR="$out/cache_$side" "$build/bench/bench_conv" --own --dtypes bf16 \
      --no-setup --json "$out/${side}_conv.json" > "$out/${side}_conv.log" 2>&1 ||
      { echo "side $side bench_conv failed"; status=1; }
  done
fi

python3 - "$out" <<'EOF'
import glob, json, math, os, statistics, sys
out = sys.argv[1]
def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
print(f"{'run':<28}{'A':>12}{'B':>12}{'B/A':>8}")
for mode in ("train", "infer"):
    ms = {s: [j["step_ms_median"] for j in map(load, sorted(glob.glob(f"{out}/{s}_{mode}_*.json"))) if j]
          for s in "ab"}
    if ms["a"] and ms["b"]:
        ma, mb = statistics.median(ms["a"]), statistics.median(ms["b"])
        print(f"{'resnet50 b256 bf16 ' + mode + ' ms':<28}{ma:>12.3f}{mb:>12.3f}{mb / ma:>8.3f}"
              f"   (rounds A {', '.join(f'{x:.3f}' for x in ms['a'])}; B {', '.join(f'{x:.3f}' for x in ms['b'])})")
conv = {s: load(f"{out}/{s}_conv.json") for s in "ab"}
if conv["a"] and conv["b"]:
    # Rows keyed by shape/op: the project's engines' time on each side.
    def rows(j):
        found = {}
        for r in j.get("rows", j.get("results", [])):
            own = r.get("own_ms")
            if own:
                found[(r.get("shape"), r.get("op"))] = own
        return found
    ra, rb = rows(conv["a"]), rows(conv["b"])
    common = sorted(set(ra) & set(rb))
    geo = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")
    if not common:
        print("conv: no common rows with own_ms (see the JSON files)")
    for op in ("fprop", "dgrad", "wgrad"):
        keys = [k for k in common if k[1] == op]
        if not keys:
            continue
        # own_vs_cudnn: cuDNN's best plan / ours (> 1: ours faster), each side's own cuDNN run.
        vs = {s: geo([r["own_vs_cudnn"] for r in conv[s]["results"]
                      if r.get("op") == op and r.get("own_vs_cudnn")]) for s in "ab"}
        print(f"{'conv ' + op + ' own vs cuDNN':<28}{vs['a']:>12.3f}{vs['b']:>12.3f}"
              f"{vs['b'] / vs['a']:>8.3f}   (own ms geomean B/A {geo([rb[k] / ra[k] for k in keys]):.3f}"
              f" over {len(keys)} rows)")
EOF
exit $status
