// The implicit-GEMM main loop shared by fprop, dgrad and wgrad (operands.cuh gives each op's
// index maps; plan.h chooses the tile). One CTA computes a BM x BN tile of C = A B:
//
//   1. Each thread owns fixed chunks of the A and B tiles (TileLoader): it computes the
//      coordinates that stay fixed over the K loop once, the moving ones per K tile.
//   2. K tiles stream through kStages shared-memory stages with cp.async (16 bytes, zero
//      fill for padding and edges), kStages - 1 tiles in flight while one is multiplied.
//      Odd channel counts use element loads into the same stages (the scalar path).
//   3. Each warp multiplies its WM x WN part with mma.sync (bf16 / f16 m16n8k16; TF32
//      m16n8k8 for f32), fragments read with ldmatrix (.trans for M/N-major operands);
//      exact f32 runs multiply-adds on the same fragment layout (tests' reference mode).
//   4. Epilogue: bias, activation, residual, residual activation on the f32 accumulators,
//      then one rounding into the output (or f32 partial sums for wgrad's K splits).
//
// Shared memory: a tile is stored [outer][inner] (inner the operand's contiguous dim) with
// its 16-byte chunks XOR-swizzled by row, so that ldmatrix's eight row reads and cp.async's
// row writes hit distinct banks.
#pragma once

#include "backends/common/activation.h"
#include "backends/cuda/device/math.cuh"
#include "backends/cuda/device/mma.cuh"
#include "backends/cuda/kernels/conv/engines/implicit_gemm/operands.cuh"

namespace fusebox::cuda::igemm {

template <int BM_, int BN_, int BK_, int WM_, int WN_, int STAGES_>
struct Tile {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_, kStages = STAGES_;
  static constexpr int kWarpsM = BM / WM, kWarpsN = BN / WN;
  static constexpr int kThreads = kWarpsM * kWarpsN * 32;
};

struct TensorCoreMath {};  // mma.sync: bf16 / f16, TF32 for f32
struct ExactMath {};       // f32 multiply-adds

// Offset of element (outer, inner) of a [outer][INNER] tile of T.
template <class T, int INNER>
__device__ __forceinline__ int swizzle(int outer, int inner) {
  constexpr int E = 16 / int(sizeof(T));  // elements per chunk
  constexpr int kChunks = INNER / E;      // chunks per row
  int x = 0;
  if constexpr (kChunks >= 8)
    x = outer & 7;
  else if constexpr (kChunks == 4)
    x = (outer >> 1) & 3;
  else if constexpr (kChunks == 2)
    x = (outer >> 2) & 1;
  return outer * INNER + ((inner / E) ^ x) * E + inner % E;
}

// Loads one operand's tiles: EXTENT rows of M (A) or N (B), BK of K.
template <class Operand, class T, int EXTENT, int BK, int THREADS, bool kVec>
struct TileLoader {
  static constexpr bool kKMajor = Operand::kKMajor;
  static constexpr int V = kVec ? 16 / int(sizeof(T)) : 1;
  static constexpr int kOuter = kKMajor ? EXTENT : BK;
  static constexpr int kInner = kKMajor ? BK : EXTENT;
  static constexpr int kChunksPerRow = kInner / V;
  static_assert(THREADS % kChunksPerRow == 0, "a thread's chunks share one inner offset");
  static constexpr int kRowsPerPass = THREADS / kChunksPerRow;
  static_assert(kOuter % kRowsPerPass == 0, "the tile is a whole number of passes");
  static constexpr int kPasses = kOuter / kRowsPerPass;
  static constexpr int kSize = kOuter * kInner;  // elements per stage

  const T* src;
  int inner, outer0;
  typename Operand::Fixed fixed[kKMajor ? kPasses : 1];

  __device__ TileLoader(const Params& p, const Cta& cta, const T* source, int tile0)
      : src(source), inner((threadIdx.x % kChunksPerRow) * V), outer0(threadIdx.x / kChunksPerRow) {
    if constexpr (kKMajor) {
#pragma unroll
      for (int i = 0; i < kPasses; ++i)
        fixed[i] = Operand::fixed(p, cta, tile0 + outer0 + i * kRowsPerPass);
    } else {
      fixed[0] = Operand::fixed(p, cta, tile0 + inner);
    }
  }

  // K tile [k0, k0 + BK) into `stage`.
  __device__ void load(const Params& p, const Cta& cta, T* stage, int k0) const {
    if constexpr (kKMajor) {
      const typename Operand::Moving v = Operand::moving(p, cta, k0 + inner);
#pragma unroll
      for (int i = 0; i < kPasses; ++i)
        copy(stage, outer0 + i * kRowsPerPass, Operand::offset(p, fixed[i], v));
    } else {
#pragma unroll
      for (int i = 0; i < kPasses; ++i) {
        const int row = outer0 + i * kRowsPerPass;
        copy(stage, row, Operand::offset(p, fixed[0], Operand::moving(p, cta, k0 + row)));
      }
    }
  }

  __device__ void copy(T* stage, int row, int64_t offset) const {
    T* dst = stage + swizzle<T, kInner>(row, inner);
    if constexpr (kVec)
      cp_async_16(dst, src + (offset < 0 ? 0 : offset), offset >= 0);
    else
      *dst = offset >= 0 ? src[offset] : T(0.0f);
  }
};

// One warp's WM x WN accumulators and the multiply of one K tile into them.
template <class T, class Math, class Tl, bool kAKMajor, bool kBKMajor>
struct WarpTile {
  static constexpr int MI = Tl::WM / 16, NI = Tl::WN / 8;
  static_assert(NI % 2 == 0, "ldmatrix.x4 loads B fragments in pairs");
  float acc[MI][NI][4];

  __device__ WarpTile() {
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NI; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
  }

  __device__ static int a_at(int m, int k) {
    return kAKMajor ? swizzle<T, Tl::BK>(m, k) : swizzle<T, Tl::BM>(k, m);
  }
  __device__ static int b_at(int n, int k) {
    return kBKMajor ? swizzle<T, Tl::BK>(n, k) : swizzle<T, Tl::BN>(k, n);
  }

  __device__ void multiply(const T* sA, const T* sB, int wm0, int wn0, int lane) {
    if constexpr (std::is_same_v<Math, ExactMath>) {
      multiply_exact(sA, sB, wm0, wn0, lane);
    } else if constexpr (std::is_same_v<T, float>) {
      multiply_tf32(sA, sB, wm0, wn0, lane);
    } else {
      multiply_16bit(sA, sB, wm0, wn0, lane);
    }
  }

  // mma.m16n8k16 fragments (PTX ISA): A rows g, g+8 and columns 2t, 2t+1 (+8); B columns g,
  // rows 2t, 2t+1 (+8); lane = 4g + t. ldmatrix.x4 matrix i comes from lanes 8i..8i+7.
  __device__ void multiply_16bit(const T* sA, const T* sB, int wm0, int wn0, int lane) {
    const int i = lane / 8, j = lane % 8;
#pragma unroll
    for (int kk = 0; kk < Tl::BK; kk += 16) {
      uint32_t a[MI][4], b[NI][2];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        if constexpr (kAKMajor)  // matrices: (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15,
                                 // 8-15)
          ldmatrix_x4(a[mi], sA + a_at(wm0 + mi * 16 + lane % 16, kk + (lane / 16) * 8));
        else  // stored [k][m]: the same four matrices, each read transposed
          ldmatrix_x4_trans(a[mi], sA + a_at(wm0 + mi * 16 + (i % 2) * 8, kk + j + (i / 2) * 8));
      }
#pragma unroll
      for (int np = 0; np < NI / 2; ++np) {
        uint32_t r[4];
        if constexpr (kBKMajor)  // (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k
                                 // 8-15)
          ldmatrix_x4(r, sB + b_at(wn0 + np * 16 + j + (i / 2) * 8, kk + (i % 2) * 8));
        else
          ldmatrix_x4_trans(r, sB + b_at(wn0 + np * 16 + (i / 2) * 8, kk + j + (i % 2) * 8));
        b[2 * np][0] = r[0], b[2 * np][1] = r[1];
        b[2 * np + 1][0] = r[2], b[2 * np + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) mma_16816<T>(acc[mi][ni], a[mi], b[ni]);
    }
  }

  // mma.m16n8k8.tf32: A rows g, g+8, columns t, t+4; B column g, rows t, t+4.
  __device__ void multiply_tf32(const T* sA, const T* sB, int wm0, int wn0, int lane) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int kk = 0; kk < Tl::BK; kk += 8) {
      uint32_t a[MI][4], b[NI][2];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        const int m = wm0 + mi * 16 + g, k = kk + t;
        a[mi][0] = to_tf32(sA[a_at(m, k)]);
        a[mi][1] = to_tf32(sA[a_at(m + 8, k)]);
        a[mi][2] = to_tf32(sA[a_at(m, k + 4)]);
        a[mi][3] = to_tf32(sA[a_at(m + 8, k + 4)]);
      }
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        const int n = wn0 + ni * 8 + g, k = kk + t;
        b[ni][0] = to_tf32(sB[b_at(n, k)]);
        b[ni][1] = to_tf32(sB[b_at(n, k + 4)]);
      }
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) mma_1688_tf32(acc[mi][ni], a[mi], b[ni]);
    }
  }

  // The accumulator layout of the mma (rows g, g+8; columns 2t, 2t+1), in f32 multiply-adds.
  __device__ void multiply_exact(const T* sA, const T* sB, int wm0, int wn0, int lane) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll 4
    for (int k = 0; k < Tl::BK; ++k) {
      float a[MI][2], b[NI][2];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        a[mi][0] = float(sA[a_at(wm0 + mi * 16 + g, k)]);
        a[mi][1] = float(sA[a_at(wm0 + mi * 16 + g + 8, k)]);
      }
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        b[ni][0] = float(sB[b_at(wn0 + ni * 8 + 2 * t, k)]);
        b[ni][1] = float(sB[b_at(wn0 + ni * 8 + 2 * t + 1, k)]);
      }
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
          acc[mi][ni][0] = fmaf(a[mi][0], b[ni][0], acc[mi][ni][0]);
          acc[mi][ni][1] = fmaf(a[mi][0], b[ni][1], acc[mi][ni][1]);
          acc[mi][ni][2] = fmaf(a[mi][1], b[ni][0], acc[mi][ni][2]);
          acc[mi][ni][3] = fmaf(a[mi][1], b[ni][1], acc[mi][ni][3]);
        }
    }
  }
};

// Writes accumulator values: y = residual_activation(activation(acc + bias) + residual) rounded
// into the output, or (wgrad's K splits) the raw f32 sum into the split's partial sums.
template <class Op, class T>
struct Epilogue {
  const Params& p;
  const Cta& cta;
  const T* bias;
  const T* residual;
  T* out;
  int bias0;

  __device__ Epilogue(const Params& params, const Cta& c)
      : p(params),
        cta(c),
        bias(Op::kBias ? static_cast<const T*>(params.bias) : nullptr),
        residual(static_cast<const T*>(params.residual)),
        out(static_cast<T*>(params.result)),
        bias0(Op::bias_base(params, c)) {}

  // Column n of the row at element offset `row` (Op::row_offset).
  __device__ void store(int64_t row, int n, float v) const {
    if (n >= cta.n) return;
    if (p.partial != nullptr) {
      p.partial[int64_t(cta.split) * p.partial_stride + row + n] = v;
      return;
    }
    if (bias != nullptr) v += float(load_compute(bias, bias0 + n));
    v = activate(p.activation, v);
    if (residual != nullptr)
      v = activate(p.residual_activation, v + float(load_compute(residual, row + n)));
    store_compute(out, row + n, v);
  }

  // Columns n0 .. n0 + 7 from v[0..7], one 16-byte store (16-bit T; row + n0 and the residual
  // 16-byte aligned: the vector path's C/g, K/g multiples of 8 and aligned tensors).
  __device__ void store8(int64_t row, int n0, const float* v) const {
    static_assert(sizeof(T) == 2, "8 elements of 16 bits");
    Vec<T> y, res;
    if (residual != nullptr) res = load_vec(residual + row + n0, 0);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      float x = v[e];
      if (bias != nullptr) x += float(load_compute(bias, bias0 + n0 + e));
      x = activate(p.activation, x);
      if (residual != nullptr) x = activate(p.residual_activation, x + float(res.v[e]));
      y.v[e] = convert<T>(x);
    }
    store_vec(out + row + n0, 0, y);
  }
};

template <class T, class Tl>
constexpr size_t shared_bytes() {
  return size_t(Tl::kStages) * size_t(Tl::BM + Tl::BN) * Tl::BK * sizeof(T);
}

template <class Op, class T, class Math, class Tl, bool kVec>
__global__ void __launch_bounds__(Tl::kThreads) conv_kernel(const __grid_constant__ Params p) {
  using LoaderA = TileLoader<typename Op::A, T, Tl::BM, Tl::BK, Tl::kThreads, kVec>;
  using LoaderB = TileLoader<typename Op::B, T, Tl::BN, Tl::BK, Tl::kThreads, kVec>;
  extern __shared__ __align__(128) unsigned char smem_tiles[];
  T* sA = reinterpret_cast<T*>(smem_tiles);
  T* sB = sA + Tl::kStages * LoaderA::kSize;

  const Cta cta = Op::template cta<Tl::BK>(p, int(blockIdx.y), int(blockIdx.z));
  const int tile_m0 = int(blockIdx.x / unsigned(p.tiles_n)) * Tl::BM;
  const int tile_n0 = int(blockIdx.x % unsigned(p.tiles_n)) * Tl::BN;
  if (tile_m0 >= cta.m) return;  // a dgrad phase smaller than the largest

  const LoaderA load_a(p, cta, static_cast<const T*>(Op::a_source(p)), tile_m0);
  const LoaderB load_b(p, cta, static_cast<const T*>(Op::b_source(p)), tile_n0);
  const int k_tiles = max(0, (cta.k_end - cta.k_begin + Tl::BK - 1) / Tl::BK);

#pragma unroll
  for (int s = 0; s < Tl::kStages - 1; ++s) {
    if (s < k_tiles) {
      load_a.load(p, cta, sA + s * LoaderA::kSize, cta.k_begin + s * Tl::BK);
      load_b.load(p, cta, sB + s * LoaderB::kSize, cta.k_begin + s * Tl::BK);
    }
    cp_async_commit();
  }

  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int wm0 = (warp % Tl::kWarpsM) * Tl::WM, wn0 = (warp / Tl::kWarpsM) * Tl::WN;
  WarpTile<T, Math, Tl, Op::A::kKMajor, Op::B::kKMajor> tile;
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<Tl::kStages - 2>();  // tile kt has landed (this thread's part) ...
    __syncthreads();                   // ... everyone's; and stage kt-1 is free again
    const int next = kt + Tl::kStages - 1;
    if (next < k_tiles) {
      const int s = next % Tl::kStages;
      load_a.load(p, cta, sA + s * LoaderA::kSize, cta.k_begin + next * Tl::BK);
      load_b.load(p, cta, sB + s * LoaderB::kSize, cta.k_begin + next * Tl::BK);
    }
    cp_async_commit();
    const int s = kt % Tl::kStages;
    tile.multiply(sA + s * LoaderA::kSize, sB + s * LoaderB::kSize, wm0, wn0, lane);
  }
  cp_async_wait<0>();

  // Epilogue: thread (g, t) holds rows g, g+8 and columns 2t, 2t+1 of each 16x8 fragment.
  using Warp = WarpTile<T, Math, Tl, Op::A::kKMajor, Op::B::kKMajor>;
  const Epilogue<Op, T> epilogue(p, cta);
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mi = 0; mi < Warp::MI; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = Op::row_offset(p, cta, tile_m0 + wm0 + mi * 16 + g + h * 8);
      if (row < 0) continue;
#pragma unroll
      for (int ni = 0; ni < Warp::NI; ++ni)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          epilogue.store(row, tile_n0 + wn0 + ni * 8 + 2 * t + e, tile.acc[mi][ni][h * 2 + e]);
    }
}

}  // namespace fusebox::cuda::igemm
