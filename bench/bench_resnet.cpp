// ResNet-50 inference end to end on the CUDA backend, with the layout pass (channels-last
// around convolutions, FUSEBOX_LAYOUT=auto) against every value contiguous (NCHW,
// FUSEBOX_LAYOUT=contiguous): what keeping activations channels-last buys.
//
//   bench_resnet [--json FILE] [--batch N] [--iters N]
//
// Each configuration: the model compiled once (Executable::compile: cuDNN plans, memory
// plan, graph instantiation) and run once ("first ms" is both), then `iters` timed runs,
// each a whole step as a user sees it: the input (random, never zeros) copied in, the step
// replayed, the logits copied out. The table gives ms per step and images per second.
// (`fusebox bench` measures whole models for users; this compares the two layouts.)
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/cuda/runtime/device.h"
#include "common/cli.h"
#include "common/report.h"
#include "common/table.h"
#include "common/timing.h"
#include "fusebox/passes/layout.h"
#include "fusebox/runtime/executable.h"
#include "fusebox/zoo.h"

using namespace fusebox;

namespace {

struct Options {
  std::string json;
  int64_t batch = 32;
  int iters = 20;
};

Tensor random_images(DType dtype, const Shape& shape, uint64_t seed) {
  std::vector<double> v(size_t(numel(shape)));
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (double& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = double(s >> 11) / double(1ull << 53) * 2.0 - 1.0;
  }
  return Tensor::from_doubles(dtype, shape, v);
}

int run(const Options& o) {
  cuda::Device& device = cuda::Device::get(0);
  std::printf("device: %s; resnet50 inference, batch %lld, %d timed steps each\n",
              device.properties().name.c_str(), (long long)o.batch, o.iters);
  const bench::Table table({{"model", 8, true},
                            {"dtype", 6, true},
                            {"layout", 13, true},
                            {"first ms", 10},
                            {"ms/step", 10},
                            {"images/s", 10}});
  table.print_header();
  bench::Json rows = bench::Json::array();
  for (DType dtype : {DType::f32, DType::bf16}) {
    ZooOptions zo;
    zo.batch = o.batch;
    zo.dtype = dtype;
    const Graph g = build_zoo_model("resnet50", zo);
    const NamedTensors feeds{{"input", random_images(dtype, {o.batch, 3, 224, 224}, 1)}};
    for (const char* layout : {"auto", "contiguous"}) {
      setenv("FUSEBOX_LAYOUT", layout, 1);
      reread_layout_policy();  // read once per process otherwise
      const bench::Stopwatch first_run;
      auto exe = Executable::compile(g, {.device = Device::cuda});
      NamedTensors out = exe->run(feeds);
      const double first_ms = first_run.ms();
      exe->run(feeds);  // warm replay
      const bench::Stopwatch steps;
      for (int i = 0; i < o.iters; ++i) out = exe->run(feeds);
      const double ms = steps.ms() / o.iters;
      const std::string layout_name =
          layout == std::string("auto") ? "channels_last" : "contiguous";
      table.print_row({"resnet50", dtype_name(dtype), layout_name, bench::fixed(first_ms, 1),
                       bench::fixed(ms, 3), bench::fixed(double(o.batch) * 1000.0 / ms, 0)});
      rows.push(bench::Json::object({{"model", "resnet50"},
                                     {"dtype", dtype_name(dtype)},
                                     {"layout", layout_name},
                                     {"batch", o.batch},
                                     {"first_ms", first_ms},
                                     {"ms_per_step", ms}}));
    }
  }
  unsetenv("FUSEBOX_LAYOUT");
  reread_layout_policy();
  bench::Json report = bench::report("resnet");
  report.set("rows", std::move(rows));
  bench::write_report(o.json, report);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  bench::Cli cli("bench_resnet",
                 "ResNet-50 inference on the CUDA backend, channels-last against contiguous",
                 o.json);
  cli.add_count("--batch", o.batch, "Images per step");
  cli.add_iters(o.iters, "Timed steps per configuration");
  return cli.run(argc, argv, [&] { return run(o); });
}
