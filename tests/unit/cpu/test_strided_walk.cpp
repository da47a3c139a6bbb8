// The strided-walk simplification both backends share (backends/common/strided_walk.h:
// the CPU StridedNest and the CUDA layouts), and the shared dtype dispatch's refusal
// naming a kernel called without a node.
#include <gtest/gtest.h>

#include <array>
#include <string>
#include <type_traits>

#include "backends/common/dtype_dispatch.h"
#include "backends/common/strided_walk.h"

namespace fusebox {
namespace {

TEST(StridedWalk, SameShapeContiguousOperandsBecomeOneRun) {
  Shape shape = {2, 3, 4};
  std::array<Shape, 2> strides = {contiguous_strides(shape), contiguous_strides(shape)};
  simplify_strided_walk(shape, strides);
  EXPECT_EQ(shape, (Shape{24}));
  EXPECT_EQ(strides[0], (Shape{1}));
  EXPECT_EQ(strides[1], (Shape{1}));
}

TEST(StridedWalk, ExtentOneDimsAreDroppedAndBroadcastsKeptApart) {
  // y [4, 1, 3, 5] = x [4, 1, 3, 5] + b [1, 1, 3, 1] (b broadcast along dims 0 and 3).
  Shape shape = {4, 1, 3, 5};
  std::array<Shape, 2> strides = {Shape{15, 15, 5, 1}, Shape{0, 0, 1, 0}};
  simplify_strided_walk(shape, strides);
  EXPECT_EQ(shape, (Shape{4, 3, 5}));
  EXPECT_EQ(strides[0], (Shape{15, 5, 1}));
  EXPECT_EQ(strides[1], (Shape{0, 1, 0}));
}

TEST(StridedWalk, OnlyDimsEveryOperandWalksAsOneMerge) {
  // A transpose: the destination merges [2, 3] but the source does not.
  Shape shape = {2, 3, 4};
  std::array<Shape, 2> strides = {Shape{12, 4, 1}, Shape{4, 8, 1}};
  simplify_strided_walk(shape, strides);
  EXPECT_EQ(shape, (Shape{2, 3, 4}));
  EXPECT_EQ(strides[1], (Shape{4, 8, 1}));
  // Every other row of [2, 6, 4]: the outer two dims still merge, the rows do not.
  Shape rows = {2, 3, 4};
  std::array<Shape, 1> row_steps = {Shape{24, 8, 1}};
  simplify_strided_walk(rows, row_steps);
  EXPECT_EQ(rows, (Shape{6, 4}));
  EXPECT_EQ(row_steps[0], (Shape{8, 1}));
  // A walk reversed along both dims is still one run, backwards.
  Shape reversed = {2, 4};
  std::array<Shape, 1> back = {Shape{-4, -1}};
  simplify_strided_walk(reversed, back);
  EXPECT_EQ(reversed, (Shape{8}));
  EXPECT_EQ(back[0], (Shape{-1}));
}

TEST(StridedWalk, ASingleElementKeepsOneDim) {
  Shape shape = {1, 1};
  std::array<Shape, 2> strides = {Shape{1, 1}, Shape{7, 3}};
  simplify_strided_walk(shape, strides);
  EXPECT_EQ(shape, (Shape{1}));
  EXPECT_EQ(strides[0], (Shape{0}));
  EXPECT_EQ(strides[1], (Shape{0}));
  Shape scalar;
  std::array<Shape, 1> none;
  simplify_strided_walk(scalar, none);
  EXPECT_EQ(scalar, (Shape{1}));
  EXPECT_EQ(none[0], (Shape{0}));
}

TEST(DtypeDispatch, VisitFloatNamesAKernelCalledWithoutANode) {
  int calls = 0;
  visit_float(std::string("avg_pool_backward"), DType::bf16, [&](auto tag) {
    EXPECT_TRUE((std::is_same_v<decltype(tag), BFloat16>));
    ++calls;
  });
  EXPECT_EQ(calls, 1);
  try {
    visit_float(std::string("avg_pool_backward"), DType::i64, [](auto) {});
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("avg_pool_backward"), std::string::npos) << message;
    EXPECT_NE(message.find("i64"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace fusebox
