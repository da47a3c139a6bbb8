// Pooling: max_pool (with optional indices), avg_pool, global_avg_pool, and the backward
// passes of the windowed pools (norm_backward.h). Semantics are the CPU kernel's
// (backends/cpu/pool.cpp):
//   window along spatial dim d of output position o: taps j < kernel[d] at input position
//     o * stride[d] - pad_begin[d] + j * dilation[d];
//   max_pool: the largest in-bounds value (padding never wins), the first of equal maxima,
//     a NaN wins and stays; its index into the flattened x (row-major over N, C, D...). A
//     window with no in-bounds tap (possible only with dilation) gives -inf and index -1.
//   avg_pool: the in-bounds sum over the number of in-bounds taps, or with
//     count_include_pad over the taps inside [-pad_begin, D + pad_end).
// 1-D and 2-D pools are 3-D ones with leading extents of 1. Values are compared / summed
// in f32 (f64 for f64), in the CPU kernel's order, and rounded once.
//
// Windowed pools: one thread per output element (grid-stride), the window's tap ranges
// computed per dim (a few integer operations), then a loop over the in-bounds taps. Each
// input element is read by about prod(kernel / stride) threads, from L1 / L2: fine for
// the small windows networks use (2x2, 3x3 stride 2 run near copy bandwidth), slower for
// large overlapping windows.
// global_avg_pool: one warp per plane when planes are small (< 1024 elements), else one
// block per plane; a fixed reduction tree.
// Backward passes gather instead of scatter (no atomics): one thread per dx element
// visits the outputs whose windows contain it. max_pool's takes the forward's indices;
// the IR op max_pool_backward (dy, x) first recomputes them into a temporary with the
// forward kernel (so the choice among ties and NaNs is exactly the forward's), then
// gathers. avg_pool_backward's IR op (dy) is the direct call with the node's attributes.
#include "backends/cuda/block_reduce.cuh"
#include "backends/cuda/device_math.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/norm_backward.h"

namespace fusebox::cuda {

namespace {

constexpr int kThreads = 256;

struct PoolShape {
  int64_t planes = 0;  // N * C
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1};
  int64_t kernel[3] = {1, 1, 1}, stride[3] = {1, 1, 1}, dilation[3] = {1, 1, 1};
  int64_t pad_lo[3] = {0, 0, 0}, pad_hi[3] = {0, 0, 0};

  __host__ __device__ int64_t in_size() const { return in[0] * in[1] * in[2]; }
  __host__ __device__ int64_t out_size() const { return out[0] * out[1] * out[2]; }
};

PoolShape make_pool_shape(const PoolAttrs& a, const Shape& x, const Shape& y,
                          const std::string& where) {
  const int64_t rank = int64_t(x.size()) - 2;
  FUSEBOX_CHECK(rank >= 1 && rank <= 3 && y.size() == x.size() && y[0] == x[0] && y[1] == x[1],
                where, "input ", shape_str(x), " and output ", shape_str(y),
                " must be [N, C, D...] with 1 to 3 spatial dims");
  FUSEBOX_CHECK(int64_t(a.kernel.size()) == rank && int64_t(a.strides.size()) == rank &&
                    int64_t(a.dilations.size()) == rank && int64_t(a.pads_begin.size()) == rank &&
                    int64_t(a.pads_end.size()) == rank,
                where, "attributes are not normalised to ", rank, " spatial dims");
  PoolShape g;
  g.planes = x[0] * x[1];
  for (int64_t d = 0; d < rank; ++d) {
    const int64_t i = 3 - rank + d;
    g.in[i] = x[2 + d];
    g.out[i] = y[2 + d];
    g.kernel[i] = a.kernel[d];
    g.stride[i] = a.strides[d];
    g.dilation[i] = a.dilations[d];
    g.pad_lo[i] = a.pads_begin[d];
    g.pad_hi[i] = a.pads_end[d];
    FUSEBOX_CHECK(g.kernel[i] >= 1 && g.stride[i] >= 1 && g.dilation[i] >= 1 && g.pad_lo[i] >= 0 &&
                      g.pad_hi[i] >= 0,
                  where, "bad window in spatial dim ", d, ": kernel ", g.kernel[i], ", stride ",
                  g.stride[i], ", dilation ", g.dilation[i], ", pads ", g.pad_lo[i], " and ",
                  g.pad_hi[i]);
  }
  return g;
}

__device__ __forceinline__ int64_t ceil_div(int64_t a, int64_t b) {  // b > 0
  return a >= 0 ? (a + b - 1) / b : -(-a / b);
}

// The taps of output position o along dim d: the first in-bounds tap's input position,
// the in-bounds count (consecutive taps), and the taps inside the padded extent.
struct Taps {
  int64_t first, count, padded;
};

__device__ __forceinline__ Taps taps_of(const PoolShape& g, int d, int64_t o) {
  const int64_t start = o * g.stride[d] - g.pad_lo[d], dil = g.dilation[d];
  auto below = [&](int64_t hi) {  // taps j with start + j * dil < hi
    return min(max(ceil_div(hi - start, dil), int64_t(0)), g.kernel[d]);
  };
  const int64_t j_first = below(0);
  return {start + j_first * dil, max(below(g.in[d]) - j_first, int64_t(0)),
          below(g.in[d] + g.pad_hi[d]) - below(-g.pad_lo[d])};
}

// Output index -> plane and 3-D position.
__device__ __forceinline__ void split_output(const PoolShape& g, int64_t idx, int64_t& plane,
                                             int64_t (&o)[3]) {
  o[2] = idx % g.out[2];
  idx /= g.out[2];
  o[1] = idx % g.out[1];
  idx /= g.out[1];
  o[0] = idx % g.out[0];
  plane = idx / g.out[0];
}

template <class T>
__global__ void max_pool_kernel(PoolShape g, const T* x, T* y, int64_t* indices) {
  using C = compute_t<T>;
  const int64_t total = g.planes * g.out_size();
  for (int64_t idx = global_thread_index(); idx < total; idx += grid_stride()) {
    int64_t plane, o[3];
    split_output(g, idx, plane, o);
    const Taps t0 = taps_of(g, 0, o[0]), t1 = taps_of(g, 1, o[1]), t2 = taps_of(g, 2, o[2]);
    const T* xp = x + plane * g.in_size();
    C best = -INFINITY;
    int64_t best_at = -1;
    for (int64_t a = 0; a < t0.count; ++a) {
      const int64_t i0 = t0.first + a * g.dilation[0];
      for (int64_t b = 0; b < t1.count; ++b) {
        const int64_t i1 = t1.first + b * g.dilation[1];
        for (int64_t c = 0; c < t2.count; ++c) {
          const int64_t i = (i0 * g.in[1] + i1) * g.in[2] + t2.first + c * g.dilation[2];
          const C v = load_compute(xp, i);
          // Take v when it is larger or NaN, unless a NaN is already held.
          if (best_at < 0 || (!(best != best) && !(v <= best))) {
            best = v;
            best_at = i;
          }
        }
      }
    }
    if (y) store_compute(y, idx, best);
    if (indices) indices[idx] = best_at < 0 ? -1 : plane * g.in_size() + best_at;
  }
}

template <class T>
__global__ void avg_pool_kernel(PoolShape g, bool count_include_pad, const T* x, T* y) {
  using C = compute_t<T>;
  const int64_t total = g.planes * g.out_size();
  for (int64_t idx = global_thread_index(); idx < total; idx += grid_stride()) {
    int64_t plane, o[3];
    split_output(g, idx, plane, o);
    const Taps t0 = taps_of(g, 0, o[0]), t1 = taps_of(g, 1, o[1]), t2 = taps_of(g, 2, o[2]);
    const T* xp = x + plane * g.in_size();
    C sum = 0;
    for (int64_t a = 0; a < t0.count; ++a) {
      const int64_t i0 = t0.first + a * g.dilation[0];
      for (int64_t b = 0; b < t1.count; ++b) {
        const T* row = xp + (i0 * g.in[1] + t1.first + b * g.dilation[1]) * g.in[2] + t2.first;
        for (int64_t c = 0; c < t2.count; ++c) sum += load_compute(row, c * g.dilation[2]);
      }
    }
    const int64_t divisor =
        count_include_pad ? t0.padded * t1.padded * t2.padded : t0.count * t1.count * t2.count;
    // divisor >= 1: shape inference keeps the pads smaller than the window.
    store_compute(y, idx, sum / C(divisor));
  }
}

// One group of kGroup threads (a warp, or the whole block) per plane.
template <class T, int kGroup>
__global__ void global_avg_pool_kernel(const T* x, T* y, int64_t planes, int64_t plane_size) {
  using C = compute_t<T>;
  constexpr int kGroups = kThreads / kGroup;
  const int group = threadIdx.x / kGroup, lane = threadIdx.x % kGroup;
  for (int64_t base = int64_t(blockIdx.x) * kGroups; base < planes;
       base += int64_t(gridDim.x) * kGroups) {
    const int64_t plane = base + group;
    C sum = 0;
    if (plane < planes) {
      const T* xp = x + plane * plane_size;
      for (int64_t i = lane; i < plane_size; i += kGroup) sum += load_compute(xp, i);
    }
    if constexpr (kGroup == 32)
      sum = warp_reduce(sum, SumOp{});
    else
      sum = block_reduce(sum, SumOp{}, C(0));
    if (plane < planes && lane == 0) store_compute(y, plane, sum / C(plane_size));
  }
}

// The outputs o along dim d whose windows hold input position i at some tap:
// o * stride = i + pad_lo - j * dilation for a tap j, so o in [lo, hi] (clipped to the
// output) with (i + pad_lo - o * stride) % dilation == 0.
__device__ __forceinline__ void windows_of(const PoolShape& g, int d, int64_t i, int64_t& lo,
                                           int64_t& hi) {
  const int64_t reach = i + g.pad_lo[d];
  lo = max(ceil_div(reach - (g.kernel[d] - 1) * g.dilation[d], g.stride[d]), int64_t(0));
  hi = min(reach / g.stride[d], g.out[d] - 1);
}

__device__ __forceinline__ bool on_tap(const PoolShape& g, int d, int64_t i, int64_t o) {
  return (i + g.pad_lo[d] - o * g.stride[d]) % g.dilation[d] == 0;
}

// Input index -> plane and 3-D position.
__device__ __forceinline__ void split_input(const PoolShape& g, int64_t idx, int64_t& plane,
                                            int64_t (&i)[3]) {
  i[2] = idx % g.in[2];
  idx /= g.in[2];
  i[1] = idx % g.in[1];
  idx /= g.in[1];
  i[0] = idx % g.in[0];
  plane = idx / g.in[0];
}

// kMax: dx[i] = sum of dy[o] over windows o containing i whose index names i.
// Otherwise (avg): dx[i] = sum of dy[o] / divisor(o) over windows o containing i.
template <class T, bool kMax>
__global__ void pool_backward_kernel(PoolShape g, bool count_include_pad, const T* dy,
                                     const int64_t* indices, T* dx) {
  using C = compute_t<T>;
  const int64_t total = g.planes * g.in_size();
  for (int64_t idx = global_thread_index(); idx < total; idx += grid_stride()) {
    int64_t plane, i[3], lo[3], hi[3];
    split_input(g, idx, plane, i);
    for (int d = 0; d < 3; ++d) windows_of(g, d, i[d], lo[d], hi[d]);
    C sum = 0;
    for (int64_t o0 = lo[0]; o0 <= hi[0]; ++o0) {
      if (!on_tap(g, 0, i[0], o0)) continue;
      for (int64_t o1 = lo[1]; o1 <= hi[1]; ++o1) {
        if (!on_tap(g, 1, i[1], o1)) continue;
        for (int64_t o2 = lo[2]; o2 <= hi[2]; ++o2) {
          if (!on_tap(g, 2, i[2], o2)) continue;
          const int64_t at = plane * g.out_size() + (o0 * g.out[1] + o1) * g.out[2] + o2;
          if constexpr (kMax) {
            if (indices[at] == idx) sum += load_compute(dy, at);
          } else {
            const Taps t0 = taps_of(g, 0, o0), t1 = taps_of(g, 1, o1), t2 = taps_of(g, 2, o2);
            const int64_t divisor = count_include_pad ? t0.padded * t1.padded * t2.padded
                                                      : t0.count * t1.count * t2.count;
            sum += load_compute(dy, at) / C(divisor);
          }
        }
      }
    }
    store_compute(dx, idx, sum);
  }
}

void check_same_dtype(const DeviceTensor& a, const DeviceTensor& b, const std::string& where) {
  FUSEBOX_CHECK(a.dtype == b.dtype, where, "input is ", dtype_name(a.dtype), " but output is ",
                dtype_name(b.dtype));
}

template <class F>
void visit_pool_float(const std::string& where, DType t, F&& f) {
  visit_device_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (is_float_v<T>)
      f(T{});
    else
      throw Error(where, cat("expects a floating-point tensor, got ", dtype_name(t)));
  });
}

}  // namespace

// x [N, C, D...] -> y [N, C, O...], indices [N, C, O...] (i64) with return_indices.
void max_pool(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const std::string where = node_label(n);
  const DeviceTensor& x = *in[0];
  DeviceTensor& y = out[0];
  check_same_dtype(x, y, where);
  const PoolShape g = make_pool_shape(std::get<PoolAttrs>(n.attrs), x.shape, y.shape, where);
  int64_t* indices = nullptr;
  BufferList writes = {y.range()};
  if (out.size() > 1) {
    FUSEBOX_CHECK(out[1].dtype == DType::i64 && out[1].shape == y.shape, where,
                  "indices must be i64 ", shape_str(y.shape));
    indices = out[1].as<int64_t>();
    writes.push_back(out[1].range());
  }
  if (y.numel() == 0) return;
  visit_pool_float(where, x.dtype, [&](auto tag) {
    using T = decltype(tag);
    ctx.encoder.launch(&max_pool_kernel<T>, dim3(launch_blocks(y.numel(), kThreads)),
                       dim3(kThreads), 0, {x.range()}, writes, g, x.as<const T>(), y.as<T>(),
                       indices);
  });
}

// x [N, C, D...] -> y [N, C, O...]
void avg_pool(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const std::string where = node_label(n);
  const auto& attrs = std::get<PoolAttrs>(n.attrs);
  const DeviceTensor& x = *in[0];
  DeviceTensor& y = out[0];
  check_same_dtype(x, y, where);
  const PoolShape g = make_pool_shape(attrs, x.shape, y.shape, where);
  if (y.numel() == 0) return;
  visit_pool_float(where, x.dtype, [&](auto tag) {
    using T = decltype(tag);
    ctx.encoder.launch(&avg_pool_kernel<T>, dim3(launch_blocks(y.numel(), kThreads)),
                       dim3(kThreads), 0, {x.range()}, {y.range()}, g, attrs.count_include_pad,
                       x.as<const T>(), y.as<T>());
  });
}

// x [N, C, D...] -> y [N, C, 1...]: the mean of each (n, c) plane.
void global_avg_pool(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const std::string where = node_label(n);
  const DeviceTensor& x = *in[0];
  DeviceTensor& y = out[0];
  FUSEBOX_CHECK(x.dtype == y.dtype && x.rank() >= 3 && y.rank() == x.rank() &&
                    y.shape[0] == x.shape[0] && y.shape[1] == x.shape[1] &&
                    y.numel() == x.shape[0] * x.shape[1],
                where, "input ", shape_str(x.shape), " (", dtype_name(x.dtype), ") and output ",
                shape_str(y.shape), " (", dtype_name(y.dtype), ") do not match");
  const int64_t planes = y.numel();
  if (planes == 0) return;
  const int64_t plane_size = x.numel() / planes;
  FUSEBOX_CHECK(plane_size >= 1, where, "input ", shape_str(x.shape), " has an empty spatial dim");
  visit_pool_float(where, x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (plane_size < 1024) {
      constexpr int kGroups = kThreads / 32;
      const unsigned blocks = launch_blocks((planes + kGroups - 1) / kGroups, 1);
      ctx.encoder.launch(&global_avg_pool_kernel<T, 32>, dim3(blocks), dim3(kThreads), 0,
                         {x.range()}, {y.range()}, x.as<const T>(), y.as<T>(), planes, plane_size);
    } else {
      const unsigned blocks = launch_blocks(planes, 1);
      ctx.encoder.launch(&global_avg_pool_kernel<T, kThreads>, dim3(blocks), dim3(kThreads), 0,
                         {x.range()}, {y.range()}, x.as<const T>(), y.as<T>(), planes, plane_size);
    }
  });
}

namespace {

void run_max_pool_backward(Context& ctx, const std::string& where, const PoolAttrs& attrs,
                           const DeviceTensor& dy, const DeviceTensor& indices,
                           const DeviceTensor& dx) {
  check_same_dtype(dy, dx, where);
  FUSEBOX_CHECK(indices.dtype == DType::i64 && indices.shape == dy.shape, where,
                "indices must be i64 ", shape_str(dy.shape));
  const PoolShape g = make_pool_shape(attrs, dx.shape, dy.shape, where);
  if (dx.numel() == 0) return;
  visit_pool_float(where, dx.dtype, [&](auto tag) {
    using T = decltype(tag);
    ctx.encoder.launch(&pool_backward_kernel<T, true>, dim3(launch_blocks(dx.numel(), kThreads)),
                       dim3(kThreads), 0, {dy.range(), indices.range()}, {dx.range()}, g, false,
                       dy.as<const T>(), indices.as<const int64_t>(), dx.as<T>());
  });
}

void run_avg_pool_backward(Context& ctx, const std::string& where, const PoolAttrs& attrs,
                           const DeviceTensor& dy, const DeviceTensor& dx) {
  check_same_dtype(dy, dx, where);
  const PoolShape g = make_pool_shape(attrs, dx.shape, dy.shape, where);
  if (dx.numel() == 0) return;
  visit_pool_float(where, dx.dtype, [&](auto tag) {
    using T = decltype(tag);
    ctx.encoder.launch(&pool_backward_kernel<T, false>, dim3(launch_blocks(dx.numel(), kThreads)),
                       dim3(kThreads), 0, {dy.range()}, {dx.range()}, g, attrs.count_include_pad,
                       dy.as<const T>(), static_cast<const int64_t*>(nullptr), dx.as<T>());
  });
}

}  // namespace

void max_pool_backward(Context& ctx, const PoolAttrs& attrs, const DeviceTensor& dy,
                       const DeviceTensor& indices, DeviceTensor& dx) {
  run_max_pool_backward(ctx, "max_pool_backward", attrs, dy, indices, dx);
}

void avg_pool_backward(Context& ctx, const PoolAttrs& attrs, const DeviceTensor& dy,
                       DeviceTensor& dx) {
  run_avg_pool_backward(ctx, "avg_pool_backward", attrs, dy, dx);
}

// (dy, x) -> dx: the forward's indices recomputed from x, then the gather.
void max_pool_backward(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const std::string where = node_label(n);
  const PoolAttrs& attrs = std::get<PoolBackwardAttrs>(n.attrs).pool;
  const DeviceTensor &dy = *in[0], &x = *in[1];
  const DeviceTensor& dx = out[0];
  FUSEBOX_CHECK(x.shape == dx.shape && x.dtype == dx.dtype && x.is_contiguous(), where, "x ",
                shape_str(x.shape), " and dx ", shape_str(dx.shape), " differ");
  check_same_dtype(dy, dx, where);
  const PoolShape g = make_pool_shape(attrs, x.shape, dy.shape, where);
  if (dx.numel() == 0) return;
  DeviceTensor indices = DeviceTensor::empty(ctx.allocator, DType::i64, dy.shape);
  ctx.encoder.add_temporary(indices.buffer);
  if (dy.numel() > 0) {
    visit_pool_float(where, x.dtype, [&](auto tag) {
      using T = decltype(tag);
      ctx.encoder.launch(&max_pool_kernel<T>, dim3(launch_blocks(dy.numel(), kThreads)),
                         dim3(kThreads), 0, {x.range()}, {indices.range()}, g, x.as<const T>(),
                         static_cast<T*>(nullptr), indices.as<int64_t>());
    });
  }
  run_max_pool_backward(ctx, where, attrs, dy, indices, dx);
}

// (dy) -> dx of input_shape.
void avg_pool_backward(Context& ctx, const Node& n, Inputs in, Outputs out) {
  run_avg_pool_backward(ctx, node_label(n), std::get<PoolBackwardAttrs>(n.attrs).pool, *in[0],
                        out[0]);
}

}  // namespace fusebox::cuda
