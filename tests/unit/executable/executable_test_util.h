// Shared pieces of the runtime tests: small graphs, error checks, skipping without a GPU.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "fusebox/ir/builder.h"
#include "fusebox/runtime/executable.h"
#include "testing.h"

namespace fusebox::testing {

// x [n] -> alternately x + a and x * b, `count` times; then leaky_relu(alpha).
inline Graph chain_graph(int count, int64_t n, double alpha = 0.1) {
  Graph g("chain");
  ValueId x = g.add_input("x", DType::f32, {n});
  ValueId a = g.add_input("a", DType::f32, {});
  ValueId b = g.add_input("b", DType::f32, {});
  for (int i = 0; i < count; ++i)
    x = g.add_node(i % 2 ? OpKind::mul : OpKind::add, {}, {x, i % 2 ? b : a})[0];
  ValueId y = g.add_node(OpKind::leaky_relu, LeakyReluAttrs{alpha}, {x})[0];
  g.rename_value(y, "y");
  g.mark_output(y);
  return g;
}

inline NamedTensors chain_feeds(int64_t n, uint64_t seed) {
  return {{"x", random_tensor(DType::f32, {n}, seed, -2.0, 2.0)},
          {"a", Tensor::scalar(DType::f32, 0.25 + 0.01 * double(seed % 7))},
          {"b", Tensor::scalar(DType::f32, 0.5)}};
}

// w [n] state, x [n] data: next_w = w + x (an elementwise "update", not in place capable),
// and out = sum(w * x) read before the update.
inline Graph accumulate_graph(int64_t n) {
  Graph g("accumulate");
  Builder b(g);
  ValueId w = g.add_input("w", DType::f32, {n});
  ValueId x = g.add_input("x", DType::f32, {n});
  ValueId dot = b.op(OpKind::reduce_sum, ReduceAttrs{.axes = {0}, .keepdims = false},
                     {b.op(OpKind::mul, {}, {w, x}).at(0)})
                    .at(0);
  g.rename_value(dot, "dot");
  g.mark_output(dot);
  ValueId next = b.op(OpKind::add, {}, {w, x}).at(0);
  g.rename_value(next, "next_w");
  g.mark_output(next);
  return g;
}

// Runs `f` and expects an Error whose text holds every needle.
inline void expect_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needles.front() << "'";
  } catch (const Error& e) {
    for (const std::string& needle : needles)
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "'" << e.what() << "' lacks '" << needle << "'";
  }
}

#define FUSEBOX_RUNTIME_REQUIRE_GPU()                                           \
  do {                                                                          \
    if (!::fusebox::cuda_available())                                           \
      GTEST_SKIP() << "no CUDA device: the CUDA executable's tests need a GPU"; \
  } while (0)

}  // namespace fusebox::testing
