// Softmax, log-softmax and layer norm on oneDNN, on the dense values as they lie: one
// forward-inference primitive each, made at compile. Layer norm over dims [axis, rank) is a
// layer norm over the last dim of the [rows, cols] view of the same bytes; taken where its
// statistics outputs are read by nothing (inference), with a scale and a bias of the
// normalised dims' shape.
#ifdef FUSEBOX_WITH_ONEDNN
#include "backends/cpu_fast/kernels.h"
#include "backends/cpu_fast/onednn.h"

namespace fusebox::cpu_fast {
namespace {

using dnnl::memory;

class SoftmaxKernel final : public Kernel {
 public:
  SoftmaxKernel(dnnl::softmax_forward::primitive_desc pd, memory::desc x)
      : pd_(std::move(pd)), primitive_(pd_), x_(x) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor> out) override {
    execute(primitive_,
            {{DNNL_ARG_SRC, wrap(x_, in[0]->raw())}, {DNNL_ARG_DST, wrap(x_, out[0].raw())}});
  }
  std::string describe() const override { return cat("oneDNN softmax ", implementation(pd_)); }

 private:
  dnnl::softmax_forward::primitive_desc pd_;
  dnnl::softmax_forward primitive_;
  memory::desc x_;
};

class LayerNormKernel final : public Kernel {
 public:
  LayerNormKernel(dnnl::layer_normalization_forward::primitive_desc pd, memory::desc x,
                  memory::desc y, memory scale, memory shift)
      : pd_(std::move(pd)), primitive_(pd_), x_(x), y_(y), scale_(scale), shift_(shift) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor> out) override {
    execute(primitive_, {{DNNL_ARG_SRC, wrap(x_, in[0]->raw())},
                         {DNNL_ARG_DST, wrap(y_, out[0].raw())},
                         {DNNL_ARG_SCALE, scale_},
                         {DNNL_ARG_SHIFT, shift_}});
  }
  std::string describe() const override {
    return cat("oneDNN layer_normalization ", implementation(pd_));
  }

 private:
  dnnl::layer_normalization_forward::primitive_desc pd_;
  dnnl::layer_normalization_forward primitive_;
  memory::desc x_, y_;
  memory scale_, shift_;
};

// Constant `v` (cols f32 values) in memory of its own, or `fill` everywhere where there is none.
memory parameter(const Graph& g, ValueId v, int64_t cols, float fill) {
  const memory::desc desc({cols}, memory::data_type::f32, memory::format_tag::x);
  if (v != kNoValue) return prepared_copy(*g.constant(v), desc, desc);
  memory m(desc, cpu_engine());
  float* p = static_cast<float*>(m.get_data_handle());
  for (int64_t i = 0; i < cols; ++i) p[i] = fill;
  return m;
}

}  // namespace

Planned plan_softmax(const Graph& g, const Node& n) {
  const TensorType& x = g.value(n.inputs[0]).type;
  const DType y = g.value(n.outputs[0]).type.dtype;
  if (x.dtype != DType::f32 || y != DType::f32)
    return {nullptr, cat("x ", dtype_name(x.dtype), ", y ", dtype_name(y), " (f32 only so far)")};
  const int64_t rank = int64_t(x.shape.size());
  int64_t axis = std::get<SoftmaxAttrs>(n.attrs).axis;
  if (axis < 0) axis += rank;
  if (rank == 0 || axis < 0 || axis >= rank) return {nullptr, "a scalar or an axis out of range"};
  const memory::desc plain = plain_desc(dims_of(x.shape));
  const auto algorithm = n.op == OpKind::log_softmax ? dnnl::algorithm::softmax_log
                                                     : dnnl::algorithm::softmax_accurate;
  try {
    dnnl::softmax_forward::primitive_desc pd(cpu_engine(), dnnl::prop_kind::forward_inference,
                                             algorithm, plain, plain, int(axis));
    return {std::make_unique<SoftmaxKernel>(pd, plain), ""};
  } catch (const dnnl::error& e) {
    return {nullptr, cat("oneDNN has no softmax for it (", e.what(), ")")};
  }
}

Planned plan_layer_norm(const Graph& g, const Node& n) {
  // x and y f32, bf16 or f16 each (the mixed form: low x or y, f32 statistics and parameters).
  const TensorType& x = g.value(n.inputs[0]).type;
  const DType y = g.value(n.outputs[0]).type.dtype;
  if (!data_type_of(x.dtype) || !data_type_of(y))
    return {nullptr,
            cat("x ", dtype_name(x.dtype), ", y ", dtype_name(y), " (f32, bf16 and f16 only)")};
  // The statistics outputs: read by nothing (not computed here).
  std::vector<bool> read(g.values().size(), false);
  for (const Node& m : g.nodes())
    for (ValueId v : m.inputs)
      if (v != kNoValue) read[size_t(v)] = true;
  for (ValueId v : g.outputs()) read[size_t(v)] = true;
  for (size_t i = 1; i < n.outputs.size(); ++i)
    if (read[size_t(n.outputs[i])]) return {nullptr, "its statistics are read (training)"};
  const int64_t rank = int64_t(x.shape.size());
  int64_t axis = std::get<NormAttrs>(n.attrs).axis;
  if (axis < 0) axis += rank;
  if (axis <= 0 || axis >= rank) return {nullptr, cat("axis ", axis, " (1 to rank - 1 so far)")};
  int64_t rows = 1, cols = 1;
  for (int64_t d = 0; d < rank; ++d) (d < axis ? rows : cols) *= x.shape[size_t(d)];
  const ValueId scale = n.inputs.size() > 1 ? n.inputs[1] : kNoValue;
  const ValueId bias = n.inputs.size() > 2 ? n.inputs[2] : kNoValue;
  for (ValueId v : {scale, bias}) {
    if (v == kNoValue) continue;
    if (!g.is_constant(v) || g.value(v).type.dtype != DType::f32 ||
        numel(g.value(v).type.shape) != cols)
      return {nullptr, "a scale or bias that is not a constant f32 of the normalised dims"};
  }
  const memory::desc x_view = plain_desc({rows, cols}, x.dtype),
                     y_view = plain_desc({rows, cols}, y);
  try {
    dnnl::layer_normalization_forward::primitive_desc pd(
        cpu_engine(), dnnl::prop_kind::forward_inference, x_view, y_view,
        float(std::get<NormAttrs>(n.attrs).epsilon),
        dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift);
    return {std::make_unique<LayerNormKernel>(pd, x_view, y_view, parameter(g, scale, cols, 1.f),
                                              parameter(g, bias, cols, 0.f)),
            ""};
  } catch (const dnnl::error& e) {
    return {nullptr, cat("oneDNN has no layer norm for it (", e.what(), ")")};
  }
}

}  // namespace fusebox::cpu_fast
#endif  // FUSEBOX_WITH_ONEDNN
