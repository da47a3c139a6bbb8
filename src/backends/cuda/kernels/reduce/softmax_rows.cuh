// Row statistics for softmax, log_softmax and cross_entropy (include from .cu files only).
//
// A row is `len` elements of x at stride `stride` (1 for the last axis, `inner` for
// another axis). For a row, in the compute type C (f32, or f64 for f64 tensors):
//   m   = max(row), NaN if any element is NaN; all -inf is replaced by 0, which keeps
//         row - m free of inf - inf (the row comes out NaN through lse = -inf); a +inf by
//         NaN: the whole row is NaN, as PyTorch's and onnxruntime's (the CPU backend's rule)
//   lse = log(sum(exp(row - m)))
// so that log_softmax = row - m - lse and softmax = exp(row - m - lse). The variants, by
// who walks the row: a whole warp (lanes strided by 32), a whole block (threads strided by
// blockDim.x; every thread of the block must call it; in one read of the row: the online
// form), or one thread; and the column tiles of a block.
#pragma once

#include "backends/cuda/device/block_reduce.cuh"
#include "backends/cuda/kernels/common/dtype_dispatch.cuh"

namespace fusebox::cuda {

template <class C>
struct RowStats {
  C max;
  C lse;
};

template <class C>
__device__ __forceinline__ C softmax_shift(C m) {
  if (m == C(INFINITY)) return C(NAN);
  return m == C(-INFINITY) ? C(0) : m;
}

// Elements first, first + step, ... of the row, folded with `step` lanes/threads.
template <class C, class T>
__device__ __forceinline__ C partial_max(const T* row, int64_t len, int64_t stride, int first,
                                         int step) {
  C m = C(-INFINITY);
  for (int64_t j = first; j < len; j += step) m = MaxOp{}(m, convert<C>(row[j * stride]));
  return m;
}
template <class C, class T>
__device__ __forceinline__ C partial_sum_exp(const T* row, int64_t len, int64_t stride, C m,
                                             int first, int step) {
  C s = C(0);
  for (int64_t j = first; j < len; j += step) s += dm::exp(convert<C>(row[j * stride]) - m);
  return s;
}

template <class C, class T>
__device__ __forceinline__ RowStats<C> warp_row_stats(const T* row, int64_t len, int64_t stride) {
  const int lane = threadIdx.x % 32;
  const C m = softmax_shift(warp_reduce(partial_max<C>(row, len, stride, lane, 32), MaxOp{}));
  const C s = warp_reduce(partial_sum_exp<C>(row, len, stride, m, lane, 32), SumOp{});
  return {m, dm::log(s)};
}

template <class C, class T>
__device__ __forceinline__ RowStats<C> block_row_stats(const T* row, int64_t len, int64_t stride) {
  const C m = softmax_shift(block_reduce(partial_max<C>(row, len, stride, threadIdx.x, blockDim.x),
                                         MaxOp{}, C(-INFINITY)));
  const C s =
      block_reduce(partial_sum_exp<C>(row, len, stride, m, threadIdx.x, blockDim.x), SumOp{}, C(0));
  return {m, dm::log(s)};
}

template <class C, class T>
__device__ __forceinline__ RowStats<C> thread_row_stats(const T* row, int64_t len, int64_t stride) {
  const C m = softmax_shift(partial_max<C>(row, len, stride, 0, 1));
  return {m, dm::log(partial_sum_exp<C>(row, len, stride, m, 0, 1))};
}

// block_row_stats in one read of the row (16-byte loads where the row is aligned): each
// thread keeps a running max and the sum of exp relative to it, rescaling the sum when the
// max grows (the online softmax); the block merges the threads' pairs in a fixed order
// (butterflies within warps, then every warp over the warps' pairs), so every thread gets
// the same result, run to run. m and lse as block_row_stats' up to rounding, NaN and the
// infinities by its rules. Every thread of the block must call it.
template <class C>
struct RunningSum {
  C max, sum;
};

template <class C>
__device__ __forceinline__ RunningSum<C> running_add(RunningSum<C> a, C x) {
  if (x != x || a.max != a.max) return {x != x ? x : a.max, a.sum};  // a NaN stays
  if (x > a.max) return {x, (a.max == C(-INFINITY) ? C(0) : a.sum * dm::exp(a.max - x)) + C(1)};
  if (x == C(-INFINITY)) return a;
  return {a.max, a.sum + dm::exp(x - a.max)};
}

template <class C>
__device__ __forceinline__ RunningSum<C> running_merge(RunningSum<C> a, RunningSum<C> b) {
  if (a.max != a.max) return a;
  if (b.max != b.max) return b;
  const C m = a.max > b.max ? a.max : b.max;
  if (m == C(-INFINITY)) return {m, C(0)};
  const C from_a = a.max == C(-INFINITY) ? C(0) : a.sum * dm::exp(a.max - m);
  const C from_b = b.max == C(-INFINITY) ? C(0) : b.sum * dm::exp(b.max - m);
  return {m, from_a + from_b};
}

template <class C>
__device__ __forceinline__ RunningSum<C> warp_running_merge(RunningSum<C> r) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    r = running_merge(r, {__shfl_xor_sync(kFullWarpMask, r.max, offset),
                          __shfl_xor_sync(kFullWarpMask, r.sum, offset)});
  return r;
}

template <class C, class T>
__device__ __forceinline__ RowStats<C> block_row_stats_online(const T* row, int64_t len) {
  RunningSum<C> r{C(-INFINITY), C(0)};
  int64_t tail = 0;
  if (is_aligned(row, kVecBytes)) {
    const int64_t vecs = len / kVecWidth<T>;
    for (int64_t k = threadIdx.x; k < vecs; k += blockDim.x) {
      const Vec<T> v = load_vec(row, k);
#pragma unroll
      for (int e = 0; e < kVecWidth<T>; ++e) r = running_add(r, convert<C>(v.v[e]));
    }
    tail = vecs * kVecWidth<T>;
  }
  for (int64_t j = tail + threadIdx.x; j < len; j += blockDim.x)
    r = running_add(r, convert<C>(row[j]));
  __shared__ C maxes[32], sums[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  r = warp_running_merge(r);
  __syncthreads();  // the previous call's readers are done with the arrays
  if (lane == 0) {
    maxes[warp] = r.max;
    sums[warp] = r.sum;
  }
  __syncthreads();
  r = lane < warps ? RunningSum<C>{maxes[lane], sums[lane]} : RunningSum<C>{C(-INFINITY), C(0)};
  r = warp_running_merge(r);
  return {softmax_shift(r.max), dm::log(r.sum)};
}

// The statistics of the rows of 32 adjacent columns (lane l: the row of column i0 + l, at
// `row` for this lane, elements `stride` apart) walked by the whole block: warp w folds
// elements w, w + warps, ... of its lane's row (a warp reads 32 adjacent elements at a time),
// then warp 0 folds the warps' partials in warp order (deterministic). `valid`: this lane's
// row exists. Every thread of the block must call it; `scratch` holds blockDim.x + 64 C in
// shared memory and is free again when it returns.
template <class C, class T>
__device__ __forceinline__ RowStats<C> column_tile_stats(const T* row, int64_t len, int64_t stride,
                                                         bool valid, C* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  C* folded = scratch + blockDim.x;  // [0, 32): the maxima, [32, 64): the sums
  scratch[threadIdx.x] = valid ? partial_max<C>(row, len, stride, warp, warps) : C(-INFINITY);
  __syncthreads();
  if (warp == 0) {
    C m = scratch[lane];
    for (int w = 1; w < warps; ++w) m = MaxOp{}(m, scratch[w * 32 + lane]);
    folded[lane] = softmax_shift(m);
  }
  __syncthreads();
  const C m = folded[lane];
  scratch[threadIdx.x] = valid ? partial_sum_exp<C>(row, len, stride, m, warp, warps) : C(0);
  __syncthreads();
  if (warp == 0) {
    C sum = scratch[lane];
    for (int w = 1; w < warps; ++w) sum += scratch[w * 32 + lane];
    folded[32 + lane] = sum;
  }
  __syncthreads();
  const C sum = folded[32 + lane];
  __syncthreads();  // every lane has its sum before the next call writes scratch
  return {m, dm::log(sum)};
}

// How a softmax-like kernel walks x viewed as [outer, len, inner]: the row of (o, i) starts
// at o * len * inner + i with stride inner.
enum class RowWalk { warp, block, thread };

// Warp per row for the last axis up to 1024 elements, block per row beyond; one thread per
// row when the axis is not the last (threads of a warp then read adjacent columns).
inline RowWalk pick_row_walk(int64_t len, int64_t inner) {
  if (inner > 1) return RowWalk::thread;
  return len <= 1024 ? RowWalk::warp : RowWalk::block;
}

}  // namespace fusebox::cuda
