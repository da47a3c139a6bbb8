// Depthwise convolutions in NHWC (depthwise.h). Every kernel reads and writes 16-byte vectors
// of V consecutive channels (V = 8 for bf16 / f16, 4 for f32); consecutive threads take
// consecutive channel vectors of one pixel, so a warp's loads are one contiguous run.
//
//   fprop: thread (kRun pixels o along the last dim, vector q): y[o, q] = sum over taps r of
//          x[o*s - p + r*d, q] w[r, q], then bias, activation, residual, residual
//          activation; one rounding.
//   dgrad: thread (kRun pixels i, vector q): dx[i, q] = sum over taps r with (i + p - r*d)
//          divisible by s, inside dy, of dy[(i + p - r*d) / s, q] w[r, q], plus bias.
//   wgrad: thread (vector q, filter row (r0, r1), split): sums dy[o, q] x[o*s - p + r*d, q]
//          over its split of the N*O pixels for every r2 of the row into f32 partials
//          [split][tap][C]; a second kernel adds the splits in order (deterministic).
// The filter is read as [taps][C] (a transposed copy of the [C, 1, R...] tensor: a few KiB).
// Filters 3, 5 or 7 wide with stride 1 or 2 and no dilation along the last dim take the rows
// kernels instead (rows.cuh: each input vector loaded once per run, not once per tap), and
// 2-D problems among them the ring kernels (ring.cuh: rows streamed through shared memory)
// where those were measured faster (ring_shape); these generic kernels keep every other shape
// (and strided dgrad).
#include "backends/cuda/kernels/conv/engines/depthwise/depthwise.h"

#include <algorithm>
#include <utility>

#include "backends/common/activation.h"
#include "backends/common/conv_geometry.h"
#include "backends/cuda/kernels/common/dtype_dispatch.cuh"
#include "backends/cuda/kernels/common/occupancy.cuh"
#include "backends/cuda/kernels/conv/engines/depthwise/plan.h"
#include "backends/cuda/kernels/conv/engines/depthwise/ring.cuh"
#include "backends/cuda/kernels/conv/engines/depthwise/rows.cuh"
#include "backends/cuda/kernels/conv/operand_layout.h"
#include "backends/cuda/kernels/conv/split_sum.cuh"

namespace fusebox::cuda {

namespace {

using depthwise::kMaxFilterWidth;
using depthwise::ring_shape;
using depthwise::rows_kernel_shape;

constexpr int kThreads = 256;

struct DwParams {
  int32_t batch = 0, channels = 0;
  int32_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, filter[3] = {1, 1, 1};
  int32_t stride[3] = {1, 1, 1}, pad[3] = {0, 0, 0}, dilation[3] = {1, 1, 1};
  ActivationFn activation, residual_activation;
};

__device__ __forceinline__ bool inside(int i, int extent) {
  return unsigned(i) < unsigned(extent);
}

// Flat pixel index -> (n, p0, p1, p2) over extents e.
__device__ __forceinline__ int split_pixel(int64_t pixel, const int32_t (&e)[3], int (&p)[3]) {
  p[2] = int(pixel % e[2]);
  pixel /= e[2];
  p[1] = int(pixel % e[1]);
  pixel /= e[1];
  p[0] = int(pixel % e[0]);
  return int(pixel / e[0]);
}

__device__ __forceinline__ int64_t pixel_at(int n, const int32_t (&e)[3], int i0, int i1, int i2) {
  return ((int64_t(n) * e[0] + i0) * e[1] + i1) * e[2] + i2;
}

// Consecutive outputs along the last dim one thread computes: each filter tap's weights are
// loaded once for all of them (the neighbouring inputs they read come from L1).
constexpr int kRun = 4;

// Thread index -> (n, p0, p1, first p2 of its run, vector q) over extents e; 32-bit
// (depthwise::cannot_implement keeps tensors under 2^31 elements).
__device__ __forceinline__ int split_run(int idx, int vectors, const int32_t (&e)[3], int (&p)[3],
                                         int& q) {
  q = idx % vectors;
  idx /= vectors;
  const int runs = (e[2] + kRun - 1) / kRun;
  p[2] = (idx % runs) * kRun;
  idx /= runs;
  p[1] = idx % e[1];
  idx /= e[1];
  p[0] = idx % e[0];
  return idx / e[0];
}

template <class T>
__global__ void depthwise_fprop(DwParams p, const T* x, const T* w, const T* bias,
                                const T* residual, T* y) {
  constexpr int V = kVecWidth<T>;
  const int vectors = p.channels / V;
  const int runs = (p.out[2] + kRun - 1) / kRun;
  const int total = p.batch * p.out[0] * p.out[1] * runs * vectors;
  for (int idx = int(global_thread_index()); idx < total; idx += int(grid_stride())) {
    int o[3], q;
    const int n = split_run(idx, vectors, p.out, o, q);
    float acc[kRun][V] = {};
    for (int r0 = 0; r0 < p.filter[0]; ++r0) {
      const int i0 = o[0] * p.stride[0] - p.pad[0] + r0 * p.dilation[0];
      if (!inside(i0, p.in[0])) continue;
      for (int r1 = 0; r1 < p.filter[1]; ++r1) {
        const int i1 = o[1] * p.stride[1] - p.pad[1] + r1 * p.dilation[1];
        if (!inside(i1, p.in[1])) continue;
        const int64_t row = pixel_at(n, p.in, i0, i1, 0);
        for (int r2 = 0; r2 < p.filter[2]; ++r2) {
          const Vec<T> wv =
              load_vec(w, int64_t((r0 * p.filter[1] + r1) * p.filter[2] + r2) * vectors + q);
#pragma unroll
          for (int j = 0; j < kRun; ++j) {
            const int i2 = (o[2] + j) * p.stride[2] - p.pad[2] + r2 * p.dilation[2];
            if (!inside(i2, p.in[2])) continue;
            const Vec<T> xv = load_vec(x, (row + i2) * vectors + q);
#pragma unroll
            for (int e = 0; e < V; ++e) acc[j][e] = fmaf(float(xv.v[e]), float(wv.v[e]), acc[j][e]);
          }
        }
      }
    }
    Vec<T> b;
    if (bias) b = load_vec(bias, q);
#pragma unroll
    for (int j = 0; j < kRun; ++j) {
      if (o[2] + j >= p.out[2]) break;
      const int64_t at = (pixel_at(n, p.out, o[0], o[1], o[2] + j)) * vectors + q;
      Vec<T> out, res;
      if (residual) res = load_vec(residual, at);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        float v = acc[j][e];
        if (bias) v += float(b.v[e]);
        v = activate(p.activation, v);
        if (residual) v = activate(p.residual_activation, v + float(res.v[e]));
        out.v[e] = convert<T>(v);
      }
      store_vec(y, at, out);
    }
  }
}

// The output position along one dim that tap r of input position i reads from, or -1.
__device__ __forceinline__ int source_of(const DwParams& p, int d, int i, int r) {
  const int t = i + p.pad[d] - r * p.dilation[d];
  if (t < 0 || t % p.stride[d] != 0) return -1;
  const int o = t / p.stride[d];
  return o < p.out[d] ? o : -1;
}

template <class T>
__global__ void depthwise_dgrad(DwParams p, const T* dy, const T* w, const T* bias, T* dx) {
  constexpr int V = kVecWidth<T>;
  const int vectors = p.channels / V;
  const int runs = (p.in[2] + kRun - 1) / kRun;
  const int total = p.batch * p.in[0] * p.in[1] * runs * vectors;
  for (int idx = int(global_thread_index()); idx < total; idx += int(grid_stride())) {
    int i[3], q;
    const int n = split_run(idx, vectors, p.in, i, q);
    float acc[kRun][V] = {};
    for (int r0 = 0; r0 < p.filter[0]; ++r0) {
      const int o0 = source_of(p, 0, i[0], r0);
      if (o0 < 0) continue;
      for (int r1 = 0; r1 < p.filter[1]; ++r1) {
        const int o1 = source_of(p, 1, i[1], r1);
        if (o1 < 0) continue;
        const int64_t row = pixel_at(n, p.out, o0, o1, 0);
        for (int r2 = 0; r2 < p.filter[2]; ++r2) {
          const Vec<T> wv =
              load_vec(w, int64_t((r0 * p.filter[1] + r1) * p.filter[2] + r2) * vectors + q);
#pragma unroll
          for (int j = 0; j < kRun; ++j) {
            const int o2 = source_of(p, 2, i[2] + j, r2);
            if (o2 < 0) continue;
            const Vec<T> gv = load_vec(dy, (row + o2) * vectors + q);
#pragma unroll
            for (int e = 0; e < V; ++e) acc[j][e] = fmaf(float(gv.v[e]), float(wv.v[e]), acc[j][e]);
          }
        }
      }
    }
    Vec<T> b;
    if (bias) b = load_vec(bias, q);
#pragma unroll
    for (int j = 0; j < kRun; ++j) {
      if (i[2] + j >= p.in[2]) break;
      Vec<T> out;
#pragma unroll
      for (int e = 0; e < V; ++e) out.v[e] = convert<T>(acc[j][e] + (bias ? float(b.v[e]) : 0.0f));
      store_vec(dx, pixel_at(n, p.in, i[0], i[1], i[2] + j) * vectors + q, out);
    }
  }
}

// blockIdx.y = split; thread (vector q, filter row (r0, r1)) within the x dimension.
template <class T>
__global__ void depthwise_wgrad(DwParams p, const T* x, const T* dy, int64_t pixels_per_split,
                                float* partial) {
  constexpr int V = kVecWidth<T>;
  const int vectors = p.channels / V;
  const int rows = p.filter[0] * p.filter[1];
  const int job = int(blockIdx.x) * blockDim.x + int(threadIdx.x);
  if (job >= rows * vectors) return;
  const int q = job % vectors, row = job / vectors;
  const int r0 = row / p.filter[1], r1 = row % p.filter[1];
  const int64_t pixels = int64_t(p.batch) * p.out[0] * p.out[1] * p.out[2];
  const int64_t first = int64_t(blockIdx.y) * pixels_per_split;
  const int64_t last = min(pixels, first + pixels_per_split);
  float acc[kMaxFilterWidth][V] = {};  // written out even for an empty range: zeros
  int o[3];
  int n = split_pixel(first < last ? first : 0, p.out, o);  // then stepped (no division)
  for (int64_t pix = first; pix < last; ++pix) {
    const int i0 = o[0] * p.stride[0] - p.pad[0] + r0 * p.dilation[0];
    const int i1 = o[1] * p.stride[1] - p.pad[1] + r1 * p.dilation[1];
    if (inside(i0, p.in[0]) && inside(i1, p.in[1])) {
      const Vec<T> gv = load_vec(dy, pix * vectors + q);
      const int64_t row = pixel_at(n, p.in, i0, i1, 0);
#pragma unroll
      for (int r2 = 0; r2 < kMaxFilterWidth; ++r2) {
        if (r2 >= p.filter[2]) break;
        const int i2 = o[2] * p.stride[2] - p.pad[2] + r2 * p.dilation[2];
        if (!inside(i2, p.in[2])) continue;
        const Vec<T> xv = load_vec(x, (row + i2) * vectors + q);
#pragma unroll
        for (int e = 0; e < V; ++e) acc[r2][e] = fmaf(float(gv.v[e]), float(xv.v[e]), acc[r2][e]);
      }
    }
    if (++o[2] == p.out[2]) {
      o[2] = 0;
      if (++o[1] == p.out[1]) {
        o[1] = 0;
        if (++o[0] == p.out[0]) o[0] = 0, ++n;
      }
    }
  }
  const int64_t taps = int64_t(rows) * p.filter[2];
  float* out = partial + int64_t(blockIdx.y) * taps * p.channels;
#pragma unroll
  for (int r2 = 0; r2 < kMaxFilterWidth; ++r2) {
    if (r2 >= p.filter[2]) break;
    const int64_t tap = int64_t(row) * p.filter[2] + r2;
#pragma unroll
    for (int e = 0; e < V; ++e) out[tap * p.channels + q * V + e] = acc[r2][e];
  }
}

// The filter [C, 1, R...] (any strides) seen as [R..., C]: a view whose contiguous copy is
// the kernels' [taps][C].
DeviceTensor filter_taps_view(const DeviceTensor& w) {
  Shape shape(w.shape.begin() + 2, w.shape.end()), strides(w.strides.begin() + 2, w.strides.end());
  shape.push_back(w.shape[0]);
  strides.push_back(w.strides[0]);
  return w.view(w.offset, shape, strides);
}

// f(integral_constant KW, integral_constant S) for a shape rows_kernel_shape returned.
template <class F>
void with_rows_kernel(std::pair<int, int> shape, F&& f) {
  auto stride = [&](auto kw) {
    if (shape.second == 1)
      f(kw, std::integral_constant<int, 1>{});
    else
      f(kw, std::integral_constant<int, 2>{});
  };
  if (shape.first == 3)
    stride(std::integral_constant<int, 3>{});
  else if (shape.first == 5)
    stride(std::integral_constant<int, 5>{});
  else
    stride(std::integral_constant<int, 7>{});
}

// The rows kernels' loop: fprop and wgrad read x and write / read dy as the node has them;
// dgrad runs fprop's loop over dy into dx with stride 1, the filter flipped and pad
// p' = (R - 1) * d - p (rows.cuh). `run`: outputs per thread along the last dim.
DwRowsParams rows_params(const ConvGeometry& g, ConvOp op, int vec_width, int run) {
  DwRowsParams p;
  const bool dgrad = op == ConvOp::dgrad;
  p.channels = int32_t(g.in_channels);
  for (int d = 0; d < 3; ++d) {
    p.src[d] = int32_t(dgrad ? g.out[d] : g.in[d]);
    p.dst[d] = int32_t(dgrad ? g.in[d] : g.out[d]);
    p.filter[d] = int32_t(g.filter[d]);
    p.stride[d] = int32_t(g.stride[d]);
    p.dilation[d] = int32_t(g.dilation[d]);
    p.pad[d] = int32_t(dgrad ? (g.filter[d] - 1) * g.dilation[d] - g.pad_lo[d] : g.pad_lo[d]);
  }
  p.vectors = FastDivmod(p.channels / vec_width);
  p.runs = FastDivmod((p.dst[2] + run - 1) / run);
  p.dst0 = FastDivmod(p.dst[0]);
  p.dst1 = FastDivmod(p.dst[1]);
  // fprop / dgrad: groups of row_block consecutive rows (a divisor of the rows from 8 down to
  // 4 where there is one: no idle threads), so a block's tap rows overlap in L1.
  p.row_block = std::min<int32_t>(8, p.dst[1]);
  for (int b = 8; b >= 4; --b)
    if (p.dst[1] % b == 0) {
      p.row_block = b;
      break;
    }
  p.row_in_block = FastDivmod(p.row_block);
  p.row_blocks = FastDivmod((p.dst[1] + p.row_block - 1) / p.row_block);
  return p;
}

// fprop / dgrad: one thread per (channel vector, row, run); nullopt past 2^31 threads.
std::optional<int32_t> rows_fprop_threads(const DwRowsParams& p, int64_t batch) {
  const int64_t threads =
      batch * p.dst[0] * p.row_blocks.divisor * p.row_block * p.runs.divisor * p.vectors.divisor;
  if (threads >= (int64_t(1) << 31)) return std::nullopt;
  return int32_t(threads);
}

// wgrad: one thread per (channel vector, filter row, split of the output runs); the splits
// fill the GPU about once (a second wave would only add partial sums to add).
void plan_rows_wgrad(DwRowsParams& p, int64_t batch, int sm_count) {
  const int64_t items = batch * p.dst[0] * p.dst[1] * p.runs.divisor;
  const int64_t jobs = int64_t(p.filter[0]) * p.filter[1] * p.vectors.divisor;
  const int64_t wanted = std::clamp<int64_t>((int64_t(sm_count) * 512 + jobs - 1) / jobs, 1,
                                             std::max<int64_t>(1, items));
  const int64_t per_split = std::max<int64_t>(1, (items + wanted - 1) / wanted);
  const int64_t splits = std::max<int64_t>(1, (items + per_split - 1) / per_split);
  p.items = int32_t(items);
  p.items_per_split = int32_t(per_split);
  p.jobs = FastDivmod(int32_t(jobs));
  p.filter1 = FastDivmod(p.filter[1]);
  p.threads = int32_t(jobs * splits);
}

int64_t rows_wgrad_splits(const DwRowsParams& p) {
  return p.threads / p.jobs.divisor;
}

// ---- ring kernels (ring.cuh) ------------------------------------------------------------
//
// Measured on the H200 (bench/results/2026-11-28_h200_session19/, bf16, N=64): vs cuDNN's
// best plan fprop 1.10-1.60x, dgrad 1.01-3.78x, wgrad 0.90-1.58x (0.99-1.57x with the runs of
// 7: bench/results/2026-11-28_h200_session21_dw_wgrad_sweep/); vs the rows kernels (ms)
// fprop 3x3 C256 at 56^2 0.099 -> 0.080, 7x7 C96 at 56^2 0.131 -> 0.087, C768 at 7^2 0.022
// -> 0.017, wgrad 7x7 C96 0.27 -> 0.11. The stride-2 3x3 fprop stays on the rows kernel
// (0.042 vs 0.045).

// Outputs per thread along a row (fprop / dgrad): 8 on rows of 56+ (fewer input
// conversions per output: 3x3 0.080 vs 0.082 ms, 7x7 C96 0.087 vs 0.111), else 4 (the
// shorter rows measured faster with 4). wgrad: half a vector of channels a thread (7x7:
// acc[7][4], three blocks per SM instead of two: C96 0.160 -> 0.133 ms at 2 outputs), 8
// outputs for 7-wide filters (0.123 ms), 7 where the rows are a multiple of 7 but not of 8
// (ConvNeXt's 28, 14 and 7: runs of 8 there compute 12.5% padding), 4 for the others.
int ring_fprop_run(int64_t dst_w) {
  return dst_w >= 56 ? 8 : 4;
}
// Calls f(std::integral_constant<int, RUN>{}) with the wgrad's run for rows of dst_w outputs.
template <int KW, class F>
void with_ring_wgrad_run(int64_t dst_w, F&& f) {
  if constexpr (KW == 7) {
    if (dst_w % 8 != 0 && dst_w % 7 == 0)
      f(std::integral_constant<int, 7>{});
    else
      f(std::integral_constant<int, 8>{});
  } else {
    f(std::integral_constant<int, 4>{});
  }
}

struct RingLaunch {
  DwRingParams params;
  dim3 block;
  unsigned blocks = 0;
  int shared_bytes = 0;
  int run = 0;
};

// The ring's extents for a channel chunk of `chunk` vectors and `step_rows` output rows a
// step (fprop; wgrad: 1).
DwRingParams ring_params(const ConvGeometry& g, ConvOp op, int kw, int s, int run, int chunk,
                         int step_rows, int vec_width) {
  DwRingParams p;
  const bool dgrad = op == ConvOp::dgrad;
  p.channels = int32_t(g.in_channels);
  p.chunk = chunk;
  p.src_h = int32_t(dgrad ? g.out[1] : g.in[1]);
  p.src_w = int32_t(dgrad ? g.out[2] : g.in[2]);
  p.dst_h = int32_t(dgrad ? g.in[1] : g.out[1]);
  p.dst_w = int32_t(dgrad ? g.in[2] : g.out[2]);
  p.filter_h = int32_t(g.filter[1]);
  p.stride_h = int32_t(dgrad ? 1 : g.stride[1]);
  p.dilation_h = int32_t(g.dilation[1]);
  p.pad_h = int32_t(dgrad ? (g.filter[1] - 1) * g.dilation[1] - g.pad_lo[1] : g.pad_lo[1]);
  p.pad_w = int32_t(dgrad ? g.filter[2] - 1 - g.pad_lo[2] : g.pad_lo[2]);
  p.runs = (p.dst_w + run - 1) / run;
  p.cols = (p.runs * run - 1) * s + kw;
  p.slots =
      (p.filter_h - 1) * p.dilation_h + 1 + ((kRingLookahead + 1) * step_rows - 1) * p.stride_h;
  p.chunks = FastDivmod(int32_t(g.in_channels / vec_width / chunk));
  p.stage = FastDivmod(chunk);
  return p;
}

// Splits each image's rows into k ranges of ceil(rows / k), each at least min(rows, filter
// rows) long (a range re-reads filter rows - stride rows). fprop (`resident` = blocks the
// device holds at once): the k that wastes the least of the last wave (a block is long;
// 3x3 C256: one full wave 0.080 ms, 1.3 waves 0.092), the fewest blocks among equals.
// wgrad (`resident` = 0): the most ranges whose blocks stay within four per SM.
void split_rows(DwRingParams& p, int64_t images, int64_t resident, int sm_count) {
  const int64_t per_range = int64_t(p.chunks.divisor) * images;
  const int shortest = std::min(p.dst_h, p.filter_h);
  int best = 1;
  double best_use = 0;
  for (int k = 1; k <= p.dst_h; ++k) {
    const int rows = (p.dst_h + k - 1) / k;
    if (rows < shortest || (k > 1 && rows == (p.dst_h + k - 2) / (k - 1))) continue;
    const int64_t blocks = per_range * ((p.dst_h + rows - 1) / rows);
    if (resident == 0) {
      if (k == 1 || blocks <= int64_t(4) * sm_count) best = k;
      continue;
    }
    const double use = double(blocks) / double((blocks + resident - 1) / resident * resident);
    if (use > best_use + 1e-9) best = k, best_use = use;
  }
  p.rows_per_split = (p.dst_h + best - 1) / best;
  p.splits = FastDivmod((p.dst_h + p.rows_per_split - 1) / p.rows_per_split);
}

// fprop / dgrad: chunk = the largest of 16, 12, 8, 4 vectors dividing C / V whose shared
// memory stays within 100 KiB; G = the runs of a row; R = 4 output rows a step (2 where
// chunk * G is past 64: at most 256 threads) — a step's rows share the ring (7x7 C96: 0.111
// ms at R = 1, 0.087 at 4). nullopt when nothing launches.
template <class T, int KW, DwRowsMode kMode, int RUN>
std::optional<RingLaunch> plan_ring_fprop_run(const ConvGeometry& g, ConvOp op,
                                              const DeviceProperties& props) {
  constexpr int V = kVecWidth<T>;
  const int vectors = int(g.in_channels / V);
  for (int chunk : {16, 12, 8, 4}) {
    if (vectors % chunk != 0) continue;
    RingLaunch l;
    l.run = RUN;
    const int runs = int((op == ConvOp::dgrad ? g.in[2] : g.out[2]) + RUN - 1) / RUN;
    const int G = std::min(runs, 256 / chunk);
    int step_rows = 4;
    while (step_rows > 1 && chunk * G * step_rows > 256) step_rows /= 2;
    l.params = ring_params(g, op, KW, 1, RUN, chunk, step_rows, V);
    l.shared_bytes = ring_shared_bytes<T, RUN>(l.params, KW, false);
    if (l.shared_bytes > 100 * 1024) continue;
    l.block = dim3(unsigned(chunk), unsigned(G), unsigned(step_rows));
    const unsigned resident = persistent_grid(
        BoundKernel<decltype(&depthwise_ring_fprop<T, KW, 1, kMode, RUN>)>{
            &depthwise_ring_fprop<T, KW, 1, kMode, RUN>, 256},
        chunk * G * step_rows, size_t(l.shared_bytes), props, int64_t(1) << 40);
    if (resident == 0) continue;
    split_rows(l.params, g.batch * g.out[0], resident, props.sm_count);
    l.blocks =
        unsigned(int64_t(l.params.chunks.divisor) * l.params.splits.divisor * g.batch * g.out[0]);
    return l;
  }
  return std::nullopt;
}

template <class T, int KW, DwRowsMode kMode>
std::optional<RingLaunch> plan_ring_fprop(const ConvGeometry& g, ConvOp op,
                                          const DeviceProperties& props) {
  if (ring_fprop_run(op == ConvOp::dgrad ? g.in[2] : g.out[2]) == 8)
    return plan_ring_fprop_run<T, KW, kMode, 8>(g, op, props);
  return plan_ring_fprop_run<T, KW, kMode, 4>(g, op, props);
}

// wgrad: chunk = the largest power of two from 16 down to 4 dividing C / V whose shared
// memory stays within 80 KiB (3x3 C256: 8, 7x7 C768: 16), a warp of G = 32 / (2 chunk) runs
// per filter row; about four blocks per SM (its ranges are summed after: fewer, longer ranges
// than the fprop's one wave measured best).
template <class T, int KW, int S, int RUN>
std::optional<RingLaunch> plan_ring_wgrad(const ConvGeometry& g, const DeviceProperties& props) {
  constexpr int V = kVecWidth<T>, L = V / 2;
  const int vectors = int(g.in_channels / V);
  for (int chunk = 16; chunk >= 4; chunk /= 2) {
    if (vectors % chunk != 0) continue;
    RingLaunch l;
    l.run = RUN;
    l.params = ring_params(g, ConvOp::wgrad, KW, S, RUN, chunk, 1, V);
    l.shared_bytes = ring_shared_bytes<T, RUN>(l.params, KW, true);
    if (l.shared_bytes > 80 * 1024) continue;
    const int pieces = chunk * V / L;
    l.block = dim3(unsigned(pieces), unsigned(32 / pieces), unsigned(g.filter[1]));
    const unsigned resident = persistent_grid(
        BoundKernel<decltype(&depthwise_ring_wgrad<T, KW, S, RUN, L>)>{
            &depthwise_ring_wgrad<T, KW, S, RUN, L>, 256},
        32 * int(g.filter[1]), size_t(l.shared_bytes), props, int64_t(1) << 40);
    if (resident == 0) continue;
    split_rows(l.params, g.batch * g.out[0], 0, props.sm_count);
    l.blocks =
        unsigned(int64_t(l.params.chunks.divisor) * l.params.splits.divisor * g.batch * g.out[0]);
    return l;
  }
  return std::nullopt;
}

// ", ring (12 vectors x 7 runs of 4 x 2 rows a step, 14 rows a block, 256 blocks)".
std::string ring_description(const RingLaunch& l, ConvOp op) {
  return cat(", ring (", l.params.chunk, " vectors x ", l.params.runs, " runs of ", l.run, " x ",
             op == ConvOp::wgrad ? 1u : l.block.z, " rows a step, ", l.params.rows_per_split,
             " rows a block, ", l.blocks, " blocks)");
}

}  // namespace

std::string run_depthwise(Context& ctx, const Node& n, ConvOp op, Inputs in, Outputs out,
                          const ConvEpilogueOperands& e) {
  const ConvGeometry g = conv_geometry_of(n, op, in, out[0]);
  DwParams p;
  p.batch = int32_t(g.batch);
  p.channels = int32_t(g.in_channels);
  for (int d = 0; d < 3; ++d) {
    p.in[d] = int32_t(g.in[d]), p.out[d] = int32_t(g.out[d]), p.filter[d] = int32_t(g.filter[d]);
    p.stride[d] = int32_t(g.stride[d]), p.pad[d] = int32_t(g.pad_lo[d]);
    p.dilation[d] = int32_t(g.dilation[d]);
  }
  p.activation = activation_fn(e.activation);
  p.residual_activation = activation_fn(e.residual_activation);
  std::vector<DeviceTensor> keep;
  keep.reserve(8);
  const ConvRoles roles = conv_roles(op, in, out[0]);
  const DeviceTensor *x = roles.x, *w = roles.w, *y = roles.y;
  DeviceTensor& result = out[0];
  const DType dtype = result.dtype;
  const int64_t taps = g.filter_size();
  std::string plan = cat("depthwise ", dtype_name(dtype), " ", conv_op_name(op), " ", g.filter[0],
                         "x", g.filter[1], "x", g.filter[2]);

  visit_device_float(n, dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, double>) {
      throw Error(node_label(n), "depthwise kernels take f32, f16 and bf16");
    } else {
      if (op == ConvOp::wgrad) {
        const DeviceTensor& xs = channels_last_operand(ctx, *x, keep);
        const DeviceTensor& dys = channels_last_operand(ctx, *y, keep);
        FUSEBOX_CHECK(aligned16(&xs) && aligned16(&dys), node_label(n),
                      "depthwise: operands not 16-byte aligned");
        const int vectors = p.channels / kVecWidth<T>;
        const int64_t count = taps * p.channels;
        DeviceTensor summed = temporary_tensor(ctx, dtype, {taps, int64_t(p.channels)});
        DeviceTensor partial;
        int64_t splits = 1;
        const auto rows = rows_kernel_shape(g, op);
        bool ring = false;
        if (ring_shape(g, op, rows, kVecWidth<T>)) {
          with_rows_kernel(rows, [&](auto kw, auto s) {
            constexpr int KW = decltype(kw)::value, S = decltype(s)::value;
            with_ring_wgrad_run<KW>(g.out[2], [&](auto run) {
              constexpr int RUN = decltype(run)::value;
              const std::optional<RingLaunch> l =
                  plan_ring_wgrad<T, KW, S, RUN>(g, ctx.device.properties());
              if (!l) return;
              splits = int64_t(l->params.splits.divisor) * g.batch * g.out[0];
              partial = temporary_tensor(ctx, DType::f32, {splits * count});
              ctx.encoder.launch(&depthwise_ring_wgrad<T, KW, S, RUN, kVecWidth<T> / 2>,
                                 dim3(l->blocks), l->block, size_t(l->shared_bytes),
                                 {xs.range(), dys.range()}, {partial.range()}, l->params,
                                 xs.as<const T>(), dys.as<const T>(), partial.as<float>());
              plan += ring_description(*l, op);
              ring = true;
            });
          });
        }
        if (ring) {
        } else if (rows.first != 0) {
          with_rows_kernel(rows, [&](auto kw, auto s) {
            constexpr int KW = decltype(kw)::value, S = decltype(s)::value;
            DwRowsParams rp = rows_params(g, op, kVecWidth<T>, kDepthwiseWgradRun<KW, S>);
            plan_rows_wgrad(rp, g.batch, ctx.device.properties().sm_count);
            splits = rows_wgrad_splits(rp);
            partial = temporary_tensor(ctx, DType::f32, {splits * count});
            ctx.encoder.launch(&depthwise_rows_wgrad<T, KW, S>,
                               dim3(unsigned((rp.threads + kThreads - 1) / kThreads)),
                               dim3(kThreads), 0, {xs.range(), dys.range()}, {partial.range()}, rp,
                               xs.as<const T>(), dys.as<const T>(), partial.as<float>());
          });
          plan += ", rows";
        } else {
          const int rows_of_filter = p.filter[0] * p.filter[1];
          const int64_t pixels = g.batch * g.out_size();
          const unsigned blocks_x =
              unsigned((int64_t(rows_of_filter) * vectors + kThreads - 1) / kThreads);
          // Splits: about four waves of 256-thread blocks, at least 64 pixels each.
          const int64_t target =
              std::max<int64_t>(1, 4 * 132 * 4 / std::max<unsigned>(1, blocks_x));
          const int64_t wanted = std::clamp<int64_t>(target, 1, std::max<int64_t>(1, pixels / 64));
          const int64_t per_split = std::max<int64_t>(1, (pixels + wanted - 1) / wanted);
          // None of them empty (an empty batch: one split of zeros).
          splits = std::max<int64_t>(1, (pixels + per_split - 1) / per_split);
          partial = temporary_tensor(ctx, DType::f32, {splits * count});
          ctx.encoder.launch(&depthwise_wgrad<T>, dim3(blocks_x, unsigned(splits)), dim3(kThreads),
                             0, {xs.range(), dys.range()}, {partial.range()}, p, xs.as<const T>(),
                             dys.as<const T>(), per_split, partial.as<float>());
        }
        record_sum_splits<T>(ctx, partial.range(), partial.as<const float>(), splits, count,
                             summed.range(), summed.as<T>());
        // [taps][C] into dw's own layout.
        copy_strided(ctx,
                     summed.view(summed.offset, filter_taps_view(result).shape,
                                 contiguous_strides(filter_taps_view(result).shape)),
                     filter_taps_view(result));
        plan += cat(", ", splits, " splits");
        return;
      }
      // fprop / dgrad: the filter as [taps][C].
      const DeviceTensor taps_view = filter_taps_view(*w);
      keep.push_back(temporary_tensor(ctx, dtype, taps_view.shape));
      copy_strided(ctx, taps_view, keep.back());
      const DeviceTensor& wt = keep.back();
      const DeviceTensor& src = channels_last_operand(ctx, op == ConvOp::fprop ? *x : *y, keep);
      const DeviceTensor* bias = e.bias ? &contiguous_operand(ctx, *e.bias, keep) : nullptr;
      const DeviceTensor* residual =
          e.residual ? &channels_last_operand(ctx, *e.residual, keep) : nullptr;
      const bool direct_out = result.is_channels_last();
      std::optional<DeviceTensor> staged;
      if (!direct_out)
        staged = temporary_tensor(ctx, dtype, result.shape, MemoryFormat::channels_last);
      const DeviceTensor& written = direct_out ? result : *staged;
      FUSEBOX_CHECK(aligned16(&src) && aligned16(&wt) && aligned16(bias) && aligned16(residual) &&
                        aligned16(&written),
                    node_label(n), "depthwise: operands not 16-byte aligned");
      BufferList reads = {src.range(), wt.range()};
      if (bias) reads.push_back(bias->range());
      if (residual) reads.push_back(residual->range());
      const ConvGeometry& gg = g;
      const int64_t last = op == ConvOp::fprop ? gg.out[2] : gg.in[2];
      const int64_t work =
          written.numel() / kVecWidth<T> / std::max<int64_t>(1, last) * ((last + kRun - 1) / kRun);
      bool launched = false;
      if (const auto rows = rows_kernel_shape(g, op); rows.first != 0) {
        with_rows_kernel(rows, [&](auto kw, auto s) {
          constexpr int KW = decltype(kw)::value, S = decltype(s)::value;
          // dgrad's epilogue is the bias alone.
          const bool fused =
              op == ConvOp::fprop && (residual || p.activation.kind != ActivationFn::none);
          if constexpr (S == 1) {
            auto launch_ring = [&](auto mode) {
              constexpr DwRowsMode kMode = decltype(mode)::value;
              std::optional<RingLaunch> l =
                  plan_ring_fprop<T, KW, kMode>(g, op, ctx.device.properties());
              if (!l) return false;
              l->params.activation = p.activation;
              l->params.residual_activation = p.residual_activation;
              const auto kernel = l->run == 8 ? &depthwise_ring_fprop<T, KW, 1, kMode, 8>
                                              : &depthwise_ring_fprop<T, KW, 1, kMode, 4>;
              ctx.encoder.launch(kernel, dim3(l->blocks), l->block, size_t(l->shared_bytes), reads,
                                 {written.range()}, l->params, src.as<const T>(), wt.as<const T>(),
                                 bias ? bias->as<const T>() : nullptr,
                                 fused && residual ? residual->as<const T>() : nullptr,
                                 written.as<T>());
              plan += ring_description(*l, op);
              return true;
            };
            using Mode = DwRowsMode;
            if (ring_shape(g, op, rows, kVecWidth<T>) &&
                (op == ConvOp::dgrad ? launch_ring(std::integral_constant<Mode, Mode::dgrad>{})
                 : fused ? launch_ring(std::integral_constant<Mode, Mode::fprop_fused>{})
                         : launch_ring(std::integral_constant<Mode, Mode::fprop>{}))) {
              launched = true;
              return;
            }
          }
          DwRowsParams rp = rows_params(g, op, kVecWidth<T>, kDepthwiseFpropRun);
          const std::optional<int32_t> threads = rows_fprop_threads(rp, g.batch);
          if (!threads) return;
          rp.threads = *threads;
          if (fused) rp.activation = p.activation, rp.residual_activation = p.residual_activation;
          auto kernel = fused ? &depthwise_rows_fprop<T, KW, S, DwRowsMode::fprop_fused>
                              : &depthwise_rows_fprop<T, KW, S, DwRowsMode::fprop>;
          if constexpr (S == 1)  // rows_kernel_shape: a dgrad's stride is 1
            if (op == ConvOp::dgrad) kernel = &depthwise_rows_fprop<T, KW, S, DwRowsMode::dgrad>;
          ctx.encoder.launch(kernel, dim3(unsigned((rp.threads + kThreads - 1) / kThreads)),
                             dim3(kThreads), 0, reads, {written.range()}, rp, src.as<const T>(),
                             wt.as<const T>(), bias ? bias->as<const T>() : nullptr,
                             fused && residual ? residual->as<const T>() : nullptr,
                             written.as<T>());
          launched = true;
          plan += ", rows";
        });
      }
      if (!launched && op == ConvOp::fprop) {
        ctx.encoder.launch(&depthwise_fprop<T>, dim3(launch_blocks(work, kThreads)), dim3(kThreads),
                           0, reads, {written.range()}, p, src.as<const T>(), wt.as<const T>(),
                           bias ? bias->as<const T>() : nullptr,
                           residual ? residual->as<const T>() : nullptr, written.as<T>());
      } else if (!launched) {
        ctx.encoder.launch(&depthwise_dgrad<T>, dim3(launch_blocks(work, kThreads)), dim3(kThreads),
                           0, reads, {written.range()}, p, src.as<const T>(), wt.as<const T>(),
                           bias ? bias->as<const T>() : nullptr, written.as<T>());
      }
      if (staged) copy_strided(ctx, *staged, result);
    }
  });
  return plan;
}

}  // namespace fusebox::cuda
