// batch_norm's channels-last stages 1 and 3 (kernels/batch_norm/common.cuh has the whole scheme;
// kernels/batch_norm/batch_norm.cu the entry points and stage 2).
//
// A dense channels-last x [N, C, D...] is, in memory, a row-major [rows, C] matrix with
// rows = N * prod(D): a channel is a column, its statistics are column reductions, and
// the elementwise passes see channel = element % C. Every kernel here tiles that matrix
// the same way. The columns are cut into *units* of W adjacent channels (W = the 16-byte
// vector width when C is a multiple of it and every pointer is aligned, else 1). A block
// is blockDim.x units wide (at most 32) and blockDim.y rows tall (blockDim.x * blockDim.y
// <= 256); thread (tx, ty) owns unit blockIdx.x * blockDim.x + tx, i.e. the same W
// channels, on every row it visits: rows ty, ty + blockDim.y, ... of its block's rows.
// With x fastest, a warp reads consecutive units of a row (and, when the tile spans the
// whole row, of the next rows too): one contiguous span, 16-byte accesses. Per-channel
// state (Welford triples, sums, coefficients) stays in the thread's registers.
//   stats (training forward): block (i, j) reduces row chunk j of its W * blockDim.x
//     channels: a Welford update per element (the W channels of a thread share one count,
//     so one reciprocal per row), then its blockDim.y triples per channel merge in a fixed
//     tree through shared memory; row ty = 0 writes chunk j's triple of each channel;
//   backward sums: the same shape with sums of dy and dy * x_hat;
//   apply (y) and dx: a grid-stride walk over rows, elementwise from the channel's
//     coefficients, loaded once per thread.
// A fused relu (kRelu, kMask, common.cuh): apply stores relu(y); the backward sums and dx
// mask each unit of dy by relu's gradient at y, read beside it or recomputed from x. A dy in
// two terms (kAddend) is summed as each unit is loaded; the sums may store the dy they used.
// Loops load kUnroll rows before using any, to keep enough bytes in flight per thread.
// Deterministic: fixed chunks, fixed trees, no atomics.
#include <algorithm>
#include <initializer_list>
#include <optional>
#include <type_traits>

#include "backends/cuda/kernels/batch_norm/common.cuh"
#include "backends/cuda/kernels/common/occupancy.cuh"
#include "backends/cuda/kernels/norm/common.h"

namespace fusebox::cuda::bn {

namespace {

constexpr int kMaxTileUnits = 32;     // units per block row (one warp's worth)
constexpr int kUnroll = 4;            // rows loaded at once (one tensor read)
constexpr int kUnrollBackward = 2;    // rows loaded at once (two tensors read)
constexpr int kMinRowsPerThread = 8;  // stage 1: each thread reduces at least this many rows

// Unit i of p as W compute values (one 16-byte vector, or one element when W == 1).
template <int W, class T>
__device__ __forceinline__ void load_unit(const T* p, int64_t i, compute_t<T> (&out)[W]) {
  if constexpr (W == 1) {
    out[0] = load_compute(p, i);
  } else {
    const Vec<T> v = load_vec(p, i);
#pragma unroll
    for (int w = 0; w < W; ++w) out[w] = convert<compute_t<T>>(v.v[w]);
  }
}
template <int W, class T>
__device__ __forceinline__ void store_unit(T* p, int64_t i, const compute_t<T> (&in)[W]) {
  if constexpr (W == 1) {
    store_compute(p, i, in[0]);
  } else {
    Vec<T> v;
#pragma unroll
    for (int w = 0; w < W; ++w) v.v[w] = convert<T>(in[w]);
    store_vec(p, i, v);
  }
}

// A unit's per-channel coefficients of the forward's affine map (MaskFrom::x).
template <class C, int W>
struct AffineUnit {
  C mean[W], k[W], bias[W];
};

// Unit i of dy as the backward uses it: plus the addend's unit (kAddend), masked by relu's
// gradient at y (kMask; xv, the unit of x, and a, its channels' coefficients, with
// MaskFrom::x).
template <int W, MaskFrom kMask, bool kAddend, class T>
__device__ __forceinline__ void load_dy_unit(const T* dy, const T* addend, const T* y, int64_t i,
                                             const compute_t<T> (&xv)[W],
                                             const AffineUnit<compute_t<T>, W>& a,
                                             compute_t<T> (&g)[W]) {
  load_unit<W>(dy, i, g);
  if constexpr (kAddend) {
    compute_t<T> other[W];
    load_unit<W>(addend, i, other);
#pragma unroll
    for (int w = 0; w < W; ++w) g[w] = add_terms<T>(g[w], other[w]);
  }
  if constexpr (kMask == MaskFrom::y) {
    compute_t<T> yv[W];
    load_unit<W>(y, i, yv);
#pragma unroll
    for (int w = 0; w < W; ++w) g[w] = relu_gradient<T>(g[w], yv[w]);
  } else if constexpr (kMask == MaskFrom::x) {
#pragma unroll
    for (int w = 0; w < W; ++w)
      g[w] = relu_gradient_at_x<T>(g[w], xv[w], a.mean[w], a.k[w], a.bias[w]);
  }
}

// The smallest power of two >= n: the span of the blockDim.y-way merge trees.
__device__ __forceinline__ int tree_span(int n) {
  int span = 1;
  while (span < n) span *= 2;
  return span;
}

// ---- stage 1 ----------------------------------------------------------------------------

// Training forward: partial[c * chunks + j] = the Welford triple of channel c over row
// chunk j = blockIdx.y (rows [j * rows_per_chunk, min(rows, (j + 1) * rows_per_chunk))).
template <class T, int W>
__global__ void __launch_bounds__(kThreads)
    bn_cl_stats(const T* __restrict__ x, int64_t rows, int64_t units, int64_t rows_per_chunk,
                Moments<compute_t<T>>* __restrict__ partial) {
  using C = compute_t<T>;
  __shared__ C shared_count[kThreads];
  __shared__ C shared_mean[W][kThreads];
  __shared__ C shared_m2[W][kThreads];
  const int64_t unit = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t first = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t last = min(rows, first + rows_per_chunk);
  C count = 0, mean[W], m2[W];
#pragma unroll
  for (int w = 0; w < W; ++w) mean[w] = m2[w] = C(0);
  auto update = [&](const C(&v)[W]) {
    count += C(1);
    const C inv_count = C(1) / count;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const C d = v[w] - mean[w];
      mean[w] += d * inv_count;
      m2[w] += d * (v[w] - mean[w]);
    }
  };
  if (unit < units) {
    const int64_t step = blockDim.y;
    int64_t r = first + threadIdx.y;
    for (; r + (kUnroll - 1) * step < last; r += kUnroll * step) {
      C v[kUnroll][W];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) load_unit<W>(x, (r + u * step) * units + unit, v[u]);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) update(v[u]);
    }
    for (; r < last; r += step) {
      C v[W];
      load_unit<W>(x, r * units + unit, v);
      update(v);
    }
  }
  // Merge the column's blockDim.y triples: at each step, row ty < s takes row ty + s's.
  const int t = threadIdx.y * blockDim.x + threadIdx.x;
  shared_count[t] = count;
#pragma unroll
  for (int w = 0; w < W; ++w) {
    shared_mean[w][t] = mean[w];
    shared_m2[w][t] = m2[w];
  }
  const int ty = int(threadIdx.y), tile_rows = int(blockDim.y);
  for (int s = tree_span(tile_rows) / 2; s > 0; s /= 2) {
    __syncthreads();
    if (ty < s && ty + s < tile_rows) {
      const int o = t + s * blockDim.x;
      const C other = shared_count[o];
#pragma unroll
      for (int w = 0; w < W; ++w) {
        const Moments<C> m = merge(Moments<C>{count, mean[w], m2[w]},
                                   Moments<C>{other, shared_mean[w][o], shared_m2[w][o]});
        mean[w] = m.mean;
        m2[w] = m.m2;
        shared_mean[w][t] = m.mean;
        shared_m2[w][t] = m.m2;
      }
      count += other;
      shared_count[t] = count;
    }
  }
  if (threadIdx.y == 0 && unit < units) {
#pragma unroll
    for (int w = 0; w < W; ++w)
      partial[(unit * W + w) * gridDim.y + blockIdx.y] = Moments<C>{count, mean[w], m2[w]};
  }
}

// Backward: partial[2 (c * chunks + j)] = sum of dy, [.. + 1] = sum of dy * x_hat, over
// row chunk j = blockIdx.y of channel c (as bn_cl_stats); `used`, when not null, gets each
// unit of dy as summed. The saved statistics (P: T, or f32 for mixed precision) are read
// element by element, once per thread: a unit of W activations is not a unit of W statistics
// when P is wider than T.
template <class T, class P, int W, MaskFrom kMask, bool kAddend>
__global__ void __launch_bounds__(kThreads)
    bn_cl_backward_sums(const T* __restrict__ x, const T* __restrict__ dy,
                        const T* __restrict__ addend, const T* __restrict__ y,
                        const P* __restrict__ saved_mean, const P* __restrict__ saved_inv_std,
                        const P* __restrict__ scale, const P* __restrict__ bias,
                        T* __restrict__ used, int64_t rows, int64_t units, int64_t rows_per_chunk,
                        compute_t<T>* __restrict__ partial) {
  using C = compute_t<T>;
  __shared__ C shared_dy[W][kThreads];
  __shared__ C shared_dyx[W][kThreads];
  const int64_t unit = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t first = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t last = min(rows, first + rows_per_chunk);
  C sum_dy[W], sum_dyx[W];
#pragma unroll
  for (int w = 0; w < W; ++w) sum_dy[w] = sum_dyx[w] = C(0);
  if (unit < units) {
    C mean[W], inv_std[W];
    AffineUnit<C, W> a{};
#pragma unroll
    for (int w = 0; w < W; ++w) {
      mean[w] = convert<C>(saved_mean[unit * W + w]);
      inv_std[w] = convert<C>(saved_inv_std[unit * W + w]);
      if constexpr (kMask == MaskFrom::x) {
        a.mean[w] = mean[w];
        a.k[w] = scaled_inv_std<C>(scale[unit * W + w], saved_inv_std[unit * W + w]);
        a.bias[w] = convert<C>(bias[unit * W + w]);
      }
    }
    auto update = [&](const C(&xv)[W], const C(&g)[W]) {
#pragma unroll
      for (int w = 0; w < W; ++w) {
        sum_dy[w] += g[w];
        sum_dyx[w] += g[w] * (xv[w] - mean[w]) * inv_std[w];
      }
    };
    const int64_t step = blockDim.y;
    int64_t r = first + threadIdx.y;
    for (; r + (kUnrollBackward - 1) * step < last; r += kUnrollBackward * step) {
      C xv[kUnrollBackward][W], g[kUnrollBackward][W];
#pragma unroll
      for (int u = 0; u < kUnrollBackward; ++u) {
        load_unit<W>(x, (r + u * step) * units + unit, xv[u]);
        load_dy_unit<W, kMask, kAddend>(dy, addend, y, (r + u * step) * units + unit, xv[u], a,
                                        g[u]);
      }
#pragma unroll
      for (int u = 0; u < kUnrollBackward; ++u) {
        update(xv[u], g[u]);
        if (used) store_unit<W>(used, (r + u * step) * units + unit, g[u]);
      }
    }
    for (; r < last; r += step) {
      C xv[W], g[W];
      load_unit<W>(x, r * units + unit, xv);
      load_dy_unit<W, kMask, kAddend>(dy, addend, y, r * units + unit, xv, a, g);
      update(xv, g);
      if (used) store_unit<W>(used, r * units + unit, g);
    }
  }
  const int t = threadIdx.y * blockDim.x + threadIdx.x;
#pragma unroll
  for (int w = 0; w < W; ++w) {
    shared_dy[w][t] = sum_dy[w];
    shared_dyx[w][t] = sum_dyx[w];
  }
  const int ty = int(threadIdx.y), tile_rows = int(blockDim.y);
  for (int s = tree_span(tile_rows) / 2; s > 0; s /= 2) {
    __syncthreads();
    if (ty < s && ty + s < tile_rows) {
      const int o = t + s * blockDim.x;
#pragma unroll
      for (int w = 0; w < W; ++w) {
        sum_dy[w] += shared_dy[w][o];
        sum_dyx[w] += shared_dyx[w][o];
        shared_dy[w][t] = sum_dy[w];
        shared_dyx[w][t] = sum_dyx[w];
      }
    }
  }
  if (threadIdx.y == 0 && unit < units) {
#pragma unroll
    for (int w = 0; w < W; ++w) {
      C* out = partial + ((unit * W + w) * gridDim.y + blockIdx.y) * 2;
      out[0] = sum_dy[w];
      out[1] = sum_dyx[w];
    }
  }
}

// ---- stage 3 ----------------------------------------------------------------------------

// y = (x - mean) * k + bias (+ residual when given; relu'd with kRelu), rows walked
// grid-stride.
template <class T, int W, bool kRelu>
__global__ void __launch_bounds__(kThreads)
    bn_cl_apply(const T* __restrict__ x, const T* __restrict__ residual, T* __restrict__ y,
                int64_t rows, int64_t units, const Coefficients<compute_t<T>>* __restrict__ coef) {
  using C = compute_t<T>;
  const int64_t unit = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (unit >= units) return;
  C mean[W], k[W], bias[W];
#pragma unroll
  for (int w = 0; w < W; ++w) {
    const Coefficients<C> c = coef[unit * W + w];
    mean[w] = c.mean;
    k[w] = c.k;
    bias[w] = c.bias;
  }
  auto apply = [&](int64_t row, C(&v)[W]) {
#pragma unroll
    for (int w = 0; w < W; ++w) v[w] = affine(v[w], mean[w], k[w], bias[w]);
    if (residual) {
      C r[W];
      load_unit<W>(residual, row * units + unit, r);
#pragma unroll
      for (int w = 0; w < W; ++w) v[w] = add_residual<T>(v[w], r[w]);
    }
#pragma unroll
    for (int w = 0; w < W; ++w) v[w] = activate<T, kRelu>(v[w]);
    store_unit<W>(y, row * units + unit, v);
  };
  const int64_t step = int64_t(gridDim.y) * blockDim.y;
  int64_t r = int64_t(blockIdx.y) * blockDim.y + threadIdx.y;
  for (; r + (kUnroll - 1) * step < rows; r += kUnroll * step) {
    C v[kUnroll][W];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) load_unit<W>(x, (r + u * step) * units + unit, v[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) apply(r + u * step, v[u]);
  }
  for (; r < rows; r += step) {
    C v[W];
    load_unit<W>(x, r * units + unit, v);
    apply(r, v);
  }
}

// dx = k * (dy - mean_dy - x_hat * mean_dyx), x_hat = (x - mean) * inv_std (dy summed and
// masked as the sums').
template <class T, int W, MaskFrom kMask, bool kAddend>
__global__ void __launch_bounds__(kThreads)
    bn_cl_backward_dx(const T* __restrict__ x, const T* __restrict__ dy,
                      const T* __restrict__ addend, const T* __restrict__ y, T* __restrict__ dx,
                      int64_t rows, int64_t units,
                      const Coefficients<compute_t<T>>* __restrict__ coef) {
  using C = compute_t<T>;
  const int64_t unit = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (unit >= units) return;
  Coefficients<C> c[W];
  AffineUnit<C, W> a{};
#pragma unroll
  for (int w = 0; w < W; ++w) {
    c[w] = coef[unit * W + w];
    a.mean[w] = c[w].mean;
    a.k[w] = c[w].k;
    a.bias[w] = c[w].bias;
  }
  auto gradient = [&](int64_t row, const C(&xv)[W], const C(&g)[W]) {
    C out[W];
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const C x_hat = (xv[w] - c[w].mean) * c[w].inv_std;
      out[w] = c[w].k * (g[w] - c[w].mean_dy - x_hat * c[w].mean_dyx);
    }
    store_unit<W>(dx, row * units + unit, out);
  };
  const int64_t step = int64_t(gridDim.y) * blockDim.y;
  int64_t r = int64_t(blockIdx.y) * blockDim.y + threadIdx.y;
  for (; r + (kUnrollBackward - 1) * step < rows; r += kUnrollBackward * step) {
    C xv[kUnrollBackward][W], g[kUnrollBackward][W];
#pragma unroll
    for (int u = 0; u < kUnrollBackward; ++u) {
      load_unit<W>(x, (r + u * step) * units + unit, xv[u]);
      load_dy_unit<W, kMask, kAddend>(dy, addend, y, (r + u * step) * units + unit, xv[u], a, g[u]);
    }
#pragma unroll
    for (int u = 0; u < kUnrollBackward; ++u) gradient(r + u * step, xv[u], g[u]);
  }
  for (; r < rows; r += step) {
    C xv[W], g[W];
    load_unit<W>(x, r * units + unit, xv);
    load_dy_unit<W, kMask, kAddend>(dy, addend, y, r * units + unit, xv, a, g);
    gradient(r, xv, g);
  }
}

// ---- host -------------------------------------------------------------------------------

// The [rows, channels] matrix cut into units and block tiles (see the top of the file).
struct Tiling {
  int64_t channels = 0;
  int64_t rows = 0;
  int64_t units = 0;  // units per row
  bool vector = false;
  dim3 block;  // (units, rows) of a tile
  unsigned col_tiles = 1;
};

// W is the vector width when every operand allows it (channels % W == 0, 16-byte aligned;
// null operands skipped).
template <class T>
Tiling tiling_for(const DeviceTensor& x, std::initializer_list<const DeviceTensor*> operands) {
  constexpr int W = kVecWidth<T>;
  Tiling t;
  t.channels = x.shape.at(1);
  t.rows = x.numel() / t.channels;
  t.vector = W > 1 && t.channels % W == 0;
  for (const DeviceTensor* p : operands)
    t.vector = t.vector && (!p || is_aligned(p->data(), kVecBytes));
  t.units = t.channels / (t.vector ? W : 1);
  const int tile_units = int(std::min<int64_t>(t.units, kMaxTileUnits));
  t.block = dim3(unsigned(tile_units), unsigned(kThreads / tile_units));
  t.col_tiles = unsigned((t.units + tile_units - 1) / tile_units);
  return t;
}

// How many row blocks of `kernel` (over t.col_tiles column tiles) fit on the device at once:
// the sums and the elementwise passes run one wave of them. Every block has the same rows to
// do, so a grid of 1.33 waves (a fixed 4 blocks per SM where 74-register blocks fit 3)
// takes as long as two.
template <class Kernel>
int64_t row_blocks_per_wave(Context& ctx, const Tiling& t, Kernel kernel) {
  const DeviceProperties& props = ctx.device.properties();
  const unsigned resident = persistent_grid(BoundKernel<Kernel>{kernel, kThreads},
                                            int(t.block.x * t.block.y), 0, props, INT64_MAX);
  FUSEBOX_CHECK(resident > 0, "batch_norm", "a ", t.block.x, "x", t.block.y,
                " block of its channels-last kernel does not launch on this device");
  return std::max<int64_t>(1, int64_t(resident) / t.col_tiles);
}

// Stage 1's grid: one wave (row_blocks_per_wave) of row chunks, at least kMinRowsPerThread
// rows per thread.
template <class Kernel>
dim3 chunk_grid(Context& ctx, const Tiling& t, Kernel kernel, int64_t& rows_per_chunk) {
  const int64_t wanted = row_blocks_per_wave(ctx, t, kernel);
  const int64_t most = std::max<int64_t>(1, t.rows / (int64_t(t.block.y) * kMinRowsPerThread));
  const int64_t chunks = std::clamp<int64_t>(wanted, 1, std::min<int64_t>(most, 65535));
  rows_per_chunk = (t.rows + chunks - 1) / chunks;
  return dim3(t.col_tiles, unsigned((t.rows + rows_per_chunk - 1) / rows_per_chunk));
}

// Stage 3's grid: at most one wave (row_blocks_per_wave), each thread walking at least
// kUnroll rows.
template <class Kernel>
dim3 walk_grid(Context& ctx, const Tiling& t, Kernel kernel) {
  const int64_t per_block = int64_t(t.block.y) * kUnroll;
  const int64_t wanted = row_blocks_per_wave(ctx, t, kernel);
  const int64_t row_blocks = std::clamp<int64_t>((t.rows + per_block - 1) / per_block, 1,
                                                 std::min<int64_t>(wanted, 65535));
  return dim3(t.col_tiles, unsigned(row_blocks));
}

// Calls f(std::integral_constant<int, W>{}) with the tiling's unit width.
template <class T, class F>
void with_width(const Tiling& t, F&& f) {
  if (t.vector)
    f(std::integral_constant<int, kVecWidth<T>>{});
  else
    f(std::integral_constant<int, 1>{});
}

}  // namespace

template <class T>
Partials channels_last_stats(Context& ctx, const DeviceTensor& x) {
  using C = compute_t<T>;
  const Tiling t = tiling_for<T>(x, {&x});
  int64_t rows_per_chunk = 0;
  std::optional<Partials> p;  // sized by the grid, which depends on the kernel
  with_width<T>(t, [&](auto width) {
    const auto kernel = &bn_cl_stats<T, decltype(width)::value>;
    const dim3 grid = chunk_grid(ctx, t, kernel, rows_per_chunk);
    p.emplace(
        ctx.encoder.temporary(ctx.allocator, size_t(t.channels) * grid.y * sizeof(Moments<C>)),
        grid.y);
    ctx.encoder.launch(kernel, grid, t.block, 0, {x.range()}, {p->buffer}, x.as<const T>(), t.rows,
                       t.units, rows_per_chunk, static_cast<Moments<C>*>(p->buffer.data()));
  });
  return *p;
}

template <class T>
void channels_last_apply(Context& ctx, const DeviceTensor& x, const DeviceTensor& y,
                         const BufferRange& coef, bool relu, const DeviceTensor* residual) {
  using C = compute_t<T>;
  const Tiling t = tiling_for<T>(x, {&x, &y, residual});
  BufferList reads = norm::ranges({&x, residual});
  reads.push_back(coef);
  with_width<T>(t, [&](auto width) {
    with_flag(relu, [&](auto fused) {
      const auto kernel = &bn_cl_apply<T, decltype(width)::value, decltype(fused)::value>;
      ctx.encoder.launch(kernel, walk_grid(ctx, t, kernel), t.block, 0, reads, {y.range()},
                         x.as<const T>(), residual ? residual->as<const T>() : nullptr, y.as<T>(),
                         t.rows, t.units, static_cast<const Coefficients<C>*>(coef.data()));
    });
  });
}

template <class T, class P>
Partials channels_last_backward_sums(Context& ctx, const DeviceTensor& x, const DyTerms& dy,
                                     const ReluMask& mask, const DeviceTensor& saved_mean,
                                     const DeviceTensor& saved_inv_std) {
  using C = compute_t<T>;
  const Tiling t = tiling_for<T>(x, {&x, dy.dy, dy.addend, dy.used, mask.y});
  int64_t rows_per_chunk = 0;
  std::optional<Partials> p;  // sized by the grid, which depends on the kernel
  const BufferList reads = norm::ranges(
      {&x, dy.dy, dy.addend, mask.y, &saved_mean, &saved_inv_std, mask.scale, mask.bias});
  with_width<T>(t, [&](auto width) {
    with_mask(mask.from, [&](auto from) {
      with_flag(dy.addend != nullptr, [&](auto addend) {
        const auto kernel = &bn_cl_backward_sums<T, P, decltype(width)::value,
                                                 decltype(from)::value, decltype(addend)::value>;
        const dim3 grid = chunk_grid(ctx, t, kernel, rows_per_chunk);
        p.emplace(ctx.encoder.temporary(ctx.allocator, size_t(t.channels) * grid.y * 2 * sizeof(C)),
                  grid.y);
        BufferList writes = norm::ranges({dy.used});
        writes.push_back(p->buffer);
        ctx.encoder.launch(kernel, grid, t.block, 0, reads, writes, x.as<const T>(),
                           dy.dy->as<const T>(), dy.addend_data<T>(), mask.y_data<T>(),
                           saved_mean.as<const P>(), saved_inv_std.as<const P>(),
                           mask.scale_data<P>(), mask.bias_data<P>(), dy.used_data<T>(), t.rows,
                           t.units, rows_per_chunk, static_cast<C*>(p->buffer.data()));
      });
    });
  });
  return *p;
}

template <class T>
void channels_last_backward_dx(Context& ctx, const DeviceTensor& x, const DyTerms& dy,
                               const ReluMask& mask, const DeviceTensor& dx,
                               const BufferRange& coef) {
  using C = compute_t<T>;
  const Tiling t = tiling_for<T>(x, {&x, dy.dy, dy.addend, mask.y, &dx});
  BufferList reads = norm::ranges({&x, dy.dy, dy.addend, mask.y});
  reads.push_back(coef);
  with_width<T>(t, [&](auto width) {
    with_mask(mask.from, [&](auto from) {
      with_flag(dy.addend != nullptr, [&](auto addend) {
        const auto kernel = &bn_cl_backward_dx<T, decltype(width)::value, decltype(from)::value,
                                               decltype(addend)::value>;
        ctx.encoder.launch(kernel, walk_grid(ctx, t, kernel), t.block, 0, reads, {dx.range()},
                           x.as<const T>(), dy.dy->as<const T>(), dy.addend_data<T>(),
                           mask.y_data<T>(), dx.as<T>(), t.rows, t.units,
                           static_cast<const Coefficients<C>*>(coef.data()));
      });
    });
  });
}

#define FUSEBOX_BN_CHANNELS_LAST(T)                                                              \
  template Partials channels_last_stats<T>(Context&, const DeviceTensor&);                       \
  template void channels_last_apply<T>(Context&, const DeviceTensor&, const DeviceTensor&,       \
                                       const BufferRange&, bool, const DeviceTensor*);           \
  template Partials channels_last_backward_sums<T, T>(Context&, const DeviceTensor&,             \
                                                      const DyTerms&, const ReluMask&,           \
                                                      const DeviceTensor&, const DeviceTensor&); \
  template void channels_last_backward_dx<T>(Context&, const DeviceTensor&, const DyTerms&,      \
                                             const ReluMask&, const DeviceTensor&,               \
                                             const BufferRange&);
FUSEBOX_BN_CHANNELS_LAST(double)
FUSEBOX_BN_CHANNELS_LAST(float)
FUSEBOX_BN_CHANNELS_LAST(__half)
FUSEBOX_BN_CHANNELS_LAST(__nv_bfloat16)
#undef FUSEBOX_BN_CHANNELS_LAST
// Mixed precision: f16 / bf16 activations with f32 saved statistics.
template Partials channels_last_backward_sums<__half, float>(Context&, const DeviceTensor&,
                                                             const DyTerms&, const ReluMask&,
                                                             const DeviceTensor&,
                                                             const DeviceTensor&);
template Partials channels_last_backward_sums<__nv_bfloat16, float>(Context&, const DeviceTensor&,
                                                                    const DyTerms&, const ReluMask&,
                                                                    const DeviceTensor&,
                                                                    const DeviceTensor&);

}  // namespace fusebox::cuda::bn
