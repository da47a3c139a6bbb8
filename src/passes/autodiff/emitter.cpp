// Emitter: the small vocabulary the VJP rules build backward graphs with.
#include <algorithm>

#include "vjp.h"

namespace fusebox::autodiff {

std::string Emitter::node_name(const std::string& part) const {
  return cat(prefix_, "/", scope_, "/", part);
}

std::vector<ValueId> Emitter::op(OpKind op, Attrs attrs, std::vector<ValueId> inputs,
                                 const std::string& part) {
  return g_.add_node(op, std::move(attrs), std::move(inputs), node_name(part));
}

ValueId Emitter::scalar(DType dtype, double value) {
  auto it = scalars_.find({dtype, value});
  if (it != scalars_.end()) return it->second;
  ValueId v = op1(OpKind::constant, ConstantAttrs{Tensor::scalar(dtype, value)}, {}, "literal");
  scalars_[{dtype, value}] = v;
  return v;
}

ValueId Emitter::zeros(const TensorType& type) {
  return expand(scalar(type.dtype, 0.0), type.shape);
}

ValueId Emitter::scale(ValueId v, double factor) {
  if (factor == 1.0) return v;
  return mul(v, scalar(dtype(v), factor));
}

ValueId Emitter::reshape(ValueId v, const Shape& shape) {
  if (this->shape(v) == shape) return v;
  return op1(OpKind::reshape, ReshapeAttrs{shape, /*allow_zero=*/true}, {v}, "reshape");
}

ValueId Emitter::expand(ValueId v, const Shape& shape) {
  if (this->shape(v) == shape) return v;
  return op1(OpKind::expand, ExpandAttrs{shape}, {v}, "expand");
}

ValueId Emitter::transpose(ValueId v, std::vector<int64_t> perm) {
  return op1(OpKind::transpose, TransposeAttrs{std::move(perm)}, {v}, "transpose");
}

ValueId Emitter::reduce_sum(ValueId v, std::vector<int64_t> axes, bool keepdims) {
  return op1(OpKind::reduce_sum, ReduceAttrs{std::move(axes), keepdims}, {v}, "reduce_sum");
}

// Broadcasting aligns shapes at the back: the leading rank(v) - rank(shape) dims were
// added, and a dim of extent 1 in `shape` against a larger one in v was stretched.
ValueId Emitter::sum_to_shape(ValueId v, const Shape& shape) {
  const Shape from = this->shape(v);
  FUSEBOX_CHECK(from.size() >= shape.size(), "autodiff",
                cat("internal: cannot sum ", shape_str(from), " down to ", shape_str(shape)));
  const size_t added = from.size() - shape.size();
  std::vector<int64_t> axes;
  for (size_t d = 0; d < from.size(); ++d) {
    if (d < added || (shape[d - added] == 1 && from[d] != 1)) axes.push_back(int64_t(d));
  }
  // Sum with keepdims (so an empty axes list is never passed, which would mean "all"),
  // then drop the added leading dims with a reshape.
  if (!axes.empty()) v = reduce_sum(v, axes, /*keepdims=*/true);
  return reshape(v, shape);
}

ValueId Emitter::sum_per_channel(ValueId v) {
  std::vector<int64_t> axes = {0};
  for (int64_t d = 2; d < rank(v); ++d) axes.push_back(d);
  return reduce_sum(v, axes, /*keepdims=*/false);
}

void VjpArgs::no_gradient(const std::string& why) const {
  throw Error(node_label(node), cat("no gradient: ", why));
}

void VjpArgs::expect_gradient_only_on_first(size_t count, const char* why) const {
  for (size_t i = count; i < dy.size(); ++i) {
    if (dy[i] != kNoValue)
      no_gradient(
          cat("the loss depends on output ", i, " (", e.graph().value(output(i)).name, "), ", why));
  }
}

}  // namespace fusebox::autodiff
