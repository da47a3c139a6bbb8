// Unary activations (relu, gelu in its erf and tanh forms, sigmoid, tanh, silu) on oneDNN's
// eltwise primitive, on the dense values as they lie: one forward-inference primitive per
// node, made at compile. Why: an erf GELU that no gemm epilogue takes (the CUDA backend's
// cuBLASLt computes only the tanh form, and the fusion passes are shared) ran on the reference
// kernel: 47 of ViT-B/16's 270 ms at batch 1 on 2 cores.
#ifdef FUSEBOX_WITH_ONEDNN
#include "backends/cpu_fast/kernels.h"
#include "backends/cpu_fast/onednn.h"

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

// oneDNN's algorithm and alpha for the op; none where it has no such eltwise.
std::optional<std::pair<dnnl::algorithm, float>> algorithm_of(const Node& n) {
  using dnnl::algorithm;
  switch (n.op) {
    case OpKind::relu:
      return std::pair{algorithm::eltwise_relu, 0.f};
    case OpKind::gelu:
      return std::pair{std::get<GeluAttrs>(n.attrs).tanh_approximation
                           ? algorithm::eltwise_gelu_tanh
                           : algorithm::eltwise_gelu_erf,
                       0.f};
    case OpKind::sigmoid:
      return std::pair{algorithm::eltwise_logistic, 0.f};
    case OpKind::tanh:
      return std::pair{algorithm::eltwise_tanh, 0.f};
    case OpKind::silu:
      return std::pair{algorithm::eltwise_swish, 1.f};
    default:
      return std::nullopt;
  }
}

}  // namespace

Planned plan_eltwise(const Graph& g, const Node& n) {
  const auto algorithm = algorithm_of(n);
  if (!algorithm) return {nullptr, cat("no oneDNN eltwise for ", op_name(n.op))};
  const TensorType& x = g.value(n.inputs[0]).type;
  if (!data_type_of(x.dtype) || g.value(n.outputs[0]).type != x)
    return {nullptr, cat("a ", dtype_name(x.dtype), " input (f32, bf16 and f16 only)")};
  if (x.shape.empty() || numel(x.shape) == 0) return {nullptr, "a scalar or empty input"};
  const memory::desc desc = plain_desc(dims_of(x.shape), x.dtype);
  try {
    dnnl::eltwise_forward::primitive_desc pd(cpu_engine(), dnnl::prop_kind::forward_inference,
                                             algorithm->first, desc, desc, algorithm->second, 0.f);
    return {std::make_unique<EltwiseKernel>(pd, desc), ""};
  } catch (const dnnl::error& e) {
    return {nullptr, cat("oneDNN has no eltwise for it (", e.what(), ")")};
  }
}

}  // namespace fusebox::cpu_fast
#endif  // FUSEBOX_WITH_ONEDNN
