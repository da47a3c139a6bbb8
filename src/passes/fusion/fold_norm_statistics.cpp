// fold_norm_statistics (passes/fusion.h): a training batch_norm whose x a plain 1x1 convolution
// writes takes x's statistics from that convolution instead of its own pass over x:
//
//   y = conv(x, w);                      y, s = conv[channel_stats](x, w);
//   batch_norm(y, ...)              ->   batch_norm(y, ..., batch_stats = s)
//
// s is f64 [K, 3] (count, mean, M2 per output channel of y as stored: ir/ops.h), the statistics
// the norm computes from y, so the step's values do not change (bit for bit on the CPU). The
// convolution keeps its place and its outputs; it gains output 1. Every such norm reading y
// takes s.
#include <vector>

#include "fusebox/passes/fusion.h"
#include "fusion_rewrite.h"

namespace fusebox {
namespace {

constexpr size_t kBatchStatsInput = 6;  // batch_norm's batch_stats (ir/ops.h)

bool all_equal(const std::vector<int64_t>& v, int64_t value) {
  for (int64_t x : v)
    if (x != value) return false;
  return true;
}

// Whether conv node p is a convolution the statistics GEMM carries
// (backends/cuda/kernels/conv/engines/cutlass_bn/stats_gemm.h): 2-D, 1x1, stride 1, no
// padding or dilation, one group, no bias or epilogue, bf16; channels in multiples of 64 and
// at least min_pixels pixels (N * H * W): the shapes where it was measured to win
// (passes/fusion.h kNormStatisticsMinPixels).
bool carries_statistics(const Graph& g, const Node& p, int64_t min_pixels) {
  if (p.op != OpKind::conv) return false;
  const auto& a = std::get<ConvAttrs>(p.attrs);
  if (a.channel_stats || a.activation || a.residual_activation || a.groups != 1) return false;
  for (size_t i = 2; i < p.inputs.size(); ++i)
    if (p.inputs[i] != kNoValue) return false;  // bias, residual
  const TensorType& w = g.value(p.inputs[1]).type;
  const TensorType& y = g.value(p.outputs[0]).type;
  if (y.dtype != DType::bf16 || w.shape.size() != 4 || w.shape[2] != 1 || w.shape[3] != 1)
    return false;
  if (w.shape[0] % 64 != 0 || w.shape[1] % 64 != 0) return false;
  if (y.shape.size() != 4 || numel(y.shape) / w.shape[0] < min_pixels) return false;
  return all_equal(a.strides, 1) && all_equal(a.dilations, 1) && all_equal(a.pads_begin, 0) &&
         all_equal(a.pads_end, 0);
}

// The training batch norm n folds: not synchronized, no statistics given yet, its x output 0
// of a convolution that carries_statistics.
bool folds(const Graph& g, const Node& n, int64_t min_pixels) {
  if (n.op != OpKind::batch_norm) return false;
  const auto& a = std::get<BatchNormAttrs>(n.attrs);
  if (!a.training || a.sync) return false;
  if (n.inputs.size() > kBatchStatsInput && n.inputs[kBatchStatsInput] != kNoValue) return false;
  const Value& x = g.value(n.inputs[0]);
  return x.producer >= 0 && g.node(x.producer).outputs[0] == x.id &&
         carries_statistics(g, g.node(x.producer), min_pixels);
}

}  // namespace

size_t fold_norm_statistics(Graph& g, FusionLog* log, int64_t min_pixels) {
  std::vector<bool> stats_of(g.nodes().size(), false);  // by conv: writes the statistics
  std::vector<bool> takes(g.nodes().size(), false);     // by batch_norm: reads them
  size_t count = 0;
  for (const Node& n : g.nodes()) {
    if (!folds(g, n, min_pixels)) continue;
    takes[size_t(n.id)] = true;
    stats_of[size_t(g.value(n.inputs[0]).producer)] = true;
    ++count;
  }
  if (count == 0) return 0;

  std::vector<ValueId> stats(g.nodes().size(), kNoValue);  // by conv: its new output 1
  fusion::rebuild_expanding(
      g, [&](const Node& n, GraphRewriter& rw) -> std::optional<std::vector<ValueId>> {
        if (stats_of[size_t(n.id)]) {
          auto attrs = std::get<ConvAttrs>(n.attrs);
          attrs.channel_stats = true;
          std::vector<ValueId> inputs;
          for (ValueId v : n.inputs) inputs.push_back(rw.mapped(v));
          std::vector<std::string> names = rw.output_names(n);
          names.push_back(rw.fresh_name(names[0] + "/channel_stats"));
          const std::vector<ValueId> outs = rw.emit(n, n.op, attrs, std::move(inputs), names);
          stats[size_t(n.id)] = outs.at(1);
          return std::vector<ValueId>{outs.at(0)};
        }
        if (!takes[size_t(n.id)]) return std::nullopt;
        std::vector<ValueId> inputs(kBatchStatsInput + 1, kNoValue);
        for (size_t i = 0; i < n.inputs.size(); ++i) inputs[i] = rw.mapped(n.inputs[i]);
        const Node& conv = g.node(g.value(n.inputs[0]).producer);
        inputs[kBatchStatsInput] = stats[size_t(conv.id)];
        if (log) log->add(n.name, {fusion::op_text(conv) + " (statistics)", fusion::op_text(n)});
        return rw.emit(n, n.op, n.attrs, std::move(inputs), rw.output_names(n));
      });
  return count;
}

}  // namespace fusebox
