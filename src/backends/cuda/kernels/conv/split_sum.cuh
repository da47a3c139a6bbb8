// The deterministic second pass of the split weight gradients (direct.cu, implicit_gemm/wgrad.cu,
// depthwise/depthwise.cu): out[i] = sum over splits s, in order, of partial[s * count + i],
// rounded once into T.
#pragma once

#include "backends/cuda/device/math.cuh"

namespace fusebox::cuda {

template <class T>
__global__ void sum_splits(const compute_t<T>* partial, int64_t splits, int64_t count, T* out) {
  for (int64_t i = global_thread_index(); i < count; i += grid_stride()) {
    compute_t<T> s = 0;
    for (int64_t k = 0; k < splits; ++k) s += partial[k * count + i];
    store_compute(out, i, s);
  }
}

}  // namespace fusebox::cuda
