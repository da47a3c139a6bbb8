// The accumulator of the scatter-add backwards (gather_backward, gather_elements_backward,
// resize_backward; include from .cu files only): atomics add into dx itself for f32 / f64,
// into a zeroed f32 temporary for f16 / bf16, which finish() rounds into dx once (atomics on
// half types would round at every add).
//
//   ScatterSum<T> sum(ctx, dx);       zeroed; sum.acc<A>() is what the kernel adds into
//   ... launch the scatter kernel writing sum.range() ...
//   sum.finish(ctx);                  f16 / bf16: dx = round(acc)
#pragma once

#include <type_traits>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/common/dtype_dispatch.cuh"

namespace fusebox::cuda {

template <class T>
__global__ void round_f32_sums(const float* acc, int64_t n, T* out) {
  for (int64_t e = global_thread_index(); e < n; e += grid_stride()) store_compute(out, e, acc[e]);
}

template <class T>
class ScatterSum {
 public:
  // The sum type: f64 for f64, else f32.
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;

  ScatterSum(Context& ctx, const DeviceTensor& dx)
      : dx_(dx), acc_(std::is_same_v<T, A> ? dx : temporary_tensor(ctx, DType::f32, dx.shape)) {
    ctx.encoder.memset(acc_.range(), 0);  // +0.0 in f32 and f64
  }
  A* acc() const { return acc_.as<A>(); }
  BufferRange range() const { return acc_.range(); }
  void finish(Context& ctx) const {
    if constexpr (!std::is_same_v<T, A>)
      ctx.encoder.launch(&round_f32_sums<T>, dim3(launch_blocks(dx_.numel())),
                         dim3(kDefaultThreads), 0, {acc_.range()}, {dx_.range()},
                         acc_.as<const float>(), dx_.numel(), dx_.as<T>());
  }

 private:
  DeviceTensor dx_, acc_;
};

}  // namespace fusebox::cuda
