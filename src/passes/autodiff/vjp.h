// Internals of autodiff (include/fusebox/passes/autodiff.h): the Emitter that appends
// backward ops to the graph, and one vector-Jacobian-product (VJP) rule per op family.
//
// A rule gets one forward node, the gradient of each of its outputs (kNoValue where an
// output has none) and which inputs want a gradient; it returns one gradient per input
// (kNoValue: no contribution), each with exactly that input's dtype and shape. A rule
// builds only what a wanted input needs.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "fusebox/ir/graph.h"

namespace fusebox::autodiff {

// Appends ops to the graph, named "<prefix>/<scope>/<part>", where the scope is the
// forward node (or value) being differentiated. Helpers that would be a no-op (a
// reshape to the same shape, a scale by 1) return their input unchanged. It builds in
// place, on the graph being differentiated: the passes that rebuild a graph into a new one
// use passes/rewrite/graph_rewriter.h instead.
class Emitter {
 public:
  Emitter(Graph& g, std::string prefix) : g_(g), prefix_(std::move(prefix)) {}

  Graph& graph() { return g_; }
  void set_scope(std::string scope) { scope_ = std::move(scope); }

  // Copies, not references: adding a node may move the graph's value storage.
  TensorType type(ValueId v) const { return g_.value(v).type; }
  Shape shape(ValueId v) const { return g_.value(v).type.shape; }
  DType dtype(ValueId v) const { return g_.value(v).type.dtype; }
  int64_t rank(ValueId v) const { return int64_t(g_.value(v).type.shape.size()); }

  // Any op; `part` names it within the scope ("dx", "dw", ...).
  std::vector<ValueId> op(OpKind op, Attrs attrs, std::vector<ValueId> inputs,
                          const std::string& part);
  ValueId op1(OpKind op, Attrs attrs, std::vector<ValueId> inputs, const std::string& part) {
    return this->op(op, std::move(attrs), std::move(inputs), part).at(0);
  }

  // A rank-0 literal of `dtype` (a constant node; one per dtype and value per pass).
  ValueId scalar(DType dtype, double value);
  // All zeros of `type` (a broadcast scalar).
  ValueId zeros(const TensorType& type);

  ValueId add(ValueId a, ValueId b) { return op1(OpKind::add, {}, {a, b}, "add"); }
  ValueId sub(ValueId a, ValueId b) { return op1(OpKind::sub, {}, {a, b}, "sub"); }
  ValueId mul(ValueId a, ValueId b) { return op1(OpKind::mul, {}, {a, b}, "mul"); }
  ValueId neg(ValueId a) { return op1(OpKind::neg, {}, {a}, "neg"); }
  // v * factor (v itself when factor is 1).
  ValueId scale(ValueId v, double factor);
  ValueId reshape(ValueId v, const Shape& shape);  // v itself when already shaped so
  ValueId expand(ValueId v, const Shape& shape);   // v itself when already shaped so
  ValueId transpose(ValueId v, std::vector<int64_t> perm);
  ValueId reduce_sum(ValueId v, std::vector<int64_t> axes, bool keepdims);
  // Undoes numpy broadcasting: sums `v` over the dims that broadcasting added to or
  // stretched in `shape`, giving exactly `shape`.
  ValueId sum_to_shape(ValueId v, const Shape& shape);
  // Sums a [N, C, D...] value over every dim but 1, giving [C].
  ValueId sum_per_channel(ValueId v);

 private:
  std::string node_name(const std::string& part) const;

  Graph& g_;
  std::string prefix_;
  std::string scope_;
  std::map<std::pair<DType, double>, ValueId> scalars_;
};

struct VjpArgs {
  const Node& node;         // a copy: the graph's node storage grows while emitting
  std::vector<ValueId> dy;  // per output: its gradient, or kNoValue
  std::vector<bool> needs;  // per input: whether its gradient is wanted
  Emitter& e;

  bool needs_input(size_t i) const { return i < needs.size() && needs[i]; }
  ValueId input(size_t i) const { return node.inputs.at(i); }
  ValueId output(size_t i) const { return node.outputs.at(i); }
  // Throws an Error naming the node: the gradient cannot flow through it.
  [[noreturn]] void no_gradient(const std::string& why) const;
  // no_gradient unless only outputs [0, count) have gradients.
  void expect_gradient_only_on_first(size_t count, const char* why) const;
};

using Grads = std::vector<ValueId>;  // per input; kNoValue: no contribution

// vjp_conv.cpp: conv, conv_backward_data, conv_backward_filter, max_pool, avg_pool,
// global_avg_pool.
Grads vjp_conv(VjpArgs& a);
Grads vjp_conv_backward_data(VjpArgs& a);
Grads vjp_pool(VjpArgs& a);
Grads vjp_global_avg_pool(VjpArgs& a);
// vjp_norm.cpp: batch_norm, layer_norm, rms_norm, softmax, log_softmax, cross_entropy.
Grads vjp_batch_norm(VjpArgs& a);
Grads vjp_layer_norm(VjpArgs& a);
Grads vjp_rms_norm(VjpArgs& a);
Grads vjp_softmax(VjpArgs& a);
Grads vjp_attention(VjpArgs& a);
Grads vjp_cross_entropy(VjpArgs& a);
// vjp_math.cpp: unary and binary pointwise ops, matmul, gemm, reductions.
Grads vjp_unary(VjpArgs& a);
Grads vjp_binary(VjpArgs& a);
Grads vjp_matmul(VjpArgs& a);
Grads vjp_gemm(VjpArgs& a);
Grads vjp_reduce(VjpArgs& a);
// vjp_shape.cpp: the shape and data-movement ops.
Grads vjp_reshape(VjpArgs& a);  // reshape, flatten, squeeze, unsqueeze
Grads vjp_transpose(VjpArgs& a);
Grads vjp_concat(VjpArgs& a);
Grads vjp_slice(VjpArgs& a);
Grads vjp_pad(VjpArgs& a);
Grads vjp_cast(VjpArgs& a);
Grads vjp_expand(VjpArgs& a);
Grads vjp_gather(VjpArgs& a);  // gather, gather_elements
Grads vjp_cumsum(VjpArgs& a);
Grads vjp_top_k(VjpArgs& a);
Grads vjp_resize(VjpArgs& a);
Grads vjp_where(VjpArgs& a);
// vjp_math.cpp: all_reduce (the cotangents reduced the same way).
Grads vjp_all_reduce(VjpArgs& a);

}  // namespace fusebox::autodiff
