// CUDA sgd_update / adamw_update against the CPU backend over several steps (each side fed
// its own previous outputs), every float dtype, odd sizes, misaligned (scalar-path) operands,
// lr in f32 and f64, step in i64 and i32, and a step < 1 failing the run.
// Tolerances: SGD rounds every product and sum separately on both sides (no FMA), so its
// bits equal the CPU's: tolerance 0. AdamW's bias corrections use the device's f64 pow (a
// few f64 ulps off glibc's), which can move a rounded f32 scalar by an ulp: relative 1e-5
// for f32 over five steps, 1e-12 for f64, tolerance_for(dtype) (an ulp) for f16/bf16.
#include <cmath>

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

}  // namespace
}  // namespace fusebox::cuda::testing
