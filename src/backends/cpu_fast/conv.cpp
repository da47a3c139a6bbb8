// Convolutions on oneDNN: one forward-inference primitive per node, chosen at compile with
// every operand's layout left to oneDNN ("any": blocked layouts on x86); constant weights and
// bias reordered into it then. An activation between two convolutions stays in the writer's
// layout (Kernel::run_own: the executable keeps it so where every reader is a convolution);
// others are reordered from and to dense NCHW around the run. The epilogue of ConvAttrs runs as
// post-ops: bias, activation, the residual add, the residual's activation. The residual is a sum
// post-op (dst += the residual, which the run first writes into dst in dst's layout): a binary
// post-op reading a plain residual beside a blocked dst sent oneDNN to its reference
// implementation (300-430 ms for one of ResNet-50's 1x1 convolutions at batch 1, 2 cores).
#ifdef FUSEBOX_WITH_ONEDNN
#include "backends/cpu_fast/kernels.h"
#include "backends/cpu_fast/onednn.h"

namespace fusebox::cpu_fast {
namespace {

using dnnl::memory;

class ConvKernel final : public Kernel {
 public:
  ConvKernel(dnnl::convolution_forward::primitive_desc pd, memory::desc x_plain,
             memory::desc w_plain, memory::desc y_plain, std::optional<memory> weights,
             std::optional<memory> bias, bool has_bias, bool has_residual)
      : pd_(std::move(pd)),
        primitive_(pd_),
        x_plain_(x_plain),
        w_plain_(w_plain),
        y_plain_(y_plain),
        weights_(std::move(weights)),
        bias_(std::move(bias)),
        has_bias_(has_bias),
        has_residual_(has_residual) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor> out) override {
    run_own(in, {}, 0, out, nullptr);
  }

  bool writes_own_layout() const override { return true; }
  bool reads_own_layout(size_t input) const override { return input == 0 || input == 3; }

  void run_own(std::span<const Tensor* const> in, std::span<const OwnLayout* const> own_in,
               uint32_t consumable, std::span<Tensor> out,
               std::shared_ptr<OwnLayout>* own_out) override {
    // Input i as oneDNN memory: the writer's own layout, or the dense tensor in `plain`.
    auto source = [&](size_t i, const memory::desc& plain) {
      const OwnLayout* own = i < own_in.size() ? own_in[i] : nullptr;
      return own ? static_cast<const OnednnValue*>(own)->memory : wrap(plain, in[i]->raw());
    };
    std::unordered_map<int, memory> args;
    args[DNNL_ARG_SRC] = in_layout(source(0, x_plain_), pd_.src_desc());
    args[DNNL_ARG_WEIGHTS] =
        weights_ ? *weights_ : in_layout(wrap(w_plain_, in[1]->raw()), pd_.weights_desc());
    if (has_bias_)
      args[DNNL_ARG_BIAS] =
          bias_ ? *bias_ : wrap(pd_.bias_desc(), in[2]->raw());  // a 1-D bias is plain
    std::optional<memory> y;  // the dense output, unless it stays in the primitive's layout
    if (!own_out) y = wrap(y_plain_, out[0].raw());
    const bool direct = y && pd_.dst_desc() == y_plain_;
    // The sum post-op adds dst's contents: the residual, in dst's layout. A residual in that
    // layout whose last reader this is becomes dst itself; another is copied into it.
    const memory residual = has_residual_ ? source(3, y_plain_) : memory();
    const bool in_place = has_residual_ && own_out && own_in.size() > 3 && own_in[3] &&
                          (consumable >> 3 & 1u) && residual.get_desc() == pd_.dst_desc();
    args[DNNL_ARG_DST] = in_place ? residual : direct ? *y : memory(pd_.dst_desc(), cpu_engine());
    if (has_residual_ && !in_place)
      execute(dnnl::reorder(residual, args[DNNL_ARG_DST]),
              {{DNNL_ARG_FROM, residual}, {DNNL_ARG_TO, args[DNNL_ARG_DST]}});
    execute(primitive_, args);
    if (own_out)
      *own_out = std::make_shared<OnednnValue>(args[DNNL_ARG_DST]);
    else if (!direct)
      execute(dnnl::reorder(args[DNNL_ARG_DST], *y),
              {{DNNL_ARG_FROM, args[DNNL_ARG_DST]}, {DNNL_ARG_TO, *y}});
  }

  std::string describe() const override {
    return cat("oneDNN conv ", implementation(pd_),
               weights_ ? " (weights reordered once)" : " (weights reordered each run)");
  }

 private:
  dnnl::convolution_forward::primitive_desc pd_;
  dnnl::convolution_forward primitive_;
  memory::desc x_plain_, w_plain_, y_plain_;
  std::optional<memory> weights_, bias_;
  bool has_bias_, has_residual_;
};

// Whether a convolution asks for 8-channel blocks (nChw8c) around it, not oneDNN's choice:
// f32 1x1 convolutions over multiples of 8 channels on AVX2 CPUs (no AVX-512). oneDNN 3.2
// picks channels-last and its brgconv kernels for "any", which were 1.11-1.45x slower on
// ResNet-50's 1x1 convolutions there than its direct kernel on 8-channel blocks (2-core AMD
// EPYC, batch 8), while its 3x3 convolutions were 1.1-1.4x faster channels-last: blocked 1x1
// convolutions beside channels-last 3x3 ones (a reorder between them, 11 ms a step) ran
// ResNet-50 b8 in 474.8 ms against 504.2 (b1 57.2 against 60.6; MobileNetV3-S b8 unchanged,
// interleaved runs; bench/results/2026-11-30_cpu_issue43_blocked_1x1/).
bool blocked_1x1(DType dtype, const Shape& xs, const Shape& ws, const Shape& ys, int64_t groups) {
  static const bool avx2_only = [] {
    const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
    return isa == dnnl::cpu_isa::avx2 || isa == dnnl::cpu_isa::avx2_vnni ||
           isa == dnnl::cpu_isa::avx2_vnni_2;
  }();
  return avx2_only && dtype == DType::f32 && groups == 1 && xs.size() == 4 && ws[2] == 1 &&
         ws[3] == 1 && xs[1] % 8 == 0 && ys[1] % 8 == 0;
}

}  // namespace

Planned plan_conv(const Graph& g, const Node& n) {
  const auto& a = std::get<ConvAttrs>(n.attrs);
  auto input = [&](size_t i) { return i < n.inputs.size() ? n.inputs[i] : kNoValue; };
  const ValueId x = input(0), w = input(1), bias = input(2), residual = input(3);
  // One dtype for x, w, y and the residual: f32, or bf16 / f16 where the CPU computes in it
  // (AVX-512 BF16 / AMX, AVX-512 FP16: else oneDNN refuses the primitive below, saying so);
  // the bias in it or f32.
  const DType dtype = g.value(x).type.dtype;
  if (!data_type_of(dtype))
    return {nullptr, cat("a ", dtype_name(dtype), " input (f32, bf16 and f16 only)")};
  for (ValueId v : {w, residual, n.outputs[0]})
    if (v != kNoValue && g.value(v).type.dtype != dtype)
      return {nullptr, cat("operands of mixed dtypes (", dtype_name(dtype), " and ",
                           dtype_name(g.value(v).type.dtype), ")")};
  const DType bias_dtype = bias == kNoValue ? dtype : g.value(bias).type.dtype;
  if (bias_dtype != dtype && bias_dtype != DType::f32)
    return {nullptr, cat("a ", dtype_name(bias_dtype), " bias for ", dtype_name(dtype), " x")};
  const Shape& xs = g.value(x).type.shape;
  const Shape& ws = g.value(w).type.shape;
  const Shape& ys = g.value(n.outputs[0]).type.shape;
  const size_t spatial = xs.size() - 2;
  if (spatial < 1 || spatial > 3)
    return {nullptr, cat(spatial, " spatial dims (oneDNN takes 1 to 3)")};
  const int64_t groups = a.groups;
  memory::dims strides(spatial, 1), dilates(spatial, 0), pad_l(spatial, 0), pad_r(spatial, 0);
  for (size_t d = 0; d < spatial; ++d) {
    if (d < a.strides.size()) strides[d] = a.strides[d];
    if (d < a.dilations.size()) dilates[d] = a.dilations[d] - 1;  // oneDNN counts the gaps
    if (d < a.pads_begin.size()) pad_l[d] = a.pads_begin[d];
    if (d < a.pads_end.size()) pad_r[d] = a.pads_end[d];
  }
  // Weights: [K, C/g, R...], grouped as [g, K/g, C/g, R...].
  memory::dims w_dims = dims_of(ws);
  if (groups > 1) {
    w_dims[0] /= groups;
    w_dims.insert(w_dims.begin(), groups);
  }
  const memory::desc x_plain = plain_desc(dims_of(xs), dtype);
  const memory::desc w_plain = plain_desc(w_dims, dtype);
  const memory::desc y_plain = plain_desc(dims_of(ys), dtype);
  const auto any = memory::format_tag::any;
  const memory::data_type type = *data_type_of(dtype);
  const auto activations =
      blocked_1x1(dtype, xs, ws, ys, groups) ? memory::format_tag::nChw8c : any;
  const memory::desc x_any(dims_of(xs), type, activations), w_any(w_dims, type, any),
      y_any(dims_of(ys), type, activations);

  dnnl::post_ops ops;
  std::string why;
  if (!append_activation(ops, a.activation, &why)) return {nullptr, why};
  if (residual != kNoValue) ops.append_sum(1.f);
  if (!append_activation(ops, a.residual_activation, &why)) return {nullptr, why};
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);

  dnnl::convolution_forward::primitive_desc pd;
  try {
    if (bias != kNoValue) {
      pd = dnnl::convolution_forward::primitive_desc(
          cpu_engine(), dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
          x_any, w_any, memory::desc({ws[0]}, *data_type_of(bias_dtype), memory::format_tag::x),
          y_any, strides, dilates, pad_l, pad_r, attr);
    } else {
      pd = dnnl::convolution_forward::primitive_desc(
          cpu_engine(), dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
          x_any, w_any, y_any, strides, dilates, pad_l, pad_r, attr);
    }
  } catch (const dnnl::error& e) {
    return {nullptr, cat("oneDNN has no convolution for it (", e.what(), ")")};
  }
  std::optional<memory> weights, bias_memory;
  if (g.is_constant(w)) weights = prepared_copy(*g.constant(w), w_plain, pd.weights_desc());
  if (bias != kNoValue && g.is_constant(bias))
    bias_memory = prepared_copy(*g.constant(bias), pd.bias_desc(), pd.bias_desc());
  return {std::make_unique<ConvKernel>(pd, x_plain, w_plain, y_plain, weights, bias_memory,
                                       bias != kNoValue, residual != kNoValue),
          ""};
}

}  // namespace fusebox::cpu_fast
#endif  // FUSEBOX_WITH_ONEDNN
