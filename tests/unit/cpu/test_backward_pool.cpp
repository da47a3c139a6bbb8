// max_pool_backward and avg_pool_backward: gradient checks in f64 against central
// differences of the forward pools (gradient_check.h) for 1-D, 2-D and 3-D windows with
// pads, strides, dilation, ceil_mode and count_include_pad both ways (max_pool's inputs
// tie-free); max_pool's tie rule against the forward's indices; low-precision dtypes.
#include <cmath>

#include "gradient_check.h"

// Designated initialisers leave the other fields defaulted.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace fusebox::cpu::test {
namespace {

using namespace fusebox::testing;

struct PoolCase {
  Shape x;
  PoolAttrs pool;
};

std::string describe(const PoolCase& c) {
  const PoolAttrs& p = c.pool;
  return cat("x ", shape_str(c.x), " kernel ", shape_str(p.kernel), " strides ",
             shape_str(p.strides), " dilations ", shape_str(p.dilations), " pads ",
             shape_str(p.pads_begin), "/", shape_str(p.pads_end), p.ceil_mode ? " ceil" : "",
             p.count_include_pad ? " include_pad" : "");
}

// Windows of every rank, each with at least one in-bounds tap (a window of padding only
// gives max_pool -inf, where no gradient check applies).
std::vector<PoolCase> pool_cases(bool dilated) {
  std::vector<PoolCase> cases = {
      {{2, 2, 9}, {.kernel = {3}, .strides = {2}, .pads_begin = {1}, .pads_end = {1}}},
      {{1, 2, 8},
       {.kernel = {2}, .strides = {3}, .pads_begin = {1}, .pads_end = {0}, .ceil_mode = true}},
      {{1, 2, 5, 6},
       {.kernel = {2, 3}, .strides = {2, 1}, .pads_begin = {1, 0}, .pads_end = {0, 1}}},
      {{2, 1, 5, 5},
       {.kernel = {3, 3},
        .strides = {2, 2},
        .pads_begin = {1, 1},
        .pads_end = {1, 1},
        .ceil_mode = true}},
      {{1, 1, 4, 5, 3},
       {.kernel = {2, 2, 2}, .strides = {1, 2, 1}, .pads_begin = {1, 0, 1}, .pads_end = {0, 1, 0}}},
      {{1, 2, 3, 4, 4},
       {.kernel = {2, 3, 2},
        .strides = {2, 2, 3},
        .pads_begin = {0, 1, 1},
        .pads_end = {1, 1, 0},
        .ceil_mode = true}},
  };
  if (dilated) {
    cases.push_back({{1, 2, 11},
                     {.kernel = {3},
                      .strides = {2},
                      .dilations = {2},
                      .pads_begin = {1},
                      .pads_end = {1},
                      .ceil_mode = true}});
    cases.push_back({{1, 1, 7, 6},
                     {.kernel = {2, 2},
                      .strides = {1, 2},
                      .dilations = {3, 2},
                      .pads_begin = {2, 1},
                      .pads_end = {0, 1}}});
    cases.push_back({{1, 1, 5, 5, 5},
                     {.kernel = {2, 2, 2},
                      .strides = {2, 2, 2},
                      .dilations = {2, 1, 2},
                      .pads_begin = {1, 0, 1},
                      .pads_end = {0, 0, 1}}});
  }
  return cases;
}

PoolBackwardAttrs backward_attrs(const PoolCase& c) {
  return {.pool = c.pool, .input_shape = c.x};
}

TEST(MaxPoolBackward, MatchesFiniteDifferences) {
  uint64_t seed = 10;
  for (const PoolCase& c : pool_cases(true)) {
    SCOPED_TRACE(describe(c));
    const Tensor x = distinct_values(c.x, ++seed);
    const Tensor y = run_op(OpKind::max_pool, c.pool, {x}).at(0);
    const Tensor dy = random_tensor(DType::f64, y.shape(), ++seed);
    const Tensor dx = run_op(OpKind::max_pool_backward, backward_attrs(c), {dy, x}).at(0);
    EXPECT_TRUE(matches_numeric(dx, OpKind::max_pool, c.pool, {x}, 0, dy));
  }
}

TEST(AvgPoolBackward, MatchesFiniteDifferences) {
  uint64_t seed = 100;
  for (bool include_pad : {false, true}) {
    for (PoolCase c : pool_cases(false)) {
      c.pool.count_include_pad = include_pad;
      SCOPED_TRACE(describe(c));
      const Tensor x = random_tensor(DType::f64, c.x, ++seed);
      const Tensor y = run_op(OpKind::avg_pool, c.pool, {x}).at(0);
      const Tensor dy = random_tensor(DType::f64, y.shape(), ++seed);
      const Tensor dx = run_op(OpKind::avg_pool_backward, backward_attrs(c), {dy}).at(0);
      EXPECT_TRUE(matches_numeric(dx, OpKind::avg_pool, c.pool, {x}, 0, dy));
    }
  }
}

// count_include_pad with ceil_mode: the divisor counts the pads but not the positions
// past the end padding. x [1, 1, 4], kernel 3, stride 2, pads 1/1, ceil: windows over
// padded positions [-1, 1], [1, 3], [3, 5], the last one's 5 lying past the end pad.
TEST(AvgPoolBackward, CeilModeDivisorByHand) {
  PoolBackwardAttrs a{.pool = {.kernel = {3},
                               .strides = {2},
                               .pads_begin = {1},
                               .pads_end = {1},
                               .ceil_mode = true,
                               .count_include_pad = true},
                      .input_shape = {1, 1, 4}};
  const Tensor dy = Tensor::from_vector<double>({1, 1, 3}, {3, 6, 12});
  // Divisors 3, 3, 2 (positions 3, 4): shares 1, 2, 6.
  EXPECT_EQ(run_op(OpKind::avg_pool_backward, a, {dy}).at(0).to_doubles(),
            (std::vector<double>{1, 1 + 2, 2, 2 + 6}));
  a.pool.count_include_pad = false;  // divisors 2, 3, 1: shares 1.5, 2, 12
  EXPECT_EQ(run_op(OpKind::avg_pool_backward, a, {dy}).at(0).to_doubles(),
            (std::vector<double>{1.5, 1.5 + 2, 2, 2 + 12}));
}

TEST(MaxPoolBackward, TiesGoToTheFirstMaximumAsTheForwardIndices) {
  // Hand-worked: windows {1, 3}, {3, 3}, {3, 2} pick positions 1, 1, 2.
  const PoolBackwardAttrs a{.pool = {.kernel = {2}}, .input_shape = {1, 1, 4}};
  const Tensor x = Tensor::from_vector<double>({1, 1, 4}, {1, 3, 3, 2});
  const Tensor dy = Tensor::from_vector<double>({1, 1, 3}, {1, 10, 100});
  EXPECT_EQ(run_op(OpKind::max_pool_backward, a, {dy, x}).at(0).to_doubles(),
            (std::vector<double>{0, 11, 100, 0}));

  // Many ties (few distinct values): dx is dy scattered through the forward's indices.
  uint64_t seed = 200;
  for (PoolCase c : pool_cases(true)) {
    SCOPED_TRACE(describe(c));
    c.pool.return_indices = true;
    const Tensor xt = random_tensor(DType::i64, c.x, ++seed, 0, 3).cast(DType::f32);
    const std::vector<Tensor> fwd = run_op(OpKind::max_pool, c.pool, {xt});
    const Tensor dyt = random_tensor(DType::f32, fwd[0].shape(), ++seed);
    const Tensor dx = run_op(OpKind::max_pool_backward, backward_attrs(c), {dyt, xt}).at(0);
    std::vector<double> want(size_t(xt.numel()), 0.0);
    for (int64_t o = 0; o < dyt.numel(); ++o) want[size_t(fwd[1].get(o))] += dyt.get(o);
    EXPECT_TRUE(close_to(dx, DType::f32, c.x, want));
  }
}

TEST(PoolBackward, LowPrecisionDtypesFollowF64) {
  uint64_t seed = 300;
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    for (PoolCase c : pool_cases(false)) {
      c.pool.count_include_pad = true;
      SCOPED_TRACE(cat(describe(c), " ", dtype_name(t)));
      const Tensor x = random_tensor(t, c.x, ++seed);
      const Tensor y = run_op(OpKind::max_pool, c.pool, {x}).at(0);
      const Tensor dy = random_tensor(t, y.shape(), ++seed);
      for (OpKind op : {OpKind::max_pool_backward, OpKind::avg_pool_backward}) {
        const bool is_max = op == OpKind::max_pool_backward;
        const std::vector<Tensor> in =
            is_max ? std::vector<Tensor>{dy, x} : std::vector<Tensor>{dy};
        const std::vector<Tensor> in64 =
            is_max ? std::vector<Tensor>{dy.cast(DType::f64), x.cast(DType::f64)}
                   : std::vector<Tensor>{dy.cast(DType::f64)};
        const Tensor got = run_op(op, backward_attrs(c), in).at(0);
        const Tensor want = run_op(op, backward_attrs(c), in64).at(0);
        EXPECT_TRUE(close_to(got, t, c.x, want.to_doubles(), 2)) << op_name(op);
      }
    }
  }
}

}  // namespace
}  // namespace fusebox::cpu::test
