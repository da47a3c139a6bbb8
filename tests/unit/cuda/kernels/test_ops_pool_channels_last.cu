// CUDA pools on channels-last operands (N, D..., C) against the CPU backend on NCHW data:
// max_pool (+ indices in either layout), avg_pool, global_avg_pool, max_pool_backward and
// avg_pool_backward; 1-3 spatial dims, ResNet's 3x3 stride 2 pad 1, ceil_mode,
// count_include_pad, dilation, asymmetric pads, C = 1, 3, 7, 64, N = 1, outputs of a single
// position (both layouts at once), ties and NaN, operands at an odd element offset (the
// scalar fallback of the vectorised path), and mixed layouts (an Error). max_pool_backward
// (dy, x) also in the contiguous layout, with stride > kernel, windows with no in-bounds
// tap and all-equal inputs, bit for bit against the direct call given the indices (through
// one-byte tap codes, and i64 indices for a window of 343 taps).
//
// Inputs are uploaded NCHW and copied (copy_strided) into channels-last tensors; outputs
// are channels-last, poisoned (0xFF bytes) first, and copied back to NCHW to compare.
// Tolerances as the NCHW pool tests: max_pool and its indices exact; avg_pool
// tolerance_for(dtype); global_avg_pool x 4 (longer sums in another order); the backward
// passes x 2 (a few window shares per element).
#include <cmath>
#include <cstring>

#include "backends/cuda/kernels/pool/direct.h"
#include "gpu_vs_cpu.h"

namespace fusebox::cuda::testing {
namespace {

using fusebox::testing::all_close;
using fusebox::testing::random_tensor;
using fusebox::testing::run_op;

class PoolChannelsLastTest : public ::testing::Test {
 protected:
  void SetUp() override { FUSEBOX_REQUIRE_GPU(); }
};

// Device tensors in a chosen layout at an element offset into their buffer.
class LayoutHarness {
 public:
  Context& ctx() { return h_.ctx(); }

  // An uninitialised tensor of `type` laid out in `format`, `offset` elements into its
  // buffer.
  DeviceTensor empty(const TensorType& type, MemoryFormat format, int64_t offset = 0) {
    DeviceTensor base =
        DeviceTensor::empty(h_.ctx().allocator, type.dtype, {numel(type.shape) + offset});
    return base.view(offset, type.shape, strides_for(type.shape, format));
  }
  // `t` (NCHW on the host) on the device in `format`.
  DeviceTensor put(const Tensor& t, MemoryFormat format, int64_t offset = 0) {
    DeviceTensor d = empty({t.dtype(), t.shape()}, format, offset);
    copy_strided(h_.ctx(), h_.upload(t), d);
    return d;
  }
  // A fresh output whose every byte is 0xFF (NaN for floats, -1 for indices).
  DeviceTensor poisoned(const TensorType& type, MemoryFormat format, int64_t offset = 0) {
    DeviceTensor d = empty(type, format, offset);
    h_.encoder().memset(d.range(), 0xFF);
    return d;
  }
  // The contents of `d` (any dense layout) as an NCHW host tensor.
  Tensor get(const DeviceTensor& d) {
    DeviceTensor contiguous = DeviceTensor::empty(h_.ctx().allocator, d.dtype, d.shape);
    copy_strided(h_.ctx(), d, contiguous);
    return h_.download(contiguous);
  }

  // Runs `entry` for the normalised node of (op, attrs, inputs) with every input and output
  // channels-last at `offset` (indices: `indices_format`), outputs poisoned; returns the
  // outputs as NCHW host tensors.
  std::vector<Tensor> run(KernelEntry entry, OpKind op, Attrs attrs,
                          const std::vector<Tensor>& inputs, int64_t offset = 0,
                          MemoryFormat indices_format = MemoryFormat::channels_last) {
    const BuiltNode built = build_node(op, std::move(attrs), inputs);
    std::vector<DeviceTensor> device;
    for (const Tensor& t : inputs) device.push_back(put(t, MemoryFormat::channels_last, offset));
    std::vector<const DeviceTensor*> pointers;
    for (const DeviceTensor& d : device) pointers.push_back(&d);
    std::vector<DeviceTensor> outputs;
    for (size_t i = 0; i < built.outputs.size(); ++i) {
      const bool is_indices = built.outputs[i].dtype == DType::i64;
      outputs.push_back(poisoned(built.outputs[i],
                                 is_indices ? indices_format : MemoryFormat::channels_last,
                                 is_indices ? 0 : offset));
    }
    entry(h_.ctx(), built.node, pointers, outputs);
    h_.encoder().synchronize();
    check_error_flags(h_.ctx());
    std::vector<Tensor> result;
    for (const DeviceTensor& d : outputs) result.push_back(get(d));
    return result;
  }

  // Runs `entry` for `built` on device inputs, every output poisoned in `format`;
  // synchronises, checks the error flags and returns the device outputs.
  std::vector<DeviceTensor> run_device(KernelEntry entry, const BuiltNode& built,
                                       const std::vector<const DeviceTensor*>& inputs,
                                       MemoryFormat format) {
    std::vector<DeviceTensor> outputs;
    for (const TensorType& type : built.outputs) outputs.push_back(poisoned(type, format));
    entry(h_.ctx(), built.node, inputs, outputs);
    h_.encoder().synchronize();
    check_error_flags(h_.ctx());
    return outputs;
  }

 private:
  OpHarness h_;
};

PoolAttrs window(std::vector<int64_t> kernel, std::vector<int64_t> strides,
                 std::vector<int64_t> pads_begin, std::vector<int64_t> pads_end,
                 std::vector<int64_t> dilations = {}, bool ceil_mode = false) {
  PoolAttrs a;
  a.kernel = std::move(kernel);
  a.strides = std::move(strides);
  a.pads_begin = std::move(pads_begin);
  a.pads_end = std::move(pads_end);
  a.dilations = std::move(dilations);
  a.ceil_mode = ceil_mode;
  return a;
}

struct PoolCase {
  const char* name;
  Shape x;
  PoolAttrs attrs;
  bool dilated() const {
    for (int64_t d : attrs.dilations)
      if (d != 1) return true;
    return false;
  }
};

std::vector<PoolCase> pool_cases() {
  return {
      {"resnet 3x3 s2 p1", {2, 64, 24, 22}, window({3, 3}, {2, 2}, {1, 1}, {1, 1})},
      {"resnet 3x3 s2 p1, N = 1, odd extents",
       {1, 64, 17, 15},
       window({3, 3}, {2, 2}, {1, 1}, {1, 1})},
      {"2x2 s2, C = 3", {2, 3, 8, 8}, window({2, 2}, {2, 2}, {0, 0}, {0, 0})},
      {"3x3 s2 ceil, C = 7", {2, 7, 12, 12}, window({3, 3}, {2, 2}, {1, 1}, {1, 1}, {}, true)},
      {"asymmetric pads ceil, C = 8",
       {1, 8, 10, 9},
       window({3, 2}, {2, 3}, {1, 0}, {0, 1}, {}, true)},
      {"overlapping 3x3 s1, C = 16", {2, 16, 7, 7}, window({3, 3}, {1, 1}, {1, 1}, {1, 1})},
      {"dilated, C = 12", {2, 12, 9, 11}, window({3, 2}, {1, 2}, {2, 1}, {1, 2}, {2, 3})},
      {"1-d, C = 7", {2, 7, 13}, window({3}, {2}, {1}, {0})},
      {"1-d dilated ceil, C = 8", {1, 8, 13}, window({2}, {3}, {3}, {3}, {4}, true)},
      {"3-d, C = 8", {2, 8, 5, 6, 7}, window({2, 3, 2}, {2, 1, 2}, {0, 1, 1}, {1, 1, 0})},
      {"3-d ceil, C = 1",
       {1, 1, 6, 5, 4},
       window({3, 3, 3}, {2, 2, 2}, {1, 1, 1}, {1, 1, 1}, {}, true)},
      {"C = 1", {2, 1, 9, 9}, window({3, 3}, {2, 2}, {1, 1}, {1, 1})},
      {"one output position, C = 32", {2, 32, 3, 3}, window({3, 3}, {1, 1}, {0, 0}, {0, 0})},
      // Windows that tile x, vectorised (the backward's one-thread-per-window path).
      {"2x2 s2 tiles, C = 16", {2, 16, 8, 6}, window({2, 2}, {2, 2}, {0, 0}, {0, 0})},
  };
}

// The attributes as infer_and_normalize leaves them (what the backward ops carry).
PoolAttrs normalised(OpKind op, const PoolAttrs& attrs, const Tensor& x) {
  return std::get<PoolAttrs>(build_node(op, attrs, {x}).node.attrs);
}

TEST_F(PoolChannelsLastTest, MaxPoolAndIndicesMatchCpu) {
  LayoutHarness h;
  uint64_t seed = 1;
  int runs = 0;
  for (DType t : kFloatTypes) {
    for (const PoolCase& c : pool_cases()) {
      // No indices, channels-last indices, contiguous indices, in turn.
      const int mode = runs % 3;
      SCOPED_TRACE(cat(c.name, " ", dtype_name(t), " indices mode ", mode));
      PoolAttrs attrs = c.attrs;
      attrs.return_indices = mode != 0;
      Tensor x = random_tensor(t, c.x, seed++, -3, 3);
      const std::vector<Tensor> want = run_op(OpKind::max_pool, attrs, {x});
      const std::vector<Tensor> got =
          h.run(&max_pool, OpKind::max_pool, attrs, {x}, 0,
                mode == 2 ? MemoryFormat::contiguous : MemoryFormat::channels_last);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_TRUE(all_close(got[0], want[0], 0, 0));
      if (mode != 0) EXPECT_TRUE(all_close(got[1], want[1], 0, 0));
      ++runs;
    }
  }
  EXPECT_EQ(runs, 56);
}

TEST_F(PoolChannelsLastTest, AvgPoolMatchesCpu) {
  LayoutHarness h;
  uint64_t seed = 100;
  for (DType t : kFloatTypes) {
    for (const PoolCase& c : pool_cases()) {
      if (c.dilated()) continue;  // avg_pool takes no dilation
      for (bool include_pad : {false, true}) {
        SCOPED_TRACE(cat(c.name, " ", dtype_name(t), include_pad ? " include_pad" : ""));
        PoolAttrs attrs = c.attrs;
        attrs.count_include_pad = include_pad;
        Tensor x = random_tensor(t, c.x, seed++);
        const std::vector<Tensor> want = run_op(OpKind::avg_pool, attrs, {x});
        const std::vector<Tensor> got = h.run(&avg_pool, OpKind::avg_pool, attrs, {x});
        const Tolerance tol = tolerance_for(t);
        EXPECT_TRUE(all_close(got[0], want[0], tol.rtol, tol.atol));
      }
    }
  }
}

TEST_F(PoolChannelsLastTest, GlobalAvgPoolMatchesCpu) {
  LayoutHarness h;
  uint64_t seed = 200;
  // ResNet's head, N = 1, rank 3 and 5, C = 1, 3, 7; and planes large enough to split the
  // rows over several blocks (vectorised and not).
  const Shape shapes[] = {{4, 2048, 7, 7},   {1, 2048, 7, 7}, {2, 3, 5},
                          {2, 16, 3, 4, 5},  {3, 1, 1500},    {2, 7, 9, 9},
                          {1, 64, 112, 112}, {2, 7, 40, 40},  {2, 512, 1, 1}};
  for (DType t : kFloatTypes) {
    for (const Shape& shape : shapes) {
      SCOPED_TRACE(cat(dtype_name(t), " ", shape_str(shape)));
      Tensor x = random_tensor(t, shape, seed++);
      const std::vector<Tensor> want = run_op(OpKind::global_avg_pool, {}, {x});
      const std::vector<Tensor> got = h.run(&global_avg_pool, OpKind::global_avg_pool, {}, {x});
      const Tolerance tol = tolerance_for(t);
      EXPECT_TRUE(all_close(got[0], want[0], tol.rtol * 4, tol.atol * 4));
    }
  }
}

TEST_F(PoolChannelsLastTest, MaxPoolBackwardMatchesCpu) {
  LayoutHarness h;
  uint64_t seed = 300;
  for (DType t : kFloatTypes) {
    for (const PoolCase& c : pool_cases()) {
      SCOPED_TRACE(cat(c.name, " ", dtype_name(t)));
      Tensor x = random_tensor(t, c.x, seed++, -3, 3);
      const PoolAttrs pool = normalised(OpKind::max_pool, c.attrs, x);
      const BuiltNode forward = build_node(OpKind::max_pool, pool, {x});
      Tensor dy = random_tensor(t, forward.outputs[0].shape, seed++, -1, 1);
      const PoolBackwardAttrs attrs{pool, {}};
      const Tensor want = run_op(OpKind::max_pool_backward, attrs, {dy, x})[0];
      const Tolerance tol = tolerance_for(t);
      EXPECT_TRUE(all_close(h.run(&max_pool_backward, OpKind::max_pool_backward, attrs, {dy, x})[0],
                            want, tol.rtol * 2, tol.atol * 2))
          << "IR op (dy, x)";
      // The direct call with the forward's indices, channels-last and contiguous.
      PoolAttrs with_indices = pool;
      with_indices.return_indices = true;
      const Tensor indices = run_op(OpKind::max_pool, with_indices, {x})[1];
      for (MemoryFormat f : {MemoryFormat::channels_last, MemoryFormat::contiguous}) {
        const DeviceTensor dyd = h.put(dy, MemoryFormat::channels_last), idx = h.put(indices, f);
        DeviceTensor dx = h.poisoned({t, c.x}, MemoryFormat::channels_last);
        max_pool_backward(h.ctx(), pool, dyd, idx, dx);
        EXPECT_TRUE(all_close(h.get(dx), want, tol.rtol * 2, tol.atol * 2))
            << "direct, indices " << memory_format_name(f);
      }
    }
  }
}

TEST_F(PoolChannelsLastTest, AvgPoolBackwardMatchesCpu) {
  LayoutHarness h;
  uint64_t seed = 400;
  for (DType t : kFloatTypes) {
    for (const PoolCase& c : pool_cases()) {
      if (c.dilated()) continue;
      for (bool include_pad : {false, true}) {
        SCOPED_TRACE(cat(c.name, " ", dtype_name(t), include_pad ? " include_pad" : ""));
        PoolAttrs pool = c.attrs;
        pool.count_include_pad = include_pad;
        pool = normalised(OpKind::avg_pool, pool, Tensor::zeros(t, c.x));
        const BuiltNode forward = build_node(OpKind::avg_pool, pool, {Tensor::zeros(t, c.x)});
        Tensor dy = random_tensor(t, forward.outputs[0].shape, seed++, -1, 1);
        const PoolBackwardAttrs attrs{pool, c.x};
        const Tensor want = run_op(OpKind::avg_pool_backward, attrs, {dy})[0];
        const Tolerance tol = tolerance_for(t);
        EXPECT_TRUE(all_close(h.run(&avg_pool_backward, OpKind::avg_pool_backward, attrs, {dy})[0],
                              want, tol.rtol * 2, tol.atol * 2))
            << "IR op";
        const DeviceTensor dyd = h.put(dy, MemoryFormat::channels_last);
        DeviceTensor dx = h.poisoned({t, c.x}, MemoryFormat::channels_last);
        avg_pool_backward(h.ctx(), pool, dyd, dx);
        EXPECT_TRUE(all_close(h.get(dx), want, tol.rtol * 2, tol.atol * 2)) << "direct";
      }
    }
  }
}

// Small integers make windows with several equal maxima (the first in row-major window
// order wins, as on the CPU), plus NaNs (a NaN wins and stays) and -inf.
TEST_F(PoolChannelsLastTest, MaxPoolTiesAndNaNFollowCpu) {
  LayoutHarness h;
  uint64_t seed = 500;
  const PoolCase cases[] = {pool_cases()[0], pool_cases()[5], pool_cases()[9]};
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    for (const PoolCase& c : cases) {
      SCOPED_TRACE(cat(c.name, " ", dtype_name(t)));
      std::vector<double> values = random_tensor(DType::i32, c.x, seed++, 0, 4).to_doubles();
      for (size_t i = 0; i < values.size(); i += 97) values[i] = NAN;
      for (size_t i = 13; i < values.size(); i += 101) values[i] = -INFINITY;
      const Tensor x = Tensor::from_doubles(t, c.x, values);
      PoolAttrs attrs = c.attrs;
      attrs.return_indices = true;
      const std::vector<Tensor> want = run_op(OpKind::max_pool, attrs, {x});
      const std::vector<Tensor> got = h.run(&max_pool, OpKind::max_pool, attrs, {x});
      EXPECT_TRUE(all_close(got[0], want[0], 0, 0));  // NaN matches NaN
      EXPECT_TRUE(all_close(got[1], want[1], 0, 0));
      const PoolBackwardAttrs backward{normalised(OpKind::max_pool, c.attrs, x), {}};
      Tensor dy = random_tensor(t, want[0].shape(), seed++, -1, 1);
      const Tolerance tol = tolerance_for(t);
      EXPECT_TRUE(all_close(
          h.run(&max_pool_backward, OpKind::max_pool_backward, backward, {dy, x})[0],
          run_op(OpKind::max_pool_backward, backward, {dy, x})[0], tol.rtol * 2, tol.atol * 2));
    }
  }
}

// Windows beyond pool_cases() for max_pool_backward: stride > kernel (elements in no window
// get 0) and dilated windows with no in-bounds tap (they send nowhere); C % 8 == 0 and odd.
std::vector<PoolCase> max_backward_cases() {
  std::vector<PoolCase> cases = pool_cases();
  cases.push_back(
      {"2x2 s3 (gaps), C = 24", {2, 24, 11, 10}, window({2, 2}, {3, 3}, {0, 0}, {0, 0})});
  cases.push_back({"3-d 1x2x2 s(1,3,3) pad (gaps), C = 5",
                   {1, 5, 3, 8, 7},
                   window({1, 2, 2}, {1, 3, 3}, {0, 1, 1}, {0, 0, 1})});
  cases.push_back({"1-d empty windows, C = 8", {2, 8, 2}, window({2}, {1}, {3}, {3}, {4})});
  cases.push_back(
      {"2-d empty windows, C = 5", {1, 5, 2, 3}, window({2, 2}, {1, 2}, {3, 0}, {3, 1}, {4, 1})});
  // The small windows' blocked gather (backward.cu: max_pool_small_backward_kernel, blocks of
  // stride[1] x stride[2] dx positions) with 16-byte vectors: mixed strides (block 1 x 2,
  // three windows along dim 1), ceil_mode (windows past the end), no padding with positions
  // in no window, 2x2 stride 1, and one image's blocks cut by the edges.
  cases.push_back(
      {"3x3 s(1,2) p1, C = 16", {2, 16, 9, 10}, window({3, 3}, {1, 2}, {1, 1}, {1, 1})});
  cases.push_back({"3x3 s2 p1 ceil, C = 16",
                   {2, 16, 10, 11},
                   window({3, 3}, {2, 2}, {1, 1}, {1, 1}, {}, true)});
  cases.push_back(
      {"3x2 s2 no pad (gaps), C = 24", {1, 24, 10, 9}, window({3, 2}, {2, 2}, {0, 0}, {0, 0})});
  cases.push_back({"2x2 s1 p(1,0), C = 8", {2, 8, 6, 5}, window({2, 2}, {1, 1}, {1, 0}, {0, 1})});
  // 343 taps: more than a one-byte tap code holds, so the (dy, x) form goes through i64
  // indices; the cases above all take the tap codes.
  cases.push_back({"3-d 7x7x7 s(1,2,1) pad (i64 indices), C = 8",
                   {1, 8, 7, 9, 8},
                   window({7, 7, 7}, {1, 2, 1}, {0, 1, 0}, {0, 1, 1})});
  return cases;
}

// x for the max_pool_backward tests: random; small integers (windows with several equal
// maxima: the first in row-major window order wins); all equal (every window ties); small
// integers with NaNs (a NaN wins and stays) and -inf.
enum class Values { random, ties, constant, nan };

Tensor max_pool_input(DType t, const Shape& shape, Values values, uint64_t seed) {
  if (values == Values::random) return random_tensor(t, shape, seed, -3, 3);
  std::vector<double> v = random_tensor(DType::i32, shape, seed, 0, 4).to_doubles();
  for (size_t i = 0; i < v.size(); ++i) {
    if (values == Values::constant) v[i] = 1.5;
    if (values == Values::nan && i % 23 == 5) v[i] = NAN;
    if (values == Values::nan && i % 19 == 3) v[i] = -INFINITY;
  }
  return Tensor::from_doubles(t, shape, v);
}

// The IR op max_pool_backward (dy, x), which recomputes each window's choice from x, with
// all operands contiguous or all channels-last: against the CPU, and bit for bit against
// the direct call given the GPU forward's indices (the same sums in the same order).
TEST_F(PoolChannelsLastTest, MaxPoolBackwardFromXMatchesCpuAndIndices) {
  LayoutHarness h;
  uint64_t seed = 700;
  int runs = 0;
  for (DType t : kFloatTypes) {
    for (const PoolCase& c : max_backward_cases()) {
      for (Values values : {Values::random, Values::ties, Values::constant, Values::nan}) {
        for (MemoryFormat f : {MemoryFormat::contiguous, MemoryFormat::channels_last}) {
          SCOPED_TRACE(
              cat(c.name, " ", dtype_name(t), " values ", int(values), " ", memory_format_name(f)));
          const Tensor x = max_pool_input(t, c.x, values, seed++);
          const PoolAttrs pool = normalised(OpKind::max_pool, c.attrs, x);
          PoolAttrs with_indices = pool;
          with_indices.return_indices = true;
          const BuiltNode forward = build_node(OpKind::max_pool, with_indices, {x});
          const Tensor dy = random_tensor(t, forward.outputs[0].shape, seed++, -1, 1);
          const PoolBackwardAttrs attrs{pool, {}};
          const BuiltNode backward = build_node(OpKind::max_pool_backward, attrs, {dy, x});
          const DeviceTensor xd = h.put(x, f), dyd = h.put(dy, f);
          const Tensor got = h.get(h.run_device(&max_pool_backward, backward, {&dyd, &xd}, f)[0]);
          const Tolerance tol = tolerance_for(t);
          EXPECT_TRUE(all_close(got, run_op(OpKind::max_pool_backward, attrs, {dy, x})[0],
                                tol.rtol * 2, tol.atol * 2))
              << "against the CPU";
          const std::vector<DeviceTensor> y = h.run_device(&max_pool, forward, {&xd}, f);
          DeviceTensor dx = h.poisoned({t, c.x}, f);
          max_pool_backward(h.ctx(), pool, dyd, y[1], dx);
          const Tensor direct = h.get(dx);
          ASSERT_EQ(got.nbytes(), direct.nbytes());
          EXPECT_EQ(std::memcmp(got.raw(), direct.raw(), got.nbytes()), 0)
              << "against the direct call with indices";
          ++runs;
        }
      }
    }
  }
  EXPECT_EQ(runs, 4 * 23 * 4 * 2);
}

// Operands one element past a 16-byte boundary: the vectorised kernels' scalar fallback.
TEST_F(PoolChannelsLastTest, MisalignedOperandsMatchCpu) {
  LayoutHarness h;
  uint64_t seed = 600;
  const PoolCase c = pool_cases()[0];
  for (DType t : {DType::f32, DType::f16}) {
    SCOPED_TRACE(dtype_name(t));
    const Tolerance tol = tolerance_for(t);
    Tensor x = random_tensor(t, c.x, seed++, -3, 3);
    PoolAttrs attrs = c.attrs;
    EXPECT_TRUE(all_close(h.run(&max_pool, OpKind::max_pool, attrs, {x}, 1)[0],
                          run_op(OpKind::max_pool, attrs, {x})[0], 0, 0));
    EXPECT_TRUE(all_close(h.run(&avg_pool, OpKind::avg_pool, attrs, {x}, 1)[0],
                          run_op(OpKind::avg_pool, attrs, {x})[0], tol.rtol, tol.atol));
    const PoolBackwardAttrs backward{normalised(OpKind::max_pool, attrs, x), {}};
    Tensor dy = random_tensor(t, run_op(OpKind::max_pool, attrs, {x})[0].shape(), seed++);
    EXPECT_TRUE(all_close(
        h.run(&max_pool_backward, OpKind::max_pool_backward, backward, {dy, x}, 1)[0],
        run_op(OpKind::max_pool_backward, backward, {dy, x})[0], tol.rtol * 2, tol.atol * 2));
    const PoolBackwardAttrs avg_backward{normalised(OpKind::avg_pool, attrs, x), c.x};
    EXPECT_TRUE(all_close(
        h.run(&avg_pool_backward, OpKind::avg_pool_backward, avg_backward, {dy}, 1)[0],
        run_op(OpKind::avg_pool_backward, avg_backward, {dy})[0], tol.rtol * 2, tol.atol * 2));
    Tensor big = random_tensor(t, {2, 64, 7, 7}, seed++);
    EXPECT_TRUE(all_close(h.run(&global_avg_pool, OpKind::global_avg_pool, {}, {big}, 1)[0],
                          run_op(OpKind::global_avg_pool, {}, {big})[0], tol.rtol * 4,
                          tol.atol * 4));
  }
}

// Operands in different layouts, or in neither, are an Error naming the node.
TEST_F(PoolChannelsLastTest, RejectsMixedLayouts) {
  LayoutHarness h;
  const Tensor x = random_tensor(DType::f32, {2, 8, 6, 6}, 1);
  const PoolAttrs attrs = window({2, 2}, {2, 2}, {0, 0}, {0, 0});
  const BuiltNode built = build_node(OpKind::max_pool, attrs, {x});
  const DeviceTensor xd = h.put(x, MemoryFormat::channels_last);
  const std::vector<const DeviceTensor*> x_in = {&xd};
  std::vector<DeviceTensor> y = {h.poisoned(built.outputs[0], MemoryFormat::contiguous)};
  try {
    max_pool(h.ctx(), built.node, x_in, y);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), node_label(built.node));
    EXPECT_NE(std::string(e.what()).find("channels-last"), std::string::npos) << e.what();
  }
  // x transposed in H and W: neither layout.
  const DeviceTensor hw = xd.permuted({0, 1, 3, 2});
  const std::vector<const DeviceTensor*> hw_in = {&hw};
  std::vector<DeviceTensor> y2 = {h.poisoned(built.outputs[0], MemoryFormat::channels_last)};
  EXPECT_THROW(max_pool(h.ctx(), built.node, hw_in, y2), Error);
  const BuiltNode global = build_node(OpKind::global_avg_pool, {}, {x});
  std::vector<DeviceTensor> g = {h.poisoned(global.outputs[0], MemoryFormat::contiguous)};
  EXPECT_THROW(global_avg_pool(h.ctx(), global.node, hw_in, g), Error);
  // avg_pool_backward with dy channels-last but dx contiguous.
  const PoolAttrs pool = normalised(OpKind::avg_pool, attrs, x);
  const DeviceTensor dy =
      h.put(random_tensor(DType::f32, built.outputs[0].shape, 2), MemoryFormat::channels_last);
  DeviceTensor dx = h.poisoned({DType::f32, x.shape()}, MemoryFormat::contiguous);
  EXPECT_THROW(avg_pool_backward(h.ctx(), pool, dy, dx), Error);
}

}  // namespace
}  // namespace fusebox::cuda::testing
