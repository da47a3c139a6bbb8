// A generated pointwise kernel (fused_pointwise: kernels/pointwise/fused.cu) against the
// device's copy bandwidth, and the same chain unfused through the existing kernels (one
// launch per op, every intermediate written and read back). Issue 13's target case: a
// chain of 8 ops on 64M bf16 elements with per-channel inputs,
//
//   y = (relu(gelu(x * a + b) * c + d) + x) * e      x [16, 256, 128, 128]; a..e [256, 1, 1]
//
// in two forms: gelu with approximate=tanh (the target row: >= 90% of the copy bandwidth on
// an H100) and exact gelu (erf), whose formula (erff and an IEEE division per element, the
// unfused kernel's own) is about 45 instructions per element: compute-bound on an H100.
//
// GB/s counts the bytes the fused op must move: every input read once and the output written
// once (x, y and the per-channel vectors). The unfused row's GB/s uses the same bytes (its
// real traffic is 8 reads and 8 writes), so its % is the fused kernel's speedup inverted.
// copy = cudaMemcpy device-to-device of as many bytes. Timing: CUDA events around `iters`
// direct launches, median of `repeats` (bench/common). compile: the first call's host time,
// NVRTC included unless the disk cache (FUSEBOX_CACHE_DIR) held the kernel. The fused kernel
// runs with 1, 2 and 4 vectors per thread step and 1, 2 and 4 steps per loop iteration (the
// library's defaults are the target row).
//
//   bench_fused_pointwise [--dtype bf16|f16|f32] [--shape N,C,H,W] [--iters N] [--repeats N]
//                         [--json FILE]
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/pointwise/fused_codegen.h"
#include "backends/cuda/runtime/nvrtc.h"
#include "common/cli.h"
#include "common/kernel_bench.h"
#include "common/report.h"
#include "fusebox/ir/pointwise_program.h"

namespace fusebox::cuda {
namespace {

using bench::KernelBench;

constexpr double kTargetPctCopy = 90.0;  // the tanh chain, on an H100

struct Options {
  std::string json;
  bench::TimingOptions timing{.iters = 20, .repeats = 5};
  std::string dtype = "bf16";
  std::vector<int64_t> shape = {16, 256, 128, 128};
};

struct Result {
  std::string gelu, mode;
  int vectors = 0;  // fused: 16-byte vectors per thread step (fused_codegen.h)
  int unroll = 0;   // fused: steps per loop iteration
  bench::Bandwidth bandwidth;
  double speedup = 1;     // unfused time / this time
  double compile_ms = 0;  // fused: the first call (NVRTC or the disk cache)
  bool correct = true;    // fused: matches the unfused kernels within the dtype's ulps
};

// The chain as an IR graph: the fused node, and the 8 unfused nodes (normalised Nodes for
// the kernel entries).
struct Chain {
  Graph unfused{"chain_unfused"};
  Graph fused{"chain_fused"};

  Chain(DType t, const Shape& x_shape, const Shape& channel, bool tanh) {
    PointwiseProgram p{6,
                       {{OpKind::mul, {0, 1}},
                        {OpKind::add, {6, 2}},
                        {.op = OpKind::gelu, .operands = {7}, .tanh_approximation = tanh},
                        {OpKind::mul, {8, 3}},
                        {OpKind::add, {9, 4}},
                        {OpKind::relu, {10}},
                        {OpKind::add, {11, 0}},
                        {OpKind::mul, {12, 5}}}};
    std::vector<ValueId> values, fused_in;
    for (const char* name : {"x", "a", "b", "c", "d", "e"}) {
      const Shape& s = name[0] == 'x' ? x_shape : channel;
      values.push_back(unfused.add_input(name, t, s));
      fused_in.push_back(fused.add_input(name, t, s));
    }
    for (size_t i = 0; i < p.instrs.size(); ++i) {
      const PointwiseInstr& ins = p.instrs[i];
      std::vector<ValueId> operands;
      for (int32_t o : ins.operands) operands.push_back(values[size_t(o)]);
      values.push_back(
          unfused.add_node(ins.op, pointwise_instr_attrs(ins), operands, cat("t", i))[0]);
    }
    fused.add_node(OpKind::fused_pointwise, p, fused_in, "chain");
  }
  const Node& fused_node() const { return fused.nodes().back(); }
};

// Elements of `got` farther from `want` than a few ulps of the dtype (both downloaded).
int64_t mismatches(const Tensor& got, const Tensor& want) {
  const double tol = got.dtype() == DType::f32 ? 1e-5 : got.dtype() == DType::f16 ? 4e-3 : 3e-2;
  int64_t bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.get(i), w = want.get(i);
    if (std::isnan(g) != std::isnan(w) || std::fabs(g - w) > tol * (1 + std::fabs(w))) ++bad;
  }
  return bad;
}

Tensor download(KernelBench& b, const DeviceTensor& d) {
  Tensor t = Tensor::empty(d.dtype, d.shape);
  b.encoder().copy_to_host(t.raw(), d.range());
  return t;
}

void run_chain(KernelBench& b, const Options& o, DType t, bool tanh, std::vector<Result>& out) {
  const Shape x_shape(o.shape.begin(), o.shape.end());
  const Shape channel = {x_shape.at(1), 1, 1};
  const Chain chain(t, x_shape, channel, tanh);
  std::vector<DeviceTensor> in = {b.upload(bench::random_host(t, x_shape, 1, -3.0, 3.0))};
  for (uint64_t k = 2; k <= 6; ++k)
    in.push_back(b.upload(bench::random_host(t, channel, k, -1.5, 1.5)));
  std::vector<const DeviceTensor*> in_ptrs;
  for (const DeviceTensor& d : in) in_ptrs.push_back(&d);
  const int64_t n = numel(x_shape);
  const size_t bytes = size_t(2 * n) * dtype_size(t) + 5 * size_t(channel[0]) * dtype_size(t);
  const std::string gelu = tanh ? "tanh" : "erf";

  // Unfused: one kernel per op, each intermediate in its own buffer.
  std::vector<DeviceTensor> values(in.begin(), in.end());
  for (const Node& node : chain.unfused.nodes())
    values.push_back(b.empty(t, chain.unfused.value(node.outputs[0]).type.shape));
  auto unfused = [&](int) {
    size_t v = in.size();
    for (const Node& node : chain.unfused.nodes()) {
      std::vector<const DeviceTensor*> args;
      for (ValueId id : node.inputs) args.push_back(&values[size_t(id)]);
      std::span<DeviceTensor> result(&values[v++], 1);
      if (args.size() == 1)
        unary(b.ctx(), node, args, result);
      else
        binary(b.ctx(), node, args, result);
    }
  };

  unfused(0);
  b.encoder().synchronize();
  const Tensor want = download(b, values.back());
  const double unfused_us = b.time_us(o.timing, unfused);
  out.push_back(
      {gelu, "unfused (8 kernels)", 0, 0, b.bandwidth(o.timing, bytes, unfused_us), 1, 0, true});

  // Fused: the first call of each step width compiles (or loads) its kernel.
  const int default_vectors = fused_vectors_per_step();
  const int default_unroll = fused_steps_per_iteration();
  std::vector<DeviceTensor> y = {b.empty(t, x_shape)};
  auto fused = [&](int) { fused_pointwise(b.ctx(), chain.fused_node(), in_ptrs, y); };
  // Every (vectors per step, steps per iteration) for the tanh chain; the erf chain at the
  // default unroll.
  std::vector<std::pair<int, int>> variants;
  for (int vectors : {1, 2, 4})
    for (int unroll : {1, 2, 4})
      if (tanh || unroll == default_unroll) variants.push_back({vectors, unroll});
  for (const auto& [vectors, unroll] : variants) {
    set_fused_vectors_per_step(vectors);
    set_fused_steps_per_iteration(unroll);
    const GeneratedKernelStats before = generated_kernel_stats();
    const bench::Stopwatch compile;
    fused(0);
    b.encoder().synchronize();
    const bool is_default = vectors == default_vectors && unroll == default_unroll;
    Result f{gelu, is_default ? "fused (default)" : "fused", vectors, unroll, {}, 1, compile.ms()};
    const GeneratedKernelStats after = generated_kernel_stats();
    const char* from = after.compiles > before.compiles     ? "NVRTC"
                       : after.disk_hits > before.disk_hits ? "disk cache"
                                                            : "memory cache";
    std::printf(
        "  gelu %s, %d vectors/step, %d steps/iteration: kernel from %s, first call %.1f ms\n",
        gelu.c_str(), vectors, unroll, from, f.compile_ms);
    f.correct = mismatches(download(b, y[0]), want) == 0;
    const double fused_us = b.time_us(o.timing, fused);
    f.bandwidth = b.bandwidth(o.timing, bytes, fused_us);
    f.speedup = unfused_us / fused_us;
    out.push_back(f);
  }
  set_fused_vectors_per_step(default_vectors);
  set_fused_steps_per_iteration(default_unroll);
}

const bench::Table& table() {
  static const bench::Table t(
      bench::joined({{"gelu", 5, true}, {"mode", 20, true}, {"vec/step", 8}, {"unroll", 6}},
                    bench::joined(bench::Bandwidth::columns(),
                                  {{"speedup", 8}, {"compile ms", 11}, {"correct", 8}})));
  return t;
}

int run(const Options& o) {
  DType t;
  if (!parse_dtype(o.dtype, &t) || !is_floating(t) || t == DType::f64)
    throw std::runtime_error("--dtype must be bf16, f16 or f32");
  if (o.shape.size() != 4) throw std::runtime_error("--shape takes N,C,H,W");
  if (device_count() == 0) {
    std::printf("bench_fused_pointwise: no CUDA device\n");
    return 1;
  }
  KernelBench b;
  std::printf("device: %s\n", b.properties().describe().c_str());
  std::printf("chain: y = (relu(gelu(x * a + b) * c + d) + x) * e, %s x %s, a..e [%lld, 1, 1]\n",
              o.dtype.c_str(), shape_str(Shape(o.shape.begin(), o.shape.end())).c_str(),
              static_cast<long long>(o.shape[1]));
  std::vector<Result> results;
  for (bool tanh : {true, false}) run_chain(b, o, t, tanh, results);

  std::printf(
      "\n(GB/s: the fused op's bytes, inputs read once + output written once; copy: "
      "cudaMemcpy D2D of as many bytes)\n");
  table().print_header();
  const Result* target = nullptr;
  for (const Result& r : results) {
    const bool fused = r.vectors > 0;
    if (!target && r.mode == "fused (default)") target = &r;  // tanh comes first
    table().print_row(bench::joined(
        {r.gelu, r.mode, fused ? std::to_string(r.vectors) : "",
         fused ? std::to_string(r.unroll) : ""},
        bench::joined(r.bandwidth.cells(),
                      {bench::fixed(r.speedup, 2) + "x", fused ? bench::fixed(r.compile_ms, 1) : "",
                       fused ? (r.correct ? "yes" : "NO") : ""})));
  }
  const double pct = target ? target->bandwidth.pct_copy() : 0;
  const bool met = pct >= kTargetPctCopy;
  std::printf("target: the fused tanh chain >= %.0f%% of copy bandwidth: %s (%.1f%%)\n",
              kTargetPctCopy, met ? "met" : "NOT met", pct);

  bench::Json rows = bench::Json::array();
  for (const Result& r : results) {
    rows.push(r.bandwidth.appended_to(bench::Json::object({{"gelu", r.gelu},
                                                           {"mode", r.mode},
                                                           {"vectors_per_step", r.vectors},
                                                           {"steps_per_iteration", r.unroll},
                                                           {"speedup", r.speedup},
                                                           {"compile_ms", r.compile_ms},
                                                           {"correct", r.correct}})));
  }
  bench::Json report = bench::report("fused_pointwise");
  report.set("dtype", o.dtype)
      .set("shape", shape_str(Shape(o.shape.begin(), o.shape.end())))
      .set("ops", 8)
      .set("target_pct_copy", kTargetPctCopy)
      .set("target_met", met)
      .set("results", std::move(rows));
  bench::write_report(o.json, report);
  bool correct = true;
  for (const Result& r : results) correct = correct && r.correct;
  return correct ? 0 : 2;
}

}  // namespace
}  // namespace fusebox::cuda

int main(int argc, char** argv) {
  fusebox::cuda::Options o;
  fusebox::bench::Cli cli("bench_fused_pointwise",
                          "A generated pointwise kernel (8-op chain) against the copy bandwidth "
                          "and the unfused kernels",
                          o.json);
  cli.add_timing(o.timing);
  cli.app().add_option("--dtype", o.dtype, "bf16, f16 or f32")->capture_default_str();
  cli.app()
      .add_option("--shape", o.shape, "x's shape N,C,H,W (a..e are [C, 1, 1])")
      ->delimiter(',')
      ->expected(4)
      ->capture_default_str();
  return cli.run(argc, argv, [&] { return fusebox::cuda::run(o); });
}
