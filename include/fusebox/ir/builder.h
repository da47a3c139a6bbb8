// C++ builder API: one method per op, returning the output value(s).
//
//   Graph g("net");
//   Builder b(g);
//   ValueId x = g.add_input("x", DType::f32, {1, 3, 224, 224});
//   ValueId w = g.add_constant("w", weights);
//   ValueId y = b.relu(b.conv(x, w, kNoValue, ConvAttrs{.strides = {2, 2}}));
//   g.mark_output(y);
//
// Each call runs shape inference at once, so a mistake throws here, naming the node.
#pragma once

#include "fusebox/ir/graph.h"

namespace fusebox {

class Builder {
 public:
  explicit Builder(Graph& g) : g_(g) {}
  Graph& graph() { return g_; }

  // Names the next node added (otherwise a unique name is generated).
  Builder& name(std::string n) {
    next_name_ = std::move(n);
    return *this;
  }

  ValueId conv(ValueId x, ValueId w, ValueId bias = kNoValue, ConvAttrs a = {});
  ValueId conv_backward_data(ValueId dy, ValueId w, ConvBackwardDataAttrs a,
                             ValueId bias = kNoValue);
  ValueId conv_backward_filter(ValueId x, ValueId dy, ConvBackwardFilterAttrs a);

  ValueId batch_norm(ValueId x, ValueId scale, ValueId bias, ValueId mean, ValueId var,
                     BatchNormAttrs a = {});  // inference form: y only
  // Training form: {y, new_running_mean, new_running_var, saved_mean, saved_inv_std}.
  std::vector<ValueId> batch_norm_training(ValueId x, ValueId scale, ValueId bias, ValueId mean,
                                           ValueId var, BatchNormAttrs a = {});
  ValueId layer_norm(ValueId x, ValueId scale, ValueId bias, NormAttrs a = {});
  ValueId rms_norm(ValueId x, ValueId scale, NormAttrs a = {});

  ValueId relu(ValueId x) { return unary(OpKind::relu, x); }
  ValueId leaky_relu(ValueId x, double alpha = 0.01);
  ValueId gelu(ValueId x, bool tanh_approximation = false);
  ValueId silu(ValueId x) { return unary(OpKind::silu, x); }
  ValueId sigmoid(ValueId x) { return unary(OpKind::sigmoid, x); }
  ValueId tanh(ValueId x) { return unary(OpKind::tanh, x); }
  ValueId exp(ValueId x) { return unary(OpKind::exp, x); }
  ValueId log(ValueId x) { return unary(OpKind::log, x); }
  ValueId sqrt(ValueId x) { return unary(OpKind::sqrt, x); }
  ValueId rsqrt(ValueId x) { return unary(OpKind::rsqrt, x); }
  ValueId reciprocal(ValueId x) { return unary(OpKind::reciprocal, x); }
  ValueId neg(ValueId x) { return unary(OpKind::neg, x); }
  ValueId abs(ValueId x) { return unary(OpKind::abs, x); }
  ValueId erf(ValueId x) { return unary(OpKind::erf, x); }
  ValueId sin(ValueId x) { return unary(OpKind::sin, x); }
  ValueId cos(ValueId x) { return unary(OpKind::cos, x); }
  ValueId clip(ValueId x, double min, double max);
  ValueId identity(ValueId x) { return unary(OpKind::identity, x); }

  ValueId add(ValueId a, ValueId b) { return binary(OpKind::add, a, b); }
  ValueId sub(ValueId a, ValueId b) { return binary(OpKind::sub, a, b); }
  ValueId mul(ValueId a, ValueId b) { return binary(OpKind::mul, a, b); }
  ValueId div(ValueId a, ValueId b) { return binary(OpKind::div, a, b); }
  ValueId max(ValueId a, ValueId b) { return binary(OpKind::max, a, b); }
  ValueId min(ValueId a, ValueId b) { return binary(OpKind::min, a, b); }
  ValueId pow(ValueId a, ValueId b) { return binary(OpKind::pow, a, b); }

  ValueId matmul(ValueId a, ValueId b) { return binary(OpKind::matmul, a, b); }
  ValueId gemm(ValueId a, ValueId b, ValueId c = kNoValue, GemmAttrs attrs = {});

  ValueId reduce_sum(ValueId x, std::vector<int64_t> axes, bool keepdims = true);
  ValueId reduce_mean(ValueId x, std::vector<int64_t> axes, bool keepdims = true);
  ValueId reduce_max(ValueId x, std::vector<int64_t> axes, bool keepdims = true);
  ValueId softmax(ValueId x, int64_t axis = -1);
  ValueId log_softmax(ValueId x, int64_t axis = -1);

  ValueId max_pool(ValueId x, PoolAttrs a);
  ValueId avg_pool(ValueId x, PoolAttrs a);
  ValueId global_avg_pool(ValueId x) { return unary(OpKind::global_avg_pool, x); }

  ValueId reshape(ValueId x, std::vector<int64_t> shape);
  ValueId flatten(ValueId x, int64_t axis = 1);
  ValueId transpose(ValueId x, std::vector<int64_t> perm = {});
  ValueId concat(std::vector<ValueId> xs, int64_t axis);
  ValueId slice(ValueId x, SliceAttrs a);
  ValueId pad(ValueId x, PadAttrs a);
  ValueId squeeze(ValueId x, std::vector<int64_t> axes = {});
  ValueId unsqueeze(ValueId x, std::vector<int64_t> axes);
  ValueId cast(ValueId x, DType to);
  ValueId constant(Tensor value);

  // {loss, log_prob}
  std::vector<ValueId> cross_entropy(ValueId logits, ValueId labels, ValueId weight = kNoValue,
                                     CrossEntropyAttrs a = {});

  // Any op, for generated code (importers, passes).
  std::vector<ValueId> op(OpKind op, Attrs attrs, std::vector<ValueId> inputs);

 private:
  ValueId unary(OpKind op, ValueId x);
  ValueId binary(OpKind op, ValueId a, ValueId b);
  ValueId one(OpKind op, Attrs attrs, std::vector<ValueId> inputs);

  Graph& g_;
  std::string next_name_;
};

}  // namespace fusebox
