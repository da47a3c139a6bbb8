#!/usr/bin/env bash
# The model suite (issue 40): fusebox against PyTorch eager, CUDA-graph replay and
# torch.compile, per model, with geometric means; bench/suite/README.md says what and how.
#
#   bench/suite/run.sh [--fusebox BIN] [--mode infer|train|both] [--models a,b,...]
#                      [--out DIR] [--json F] [--resume] [--time-limit S] [--device cuda|cpu]
#                      [--dry-run] [other options of bench/suite/suite.py]
#   bench/suite/run.sh --table --out DIR      # merge OUT's per-model JSON into the table
#   bench/suite/run.sh --self-test            # the merge/table logic on made-up JSON
#
# The fusebox binary: --fusebox, else build/gpu/tools/fusebox, else
# build/release/tools/fusebox. The Python: $PYTHON, else python3 (it needs torch,
# torchvision and onnx, except for --table and --self-test).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
python=${PYTHON:-python3}
fusebox=""
args=()
while [ $# -gt 0 ]; do
  case $1 in
    --fusebox) fusebox=$2; shift 2 ;;
    --fusebox=*) fusebox=${1#--fusebox=}; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ -z "$fusebox" ]; then
  for candidate in "$root/build/gpu/tools/fusebox" "$root/build/release/tools/fusebox"; do
    if [ -x "$candidate" ]; then fusebox=$candidate; break; fi
  done
fi
if [ -n "$fusebox" ]; then
  [ -x "$fusebox" ] || { echo "run.sh: --fusebox $fusebox is not an executable" >&2; exit 2; }
  args=(--fusebox "$(cd "$(dirname "$fusebox")" && pwd)/$(basename "$fusebox")" "${args[@]}")
fi
exec "$python" "$root/bench/suite/suite.py" --python "$(command -v "$python")" "${args[@]}"
