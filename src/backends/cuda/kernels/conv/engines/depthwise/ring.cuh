// Depthwise 2-D convolutions streamed through a ring of rows in shared memory: the fast path
// of depthwise.cu for 2-D problems whose filter is 3, 5 or 7 wide with stride 1 or 2 and no
// dilation along the last dim (3x3, 5x5, ConvNeXt's 7x7, their strided forms). Device code; it
// includes only device-safe headers.
//
// Why: depthwise convolution is memory-bound (3x3) or close to the FMA rate (7x7), yet the
// rows kernels (rows.cuh), which read every input from global memory through L1, ran at 60%
// of copy bandwidth and 25-50% of the FMA rate: they wait on loads with too few warps. Here a
// block owns a chunk of CB channel vectors of one image and a range of output rows; it copies
// each input row it needs into a ring of shared-memory rows ONCE (cp.async, the next step's
// rows in flight while this step computes), so the loop's loads are short shared-memory
// reads, and no input row is fetched twice except the few (filter rows - stride) a range
// starts with.
//
//   A step computes R output rows (fprop; wgrad: 1). Output row o (relative to the range)
//   reads input rows o*s_h + r*d_h (r < KH, relative to the range's first input row
//   first*s_h - p_h); relative row j lives in ring slot j % slots. A step starts with one
//   barrier: its rows have landed and every thread is past the step before, whose rows
//   alone the next step's overwrite, so slots = span + ((lookahead + 1) * R - 1) * s_h
//   (span = (KH-1)*d_h + 1).
//
//   fprop:  thread (q, g, z): output row z of the step, its runs of RUN outputs (g, g + G, ...)
//           y[o, c, q] = sum_{r, t} ring[row r][c*S + t, q] w[r, t, q]   (+ bias, activation,
//           residual, activation); dgrad (stride 1) is the same loop over dy with the filter
//           flipped and the pads p' = (R-1)*d - p.
//   wgrad:  thread (q, g, filter row r), q = a piece of L channels (half a vector: fewer
//           accumulators, more warps): dw[r, t, q] += sum_c dy[o, c, q] ring[row r][c*S + t, q]
//           over its runs; the G threads of one (q, r) are one warp's lanes, summed by
//           shuffles at the end into f32 partials [image * splits + split][tap][C]
//           (depthwise.cu sums them in order: deterministic).
//
// Shared memory: the filter in f32 (converted once per block: the loop's weights cost no
// conversion), the ring [slots][cols][CB] vectors (cols = (runs*RUN - 1)*S + KW pixels from
// input column -p_w; columns outside the image are zeros), and for wgrad (lookahead + 1) dy
// rows [runs*RUN][CB] (zeros past the row's end). Rows outside the image are neither loaded
// nor read: the test is per output row, uniform over its threads.
#pragma once

#include <cstdint>

#include "backends/common/activation.h"
#include "backends/common/fast_divmod.h"
#include "backends/cuda/device/math.cuh"
#include "backends/cuda/device/mma.cuh"
#include "backends/cuda/kernels/conv/engines/depthwise/rows.cuh"  // DwRowsMode, store_output

namespace fusebox::cuda {

// Steps whose rows are in flight while a step computes (H200: 2 and 3 measured no faster).
constexpr int kRingLookahead = 1;

struct DwRingParams {
  int32_t channels = 0;  // C; vectors = C / V
  int32_t chunk = 0;     // CB: channel vectors per block
  // src: the rows streamed through the ring (fprop x, dgrad dy, wgrad x); dst: the rows the
  // loop produces (fprop y, dgrad dx) or reads beside them (wgrad dy). Extents of dims 1, 2.
  int32_t src_h = 1, src_w = 1, dst_h = 1, dst_w = 1;
  int32_t filter_h = 1, stride_h = 1, pad_h = 0, dilation_h = 1, pad_w = 0;
  int32_t runs = 0;            // runs of RUN outputs along a dst row
  int32_t cols = 0;            // ring pixels per row: (runs * RUN - 1) * S + KW
  int32_t slots = 0;           // ring rows: span + ((lookahead + 1) * R - 1) * s_h
  int32_t rows_per_split = 0;  // output rows a block streams
  FastDivmod chunks, splits;   // blockIdx.x -> (chunk, split, image)
  FastDivmod stage;            // staging index -> (pixel, vector): divisor CB
  ActivationFn activation, residual_activation;
};

namespace depthwise_ring_detail {

__device__ __forceinline__ bool inside(int i, int extent) {
  return unsigned(i) < unsigned(extent);
}

// Copies input row `row` (absolute; outside the image: nothing) of this block's image and
// channel chunk into ring slot `slot`, columns from -p_w, zeros outside the image.
template <class T>
__device__ __forceinline__ void stage_row(const DwRingParams& p, const T* src, int image, int chunk,
                                          int row, int slot, Vec<T>* ring, int tid, int threads) {
  if (!inside(row, p.src_h)) return;
  const int vectors = p.channels / kVecWidth<T>;
  const Vec<T>* src_row = reinterpret_cast<const Vec<T>*>(src) +
                          (image * p.src_h + row) * p.src_w * vectors + chunk * p.chunk;
  Vec<T>* dst = ring + slot * p.cols * p.chunk;
  for (int t = tid; t < p.cols * p.chunk; t += threads) {
    int q;
    const int c = p.stage.divmod(t, q);
    const int col = c - p.pad_w;
    const bool valid = inside(col, p.src_w);
    cp_async_16(dst + t, src_row + (valid ? col : 0) * vectors + q, valid);
  }
}

// The block's filter chunk as f32 in float4 planes [taps][V / 4][CB][4] (`flip`: taps in
// reverse order, dgrad): the lanes of a warp read consecutive 16-byte pieces (as [taps][CB][V]
// a lane's 32 bytes made every read a 2-way bank conflict).
template <class T>
__device__ __forceinline__ void stage_filter(const DwRingParams& p, const T* w, int taps, int chunk,
                                             bool flip, float* out, int tid, int threads) {
  constexpr int V = kVecWidth<T>;
  const int vectors = p.channels / V;
  for (int t = tid; t < taps * p.chunk; t += threads) {
    int q;
    const int tap = p.stage.divmod(t, q);
    const Vec<T> v = load_vec(w, (flip ? taps - 1 - tap : tap) * vectors + chunk * p.chunk + q);
#pragma unroll
    for (int e = 0; e < V; ++e)
      out[((tap * (V / 4) + e / 4) * p.chunk + q) * 4 + e % 4] = float(v.v[e]);
  }
}

// Vector q of row `row` of float4 planes [rows][V / 4][CB][4] (the filter stage_filter wrote).
template <int V>
__device__ __forceinline__ void load_planes(float (&v)[V], const float* planes, int row, int chunk,
                                            int q) {
#pragma unroll
  for (int e = 0; e < V; e += 4) {
    const float4 f =
        *reinterpret_cast<const float4*>(planes + ((row * (V / 4) + e / 4) * chunk + q) * 4);
    v[e] = f.x, v[e + 1] = f.y, v[e + 2] = f.z, v[e + 3] = f.w;
  }
}

// Shared-memory bytes of the filter part, rounded to 16.
__host__ __device__ inline int ring_filter_bytes(int taps, int chunk, int vec_width) {
  return (taps * chunk * vec_width * 4 + 15) / 16 * 16;
}

}  // namespace depthwise_ring_detail

// Shared-memory bytes a ring kernel needs (wgrad: its lookahead + 1 dy rows, no filter).
template <class T, int RUN>
__host__ __device__ inline int ring_shared_bytes(const DwRingParams& p, int kw, bool wgrad) {
  constexpr int V = kVecWidth<T>;
  const int rows = p.slots * p.cols * p.chunk * 16;
  if (wgrad) return rows + (kRingLookahead + 1) * p.runs * RUN * p.chunk * 16;
  return depthwise_ring_detail::ring_filter_bytes(p.filter_h * kw, p.chunk, V) + rows;
}

// blockDim = (CB, G, R); blockIdx.x = (chunk, split, image), chunk fastest.
template <class T, int KW, int S, DwRowsMode kMode, int RUN>
__global__ void __launch_bounds__(256)
    depthwise_ring_fprop(DwRingParams p, const T* __restrict__ src, const T* __restrict__ w,
                         const T* __restrict__ bias, const T* __restrict__ residual,
                         T* __restrict__ dst) {
  using namespace depthwise_ring_detail;
  constexpr int V = kVecWidth<T>;
  constexpr int NIN = (RUN - 1) * S + KW;
  extern __shared__ float4 ring_shared[];
  const int KH = p.filter_h, taps = KH * KW;
  float* filter = reinterpret_cast<float*>(ring_shared);
  Vec<T>* ring = reinterpret_cast<Vec<T>*>(reinterpret_cast<char*>(ring_shared) +
                                           ring_filter_bytes(taps, p.chunk, V));
  int chunk, split;
  const int image = p.splits.divmod(p.chunks.divmod(int(blockIdx.x), chunk), split);
  const int q = int(threadIdx.x), g = int(threadIdx.y), G = int(blockDim.y);
  const int z = int(threadIdx.z), R = int(blockDim.z);  // output row z of a step's R
  const int tid = (z * G + g) * p.chunk + q, threads = R * G * p.chunk;
  const int vectors = p.channels / V;
  const int first = split * p.rows_per_split;
  const int rows = min(p.dst_h, first + p.rows_per_split) - first;
  const int steps = (rows + R - 1) / R;
  const int base = first * p.stride_h - p.pad_h;  // the absolute input row of relative row 0
  const int span = (KH - 1) * p.dilation_h + 1;

  stage_filter(p, w, taps, chunk, kMode == DwRowsMode::dgrad, filter, tid, threads);
  // The relative input rows steps 0..i read: up to those of step i's last output row.
  auto rows_through = [&](int i) { return min(i * R + R - 1, rows - 1) * p.stride_h + span; };
  // The rows step i adds; one group per step.
  auto stage_step = [&](int i) {
    if (i < steps)
      for (int j = i == 0 ? 0 : rows_through(i - 1); j < rows_through(i); ++j)
        stage_row(p, src, image, chunk, base + j, j % p.slots, ring, tid, threads);
    cp_async_commit();
  };
  for (int i = 0; i < kRingLookahead; ++i) stage_step(i);
  Vec<T> b;
  if (bias) b = load_vec(bias, chunk * p.chunk + q);

  for (int k = 0; k < steps; ++k) {
    // Step k's rows have landed and every thread is past step k - 1: the slots only step
    // k - 1 read may take step k + lookahead's rows.
    cp_async_wait<kRingLookahead - 1>();
    __syncthreads();
    stage_step(k + kRingLookahead);
    const int row = k * R + z;  // relative to first
    if (row >= rows) continue;
    const int o = first + row;
    for (int run = g; run < p.runs; run += G) {
      const int c0 = run * RUN;
      float acc[RUN][V] = {};
      for (int r = 0; r < KH; ++r) {
        const int j = row * p.stride_h + r * p.dilation_h;
        if (!inside(base + j, p.src_h)) continue;
        const Vec<T>* row = ring + ((j % p.slots) * p.cols + c0 * S) * p.chunk + q;
        float wv[KW][V];
#pragma unroll
        for (int t = 0; t < KW; ++t) load_planes(wv[t], filter, r * KW + t, p.chunk, q);
#pragma unroll
        for (int t = 0; t < NIN; ++t) {
          const Vec<T> x = row[t * p.chunk];
#pragma unroll
          for (int jj = 0; jj < RUN; ++jj) {
            const int tap = t - jj * S;
            if (tap < 0 || tap >= KW) continue;
#pragma unroll
            for (int e = 0; e < V; ++e) acc[jj][e] = fmaf(float(x.v[e]), wv[tap][e], acc[jj][e]);
          }
        }
      }
      const int at = ((image * p.dst_h + o) * p.dst_w + c0) * vectors + chunk * p.chunk + q;
#pragma unroll
      for (int jj = 0; jj < RUN; ++jj) {
        if (c0 + jj >= p.dst_w) break;
        store_output<T, kMode>(dst, at + jj * vectors, acc[jj], bias, b, residual, p.activation,
                               p.residual_activation);
      }
    }
  }
  cp_async_wait<0>();
}

// blockDim = (CB * V / L, G, KH) with CB * V / L * G = 32: a warp is one filter row's G runs
// of the chunk's channels, L channels a thread (L = V / 2 halves the accumulators: 7x7 keeps
// acc[7][4], twice the warps per SM). blockIdx.x = (chunk, split, image). src = x, dst = dy.
template <class T, int KW, int S, int RUN, int L = kVecWidth<T>>
__global__ void __launch_bounds__(256)
    depthwise_ring_wgrad(DwRingParams p, const T* __restrict__ x, const T* __restrict__ dy,
                         float* __restrict__ partial) {
  using namespace depthwise_ring_detail;
  constexpr int V = kVecWidth<T>, P = V / L;  // pieces of L channels per vector
  struct alignas(sizeof(T) * L) Piece {
    T v[L];
  };
  extern __shared__ float4 ring_shared[];
  Vec<T>* ring = reinterpret_cast<Vec<T>*>(ring_shared);
  Vec<T>* dy_rows = ring + p.slots * p.cols * p.chunk;  // [kRingLookahead + 1][runs * RUN][CB]
  const int dy_cols = p.runs * RUN;
  int chunk, split;
  const int image = p.splits.divmod(p.chunks.divmod(int(blockIdx.x), chunk), split);
  const int q = int(threadIdx.x), g = int(threadIdx.y), G = int(blockDim.y), r = int(threadIdx.z);
  const int pieces = p.chunk * P;  // threads along x: a pixel's pieces of the chunk
  const int tid = (r * G + g) * pieces + q, threads = int(blockDim.z) * G * pieces;
  const int vectors = p.channels / V;
  const int first = split * p.rows_per_split;
  const int steps = min(p.dst_h, first + p.rows_per_split) - first;
  const int base = first * p.stride_h - p.pad_h;
  const int span = (p.filter_h - 1) * p.dilation_h + 1;

  // dy row o into dy slot `slot`, zeros past the row's end.
  auto stage_dy = [&](int o, int slot) {
    const Vec<T>* src_row = reinterpret_cast<const Vec<T>*>(dy) +
                            (image * p.dst_h + o) * p.dst_w * vectors + chunk * p.chunk;
    Vec<T>* to = dy_rows + slot * dy_cols * p.chunk;
    for (int t = tid; t < dy_cols * p.chunk; t += threads) {
      int qq;
      const int c = p.stage.divmod(t, qq);
      const bool valid = c < p.dst_w;
      cp_async_16(to + t, src_row + (valid ? c : 0) * vectors + qq, valid);
    }
  };

  auto stage_step = [&](int i) {
    if (i < steps) {
      for (int j = i == 0 ? 0 : (i - 1) * p.stride_h + span; j < i * p.stride_h + span; ++j)
        stage_row(p, x, image, chunk, base + j, j % p.slots, ring, tid, threads);
      stage_dy(first + i, i % (kRingLookahead + 1));
    }
    cp_async_commit();
  };
  for (int i = 0; i < kRingLookahead; ++i) stage_step(i);

  float acc[KW][L] = {};
  for (int k = 0; k < steps; ++k) {
    // Step k's rows have landed and every thread is past step k - 1: the slots only step
    // k - 1 read may take step k + lookahead's rows.
    cp_async_wait<kRingLookahead - 1>();
    __syncthreads();
    stage_step(k + kRingLookahead);
    const Piece* grow =
        reinterpret_cast<const Piece*>(dy_rows + (k % (kRingLookahead + 1)) * dy_cols * p.chunk) +
        q;
    const int j = k * p.stride_h + r * p.dilation_h;
    if (inside(base + j, p.src_h)) {  // uniform per warp
      const Piece* row =
          reinterpret_cast<const Piece*>(ring + (j % p.slots) * p.cols * p.chunk) + q;
      for (int run = g; run < p.runs; run += G) {
        const int c0 = run * RUN;
        float gv[RUN][L];
#pragma unroll
        for (int jj = 0; jj < RUN; ++jj) {
          const Piece v = grow[(c0 + jj) * pieces];
#pragma unroll
          for (int e = 0; e < L; ++e) gv[jj][e] = float(v.v[e]);
        }
#pragma unroll
        for (int t = 0; t < (RUN - 1) * S + KW; ++t) {
          const Piece xv = row[(c0 * S + t) * pieces];
#pragma unroll
          for (int jj = 0; jj < RUN; ++jj) {
            const int tap = t - jj * S;
            if (tap < 0 || tap >= KW) continue;
#pragma unroll
            for (int e = 0; e < L; ++e) acc[tap][e] = fmaf(gv[jj][e], float(xv.v[e]), acc[tap][e]);
          }
        }
      }
    }
  }
  cp_async_wait<0>();

  // The G lanes of one (q, r): lane = q + pieces * g.
#pragma unroll
  for (int t = 0; t < KW; ++t)
#pragma unroll
    for (int e = 0; e < L; ++e)
      for (int off = pieces; off < 32; off <<= 1)
        acc[t][e] += __shfl_xor_sync(0xffffffffu, acc[t][e], off);
  if (g != 0) return;
  const int taps = p.filter_h * KW;
  float* out = partial + (int64_t(image) * p.splits.divisor + split) * taps * p.channels +
               (r * KW) * p.channels + chunk * p.chunk * V + q * L;
#pragma unroll
  for (int t = 0; t < KW; ++t)
#pragma unroll
    for (int e = 0; e < L; ++e) out[t * p.channels + e] = acc[t][e];
}

}  // namespace fusebox::cuda
