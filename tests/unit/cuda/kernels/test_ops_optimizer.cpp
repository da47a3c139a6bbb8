// CUDA sgd_update / adamw_update against the CPU backend over several steps (each side fed
// its own previous outputs), every float dtype, odd sizes, misaligned (scalar-path) operands,
// lr in f32 and f64, step in i64 and i32, and a step < 1 failing the run; f16 loss
// scaling's grad_scale and skip inputs, nonfinite_any and loss_scale_update.
// Tolerances: SGD rounds every product and sum separately on both sides (no FMA), so its
// bits equal the CPU's: tolerance 0. AdamW's bias corrections use the device's f64 pow (a
// few f64 ulps off glibc's), which can move a rounded f32 scalar by an ulp: relative 1e-5
// for f32 over five steps, 1e-12 for f64, tolerance_for(dtype) (an ulp) for f16/bf16.
#include <cmath>
#include <limits>

#include "gpu_vs_cpu.h"

namespace fusebox::cuda::testing {
namespace {

using fusebox::testing::all_close;
using fusebox::testing::random_tensor;
using fusebox::testing::run_op;

class OptimizerTest : public ::testing::Test {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }
};

const Shape kSizes[] = {{1}, {7}, {4099}, {65539}, {3, 5, 7}};

SgdAttrs sgd(double momentum, double dampening, double weight_decay, bool nesterov) {
  SgdAttrs a;
  a.momentum = momentum;
  a.dampening = dampening;
  a.weight_decay = weight_decay;
  a.nesterov = nesterov;
  return a;
}

TEST_F(OptimizerTest, SgdStepsEqualCpuBits) {
  OpHarness h;
  const SgdAttrs configs[] = {sgd(0, 0, 0, false), sgd(0.9, 0, 0, false),
                              sgd(0.9, 0.1, 1e-2, false), sgd(0.8, 0, 5e-4, true),
                              sgd(0, 0, 1e-1, false)};
  uint64_t seed = 1;
  for (const SgdAttrs& attrs : configs) {
    for (DType t : kFloatTypes) {
      for (const Shape& shape : kSizes) {
        SCOPED_TRACE(cat("momentum ", attrs.momentum, " dampening ", attrs.dampening, " decay ",
                         attrs.weight_decay, attrs.nesterov ? " nesterov " : " ", dtype_name(t),
                         " ", shape_str(shape)));
        Tensor gpu_param = random_tensor(t, shape, seed++, -1, 1);
        Tensor gpu_buf = Tensor::zeros(t, shape);
        Tensor cpu_param = gpu_param, cpu_buf = gpu_buf;
        for (int step = 0; step < 3; ++step) {
          Tensor grad = random_tensor(t, shape, seed++, -1, 1);
          Tensor lr =
              Tensor::from_doubles(step == 2 ? DType::f64 : DType::f32, {}, {0.05 * (step + 1)});
          std::vector<Tensor> got =
              h.run(sgd_update, OpKind::sgd_update, attrs, {gpu_param, grad, gpu_buf, lr});
          std::vector<Tensor> want =
              run_op(OpKind::sgd_update, attrs, {cpu_param, grad, cpu_buf, lr});
          ASSERT_EQ(got.size(), 2u);
          EXPECT_TRUE(all_close(got[0], want[0], 0, 0)) << "param, step " << step;
          EXPECT_TRUE(all_close(got[1], want[1], 0, 0)) << "momentum buffer, step " << step;
          gpu_param = got[0];
          gpu_buf = got[1];
          cpu_param = want[0];
          cpu_buf = want[1];
        }
      }
    }
  }
}

TEST_F(OptimizerTest, AdamWStepsMatchCpu) {
  OpHarness h;
  AdamWAttrs defaults;
  AdamWAttrs strong;
  strong.beta1 = 0.8;
  strong.beta2 = 0.99;
  strong.epsilon = 1e-6;
  strong.weight_decay = 0.1;
  uint64_t seed = 100;
  for (const AdamWAttrs& attrs : {defaults, strong}) {
    for (DType t : kFloatTypes) {
      for (const Shape& shape : kSizes) {
        SCOPED_TRACE(cat("beta1 ", attrs.beta1, " ", dtype_name(t), " ", shape_str(shape)));
        Tensor gpu_param = random_tensor(t, shape, seed++, -1, 1);
        Tensor gpu_m = Tensor::zeros(t, shape), gpu_v = Tensor::zeros(t, shape);
        Tensor cpu_param = gpu_param, cpu_m = gpu_m, cpu_v = gpu_v;
        for (int step = 1; step <= 5; ++step) {
          Tensor grad = random_tensor(t, shape, seed++, -1, 1);
          Tensor lr = Tensor::from_doubles(step == 3 ? DType::f64 : DType::f32, {}, {1e-2 / step});
          Tensor step_t =
              Tensor::from_doubles(step == 4 ? DType::i32 : DType::i64, {}, {double(step)});
          std::vector<Tensor> got = h.run(adamw_update, OpKind::adamw_update, attrs,
                                          {gpu_param, grad, gpu_m, gpu_v, lr, step_t});
          std::vector<Tensor> want =
              run_op(OpKind::adamw_update, attrs, {cpu_param, grad, cpu_m, cpu_v, lr, step_t});
          ASSERT_EQ(got.size(), 3u);
          const Tolerance tol = t == DType::f32   ? Tolerance{1e-5, 1e-7}
                                : t == DType::f64 ? Tolerance{1e-12, 1e-14}
                                                  : tolerance_for(t);
          EXPECT_TRUE(all_close(got[0], want[0], tol.rtol, tol.atol)) << "param, step " << step;
          EXPECT_TRUE(all_close(got[1], want[1], tol.rtol, tol.atol)) << "m, step " << step;
          EXPECT_TRUE(all_close(got[2], want[2], tol.rtol, tol.atol)) << "v, step " << step;
          gpu_param = got[0];
          gpu_m = got[1];
          gpu_v = got[2];
          cpu_param = want[0];
          cpu_m = want[1];
          cpu_v = want[2];
        }
      }
    }
  }
}

// Operands one element past a 16-byte boundary take the scalar path.
TEST_F(OptimizerTest, MisalignedOperandsTakeTheScalarPath) {
  OpHarness h;
  Tensor base_param = random_tensor(DType::f32, {1001}, 1);
  Tensor base_grad = random_tensor(DType::f32, {1001}, 2);
  Tensor buf = random_tensor(DType::f32, {1000}, 3);
  Tensor lr = Tensor::from_doubles(DType::f32, {}, {0.1});
  DeviceTensor param = h.view(base_param, {1000}, {1}, 1);
  DeviceTensor grad = h.view(base_grad, {1000}, {1}, 1);
  DeviceTensor dbuf = h.upload(buf);
  DeviceTensor dlr = h.upload(lr);
  Tensor host_param = gather(base_param, {1000}, {1}, 1);
  Tensor host_grad = gather(base_grad, {1000}, {1}, 1);
  const SgdAttrs attrs = sgd(0.9, 0, 1e-3, true);
  const BuiltNode built = build_node(OpKind::sgd_update, attrs, {host_param, host_grad, buf, lr});
  std::vector<Tensor> got = h.run_device(sgd_update, built, {&param, &grad, &dbuf, &dlr});
  std::vector<Tensor> want = run_op(OpKind::sgd_update, attrs, {host_param, host_grad, buf, lr});
  EXPECT_TRUE(all_close(got[0], want[0], 0, 0));
  EXPECT_TRUE(all_close(got[1], want[1], 0, 0));
}

TEST_F(OptimizerTest, AdamWRejectsStepZero) {
  OpHarness h;
  Tensor p = random_tensor(DType::f32, {10}, 1);
  Tensor zero = Tensor::zeros(DType::f32, {10});
  Tensor lr = Tensor::from_doubles(DType::f32, {}, {1e-3});
  Tensor step = Tensor::from_doubles(DType::i64, {}, {0});
  try {
    h.run(adamw_update, OpKind::adamw_update, AdamWAttrs{}, {p, p, zero, zero, lr, step});
    ADD_FAILURE() << "no error for step 0";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step 0 must be >= 1"), std::string::npos) << e.what();
  }
  // The flags were consumed: step 1 passes.
  Tensor one = Tensor::from_doubles(DType::i64, {}, {1});
  EXPECT_TRUE(all_close(
      h.run(adamw_update, OpKind::adamw_update, AdamWAttrs{}, {p, p, zero, zero, lr, one})[0],
      run_op(OpKind::adamw_update, AdamWAttrs{}, {p, p, zero, zero, lr, one})[0], 1e-5, 1e-7));
}

// ---- f16 loss scaling ------------------------------------------------------------------

// grad_scale and skip (ops.h): SGD's bits equal the CPU's; AdamW's are within its usual
// tolerance; a skipped update writes its state inputs back bit for bit, whatever the
// gradient holds.
TEST_F(OptimizerTest, GradScaleAndSkipMatchCpu) {
  OpHarness h;
  const SgdAttrs sgd_attrs = sgd(0.9, 0, 1e-2, true);
  const AdamWAttrs adamw_attrs;
  const Tensor lr = Tensor::from_doubles(DType::f32, {}, {0.01});
  const Tensor step = Tensor::from_doubles(DType::i64, {}, {3});
  const Tensor nan_skip = Tensor::from_doubles(DType::f32, {}, {std::nan("")});
  uint64_t seed = 500;
  for (DType t : kFloatTypes) {
    for (const Shape& shape : {Shape{7}, Shape{4099}}) {
      const Tensor param = random_tensor(t, shape, seed++), grad = random_tensor(t, shape, seed++);
      const Tensor buf = random_tensor(t, shape, seed++);
      const Tensor v = random_tensor(t, shape, seed++, 0, 1);
      for (double scale : {1.0, 1.0 / 65536, 0.75}) {
        for (const Tensor& skip : {Tensor(), Tensor::from_doubles(DType::f32, {}, {0}),
                                   Tensor::from_doubles(DType::f32, {}, {1}),
                                   Tensor::from_doubles(DType::i64, {}, {2}), nan_skip}) {
          SCOPED_TRACE(cat(dtype_name(t), " ", shape_str(shape), " grad_scale ", scale, " skip ",
                           skip.defined() ? cat(skip.get(0)) : std::string("absent")));
          const Tensor gs = Tensor::from_doubles(DType::f32, {}, {scale});
          const std::vector<Tensor> sgd_in = {param, grad, buf, lr, gs, skip};
          std::vector<Tensor> got = h.run(sgd_update, OpKind::sgd_update, sgd_attrs, sgd_in);
          std::vector<Tensor> want = run_op(OpKind::sgd_update, sgd_attrs, sgd_in);
          EXPECT_TRUE(all_close(got[0], want[0], 0, 0)) << "sgd param";
          EXPECT_TRUE(all_close(got[1], want[1], 0, 0)) << "sgd buffer";
          const std::vector<Tensor> adamw_in = {param, grad, buf, v, lr, step, gs, skip};
          got = h.run(adamw_update, OpKind::adamw_update, adamw_attrs, adamw_in);
          want = run_op(OpKind::adamw_update, adamw_attrs, adamw_in);
          const Tolerance tol = t == DType::f32   ? Tolerance{1e-5, 1e-7}
                                : t == DType::f64 ? Tolerance{1e-12, 1e-14}
                                                  : tolerance_for(t);
          for (size_t k = 0; k < 3; ++k)
            EXPECT_TRUE(all_close(got[k], want[k], tol.rtol, tol.atol)) << "adamw " << k;
          if (skip.defined() && skip.get(0) != 0) {
            EXPECT_TRUE(all_close(got[0], param, 0, 0));
            EXPECT_TRUE(all_close(got[1], buf, 0, 0));
            EXPECT_TRUE(all_close(got[2], v, 0, 0));
          }
        }
      }
    }
  }
}

// Mixed precision's form (ops.h low_param): an f32 param, a bf16 / f16 gradient and the low
// copy written in the same pass, odd sizes (the scalar tail), skipped and not: the CPU's bits for
// SGD, AdamW within its tolerance, the copy the rounding of the new param.
TEST_F(OptimizerTest, LowGradientAndCopyMatchCpu) {
  OpHarness h;
  const Tensor lr = Tensor::from_doubles(DType::f32, {}, {0.01});
  const Tensor step = Tensor::from_doubles(DType::i64, {}, {3});
  const Tensor none;
  uint64_t seed = 700;
  for (DType low : {DType::bf16, DType::f16}) {
    for (const Shape& shape : {Shape{7}, Shape{4099}, Shape{65539}}) {
      for (const Tensor& skip : {none, Tensor::from_doubles(DType::f32, {}, {1})}) {
        SCOPED_TRACE(cat(dtype_name(low), " ", shape_str(shape), skip.defined() ? " skipped" : ""));
        const Tensor param = random_tensor(DType::f32, shape, seed++, -1, 1);
        const Tensor grad = random_tensor(low, shape, seed++, -1, 1);
        const Tensor buf = random_tensor(DType::f32, shape, seed++, -1, 1);
        const Tensor v = random_tensor(DType::f32, shape, seed++, 0, 1);
        const Tensor copy = random_tensor(low, shape, seed++);  // poison: not read
        const Tensor gs = skip.defined() ? Tensor::from_doubles(DType::f32, {}, {1}) : none;
        const std::vector<Tensor> sgd_in = {param, grad, buf, lr, gs, skip, copy};
        std::vector<Tensor> got =
            h.run(sgd_update, OpKind::sgd_update, sgd(0.9, 0, 1e-2, false), sgd_in);
        std::vector<Tensor> want = run_op(OpKind::sgd_update, sgd(0.9, 0, 1e-2, false), sgd_in);
        ASSERT_EQ(got.size(), 3u);
        for (size_t k = 0; k < 3; ++k) EXPECT_TRUE(all_close(got[k], want[k], 0, 0)) << "sgd " << k;
        const std::vector<Tensor> adamw_in = {param, grad, buf, v, lr, step, gs, skip, copy};
        got = h.run(adamw_update, OpKind::adamw_update, AdamWAttrs{}, adamw_in);
        want = run_op(OpKind::adamw_update, AdamWAttrs{}, adamw_in);
        ASSERT_EQ(got.size(), 4u);
        for (size_t k = 0; k < 3; ++k)
          EXPECT_TRUE(all_close(got[k], want[k], 1e-5, 1e-7)) << "adamw " << k;
        EXPECT_TRUE(all_close(got[3], got[0].cast(low), 0, 0)) << "adamw copy";
      }
    }
  }
}

// nonfinite_any over more inputs than one launch takes (kNonfiniteBatch), of every float
// dtype, with channels-last and transposed (copied first) views: the CPU's answer.
TEST_F(OptimizerTest, NonfiniteAnyMatchesCpu) {
  OpHarness h;
  const double inf = std::numeric_limits<double>::infinity();
  for (int where : {-1, 0, 40, 69, 70, 71}) {  // the bad element's input (-1: none)
    for (double bad : {inf, -inf, std::nan("")}) {
      SCOPED_TRACE(cat("bad ", bad, " in input ", where));
      std::vector<Tensor> host;
      std::vector<DeviceTensor> device;
      device.reserve(72);
      for (int i = 0; i < 70; ++i) {
        const DType t = kFloatTypes[size_t(i) % 4];
        Tensor x = random_tensor(t, {int64_t(1 + 37 * i)}, uint64_t(900 + i), -100, 100);
        if (i == where) x.set(int64_t(37 * i) / 2, bad);
        host.push_back(x);
        device.push_back(h.upload(x));
      }
      // [2, 3, 4, 5] channels-last (strides N, 1, W*C, C) and a transposed [5, 7].
      Tensor cl = random_tensor(DType::f16, {120}, 970);
      Tensor tr = random_tensor(DType::f32, {35}, 971);
      if (where == 70) cl.set(77, bad);
      if (where == 71) tr.set(34, bad);
      device.push_back(h.view(cl, {2, 3, 4, 5}, {60, 1, 15, 3}));
      device.push_back(h.view(tr, {5, 7}, {1, 5}));
      EXPECT_TRUE(device[70].is_channels_last() && !device[70].is_contiguous());
      host.push_back(gather(cl, {2, 3, 4, 5}, {60, 1, 15, 3}, 0));
      host.push_back(gather(tr, {5, 7}, {1, 5}, 0));
      std::vector<const DeviceTensor*> pointers;
      for (const DeviceTensor& d : device) pointers.push_back(&d);
      const std::vector<Tensor> got =
          h.run_device(nonfinite_any, build_node(OpKind::nonfinite_any, {}, host), pointers);
      const std::vector<Tensor> want = run_op(OpKind::nonfinite_any, {}, host);
      EXPECT_EQ(want[0].get(0), where >= 0 ? 1.0 : 0.0);
      EXPECT_TRUE(all_close(got[0], want[0], 0, 0));
    }
  }
}

TEST_F(OptimizerTest, LossScaleUpdateMatchesCpu) {
  OpHarness h;
  const LossScaleAttrs custom{.growth_factor = 3, .backoff_factor = 0.25, .growth_interval = 5};
  struct Case {
    double scale;
    int64_t tracker;
    double found;
  };
  const Case cases[] = {{65536, 0, 0},    {65536, 1998, 0},   {65536, 1999, 0},
                        {65536, 1999, 1}, {0x1p127, 1999, 0}, {1, 4, std::nan("")},
                        {1024, 4, 0}};
  for (const Case& c : cases) {
    for (const LossScaleAttrs& a : {LossScaleAttrs{}, custom}) {
      SCOPED_TRACE(cat(c.scale, " ", c.tracker, " ", c.found, " interval ", a.growth_interval));
      const std::vector<Tensor> in = {Tensor::from_doubles(DType::f32, {}, {c.scale}),
                                      Tensor::from_doubles(DType::i64, {}, {double(c.tracker)}),
                                      Tensor::from_doubles(DType::f32, {}, {c.found}),
                                      Tensor::from_doubles(DType::i64, {}, {7})};
      const std::vector<Tensor> got = h.run(loss_scale_update, OpKind::loss_scale_update, a, in);
      const std::vector<Tensor> want = run_op(OpKind::loss_scale_update, a, in);
      ASSERT_EQ(got.size(), 3u);
      for (size_t k = 0; k < 3; ++k) EXPECT_TRUE(all_close(got[k], want[k], 0, 0)) << k;
      // Without the count: two outputs.
      const std::vector<Tensor> two =
          h.run(loss_scale_update, OpKind::loss_scale_update, a, {in[0], in[1], in[2]});
      ASSERT_EQ(two.size(), 2u);
      EXPECT_TRUE(all_close(two[0], want[0], 0, 0));
      EXPECT_TRUE(all_close(two[1], want[1], 0, 0));
    }
  }
}

}  // namespace
}  // namespace fusebox::cuda::testing
