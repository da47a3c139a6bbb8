// Families of ops that share shape inference, a VJP and a kernel entry, as X-macro lists,
// so that a switch names a family in one line and the compiler still checks that every
// OpKind is handled:
//   switch (op) {
//     FUSEBOX_UNARY_POINTWISE_OPS(FUSEBOX_OP_CASE) return unary(...);
//     ...
//   }
// Adding an op to a family here adds it to every such switch. Each list is exactly its
// family in the op table (op_info.h), checked below.
#pragma once

#include <initializer_list>

#include "fusebox/ir/op_info.h"

#define FUSEBOX_OP_CASE(name) case ::fusebox::OpKind::name:

// clang-format off
// Elementwise, one input (identity is not one of them: it is a copy everywhere).
#define FUSEBOX_UNARY_POINTWISE_OPS(X)                                                      \
  X(relu) X(leaky_relu) X(gelu) X(silu) X(sigmoid) X(tanh) X(exp) X(log) X(sqrt) X(rsqrt) \
  X(reciprocal) X(neg) X(abs) X(erf) X(sin) X(cos) X(floor) X(ceil) X(round) X(clip)

// The gradients autodiff emits; none of them is differentiated again.
#define FUSEBOX_BACKWARD_OPS(X)                                                             \
  X(unary_backward) X(binary_backward) X(batch_norm_backward) X(layer_norm_backward)      \
  X(rms_norm_backward) X(softmax_backward) X(log_softmax_backward)                        \
  X(cross_entropy_backward) X(reduce_max_backward) X(max_pool_backward)                   \
  X(avg_pool_backward) X(slice_backward) X(pad_backward) X(gather_backward)               \
  X(gather_elements_backward) X(resize_backward)                                          \
  X(attention_backward)
// clang-format on

// Elementwise, two inputs broadcast as numpy.
#define FUSEBOX_BINARY_POINTWISE_OPS(X) X(add) X(sub) X(mul) X(div) X(max) X(min) X(pow)

// Comparisons and logic: bool results, numpy-broadcast operands (ops.h).
// clang-format off
#define FUSEBOX_LOGIC_OPS(X)                                                            \
  X(equal)                                                                              \
  X(less)                                                                               \
  X(greater) X(less_equal) X(greater_equal) X(logical_not) X(logical_and) X(logical_or) \
      X(logical_xor)
// clang-format on

#define FUSEBOX_REDUCE_OPS(X) X(reduce_sum) X(reduce_mean) X(reduce_max)

// The same row-major bytes under another shape (of the shape family): a copy, or no copy at
// all where the executable makes the output a view of the input (runtime/memory_plan.h).
#define FUSEBOX_RESHAPE_OPS(X) X(reshape) X(flatten) X(squeeze) X(unsqueeze)

namespace fusebox {
constexpr bool is_reshape_family(OpKind op) {
  switch (op) {
    FUSEBOX_RESHAPE_OPS(FUSEBOX_OP_CASE) return true;
    default:
      return false;
  }
}
}  // namespace fusebox

namespace fusebox::op_info_checks {

// `ops` are exactly the ops of `family` in the table.
constexpr bool is_family(OpFamily family, std::initializer_list<OpKind> ops) {
  size_t in_family = 0;
  for (const OpInfo& r : kOpTable) in_family += r.family == family;
  for (OpKind op : ops)
    if (op_info(op).family != family) return false;
  return ops.size() == in_family;
}

#define FUSEBOX_OP_LIST_ITEM(name) ::fusebox::OpKind::name,
static_assert(is_family(OpFamily::unary, {FUSEBOX_UNARY_POINTWISE_OPS(FUSEBOX_OP_LIST_ITEM)}));
static_assert(is_family(OpFamily::binary, {FUSEBOX_BINARY_POINTWISE_OPS(FUSEBOX_OP_LIST_ITEM)}));
static_assert(is_family(OpFamily::logic, {FUSEBOX_LOGIC_OPS(FUSEBOX_OP_LIST_ITEM)}));
static_assert(is_family(OpFamily::reduce, {FUSEBOX_REDUCE_OPS(FUSEBOX_OP_LIST_ITEM)}));
static_assert(is_family(OpFamily::backward, {FUSEBOX_BACKWARD_OPS(FUSEBOX_OP_LIST_ITEM)}));
#undef FUSEBOX_OP_LIST_ITEM

}  // namespace fusebox::op_info_checks
