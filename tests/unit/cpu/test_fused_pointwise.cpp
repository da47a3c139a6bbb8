// fused_pointwise on the CPU: the program gives the unfused chain's bits (every instruction
// rounded to its op's dtype), for random programs over broadcast shapes and f32 / bf16 /
// f16 (and f64, and mixes through casts), on sizes that span many threads' chunks.
#include "bit_identical.h"
#include "random_pointwise.h"

// Designated initialisers leave the other fields defaulted.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace fusebox::testing {
namespace {

::testing::AssertionResult fused_matches_unfused(const RandomChain& c) {
  const Tensor want = run_graph(unfused_graph(c), c.feeds()).at("y");
  const Tensor got = run_graph(fused_graph(c), c.feeds()).at("y");
  ::testing::AssertionResult same = bit_identical(got, want);
  if (!same) same << "\nprogram: " << pointwise_program_text(c.program);
  return same;
}

TEST(CpuFusedPointwise, RandomProgramsGiveTheUnfusedBits) {
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    SCOPED_TRACE(cat("seed ", seed));
    EXPECT_TRUE(fused_matches_unfused(random_chain(seed)));
  }
}

TEST(CpuFusedPointwise, EveryDtypeAlone) {
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    ChainOptions o;
    o.dtypes = {t};
    for (uint64_t seed = 1000; seed < 1060; ++seed) {
      SCOPED_TRACE(cat(dtype_name(t), " seed ", seed));
      EXPECT_TRUE(fused_matches_unfused(random_chain(seed, o)));
    }
  }
}

TEST(CpuFusedPointwise, MixedWidthsThroughCastsAndPow) {
  ChainOptions o;
  o.dtypes = {DType::f64, DType::bf16, DType::f32};
  for (uint64_t seed = 2000; seed < 2100; ++seed) {
    SCOPED_TRACE(cat("seed ", seed));
    EXPECT_TRUE(fused_matches_unfused(random_chain(seed, o)));
  }
}

// Larger than one thread's chunk (backends/cpu kGrain) and not a multiple of the block.
TEST(CpuFusedPointwise, LargeBroadcastShapes) {
  ChainOptions o;
  o.random_shape = false;
  o.shape = {3, 7, 2053};
  for (uint64_t seed = 3000; seed < 3006; ++seed) {
    SCOPED_TRACE(cat("seed ", seed));
    EXPECT_TRUE(fused_matches_unfused(random_chain(seed, o)));
  }
}

// The special values: NaN, infinities, signed zeros, bf16 values clip bounds fall between.
TEST(CpuFusedPointwise, SpecialValues) {
  const Tensor x = Tensor::from_doubles(DType::bf16, {8},
                                        {0.0, -0.0, INFINITY, -INFINITY, NAN, 1e30, -3.5, 0.3});
  const Tensor s = Tensor::from_doubles(DType::bf16, {}, {-0.7});
  RandomChain c;
  c.inputs = {x, s};
  c.program = {2,
               {{OpKind::relu, {0}},
                {OpKind::mul, {2, 1}},
                {.op = OpKind::clip, .operands = {3}, .min = -0.3, .max = 0.3},
                {OpKind::max, {4, 0}},
                {OpKind::neg, {5}},
                {.op = OpKind::leaky_relu, .operands = {6}, .alpha = 0.1},
                {.op = OpKind::gelu, .operands = {7}, .tanh_approximation = true},
                {.op = OpKind::cast, .operands = {8}, .to = DType::f16},
                {OpKind::sigmoid, {9}}}};
  EXPECT_TRUE(fused_matches_unfused(c));
}

}  // namespace
}  // namespace fusebox::testing
