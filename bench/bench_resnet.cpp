// ResNet-50 inference end to end on the CUDA backend, with the layout pass (channels-last
// around convolutions, FUSEBOX_LAYOUT=auto) against every value contiguous (NCHW,
// FUSEBOX_LAYOUT=contiguous): what keeping activations channels-last buys.
//
//   bench_resnet [--json FILE] [--batch N] [--iters N]
//
// Each configuration: one run_graph (records and compiles the step: cuDNN plans, graph
// instantiation), then `iters` timed runs, each a whole step as a user sees it: the input
// (random, never zeros) copied in, the step replayed, the logits copied out. The table
// gives ms per step and images per second.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "backends/cuda/device.h"
#include "fusebox/runtime/executor.h"
#include "fusebox/zoo.h"

using namespace fusebox;

namespace {

Tensor random_images(DType dtype, const Shape& shape, uint64_t seed) {
  std::vector<double> v(size_t(numel(shape)));
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (double& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = double(s >> 11) / double(1ull << 53) * 2.0 - 1.0;
  }
  return Tensor::from_doubles(dtype, shape, v);
}

struct Row {
  std::string model, dtype, layout;
  int64_t batch;
  double first_ms, ms;
};

}  // namespace

int main(int argc, char** argv) {
  std::string json;
  int64_t batch = 32;
  int iters = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json" && i + 1 < argc)
      json = argv[++i];
    else if (arg == "--batch" && i + 1 < argc)
      batch = std::atoll(argv[++i]);
    else if (arg == "--iters" && i + 1 < argc)
      iters = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: bench_resnet [--json FILE] [--batch N] [--iters N]\n");
      return 2;
    }
  }
  try {
    cuda::Device& device = cuda::Device::get(0);
    std::printf("device: %s; resnet50 inference, batch %lld, %d timed steps each\n",
                device.properties().name.c_str(), (long long)batch, iters);
    std::printf("%-8s %-6s %-12s %10s %10s %10s\n", "model", "dtype", "layout", "first ms",
                "ms/step", "images/s");
    std::vector<Row> rows;
    for (DType dtype : {DType::f32, DType::bf16}) {
      ZooOptions zo;
      zo.batch = batch;
      zo.dtype = dtype;
      const Graph g = build_zoo_model("resnet50", zo);
      const NamedTensors feeds{{"input", random_images(dtype, {batch, 3, 224, 224}, 1)}};
      for (const char* layout : {"auto", "contiguous"}) {
        setenv("FUSEBOX_LAYOUT", layout, 1);
        RunOptions opts;
        opts.device = Device::cuda;
        opts.poison_outputs = false;
        auto t0 = std::chrono::steady_clock::now();
        NamedTensors out = run_graph(g, feeds, opts);
        const double first =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        run_graph(g, feeds, opts);  // warm replay
        t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) out = run_graph(g, feeds, opts);
        const double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count() /
            iters;
        rows.push_back({"resnet50", dtype_name(dtype),
                        layout == std::string("auto") ? "channels_last" : "contiguous", batch,
                        first, ms});
        std::printf("%-8s %-6s %-12s %10.1f %10.3f %10.0f\n", "resnet50", dtype_name(dtype),
                    rows.back().layout.c_str(), first, ms, double(batch) * 1000.0 / ms);
        std::fflush(stdout);
      }
    }
    unsetenv("FUSEBOX_LAYOUT");
    if (!json.empty()) {
      std::ofstream f(json);
      f << "{\"device\": \"" << device.properties().name << "\", \"rows\": [";
      for (size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        f << (i ? ", " : "") << "{\"model\": \"" << r.model << "\", \"dtype\": \"" << r.dtype
          << "\", \"layout\": \"" << r.layout << "\", \"batch\": " << r.batch
          << ", \"first_ms\": " << r.first_ms << ", \"ms_per_step\": " << r.ms << "}";
      }
      f << "]}\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_resnet: %s\n", e.what());
    return 1;
  }
  return 0;
}
