// The deterministic second pass of the split weight gradients (direct.cu, implicit_gemm/wgrad.cu,
// depthwise/depthwise.cu, cutlass/): out[i] = the sum over splits s of partial[s * count + i],
// rounded once into T.
//
// Algorithm: a block is 32 element columns x 8 split lanes. Lane l adds splits l, l + 8,
// l + 16, ... in order, then lane 0 adds the 8 lanes' sums in lane order: a fixed order for a
// given split count, so every run gives the same bits. Eight lanes keep eight loads in
// flight per element: a weight gradient of a few thousand elements cut into a hundred splits
// would otherwise be a few thousand threads each walking a hundred dependent loads.
#pragma once

#include <algorithm>

#include "backends/cuda/device/math.cuh"
#include "backends/cuda/runtime/context.h"

namespace fusebox::cuda {

constexpr int kSplitSumColumns = 32, kSplitSumLanes = 8;

template <class T>
__global__ void __launch_bounds__(kSplitSumColumns* kSplitSumLanes)
    sum_splits(const compute_t<T>* partial, int64_t splits, int64_t count, T* out) {
  using C = compute_t<T>;
  __shared__ C lane_sums[kSplitSumLanes][kSplitSumColumns];
  for (int64_t base = int64_t(blockIdx.x) * kSplitSumColumns; base < count;
       base += int64_t(gridDim.x) * kSplitSumColumns) {
    const int64_t i = base + threadIdx.x;
    C s = 0;
    if (i < count)
      for (int64_t k = threadIdx.y; k < splits; k += kSplitSumLanes) s += partial[k * count + i];
    lane_sums[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && i < count) {
      C total = lane_sums[0][threadIdx.x];
      for (int l = 1; l < kSplitSumLanes; ++l) total += lane_sums[l][threadIdx.x];
      store_compute(out, i, total);
    }
    __syncthreads();
  }
}

// Records out = sum_splits(partial) (`partial_range`: partial's bytes; `written`: out's).
template <class T>
void record_sum_splits(Context& ctx, const BufferRange& partial_range, const compute_t<T>* partial,
                       int64_t splits, int64_t count, const BufferRange& written, T* out) {
  const int64_t blocks =
      std::clamp<int64_t>((count + kSplitSumColumns - 1) / kSplitSumColumns, 1, int64_t(1) << 20);
  ctx.encoder.launch(&sum_splits<T>, dim3(unsigned(blocks)), dim3(kSplitSumColumns, kSplitSumLanes),
                     0, {partial_range}, {written}, partial, splits, count, out);
}

}  // namespace fusebox::cuda
