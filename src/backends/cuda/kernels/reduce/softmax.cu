// softmax / log_softmax over one axis on the GPU.
//
// x (contiguous) is viewed as [outer, len, inner] around the axis; each (o, i) is a row of
// len elements at stride inner. Per row: the statistics m and lse (kernels/reduce/softmax_rows.cuh,
// in f32, or f64 for f64 tensors), then one pass writing
//   log_softmax = x - m - lse,   softmax = exp(x - m - lse)
// rounded once to T. The rows are walked by a warp each (last axis, <= 1024 elements), a
// block each (last axis, longer) or a thread each (another axis: the threads of a warp take
// adjacent columns, so every load is coalesced). The row is read three times (max, sum,
// write); short rows come back from L1/L2.
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/reduce/softmax_rows.cuh"

namespace fusebox::cuda {

namespace {

constexpr int kRowsPerWarpBlock = 8;  // 256 threads
constexpr int kBlockRowThreads = 512;

template <class C, class T, bool kLog>
__device__ __forceinline__ void write_row(const T* x, T* y, int64_t len, int64_t stride,
                                          RowStats<C> s, int first, int step) {
  for (int64_t j = first; j < len; j += step) {
    const C shifted = convert<C>(x[j * stride]) - s.max - s.lse;
    y[j * stride] = convert<T>(kLog ? shifted : dm::exp(shifted));
  }
}

template <RowWalk kWalk, bool kLog, class T>
__global__ void softmax_kernel(const T* x, T* y, int64_t outer, int64_t len, int64_t inner) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  if constexpr (kWalk == RowWalk::warp) {
    const int lane = threadIdx.x % 32;
    for (int64_t r = int64_t(blockIdx.x) * kRowsPerWarpBlock + threadIdx.x / 32; r < outer;
         r += int64_t(gridDim.x) * kRowsPerWarpBlock) {
      const RowStats<C> s = warp_row_stats<C>(x + r * len, len, 1);
      write_row<C, T, kLog>(x + r * len, y + r * len, len, 1, s, lane, 32);
    }
  } else if constexpr (kWalk == RowWalk::block) {
    for (int64_t r = blockIdx.x; r < outer; r += gridDim.x) {
      const RowStats<C> s = block_row_stats<C>(x + r * len, len, 1);
      write_row<C, T, kLog>(x + r * len, y + r * len, len, 1, s, threadIdx.x, blockDim.x);
    }
  } else {
    for (int64_t t = global_thread_index(); t < outer * inner; t += grid_stride()) {
      const int64_t base = (t / inner) * len * inner + t % inner;
      const RowStats<C> s = thread_row_stats<C>(x + base, len, inner);
      write_row<C, T, kLog>(x + base, y + base, len, inner, s, 0, 1);
    }
  }
}

template <bool kLog, class T>
void launch_softmax(Context& ctx, const DeviceTensor& x, const DeviceTensor& y, int64_t outer,
                    int64_t len, int64_t inner) {
  const BufferList reads{x.range()}, writes{y.range()};
  const T* px = x.as<T>();
  T* py = y.as<T>();
  switch (pick_row_walk(len, inner)) {
    case RowWalk::warp: {
      const int64_t blocks = (outer + kRowsPerWarpBlock - 1) / kRowsPerWarpBlock;
      ctx.encoder.launch(softmax_kernel<RowWalk::warp, kLog, T>,
                         unsigned(std::min(blocks, kMaxGridStrideBlocks)), kRowsPerWarpBlock * 32,
                         0, reads, writes, px, py, outer, len, inner);
      return;
    }
    case RowWalk::block:
      ctx.encoder.launch(softmax_kernel<RowWalk::block, kLog, T>,
                         unsigned(std::min(outer, kMaxGridStrideBlocks)), kBlockRowThreads, 0,
                         reads, writes, px, py, outer, len, inner);
      return;
    case RowWalk::thread:
      ctx.encoder.launch(softmax_kernel<RowWalk::thread, kLog, T>, launch_blocks(outer * inner),
                         kDefaultThreads, 0, reads, writes, px, py, outer, len, inner);
      return;
  }
}

}  // namespace

void softmax(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const DeviceTensor& x = *in[0];
  const DeviceTensor& y = out[0];
  const int64_t axis = std::get<SoftmaxAttrs>(n.attrs).axis;
  FUSEBOX_CHECK(
      x.is_contiguous() && x.shape == y.shape && x.dtype == y.dtype && axis >= 0 && axis < x.rank(),
      node_label(n), "expects a contiguous input shaped as the output and an axis in [0, ",
      x.rank(), ")");
  if (y.numel() == 0) return;
  const Shape& s = x.shape;
  const int64_t outer = numel(Shape(s.begin(), s.begin() + axis));
  const int64_t len = s[size_t(axis)];
  const int64_t inner = numel(Shape(s.begin() + axis + 1, s.end()));
  visit_device_float(n, x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (n.op == OpKind::log_softmax)
      launch_softmax<true, T>(ctx, x, y, outer, len, inner);
    else
      launch_softmax<false, T>(ctx, x, y, outer, len, inner);
  });
}

}  // namespace fusebox::cuda
