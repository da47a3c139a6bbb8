// The convolution fusions of inference graphs (passes/fusion.h): batch-norm folding and
// conv epilogues, on the shared rewrite (passes/fusion/fusion_rewrite.h).
#include <cmath>
#include <string>
#include <vector>

#include "fusebox/passes/fusion.h"
#include "fusion_rewrite.h"

namespace fusebox {
namespace {

using fusion::op_text;
using fusion::Readers;
using fusion::Takeover;

// A conv without an epilogue yet (nothing fused after it).
bool plain_conv(const Node& n) {
  if (n.op != OpKind::conv) return false;
  const auto& a = std::get<ConvAttrs>(n.attrs);
  return !a.activation && !a.residual_activation &&
         (n.inputs.size() < 4 || n.inputs[3] == kNoValue);
}

bool float_dtype(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}

}  // namespace

size_t fold_batch_norms(Graph& g, FusionLog* log) {
  const Readers r(g);
  std::vector<Takeover> takeover(g.nodes().size());
  size_t count = 0;
  const size_t nodes = g.nodes().size();
  for (size_t i = 0; i < nodes; ++i) {
    const Node bn = g.node(NodeId(i));  // a copy: add_constant below may grow the graph
    if (bn.op != OpKind::batch_norm) continue;
    const auto& b = std::get<BatchNormAttrs>(bn.attrs);
    if (b.training || b.relu || (bn.inputs.size() > 5 && bn.inputs[5] != kNoValue)) continue;
    const ValueId x = bn.inputs[0];
    const NodeId producer = g.value(x).producer;
    if (producer < 0 || r.only_reader(x) != bn.id) continue;
    const Node conv = g.node(producer);
    if (!plain_conv(conv)) continue;
    // Everything folded must be known now: the weight, the bias if any, the statistics.
    const ValueId w = conv.inputs[1];
    const ValueId conv_bias = conv.inputs.size() > 2 ? conv.inputs[2] : kNoValue;
    bool known = g.is_constant(w) && (conv_bias == kNoValue || g.is_constant(conv_bias));
    for (size_t k = 1; k < 5; ++k) known = known && g.is_constant(bn.inputs[k]);
    if (!known || !float_dtype(g.value(w).type.dtype)) continue;

    // W'[k] = W[k] * s[k], b'[k] = (b[k] - mean[k]) * s[k] + beta[k], s = gamma / sqrt(var +
    // eps): in f64, each rounded once to the weight's dtype.
    const Tensor& wt = g.constants().at(w);
    const Tensor& gamma = g.constants().at(bn.inputs[1]);
    const Tensor& beta = g.constants().at(bn.inputs[2]);
    const Tensor& mean = g.constants().at(bn.inputs[3]);
    const Tensor& var = g.constants().at(bn.inputs[4]);
    const int64_t channels = wt.shape().at(0);
    if (gamma.numel() != channels) continue;
    const int64_t per_channel = channels > 0 ? wt.numel() / channels : 0;
    Tensor folded_w = Tensor::empty(wt.dtype(), wt.shape());
    Tensor folded_b = Tensor::empty(wt.dtype(), {channels});
    for (int64_t k = 0; k < channels; ++k) {
      const double s = gamma.get(k) / std::sqrt(var.get(k) + b.epsilon);
      for (int64_t j = 0; j < per_channel; ++j)
        folded_w.set(k * per_channel + j, wt.get(k * per_channel + j) * s);
      const double bias_k = conv_bias == kNoValue ? 0.0 : g.constants().at(conv_bias).get(k);
      folded_b.set(k, (bias_k - mean.get(k)) * s + beta.get(k));
    }
    const ValueId new_w = g.add_constant(g.value(w).name + "/folded:" + bn.name, folded_w);
    const ValueId new_b = g.add_constant(conv.name + "/bias/folded:" + bn.name, folded_b);
    takeover[size_t(conv.id)] = {{bn.id}, bn.outputs[0], conv.attrs, {{1, new_w}, {2, new_b}}};
    if (log) log->add(conv.name, {op_text(conv), op_text(bn) + " (folded)"});
    ++count;
  }
  if (count > 0) {
    takeover.resize(g.nodes().size());
    fusion::rebuild(g, takeover);
  }
  return count;
}

size_t fuse_conv_epilogues(Graph& g, FusionLog* log) {
  const Readers r(g);
  std::vector<Takeover> takeover(g.nodes().size());
  std::vector<bool> taken(g.nodes().size(), false);  // nodes already taken over
  size_t count = 0;
  for (const Node& conv : g.nodes()) {
    if (!plain_conv(conv) || !float_dtype(g.value(conv.outputs[0]).type.dtype)) continue;
    const TensorType& y_type = g.value(conv.outputs[0]).type;
    Takeover t{{}, conv.outputs[0], conv.attrs, {}};
    auto& attrs = std::get<ConvAttrs>(t.attrs);
    std::vector<std::string> ops = {op_text(conv)};
    // The one reader of the value written so far, unless taken.
    fusion::Chain chain{g, r, taken, t, ops};
    const Node* n = chain.next();
    if (n && fusion::activation_of(*n)) {
      attrs.activation = fusion::activation_of(*n);
      chain.take(*n);
      n = chain.next();
    }
    if (n && n->op == OpKind::add) {
      // The residual: the add's other operand, of y's type exactly (no broadcasting), and not
      // y itself.
      const ValueId other = n->inputs.at(0) == t.writes ? n->inputs.at(1) : n->inputs.at(0);
      if (other != t.writes && g.value(other).type == y_type) {
        t.inputs.push_back({3, other});
        chain.take(*n);
        n = chain.next();
        if (n && fusion::activation_of(*n)) {
          attrs.residual_activation = fusion::activation_of(*n);
          chain.take(*n);
        }
      }
    }
    if (t.replaced.empty()) continue;
    for (NodeId m : t.replaced) taken[size_t(m)] = true;
    if (log) log->add(conv.name, ops);
    takeover[size_t(conv.id)] = std::move(t);
    ++count;
  }
  if (count > 0) fusion::rebuild(g, takeover);
  return count;
}

}  // namespace fusebox
