// A program that links fusebox as an installed C++ library (find_package(fusebox), docs/cpp.md):
// builds the zoo's small CNN, compiles it for the CPU, runs a batch and prints the logits' shape
// and their sum. tests/package/check_package.sh builds and runs it against `cmake --install`.
#include <cstdio>
#include <exception>

#include "fusebox/runtime/executable.h"
#include "fusebox/version.h"
#include "fusebox/zoo.h"

int main() {
  try {
    const fusebox::Graph model = fusebox::build_zoo_model(
        "small_cnn", {.batch = 2, .image_size = 16, .num_classes = 10, .seed = 1});
    auto exe = fusebox::Executable::compile(model, {.device = fusebox::Device::cpu});
    fusebox::Tensor x = fusebox::Tensor::empty(fusebox::DType::f32, {2, 3, 16, 16});
    for (int64_t i = 0; i < x.numel(); ++i) x.set(i, double(i % 17) / 17.0 - 0.5);
    const fusebox::NamedTensors out = exe->run({{"input", x}});
    const fusebox::Tensor& logits = out.begin()->second;
    double sum = 0;
    for (int64_t i = 0; i < logits.numel(); ++i) sum += logits.get(i);
    std::printf("fusebox %s: logits %s, sum %.6f\n", FUSEBOX_VERSION_STRING,
                fusebox::shape_str(logits.shape()).c_str(), sum);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
