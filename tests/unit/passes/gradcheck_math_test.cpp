// Gradient checks for the arithmetic ops: every unary op, the broadcasting binary
// ops (rank-changing broadcasts included), matmul (1-D operands, broadcast batch
// dims), gemm (transposes, alpha / beta, C broadcast) and the reductions.
#include "gradcheck.h"

namespace fusebox::testing::gradcheck {
namespace {

Shape random_shape(std::mt19937_64& rng, int64_t rank, int64_t lo, int64_t hi) {
  Shape s;
  for (int64_t d = 0; d < rank; ++d) s.push_back(pick(rng, lo, hi));
  return s;
}

// A shape that broadcasts to `target`: some leading dims dropped, some dims set to 1.
Shape broadcastable_to(std::mt19937_64& rng, const Shape& target) {
  Shape s(target.begin() + pick(rng, 0, int64_t(target.size())), target.end());
  for (int64_t& d : s)
    if (pick(rng, 0, 2) == 0) d = 1;
  return s;
}

struct UnaryCase {
  OpKind op;
  Attrs attrs;
  double lo, hi;        // input range
  bool away_from_zero;  // magnitudes in [lo, hi), random sign
};

TEST(GradCheckMath, UnaryOps) {
  const double inf = std::numeric_limits<double>::infinity();
  const UnaryCase cases[] = {
      {OpKind::relu, {}, -1, 1, false},
      {OpKind::leaky_relu, LeakyReluAttrs{0.2}, -1, 1, false},
      {OpKind::leaky_relu, LeakyReluAttrs{-1.5}, -1, 1, false},
      {OpKind::gelu, GeluAttrs{false}, -3, 3, false},
      {OpKind::gelu, GeluAttrs{true}, -3, 3, false},
      {OpKind::silu, {}, -3, 3, false},
      {OpKind::sigmoid, {}, -3, 3, false},
      {OpKind::tanh, {}, -2, 2, false},
      {OpKind::exp, {}, -2, 2, false},
      {OpKind::log, {}, 0.1, 3, false},
      {OpKind::sqrt, {}, 0.1, 3, false},
      {OpKind::rsqrt, {}, 0.2, 3, false},
      {OpKind::reciprocal, {}, 0.2, 2, true},
      {OpKind::neg, {}, -1, 1, false},
      {OpKind::abs, {}, 0.05, 1, true},
      {OpKind::erf, {}, -2, 2, false},
      {OpKind::sin, {}, -3, 3, false},
      {OpKind::cos, {}, -3, 3, false},
      {OpKind::clip, ClipAttrs{-0.4, 0.5}, -1, 1, false},
      {OpKind::clip, ClipAttrs{-inf, 0.1}, -1, 1, false},
      {OpKind::clip, ClipAttrs{-0.3, inf}, -1, 1, false},
      {OpKind::identity, {}, -1, 1, false},
  };
  std::mt19937_64 rng(301);
  uint64_t seed = 7000;
  for (const UnaryCase& c : cases) {
    for (int trial = 0; trial < 3; ++trial, ++seed) {
      // One scalar case; the others large enough that both sides of a kink occur.
      const Shape x = trial == 0 ? Shape{} : random_shape(rng, pick(rng, 2, 3), 2, 5);
      const std::string config = cat(op_name(c.op), " x ", shape_str(x));
      SCOPED_TRACE(config);
      Leaf leaf = input("x", x, seed, c.lo, c.hi);
      if (c.away_from_zero) leaf.value = away_from_zero(x, seed, c.lo, c.hi);
      Forward f = [&c](Builder& b, const std::vector<ValueId>& v) {
        return b.op(c.op, c.attrs, {v[0]});
      };
      EXPECT_TRUE(check_gradients({leaf}, f, {op_name(c.op), config, {}, 48, seed}));
    }
  }
}

TEST(GradCheckMath, BinaryOpsBroadcasting) {
  const OpKind ops[] = {OpKind::add, OpKind::sub, OpKind::mul, OpKind::div,
                        OpKind::max, OpKind::min, OpKind::pow};
  std::mt19937_64 rng(302);
  uint64_t seed = 7100;
  for (OpKind op : ops) {
    for (int trial = 0; trial < 5; ++trial, seed += 2) {
      const Shape out = random_shape(rng, pick(rng, 0, 4), 1, 4);
      Shape a = broadcastable_to(rng, out), b = broadcastable_to(rng, out);
      if (trial == 0) a = out;  // at least one case with one side full-shaped
      Leaf la = input("a", a, seed), lb = param("b", b, seed + 1);
      if (op == OpKind::div) lb.value = away_from_zero(b, seed + 1, 0.3, 2);
      if (op == OpKind::pow) {
        la = input("a", a, seed, 0.2, 2);
        lb = param("b", b, seed + 1, -2, 2);
      }
      const std::string config = cat(op_name(op), " a ", shape_str(a), " b ", shape_str(b));
      SCOPED_TRACE(config);
      Forward f = [op](Builder& bld, const std::vector<ValueId>& v) {
        return bld.op(op, {}, {v[0], v[1]});
      };
      EXPECT_TRUE(check_gradients({la, lb}, f, {op_name(op), config, {}, 48, seed}));
    }
  }
}

// pow with an integer exponent (no gradient for it) and the same value on both sides
// of a binary op (two uses accumulate).
TEST(GradCheckMath, IntegerExponentAndRepeatedOperand) {
  Leaf base = input("a", {2, 3}, 7200, -2, 2);
  Leaf exponent{"e", Tensor::from_vector<int64_t>({3}, {2, 3, -1}), false, false};
  base.value = away_from_zero({2, 3}, 7200, 0.3, 2);
  Forward pow = [](Builder& b, const std::vector<ValueId>& v) {
    return std::vector<ValueId>{b.pow(v[0], v[1])};
  };
  EXPECT_TRUE(check_gradients({base, exponent}, pow, {"pow", "pow, i64 exponent", {}, 48, 7200}));

  Forward square = [](Builder& b, const std::vector<ValueId>& v) {
    return std::vector<ValueId>{b.add(b.mul(v[0], v[0]), b.sub(v[0], b.exp(v[0])))};
  };
  EXPECT_TRUE(check_gradients({input("x", {3, 2}, 7201)}, square,
                              {"mul", "x * x + (x - exp(x)): accumulation", {}, 48, 7201}));
}

TEST(GradCheckMath, Matmul) {
  std::mt19937_64 rng(303);
  // Fixed shapes for 1-D operands and batch broadcasting, then random ones.
  std::vector<std::pair<Shape, Shape>> shapes = {{{4}, {4}},
                                                 {{4}, {4, 3}},
                                                 {{2, 3, 4}, {4}},
                                                 {{4}, {2, 4, 3}},
                                                 {{3, 4}, {4, 2}},
                                                 {{2, 1, 3, 4}, {3, 4, 5}},
                                                 {{1, 3, 4}, {2, 4, 2}},
                                                 {{2, 3, 4}, {4, 2}}};
  for (int trial = 0; trial < 6; ++trial) {
    const int64_t ra = pick(rng, 1, 4), rb = pick(rng, 1, 4);
    const int64_t M = pick(rng, 1, 4), K = pick(rng, 1, 4), N = pick(rng, 1, 4);
    const Shape batch = random_shape(rng, std::max<int64_t>({ra - 2, rb - 2, 0}), 1, 3);
    // An operand's batch dims: the trailing `count` of `batch`, some set to 1.
    const auto batch_dims = [&](int64_t count) {
      Shape s(batch.end() - std::max<int64_t>(count, 0), batch.end());
      for (int64_t& d : s)
        if (coin(rng)) d = 1;
      return s;
    };
    Shape a = ra == 1 ? Shape{K} : batch_dims(ra - 2);
    Shape b = rb == 1 ? Shape{K} : batch_dims(rb - 2);
    if (ra > 1) a.insert(a.end(), {M, K});
    if (rb > 1) b.insert(b.end(), {K, N});
    shapes.push_back({a, b});
  }
  uint64_t seed = 7300;
  for (const auto& [a, b] : shapes) {
    const std::string config = cat("a ", shape_str(a), " b ", shape_str(b));
    SCOPED_TRACE(config);
    Forward f = [](Builder& bld, const std::vector<ValueId>& v) {
      return std::vector<ValueId>{bld.matmul(v[0], v[1])};
    };
    EXPECT_TRUE(check_gradients({input("a", a, seed), param("b", b, seed + 1)}, f,
                                {"matmul", config, {}, 48, seed}));
    seed += 2;
  }
}

TEST(GradCheckMath, Gemm) {
  std::mt19937_64 rng(304);
  for (int trial = 0; trial < 14; ++trial) {
    const int64_t M = pick(rng, 1, 4), K = pick(rng, 1, 4), N = pick(rng, 1, 4);
    GemmAttrs g{trial % 2 == 1, trial % 4 >= 2, std::uniform_real_distribution<double>(-2, 2)(rng),
                std::uniform_real_distribution<double>(-2, 2)(rng)};
    const Shape a = g.trans_a ? Shape{K, M} : Shape{M, K};
    const Shape b = g.trans_b ? Shape{N, K} : Shape{K, N};
    const Shape c_shapes[] = {{}, {M, N}, {N}, {1, N}, {M, 1}, {}, {1}};
    const int c_kind = trial % 7;  // 0: no C; 5: a scalar C
    const uint64_t seed = 7400 + uint64_t(trial) * 3;
    std::vector<Leaf> leaves = {input("a", a, seed), param("b", b, seed + 1)};
    if (c_kind) leaves.push_back(param("c", c_shapes[c_kind], seed + 2));
    const std::string config =
        cat("a ", shape_str(a), " b ", shape_str(b), " trans ", g.trans_a, g.trans_b, " alpha ",
            g.alpha, " beta ", g.beta, c_kind ? cat(" c ", shape_str(c_shapes[c_kind])) : "");
    SCOPED_TRACE(config);
    Forward f = [g, c_kind](Builder& bld, const std::vector<ValueId>& v) {
      return std::vector<ValueId>{bld.gemm(v[0], v[1], c_kind ? v[2] : kNoValue, g)};
    };
    EXPECT_TRUE(check_gradients(leaves, f, {"gemm", config, {}, 48, seed}));
  }
}

TEST(GradCheckMath, Reductions) {
  const OpKind ops[] = {OpKind::reduce_sum, OpKind::reduce_mean, OpKind::reduce_max};
  std::mt19937_64 rng(305);
  uint64_t seed = 7500;
  for (OpKind op : ops) {
    for (int trial = 0; trial < 6; ++trial, ++seed) {
      const int64_t rank = pick(rng, 1, 4);
      const Shape x = random_shape(rng, rank, 1, 4);
      std::vector<int64_t> axes;  // empty: every axis
      if (trial > 0) {
        for (int64_t d = 0; d < rank; ++d)
          if (coin(rng)) axes.push_back(coin(rng) ? d - rank : d);
        if (axes.empty()) axes.push_back(pick(rng, 0, rank - 1));
      }
      const bool keepdims = coin(rng);
      const std::string config = cat(op_name(op), " x ", shape_str(x), " axes ", shape_str(axes),
                                     keepdims ? " keepdims" : "");
      SCOPED_TRACE(config);
      Forward f = [op, axes, keepdims](Builder& b, const std::vector<ValueId>& v) {
        return b.op(op, ReduceAttrs{axes, keepdims}, {v[0]});
      };
      EXPECT_TRUE(check_gradients({input("x", x, seed)}, f, {op_name(op), config, {}, 48, seed}));
    }
  }
}

}  // namespace
}  // namespace fusebox::testing::gradcheck
