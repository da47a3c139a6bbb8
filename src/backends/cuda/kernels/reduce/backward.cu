// Gradients of softmax / log_softmax and reduce_max on the GPU, with the CPU backend's
// semantics (backends/cpu/reduce_backward.cpp).
//
// softmax_backward / log_softmax_backward: y (and dy) viewed as [outer, len, inner] around
//   the axis; per row, s = sum(dy * y) (softmax) or s = sum(dy) (log_softmax), summed in
//   f64 (the CPU's precision; a fixed shuffle tree, so deterministic), then
//     softmax:     dx = y * (dy - s)
//     log_softmax: dx = dy - exp(y) * s
//   in the compute type, rounded once. Rows are walked as the forward's
//   (kernels/reduce/softmax_rows.cuh): a warp per row (last axis, <= 1024), a block per row (last
//   axis, longer) or a thread per row (another axis: a warp's threads take adjacent columns,
//   coalesced).
// reduce_max_backward: per output o, the reduced elements of x equal to y[o] (the NaN ones
//   when y[o] is NaN) share dy[o] evenly; the others get 0. Two passes:
//     1. per output (a warp, or a block for long reductions): count the ties (integers,
//        so any order is exact), share[o] = dy[o] / max(ties, 1) in the compute type;
//     2. per element of x: dx = is_max ? share[o] : 0, o found through a strided walk
//        whose output strides are 0 along the reduced dims.
#include <algorithm>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/common/indexing.cuh"
#include "backends/cuda/kernels/reduce/softmax_rows.cuh"

namespace fusebox::cuda {

namespace {

constexpr int kRowsPerWarpBlock = 8;  // 256 threads
constexpr int kBlockRowThreads = 512;

// ---- softmax / log_softmax -----------------------------------------------------------

// Partial sum over elements first, first + step, ... of one row.
template <bool kLog, class T>
__device__ __forceinline__ double partial_row_sum(const T* dy, const T* y, int64_t len,
                                                  int64_t stride, int first, int step) {
  using C = compute_t<T>;
  double s = 0.0;
  for (int64_t j = first; j < len; j += step) {
    const double g = double(convert<C>(dy[j * stride]));
    s += kLog ? g : g * double(convert<C>(y[j * stride]));
  }
  return s;
}

template <bool kLog, class T>
__device__ __forceinline__ void write_row_grad(const T* dy, const T* y, T* dx, int64_t len,
                                               int64_t stride, double sum, int first, int step) {
  using C = compute_t<T>;
  const C s = C(sum);
  for (int64_t j = first; j < len; j += step) {
    const C g = convert<C>(dy[j * stride]), v = convert<C>(y[j * stride]);
    dx[j * stride] = convert<T>(kLog ? g - dm::exp(v) * s : v * (g - s));
  }
}

template <RowWalk kWalk, bool kLog, class T>
__global__ void softmax_backward_kernel(const T* dy, const T* y, T* dx, int64_t outer, int64_t len,
                                        int64_t inner) {
  if constexpr (kWalk == RowWalk::warp) {
    const int lane = threadIdx.x % 32;
    for (int64_t r = int64_t(blockIdx.x) * kRowsPerWarpBlock + threadIdx.x / 32; r < outer;
         r += int64_t(gridDim.x) * kRowsPerWarpBlock) {
      const int64_t base = r * len;
      const double s =
          warp_reduce(partial_row_sum<kLog>(dy + base, y + base, len, 1, lane, 32), SumOp{});
      write_row_grad<kLog>(dy + base, y + base, dx + base, len, 1, s, lane, 32);
    }
  } else if constexpr (kWalk == RowWalk::block) {
    for (int64_t r = blockIdx.x; r < outer; r += gridDim.x) {
      const int64_t base = r * len;
      const double s =
          block_reduce(partial_row_sum<kLog>(dy + base, y + base, len, 1, threadIdx.x, blockDim.x),
                       SumOp{}, 0.0);
      write_row_grad<kLog>(dy + base, y + base, dx + base, len, 1, s, threadIdx.x, blockDim.x);
    }
  } else {
    for (int64_t t = global_thread_index(); t < outer * inner; t += grid_stride()) {
      const int64_t base = (t / inner) * len * inner + t % inner;
      const double s = partial_row_sum<kLog>(dy + base, y + base, len, inner, 0, 1);
      write_row_grad<kLog>(dy + base, y + base, dx + base, len, inner, s, 0, 1);
    }
  }
}

template <bool kLog, class T>
void launch_softmax_backward(Context& ctx, const DeviceTensor& dy, const DeviceTensor& y,
                             const DeviceTensor& dx, int64_t outer, int64_t len, int64_t inner) {
  const BufferList reads{dy.range(), y.range()}, writes{dx.range()};
  const T *pdy = dy.as<T>(), *py = y.as<T>();
  T* pdx = dx.as<T>();
  switch (pick_row_walk(len, inner)) {
    case RowWalk::warp: {
      const int64_t blocks = (outer + kRowsPerWarpBlock - 1) / kRowsPerWarpBlock;
      ctx.encoder.launch(softmax_backward_kernel<RowWalk::warp, kLog, T>,
                         unsigned(std::min(blocks, kMaxGridStrideBlocks)), kRowsPerWarpBlock * 32,
                         0, reads, writes, pdy, py, pdx, outer, len, inner);
      return;
    }
    case RowWalk::block:
      ctx.encoder.launch(softmax_backward_kernel<RowWalk::block, kLog, T>,
                         unsigned(std::min(outer, kMaxGridStrideBlocks)), kBlockRowThreads, 0,
                         reads, writes, pdy, py, pdx, outer, len, inner);
      return;
    case RowWalk::thread:
      ctx.encoder.launch(softmax_backward_kernel<RowWalk::thread, kLog, T>,
                         launch_blocks(outer * inner), kDefaultThreads, 0, reads, writes, pdy, py,
                         pdx, outer, len, inner);
      return;
  }
}

// ---- reduce_max ------------------------------------------------------------------------

// The reduced elements of output o: x[base(o) + reduced.offsets(j)] for j < count, where
// base(o) = kept.offsets(o).
struct MaxWalk {
  StridedLayout<1> kept;     // over the kept dims, x's strides
  StridedLayout<1> reduced;  // over the reduced dims, x's strides
  int64_t outputs, count;
};

template <class C>
__device__ __forceinline__ bool is_max(C v, C m) {
  return m != m ? v != v : v == m;
}

// Pass 1, a group of kGroup threads (a warp, or the block) per output.
template <class T, int kGroup>
__global__ void max_ties_kernel(const T* x, const T* dy, const T* y, MaxWalk w,
                                compute_t<T>* share) {
  using C = compute_t<T>;
  constexpr int kGroups = kDefaultThreads / kGroup;
  const int group = threadIdx.x / kGroup, lane = threadIdx.x % kGroup;
  for (int64_t first = int64_t(blockIdx.x) * kGroups; first < w.outputs;
       first += int64_t(gridDim.x) * kGroups) {
    const int64_t o = first + group;
    int64_t ties = 0;
    if (o < w.outputs) {
      int64_t base[1];
      w.kept.offsets(uint64_t(o), base);
      const C m = convert<C>(y[o]);
      for (int64_t j = lane; j < w.count; j += kGroup) {
        int64_t off[1];
        w.reduced.offsets(uint64_t(j), off);
        ties += is_max(convert<C>(x[base[0] + off[0]]), m);
      }
    }
    if constexpr (kGroup == 32)
      ties = warp_reduce(ties, SumOp{});
    else
      ties = block_reduce(ties, SumOp{}, int64_t(0));
    if (o < w.outputs && lane == 0) share[o] = convert<C>(dy[o]) / C(ties > 1 ? ties : 1);
  }
}

// Pass 2: off[0] walks x (and dx) contiguously, off[1] is the element's output.
template <class T>
__global__ void max_scatter_kernel(const T* x, const T* y, const compute_t<T>* share, T* dx,
                                   StridedLayout<2> layout, int64_t total) {
  using C = compute_t<T>;
  for (int64_t i = global_thread_index(); i < total; i += grid_stride()) {
    int64_t off[2];
    layout.offsets(uint64_t(i), off);
    const bool hit = is_max(convert<C>(x[off[0]]), convert<C>(y[off[1]]));
    dx[off[0]] = convert<T>(hit ? share[off[1]] : C(0));
  }
}

}  // namespace

// (dy, y) -> dx for softmax_backward and log_softmax_backward.
void softmax_backward(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const DeviceTensor &dy = *in[0], &y = *in[1];
  const DeviceTensor& dx = out[0];
  const int64_t axis = std::get<SoftmaxAttrs>(n.attrs).axis;
  FUSEBOX_CHECK(dy.shape == y.shape && dy.dtype == y.dtype && dx.shape == y.shape &&
                    dx.dtype == y.dtype && dy.is_contiguous() && y.is_contiguous() && axis >= 0 &&
                    axis < y.rank(),
                node_label(n), "dy ", shape_str(dy.shape), " and y ", shape_str(y.shape),
                " must share a type, with an axis in [0, ", y.rank(), ")");
  if (dx.numel() == 0) return;
  const Shape& s = y.shape;
  const int64_t outer = numel(Shape(s.begin(), s.begin() + axis));
  const int64_t len = s[size_t(axis)];
  const int64_t inner = numel(Shape(s.begin() + axis + 1, s.end()));
  visit_device_float(n, y.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (n.op == OpKind::log_softmax_backward)
      launch_softmax_backward<true, T>(ctx, dy, y, dx, outer, len, inner);
    else
      launch_softmax_backward<false, T>(ctx, dy, y, dx, outer, len, inner);
  });
}

// (dy, x, y) -> dx
void reduce_max_backward(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const auto& axes = std::get<ReduceAttrs>(n.attrs).axes;
  const DeviceTensor &dy = *in[0], &x = *in[1], &y = *in[2];
  const DeviceTensor& dx = out[0];
  // Kept dims walk the outputs (dy and y row-major over them), reduced ones each output's
  // elements (axes are normalised: explicit and sorted).
  const Shape x_strides = contiguous_strides(x.shape);
  Shape kept_shape, kept_strides, reduced_shape, reduced_strides;
  Shape out_strides(x.shape.size(), 0);
  for (int64_t d = 0; d < x.rank(); ++d) {
    const bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
    (reduced ? reduced_shape : kept_shape).push_back(x.shape[size_t(d)]);
    (reduced ? reduced_strides : kept_strides).push_back(x_strides[size_t(d)]);
  }
  for (int64_t d = x.rank(), stride = 1; d-- > 0;) {
    const bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
    if (reduced) continue;
    out_strides[size_t(d)] = stride;
    stride *= x.shape[size_t(d)];
  }
  FUSEBOX_CHECK(
      x.is_contiguous() && dy.is_contiguous() && y.is_contiguous() &&
          dy.numel() == numel(kept_shape) && y.numel() == dy.numel() && dy.dtype == x.dtype &&
          y.dtype == x.dtype && dx.dtype == x.dtype && dx.shape == x.shape,
      node_label(n), "dy ", shape_str(dy.shape), " and y ", shape_str(y.shape),
      " do not match the kept dims ", shape_str(kept_shape), " of x ", shape_str(x.shape));
  if (dx.numel() == 0) return;
  MaxWalk w{make_layout<1>(n, kept_shape, {kept_strides}),
            make_layout<1>(n, reduced_shape, {reduced_strides}), numel(kept_shape),
            numel(reduced_shape)};
  const StridedLayout<2> scatter = make_layout<2>(n, x.shape, {x_strides, out_strides});
  visit_device_float(n, x.dtype, [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    DeviceBuffer share = ctx.allocator.allocate(size_t(w.outputs) * sizeof(C));
    ctx.encoder.add_temporary(share);
    const BufferList reads{x.range(), dy.range(), y.range()};
    if (w.count <= 2048) {
      constexpr int kGroups = kDefaultThreads / 32;
      ctx.encoder.launch(max_ties_kernel<T, 32>,
                         launch_blocks((w.outputs + kGroups - 1) / kGroups, 1), kDefaultThreads, 0,
                         reads, BufferList{share}, x.as<T>(), dy.as<T>(), y.as<T>(), w,
                         share.as<C>());
    } else {
      ctx.encoder.launch(max_ties_kernel<T, kDefaultThreads>, launch_blocks(w.outputs, 1),
                         kDefaultThreads, 0, reads, BufferList{share}, x.as<T>(), dy.as<T>(),
                         y.as<T>(), w, share.as<C>());
    }
    ctx.encoder.launch(max_scatter_kernel<T>, launch_blocks(x.numel()), kDefaultThreads, 0,
                       BufferList{x.range(), y.range(), share}, BufferList{dx.range()}, x.as<T>(),
                       y.as<T>(), share.as<C>(), dx.as<T>(), scatter, x.numel());
  });
}

}  // namespace fusebox::cuda
