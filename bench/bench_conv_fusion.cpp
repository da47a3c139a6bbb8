// Convolutions with fused epilogues (ir/ops.h ConvAttrs) on the CUDA backend, bf16,
// channels-last, batch 64: each case three ways, the same kernels path a compiled model takes
// (kernels.h conv_forward):
//   fused   one cuDNN graph (conv + bias + activation [+ residual + activation])
//   split   FUSEBOX_CUDNN_FUSION=refuse: the plain convolution, then the epilogue kernel
//   conv    the convolution alone (no bias, no epilogue): the floor the fused graph nears
// Cases: the anchor (1x1 C64->256 at 56x56 + bias + relu, target <= 0.06 ms; PyTorch
// eager 0.277 ms with bias and relu as separate kernels), ResNet-50's block ends (1x1 conv +
// bias + residual + relu at each stage) and a 3x3 conv + bias + relu. bench/torch_conv_fusion.py
// times PyTorch on the same cases (eager and torch.compile).
//
//   bench_conv_fusion [--json FILE] [--iters N] [--repeats N]
//
// Timing: `iters` calls recorded into one CUDA graph, replayed `repeats` times between CUDA
// events, the median per call (KernelBench::replay_us). Random inputs in [-1, 1).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/conv/report.h"
#include "common/cli.h"
#include "common/kernel_bench.h"
#include "common/report.h"
#include "fusebox/ir/graph.h"

namespace fusebox::cuda {
namespace {

using bench::KernelBench;

constexpr int64_t kBatch = 64;
constexpr double kAnchorTargetMs = 0.06;

struct Case {
  const char* name;
  int64_t c, k, hw, r;
  bool residual;
};

// name, C, K, H=W, R, residual (else relu on conv + bias)
const Case kCases[] = {
    {"anchor_1x1_c64k256_56_bias_relu", 64, 256, 56, 1, false},
    {"l1_3x3_c64k64_56_bias_relu", 64, 64, 56, 3, false},
    {"l1_end_1x1_c64k256_56_residual_relu", 64, 256, 56, 1, true},
    {"l2_end_1x1_c128k512_28_residual_relu", 128, 512, 28, 1, true},
    {"l3_end_1x1_c256k1024_14_residual_relu", 256, 1024, 14, 1, true},
    {"l4_end_1x1_c512k2048_7_residual_relu", 512, 2048, 7, 1, true},
};

struct Result {
  std::string name;
  double fused_ms = 0, split_ms = 0, conv_ms = 0;
  std::string fused_path, fused_plan;
};

struct Setup {
  DeviceTensor x, w, bias, residual, y;
  Node fused, plain;
};

Setup make_setup(KernelBench& b, const Case& c) {
  const DType dt = DType::bf16;
  const Shape xs = {kBatch, c.c, c.hw, c.hw}, ws = {c.k, c.c, c.r, c.r},
              ys = {kBatch, c.k, c.hw, c.hw};
  ConvAttrs plain;
  plain.strides = {1, 1};
  plain.dilations = {1, 1};
  plain.pads_begin = {c.r / 2, c.r / 2};
  plain.pads_end = {c.r / 2, c.r / 2};
  ConvAttrs fused = plain;
  (c.residual ? fused.residual_activation : fused.activation).kind = Activation::relu;
  Graph g("bench_conv_fusion");
  const ValueId x = g.add_input("x", dt, xs), w = g.add_input("w", dt, ws),
                bias = g.add_input("bias", dt, {c.k}), z = g.add_input("z", dt, ys);
  g.add_node(OpKind::conv, fused,
             c.residual ? std::vector<ValueId>{x, w, bias, z} : std::vector<ValueId>{x, w, bias},
             cat(c.name, ".fused"));
  Setup s;
  s.fused = g.nodes().back();
  g.add_node(OpKind::conv, plain, {x, w}, cat(c.name, ".conv"));
  s.plain = g.nodes().back();
  auto random = [&](const Shape& shape, uint64_t seed, MemoryFormat f) {
    return b.upload(bench::random_host(dt, shape, seed, -1, 1), f);
  };
  s.x = random(xs, 1, MemoryFormat::channels_last);
  s.w = random(ws, 2, MemoryFormat::channels_last);
  s.bias = random({c.k}, 3, MemoryFormat::contiguous);
  s.residual = random(ys, 4, MemoryFormat::channels_last);
  s.y = b.empty(dt, ys, MemoryFormat::channels_last);
  return s;
}

double time_ms(KernelBench& b, const bench::TimingOptions& t, Setup& s, bool fused, bool residual) {
  return b.replay_us(t, [&] {
    std::vector<DeviceTensor> out = {s.y};
    std::vector<const DeviceTensor*> in = {&s.x, &s.w};
    if (fused) in.push_back(&s.bias);
    if (fused && residual) in.push_back(&s.residual);
    conv_forward(b.ctx(), fused ? s.fused : s.plain, in, out);
  }) / 1e3;
}

}  // namespace

int run(const std::string& json, const bench::TimingOptions& timing) {
  KernelBench b(CommandEncoder::Options::from_env());  // graphs, as a compiled model's
  std::vector<Result> results;
  std::printf("%-40s %10s %10s %10s  %s\n", "case (bf16, NHWC, N=64)", "fused ms", "split ms",
              "conv ms", "fused path");
  for (const Case& c : kCases) {
    Setup s = make_setup(b, c);
    Result r{c.name};
    clear_conv_decisions();
    r.fused_ms = time_ms(b, timing, s, true, c.residual);
    for (const ConvDecision& d : conv_decisions()) {
      if (d.node.find(".fused'") == std::string::npos) continue;
      r.fused_path = d.path;
      r.fused_plan = d.plan;
    }
    bench::set_setting("FUSEBOX_CUDNN_FUSION", "refuse");
    r.split_ms = time_ms(b, timing, s, true, c.residual);
    bench::set_setting("FUSEBOX_CUDNN_FUSION", nullptr);
    r.conv_ms = time_ms(b, timing, s, false, c.residual);
    std::printf("%-40s %10.4f %10.4f %10.4f  %s [%s]\n", c.name, r.fused_ms, r.split_ms, r.conv_ms,
                r.fused_path.c_str(), r.fused_plan.c_str());
    results.push_back(r);
  }
  const Result& anchor = results.front();
  std::printf("anchor conv+bias+relu 1x1 C64->256 56x56 N64 bf16: %.4f ms (target <= %.2f): %s\n",
              anchor.fused_ms, kAnchorTargetMs,
              anchor.fused_ms <= kAnchorTargetMs ? "met" : "NOT met");

  bench::Json rows = bench::Json::array();
  for (const Result& r : results) {
    rows.push(bench::Json::object({{"case", r.name},
                                   {"fused_ms", r.fused_ms},
                                   {"split_ms", r.split_ms},
                                   {"conv_ms", r.conv_ms},
                                   {"fused_path", r.fused_path},
                                   {"fused_plan", r.fused_plan}}));
  }
  bench::write_report(json, bench::report("bench_conv_fusion")
                                .set("batch", kBatch)
                                .set("dtype", "bf16")
                                .set("layout", "channels_last")
                                .set("anchor_target_ms", kAnchorTargetMs)
                                .set("results", std::move(rows)));
  return 0;
}

}  // namespace fusebox::cuda

int main(int argc, char** argv) {
  std::string json;
  fusebox::bench::TimingOptions timing{.iters = 20, .repeats = 7};
  fusebox::bench::Cli cli("bench_conv_fusion",
                          "Convolutions with fused epilogues: one cuDNN graph vs split vs the "
                          "convolution alone (bf16, NHWC, batch 64)",
                          json);
  cli.add_timing(timing);
  return cli.run(argc, argv, [&] { return fusebox::cuda::run(json, timing); });
}
