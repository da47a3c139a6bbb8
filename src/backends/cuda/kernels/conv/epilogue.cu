// conv_epilogue: the part of a convolution's fused epilogue (ir/ops.h ConvAttrs) that cuDNN
// did not run, in place on y, in one pass:
//
//   y = residual_activation(activation(y + bias[c]) + residual)
//
// with any of bias, activation and residual absent. Who calls it (kernels/conv/conv.cpp):
// cuDNN ran the plain convolution or conv + bias (the fused graph was refused), or the
// direct kernel ran. y, rounded to its dtype by the convolution, is read back in the compute
// type: one rounding more than cuDNN's fused graph, within the epilogue's tolerance.
//
// Paths. Dense y (every element once, channels-last or contiguous) with the residual in the
// same strides: a flat loop over memory, the channel of offset i being (i / channel_stride) %
// C; when channels are innermost (channel_stride 1) and C is a multiple of the vector
// width, 16-byte vectors (ResNet block ends in NHWC). Anything else: per-element index math
// over rank <= 5 dims and both tensors' strides.
#include "backends/common/activation.h"
#include "backends/cuda/kernels/common/dtype_dispatch.cuh"
#include "backends/cuda/kernels/conv/direct.h"
#include "backends/cuda/kernels/conv/operand_layout.h"

namespace fusebox::cuda {

namespace {

constexpr int kThreads = 256;

struct EpilogueOps {
  ActivationFn activation, residual_activation;
};

template <class T>
__device__ __forceinline__ compute_t<T> epilogue_value(const EpilogueOps& ops, compute_t<T> y,
                                                       const T* bias, int64_t channel,
                                                       const T* residual, int64_t r_offset) {
  if (bias) y += load_compute(bias, channel);
  y = activate(ops.activation, y);
  if (residual) y = activate(ops.residual_activation, y + load_compute(residual, r_offset));
  return y;
}

// Dense y, residual (if any) in y's strides: offset i's channel is (i / channel_stride) % C.
template <class T>
__global__ void epilogue_dense(EpilogueOps ops, int64_t total, int64_t channel_stride,
                               int64_t channels, const T* bias, const T* residual, T* y) {
  for (int64_t i = global_thread_index(); i < total; i += grid_stride()) {
    const int64_t c = (i / channel_stride) % channels;
    store_compute(y, i, epilogue_value(ops, load_compute(y, i), bias, c, residual, i));
  }
}

// Dense y with channels innermost and C a multiple of the vector width: vector v holds
// channels [(v * W) % C, + W).
template <class T>
__global__ void epilogue_vectors(EpilogueOps ops, int64_t vectors, int64_t channels, const T* bias,
                                 const T* residual, T* y) {
  constexpr int W = kVecWidth<T>;
  for (int64_t v = global_thread_index(); v < vectors; v += grid_stride()) {
    Vec<T> yv = load_vec(y, v), rv;
    if (residual) rv = load_vec(residual, v);
    const int64_t c0 = (v * W) % channels;
#pragma unroll
    for (int j = 0; j < W; ++j) {
      compute_t<T> value = convert<compute_t<T>>(yv.v[j]);
      if (bias) value += load_compute(bias, c0 + j);
      value = activate(ops.activation, value);
      if (residual)
        value = activate(ops.residual_activation, value + convert<compute_t<T>>(rv.v[j]));
      yv.v[j] = convert<T>(value);
    }
    store_vec(y, v, yv);
  }
}

struct StridedGeometry {
  int rank = 0;
  int64_t dims[5] = {1, 1, 1, 1, 1};
  int64_t y_strides[5] = {0, 0, 0, 0, 0};
  int64_t r_strides[5] = {0, 0, 0, 0, 0};
};

template <class T>
__global__ void epilogue_strided(EpilogueOps ops, StridedGeometry g, int64_t total, const T* bias,
                                 const T* residual, T* y) {
  for (int64_t idx = global_thread_index(); idx < total; idx += grid_stride()) {
    int64_t rem = idx, y_off = 0, r_off = 0, channel = 0;
    for (int d = g.rank - 1; d >= 0; --d) {
      const int64_t coord = rem % g.dims[d];
      rem /= g.dims[d];
      y_off += coord * g.y_strides[d];
      r_off += coord * g.r_strides[d];
      if (d == 1) channel = coord;
    }
    store_compute(y, y_off,
                  epilogue_value(ops, load_compute(y, y_off), bias, channel, residual, r_off));
  }
}

// y's strides cover its elements exactly once (a permutation of a contiguous layout).
bool dense(const DeviceTensor& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, extent)
  for (size_t d = 0; d < t.rank(); ++d)
    if (t.shape[d] != 1) dims.push_back({t.strides[d], t.shape[d]});
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (const auto& [stride, extent] : dims) {
    if (stride != expected) return false;
    expected *= extent;
  }
  return true;
}

}  // namespace

void conv_epilogue(Context& ctx, const Node& n, const ConvEpilogueOperands& e,
                   const DeviceTensor& y) {
  const std::string where = node_label(n);
  FUSEBOX_CHECK(y.rank() >= 2 && y.rank() <= 5, where, "conv epilogue on a rank-", y.rank(),
                " output");
  if (e.bias) {
    FUSEBOX_CHECK(
        e.bias->dtype == y.dtype && e.bias->shape == Shape{y.shape[1]} && e.bias->is_contiguous(),
        where, "bias ", dtype_name(e.bias->dtype), shape_str(e.bias->shape),
        " does not match output ", dtype_name(y.dtype), shape_str(y.shape));
  }
  if (e.residual) {
    FUSEBOX_CHECK(e.residual->dtype == y.dtype && e.residual->shape == y.shape, where, "residual ",
                  dtype_name(e.residual->dtype), shape_str(e.residual->shape),
                  " does not match output ", dtype_name(y.dtype), shape_str(y.shape));
  }
  if (y.numel() == 0 || (!e.bias && !e.residual && !e.activation)) return;
  const EpilogueOps ops{activation_fn(e.activation), activation_fn(e.residual_activation)};
  BufferList reads = {y.range()};
  if (e.bias) reads.push_back(e.bias->range());
  if (e.residual) reads.push_back(e.residual->range());
  const bool flat = dense(y) && (!e.residual || e.residual->strides == y.strides);
  const int64_t channels = y.shape[1], channel_stride = y.strides[1];
  visit_device_float(n, y.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* bias = e.bias ? e.bias->as<const T>() : nullptr;
    const T* residual = e.residual ? e.residual->as<const T>() : nullptr;
    constexpr int W = kVecWidth<T>;
    const bool vectors = flat && channel_stride == 1 && channels % W == 0 &&
                         is_aligned(y.data(), kVecBytes) &&
                         (!residual || is_aligned(residual, kVecBytes));
    if (vectors) {
      const int64_t count = y.numel() / W;
      ctx.encoder.launch(&epilogue_vectors<T>, dim3(launch_blocks(count, kThreads)), dim3(kThreads),
                         0, reads, {y.range()}, ops, count, channels, bias, residual, y.as<T>());
    } else if (flat) {
      ctx.encoder.launch(&epilogue_dense<T>, dim3(launch_blocks(y.numel(), kThreads)),
                         dim3(kThreads), 0, reads, {y.range()}, ops, y.numel(),
                         std::max<int64_t>(channel_stride, 1), channels, bias, residual, y.as<T>());
    } else {
      StridedGeometry g;
      g.rank = int(y.rank());
      for (int d = 0; d < g.rank; ++d) {
        g.dims[d] = y.shape[size_t(d)];
        g.y_strides[d] = y.strides[size_t(d)];
        g.r_strides[d] = e.residual ? e.residual->strides[size_t(d)] : 0;
      }
      ctx.encoder.launch(&epilogue_strided<T>, dim3(launch_blocks(y.numel(), kThreads)),
                         dim3(kThreads), 0, reads, {y.range()}, ops, g, y.numel(), bias, residual,
                         y.as<T>());
    }
  });
}

}  // namespace fusebox::cuda
