// gemm and matmul on oneDNN's matmul primitive, made at compile: a constant B (a linear
// layer's weights) reordered once into the layout oneDNN picks for it; gemm's bias vector and
// fused activation as the primitive's bias and an eltwise post-op.
#ifdef FUSEBOX_WITH_ONEDNN
#include "backends/cpu_fast/kernels.h"
#include "backends/cpu_fast/onednn.h"

namespace fusebox::cpu_fast {
namespace {

using dnnl::memory;

class MatmulKernel final : public Kernel {
 public:
  MatmulKernel(dnnl::matmul::primitive_desc pd, memory::desc a, memory::desc b, memory::desc y,
               std::optional<memory> weights, std::optional<memory::desc> bias, const char* what)
      : pd_(std::move(pd)),
        primitive_(pd_),
        a_(a),
        b_(b),
        y_(y),
        weights_(std::move(weights)),
        bias_(std::move(bias)),
        what_(what) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor> out) override {
    std::unordered_map<int, memory> args;
    args[DNNL_ARG_SRC] = in_layout(wrap(a_, in[0]->raw()), pd_.src_desc());
    args[DNNL_ARG_WEIGHTS] =
        weights_ ? *weights_ : in_layout(wrap(b_, in[1]->raw()), pd_.weights_desc());
    if (bias_) args[DNNL_ARG_BIAS] = wrap(*bias_, in[2]->raw());
    const memory y = wrap(y_, out[0].raw());
    const bool direct = pd_.dst_desc() == y_;
    args[DNNL_ARG_DST] = direct ? y : memory(pd_.dst_desc(), cpu_engine());
    execute(primitive_, args);
    if (!direct)
      execute(dnnl::reorder(args[DNNL_ARG_DST], y),
              {{DNNL_ARG_FROM, args[DNNL_ARG_DST]}, {DNNL_ARG_TO, y}});
  }

  std::string describe() const override {
    return cat("oneDNN ", what_, " ", implementation(pd_),
               weights_ ? " (weights reordered once)" : "");
  }

 private:
  dnnl::matmul::primitive_desc pd_;
  dnnl::matmul primitive_;
  memory::desc a_, b_, y_;
  std::optional<memory> weights_;
  std::optional<memory::desc> bias_;
  const char* what_;
};

// Dense row-major strides of `dims`, with the last two dims swapped when `transposed`
// (the matrix stored [cols, rows]).
memory::desc matrix_desc(memory::dims dims, bool transposed, DType dtype) {
  const size_t r = dims.size();
  memory::dims stored = dims;
  if (transposed) std::swap(stored[r - 1], stored[r - 2]);
  memory::dims strides(r, 1);
  for (size_t i = r; i-- > 1;) strides[i - 1] = strides[i] * stored[i];
  if (transposed) std::swap(strides[r - 1], strides[r - 2]);
  return memory::desc(dims, *data_type_of(dtype), strides);
}

// Whether constant weights B [K, N] stored transposed (N rows of K) beat the plain row-major
// layout oneDNN picks for "any" when its matmul is its jit sgemm (AVX2 f32): for products of
// at most kFewRows rows of A. ViT-B/16 at batch 1 (197 rows; 2-core AMD EPYC, oneDNN's own
// timings): 768 -> 3072 12.0 -> 6.9 ms, 3072 -> 768 7.6 -> 7.1, 768 -> 2304 5.7 -> 5.4, 768 ->
// 768 1.84 -> 1.68; at batch 8 (1576 rows) no better (40.0 vs 42.3 ms, 49.5 vs 52.9).
constexpr int64_t kFewRows = 512;

bool transposed_weights_pay(const memory::desc& a, const memory::desc& b,
                            const dnnl::matmul::primitive_desc& pd) {
  const memory::dims ad = a.get_dims(), bd = b.get_dims();
  // No empty operand: oneDNN's sgemm divides by K on the transposed path (an empty inner dim
  // raised SIGFPE).
  if (bd.size() != 2 || ad.size() != 2 || ad[0] > kFewRows || ad[0] < 1 || bd[0] < 1 || bd[1] < 1)
    return false;
  return pd.weights_desc() == memory::desc(bd, b.get_data_type(), memory::format_tag::ab);
}

// The primitive, with B in the layout oneDNN picks when it is a constant (reordered now).
Planned make(const Graph& g, ValueId b, const memory::desc& a_desc, const memory::desc& b_desc,
             const memory::desc& y_desc, std::optional<memory::desc> bias,
             const dnnl::primitive_attr& attr, const char* what) {
  const bool constant_b = g.is_constant(b);
  const memory::desc b_any(b_desc.get_dims(), b_desc.get_data_type(), memory::format_tag::any);
  dnnl::matmul::primitive_desc pd;
  try {
    pd = bias ? dnnl::matmul::primitive_desc(cpu_engine(), a_desc, constant_b ? b_any : b_desc,
                                             *bias, y_desc, attr)
              : dnnl::matmul::primitive_desc(cpu_engine(), a_desc, constant_b ? b_any : b_desc,
                                             y_desc, attr);
  } catch (const dnnl::error& e) {
    return {nullptr, cat("oneDNN has no matmul for it (", e.what(), ")")};
  }
  if (constant_b && transposed_weights_pay(a_desc, b_desc, pd)) {
    try {
      const memory::desc b_columns(b_desc.get_dims(), b_desc.get_data_type(),
                                   memory::format_tag::ba);
      pd = bias ? dnnl::matmul::primitive_desc(cpu_engine(), a_desc, b_columns, *bias, y_desc, attr)
                : dnnl::matmul::primitive_desc(cpu_engine(), a_desc, b_columns, y_desc, attr);
    } catch (const dnnl::error&) {
      // Kept as oneDNN chose.
    }
  }
  std::optional<memory> weights;
  if (constant_b) weights = prepared_copy(*g.constant(b), b_desc, pd.weights_desc());
  return {std::make_unique<MatmulKernel>(pd, a_desc, b_desc, y_desc, weights, bias, what), ""};
}

// The operands' one dtype (f32, or bf16 / f16 where the CPU computes in it: else oneDNN
// refuses the primitive, saying so); a gemm's bias may be f32 beside bf16 / f16 operands.
// (y has it too, or f32: gemm's mixed form, ir/ops.h GemmAttrs.)
std::optional<DType> operand_dtype(const Graph& g, const Node& n, std::string* why) {
  const DType t = g.value(n.inputs[0]).type.dtype;
  if (!data_type_of(t)) {
    *why = cat("a ", dtype_name(t), " product (f32, bf16 and f16 only)");
    return std::nullopt;
  }
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const ValueId v = n.inputs[i];
    if (v == kNoValue) continue;
    const DType d = g.value(v).type.dtype;
    if (d != t && !(i == 2 && d == DType::f32)) {
      *why = cat("operands of mixed dtypes (", dtype_name(t), " and ", dtype_name(d), ")");
      return std::nullopt;
    }
  }
  return t;
}

}  // namespace

Planned plan_gemm(const Graph& g, const Node& n) {
  const auto& a = std::get<GemmAttrs>(n.attrs);
  std::string why;
  const std::optional<DType> dtype = operand_dtype(g, n, &why);
  if (!dtype) return {nullptr, why};
  if (a.alpha != 1.0) return {nullptr, cat("alpha ", a.alpha, " (only 1 so far)")};
  const Shape& as = g.value(n.inputs[0]).type.shape;
  const Shape& bs = g.value(n.inputs[1]).type.shape;
  const int64_t m = a.trans_a ? as[1] : as[0], k = a.trans_a ? as[0] : as[1];
  const int64_t cols = a.trans_b ? bs[0] : bs[1];
  std::optional<memory::desc> bias;
  const ValueId c = n.inputs.size() > 2 ? n.inputs[2] : kNoValue;
  if (c != kNoValue && a.beta != 0.0) {
    const Shape& cs = g.value(c).type.shape;
    if (a.beta != 1.0 || numel(cs) != cols || cs.empty() || cs.back() != cols)
      return {nullptr, cat("C ", shape_str(cs), " with beta ", a.beta,
                           " (only a bias over the columns with beta 1 so far)")};
    bias = memory::desc({1, cols}, *data_type_of(g.value(c).type.dtype), memory::format_tag::ab);
  }
  dnnl::post_ops ops;
  if (!append_activation(ops, a.activation, &why)) return {nullptr, why};
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);
  const DType y_dtype = g.value(n.outputs[0]).type.dtype;  // f32 in the mixed form
  return make(g, n.inputs[1], matrix_desc({m, k}, a.trans_a, *dtype),
              matrix_desc({k, cols}, a.trans_b, *dtype), plain_desc({m, cols}, y_dtype), bias, attr,
              "gemm");
}

Planned plan_matmul(const Graph& g, const Node& n) {
  std::string why;
  const std::optional<DType> dtype = operand_dtype(g, n, &why);
  if (!dtype) return {nullptr, why};
  const Shape& as = g.value(n.inputs[0]).type.shape;
  const Shape& bs = g.value(n.inputs[1]).type.shape;
  const Shape& ys = g.value(n.outputs[0]).type.shape;
  if (as.size() < 2 || bs.size() < 2 || ys.size() > 4)
    return {nullptr, cat("operands ", shape_str(as), " x ", shape_str(bs),
                         " (ranks 2 to 4, no vectors, so far)")};
  // Every operand at the output's rank, missing batch dims as 1 (numpy's broadcast).
  auto padded = [&](const Shape& s) {
    memory::dims d(ys.size() - s.size(), 1);
    d.insert(d.end(), s.begin(), s.end());
    return d;
  };
  return make(g, n.inputs[1], plain_desc(padded(as), *dtype), plain_desc(padded(bs), *dtype),
              plain_desc(dims_of(ys), *dtype), std::nullopt, dnnl::primitive_attr(), "matmul");
}

}  // namespace fusebox::cpu_fast
#endif  // FUSEBOX_WITH_ONEDNN
