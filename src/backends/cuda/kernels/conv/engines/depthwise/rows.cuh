// Depthwise convolutions along rows: the fast path of depthwise.cu for filters 3, 5 or 7 wide
// along the last spatial dim with stride 1 or 2 and no dilation there (3x3, 5x5, ConvNeXt's
// 7x7, their strided forms; the other dims any size, stride, dilation, pad). Device code; it
// includes only device-safe headers.
//
// Depthwise convolution is memory-bound: the work per element is a few taps, so the kernels
// must touch each activation about once and spend few instructions per byte. One thread owns
// one 16-byte channel vector q (V channels) and a run of RUN outputs along the last dim; per
// filter row it loads the NIN = (RUN - 1) * S + KW input vectors the run needs ONCE into
// registers (the generic kernel loaded one per tap and output: KW * RUN), and the KW weight
// vectors once, then does RUN * KW FMAs per channel from registers.
//
//   fprop:          y[o, q]  = sum_r x[o*s - p + r*d, q] w[r, q]      (+ bias, activation,
//                                                                      residual, activation)
//   dgrad, stride 1: dx[i, q] = sum_r dy[i - p' + r*d, q] w[R-1-r, q]  p' = (R-1)*d - p:
//                   the same loop over dy with the filter flipped (mode dgrad), + bias
//   wgrad:          thread (q, filter row, split): for each run of RUN outputs in its split,
//                   dw[row, r, q] += sum_j dy[o_j, q] x[o_j*s - p + r, q] for the KW taps r
//                   of its row, into f32 partials [split][tap][C] summed in order after.
//
// Thread order, fastest first: q, then (fprop) the output row within a block of `row_block`
// rows, the run, the row block, dim 0, the batch image. A block of threads so covers a few
// runs of `row_block` consecutive rows: the rows a tap row shares with its neighbours come
// from L1 instead of L2. wgrad: q, then the filter row, then the split, so the threads that
// read one dy vector are neighbours; a split walks down a column of runs (rows fastest), so
// the x row filter row r reads now, filter row r - 1 reads one step later (walking along the
// rows, that was a row of runs later, and with every split streaming at once the row had left
// L2: x and dy came from DRAM about twice; 3x3 C256 at 56^2: 0.145 -> 0.102 ms).
#pragma once

#include <cstdint>

#include "backends/common/activation.h"
#include "backends/common/fast_divmod.h"
#include "backends/cuda/device/math.cuh"

namespace fusebox::cuda {

// Outputs per thread along the last dim (H100, bench/results/2026-11-25_h100_session14/):
// fprop / dgrad 4 (8 needs ~130 registers: a quarter of the warps, 1.8x slower at 3x3);
// wgrad 8 for 3x3 and 5x5 at stride 1 (fewer x reloads per tap), else 4.
constexpr int kDepthwiseFpropRun = 4;
template <int KW, int S>
constexpr int kDepthwiseWgradRun = (S == 1 && KW <= 5) ? 8 : 4;

struct DwRowsParams {
  int32_t channels = 0;
  // Extents of what the loop reads (src: fprop x, dgrad dy) and writes (dst: y, dx); wgrad:
  // src = x, dst = dy. The stride / pad / dilation are the loop's (dgrad: 1, p', d).
  int32_t src[3] = {1, 1, 1}, dst[3] = {1, 1, 1}, filter[3] = {1, 1, 1};
  int32_t stride[3] = {1, 1, 1}, pad[3] = {0, 0, 0}, dilation[3] = {1, 1, 1};
  int32_t threads = 0;
  int32_t row_block = 1;  // fprop: dst rows along dim 1 per group of threads
  FastDivmod vectors, row_in_block, runs, row_blocks, dst0;  // fprop thread -> coordinates
  FastDivmod jobs, filter1, dst1;          // wgrad: thread -> (job, split), item -> coordinates
  int32_t items = 0, items_per_split = 0;  // wgrad: runs of outputs in all / in one split
  ActivationFn activation, residual_activation;
};

namespace depthwise_rows_detail {

__device__ __forceinline__ bool inside(int i, int extent) {
  return unsigned(i) < unsigned(extent);
}

template <class T, int N>
__device__ __forceinline__ void load_row(Vec<T> (&v)[N], const T* row, int first, int extent,
                                         int step) {
#pragma unroll
  for (int t = 0; t < N; ++t) {
    if (inside(first + t, extent)) {
      v[t] = load_vec(row, (first + t) * step);
    } else {
#pragma unroll
      for (int e = 0; e < kVecWidth<T>; ++e) v[t].v[e] = T(0.0f);
    }
  }
}

}  // namespace depthwise_rows_detail

// What the loop computes. fprop_fused adds the activation / residual epilogue: a kernel of its
// own, since carrying that code made the bias-only fprop 1.8x slower on the H100 (3x3 C256
// at 56^2: 0.184 vs 0.104 ms). dgrad reads the filter back to front; its epilogue is the
// bias. Compile-time, so neither costs the others a select per tap.
enum class DwRowsMode { fprop, fprop_fused, dgrad };

// Output vector `at` of an fprop / dgrad from its f32 sums: + bias (b, when `bias`), then
// under fprop_fused the activation, the residual and its activation; one rounding.
template <class T, DwRowsMode kMode>
__device__ __forceinline__ void store_output(T* dst, int at, const float (&acc)[kVecWidth<T>],
                                             const T* bias, const Vec<T>& b, const T* residual,
                                             ActivationFn activation,
                                             ActivationFn residual_activation) {
  constexpr bool fused = kMode == DwRowsMode::fprop_fused;
  Vec<T> out, res;
  if (fused && residual) res = load_vec(residual, at);
#pragma unroll
  for (int e = 0; e < kVecWidth<T>; ++e) {
    float v = acc[e];
    if (bias) v += float(b.v[e]);
    if constexpr (fused) {
      v = activate(activation, v);
      if (residual) v = activate(residual_activation, v + float(res.v[e]));
    }
    out.v[e] = convert<T>(v);
  }
  store_vec(dst, at, out);
}

template <class T, int KW, int S, DwRowsMode kMode, int RUN = kDepthwiseFpropRun>
__global__ void __launch_bounds__(256)
    depthwise_rows_fprop(DwRowsParams p, const T* __restrict__ src, const T* __restrict__ w,
                         const T* __restrict__ bias, const T* __restrict__ residual,
                         T* __restrict__ dst) {
  using namespace depthwise_rows_detail;
  constexpr int V = kVecWidth<T>;
  constexpr int NIN = (RUN - 1) * S + KW;
  int idx = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x);
  if (idx >= p.threads) return;
  int q, h, run, hb, o0;
  idx = p.vectors.divmod(idx, q);
  idx = p.row_in_block.divmod(idx, h);
  idx = p.runs.divmod(idx, run);
  idx = p.row_blocks.divmod(idx, hb);
  const int n = p.dst0.divmod(idx, o0);
  const int o1 = hb * p.row_block + h;
  if (o1 >= p.dst[1]) return;
  const int o2 = run * RUN;
  const int C = p.channels;
  const int first = o2 * S - p.pad[2];  // the run's first input along the last dim

  float acc[RUN][V] = {};
  for (int r0 = 0; r0 < p.filter[0]; ++r0) {
    const int i0 = o0 * p.stride[0] - p.pad[0] + r0 * p.dilation[0];
    if (!inside(i0, p.src[0])) continue;
    for (int r1 = 0; r1 < p.filter[1]; ++r1) {
      const int i1 = o1 * p.stride[1] - p.pad[1] + r1 * p.dilation[1];
      if (!inside(i1, p.src[1])) continue;
      Vec<T> in[NIN];
      load_row(in, src + (((n * p.src[0] + i0) * p.src[1] + i1) * p.src[2]) * C + q * V, first,
               p.src[2], C / V);
      constexpr bool flip = kMode == DwRowsMode::dgrad;
      const int f0 = flip ? p.filter[0] - 1 - r0 : r0;
      const int f1 = flip ? p.filter[1] - 1 - r1 : r1;
      const T* wrow = w + (f0 * p.filter[1] + f1) * KW * C + q * V;
      Vec<T> wv[KW];
#pragma unroll
      for (int r = 0; r < KW; ++r) wv[r] = load_vec(wrow, (flip ? KW - 1 - r : r) * (C / V));
#pragma unroll
      for (int e = 0; e < V; ++e)
#pragma unroll
        for (int j = 0; j < RUN; ++j)
#pragma unroll
          for (int r = 0; r < KW; ++r)
            acc[j][e] = fmaf(float(in[j * S + r].v[e]), float(wv[r].v[e]), acc[j][e]);
    }
  }

  Vec<T> b;
  if (bias) b = load_vec(bias, q);
  const int base = (((n * p.dst[0] + o0) * p.dst[1] + o1) * p.dst[2] + o2) * (C / V) + q;
#pragma unroll
  for (int j = 0; j < RUN; ++j) {
    if (o2 + j >= p.dst[2]) break;
    store_output<T, kMode>(dst, base + j * (C / V), acc[j], bias, b, residual, p.activation,
                           p.residual_activation);
  }
}

// src = x (extents p.src), dy (extents p.dst); partial [split][tap][C] f32.
template <class T, int KW, int S, int RUN = kDepthwiseWgradRun<KW, S>>
__global__ void __launch_bounds__(256)
    depthwise_rows_wgrad(DwRowsParams p, const T* __restrict__ x, const T* __restrict__ dy,
                         float* __restrict__ partial) {
  using namespace depthwise_rows_detail;
  constexpr int V = kVecWidth<T>;
  constexpr int NIN = (RUN - 1) * S + KW;
  const int id = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x);
  if (id >= p.threads) return;
  int job, q, r1;
  const int split = p.jobs.divmod(id, job);
  const int row = p.vectors.divmod(job, q);
  const int r0 = p.filter1.divmod(row, r1);
  const int C = p.channels;

  // Items: runs of RUN outputs along the last dim, flattened (n, o0, run, o1), o1 fastest.
  const int begin = split * p.items_per_split;
  const int end = min(p.items, begin + p.items_per_split);
  int run, o1, o0;
  int rest = p.dst1.divmod(begin < end ? begin : 0, o1);
  rest = p.runs.divmod(rest, run);
  const int n0 = p.dst0.divmod(rest, o0);
  int n = n0;

  float acc[KW][V] = {};
  for (int item = begin; item < end; ++item) {
    const int i0 = o0 * p.stride[0] - p.pad[0] + r0 * p.dilation[0];
    const int i1 = o1 * p.stride[1] - p.pad[1] + r1 * p.dilation[1];
    if (inside(i0, p.src[0]) && inside(i1, p.src[1])) {
      const int o2 = run * RUN;
      Vec<T> g[RUN], in[NIN];
      load_row(g, dy + (((n * p.dst[0] + o0) * p.dst[1] + o1) * p.dst[2]) * C + q * V, o2, p.dst[2],
               C / V);
      load_row(in, x + (((n * p.src[0] + i0) * p.src[1] + i1) * p.src[2]) * C + q * V,
               o2 * S - p.pad[2], p.src[2], C / V);
#pragma unroll
      for (int e = 0; e < V; ++e)
#pragma unroll
        for (int r = 0; r < KW; ++r)
#pragma unroll
          for (int j = 0; j < RUN; ++j)
            acc[r][e] = fmaf(float(g[j].v[e]), float(in[j * S + r].v[e]), acc[r][e]);
    }
    if (++o1 == p.dst[1]) {
      o1 = 0;
      if (++run == p.runs.divisor) {
        run = 0;
        if (++o0 == p.dst[0]) o0 = 0, ++n;
      }
    }
  }

  float* out = partial + (int64_t(split) * p.filter[0] * p.filter[1] * KW + row * KW) * C + q * V;
#pragma unroll
  for (int r = 0; r < KW; ++r)
#pragma unroll
    for (int e = 0; e < V; e += 4)
      *reinterpret_cast<float4*>(out + r * C + e) =
          make_float4(acc[r][e], acc[r][e + 1], acc[r][e + 2], acc[r][e + 3]);
}

}  // namespace fusebox::cuda
