// Warp and block reductions for the CUDA kernels (include from .cu files only).
//
//   warp_reduce(v, op)          every lane of the warp gets op over the 32 lanes' v
//   warp_sum(v) / warp_max(v)
//   block_reduce(v, op, ident)  every thread of the block gets op over all threads' v;
//   block_sum(v) / block_max(v) must be reached by every thread of the block; uses 32
//                               elements of static shared memory, which consecutive calls
//                               reuse safely (each call synchronises before writing)
//
// Algorithm: butterfly shuffles (xor 16, 8, 4, 2, 1) within each warp, so every lane ends
// with the result; for a block, lane 0 of each warp writes its warp's result to shared
// memory, then every warp reduces those (at most 32) values the same way. The order of
// operations is fixed, so results are deterministic run to run.
#pragma once

#include <cfloat>

namespace fusebox::cuda {

constexpr unsigned kFullWarpMask = 0xffffffffu;

struct SumOp {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};
// fmaxf-style max that propagates NaN (as the CPU reduce_max and max op do).
struct MaxOp {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return (a > b || a != a) ? a : b;
  }
};

template <class T, class Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    v = op(v, __shfl_xor_sync(kFullWarpMask, v, offset));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  return warp_reduce(v, SumOp{});
}
__device__ __forceinline__ float warp_max(float v) {
  return warp_reduce(v, MaxOp{});
}

// `identity` is op's neutral element (0 for a sum, -inf for a max): warps past the
// block's last one contribute it. blockDim.x must be a multiple of 32.
template <class T, class Op>
__device__ __forceinline__ T block_reduce(T v, Op op, T identity) {
  __shared__ T warp_results[32];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = (blockDim.x + 31) / 32;
  v = warp_reduce(v, op);
  __syncthreads();  // a previous call through this site may still be reading warp_results
  if (lane == 0) warp_results[warp] = v;
  __syncthreads();
  v = lane < warps ? warp_results[lane] : identity;
  return warp_reduce(v, op);
}

__device__ __forceinline__ float block_sum(float v) {
  return block_reduce(v, SumOp{}, 0.0f);
}
__device__ __forceinline__ float block_max(float v) {
  return block_reduce(v, MaxOp{}, -INFINITY);
}

}  // namespace fusebox::cuda
