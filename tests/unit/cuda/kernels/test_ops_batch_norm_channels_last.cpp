// CUDA batch_norm and batch_norm_backward on channels-last operands (x, y; dy, x, dx stored
// N, D..., C) against the CPU backend run on the same values in NCHW. A channels-last
// device tensor is the NCHW data uploaded and copy_strided into DeviceTensor::empty(...,
// channels_last) (or into a view one element past a buffer's start, for the unaligned
// scalar fallback); channels-last outputs are poisoned (memset 0xFF: NaN) before each run
// and copied back to contiguous to compare. Shapes: ResNet-like, odd and small C (1, 3, 5,
// 7), C not a multiple of the vector width, C wider than one block tile, rank 3 and 5,
// N = 1, [N, C, 1, 1] and C == 1 (both layouts at once: either path may take them).
//
// Tolerances: as the NCHW tests. Forward (test_ops_norm.cu): elementwise 5e-5 (f32), 4e-3
// (f16), 2e-2 (bf16), 1e-10 (f64), for y and the statistics outputs. Backward
// (test_ops_backward_pool_norm.cpp): dx tolerance_for(dtype) x 4; dscale / dbias an
// absolute tolerance growing with sqrt(count) (per-chunk f32 sums).
//
// Mixed layouts (say x channels-last and y contiguous, or a transposed view that is
// neither) are rejected with an Error naming the node; this file checks that.
//
// A fused relu (BatchNormAttrs::relu; batch_norm_backward reading y) in both layouts, every
// dtype and the mixed form: against the CPU's fused op to the tolerances above, and against
// the unfused kernels (batch_norm then the relu kernel; relu's unary_backward then
// batch_norm_backward) bit for bit. batch_norm_apply: the training forward's y bit for bit.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "backends/cuda/kernels/batch_norm/direct.h"
#include "bit_identical.h"
#include "gpu_vs_cpu.h"

namespace fusebox::cuda::testing {
namespace {

using fusebox::testing::all_close;
using fusebox::testing::bit_identical;
using fusebox::testing::random_tensor;
using fusebox::testing::run_op;
using fusebox::testing::same_values;

class BatchNormChannelsLastTest : public ::testing::Test {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }
};

Tolerance forward_tolerance(DType t) {
  switch (t) {
    case DType::f64:
      return {1e-10, 1e-10};
    case DType::f32:
      return {5e-5, 5e-5};
    case DType::f16:
      return {4e-3, 4e-3};
    default:
      return {2e-2, 2e-2};
  }
}

// A channels-last tensor of `shape` on the device: a fresh one, or (offset > 0) a view
// `offset` elements into a larger buffer, so that its data is not 16-byte aligned.
DeviceTensor empty_channels_last(OpHarness& h, DType dtype, const Shape& shape, int64_t offset) {
  const Shape strides = strides_for(shape, MemoryFormat::channels_last);
  if (offset == 0) {
    DeviceTensor d =
        DeviceTensor::empty(h.ctx().allocator, dtype, shape, MemoryFormat::channels_last);
    EXPECT_EQ(d.strides, strides);
    return d;
  }
  DeviceTensor base = DeviceTensor::empty(h.ctx().allocator, dtype, {numel(shape) + offset});
  return base.view(offset, shape, strides);
}

DeviceTensor upload_channels_last(OpHarness& h, const Tensor& t, int64_t offset = 0) {
  DeviceTensor contiguous = h.upload(t);
  DeviceTensor d = empty_channels_last(h, t.dtype(), t.shape(), offset);
  copy_strided(h.ctx(), contiguous, d);
  return d;
}

DeviceTensor poisoned_channels_last(OpHarness& h, const TensorType& type, int64_t offset = 0) {
  DeviceTensor d = empty_channels_last(h, type.dtype, type.shape, offset);
  h.encoder().memset(d.range(), 0xFF);
  return d;
}

Tensor download_channels_last(OpHarness& h, const DeviceTensor& d) {
  DeviceTensor contiguous = DeviceTensor::empty(h.ctx().allocator, d.dtype, d.shape);
  copy_strided(h.ctx(), d, contiguous);
  h.encoder().synchronize();
  return h.download(contiguous);
}

// Whether a dense tensor of this shape is contiguous and channels-last at once (C == 1 or
// every spatial extent 1), so that the layout cannot be told apart.
bool both_layouts(const Shape& shape) {
  return is_dense_in(shape, strides_for(shape, MemoryFormat::channels_last),
                     MemoryFormat::contiguous);
}

bool listed(const std::vector<size_t>& list, size_t i) {
  return std::find(list.begin(), list.end(), i) != list.end();
}

// Runs `entry` for op on `inputs`, the inputs at `activation_inputs` uploaded
// channels-last (the rest contiguous; undefined ones absent), the outputs at
// `activation_outputs` channels-last and the others contiguous, all poisoned; returns the
// outputs as contiguous host tensors.
std::vector<Tensor> run_channels_last(OpHarness& h, KernelEntry entry, OpKind op, Attrs attrs,
                                      const std::vector<Tensor>& inputs,
                                      const std::vector<size_t>& activation_inputs,
                                      int64_t offset = 0,
                                      const std::vector<size_t>& activation_outputs = {0}) {
  const BuiltNode built = build_node(op, std::move(attrs), inputs);
  std::vector<DeviceTensor> device(inputs.size());
  std::vector<const DeviceTensor*> pointers;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) {
      pointers.push_back(nullptr);
      continue;
    }
    const bool activation = listed(activation_inputs, i);
    device[i] = activation ? upload_channels_last(h, inputs[i], offset) : h.upload(inputs[i]);
    if (activation && !both_layouts(inputs[i].shape())) {
      EXPECT_FALSE(device[i].is_contiguous());
    }
    pointers.push_back(&device[i]);
  }
  std::vector<DeviceTensor> outputs;
  for (size_t o = 0; o < built.outputs.size(); ++o)
    outputs.push_back(listed(activation_outputs, o)
                          ? poisoned_channels_last(h, built.outputs[o], offset)
                          : h.poisoned(built.outputs[o]));
  entry(h.ctx(), built.node, pointers, outputs);
  h.encoder().synchronize();
  check_error_flags(h.ctx());
  std::vector<Tensor> result;
  for (size_t o = 0; o < outputs.size(); ++o)
    result.push_back(listed(activation_outputs, o) ? download_channels_last(h, outputs[o])
                                                   : h.download(outputs[o]));
  return result;
}

// ResNet-like, odd / small C, C = 1, rank 3 and 5, N = 1, [N, C, 1, 1], C past one block
// tile (f32: 520 / 4 = 130 vector units = 5 tiles of 32, the last partial), C a multiple of
// 4 but not of 8 (vectors for f32, scalars for f16 / bf16), many rows (many row chunks).
const Shape kShapes[] = {{8, 256, 14, 14}, {2, 3, 5, 7},     {4, 1, 6, 6},  {3, 7, 10},
                         {2, 5, 3, 4, 6},  {4, 2048, 1, 1},  {1, 64, 9, 9}, {2, 520, 3, 3},
                         {3, 12, 17, 19},  {16, 64, 28, 28}, {2, 40, 9, 9}, {1, 2048, 2, 2}};

std::vector<Tensor> forward_inputs(DType t, const Shape& shape, uint64_t seed) {
  const int64_t channels = shape[1];
  return {random_tensor(t, shape, seed, 1.0, 5.0), random_tensor(t, {channels}, seed + 1, 0.5, 1.5),
          random_tensor(t, {channels}, seed + 2), random_tensor(t, {channels}, seed + 3, 2.0, 4.0),
          random_tensor(t, {channels}, seed + 4, 0.5, 2.0)};
}

void expect_forward_close(const std::vector<Tensor>& got, const std::vector<Tensor>& want,
                          DType t) {
  ASSERT_EQ(got.size(), want.size());
  const Tolerance tol = forward_tolerance(t);
  for (size_t o = 0; o < got.size(); ++o)
    EXPECT_TRUE(all_close(got[o], want[o], tol.rtol, tol.atol)) << "output " << o;
}

TEST_F(BatchNormChannelsLastTest, ForwardMatchesCpu) {
  OpHarness h;
  uint64_t seed = 5000;
  for (DType t : kFloatTypes) {
    for (const Shape& shape : kShapes) {
      for (bool training : {false, true}) {
        SCOPED_TRACE(
            cat(dtype_name(t), " ", shape_str(shape), training ? " training" : " inference"));
        const std::vector<Tensor> inputs = forward_inputs(t, shape, seed);
        seed += 5;
        const BatchNormAttrs attrs{1e-5, 0.9, training};
        const std::vector<Tensor> want = run_op(OpKind::batch_norm, attrs, inputs);
        expect_forward_close(
            run_channels_last(h, &batch_norm, OpKind::batch_norm, attrs, inputs, {0}), want, t);
      }
    }
  }
}

// One element per channel (N = 1, spatial 1: both layouts; variance 0) and data that is
// not 16-byte aligned (the scalar fallback even where C allows vectors).
TEST_F(BatchNormChannelsLastTest, ForwardSingleElementAndUnaligned) {
  OpHarness h;
  uint64_t seed = 6000;
  for (DType t : kFloatTypes) {
    for (const Shape& shape : {Shape{1, 16, 1, 1}, Shape{4, 64, 5, 5}, Shape{2, 8, 3}}) {
      for (int64_t offset : {0, 1}) {
        SCOPED_TRACE(cat(dtype_name(t), " ", shape_str(shape), " offset ", offset));
        const std::vector<Tensor> inputs = forward_inputs(t, shape, seed);
        seed += 5;
        const BatchNormAttrs attrs{1e-5, 0.9, true};
        const std::vector<Tensor> want = run_op(OpKind::batch_norm, attrs, inputs);
        expect_forward_close(
            run_channels_last(h, &batch_norm, OpKind::batch_norm, attrs, inputs, {0}, offset), want,
            t);
      }
    }
  }
}

// A mean a thousand standard deviations from zero (f32 x in [100, 100.1)): the statistics
// pass's Welford updates keep the variance's precision where sums of x and x * x would lose
// it all (100^2 * 2^-24 is the variance's own size). The statistics
// outputs to 1e-4 of the CPU's; y to 1e-3 (the mean's rounding, half an ulp of 100 in f32,
// times k = 1 / std ~ 35).
TEST_F(BatchNormChannelsLastTest, StatisticsOfAFarFromZeroMeanKeepTheirPrecision) {
  OpHarness h;
  const Shape shape{64, 64, 28, 28};
  std::vector<Tensor> inputs = forward_inputs(DType::f32, shape, 6500);
  inputs[0] = random_tensor(DType::f32, shape, 6505, 100.0, 100.1);
  const BatchNormAttrs attrs{1e-9, 0.9, true};
  const std::vector<Tensor> want = run_op(OpKind::batch_norm, attrs, inputs);
  const std::vector<Tensor> got =
      run_channels_last(h, &batch_norm, OpKind::batch_norm, attrs, inputs, {0});
  ASSERT_EQ(got.size(), want.size());
  for (size_t o = 1; o < got.size(); ++o)
    EXPECT_TRUE(all_close(got[o], want[o], 1e-4, 0.0)) << "output " << o;
  EXPECT_TRUE(all_close(got[0], want[0], 0.0, 1e-3)) << "y";
}

// (dy, x, scale, saved_mean, saved_inv_std): the statistics from the CPU's training forward
// (training form) or made-up ones (inference form), as test_ops_backward_pool_norm.cpp.
std::vector<Tensor> backward_inputs(DType t, const Shape& shape, bool training, uint64_t seed) {
  const int64_t channels = shape[1];
  Tensor x = random_tensor(t, shape, seed, -2, 3);
  Tensor scale = random_tensor(t, {channels}, seed + 1, 0.5, 1.5);
  Tensor dy = random_tensor(t, shape, seed + 2, -1, 1);
  if (!training) {
    return {dy, x, scale, random_tensor(t, {channels}, seed + 3, -0.5, 0.5),
            random_tensor(t, {channels}, seed + 4, 0.5, 2)};
  }
  std::vector<Tensor> forward = run_op(OpKind::batch_norm, BatchNormAttrs{1e-5, 0.9, true},
                                       {x, scale, random_tensor(t, {channels}, seed + 5, -1, 1),
                                        random_tensor(t, {channels}, seed + 6, -1, 1),
                                        random_tensor(t, {channels}, seed + 7, 0.5, 2)});
  return {dy, x, scale, forward[3], forward[4]};
}

void expect_backward_close(const Tensor& dx, const Tensor& dscale, const Tensor& dbias,
                           const std::vector<Tensor>& want, const Shape& shape, DType t) {
  const double count = double(numel(shape) / shape[1]);
  const Tolerance tol = tolerance_for(t);
  const double sum_atol =
      t == DType::f64 ? 1e-10 : (t == DType::f32 ? 1e-6 : tol.atol) * 8 * std::sqrt(count);
  EXPECT_TRUE(all_close(dx, want[0], tol.rtol * 4, tol.atol * 4 + (t == DType::f32 ? 1e-6 : 0.0)))
      << "dx";
  EXPECT_TRUE(all_close(dscale, want[1], tol.rtol * 4, sum_atol)) << "dscale";
  EXPECT_TRUE(all_close(dbias, want[2], tol.rtol * 4, sum_atol)) << "dbias";
}

TEST_F(BatchNormChannelsLastTest, BackwardMatchesCpu) {
  OpHarness h;
  uint64_t seed = 7000;
  for (bool training : {true, false}) {
    for (DType t : kFloatTypes) {
      for (const Shape& shape : kShapes) {
        for (int64_t offset : {0, 1}) {
          if (offset == 1 && numel(shape) > 100000) continue;  // the scalar path, smaller shapes
          SCOPED_TRACE(cat(training ? "training " : "inference ", dtype_name(t), " ",
                           shape_str(shape), " offset ", offset));
          const std::vector<Tensor> inputs = backward_inputs(t, shape, training, seed);
          seed += 8;
          BatchNormAttrs attrs;
          attrs.training = training;
          const std::vector<Tensor> want = run_op(OpKind::batch_norm_backward, attrs, inputs);
          const std::vector<Tensor> got = run_channels_last(
              h, &batch_norm_backward, OpKind::batch_norm_backward, attrs, inputs, {0, 1}, offset);
          ASSERT_EQ(got.size(), 3u);
          expect_backward_close(got[0], got[1], got[2], want, shape, t);
        }
      }
    }
  }
}

// The direct call of kernels/batch_norm/direct.h (training form; dscale / dbias in f32 here).
TEST_F(BatchNormChannelsLastTest, DirectBackwardMatchesCpu) {
  OpHarness h;
  uint64_t seed = 8000;
  for (DType t : {DType::f32, DType::bf16}) {
    for (const Shape& shape : {Shape{8, 256, 14, 14}, Shape{2, 3, 5, 7}, Shape{2, 5, 3, 4, 6}}) {
      SCOPED_TRACE(cat(dtype_name(t), " ", shape_str(shape)));
      const std::vector<Tensor> inputs = backward_inputs(t, shape, true, seed);
      seed += 8;
      BatchNormAttrs attrs;
      attrs.training = true;
      const std::vector<Tensor> want = run_op(OpKind::batch_norm_backward, attrs, inputs);
      DeviceTensor dy = upload_channels_last(h, inputs[0]), x = upload_channels_last(h, inputs[1]);
      DeviceTensor scale = h.upload(inputs[2]), mean = h.upload(inputs[3]),
                   inv_std = h.upload(inputs[4]);
      DeviceTensor dx = poisoned_channels_last(h, {t, shape});
      DeviceTensor dscale = h.poisoned({DType::f32, {shape[1]}}),
                   dbias = h.poisoned({DType::f32, {shape[1]}});
      batch_norm_backward(h.ctx(), x, dy, scale, mean, inv_std, &dx, &dscale, &dbias);
      // The CPU's dscale / dbias are in x's dtype: compare the f32 ones rounded the same way.
      const Tensor got_dscale = h.download(dscale).cast(t), got_dbias = h.download(dbias).cast(t);
      expect_backward_close(download_channels_last(h, dx), got_dscale, got_dbias, want, shape, t);
    }
  }
}

// Mixed precision (f16 / bf16 activations, f32 scale, bias and statistics; f32 dscale /
// dbias), both layouts, forward (inference and training) and backward (both forms), against
// the CPU on the same mixed inputs. Shapes: vector units (C a multiple of 8) and scalars, one
// channels-last shape with an unaligned offset. Tolerances: y and dx as the single-dtype
// tests of x's dtype; the f32 per-channel outputs: the forward's as f32 (5e-5; they are
// statistics of the same values), dscale / dbias as x's dtype's sums (f32 partial sums).
TEST_F(BatchNormChannelsLastTest, MixedPrecisionMatchesCpu) {
  OpHarness h;
  uint64_t seed = 8500;
  auto widen = [](std::vector<Tensor> in, std::initializer_list<size_t> params) {
    for (size_t i : params) in[i] = in[i].cast(DType::f32);
    return in;
  };
  for (DType t : {DType::bf16, DType::f16}) {
    for (const Shape& shape : {Shape{8, 64, 14, 14}, Shape{2, 5, 3, 4}, Shape{3, 12, 17, 19}}) {
      for (bool channels_last : {false, true}) {
        const int64_t offset = channels_last && shape[1] == 12 ? 1 : 0;
        for (bool training : {false, true}) {
          SCOPED_TRACE(cat(dtype_name(t), " ", shape_str(shape), channels_last ? " NHWC" : " NCHW",
                           training ? " training" : " inference"));
          const std::vector<Tensor> inputs =
              widen(forward_inputs(t, shape, seed += 5), {1, 2, 3, 4});
          const BatchNormAttrs attrs{1e-5, 0.9, training};
          const std::vector<Tensor> want = run_op(OpKind::batch_norm, attrs, inputs);
          const std::vector<Tensor> got =
              channels_last ? run_channels_last(h, &batch_norm, OpKind::batch_norm, attrs, inputs,
                                                {0}, offset)
                            : h.run(&batch_norm, OpKind::batch_norm, attrs, inputs);
          ASSERT_EQ(got.size(), want.size());
          const Tolerance y_tol = forward_tolerance(t), stat_tol = forward_tolerance(DType::f32);
          EXPECT_TRUE(all_close(got[0], want[0], y_tol.rtol, y_tol.atol)) << "y";
          for (size_t o = 1; o < got.size(); ++o)
            EXPECT_TRUE(all_close(got[o], want[o], stat_tol.rtol, stat_tol.atol)) << "output " << o;

          const std::vector<Tensor> back =
              widen(backward_inputs(t, shape, training, seed += 8), {2, 3, 4});
          BatchNormAttrs back_attrs;
          back_attrs.training = training;
          const std::vector<Tensor> back_want =
              run_op(OpKind::batch_norm_backward, back_attrs, back);
          const std::vector<Tensor> back_got =
              channels_last
                  ? run_channels_last(h, &batch_norm_backward, OpKind::batch_norm_backward,
                                      back_attrs, back, {0, 1}, offset)
                  : h.run(&batch_norm_backward, OpKind::batch_norm_backward, back_attrs, back);
          ASSERT_EQ(back_got.size(), 3u);
          EXPECT_EQ(back_got[1].dtype(), DType::f32);
          expect_backward_close(back_got[0], back_got[1], back_got[2], back_want, shape, t);
        }
      }
    }
  }
}

// ---- fused relu (BatchNormAttrs::relu) ---------------------------------------------------

// A batch_norm or batch_norm_backward node in one layout: channels-last (activations at
// `activation_inputs`, output 0) or contiguous.
std::vector<Tensor> run_in_layout(OpHarness& h, bool channels_last, KernelEntry entry, OpKind op,
                                  Attrs attrs, const std::vector<Tensor>& inputs,
                                  const std::vector<size_t>& activation_inputs, int64_t offset,
                                  const std::vector<size_t>& activation_outputs = {0}) {
  return channels_last ? run_channels_last(h, entry, op, std::move(attrs), inputs,
                                           activation_inputs, offset, activation_outputs)
                       : h.run(entry, op, std::move(attrs), inputs);
}

// The unfused pair on the GPU, in the same layout: batch_norm, then the relu kernel on y.
std::vector<Tensor> unfused_forward(OpHarness& h, bool channels_last, BatchNormAttrs attrs,
                                    const std::vector<Tensor>& inputs, int64_t offset) {
  attrs.relu = false;
  std::vector<Tensor> out =
      run_in_layout(h, channels_last, &batch_norm, OpKind::batch_norm, attrs, inputs, {0}, offset);
  out[0] = h.run(&unary, OpKind::relu, {}, {out[0]}).at(0);
  return out;
}

// relu's unary_backward kernel on dy, then batch_norm_backward, in the same layout.
// inputs: (dy, x, scale, saved_mean, saved_inv_std, y).
std::vector<Tensor> unfused_backward(OpHarness& h, bool channels_last, BatchNormAttrs attrs,
                                     std::vector<Tensor> inputs, int64_t offset) {
  attrs.relu = false;
  const Tensor y = inputs.back();
  inputs.pop_back();
  inputs[0] = h.run(&unary_backward, OpKind::unary_backward, UnaryBackwardAttrs{.op = OpKind::relu},
                    {inputs[0], y})
                  .at(0);
  return run_in_layout(h, channels_last, &batch_norm_backward, OpKind::batch_norm_backward, attrs,
                       inputs, {0, 1}, offset);
}

// batch_norm_backward's inputs for a fused relu: dy, the forward's x and scale, its saved
// statistics (outputs 3 and 4 of `fwd`) and y.
std::vector<Tensor> fused_relu_backward_inputs(const Tensor& dy, const std::vector<Tensor>& inputs,
                                               const std::vector<Tensor>& fwd, const Tensor& y) {
  return {dy, inputs[0], inputs[1], fwd[3], fwd[4], y};
}

// Fused forward and backward, both layouts (channels-last also unaligned), both forms, every
// dtype and the mixed-precision form: against the CPU's fused op to the unfused tests'
// tolerances, and against the unfused GPU kernels bit for bit (the max and the mask are
// exact, the rest is the same arithmetic). The backward's y is the CPU's fused forward
// output, so the mask cuts about half of dy.
TEST_F(BatchNormChannelsLastTest, FusedReluMatchesCpuAndUnfusedKernels) {
  OpHarness h;
  uint64_t seed = 9200;
  struct DTypes {
    DType x, param;
  };
  const std::vector<DTypes> dtypes = {{DType::f32, DType::f32},   {DType::f16, DType::f16},
                                      {DType::bf16, DType::bf16}, {DType::f64, DType::f64},
                                      {DType::f16, DType::f32},   {DType::bf16, DType::f32}};
  for (const DTypes& d : dtypes) {
    for (const Shape& shape :
         {Shape{8, 64, 14, 14}, Shape{4, 32, 8, 8}, Shape{2, 5, 3, 4}, Shape{3, 12, 17, 19}}) {
      for (bool channels_last : {false, true}) {
        const int64_t offset = channels_last && shape[1] == 12 ? 1 : 0;
        for (bool training : {false, true}) {
          SCOPED_TRACE(cat(dtype_name(d.x), " x ", dtype_name(d.param), " params ",
                           shape_str(shape), channels_last ? " NHWC" : " NCHW",
                           training ? " training" : " inference"));
          std::vector<Tensor> inputs = forward_inputs(d.x, shape, seed += 5);
          for (size_t i = 1; i < 5; ++i) inputs[i] = inputs[i].cast(d.param);
          const BatchNormAttrs attrs{1e-5, 0.9, training, true};
          const std::vector<Tensor> want = run_op(OpKind::batch_norm, attrs, inputs);
          const std::vector<Tensor> got = run_in_layout(
              h, channels_last, &batch_norm, OpKind::batch_norm, attrs, inputs, {0}, offset);
          ASSERT_EQ(got.size(), want.size());
          const Tolerance y_tol = forward_tolerance(d.x), stat_tol = forward_tolerance(d.param);
          EXPECT_TRUE(all_close(got[0], want[0], y_tol.rtol, y_tol.atol)) << "y";
          for (size_t o = 1; o < got.size(); ++o)
            EXPECT_TRUE(all_close(got[o], want[o], stat_tol.rtol, stat_tol.atol)) << o;
          const std::vector<Tensor> unfused =
              unfused_forward(h, channels_last, attrs, inputs, offset);
          for (size_t o = 0; o < got.size(); ++o)
            EXPECT_TRUE(bit_identical(got[o], unfused[o])) << "fused vs unfused GPU, output " << o;

          // Backward: (dy, x, scale, saved statistics, y) from the CPU's training forward.
          const BatchNormAttrs train_attrs{1e-5, 0.9, true, true};
          const std::vector<Tensor> fwd = run_op(OpKind::batch_norm, train_attrs, inputs);
          const std::vector<Tensor> back = fused_relu_backward_inputs(
              random_tensor(d.x, shape, seed + 1, -1, 1), inputs, fwd, fwd[0]);
          BatchNormAttrs back_attrs;
          back_attrs.training = training;
          back_attrs.relu = true;
          const std::vector<Tensor> back_want =
              run_op(OpKind::batch_norm_backward, back_attrs, back);
          const std::vector<Tensor> back_got =
              run_in_layout(h, channels_last, &batch_norm_backward, OpKind::batch_norm_backward,
                            back_attrs, back, {0, 1, 5}, offset);
          ASSERT_EQ(back_got.size(), 3u);
          expect_backward_close(back_got[0], back_got[1], back_got[2], back_want, shape, d.x);
          const std::vector<Tensor> back_unfused =
              unfused_backward(h, channels_last, back_attrs, back, offset);
          for (size_t o = 0; o < 3; ++o)
            EXPECT_TRUE(bit_identical(back_got[o], back_unfused[o]))
                << "fused vs unfused GPU, backward output " << o;
        }
      }
    }
  }
}

// A fused residual (input 5), with and without the relu, both layouts (channels-last also
// unaligned), both forms, every dtype and the mixed-precision form: against the CPU's fused
// op (which is bit for bit batch_norm, add, relu: tests/unit/cpu/test_batch_norm_relu.cpp).
TEST_F(BatchNormChannelsLastTest, FusedResidualMatchesCpu) {
  OpHarness h;
  uint64_t seed = 9700;
  const std::vector<std::pair<DType, DType>> dtypes = {
      {DType::f32, DType::f32}, {DType::f16, DType::f16}, {DType::bf16, DType::bf16},
      {DType::f64, DType::f64}, {DType::f16, DType::f32}, {DType::bf16, DType::f32}};
  for (const auto& [xt, pt] : dtypes) {
    for (const Shape& shape : {Shape{8, 64, 14, 14}, Shape{2, 5, 3, 4}, Shape{3, 12, 17, 19}}) {
      for (bool channels_last : {false, true}) {
        const int64_t offset = channels_last && shape[1] == 12 ? 1 : 0;
        for (bool training : {false, true}) {
          for (bool relu : {false, true}) {
            SCOPED_TRACE(cat(dtype_name(xt), " x ", dtype_name(pt), " params ", shape_str(shape),
                             channels_last ? " NHWC" : " NCHW",
                             training ? " training" : " inference", relu ? " relu" : ""));
            std::vector<Tensor> inputs = forward_inputs(xt, shape, seed += 5);
            for (size_t i = 1; i < 5; ++i) inputs[i] = inputs[i].cast(pt);
            inputs.push_back(random_tensor(xt, shape, seed + 2, -2, 2));
            const BatchNormAttrs attrs{1e-5, 0.9, training, relu};
            const std::vector<Tensor> want = run_op(OpKind::batch_norm, attrs, inputs);
            const std::vector<Tensor> got = run_in_layout(
                h, channels_last, &batch_norm, OpKind::batch_norm, attrs, inputs, {0, 5}, offset);
            ASSERT_EQ(got.size(), want.size());
            const Tolerance y_tol = forward_tolerance(xt), stat_tol = forward_tolerance(pt);
            EXPECT_TRUE(all_close(got[0], want[0], y_tol.rtol, y_tol.atol)) << "y";
            for (size_t o = 1; o < got.size(); ++o)
              EXPECT_TRUE(all_close(got[o], want[o], stat_tol.rtol, stat_tol.atol)) << o;
          }
        }
      }
    }
  }
}

// dy in two terms (input 7, dy_addend) and the dy used written out (dy_output: output 3, what
// a fused residual's input gets), without a relu, with one masking by y, and with one whose
// mask is recomputed from x (the forward's bias given), both layouts (channels-last also
// unaligned), both forms, every dtype and the mixed-precision form: against the unfused GPU
// kernels (the add kernel, relu's unary_backward, then batch_norm_backward on the one dy) bit
// for bit, dy_used included, and against the CPU's node to the backward's tolerances.
TEST_F(BatchNormChannelsLastTest, TwoTermsAndUsedDyMatchTheUnfusedKernels) {
  OpHarness h;
  uint64_t seed = 9900;
  const std::vector<std::pair<DType, DType>> dtypes = {
      {DType::f32, DType::f32}, {DType::f16, DType::f16}, {DType::bf16, DType::bf16},
      {DType::f64, DType::f64}, {DType::f16, DType::f32}, {DType::bf16, DType::f32}};
  enum class Mask { none, y, x };
  for (const auto& [xt, pt] : dtypes) {
    for (const Shape& shape : {Shape{8, 64, 14, 14}, Shape{2, 5, 3, 4}, Shape{3, 12, 17, 19}}) {
      for (bool channels_last : {false, true}) {
        const int64_t offset = channels_last && shape[1] == 12 ? 1 : 0;
        for (bool training : {false, true}) {
          for (Mask mask : {Mask::none, Mask::y, Mask::x}) {
            for (bool used : {false, true}) {
              SCOPED_TRACE(cat(dtype_name(xt), " x ", dtype_name(pt), " params ", shape_str(shape),
                               channels_last ? " NHWC" : " NCHW",
                               training ? " training" : " inference", " mask ", int(mask),
                               used ? " dy_output" : ""));
              std::vector<Tensor> inputs = forward_inputs(xt, shape, seed += 5);
              for (size_t i = 1; i < 5; ++i) inputs[i] = inputs[i].cast(pt);
              // The GPU's own forward: a mask recomputed from x is the y it stored.
              const std::vector<Tensor> fwd = run_in_layout(
                  h, channels_last, &batch_norm, OpKind::batch_norm,
                  BatchNormAttrs{1e-5, 0.9, true, mask != Mask::none}, inputs, {0}, offset);
              const Tensor dy = random_tensor(xt, shape, seed + 1, -1, 1);
              const Tensor addend = random_tensor(xt, shape, seed + 2, -1, 1);
              BatchNormAttrs attrs;
              attrs.training = training;
              attrs.relu = mask != Mask::none;
              attrs.dy_output = used;
              std::vector<Tensor> back = {dy,     inputs[0], inputs[1], fwd[3],
                                          fwd[4], Tensor{},  Tensor{},  addend};
              if (mask != Mask::none) back[5] = fwd[0];
              if (mask == Mask::x) back[6] = inputs[2];
              const std::vector<Tensor> want = run_op(OpKind::batch_norm_backward, attrs, back);
              const std::vector<size_t> activation_outputs =
                  used ? std::vector<size_t>{0, 3} : std::vector<size_t>{0};
              const std::vector<Tensor> got =
                  run_in_layout(h, channels_last, &batch_norm_backward, OpKind::batch_norm_backward,
                                attrs, back, {0, 1, 5, 7}, offset, activation_outputs);
              ASSERT_EQ(got.size(), used ? 4u : 3u);
              expect_backward_close(got[0], got[1], got[2], want, shape, xt);
              // Unfused on the GPU: the add kernel, the mask, the backward of one dy.
              Tensor sum = h.run(&binary, OpKind::add, {}, {dy, addend}).at(0);
              if (mask != Mask::none)
                sum = h.run(&unary_backward, OpKind::unary_backward,
                            UnaryBackwardAttrs{.op = OpKind::relu}, {sum, fwd[0]})
                          .at(0);
              BatchNormAttrs plain;
              plain.training = training;
              const std::vector<Tensor> unfused =
                  run_in_layout(h, channels_last, &batch_norm_backward, OpKind::batch_norm_backward,
                                plain, {sum, inputs[0], inputs[1], fwd[3], fwd[4]}, {0, 1}, offset);
              for (size_t o = 0; o < 3; ++o)
                EXPECT_TRUE(bit_identical(got[o], unfused[o])) << "vs unfused GPU, output " << o;
              if (used) {
                EXPECT_TRUE(bit_identical(got[3], sum)) << "dy_used vs the unfused dy";
                EXPECT_TRUE(bit_identical(want[3], sum)) << "the CPU's dy_used";
              }
            }
          }
        }
      }
    }
  }
}

// The forward's bias given to the backward (input 6): the relu mask recomputed from x, where
// the saved statistics are in the compute type (f32 / f64, and f32 statistics of f16 / bf16
// x), is the mask the GPU's own forward stored, so the outputs are those of the backward that
// reads y, bit for bit; bf16 statistics of bf16 x read y as before (the same bits trivially).
TEST_F(BatchNormChannelsLastTest, FusedReluMaskFromXIsTheForwardsMask) {
  OpHarness h;
  uint64_t seed = 9600;
  struct DTypes {
    DType x, param;
  };
  const std::vector<DTypes> dtypes = {{DType::f32, DType::f32},
                                      {DType::f64, DType::f64},
                                      {DType::f16, DType::f32},
                                      {DType::bf16, DType::f32},
                                      {DType::bf16, DType::bf16}};
  for (const DTypes& d : dtypes) {
    for (const Shape& shape : {Shape{8, 64, 14, 14}, Shape{2, 5, 3, 4}, Shape{3, 12, 17, 19}}) {
      for (bool channels_last : {false, true}) {
        const int64_t offset = channels_last && shape[1] == 12 ? 1 : 0;
        SCOPED_TRACE(cat(dtype_name(d.x), " x ", dtype_name(d.param), " params ", shape_str(shape),
                         channels_last ? " NHWC" : " NCHW"));
        std::vector<Tensor> inputs = forward_inputs(d.x, shape, seed += 5);
        for (size_t i = 1; i < 5; ++i) inputs[i] = inputs[i].cast(d.param);
        const BatchNormAttrs attrs{1e-5, 0.9, true, true};
        const std::vector<Tensor> fwd = run_in_layout(
            h, channels_last, &batch_norm, OpKind::batch_norm, attrs, inputs, {0}, offset);
        std::vector<Tensor> back = fused_relu_backward_inputs(
            random_tensor(d.x, shape, seed + 1, -1, 1), inputs, fwd, fwd[0]);
        BatchNormAttrs back_attrs;
        back_attrs.training = true;
        back_attrs.relu = true;
        const std::vector<Tensor> from_y =
            run_in_layout(h, channels_last, &batch_norm_backward, OpKind::batch_norm_backward,
                          back_attrs, back, {0, 1, 5}, offset);
        back.push_back(inputs[2]);
        const std::vector<Tensor> from_x =
            run_in_layout(h, channels_last, &batch_norm_backward, OpKind::batch_norm_backward,
                          back_attrs, back, {0, 1, 5}, offset);
        ASSERT_EQ(from_x.size(), 3u);
        for (size_t o = 0; o < 3; ++o)
          EXPECT_TRUE(bit_identical(from_x[o], from_y[o])) << "backward output " << o;
        // The mask did cut: dx differs from the unmasked backward's.
        BatchNormAttrs plain = back_attrs;
        plain.relu = false;
        back.resize(5);
        const std::vector<Tensor> unmasked =
            run_in_layout(h, channels_last, &batch_norm_backward, OpKind::batch_norm_backward,
                          plain, back, {0, 1}, offset);
        EXPECT_FALSE(bit_identical(from_x[0], unmasked[0]));
      }
    }
  }
}

// batch_norm_apply (the training forward's y from its saved statistics, for the backward:
// passes/rematerialize.h) in both layouts: the forward's y bit for bit where the statistics
// are in the compute type, with and without relu; against the CPU's apply to the forward's
// tolerance; and the statistics are read (another mean, another y).
TEST_F(BatchNormChannelsLastTest, ApplyFromSavedStatisticsIsTheForwardsY) {
  OpHarness h;
  uint64_t seed = 9800;
  struct DTypes {
    DType x, param;
  };
  for (const DTypes& d : {DTypes{DType::f32, DType::f32}, DTypes{DType::f64, DType::f64},
                          DTypes{DType::f16, DType::f32}, DTypes{DType::bf16, DType::f32}}) {
    for (const Shape& shape : {Shape{8, 64, 14, 14}, Shape{2, 5, 3, 4}, Shape{3, 12, 17, 19}}) {
      for (bool channels_last : {false, true}) {
        for (bool relu : {false, true}) {
          const int64_t offset = channels_last && shape[1] == 12 ? 1 : 0;
          SCOPED_TRACE(cat(dtype_name(d.x), " x ", dtype_name(d.param), " params ",
                           shape_str(shape), channels_last ? " NHWC" : " NCHW",
                           relu ? " relu" : ""));
          std::vector<Tensor> inputs = forward_inputs(d.x, shape, seed += 5);
          for (size_t i = 1; i < 5; ++i) inputs[i] = inputs[i].cast(d.param);
          const BatchNormAttrs attrs{1e-5, 0.9, true, relu};
          const std::vector<Tensor> fwd = run_in_layout(
              h, channels_last, &batch_norm, OpKind::batch_norm, attrs, inputs, {0}, offset);
          BatchNormAttrs apply;
          apply.relu = relu;
          std::vector<Tensor> saved = {inputs[0], inputs[1], inputs[2], fwd[3], fwd[4]};
          const std::vector<Tensor> got =
              run_in_layout(h, channels_last, &batch_norm_apply, OpKind::batch_norm_apply, apply,
                            saved, {0}, offset);
          ASSERT_EQ(got.size(), 1u);
          EXPECT_TRUE(bit_identical(got[0], fwd[0]));
          const Tensor cpu = run_op(OpKind::batch_norm_apply, apply, saved).at(0);
          const Tolerance tol = forward_tolerance(d.x);
          EXPECT_TRUE(all_close(got[0], cpu, tol.rtol, tol.atol));
          std::vector<double> mean = fwd[3].to_doubles();
          mean[1] += 0.5;
          saved[3] = Tensor::from_doubles(d.param, {shape[1]}, mean);
          const std::vector<Tensor> moved =
              run_in_layout(h, channels_last, &batch_norm_apply, OpKind::batch_norm_apply, apply,
                            saved, {0}, offset);
          EXPECT_FALSE(bit_identical(moved[0], fwd[0]));
        }
      }
    }
  }
}

// The edges, fused against unfused on the GPU bit for bit: y exactly -0 (x == running
// mean, negative scale, bias -0: relu keeps -0), y rounding to -0 in f16, NaN x, and
// infinite and NaN dy (where y <= 0, dy * 0 is NaN in both).
TEST_F(BatchNormChannelsLastTest, FusedReluEdgesBitForBit) {
  OpHarness h;
  const Shape shape = {4, 8, 3, 5};
  for (DType t : kFloatTypes) {
    for (bool channels_last : {false, true}) {
      for (bool training : {false, true}) {
        SCOPED_TRACE(cat(dtype_name(t), channels_last ? " NHWC" : " NCHW",
                         training ? " training" : " inference"));
        std::vector<double> x = random_tensor(DType::f64, shape, 9300, -2, 3).to_doubles();
        const int64_t inner = 15, channels = 8;
        for (int64_t n = 0; n < 4; ++n)
          for (int64_t c = 0; c < 3; ++c)
            for (int64_t i = 0; i < 3; ++i) x[size_t((n * channels + c) * inner + i)] = 0.5;
        x[size_t((2 * channels + 7) * inner + 4)] = std::numeric_limits<double>::quiet_NaN();
        std::vector<double> scale(8, 0.75), bias(8, 0.125), mean(8, 0.5), var(8, 1.5);
        scale[0] = -1.25;
        bias[0] = -0.0;
        bias[1] = 0.0;
        bias[2] = -1e-10;
        const std::vector<Tensor> inputs = {
            Tensor::from_doubles(t, shape, x), Tensor::from_doubles(t, {8}, scale),
            Tensor::from_doubles(t, {8}, bias), Tensor::from_doubles(t, {8}, mean),
            Tensor::from_doubles(t, {8}, var)};
        const BatchNormAttrs attrs{1e-5, 0.9, training, true};
        const std::vector<Tensor> got =
            run_in_layout(h, channels_last, &batch_norm, OpKind::batch_norm, attrs, inputs, {0}, 0);
        const std::vector<Tensor> unfused = unfused_forward(h, channels_last, attrs, inputs, 0);
        for (size_t o = 0; o < got.size(); ++o) EXPECT_TRUE(bit_identical(got[o], unfused[o])) << o;
        if (!training) {
          const double y = got[0].get(0);
          EXPECT_TRUE(y == 0 && std::signbit(y)) << "x == mean in channel 0 gives -0: " << y;
        }
        std::vector<double> dy = random_tensor(DType::f64, shape, 9301).to_doubles();
        for (int64_t c = 0; c < channels; ++c) {
          dy[size_t(c * inner)] = std::numeric_limits<double>::infinity();
          dy[size_t((channels + c) * inner + 1)] = -std::numeric_limits<double>::infinity();
          dy[size_t((3 * channels + c) * inner + 2)] = std::numeric_limits<double>::quiet_NaN();
        }
        const std::vector<Tensor> fwd =
            run_op(OpKind::batch_norm, BatchNormAttrs{1e-5, 0.9, true, true}, inputs);
        const std::vector<Tensor> back =
            fused_relu_backward_inputs(Tensor::from_doubles(t, shape, dy), inputs, fwd, got[0]);
        BatchNormAttrs back_attrs;
        back_attrs.training = training;
        back_attrs.relu = true;
        const std::vector<Tensor> back_got =
            run_in_layout(h, channels_last, &batch_norm_backward, OpKind::batch_norm_backward,
                          back_attrs, back, {0, 1, 5}, 0);
        const std::vector<Tensor> back_unfused =
            unfused_backward(h, channels_last, back_attrs, back, 0);
        // (NaNs from the infinite dy: any NaN, bit_identical.h same_values.)
        for (size_t o = 0; o < 3; ++o)
          EXPECT_TRUE(same_values(back_got[o], back_unfused[o])) << "backward output " << o;
      }
    }
  }
}

// Same inputs, same bits: fixed chunks and merge trees, no atomics.
TEST_F(BatchNormChannelsLastTest, Deterministic) {
  OpHarness h;
  const Shape shape = {16, 64, 28, 28};
  const std::vector<Tensor> inputs = forward_inputs(DType::bf16, shape, 9000);
  const BatchNormAttrs attrs{1e-5, 0.9, true};
  const std::vector<Tensor> first =
      run_channels_last(h, &batch_norm, OpKind::batch_norm, attrs, inputs, {0});
  const std::vector<Tensor> second =
      run_channels_last(h, &batch_norm, OpKind::batch_norm, attrs, inputs, {0});
  for (size_t o = 0; o < first.size(); ++o)
    EXPECT_TRUE(all_close(first[o], second[o], 0, 0)) << "output " << o;
  const std::vector<Tensor> back_inputs = backward_inputs(DType::f32, shape, true, 9100);
  BatchNormAttrs back_attrs;
  back_attrs.training = true;
  const std::vector<Tensor> b1 = run_channels_last(
      h, &batch_norm_backward, OpKind::batch_norm_backward, back_attrs, back_inputs, {0, 1});
  const std::vector<Tensor> b2 = run_channels_last(
      h, &batch_norm_backward, OpKind::batch_norm_backward, back_attrs, back_inputs, {0, 1});
  for (size_t o = 0; o < b1.size(); ++o)
    EXPECT_TRUE(all_close(b1[o], b2[o], 0, 0)) << "backward output " << o;
}

// Operands in different layouts (or in neither) are an Error naming the node, never a
// silently wrong answer.
TEST_F(BatchNormChannelsLastTest, MixedLayoutsAreRejected) {
  OpHarness h;
  const Shape shape = {2, 8, 3, 3};
  const std::vector<Tensor> inputs = forward_inputs(DType::f32, shape, 9500);
  const BuiltNode built = build_node(OpKind::batch_norm, BatchNormAttrs{1e-5, 0.9, true}, inputs);
  const std::string label = node_label(built.node);
  DeviceTensor x_cl = upload_channels_last(h, inputs[0]), x = h.upload(inputs[0]);
  DeviceTensor scale = h.upload(inputs[1]), bias = h.upload(inputs[2]), mean = h.upload(inputs[3]),
               var = h.upload(inputs[4]);
  // A transposed view (N and C swapped in the strides): neither layout.
  DeviceTensor x_neither = x;
  x_neither.shape = shape;
  x_neither.strides = {3 * 3, 2 * 3 * 3, 3, 1};
  auto expect_rejected = [&](const DeviceTensor& in, bool y_channels_last) {
    std::vector<DeviceTensor> outputs;
    for (size_t o = 0; o < built.outputs.size(); ++o) {
      outputs.push_back(o == 0 && y_channels_last ? poisoned_channels_last(h, built.outputs[o])
                                                  : h.poisoned(built.outputs[o]));
    }
    const std::vector<const DeviceTensor*> pointers = {&in, &scale, &bias, &mean, &var};
    try {
      batch_norm(h.ctx(), built.node, pointers, outputs);
      ADD_FAILURE() << "mixed layouts were accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(label), std::string::npos) << what;
      EXPECT_NE(what.find("channels-last"), std::string::npos) << what;
    }
  };
  expect_rejected(x_cl, false);
  expect_rejected(x, true);
  expect_rejected(x_neither, false);
  expect_rejected(x_neither, true);

  // Backward: dy channels-last, x contiguous.
  DeviceTensor dy_cl = upload_channels_last(h, inputs[0]);
  DeviceTensor dx = h.poisoned({DType::f32, shape});
  EXPECT_THROW(batch_norm_backward(h.ctx(), x, dy_cl, scale, mean, var, &dx, nullptr, nullptr),
               Error);
  h.encoder().synchronize();
}

}  // namespace
}  // namespace fusebox::cuda::testing
