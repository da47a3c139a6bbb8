// The attention op and its backward on the GPU against the CPU reference (f64): cuDNN's fused
// attention for bf16/f16 and the project's row kernels (FUSEBOX_ATTENTION=own, and f32, which
// cuDNN does not take), causal and not, ViT-B's shape, odd lengths, Tq != Tk, rank 3; the
// training forward's lse; additive biases (padding masks, trainable biases with dbias).
// Outputs are poisoned. Under auto, the bf16/f16 forwards of Tq, Tk, d, dv <= 64 run the
// short-sequence kernel (test_ops_short_attention.cpp tests it in depth).
// Tolerances: cuDNN and the short-sequence kernel round the probabilities to the io dtype before
// the product with v.
#include <functional>

#include "gpu_vs_cpu.h"

namespace fusebox::cuda::testing {
namespace {

using fusebox::testing::all_close;
using fusebox::testing::random_tensor;
using fusebox::testing::run_op;
using fusebox::testing::ScopedEnv;

class AttentionTest : public ::testing::Test {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }
};

// One problem of the sweeps below: the path, the dtype and random q, k, v.
struct Problem {
  DType dtype;
  Tensor q, k, v;
  bool causal;
  double scale() const { return 1.0 / std::sqrt(double(q.shape().back())); }
  // Relative and absolute tolerance of the forward (training uses 2.5 times, f32 ten times).
  double tol() const { return dtype == DType::f32 ? 1e-5 : dtype == DType::f16 ? 4e-3 : 2e-2; }
};

// Calls check(problem) for every case, dtype (bf16, f16, f32) and path (auto: the
// short-sequence kernel, else cuDNN, where they take the problem; own: the row kernels), each under
// a trace naming them.
void for_each_problem(uint64_t seed, const std::function<void(const Problem&)>& check) {
  struct Case {
    Shape q, k, v;
    bool causal;
  };
  const Case cases[] = {
      {{2, 12, 197, 64}, {2, 12, 197, 64}, {2, 12, 197, 64}, false},  // ViT-B/16's
      {{1, 2, 5, 8}, {1, 2, 7, 8}, {1, 2, 7, 16}, false},             // Tq != Tk, dv != d
      {{2, 1, 33, 128}, {2, 1, 33, 128}, {2, 1, 33, 128}, true},      // causal, d 128
      {{2, 3, 40, 64}, {2, 3, 64, 64}, {2, 3, 64, 64}, true},         // causal, Tq < Tk
      {{3, 17, 32}, {3, 17, 32}, {3, 17, 32}, false},                 // rank 3
      {{8, 4, 32, 16}, {8, 4, 32, 16}, {8, 4, 32, 16}, true},         // gpt2_test's, d 16
  };
  for (const char* path : {"auto", "own"}) {
    ScopedEnv env("FUSEBOX_ATTENTION", std::string(path));
    for (DType t : {DType::bf16, DType::f16, DType::f32}) {
      for (const Case& c : cases) {
        SCOPED_TRACE(cat(path, " ", dtype_name(t), " q", shape_str(c.q), " k", shape_str(c.k),
                         c.causal ? " causal" : ""));
        check({t, random_tensor(t, c.q, seed++, -1, 1), random_tensor(t, c.k, seed++, -1, 1),
               random_tensor(t, c.v, seed++, -1, 1), c.causal});
      }
    }
  }
}

TEST_F(AttentionTest, MatchesCpuOnEveryPath) {
  OpHarness h;
  for_each_problem(1, [&](const Problem& p) {
    const AttentionAttrs attrs{p.scale(), p.causal};
    EXPECT_TRUE(all_close(h.run(attention, OpKind::attention, attrs, {p.q, p.k, p.v})[0],
                          run_op(OpKind::attention, attrs, {p.q, p.k, p.v})[0], p.tol(), p.tol()));
  });
}

// Training: the forward with lse, and attention_backward fed the CPU's forward (so both sides
// differentiate the same y and lse).
TEST_F(AttentionTest, TrainingForwardAndBackwardMatchCpu) {
  OpHarness h;
  uint64_t seed = 1000;
  for_each_problem(100, [&](const Problem& p) {
    const AttentionAttrs attrs{p.scale(), p.causal, true};
    const double tol = p.dtype == DType::f32 ? 10 * p.tol() : 2.5 * p.tol();
    const std::vector<Tensor> want = run_op(OpKind::attention, attrs, {p.q, p.k, p.v});
    const std::vector<Tensor> got = h.run(attention, OpKind::attention, attrs, {p.q, p.k, p.v});
    EXPECT_TRUE(all_close(got[0], want[0], tol, tol)) << "y";
    EXPECT_TRUE(all_close(got[1], want[1], 1e-3, 2e-3)) << "lse";
    const Tensor dy = random_tensor(p.dtype, want[0].shape(), seed++, -1, 1);
    const std::vector<Tensor> inputs = {dy, p.q, p.k, p.v, want[0], want[1]};
    const std::vector<Tensor> grads =
        h.run(attention_backward, OpKind::attention_backward, attrs, inputs);
    const std::vector<Tensor> expected = run_op(OpKind::attention_backward, attrs, inputs);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_TRUE(all_close(grads[i], expected[i], tol, tol)) << "d"
                                                              << "qkv"[i];
  });
}

// With an additive bias: a padding mask (f32, finfo.min on the padded keys, [B, 1, 1, Tk]),
// a trainable relative-position bias in the io dtype ([1, H, Tq, Tk], with dbias; also over a
// batch of 200 windows, which cuDNN's backward takes regrouped), a rank-3
// problem's [Tq, Tk] f32 bias with dbias, and causal + a bias; forward with lse and backward,
// each path and dtype, against the CPU fed the same forward.
TEST_F(AttentionTest, BiasMatchesCpuOnEveryPath) {
  struct Case {
    Shape q, k, bias;
    bool causal, bias_grad, mask, io_bias;
  };
  const Case cases[] = {
      {{2, 12, 197, 64}, {2, 12, 197, 64}, {2, 1, 1, 197}, false, false, true, false},
      {{4, 4, 49, 32}, {4, 4, 49, 32}, {1, 4, 49, 49}, false, true, false, true},
      {{3, 17, 32}, {3, 17, 32}, {17, 17}, false, true, false, false},
      {{2, 2, 33, 64}, {2, 2, 33, 64}, {1, 1, 33, 33}, true, false, false, true},
      // Swin's windows: one bias over a batch past 64, whose backward cuDNN takes regrouped
      // ([50, 12 heads]); the bias in the io dtype and in f32.
      {{200, 3, 49, 32}, {200, 3, 49, 32}, {1, 3, 49, 49}, false, true, false, true},
      {{200, 3, 49, 32}, {200, 3, 49, 32}, {1, 3, 49, 49}, false, true, false, false},
  };
  OpHarness h;
  uint64_t seed = 3000;
  for (const char* path : {"auto", "own"}) {
    ScopedEnv env("FUSEBOX_ATTENTION", std::string(path));
    for (DType t : {DType::bf16, DType::f16, DType::f32}) {
      for (const Case& c : cases) {
        SCOPED_TRACE(cat(path, " ", dtype_name(t), " q", shape_str(c.q), " bias", shape_str(c.bias),
                         c.causal ? " causal" : "", c.bias_grad ? " dbias" : ""));
        const Tensor q = random_tensor(t, c.q, seed++, -1, 1),
                     k = random_tensor(t, c.k, seed++, -1, 1),
                     v = random_tensor(t, c.k, seed++, -1, 1);
        Tensor bias = random_tensor(c.io_bias ? t : DType::f32, c.bias, seed++, -2, 2);
        if (c.mask) {  // every batch keeps a different number of keys, at least one
          const int64_t tk = c.bias.back();
          for (int64_t e = 0; e < bias.numel(); ++e)
            bias.set(e, e % tk < tk - 1 - 37 * (e / tk) ? 0.0 : -3.4028234663852886e38);
        }
        const double tol = t == DType::f32 ? 1e-4 : t == DType::f16 ? 1e-2 : 5e-2;
        const AttentionAttrs attrs{1.0 / std::sqrt(double(c.q.back())), c.causal, true};
        const std::vector<Tensor> want = run_op(OpKind::attention, attrs, {q, k, v, bias});
        const std::vector<Tensor> got = h.run(attention, OpKind::attention, attrs, {q, k, v, bias});
        EXPECT_TRUE(all_close(got[0], want[0], tol, tol)) << "y";
        EXPECT_TRUE(all_close(got[1], want[1], 1e-3, 2e-3)) << "lse";
        AttentionAttrs backward = attrs;
        backward.bias_grad = c.bias_grad;
        const Tensor dy = random_tensor(t, want[0].shape(), seed++, -1, 1);
        const std::vector<Tensor> inputs = {dy, q, k, v, want[0], want[1], bias};
        const std::vector<Tensor> grads =
            h.run(attention_backward, OpKind::attention_backward, backward, inputs);
        const std::vector<Tensor> expected = run_op(OpKind::attention_backward, backward, inputs);
        ASSERT_EQ(grads.size(), c.bias_grad ? 4u : 3u);
        for (size_t i = 0; i < grads.size(); ++i)
          EXPECT_TRUE(all_close(grads[i], expected[i], tol, tol))
              << (i < 3 ? std::string(1, "qkv"[i]) : std::string("bias")) << " gradient";
      }
    }
  }
}

TEST_F(AttentionTest, BadSettingIsAnError) {
  OpHarness h;
  ScopedEnv env("FUSEBOX_ATTENTION", std::string("fast"));
  const Tensor x = random_tensor(DType::bf16, {1, 1, 4, 8}, 9);
  try {
    h.run(attention, OpKind::attention, AttentionAttrs{}, {x, x, x});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("FUSEBOX_ATTENTION"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fusebox::cuda::testing
