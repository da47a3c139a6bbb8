// The deterministic second pass of the split weight gradients (direct.cu, implicit_gemm/wgrad.cu,
// depthwise/depthwise.cu, cutlass/): out[i] = the sum over splits s of partial[s * count + i],
// rounded once into T.
//
// Algorithm: a block of 256 threads is `lanes` split lanes x 256 / lanes element columns.
// Lane l adds splits l, l + lanes, l + 2 lanes, ... in order, then lane 0 adds the lanes'
// sums in lane order: a fixed order for a given split count, so every run gives the same
// bits. Below 65536 elements, lanes = the split count rounded up to a power of two, at most
// 8: a weight gradient of a few thousand elements cut into a hundred splits keeps eight
// loads in flight per element (else a few thousand threads would each walk a hundred
// dependent loads: the 64x64 1x1 layer's 262 chunks). From 65536 elements one thread per
// element fills the GPU, and lanes (tiny blocks, two barriers each) cost more than they
// bring: on the H100 they slowed ResNet-50's 8- and 13-chunk weight gradients by ~10 us.
#pragma once

#include <algorithm>

#include "backends/cuda/device/math.cuh"
#include "backends/cuda/runtime/context.h"

namespace fusebox::cuda {

constexpr int kSplitSumThreads = 256;

template <class T>
__global__ void __launch_bounds__(kSplitSumThreads)
    sum_splits(const compute_t<T>* partial, int64_t splits, int64_t count, T* out) {
  using C = compute_t<T>;
  __shared__ C lane_sums[kSplitSumThreads];
  const int columns = blockDim.x, lanes = blockDim.y;
  for (int64_t base = int64_t(blockIdx.x) * columns; base < count;
       base += int64_t(gridDim.x) * columns) {
    const int64_t i = base + threadIdx.x;
    C s = 0;
    if (i < count)
      for (int64_t k = threadIdx.y; k < splits; k += lanes) s += partial[k * count + i];
    if (lanes == 1) {
      if (i < count) store_compute(out, i, s);
      continue;
    }
    lane_sums[threadIdx.y * columns + threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && i < count) {
      C total = lane_sums[threadIdx.x];
      for (int l = 1; l < lanes; ++l) total += lane_sums[l * columns + threadIdx.x];
      store_compute(out, i, total);
    }
    __syncthreads();
  }
}

// Records out = sum_splits(partial) (`partial_range`: partial's bytes; `written`: out's).
template <class T>
void record_sum_splits(Context& ctx, const BufferRange& partial_range, const compute_t<T>* partial,
                       int64_t splits, int64_t count, const BufferRange& written, T* out) {
  int lanes = 1;
  while (count < 65536 && lanes < 8 && lanes < splits) lanes *= 2;
  const int columns = kSplitSumThreads / lanes;
  const int64_t blocks = std::clamp<int64_t>((count + columns - 1) / columns, 1, 8192);
  ctx.encoder.launch(&sum_splits<T>, dim3(unsigned(blocks)), dim3(columns, lanes), 0,
                     {partial_range}, {written}, partial, splits, count, out);
}

}  // namespace fusebox::cuda
