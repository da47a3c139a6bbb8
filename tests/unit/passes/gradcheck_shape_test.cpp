// Gradient checks for the shape and data-movement ops: reshape, flatten, transpose,
// concat, slice (negative steps, clamped bounds), pad (every mode, crops), squeeze,
// unsqueeze, cast, identity, expand, constant, gather and gather_elements (repeated and
// negative indices), cumsum (every mode), where (broadcast operands) and resize.
#include <algorithm>
#include <numeric>

#include "gradcheck.h"

namespace fusebox::testing::gradcheck {
namespace {

Shape random_shape(std::mt19937_64& rng, int64_t rank, int64_t lo, int64_t hi) {
  Shape s;
  for (int64_t d = 0; d < rank; ++d) s.push_back(pick(rng, lo, hi));
  return s;
}

// Checks a one-input op applied to a random f64 input.
void check_unary_op(const std::string& op, const std::string& config, const Shape& x,
                    std::function<ValueId(Builder&, ValueId)> apply, uint64_t seed) {
  SCOPED_TRACE(config);
  Forward f = [apply](Builder& b, const std::vector<ValueId>& v) {
    return std::vector<ValueId>{apply(b, v[0])};
  };
  EXPECT_TRUE(check_gradients({input("x", x, seed)}, f, {op, config, {}, 64, seed}));
}

TEST(GradCheckShape, ReshapeFlattenSqueezeUnsqueeze) {
  std::mt19937_64 rng(401);
  uint64_t seed = 8000;
  for (int trial = 0; trial < 4; ++trial, ++seed) {
    const Shape x = random_shape(rng, pick(rng, 2, 4), 1, 4);
    const int64_t n = numel(x);
    const std::vector<std::vector<int64_t>> targets = {
        {-1}, {0, -1}, {1, n, 1}, Shape(x.rbegin(), x.rend())};
    const std::vector<int64_t>& t = targets[size_t(trial)];
    check_unary_op(
        "reshape", cat("x ", shape_str(x), " to ", shape_str(t)), x,
        [t](Builder& b, ValueId v) { return b.reshape(v, t); }, seed);
  }
  for (int trial = 0; trial < 4; ++trial, ++seed) {
    const int64_t rank = pick(rng, 1, 4);
    const Shape x = random_shape(rng, rank, 1, 4);
    const int64_t axis = pick(rng, -rank, rank);
    check_unary_op(
        "flatten", cat("x ", shape_str(x), " axis ", axis), x,
        [axis](Builder& b, ValueId v) { return b.flatten(v, axis); }, seed);
  }
  for (int trial = 0; trial < 4; ++trial, ++seed) {
    Shape x = random_shape(rng, pick(rng, 1, 4), 1, 3);
    std::vector<int64_t> axes;  // empty: every unit dim
    x[size_t(pick(rng, 0, int64_t(x.size()) - 1))] = 1;
    if (trial % 2) {
      for (size_t d = 0; d < x.size(); ++d)
        if (x[d] == 1 && coin(rng))
          axes.push_back(coin(rng) ? int64_t(d) - int64_t(x.size()) : int64_t(d));
    }
    check_unary_op(
        "squeeze", cat("x ", shape_str(x), " axes ", shape_str(axes)), x,
        [axes](Builder& b, ValueId v) { return b.squeeze(v, axes); }, seed);
  }
  for (int trial = 0; trial < 4; ++trial, ++seed) {
    const Shape x = random_shape(rng, pick(rng, 0, 3), 1, 3);
    const int64_t out_rank = int64_t(x.size()) + pick(rng, 1, 2);
    std::vector<int64_t> axes = {pick(rng, -out_rank, out_rank - 1)};
    if (out_rank - int64_t(x.size()) == 2) {
      int64_t other = pick(rng, 0, out_rank - 1);
      int64_t first = axes[0] < 0 ? axes[0] + out_rank : axes[0];
      if (other == first) other = (other + 1) % out_rank;
      axes.push_back(other);
    }
    check_unary_op(
        "unsqueeze", cat("x ", shape_str(x), " axes ", shape_str(axes)), x,
        [axes](Builder& b, ValueId v) { return b.unsqueeze(v, axes); }, seed);
  }
}

TEST(GradCheckShape, Transpose) {
  std::mt19937_64 rng(402);
  for (int trial = 0; trial < 6; ++trial) {
    const int64_t rank = pick(rng, 1, 5);
    const Shape x = random_shape(rng, rank, 1, 3);
    std::vector<int64_t> perm(static_cast<size_t>(rank));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    if (trial == 0) perm.clear();  // reverse
    check_unary_op(
        "transpose", cat("x ", shape_str(x), " perm ", shape_str(perm)), x,
        [perm](Builder& b, ValueId v) { return b.transpose(v, perm); }, 8100 + uint64_t(trial));
  }
}

TEST(GradCheckShape, Concat) {
  std::mt19937_64 rng(403);
  for (int trial = 0; trial < 6; ++trial) {
    const int64_t rank = pick(rng, 1, 3);
    const Shape base = random_shape(rng, rank, 1, 3);
    const int64_t axis = pick(rng, -rank, rank - 1);
    const size_t axis_index = size_t(axis < 0 ? axis + rank : axis);
    const int count = int(pick(rng, 1, 3));
    std::vector<Leaf> leaves;
    std::string config = cat("axis ", axis, " inputs");
    for (int i = 0; i < count; ++i) {
      Shape s = base;
      s[axis_index] = pick(rng, 1, 3);
      config += " " + shape_str(s);
      // Mixed inputs and parameters.
      leaves.push_back(i % 2 ? param(cat("p", i), s, 8200 + uint64_t(trial * 4 + i))
                             : input(cat("x", i), s, 8200 + uint64_t(trial * 4 + i)));
    }
    SCOPED_TRACE(config);
    Forward f = [axis](Builder& b, const std::vector<ValueId>& v) {
      return std::vector<ValueId>{b.concat(v, axis)};
    };
    EXPECT_TRUE(check_gradients(leaves, f, {"concat", config, {}, 48, 8200 + uint64_t(trial)}));
  }
}

// Bounds are drawn past both ends (clamped) with steps of either sign; draws whose
// result is empty are redrawn (their gradient is trivially zero), but for one case.
TEST(GradCheckShape, Slice) {
  std::mt19937_64 rng(404);
  for (int trial = 0; trial < 12; ++trial) {
    Shape x, y;
    SliceAttrs a;
    do {
      const int64_t rank = pick(rng, 1, 3);
      x = random_shape(rng, rank, 1, 6);
      a = SliceAttrs{};
      for (int64_t d = 0; d < rank; ++d) {
        if (d > 0 && coin(rng)) continue;
        const int64_t dim = x[size_t(d)];
        int64_t step = pick(rng, -3, 3);
        if (step == 0) step = 1;
        a.axes.push_back(coin(rng) ? d - rank : d);
        a.starts.push_back(pick(rng, -dim - 2, dim + 2));
        a.ends.push_back(pick(rng, -dim - 2, dim + 2));
        a.steps.push_back(step);
      }
      Graph probe;
      Builder pb(probe);
      y = probe.value(pb.slice(probe.add_input("x", DType::f64, x), a)).type.shape;
    } while (numel(y) == 0 && trial > 0);
    const std::string config =
        cat("x ", shape_str(x), " starts ", shape_str(a.starts), " ends ", shape_str(a.ends),
            " axes ", shape_str(a.axes), " steps ", shape_str(a.steps), " -> ", shape_str(y));
    check_unary_op(
        "slice", config, x, [a](Builder& b, ValueId v) { return b.slice(v, a); },
        8300 + uint64_t(trial));
  }
}

TEST(GradCheckShape, Pad) {
  std::mt19937_64 rng(405);
  const char* modes[] = {"constant", "reflect", "edge"};
  for (int trial = 0; trial < 12; ++trial) {
    const int64_t rank = pick(rng, 1, 3);
    const Shape x = random_shape(rng, rank, 2, 4);
    PadAttrs a;
    a.mode = PadMode(trial % 3);
    a.value = 0.5;
    a.pads.assign(size_t(2 * rank), 0);
    for (int64_t d = 0; d < rank; ++d) {
      const int64_t extent = x[size_t(d)];
      // Each dim either grows or is cropped (a crop mixed with a reflection is left out:
      // which of the two applies first is not a question for autodiff).
      const bool crop = pick(rng, 0, 3) == 0;
      for (int side = 0; side < 2; ++side) {
        int64_t p = a.mode == PadMode::reflect ? pick(rng, 0, extent - 1) : pick(rng, 0, 2);
        if (crop) p = -pick(rng, 0, (extent - 1) / 2);
        a.pads[size_t(side * rank + d)] = p;
      }
    }
    const std::string config =
        cat(modes[trial % 3], " x ", shape_str(x), " pads ", shape_str(a.pads));
    check_unary_op(
        "pad", config, x, [a](Builder& b, ValueId v) { return b.pad(v, a); },
        8400 + uint64_t(trial));
  }
}

TEST(GradCheckShape, Expand) {
  const std::pair<Shape, Shape> cases[] = {
      {{3, 1}, {2, 3, 4}}, {{}, {2, 3}}, {{1}, {3}}, {{2, 1, 3}, {2, 4, 3}}, {{4}, {2, 1, 4}}};
  uint64_t seed = 8500;
  for (const auto& [x, shape] : cases) {
    const Shape target = shape;
    check_unary_op(
        "expand", cat("x ", shape_str(x), " to ", shape_str(target)), x,
        [target](Builder& b, ValueId v) {
          return b.op(OpKind::expand, ExpandAttrs{target}, {v}).at(0);
        },
        seed++);
  }
}

TEST(GradCheckShape, GatherAndGatherElements) {
  // An embedding-like lookup along each axis: repeated and negative indices add up.
  const Tensor rows = Tensor::from_vector<int64_t>({2, 3}, {3, 0, -1, 3, 1, 1});
  for (int64_t axis : {0, 1}) {
    check_unary_op(
        "gather", cat("x [4, 4] axis ", axis, " indices [2, 3]"), {4, 4},
        [&rows, axis](Builder& b, ValueId v) {
          return b.op(OpKind::gather, GatherAttrs{axis}, {v, b.constant(rows)}).at(0);
        },
        8700 + uint64_t(axis));
  }
  const Tensor picks = Tensor::from_vector<int32_t>({2, 4}, {2, 0, -1, 1, 1, 1, 0, 2});
  check_unary_op(
      "gather_elements", "x [3, 3] axis 1 indices [2, 4]", {3, 3},
      [&picks](Builder& b, ValueId v) {
        return b.op(OpKind::gather_elements, GatherAttrs{1}, {v, b.constant(picks)}).at(0);
      },
      8710);
}

TEST(GradCheckShape, CumSum) {
  uint64_t seed = 8720;
  for (int64_t axis : {0, 1, -1})
    for (bool exclusive : {false, true})
      for (bool reverse : {false, true}) {
        const CumSumAttrs a{axis, exclusive, reverse};
        check_unary_op(
            "cumsum",
            cat("x [3, 4, 2] axis ", axis, " exclusive ", exclusive, " reverse ", reverse),
            {3, 4, 2}, [a](Builder& b, ValueId v) { return b.op(OpKind::cumsum, a, {v}).at(0); },
            seed++);
      }
}

// resize: each mode, up and down along different dims; the taps' weights carry dy back.
TEST(GradCheckShape, Resize) {
  const std::vector<std::pair<std::string, ResizeAttrs>> cases = {
      {"linear half_pixel [3, 4] -> [5, 3]", {.sizes = {5, 3}, .mode = ResizeMode::linear}},
      {"cubic align_corners [3, 4] -> [2, 7]",
       {.sizes = {2, 7},
        .mode = ResizeMode::cubic,
        .coordinates = ResizeCoordinates::align_corners}},
      {"nearest asymmetric [3, 4] -> [7, 2]",
       {.sizes = {7, 2}, .coordinates = ResizeCoordinates::asymmetric}},
  };
  uint64_t seed = 8740;
  for (const auto& [what, a] : cases)
    check_unary_op(
        "resize", what, {3, 4},
        [a](Builder& b, ValueId v) { return b.op(OpKind::resize, a, {v}).at(0); }, seed++);
}

// where(c, a, b) with every operand broadcast: a's gradient where c holds, summed back to a's
// shape; b's elsewhere.
TEST(GradCheckShape, Where) {
  Tensor c = Tensor::empty(DType::boolean, {2, 1, 3});
  for (int64_t i = 0; i < 6; ++i) c.data<bool>()[i] = (i * 7) % 3 != 0;
  Forward f = [c](Builder& b, const std::vector<ValueId>& v) {
    return std::vector<ValueId>{b.op(OpKind::where, {}, {b.constant(c), v[0], v[1]}).at(0)};
  };
  EXPECT_TRUE(check_gradients({input("a", {4, 1}, 8730), input("b", {2, 4, 3}, 8731)}, f,
                              {"where", "c [2, 1, 3], a [4, 1], b [2, 4, 3]", {}, 48, 8732}));
}

TEST(GradCheckShape, IdentityAndConstant) {
  check_unary_op(
      "identity", "x [2, 3]", {2, 3}, [](Builder& b, ValueId v) { return b.identity(v); }, 8600);
  // A constant node on both sides of the computation: it takes no gradient and must
  // not disturb x's.
  check_unary_op(
      "constant", "x * c + c, c a constant node", {2, 3},
      [](Builder& b, ValueId v) {
        const ValueId c = b.constant(random_tensor(DType::f64, {3}, 8601));
        return b.add(b.mul(v, c), c);
      },
      8602);
}

// cast: f64 -> f64, f32 -> f64 (an f32 leaf), f64 -> f32 (the harness casts the f32
// output back to f64 for the loss), and f64 -> i64 -> f64 beside an f64 path (the
// integer path carries no gradient; its finite difference is 0 too).
TEST(GradCheckShape, Cast) {
  check_unary_op(
      "cast", "f64 -> f64", {2, 3}, [](Builder& b, ValueId v) { return b.cast(v, DType::f64); },
      8700);
  check_unary_op(
      "cast", "f64 -> i64 -> f64, plus x", {2, 3},
      [](Builder& b, ValueId v) {
        const ValueId scaled = b.mul(v, b.constant(Tensor::scalar(DType::f64, 7.0)));
        return b.add(b.cast(b.cast(scaled, DType::i64), DType::f64), v);
      },
      8701);
  // Through f32 the perturbation itself is rounded to f32 (~6e-8): h = 3e-3 keeps that
  // near 1e-5 of the difference (the harness divides by the perturbation as stored).
  // Through tanh the truncation error is ~h^2 |f'''| / 6 < 3e-6. rtol 1e-4 covers both
  // and the f32 rounding of the products.
  const Tolerance f32_tol{3e-3, 1e-4, 1e-6};
  {
    Leaf x{"x", random_tensor(DType::f32, {3, 2}, 8702), false, true};
    Forward f = [](Builder& b, const std::vector<ValueId>& v) {
      return std::vector<ValueId>{b.cast(v[0], DType::f64)};
    };
    EXPECT_TRUE(check_gradients({x}, f, {"cast", "f32 -> f64", f32_tol, 48, 8702}));
  }
  {
    Forward f = [](Builder& b, const std::vector<ValueId>& v) {
      return std::vector<ValueId>{b.tanh(b.cast(v[0], DType::f32))};
    };
    EXPECT_TRUE(check_gradients({input("x", {3, 2}, 8703)}, f,
                                {"cast", "f64 -> f32 -> tanh (f32 gradient)", f32_tol, 48, 8703}));
  }
}

}  // namespace
}  // namespace fusebox::testing::gradcheck
