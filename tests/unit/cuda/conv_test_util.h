// Helpers for the convolution tests (test_conv_*.cpp): one configuration of any of the three
// convolution ops, its CPU reference, running it on the GPU with every tensor NCHW-contiguous
// or channels-last (a strided view of an NHWC / NDHWC buffer), outputs poisoned, environment
// variables and a forced convolution engine (as FUSEBOX_CONV_ENGINE) set for a scope.
#pragma once

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/kernels/conv/engines.h"
#include "backends/cuda/kernels/conv/report.h"
#include "gpu_vs_cpu.h"

namespace fusebox::cuda::testing {

using fusebox::testing::all_close;
using fusebox::testing::random_tensor;
using fusebox::testing::run_op;

using fusebox::testing::ScopedEnv;
using fusebox::testing::TempDir;

struct ConvConfig {
  OpKind op = OpKind::conv;  // conv, conv_backward_data, conv_backward_filter
  DType dtype = DType::f32;
  int64_t batch = 1, in_channels = 1, out_channels = 1, groups = 1;
  Shape spatial, filter;  // D (the forward input's extents) and R
  std::vector<int64_t> strides, dilations, pads_begin, pads_end;
  bool bias = false;           // conv and conv_backward_data only
  bool channels_last = false;  // every tensor (not the bias) as a channels-last view
  // conv only: the fused epilogue (ir/ops.h ConvAttrs) and its residual input.
  FusedActivation activation, residual_activation;
  bool residual = false;

  int rank() const { return int(spatial.size()); }
  Shape x_shape() const {
    Shape s = {batch, in_channels};
    s.insert(s.end(), spatial.begin(), spatial.end());
    return s;
  }
  Shape w_shape() const {
    Shape s = {out_channels, in_channels / groups};
    s.insert(s.end(), filter.begin(), filter.end());
    return s;
  }
  Shape y_shape() const {
    Shape s = {batch, out_channels};
    for (int d = 0; d < rank(); ++d) {
      const int64_t eff = dilations[size_t(d)] * (filter[size_t(d)] - 1) + 1;
      s.push_back((spatial[size_t(d)] + pads_begin[size_t(d)] + pads_end[size_t(d)] - eff) /
                      strides[size_t(d)] +
                  1);
    }
    return s;
  }
  ConvAttrs attrs() const {
    ConvAttrs a;
    a.strides = strides;
    a.dilations = dilations;
    a.pads_begin = pads_begin;
    a.pads_end = pads_end;
    a.groups = groups;
    return a;
  }
  ConvAttrs forward_attrs() const {
    ConvAttrs a = attrs();
    a.activation = activation;
    a.residual_activation = residual_activation;
    return a;
  }
  Attrs node_attrs() const {
    switch (op) {
      case OpKind::conv_backward_data:
        return ConvBackwardDataAttrs{attrs(), spatial};
      case OpKind::conv_backward_filter:
        return ConvBackwardFilterAttrs{attrs(), filter};
      default:
        return forward_attrs();
    }
  }
  std::string describe() const {
    auto v = [](const std::vector<int64_t>& x) { return shape_str(x); };
    return cat(op_name(op), " ", dtype_name(dtype), channels_last ? " channels-last" : " nchw",
               " x", shape_str(x_shape()), " w", shape_str(w_shape()), " s", v(strides), " d",
               v(dilations), " p", v(pads_begin), "/", v(pads_end), " g", groups,
               bias ? " +bias" : "", activation ? cat(" +", activation_name(activation.kind)) : "",
               residual ? " +residual" : "",
               residual_activation ? cat(" +", activation_name(residual_activation.kind)) : "");
  }
};

// The ranges random_window draws from: input extents per rank (index rank - 1), the larger
// filter extents 1-D and 2-D problems get with probability 1 / big_odds (0: never), the
// largest pad.
struct WindowRanges {
  int64_t in_lo[3] = {5, 4, 3}, in_hi[3] = {40, 14, 7};
  std::vector<int64_t> big_filters;
  int64_t big_odds = 0;
  int64_t max_pad = 2;
};

// Random spatial attributes of `rank` dims for c: input extents, filters 1-3 (or one of
// big_filters), stride 2 with probability 1/3, dilation 2 with probability 1/4 (filters > 1),
// pads below the window's reach; drawn again until the padded input holds a window.
inline void random_window(ConvConfig& c, std::mt19937_64& rng, int rank, const WindowRanges& r) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (;;) {
    c.spatial.clear(), c.filter.clear(), c.strides.clear(), c.dilations.clear();
    c.pads_begin.clear(), c.pads_end.clear();
    bool ok = true;
    for (int d = 0; d < rank; ++d) {
      const int64_t in = pick(r.in_lo[rank - 1], r.in_hi[rank - 1]);
      const bool big = rank < 3 && r.big_odds > 0 && pick(1, r.big_odds) == 1;
      const int64_t filter =
          big ? r.big_filters[size_t(pick(0, int64_t(r.big_filters.size()) - 1))] : pick(1, 3);
      const int64_t dilation = filter > 1 && pick(0, 3) == 0 ? 2 : 1;
      const int64_t reach = dilation * (filter - 1);
      c.spatial.push_back(in);
      c.filter.push_back(filter);
      c.strides.push_back(pick(0, 2) == 0 ? 2 : 1);
      c.dilations.push_back(dilation);
      c.pads_begin.push_back(std::min<int64_t>(pick(0, r.max_pad), reach));
      c.pads_end.push_back(std::min<int64_t>(pick(0, r.max_pad), reach));
      ok = ok && in + c.pads_begin.back() + c.pads_end.back() >= reach + 1;
    }
    if (ok) return;
  }
}

// Channels-last strides of a logical [N, C, S...] shape: C fastest, then S..., then N.
inline Shape channels_last_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = shape[1];
  strides[1] = 1;
  for (size_t i = shape.size(); i-- > 2;) {
    strides[i] = s;
    s *= shape[i];
  }
  strides[0] = s;
  return strides;
}

// The bytes of `t` laid out with `strides` (a permutation of its dims): a flat host tensor
// that, viewed with t's shape and `strides`, reads as t.
inline Tensor permuted_storage(const Tensor& t, const Shape& strides) {
  const std::vector<double> values = t.to_doubles();
  std::vector<double> stored(values.size());
  const Shape& shape = t.shape();
  for (size_t i = 0; i < values.size(); ++i) {
    int64_t rem = int64_t(i), offset = 0;
    for (size_t d = shape.size(); d-- > 0;) {
      offset += (rem % shape[d]) * strides[d];
      rem /= shape[d];
    }
    stored[size_t(offset)] = values[i];
  }
  return Tensor::from_doubles(t.dtype(), {t.numel()}, stored);
}

// Device tensors of a configuration in its layout, through a kernel Context.
class ConvDeviceRunner {
 public:
  explicit ConvDeviceRunner(Context& ctx) : ctx_(ctx) {}

  DeviceTensor upload(const Tensor& t, bool channels_last) {
    const bool permute = channels_last && t.shape().size() >= 3;
    const Shape strides =
        permute ? channels_last_strides(t.shape()) : contiguous_strides(t.shape());
    const Tensor stored = permute ? permuted_storage(t, strides) : t;
    DeviceTensor d = DeviceTensor::empty(ctx_.allocator, t.dtype(), t.shape());
    ctx_.encoder.copy_to_device(d.range(), stored.raw());
    d.strides = strides;
    return d;
  }
  // A fresh output with every byte 0xFF (NaN), written by a recorded memset.
  DeviceTensor poisoned(DType dtype, const Shape& shape, bool channels_last) {
    DeviceTensor d = DeviceTensor::empty(ctx_.allocator, dtype, shape);
    ctx_.encoder.memset(d.range(), 0xFF);
    if (channels_last) d.strides = channels_last_strides(shape);
    return d;
  }
  Tensor download(const DeviceTensor& d) {
    Tensor flat = Tensor::empty(d.dtype, {d.numel()});
    ctx_.encoder.copy_to_host(flat.raw(), d.range());
    return gather(flat, d.shape, d.strides, 0);
  }

 private:
  Context& ctx_;
};

// Inputs of a configuration (host, logical NCHW; an undefined tensor for no bias), in the
// node's input order.
inline std::vector<Tensor> conv_inputs(const ConvConfig& c, uint64_t seed) {
  Tensor x = random_tensor(c.dtype, c.x_shape(), seed);
  Tensor w = random_tensor(c.dtype, c.w_shape(), seed + 1);
  Tensor y = random_tensor(c.dtype, c.y_shape(), seed + 2);
  switch (c.op) {
    case OpKind::conv: {
      std::vector<Tensor> in = {
          x, w, c.bias ? random_tensor(c.dtype, {c.out_channels}, seed + 3) : Tensor()};
      if (c.residual) in.push_back(random_tensor(c.dtype, c.y_shape(), seed + 4));
      return in;
    }
    case OpKind::conv_backward_data:
      return {y, w, c.bias ? random_tensor(c.dtype, {c.in_channels}, seed + 3) : Tensor()};
    default:
      return {x, y};
  }
}

// Runs the op's kernels.h entry on `ctx` (inputs and output in c's layout, output poisoned)
// and returns the output as a contiguous host tensor. Throws what the entry throws.
inline Tensor run_conv_on_gpu(Context& ctx, const ConvConfig& c, const std::vector<Tensor>& in) {
  KernelEntry entry = c.op == OpKind::conv                 ? &conv_forward
                      : c.op == OpKind::conv_backward_data ? &conv_backward_data
                                                           : &conv_backward_filter;
  const BuiltNode built = build_node(c.op, c.node_attrs(), in);
  ConvDeviceRunner runner(ctx);
  std::vector<DeviceTensor> device(in.size());
  std::vector<const DeviceTensor*> pointers;
  for (size_t i = 0; i < in.size(); ++i) {
    const bool is_bias = i == 2;
    if (in[i].defined()) device[i] = runner.upload(in[i], c.channels_last && !is_bias);
    pointers.push_back(in[i].defined() ? &device[i] : nullptr);
  }
  std::vector<DeviceTensor> out = {
      runner.poisoned(built.outputs[0].dtype, built.outputs[0].shape, c.channels_last)};
  entry(ctx, built.node, pointers, out);
  ctx.encoder.synchronize();
  check_error_flags(ctx);
  return runner.download(out[0]);
}

inline Tensor run_conv_on_gpu(OpHarness& h, const ConvConfig& c, const std::vector<Tensor>& in) {
  return run_conv_on_gpu(h.ctx(), c, in);
}

// Forces a convolution engine for a scope as FUSEBOX_CONV_ENGINE=`spec` does ("name[:variant]";
// "": the default policy), in process (engines.h set_conv_engine_override).
class ScopedConvEngine {
 public:
  explicit ScopedConvEngine(const std::string& spec) : previous_(conv_engine_override()) {
    set_conv_engine_override(spec.empty() ? std::nullopt
                                          : std::optional<ConvEngineChoice>(
                                                parse_conv_engine(spec, "ScopedConvEngine")));
  }
  ~ScopedConvEngine() { set_conv_engine_override(previous_); }
  ScopedConvEngine(const ScopedConvEngine&) = delete;
  ScopedConvEngine& operator=(const ScopedConvEngine&) = delete;

 private:
  std::optional<ConvEngineChoice> previous_;
};

// Whether `e` says a forced engine cannot run a problem (engines.cpp run_forced).
inline bool is_forced_engine_refusal(const Error& e) {
  const std::string m = e.what();
  return m.find("FUSEBOX_CONV_ENGINE=") != std::string::npos &&
         m.find(" cannot run ") != std::string::npos;
}

// Runs c on engine `spec` where that engine takes it, else (its refusal) under the default
// policy; *forced (when given) says which.
inline Tensor run_conv_preferring(Context& ctx, const ConvConfig& c, const std::vector<Tensor>& in,
                                  const std::string& spec, bool* forced = nullptr) {
  if (forced) *forced = false;
  if (!spec.empty()) {
    ScopedConvEngine engine(spec);
    try {
      Tensor got = run_conv_on_gpu(ctx, c, in);
      if (forced) *forced = true;
      return got;
    } catch (const Error& e) {
      if (!is_forced_engine_refusal(e)) throw;
    }
  }
  return run_conv_on_gpu(ctx, c, in);
}

// Relative L2 error of got against want (inf when got has a non-finite element).
inline double relative_l2_error(const Tensor& got, const Tensor& want) {
  const std::vector<double> g = got.to_doubles(), w = want.to_doubles();
  if (g.size() != w.size()) return INFINITY;
  double diff = 0, norm = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(g[i])) return INFINITY;
    diff += (g[i] - w[i]) * (g[i] - w[i]);
    norm += w[i] * w[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

// Relative L2 tolerances against the CPU reference (which rounds its output to the dtype
// too). f32 on cuDNN with TF32 (the default): inputs rounded to 10 mantissa bits, ~5e-4
// per product, so 3e-3; f32 without TF32 and the direct kernel: 1e-5. f16: 5e-3 (two output
// roundings apart, plus the bias added after a rounding on the bias-kernel path); bf16 2e-2.
inline double conv_l2_tolerance(DType t, bool tf32) {
  switch (t) {
    case DType::f32:
      return tf32 ? 3e-3 : 1e-5;
    case DType::f16:
      return 5e-3;
    case DType::f64:
      return 1e-12;
    default:
      return 2e-2;
  }
}

}  // namespace fusebox::cuda::testing
