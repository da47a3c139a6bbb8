// Issue 40 item 5's question, per ResNet-50 1x1 forward convolution of a training step (batch
// 256, bf16, channels-last): does the statistics GEMM (kernels/conv/engines/cutlass_bn/) beat
// the convolution followed by the batch norm's statistics pass?
//
//   today   conv_ms (the kernels path a compiled model takes: cuDNN or ours, as chosen)
//           + bn_train_ms (the training batch norm: statistics pass, then y)
//   fused   stats_gemm_ms (the convolution writing y and per-tile sums)
//           + merge_ms (the tile sums merged into the channels' statistics:
//             channel_moments_from_tile_sums, as a compiled step runs it)
//           + bn_apply_ms (the inference form, y = x * k + b: the pass left once the
//             statistics are given)
//
// Columns: those times (ms) and fused / today (< 1: the fused form wins). stats_gemm: its one
// tile, 128 x 64 (a 128 x 128 instance and CUTLASS's bounds-checked reductions were timed and
// dropped: bench/results/2026-12-02_h200_issue40_session50/). conv cutlass: the same
// convolution forced onto the CUTLASS engine (FUSEBOX_CONV_ENGINE=cutlass: the plain-epilogue
// GEMM the statistics GEMM extends), so that the epilogue's own cost reads off directly.
//
//   bench_norm_stats [--json FILE] [--iters N] [--repeats N]
//
// Timing: `iters` calls recorded into one CUDA graph, replayed `repeats` times between CUDA
// events, the median per call (KernelBench::replay_us). Random inputs in [-1, 1).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/conv/engines/cutlass_bn/stats_gemm.h"
#include "common/cli.h"
#include "common/kernel_bench.h"
#include "common/report.h"
#include "fusebox/ir/graph.h"

namespace fusebox::cuda {
namespace {

using bench::KernelBench;

constexpr int64_t kBatch = 256;

struct Case {
  const char* name;
  int64_t c, k, hw;
};

// ResNet-50's 1x1 stride-1 convolutions that feed a batch norm (C in, K out, H = W).
const Case kCases[] = {
    {"l1_1x1_c64k256_56", 64, 256, 56},     {"l1_1x1_c256k64_56", 256, 64, 56},
    {"l2_1x1_c128k512_28", 128, 512, 28},   {"l2_1x1_c512k128_28", 512, 128, 28},
    {"l3_1x1_c256k1024_14", 256, 1024, 14}, {"l3_1x1_c1024k256_14", 1024, 256, 14},
    {"l4_1x1_c512k2048_7", 512, 2048, 7},   {"l4_1x1_c2048k512_7", 2048, 512, 7},
};

struct Result {
  std::string name;
  double conv_ms = 0, conv_cutlass_ms = 0, bn_train_ms = 0, bn_apply_ms = 0, stats_ms = -1,
         merge_ms = 0;
  std::string refused;  // why the statistics GEMM refused, if it did
  double today() const { return conv_ms + bn_train_ms; }
  double fused() const { return stats_ms < 0 ? -1 : stats_ms + merge_ms + bn_apply_ms; }
};

Node conv_node(const Case& c) {
  Graph g("bench_norm_stats");
  ConvAttrs a;
  a.strides = {1, 1};
  a.dilations = {1, 1};
  a.pads_begin = {0, 0};
  a.pads_end = {0, 0};
  const ValueId x = g.add_input("x", DType::bf16, {kBatch, c.c, c.hw, c.hw});
  const ValueId w = g.add_input("w", DType::bf16, {c.k, c.c, 1, 1});
  g.add_node(OpKind::conv, a, {x, w}, cat(c.name, ".conv"));
  return g.nodes().back();
}

Node bn_node(const Case& c, bool training) {
  Graph g("bench_norm_stats");
  const Shape per_channel = {c.k};
  std::vector<ValueId> in = {
      g.add_input("x", DType::bf16, {kBatch, c.k, c.hw, c.hw}),
      g.add_input("scale", DType::bf16, per_channel), g.add_input("bias", DType::bf16, per_channel),
      g.add_input("mean", DType::bf16, per_channel), g.add_input("var", DType::bf16, per_channel)};
  g.add_node(OpKind::batch_norm, BatchNormAttrs{1e-5, 0.9, training}, in, cat(c.name, ".bn"));
  return g.nodes().back();
}

Result run_case(KernelBench& b, const bench::TimingOptions& t, const Case& c) {
  const DType dt = DType::bf16;
  const auto nhwc = MemoryFormat::channels_last, dense = MemoryFormat::contiguous;
  const Shape xs = {kBatch, c.c, c.hw, c.hw}, ys = {kBatch, c.k, c.hw, c.hw};
  DeviceTensor x = b.upload(bench::random_host(dt, xs, 1, -1, 1), nhwc);
  DeviceTensor w = b.upload(bench::random_host(dt, {c.k, c.c, 1, 1}, 2, -1, 1), nhwc);
  DeviceTensor y = b.empty(dt, ys, nhwc), z = b.empty(dt, ys, nhwc);
  DeviceTensor scale = b.upload(bench::random_host(dt, {c.k}, 3, 0.5, 1.5), dense);
  DeviceTensor bias = b.upload(bench::random_host(dt, {c.k}, 4, -1, 1), dense);
  DeviceTensor mean = b.upload(bench::random_host(dt, {c.k}, 5, -1, 1), dense);
  DeviceTensor var = b.upload(bench::random_host(dt, {c.k}, 6, 0.5, 2), dense);
  std::vector<DeviceTensor> stats;
  for (int i = 0; i < 4; ++i) stats.push_back(b.empty(dt, {c.k}, dense));

  Result r{c.name};
  const Node conv = conv_node(c);
  auto time_conv = [&] {
    return b.replay_us(t, [&] {
      std::vector<DeviceTensor> out = {y};
      const DeviceTensor* in[] = {&x, &w};
      conv_forward(b.ctx(), conv, in, out);
    }) / 1e3;
  };
  r.conv_ms = time_conv();
  if (b.properties().compute_capability() == 90) {
    bench::set_setting("FUSEBOX_CONV_ENGINE", "cutlass");
    r.conv_cutlass_ms = time_conv();
    bench::set_setting("FUSEBOX_CONV_ENGINE", nullptr);
  }
  for (bool training : {true, false}) {
    const Node bn = bn_node(c, training);
    const double ms = b.replay_us(t, [&] {
      const DeviceTensor* in[] = {&y, &scale, &bias, &mean, &var};
      std::vector<DeviceTensor> out = {z};
      if (training) out.insert(out.end(), stats.begin(), stats.end());
      batch_norm(b.ctx(), bn, in, out);
    }) / 1e3;
    (training ? r.bn_train_ms : r.bn_apply_ms) = ms;
  }
  if (b.properties().compute_capability() != 90) {
    r.refused = "the statistics GEMM is sm_90a code";
    return r;
  }
  const int64_t m = kBatch * c.hw * c.hw;
  const int64_t slots = cutlass_bn::stats_partial_rows(m) * cutlass_bn::stats_partial_cols(c.k);
  DeviceTensor sums = b.empty(DType::f32, {slots}), squares = b.empty(DType::f32, {slots});
  const cutlass_bn::StatsGemmCall call{
      m, c.k, c.c, x.data(), w.data(), y.data(), sums.as<float>(), squares.as<float>()};
  std::optional<std::string> why;
  const double ms = b.replay_us(t, [&] {
    why = cutlass_bn::record_stats_gemm(b.ctx(), call, {x.range(), w.range()},
                                        {y.range(), sums.range(), squares.range()});
  }) / 1e3;
  if (why) {
    r.refused = *why;
    return r;
  }
  r.stats_ms = ms;
  DeviceTensor moments = b.empty(DType::f64, {c.k, 3});
  const BatchNormTileSums tile_sums{call.sums,
                                    call.squares,
                                    {sums.range(), squares.range()},
                                    cutlass_bn::stats_partial_rows(m),
                                    cutlass_bn::stats_partial_cols(c.k),
                                    cutlass_bn::kStatsTileM,
                                    m};
  r.merge_ms = b.replay_us(t, [&] {
    channel_moments_from_tile_sums(b.ctx(), c.name, tile_sums, c.k, moments);
  }) / 1e3;
  return r;
}

int run(const std::string& json, const bench::TimingOptions& timing) {
  KernelBench b(CommandEncoder::Options::from_env());  // graphs, as a compiled model's
  std::vector<Result> results;
  std::printf("%-22s %9s %9s %9s %9s %9s %9s %8s  (batch %lld, bf16, NHWC; ms)\n", "case", "conv",
              "cutlass", "bn train", "bn apply", "stats", "merge", "fused/today",
              static_cast<long long>(kBatch));
  double today = 0, fused = 0;
  for (const Case& c : kCases) {
    const Result r = run_case(b, timing, c);
    std::printf("%-22s %9.4f %9.4f %9.4f %9.4f %9.4f %9.4f %8.3f  %s\n", r.name.c_str(), r.conv_ms,
                r.conv_cutlass_ms, r.bn_train_ms, r.bn_apply_ms, r.stats_ms, r.merge_ms,
                r.fused() > 0 ? r.fused() / r.today() : -1.0, r.refused.c_str());
    today += r.today();
    fused += r.fused() > 0 ? r.fused() : r.today();
    results.push_back(r);
  }
  std::printf("all cases: today %.4f ms, fused %.4f ms (%.3f)\n", today, fused, fused / today);
  bench::Json rows = bench::Json::array();
  for (const Result& r : results) {
    rows.push(bench::Json::object({{"case", r.name},
                                   {"conv_ms", r.conv_ms},
                                   {"conv_cutlass_ms", r.conv_cutlass_ms},
                                   {"bn_train_ms", r.bn_train_ms},
                                   {"bn_apply_ms", r.bn_apply_ms},
                                   {"stats_gemm_ms", r.stats_ms},
                                   {"merge_ms", r.merge_ms},
                                   {"today_ms", r.today()},
                                   {"fused_ms", r.fused()},
                                   {"refused", r.refused}}));
  }
  bench::write_report(json, bench::report("bench_norm_stats")
                                .set("batch", kBatch)
                                .set("dtype", "bf16")
                                .set("layout", "channels_last")
                                .set("today_ms", today)
                                .set("fused_ms", fused)
                                .set("results", std::move(rows)));
  return 0;
}

}  // namespace
}  // namespace fusebox::cuda

int main(int argc, char** argv) {
  std::string json;
  fusebox::bench::TimingOptions timing{.iters = 20, .repeats = 7};
  fusebox::bench::Cli cli("bench_norm_stats",
                          "ResNet-50's 1x1 convolutions + training batch norm against the "
                          "statistics GEMM + the norm's apply pass (bf16, NHWC, batch 256)",
                          json);
  cli.add_timing(timing);
  return cli.run(argc, argv, [&] { return fusebox::cuda::run(json, timing); });
}
