// fuse_gemm_epilogues (passes/fusion.h): a linear layer's bias add and activation taken
// into its product, on the shared rewrite (passes/fusion/fusion_rewrite.h).
#include <string>
#include <vector>

#include "fusebox/passes/fusion.h"
#include "fusion_rewrite.h"

namespace fusebox {
namespace {

using fusion::op_text;
using fusion::Readers;
using fusion::Takeover;

bool has_input(const Node& n, size_t i) {
  return i < n.inputs.size() && n.inputs[i] != kNoValue;
}

// A product that may take an epilogue: a gemm without an activation, or a matmul of two 2-D
// operands (numpy matmul is then gemm's product); float, as gemm requires.
bool fusible_product(const Graph& g, const Node& n) {
  if (!is_floating(g.value(n.outputs[0]).type.dtype)) return false;
  if (n.op == OpKind::gemm) return !std::get<GemmAttrs>(n.attrs).activation;
  return n.op == OpKind::matmul && g.value(n.inputs[0]).type.shape.size() == 2 &&
         g.value(n.inputs[1]).type.shape.size() == 2;
}

// The activations a gemm takes: those cuBLASLt computes in its epilogue (relu, gelu's tanh
// form). Any other would run as a pass over y after the product, slower than the generated
// kernel the pointwise chains make of it with its neighbours: ViT-B/16's erf GELU as the
// mlp.0 gemm's pass, 0.36 ms against 0.17 (gemm + bias) + 0.12 (generated) on an H200.
bool epilogue_activation(const Node& n) {
  const FusedActivation a = fusion::activation_of(n);
  return a.kind == Activation::relu || a.kind == Activation::gelu_tanh;
}

// gemm -> reshape -> activation, the reshape read by the activation alone and the product by
// the reshape alone, becomes gemm -> activation -> reshape (the reshape keeps its name and
// writes the activation's value), so that the gemm can take the activation: form_linears
// leaves a linear layer of N-D rows (every transformer's MLP) as a gemm of [M, N] viewed back
// as [..., N], and the activation reads the view. The same values: an activation is
// elementwise. Returns the number moved.
size_t move_activations_above_reshapes(Graph& g) {
  const Readers r(g);
  std::vector<NodeId> moved_above(g.nodes().size(), -1);  // activation -> the reshape it reads
  std::vector<bool> reshape_moved(g.nodes().size(), false);
  size_t count = 0;
  for (const Node& reshape : g.nodes()) {
    if (reshape.op != OpKind::reshape) continue;
    const NodeId product = g.value(reshape.inputs[0]).producer;
    if (product < 0 || !fusible_product(g, g.node(product)) ||
        r.only_reader(reshape.inputs[0]) != reshape.id)
      continue;
    const NodeId activation = r.only_reader(reshape.outputs[0]);
    if (activation < 0 || !epilogue_activation(g.node(activation))) continue;
    moved_above[size_t(activation)] = reshape.id;
    reshape_moved[size_t(reshape.id)] = true;
    ++count;
  }
  if (count == 0) return 0;
  GraphRewriter rw(g);
  for (const Node& n : g.nodes()) {
    if (reshape_moved[size_t(n.id)]) continue;  // emitted after its activation
    const NodeId reshape_id = moved_above[size_t(n.id)];
    if (reshape_id < 0) {
      rw.copy(n);
      continue;
    }
    const Node& reshape = g.node(reshape_id);
    const ValueId rows = rw.mapped(reshape.inputs[0]);
    const std::string rows_name = rw.fresh_name(g.value(n.outputs[0]).name + "/rows");
    const ValueId activated = rw.graph().add_node(n.op, n.attrs, {rows}, n.name, {rows_name})[0];
    rw.map(n.outputs[0], rw.graph().add_node(OpKind::reshape, reshape.attrs, {activated},
                                             reshape.name, rw.output_names(n))[0]);
  }
  g = rw.finish();
  return count;
}

}  // namespace

size_t fuse_gemm_epilogues(Graph& g, FusionLog* log) {
  move_activations_above_reshapes(g);
  const Readers r(g);
  std::vector<Takeover> takeover(g.nodes().size());
  std::vector<bool> taken(g.nodes().size(), false);  // nodes already taken over (an add of
                                                     // two products goes to the first)
  size_t count = 0;
  for (const Node& product : g.nodes()) {
    if (!fusible_product(g, product)) continue;
    const TensorType& y_type = g.value(product.outputs[0]).type;
    GemmAttrs attrs = product.op == OpKind::gemm ? std::get<GemmAttrs>(product.attrs) : GemmAttrs{};
    Takeover t{{}, product.outputs[0], {}, {}, OpKind::gemm};
    std::vector<std::string> ops = {op_text(product)};
    fusion::Chain chain{g, r, taken, t, ops};
    const Node* n = chain.next();
    // The bias: an add whose other operand broadcasts to y and has its dtype, where the
    // product has no C yet.
    if (n && n->op == OpKind::add && !has_input(product, 2)) {
      const ValueId other = n->inputs.at(0) == t.writes ? n->inputs.at(1) : n->inputs.at(0);
      Shape b;
      const TensorType& bias = g.value(other).type;
      if (other != t.writes && bias.dtype == y_type.dtype &&
          broadcast_shapes(bias.shape, y_type.shape, &b) && b == y_type.shape) {
        t.inputs.push_back({2, other});
        attrs.beta = 1.0;
        chain.take(*n);
        n = chain.next();
      }
    }
    if (n && epilogue_activation(*n)) {
      attrs.activation = fusion::activation_of(*n);
      chain.take(*n);
    }
    if (t.replaced.empty()) continue;
    for (NodeId m : t.replaced) taken[size_t(m)] = true;
    t.attrs = attrs;
    if (log) log->add(product.name, ops);
    takeover[size_t(product.id)] = std::move(t);
    ++count;
  }
  if (count > 0) fusion::rebuild(g, takeover);
  return count;
}

}  // namespace fusebox
