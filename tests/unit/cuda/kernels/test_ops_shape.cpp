// CUDA data-movement kernels against the CPU backend: copy_strided over many views (tiled
// transposes of odd sizes, negative strides, broadcasts, 1- to 8-byte elements, permutations
// that keep the last dim moved as words), reshape,
// transpose, concat, slice (negative steps), pad (every mode, negative pads), cast (every
// dtype pair, special values) and constant.
#include <cmath>
#include <limits>

#include "gpu_vs_cpu.h"

namespace fusebox::cuda::testing {
namespace {

using fusebox::testing::all_close;
using fusebox::testing::random_tensor;
using fusebox::testing::run_op;

const DType kAllTypes[] = {DType::f64, DType::f32, DType::f16,    DType::bf16,
                           DType::i64, DType::i32, DType::boolean};

class ShapeOpsTest : public ::testing::Test {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }
};

// Bitwise equality, whatever the dtype (NaN payloads included).
::testing::AssertionResult same_bytes(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape())
    return ::testing::AssertionFailure() << "type " << dtype_name(a.dtype()) << shape_str(a.shape())
                                         << " vs " << dtype_name(b.dtype()) << shape_str(b.shape());
  const auto* pa = static_cast<const unsigned char*>(a.raw());
  const auto* pb = static_cast<const unsigned char*>(b.raw());
  for (size_t i = 0; i < a.nbytes(); ++i) {
    if (pa[i] != pb[i])
      return ::testing::AssertionFailure() << "byte " << i << " of " << a.nbytes() << " differs";
  }
  return ::testing::AssertionSuccess();
}

TEST_F(ShapeOpsTest, CopyStridedMatchesGather) {
  OpHarness h;
  struct View {
    const char* name;
    Shape base, shape, strides;
    int64_t offset;
  };
  const View views[] = {
      {"2-d transpose, odd sizes", {33, 65}, {65, 33}, {1, 65}, 0},
      {"2-d transpose, big", {1000, 517}, {517, 1000}, {1, 517}, 0},
      {"batched last-two swap", {3, 40, 50}, {3, 50, 40}, {2000, 1, 50}, 0},
      {"3-d permutation (2, 0, 1)", {9, 10, 11}, {11, 9, 10}, {1, 110, 11}, 0},
      {"thin transpose", {2, 1000}, {1000, 2}, {1, 1000}, 0},
      {"negative strides", {20, 30}, {20, 30}, {-30, -1}, 599},
      {"broadcast", {30}, {4, 30}, {0, 1}, 0},
      {"every third, offset", {100}, {33}, {3}, 1},
      {"misaligned contiguous", {100}, {97}, {1}, 3},
      {"8 dims",
       {2, 2, 2, 2, 2, 2, 2, 3},
       {3, 2, 2, 2, 2, 2, 2, 2},
       {1, 3, 6, 12, 24, 48, 96, 192},
       0},
      {"scalar", {5}, {}, {}, 4},
      // The words path: the innermost dim contiguous in both (16-, 8-, 4-byte words by the
      // dtype and extents), and where an offset or extent forbids wide words.
      {"head split (2, 0, 3, 1, 4)", {2, 5, 3, 4, 16}, {3, 2, 4, 5, 16}, {64, 960, 16, 192, 1}, 0},
      {"head merge, odd inner", {2, 3, 5, 6}, {2, 5, 3, 6}, {90, 6, 30, 1}, 0},
      {"rows permuted, offset", {6, 8, 24}, {8, 6, 20}, {24, 192, 1}, 2},
  };
  uint64_t seed = 1;
  for (const View& v : views) {
    for (DType t : kAllTypes) {
      SCOPED_TRACE(cat(v.name, " ", dtype_name(t)));
      Tensor base = random_tensor(t, v.base, seed++, -100, 100);
      DeviceTensor src = h.view(base, v.shape, v.strides, v.offset);
      DeviceTensor dst = h.poisoned({t, v.shape});
      copy_strided(h.ctx(), src, dst);
      EXPECT_TRUE(same_bytes(h.download(dst), gather(base, v.shape, v.strides, v.offset)));
    }
  }
}

TEST_F(ShapeOpsTest, ReshapeFamilyCopies) {
  OpHarness h;
  Tensor x = random_tensor(DType::bf16, {4, 6, 5}, 3);
  const std::vector<std::pair<OpKind, Attrs>> ops = {
      {OpKind::reshape, ReshapeAttrs{{-1, 5}, false}},
      {OpKind::flatten, FlattenAttrs{2}},
      {OpKind::unsqueeze, AxesAttrs{{0, 3}}},
  };
  for (const auto& [op, attrs] : ops) {
    SCOPED_TRACE(op_name(op));
    EXPECT_TRUE(same_bytes(h.run(copy_reshape, op, attrs, {x})[0], run_op(op, attrs, {x})[0]));
  }
  Tensor y = random_tensor(DType::i32, {4, 1, 5}, 4, -9, 9);
  EXPECT_TRUE(same_bytes(h.run(copy_reshape, OpKind::squeeze, AxesAttrs{}, {y})[0],
                         run_op(OpKind::squeeze, AxesAttrs{}, {y})[0]));
}

TEST_F(ShapeOpsTest, TransposeMatchesCpu) {
  OpHarness h;
  const std::pair<Shape, std::vector<int64_t>> cases[] = {{{33, 65}, {1, 0}},
                                                          {{7, 1}, {1, 0}},
                                                          {{2, 3, 4}, {}},
                                                          {{64, 48, 40}, {0, 2, 1}},
                                                          {{5, 6, 7, 8}, {3, 1, 0, 2}},
                                                          {{300, 301}, {1, 0}},
                                                          {{2, 1, 3}, {1, 0, 2}}};
  uint64_t seed = 10;
  for (const auto& [shape, perm] : cases) {
    for (DType t : kAllTypes) {
      SCOPED_TRACE(cat(shape_str(shape), " perm size ", perm.size(), " ", dtype_name(t)));
      Tensor x = random_tensor(t, shape, seed++, -50, 50);
      TransposeAttrs attrs{perm};
      EXPECT_TRUE(same_bytes(h.run(transpose, OpKind::transpose, attrs, {x})[0],
                             run_op(OpKind::transpose, attrs, {x})[0]));
    }
  }
}

TEST_F(ShapeOpsTest, ConcatMatchesCpu) {
  OpHarness h;
  uint64_t seed = 40;
  for (int64_t axis : {0, 1, 2}) {
    for (DType t : {DType::f32, DType::f16, DType::i64, DType::boolean}) {
      SCOPED_TRACE(cat("axis ", axis, " ", dtype_name(t)));
      Shape a{3, 4, 5}, b{3, 4, 5}, c{3, 4, 5}, empty{3, 4, 5};
      a[size_t(axis)] = 2;
      b[size_t(axis)] = 7;
      c[size_t(axis)] = 1;
      empty[size_t(axis)] = 0;
      std::vector<Tensor> inputs{
          random_tensor(t, a, seed++, -9, 9), random_tensor(t, empty, seed++, -9, 9),
          random_tensor(t, b, seed++, -9, 9), random_tensor(t, c, seed++, -9, 9)};
      ConcatAttrs attrs{axis};
      EXPECT_TRUE(same_bytes(h.run(concat, OpKind::concat, attrs, inputs)[0],
                             run_op(OpKind::concat, attrs, inputs)[0]));
    }
  }
}

TEST_F(ShapeOpsTest, SliceMatchesCpu) {
  OpHarness h;
  const SliceAttrs cases[] = {
      {{1}, {5}, {0}, {1}},
      {{-1}, {-1000}, {1}, {-1}},          // reversed
      {{8, 1}, {0, 30}, {0, 1}, {-3, 7}},  // negative step and a stride
      {{2, 0, 3}, {5, 10, 100}, {0, 1, 2}, {}},
      {{4}, {4}, {0}, {1}},  // empty
      {{-2}, {-100}, {2}, {-2}},
  };
  uint64_t seed = 70;
  for (const SliceAttrs& attrs : cases) {
    for (DType t : {DType::f32, DType::bf16, DType::i32, DType::f64}) {
      SCOPED_TRACE(cat(dtype_name(t), " starts ", attrs.starts.size()));
      Tensor x = random_tensor(t, {10, 31, 6}, seed++, -9, 9);
      EXPECT_TRUE(same_bytes(h.run(slice, OpKind::slice, attrs, {x})[0],
                             run_op(OpKind::slice, attrs, {x})[0]));
    }
  }
}

TEST_F(ShapeOpsTest, PadMatchesCpu) {
  OpHarness h;
  struct Case {
    Shape shape;
    std::vector<int64_t> pads;
  };
  const Case cases[] = {
      {{5}, {2, 3}},
      {{5}, {-1, 4}},
      {{4, 6}, {1, 2, 3, 4}},
      {{4, 6}, {-1, 0, 2, -2}},
      {{2, 3, 4, 5}, {0, 1, 2, 3, 1, 0, 3, 2}},
      {{1, 7}, {0, 9, 0, 9}},  // wider than the input (constant and edge only)
      {{3, 8}, {2, 7, 2, 7}},  // reflect as far as it goes
      {{3, 1000}, {0, 5, 0, 5}},
  };
  // Inference allows reflect pads of at most extent - 1 per side.
  auto reflect_ok = [](const Case& c) {
    const size_t r = c.shape.size();
    for (size_t d = 0; d < r; ++d) {
      if (c.pads[d] > c.shape[d] - 1 || c.pads[d + r] > c.shape[d] - 1) return false;
    }
    return true;
  };
  uint64_t seed = 90;
  for (const Case& c : cases) {
    for (PadMode mode : {PadMode::constant, PadMode::reflect, PadMode::edge}) {
      if (mode == PadMode::reflect && !reflect_ok(c)) continue;
      for (DType t : {DType::f32, DType::f16, DType::i64, DType::boolean}) {
        SCOPED_TRACE(cat(shape_str(c.shape), " mode ", int(mode), " ", dtype_name(t)));
        Tensor x = random_tensor(t, c.shape, seed++, -9, 9);
        PadAttrs attrs{c.pads, mode, is_floating(t) ? 2.5 : 1.0};
        EXPECT_TRUE(
            same_bytes(h.run(pad, OpKind::pad, attrs, {x})[0], run_op(OpKind::pad, attrs, {x})[0]));
      }
    }
  }
}

TEST_F(ShapeOpsTest, CastEveryPairMatchesCpu) {
  OpHarness h;
  // Special values for float sources: NaN, infinities, out of every integer range, ties
  // for f16/bf16 rounding, negative zero, halves for truncation.
  const std::vector<double> specials = {NAN,  INFINITY,   -INFINITY, 1e20,          -1e20,
                                        3e9,  -3e9,       0.0,       -0.0,          2.5,
                                        -2.5, 0.5,        -0.99,     1.00048828125, 65520.0,
                                        1e-8, 1.00390625, 255.9,     -2147483648.0, 70000.0};
  uint64_t seed = 120;
  for (DType from : kAllTypes) {
    Tensor x = random_tensor(from, {4099}, seed++, -300, 300);
    if (is_floating(from)) {
      for (size_t i = 0; i < specials.size(); ++i) x.set(int64_t(i), specials[i]);
    }
    if (from == DType::i64) x.set(0, 9.2e18);
    for (DType to : kAllTypes) {
      SCOPED_TRACE(cat(dtype_name(from), " -> ", dtype_name(to)));
      CastAttrs attrs{to};
      EXPECT_TRUE(all_close(h.run(cast, OpKind::cast, attrs, {x})[0],
                            run_op(OpKind::cast, attrs, {x})[0], 0, 0));
    }
  }
}

TEST_F(ShapeOpsTest, CastMisalignedInputUsesScalarPath) {
  OpHarness h;
  Tensor base = random_tensor(DType::f32, {1001}, 3, -5, 5);
  Tensor logical = gather(base, {1000}, {1}, 1);
  DeviceTensor x = h.view(base, {1000}, {1}, 1);  // contiguous, 4-byte offset
  const BuiltNode built = build_node(OpKind::cast, CastAttrs{DType::bf16}, {logical});
  EXPECT_TRUE(all_close(h.run_device(cast, built, {&x})[0],
                        run_op(OpKind::cast, CastAttrs{DType::bf16}, {logical})[0], 0, 0));
}

TEST_F(ShapeOpsTest, ConstantUploadsItsValue) {
  OpHarness h;
  for (DType t : {DType::f32, DType::i64, DType::bf16}) {
    Tensor value = random_tensor(t, {3, 7}, 5, -9, 9);
    ConstantAttrs attrs{value};
    // Twice: the second run takes the cached device copy.
    for (int run = 0; run < 2; ++run)
      EXPECT_TRUE(same_bytes(h.run(constant, OpKind::constant, attrs, {})[0], value));
  }
}

}  // namespace
}  // namespace fusebox::cuda::testing
