// CUDA gather / gather_backward, gather_elements (+ backward), cumsum, the comparisons,
// logic ops and where against the CPU backend: every dtype, every axis, broadcasts and strided
// views, an embedding-sized lookup with repeated tokens (the backward's atomics), and an index out
// of range failing the run with the node's message.
#include <cmath>
#include <limits>

#include "gpu_vs_cpu.h"

namespace fusebox::cuda::testing {
namespace {

using fusebox::testing::all_close;
using fusebox::testing::random_tensor;
using fusebox::testing::run_op;

class GatherLogicTest : public ::testing::Test {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }
};

TEST_F(GatherLogicTest, GatherEveryAxisAndDtypeMatchesCpu) {
  OpHarness h;
  uint64_t seed = 1;
  for (DType t : {DType::f64, DType::f32, DType::bf16, DType::i64, DType::i32, DType::boolean}) {
    for (int64_t axis : {0, 1, 2}) {
      for (DType it : {DType::i64, DType::i32}) {
        SCOPED_TRACE(cat(dtype_name(t), " axis ", axis, " indices ", dtype_name(it)));
        const Tensor data = random_tensor(t, {4, 5, 6}, seed++, -9, 9);
        const int64_t extent = data.shape()[size_t(axis)];
        // Negative, repeated, a 2-D index tensor.
        Tensor idx = random_tensor(it, {2, 3}, seed++, double(-extent), double(extent) - 0.01);
        idx.set(0, double(extent - 1));
        idx.set(1, double(extent - 1));
        const GatherAttrs attrs{axis};
        EXPECT_TRUE(all_close(h.run(cuda::gather, OpKind::gather, attrs, {data, idx})[0],
                              run_op(OpKind::gather, attrs, {data, idx})[0], 0, 0));
      }
    }
  }
}

// An embedding: [V, D] rows looked up by [B, T] token ids, many repeated, and its backward
// (atomics into repeated rows; bf16 summed in f32).
TEST_F(GatherLogicTest, EmbeddingLookupAndBackwardMatchCpu) {
  OpHarness h;
  for (DType t : {DType::f32, DType::bf16, DType::f64}) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor table = random_tensor(t, {50, 96}, 11, -1, 1);
    const Tensor ids = random_tensor(DType::i64, {4, 33}, 12, 0, 49.99);  // ~130 ids, 50 rows
    const GatherAttrs attrs{0};
    EXPECT_TRUE(all_close(h.run(cuda::gather, OpKind::gather, attrs, {table, ids})[0],
                          run_op(OpKind::gather, attrs, {table, ids})[0], 0, 0));
    const Tensor dy = random_tensor(t, {4, 33, 96}, 13, -1, 1);
    const GatherBackwardAttrs back{attrs, {50, 96}};
    const Tensor want = run_op(OpKind::gather_backward, back, {dy, ids})[0];
    const Tensor got = h.run(gather_backward, OpKind::gather_backward, back, {dy, ids})[0];
    // The CPU sums in f64 in index order; the GPU in f32 (f64 for f64) in no fixed order.
    const double tol = t == DType::bf16 ? 1e-2 : t == DType::f32 ? 1e-5 : 1e-12;
    EXPECT_TRUE(all_close(got, want, tol, tol));
  }
}

TEST_F(GatherLogicTest, GatherIndexOutOfRangeFailsTheRun) {
  OpHarness h;
  const Tensor data = random_tensor(DType::f32, {5, 3}, 21, -1, 1);
  for (double bad : {5.0, -6.0}) {
    Tensor idx = Tensor::from_vector<int64_t>({2, 2}, {0, 4, -5, 1});
    idx.set(2, bad);
    try {
      h.run(cuda::gather, OpKind::gather, GatherAttrs{0}, {data, idx});
      ADD_FAILURE() << "no error for index " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(cat("index ", int64_t(bad),
                                               " at position [1, 0] of input 1 (indices) is "
                                               "outside [-5, 5)")),
                std::string::npos)
          << e.what();
    }
  }
}

TEST_F(GatherLogicTest, GatherElementsAndBackwardMatchCpu) {
  OpHarness h;
  uint64_t seed = 60;
  for (int64_t axis : {0, 1, 2}) {
    for (DType t : {DType::f32, DType::bf16, DType::i64}) {
      SCOPED_TRACE(cat(dtype_name(t), " axis ", axis));
      const Tensor data = random_tensor(t, {4, 5, 6}, seed++, -9, 9);
      Shape is{3, 5, 4};  // shorter than data along dims 0 and 2, longer along the axis is fine
      is[size_t(axis)] = 7;
      const int64_t extent = data.shape()[size_t(axis)];
      const Tensor idx =
          random_tensor(DType::i64, is, seed++, double(-extent), double(extent) - 0.01);
      const GatherAttrs attrs{axis};
      EXPECT_TRUE(
          all_close(h.run(cuda::gather_elements, OpKind::gather_elements, attrs, {data, idx})[0],
                    run_op(OpKind::gather_elements, attrs, {data, idx})[0], 0, 0));
      if (!is_floating(t)) continue;
      const Tensor dy = random_tensor(t, is, seed++, -1, 1);
      const GatherBackwardAttrs back{attrs, data.shape()};
      const double tol = t == DType::bf16 ? 1e-2 : 1e-5;
      EXPECT_TRUE(all_close(
          h.run(gather_elements_backward, OpKind::gather_elements_backward, back, {dy, idx})[0],
          run_op(OpKind::gather_elements_backward, back, {dy, idx})[0], tol, tol));
    }
  }
}

TEST_F(GatherLogicTest, CumSumEveryModeAndDtypeMatchesCpu) {
  OpHarness h;
  uint64_t seed = 70;
  for (DType t : {DType::f64, DType::f32, DType::f16, DType::bf16, DType::i64, DType::i32}) {
    for (int64_t axis : {0, 1, 2}) {
      for (bool exclusive : {false, true}) {
        for (bool reverse : {false, true}) {
          SCOPED_TRACE(
              cat(dtype_name(t), " axis ", axis, " exclusive ", exclusive, " reverse ", reverse));
          const Tensor x = random_tensor(t, {3, 70, 5}, seed++, -9, 9);
          const CumSumAttrs attrs{axis, exclusive, reverse};
          // Same f64 sums rounded once: the CPU's bits.
          EXPECT_TRUE(all_close(h.run(cumsum, OpKind::cumsum, attrs, {x})[0],
                                run_op(OpKind::cumsum, attrs, {x})[0], 0, 0));
        }
      }
    }
  }
}

TEST_F(GatherLogicTest, ComparisonsEveryDtypeWithBroadcastMatchCpu) {
  OpHarness h;
  uint64_t seed = 30;
  for (OpKind op :
       {OpKind::equal, OpKind::less, OpKind::greater, OpKind::less_equal, OpKind::greater_equal}) {
    for (DType t : {DType::f64, DType::f32, DType::f16, DType::bf16, DType::i64, DType::i32}) {
      SCOPED_TRACE(cat(op_name(op), " ", dtype_name(t)));
      // Small integer ranges so that ties are common; NaNs in the float cases.
      auto integral = [&](Shape s) {  // whole numbers in [-3, 3] of dtype t
        const Tensor i = random_tensor(DType::i32, s, seed++, -3, 3.99);
        return run_op(OpKind::cast, CastAttrs{t}, {i})[0];
      };
      Tensor a = integral({3, 1, 5}), b = integral({4, 5});
      if (!is_integer(t)) {
        a.set(2, std::numeric_limits<double>::quiet_NaN());
        b.set(7, std::numeric_limits<double>::quiet_NaN());
      }
      EXPECT_TRUE(all_close(h.run(logic, op, {}, {a, b})[0], run_op(op, {}, {a, b})[0], 0, 0));
    }
  }
}

TEST_F(GatherLogicTest, LogicOpsAndWhereMatchCpu) {
  OpHarness h;
  const Tensor zero = Tensor::zeros(DType::f32, {});
  auto mask = [&](Shape s, uint64_t seed) {
    return run_op(OpKind::greater, {}, {random_tensor(DType::f32, s, seed, -1, 1), zero})[0];
  };
  const Tensor p = mask({4, 1, 6}, 41), q = mask({5, 6}, 42);
  EXPECT_TRUE(all_close(h.run(logic, OpKind::logical_not, {}, {p})[0],
                        run_op(OpKind::logical_not, {}, {p})[0], 0, 0));
  for (OpKind op : {OpKind::logical_and, OpKind::logical_or, OpKind::logical_xor, OpKind::equal}) {
    SCOPED_TRACE(op_name(op));
    EXPECT_TRUE(all_close(h.run(logic, op, {}, {p, q})[0], run_op(op, {}, {p, q})[0], 0, 0));
  }
  uint64_t seed = 50;
  for (DType t :
       {DType::f64, DType::f32, DType::f16, DType::bf16, DType::i64, DType::i32, DType::boolean}) {
    SCOPED_TRACE(cat("where ", dtype_name(t)));
    // The causal-mask form: a [T, T] condition, [B, H, T, T] scores, a scalar fill.
    const Tensor cond = mask({7, 7}, seed++);
    const Tensor a = random_tensor(t, {2, 3, 7, 7}, seed++, -9, 9);
    const Tensor b = random_tensor(t, {}, seed++, -9, 9);
    EXPECT_TRUE(all_close(h.run(where, OpKind::where, {}, {cond, a, b})[0],
                          run_op(OpKind::where, {}, {cond, a, b})[0], 0, 0));
    // Every operand broadcast.
    const Tensor c2 = mask({3, 1, 1}, seed++);
    const Tensor a2 = random_tensor(t, {1, 4, 1}, seed++, -9, 9);
    const Tensor b2 = random_tensor(t, {5}, seed++, -9, 9);
    EXPECT_TRUE(all_close(h.run(where, OpKind::where, {}, {c2, a2, b2})[0],
                          run_op(OpKind::where, {}, {c2, a2, b2})[0], 0, 0));
  }
}

}  // namespace
}  // namespace fusebox::cuda::testing
