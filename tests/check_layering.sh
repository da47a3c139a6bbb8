#!/usr/bin/env bash
# The CUDA backend's folder rules (docs/architecture.md), checked on the sources:
#   runtime/  never includes the kernels (kernels.h, kernels/) or cuDNN plumbing (cudnn/);
#   device/   device-only headers: quoted includes name device/ headers only;
#   cudnn-frontend is included only under src/backends/cuda/cudnn/;
#   backends/common/ (shared by cpu and cuda) includes neither backend;
#   src/backends/cuda keeps at most three files at its top (the dispatcher, the op entries).
# Prints every violation with file and line; exits 1 if there is any.
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
report "backends/common/ includes a backend" \
  "$(grep -rnE '#include\s+"backends/(cpu|cuda)/' src/backends/common)"
top=$(find "$cuda" -maxdepth 1 -type f | sort)
if [ "$(echo "$top" | grep -c .)" -gt 3 ]; then
  report "more than three files at the top of $cuda" "$top"
fi
if [ "$bad" -eq 0 ]; then
  echo "layering: ok (runtime, device, cudnn, common, top of $cuda)"
fi
exit $bad
