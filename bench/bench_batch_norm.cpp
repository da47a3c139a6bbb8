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
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/check.h"
#include "backends/cuda/kernels.h"
#include "fusebox/ir/graph.h"
#include "kernel_bench.h"

namespace fusebox::cuda {
namespace {

using Bench = bench::KernelBench;
using bench::random_host;

struct Options {
  std::string json;
  int iters = 20;
  int repeats = 5;
  DType dtype = DType::bf16;
};

struct Result {
  std::string layout, pass;
  int64_t channels, size;
  double us, gbps, copy_gbps;
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

void run_shape(Bench& b, const Options& o, int64_t channels, int64_t size,
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
      const double copy = b.copy_gbps(o.iters, o.repeats, bytes, kRotationBytes);
      results.push_back({layout, pass, channels, size, us, double(bytes) / us / 1e3, copy});
    };
    for (bool training : {true, false}) {
      const Node node = bn_node(OpKind::batch_norm, t, shape, training);
      const double us = b.time_us(o.iters, o.repeats, [&](int i) {
        const size_t k = size_t(i) % copies;
        const DeviceTensor* in[] = {&x[k], &scale, &bias, &mean, &var};
        std::vector<DeviceTensor> out = {y[k]};
        if (training) out.insert(out.end(), stats.begin(), stats.end());
        batch_norm(b.ctx(), node, in, out);
      });
      record(training ? "fwd_train" : "fwd_infer", 2 * act_bytes, us);
    }
    const Node node = bn_node(OpKind::batch_norm_backward, t, shape, true);
    const double us = b.time_us(o.iters, o.repeats, [&](int i) {
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
  Bench b;
  std::vector<Result> results;
  for (const auto& [channels, size] : kShapes) {
    run_shape(b, o, channels, size, results);
    std::fflush(stdout);
  }
  std::printf(
      "batch_norm %s, N = %lld (GB/s = bytes read + written, activations once; copy = "
      "cudaMemcpy D2D, same bytes)\n",
      dtype_name(o.dtype), (long long)kBatch);
  std::printf("%-16s %-6s %-10s %10s %10s %10s %8s\n", "shape", "layout", "pass", "us", "GB/s",
              "copy", "% copy");
  for (const Result& r : results) {
    const std::string shape = cat("[", kBatch, ",", r.channels, ",", r.size, ",", r.size, "]");
    std::printf("%-16s %-6s %-10s %10.1f %10.0f %10.0f %7.1f%%\n", shape.c_str(), r.layout.c_str(),
                r.pass.c_str(), r.us, r.gbps, r.copy_gbps, 100.0 * r.gbps / r.copy_gbps);
  }
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    if (!f) {
      std::fprintf(stderr, "bench_batch_norm: cannot write %s\n", o.json.c_str());
      return 1;
    }
    f << "{\"bench\": \"batch_norm\", \"dtype\": \"" << dtype_name(o.dtype)
      << "\", \"batch\": " << kBatch << ", \"results\": [\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      f << "  {\"channels\": " << r.channels << ", \"size\": " << r.size << ", \"layout\": \""
        << r.layout << "\", \"pass\": \"" << r.pass << "\", \"us\": " << r.us
        << ", \"gbps\": " << r.gbps << ", \"copy_gbps\": " << r.copy_gbps
        << ", \"pct_copy\": " << 100.0 * r.gbps / r.copy_gbps << "}"
        << (i + 1 < results.size() ? ",\n" : "\n");
    }
    f << "]}\n";
  }
  return 0;
}

}  // namespace
}  // namespace fusebox::cuda

int main(int argc, char** argv) {
  fusebox::cuda::Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json" && i + 1 < argc) {
      o.json = argv[++i];
    } else if (arg == "--iters" && i + 1 < argc) {
      o.iters = std::max(1, std::stoi(argv[++i]));
    } else if (arg == "--repeats" && i + 1 < argc) {
      o.repeats = std::max(1, std::stoi(argv[++i]));
    } else if (arg == "--dtype" && i + 1 < argc) {
      const std::string d = argv[++i];
      o.dtype = d == "f32"   ? fusebox::DType::f32
                : d == "f16" ? fusebox::DType::f16
                             : fusebox::DType::bf16;
    } else {
      std::fprintf(stderr,
                   "usage: bench_batch_norm [--json FILE] [--iters N] [--repeats N] "
                   "[--dtype bf16|f16|f32]\n");
      return 2;
    }
  }
  try {
    return fusebox::cuda::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_batch_norm: %s\n", e.what());
    return 1;
  }
}
