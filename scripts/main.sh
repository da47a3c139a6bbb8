#!/usr/bin/env bash
# The main job: set up, build, then run an example model (a zoo ResNet-50 exported
# to ONNX) through `fusebox run`, on the GPU when there is one, else on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh release fusebox   # the CLI and the libraries it links: no tests, no benchmarks
bin=build/release/tools/fusebox
mkdir -p out
$bin zoo resnet50 --out out/resnet50.onnx --seed 0
$bin run out/resnet50.onnx --device auto --seed 0 --output-dir out/resnet50
