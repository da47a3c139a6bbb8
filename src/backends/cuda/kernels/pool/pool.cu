// Pooling forward: max_pool (with optional indices), avg_pool and global_avg_pool; the
// backward passes are in kernels/pool/backward.cu. Semantics are the CPU kernel's
// (backends/cpu/pool.cpp):
//   window along spatial dim d of output position o: taps j < kernel[d] at input position
//     o * stride[d] - pad_begin[d] + j * dilation[d];
//   max_pool: the largest in-bounds value (padding never wins), the first of equal maxima,
//     a NaN wins and stays; its index into the flattened x (row-major over N, C, D...,
//     whatever the layout). A window with no in-bounds tap (possible only with dilation)
//     gives -inf and index -1.
//   avg_pool: the in-bounds sum over the number of in-bounds taps, or with
//     count_include_pad over the taps inside [-pad_begin, D + pad_end).
// 1-D and 2-D pools are 3-D ones with leading extents of 1. Values are compared / summed
// in f32 (f64 for f64), in the CPU kernel's order, and rounded once.
//
// Operands are all contiguous NCHW or all channels-last (kernels/pool/window.cuh says how the
// layout is chosen and how threads map to elements).
// Windowed pools: one thread per output element, or per V consecutive channels of one
// output position in channels-last (16-byte vector loads; a warp reads whole cache lines
// of neighbouring channels), in physical output order, grid-stride. The window's tap
// ranges are computed per dim (a few integer operations), then a loop over the in-bounds
// taps. Each input element is read by about prod(kernel / stride) threads, from L1 / L2.
// Small 2-D windows in channels-last with vectors (window.cuh: small_windows; the stems'
// 3x3 stride 2, 2x2 pools) load the whole window before comparing (max_pool_small_kernel).
// global_avg_pool, contiguous: one warp per plane when planes are small (< 1024 elements),
// else one block per plane; a fixed reduction tree. Channels-last: per image a column
// reduction over prod(D) rows of C columns (below).
#include "backends/cuda/device/block_reduce.cuh"
#include "backends/cuda/kernels/pool/window.cuh"

namespace fusebox::cuda {

namespace {

constexpr int kThreads = 256;

// y = max over each window, indices its position (see the header comment). `narrow`: the
// walk fits uint32_t. y or indices may be null (max_pool_backward only wants indices).
// kTaps: the lanes' tap codes into `taps` (window.cuh) instead of y and indices. kUnit:
// unit_windows(g) (window.cuh).
template <class T, int V, bool kCL, bool kUnit, bool kTaps = false>
__global__ void max_pool_kernel(PoolWindow g, bool narrow, const T* x, T* y, int64_t* indices,
                                bool indices_cl, uint8_t* taps) {
  using C = compute_t<T>;
  const int64_t units = g.channels / V, in_size = g.in_size(), out_size = g.out_size();
  const int64_t total = g.batch * units * out_size;
  for (int64_t w = global_thread_index(); w < total; w += grid_stride()) {
    const Site s = locate<kCL>(w, units, g.out, narrow);
    const int64_t c0 = s.unit * V;
    const TapRange t0 = taps_of<kUnit>(g, 0, s.p[0]), t1 = taps_of<kUnit>(g, 1, s.p[1]),
                   t2 = taps_of<kUnit>(g, 2, s.p[2]);
    // The kernel tap of each dim's first in-bounds tap (for the tap codes).
    const int64_t j0 = kTaps ? tap_along<kUnit>(g, 0, t0.first, s.p[0]) : 0,
                  j1 = kTaps ? tap_along<kUnit>(g, 1, t1.first, s.p[1]) : 0,
                  j2 = kTaps ? tap_along<kUnit>(g, 2, t2.first, s.p[2]) : 0;
    C best[V];
    int64_t best_at[V];  // spatial offset (kTaps: tap code) of the lane's max; -1 before the first
#pragma unroll
    for (int l = 0; l < V; ++l) {
      best[l] = C(-INFINITY);
      best_at[l] = -1;
    }
    for (int64_t a = 0; a < t0.count; ++a) {
      const int64_t i0 = t0.first + a * g.dilation[0];
      for (int64_t b = 0; b < t1.count; ++b) {
        const int64_t i1 = t1.first + b * g.dilation[1];
        for (int64_t c = 0; c < t2.count; ++c) {
          const int64_t sp = spatial_offset(g.in, i0, i1, t2.first + c * g.dilation[2]);
          const int64_t at = kTaps ? tap_code(g, j0 + a, j1 + b, j2 + c) : sp;
          C v[V];
          load_lanes<V>(x, element_at<kCL>(s.n, c0, g.channels, in_size, sp), v);
#pragma unroll
          for (int l = 0; l < V; ++l) keep_max(best[l], best_at[l], v[l], at);
        }
      }
    }
    const int64_t out_sp = spatial_offset(g.out, s.p[0], s.p[1], s.p[2]);
    if constexpr (kTaps) {
      const int64_t first = element_at<kCL>(s.n, c0, g.channels, out_size, out_sp);
#pragma unroll
      for (int l = 0; l < V; ++l)  // kCL: the lanes' codes are V consecutive bytes
        taps[first + l] = uint8_t(best_at[l] < 0 ? kNoTap : best_at[l]);
      continue;
    }
    if (y) store_lanes<V>(y, element_at<kCL>(s.n, c0, g.channels, out_size, out_sp), best);
    if (indices) {
#pragma unroll
      for (int l = 0; l < V; ++l) {
        const int64_t c = c0 + l;
        const int64_t at = indices_cl ? element_at<true>(s.n, c, g.channels, out_size, out_sp)
                                      : element_at<false>(s.n, c, g.channels, out_size, out_sp);
        indices[at] = best_at[l] < 0 ? -1 : (s.n * g.channels + c) * in_size + best_at[l];
      }
    }
  }
}

// Two 16-bit lanes of a vector as one packed value (bf16 and f16), for the small max pool.
template <class T>
struct LanePair;
template <>
struct LanePair<__nv_bfloat16> {
  using type = __nv_bfloat162;
};
template <>
struct LanePair<__half> {
  using type = __half2;
};

// max_pool_kernel's result for small windows (window.cuh: small_windows), channels-last with
// V = kVecWidth<T>: work item w (V channels of one output position, in physical order, so y's
// and the tap codes' offset is w * V) loads its window's in-bounds taps, at most K x K 16-byte
// vectors (K: the larger kernel extent of dims 1 and 2; dim 0 is one position), then each
// lane compares them in row-major tap order (keep_max).
// 16-bit types compare two lanes per instruction instead: the maximum is a running
// NaN-propagating max over the taps (__hmax2_nan), and the tap code each lane's first tap
// equal to it, or its first NaN when the maximum is NaN (keep_max's choice: the first of equal
// maxima, the first NaN), found by visiting the taps last to first and letting each match
// overwrite. The kernel is bound by its compares (the lane-by-lane form ran ResNet-50's stem
// pool, bf16 batch 256 on an H200, at 78% of the SMs' issue and a third of DRAM's
// bandwidth). y then holds NaN where keep_max would hold the first NaN's payload, and a
// window of -0 and +0 may give either sign: equal values.
template <class T, int K, bool kTaps>
__global__ void __launch_bounds__(kThreads)
    max_pool_small_kernel(PoolWindow g, uint32_t total, const T* __restrict__ x, T* __restrict__ y,
                          uint8_t* __restrict__ taps) {
  constexpr int V = kVecWidth<T>;
  using C = compute_t<T>;
  const uint32_t units = uint32_t(g.channels / V), out_h = uint32_t(g.out[1]),
                 out_w = uint32_t(g.out[2]);
  const int in_h = int(g.in[1]), in_w = int(g.in[2]), kh = int(g.kernel[1]), kw = int(g.kernel[2]);
  for (uint32_t w = blockIdx.x * blockDim.x + threadIdx.x; w < total; w += gridDim.x * blockDim.x) {
    uint32_t rest = w / units;
    const uint32_t unit = w - rest * units, ow = rest % out_w;
    rest /= out_w;
    const uint32_t oh = rest % out_h, n = rest / out_h;
    const int h0 = int(oh) * int(g.stride[1]) - int(g.pad_lo[1]);
    const int w0 = int(ow) * int(g.stride[2]) - int(g.pad_lo[2]);
    const T* image = x + (int64_t(n) * in_h * in_w) * g.channels + int64_t(unit) * V;
    Vec<T> tap[K][K];
    unsigned inside = 0;  // bit a * K + b: tap (a, b) is in the kernel and in bounds
#pragma unroll
    for (int a = 0; a < K; ++a) {
#pragma unroll
      for (int b = 0; b < K; ++b) {
        const int h = h0 + a, c = w0 + b;
        if (a < kh && b < kw && h >= 0 && h < in_h && c >= 0 && c < in_w) {
          inside |= 1u << (a * K + b);
          tap[a][b] = load_vec(image + (int64_t(h) * in_w + c) * g.channels, 0);
        }
      }
    }
    if constexpr (sizeof(T) == 2) {
      using P = typename LanePair<T>::type;
      constexpr int kPairs = V / 2;
      P best[kPairs];
#pragma unroll
      for (int i = 0; i < kPairs; ++i) best[i] = P(T(-INFINITY), T(-INFINITY));
#pragma unroll
      for (int a = 0; a < K; ++a) {
#pragma unroll
        for (int b = 0; b < K; ++b) {
          if (!(inside >> (a * K + b) & 1u)) continue;
          const P* v = reinterpret_cast<const P*>(&tap[a][b]);
#pragma unroll
          for (int i = 0; i < kPairs; ++i) best[i] = __hmax2_nan(best[i], v[i]);
        }
      }
      if constexpr (kTaps) {
        static_assert(V == 8, "16-bit lanes: two words of four one-byte codes");
        uint32_t codes[2] = {kNoTap * 0x01010101u, kNoTap * 0x01010101u};
#pragma unroll
        for (int a = K - 1; a >= 0; --a) {
#pragma unroll
          for (int b = K - 1; b >= 0; --b) {
            if (!(inside >> (a * K + b) & 1u)) continue;
            const P* v = reinterpret_cast<const P*>(&tap[a][b]);
            unsigned match[kPairs];  // 0xffff per lane equal to the max, or NaN
#pragma unroll
            for (int i = 0; i < kPairs; ++i)
              match[i] = __heq2_mask(v[i], best[i]) | __hneu2_mask(v[i], v[i]);
            const uint32_t code = uint32_t(a * kw + b) * 0x01010101u;
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              // One byte per lane: the low bytes of lanes 4j ... 4j + 3's masks.
              const uint32_t bytes = __byte_perm(match[2 * j], match[2 * j + 1], 0x6420);
              codes[j] = (codes[j] & ~bytes) | (code & bytes);
            }
          }
        }
        Pack<uint8_t, V> out;
        static_assert(sizeof(out) == sizeof(codes));
        memcpy(&out, codes, sizeof(codes));
        store_pack<V>(taps, int64_t(w), out);
      } else {
        Vec<T> out;
        static_assert(sizeof(out) == sizeof(best));
        memcpy(&out, best, sizeof(best));
        store_vec(y, int64_t(w), out);
      }
      continue;
    }
    C best[V];
    int best_at[V];  // the tap code of the lane's max; -1 before the first tap
#pragma unroll
    for (int l = 0; l < V; ++l) {
      best[l] = C(-INFINITY);
      best_at[l] = -1;
#pragma unroll
      for (int a = 0; a < K; ++a) {
#pragma unroll
        for (int b = 0; b < K; ++b)
          if (inside >> (a * K + b) & 1u)
            keep_max(best[l], best_at[l], lane_value<C>(tap[a][b], l), a * kw + b);
      }
    }
    if constexpr (kTaps) {
      Pack<uint8_t, V> codes;
#pragma unroll
      for (int l = 0; l < V; ++l) codes.v[l] = uint8_t(best_at[l] < 0 ? kNoTap : best_at[l]);
      store_pack<V>(taps, int64_t(w), codes);
    } else {
      store_lanes<V>(y, int64_t(w) * V, best);
    }
  }
}

// Calls f(std::integral_constant<int, K>) with K = 2 or 3, at least each kernel extent of dims 1
// and 2 of small windows.
template <class F>
void visit_small_kernel(const PoolWindow& g, F&& f) {
  if (g.kernel[1] <= 2 && g.kernel[2] <= 2)
    f(std::integral_constant<int, 2>{});
  else
    f(std::integral_constant<int, kSmallTaps>{});
}

// y = the window's in-bounds sum / its divisor (see the header comment).
template <class T, int V, bool kCL, bool kUnit>
__global__ void avg_pool_kernel(PoolWindow g, bool narrow, bool count_include_pad, const T* x,
                                T* y) {
  using C = compute_t<T>;
  const int64_t units = g.channels / V, in_size = g.in_size(), out_size = g.out_size();
  const int64_t total = g.batch * units * out_size;
  for (int64_t w = global_thread_index(); w < total; w += grid_stride()) {
    const Site s = locate<kCL>(w, units, g.out, narrow);
    const int64_t c0 = s.unit * V;
    const TapRange t0 = taps_of<kUnit>(g, 0, s.p[0]), t1 = taps_of<kUnit>(g, 1, s.p[1]),
                   t2 = taps_of<kUnit>(g, 2, s.p[2]);
    C sum[V];
#pragma unroll
    for (int l = 0; l < V; ++l) sum[l] = 0;
    for (int64_t a = 0; a < t0.count; ++a) {
      const int64_t i0 = t0.first + a * g.dilation[0];
      for (int64_t b = 0; b < t1.count; ++b) {
        const int64_t i1 = t1.first + b * g.dilation[1];
        for (int64_t c = 0; c < t2.count; ++c) {
          const int64_t sp = spatial_offset(g.in, i0, i1, t2.first + c * g.dilation[2]);
          C v[V];
          load_lanes<V>(x, element_at<kCL>(s.n, c0, g.channels, in_size, sp), v);
#pragma unroll
          for (int l = 0; l < V; ++l) sum[l] += v[l];
        }
      }
    }
    // divisor >= 1: shape inference keeps the pads smaller than the window.
    const C divisor = C(window_divisor(t0, t1, t2, count_include_pad));
#pragma unroll
    for (int l = 0; l < V; ++l) sum[l] /= divisor;
    const int64_t out_sp = spatial_offset(g.out, s.p[0], s.p[1], s.p[2]);
    store_lanes<V>(y, element_at<kCL>(s.n, c0, g.channels, out_size, out_sp), sum);
  }
}

// Contiguous: one group of kGroup threads (a warp, or the whole block) per plane.
template <class T, int kGroup>
__global__ void global_avg_pool_kernel(const T* x, T* y, int64_t planes, int64_t plane_size) {
  using C = compute_t<T>;
  constexpr int kGroups = kThreads / kGroup;
  const int group = threadIdx.x / kGroup, lane = threadIdx.x % kGroup;
  for (int64_t base = int64_t(blockIdx.x) * kGroups; base < planes;
       base += int64_t(gridDim.x) * kGroups) {
    const int64_t plane = base + group;
    C sum = 0;
    if (plane < planes) {
      const T* xp = x + plane * plane_size;
      for (int64_t i = lane; i < plane_size; i += kGroup) sum += load_compute(xp, i);
    }
    if constexpr (kGroup == 32)
      sum = warp_reduce(sum, SumOp{});
    else
      sum = block_reduce(sum, SumOp{}, C(0));
    if (plane < planes && lane == 0) store_compute(y, plane, sum / C(plane_size));
  }
}

// Channels-last: x is, per image n, `rows` = prod(D) rows of C channels. A block of
// (blockDim.x column threads) x (blockDim.y row threads) owns blockDim.x * V channels of one
// image and a range of rows (blockIdx.y's split): each thread sums every blockDim.y-th row
// of its V channels (16-byte loads: a warp reads contiguous runs of a row), then the
// blockDim.y partial sums of each column are added by a fixed tree in shared memory. With
// one split the mean goes to y[n, c]; with several, each split's sum goes to
// partial[n, split, c] and global_avg_pool_finish_kernel adds them in split order. All
// orders are fixed: deterministic.
template <class T, int V>
__global__ void global_avg_pool_cl_kernel(const T* x, T* y, compute_t<T>* partial, int64_t channels,
                                          int64_t rows, int64_t rows_per_split,
                                          int64_t channel_blocks) {
  using C = compute_t<T>;
  __shared__ C sums[V * kThreads];  // [lane][thread]: conflict-free
  const int64_t n = blockIdx.x / channel_blocks, block_col = blockIdx.x % channel_blocks;
  const int64_t c0 = (block_col * blockDim.x + threadIdx.x) * V;
  const int64_t begin = int64_t(blockIdx.y) * rows_per_split;
  const int64_t end = min(rows, begin + rows_per_split);
  C acc[V];
#pragma unroll
  for (int l = 0; l < V; ++l) acc[l] = 0;
  if (c0 < channels) {
    for (int64_t r = begin + threadIdx.y; r < end; r += blockDim.y) {
      C v[V];
      load_lanes<V>(x, (n * rows + r) * channels + c0, v);
#pragma unroll
      for (int l = 0; l < V; ++l) acc[l] += v[l];
    }
  }
  const int t = threadIdx.y * blockDim.x + threadIdx.x;
#pragma unroll
  for (int l = 0; l < V; ++l) sums[l * kThreads + t] = acc[l];
  for (int half = blockDim.y / 2; half > 0; half /= 2) {  // blockDim.y is a power of 2
    __syncthreads();
    if (int(threadIdx.y) < half) {
#pragma unroll
      for (int l = 0; l < V; ++l)
        sums[l * kThreads + t] += sums[l * kThreads + t + half * int(blockDim.x)];
    }
  }
  if (threadIdx.y != 0 || c0 >= channels) return;
  C total[V];
#pragma unroll
  for (int l = 0; l < V; ++l) total[l] = sums[l * kThreads + t];
  if (gridDim.y == 1) {
#pragma unroll
    for (int l = 0; l < V; ++l) total[l] /= C(rows);
    store_lanes<V>(y, n * channels + c0, total);
  } else {
    C* out = partial + (n * gridDim.y + blockIdx.y) * channels + c0;
#pragma unroll
    for (int l = 0; l < V; ++l) out[l] = total[l];
  }
}

// y[n, c] = (sum over splits s of partial[n, s, c]) / rows.
template <class T>
__global__ void global_avg_pool_finish_kernel(const compute_t<T>* partial, T* y, int64_t batch,
                                              int64_t channels, int64_t splits, int64_t rows) {
  using C = compute_t<T>;
  for (int64_t i = global_thread_index(); i < batch * channels; i += grid_stride()) {
    const int64_t n = i / channels, c = i % channels;
    C sum = 0;
    for (int64_t s = 0; s < splits; ++s) sum += partial[(n * splits + s) * channels + c];
    store_compute(y, i, sum / C(rows));
  }
}

// Channels-last global_avg_pool of x [N, C, D...] (dense N, D..., C) into y [N, C].
void global_avg_pool_channels_last(Context& ctx, const std::string& where, const DeviceTensor& x,
                                   const DeviceTensor& y) {
  const int64_t batch = x.shape[0], channels = x.shape[1], rows = x.numel() / (batch * channels);
  const PoolLayout layout = pool_layout(where, {{"x", &x}, {"y", &y}});
  visit_device_float(where, x.dtype, [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    visit_pool_layout<T>(layout, [&](auto vec, auto) {
      constexpr int V = decltype(vec)::value;
      // Column threads: enough for the channels (a power of 2, at most a warp).
      const int64_t units = channels / V;
      int columns = 1;
      while (columns < 32 && columns < units) columns *= 2;
      const int row_threads = kThreads / columns;
      const int64_t channel_blocks = ceil_div(units, columns), blocks = batch * channel_blocks;
      // Split the rows when the images alone give too few blocks to fill the GPU, keeping
      // at least 8 rows per thread.
      constexpr int64_t kTargetBlocks = 2 * 132;
      int64_t splits = 1;
      if (blocks < kTargetBlocks)
        splits = std::max<int64_t>(
            1, std::min(ceil_div(kTargetBlocks, blocks), rows / (int64_t(row_threads) * 8)));
      const int64_t rows_per_split = ceil_div(rows, splits);
      splits = ceil_div(rows, rows_per_split);
      const dim3 grid{unsigned(blocks), unsigned(splits)},
          block{unsigned(columns), unsigned(row_threads)};
      if (splits == 1) {
        ctx.encoder.launch(&global_avg_pool_cl_kernel<T, V>, grid, block, 0, {x.range()},
                           {y.range()}, x.as<const T>(), y.as<T>(), static_cast<C*>(nullptr),
                           channels, rows, rows_per_split, channel_blocks);
        return;
      }
      DeviceTensor partial =
          DeviceTensor::empty(ctx.allocator, std::is_same_v<C, double> ? DType::f64 : DType::f32,
                              {batch, splits, channels});
      ctx.encoder.add_temporary(partial.buffer);
      ctx.encoder.launch(&global_avg_pool_cl_kernel<T, V>, grid, block, 0, {x.range()},
                         {partial.range()}, x.as<const T>(), static_cast<T*>(nullptr),
                         partial.as<C>(), channels, rows, rows_per_split, channel_blocks);
      ctx.encoder.launch(&global_avg_pool_finish_kernel<T>,
                         dim3(launch_blocks(batch * channels, kThreads)), dim3(kThreads), 0,
                         {partial.range()}, {y.range()}, partial.as<const C>(), y.as<T>(), batch,
                         channels, splits, rows);
    });
  });
}

}  // namespace

void launch_max_pool(Context& ctx, const std::string& where, const PoolWindow& g,
                     const DeviceTensor& x, const DeviceTensor* y, const DeviceTensor* indices,
                     const BufferRange* taps) {
  const int64_t outputs = g.batch * g.channels * g.out_size();
  if (taps) {
    FUSEBOX_CHECK(!y && !indices && fits_tap_codes(g), where,
                  "tap codes alone, for a window of fewer than ", kNoTap, " taps");
    FUSEBOX_CHECK(taps->bytes >= size_t(outputs), where, "tap codes need ", outputs, " bytes");
  }
  const PoolLayout layout =
      y ? pool_layout(where, {{"x", &x}, {"y", y}}) : pool_layout(where, {{"x", &x}});
  const bool idx_cl = indices && indices_channels_last(where, *indices);
  BufferList writes;
  if (y) writes.push_back(y->range());
  if (indices) writes.push_back(indices->range());
  if (taps) writes.push_back(*taps);
  if (outputs == 0) return;
  visit_device_float(where, x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t vectors = outputs / kVecWidth<T>;
    if (layout.channels_last && layout.vectorised && !indices && small_windows(g, vectors)) {
      visit_small_kernel(g, [&](auto k) {
        constexpr int K = decltype(k)::value;
        ctx.encoder.launch(
            taps ? &max_pool_small_kernel<T, K, true> : &max_pool_small_kernel<T, K, false>,
            dim3(launch_blocks(vectors, kThreads)), dim3(kThreads), 0, {x.range()}, writes, g,
            uint32_t(vectors), x.as<const T>(), y ? y->as<T>() : nullptr,
            taps ? static_cast<uint8_t*>(taps->data()) : nullptr);
      });
      return;
    }
    visit_pool_layout<T>(layout, [&](auto vec, auto cl) {
      visit_unit_windows(g, [&](auto unit) {
        constexpr int V = decltype(vec)::value;
        constexpr bool kCL = decltype(cl)::value, kUnit = decltype(unit)::value;
        const int64_t work = outputs / V;
        ctx.encoder.launch(taps ? &max_pool_kernel<T, V, kCL, kUnit, true>
                                : &max_pool_kernel<T, V, kCL, kUnit, false>,
                           dim3(launch_blocks(work, kThreads)), dim3(kThreads), 0, {x.range()},
                           writes, g, fits_u32(work), x.as<const T>(), y ? y->as<T>() : nullptr,
                           indices ? indices->as<int64_t>() : nullptr, idx_cl,
                           taps ? static_cast<uint8_t*>(taps->data()) : nullptr);
      });
    });
  });
}

// x [N, C, D...] -> y [N, C, O...], indices [N, C, O...] (i64) with return_indices.
void max_pool(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const std::string where = node_label(n);
  const DeviceTensor& x = *in[0];
  DeviceTensor& y = out[0];
  check_same_dtype(x, y, where);
  const PoolWindow g = make_pool_window(std::get<PoolAttrs>(n.attrs), x.shape, y.shape, where);
  const DeviceTensor* indices = nullptr;
  if (out.size() > 1) {
    FUSEBOX_CHECK(out[1].dtype == DType::i64 && out[1].shape == y.shape, where,
                  "indices must be i64 ", shape_str(y.shape));
    indices = &out[1];
  }
  launch_max_pool(ctx, where, g, x, &y, indices);
}

// x [N, C, D...] -> y [N, C, O...]
void avg_pool(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const std::string where = node_label(n);
  const auto& attrs = std::get<PoolAttrs>(n.attrs);
  const DeviceTensor& x = *in[0];
  DeviceTensor& y = out[0];
  check_same_dtype(x, y, where);
  const PoolWindow g = make_pool_window(attrs, x.shape, y.shape, where);
  const PoolLayout layout = pool_layout(where, {{"x", &x}, {"y", &y}});
  if (y.numel() == 0) return;
  visit_device_float(where, x.dtype, [&](auto tag) {
    using T = decltype(tag);
    visit_pool_layout<T>(layout, [&](auto vec, auto cl) {
      visit_unit_windows(g, [&](auto unit) {
        constexpr int V = decltype(vec)::value;
        const int64_t work = y.numel() / V;
        ctx.encoder.launch(&avg_pool_kernel<T, V, decltype(cl)::value, decltype(unit)::value>,
                           dim3(launch_blocks(work, kThreads)), dim3(kThreads), 0, {x.range()},
                           {y.range()}, g, fits_u32(work), attrs.count_include_pad, x.as<const T>(),
                           y.as<T>());
      });
    });
  });
}

// x [N, C, D...] -> y [N, C, 1...]: the mean of each (n, c) plane. y is dense (both layouts
// at once); x contiguous or channels-last.
void global_avg_pool(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const std::string where = node_label(n);
  const DeviceTensor& x = *in[0];
  DeviceTensor& y = out[0];
  FUSEBOX_CHECK(x.dtype == y.dtype && x.rank() >= 3 && y.rank() == x.rank() &&
                    y.shape[0] == x.shape[0] && y.shape[1] == x.shape[1] &&
                    y.numel() == x.shape[0] * x.shape[1],
                where, "input ", shape_str(x.shape), " (", dtype_name(x.dtype), ") and output ",
                shape_str(y.shape), " (", dtype_name(y.dtype), ") do not match");
  FUSEBOX_CHECK(y.is_contiguous(), where, "output must be dense; got ", layout_str(y));
  const int64_t planes = y.numel();
  if (planes == 0) return;
  const int64_t plane_size = x.numel() / planes;
  FUSEBOX_CHECK(plane_size >= 1, where, "input ", shape_str(x.shape), " has an empty spatial dim");
  if (!x.is_contiguous()) return global_avg_pool_channels_last(ctx, where, x, y);
  visit_device_float(where, x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (plane_size < 1024) {
      constexpr int kGroups = kThreads / 32;
      const unsigned blocks = launch_blocks((planes + kGroups - 1) / kGroups, 1);
      ctx.encoder.launch(&global_avg_pool_kernel<T, 32>, dim3(blocks), dim3(kThreads), 0,
                         {x.range()}, {y.range()}, x.as<const T>(), y.as<T>(), planes, plane_size);
    } else {
      const unsigned blocks = launch_blocks(planes, 1);
      ctx.encoder.launch(&global_avg_pool_kernel<T, kThreads>, dim3(blocks), dim3(kThreads), 0,
                         {x.range()}, {y.range()}, x.as<const T>(), y.as<T>(), planes, plane_size);
    }
  });
}

}  // namespace fusebox::cuda
