// pad_product_columns (passes/simplify.h): one walk over the nodes; a matmul that pays is
// emitted as reshape -> matmul with padded columns -> slice -> reshape, the rest copied.
#include <string>

#include "fusebox/passes/simplify.h"
#include "passes/rewrite/graph_rewriter.h"

namespace fusebox {
namespace {

constexpr int64_t kColumnMultiple = 8;  // 16 bytes of bf16 / f16

// The padded product's extra traffic: the forward's slice and the backward's zero-padded
// gradient each read and write y once, 2 bytes an element at the low precision it pays at.
double copied_bytes(int64_t rows, int64_t padded_cols) {
  return 2.0 * 2.0 * 2.0 * double(rows) * double(padded_cols);
}

// Whether `n` is a matmul of rows [.., K] by a 2-D weight [K, N] whose N is not a multiple of
// kColumnMultiple, large enough that the copies pay.
bool pays(const Graph& g, const Node& n, const PadColumnsThresholds& t) {
  if (n.op != OpKind::matmul || n.inputs.size() != 2 || n.outputs.size() != 1) return false;
  const TensorType& a = g.value(n.inputs[0]).type;
  const TensorType& b = g.value(n.inputs[1]).type;
  const TensorType& y = g.value(n.outputs[0]).type;
  if (!is_floating(y.dtype) || a.shape.size() < 2 || b.shape.size() != 2) return false;
  const int64_t k = b.shape[0], cols = b.shape[1];
  if (cols % kColumnMultiple == 0 || k == 0) return false;
  const int64_t rows = numel(a.shape) / k;
  const int64_t padded = (cols + kColumnMultiple - 1) / kColumnMultiple * kColumnMultiple;
  const double flops = 2.0 * double(rows) * double(cols) * double(k);
  return flops >= t.min_flops && flops >= t.min_flops_per_copied_byte * copied_bytes(rows, padded);
}

}  // namespace

size_t pad_product_columns(Graph& g, FusionLog* /*log*/, const PadColumnsThresholds& thresholds) {
  size_t count = 0;
  for (const Node& n : g.nodes()) count += pays(g, n, thresholds);
  if (count == 0) return 0;
  GraphRewriter rw(g);
  Graph& out = rw.graph();
  for (const Node& n : g.nodes()) {
    if (!pays(g, n, thresholds)) {
      rw.copy(n);
      continue;
    }
    const Shape& a_shape = g.value(n.inputs[0]).type.shape;
    const Shape& y_shape = g.value(n.outputs[0]).type.shape;
    const Shape& b_shape = g.value(n.inputs[1]).type.shape;
    const int64_t k = b_shape[0], cols = b_shape[1];
    const int64_t padded = (cols + kColumnMultiple - 1) / kColumnMultiple * kColumnMultiple;
    const int64_t rows = numel(a_shape) / k;
    const std::string& y_name = g.value(n.outputs[0]).name;
    ValueId a = rw.mapped(n.inputs[0]);
    if (a_shape.size() != 2)
      a = out.add_node(OpKind::reshape, ReshapeAttrs{{rows, k}}, {a}, n.name + "/rows",
                       {rw.fresh_name(y_name + "/rows")})[0];
    const ValueId b =
        out.add_node(OpKind::pad, PadAttrs{{0, 0, 0, padded - cols}}, {rw.mapped(n.inputs[1])},
                     n.name + "/pad_columns", {rw.fresh_name(y_name + "/weight_padded")})[0];
    const ValueId product =
        out.add_node(OpKind::matmul, {}, {a, b}, n.name, {rw.fresh_name(y_name + "/padded")})[0];
    const bool flat = y_shape.size() == 2;
    ValueId y =
        out.add_node(OpKind::slice, SliceAttrs{{0}, {cols}, {1}, {1}}, {product},
                     n.name + "/columns", {flat ? y_name : rw.fresh_name(y_name + "/columns")})[0];
    if (!flat)
      y = out.add_node(OpKind::reshape, ReshapeAttrs{y_shape}, {y}, n.name + "/unflatten",
                       {y_name})[0];
    rw.map(n.outputs[0], y);
  }
  g = rw.finish();
  return count;
}

}  // namespace fusebox
