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
