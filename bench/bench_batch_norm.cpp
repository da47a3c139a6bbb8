// batch_norm on the CUDA backend, NCHW against channels-last, on ResNet-50's batch-norm
// shapes (N = 64, bf16 by default), against the device's copy bandwidth measured in the
// same process.
//
//   bench_batch_norm [--json FILE] [--iters N] [--repeats N] [--dtype bf16|f16|f32]
//
// Passes: training forward (y, new running statistics, saved mean and inverse std),
// inference forward (y), backward (the IR op: dx, dscale, dbias; training form).
// Bytes (read + written, each activation tensor once; per-channel vectors ignored):
// forward x + y, backward x + dy + dx. The training forward reads x twice (statistics,
// then y), so about 2/3 of the copy bandwidth is its ceiling; the backward reads x and dy
// twice, so about 3/5.
// Timing: CUDA events around `iters` direct launches (no graph), the median per-iteration
// time over `repeats` runs after a warm-up; inputs random, rotating over enough copies that
// the working set exceeds twice the 50 MB L2. The copy reference is cudaMemcpyAsync
// device-to-device of half the op's bytes (equal traffic), timed the same way.
#include <algorithm>
#include <string>
#include <vector>

#include "backends/cuda/kernels.h"
#include "common/cli.h"
#include "common/kernel_bench.h"
#include "common/report.h"
#include "fusebox/ir/graph.h"

namespace fusebox::cuda {
namespace {

using bench::Bandwidth;
using bench::KernelBench;
using bench::random_host;

struct Options {
  std::string json;
  bench::TimingOptions timing{.iters = 20, .repeats = 5};
  DType dtype = DType::bf16;
};

struct Result {
  std::string layout, pass;
  int64_t channels, size;
  Bandwidth bandwidth;
};

constexpr int64_t kBatch = 64;
constexpr size_t kRotationBytes = size_t(120) << 20;  // > 2 x the H100's 50 MB L2

// ResNet-50's batch-norm inputs (channels, spatial size) at 224 x 224, each once.
const std::pair<int64_t, int64_t> kShapes[] = {{64, 112},  {64, 56},  {256, 56}, {128, 56},
                                               {128, 28},  {512, 28}, {256, 28}, {256, 14},
                                               {1024, 14}, {512, 14}, {512, 7},  {2048, 7}};

// The normalised node of a one-node graph: batch_norm or batch_norm_backward.
Node bn_node(OpKind op, DType dtype, const Shape& shape, bool training) {
  Graph g("bench_batch_norm");
  const Shape per_channel = {shape[1]};
  std::vector<ValueId> in;
  if (op == OpKind::batch_norm) {
    in = {g.add_input("x", dtype, shape), g.add_input("scale", dtype, per_channel),
          g.add_input("bias", dtype, per_channel), g.add_input("mean", dtype, per_channel),
          g.add_input("var", dtype, per_channel)};
  } else {
    in = {g.add_input("dy", dtype, shape), g.add_input("x", dtype, shape),
          g.add_input("scale", dtype, per_channel), g.add_input("mean", dtype, per_channel),
          g.add_input("inv_std", dtype, per_channel)};
  }
  g.add_node(op, BatchNormAttrs{1e-5, 0.9, training}, in, "bn");
  return g.nodes().back();
}

void run_shape(KernelBench& b, const Options& o, int64_t channels, int64_t size,
               std::vector<Result>& results) {
  const Shape shape = {kBatch, channels, size, size};
  const Shape per_channel = {channels};
  const DType t = o.dtype;
  const size_t act_bytes = size_t(numel(shape)) * dtype_size(t);
  const size_t copies = std::max<size_t>(1, kRotationBytes / act_bytes);
  const auto contiguous = MemoryFormat::contiguous;
  DeviceTensor scale = b.upload(random_host(t, per_channel, 1, 0.5, 1.5), contiguous);
  DeviceTensor bias = b.upload(random_host(t, per_channel, 2, -1, 1), contiguous);
  DeviceTensor mean = b.upload(random_host(t, per_channel, 3, -1, 1), contiguous);
  DeviceTensor var = b.upload(random_host(t, per_channel, 4, 0.5, 2), contiguous);
  // One set of random values, uploaded into every copy (the same values in different
  // buffers cost the same traffic).
  const Tensor x_host = random_host(t, shape, 5, 1, 5), dy_host = random_host(t, shape, 6, -1, 1);
  for (MemoryFormat format : {MemoryFormat::contiguous, MemoryFormat::channels_last}) {
    const std::string layout = format == MemoryFormat::contiguous ? "nchw" : "nhwc";
    std::vector<DeviceTensor> x, y, dy;
    for (size_t i = 0; i < copies; ++i) {
      x.push_back(b.upload(x_host, format));
      dy.push_back(b.upload(dy_host, format));
      y.push_back(b.empty(t, shape, format));
    }
    std::vector<DeviceTensor> stats;
    for (int i = 0; i < 4; ++i) stats.push_back(b.empty(t, per_channel, contiguous));
    auto record = [&](const std::string& pass, size_t bytes, double us) {
      results.push_back(
          {layout, pass, channels, size, b.bandwidth(o.timing, bytes, us, kRotationBytes)});
    };
    for (bool training : {true, false}) {
      const Node node = bn_node(OpKind::batch_norm, t, shape, training);
      const double us = b.time_us(o.timing, [&](int i) {
        const size_t k = size_t(i) % copies;
        const DeviceTensor* in[] = {&x[k], &scale, &bias, &mean, &var};
        std::vector<DeviceTensor> out = {y[k]};
        if (training) out.insert(out.end(), stats.begin(), stats.end());
        batch_norm(b.ctx(), node, in, out);
      });
      record(training ? "fwd_train" : "fwd_infer", 2 * act_bytes, us);
    }
    const Node node = bn_node(OpKind::batch_norm_backward, t, shape, true);
    const double us = b.time_us(o.timing, [&](int i) {
      const size_t k = size_t(i) % copies;
      // dx into y's buffers; dscale / dbias into two of the statistics vectors.
      const DeviceTensor* in[] = {&dy[k], &x[k], &scale, &mean, &var};
      std::vector<DeviceTensor> out = {y[k], stats[0], stats[1]};
      batch_norm_backward(b.ctx(), node, in, out);
    });
    record("backward", 3 * act_bytes, us);
  }
}

int run(const Options& o) {
  KernelBench b;
  std::vector<Result> results;
  for (const auto& [channels, size] : kShapes) run_shape(b, o, channels, size, results);
  std::printf(
      "batch_norm %s, N = %lld (GB/s = bytes read + written, activations once; copy = "
      "cudaMemcpy D2D, same bytes)\n",
      dtype_name(o.dtype), (long long)kBatch);
  const bench::Table table(bench::joined(
      {{"shape", 16, true}, {"layout", 6, true}, {"pass", 10, true}}, Bandwidth::columns()));
  table.print_header();
  bench::Json rows = bench::Json::array();
  for (const Result& r : results) {
    const std::string shape = cat("[", kBatch, ",", r.channels, ",", r.size, ",", r.size, "]");
    table.print_row(bench::joined({shape, r.layout, r.pass}, r.bandwidth.cells()));
    rows.push(r.bandwidth.appended_to(bench::Json::object(
        {{"channels", r.channels}, {"size", r.size}, {"layout", r.layout}, {"pass", r.pass}})));
  }
  bench::Json report = bench::report("batch_norm");
  report.set("dtype", dtype_name(o.dtype)).set("batch", kBatch).set("results", std::move(rows));
  bench::write_report(o.json, report);
  return 0;
}

}  // namespace
}  // namespace fusebox::cuda

int main(int argc, char** argv) {
  fusebox::cuda::Options o;
  fusebox::bench::Cli cli("bench_batch_norm",
                          "batch_norm, NCHW and channels-last, against the copy bandwidth", o.json);
  cli.add_timing(o.timing);
  cli.app()
      .add_option_function<std::string>(
          "--dtype", [&](const std::string& name) { fusebox::parse_dtype(name, &o.dtype); },
          "Activation dtype")
      ->check(CLI::IsMember({"bf16", "f16", "f32"}))
      ->default_str("bf16");
  return cli.run(argc, argv, [&] { return fusebox::cuda::run(o); });
}
