// max_pool's choice of element in a window: the one place it is decided, used by the forward
// kernel (kernels/pool/pool.cu, for y and indices) and by max_pool_backward's gather
// (kernels/pool/backward.cu, which recomputes it from x instead of storing indices), so the
// gradient goes exactly where the forward's indices would send it. Device only; include
// from .cu files.
//
// The rule is the CPU kernel's (backends/cpu/pool.cpp): the largest in-bounds value, the
// first of equal maxima in row-major tap order, a NaN wins and stays; padding never
// competes, and a window with no in-bounds tap chooses nothing.
#pragma once

#include "backends/cuda/kernels/pool/window.cuh"

namespace fusebox::cuda {

// The choice in one window of x, for V consecutive channels c0.. of image n (x dense in the
// kCL layout); t0, t1, t2: the window's in-bounds taps per dim (window_taps). best[l]: the
// lane's chosen value (-inf when none), best_at[l]: its spatial offset in x (-1 when none).
template <int V, bool kCL, class T>
__device__ __forceinline__ void window_argmax(const PoolWindow& g, const T* x, int64_t n,
                                              int64_t c0, const TapRange& t0, const TapRange& t1,
                                              const TapRange& t2, compute_t<T> (&best)[V],
                                              int64_t (&best_at)[V]) {
  using C = compute_t<T>;
#pragma unroll
  for (int l = 0; l < V; ++l) {
    best[l] = C(-INFINITY);
    best_at[l] = -1;
  }
  const int64_t in_size = g.in_size();
  for (int64_t a = 0; a < t0.count; ++a) {
    const int64_t i0 = t0.first + a * g.dilation[0];
    for (int64_t b = 0; b < t1.count; ++b) {
      const int64_t i1 = t1.first + b * g.dilation[1];
      for (int64_t c = 0; c < t2.count; ++c) {
        const int64_t sp = spatial_offset(g.in, i0, i1, t2.first + c * g.dilation[2]);
        C v[V];
        load_lanes<V>(x, element_at<kCL>(n, c0, g.channels, in_size, sp), v);
#pragma unroll
        for (int l = 0; l < V; ++l) {
          // Take v when it is the first tap, larger, or NaN, unless a NaN is already held.
          if (best_at[l] < 0 || (!(best[l] != best[l]) && !(v[l] <= best[l]))) {
            best[l] = v[l];
            best_at[l] = sp;
          }
        }
      }
    }
  }
}

}  // namespace fusebox::cuda
