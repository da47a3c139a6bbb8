// Row machinery shared by the layer_norm / rms_norm kernels (norm.cu, norm_backward.cu).
// Include from .cu files only.
//
// A norm works on a [rows, cols] view of x (cols = product of the normalised dims).
//
// Register path. A row is held in registers by a *row group* of R threads (R a power of
// two, 32..512): thread t of the group holds the 16-byte vectors t, t + R, ...,
// t + (V-1) R of the row (consecutive threads touch consecutive vectors, so every load
// is coalesced), V = kVecs being a template parameter so that the arrays stay in
// registers. A block holds G = blockDim.x / R groups. The groups of a block walk the
// rows in lockstep (row = base + group, base += gridDim.x * G) so that they can share
// __syncthreads; the grid is persistent (about as many blocks as fit on the GPU at once).
// The path needs cols % W == 0 (W = elements per vector) and 16-byte aligned pointers;
// plan_rows() says whether a row fits.
//
// Long-row path (rows longer than the register path holds, unaligned data, cols not a
// multiple of W, f64): one block per row, scalar accesses, the row streamed from global
// memory once per pass (the re-reads mostly hit L2, since a block finishes its row before
// moving on).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backends/cuda/block_reduce.cuh"
#include "backends/cuda/check.h"
#include "backends/cuda/device_math.cuh"

namespace fusebox::cuda::norm {

constexpr int kMaxRowThreads = 512;  // threads per row group and per block on the register path
constexpr int kMinBlock = 256;
// Blocks of kMaxRowThreads the register path asks to fit on one SM (__launch_bounds__):
// two (at most 64 registers per thread) when a thread's share of the row is at most 64
// bytes, so that while one block reduces its row the other's loads are in flight; one
// when it holds more (f32 rows of 16K elements), which 64 registers cannot hold unspilled.
constexpr int min_blocks_per_sm(int row_bytes_per_thread) {
  return row_bytes_per_thread <= 64 ? 2 : 1;
}  // a block of small row groups holds several rows
constexpr int kLongRowBlock = 512;  // threads per block on the long-row path
// Values a thread holds on the register path: preferably 16, at most 32 (so rows of up to
// 512 x 32 = 16,384 elements). Forward: the row in its own type. Backward: x and dy in
// their own type plus one or two f32 accumulators per element (dscale, dbias), which fits
// 128 registers for 32 values of a 2-byte type but only 16 of f32.
constexpr int kPreferredElems = 16;
constexpr int kMaxForwardElems = 32;
template <class T>
constexpr int kMaxBackwardElems = sizeof(T) == 2 ? 32 : 16;

// The statistics' type (ONNX stash_type): f64 for f64 x, f32 otherwise.
template <class T>
using stats_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// How the register path lays out a row; fast == false sends it to the long-row path.
struct RowPlan {
  bool fast = false;
  int vecs = 0;             // V: vectors per thread
  int threads_per_row = 0;  // R
  int block = 0;            // threads per block (a multiple of R)
  int groups() const { return block / threads_per_row; }
};

// Lays out rows of `cols` elements in vectors of `width` elements. A thread preferably
// holds `preferred_elems` elements (enough independent loads in flight, while keeping
// registers low enough for several rows per SM), more (up to `max_elems`) only when the
// row needs them to fit kMaxRowThreads threads. R is the smallest power of two >= 32 that
// covers the row with V vectors per thread; then V halves while the halved count still
// covers the row with the same R (fewer idle lanes on short rows).
inline RowPlan plan_rows(int64_t cols, int width, int preferred_elems, int max_elems,
                         bool aligned) {
  RowPlan plan;
  if (!aligned || width < 2 || cols % width != 0) return plan;
  const int64_t nvec = cols / width;
  int vecs = std::max(1, preferred_elems / width);
  while (int64_t(kMaxRowThreads) * vecs < nvec && vecs * 2 * width <= max_elems) vecs *= 2;
  int64_t threads = 32;
  while (threads * vecs < nvec) threads *= 2;
  if (threads > kMaxRowThreads) return plan;
  while (vecs > 1 && threads * (vecs / 2) >= nvec) vecs /= 2;
  plan.fast = true;
  plan.vecs = vecs;
  plan.threads_per_row = int(threads);
  plan.block = std::max<int>(int(threads), kMinBlock);
  return plan;
}

// A 16-byte vector of T held as four 32-bit words, so that 2-byte elements stay packed
// two to a register (an array of __nv_bfloat16 values tends to take one register each,
// which doubles the registers a row needs). Element and word indices must be
// compile-time constants after unrolling, so that the words stay in registers.
struct Packed {
  uint32_t word[4];
};

template <class T>
__device__ __forceinline__ Packed load_packed(const T* p, int64_t i) {
  const uint4 u = reinterpret_cast<const uint4*>(p)[i];
  return {{u.x, u.y, u.z, u.w}};
}

template <class T>
__device__ __forceinline__ void store_packed(T* p, int64_t i, const Packed& v) {
  reinterpret_cast<uint4*>(p)[i] = make_uint4(v.word[0], v.word[1], v.word[2], v.word[3]);
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

// Blocks for a persistent grid over `work_items` items (rows or row groups): as many as
// fit on the device at once (from the occupancy calculator), never more than items.
template <class Kernel>
unsigned persistent_grid(Kernel kernel, int block, size_t shared_bytes, int sm_count,
                         int64_t work_items) {
  int per_sm = 0;
  FUSEBOX_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &per_sm, reinterpret_cast<const void*>(kernel), block, shared_bytes));
  const int64_t resident = int64_t(std::max(per_sm, 1)) * sm_count;
  return unsigned(std::clamp<int64_t>(work_items, 1, resident));
}

// Sums each v[i] over the R threads of each row group (R = 32 << k, the groups being
// consecutive runs of R threads). Every thread of the block calls it, with the same R;
// `slots` is shared memory of 32 * N floats. Deterministic: a fixed shuffle tree within
// each warp, then one over the group's warp results.
template <int N>
__device__ __forceinline__ void group_sum(float (&v)[N], float* slots, int threads_per_row) {
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = warp_sum(v[i]);
  if (threads_per_row == 32) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warps_per_group = threads_per_row / 32;
  const int first = warp / warps_per_group * warps_per_group;
  __syncthreads();  // the previous call's readers are done with the slots
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) slots[i * 32 + warp] = v[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i) {
    v[i] = warp_sum(lane < warps_per_group ? slots[i * 32 + first + lane] : 0.0f);
  }
}

// The element pointer of vector i (of width W) holds 16-byte aligned data when the base
// pointer does; the host checks every base pointer.
inline bool aligned16(const void* p) {
  return p == nullptr || is_aligned(p, kVecBytes);
}

// Sums per-block partial rows: out[j] = sum over p < parts of partial[p * cols + j], in
// order p = ty, ty + 8, ... per thread row ty, then the 8 thread rows in order: the same
// result every run. Block (32, 8), grid ceil(cols / 32).
template <class A, class O>
__global__ void sum_partial_rows(const A* partial, int64_t parts, int64_t cols, O* out) {
  __shared__ A part[8][33];
  const int64_t j = int64_t(blockIdx.x) * 32 + threadIdx.x;
  A s = 0;
  if (j < cols) {
    for (int64_t p = threadIdx.y; p < parts; p += 8) s += partial[p * cols + j];
  }
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
    A total = 0;
#pragma unroll
    for (int y = 0; y < 8; ++y) total += part[y][threadIdx.x];
    out[j] = convert<O>(total);
  }
}

}  // namespace fusebox::cuda::norm
