// layer_norm / rms_norm backward: the long-row path (kernels/norm/backward.cu's file comment:
// rows too long for the register path, unaligned data, cols not a multiple of the vector
// width, f64); kernels/norm/backward_partials.cu sums every path's partial rows.
#include "backends/cuda/kernels/norm/backward_impl.cuh"
#include "backends/cuda/kernels/norm/common.h"

namespace fusebox::cuda::norm {

namespace {

// a * b rounded once, never contracted into a neighbouring add (f32 and f64).
__device__ __forceinline__ float exact_product(float a, float b) {
  return __fmul_rn(a, b);
}
__device__ __forceinline__ double exact_product(double a, double b) {
  return __dmul_rn(a, b);
}

// Long-row path, dx: a block per row (grid-stride over rows); pass 1 sums g and
// g * x_hat over the row, pass 2 writes dx. C is f32 (f64 for f64).
template <class T, bool kCentre>
__global__ void norm_backward_long_dx(BackwardArgs<T, stats_t<T>> a) {
  using C = compute_t<T>;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const int64_t offset = row * a.cols;
    const C mean = kCentre ? C(a.mean[row]) : C(0), rstd = C(a.rstd[row]);
    // g rounded on its own (never fused into a later subtraction), as in the register path.
    auto g_at = [&](int64_t j) {
      const C dy = load_compute(a.dy, offset + j);
      return a.scale ? exact_product(dy, load_compute(a.scale, j)) : dy;
    };
    C sum_g = 0, sum_gx = 0;
    for (int64_t j = threadIdx.x; j < a.cols; j += blockDim.x) {
      const C x_hat = (load_compute(a.x, offset + j) - mean) * rstd;
      const C g = g_at(j);
      sum_g += g;
      sum_gx += g * x_hat;
    }
    const C mean_g = kCentre ? block_reduce(sum_g, SumOp{}, C(0)) / C(a.cols) : C(0);
    const C mean_gx = block_reduce(sum_gx, SumOp{}, C(0)) / C(a.cols);
    for (int64_t j = threadIdx.x; j < a.cols; j += blockDim.x) {
      const C x_hat = (load_compute(a.x, offset + j) - mean) * rstd;
      store_compute(a.dx, offset + j, rstd * (g_at(j) - mean_g - x_hat * mean_gx));
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

}  // namespace

template <class T, bool kCentre>
void launch_long_backward(Context& ctx, const BackwardTensors& b, BackwardArgs<T, stats_t<T>> args,
                          const BufferList& reads) {
  using S = stats_t<T>;
  const int64_t rows = args.rows, cols = args.cols;
  const DeviceProperties& props = ctx.device.properties();
  // The long-row kernels have no launch bounds and few registers: they always launch.
  const BoundKernel<void (*)(BackwardArgs<T, S>)> long_dx{&norm_backward_long_dx<T, kCentre>,
                                                          kUnbounded};
  const unsigned grid = persistent_grid(long_dx, kLongRowBlock, 0, props, rows);
  FUSEBOX_CHECK(grid > 0, "layer_norm_backward / rms_norm_backward",
                "the long-row kernel does not launch");
  ctx.encoder.launch(long_dx.fn, dim3(grid), dim3(kLongRowBlock), 0, reads, ranges({&b.dx}), args);
  if (!b.dscale && !b.dbias) return;
  // Chunks of rows: about 4 blocks per SM in all, each chunk at least 8 rows.
  const int64_t column_blocks = (cols + 31) / 32;
  int64_t chunks = std::clamp<int64_t>((4 * props.sm_count + column_blocks - 1) / column_blocks, 1,
                                       std::max<int64_t>(1, (rows + 7) / 8));
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  const PartialRows partials = make_partial_rows(ctx, b, chunks, args);
  ctx.encoder.launch(&norm_backward_long_params<T, kCentre>,
                     dim3(unsigned(column_blocks), unsigned(chunks)), dim3(32, 8), 0, reads,
                     partial_ranges(partials), args, rows_per_chunk);
  finish_partials<S>(ctx, partials, cols, b.dscale, b.dbias);
}

#define FUSEBOX_LONG_BACKWARD(T)                                                               \
  template void launch_long_backward<T, true>(Context&, const BackwardTensors&,                \
                                              BackwardArgs<T, stats_t<T>>, const BufferList&); \
  template void launch_long_backward<T, false>(Context&, const BackwardTensors&,               \
                                               BackwardArgs<T, stats_t<T>>, const BufferList&);
FUSEBOX_LONG_BACKWARD(double)
FUSEBOX_LONG_BACKWARD(float)
FUSEBOX_LONG_BACKWARD(__half)
FUSEBOX_LONG_BACKWARD(__nv_bfloat16)
#undef FUSEBOX_LONG_BACKWARD

}  // namespace fusebox::cuda::norm
