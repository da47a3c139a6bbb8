// Convolutions on oneDNN: one forward-inference primitive per node, chosen at compile with
// every operand's layout left to oneDNN ("any": blocked layouts on x86); constant weights and
// bias reordered into it then. An activation between two convolutions stays in the writer's
// layout (Kernel::run_own: the executable keeps it so where every reader is a convolution);
// others are reordered from and to dense NCHW around the run. The epilogue of ConvAttrs runs as
// post-ops: bias, activation, the residual add, the residual's activation. The residual is a sum
// post-op (dst += the residual, which the run first writes into dst in dst's layout): a binary
// post-op reading a plain residual beside a blocked dst sent oneDNN to its reference
// implementation (300-430 ms for one of ResNet-50's 1x1 convolutions at batch 1, 2 cores).
//
// The backward ones (training steps, and conv_backward_data as a ConvTranspose): oneDNN's
// backward-data and backward-weights primitives, made at compile with the forward they belong
// to as the hint oneDNN asks for, every operand's layout left to it; dense tensors in and out,
// reordered around the run where its layouts differ.
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

// The geometry oneDNN's convolution primitives share.
struct Geometry {
  memory::dims strides, dilates, pad_l, pad_r;
  memory::dims w_dims;  // [K, C/g, R...], grouped as [g, K/g, C/g, R...]
};

Geometry geometry_of(const ConvAttrs& a, const Shape& ws, size_t spatial) {
  Geometry geo{memory::dims(spatial, 1), memory::dims(spatial, 0), memory::dims(spatial, 0),
               memory::dims(spatial, 0), dims_of(ws)};
  for (size_t d = 0; d < spatial; ++d) {
    if (d < a.strides.size()) geo.strides[d] = a.strides[d];
    if (d < a.dilations.size()) geo.dilates[d] = a.dilations[d] - 1;  // oneDNN counts the gaps
    if (d < a.pads_begin.size()) geo.pad_l[d] = a.pads_begin[d];
    if (d < a.pads_end.size()) geo.pad_r[d] = a.pads_end[d];
  }
  if (a.groups > 1) {
    geo.w_dims[0] /= a.groups;
    geo.w_dims.insert(geo.w_dims.begin(), a.groups);
  }
  return geo;
}

// Why oneDNN cannot take these operands (empty where it can): one dtype among them, f32, or
// bf16 / f16 where the CPU computes in them (else oneDNN refuses the primitive, saying so).
std::string dtype_refusal(const Graph& g, std::initializer_list<ValueId> values) {
  const DType dtype = g.value(*values.begin()).type.dtype;
  if (!data_type_of(dtype)) return cat("a ", dtype_name(dtype), " input (f32, bf16 and f16 only)");
  for (ValueId v : values)
    if (g.value(v).type.dtype != dtype)
      return cat("operands of mixed dtypes (", dtype_name(dtype), " and ",
                 dtype_name(g.value(v).type.dtype), ")");
  return "";
}

// One backward primitive on dense tensors: input i is the oneDNN argument ins[i].arg, held
// dense as ins[i].plain and read in ins[i].want; output 0 likewise.
struct Operand {
  int arg;
  memory::desc plain, want;
};

class ConvBackwardKernel final : public Kernel {
 public:
  ConvBackwardKernel(dnnl::primitive primitive, std::string what, std::vector<Operand> ins,
                     Operand out)
      : primitive_(std::move(primitive)),
        what_(std::move(what)),
        ins_(std::move(ins)),
        out_(std::move(out)) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor> out) override {
    std::unordered_map<int, memory> args;
    for (size_t i = 0; i < ins_.size(); ++i)
      args[ins_[i].arg] = in_layout(wrap(ins_[i].plain, in[i]->raw()), ins_[i].want);
    const memory dense = wrap(out_.plain, out[0].raw());
    const bool direct = out_.want == out_.plain;
    args[out_.arg] = direct ? dense : memory(out_.want, cpu_engine());
    execute(primitive_, args);
    if (!direct)
      execute(dnnl::reorder(args[out_.arg], dense),
              {{DNNL_ARG_FROM, args[out_.arg]}, {DNNL_ARG_TO, dense}});
  }

  std::string describe() const override { return what_; }

 private:
  dnnl::primitive primitive_;
  std::string what_;
  std::vector<Operand> ins_;
  Operand out_;
};

// What both backward planners share: the convolution (x, w, y) they differentiate, refused or
// described for oneDNN: its geometry, each operand "any" (oneDNN's layout) and plain (the
// tensor the executable holds), and the forward oneDNN asks for as the hint.
struct BackwardProblem {
  Geometry geo;
  memory::desc x_any, w_any, y_any, x_plain, w_plain, y_plain;
  dnnl::convolution_forward::primitive_desc forward;
};

// x, w, y: the forward's operands as this node has them (dx or x, w or dw, dy); nullopt with
// `why` where oneDNN cannot take them.
std::optional<BackwardProblem> backward_problem(const Graph& g, const ConvAttrs& a, ValueId x,
                                                ValueId w, ValueId y, std::string& why) {
  why = dtype_refusal(g, {x, w, y});
  if (why.empty() && (a.activation || a.residual_activation))
    why = "a fused activation on a backward convolution";
  if (!why.empty()) return std::nullopt;
  const Shape &xs = g.value(x).type.shape, &ws = g.value(w).type.shape, &ys = g.value(y).type.shape;
  const size_t spatial = xs.size() - 2;
  if (spatial < 1 || spatial > 3) {
    why = cat(spatial, " spatial dims (oneDNN takes 1 to 3)");
    return std::nullopt;
  }
  const DType dtype = g.value(x).type.dtype;
  const memory::data_type type = *data_type_of(dtype);
  const auto any = memory::format_tag::any;
  BackwardProblem p{geometry_of(a, ws, spatial), {}, {}, {}, {}, {}, {}, {}};
  p.x_any = memory::desc(dims_of(xs), type, any);
  p.w_any = memory::desc(p.geo.w_dims, type, any);
  p.y_any = memory::desc(dims_of(ys), type, any);
  p.x_plain = plain_desc(dims_of(xs), dtype);
  p.w_plain = plain_desc(p.geo.w_dims, dtype);
  p.y_plain = plain_desc(dims_of(ys), dtype);
  try {
    p.forward = dnnl::convolution_forward::primitive_desc(
        cpu_engine(), dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
        p.x_any, p.w_any, p.y_any, p.geo.strides, p.geo.dilates, p.geo.pad_l, p.geo.pad_r);
  } catch (const dnnl::error& e) {
    why = cat("oneDNN has no convolution for it (", e.what(), ")");
    return std::nullopt;
  }
  return p;
}

}  // namespace

Planned plan_conv_backward_data(const Graph& g, const Node& n) {
  const auto& a = std::get<ConvBackwardDataAttrs>(n.attrs);
  if (n.inputs.size() > 2 && n.inputs[2] != kNoValue)
    return {nullptr, "a bias (a ConvTranspose's): the reference adds it"};
  std::string why;
  const std::optional<BackwardProblem> p =
      backward_problem(g, a.conv, n.outputs[0], n.inputs[1], n.inputs[0], why);
  if (!p) return {nullptr, why};
  dnnl::convolution_backward_data::primitive_desc pd;
  try {
    pd = dnnl::convolution_backward_data::primitive_desc(
        cpu_engine(), dnnl::algorithm::convolution_direct, p->x_any, p->w_any, p->y_any,
        p->geo.strides, p->geo.dilates, p->geo.pad_l, p->geo.pad_r, p->forward);
  } catch (const dnnl::error& e) {
    return {nullptr, cat("oneDNN has no backward-data convolution for it (", e.what(), ")")};
  }
  return {std::make_unique<ConvBackwardKernel>(
              dnnl::convolution_backward_data(pd),
              cat("oneDNN conv backward data ", implementation(pd)),
              std::vector<Operand>{{DNNL_ARG_DIFF_DST, p->y_plain, pd.diff_dst_desc()},
                                   {DNNL_ARG_WEIGHTS, p->w_plain, pd.weights_desc()}},
              Operand{DNNL_ARG_DIFF_SRC, p->x_plain, pd.diff_src_desc()}),
          ""};
}

Planned plan_conv_backward_filter(const Graph& g, const Node& n) {
  const auto& a = std::get<ConvBackwardFilterAttrs>(n.attrs);
  std::string why;
  const std::optional<BackwardProblem> p =
      backward_problem(g, a.conv, n.inputs[0], n.outputs[0], n.inputs[1], why);
  if (!p) return {nullptr, why};
  dnnl::convolution_backward_weights::primitive_desc pd;
  try {
    pd = dnnl::convolution_backward_weights::primitive_desc(
        cpu_engine(), dnnl::algorithm::convolution_direct, p->x_any, p->w_any, p->y_any,
        p->geo.strides, p->geo.dilates, p->geo.pad_l, p->geo.pad_r, p->forward);
  } catch (const dnnl::error& e) {
    return {nullptr, cat("oneDNN has no backward-weights convolution for it (", e.what(), ")")};
  }
  return {std::make_unique<ConvBackwardKernel>(
              dnnl::convolution_backward_weights(pd),
              cat("oneDNN conv backward weights ", implementation(pd)),
              std::vector<Operand>{{DNNL_ARG_SRC, p->x_plain, pd.src_desc()},
                                   {DNNL_ARG_DIFF_DST, p->y_plain, pd.diff_dst_desc()}},
              Operand{DNNL_ARG_DIFF_WEIGHTS, p->w_plain, pd.diff_weights_desc()}),
          ""};
}

Planned plan_conv(const Graph& g, const Node& n) {
  // The ordered try-list: a 3x3 stride-1 f32 convolution as Winograd where it wins, else
  // oneDNN's direct convolution.
  const auto& a = std::get<ConvAttrs>(n.attrs);
  if (a.channel_stats) return {nullptr, "channel statistics as a second output (channel_stats)"};
  if (Planned winograd = plan_winograd_conv(g, n); winograd.kernel) return winograd;
  auto input = [&](size_t i) { return i < n.inputs.size() ? n.inputs[i] : kNoValue; };
  const ValueId x = input(0), w = input(1), bias = input(2), residual = input(3);
  // One dtype for x, w, y and the residual: f32, or bf16 / f16 where the CPU computes in it
  // (AVX-512 BF16 / AMX, AVX-512 FP16: else oneDNN refuses the primitive below, saying so);
  // the bias in it or f32.
  const DType dtype = g.value(x).type.dtype;
  if (std::string why = dtype_refusal(g, {x, w, n.outputs[0], residual == kNoValue ? x : residual});
      !why.empty())
    return {nullptr, why};
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
  const Geometry geo = geometry_of(a, ws, spatial);
  const memory::dims& w_dims = geo.w_dims;
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
          y_any, geo.strides, geo.dilates, geo.pad_l, geo.pad_r, attr);
    } else {
      pd = dnnl::convolution_forward::primitive_desc(
          cpu_engine(), dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
          x_any, w_any, y_any, geo.strides, geo.dilates, geo.pad_l, geo.pad_r, attr);
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
