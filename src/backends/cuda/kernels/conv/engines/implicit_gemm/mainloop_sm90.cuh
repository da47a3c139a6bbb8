// The Hopper main loop (sm_90a): the same index maps and loaders as mainloop.cuh, with the
// multiply on wgmma. For K-major operands only (fprop; dgrad with its filter transposed), 16-bit
// types, channel counts on the vector path. One CTA: 128 x BN of C, two warpgroups of 64 rows.
//
//   1. All 256 threads load K tiles of 64 (128-byte rows) into kStages stages with cp.async,
//      in the 128-byte-swizzled layout wgmma's descriptors read (mainloop.cuh's swizzle with
//      8 chunks per row is exactly that layout).
//   2. Per K tile each warpgroup issues four m64 x BN x k16 wgmmas from shared memory (A rows
//      64 wg .. 64 wg + 63, all of B); one tile's wgmmas stay in flight while the next tile's
//      are issued, loads run kStages - 2 tiles ahead.
//   3. The epilogue stages the f32 tile in shared memory and writes 16-byte chunks of 8
//      channels (Epilogue::store8).
#pragma once

#include "backends/cuda/device/wgmma.cuh"
#include "backends/cuda/kernels/conv/engines/implicit_gemm/mainloop.cuh"

namespace fusebox::cuda::igemm {

constexpr int kSm90TileM = 128, kSm90TileK = 64, kSm90Stages = 4, kSm90Threads = 256;

template <class T, int BN>
constexpr size_t sm90_shared_bytes() {
  return size_t(kSm90Stages) * size_t(kSm90TileM + BN) * kSm90TileK * sizeof(T);
}

template <class Op, class T, int BN>
__global__ void __launch_bounds__(kSm90Threads, 1)
    conv_kernel_sm90(const __grid_constant__ Params p) {
  constexpr int BM = kSm90TileM, BK = kSm90TileK, kStages = kSm90Stages;
  static_assert(Op::A::kKMajor && Op::B::kKMajor, "wgmma reads K-major tiles here");
  using LoaderA = TileLoader<typename Op::A, T, BM, BK, kSm90Threads, true>;
  using LoaderB = TileLoader<typename Op::B, T, BN, BK, kSm90Threads, true>;
  extern __shared__ __align__(1024) unsigned char smem_sm90[];  // no static shared memory
  T* sA = reinterpret_cast<T*>(smem_sm90);
  T* sB = sA + kStages * LoaderA::kSize;  // stage sizes are multiples of 1024 bytes

  const Cta cta = Op::template cta<BK>(p, int(blockIdx.y), int(blockIdx.z));
  const int tile_m0 = int(blockIdx.x / unsigned(p.tiles_n)) * BM;
  const int tile_n0 = int(blockIdx.x % unsigned(p.tiles_n)) * BN;
  if (tile_m0 >= cta.m) return;

  const LoaderA load_a(p, cta, static_cast<const T*>(Op::a_source(p)), tile_m0);
  const LoaderB load_b(p, cta, static_cast<const T*>(Op::b_source(p)), tile_n0);
  const int k_tiles = max(0, (cta.k_end - cta.k_begin + BK - 1) / BK);
  // Loads run kLookahead tiles ahead and one wgmma group stays in flight: the stage a load
  // refills was last read by the wgmmas of tile kt - 2, which wgmma_wait<1> in iteration kt - 1
  // retired before this iteration's barrier.
  constexpr int kLookahead = kStages - 2;
#pragma unroll
  for (int s = 0; s < kLookahead; ++s) {
    if (s < k_tiles) {
      load_a.load(p, cta, sA + s * LoaderA::kSize, cta.k_begin + s * BK);
      load_b.load(p, cta, sB + s * LoaderB::kSize, cta.k_begin + s * BK);
    }
    cp_async_commit();
  }

  const int warpgroup = int(threadIdx.x) / 128;
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<kLookahead - 1>();  // tile kt has landed (this thread's part)
    fence_proxy_async();              // ... and is visible to wgmma's reads
    __syncthreads();                  // ... everyone's
    const int next = kt + kLookahead;
    if (next < k_tiles) {
      const int s = next % kStages;
      load_a.load(p, cta, sA + s * LoaderA::kSize, cta.k_begin + next * BK);
      load_b.load(p, cta, sB + s * LoaderB::kSize, cta.k_begin + next * BK);
    }
    cp_async_commit();
    const int s = kt % kStages;
    const T* a = sA + s * LoaderA::kSize + warpgroup * 64 * BK;
    const T* b = sB + s * LoaderB::kSize;
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < BK; k += 16)
      wgmma_m64k16<T, BN>(acc, wgmma_descriptor_sw128(a + k), wgmma_descriptor_sw128(b + k));
    wgmma_commit();
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
  cp_async_wait<0>();

  // Epilogue through shared memory (the stages are free now): the f32 tile is staged row by
  // row, then each thread finishes 8 consecutive channels of a row and writes them as one
  // 16-byte store (bias, activation, residual as Epilogue::store; C/g and K/g are multiples of
  // 8 on this path, so a chunk is in range entirely or not at all).
  constexpr int kRowStride = BN + 4;  // floats; the padding spreads the fragment writes
  float* staged = reinterpret_cast<float*>(smem_sm90);
  __syncthreads();  // every warpgroup is done reading the stages
  {
    const int warp = (int(threadIdx.x) / 32) % 4, lane = int(threadIdx.x) % 32;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float* row = staged + (warpgroup * 64 + warp * 16 + g + h * 8) * kRowStride;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
        *reinterpret_cast<float2*>(row + j * 8 + 2 * t) =
            make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
    }
  }
  __syncthreads();
  constexpr int kChunks = BN / 8;  // per row
  const Epilogue<Op, T> epilogue(p, cta);
  for (int i = int(threadIdx.x); i < BM * kChunks; i += kSm90Threads) {
    const int r = i / kChunks, n0 = tile_n0 + (i % kChunks) * 8;
    const int64_t row = Op::row_offset(p, cta, tile_m0 + r);
    if (row < 0 || n0 >= cta.n) continue;
    const float* v = staged + r * kRowStride + (i % kChunks) * 8;
    epilogue.store8(row, n0, v);
  }
}

}  // namespace fusebox::cuda::igemm
