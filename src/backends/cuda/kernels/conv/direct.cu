// Direct convolution: conv_forward_direct, conv_backward_data_direct and
// conv_backward_filter_direct for 1 to 3 spatial dims, groups, dilation, stride and
// asymmetric pads, with bias. The last resort (kernels/conv/conv.cpp sends problems to
// cuDNN, else to the implicit GEMM) and the oracle: simple and correct, not fast.
//
// The problem is the backends' shared ConvGeometry (backends/common/conv_geometry.h, the
// CPU backend's too): x [N, C, D], w [K, C/g, R], y [N, K, O], 1-D and 2-D problems stored
// as 3-D ones with leading extents of 1; the high pads are implied by O (taps past D read
// zero). Tap r of output position o reads input position o * stride - pad_lo + r *
// dilation. Arithmetic in f32 (f64 for f64), each output rounded once.
//
//   fprop: one thread per y element: y[n,k,o] = bias[k] + sum over c in k's group and
//          taps r of x[n,c,o*s-p+r*d] * w[k,c,r].
//   dgrad: one thread per dx element: dx[n,c,i] = bias[c] + sum over k in c's group and
//          taps r with i + p - r*d = o*s for an output o of dy[n,k,o] * w[k,c,r].
//   wgrad: one thread per (weight element, split) sums x * dy over its split of the N x O
//          positions into f32 partials; a second kernel adds the splits in order.
// Speed: each multiply-add reads its operands through L1 / L2, about 1-3% of the GPU's
// f32 rate: a ResNet-50 3x3 layer (N64 C64 56x56 K64) takes a few ms where cuDNN takes
// 0.05 ms. Deterministic.
#include "backends/cuda/kernels/conv/direct.h"

#include "backends/common/conv_geometry.h"
#include "backends/cuda/kernels/common/dtype_dispatch.cuh"
#include "backends/cuda/kernels/conv/split_sum.cuh"

namespace fusebox::cuda {

namespace {

constexpr int kThreads = 256;

// Flat index over [outer, e0, e1, e2] -> outer and the 3-D position.
__device__ __forceinline__ void split3(const int64_t (&extent)[3], int64_t idx, int64_t& outer,
                                       int64_t (&pos)[3]) {
  pos[2] = idx % extent[2];
  idx /= extent[2];
  pos[1] = idx % extent[1];
  idx /= extent[1];
  pos[0] = idx % extent[0];
  outer = idx / extent[0];
}

template <class T>
__global__ void conv_fprop_kernel(ConvGeometry p, const T* x, const T* w, const T* bias, T* y) {
  using C = compute_t<T>;
  const int64_t total = p.batch * p.out_channels * p.out_size();
  const int64_t cg = p.in_per_group(), taps = p.filter_size();
  for (int64_t idx = global_thread_index(); idx < total; idx += grid_stride()) {
    int64_t nk, o[3];
    split3(p.out, idx, nk, o);
    const int64_t n = nk / p.out_channels, k = nk % p.out_channels;
    const int64_t g = k / p.out_per_group();
    C acc = 0;
    for (int64_t c = 0; c < cg; ++c) {
      const T* xc = x + (n * p.in_channels + g * cg + c) * p.in_size();
      const T* wc = w + (k * cg + c) * taps;
      for (int64_t r0 = 0; r0 < p.filter[0]; ++r0) {
        const int64_t i0 = o[0] * p.stride[0] - p.pad_lo[0] + r0 * p.dilation[0];
        if (i0 < 0 || i0 >= p.in[0]) continue;
        for (int64_t r1 = 0; r1 < p.filter[1]; ++r1) {
          const int64_t i1 = o[1] * p.stride[1] - p.pad_lo[1] + r1 * p.dilation[1];
          if (i1 < 0 || i1 >= p.in[1]) continue;
          for (int64_t r2 = 0; r2 < p.filter[2]; ++r2) {
            const int64_t i2 = o[2] * p.stride[2] - p.pad_lo[2] + r2 * p.dilation[2];
            if (i2 < 0 || i2 >= p.in[2]) continue;
            acc += load_compute(xc, (i0 * p.in[1] + i1) * p.in[2] + i2) *
                   load_compute(wc, (r0 * p.filter[1] + r1) * p.filter[2] + r2);
          }
        }
      }
    }
    if (bias) acc += load_compute(bias, k);
    store_compute(y, idx, acc);
  }
}

// The output position o along dim d that tap r of input position i belongs to, or -1.
__device__ __forceinline__ int64_t output_of(const ConvGeometry& p, int d, int64_t i, int64_t r) {
  const int64_t t = i + p.pad_lo[d] - r * p.dilation[d];
  if (t < 0 || t % p.stride[d] != 0) return -1;
  const int64_t o = t / p.stride[d];
  return o < p.out[d] ? o : -1;
}

template <class T>
__global__ void conv_dgrad_kernel(ConvGeometry p, const T* dy, const T* w, const T* bias, T* dx) {
  using C = compute_t<T>;
  const int64_t total = p.batch * p.in_channels * p.in_size();
  const int64_t cg = p.in_per_group(), kg = p.out_per_group(), taps = p.filter_size();
  for (int64_t idx = global_thread_index(); idx < total; idx += grid_stride()) {
    int64_t nc, i[3];
    split3(p.in, idx, nc, i);
    const int64_t n = nc / p.in_channels, c = nc % p.in_channels;
    const int64_t g = c / cg, cc = c % cg;
    C acc = 0;
    for (int64_t kk = 0; kk < kg; ++kk) {
      const int64_t k = g * kg + kk;
      const T* dyk = dy + (n * p.out_channels + k) * p.out_size();
      const T* wk = w + (k * cg + cc) * taps;
      for (int64_t r0 = 0; r0 < p.filter[0]; ++r0) {
        const int64_t o0 = output_of(p, 0, i[0], r0);
        if (o0 < 0) continue;
        for (int64_t r1 = 0; r1 < p.filter[1]; ++r1) {
          const int64_t o1 = output_of(p, 1, i[1], r1);
          if (o1 < 0) continue;
          for (int64_t r2 = 0; r2 < p.filter[2]; ++r2) {
            const int64_t o2 = output_of(p, 2, i[2], r2);
            if (o2 < 0) continue;
            acc += load_compute(dyk, (o0 * p.out[1] + o1) * p.out[2] + o2) *
                   load_compute(wk, (r0 * p.filter[1] + r1) * p.filter[2] + r2);
          }
        }
      }
    }
    if (bias) acc += load_compute(bias, c);
    store_compute(dx, idx, acc);
  }
}

// Thread (weight element, split blockIdx.y): the sum over positions [first, last) of the
// flattened N x O space of dy[n,k,o] * x[n,c,o*s-p+r*d], into partial[split][weight].
template <class T>
__global__ void conv_wgrad_kernel(ConvGeometry p, const T* x, const T* dy, int64_t per_split,
                                  compute_t<T>* partial) {
  using C = compute_t<T>;
  const int64_t weights = p.out_channels * p.in_per_group() * p.filter_size();
  const int64_t widx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (widx >= weights) return;
  int64_t kc, r[3];
  split3(p.filter, widx, kc, r);
  const int64_t cg = p.in_per_group();
  const int64_t k = kc / cg, cc = kc % cg, g = k / p.out_per_group();
  const int64_t c = g * cg + cc;
  int64_t shift[3];
  for (int d = 0; d < 3; ++d) shift[d] = r[d] * p.dilation[d] - p.pad_lo[d];
  const int64_t positions = p.batch * p.out_size();
  const int64_t first = int64_t(blockIdx.y) * per_split;
  const int64_t last = min(positions, first + per_split);
  C acc = 0;
  if (first < last) {
    // Walk the positions with an incremental (n, o0, o1, o2) counter.
    int64_t n, o[3];
    split3(p.out, first, n, o);
    for (int64_t f = first; f < last; ++f) {
      const int64_t i0 = o[0] * p.stride[0] + shift[0], i1 = o[1] * p.stride[1] + shift[1];
      const int64_t i2 = o[2] * p.stride[2] + shift[2];
      if (i0 >= 0 && i0 < p.in[0] && i1 >= 0 && i1 < p.in[1] && i2 >= 0 && i2 < p.in[2]) {
        const C xv = load_compute(
            x, (n * p.in_channels + c) * p.in_size() + (i0 * p.in[1] + i1) * p.in[2] + i2);
        const C dv = load_compute(dy, (n * p.out_channels + k) * p.out_size() +
                                          (o[0] * p.out[1] + o[1]) * p.out[2] + o[2]);
        acc += xv * dv;
      }
      if (++o[2] == p.out[2]) {
        o[2] = 0;
        if (++o[1] == p.out[1]) {
          o[1] = 0;
          if (++o[0] == p.out[0]) {
            o[0] = 0;
            ++n;
          }
        }
      }
    }
  }
  partial[int64_t(blockIdx.y) * weights + widx] = acc;
}

void check_same_dtype(const DeviceTensor& a, const DeviceTensor& b, const char* a_name,
                      const char* b_name, const std::string& where) {
  FUSEBOX_CHECK(a.dtype == b.dtype, where, a_name, " is ", dtype_name(a.dtype), " but ", b_name,
                " is ", dtype_name(b.dtype));
}

void check_bias(const DeviceTensor* bias, const DeviceTensor& out, int64_t channels,
                const std::string& where) {
  if (!bias) return;
  check_same_dtype(*bias, out, "bias", "output", where);
  FUSEBOX_CHECK(bias->shape == Shape{channels}, where, "bias ", shape_str(bias->shape),
                " should be [", channels, "]");
}

const DeviceTensor* optional_input(Inputs in, size_t i) {
  return i < in.size() ? in[i] : nullptr;
}

template <class T>
const T* data_or_null(const DeviceTensor* t) {
  return t ? t->as<const T>() : nullptr;
}

BufferList ranges_of(std::initializer_list<const DeviceTensor*> tensors) {
  BufferList list;
  for (const DeviceTensor* t : tensors)
    if (t) list.push_back(t->range());
  return list;
}

}  // namespace

// x [N, C, D...], w [K, C/g, R...], bias [K]? -> y [N, K, O...]
void conv_forward_direct(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const std::string where = node_label(n);
  const DeviceTensor &x = *in[0], &w = *in[1];
  const DeviceTensor* bias = optional_input(in, 2);
  DeviceTensor& y = out[0];
  check_same_dtype(x, y, "input", "output", where);
  check_same_dtype(w, y, "weight", "output", where);
  const ConvGeometry p =
      make_conv_geometry(std::get<ConvAttrs>(n.attrs), x.shape, w.shape, y.shape, where);
  check_bias(bias, y, p.out_channels, where);
  if (y.numel() == 0) return;
  visit_device_float(n, y.dtype, [&](auto tag) {
    using T = decltype(tag);
    ctx.encoder.launch(&conv_fprop_kernel<T>, dim3(launch_blocks(y.numel(), kThreads)),
                       dim3(kThreads), 0, ranges_of({&x, &w, bias}), {y.range()}, p,
                       x.as<const T>(), w.as<const T>(), data_or_null<T>(bias), y.as<T>());
  });
}

// dy [N, K, O...], w [K, C/g, R...], bias [C]? -> dx [N, C, D...]
void conv_backward_data_direct(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const std::string where = node_label(n);
  const DeviceTensor &dy = *in[0], &w = *in[1];
  const DeviceTensor* bias = optional_input(in, 2);
  DeviceTensor& dx = out[0];
  check_same_dtype(dy, dx, "dy", "dx", where);
  check_same_dtype(w, dx, "weight", "dx", where);
  const auto& attrs = std::get<ConvBackwardDataAttrs>(n.attrs);
  const ConvGeometry p = make_conv_geometry(attrs.conv, dx.shape, w.shape, dy.shape, where);
  check_bias(bias, dx, p.in_channels, where);
  if (dx.numel() == 0) return;
  visit_device_float(n, dx.dtype, [&](auto tag) {
    using T = decltype(tag);
    ctx.encoder.launch(&conv_dgrad_kernel<T>, dim3(launch_blocks(dx.numel(), kThreads)),
                       dim3(kThreads), 0, ranges_of({&dy, &w, bias}), {dx.range()}, p,
                       dy.as<const T>(), w.as<const T>(), data_or_null<T>(bias), dx.as<T>());
  });
}

// x [N, C, D...], dy [N, K, O...] -> dw [K, C/g, R...]
void conv_backward_filter_direct(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const std::string where = node_label(n);
  const DeviceTensor &x = *in[0], &dy = *in[1];
  DeviceTensor& dw = out[0];
  check_same_dtype(x, dw, "x", "dw", where);
  check_same_dtype(dy, dw, "dy", "dw", where);
  const auto& attrs = std::get<ConvBackwardFilterAttrs>(n.attrs);
  const ConvGeometry p = make_conv_geometry(attrs.conv, x.shape, dw.shape, dy.shape, where);
  const int64_t weights = dw.numel();
  if (weights == 0) return;
  // Splits of the N x O positions: enough threads to fill the GPU (about 64K), each split
  // at least 64 positions.
  const int64_t positions = p.batch * p.out_size();
  const int64_t splits =
      std::clamp<int64_t>((int64_t(1) << 16) / weights, 1,
                          std::min<int64_t>(std::max<int64_t>(1, positions / 64), 65535));
  const int64_t per_split = (positions + splits - 1) / splits;
  visit_device_float(n, dw.dtype, [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    DeviceBuffer partial = ctx.allocator.allocate(size_t(splits * weights) * sizeof(C));
    ctx.encoder.add_temporary(partial);
    ctx.encoder.launch(&conv_wgrad_kernel<T>,
                       dim3(unsigned((weights + kThreads - 1) / kThreads), unsigned(splits)),
                       dim3(kThreads), 0, {x.range(), dy.range()}, {partial}, p, x.as<const T>(),
                       dy.as<const T>(), per_split, partial.as<C>());
    record_sum_splits<T>(ctx, BufferRange(partial), partial.as<const C>(), splits, weights,
                         dw.range(), dw.as<T>());
  });
}

}  // namespace fusebox::cuda
