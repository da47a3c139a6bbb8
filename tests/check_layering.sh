#!/usr/bin/env bash
# The CUDA backend's folder rules (docs/architecture.md), checked on the sources:
#   runtime/  never includes the kernels (kernels.h, kernels/) or cuDNN plumbing (cudnn/);
#   device/   device-only headers: quoted includes name device/ headers only;
#   cudnn-frontend is included only under src/backends/cuda/cudnn/, oneDNN only under
#     src/backends/cpu_fast/;
#   backends/common/ (shared by cpu and cuda) includes neither backend;
#   src/backends/cuda keeps at most three files at its top (the dispatcher, the op entries).
# And the layers' rules (src/CMakeLists.txt):
#   no quoted include climbs into src/ ("../../src/..."): tools, benchmarks and tests reach the
#     library through include/fusebox/ (or, for tests and benchmarks of internals, the src/
#     include path), never by a relative path;
#   the data-parallel launch (fusebox/dist: include/fusebox/dist, src/dist) is included only
#     by train and above, not by core, ir, passes, backends, executable, io, frontends, zoo.
# Prints every violation with its rule, file and line; exits 1 if there is any.
set -uo pipefail
cd "${1:-$(dirname "$0")/..}" || exit 2
cuda=src/backends/cuda
[ -d "$cuda/runtime" ] || { echo "check_layering: $cuda/runtime not found (run from the repo root)"; exit 2; }
bad=0
report() {  # report RULE HITS (not in a pipeline: it sets bad)
  local rule=$1 hits=$2
  if [ -n "$hits" ]; then
    echo "layering: $rule:"
    echo "$hits" | sed 's/^/  /'
    bad=1
  fi
}
report "runtime/ includes kernels or cudnn" \
  "$(grep -rnE '#include\s+"backends/cuda/(kernels|cudnn)' "$cuda/runtime")"
report "device/ includes a header outside device/" \
  "$(grep -rnE '#include\s+"' "$cuda/device" | grep -vE '#include\s+"backends/cuda/device/')"
report "cudnn-frontend included outside $cuda/cudnn/" \
  "$(grep -rnE '#include\s+[<"]cudnn_frontend' src tests bench tools include | grep -v "^$cuda/cudnn/" | grep -v '^bench/probes/')"
report "oneDNN included outside src/backends/cpu_fast/" \
  "$(grep -rnE '#include\s+[<"](oneapi/dnnl|dnnl)' src tests bench tools include | grep -v '^src/backends/cpu_fast/')"
report "backends/common/ includes a backend" \
  "$(grep -rnE '#include\s+"backends/(cpu|cuda)/' src/backends/common)"
# A quoted include resolved from the including file's folder, as the compiler first tries it.
climbing=""
while IFS=: read -r file line text; do
  [ -n "$file" ] || continue
  path=$(echo "$text" | sed -E 's/.*#include\s+"([^"]*)".*/\1/')
  resolved=$(realpath -m --relative-to=. "$(dirname "$file")/$path")
  case "$resolved" in src/*) climbing+="$file:$line:$text (reaches $resolved)"$'\n' ;; esac
done < <(grep -rnE '#include\s+"\.\./' src include tools bench tests)
report "a relative include climbs into src/ (include the public fusebox/... header instead)" \
  "$(echo -n "$climbing")"
# Below train: the layers src/CMakeLists.txt builds before fusebox_train, and their public
# headers (include/fusebox/runtime is the executable layer's).
below_train="src/core src/ir src/passes src/backends src/executable src/io src/frontends src/zoo
  include/fusebox/core include/fusebox/ir include/fusebox/passes include/fusebox/backends
  include/fusebox/runtime include/fusebox/io include/fusebox/frontends include/fusebox/zoo.h"
# shellcheck disable=SC2086  # below_train is a list of paths
report "fusebox/dist (the data-parallel launch) included below train" \
  "$(grep -rnE '#include\s+[<"](fusebox/dist/|dist/)' $below_train)"
top=$(find "$cuda" -maxdepth 1 -type f | sort)
if [ "$(echo "$top" | grep -c .)" -gt 3 ]; then
  report "more than three files at the top of $cuda" "$top"
fi
if [ "$bad" -eq 0 ]; then
  echo "layering: ok (runtime, device, cudnn, oneDNN, common, top of $cuda; no include climbs into src/;"
  echo "  fusebox/dist only from train up)"
fi
exit $bad
