// Row machinery shared by the layer_norm / rms_norm kernels (kernels/norm/forward.cu,
// kernels/norm/backward.cu). Include from .cu files only.
//
// A norm works on a [rows, cols] view of x (cols = product of the normalised dims).
//
// Register path. A row is held in registers by a *row group* of R threads (R a power of
// two, 4..1024): thread t of the group holds the 16-byte vectors t, t + R, ...,
// t + (V-1) R of the row (consecutive threads touch consecutive vectors, so every access
// is coalesced), V = kVecs being a template parameter so that the arrays stay in
// registers. Groups of R <= 32 threads share a warp (a block of 256 threads holds
// 256 / R groups that never synchronise with each other: their reductions are shuffles);
// a group of R > 32 threads is a whole block (its reductions cross warps through shared
// memory and one __syncthreads). The grid is persistent (as many blocks as fit on the GPU
// at once), each group walking rows group, group + groups in the grid, ... With kPrefetch
// a thread loads the next row's vectors before it reduces and writes the current one, so
// that loads stay in flight while the row is reduced (double the row's registers).
// The path needs cols % W == 0 (W = elements per vector) and 16-byte aligned pointers;
// the planners in kernels/norm/forward.cu / kernels/norm/backward.cu say whether a row fits.
//
// Long-row path (rows longer than the register path holds, unaligned data, cols not a
// multiple of W, f64): one block per row, scalar accesses, the row streamed from global
// memory once per pass (the re-reads mostly hit L2, since a block finishes its row before
// moving on).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "backends/cuda/device/block_reduce.cuh"
#include "backends/cuda/kernels/common/dtype_dispatch.cuh"
#include "backends/cuda/kernels/common/occupancy.cuh"
#include "backends/cuda/kernels/norm/tuning.h"
#include "backends/cuda/runtime/check.h"
#include "backends/cuda/runtime/device.h"

namespace fusebox::cuda::norm {

constexpr int kMaxRowThreads = 1024;  // threads per row group on the register path
constexpr int kMinRowThreads = 4;
constexpr int kSmallGroupBlock = 256;  // threads per block when groups are R <= 32 threads
constexpr int kLongRowBlock = 512;     // threads per block on the long-row path
constexpr int kMaxVecs = 8;            // 16-byte vectors per thread, at most
// The largest block a kernel is compiled for (__launch_bounds__, hence its register cap:
// 64, 128 or 255 per thread) from the registers of row data a thread holds (the rest,
// indices, statistics and temporaries, takes about 30 more). The planners never launch a
// kernel with a larger block (BoundKernel, launchable below).
constexpr int max_block_for(int data_regs) {
  return data_regs <= 32 ? 1024 : data_regs <= 64 ? 512 : 256;
}

// The statistics' type (ONNX stash_type): f64 for f64 x, f32 otherwise.
template <class T>
using stats_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// How the register path lays out a row; fast == false sends it to the long-row path.
struct RowPlan {
  bool fast = false;
  int vecs = 0;             // V: vectors per thread
  int threads_per_row = 0;  // R
  int block = 0;            // threads per block (R, or kSmallGroupBlock when R <= 32)
  bool prefetch = false;    // the next row is loaded while the current one is reduced
  bool smem_acc = false;    // backward: column accumulators in shared memory
  size_t shared_bytes = 0;  // dynamic shared memory per block
  int cluster = 1;          // backward: blocks per thread-block cluster (one partial row each)
  int max_regs = 0;         // backward: the kernel's register cap (0: the default bounds)
  int stages = 0;           // backward: rows staged in shared memory (0: not the staged path)
  unsigned grid = 0;        // persistent grid (blocks)
  int groups() const { return block / threads_per_row; }
};

// The plan as text for benchmark tables (kernels/norm/tuning.h: forward_layout).
inline std::string layout_text(const RowPlan& plan, bool backward) {
  if (!plan.fast) return "long-row";
  std::string text =
      cat("R=", plan.threads_per_row, " V=", plan.vecs, plan.prefetch ? " prefetch" : " plain",
          " grid=", plan.grid, " block=", plan.block);
  if (backward) text += cat(plan.smem_acc ? " acc=smem" : " acc=regs", " smem=", plan.shared_bytes);
  if (plan.cluster > 1) text += cat(" cluster=", plan.cluster);
  if (plan.max_regs > 0) text += cat(" regs<=", plan.max_regs);
  if (plan.stages > 0)
    text = cat("staged S=", plan.stages, " R=", plan.threads_per_row, " V=", plan.vecs,
               " grid=", plan.grid, " block=", plan.block, " smem=", plan.shared_bytes,
               plan.cluster > 1 ? cat(" cluster=", plan.cluster) : std::string());
  return text;
}

// The smallest power of two >= n, at least kMinRowThreads.
inline int64_t row_threads_for(int64_t n) {
  int64_t r = kMinRowThreads;
  while (r < n) r *= 2;
  return r;
}

// R for rows of `nvec` vectors at V vectors per thread (0 when more than kMaxRowThreads);
// V then shrinks while the same R still covers the row (fewer idle lanes on short rows).
inline void fit_row(int64_t nvec, int& vecs, int& threads) {
  const int64_t r = row_threads_for((nvec + vecs - 1) / vecs);
  if (r > kMaxRowThreads) {
    threads = 0;
    return;
  }
  while (vecs > 1 && r * (vecs / 2) >= nvec) vecs /= 2;
  threads = int(r);
}

// A 16-byte vector of T held as four 32-bit words, so that 2-byte elements stay packed
// two to a register (an array of __nv_bfloat16 values tends to take one register each,
// which doubles the registers a row needs). Element and word indices must be
// compile-time constants after unrolling, so that the words stay in registers.
struct Packed {
  uint32_t word[4];
};

// Loads: ordinary (through L1), read-only (scale, bias: every row reads them), streaming
// (x and dy, read once: evict first, keep L2 for what is reused).
template <class T>
__device__ __forceinline__ Packed load_packed(const T* p, int64_t i) {
  const uint4 u = reinterpret_cast<const uint4*>(p)[i];
  return {{u.x, u.y, u.z, u.w}};
}
template <class T>
__device__ __forceinline__ Packed load_packed_ro(const T* p, int64_t i) {
  const uint4 u = __ldg(reinterpret_cast<const uint4*>(p) + i);
  return {{u.x, u.y, u.z, u.w}};
}
template <class T>
__device__ __forceinline__ Packed load_packed_stream(const T* p, int64_t i) {
  const uint4 u = __ldcs(reinterpret_cast<const uint4*>(p) + i);
  return {{u.x, u.y, u.z, u.w}};
}
// Stores of outputs written once (y, dx): streaming (evict first).
template <class T>
__device__ __forceinline__ void store_packed_stream(T* p, int64_t i, const Packed& v) {
  __stcs(reinterpret_cast<uint4*>(p) + i, make_uint4(v.word[0], v.word[1], v.word[2], v.word[3]));
}

// Element e (of kVecWidth<T>) as f32.
template <class T>
__device__ __forceinline__ float unpack(const Packed& v, int e) {
  if constexpr (std::is_same_v<T, float>) {
    return __uint_as_float(v.word[e]);
  } else {
    const uint32_t u = v.word[e / 2];
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      return __uint_as_float(e % 2 ? (u & 0xffff0000u) : (u << 16));
    } else {
      __half2 h;
      static_assert(sizeof h == sizeof u);
      memcpy(&h, &u, sizeof u);
      return e % 2 ? __high2float(h) : __low2float(h);
    }
  }
}

// Rounds (to nearest even) kVecWidth<T> values into a vector.
template <class T>
__device__ __forceinline__ Packed pack(const float (&f)[kVecWidth<T>]) {
  Packed v;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (std::is_same_v<T, float>) {
      v.word[i] = __float_as_uint(f[i]);
    } else {
      uint32_t u;
      if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
        memcpy(&u, &h, sizeof u);
      } else {
        const __half2 h = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
        memcpy(&u, &h, sizeof u);
      }
      v.word[i] = u;
    }
  }
  return v;
}

// The W elements [i * W, (i + 1) * W) of U, as f32, where W is the width of x's vectors
// (kVecWidth<T>) and U may be wider or narrower than T (the norms' mixed form: f32 scale
// and bias for bf16 x, a bf16 y for f32 x): 16-byte accesses where the W elements of U
// take 16 or 32 bytes, one 8-byte access where they take 8. Base pointers are 16-byte
// aligned (the host checks), so every access is aligned.
template <class U, int W>
__device__ __forceinline__ void load_elems_ro(const U* p, int64_t i, float (&f)[W]) {
  constexpr int kBytes = W * int(sizeof(U));
  if constexpr (kBytes % kVecBytes == 0) {
    constexpr int kChunks = kBytes / kVecBytes, kPer = kVecWidth<U>;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const Packed v = load_packed_ro(p, i * kChunks + c);
#pragma unroll
      for (int e = 0; e < kPer; ++e) f[c * kPer + e] = unpack<U>(v, e);
    }
  } else {
    static_assert(kBytes == 8, "8, 16 or 32 bytes of elements per vector");
    const uint2 u = __ldg(reinterpret_cast<const uint2*>(p) + i);
    const Packed v{{u.x, u.y, 0u, 0u}};
#pragma unroll
    for (int e = 0; e < W; ++e) f[e] = unpack<U>(v, e);
  }
}
// Rounds W values to U and stores them at elements [i * W, (i + 1) * W), streaming.
template <class U, int W>
__device__ __forceinline__ void store_elems_stream(U* p, int64_t i, const float (&f)[W]) {
  constexpr int kBytes = W * int(sizeof(U)), kPer = kVecWidth<U>;
  if constexpr (kBytes % kVecBytes == 0) {
    constexpr int kChunks = kBytes / kVecBytes;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      float part[kPer];
#pragma unroll
      for (int e = 0; e < kPer; ++e) part[e] = f[c * kPer + e];
      store_packed_stream(p, i * kChunks + c, pack<U>(part));
    }
  } else {
    static_assert(kBytes == 8, "8, 16 or 32 bytes of elements per vector");
    float part[kPer] = {};
#pragma unroll
    for (int e = 0; e < W; ++e) part[e] = f[e];
    const Packed v = pack<U>(part);
    __stcs(reinterpret_cast<uint2*>(p) + i, make_uint2(v.word[0], v.word[1]));
  }
}

// Vector of ones (the scale when there is none).
template <class T>
__device__ __forceinline__ Packed ones_packed() {
  float f[kVecWidth<T>];
#pragma unroll
  for (int w = 0; w < kVecWidth<T>; ++w) f[w] = 1.0f;
  return pack<T>(f);
}

// Shared memory of group_sum: two buffers (alternate calls use alternate ones, so one
// barrier per call suffices) of N values per warp.
template <int N>
struct SumSlots {
  float v[2][N][32];
};

// Sums each v[i] over the R threads of the caller's row group; every thread of the group
// gets the same result. R <= 32: xor shuffles within the group (every lane of the warp
// must call, all with the same R). R > 32: the group is the whole block (every thread must
// call); warp sums go through `slots`, buffer `parity`, which must alternate between
// consecutive calls (a fast warp may write the next call's buffer while a slow one still
// reads this one). R > 32 with several groups per block (blockDim.x a multiple of R): every
// thread of the block still calls (one barrier for all groups); each group reads its own
// warps' slots. The order of additions is fixed: deterministic.
template <int N>
__device__ __forceinline__ void group_sum(float (&v)[N], SumSlots<N>& slots, int threads_per_row,
                                          int parity) {
  if (threads_per_row <= 32) {
    for (int offset = threads_per_row / 2; offset > 0; offset /= 2) {
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] += __shfl_xor_sync(kFullWarpMask, v[i], offset);
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = warp_sum(v[i]);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) slots.v[parity][i][warp] = v[i];
  }
  __syncthreads();
  const int warps = threads_per_row / 32;
  const int first = (warp / warps) * warps;  // the group's first warp
#pragma unroll
  for (int i = 0; i < N; ++i) {
    v[i] = warp_sum(lane < warps ? slots.v[parity][i][first + lane] : 0.0f);
  }
}

// The launch checks (kernels/common/occupancy.cuh) under their old names here.
using cuda::BoundKernel;
using cuda::kernel_limits;
using cuda::KernelLimits;
using cuda::kMaxSpillBytes;
using cuda::kUnbounded;
using cuda::launchable;
using cuda::persistent_cluster_grid;
using cuda::persistent_grid;
using cuda::spill_free;

// The element pointer of vector i (of width W) holds 16-byte aligned data when the base
// pointer does; the host checks every base pointer.
inline bool aligned16(const void* p) {
  return p == nullptr || is_aligned(p, kVecBytes);
}

}  // namespace fusebox::cuda::norm
