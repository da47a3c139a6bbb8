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
#include "backends/cuda/kernels/conv/depthwise/depthwise.h"

#include <algorithm>

#include "backends/common/activation.h"
#include "backends/common/conv_geometry.h"
#include "backends/cuda/kernels/common/dtype_dispatch.cuh"
#include "backends/cuda/kernels/conv/operand_layout.h"
#include "backends/cuda/kernels/conv/split_sum.cuh"

namespace fusebox::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxFilterWidth = 8;  // wgrad keeps one accumulator vector per r2

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
// (depthwise_cannot_implement keeps tensors under 2^31 elements).
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

}  // namespace

std::optional<std::string> depthwise_cannot_implement(const Node& n, ConvOp op, Inputs in,
                                                      const DeviceTensor& out) {
  const DType t = out.dtype;
  if (t != DType::f32 && t != DType::f16 && t != DType::bf16) return cat("dtype ", dtype_name(t));
  for (const DeviceTensor* i : in)
    if (i != nullptr && i->dtype != t) return std::string("mixed dtypes");
  // Operands already channels-last are read in place: they must be 16-byte aligned (copies
  // are).
  for (const DeviceTensor* i : in)
    if (i != nullptr && (i->is_channels_last() || i->rank() == 1) && !aligned16(i))
      return std::string("an operand not 16-byte aligned");
  if (out.is_channels_last() && !aligned16(&out))
    return std::string("the output not 16-byte aligned");
  const ConvGeometry g = conv_geometry_of(n, op, in, out);
  if (g.groups != g.in_channels || g.out_channels != g.in_channels)
    return std::string("not depthwise (groups == C == K)");
  const int v = 16 / int(dtype_size(t));
  if (g.in_channels % v != 0) return cat("C = ", g.in_channels, " not a multiple of ", v);
  if (op == ConvOp::wgrad && g.filter[2] > kMaxFilterWidth)
    return cat("filter width ", g.filter[2], " > ", kMaxFilterWidth);
  const int64_t largest = std::max(g.batch * g.in_size(), g.batch * g.out_size()) * g.in_channels;
  if (largest >= (int64_t(1) << 31)) return std::string("a tensor of 2^31 elements or more");
  return std::nullopt;
}

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
        const int rows = p.filter[0] * p.filter[1];
        const int64_t pixels = g.batch * g.out_size();
        const unsigned blocks_x = unsigned((int64_t(rows) * vectors + kThreads - 1) / kThreads);
        // Splits: about four waves of 256-thread blocks, at least 64 pixels each.
        const int64_t target = std::max<int64_t>(1, 4 * 132 * 4 / std::max<unsigned>(1, blocks_x));
        const int64_t wanted = std::clamp<int64_t>(target, 1, std::max<int64_t>(1, pixels / 64));
        const int64_t per_split = std::max<int64_t>(1, (pixels + wanted - 1) / wanted);
        // None of them empty (an empty batch: one split of zeros).
        const int64_t splits = std::max<int64_t>(1, (pixels + per_split - 1) / per_split);
        const int64_t count = taps * p.channels;
        DeviceTensor partial = temporary_tensor(ctx, DType::f32, {splits * count});
        DeviceTensor summed = temporary_tensor(ctx, dtype, {taps, int64_t(p.channels)});
        ctx.encoder.launch(&depthwise_wgrad<T>, dim3(blocks_x, unsigned(splits)), dim3(kThreads), 0,
                           {xs.range(), dys.range()}, {partial.range()}, p, xs.as<const T>(),
                           dys.as<const T>(), per_split, partial.as<float>());
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
      if (op == ConvOp::fprop) {
        ctx.encoder.launch(&depthwise_fprop<T>, dim3(launch_blocks(work, kThreads)), dim3(kThreads),
                           0, reads, {written.range()}, p, src.as<const T>(), wt.as<const T>(),
                           bias ? bias->as<const T>() : nullptr,
                           residual ? residual->as<const T>() : nullptr, written.as<T>());
      } else {
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
