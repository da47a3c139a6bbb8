// resize and resize_backward on the GPU, the CPU backend's rule (cpu/resize.cpp) on the same
// tap arithmetic (backends/common/resize_map.h):
//
//   resize:          one thread per output element: its dims' taps (coordinates in f64),
//                    the weighted taps summed in f32 (f64 for f64), rounded once; nearest
//                    copies one word, any dtype
//   resize_backward: one thread per dy element, atomics adding weight * dy into dx (an f32
//                    temporary for f16 / bf16, rounded once): sums in no fixed order, as
//                    PyTorch's upsample backwards
//
// A thread's taps are its own: neighbouring threads read neighbouring (or the same) input
// elements, which L1/L2 serve; the op is memory-bound.
#include <cstdint>

#include "backends/common/resize_map.h"
#include "backends/cuda/device/strided_layout.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/common/dtype_dispatch.cuh"
#include "backends/cuda/kernels/common/scatter_sum.cuh"

namespace fusebox::cuda {

namespace {

template <class W>
__global__ void resize_nearest(const W* x, ResizeMap m, int64_t total, W* y) {
  for (int64_t e = global_thread_index(); e < total; e += grid_stride()) {
    W v{};
    if (for_each_resize_tap(m, e, [&](int64_t offset, double) { v = x[offset]; })) y[e] = v;
  }
}

template <class T>
__global__ void resize_weighted(const T* x, ResizeMap m, int64_t total, T* y) {
  using C = compute_t<T>;
  for (int64_t e = global_thread_index(); e < total; e += grid_stride()) {
    C sum = 0;
    const bool inside = for_each_resize_tap(
        m, e, [&](int64_t offset, double w) { sum += C(w) * load_compute(x, offset); });
    store_compute(y, e, inside ? sum : C(m.extrapolation));
  }
}

// The common case, images resampled in their last two dims only (every other dim unscaled:
// one tap of weight 1 at its own index): the two dims' taps from the same resize_taps, the
// leading dims as one plane index, no per-dim loop; the taps summed in the general kernel's
// order (the last dim fastest) with the same weights (1 * ... * w_h * w_w), so the values are
// its values. The general kernel's per-dim int64 divisions and tap arrays in local memory
// ran DeepLabV3's [16, 21, 64, 64] -> 512 x 512 upsample in 26 ms on an H200.
// Calls f(e, plane, th, tw) for each output element e of the grid-stride loop: `plane` the
// element offset of its image in x (the leading dims' index times H_in * W_in), th and tw the
// taps of its two resampled dims.
template <class Index, class F>
__device__ __forceinline__ void for_each_output_2d(const ResizeMap& m, Index total, F&& f) {
  const int r = m.rank;
  const Index out_h = Index(m.out[r - 2]), out_w = Index(m.out[r - 1]);
  const int64_t image = m.in[r - 2] * m.in[r - 1];
  for (Index e = Index(global_thread_index()); e < total; e += Index(grid_stride())) {
    const Index ow = e % out_w, rest = e / out_w, oh = rest % out_h;
    f(e, int64_t(rest / out_h) * image, resize_taps(m, r - 2, int64_t(oh)),
      resize_taps(m, r - 1, int64_t(ow)));
  }
}

template <class W, class Index>
__global__ void resize_nearest_2d(const W* x, ResizeMap m, Index total, W* y) {
  const int64_t in_w = m.in[m.rank - 1];
  for_each_output_2d(m, total,
                     [&](Index e, int64_t plane, const ResizeTaps& th, const ResizeTaps& tw) {
                       y[e] = x[plane + th.index[0] * in_w + tw.index[0]];
                     });
}

template <class T, class Index>
__global__ void resize_weighted_2d(const T* x, ResizeMap m, Index total, T* y) {
  using C = compute_t<T>;
  const int64_t in_w = m.in[m.rank - 1];
  for_each_output_2d(m, total,
                     [&](Index e, int64_t plane, const ResizeTaps& th, const ResizeTaps& tw) {
                       C sum = 0;
#pragma unroll
                       for (int i = 0; i < 4; ++i) {
                         if (i >= th.count) break;
#pragma unroll
                         for (int j = 0; j < 4; ++j) {
                           if (j >= tw.count) break;
                           sum += C(th.weight[i] * tw.weight[j]) *
                                  load_compute(x, plane + th.index[i] * in_w + tw.index[j]);
                         }
                       }
                       store_compute(y, e, sum);
                     });
}

// Whether resize_*_2d computes `m`: its last two dims resampled, every other dim unscaled in a
// coordinate mode that maps an unscaled index to itself (tf_half_pixel_for_nn adds a half,
// tf_crop_and_resize may read outside).
bool resamples_last_two_dims(const ResizeMap& m) {
  if (m.rank < 2) return false;
  switch (m.coordinates) {
    case kHalfPixel:
    case kHalfPixelSymmetric:
    case kPytorchHalfPixel:
    case kAlignCorners:
    case kAsymmetric:
      break;
    default:
      return false;
  }
  for (int d = 0; d + 2 < m.rank; ++d)
    if (m.out[d] != m.in[d] || m.scale[d] != 1.0) return false;
  return true;
}

template <class T, class A>
__global__ void resize_scatter_add(const T* dy, ResizeMap m, int64_t total, A* acc) {
  for (int64_t e = global_thread_index(); e < total; e += grid_stride()) {
    const A g = A(load_compute(dy, e));
    for_each_resize_tap(m, e, [&](int64_t offset, double w) { atomicAdd(&acc[offset], A(w) * g); });
  }
}

}  // namespace

void resize(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const auto& a = std::get<ResizeAttrs>(n.attrs);
  const DeviceTensor& x = *in[0];
  const DeviceTensor& y = out[0];
  FUSEBOX_CHECK(x.is_contiguous() && y.is_contiguous(), node_label(n),
                "expects contiguous tensors");
  const int64_t total = y.numel();
  if (total == 0) return;
  const ResizeMap m = make_resize_map(a, x.shape, node_label(n));
  const dim3 grid(launch_blocks(total)), block(kDefaultThreads);
  if (resamples_last_two_dims(m) && fits_u32(total)) {
    const BufferList reads{x.range()}, writes{y.range()};
    if (a.mode == ResizeMode::nearest) {
      visit_bytes(dtype_size(x.dtype), [&](auto tag) {
        using W = decltype(tag);
        ctx.encoder.launch(&resize_nearest_2d<W, uint32_t>, grid, block, 0, reads, writes,
                           x.as<const W>(), m, uint32_t(total), y.as<W>());
      });
      return;
    }
    visit_device_float(n, x.dtype, [&](auto tag) {
      using T = decltype(tag);
      ctx.encoder.launch(&resize_weighted_2d<T, uint32_t>, grid, block, 0, reads, writes,
                         x.as<const T>(), m, uint32_t(total), y.as<T>());
    });
    return;
  }
  if (a.mode == ResizeMode::nearest && a.coordinates != ResizeCoordinates::tf_crop_and_resize) {
    visit_bytes(dtype_size(x.dtype), [&](auto tag) {
      using W = decltype(tag);
      ctx.encoder.launch(&resize_nearest<W>, grid, block, 0, {x.range()}, {y.range()},
                         x.as<const W>(), m, total, y.as<W>());
    });
    return;
  }
  visit_device_float(n, x.dtype, [&](auto tag) {
    using T = decltype(tag);
    ctx.encoder.launch(&resize_weighted<T>, grid, block, 0, {x.range()}, {y.range()},
                       x.as<const T>(), m, total, y.as<T>());
  });
}

void resize_backward(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const auto& a = std::get<ResizeBackwardAttrs>(n.attrs);
  const DeviceTensor& dy = *in[0];
  const DeviceTensor& dx = out[0];
  FUSEBOX_CHECK(dy.is_contiguous() && dx.is_contiguous(), node_label(n),
                "expects contiguous tensors");
  if (dx.numel() == 0) return;
  const ResizeMap m = make_resize_map(a.resize, dx.shape, node_label(n));
  visit_device_float(n, dx.dtype, [&](auto tag) {
    using T = decltype(tag);
    using A = typename ScatterSum<T>::A;
    const ScatterSum<T> sum(ctx, dx);
    if (dy.numel() > 0)
      ctx.encoder.launch(&resize_scatter_add<T, A>, dim3(launch_blocks(dy.numel())),
                         dim3(kDefaultThreads), 0, {dy.range()}, {sum.range()}, dy.as<const T>(), m,
                         dy.numel(), sum.acc());
    sum.finish(ctx);
  });
}

}  // namespace fusebox::cuda
