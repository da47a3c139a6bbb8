// Families of ops that share shape inference, a VJP and a kernel entry, as X-macro lists,
// so that a switch names a family in one line and the compiler still checks that every
// OpKind is handled:
//   switch (op) {
//     FUSEBOX_UNARY_POINTWISE_OPS(FUSEBOX_OP_CASE) return unary(...);
//     ...
//   }
// Adding an op to a family here adds it to every such switch.
#pragma once

#include "fusebox/ir/ops.h"

#define FUSEBOX_OP_CASE(name) case ::fusebox::OpKind::name:

// clang-format off
// Elementwise, one input (identity is not one of them: it is a copy everywhere).
#define FUSEBOX_UNARY_POINTWISE_OPS(X)                                                      \
  X(relu) X(leaky_relu) X(gelu) X(silu) X(sigmoid) X(tanh) X(exp) X(log) X(sqrt) X(rsqrt) \
  X(reciprocal) X(neg) X(abs) X(erf) X(clip)
// clang-format on

// Elementwise, two inputs broadcast as numpy.
#define FUSEBOX_BINARY_POINTWISE_OPS(X) X(add) X(sub) X(mul) X(div) X(max) X(min) X(pow)

#define FUSEBOX_REDUCE_OPS(X) X(reduce_sum) X(reduce_mean) X(reduce_max)
