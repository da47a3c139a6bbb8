// fold_product_casts (passes/fusion.h): a low-precision product read only by its widening cast
// becomes gemm's mixed form (ir/ops.h GemmAttrs::y_dtype), emitted in the cast's place:
//
//   cast(gemm(A, B) -> f32)            -> gemm(A, B, y_dtype f32)
//   cast(matmul(x [..., K], w [K, N]))  -> reshape(gemm(reshape(x, [M, K]), w, y_dtype f32),
//                                                 [..., N])          M = the rows of x
//
// (no reshapes for a 2-D x). The reshapes are views; the CUDA executable computes a product
// read only by the reshape that makes a graph output in that output's buffer.
#include <vector>

#include "fusebox/passes/fusion.h"
#include "fusion_rewrite.h"

namespace fusebox {
namespace {

// Whether `p`, the producer of the value a widening cast reads, folds into that cast: an f16 /
// bf16 gemm without C in its plain form, or a matmul of rows by a 2-D matrix; not an empty
// product (nothing to gain, and the backends' empty-K paths write the operands' dtype).
bool foldable_product(const Graph& g, const Node& p) {
  if (p.op != OpKind::gemm && p.op != OpKind::matmul) return false;
  const TensorType& y = g.value(p.outputs[0]).type;
  if (!is_low_float(y.dtype) || numel(y.shape) == 0) return false;
  const Shape& a = g.value(p.inputs[0]).type.shape;
  const Shape& b = g.value(p.inputs[1]).type.shape;
  if (numel(a) == 0 || numel(b) == 0) return false;
  if (p.op == OpKind::gemm) {
    const auto& attrs = std::get<GemmAttrs>(p.attrs);
    return !attrs.y_dtype && (p.inputs.size() < 3 || p.inputs[2] == kNoValue);
  }
  return p.op == OpKind::matmul && a.size() >= 2 && b.size() == 2;
}

}  // namespace

size_t fold_product_casts(Graph& g, FusionLog* log) {
  const fusion::Readers r(g);
  std::vector<NodeId> product_of(g.nodes().size(), -1);  // cast -> the product it takes
  std::vector<bool> moved(g.nodes().size(), false);      // a product emitted at its cast
  size_t count = 0;
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::cast || g.value(n.outputs[0]).type.dtype != DType::f32) continue;
    const NodeId p = g.value(n.inputs[0]).producer;
    if (p < 0 || r.only_reader(n.inputs[0]) != n.id || !foldable_product(g, g.node(p))) continue;
    product_of[size_t(n.id)] = p;
    moved[size_t(p)] = true;
    ++count;
  }
  if (count == 0) return 0;

  fusion::rebuild_expanding(
      g, [&](const Node& n, GraphRewriter& rw) -> std::optional<std::vector<ValueId>> {
        if (moved[size_t(n.id)]) return std::vector<ValueId>{kNoValue};  // emitted at its cast
        const NodeId pid = product_of[size_t(n.id)];
        if (pid < 0) return std::nullopt;
        const Node& p = g.node(pid);
        Graph& out = rw.graph();
        const std::string& y_name = g.value(n.outputs[0]).name;
        const Shape& x = g.value(p.inputs[0]).type.shape;
        const Shape& y = g.value(n.outputs[0]).type.shape;
        GemmAttrs attrs = p.op == OpKind::gemm ? std::get<GemmAttrs>(p.attrs) : GemmAttrs{};
        attrs.y_dtype = DType::f32;
        ValueId a = rw.mapped(p.inputs[0]);
        const bool rows = p.op == OpKind::matmul && x.size() > 2;
        if (rows)
          a = out.add_node(OpKind::reshape, ReshapeAttrs{{numel(x) / x.back(), x.back()}}, {a},
                           p.name + "/rows", {y_name + "/rows"})[0];
        ValueId product = out.add_node(OpKind::gemm, attrs, {a, rw.mapped(p.inputs[1])}, p.name,
                                       {rows ? y_name + "/gemm" : y_name})[0];
        if (rows)
          product = out.add_node(OpKind::reshape, ReshapeAttrs{y}, {product}, n.name, {y_name})[0];
        if (log) log->add(p.name, {fusion::op_text(p), fusion::op_text(n)});
        return std::vector<ValueId>{product};
      });
  return count;
}

}  // namespace fusebox
