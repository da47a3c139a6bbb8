// The short-sequence attention kernel (kernels/attention/short_attention.h), the forward's
// first choice for bf16/f16 problems of Tq, Tk, d, dv <= 64, against the CPU reference (f64):
// lengths 1 to 64 (Tq != Tk too), d and dv 32, 64 and d != dv, every bias broadcast (none,
// [1, H, Tq, Tk], [B, 1, Tq, Tk], [B, H, Tq, Tk], a padding mask [B, 1, 1, Tk]), causal and
// not, with and without lse, and (batch, head) counts that no problems-per-block packing
// divides. Problems past its limits go to cuDNN or the row kernels and stay correct. Outputs
// are poisoned (gpu_vs_cpu.h). Tolerances: the io dtype's rounding of the probabilities
// before the product with v, as in test_ops_attention.cpp.
#include <functional>

#include "backends/cuda/kernels/attention/short_attention.h"
#include "gpu_vs_cpu.h"

namespace fusebox::cuda::testing {
namespace {

using fusebox::testing::all_close;
using fusebox::testing::random_tensor;
using fusebox::testing::run_op;
using fusebox::testing::ScopedEnv;

class ShortAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }
};

AttentionProblem problem(DType t, int64_t tq, int64_t tk, int64_t d, int64_t dv) {
  AttentionProblem p;
  p.dtype = t, p.batch = 2, p.heads = 3, p.tq = tq, p.tk = tk, p.d = d, p.dv = dv;
  return p;
}

// Host only: which problems the kernel takes, so the GPU sweeps below know they test it.
TEST(ShortAttentionTakes, ItsLimits) {
  std::string why;
  for (DType t : {DType::bf16, DType::f16}) {
    EXPECT_TRUE(short_attention_takes(problem(t, 49, 49, 32, 32), why)) << why;  // Swin-T's
    EXPECT_TRUE(short_attention_takes(problem(t, 1, 1, 8, 8), why)) << why;
    EXPECT_TRUE(short_attention_takes(problem(t, 64, 64, 64, 64), why)) << why;
    EXPECT_TRUE(short_attention_takes(problem(t, 5, 40, 16, 48), why)) << why;
  }
  const AttentionProblem refused[] = {
      problem(DType::f32, 49, 49, 32, 32),   problem(DType::bf16, 49, 65, 32, 32),
      problem(DType::bf16, 65, 49, 32, 32),  problem(DType::bf16, 197, 197, 64, 64),
      problem(DType::f16, 49, 49, 128, 128), problem(DType::f16, 49, 49, 32, 72),
      problem(DType::f16, 49, 49, 12, 32),
  };
  for (const AttentionProblem& p : refused) {
    why.clear();
    EXPECT_FALSE(short_attention_takes(p, why)) << p.describe();
    EXPECT_FALSE(why.empty()) << p.describe();
  }
  AttentionProblem backward = problem(DType::bf16, 49, 49, 32, 32);
  backward.backward = true;
  EXPECT_FALSE(short_attention_takes(backward, why));
}

enum class BiasKind { none, heads, batch, full, padding_mask };

const char* bias_name(BiasKind b) {
  switch (b) {
    case BiasKind::none:
      return "no bias";
    case BiasKind::heads:
      return "bias [1, H, Tq, Tk]";
    case BiasKind::batch:
      return "bias [B, 1, Tq, Tk]";
    case BiasKind::full:
      return "bias [B, H, Tq, Tk]";
    case BiasKind::padding_mask:
      return "mask [B, 1, 1, Tk]";
  }
  return "?";
}

// The bias of kind `b` for q [B, H, Tq, *] and Tk keys (undefined for none): the trainable
// kinds in [-2, 2], heads and full in the io dtype, batch in f32; the padding mask f32 with
// finfo.min on the padded keys, batch b keeping Tk - b Tk / 3 keys (at least one).
Tensor make_bias(BiasKind b, DType t, const Shape& q, int64_t tk, uint64_t seed) {
  const int64_t batch = q[0], heads = q[1], tq = q[2];
  switch (b) {
    case BiasKind::none:
      return Tensor();
    case BiasKind::heads:
      return random_tensor(t, {1, heads, tq, tk}, seed, -2, 2);
    case BiasKind::batch:
      return random_tensor(DType::f32, {batch, 1, tq, tk}, seed, -2, 2);
    case BiasKind::full:
      return random_tensor(t, {batch, heads, tq, tk}, seed, -2, 2);
    case BiasKind::padding_mask: {
      Tensor mask = Tensor::empty(DType::f32, {batch, 1, 1, tk});
      for (int64_t e = 0; e < mask.numel(); ++e) {
        const int64_t kept = tk - (e / tk) * (tk / 3);
        mask.set(e, e % tk < kept ? 0.0 : -3.4028234663852886e38);
      }
      return mask;
    }
  }
  return Tensor();
}

// Runs one problem on the GPU and the CPU and compares y (and lse when requested).
void expect_matches_cpu(OpHarness& h, DType t, const Shape& q_shape, int64_t tk, int64_t dv,
                        BiasKind b, bool causal, bool with_lse, uint64_t& seed) {
  Shape k_shape = q_shape, v_shape = q_shape;
  k_shape[2] = v_shape[2] = tk, v_shape[3] = dv;
  std::vector<Tensor> inputs = {random_tensor(t, q_shape, seed++, -1, 1),
                                random_tensor(t, k_shape, seed++, -1, 1),
                                random_tensor(t, v_shape, seed++, -1, 1)};
  if (b != BiasKind::none) inputs.push_back(make_bias(b, t, q_shape, tk, seed++));
  const AttentionAttrs attrs{1.0 / std::sqrt(double(q_shape[3])), causal, with_lse};
  const double tol =
      b == BiasKind::none ? (t == DType::f16 ? 4e-3 : 2e-2) : (t == DType::f16 ? 1e-2 : 5e-2);
  const std::vector<Tensor> want = run_op(OpKind::attention, attrs, inputs);
  const std::vector<Tensor> got = h.run(attention, OpKind::attention, attrs, inputs);
  ASSERT_EQ(got.size(), with_lse ? 2u : 1u);
  EXPECT_TRUE(all_close(got[0], want[0], tol, tol)) << "y";
  if (with_lse) {
    EXPECT_TRUE(all_close(got[1], want[1], 1e-3, 2e-3)) << "lse";
  }
}

// Every length pair x (d, dv) x bias kind x causal (where Tq <= Tk) x dtype, lse on every other
// case; B = 3, H = 3: 9 problems, which no packing of 2 or 4 problems per block divides.
TEST_F(ShortAttentionTest, MatchesCpu) {
  struct Lengths {
    int64_t tq, tk;
  };
  const Lengths lengths[] = {{1, 1}, {7, 7}, {49, 49}, {64, 64}, {5, 40}, {49, 17}, {33, 64}};
  struct Dims {
    int64_t d, dv;
  };
  const Dims dims[] = {{32, 32}, {64, 64}, {16, 48}};
  const BiasKind biases[] = {BiasKind::none, BiasKind::heads, BiasKind::batch, BiasKind::full,
                             BiasKind::padding_mask};
  ScopedEnv env("FUSEBOX_ATTENTION", std::string("auto"));
  OpHarness h;
  uint64_t seed = 7000;
  int case_index = 0;
  for (DType t : {DType::bf16, DType::f16}) {
    for (const Lengths& n : lengths) {
      for (const Dims& dd : dims) {
        std::string why;
        AttentionProblem p = problem(t, n.tq, n.tk, dd.d, dd.dv);
        ASSERT_TRUE(short_attention_takes(p, why)) << why;
        for (BiasKind b : biases) {
          for (bool causal : {false, true}) {
            if (causal && n.tq > n.tk) continue;  // causal needs Tq <= Tk (ir/ops.h)
            const bool with_lse = case_index++ % 2 == 0;
            SCOPED_TRACE(cat(dtype_name(t), " Tq ", n.tq, " Tk ", n.tk, " d ", dd.d, " dv ", dd.dv,
                             " ", bias_name(b), causal ? " causal" : "", with_lse ? " lse" : ""));
            expect_matches_cpu(h, t, {3, 3, n.tq, dd.d}, n.tk, dd.dv, b, causal, with_lse, seed);
          }
        }
      }
    }
  }
}

// Swin-T's stage-1 shape at a small batch (many problems, the shared relative-position bias).
TEST_F(ShortAttentionTest, SwinWindowsMatchCpu) {
  OpHarness h;
  uint64_t seed = 8000;
  for (DType t : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(t));
    expect_matches_cpu(h, t, {64, 3, 49, 32}, 49, 32, BiasKind::heads, false, false, seed);
  }
}

// The forward reports the short-sequence kernel for a problem it takes, and another path for
// problems past its limits (which stay correct); FUSEBOX_ATTENTION=own still forces the row
// kernels. Each problem's shape is unique to this test, as the report comes once per problem.
TEST_F(ShortAttentionTest, ChoiceIsReportedAndLimitsRespected) {
  OpHarness h;
  uint64_t seed = 9000;
  struct Case {
    Shape q;
    int64_t tk;
    DType t;
    bool own, short_kernel;
  };
  const Case cases[] = {
      {{1, 5, 49, 32}, 49, DType::bf16, false, true},
      {{1, 5, 47, 32}, 47, DType::bf16, true, false},   // FUSEBOX_ATTENTION=own
      {{1, 5, 49, 32}, 65, DType::bf16, false, false},  // Tk past 64
      {{1, 5, 65, 32}, 49, DType::f16, false, false},   // Tq past 64
      {{1, 5, 197, 32}, 197, DType::f16, false, false},
      {{1, 5, 49, 128}, 49, DType::bf16, false, false},  // d past 64
      {{1, 5, 49, 32}, 49, DType::f32, false, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(cat(dtype_name(c.t), " q", shape_str(c.q), " Tk ", c.tk, c.own ? " own" : ""));
    ScopedEnv env("FUSEBOX_ATTENTION", std::string(c.own ? "own" : "auto"));
    ::testing::internal::CaptureStderr();
    expect_matches_cpu(h, c.t, c.q, c.tk, c.q[3], BiasKind::heads, false, true, seed);
    const std::string report = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(report.find("fusebox: attention"), std::string::npos) << report;
    EXPECT_EQ(report.find(": the short-sequence kernel\n") != std::string::npos, c.short_kernel)
        << report;
  }
}

}  // namespace
}  // namespace fusebox::cuda::testing
