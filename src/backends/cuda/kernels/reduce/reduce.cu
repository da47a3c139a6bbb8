// reduce_sum / reduce_mean / reduce_max on the GPU.
//
// Layout. Drop extent-1 dims, merge neighbours that are both kept or both reduced, and x
// (contiguous) becomes [outer, len, inner] when the reduced dims form one block:
//   inner == 1   row reduce: each output is a contiguous row of len elements
//   inner > 1    column reduce: each output is a column, threads side by side along inner
// Otherwise (reduced dims separated by kept ones) x is first copied, permuted, into a
// temporary [kept..., reduced...] and row-reduced.
//
// Arithmetic. Elements convert to an accumulator type: f32 for f32/f16/bf16 (f64 for f64),
// wrapping u64 for an integer sum, the type itself for an integer max; the max propagates
// NaN. The output is finish(acc) = convert<T>(acc, divided by the count for a mean).
//
// Parallelism. Row reduce: one warp per row for short rows (or when rows fill the GPU),
// else one block per row; column reduce: 32 columns x 8 row-slices per block. When the
// outputs alone cannot fill the GPU, each output's reduction is split into chunks: pass 1
// writes per-chunk partial accumulators to a temporary, pass 2 reduces those. The order of
// operations is fixed, so results are deterministic (no atomics).
#include <algorithm>
#include <limits>

#include "backends/cuda/device/block_reduce.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/common/dtype_dispatch.cuh"

namespace fusebox::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kRowBlockThreads = 512;
constexpr int64_t kFillBlocks = 132 * 4;  // blocks that keep every SM busy (derived: 132 SMs)
constexpr int64_t kMinChunk = 4096;       // elements per chunk of a split row
constexpr int kColumnTile = 32;           // columns per column-reduce block
constexpr int kColumnSlices = 8;          // row slices per column-reduce block
constexpr int64_t kMinColumnChunk = 256;  // rows per chunk of a split column

// acc / count for a mean (count > 0), acc otherwise; then the conversion to Out.
template <class Out, class Acc>
__device__ __forceinline__ Out finish(Acc acc, int64_t mean_count) {
  if constexpr (std::is_floating_point_v<Acc>) {
    if (mean_count > 0) acc = acc / Acc(mean_count);
  }
  return convert<Out>(acc);
}

// acc = op(acc, x[j]) for j = first, first + step, ... < count; with kVec, 16-byte vectors
// (x aligned, count a multiple of the width) are taken instead of single elements.
template <bool kVec, class T, class Acc, class Op>
__device__ __forceinline__ Acc fold(const T* x, int64_t count, int first, int step, Acc acc,
                                    Op op) {
  if constexpr (kVec) {
    constexpr int W = kVecWidth<T>;
    for (int64_t v = first; v < count / W; v += step) {
      const Vec<T> pack = load_vec(x, v);
#pragma unroll
      for (int j = 0; j < W; ++j) acc = op(acc, convert<Acc>(pack.v[j]));
    }
  } else {
    for (int64_t j = first; j < count; j += step) acc = op(acc, convert<Acc>(x[j]));
  }
  return acc;
}

// One warp per row of x [rows, len]: y[row] = finish(reduction of the row).
template <bool kVec, class T, class Acc, class Op, class Out>
__global__ void reduce_rows_warp(const T* x, Out* y, int64_t rows, int64_t len, Acc identity,
                                 int64_t mean_count, Op op) {
  const int lane = threadIdx.x % 32;
  const int64_t first_row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  for (int64_t row = first_row; row < rows; row += int64_t(gridDim.x) * kWarpsPerBlock) {
    Acc acc = fold<kVec>(x + row * len, len, lane, 32, identity, op);
    acc = warp_reduce(acc, op);
    if (lane == 0) y[row] = finish<Out>(acc, mean_count);
  }
}

// One block per (row, chunk) of x [rows, len], chunk c covering [c * chunk_len, ...):
// y[row * chunks + c] = finish(reduction of the chunk). blockIdx.x walks rows (grid-stride),
// blockIdx.y chunks. chunk_len is a multiple of the vector width.
template <bool kVec, class T, class Acc, class Op, class Out>
__global__ void reduce_rows_block(const T* x, Out* y, int64_t rows, int64_t len, int64_t chunk_len,
                                  Acc identity, int64_t mean_count, Op op) {
  const int64_t begin = int64_t(blockIdx.y) * chunk_len;
  const int64_t count = len - begin < chunk_len ? len - begin : chunk_len;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    Acc acc = fold<kVec>(x + row * len + begin, count, threadIdx.x, blockDim.x, identity, op);
    acc = block_reduce(acc, op, identity);
    if (threadIdx.x == 0) y[row * gridDim.y + blockIdx.y] = finish<Out>(acc, mean_count);
  }
}

// x [outer, len, inner]; block (32, 8) covers 32 columns of one outer index and one chunk
// of rows: thread (tx, ty) folds rows ty, ty + 8, ... of its column, then the 8 partial
// results are combined in order by ty == 0. y[(o * chunks + chunk) * inner + column].
template <class T, class Acc, class Op, class Out>
__global__ void reduce_columns(const T* x, Out* y, int64_t outer, int64_t len, int64_t inner,
                               int64_t chunk_len, Acc identity, int64_t mean_count, Op op) {
  __shared__ Acc partial[kColumnSlices][kColumnTile];
  const int64_t column = int64_t(blockIdx.x) * kColumnTile + threadIdx.x;
  const int64_t begin = int64_t(blockIdx.z) * chunk_len;
  const int64_t end = begin + chunk_len < len ? begin + chunk_len : len;
  for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) {
    Acc acc = identity;
    if (column < inner) {
      const T* base = x + o * len * inner + column;
      for (int64_t r = begin + threadIdx.y; r < end; r += kColumnSlices)
        acc = op(acc, convert<Acc>(base[r * inner]));
    }
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && column < inner) {
      for (int s = 1; s < kColumnSlices; ++s) acc = op(acc, partial[s][threadIdx.x]);
      y[(o * gridDim.z + blockIdx.z) * inner + column] = finish<Out>(acc, mean_count);
    }
    __syncthreads();  // partial is reused by the next o
  }
}

template <class T, class Acc, class Op>
struct Reduction {
  Context& ctx;
  Acc identity;
  Op op;

  // y[row] for x [rows, len] (contiguous from x); Out is T, or Acc for partials; divide_by
  // > 0 makes a mean.
  template <class In, class Out>
  void rows(const In* x, const BufferRange& x_range, Out* y, const BufferRange& y_range,
            int64_t rows, int64_t len, int64_t divide_by) {
    const bool vec = is_aligned(x, kVecBytes) && len % kVecWidth<In> == 0;
    const BufferList reads{x_range}, writes{y_range};
    if (len <= 2048 || rows >= kFillBlocks * kWarpsPerBlock) {
      const unsigned blocks = unsigned(
          std::min<int64_t>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock, kMaxGridStrideBlocks));
      auto kernel = vec ? reduce_rows_warp<true, In, Acc, Op, Out>
                        : reduce_rows_warp<false, In, Acc, Op, Out>;
      ctx.encoder.launch(kernel, blocks, kWarpsPerBlock * 32, 0, reads, writes, x, y, rows, len,
                         identity, divide_by, op);
      return;
    }
    // Long rows: chunks so that rows x chunks fills the GPU, each chunk >= kMinChunk.
    const int64_t chunks = std::max<int64_t>(
        1, std::min<int64_t>({(kFillBlocks + rows - 1) / rows, len / kMinChunk, 65535}));
    const int64_t step = kVecWidth<In>;
    const int64_t chunk_len = ((len + chunks - 1) / chunks + step - 1) / step * step;
    const int64_t used_chunks = (len + chunk_len - 1) / chunk_len;
    const dim3 grid(unsigned(std::min<int64_t>(rows, kMaxGridStrideBlocks)), unsigned(used_chunks));
    if (used_chunks == 1) {
      auto kernel = vec ? reduce_rows_block<true, In, Acc, Op, Out>
                        : reduce_rows_block<false, In, Acc, Op, Out>;
      ctx.encoder.launch(kernel, grid, kRowBlockThreads, 0, reads, writes, x, y, rows, len,
                         chunk_len, identity, divide_by, op);
      return;
    }
    // A temporary of the node (its arena gap, or the encoder's shared overflow buffer).
    const BufferRange partials =
        ctx.encoder.temporary(ctx.allocator, size_t(rows * used_chunks) * sizeof(Acc));
    Acc* const partial = static_cast<Acc*>(partials.data());
    auto kernel = vec ? reduce_rows_block<true, In, Acc, Op, Acc>
                      : reduce_rows_block<false, In, Acc, Op, Acc>;
    ctx.encoder.launch(kernel, grid, kRowBlockThreads, 0, reads, BufferList{partials}, x, partial,
                       rows, len, chunk_len, identity, int64_t(0), op);
    this->rows(partial, partials, y, y_range, rows, used_chunks, divide_by);
  }

  // y[o, i] for x [outer, len, inner] (contiguous from x).
  template <class In, class Out>
  void columns(const In* x, const BufferRange& x_range, Out* y, const BufferRange& y_range,
               int64_t outer, int64_t len, int64_t inner, int64_t divide_by) {
    const int64_t tiles = (inner + kColumnTile - 1) / kColumnTile;
    const int64_t base_blocks = tiles * outer;
    int64_t chunks = 1;
    if (base_blocks < kFillBlocks && len >= 2 * kMinColumnChunk)
      chunks = std::min<int64_t>(
          {(kFillBlocks + base_blocks - 1) / base_blocks, len / kMinColumnChunk, 65535});
    // >= 1 so that an empty reduced dim (len 0) does not divide by zero below.
    const int64_t chunk_len = std::max<int64_t>(1, (len + chunks - 1) / chunks);
    chunks = std::max<int64_t>(1, (len + chunk_len - 1) / chunk_len);
    const dim3 grid(unsigned(tiles), unsigned(std::min<int64_t>(outer, 65535)), unsigned(chunks));
    const dim3 block(kColumnTile, kColumnSlices);
    if (chunks == 1 || len == 0) {
      ctx.encoder.launch(reduce_columns<In, Acc, Op, Out>, dim3(grid.x, grid.y, 1), block, 0,
                         BufferList{x_range}, BufferList{y_range}, x, y, outer, len, inner,
                         std::max<int64_t>(len, 1), identity, divide_by, op);
      return;
    }
    const BufferRange partials =
        ctx.encoder.temporary(ctx.allocator, size_t(outer * chunks * inner) * sizeof(Acc));
    Acc* const partial = static_cast<Acc*>(partials.data());
    ctx.encoder.launch(reduce_columns<In, Acc, Op, Acc>, grid, block, 0, BufferList{x_range},
                       BufferList{partials}, x, partial, outer, len, inner, chunk_len, identity,
                       int64_t(0), op);
    columns(partial, partials, y, y_range, outer, chunks, inner, divide_by);
  }
};

// Merged dims of x: extents and whether each is reduced (extent-1 dims dropped).
struct Group {
  int64_t extent;
  bool reduced;
};

template <class T, class Acc, class Op>
void run_reduction(Context& ctx, const Node& n, const DeviceTensor& x, const DeviceTensor& y,
                   Acc identity, Op op, int64_t mean_count) {
  const auto& axes = std::get<ReduceAttrs>(n.attrs).axes;
  std::vector<Group> groups;
  for (int64_t d = 0; d < x.rank(); ++d) {
    if (x.shape[size_t(d)] == 1) continue;
    const bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
    if (!groups.empty() && groups.back().reduced == reduced)
      groups.back().extent *= x.shape[size_t(d)];
    else
      groups.push_back({x.shape[size_t(d)], reduced});
  }
  int reduced_groups = 0;
  for (const Group& g : groups) reduced_groups += g.reduced;
  Reduction<T, Acc, Op> r{ctx, identity, op};
  const T* px = x.as<T>();
  T* py = y.as<T>();

  if (reduced_groups <= 1) {  // [outer, len, inner]
    int64_t outer = 1, len = 1, inner = 1;
    bool seen_reduced = false;
    for (const Group& g : groups) {
      if (g.reduced) {
        len = g.extent;
        seen_reduced = true;
      } else {
        (seen_reduced ? inner : outer) *= g.extent;
      }
    }
    if (x.numel() == 0) len = 0;  // a sum over an empty dim (inference allows only that)
    if (inner == 1)
      r.rows(px, x.range(), py, y.range(), outer, len, mean_count);
    else
      r.columns(px, x.range(), py, y.range(), outer, len, inner, mean_count);
    return;
  }
  // Reduced dims separated by kept ones: permute into [kept..., reduced...], then rows.
  Shape shape, strides;
  int64_t kept = 1, reduced = 1;
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t d = 0; d < x.rank(); ++d) {
      const bool is_reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
      if (is_reduced != (pass == 1)) continue;
      shape.push_back(x.shape[size_t(d)]);
      strides.push_back(x.strides[size_t(d)]);
      (is_reduced ? reduced : kept) *= x.shape[size_t(d)];
    }
  }
  DeviceTensor src = x;
  src.shape = shape;
  src.strides = strides;
  DeviceTensor permuted = temporary_tensor(ctx, x.dtype, shape);
  copy_strided(ctx, src, permuted);
  r.rows(permuted.as<T>(), permuted.range(), py, y.range(), kept, reduced, mean_count);
}

}  // namespace

void reduce(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const DeviceTensor& x = *in[0];
  const DeviceTensor& y = out[0];
  FUSEBOX_CHECK(x.is_contiguous() && x.dtype == y.dtype, node_label(n),
                "expects a contiguous input of the output's dtype");
  if (y.numel() == 0) return;
  const int64_t count = y.numel() == 0 ? 0 : x.numel() / y.numel();
  visit_device_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (is_float_v<T>) {
      using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
      switch (n.op) {
        case OpKind::reduce_sum:
          return run_reduction<T>(ctx, n, x, y, Acc(0), SumOp{}, 0);
        case OpKind::reduce_mean:
          return run_reduction<T>(ctx, n, x, y, Acc(0), SumOp{}, count);
        case OpKind::reduce_max:
          return run_reduction<T>(ctx, n, x, y, Acc(-INFINITY), MaxOp{}, 0);
        default:
          break;
      }
    } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      switch (n.op) {
        case OpKind::reduce_sum:  // wraps, as the CPU's u64 sum
          return run_reduction<T>(ctx, n, x, y, 0ull, SumOp{}, 0);
        case OpKind::reduce_max:
          return run_reduction<T>(ctx, n, x, y, std::numeric_limits<T>::lowest(), MaxOp{}, 0);
        default:
          break;
      }
    }
    throw Error(node_label(n), cat("is not defined for ", dtype_name(x.dtype), " tensors"));
  });
}

}  // namespace fusebox::cuda
