// resize and resize_backward on the GPU, the CPU backend's rule (cpu/resize.cpp) on the same
// tap arithmetic (backends/common/resize_map.h):
//
//   resize:          one thread per output element: its dims' taps (coordinates in f64),
//                    the weighted taps summed in f32 (f64 for f64), rounded once; nearest
//                    copies one word, any dtype
//   resize_backward: images resampled in their last two dims (the common case) gather, one
//                    dim at a time: for each dx column, the dy columns whose taps read it
//                    (t = the W dim's adjoint applied to dy, in f32), then for each dx row the
//                    t rows whose taps read it, rounded once: a fixed order, no atomics.
//                    Otherwise one thread per dy element, atomics adding weight * dy into dx
//                    (an f32 temporary for f16 / bf16, rounded once): sums in no fixed order,
//                    as PyTorch's upsample backwards. The atomics ran DeepLabV3's 64 -> 512
//                    bilinear backward in 28 ms on an H200 (every dx element takes ~64 adds).
//
// A thread's taps are its own: neighbouring threads read neighbouring (or the same) input
// elements, which L1/L2 serve; the op is memory-bound.
#include <cstdint>
#include <type_traits>

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
// one tap of weight 1 at its own index): the two dims' taps computed once each, the leading
// dims as one plane index, no per-dim loop; the taps summed in the general kernel's order (the
// last dim fastest) with the same weights (1 * ... * w_h * w_w), so the values are its values.
// Nearest and linear take resize_taps2 (two fixed slots, weight 0 where resize_taps drops a
// tap: skipped), which stays in registers; resize_taps's compacted arrays live in local
// memory, which ran DeepLabV3's [16, 21, 64, 64] -> 512 x 512 upsample in 4.6 ms (the general
// kernel, with per-dim int64 divisions as well: 26 ms).
struct Taps2Of {
  __device__ ResizeTaps2 operator()(const ResizeMap& m, int d, int64_t o) const {
    return resize_taps2(m, d, o);
  }
};
struct TapsOf {
  __device__ ResizeTaps operator()(const ResizeMap& m, int d, int64_t o) const {
    return resize_taps(m, d, o);
  }
};

// The slots of a taps struct (2 or 4): the unrolled loops' bound.
template <class Taps>
__device__ constexpr int slots(const Taps&) {
  return int(sizeof(Taps::index) / sizeof(Taps::index[0]));
}

// Calls f(e, plane, th, tw) for each output element e of the grid-stride loop: `plane` the
// element offset of its image in x (the leading dims' index times H_in * W_in), th and tw the
// taps of its two resampled dims.
template <class Index, class TapsFn, class F>
__device__ __forceinline__ void for_each_output_2d(const ResizeMap& m, Index total, TapsFn taps,
                                                   F&& f) {
  const int r = m.rank;
  const Index out_h = Index(m.out[r - 2]), out_w = Index(m.out[r - 1]);
  const int64_t image = m.in[r - 2] * m.in[r - 1];
  for (Index e = Index(global_thread_index()); e < total; e += Index(grid_stride())) {
    const Index ow = e % out_w, rest = e / out_w, oh = rest % out_h;
    f(e, int64_t(rest / out_h) * image, taps(m, r - 2, int64_t(oh)), taps(m, r - 1, int64_t(ow)));
  }
}

template <class W, class Index>
__global__ void resize_nearest_2d(const W* x, ResizeMap m, Index total, W* y) {
  const int64_t in_w = m.in[m.rank - 1];
  for_each_output_2d(m, total, Taps2Of{},
                     [&](Index e, int64_t plane, const ResizeTaps2& th, const ResizeTaps2& tw) {
                       y[e] = x[plane + th.index[0] * in_w + tw.index[0]];
                     });
}

template <class T, class Index, class TapsFn>
__global__ void resize_weighted_2d(const T* x, ResizeMap m, Index total, T* y) {
  using C = compute_t<T>;
  const int64_t in_w = m.in[m.rank - 1];
  for_each_output_2d(m, total, TapsFn{},
                     [&](Index e, int64_t plane, const auto& th, const auto& tw) {
                       C sum = 0;
#pragma unroll
                       for (int i = 0; i < slots(th); ++i) {
                         if (i >= th.count) break;
                         if (th.weight[i] == 0) continue;
#pragma unroll
                         for (int j = 0; j < slots(tw); ++j) {
                           if (j >= tw.count) break;
                           if (tw.weight[j] == 0) continue;
                           sum += C(th.weight[i] * tw.weight[j]) *
                                  load_compute(x, plane + th.index[i] * in_w + tw.index[j]);
                         }
                       }
                       store_compute(y, e, sum);
                     });
}

// The backward's gather along one resampled dim d (rank - 1: W, rank - 2: H) of an image
// stack: `src` [planes, rows, src_cols] in the grad's space along d, `dst` [planes, rows,
// dst_cols] in x's space along d (for W: rows = out_h; for H the stacks are transposed views:
// `inner` elements follow each index of d). dst[i] = sum over the outputs o whose taps read i
// (resize_outputs_reading, then each one's taps checked) of weight * src[o], in f32 (f64 for
// f64), o ascending. One thread per dst element.
template <class S, class D, class TapsFn>
__global__ void resize_gather_dim(const S* src, ResizeMap m, int d, int64_t outer, int64_t inner,
                                  D* dst) {
  using A =
      std::conditional_t<std::is_same_v<D, double> || std::is_same_v<S, double>, double, float>;
  const int64_t in_d = m.in[d], out_d = m.out[d], total = outer * in_d * inner;
  const TapsFn taps_of{};
  for (int64_t e = global_thread_index(); e < total; e += grid_stride()) {
    const int64_t c = e % inner, rest = e / inner, i = rest % in_d, plane = rest / in_d;
    const S* const line = src + plane * out_d * inner + c;
    const ResizeOutputRange range = resize_outputs_reading(m, d, i);
    A sum = 0;
    for (int64_t o = range.first; o <= range.last; ++o) {
      const auto taps = taps_of(m, d, o);
      double w = 0;
#pragma unroll
      for (int j = 0; j < slots(taps); ++j) {
        if (j >= taps.count) break;
        if (taps.index[j] == i) w += taps.weight[j];
      }
      if (w != 0) sum += A(w) * A(load_compute(line, o * inner));
    }
    store_compute(dst, e, sum);
  }
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

// resize_backward when resamples_last_two_dims(m): dx [.., H_in, W_in] from dy [.., H_out,
// W_out] in two gathers through t [.., H_out, W_in] (f32; f64 for f64).
void gather_backward_2d(Context& ctx, const Node& n, const ResizeMap& m, const DeviceTensor& dy,
                        const DeviceTensor& dx) {
  const int r = m.rank;
  const int64_t out_h = m.out[r - 2], in_w = m.in[r - 1];
  const int64_t planes = dx.numel() / (m.in[r - 2] * in_w);
  if (dy.numel() == 0) {  // an empty output: nothing reaches dx (+0.0 is all zero bits)
    ctx.encoder.memset(dx.range(), 0);
    return;
  }
  visit_device_float(n, dx.dtype, [&](auto tag) {
    using T = decltype(tag);
    using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const DeviceTensor t = temporary_tensor(
        ctx, std::is_same_v<A, double> ? DType::f64 : DType::f32, {planes, out_h, in_w});
    auto gather = [&](auto taps_tag) {
      using TapsFn = decltype(taps_tag);
      // W: rows of dy [planes * H_out, W_out] -> t [planes * H_out, W_in].
      const int64_t along_w = planes * out_h * in_w;
      ctx.encoder.launch(&resize_gather_dim<T, A, TapsFn>, dim3(launch_blocks(along_w)),
                         dim3(kDefaultThreads), 0, {dy.range()}, {t.range()}, dy.as<const T>(), m,
                         r - 1, planes * out_h, int64_t(1), t.as<A>());
      // H: t [planes, H_out, W_in] -> dx [planes, H_in, W_in], W_in elements per row.
      ctx.encoder.launch(&resize_gather_dim<A, T, TapsFn>, dim3(launch_blocks(dx.numel())),
                         dim3(kDefaultThreads), 0, {t.range()}, {dx.range()}, t.as<const A>(), m,
                         r - 2, planes, in_w, dx.as<T>());
    };
    if (resize_has_taps2(m))
      gather(Taps2Of{});
    else
      gather(TapsOf{});
  });
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
      if (resize_has_taps2(m))
        ctx.encoder.launch(&resize_weighted_2d<T, uint32_t, Taps2Of>, grid, block, 0, reads, writes,
                           x.as<const T>(), m, uint32_t(total), y.as<T>());
      else
        ctx.encoder.launch(&resize_weighted_2d<T, uint32_t, TapsOf>, grid, block, 0, reads, writes,
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
  if (resamples_last_two_dims(m)) {
    gather_backward_2d(ctx, n, m, dy, dx);
    return;
  }
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
