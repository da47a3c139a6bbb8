// Backward passes of the windowed pools (the direct calls of kernels/pool/direct.h and the IR ops
// max_pool_backward, avg_pool_backward). Semantics are the CPU kernel's
// (backends/cpu/pool_backward.cpp):
//   max_pool: each output's dy goes to its window's max (the forward's choice among ties
//     and NaNs; a window with no in-bounds tap sends nowhere);
//   avg_pool: each output's dy / divisor goes to every in-bounds tap of its window.
//
// Gather instead of scatter (no atomics, deterministic): one thread per dx element, or per
// V consecutive channels of one dx position in channels-last (kernels/pool/window.cuh), visits
// the outputs whose windows contain it, in row-major window order, summing in f32 (f64
// for f64) and rounding once. max_pool's takes the forward's indices; the IR op
// max_pool_backward (dy, x) first recomputes them into a temporary (in dy's layout) with
// the forward kernel, so the choice among ties and NaNs is exactly the forward's, then
// gathers; as one-byte tap codes where the window has fewer than 255 taps (window.cuh: an
// eighth of the temporary), else as i64 indices. Small windows (window.cuh: small_windows)
// gather from the tap codes with every holding window's codes loaded at once
// (max_pool_small_backward_kernel). (Recomputing each window's argmax inside the
// gather instead, with no indices, was measured 3x slower on the H100: ResNet-50's stem pool, TF32
// batch 128, 4.7 ms against 1.4 + 0.55 ms.) Except where the windows tile x (stride = kernel, no
// dilation or padding, each extent a multiple of the kernel: U-Net's and VGG's 2x2 pools): there
// each dx element lies in exactly one window, so one thread per window (per V channels) finds the
// forward's max (its rule, in its order) and writes the whole window's dx, dy at the max and 0
// elsewhere: x and dy read once, dx written once, no indices (U-Net's first pool, [16, 64, 512,
// 512] bf16 on an H200: 2.1 ms through the indices). avg_pool_backward's IR op (dy) is the direct
// call with the node's attributes.
#include "backends/cuda/kernels/pool/direct.h"
#include "backends/cuda/kernels/pool/window.cuh"

namespace fusebox::cuda {

namespace {

constexpr int kThreads = 256;

// kMax: dx[i] = sum of dy[o] over the windows o containing i whose index names i (kTaps:
// whose tap code is i's tap in o's window). Otherwise (avg): dx[i] = sum of dy[o] /
// divisor(o) over the windows o containing i.
template <class T, int V, bool kCL, bool kUnit, bool kMax, bool kTaps = false>
__global__ void pool_backward_kernel(PoolWindow g, bool narrow, bool count_include_pad, const T* dy,
                                     const int64_t* indices, bool indices_cl, const uint8_t* taps,
                                     T* dx) {
  using C = compute_t<T>;
  const int64_t units = g.channels / V, in_size = g.in_size(), out_size = g.out_size();
  const int64_t total = g.batch * units * in_size;
  for (int64_t w = global_thread_index(); w < total; w += grid_stride()) {
    const Site s = locate<kCL>(w, units, g.in, narrow);
    const int64_t c0 = s.unit * V;
    const int64_t sp = spatial_offset(g.in, s.p[0], s.p[1], s.p[2]);
    OutputSpan span[3];
    for (int d = 0; d < 3; ++d) span[d] = holding<kUnit>(g, d, s.p[d]);
    C sum[V];
#pragma unroll
    for (int l = 0; l < V; ++l) sum[l] = 0;
    for (int64_t o0 = span[0].first; o0 <= span[0].last; ++o0) {
      if (!holds<kUnit>(g, 0, s.p[0], o0)) continue;
      for (int64_t o1 = span[1].first; o1 <= span[1].last; ++o1) {
        if (!holds<kUnit>(g, 1, s.p[1], o1)) continue;
        for (int64_t o2 = span[2].first; o2 <= span[2].last; ++o2) {
          if (!holds<kUnit>(g, 2, s.p[2], o2)) continue;
          const int64_t out_sp = spatial_offset(g.out, o0, o1, o2);
          const int64_t at = element_at<kCL>(s.n, c0, g.channels, out_size, out_sp);
          if constexpr (kMax) {
            // Which lanes' windows chose this element; dy is read only when one did.
            bool chosen[V], any = false;
            if constexpr (kTaps) {
              const int code =
                  tap_code(g, tap_along<kUnit>(g, 0, s.p[0], o0),
                           tap_along<kUnit>(g, 1, s.p[1], o1), tap_along<kUnit>(g, 2, s.p[2], o2));
#pragma unroll
              for (int l = 0; l < V; ++l) {  // kCL: the lanes' codes are V consecutive bytes
                chosen[l] = taps[at + l] == code;
                any = any || chosen[l];
              }
            } else {
#pragma unroll
              for (int l = 0; l < V; ++l) {
                const int64_t c = c0 + l;
                const int64_t idx_at =
                    indices_cl ? element_at<true>(s.n, c, g.channels, out_size, out_sp)
                               : element_at<false>(s.n, c, g.channels, out_size, out_sp);
                chosen[l] = indices[idx_at] == (s.n * g.channels + c) * in_size + sp;
                any = any || chosen[l];
              }
            }
            if (any) {
              C v[V];
              load_lanes<V>(dy, at, v);
#pragma unroll
              for (int l = 0; l < V; ++l)
                if (chosen[l]) sum[l] += v[l];
            }
          } else {
            C v[V];
            load_lanes<V>(dy, at, v);
            const C divisor = C(window_divisor(taps_of<kUnit>(g, 0, o0), taps_of<kUnit>(g, 1, o1),
                                               taps_of<kUnit>(g, 2, o2), count_include_pad));
#pragma unroll
            for (int l = 0; l < V; ++l) sum[l] += v[l] / divisor;
          }
        }
      }
    }
    store_lanes<V>(dx, element_at<kCL>(s.n, c0, g.channels, in_size, sp), sum);
  }
}

// pool_backward_kernel<kMax, kTaps>'s result for small windows (window.cuh: small_windows)
// with strides of at most kMaxBlock along dims 1 and 2, channels-last with V = kVecWidth<T>.
// Algorithm: dx's positions fall into blocks of stride[1] x stride[2] (block q along dim d
// holds the padded positions q * s ... q * s + s - 1), and every position of a block lies in
// the same windows: q - m for m = 0 ... (kernel - 1) / s, at most S along each dim (S >= 1 +
// (kernel - 1) / s), the position at offset t of the block being that window's tap m * s +
// t. Work item w is V channels of one block (n, q1, q2, unit), in physical order. It
//   1. loads those windows' V tap codes and dy's V lanes each,
//   2. per position of the block, sums in each lane the dy of the windows whose code names
//      that position, in the generic kernel's order (row-major over the windows), and
//      stores the V sums.
// One item per block instead of one per position: ResNet-50's 3x3 stride-2 stem pool loads
// each window's codes and dy once for four dx positions, not once for each. The kernel is
// bound by its compares, not by memory (with the geometry at run time it ran at 79% of the SMs'
// issue and a quarter of DRAM's bandwidth, 96 registers, H200): K and St, when not 0, fix the
// kernel extent and stride of both dims at compile time (3x3 stride 2, 3x3 stride 1), so that
// every window and position pair that cannot match is dropped before it is compared.
constexpr int kMaxBlock = 2;

template <class T, int S, int B, int K = 0, int St = 0>
__global__ void __launch_bounds__(kThreads)
    max_pool_small_backward_kernel(PoolWindow g, uint32_t total, uint32_t blocks_h,
                                   uint32_t blocks_w, const T* __restrict__ dy,
                                   const uint8_t* __restrict__ taps, T* __restrict__ dx) {
  constexpr int V = kVecWidth<T>;
  using C = compute_t<T>;
  const uint32_t units = uint32_t(g.channels / V);
  const int in_h = int(g.in[1]), in_w = int(g.in[2]), out_h = int(g.out[1]), out_w = int(g.out[2]);
  const int s1 = St ? St : int(g.stride[1]), s2 = St ? St : int(g.stride[2]);
  const int kh = K ? K : int(g.kernel[1]), kw = K ? K : int(g.kernel[2]);
  const int q1_lo = int(g.pad_lo[1]) / s1, q2_lo = int(g.pad_lo[2]) / s2;
  for (uint32_t w = blockIdx.x * blockDim.x + threadIdx.x; w < total; w += gridDim.x * blockDim.x) {
    uint32_t rest = w / units;
    const uint32_t unit = w - rest * units, b2 = rest % blocks_w;
    rest /= blocks_w;
    const uint32_t b1 = rest % blocks_h, n = rest / blocks_h;
    const int q1 = q1_lo + int(b1), q2 = q2_lo + int(b2);
    // The block's first position (padded offsets subtracted) along dims 1 and 2.
    const int h0 = q1 * s1 - int(g.pad_lo[1]), w0 = q2 * s2 - int(g.pad_lo[2]);
    // Window (q1 - m1, q2 - m2) reaches the block (a compile-time fact with K and St).
    auto reaches = [&](int m1, int m2) { return m1 * s1 < kh && m2 * s2 < kw; };
    // Position (t1, t2) of the block is a position of dx.
    auto in_dx = [&](int t1, int t2) {
      return t1 < s1 && t2 < s2 && h0 + t1 >= 0 && h0 + t1 < in_h && w0 + t2 >= 0 && w0 + t2 < in_w;
    };
    // 1. Each window's codes and dy (kNoTap codes for a window that does not exist).
    Pack<uint8_t, V> codes[S][S];
    Vec<T> grad[S][S];
#pragma unroll
    for (int m1 = 0; m1 < S; ++m1) {
#pragma unroll
      for (int m2 = 0; m2 < S; ++m2) {
        const int o1 = q1 - m1, o2 = q2 - m2;
        if (reaches(m1, m2) && o1 >= 0 && o1 < out_h && o2 >= 0 && o2 < out_w) {
          const int64_t at = ((int64_t(n) * out_h + o1) * out_w + o2) * units + unit;
          codes[m1][m2] = load_pack<V>(taps, at);
          grad[m1][m2] = load_vec(dy, at);
        } else {
#pragma unroll
          for (int l = 0; l < V; ++l) codes[m1][m2].v[l] = uint8_t(kNoTap);
        }
      }
    }
    // 2. Each position's sums, windows in row-major order (m descending): position (t1, t2)
    // is tap (m1 s1 + t1, m2 s2 + t2) of window (m1, m2) where that is a tap.
#pragma unroll
    for (int t1 = 0; t1 < B; ++t1) {
#pragma unroll
      for (int t2 = 0; t2 < B; ++t2) {
        if (!in_dx(t1, t2)) continue;
        C sum[V];
#pragma unroll
        for (int l = 0; l < V; ++l) sum[l] = 0;
#pragma unroll
        for (int m1 = S - 1; m1 >= 0; --m1) {
#pragma unroll
          for (int m2 = S - 1; m2 >= 0; --m2) {
            const int j1 = m1 * s1 + t1, j2 = m2 * s2 + t2;
            if (j1 >= kh || j2 >= kw) continue;
            const int code = j1 * kw + j2;
#pragma unroll
            for (int l = 0; l < V; ++l)
              if (int(codes[m1][m2].v[l]) == code) sum[l] += lane_value<C>(grad[m1][m2], l);
          }
        }
        const int64_t at = ((int64_t(n) * in_h + (h0 + t1)) * in_w + (w0 + t2)) * units + unit;
        store_lanes<V>(dx, at * V, sum);
      }
    }
  }
}

// Whether max_pool_small_backward_kernel takes these windows (strides of at most kMaxBlock), and
// f(kernel) with its instance: S = 2 or 3 windows per block along each of dims 1 and 2 (S >= 1
// + (kernel - 1) / stride), B = 1 or 2 (B >= each stride), and the compile-time geometry of
// 3x3 windows of stride 2 (ResNet's and DenseNet's stem pools) and stride 1.
template <class T, class F>
bool visit_small_blocks(const PoolWindow& g, F&& f) {
  if (g.stride[1] > kMaxBlock || g.stride[2] > kMaxBlock) return false;
  const bool square = g.kernel[1] == g.kernel[2] && g.stride[1] == g.stride[2];
  if (square && g.kernel[1] == 3 && g.stride[1] == 2) {
    f(&max_pool_small_backward_kernel<T, 2, 2, 3, 2>);
    return true;
  }
  if (square && g.kernel[1] == 3 && g.stride[1] == 1) {
    f(&max_pool_small_backward_kernel<T, 3, 1, 3, 1>);
    return true;
  }
  const int64_t windows =
      std::max(1 + (g.kernel[1] - 1) / g.stride[1], 1 + (g.kernel[2] - 1) / g.stride[2]);
  const bool wide = std::max(g.stride[1], g.stride[2]) > 1;
  // small_windows caps each kernel extent at kSmallTaps: at most that many windows per block.
  constexpr int kMost = kSmallTaps;
  if (windows <= 2)
    f(wide ? &max_pool_small_backward_kernel<T, 2, 2> : &max_pool_small_backward_kernel<T, 2, 1>);
  else
    f(wide ? &max_pool_small_backward_kernel<T, kMost, 2>
           : &max_pool_small_backward_kernel<T, kMost, 1>);
  return true;
}

// The tiling windows' max_pool backward (see the header comment).
template <class T, int V, bool kCL>
__global__ void max_pool_tiles_backward(PoolWindow g, bool narrow, const T* x, const T* dy, T* dx) {
  using C = compute_t<T>;
  const int64_t units = g.channels / V, in_size = g.in_size(), out_size = g.out_size();
  const int64_t total = g.batch * units * out_size;
  for (int64_t w = global_thread_index(); w < total; w += grid_stride()) {
    const Site s = locate<kCL>(w, units, g.out, narrow);
    const int64_t c0 = s.unit * V;
    const int64_t first[3] = {s.p[0] * g.kernel[0], s.p[1] * g.kernel[1], s.p[2] * g.kernel[2]};
    // 1. The forward's max (keep_max: max_pool_kernel's rule and order).
    C best[V];
    int64_t best_at[V];
#pragma unroll
    for (int l = 0; l < V; ++l) best[l] = C(-INFINITY), best_at[l] = -1;
    for (int64_t a = 0; a < g.kernel[0]; ++a)
      for (int64_t b = 0; b < g.kernel[1]; ++b)
        for (int64_t c = 0; c < g.kernel[2]; ++c) {
          const int64_t sp = spatial_offset(g.in, first[0] + a, first[1] + b, first[2] + c);
          C v[V];
          load_lanes<V>(x, element_at<kCL>(s.n, c0, g.channels, in_size, sp), v);
#pragma unroll
          for (int l = 0; l < V; ++l) keep_max(best[l], best_at[l], v[l], sp);
        }
    // 2. The window's dx: dy at each lane's max, 0 elsewhere.
    C grad[V];
    load_lanes<V>(dy,
                  element_at<kCL>(s.n, c0, g.channels, out_size,
                                  spatial_offset(g.out, s.p[0], s.p[1], s.p[2])),
                  grad);
    for (int64_t a = 0; a < g.kernel[0]; ++a)
      for (int64_t b = 0; b < g.kernel[1]; ++b)
        for (int64_t c = 0; c < g.kernel[2]; ++c) {
          const int64_t sp = spatial_offset(g.in, first[0] + a, first[1] + b, first[2] + c);
          C v[V];
#pragma unroll
          for (int l = 0; l < V; ++l) v[l] = sp == best_at[l] ? grad[l] : C(0);
          store_lanes<V>(dx, element_at<kCL>(s.n, c0, g.channels, in_size, sp), v);
        }
  }
}

// Whether every dx element lies in exactly one window (see the header comment).
bool windows_tile(const PoolWindow& g) {
  for (int d = 0; d < 3; ++d)
    if (g.stride[d] != g.kernel[d] || g.dilation[d] != 1 || g.pad_lo[d] != 0 ||
        g.in[d] != g.out[d] * g.kernel[d])
      return false;
  return true;
}

// kMax: the forward's choices as i64 `indices`, or as tap codes in `taps` (window.cuh).
template <bool kMax>
void launch_pool_backward(Context& ctx, const std::string& where, const PoolWindow& g,
                          bool count_include_pad, const DeviceTensor& dy,
                          const DeviceTensor* indices, const DeviceTensor& dx,
                          const BufferRange* taps = nullptr) {
  const PoolLayout layout = pool_layout(where, {{"dy", &dy}, {"dx", &dx}});
  const bool idx_cl = indices && indices_channels_last(where, *indices);
  if (dx.numel() == 0) return;
  BufferList reads = {dy.range()};
  if (indices) reads.push_back(indices->range());
  if (taps) reads.push_back(*taps);
  visit_device_float(where, dx.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t vectors = dx.numel() / kVecWidth<T>;
    if (kMax && taps && layout.channels_last && layout.vectorised && small_windows(g, vectors)) {
      // Blocks along dims 1 and 2 (see the kernel): those holding padded positions pad_lo ...
      // pad_lo + in - 1.
      const int64_t blocks_h =
          (g.in[1] - 1 + g.pad_lo[1]) / g.stride[1] - g.pad_lo[1] / g.stride[1] + 1;
      const int64_t blocks_w =
          (g.in[2] - 1 + g.pad_lo[2]) / g.stride[2] - g.pad_lo[2] / g.stride[2] + 1;
      const int64_t items = g.batch * blocks_h * blocks_w * (g.channels / kVecWidth<T>);
      if (items <= int64_t(INT32_MAX) && visit_small_blocks<T>(g, [&](auto kernel) {
            ctx.encoder.launch(kernel, dim3(launch_blocks(items, kThreads)), dim3(kThreads), 0,
                               reads, {dx.range()}, g, uint32_t(items), uint32_t(blocks_h),
                               uint32_t(blocks_w), dy.as<const T>(),
                               static_cast<const uint8_t*>(taps->data()), dx.as<T>());
          }))
        return;
    }
    visit_pool_layout<T>(layout, [&](auto vec, auto cl) {
      visit_unit_windows(g, [&](auto unit) {
        constexpr int V = decltype(vec)::value;
        constexpr bool kCL = decltype(cl)::value, kUnit = decltype(unit)::value;
        const int64_t work = dx.numel() / V;
        ctx.encoder.launch(taps ? &pool_backward_kernel<T, V, kCL, kUnit, kMax, kMax>
                                : &pool_backward_kernel<T, V, kCL, kUnit, kMax, false>,
                           dim3(launch_blocks(work, kThreads)), dim3(kThreads), 0, reads,
                           {dx.range()}, g, fits_u32(work), count_include_pad, dy.as<const T>(),
                           indices ? indices->as<const int64_t>() : nullptr, idx_cl,
                           taps ? static_cast<const uint8_t*>(taps->data()) : nullptr, dx.as<T>());
      });
    });
  });
}

void run_max_pool_backward(Context& ctx, const std::string& where, const PoolAttrs& attrs,
                           const DeviceTensor& dy, const DeviceTensor& indices,
                           const DeviceTensor& dx) {
  check_same_dtype(dy, dx, where);
  FUSEBOX_CHECK(indices.dtype == DType::i64 && indices.shape == dy.shape, where,
                "indices must be i64 ", shape_str(dy.shape));
  const PoolWindow g = make_pool_window(attrs, dx.shape, dy.shape, where);
  launch_pool_backward<true>(ctx, where, g, false, dy, &indices, dx);
}

void run_avg_pool_backward(Context& ctx, const std::string& where, const PoolAttrs& attrs,
                           const DeviceTensor& dy, const DeviceTensor& dx) {
  check_same_dtype(dy, dx, where);
  const PoolWindow g = make_pool_window(attrs, dx.shape, dy.shape, where);
  launch_pool_backward<false>(ctx, where, g, attrs.count_include_pad, dy, nullptr, dx);
}

}  // namespace

void max_pool_backward(Context& ctx, const PoolAttrs& attrs, const DeviceTensor& dy,
                       const DeviceTensor& indices, DeviceTensor& dx) {
  run_max_pool_backward(ctx, "max_pool_backward", attrs, dy, indices, dx);
}

void avg_pool_backward(Context& ctx, const PoolAttrs& attrs, const DeviceTensor& dy,
                       DeviceTensor& dx) {
  run_avg_pool_backward(ctx, "avg_pool_backward", attrs, dy, dx);
}

// (dy, x) -> dx: the forward's indices recomputed from x, then the gather.
void max_pool_backward(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const std::string where = node_label(n);
  const PoolAttrs& attrs = std::get<PoolBackwardAttrs>(n.attrs).pool;
  const DeviceTensor &dy = *in[0], &x = *in[1];
  const DeviceTensor& dx = out[0];
  FUSEBOX_CHECK(x.shape == dx.shape && x.dtype == dx.dtype, where, "x ", shape_str(x.shape),
                " and dx ", shape_str(dx.shape), " differ");
  check_same_dtype(dy, dx, where);
  const PoolWindow g = make_pool_window(attrs, x.shape, dy.shape, where);
  const PoolLayout layout = pool_layout(where, {{"dy", &dy}, {"x", &x}, {"dx", &dx}});
  if (dx.numel() == 0) return;
  if (windows_tile(g)) {
    visit_device_float(where, dx.dtype, [&](auto tag) {
      using T = decltype(tag);
      visit_pool_layout<T>(layout, [&](auto vec, auto cl) {
        constexpr int V = decltype(vec)::value;
        const int64_t work = dy.numel() / V;
        ctx.encoder.launch(&max_pool_tiles_backward<T, V, decltype(cl)::value>,
                           dim3(launch_blocks(work, kThreads)), dim3(kThreads), 0,
                           {x.range(), dy.range()}, {dx.range()}, g, fits_u32(work),
                           x.as<const T>(), dy.as<const T>(), dx.as<T>());
      });
    });
    return;
  }
  // The forward's choices into a temporary: in a compiled executable, arena bytes free at
  // this node (the backward pass has freed most activations by then), else a buffer held
  // with the recording. One byte per output where the window allows (window.cuh).
  if (fits_tap_codes(g)) {
    const BufferRange taps = ctx.encoder.temporary(ctx.allocator, size_t(dy.numel()));
    launch_max_pool(ctx, where, g, x, nullptr, nullptr, &taps);
    launch_pool_backward<true>(ctx, where, g, false, dy, nullptr, dx, &taps);
    return;
  }
  DeviceTensor indices = temporary_tensor(
      ctx, DType::i64, dy.shape,
      layout.channels_last ? MemoryFormat::channels_last : MemoryFormat::contiguous);
  if (dy.numel() > 0) launch_max_pool(ctx, where, g, x, nullptr, &indices);
  run_max_pool_backward(ctx, where, attrs, dy, indices, dx);
}

// (dy) -> dx of input_shape.
void avg_pool_backward(Context& ctx, const Node& n, Inputs in, Outputs out) {
  run_avg_pool_backward(ctx, node_label(n), std::get<PoolBackwardAttrs>(n.attrs).pool, *in[0],
                        out[0]);
}

}  // namespace fusebox::cuda
