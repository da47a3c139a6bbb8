// resize and resize_backward on the CPU backend against hand-worked values (PyTorch's
// bilinear and align_corners results, each nearest mode, tf_crop_and_resize's
// extrapolation), a cubic's exactness on a linear ramp, and the backward as the forward's
// adjoint (<resize(x), dy> = <x, resize_backward(dy)>).
#include <numeric>

#include "ops_test_util.h"

namespace fusebox::testing {
namespace {

std::vector<double> resized(const Tensor& x, const ResizeAttrs& a) {
  return run_op(OpKind::resize, a, {x})[0].to_doubles();
}

TEST(CpuResize, BilinearHalfPixelIsPyTorchsAlignCornersFalse) {
  const Tensor x = Tensor::from_vector<float>({1, 1, 2, 2}, {1, 2, 3, 4});
  const ResizeAttrs a{.sizes = {1, 1, 4, 4}, .mode = ResizeMode::linear};
  EXPECT_EQ(resized(x, a), (std::vector<double>{1, 1.25, 1.75, 2, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75,
                                                3.25, 3.5, 3, 3.25, 3.75, 4}));
}

TEST(CpuResize, LinearAlignCorners) {
  const Tensor x = Tensor::from_vector<double>({2}, {1, 2});
  const std::vector<double> y =
      resized(x, ResizeAttrs{.sizes = {4},
                             .mode = ResizeMode::linear,
                             .coordinates = ResizeCoordinates::align_corners});
  const std::vector<double> want{1, 4.0 / 3, 5.0 / 3, 2};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(y[i], want[i], 1e-15) << i;
}

TEST(CpuResize, NearestModesOnIntegers) {
  const Tensor x = Tensor::from_vector<int64_t>({3}, {10, 20, 30});
  auto nearest = [&](const Tensor& t, int64_t size, ResizeNearest r) {
    return resized(
        t,
        ResizeAttrs{.sizes = {size}, .coordinates = ResizeCoordinates::asymmetric, .nearest = r});
  };
  // c = o * 3 / 5 = 0, 0.6, 1.2, 1.8, 2.4
  EXPECT_EQ(nearest(x, 5, ResizeNearest::floor), (std::vector<double>{10, 10, 20, 20, 30}));
  EXPECT_EQ(nearest(x, 5, ResizeNearest::ceil), (std::vector<double>{10, 20, 30, 30, 30}));
  EXPECT_EQ(nearest(x, 5, ResizeNearest::round_prefer_floor),
            (std::vector<double>{10, 20, 20, 30, 30}));
  // c = 0, 0.5, 1, 1.5: the halves go down or up
  const Tensor two = Tensor::from_vector<int64_t>({2}, {10, 20});
  EXPECT_EQ(nearest(two, 4, ResizeNearest::round_prefer_floor),
            (std::vector<double>{10, 10, 20, 20}));
  EXPECT_EQ(nearest(two, 4, ResizeNearest::round_prefer_ceil),
            (std::vector<double>{10, 20, 20, 20}));
}

TEST(CpuResize, CubicReproducesARampInTheInterior) {
  std::vector<double> ramp(10);
  std::iota(ramp.begin(), ramp.end(), 0.0);
  const Tensor x = Tensor::from_vector<double>({10}, ramp);
  for (double a : {-0.75, -0.5}) {
    const std::vector<double> y =
        resized(x, ResizeAttrs{.sizes = {19},
                               .mode = ResizeMode::cubic,
                               .coordinates = ResizeCoordinates::align_corners,
                               .cubic_a = a});
    for (int o = 2; o <= 14; ++o)
      EXPECT_NEAR(y[size_t(o)], o / 2.0, 1e-12) << "a " << a << " o " << o;
    EXPECT_DOUBLE_EQ(y[0], 0);  // integral coordinates read one element
    EXPECT_DOUBLE_EQ(y[18], 9);
  }
}

TEST(CpuResize, TfCropAndResizeExtrapolatesOutsideTheCrop) {
  const Tensor x = Tensor::from_vector<float>({4}, {0, 1, 2, 3});
  // c = 1.5 + o: 1.5, 2.5, then 3.5 and 4.5 past the last element
  const ResizeAttrs a{.sizes = {4},
                      .mode = ResizeMode::linear,
                      .coordinates = ResizeCoordinates::tf_crop_and_resize,
                      .extrapolation_value = -1,
                      .roi_start = {0.5},
                      .roi_end = {1.5}};
  EXPECT_EQ(resized(x, a), (std::vector<double>{1.5, 2.5, -1, -1}));
}

TEST(CpuResize, BackwardIsTheAdjoint) {
  struct Case {
    ResizeAttrs attrs;
    Shape x;
  };
  const std::vector<Case> cases = {
      {{.sizes = {2, 3, 7, 5}, .mode = ResizeMode::linear}, {2, 3, 4, 6}},
      {{.sizes = {1, 2, 9, 4},
        .mode = ResizeMode::cubic,
        .coordinates = ResizeCoordinates::align_corners},
       {1, 2, 5, 7}},
      {{.sizes = {3, 8}, .mode = ResizeMode::cubic, .exclude_outside = true}, {3, 5}},
      {{.sizes = {4, 11}, .coordinates = ResizeCoordinates::pytorch_half_pixel}, {4, 3}},
      {{.sizes = {6, 6},
        .mode = ResizeMode::linear,
        .coordinates = ResizeCoordinates::tf_crop_and_resize,
        .roi_start = {0.2, -0.1},
        .roi_end = {0.9, 1.2}},
       {5, 4}},
  };
  uint64_t seed = 1;
  for (const Case& c : cases) {
    SCOPED_TRACE(shape_str(c.attrs.sizes));
    const Tensor x = random_tensor(DType::f64, c.x, seed++);
    const Tensor dy = random_tensor(DType::f64, c.attrs.sizes, seed++);
    const std::vector<double> y = resized(x, c.attrs);
    const std::vector<double> dx =
        run_op(OpKind::resize_backward, ResizeBackwardAttrs{c.attrs, c.x}, {dy})[0].to_doubles();
    const std::vector<double> xv = x.to_doubles(), dyv = dy.to_doubles();
    double lhs = 0, rhs = 0;
    for (size_t i = 0; i < y.size(); ++i) lhs += y[i] * dyv[i];
    for (size_t i = 0; i < dx.size(); ++i) rhs += xv[i] * dx[i];
    EXPECT_NEAR(lhs, rhs, 1e-12 * std::max(1.0, std::fabs(lhs)));
  }
}

TEST(CpuResize, BadAttributesAreErrorsNamingTheNode) {
  const Tensor ints = Tensor::from_vector<int64_t>({2}, {1, 2});
  EXPECT_THROW(
      run_op(OpKind::resize, ResizeAttrs{.sizes = {4}, .mode = ResizeMode::linear}, {ints}),
      Error);  // linear needs floats
  const Tensor x = random_tensor(DType::f32, {2, 3}, 3);
  EXPECT_THROW(run_op(OpKind::resize, ResizeAttrs{.sizes = {4}}, {x}), Error);  // rank
  EXPECT_THROW(run_op(OpKind::resize, ResizeAttrs{.sizes = {2, 4}, .scales = {1, -2}}, {x}), Error);
  const Tensor deep = random_tensor(DType::f32, Shape(9, 1), 4);
  try {
    run_op(OpKind::resize, ResizeAttrs{.sizes = Shape(9, 2)}, {deep});
    ADD_FAILURE() << "a rank-9 resize ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at most 8"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fusebox::testing
