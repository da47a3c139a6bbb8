// CUDA resize and resize_backward against the CPU backend: every mode and coordinate mapping,
// up and down, float dtypes (nearest also integers, bit for bit), an extrapolating crop, the
// backward's gathers (images resampled in their last two dims) and atomics (the rest), with
// f32 sums for f16 / bf16.
#include "gpu_vs_cpu.h"

namespace fusebox::cuda::testing {
namespace {

using fusebox::testing::all_close;
using fusebox::testing::random_tensor;
using fusebox::testing::run_op;

class ResizeTest : public ::testing::Test {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }
};

std::vector<ResizeAttrs> resize_cases() {
  std::vector<ResizeAttrs> cases;
  const Shape up_down = {2, 3, 13, 5};  // x is [2, 3, 6, 8]
  for (ResizeCoordinates c :
       {ResizeCoordinates::half_pixel, ResizeCoordinates::half_pixel_symmetric,
        ResizeCoordinates::pytorch_half_pixel, ResizeCoordinates::align_corners,
        ResizeCoordinates::asymmetric})
    for (ResizeMode m : {ResizeMode::nearest, ResizeMode::linear, ResizeMode::cubic})
      cases.push_back({.sizes = up_down, .mode = m, .coordinates = c});
  cases.push_back({.sizes = up_down, .mode = ResizeMode::cubic, .exclude_outside = true});
  cases.push_back({.sizes = up_down, .nearest = ResizeNearest::ceil});
  cases.push_back({.sizes = {2, 3, 7, 7},
                   .mode = ResizeMode::linear,
                   .coordinates = ResizeCoordinates::tf_crop_and_resize,
                   .extrapolation_value = 5,
                   .roi_start = {0, 0, -0.2, 0.3},
                   .roi_end = {1, 1, 0.9, 1.3}});
  cases.push_back({.sizes = {2, 3, 12, 16}, .mode = ResizeMode::linear});  // PyTorch's 2x
  // A leading dim resampled too: the general kernel (the others take the 2-D one).
  cases.push_back({.sizes = {2, 5, 13, 5}, .mode = ResizeMode::linear});
  cases.push_back({.sizes = {3, 3, 13, 5}, .mode = ResizeMode::nearest});
  return cases;
}

TEST_F(ResizeTest, EveryModeAndMappingMatchesCpu) {
  OpHarness h;
  uint64_t seed = 1;
  for (const ResizeAttrs& a : resize_cases()) {
    for (DType t : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
      SCOPED_TRACE(cat(resize_mode_name(a.mode), " ", resize_coordinates_name(a.coordinates), " ",
                       shape_str(a.sizes), " ", dtype_name(t)));
      const Tensor x = random_tensor(t, {2, 3, 6, 8}, seed++);
      const double tol = t == DType::f64 ? 1e-12 : t == DType::f32 ? 1e-5 : 1e-2;
      EXPECT_TRUE(all_close(h.run(resize, OpKind::resize, a, {x})[0],
                            run_op(OpKind::resize, a, {x})[0], tol, tol));
      const ResizeBackwardAttrs back{a, {2, 3, 6, 8}};
      const Tensor dy = random_tensor(t, a.sizes, seed++);
      EXPECT_TRUE(all_close(h.run(resize_backward, OpKind::resize_backward, back, {dy})[0],
                            run_op(OpKind::resize_backward, back, {dy})[0], tol, 4 * tol));
    }
  }
}

// The backward's gathers where every dx element takes many dy elements: DeepLabV3's 8x
// bilinear upsample, its ASPP pooling branch (1 x 1 -> H x W), a 3x downsample, and each mode.
TEST_F(ResizeTest, LargeScalesGatherTheBackward) {
  OpHarness h;
  struct Case {
    Shape x;
    ResizeAttrs a;
  };
  const std::vector<Case> cases = {
      {{2, 3, 6, 8},
       {.sizes = {2, 3, 48, 64},
        .mode = ResizeMode::linear,
        .coordinates = ResizeCoordinates::pytorch_half_pixel}},
      {{2, 3, 6, 8},
       {.sizes = {2, 3, 48, 64},
        .mode = ResizeMode::linear,
        .coordinates = ResizeCoordinates::align_corners}},
      {{2, 3, 6, 8}, {.sizes = {2, 3, 45, 61}, .mode = ResizeMode::cubic}},
      {{2, 3, 6, 8}, {.sizes = {2, 3, 48, 64}, .mode = ResizeMode::nearest}},
      {{2, 4, 1, 1}, {.sizes = {2, 4, 9, 7}, .mode = ResizeMode::linear}},
      {{2, 4, 1, 1},
       {.sizes = {2, 4, 9, 7},
        .mode = ResizeMode::linear,
        .coordinates = ResizeCoordinates::align_corners}},
      {{2, 3, 30, 27}, {.sizes = {2, 3, 10, 9}, .mode = ResizeMode::linear}},
      {{2, 3, 30, 27}, {.sizes = {2, 3, 10, 9}, .mode = ResizeMode::cubic}},
  };
  uint64_t seed = 100;
  for (const Case& c : cases) {
    for (DType t : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(cat(resize_mode_name(c.a.mode), " ", resize_coordinates_name(c.a.coordinates),
                       " ", shape_str(c.x), " -> ", shape_str(c.a.sizes), " ", dtype_name(t)));
      const double tol = t == DType::f32 ? 1e-5 : 1e-2;
      const Tensor x = random_tensor(t, c.x, seed++);
      EXPECT_TRUE(all_close(h.run(resize, OpKind::resize, c.a, {x})[0],
                            run_op(OpKind::resize, c.a, {x})[0], tol, tol));
      const ResizeBackwardAttrs back{c.a, c.x};
      const Tensor dy = random_tensor(t, c.a.sizes, seed++);
      EXPECT_TRUE(all_close(h.run(resize_backward, OpKind::resize_backward, back, {dy})[0],
                            run_op(OpKind::resize_backward, back, {dy})[0], tol, 4 * tol));
    }
  }
}

TEST_F(ResizeTest, NearestCopiesIntegersExactly) {
  OpHarness h;
  const ResizeAttrs a{.sizes = {3, 9, 4},
                      .coordinates = ResizeCoordinates::asymmetric,
                      .nearest = ResizeNearest::floor};
  for (DType t : {DType::i64, DType::i32, DType::boolean}) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor x = random_tensor(t, {3, 4, 7}, 40, -1000, 1000);
    EXPECT_TRUE(all_close(h.run(resize, OpKind::resize, a, {x})[0],
                          run_op(OpKind::resize, a, {x})[0], 0, 0));
  }
}

}  // namespace
}  // namespace fusebox::cuda::testing
