// form_linears (passes/fusion.h): nn.Linear as ONNX exporters write it, matmul by a 2-D
// weight then an add of a bias along the last dim, becomes one gemm with that bias:
//
//   y = add(matmul(x [..., K], w [K, N]), bias [N] or [1, .., 1, N])
//     -> y = reshape(gemm(reshape(x, [M, K]), w, bias [N]), [..., N])     M = the rows of x
//
// (no reshapes for a 2-D x; the bias reshaped to [N] when it has leading 1s). A bias-less
// linear of an N-D x (Swin's patch merging, nn.Linear(bias=False)) becomes a gemm the same
// way, without the bias: as a batched matmul by a broadcast weight its weight gradient was a
// matmul per batch index then a reduce_sum over them (Swin-T training: 2.9 ms of its step on
// an H200), as a gemm it is one product over all the rows. The same sums,
// so the same values; the reshapes are views. Run before mixed precision: a gemm runs in the
// low dtype with its bias, as PyTorch's autocast runs nn.Linear, where matmul + add of an f32
// bias would promote the layer's output to f32 (a cast and a pass in f32 per layer, and an
// f32 activation for everything after it). The gemm is emitted where the add was, so a bias
// computed between the two is there by then.
#include <map>

#include "fusebox/passes/fusion.h"
#include "fusion_rewrite.h"

namespace fusebox {

namespace {

struct Linear {
  NodeId matmul;
  ValueId bias;
};

// The bias of `add` when it adds one along the last dim of the matmul's output y.
ValueId bias_of(const Graph& g, const Node& add, ValueId y) {
  const ValueId other = add.inputs[0] == y ? add.inputs[1] : add.inputs[0];
  if (other == y) return kNoValue;  // y + y
  const TensorType &b = g.value(other).type, &out = g.value(y).type;
  if (b.dtype != out.dtype || b.shape.empty() || b.shape.size() > out.shape.size() ||
      b.shape.back() != out.shape.back() || numel(b.shape) != out.shape.back())
    return kNoValue;
  return other;
}

}  // namespace

size_t form_linears(Graph& g, FusionLog* log) {
  const fusion::Readers r(g);
  std::map<NodeId, Linear> at_add;  // the add's node -> its linear
  std::vector<bool> skipped(g.nodes().size(), false);
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::matmul) continue;
    const TensorType &x = g.value(n.inputs[0]).type, &w = g.value(n.inputs[1]).type,
                     &y = g.value(n.outputs[0]).type;
    if (!is_floating(y.dtype) || w.shape.size() != 2 || x.shape.size() < 2) continue;
    const NodeId next = r.only_reader(n.outputs[0]);
    const ValueId bias = next >= 0 && g.node(next).op == OpKind::add
                             ? bias_of(g, g.node(next), n.outputs[0])
                             : kNoValue;
    if (bias != kNoValue) {
      at_add[next] = {n.id, bias};
      skipped[size_t(n.id)] = true;
    } else if (x.shape.size() > 2 && w.shape[1] % 8 == 0) {
      // A bias-less linear, emitted in its own place. Not with columns that are not a multiple
      // of 8 (GPT-2's LM head): pad_product_columns pads those as 2-D matmuls (passes/simplify.h),
      // which fold_cross_entropy then reads through.
      at_add[n.id] = {n.id, kNoValue};
    }
  }
  if (at_add.empty()) return 0;

  fusion::rebuild_expanding(
      g, [&](const Node& n, GraphRewriter& rw) -> std::optional<std::vector<ValueId>> {
        Graph& out = rw.graph();
        auto mapped = [&](ValueId v) { return rw.mapped(v); };
        if (skipped[size_t(n.id)]) return std::vector<ValueId>{kNoValue};  // emitted at its add
        const auto linear = at_add.find(n.id);
        if (linear == at_add.end()) return std::nullopt;
        const Node& matmul = g.node(linear->second.matmul);
        const Shape &x = g.value(matmul.inputs[0]).type.shape,
                    &y = g.value(n.outputs[0]).type.shape;
        const std::string& y_name = g.value(n.outputs[0]).name;
        const int64_t k = x.back(), cols = y.back(), rows = k == 0 ? 0 : numel(x) / k;
        ValueId x2 = mapped(matmul.inputs[0]);
        if (x.size() > 2)
          x2 = out.add_node(OpKind::reshape, ReshapeAttrs{{rows, k}}, {x2}, matmul.name + "/rows",
                            {y_name + "/rows"})[0];
        std::vector<ValueId> operands = {x2, mapped(matmul.inputs[1])};
        const ValueId bias = linear->second.bias;
        if (bias != kNoValue) {
          operands.push_back(mapped(bias));
          if (g.value(bias).type.shape.size() > 1)
            operands.back() = out.add_node(OpKind::reshape, ReshapeAttrs{{cols}}, {operands.back()},
                                           n.name + "/bias_row", {y_name + "/bias_row"})[0];
        }
        const bool flat = x.size() == 2;
        ValueId y2 = out.add_node(OpKind::gemm, GemmAttrs{}, operands, matmul.name,
                                  {flat ? y_name : y_name + "/gemm"})[0];
        if (!flat)  // named for the add it replaces; a bias-less one's for its gemm
          y2 = out.add_node(OpKind::reshape, ReshapeAttrs{y}, {y2},
                            bias != kNoValue ? n.name : matmul.name + "/rows_out", {y_name})[0];
        if (log) {
          std::vector<std::string> ops = {fusion::op_text(matmul)};
          if (bias != kNoValue) ops.push_back(fusion::op_text(n));
          log->add(matmul.name, ops);
        }
        return std::vector<ValueId>{y2};
      });
  return at_add.size();
}

}  // namespace fusebox
