// Unary activations (relu, gelu in its erf and tanh forms, sigmoid, tanh, silu) on oneDNN's
// eltwise primitive, and the binary arithmetic ops (add, sub, mul, div; numpy broadcasting of
// the second operand, or of the first for add and mul) on its binary
// primitive, on the dense values as they lie: one forward-inference primitive per node, made
// at compile. Why: an erf GELU that no gemm epilogue takes (the CUDA backend's cuBLASLt
// computes only the tanh form, and the fusion passes are shared) ran on the reference kernel,
// 47 of ViT-B/16's 270 ms at batch 1 on 2 cores; its bf16 residual adds, 15 of 120 ms.
#ifdef FUSEBOX_WITH_ONEDNN
#include "backends/cpu_fast/kernels.h"
#include "backends/cpu_fast/onednn.h"
#include "fusebox/passes/fusion.h"

namespace fusebox::cpu_fast {
namespace {

using dnnl::memory;

class EltwiseKernel final : public Kernel {
 public:
  EltwiseKernel(dnnl::eltwise_forward::primitive_desc pd, memory::desc x)
      : pd_(std::move(pd)), primitive_(pd_), x_(x) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor> out) override {
    execute(primitive_,
            {{DNNL_ARG_SRC, wrap(x_, in[0]->raw())}, {DNNL_ARG_DST, wrap(x_, out[0].raw())}});
  }
  std::string describe() const override { return cat("oneDNN eltwise ", implementation(pd_)); }

 private:
  dnnl::eltwise_forward::primitive_desc pd_;
  dnnl::eltwise_forward primitive_;
  memory::desc x_;
};

class BinaryKernel final : public Kernel {
 public:
  BinaryKernel(dnnl::binary::primitive_desc pd, memory::desc a, memory::desc b, memory::desc y,
               bool swapped)
      : pd_(std::move(pd)), primitive_(pd_), a_(a), b_(b), y_(y), swapped_(swapped) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor> out) override {
    const Tensor* a = in[swapped_ ? 1 : 0];
    const Tensor* b = in[swapped_ ? 0 : 1];
    execute(primitive_, {{DNNL_ARG_SRC_0, wrap(a_, a->raw())},
                         {DNNL_ARG_SRC_1, wrap(b_, b->raw())},
                         {DNNL_ARG_DST, wrap(y_, out[0].raw())}});
  }
  std::string describe() const override { return cat("oneDNN binary ", implementation(pd_)); }

 private:
  dnnl::binary::primitive_desc pd_;
  dnnl::binary primitive_;
  memory::desc a_, b_, y_;
  bool swapped_;  // the broadcast operand was the first: a commutative op's operands swapped
};

std::optional<dnnl::algorithm> binary_algorithm(OpKind op) {
  using dnnl::algorithm;
  switch (op) {
    case OpKind::add:
      return algorithm::binary_add;
    case OpKind::sub:
      return algorithm::binary_sub;
    case OpKind::mul:
      return algorithm::binary_mul;
    case OpKind::div:
      return algorithm::binary_div;
    default:  // max and min: oneDNN's NaN rule is not the reference's (NaN wins)
      return std::nullopt;
  }
}

// `s` at rank `rank` (numpy's leading 1s).
memory::dims padded_dims(const Shape& s, size_t rank) {
  memory::dims d(rank - s.size(), 1);
  d.insert(d.end(), s.begin(), s.end());
  return d;
}

}  // namespace

Planned plan_binary(const Graph& g, const Node& n) {
  const auto algorithm = binary_algorithm(n.op);
  if (!algorithm || n.inputs.size() != 2)
    return {nullptr, cat("no oneDNN binary for ", op_name(n.op))};
  const TensorType& a = g.value(n.inputs[0]).type;
  const TensorType& b = g.value(n.inputs[1]).type;
  const TensorType& y = g.value(n.outputs[0]).type;
  if (!data_type_of(y.dtype) || a.dtype != y.dtype || b.dtype != y.dtype)
    return {nullptr, cat("operands ", dtype_name(a.dtype), " and ", dtype_name(b.dtype),
                         " (one dtype of f32, bf16 and f16 only)")};
  if (y.shape.empty() || numel(y.shape) == 0) return {nullptr, "a scalar or empty output"};
  // oneDNN broadcasts only its second operand: the first must have the output's shape.
  bool swapped = false;
  if (a.shape != y.shape) {
    const bool commutative = n.op == OpKind::add || n.op == OpKind::mul;
    if (!commutative || b.shape != y.shape)
      return {nullptr, "a broadcast first operand of a non-commutative op"};
    swapped = true;
  }
  const TensorType& second = swapped ? a : b;
  const memory::desc y_desc = plain_desc(dims_of(y.shape), y.dtype);
  const memory::desc b_desc = plain_desc(padded_dims(second.shape, y.shape.size()), y.dtype);
  try {
    dnnl::binary::primitive_desc pd(cpu_engine(), *algorithm, y_desc, b_desc, y_desc);
    return {std::make_unique<BinaryKernel>(pd, y_desc, b_desc, y_desc, swapped), ""};
  } catch (const dnnl::error& e) {
    return {nullptr, cat("oneDNN has no binary for it (", e.what(), ")")};
  }
}

Planned plan_eltwise(const Graph& g, const Node& n) {
  std::string why = cat("no oneDNN eltwise for ", op_name(n.op));
  const std::optional<Eltwise> eltwise = eltwise_of(activation_of(n), &why);
  if (!eltwise) return {nullptr, why};
  const TensorType& x = g.value(n.inputs[0]).type;
  if (!data_type_of(x.dtype) || g.value(n.outputs[0]).type != x)
    return {nullptr, cat("a ", dtype_name(x.dtype), " input (f32, bf16 and f16 only)")};
  if (x.shape.empty() || numel(x.shape) == 0) return {nullptr, "a scalar or empty input"};
  const memory::desc desc = plain_desc(dims_of(x.shape), x.dtype);
  try {
    dnnl::eltwise_forward::primitive_desc pd(cpu_engine(), dnnl::prop_kind::forward_inference,
                                             eltwise->algorithm, desc, desc, eltwise->alpha,
                                             eltwise->beta);
    return {std::make_unique<EltwiseKernel>(pd, desc), ""};
  } catch (const dnnl::error& e) {
    return {nullptr, cat("oneDNN has no eltwise for it (", e.what(), ")")};
  }
}

}  // namespace fusebox::cpu_fast
#endif  // FUSEBOX_WITH_ONEDNN
