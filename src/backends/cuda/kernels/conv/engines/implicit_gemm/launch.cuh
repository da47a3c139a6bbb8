// The dispatch from a Plan (dtype, math, vector loads, tile) to one conv_kernel instance.
// Included by fprop.cu, dgrad.cu and wgrad.cu only: each instantiates its op's kernels.
#pragma once

#include "backends/cuda/kernels/conv/engines/implicit_gemm/launch.h"
#include "backends/cuda/kernels/conv/engines/implicit_gemm/mainloop.cuh"
#include "backends/cuda/runtime/check.h"

namespace fusebox::cuda::igemm {

using Tile128x128 = Tile<128, 128, kTileK, 64, 64, kStages>;
using Tile128x64 = Tile<128, 64, kTileK, 64, 32, kStages>;
using Tile64x128 = Tile<64, 128, kTileK, 32, 64, kStages>;
using Tile64x64 = Tile<64, 64, kTileK, 32, 32, kStages>;

template <class Op, class T, class Math, class Tl, bool kVec>
void launch_instance(Context& ctx, const Plan& plan, const BufferList& reads,
                     const BufferList& writes) {
  auto* kernel = &conv_kernel<Op, T, Math, Tl, kVec>;
  constexpr size_t smem = shared_bytes<T, Tl>();
  // Above 48 KiB of dynamic shared memory a kernel must opt in (per device; cheap to repeat).
  FUSEBOX_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  ctx.encoder.launch(kernel, dim3(plan.grid[0], plan.grid[1], plan.grid[2]), dim3(Tl::kThreads),
                     smem, reads, writes, plan.params);
}

// The tiles compiled for (T, Math, kVec): plan.cpp's tile_available says the same.
template <class Op, class T, class Math, bool kVec>
void launch_tiled(Context& ctx, const Plan& plan, const BufferList& reads,
                  const BufferList& writes) {
  constexpr bool kAllTiles = kVec && !std::is_same_v<Math, ExactMath>;
  constexpr bool kLargest = kAllTiles && !std::is_same_v<T, float>;
  switch (plan.tile) {
    case TileShape::t128x128:
      if constexpr (kLargest)
        return launch_instance<Op, T, Math, Tile128x128, kVec>(ctx, plan, reads, writes);
      break;
    case TileShape::t128x64:
      if constexpr (kAllTiles)
        return launch_instance<Op, T, Math, Tile128x64, kVec>(ctx, plan, reads, writes);
      break;
    case TileShape::t64x128:
      if constexpr (kAllTiles)
        return launch_instance<Op, T, Math, Tile64x128, kVec>(ctx, plan, reads, writes);
      break;
    case TileShape::t64x64:
      return launch_instance<Op, T, Math, Tile64x64, kVec>(ctx, plan, reads, writes);
    default:  // the wgmma tiles: launch_sm90
      break;
  }
  throw Error("implicit GEMM",
              cat("tile ", tile_name(plan.tile), " is not compiled for ", plan.describe()));
}

template <class Op>
void launch_op(Context& ctx, const Plan& plan, const BufferList& reads, const BufferList& writes) {
  const bool v = plan.vector;
  switch (plan.dtype) {
    case DType::bf16:
      return v ? launch_tiled<Op, __nv_bfloat16, TensorCoreMath, true>(ctx, plan, reads, writes)
               : launch_tiled<Op, __nv_bfloat16, TensorCoreMath, false>(ctx, plan, reads, writes);
    case DType::f16:
      return v ? launch_tiled<Op, __half, TensorCoreMath, true>(ctx, plan, reads, writes)
               : launch_tiled<Op, __half, TensorCoreMath, false>(ctx, plan, reads, writes);
    case DType::f32:
      if (plan.math == Math::exact)
        return v ? launch_tiled<Op, float, ExactMath, true>(ctx, plan, reads, writes)
                 : launch_tiled<Op, float, ExactMath, false>(ctx, plan, reads, writes);
      return v ? launch_tiled<Op, float, TensorCoreMath, true>(ctx, plan, reads, writes)
               : launch_tiled<Op, float, TensorCoreMath, false>(ctx, plan, reads, writes);
    default:
      throw Error("implicit GEMM", cat("no kernel for ", plan.describe()));
  }
}

}  // namespace fusebox::cuda::igemm
