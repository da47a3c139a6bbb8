// Helpers for the IR tests: run infer_and_normalize on a one-off node (named "n1"),
// check that re-inferring the normalised node changes nothing (Graph::verify relies
// on it), and match error messages.
#pragma once

#include <gtest/gtest.h>

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "fusebox/ir/graph.h"
#include "fusebox/ir/pointwise_program.h"

namespace fusebox {

// gtest prints TensorType values as "f32[2, 3]".
inline void PrintTo(const TensorType& t, std::ostream* os) {
  *os << dtype_name(t.dtype) << shape_str(t.shape);
}

namespace ir_test {

using In = std::optional<TensorType>;
using Ints = std::vector<int64_t>;

inline TensorType f32(Shape s) {
  return {DType::f32, std::move(s)};
}
inline TensorType typed(DType d, Shape s) {
  return {d, std::move(s)};
}

// Every field of every attribute struct, as text: compares normalised attributes.
inline std::string attrs_text(const Attrs& attrs) {
  return std::visit(
      [](const auto& a) -> std::string {
        using A = std::decay_t<decltype(a)>;
        auto conv = [](const ConvAttrs& c) {
          return cat(shape_str(c.strides), shape_str(c.dilations), shape_str(c.pads_begin),
                     shape_str(c.pads_end), c.groups);
        };
        if constexpr (std::is_same_v<A, std::monostate>)
          return "none";
        else if constexpr (std::is_same_v<A, ConvAttrs>)
          return conv(a);
        else if constexpr (std::is_same_v<A, ConvBackwardDataAttrs>)
          return conv(a.conv) + shape_str(a.input_spatial);
        else if constexpr (std::is_same_v<A, ConvBackwardFilterAttrs>)
          return conv(a.conv) + shape_str(a.filter_spatial);
        else if constexpr (std::is_same_v<A, BatchNormAttrs>)
          return cat(a.epsilon, " ", a.momentum, " ", a.training, " ", a.relu, " ", a.sync);
        else if constexpr (std::is_same_v<A, NormAttrs>)
          return cat(a.axis, " ", a.epsilon);
        else if constexpr (std::is_same_v<A, LeakyReluAttrs>)
          return cat(a.alpha);
        else if constexpr (std::is_same_v<A, GeluAttrs>)
          return cat(a.tanh_approximation);
        else if constexpr (std::is_same_v<A, ClipAttrs>)
          return cat(a.min, " ", a.max);
        else if constexpr (std::is_same_v<A, GemmAttrs>)
          return cat(a.trans_a, a.trans_b, " ", a.alpha, " ", a.beta);
        else if constexpr (std::is_same_v<A, ReduceAttrs>)
          return cat(shape_str(a.axes), a.keepdims);
        else if constexpr (std::is_same_v<A, SoftmaxAttrs>)
          return cat(a.axis);
        else if constexpr (std::is_same_v<A, PoolAttrs>)
          return cat(shape_str(a.kernel), shape_str(a.strides), shape_str(a.dilations),
                     shape_str(a.pads_begin), shape_str(a.pads_end), a.ceil_mode,
                     a.count_include_pad, a.return_indices);
        else if constexpr (std::is_same_v<A, ReshapeAttrs>)
          return cat(shape_str(a.shape), a.allow_zero);
        else if constexpr (std::is_same_v<A, FlattenAttrs>)
          return cat(a.axis);
        else if constexpr (std::is_same_v<A, TransposeAttrs>)
          return shape_str(a.perm);
        else if constexpr (std::is_same_v<A, ConcatAttrs>)
          return cat(a.axis);
        else if constexpr (std::is_same_v<A, SliceAttrs>)
          return cat(shape_str(a.starts), shape_str(a.ends), shape_str(a.axes), shape_str(a.steps));
        else if constexpr (std::is_same_v<A, PadAttrs>)
          return cat(shape_str(a.pads), int(a.mode), " ", a.value);
        else if constexpr (std::is_same_v<A, AxesAttrs>)
          return shape_str(a.axes);
        else if constexpr (std::is_same_v<A, CastAttrs>)
          return dtype_name(a.to);
        else if constexpr (std::is_same_v<A, ConstantAttrs>)
          return cat(dtype_name(a.value.dtype()), shape_str(a.value.shape()));
        else if constexpr (std::is_same_v<A, CrossEntropyAttrs>)
          return cat(int(a.reduction), " ", a.ignore_index.value_or(-12345), " ", a.lse_stash, " ",
                     a.classes.value_or(-1));
        else if constexpr (std::is_same_v<A, ExpandAttrs>)
          return shape_str(a.shape);
        else if constexpr (std::is_same_v<A, UnaryBackwardAttrs>)
          return cat(op_name(a.op), " ", a.alpha, " ", a.tanh_approximation, " ", a.min, " ",
                     a.max);
        else if constexpr (std::is_same_v<A, BinaryBackwardAttrs>)
          return op_name(a.op);
        else if constexpr (std::is_same_v<A, PoolBackwardAttrs>)
          return attrs_text(a.pool) + shape_str(a.input_shape);
        else if constexpr (std::is_same_v<A, SliceBackwardAttrs>)
          return attrs_text(a.slice) + shape_str(a.input_shape);
        else if constexpr (std::is_same_v<A, PadBackwardAttrs>)
          return attrs_text(a.pad) + shape_str(a.input_shape);
        else if constexpr (std::is_same_v<A, SgdAttrs>)
          return cat(a.momentum, " ", a.dampening, " ", a.weight_decay, " ", a.nesterov);
        else if constexpr (std::is_same_v<A, AdamWAttrs>)
          return cat(a.beta1, " ", a.beta2, " ", a.epsilon, " ", a.weight_decay);
        else if constexpr (std::is_same_v<A, LossScaleAttrs>)
          return cat(a.growth_factor, " ", a.backoff_factor, " ", a.growth_interval);
        else if constexpr (std::is_same_v<A, PointwiseProgram>)
          return pointwise_program_text(a);
        else if constexpr (std::is_same_v<A, AttentionAttrs>)
          return cat(a.scale, " ", a.causal, " ", a.with_lse, " ", a.bias_grad);
        else if constexpr (std::is_same_v<A, ArgReduceAttrs>)
          return cat(a.axis, " ", a.keepdims, " ", a.select_last_index);
        else if constexpr (std::is_same_v<A, GatherAttrs>)
          return cat(a.axis);
        else if constexpr (std::is_same_v<A, ResizeAttrs>)
          return cat(shape_str(a.sizes), " ", int(a.mode), " ", int(a.coordinates), " ",
                     int(a.nearest), " ", a.scales.size());
        else if constexpr (std::is_same_v<A, ResizeBackwardAttrs>)
          return cat(shape_str(a.resize.sizes), " ", shape_str(a.input_shape));
        else if constexpr (std::is_same_v<A, CumSumAttrs>)
          return cat(a.axis, " ", a.exclusive, " ", a.reverse);
        else if constexpr (std::is_same_v<A, TopKAttrs>)
          return cat(a.k, " ", a.axis, " ", a.largest, " ", a.sorted);
        else if constexpr (std::is_same_v<A, GatherBackwardAttrs>)
          return cat(a.gather.axis, shape_str(a.data_shape));
        else if constexpr (std::is_same_v<A, AllReduceAttrs>)
          return cat(a.mean, " ", dtype_name(a.reduce_dtype));
      },
      attrs);
}

struct Inferred {
  std::vector<TensorType> types;
  Node node;  // with normalised attributes
  const TensorType& out(size_t i = 0) const { return types.at(i); }
  template <class A>
  const A& attrs() const {
    return std::get<A>(node.attrs);
  }
};

inline Node make_node(OpKind op, Attrs attrs) {
  Node n;
  n.name = "n1";
  n.op = op;
  n.attrs = std::move(attrs);
  return n;
}

// Infers a node that must be valid; a second inference of the normalised node must
// give the same types and attributes.
inline Inferred infer(OpKind op, Attrs attrs, const std::vector<In>& inputs) {
  Inferred r{{}, make_node(op, std::move(attrs))};
  try {
    r.types = infer_and_normalize(r.node, inputs);
  } catch (const Error& e) {
    ADD_FAILURE() << "unexpected error: " << e.what();
    return r;
  }
  Node again = r.node;
  std::vector<TensorType> types;
  try {
    types = infer_and_normalize(again, inputs);
  } catch (const Error& e) {
    ADD_FAILURE() << "re-inference of the normalised node fails: " << e.what();
    return r;
  }
  EXPECT_EQ(types, r.types) << "re-inference of the normalised node gives other types";
  EXPECT_EQ(attrs_text(again.attrs), attrs_text(r.node.attrs)) << "normalisation is not idempotent";
  return r;
}

// Success when inference of the node fails with a fusebox::Error whose message starts
// with "[<op> 'n1'] " and contains every fragment.
inline ::testing::AssertionResult fails_with(OpKind op, Attrs attrs, const std::vector<In>& inputs,
                                             const std::vector<std::string>& fragments) {
  Node n = make_node(op, std::move(attrs));
  std::string msg;
  try {
    std::vector<TensorType> types = infer_and_normalize(n, inputs);
    std::string got;
    for (const TensorType& t : types) got += cat(" ", dtype_name(t.dtype), shape_str(t.shape));
    return ::testing::AssertionFailure() << "no error; inferred" << got;
  } catch (const Error& e) {
    msg = e.what();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-fusebox exception: " << e.what();
  }
  const std::string label = cat("[", op_name(op), " 'n1'] ");
  if (msg.rfind(label, 0) != 0)
    return ::testing::AssertionFailure()
           << "message does not start with '" << label << "': " << msg;
  for (const std::string& f : fragments) {
    if (msg.find(f) == std::string::npos)
      return ::testing::AssertionFailure() << "message lacks '" << f << "': " << msg;
  }
  return ::testing::AssertionSuccess() << msg;
}

}  // namespace ir_test
}  // namespace fusebox
