#include "fusebox/ir/builder.h"

namespace fusebox {

std::vector<ValueId> Builder::op(OpKind op, Attrs attrs, std::vector<ValueId> inputs) {
  std::string n = std::move(next_name_);
  next_name_.clear();
  return g_.add_node(op, std::move(attrs), std::move(inputs), std::move(n));
}

ValueId Builder::one(OpKind kind, Attrs attrs, std::vector<ValueId> inputs) {
  return op(kind, std::move(attrs), std::move(inputs)).at(0);
}

ValueId Builder::unary(OpKind kind, ValueId x) {
  return one(kind, {}, {x});
}
ValueId Builder::binary(OpKind kind, ValueId a, ValueId b) {
  return one(kind, {}, {a, b});
}

ValueId Builder::conv(ValueId x, ValueId w, ValueId bias, ConvAttrs a) {
  std::vector<ValueId> in{x, w};
  if (bias != kNoValue) in.push_back(bias);
  return one(OpKind::conv, std::move(a), std::move(in));
}

ValueId Builder::conv_backward_data(ValueId dy, ValueId w, ConvBackwardDataAttrs a, ValueId bias) {
  std::vector<ValueId> in{dy, w};
  if (bias != kNoValue) in.push_back(bias);
  return one(OpKind::conv_backward_data, std::move(a), std::move(in));
}

ValueId Builder::conv_backward_filter(ValueId x, ValueId dy, ConvBackwardFilterAttrs a) {
  return one(OpKind::conv_backward_filter, std::move(a), {x, dy});
}

ValueId Builder::batch_norm(ValueId x, ValueId scale, ValueId bias, ValueId mean, ValueId var,
                            BatchNormAttrs a) {
  a.training = false;
  return one(OpKind::batch_norm, a, {x, scale, bias, mean, var});
}

std::vector<ValueId> Builder::batch_norm_training(ValueId x, ValueId scale, ValueId bias,
                                                  ValueId mean, ValueId var, BatchNormAttrs a) {
  a.training = true;
  return op(OpKind::batch_norm, a, {x, scale, bias, mean, var});
}

ValueId Builder::layer_norm(ValueId x, ValueId scale, ValueId bias, NormAttrs a) {
  return one(OpKind::layer_norm, a, {x, scale, bias});
}

ValueId Builder::rms_norm(ValueId x, ValueId scale, NormAttrs a) {
  return one(OpKind::rms_norm, a, {x, scale});
}

ValueId Builder::leaky_relu(ValueId x, double alpha) {
  return one(OpKind::leaky_relu, LeakyReluAttrs{alpha}, {x});
}
ValueId Builder::gelu(ValueId x, bool tanh_approximation) {
  return one(OpKind::gelu, GeluAttrs{tanh_approximation}, {x});
}
ValueId Builder::clip(ValueId x, double min, double max) {
  return one(OpKind::clip, ClipAttrs{min, max}, {x});
}

ValueId Builder::gemm(ValueId a, ValueId b, ValueId c, GemmAttrs attrs) {
  std::vector<ValueId> in{a, b};
  if (c != kNoValue) in.push_back(c);
  return one(OpKind::gemm, attrs, std::move(in));
}

ValueId Builder::reduce_sum(ValueId x, std::vector<int64_t> axes, bool keepdims) {
  return one(OpKind::reduce_sum, ReduceAttrs{std::move(axes), keepdims}, {x});
}
ValueId Builder::reduce_mean(ValueId x, std::vector<int64_t> axes, bool keepdims) {
  return one(OpKind::reduce_mean, ReduceAttrs{std::move(axes), keepdims}, {x});
}
ValueId Builder::reduce_max(ValueId x, std::vector<int64_t> axes, bool keepdims) {
  return one(OpKind::reduce_max, ReduceAttrs{std::move(axes), keepdims}, {x});
}
ValueId Builder::softmax(ValueId x, int64_t axis) {
  return one(OpKind::softmax, SoftmaxAttrs{axis}, {x});
}
ValueId Builder::log_softmax(ValueId x, int64_t axis) {
  return one(OpKind::log_softmax, SoftmaxAttrs{axis}, {x});
}

ValueId Builder::max_pool(ValueId x, PoolAttrs a) {
  a.return_indices = false;
  return one(OpKind::max_pool, std::move(a), {x});
}
ValueId Builder::avg_pool(ValueId x, PoolAttrs a) {
  return one(OpKind::avg_pool, std::move(a), {x});
}

ValueId Builder::reshape(ValueId x, std::vector<int64_t> shape) {
  return one(OpKind::reshape, ReshapeAttrs{std::move(shape), false}, {x});
}
ValueId Builder::flatten(ValueId x, int64_t axis) {
  return one(OpKind::flatten, FlattenAttrs{axis}, {x});
}
ValueId Builder::transpose(ValueId x, std::vector<int64_t> perm) {
  return one(OpKind::transpose, TransposeAttrs{std::move(perm)}, {x});
}
ValueId Builder::concat(std::vector<ValueId> xs, int64_t axis) {
  return one(OpKind::concat, ConcatAttrs{axis}, std::move(xs));
}
ValueId Builder::slice(ValueId x, SliceAttrs a) {
  return one(OpKind::slice, std::move(a), {x});
}
ValueId Builder::pad(ValueId x, PadAttrs a) {
  return one(OpKind::pad, std::move(a), {x});
}
ValueId Builder::squeeze(ValueId x, std::vector<int64_t> axes) {
  return one(OpKind::squeeze, AxesAttrs{std::move(axes)}, {x});
}
ValueId Builder::unsqueeze(ValueId x, std::vector<int64_t> axes) {
  return one(OpKind::unsqueeze, AxesAttrs{std::move(axes)}, {x});
}
ValueId Builder::cast(ValueId x, DType to) {
  return one(OpKind::cast, CastAttrs{to}, {x});
}
ValueId Builder::constant(Tensor value) {
  return one(OpKind::constant, ConstantAttrs{std::move(value)}, {});
}

std::vector<ValueId> Builder::cross_entropy(ValueId logits, ValueId labels, ValueId weight,
                                            CrossEntropyAttrs a) {
  std::vector<ValueId> in{logits, labels};
  if (weight != kNoValue) in.push_back(weight);
  return op(OpKind::cross_entropy, a, std::move(in));
}

}  // namespace fusebox
