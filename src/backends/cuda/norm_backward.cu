// layer_norm and rms_norm, backward (kernels.h: layer_norm_backward, rms_norm_backward).
//
// With x_hat = (x - mean) * rstd (mean = 0 for rms_norm) and g = dy * scale (dy without
// scale), per row of `cols` elements:
//   dx     = rstd * (g - mean(g) - x_hat * mean(g * x_hat))    (layer_norm)
//   dx     = rstd * (g - x_hat * mean(g * x_hat))              (rms_norm)
// and per column, summed over the rows:
//   dscale = sum(dy * x_hat),   dbias = sum(dy)                (dbias: layer_norm only)
// mean and rstd are the forward's saved statistics (f32, f64 for f64 x).
//
// Register path (f32 rows of up to 8,192 elements, f16/bf16 up to 16,384; norm_rows.cuh):
// a persistent grid of row groups. A group loads its row of x and dy with 16-byte loads
// (all of a thread's loads issued before the first use); from them it accumulates the two
// row sums (g, g * x_hat) and, per column it owns, dy * x_hat and dy into f32
// accumulators that live in registers across all the rows the thread handles (a thread
// owns the same columns in every row). After the group reduction it reloads x and dy
// (L1 / L2 hits) and writes dx. At the end each block sums its groups' accumulators in
// shared memory (in group order) and writes one partial row per block; a second small
// kernel sums the partial rows in a fixed order into dscale and dbias. So x and dy come
// from DRAM once and dx is written once, plus 2 x (blocks x cols) f32 partials written
// and read (about 4-9% more bytes at 4K-16K columns): expect 80-90% of the device's copy
// bandwidth counting x, dy and dx. No atomics: the result is the same every run.
//
// Long-row path (longer rows, unaligned data, cols not a multiple of the vector width,
// f64): dx by a block per row in two passes over the row (row sums, then dx); dscale and
// dbias by a column kernel (32 columns x 8 row slices per block over chunks of rows,
// reduced in a fixed order to one partial row per chunk), then the same partial-row sum.
// About half the register path's speed.
#include "backends/cuda/kernels.h"
#include "backends/cuda/norm_common.h"
#include "backends/cuda/norm_rows.cuh"

namespace fusebox::cuda {

namespace {

using norm::RowPlan;
using norm::stats_t;

template <class T, class S>
struct BackwardArgs {
  const T* x;
  const T* dy;
  const T* scale;  // [cols] or null
  const S* mean;   // [rows] (layer_norm) or null (rms_norm)
  const S* rstd;   // [rows]
  T* dx;
  S* partial_scale;  // [parts, cols] or null (dscale not wanted)
  S* partial_bias;   // [parts, cols] or null (dbias not wanted, or rms_norm)
  int64_t rows;
  int64_t cols;
  int threads_per_row;  // register path only
};

// Writes this block's column sums of `acc` (the per-thread accumulators of the block's
// row groups, added in group order) as row blockIdx.x of `partial`. `staging` is dynamic
// shared memory of cols floats when the block has more than one group.
template <class T, int kVecs>
__device__ void store_block_partial(const float (&acc)[kVecs][kVecWidth<T>], float* partial,
                                    float* staging, int threads_per_row, int64_t cols) {
  constexpr int W = kVecWidth<T>;
  const int R = threads_per_row, groups = blockDim.x / R;
  const int group = threadIdx.x / R, t = threadIdx.x % R;
  const int64_t nvec = cols / W;
  float* out = partial + int64_t(blockIdx.x) * cols;
  if (groups == 1) {
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t i = int64_t(k) * R + t;
      if (i >= nvec) continue;
#pragma unroll
      for (int w = 0; w < W; w += 4) {
        reinterpret_cast<float4*>(out + i * W)[w / 4] =
            make_float4(acc[k][w], acc[k][w + 1], acc[k][w + 2], acc[k][w + 3]);
      }
    }
    return;
  }
  for (int g = 0; g < groups; ++g) {
    if (group == g) {
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        const int64_t i = int64_t(k) * R + t;
        if (i >= nvec) continue;
#pragma unroll
        for (int w = 0; w < W; ++w)
          staging[i * W + w] = (g == 0 ? 0.0f : staging[i * W + w]) + acc[k][w];
      }
    }
    __syncthreads();
  }
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) out[j] = staging[j];
  __syncthreads();  // staging is reused by the next call
}

// Registers per thread: the f32 accumulators (E or 2E for E elements per thread), the
// held scale and the loads in flight (x and dy), plus about 48 for indices and row values,
// rounded up to 8 and capped at 128. A cap just above the need leaves room for as many
// blocks per SM as possible without spilling.
template <class T, bool kCentre, int kVecs>
constexpr int backward_registers() {
  constexpr int elems = kVecs * kVecWidth<T>;
  constexpr int vec_regs = kVecBytes / 4;
  constexpr int held_scale = kVecs * kVecBytes <= 32 ? kVecs * vec_regs : 0;
  constexpr int need = (kCentre ? 2 : 1) * elems + held_scale + 2 * kVecs * vec_regs + 48;
  return std::min(128, (need + 7) / 8 * 8);
}

// Register path; see the file comment. Block = G row groups of R threads, persistent.
template <class T, bool kCentre, int kVecs>
__global__ void __maxnreg__((backward_registers<T, kCentre, kVecs>()))
    norm_backward_rows(BackwardArgs<T, float> a) {
  using norm::Packed;
  using norm::unpack;
  constexpr int W = kVecWidth<T>;
  extern __shared__ float staging[];
  __shared__ float slots[64];
  const int R = a.threads_per_row;
  const int groups = blockDim.x / R;
  const int group = threadIdx.x / R, t = threadIdx.x % R;
  const int64_t nvec = a.cols / W;
  const float inv_cols = 1.0f / float(a.cols);
  // Per column this thread owns (the same in every row): the accumulators, and the scale
  // when it fits (kHoldScale), loaded once; otherwise it is read (from L1) where used.
  constexpr bool kHoldScale = kVecs * kVecBytes <= 32;
  float acc_scale[kVecs][W], acc_bias[kVecs][W];
  Packed held_scale[kHoldScale ? kVecs : 1] = {};
  auto scale_at = [&](int k, int64_t i) {
    if constexpr (kHoldScale) {
      return held_scale[k];
    } else {
      if (a.scale) return norm::load_packed(a.scale, i);
      float ones[W];
#pragma unroll
      for (int w = 0; w < W; ++w) ones[w] = 1.0f;
      return norm::pack<T>(ones);
    }
  };
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int64_t i = int64_t(k) * R + t;
    if constexpr (kHoldScale) {
      if (a.scale && i < nvec) {
        held_scale[k] = norm::load_packed(a.scale, i);
      } else {
        float ones[W];
#pragma unroll
        for (int w = 0; w < W; ++w) ones[w] = 1.0f;
        held_scale[k] = norm::pack<T>(ones);
      }
    }
#pragma unroll
    for (int w = 0; w < W; ++w) acc_scale[k][w] = acc_bias[k][w] = 0.0f;
  }

  for (int64_t base = int64_t(blockIdx.x) * groups; base < a.rows;
       base += int64_t(gridDim.x) * groups) {
    const int64_t row = base + group;
    const bool active = row < a.rows;
    const int64_t offset = row * a.cols;
    bool valid[kVecs];
    Packed xv[kVecs], dyv[kVecs];  // this pass only
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t i = int64_t(k) * R + t;
      valid[k] = active && i < nvec;
      if (valid[k]) {
        xv[k] = norm::load_packed(a.x + offset, i);
        dyv[k] = norm::load_packed(a.dy + offset, i);
      }
    }
    float mean = 0.0f, rstd = 0.0f;
    if (active) {
      if constexpr (kCentre) mean = a.mean[row];
      rstd = a.rstd[row];
    }

    // Row sums of g and g * x_hat; column sums of dy * x_hat and dy.
    float sums[2] = {0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      if (!valid[k]) continue;
      const Packed scale = scale_at(k, int64_t(k) * R + t);
#pragma unroll
      for (int w = 0; w < W; ++w) {
        const float x_hat = (unpack<T>(xv[k], w) - mean) * rstd;
        const float dy = unpack<T>(dyv[k], w);
        const float g = dy * unpack<T>(scale, w);
        sums[0] += g;
        sums[1] += g * x_hat;
        acc_scale[k][w] += dy * x_hat;
        if constexpr (kCentre) acc_bias[k][w] += dy;
      }
    }
    norm::group_sum(sums, slots, R);
    const float mean_g = kCentre ? sums[0] * inv_cols : 0.0f;
    const float mean_gx = sums[1] * inv_cols;
    if (!active) continue;  // no barrier follows in this iteration

    // Reload x and dy (L1 / L2 hits: this group read them a moment ago) rather than keep
    // them, or values derived from them, live across the reduction: registers held there
    // are registers the next rows' loads cannot use. The empty asm keeps the compiler from
    // reusing the first loads.
    asm volatile("" ::: "memory");
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      if (!valid[k]) continue;
      const int64_t i = int64_t(k) * R + t;
      const Packed x = norm::load_packed(a.x + offset, i), dy = norm::load_packed(a.dy + offset, i);
      const Packed scale = scale_at(k, i);
      float out[W];
#pragma unroll
      for (int w = 0; w < W; ++w) {
        const float x_hat = (unpack<T>(x, w) - mean) * rstd;
        const float g = unpack<T>(dy, w) * unpack<T>(scale, w);
        out[w] = rstd * (g - mean_g - x_hat * mean_gx);
      }
      norm::store_packed(a.dx + offset, i, norm::pack<T>(out));
    }
  }

  if (a.partial_scale) {
    store_block_partial<T, kVecs>(acc_scale, a.partial_scale, staging, R, a.cols);
  }
  if constexpr (kCentre) {
    if (a.partial_bias) {
      store_block_partial<T, kVecs>(acc_bias, a.partial_bias, staging, R, a.cols);
    }
  }
}

// Long-row path, dx: a block per row (grid-stride over rows); pass 1 sums g and
// g * x_hat over the row, pass 2 writes dx. C is f32 (f64 for f64).
template <class T, bool kCentre>
__global__ void norm_backward_long_dx(BackwardArgs<T, stats_t<T>> a) {
  using C = compute_t<T>;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const int64_t offset = row * a.cols;
    const C mean = kCentre ? C(a.mean[row]) : C(0), rstd = C(a.rstd[row]);
    C sum_g = 0, sum_gx = 0;
    for (int64_t j = threadIdx.x; j < a.cols; j += blockDim.x) {
      const C x_hat = (load_compute(a.x, offset + j) - mean) * rstd;
      C g = load_compute(a.dy, offset + j);
      if (a.scale) g *= load_compute(a.scale, j);
      sum_g += g;
      sum_gx += g * x_hat;
    }
    const C mean_g = kCentre ? block_reduce(sum_g, SumOp{}, C(0)) / C(a.cols) : C(0);
    const C mean_gx = block_reduce(sum_gx, SumOp{}, C(0)) / C(a.cols);
    for (int64_t j = threadIdx.x; j < a.cols; j += blockDim.x) {
      const C x_hat = (load_compute(a.x, offset + j) - mean) * rstd;
      C g = load_compute(a.dy, offset + j);
      if (a.scale) g *= load_compute(a.scale, j);
      store_compute(a.dx, offset + j, rstd * (g - mean_g - x_hat * mean_gx));
    }
  }
}

// Long-row path, dscale / dbias partials: block (32, 8) covers 32 columns of one chunk of
// rows; thread row ty takes rows ty, ty + 8, ... of the chunk; the 8 sums are added in
// order and written as row `chunk` of the partials.
template <class T, bool kCentre>
__global__ void norm_backward_long_params(BackwardArgs<T, stats_t<T>> a, int64_t rows_per_chunk) {
  using C = compute_t<T>;
  using S = stats_t<T>;
  __shared__ C part[2][8][33];
  const int64_t j = int64_t(blockIdx.x) * 32 + threadIdx.x;
  const int64_t first = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t last = min(a.rows, first + rows_per_chunk);
  C sum_scale = 0, sum_bias = 0;
  if (j < a.cols) {
    for (int64_t row = first + threadIdx.y; row < last; row += 8) {
      const C mean = kCentre ? C(a.mean[row]) : C(0);
      const C x_hat = (load_compute(a.x, row * a.cols + j) - mean) * C(a.rstd[row]);
      const C dy = load_compute(a.dy, row * a.cols + j);
      sum_scale += dy * x_hat;
      sum_bias += dy;
    }
  }
  part[0][threadIdx.y][threadIdx.x] = sum_scale;
  part[1][threadIdx.y][threadIdx.x] = sum_bias;
  __syncthreads();
  if (threadIdx.y != 0 || j >= a.cols) return;
  C total_scale = 0, total_bias = 0;
#pragma unroll
  for (int y = 0; y < 8; ++y) {
    total_scale += part[0][y][threadIdx.x];
    total_bias += part[1][y][threadIdx.x];
  }
  const int64_t at = int64_t(blockIdx.y) * a.cols + j;
  if (a.partial_scale) a.partial_scale[at] = S(total_scale);
  if (kCentre && a.partial_bias) a.partial_bias[at] = S(total_bias);
}

template <class T, bool kCentre>
auto backward_rows_kernel(int vecs) {
  switch (vecs) {
    case 1:
      return &norm_backward_rows<T, kCentre, 1>;
    case 2:
      return &norm_backward_rows<T, kCentre, 2>;
    default:
      return &norm_backward_rows<T, kCentre, 4>;
  }
}

// Sums `parts` partial rows into `out` ([cols], in out's dtype).
template <class A>
void sum_partials(Context& ctx, const DeviceBuffer& partial, int64_t parts, int64_t cols,
                  DeviceTensor& out) {
  const BufferRange partial_range(partial, 0, size_t(parts * cols) * sizeof(A));
  visit_device_dtype(out.dtype, [&](auto tag) {
    using O = decltype(tag);
    if constexpr (is_float_v<O>) {
      ctx.encoder.launch(&norm::sum_partial_rows<A, O>, dim3(unsigned((cols + 31) / 32)),
                         dim3(32, 8), 0, {partial_range}, {out.range()}, partial.as<const A>(),
                         parts, cols, out.as<O>());
    }
  });
}

struct BackwardTensors {
  const DeviceTensor& x;
  const DeviceTensor& dy;
  const DeviceTensor* scale;
  const DeviceTensor* mean;
  const DeviceTensor& rstd;
  DeviceTensor& dx;
  DeviceTensor* dscale;
  DeviceTensor* dbias;
};

template <class T, bool kCentre>
void launch_backward(Context& ctx, const BackwardTensors& b, int64_t rows, int64_t cols) {
  using S = stats_t<T>;
  const int sms = ctx.device.properties().sm_count;
  BackwardArgs<T, S> args{b.x.as<const T>(),
                          b.dy.as<const T>(),
                          b.scale ? b.scale->as<const T>() : nullptr,
                          b.mean ? b.mean->as<const S>() : nullptr,
                          b.rstd.as<const S>(),
                          b.dx.as<T>(),
                          nullptr,
                          nullptr,
                          rows,
                          cols,
                          0};
  const BufferList reads = norm::ranges({&b.x, &b.dy, b.scale, b.mean, &b.rstd});
  DeviceBuffer partial_scale, partial_bias;
  // Partial rows for dscale / dbias (parts x cols, in S), made once the part count is known.
  auto make_partials = [&](int64_t parts) {
    const size_t bytes = size_t(parts * cols) * sizeof(S);
    if (b.dscale) {
      partial_scale = ctx.allocator.allocate(bytes);
      ctx.encoder.add_temporary(partial_scale);
      args.partial_scale = partial_scale.as<S>();
    }
    if (b.dbias) {
      partial_bias = ctx.allocator.allocate(bytes);
      ctx.encoder.add_temporary(partial_bias);
      args.partial_bias = partial_bias.as<S>();
    }
    BufferList writes = norm::ranges({&b.dx});
    if (partial_scale) writes.push_back(BufferRange(partial_scale, 0, bytes));
    if (partial_bias) writes.push_back(BufferRange(partial_bias, 0, bytes));
    return writes;
  };
  auto finish = [&](int64_t parts) {
    if (b.dscale) sum_partials<S>(ctx, partial_scale, parts, cols, *b.dscale);
    if (b.dbias) sum_partials<S>(ctx, partial_bias, parts, cols, *b.dbias);
  };

  if constexpr (!std::is_same_v<T, double>) {
    const bool aligned = norm::aligned16(args.x) && norm::aligned16(args.dy) &&
                         norm::aligned16(args.scale) && norm::aligned16(args.dx);
    const RowPlan plan = norm::plan_rows(cols, kVecWidth<T>, norm::kPreferredElems,
                                         norm::kMaxBackwardElems<T>, aligned);
    if (plan.fast) {
      args.threads_per_row = plan.threads_per_row;
      auto kernel = backward_rows_kernel<T, kCentre>(plan.vecs);
      const size_t staging = plan.groups() > 1 ? size_t(cols) * sizeof(float) : 0;
      const int64_t row_blocks = (rows + plan.groups() - 1) / plan.groups();
      const unsigned grid = norm::persistent_grid(kernel, plan.block, staging, sms, row_blocks);
      const BufferList writes = make_partials(grid);
      ctx.encoder.launch(kernel, dim3(grid), dim3(plan.block), staging, reads, writes, args);
      finish(grid);
      return;
    }
  }
  const unsigned grid =
      norm::persistent_grid(&norm_backward_long_dx<T, kCentre>, norm::kLongRowBlock, 0, sms, rows);
  ctx.encoder.launch(&norm_backward_long_dx<T, kCentre>, dim3(grid), dim3(norm::kLongRowBlock), 0,
                     reads, norm::ranges({&b.dx}), args);
  if (!b.dscale && !b.dbias) return;
  // Chunks of rows: about 4 blocks per SM in all, each chunk at least 8 rows.
  const int64_t column_blocks = (cols + 31) / 32;
  int64_t chunks = std::clamp<int64_t>((4 * sms + column_blocks - 1) / column_blocks, 1,
                                       std::max<int64_t>(1, (rows + 7) / 8));
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  BufferList writes = make_partials(chunks);
  writes.erase(writes.begin());  // dx is not written here
  ctx.encoder.launch(&norm_backward_long_params<T, kCentre>,
                     dim3(unsigned(column_blocks), unsigned(chunks)), dim3(32, 8), 0, reads, writes,
                     args, rows_per_chunk);
  finish(chunks);
}

void norm_backward(Context& ctx, const char* where, const BackwardTensors& b, bool centre) {
  const DeviceTensor& x = b.x;
  FUSEBOX_CHECK(x.is_contiguous() && b.dy.is_contiguous() && b.dx.is_contiguous(), where,
                "x, dy and dx must be contiguous");
  FUSEBOX_CHECK(b.dy.dtype == x.dtype && b.dy.shape == x.shape && b.dx.dtype == x.dtype &&
                    b.dx.shape == x.shape,
                where, "dy and dx must match x (", dtype_name(x.dtype), " ", shape_str(x.shape),
                ")");
  const DType stats = x.dtype == DType::f64 ? DType::f64 : DType::f32;
  const int64_t rows = b.rstd.numel();
  FUSEBOX_CHECK(
      b.rstd.dtype == stats && (!b.mean || (b.mean->dtype == stats && b.mean->numel() == rows)),
      where, "the saved statistics must be ", dtype_name(stats), " with one value per row");
  int64_t cols = rows > 0 ? x.numel() / rows : 0;
  for (const DeviceTensor* p : {b.scale, static_cast<const DeviceTensor*>(b.dscale),
                                static_cast<const DeviceTensor*>(b.dbias)}) {
    if (p && rows == 0) cols = p->numel();
  }
  FUSEBOX_CHECK(rows * cols == x.numel(), where, "x ", shape_str(x.shape), " is not ", rows,
                " rows (one per saved statistic)");
  FUSEBOX_CHECK(!b.scale || (b.scale->dtype == x.dtype && b.scale->numel() == cols &&
                             b.scale->is_contiguous()),
                where, "scale must be ", dtype_name(x.dtype), " with ", cols, " elements");
  for (DeviceTensor* p : {b.dscale, b.dbias}) {
    FUSEBOX_CHECK(!p || (p->numel() == cols && p->is_contiguous() &&
                         (p->dtype == x.dtype || p->dtype == DType::f32)),
                  where, "dscale and dbias must have ", cols, " elements, in ", dtype_name(x.dtype),
                  " or f32");
  }
  if (rows == 0 || cols == 0) {  // empty sums
    for (DeviceTensor* p : {b.dscale, b.dbias})
      if (p) ctx.encoder.memset(p->range(), 0);
    return;
  }
  switch (x.dtype) {
    case DType::f64:
      return centre ? launch_backward<double, true>(ctx, b, rows, cols)
                    : launch_backward<double, false>(ctx, b, rows, cols);
    case DType::f32:
      return centre ? launch_backward<float, true>(ctx, b, rows, cols)
                    : launch_backward<float, false>(ctx, b, rows, cols);
    case DType::f16:
      return centre ? launch_backward<__half, true>(ctx, b, rows, cols)
                    : launch_backward<__half, false>(ctx, b, rows, cols);
    case DType::bf16:
      return centre ? launch_backward<__nv_bfloat16, true>(ctx, b, rows, cols)
                    : launch_backward<__nv_bfloat16, false>(ctx, b, rows, cols);
    default:
      break;
  }
  throw Error(where, cat("expects a floating-point x, got ", dtype_name(x.dtype)));
}

}  // namespace

void layer_norm_backward(Context& ctx, const DeviceTensor& x, const DeviceTensor& dy,
                         const DeviceTensor* scale, const DeviceTensor& mean,
                         const DeviceTensor& rstd, DeviceTensor& dx, DeviceTensor* dscale,
                         DeviceTensor* dbias) {
  norm_backward(ctx, "layer_norm_backward", {x, dy, scale, &mean, rstd, dx, dscale, dbias}, true);
}

void rms_norm_backward(Context& ctx, const DeviceTensor& x, const DeviceTensor& dy,
                       const DeviceTensor* scale, const DeviceTensor& rstd, DeviceTensor& dx,
                       DeviceTensor* dscale) {
  norm_backward(ctx, "rms_norm_backward", {x, dy, scale, nullptr, rstd, dx, dscale, nullptr},
                false);
}

}  // namespace fusebox::cuda
